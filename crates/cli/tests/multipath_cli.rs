//! The initiator subcommands that take a URL per path (`iscsi verify`,
//! `iscsi bench`) against `iscsi target` on two portals of one process:
//! the load runs through the multipath set and reports its paths, and URLs
//! that reach two different LUs are refused before any I/O. (Paths that
//! fail under the load: `crates/initiator/tests/multipath.rs` and, across
//! a gateway group, `multipath_group.rs`.)

mod common;

use common::{iscsi, our_target};
use iscsi_test_peers::free_port;

const NAME: &str = "iqn.2026-11.rs.iscsi:multipath-cli";

/// Our target on two portals with LUNs 0 (64 MiB) and 1 (16 MiB); the two
/// URLs of LUN `lun` and the second portal's port.
fn two_portals() -> (iscsi_test_peers::Peer, String, u16) {
    let second = free_port();
    let (peer, url) = our_target(
        NAME,
        &[
            "--listen",
            &format!("127.0.0.1:{second}"),
            "--lun",
            "ram:16M",
        ],
    );
    (peer, url, second)
}

fn via(port: u16, lun: u64) -> String {
    format!("iscsi://127.0.0.1:{port}/{NAME}/{lun}")
}

#[test]
fn verify_runs_through_a_url_per_portal() {
    let (_target, first, second) = two_portals();
    let out = iscsi(&[
        "verify",
        &first,
        &via(second, 0),
        "--time",
        "1",
        "--region",
        "4M",
        "--bs",
        "64k",
        "--qd",
        "8",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["failed_commands"], 0, "{report}");
    assert_eq!(report["wrong_reads"], 0);
    let paths = report["paths"].as_array().expect("the paths");
    assert_eq!(paths.len(), 2, "{report}");
    // No ALUA here: both active, I/O on the first.
    assert!(
        paths[0].as_str().unwrap().ends_with("Active, current"),
        "{report}"
    );
    assert!(paths[1].as_str().unwrap().ends_with("Active"), "{report}");
}

#[test]
fn urls_of_two_lus_are_refused_before_any_io() {
    let (_target, first, second) = two_portals();
    let out = iscsi(&["verify", &first, &via(second, 1), "--time", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("reaches another LU"), "{stderr}");
    let out = iscsi(&["verify", &first, &via(second, 0), "--check", "/nonexistent"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("take one URL"));
}

#[test]
fn bench_runs_through_a_url_per_portal() {
    let (_target, first, second) = two_portals();
    let out = iscsi(&[
        "bench",
        &first,
        &via(second, 0),
        "--rw",
        "randwrite",
        "--time",
        "1",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(report["commands"].as_u64().unwrap() > 0, "{report}");
    assert!(
        stderr.contains(&format!("path {first}: Active")),
        "{stderr}"
    );
    let out = iscsi(&["bench", &first, &via(second, 0), "--sessions", "2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("take one URL"));
}
