//! `iscsi mount`: the LUNs of `iscsi target` as files through FUSE, used by
//! dd, fallocate and plain file I/O, checked against `iscsi read` and
//! `iscsi write` (another session, straight to the LUN); and the bad
//! cases: the target gone, the mount interrupted or killed during writes,
//! a read-only mount, a missing mount point, a user without permission.
//!
//! Needs root or a usable /dev/fuse, and fusermount3 (Debian's fuse3,
//! installed by scripts/test): the CI machine has both.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{our_target, succeeds};
use iscsi_test_peers::require;

const MIB: usize = 1 << 20;

/// A running `iscsi mount` on a fresh directory; on drop, stopped (SIGKILL)
/// and the directory unmounted and removed, whatever the test did.
struct Mount {
    child: Child,
    dir: PathBuf,
    log: PathBuf,
}

impl Mount {
    /// `iscsi mount URL DIR EXTRA...`, waiting until DIR/lun0 is there.
    fn start(url: &str, extra: &[&str]) -> Mount {
        require("fusermount3", "fuse3");
        let dir = scratch("mnt");
        std::fs::create_dir_all(&dir).expect("the mount point");
        let log = dir.with_extension("log");
        let child = Command::new(env!("CARGO_BIN_EXE_iscsi"))
            .arg("mount")
            .args(extra)
            .arg(url)
            .arg(&dir)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the log"))
            .spawn()
            .expect("iscsi mount starts");
        let mut mount = Mount { child, dir, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mount.dir.join("lun0").exists() {
            if let Ok(Some(status)) = mount.child.try_wait() {
                panic!("iscsi mount exited ({status}): {}", mount.log());
            }
            assert!(Instant::now() < deadline, "not mounted: {}", mount.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        mount
    }

    /// The LUN file `name` opened for reading and writing with O_DIRECT:
    /// every read and write reaches the target.
    fn open_direct(&self, name: &str) -> std::fs::File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(self.file(name))
            .unwrap()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits up to `limit` for the process to end.
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "iscsi mount still running after {limit:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn is_mounted(&self) -> bool {
        let mounts = std::fs::read_to_string("/proc/self/mounts").expect("/proc/self/mounts");
        let dir = self.dir.to_string_lossy();
        mounts.lines().any(|l| l.split(' ').nth(1) == Some(&dir))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.is_mounted() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A path of its own under the temporary directory.
fn scratch(what: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("iscsi-rs-mount-{}-{what}-{n}", std::process::id()))
}

/// `len` bytes of a pattern that differs with `seed` and position.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The LUN's bytes `offset..offset + length`, read by `iscsi read` in a
/// session of its own.
fn lun_bytes(url: &str, offset: usize, length: usize) -> Vec<u8> {
    let out = scratch("read");
    succeeds(&[
        "read",
        url,
        "--offset",
        &offset.to_string(),
        "--length",
        &length.to_string(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let data = std::fs::read(&out).expect("the read output");
    let _ = std::fs::remove_file(&out);
    data
}

fn run(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().expect(program);
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// 64 MiB through the file with dd and back with `iscsi read`, and the
/// reverse; dd's fsync reaches the target as SYNCHRONIZE CACHE (counted in
/// the mount's trace, with the one each LUN gets at unmount).
#[test]
fn dd_through_the_file_and_iscsi_read_see_the_same_bytes() {
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:mount-dd", &[]);
    let target_url = url.trim_end_matches("/0").to_owned();
    let trace = scratch("trace.json");
    let mut mount = Mount::start(&target_url, &["--trace", trace.to_str().unwrap()]);

    let first = pattern(1, 64 * MIB);
    let source = scratch("source");
    std::fs::write(&source, &first).unwrap();
    run(
        "dd",
        &[
            &format!("if={}", source.display()),
            &format!("of={}", mount.file("lun0").display()),
            "bs=1M",
            "conv=notrunc,fsync",
            "status=none",
        ],
    );
    assert!(
        lun_bytes(&url, 0, 64 * MIB) == first,
        "dd's bytes on the LUN"
    );

    let second = pattern(2, 64 * MIB);
    std::fs::write(&source, &second).unwrap();
    succeeds(&["write", &url, "-i", source.to_str().unwrap()]);
    let back = scratch("back");
    run(
        "dd",
        &[
            &format!("if={}", mount.file("lun0").display()),
            &format!("of={}", back.display()),
            "bs=1M",
            "iflag=direct",
            "status=none",
        ],
    );
    assert!(
        std::fs::read(&back).unwrap() == second,
        "iscsi write's bytes in the file"
    );
    let _ = std::fs::remove_file(&source);
    let _ = std::fs::remove_file(&back);
    // Through the page cache too: a new open sees the LUN, not old pages.
    assert!(std::fs::read(mount.file("lun0")).unwrap() == second);

    run("fusermount3", &["-u", mount.dir.to_str().unwrap()]);
    let status = mount.wait(Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", mount.log());
    let trace_text = std::fs::read_to_string(&trace).expect("the trace");
    let _ = std::fs::remove_file(&trace);
    let syncs = trace_text.matches("\"SYNCHRONIZE CACHE(10)\"").count();
    assert_eq!(syncs, 2, "dd's fsync and the unmount's flush");
}

/// Writes that are not whole blocks, hole punching and zeroing, seen from
/// another session.
#[test]
fn partial_blocks_holes_and_zeroes_reach_the_lun() {
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:mount-edges", &[]);
    let mount = Mount::start(url.trim_end_matches("/0"), &[]);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.file("lun0"))
        .unwrap();
    let base = pattern(3, 64 * 1024);
    file.write_all_at(&base, 0).unwrap();
    // 5 bytes across nothing, 700 bytes across a block boundary.
    file.write_all_at(b"hello", 1000).unwrap();
    file.write_all_at(&[0xAB; 700], 4000).unwrap();
    let mut want = base.clone();
    want[1000..1005].copy_from_slice(b"hello");
    want[4000..4700].fill(0xAB);
    assert!(lun_bytes(&url, 0, base.len()) == want);

    let path = mount.file("lun0");
    let path = path.to_str().unwrap();
    // A punched hole (unaligned edges) and a zeroed range read as zeros.
    run(
        "fallocate",
        &["--punch-hole", "-o", "8000", "-l", "20000", path],
    );
    want[8000..28000].fill(0);
    run(
        "fallocate",
        &["--zero-range", "-o", "40960", "-l", "8192", path],
    );
    want[40960..49152].fill(0);
    assert!(lun_bytes(&url, 0, base.len()) == want);
    // The file keeps the LUN's size: a write past its end fails, one
    // across it is short, truncation changes nothing.
    let size = 64 * MIB as u64;
    let past = file.write_at(b"x", size).unwrap_err();
    assert_eq!(past.raw_os_error(), Some(libc::ENOSPC), "{past}");
    assert_eq!(file.write_at(&[7; 10], size - 4).unwrap(), 4);
    file.set_len(0).unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().len(), size);
    assert_eq!(lun_bytes(&url, size as usize - 4, 4), [7; 4]);
}

/// `--read-only` refuses writes with EROFS; a missing mount point is said
/// before any login.
#[test]
fn read_only_mounts_and_missing_mount_points() {
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:mount-ro", &[]);
    let mount = Mount::start(url.trim_end_matches("/0"), &["--read-only"]);
    let refused = OpenOptions::new()
        .write(true)
        .open(mount.file("lun0"))
        .unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    assert_eq!(std::fs::read(mount.file("lun0")).unwrap().len(), 64 * MIB);

    let missing = scratch("missing");
    let output = common::iscsi(&["mount", &url, missing.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("mount point") && stderr.contains("No such file"),
        "{stderr}"
    );
}

/// A second mount of a mounted target is refused unless `--shared`; the
/// source /proc/mounts shows has no CHAP credentials.
#[test]
fn a_second_mount_of_one_target_is_refused_unless_shared() {
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:mount-twice", &[]);
    let target_url = url.trim_end_matches("/0");
    let first = Mount::start(target_url, &[]);
    let second_dir = scratch("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    // The same target with a user and secret in the URL: still the same.
    let with_secret = target_url.replace("iscsi://", "iscsi://someone%topsecret@");
    // Bounded: a mount that is not refused would serve until unmounted.
    let output = Command::new("timeout")
        .args(["-s", "INT", "30"])
        .arg(env!("CARGO_BIN_EXE_iscsi"))
        .args(["mount", &with_secret, second_dir.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .output()
        .expect("timeout runs");
    let _ = std::fs::remove_dir(&second_dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("already mounted") && stderr.contains(first.dir.to_str().unwrap()),
        "{stderr}"
    );
    assert!(!stderr.contains("topsecret"), "{stderr}");
    let second = Mount::start(target_url, &["--shared"]);
    std::fs::write(first.file("lun0"), b"from the first").unwrap();
    let mut seen = vec![0u8; 14];
    std::fs::File::open(second.file("lun0"))
        .unwrap()
        .read_exact_at(&mut seen, 0)
        .unwrap();
    assert_eq!(&seen, b"from the first", "a new open reads the LUN");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.contains(first.dir.to_str().unwrap()))
        .unwrap();
    assert!(line.starts_with(&format!("{target_url} ")), "{line}");
}

/// A user who may not mount gets a message that says what to do, and no
/// mount.
#[test]
fn a_user_without_permission_is_told_why() {
    require("setpriv", "util-linux");
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:mount-perm", &[]);
    let dir = scratch("perm");
    std::fs::create_dir_all(&dir).unwrap();
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_iscsi"))
        .args(["mount", url.trim_end_matches("/0")])
        .arg(&dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("setpriv runs");
    let _ = std::fs::remove_dir(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("mounting on {}", dir.display())),
        "{stderr}"
    );
    assert!(stderr.contains("run as root"), "{stderr}");
}

/// The target gone: I/O fails with EIO once the replacement timeout has
/// passed, nothing hangs, and the mount is still removed by fusermount3.
#[test]
fn a_lost_target_is_an_io_error_and_unmount_still_works() {
    let (target, url) = our_target("iqn.2026-11.rs.iscsi:mount-lost", &[]);
    let mut mount = Mount::start(
        url.trim_end_matches("/0"),
        &["--replacement-timeout", "2", "--timeout", "5"],
    );
    let file = mount.open_direct("lun0");
    file.write_all_at(&[1; 4096], 0).unwrap();
    drop(target);
    let start = Instant::now();
    let error = file.write_all_at(&[2; 4096], 4096).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    // It waited for the 2 s replacement timeout, not for ever.
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    // Once the replacement timeout has run out, I/O fails at once: it does
    // not wait a whole timeout again (a file system's every read would).
    let again = Instant::now();
    let mut block = vec![0u8; 4096];
    let error = file.read_exact_at(&mut block, 0).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    assert!(
        again.elapsed() < Duration::from_secs(1),
        "failing fast took {:?}",
        again.elapsed()
    );
    drop(file);
    run("fusermount3", &["-u", mount.dir.to_str().unwrap()]);
    let status = mount.wait(Duration::from_secs(60));
    // The last flush could not reach the target: said, and a failure.
    assert!(!status.success());
    assert!(
        mount.log().contains("SYNCHRONIZE CACHE of LUN 0"),
        "{}",
        mount.log()
    );
    assert!(!mount.is_mounted());
}

/// A target that hangs with its connection open (SIGSTOP): a write fails
/// within the command and replacement timeouts, the next I/O fails at
/// once, and once the target runs again (SIGCONT) the same mount serves
/// I/O again, with what was written before the hang intact.
#[test]
fn a_hung_target_fails_io_in_bounded_time_and_serves_again_when_it_resumes() {
    let (target, url) = our_target("iqn.2026-11.rs.iscsi:mount-hung", &[]);
    let mount = Mount::start(
        url.trim_end_matches("/0"),
        &["--replacement-timeout", "2", "--timeout", "2"],
    );
    let file = mount.open_direct("lun0");
    let before = pattern(7, 4096);
    file.write_all_at(&before, 0).unwrap();
    iscsi_test_peers::stop_process(target.pid());
    let start = Instant::now();
    let error = file.write_all_at(&[2; 4096], 4096).unwrap_err();
    let errno = error.raw_os_error();
    assert!(
        errno == Some(libc::EIO) || errno == Some(libc::ETIMEDOUT),
        "{error}"
    );
    let first = start.elapsed();
    assert!(
        first < Duration::from_secs(30),
        "the first failure took {first:?}"
    );
    // The session is being replaced or has failed: within the replacement
    // timeout plus one login's time, I/O fails at once.
    let deadline = Instant::now() + Duration::from_secs(30);
    let fast = loop {
        let again = Instant::now();
        let mut block = vec![0u8; 4096];
        let error = file.read_exact_at(&mut block, 0).unwrap_err();
        assert!(
            matches!(
                error.raw_os_error(),
                Some(libc::EIO) | Some(libc::ETIMEDOUT)
            ),
            "{error}"
        );
        if again.elapsed() < Duration::from_millis(500) {
            break again.elapsed();
        }
        assert!(Instant::now() < deadline, "I/O never failed fast");
    };
    eprintln!("hung target: first failure after {first:?}, then failing in {fast:?}");
    iscsi_test_peers::signal_process(target.pid(), "-CONT");
    // The mount logs in again by itself (an attempt at most 2 s apart).
    let deadline = Instant::now() + Duration::from_secs(30);
    let resumed = Instant::now();
    loop {
        match file.write_all_at(&[3; 4096], 4096) {
            Ok(()) => break,
            Err(error) if Instant::now() < deadline => {
                assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(error) => panic!("the resumed target was never used again: {error}"),
        }
    }
    eprintln!("served again {:?} after SIGCONT", resumed.elapsed());
    let mut block = vec![0u8; 4096];
    file.read_exact_at(&mut block, 0).unwrap();
    assert!(block == before, "data written before the hang changed");
    assert_eq!(lun_bytes(&url, 4096, 4096), vec![3u8; 4096]);
    drop(target);
}

/// Blocks of the 64 MiB LUN the writer cycles over.
const BLOCKS: usize = 64;

/// The writer's pause signal, the way to resume it, and its thread.
type Writer = (
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<(usize, Option<std::io::Error>)>,
);

/// 1 MiB writes of a known pattern in a thread, write `n` to block
/// `n % BLOCKS`, until `total` writes or the first failure. After
/// `pause_at` acknowledged writes it says so on `paused` and waits for
/// `resume`, so that the test acts while writes are under way. Returns how
/// many writes were acknowledged (returned) and the failure, if any.
fn writer(path: &Path, total: usize, pause_at: usize) -> Writer {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    let (paused_tx, paused) = std::sync::mpsc::channel();
    let (resume, resume_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        for n in 0..total {
            if n == pause_at {
                paused_tx.send(()).unwrap();
                resume_rx.recv().unwrap();
            }
            let at = ((n % BLOCKS) * MIB) as u64;
            if let Err(error) = file.write_all_at(&pattern(100 + n as u64, MIB), at) {
                return (n, Some(error));
            }
        }
        (total, None)
    });
    (paused, resume, thread)
}

/// Checks each block of the LUN holds the last acknowledged of the
/// `acknowledged` writes to it, or, for the block of the write that failed
/// (if `failed`), that write's data instead: it may or may not have landed.
fn check_acknowledged(url: &str, acknowledged: usize, failed: bool) {
    let data = lun_bytes(url, 0, BLOCKS * MIB);
    for block in 0..BLOCKS {
        let found = &data[block * MIB..(block + 1) * MIB];
        let last = (0..acknowledged).rev().find(|n| n % BLOCKS == block);
        let unacknowledged = (failed && acknowledged % BLOCKS == block)
            .then(|| pattern(100 + acknowledged as u64, MIB));
        if unacknowledged.as_deref() == Some(found) {
            continue;
        }
        if let Some(n) = last {
            assert!(
                found == &pattern(100 + n as u64, MIB)[..],
                "block {block}: acknowledged write {n} (of {acknowledged}) lost"
            );
        }
    }
}

/// SIGINT during writes: the mount leaves the namespace at once, the
/// writer's open file keeps working to its end, then the process exits
/// cleanly; every write is on the LUN.
#[test]
fn an_interrupt_during_writes_finishes_them_and_unmounts() {
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:mount-int", &[]);
    let mut mount = Mount::start(url.trim_end_matches("/0"), &[]);
    let (paused, resume, writing) = writer(&mount.file("lun0"), 2 * BLOCKS, 16);
    paused.recv().unwrap();
    mount.signal("-INT");
    let deadline = Instant::now() + Duration::from_secs(30);
    while mount.is_mounted() {
        assert!(Instant::now() < deadline, "still mounted: {}", mount.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    resume.send(()).unwrap();
    let (acknowledged, error) = writing.join().unwrap();
    assert!(error.is_none(), "{error:?} after {acknowledged} writes");
    let status = mount.wait(Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", mount.log());
    check_acknowledged(&url, acknowledged, false);
}

/// SIGKILL during writes: the writer's next request fails (ENOTCONN or
/// ECONNABORTED), no
/// process hangs, every write acknowledged before is on the LUN, and the
/// dead mount is removed with fusermount3.
#[test]
fn a_kill_during_writes_loses_no_acknowledged_write() {
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:mount-kill", &[]);
    let mut mount = Mount::start(url.trim_end_matches("/0"), &[]);
    let (paused, resume, writing) = writer(&mount.file("lun0"), usize::MAX, 16);
    paused.recv().unwrap();
    resume.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    mount.signal("-KILL");
    mount.wait(Duration::from_secs(10));
    let (acknowledged, error) = writing.join().unwrap();
    let error = error.expect("the writer stops at a failure");
    // ECONNABORTED for the write in flight when the server died, ENOTCONN
    // for one sent after: which it is depends on timing.
    assert!(
        matches!(
            error.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED)
        ),
        "{error}"
    );
    check_acknowledged(&url, acknowledged, true);
    assert!(mount.is_mounted(), "a killed FUSE server leaves its mount");
    // The dead mount does not block a new one: it is removed, said.
    let again = Mount::start(url.trim_end_matches("/0"), &[]);
    assert!(!mount.is_mounted(), "the dead mount is still there");
    assert!(
        again.log().contains("removing a dead mount"),
        "{}",
        again.log()
    );
}

/// Two mounts of one target started together: exactly one mounts, the
/// other is refused (each claims the target before looking for a mount).
#[test]
fn two_mounts_started_together_mount_once() {
    require("fusermount3", "fuse3");
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:mount-race", &[]);
    let target_url = url.trim_end_matches("/0");
    let dirs = [scratch("race-a"), scratch("race-b")];
    let children: Vec<Child> = dirs
        .iter()
        .map(|dir| {
            std::fs::create_dir_all(dir).unwrap();
            Command::new(env!("CARGO_BIN_EXE_iscsi"))
                .args(["mount", target_url, dir.to_str().unwrap()])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    let mut refused = Vec::new();
    // Until one has exited refused and the other has mounted.
    while refused.is_empty() || !dirs.iter().any(|d| d.join("lun0").exists()) {
        assert!(
            Instant::now() < deadline,
            "neither mounted and refused in 30 s"
        );
        for slot in children.iter_mut() {
            if let Some(child) = slot
                && let Ok(Some(status)) = child.try_wait()
            {
                let mut stderr = String::new();
                use std::io::Read;
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr)
                    .unwrap();
                assert!(!status.success(), "{stderr}");
                refused.push(stderr);
                *slot = None;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("being mounted") || refused[0].contains("already mounted"),
        "{}",
        refused[0]
    );
    for (slot, dir) in children.iter_mut().zip(&dirs) {
        if let Some(mut child) = slot.take() {
            run("fusermount3", &["-u", dir.to_str().unwrap()]);
            assert!(child.wait().unwrap().success());
        }
        let _ = std::fs::remove_dir(dir);
    }
}

/// A URL per portal: each LUN is served through a multipath set over both,
/// its bytes land on the LU, and the unmount logs every path out.
#[test]
fn a_url_per_portal_mounts_each_lun_over_both() {
    let second = iscsi_test_peers::free_port();
    let name = "iqn.2026-11.rs.iscsi:mount-paths";
    let (_target, url) = our_target(name, &["--listen", &format!("127.0.0.1:{second}")]);
    let first = url.trim_end_matches("/0").to_owned();
    let other = format!("iscsi://127.0.0.1:{second}/{name}");
    let mut mount = Mount::start(&first, &[&other]);
    let data = pattern(7, 4 * MIB);
    mount
        .open_direct("lun0")
        .write_all_at(&data, MIB as u64)
        .unwrap();
    assert!(lun_bytes(&url, MIB, 4 * MIB) == data, "the bytes on the LU");
    run("fusermount3", &["-u", mount.dir.to_str().unwrap()]);
    let status = mount.wait(Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", mount.log());
}
