//! `iscsi fault-proxy` as a user runs it: between `iscsi write`/`iscsi
//! read` and `iscsi target`, a corrupted Data-In and a corrupted Data-Out
//! are caught by their digests and recovered, the data comes back as
//! written, and the `--log` file says exactly what the proxy did.

mod common;

use std::path::Path;
use std::process::Command;

use iscsi_test_peers::{Peer, free_port};
use rand::RngCore;

/// `iscsi target` serving `lun`, and `iscsi fault-proxy` in front of it
/// with `proxy_args` (faults, logging) and its log in `dir`/`log`: the
/// two peers (stopped when dropped) and the URL through the proxy.
fn target_behind_proxy(
    lun: &str,
    dir: &Path,
    log: &str,
    proxy_args: &[&str],
) -> (Peer, Peer, String) {
    let port = free_port();
    let mut target = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    target.args([
        "target",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--lun",
        lun,
    ]);
    let target = Peer::spawn(target, port);
    std::fs::create_dir_all(dir).unwrap();
    let proxy_port = free_port();
    let mut proxy = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    proxy
        .args([
            "fault-proxy",
            "--listen",
            &format!("127.0.0.1:{proxy_port}"),
        ])
        .args(["--to", &format!("127.0.0.1:{port}")])
        .args(proxy_args)
        .arg("--log")
        .arg(dir.join(log));
    let proxy = Peer::spawn(proxy, proxy_port);
    let url = format!("iscsi://127.0.0.1:{proxy_port}/iqn.2026-11.rs.iscsi:target0/0");
    (target, proxy, url)
}

/// Runs `iscsi ARGS --digest crc32c` (digests, so that the proxy's
/// corruptions are caught) and asserts it succeeded.
fn run(args: &[&str]) {
    common::succeeds(&[args, &["--digest", "crc32c"]].concat());
}

#[test]
fn corrupted_pdus_are_recovered_and_logged() {
    let dir = std::env::temp_dir().join(format!("iscsi-fault-proxy-{}", std::process::id()));
    let faults = [
        "--fault",
        "corrupt-data@data-out#5",
        "--fault",
        "corrupt-data@data-in#9",
    ];
    let (_target, _proxy, url) = target_behind_proxy("ram:64M", &dir, "faults.jsonl", &faults);
    let log = dir.join("faults.jsonl");
    let mut data = vec![0u8; 8 << 20];
    rand::rng().fill_bytes(&mut data);
    let input = dir.join("in");
    let output = dir.join("out");
    std::fs::write(&input, &data).unwrap();
    run(&["write", &url, "--input", input.to_str().unwrap()]);
    run(&[
        "read",
        &url,
        "--length",
        "8M",
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&output).unwrap() == data,
        "data came back changed"
    );
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let faults: Vec<&serde_json::Value> = events.iter().filter(|e| !e["fault"].is_null()).collect();
    assert_eq!(faults.len(), 2, "{events:#?}");
    assert_eq!(faults[0]["fault"], "corrupt-data@data-out#5");
    assert_eq!(faults[0]["direction"], "to-target");
    assert!(
        faults[0]["pdu"]
            .as_str()
            .unwrap()
            .starts_with("data-out ITT")
    );
    assert_eq!(faults[1]["fault"], "corrupt-data@data-in#9");
    assert_eq!(faults[1]["direction"], "to-initiator");
    assert!(
        faults[1]["what"]
            .as_str()
            .unwrap()
            .starts_with("flipped data byte")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--log-pdus`: every PDU forwarded is in the log, so what the peers said
/// around a fault can be read back: here the Data SNACK an ERL 1 initiator
/// sends for a corrupted Data-In, between the Data-In and the status.
#[test]
fn every_pdu_is_logged_with_log_pdus() {
    let dir = std::env::temp_dir().join(format!("iscsi-fault-pdus-{}", std::process::id()));
    let args = ["--fault", "corrupt-data@data-in#2", "--log-pdus"];
    let (_target, _proxy, url) = target_behind_proxy("ram:16M", &dir, "pdus.jsonl", &args);
    let log = dir.join("pdus.jsonl");
    let output = dir.join("out");
    run(&[
        "read",
        &url,
        "--length",
        "1M",
        "--output",
        output.to_str().unwrap(),
        "--set",
        "ErrorRecoveryLevel=1",
    ]);
    let pdus: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|event| event["what"] == "forwarded")
        .map(|event| format!("{} {}", event["direction"], event["pdu"]))
        .collect();
    let position = |needle: &str| {
        pdus.iter()
            .position(|pdu| pdu.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in {pdus:#?}"))
    };
    let command = position("scsi-command ITT");
    let snack = position("snack ITT");
    assert!(pdus[command].contains("ExpStatSN"), "{}", pdus[command]);
    assert!(pdus[snack].contains("DataR2t"), "{}", pdus[snack]);
    assert!(pdus[snack].contains("to-target"), "{}", pdus[snack]);
    let status = pdus
        .iter()
        .rposition(|pdu| pdu.contains(" S status 0x00 StatSN") || pdu.contains("scsi-response"))
        .unwrap_or_else(|| panic!("no status in {pdus:#?}"));
    assert!(command < snack && snack < status, "{pdus:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_fault_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args([
            "fault-proxy",
            "--listen",
            "127.0.0.1:0",
            "--to",
            "127.0.0.1:1",
            "--fault",
            "explode@data-in",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown action"), "{stderr}");
}
