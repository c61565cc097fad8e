//! `iscsi sweep` and `iscsi model` end to end: small sweeps (two keys of
//! two values, 0.3 s a cell) against `iscsi target` and tgtd (Debian
//! package `tgt`), checking the CSV's header and rows, the PDUs per
//! command counted on the wire against what the negotiated keys imply,
//! models.json and the plots; and every bad input refused before anything
//! is written. Nothing here asserts on timing: throughput is only checked
//! to be positive.

use std::path::{Path, PathBuf};

use common::{iscsi, succeeds};
use iscsi_test_peers::{Tgtd, free_port};

mod common;

const OUR_NAME: &str = "iqn.2026-11.rs.iscsi:sweep-test";
const TGT_NAME: &str = "iqn.2026-11.test:sweep-tgt";

const FIXED: &str = "rw,bs,qd,repeat,mib_per_s,iops,p50_us,p99_us,cpu_us_per_io,\
                     data_in_per_cmd,r2t_per_cmd,data_out_per_cmd,immediate_bytes,\
                     unsolicited_bytes,solicited_bytes,ms_per_mb";

fn our_target() -> (iscsi_test_peers::Peer, String) {
    common::our_target(OUR_NAME, &[])
}

fn out_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iscsi-sweep-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The CSV as (header, rows of name -> value).
fn read_csv(dir: &Path) -> (String, Vec<Vec<(String, String)>>) {
    let text = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().to_owned();
    let names: Vec<String> = header.split(',').map(str::to_owned).collect();
    let rows = lines
        .map(|line| {
            names
                .iter()
                .cloned()
                .zip(line.split(',').map(str::to_owned))
                .collect()
        })
        .collect();
    (header, rows)
}

fn field<'a>(row: &'a [(String, String)], name: &str) -> &'a str {
    &row.iter().find(|(n, _)| n == name).unwrap().1
}

fn number(row: &[(String, String)], name: &str) -> f64 {
    field(row, name).parse().unwrap()
}

