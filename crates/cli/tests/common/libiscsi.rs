//! libiscsi's conformance suite (`iscsi-test-cu`, Debian libiscsi-bin)
//! as the RBD tests run it: every test but Sanitize.Reset (it needs a slow
//! LUN: conformance.rs runs it), data-destroying ones included (`-d`),
//! with a second URL for the multipath and multi-initiator tests, and the
//! check that none fails and exactly the expected tests skip.

use std::collections::BTreeSet;
use std::process::Command;

/// What libiscsi's suite skips on a plain RBD LUN, and why: the same
/// families a plain file LUN skips for its options (conformance.rs runs
/// them on LUNs with those options), plus what the RBD store does not
/// offer yet.
pub const RBD_SKIPS: &[(&str, &str)] = &[
    ("CompareAndWrite.InvalidDataOutSize", "needs LBPPB > 1"),
    ("WriteSame10.UnmapUnaligned", "needs LBPPB > 1"),
    ("WriteSame10.InvalidDataOutSize", "needs LBPPB > 1"),
    ("WriteSame16.UnmapUnaligned", "needs LBPPB > 1"),
    ("WriteSame16.InvalidDataOutSize", "needs LBPPB > 1"),
    ("PreventAllow.2ITNexuses", "needs a removable LU"),
    ("PreventAllow.ColdReset", "needs a removable LU"),
    ("PreventAllow.Eject", "needs a removable LU"),
    ("PreventAllow.ITNexusLoss", "needs a removable LU"),
    ("PreventAllow.LUNReset", "needs a removable LU"),
    ("PreventAllow.Logout", "needs a removable LU"),
    ("PreventAllow.Simple", "needs a removable LU"),
    ("PreventAllow.WarmReset", "needs a removable LU"),
    ("StartStopUnit.Simple", "needs a removable LU"),
    ("ReadOnly.ReadOnlySBC", "needs a write-protected LU"),
    ("Sanitize.BlockErase", "not offered on RBD (yet)"),
    ("Sanitize.CryptoErase", "not encrypted"),
    ("Sanitize.Readonly", "its erase parts are not offered here"),
    (
        "Sanitize.Reservations",
        "its erase parts are not offered here",
    ),
    ("WriteAtomic16.BeyondEol", "librbd promises no atomic write"),
    ("WriteAtomic16.DpoFua", "librbd promises no atomic write"),
    ("WriteAtomic16.Simple", "librbd promises no atomic write"),
    ("WriteAtomic16.VPD", "librbd promises no atomic write"),
    (
        "WriteAtomic16.WriteProtect",
        "librbd promises no atomic write",
    ),
    (
        "WriteAtomic16.ZeroBlocks",
        "librbd promises no atomic write",
    ),
];

/// What an RBD LU served by two gateways outside a gateway group does not
/// offer, on top of [`RBD_SKIPS`]: ORWRITE, a read, modify and write that
/// the LU's lock, one gateway's, cannot make atomic across both
/// (`pr_shared::serves_alone`). COMPARE AND WRITE stays, up to the one
/// 512-byte block the OSD compares (Block Limits says so, and the suite
/// checks the refusal beyond it).
pub const TWO_GATEWAYS_SKIPS: &[(&str, &str)] = &[
    ("OrWrite.BeyondEol", "not atomic across two gateways"),
    ("OrWrite.DpoFua", "not atomic across two gateways"),
    ("OrWrite.Protect", "not atomic across two gateways"),
    ("OrWrite.Simple", "not atomic across two gateways"),
    ("OrWrite.Verify", "not atomic across two gateways"),
    ("OrWrite.ZeroBlocks", "not atomic across two gateways"),
];

/// Every test of the suite but Sanitize.Reset, by name.
pub fn tests() -> Vec<String> {
    let list = Command::new("iscsi-test-cu")
        .arg("--list")
        .output()
        .expect("iscsi-test-cu --list runs");
    String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| match l.matches('.').count() {
            1 => l.starts_with("ALL.") && *l != "ALL.Sanitize",
            2 => l.starts_with("ALL.Sanitize.") && *l != "ALL.Sanitize.Reset",
            _ => false,
        })
        .map(str::to_owned)
        .collect()
}

/// One run of the suite: its output, CUnit's counts, the tests that
/// skipped.
pub struct Run {
    pub text: String,
    /// "tests  TOTAL  RAN  PASSED  FAILED  INACTIVE" of CUnit's summary.
    pub counts: Vec<u64>,
    pub skipped: BTreeSet<String>,
}

/// Runs [`tests`] with `url` as the first initiator's and `second` as the
/// second's (a multipath or multi-initiator test's other path).
pub fn run_suite(url: &str, second: &str) -> Run {
    let out = Command::new("timeout")
        .arg("900")
        .arg("iscsi-test-cu")
        .args([
            "-S",
            "-d",
            &format!("--test={}", tests().join(",")),
            url,
            second,
        ])
        .output()
        .expect("iscsi-test-cu runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let counts: Vec<u64> = text
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .unwrap_or_else(|| panic!("no summary in:\n{text}"))
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let (mut suite, mut test) = (String::new(), String::new());
    let mut skipped = BTreeSet::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("Suite: ") {
            suite = name.trim().to_owned();
        }
        if let Some(at) = line.find("Test: ") {
            let name = line[at + 6..].split_whitespace().next().unwrap_or("");
            test = format!("{suite}.{}", name.trim_end_matches("..."));
        }
        if line.contains("[SKIPPED]") {
            skipped.insert(test.clone());
        }
    }
    Run {
        text,
        counts,
        skipped,
    }
}

impl Run {
    /// None failed, and exactly the tests of `skips` skipped (a test that
    /// no longer skips leaves the list).
    pub fn assert_passes(&self, what: &str, skips: &[(&str, &str)]) {
        let counts = &self.counts;
        assert!(counts.len() >= 4, "no counts in:\n{}", self.text);
        println!(
            "{what}: {} tests, {} passed, {} failed, {} skipped",
            counts[0],
            counts[2],
            counts[3],
            self.skipped.len()
        );
        // CUnit's count, not "[FAILED]" lines: the suite logs those for
        // expected failures of tests that pass.
        assert!(counts[3] == 0, "failures:\n{}", self.text);
        let expected: BTreeSet<String> = skips.iter().map(|(t, _)| (*t).to_owned()).collect();
        let unexpected: Vec<_> = self.skipped.difference(&expected).collect();
        assert!(
            unexpected.is_empty(),
            "skipped unexpectedly: {unexpected:?}"
        );
        let ran: Vec<_> = expected.difference(&self.skipped).collect();
        assert!(ran.is_empty(), "no longer skipped: {ran:?}");
    }
}
