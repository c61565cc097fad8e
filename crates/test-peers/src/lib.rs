//! Test support shared by the integration tests of the initiator and the
//! CLI: loopback ports that no two tests of one process share, peers
//! (tgtd, `iscsi target`, any child process) that are known to listen
//! before a test uses them, and that are stopped by PID when dropped.
//!
//! Why a crate of its own: picking a port by binding port 0 and closing
//! the socket again lets two tests running in parallel get the same port;
//! and a readiness probe that merely connects can be answered by the
//! *other* test's peer, or by a TCP self-connection when the port lies in
//! the ephemeral range. Both happened in CI. Every test that starts a peer
//! goes through [`free_port`] and [`Peer::wait_listening`].

use std::collections::HashSet;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// How long a peer may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Ports this process has handed out already; never handed out twice.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// The lowest port handed out: above the well-known and most services'.
const LOWEST_PORT: u16 = 10000;

/// A loopback TCP port that is free now and that no other caller in this
/// process has been given. It lies below the kernel's ephemeral range
/// (`ip_local_port_range`), where the kernel never puts a connecting
/// socket: a port the kernel picked (bind to port 0) could be given to
/// some connection's local end between this check and the peer's own bind,
/// and the peer then failed with EADDRINUSE (CI saw it).
pub fn free_port() -> u16 {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    let below = ephemeral_low().max(LOWEST_PORT + 1000);
    let span = u64::from(below - LOWEST_PORT);
    // A random start, so that two processes rarely try the same ports.
    let start = std::hash::BuildHasher::hash_one(
        &std::collections::hash_map::RandomState::new(),
        std::process::id(),
    ) % span;
    for step in 0..span {
        let port = LOWEST_PORT + ((start + step) % span) as u16;
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {LOWEST_PORT}..{below}");
}

/// The low end of the kernel's ephemeral port range (Linux's default when
/// it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// Whether `program` is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Panics with the Debian package to install when `program` is missing
/// (scripts/test installs every package the tests use).
pub fn require(program: &str, package: &str) {
    assert!(
        have(program),
        "{program} is missing (Debian package {package}): run scripts/test, which installs it"
    );
}

/// A child process listening on a loopback port, killed (SIGKILL, by PID)
/// when dropped, together with files it owns.
pub struct Peer {
    child: Child,
    /// The port it listens on.
    pub port: u16,
    host: String,
    files: Vec<String>,
}

/// Sends SIGSTOP to process `pid` and returns once every thread of it has
/// stopped. kill(2) only queues the signal: one thread takes it and then
/// stops the others, and on a loaded machine the others run on meanwhile —
/// long enough for a stopped target to answer one more command (CI saw a
/// write succeed through a target the test had just stopped).
pub fn stop_process(pid: u32) {
    signal_process(pid, "-STOP");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !all_threads_stopped(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} did not stop in 30 s after SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends `signal` (as kill(1) spells it: `-CONT`) to process `pid`.
pub fn signal_process(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

/// Whether every thread of `pid` is stopped (or gone): the state field of
/// each `/proc/PID/task/TID/stat`, read after the last `)` because the
/// thread's name may hold any character.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return true;
        };
        let state = stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next());
        matches!(state, Some("T" | "t" | "Z" | "X"))
    })
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl Peer {
    /// Spawns `command` (stdout discarded, stderr to a log file, so a
    /// chatty peer never blocks on a full pipe) and waits until it listens
    /// on 127.0.0.1:`port`.
    pub fn spawn(command: Command, port: u16) -> Peer {
        Peer::spawn_at(command, "127.0.0.1", port)
    }

    /// The same, waiting for `host`:`port` (e.g. "::1").
    pub fn spawn_at(mut command: Command, host: &str, port: u16) -> Peer {
        let log_file = std::env::temp_dir()
            .join(format!("iscsi-rs-peer-{}-{port}.log", std::process::id()))
            .to_string_lossy()
            .into_owned();
        let stderr = std::fs::File::create(&log_file).expect("the peer's log file");
        let child = command
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?} does not start: {e}"));
        let mut peer = Peer {
            child,
            port,
            host: host.to_owned(),
            files: vec![log_file],
        };
        peer.wait_listening();
        peer
    }

    /// Removes `file` when the peer is dropped.
    pub fn owns_file(&mut self, file: impl Into<String>) {
        self.files.push(file.into());
    }

    /// Waits until this peer accepts connections on its port. A connection
    /// only counts if it is not a TCP self-connection, and the peer must
    /// still be running afterwards: a peer that failed to bind and exited
    /// is reported with its log rather than mistaken for another listener.
    pub fn wait_listening(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        let port = self.port;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the peer for port {} exited ({status}) before listening:\n{}",
                    port,
                    self.log()
                );
            }
            if let Ok(stream) = TcpStream::connect((self.host.as_str(), self.port)) {
                let self_connected = stream
                    .local_addr()
                    .is_ok_and(|local| local.port() == self.port);
                drop(stream);
                if !self_connected {
                    std::thread::sleep(Duration::from_millis(20));
                    if let Ok(Some(status)) = self.child.try_wait() {
                        panic!(
                            "the peer for port {} exited ({status}) right after start:\n{}",
                            port,
                            self.log()
                        );
                    }
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nothing listens on {}:{} after {START_TIMEOUT:?}",
                self.host,
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM (what a service manager sends) and waits up to
    /// `timeout` for the peer to exit; `None` if it is still running.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The peer's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the peer has written to stderr so far; it keeps running.
    pub fn log_so_far(&self) -> String {
        self.files
            .first()
            .and_then(|file| std::fs::read_to_string(file).ok())
            .unwrap_or_default()
    }

    /// Stops the peer and returns what it wrote to stderr.
    pub fn log(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut log = String::new();
        if let Some(Ok(mut file)) = self.files.first().map(std::fs::File::open) {
            let _ = file.read_to_string(&mut log);
        }
        log
    }
}

/// A tgtd control channel number (`-C`: a Unix socket numbered 0..=32767)
/// that no other tgtd started by this process uses.
fn tgtd_control_number() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 10_000 + (std::process::id() % 16_384) as u16;
    let offset = NEXT.fetch_add(1, Ordering::Relaxed) % 6_000;
    base + offset
}

