//! Crash consistency on a file LUN. The target killed (SIGKILL) in the
//! middle of a write load and started again on the same file must hold
//! every write that was durable: acknowledged with FUA, or acknowledged
//! before a SYNCHRONIZE CACHE that completed (SBC-4 5.40, 5.30). The
//! initiator killed in the middle of a load: the target ends its session
//! at once (the connection's end is the I_T nexus loss of SAM-5 6.3.4),
//! which releases its SPC-2 reservation, closes its socket, and leaves the
//! LUN as the journal says.
//!
//! `iscsi verify --journal` logs every write as issued, acknowledged and
//! made durable; `iscsi verify --check` reads the LUN back against it.
//! A SIGKILL leaves the page cache in place, so this proves what a process
//! crash keeps (no acknowledged write held in the target's memory); what a
//! power cut keeps is the Linux VM job `power-cut`
//! (tests/linux-vm/jobs/power-cut.sh), which kills the VM the target runs in.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use iscsi_test_peers::{Peer, free_port};
use serde_json::Value;

const NAME: &str = "iqn.2026-11.rs.iscsi:crash";
/// 512 slots of 16 KiB: small enough that the load overwrites each slot
/// many times in a few seconds.
const SLOTS: u64 = 512;

struct Dir(PathBuf);

impl Dir {
    fn new(what: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("iscsi-crash-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `iscsi target` serving `lun` (a file) on a free port, logging sessions.
fn target(lun: &str) -> (Peer, String) {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["target", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--name", NAME, "--lun", &format!("file:{lun},size=16M")])
        .env("RUST_LOG", "info");
    let peer = Peer::spawn(command, port);
    (peer, format!("iscsi://127.0.0.1:{port}/{NAME}/0"))
}

fn iscsi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("iscsi runs")
}

/// `iscsi verify` writing at QD 16 for long enough to be killed first.
fn write_load(url: &str, durability: &str, journal: &str, initiator: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args([
            "verify", url, "--rw", "write", "--bs", "16k", "--region", "8M",
        ])
        .args(["--qd", "16", "--time", "120", "--durability", durability])
        .args(["--journal", journal, "--initiator-name", initiator])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iscsi verify starts")
}

/// Waits until the journal holds `count` lines starting with `kind`.
fn wait_for_lines(journal: &str, kind: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(journal).unwrap_or_default();
        let seen = text.lines().filter(|l| l.starts_with(kind)).count();
        if seen >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{seen} of {count} {kind:?} lines in the journal after a minute"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `iscsi verify --check`: its exit and JSON report.
fn check(url: &str, journal: &str) -> (bool, Value, String) {
    let output = iscsi(&["verify", url, "--check", journal, "--json"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.success(), report, stderr)
}

/// A slot with a durable write in the journal.
fn durable_slot(journal: &str) -> u64 {
    let text = std::fs::read_to_string(journal).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("U ")?.split(' ').next()?.parse().ok())
        .expect("a durable write")
}

fn sessions_ended(target: &Peer) -> usize {
    target.log_so_far().matches("session ended").count()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

fn kill_target_mid_write(durability: &str) {
    let dir = Dir::new(durability);
    let lun = dir.path("lun.img");
    let journal = dir.path("journal");
    let (target, url) = target(&lun);
    let mut load = write_load(&url, durability, &journal, "iqn.2026-11.rs.iscsi:writer");
    // The fill, then a second pass of durable writes or flushes under way.
    match durability {
        "fua" => wait_for_lines(&journal, "U ", 3 * SLOTS as usize),
        _ => {
            wait_for_lines(&journal, "A ", 3 * SLOTS as usize);
            wait_for_lines(&journal, "D ", 5);
        }
    }
    drop(target); // SIGKILL, with commands in flight
    std::thread::sleep(Duration::from_millis(200));
    let _ = load.kill();
    let _ = load.wait();

    let (mut target, url) = self::target(&lun);
    let (ok, report, stderr) = check(&url, &journal);
    assert!(ok, "{durability}: the check failed: {report} {stderr}");
    assert_eq!(report["slots"], SLOTS);
    assert_eq!(report["durable_slots"], SLOTS, "{durability}: {report}");
    assert_eq!(report["lost_blocks"], 0);
    assert_eq!(report["wrong_blocks"], 0);

    if durability == "fua" {
        // The check can fail: a durable slot zeroed behind the target's
        // back is reported as lost.
        let slot = durable_slot(&journal);
        target.terminate(Duration::from_secs(10));
        let file = std::fs::OpenOptions::new().write(true).open(&lun).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &[0; 16384], slot * 16384).unwrap();
        drop(file);
        let (_target, url) = self::target(&lun);
        let (ok, report, stderr) = check(&url, &journal);
        assert!(!ok, "a zeroed slot passed: {report}");
        assert_eq!(report["lost_blocks"], 32, "{report}");
        assert!(
            stderr.contains(&format!("slot {slot}: 32 blocks lost")),
            "{stderr}"
        );
    }
}

#[test]
fn fua_writes_survive_the_target_killed_mid_write() {
    kill_target_mid_write("fua");
}

#[test]
fn synchronized_writes_survive_the_target_killed_mid_write() {
    kill_target_mid_write("sync");
}

/// `iscsi script` of `text` as `initiator`, to be run.
fn script(text: &str, initiator: &str, dir: &Path) -> Command {
    let file = dir.join(format!("{}.script", initiator.replace(':', "_")));
    std::fs::write(&file, text).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["script", file.to_str().unwrap()])
        .args(["--initiator-name", initiator])
        .env("RUST_LOG", "warn");
    command
}

fn write_as(url: &str, initiator: &str, dir: &Path) -> Output {
    let text = format!("login {url}\nwrite 64 8 0x5a\nlogout\n");
    script(&text, initiator, dir).output().unwrap()
}

#[test]
fn an_initiator_killed_mid_write_loses_its_session_and_reservation_and_nothing_else() {
    let dir = Dir::new("initiator");
    let lun = dir.path("lun.img");
    let journal = dir.path("journal");
    let (target, url) = target(&lun);
    std::thread::sleep(Duration::from_millis(100));
    let baseline = open_files(target.pid());

    // A writer killed with 16 FUA writes in flight: its session ends at
    // once, and the LUN holds what the journal says.
    let mut load = write_load(&url, "fua", &journal, "iqn.2026-11.rs.iscsi:writer");
    wait_for_lines(&journal, "U ", 2 * SLOTS as usize);
    let ended = sessions_ended(&target);
    let _ = load.kill();
    let _ = load.wait();
    let took = wait_until(
        "the killed writer's session ends",
        Duration::from_secs(5),
        || sessions_ended(&target) > ended,
    );
    eprintln!("the writer's session ended {took:?} after its kill");
    let (ok, report, stderr) = check(&url, &journal);
    assert!(ok, "the check failed: {report} {stderr}");
    assert_eq!(report["durable_slots"], SLOTS);

    // A reservation holder killed: other nexuses conflict while it lives,
    // and may write once its session has ended (SPC-2 5.5.1: a
    // reservation is released on the loss of its I_T nexus).
    let holder_name = "iqn.2026-11.rs.iscsi:holder";
    let other = "iqn.2026-11.rs.iscsi:other";
    let mut holder = script(
        &format!("login {url}\nreserve\necho reserved\nsleep 600000\n"),
        holder_name,
        &dir.0,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("iscsi script starts");
    let stdout = std::io::BufReader::new(holder.stdout.take().unwrap());
    let said: Vec<String> = std::io::BufRead::lines(stdout)
        .map_while(Result::ok)
        .take_while(|line| line != "reserved")
        .collect();
    assert!(
        holder.try_wait().unwrap().is_none(),
        "the holder never reserved: {said:?}"
    );
    let refused = write_as(&url, other, &dir.0);
    assert!(
        !refused.status.success(),
        "a write past another's reservation"
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.to_lowercase().contains("reservation conflict"), "{why}");
    let ended = sessions_ended(&target);
    let _ = holder.kill();
    let _ = holder.wait();
    wait_until("the holder's session ends", Duration::from_secs(5), || {
        sessions_ended(&target) > ended
    });
    let written = write_as(&url, other, &dir.0);
    assert!(
        written.status.success(),
        "the reservation outlived its nexus: {}",
        String::from_utf8_lossy(&written.stderr)
    );

    // Nothing leaks: every socket of the killed sessions is closed.
    wait_until(
        "the target's descriptors are back to where they were",
        Duration::from_secs(5),
        || open_files(target.pid()) <= baseline,
    );
}
