//! libiscsi's conformance suite (`iscsi-test-cu`, Debian package
//! libiscsi-bin) against `iscsi target`: every test, data-destroying ones
//! included (`-d`), with a second URL to the same LUN for the multipath
//! tests. The yardstick LIO, SCST and QEMU developers use: no test may
//! fail, and the "[SKIPPED]" lines (features the suite found missing) may
//! not grow past what the target is known to lack.

use std::process::Command;

use iscsi_test_peers::{Peer, free_port, require};

const NAME: &str = "iqn.2026-11.rs.iscsi:conformance";

/// "[SKIPPED]" lines at most: exactly what libiscsi 1.19.0 prints against
/// a RAM or file LUN. What is left: EXTENDED COPY and RECEIVE COPY RESULTS
/// (16), WRITE ATOMIC (11), SANITIZE (11, needs `-S`), removable-medium
/// (9) and write-protect (1) tests that do not apply to this disk, and the
/// tests that need LBPPB > 1 (5).
const MAX_SKIPPED: usize = 53;

/// The same for a block-device LUN, which is not thin-provisioned: the
/// LBPPB skips become "fully provisioned" ones, 8 more tests skip for that
/// reason and UNMAP is not offered (62).
const MAX_SKIPPED_BLOCK: usize = 62;

/// What one run of the suite reported.
struct Summary {
    total: u64,
    passed: u64,
    failed: u64,
    skipped: usize,
    failures: String,
}

/// Runs the whole suite against `iscsi target` serving `luns` (LUN 0 is
/// the one tested).
fn suite(luns: &[&str]) -> Summary {
    require("iscsi-test-cu", "libiscsi-bin");
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["target", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--name", NAME])
        .env("RUST_LOG", "warn");
    for lun in luns {
        command.args(["--lun", lun]);
    }
    let target = Peer::spawn(command, port);
    let url = format!("iscsi://127.0.0.1:{port}/{NAME}/0");
    let output = Command::new("timeout")
        .args(["600", "iscsi-test-cu", "-d", "--test=ALL", &url, &url])
        .output()
        .expect("iscsi-test-cu runs");
    drop(target);
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
    assert_eq!(ran, total);
    let failures = text
        .lines()
        .filter(|l| l.contains("Test:") && l.contains("FAILED"))
        .collect::<Vec<_>>()
        .join("\n");
    let skipped = text.matches("[SKIPPED]").count();
    println!(
        "iscsi-test-cu {luns:?}: {total} tests, {passed} passed, {failed} failed, {skipped} [SKIPPED]"
    );
    Summary {
        total,
        passed,
        failed,
        skipped,
        failures,
    }
}

fn check(summary: &Summary, max_skipped: usize) {
    assert_eq!(summary.failed, 0, "failed tests:\n{}", summary.failures);
    assert_eq!(summary.passed, summary.total);
    assert!(
        summary.total >= 230,
        "the suite ran {} tests",
        summary.total
    );
    assert!(
        summary.skipped <= max_skipped,
        "{} [SKIPPED] lines, more than {max_skipped}",
        summary.skipped
    );
}

#[test]
fn the_suite_passes_on_a_ram_lun() {
    check(&suite(&["ram:256M", "ram:64M"]), MAX_SKIPPED);
}

#[test]
fn the_suite_passes_on_a_file_lun() {
    let path =
        std::env::temp_dir().join(format!("iscsi-rs-conformance-{}.img", std::process::id()));
    let spec = format!("file:{},size=256M", path.display());
    let summary = suite(&[&spec, "ram:64M"]);
    let _ = std::fs::remove_file(&path);
    check(&summary, MAX_SKIPPED);
}

/// A loop device over a file: a real block device (O_DIRECT too).
#[test]
fn the_suite_passes_on_a_block_device() {
    if !std::path::Path::new("/dev/loop-control").exists() {
        println!("SKIPPED: no /dev/loop-control on this machine: no loop device to test with");
        return;
    }
    let path =
        std::env::temp_dir().join(format!("iscsi-rs-conformance-{}.blk", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let out = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&path)
        .output()
        .expect("losetup runs");
    assert!(
        out.status.success(),
        "losetup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let device = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let spec = format!("block:{device},direct");
    let summary = suite(&[&spec, "ram:64M"]);
    let _ = Command::new("losetup").args(["-d", &device]).status();
    let _ = std::fs::remove_file(&path);
    // A block device is not thin-provisioned: the suite's thin
    // provisioning tests skip on it.
    check(&summary, MAX_SKIPPED_BLOCK);
}
