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
//! removable and a 512e LUN; `-S` for SANITIZE) together must run every
//! test of the suite unskipped at least once, except the commands other
//! branches are adding ([`UNTIL_EXTENDED_COPY`], [`UNTIL_WRITE_ATOMIC`],
//! [`UNTIL_SANITIZE`]: remove each list when its command lands).
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

/// EXTENDED COPY and RECEIVE COPY RESULTS are being added on another
/// branch: until EXTENDED COPY lands these skip everywhere.
const UNTIL_EXTENDED_COPY: &[Skip] = &[
    ("ExtendedCopy.Simple", "EXTENDED COPY not implemented yet"),
    ("ExtendedCopy.ParamHdr", "EXTENDED COPY not implemented yet"),
    (
        "ExtendedCopy.DescrLimits",
        "RECEIVE COPY RESULTS not implemented yet",
    ),
    (
        "ExtendedCopy.DescrType",
        "EXTENDED COPY not implemented yet",
    ),
    (
        "ExtendedCopy.ValidTgtDescr",
        "EXTENDED COPY not implemented yet",
    ),
    (
        "ExtendedCopy.ValidSegDescr",
        "EXTENDED COPY not implemented yet",
    ),
    (
        "ReceiveCopyResults.CopyStatus",
        "RECEIVE COPY RESULTS not implemented yet",
    ),
    (
        "ReceiveCopyResults.OpParams",
        "RECEIVE COPY RESULTS not implemented yet",
    ),
];

/// WRITE ATOMIC(16) is being added on another branch: until WRITE ATOMIC
/// lands these skip everywhere.
const UNTIL_WRITE_ATOMIC: &[Skip] = &[
    (
        "WriteAtomic16.Simple",
        "WRITE ATOMIC(16) not implemented yet",
    ),
    (
        "WriteAtomic16.BeyondEol",
        "WRITE ATOMIC(16) not implemented yet",
    ),
    (
        "WriteAtomic16.ZeroBlocks",
        "WRITE ATOMIC(16) not implemented yet",
    ),
    (
        "WriteAtomic16.WriteProtect",
        "WRITE ATOMIC(16) not implemented yet",
    ),
    (
        "WriteAtomic16.DpoFua",
        "WRITE ATOMIC(16) not implemented yet",
    ),
    ("WriteAtomic16.VPD", "WRITE ATOMIC(16) not implemented yet"),
];

/// The SANITIZE tests. They skip in every run without `-S`
/// ([`WITHOUT_SANITIZE_FLAG`]); with it, until SANITIZE lands (another
/// branch adds it), they skip as not implemented.
const SANITIZE_TESTS: &[&str] = &[
    "Sanitize.BlockErase",
    "Sanitize.BlockEraseReserved",
    "Sanitize.CryptoErase",
    "Sanitize.CryptoEraseReserved",
    "Sanitize.ExitFailureMode",
    "Sanitize.InvalidServiceAction",
    "Sanitize.Overwrite",
    "Sanitize.OverwriteReserved",
    "Sanitize.Readonly",
    "Sanitize.Reservations",
    "Sanitize.Reset",
];

/// Until SANITIZE lands: with `-S`, every SANITIZE test skips.
const UNTIL_SANITIZE: &[&str] = SANITIZE_TESTS;

/// Why the SANITIZE tests skip without `-S`: the suite will not erase a
/// LUN unless told to.
const WITHOUT_SANITIZE_FLAG: &str = "the suite needs -S (--allow-sanitize)";

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
        "iscsi-test-cu {} --test={} {:?}: {} tests, {} passed, {} failed, {} skipped",
        run.flags.join(" "),
        run.tests,
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

/// The skips every run of the whole suite without `-S` may have.
fn pending_and_sanitize() -> Vec<Skip> {
    let mut skips: Vec<Skip> = UNTIL_EXTENDED_COPY.to_vec();
    skips.extend_from_slice(UNTIL_WRITE_ATOMIC);
    skips.extend(SANITIZE_TESTS.iter().map(|&t| (t, WITHOUT_SANITIZE_FLAG)));
    skips
}

/// The whole suite on a plain LUN (`spec`), as the default RAM and the
/// file LUN run it.
fn whole_suite(name: &'static str, spec: String) -> Run<'static> {
    let mut skips = pending_and_sanitize();
    skips.extend_from_slice(PLAIN_LUN);
    Run {
        name,
        luns: vec![spec, "ram:64M".into()],
        tests: "ALL",
        flags: &[],
        skips,
    }
}

/// The default RAM LUN, then every option LUN and `-S`, on parallel
/// threads; then every test of the suite must have run unskipped in one
/// of them, but for the commands other branches are adding.
#[test]
fn the_suite_passes_and_every_test_runs_somewhere() {
    let runs = [
        whole_suite("RAM LUN", "ram:256M".into()),
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
            name: "-S (allow sanitize)",
            luns: vec!["ram:64M".into(), "ram:64M".into()],
            tests: "SCSI.Sanitize",
            flags: &["-S"],
            skips: UNTIL_SANITIZE
                .iter()
                .map(|&t| (t, "SANITIZE not implemented yet"))
                .collect(),
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
        summaries[0].total >= 230,
        "the whole suite ran {} tests",
        summaries[0].total
    );
    let ran_somewhere: BTreeSet<&String> = summaries
        .iter()
        .flat_map(|s| s.tests.iter().filter(|t| !s.skipped.contains_key(*t)))
        .collect();
    let pending: BTreeSet<&str> = UNTIL_EXTENDED_COPY
        .iter()
        .chain(UNTIL_WRITE_ATOMIC)
        .map(|&(t, _)| t)
        .chain(UNTIL_SANITIZE.iter().copied())
        .collect();
    let never: Vec<&String> = summaries[0]
        .tests
        .iter()
        .filter(|t| !ran_somewhere.contains(t) && !pending.contains(t.as_str()))
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
    let run = whole_suite("file LUN", format!("file:{},size=256M", path.display()));
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
    let mut run = whole_suite("block device LUN", format!("block:{device},direct"));
    // Not thin-provisioned: the LBPPB skips say "fully provisioned"
    // instead, and the thin-provisioning tests skip too.
    run.skips.extend_from_slice(FULLY_PROVISIONED);
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
