//! libiscsi's conformance suite (`iscsi-test-cu`, Debian package
//! libiscsi-bin) against `iscsi target`: data-destroying tests included
//! (`-d`), with a second URL to the same LUN for the multipath tests. The
//! yardstick LIO, SCST and QEMU developers use: no test may fail, and each
//! configuration names the tests it expects to skip, each with its reason;
//! a test that skips anywhere else fails the run, named.
//!
//! The suite decides what applies from what the LU reports (RMB, WP,
//! LBPPB, thin provisioning), so one LUN cannot run every test: the
//! configurations below (RAM, file and block stores; a read-only, a
//! removable, a 512e and an encrypted LUN; `-S` for SANITIZE) together
//! must run every test of the suite unskipped at least once.
//!
//! The whole suite takes about 30 s against a RAM LUN; the option LUNs run
//! only the families their option changes, so the file stays within a few
//! minutes on two cores. The configurations of the coverage test run on
//! parallel threads, each with its own target and port.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use iscsi_test_peers::{Peer, free_port, require};

const NAME: &str = "iqn.2026-11.rs.iscsi:conformance";

/// A test name as the suite prints it: `Suite.Test`, and why it may skip.
type Skip = (&'static str, &'static str);

/// The one test the whole-suite runs leave out: it aborts a SANITIZE
/// without IMMED (ABORT TASK, LUN and target resets), logs out and in
/// again, and wants the sanitize still running some four seconds after it
/// began, which an honest overwrite of a RAM or file LUN is not;
/// [`SLOW_SANITIZE`] runs it (about a minute: the test then sleeps 60 s).
const SANITIZE_RESET: &str = "Sanitize.Reset";

/// A LUN whose every write waits 40 ms: SANITIZE OVERWRITE writes it in
/// 1 MiB steps, so it runs for at least 256 x 40 ms = 10 s.
const SLOW_SANITIZE: &str = "ram:256M,latency=40ms";

/// What skips with `-S` on a store that is not encrypted (`,encrypt`):
/// CRYPTOGRAPHIC ERASE is refused (and not reported as supported); the
/// encrypted RAM LUN runs these.
const NO_CRYPTO_ERASE: &[Skip] = &[
    (
        "Sanitize.CryptoErase",
        "not encrypted: CRYPTOGRAPHIC ERASE is not offered (the encrypted LUN runs it)",
    ),
    (
        "Sanitize.Readonly",
        "skips its CRYPTOGRAPHIC ERASE part (not offered here); the rest runs",
    ),
    (
        "Sanitize.Reservations",
        "skips its CRYPTOGRAPHIC ERASE part (not offered here); the rest runs",
    ),
];

/// What skips on a store without BLOCK ERASE (a block device: not thin, so
/// it cannot deallocate everything) besides [`NO_CRYPTO_ERASE`]'s.
const NO_BLOCK_ERASE: &[Skip] = &[(
    "Sanitize.BlockErase",
    "no BLOCK ERASE on a fully provisioned LU: the RAM and file LUNs run it",
)];

/// What skips on a file or block LUN besides [`PLAIN_LUN`]'s: writes go
/// through the kernel, which promises no atomicity to a concurrent reader
/// or a crash, so WRITE ATOMIC(16) is not offered; the RAM LUN runs these.
const NO_ATOMIC_WRITE: &[Skip] = &[
    (
        "WriteAtomic16.Simple",
        "no atomic writes: the RAM LUN runs it",
    ),
    (
        "WriteAtomic16.BeyondEol",
        "no atomic writes: the RAM LUN runs it",
    ),
    (
        "WriteAtomic16.ZeroBlocks",
        "no atomic writes: the RAM LUN runs it",
    ),
    (
        "WriteAtomic16.WriteProtect",
        "no atomic writes: the RAM LUN runs it",
    ),
    (
        "WriteAtomic16.DpoFua",
        "no atomic writes: the RAM LUN runs it",
    ),
    ("WriteAtomic16.VPD", "no atomic writes: the RAM LUN runs it"),
];