fn models(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("models.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A read sweep of MRDSL × TcpNoDelay: the Data-Ins per 64 KiB command
/// are 64 KiB / MRDSL (both targets' MaxBurstLength is at least 64 KiB).
fn read_sweep(url: &str, tag: &str) {
    let dir = out_dir(tag);
    let out = dir.to_str().unwrap();
    let stdout = succeeds(&[
        "sweep",
        url,
        "--rw",
        "read",
        "--key",
        "MaxRecvDataSegmentLength=8k,16384",
        "--key",
        "TcpNoDelay=Yes,No",
        "--bs",
        "64k",
        "--qd",
        "2",
        "--time",
        "0.3",
        "--repeat",
        "2",
        "--out",
        out,
    ]);
    let (header, rows) = read_csv(&dir);
    assert_eq!(
        header,
        format!("MaxRecvDataSegmentLength,TcpNoDelay,{FIXED}")
    );
    assert_eq!(rows.len(), 8, "2 x 2 cells, 2 repeats");
    // Repeats interleave: every cell of round 0 before any of round 1.
    let repeats: Vec<&str> = rows.iter().map(|r| field(r, "repeat")).collect();
    assert_eq!(repeats, ["0", "0", "0", "0", "1", "1", "1", "1"]);
    for row in &rows {
        let mrdsl = number(row, "MaxRecvDataSegmentLength");
        assert!([8192.0, 16384.0].contains(&mrdsl));
        assert!(["Yes", "No"].contains(&field(row, "TcpNoDelay")));
        assert_eq!(field(row, "rw"), "read");
        assert_eq!(field(row, "bs"), "65536");
        assert_eq!(field(row, "qd"), "2");
        assert_eq!(number(row, "data_in_per_cmd"), 65536.0 / mrdsl, "{row:?}");
        for zero in [
            "r2t_per_cmd",
            "data_out_per_cmd",
            "immediate_bytes",
            "solicited_bytes",
        ] {
            assert_eq!(number(row, zero), 0.0, "{zero}");
        }
        let mib_per_s = number(row, "mib_per_s");
        assert!(mib_per_s > 0.0);
        assert!((number(row, "ms_per_mb") - 1000.0 / mib_per_s).abs() < 1e-9);
        assert!(number(row, "cpu_us_per_io") > 0.0);
        assert!(number(row, "p99_us") >= number(row, "p50_us"));
    }
    // Two distinct Data-In counts determine eq. 1.
    let models = models(&dir);
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0]["model"], "eq1");
    assert_eq!(models[0]["n"], 8);
    assert_eq!(models[0]["terms"][0], "data_in_per_cmd");
    assert_eq!(models[0]["coefficients"].as_array().unwrap().len(), 2);
    assert!(stdout.contains("eq2") && stdout.contains("skipped: no write rows"));
    for png in [
        "throughput_vs_MaxRecvDataSegmentLength.png",
        "throughput_vs_TcpNoDelay.png",
        "eq1_time_per_mib.png",
    ] {
        let bytes = std::fs::read(dir.join(png)).unwrap();
        assert_eq!(&bytes[..4], b"\x89PNG", "{png}");
    }
    assert!(!dir.join("results.csv.partial").exists());

    // `iscsi model` re-fits from the CSV alone, to the same models.
    let before = std::fs::read_to_string(dir.join("models.json")).unwrap();
    std::fs::remove_file(dir.join("models.json")).unwrap();
    std::fs::remove_file(dir.join("eq1_time_per_mib.png")).unwrap();
    let stdout = succeeds(&["model", out]);
    assert!(stdout.contains("eq1"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(dir.join("models.json")).unwrap(),
        before
    );
    assert!(dir.join("eq1_time_per_mib.png").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn read_sweep_against_our_target() {
    let (_target, url) = our_target();
    read_sweep(&url, "ours-read");
}

#[test]
fn read_sweep_against_tgtd() {
    let tgtd = Tgtd::start(TGT_NAME, 64 << 20);
    read_sweep(&tgtd.url(), "tgtd-read");
}

/// Writes with every byte solicited (InitialR2T=Yes, ImmediateData=No) and
/// bursts equal to MRDSL, as in the seed's §6.3: one R2T and one Data-Out
/// per MRDSL of data; MaxOutstandingR2T swept for eq. 3.
#[test]
fn solicited_write_sweep_counts_r2ts_and_searches_eq3() {
    let (_target, url) = our_target();
    let dir = out_dir("ours-write");
    succeeds(&[
        "sweep",
        &url,
        "--rw",
        "write",
        "--key",
        "MaxRecvDataSegmentLength,MaxBurstLength,FirstBurstLength=8k,32k",
        "--key",
        "MaxOutstandingR2T=1,4",
        "--set",
        "InitialR2T=Yes",
        "--set",
        "ImmediateData=No",
        "--bs",
        "64k",
        "--qd",
        "1",
        "--time",
        "0.3",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let (header, rows) = read_csv(&dir);
    assert_eq!(
        header,
        format!(
            "MaxRecvDataSegmentLength,MaxBurstLength,FirstBurstLength,MaxOutstandingR2T,{FIXED}"
        )
    );
    assert_eq!(rows.len(), 4);
    for row in &rows {
        let mrdsl = number(row, "MaxRecvDataSegmentLength");
        assert_eq!(number(row, "MaxBurstLength"), mrdsl);
        assert_eq!(number(row, "r2t_per_cmd"), 65536.0 / mrdsl, "{row:?}");
        assert_eq!(number(row, "data_out_per_cmd"), 65536.0 / mrdsl, "{row:?}");
        assert_eq!(number(row, "solicited_bytes"), 65536.0);
        assert_eq!(number(row, "immediate_bytes"), 0.0);
        assert_eq!(number(row, "unsolicited_bytes"), 0.0);
        assert_eq!(number(row, "data_in_per_cmd"), 0.0);
    }
    let models = models(&dir);
    let eq3 = models.iter().find(|m| m["model"] == "eq3").expect("eq3");
    let table = eq3["table"].as_array().unwrap();
    assert_eq!(table.len(), 2, "one choice per MRDSL");
    assert_eq!(table[0]["mrdsl_kb"], 8.0);
    assert!([1, 4].contains(&table[0]["n"].as_u64().unwrap()));
    assert!(dir.join("eq3_heatmap.png").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A bad input fails with a message naming the problem, and writes nothing.
fn refused(args: &[&str], dir: &Path, says: &str) {
    let output = iscsi(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "iscsi {args:?} succeeded");
    assert!(stderr.contains(says), "iscsi {args:?}: {stderr}");
    assert!(!dir.exists(), "iscsi {args:?} wrote {}", dir.display());
}

#[test]
fn bad_input_is_refused_before_any_output() {
    let (_target, url) = our_target();
    let dir = out_dir("refused");
    let out = dir.to_str().unwrap();
    let sweep = |key: &str, url: &str, says: &str| {
        refused(
            &["sweep", url, "--key", key, "--time", "0.1", "--out", out],
            &dir,
            says,
        );
    };
    sweep("NoSuchKey=1,2", &url, "unknown key \"NoSuchKey\"");
    sweep("MaxBurstLength=", &url, "the value list is empty");
    sweep("MaxBurstLength", &url, "--key wants KEY[,KEY...]=V1,V2,...");
    sweep("InitialR2T=Yes,Perhaps", &url, "InitialR2T=Perhaps");
    // Nothing listens on a fresh port.
    let nowhere = format!("iscsi://127.0.0.1:{}/{OUR_NAME}/0", free_port());
    sweep("MaxBurstLength=8k,16k", &nowhere, "logging in to");
    // The target refuses a MaxRecvDataSegmentLength below 512: the second
    // value's probe login fails, naming it, before the first is measured.
    sweep(
        "MaxRecvDataSegmentLength=8192,100",
        &url,
        "MaxRecvDataSegmentLength=100",
    );
    // A block size the LUN's blocks do not divide.
    refused(
        &["sweep", &url, "--bs", "1000", "--time", "0.1", "--out", out],
        &dir,
        "multiple of the 512-byte block",
    );
    // `iscsi model` on a directory without a finished sweep.
    let output = iscsi(&["model", out]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("results.csv"));
}
