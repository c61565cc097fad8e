//! `iscsi bench --sessions N --mix` against `iscsi target`: N separate
//! sessions (initiators) from one process, even ones 4 KiB random reads,
//! odd ones 1 MiB sequential reads; the JSON report has both kinds with
//! their throughput, IOPS, p99 and per-session fairness, and every session
//! completed commands (none starved). The default single-session report
//! keeps its fields.

use common::{our_target, succeeds};
use serde_json::Value;

mod common;

#[test]
fn four_mixed_sessions_report_both_kinds_and_none_starves() {
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:bench-sessions", &[]);
    let out = succeeds(&[
        "bench",
        &url,
        "--sessions",
        "4",
        "--mix",
        "--qd",
        "2",
        "--time",
        "1",
        "--json",
    ]);
    let report: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(report["sessions"], 4, "{report}");
    assert_eq!(report["rw"], "mix", "{report}");
    for key in ["mib_per_s", "iops", "seconds"] {
        assert!(
            report[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} in {report}"
        );
    }
    let kinds = report["kinds"].as_array().expect("kinds");
    assert_eq!(kinds.len(), 2, "{report}");
    for (kind, (rw, bs)) in kinds.iter().zip([("randread", 4096), ("read", 1 << 20)]) {
        assert_eq!(kind["rw"], rw, "{kind}");
        assert_eq!(kind["bs"], bs, "{kind}");
        assert_eq!(kind["sessions"], 2, "{kind}");
        for key in ["mib_per_s", "iops", "p99_us", "p50_us"] {
            assert!(
                kind[key].as_f64().is_some_and(|v| v > 0.0),
                "{key} in {kind}"
            );
        }
        let per_session = kind["session_commands"]
            .as_array()
            .expect("session_commands");
        assert_eq!(per_session.len(), 2, "{kind}");
        assert!(
            per_session
                .iter()
                .all(|c| c.as_u64().is_some_and(|c| c > 0)),
            "a session completed nothing: {kind}"
        );
        let min = kind["min_session_commands"].as_u64().unwrap();
        let median = kind["median_session_commands"].as_u64().unwrap();
        let max = kind["max_session_commands"].as_u64().unwrap();
        assert!(0 < min && min <= median && median <= max, "{kind}");
    }

    // One session, no --mix: the report of old, no `kinds`.
    let out = succeeds(&["bench", &url, "--qd", "2", "--time", "0.3", "--json"]);
    let report: Value = serde_json::from_str(&out).expect("one JSON object");
    for key in [
        "rw",
        "bs",
        "qd",
        "connections",
        "commands",
        "mib_per_s",
        "iops",
        "p99_us",
    ] {
        assert!(!report[key].is_null(), "{key} in {report}");
    }
    assert!(report["kinds"].is_null(), "{report}");
}

/// `--threads 2`: the sessions run on two shards (a current-thread runtime
/// each, pinned where the affinity mask allows); the report is the same,
/// with every session's own count, none starved.
#[test]
fn sharded_sessions_report_every_session() {
    let (_target, url) = our_target("iqn.2026-11.rs.iscsi:bench-shards", &[]);
    let out = succeeds(&[
        "bench",
        &url,
        "--sessions",
        "5",
        "--mix",
        "--qd",
        "2",
        "--time",
        "1",
        "--threads",
        "2",
        "--pin",
        "--json",
    ]);
    let report: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(report["sessions"], 5, "{report}");
    assert_eq!(report["connections"], 1, "{report}");
    for key in ["mib_per_s", "iops", "seconds", "login_seconds"] {
        assert!(
            report[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} in {report}"
        );
    }
    let kinds = report["kinds"].as_array().expect("kinds");
    let counts: Vec<usize> = kinds
        .iter()
        .map(|k| k["sessions"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(counts, [3, 2], "{report}");
    for kind in kinds {
        let per_session = kind["session_commands"]
            .as_array()
            .expect("session_commands");
        assert_eq!(
            per_session.len(),
            kind["sessions"].as_u64().unwrap() as usize
        );
        assert!(
            per_session
                .iter()
                .all(|c| c.as_u64().is_some_and(|c| c > 0)),
            "a session completed nothing: {kind}"
        );
    }
}