/// What skips on a plain LUN (RAM or file): the option LUNs run these.
const PLAIN_LUN: &[Skip] = &[
    (
        "CompareAndWrite.InvalidDataOutSize",
        "needs LBPPB > 1: the 512e LUN runs it",
    ),
    (
        "WriteSame10.UnmapUnaligned",
        "needs LBPPB > 1: the 512e LUN runs it",
    ),
    (
        "WriteSame10.InvalidDataOutSize",
        "needs LBPPB > 1: the 512e LUN runs it",
    ),
    (
        "WriteSame16.UnmapUnaligned",
        "needs LBPPB > 1: the 512e LUN runs it",
    ),
    (
        "WriteSame16.InvalidDataOutSize",
        "needs LBPPB > 1: the 512e LUN runs it",
    ),
    (
        "PreventAllow.Simple",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "PreventAllow.Eject",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "PreventAllow.ITNexusLoss",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "PreventAllow.Logout",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "PreventAllow.WarmReset",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "PreventAllow.ColdReset",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "PreventAllow.LUNReset",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "PreventAllow.2ITNexuses",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "StartStopUnit.Simple",
        "needs a removable LU: the removable LUN runs it",
    ),
    (
        "ReadOnly.ReadOnlySBC",
        "needs a write-protected LU: the read-only LUN runs it",
    ),
];

/// What skips on a block device besides [`PLAIN_LUN`]'s: it is fully
/// provisioned (not thin), so the suite's thin-provisioning tests do not
/// apply and UNMAP is not offered; the RAM and file LUNs run them.
const FULLY_PROVISIONED: &[Skip] = &[
    (
        "GetLBAStatus.UnmapSingle",
        "fully provisioned: the RAM LUN runs it",
    ),
    (
        "Inquiry.BlockLimits",
        "fully provisioned: the RAM LUN runs it",
    ),
    ("Unmap.Simple", "fully provisioned: the RAM LUN runs it"),
    (
        "Unmap.VPD",
        "no UNMAP on a fully provisioned LU: the RAM LUN runs it",
    ),
    ("Unmap.ZeroBlocks", "fully provisioned: the RAM LUN runs it"),
    (
        "WriteSame10.Unmap",
        "fully provisioned: the RAM LUN runs it",
    ),
    (
        "WriteSame10.UnmapUntilEnd",
        "fully provisioned: the RAM LUN runs it",
    ),
    (
        "WriteSame16.Unmap",
        "fully provisioned: the RAM LUN runs it",
    ),
    (
        "WriteSame16.UnmapUntilEnd",
        "fully provisioned: the RAM LUN runs it",
    ),
];

/// The families a read-only LUN runs: ReadOnly (every command that writes
/// must fail with WRITE PROTECTED) and what must still work. The rest of
/// the suite writes and expects to succeed.
const READ_ONLY_TESTS: &str = "SCSI.ReadOnly,SCSI.Read6,SCSI.Read10,SCSI.Read12,SCSI.Read16,\
    SCSI.ReadCapacity10,SCSI.ReadCapacity16,SCSI.Inquiry,SCSI.TestUnitReady";

/// The families a removable LUN runs: the medium's own and what a
/// removable LU answers differently.
const REMOVABLE_TESTS: &str = "SCSI.PreventAllow,SCSI.StartStopUnit,SCSI.NoMedia,SCSI.Inquiry,\
    SCSI.TestUnitReady,SCSI.Read10,SCSI.Write10";

/// The families a 512e LUN runs: those that need LBPPB > 1 and those that
/// read the physical block size. (GetLBAStatus.UnmapSingle is left out:
/// with LBPPB > 1 it asks about LBA i + 1 and wants the answer to start at
/// i + LBPPB, which SBC-3 §5.6 does not allow; libiscsi 1.19.0.)
const PHYSICAL_4K_TESTS: &str = "SCSI.CompareAndWrite,SCSI.WriteSame10,SCSI.WriteSame16,\
    SCSI.ReadCapacity16,SCSI.Inquiry,SCSI.Unmap,SCSI.Read10,SCSI.Write10";

