//! libiscsi's conformance suite (`iscsi-test-cu`, Debian package
//! libiscsi-bin) against `iscsi target`: every test, data-destroying ones
//! included (`-d`), with a second URL to the same LUN for the multipath
//! tests. The yardstick LIO, SCST and QEMU developers use: no test may
//! fail, and the "[SKIPPED]" lines (features the suite found missing) may
//! not grow past what the target is known to lack.

use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NAME: &str = "iqn.2026-11.rs.iscsi:conformance";

/// "[SKIPPED]" lines at most. What is left: EXTENDED COPY and RECEIVE COPY
/// RESULTS, SANITIZE (needs `-S`), removable-medium and write-protect
/// tests that do not apply to this disk, WRITE ATOMIC, and the tests that
/// need LBPPB > 1.
const MAX_SKIPPED: usize = 60;

#[test]
fn libiscsi_conformance_suite_passes() {
    let have = Command::new("sh")
        .args(["-c", "command -v iscsi-test-cu"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        have,
        "iscsi-test-cu is missing (libiscsi-bin): run scripts/test, which installs it"
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut target = Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args(["target", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--name", NAME, "--lun", "ram:256M", "--lun", "ram:64M"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iscsi target starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "iscsi target did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("iscsi://127.0.0.1:{port}/{NAME}/0");
    let output = Command::new("timeout")
        .args(["600", "iscsi-test-cu", "-d", "--test=ALL", &url, &url])
        .output()
        .expect("iscsi-test-cu runs");
    let _ = target.kill();
    let _ = target.wait();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    // "               tests    230    230    230      0        0"
    let tests: Vec<u64> = text
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .unwrap_or_else(|| panic!("no summary in the suite's output:\n{text}"))
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let [total, ran, passed, failed, ..] = tests[..] else {
        panic!("unexpected summary {tests:?}");
    };
    let failures: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Test:") && (l.contains("FAILED") || l.ends_with("...FAILED")))
        .collect();
    assert_eq!(failed, 0, "failed tests:\n{}", failures.join("\n"));
    assert_eq!(ran, total);
    assert_eq!(passed, total);
    assert!(total >= 230, "the suite ran {total} tests");
    let skipped = text.matches("[SKIPPED]").count();
    println!("iscsi-test-cu: {total} tests, {passed} passed, {failed} failed, {skipped} [SKIPPED]");
    assert!(
        skipped <= MAX_SKIPPED,
        "{skipped} [SKIPPED] lines, more than {MAX_SKIPPED}"
    );
}