/// tgtd (Debian package `tgt`) on a port of its own, serving one target
/// with a file LUN (LUN 1) in /dev/shm.
pub struct Tgtd {
    peer: Peer,
    name: String,
    lun_file: String,
    /// tgtd's control port number (`tgtadm -C`).
    control: String,
}

impl Tgtd {
    /// Starts tgtd with target `name` and a zeroed LUN 1 of `size` bytes.
    pub fn start(name: &str, size: u64) -> Tgtd {
        require("tgtd", "tgt");
        require("tgtadm", "tgt");
        let port = free_port();
        let control = tgtd_control_number().to_string();
        let lun_file = format!("/dev/shm/iscsi-rs-test-{}-{port}.img", std::process::id());
        std::fs::File::create(&lun_file)
            .and_then(|file| file.set_len(size))
            .expect("the LUN file");
        let mut command = Command::new("tgtd");
        command.args([
            "-f",
            "--iscsi",
            &format!("portal=127.0.0.1:{port}"),
            "-C",
            &control,
        ]);
        let mut peer = Peer::spawn(command, port);
        peer.owns_file(lun_file.clone());
        let admin = |args: &[&str]| {
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                let status = Command::new("tgtadm")
                    .args(["-C", &control, "--lld", "iscsi"])
                    .args(args)
                    .stdout(Stdio::null())
                    .status()
                    .expect("tgtadm runs");
                if status.success() {
                    return;
                }
                assert!(Instant::now() < deadline, "tgtadm {args:?} failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        admin(&["--op", "new", "--mode", "target", "--tid", "1", "-T", name]);
        admin(&[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            &lun_file,
        ]);
        admin(&[
            "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ]);
        Tgtd {
            peer,
            name: name.to_owned(),
            lun_file,
            control,
        }
    }

    /// Changes what tgtd offers in later logins (`tgtadm --op update`), e.g.
    /// `set("InitialR2T", "No")`.
    pub fn set(&self, key: &str, value: &str) {
        let status = Command::new("tgtadm")
            .args(["-C", &self.control, "--lld", "iscsi", "--op", "update"])
            .args([
                "--mode", "target", "--tid", "1", "--name", key, "--value", value,
            ])
            .stdout(Stdio::null())
            .status()
            .expect("tgtadm runs");
        assert!(status.success(), "tgtadm could not set {key}={value}");
    }

    /// The portal port.
    pub fn port(&self) -> u16 {
        self.peer.port
    }

    /// The URL of the disk (LUN 1).
    pub fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{}/1", self.peer.port, self.name)
    }

    /// The LUN file's path.
    pub fn lun_file(&self) -> &str {
        &self.lun_file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len());
        // None where the kernel picks a connecting socket's port.
        let below = ephemeral_low();
        assert!(
            ports.iter().all(|&p| (LOWEST_PORT..below).contains(&p)),
            "{ports:?} not all in {LOWEST_PORT}..{below}"
        );
    }

    #[test]
    fn a_peer_that_exits_is_reported_with_its_log() {
        let port = free_port();
        let mut command = Command::new("sh");
        command.args(["-c", "echo cannot bind >&2; exit 3"]);
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Peer::spawn(command, port)));
        let message = *result
            .err()
            .expect("spawn must fail")
            .downcast::<String>()
            .expect("a message");
        assert!(message.contains("cannot bind"), "{message}");
    }

    #[test]
    fn a_stopped_process_is_stopped_in_every_thread_when_stop_returns() {
        // Three threads spinning: every thread busy, the hard case.
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import threading\nfor _ in range(3): threading.Thread(target=exec, args=('while True: pass',)).start()",
            ])
            .spawn()
            .unwrap();
        let pid = child.id();
        while std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |t| t.count()) < 4 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!all_threads_stopped(pid));
        stop_process(pid);
        assert!(all_threads_stopped(pid));
        signal_process(pid, "-CONT");
        let deadline = Instant::now() + Duration::from_secs(10);
        while all_threads_stopped(pid) {
            assert!(Instant::now() < deadline, "SIGCONT did not resume it");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_listening_peer_is_found() {
        let port = free_port();
        let mut command = Command::new("python3");
        command.args([
            "-c",
            &format!(
                "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\ns.listen()\ntime.sleep(30)"
            ),
        ]);
        let peer = Peer::spawn(command, port);
        assert_eq!(peer.port, port);
    }
}