/// One run of the suite: the LUNs served (LUN 0 is tested), the tests
/// (`ALL` or a list of families) and the suite's own flags.
struct Run<'a> {
    name: &'a str,
    luns: Vec<String>,
    tests: &'a str,
    flags: &'a [&'a str],
    /// The tests it may skip, with why.
    skips: Vec<Skip>,
}

/// What one run of the suite reported.
struct Summary {
    total: u64,
    passed: u64,
    failed: u64,
    /// Every test that ran, as `Suite.Test`.
    tests: BTreeSet<String>,
    /// The tests that printed "[SKIPPED]", with the suite's first reason.
    skipped: BTreeMap<String, String>,
    failures: Vec<String>,
}

/// Reads the suite's output: "Suite: NAME", then "  Test: NAME ..." per
/// test, then its messages ("[SKIPPED] why", "[FAILED] what") and "passed"
/// or "FAILED"; the run summary ("tests 230 230 230 0 0") at the end.
fn parse(text: &str) -> Summary {
    let mut suite = String::new();
    let mut test: Option<String> = None;
    let mut tests = BTreeSet::new();
    let mut skipped = BTreeMap::new();
    let mut failures = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("Suite: ") {
            suite = name.trim().to_owned();
            test = None;
            continue;
        }
        if let Some(rest) = line.trim_start().strip_prefix("Test: ")
            && let Some((name, _)) = rest.split_once(" ...")
        {
            let full = format!("{suite}.{name}");
            tests.insert(full.clone());
            test = Some(full);
        }
        let Some(current) = &test else { continue };
        if let Some((_, why)) = line.split_once("[SKIPPED]") {
            skipped
                .entry(current.clone())
                .or_insert_with(|| why.trim().to_owned());
        }
        if line.trim() == "FAILED" || line.trim_end().ends_with("...FAILED") {
            failures.push(current.clone());
        }
    }
    // "               tests    230    230    230      0        0"
    let counts: Vec<u64> = text
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .unwrap_or_else(|| panic!("no summary in the suite's output:\n{text}"))
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let [total, ran, passed, failed, ..] = counts[..] else {
        panic!("unexpected summary {counts:?}");
    };
    assert_eq!(ran, total);
    Summary {
        total,
        passed,
        failed,
        tests,
        skipped,
        failures,
    }
}

/// Runs the suite as `run` says against `iscsi target` serving its LUNs.
fn suite(run: &Run) -> Summary {
    require("iscsi-test-cu", "libiscsi-bin");
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["target", "--control", "none"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--name", NAME])
        .env("RUST_LOG", "warn");
    for lun in &run.luns {
        command.args(["--lun", lun]);
    }
    let target = Peer::spawn(command, port);
    let url = format!("iscsi://127.0.0.1:{port}/{NAME}/0");
    let output = Command::new("timeout")
        .arg("600")
        .arg("iscsi-test-cu")
        .args(run.flags)
        .args(["-d", &format!("--test={}", run.tests), &url, &url])
        .output()
        .expect("iscsi-test-cu runs");
    drop(target);
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let summary = parse(&text);
    println!(
        "{}: iscsi-test-cu {} --test={} {:?}: {} tests, {} passed, {} failed, {} skipped",
        run.name,
        run.flags.join(" "),
        if run.tests.len() > 200 {
            "(all but Sanitize.Reset)"
        } else {
            run.tests
        },
        run.luns,
        summary.total,
        summary.passed,
        summary.failed,
        summary.skipped.len()
    );
    for (test, why) in &summary.skipped {
        println!("  skipped {test}: {why}");
    }
    summary
}

/// No failure, and no skip that `run` does not expect (named if any).
fn check(run: &Run, summary: &Summary) {
    assert_eq!(
        summary.failed, 0,
        "{}: failed tests: {:?}",
        run.name, summary.failures
    );
    assert_eq!(summary.passed, summary.total, "{}", run.name);
    let expected: BTreeSet<&str> = run.skips.iter().map(|&(t, _)| t).collect();
    let unexpected: Vec<String> = summary
        .skipped
        .iter()
        .filter(|(t, _)| !expected.contains(t.as_str()))
        .map(|(t, why)| format!("{t} ({why})"))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{}: tests skipped that should run: {unexpected:?}",
        run.name
    );
    // A listed skip that now runs is good news, not an error: say so,
    // so that the list is trimmed.
    for t in expected {
        if summary.tests.contains(t) && !summary.skipped.contains_key(t) {
            println!(
                "  {}: {t} is listed as skipping but ran: trim the list",
                run.name
            );
        }
    }
}

/// Every test of the suite but [`SANITIZE_RESET`]: each family ("ALL.Read10",
/// as `iscsi-test-cu --list` prints them) whole but Sanitize's, whose
/// other tests are named one by one. Families, not single tests: some of
/// libiscsi 1.19.0's tests pass only after the one before them in their
/// family (iSCSITMF.LUNResetSimpleAsync reads a flag that
/// AbortTaskSimpleAsync leaves set).
fn all_but_sanitize_reset() -> String {
    require("iscsi-test-cu", "libiscsi-bin");
    let out = Command::new("iscsi-test-cu")
        .arg("--list")
        .output()
        .expect("iscsi-test-cu --list runs");
    let list = String::from_utf8_lossy(&out.stdout).into_owned();
    let reset = format!("ALL.{SANITIZE_RESET}");
    let names: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|l| match l.matches('.').count() {
            1 => l.starts_with("ALL.") && *l != "ALL.Sanitize",
            2 => l.starts_with("ALL.Sanitize.") && *l != reset,
            _ => false,
        })
        .collect();
    assert!(
        names.len() > 50 && names.iter().any(|n| n.starts_with("ALL.Sanitize.")),
        "iscsi-test-cu --list: {list}"
    );
    names.join(",")
}

/// Every test of the suite as the parser names them ("Suite.Test").
fn list_of_every_test() -> Vec<String> {
    let out = Command::new("iscsi-test-cu")
        .arg("--list")
        .output()
        .expect("iscsi-test-cu --list runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("ALL.") && l.matches('.').count() == 2)
        .map(|l| l["ALL.".len()..].to_owned())
        .collect()
}

/// The whole suite with `-S` on a plain LUN (`spec`), as the default RAM,
/// the file and the block LUN run it: all but [`SANITIZE_RESET`].
fn whole_suite<'a>(name: &'a str, spec: String, tests: &'a str) -> Run<'a> {
    let mut skips = NO_CRYPTO_ERASE.to_vec();
    skips.extend_from_slice(PLAIN_LUN);
    Run {
        name,
        luns: vec![spec, "ram:64M".into()],
        tests,
        flags: &["-S"],
        skips,
    }
}

/// The default RAM LUN, then every option LUN and the slow SANITIZE, on
/// parallel threads; then every test of the suite must have run unskipped
/// in one of them.
#[test]
fn the_suite_passes_and_every_test_runs_somewhere() {
    let all = all_but_sanitize_reset();
    let runs = [
        whole_suite("RAM LUN", "ram:256M".into(), &all),
        Run {
            name: "read-only LUN",
            luns: vec!["ram:64M,readonly".into(), "ram:64M".into()],
            tests: READ_ONLY_TESTS,
            flags: &[],
            skips: Vec::new(),
        },
        Run {
            name: "removable LUN",
            luns: vec!["ram:64M,removable".into(), "ram:64M".into()],
            tests: REMOVABLE_TESTS,
            flags: &[],
            skips: Vec::new(),
        },
        Run {
            name: "512e LUN",
            luns: vec!["ram:256M,physical-block=4096".into(), "ram:64M".into()],
            tests: PHYSICAL_4K_TESTS,
            flags: &[],
            skips: Vec::new(),
        },
        Run {
            name: "encrypted RAM LUN",
            luns: vec!["ram:256M,encrypt".into(), "ram:64M".into()],
            tests: &all,
            flags: &["-S"],
            skips: PLAIN_LUN.to_vec(),
        },
        Run {
            name: "slow SANITIZE",
            luns: vec![SLOW_SANITIZE.into(), "ram:64M".into()],
            tests: "SCSI.Sanitize.Reset",
            flags: &["-S"],
            skips: Vec::new(),
        },
    ];
    let summaries: Vec<Summary> = std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .map(|run| scope.spawn(move || suite(run)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a suite run"))
            .collect()
    });
    for (run, summary) in runs.iter().zip(&summaries) {
        check(run, summary);
    }
    assert!(
        // libiscsi 1.19.0 has 230; one is SANITIZE_RESET.
        summaries[0].total >= 229,
        "the whole suite ran {} tests",
        summaries[0].total
    );
    let ran_somewhere: BTreeSet<&String> = summaries
        .iter()
        .flat_map(|s| s.tests.iter().filter(|t| !s.skipped.contains_key(*t)))
        .collect();
    let listed = list_of_every_test();
    let never: Vec<&String> = listed
        .iter()
        .filter(|t| !ran_somewhere.contains(t))
        .collect();
    assert!(
        never.is_empty(),
        "tests no configuration runs unskipped: {never:?}"
    );
}

#[test]
fn the_suite_passes_on_a_file_lun() {
    let path =
        std::env::temp_dir().join(format!("iscsi-rs-conformance-{}.img", std::process::id()));
    let all = all_but_sanitize_reset();
    let mut run = whole_suite(
        "file LUN",
        format!("file:{},size=256M", path.display()),
        &all,
    );
    run.skips.extend_from_slice(NO_ATOMIC_WRITE);
    let summary = suite(&run);
    let _ = std::fs::remove_file(&path);
    check(&run, &summary);
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
    let all = all_but_sanitize_reset();
    let mut run = whole_suite("block device LUN", format!("block:{device},direct"), &all);
    run.skips.extend_from_slice(NO_ATOMIC_WRITE);
    // Not thin-provisioned: the LBPPB skips say "fully provisioned"
    // instead, and the thin-provisioning tests skip too.
    run.skips.extend_from_slice(FULLY_PROVISIONED);
    run.skips.extend_from_slice(NO_BLOCK_ERASE);
    let summary = suite(&run);
    let _ = Command::new("losetup").args(["-d", &device]).status();
    let _ = std::fs::remove_file(&path);
    check(&run, &summary);
}

/// The parser names the test a "[SKIPPED]" or a failure belongs to.
#[test]
fn the_output_parser_names_skipped_and_failed_tests() {
    let text = "Suite: Read10\n  Test: Simple ...passed\n  Test: Odd ...    [SKIPPED] no.\n\
        passed\nSuite: Write10\n  Test: Simple ...\n    [SKIPPED] later\n    [FAILED] oops\n\
        FAILED\n    1. x.c:1  - CU_FAIL\n\n               tests      3      3      2      1        0\n";
    let s = parse(text);
    assert_eq!((s.total, s.passed, s.failed), (3, 2, 1));
    assert_eq!(s.tests.len(), 3);
    assert_eq!(s.skipped["Read10.Odd"], "no.");
    assert_eq!(s.skipped["Write10.Simple"], "later");
    assert_eq!(s.failures, ["Write10.Simple"]);
    let run = Run {
        name: "t",
        luns: Vec::new(),
        tests: "ALL",
        flags: &[],
        skips: vec![("Read10.Odd", "why")],
    };
    let ok = Summary {
        failed: 0,
        passed: 3,
        failures: Vec::new(),
        ..parse(text)
    };
    let caught = std::panic::catch_unwind(|| check(&run, &ok)).unwrap_err();
    let message = caught.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("Write10.Simple (later)"), "{message}");
}
