//! `--trace` end to end: `iscsi target --trace` stopped by SIGTERM and
//! `iscsi bench --trace` against it each leave a Chrome trace that parses,
//! with PDU events and command spans that agree with each other, and
//! `iscsi trace-report` turns them into the table (or refuses what is not
//! a trace, with a non-zero status).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{iscsi, succeeds};
use iscsi_test_peers::free_port;
use serde_json::Value;

mod common;

const NAME: &str = "iqn.2026-11.rs.iscsi:trace-test";
/// The read size, and its one Data-In's length.
const MIB: u64 = 1 << 20;

/// A file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!("iscsi-rs-trace-{}-{name}", std::process::id())))
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("UTF-8 temporary path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn parse(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("the trace exists");
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON ({e}): ...{}", path.display(), tail(&text)))
}

fn tail(text: &str) -> &str {
    let start = text.len().saturating_sub(300);
    text.get(start..).unwrap_or(text)
}

/// The complete events of a trace, after checking its shape.
fn complete(trace: &Value) -> Vec<&Value> {
    let events = trace["traceEvents"].as_array().expect("traceEvents array");
    let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    for event in &complete {
        assert!(
            event["ts"].is_number() && event["dur"].is_number(),
            "{event}"
        );
    }
    complete
}

/// Asserts that on every track (pid, tid) slices nest, never partly
/// overlap: a timeline draws nothing else (why commands get lanes).
fn assert_nested(events: &[&Value]) {
    let mut tracks: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
    for e in events {
        let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let start = e["ts"].as_f64().unwrap();
        let end = start + e["dur"].as_f64().unwrap();
        tracks.entry((pid, tid)).or_default().push((start, end));
    }
    for (track, mut slices) in tracks {
        slices.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (start, end) in slices {
            while open.last().is_some_and(|&until| until <= start) {
                open.pop();
            }
            if let Some(&until) = open.last() {
                assert!(
                    end <= until,
                    "track {track:?}: {start}..{end} overlaps a slice ending at {until}"
                );
            }
            open.push(end);
        }
    }
}

fn count(events: &[&Value], test: impl Fn(&Value) -> bool) -> usize {
    events.iter().filter(|e| test(e)).count()
}

#[test]
fn target_and_bench_traces_parse_agree_and_make_a_table() {
    let target_trace = TempFile::new("target.json");
    let bench_trace = TempFile::new("bench.json");
    let (mut target, url) = common::our_target(NAME, &["--trace", target_trace.path()]);
    succeeds(&[
        "bench",
        &url,
        "--rw",
        "read",
        "--bs",
        "1M",
        "--qd",
        "4",
        "--time",
        "0.5",
        "--trace",
        bench_trace.path(),
    ]);
    let status = target
        .terminate(Duration::from_secs(20))
        .expect("the target stops on SIGTERM");
    assert!(status.success(), "target exit: {status}");

    // The initiator: one span per command, from its command PDU to its
    // status; a 1 MiB read at MaxRecvDataSegmentLength 1 MiB (what the
    // initiator offers) is one Data-In carrying the status.
    let trace = parse(&bench_trace.0);
    let events = complete(&trace);
    assert_nested(&events);
    let reads = count(&events, |e| {
        e["name"] == "READ(10)" && e["cat"] == "command"
    });
    let megabyte_statuses = count(&events, |e| {
        e["name"] == "recv Data-In"
            && e["args"]["status"] == true
            && e["args"]["data_length"] == MIB
    });
    assert!(reads > 10, "{reads} READ(10) spans in half a second");
    assert_eq!(
        reads, megabyte_statuses,
        "READ(10) spans against 1 MiB Data-In with status"
    );
    // Every Data-In carried a status (READ CAPACITY's too), and every
    // command sent has its span.
    let statuses = count(&events, |e| {
        e["name"] == "recv Data-In" && e["args"]["status"] == true
    });
    assert_eq!(count(&events, |e| e["name"] == "recv Data-In"), statuses);
    let commands = count(&events, |e| e["name"] == "send SCSI Command");
    let spans = count(&events, |e| e["cat"] == "command");
    let responses = count(&events, |e| e["name"] == "recv SCSI Response");
    assert_eq!(
        (commands, spans),
        (statuses + responses, statuses + responses)
    );
    assert!(
        events
            .iter()
            .all(|e| e["pid"] == events[0]["pid"] && e["tid"].is_u64())
    );

    // The target: the same commands, with their execution nested inside.
    let trace = parse(&target_trace.0);
    let events = complete(&trace);
    assert_nested(&events);
    let target_reads = count(&events, |e| {
        e["name"] == "READ(10)" && e["cat"] == "command"
    });
    let sent = count(&events, |e| {
        e["name"] == "send Data-In"
            && e["args"]["status"] == true
            && e["args"]["data_length"] == MIB
    });
    let executed = count(&events, |e| {
        e["name"] == "execute READ(10)" && e["cat"] == "step"
    });
    assert_eq!(target_reads, reads, "both ends saw every read");
    assert_eq!((sent, executed), (reads, reads));
    assert_eq!(trace["otherData"]["commands_in_flight_at_end"], 0);
    let names: Vec<&Value> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .collect();
    assert_eq!(names[0]["args"]["name"], "iscsi target");

    let table = succeeds(&["trace-report", bench_trace.path()]);
    for step in ["READ(10)", "recv Data-In", "send SCSI Command", "share"] {
        assert!(table.contains(step), "no {step} in:\n{table}");
    }
    let table = succeeds(&["trace-report", target_trace.path()]);
    for step in [
        "execute READ(10)",
        "send Data-In",
        "wait for writer READ(10)",
    ] {
        assert!(table.contains(step), "no {step} in:\n{table}");
    }
    let json: Value =
        serde_json::from_str(&succeeds(&["trace-report", "--json", bench_trace.path()]))
            .expect("--json prints JSON");
    let row = json["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["name"] == "READ(10)")
        .expect("a READ(10) row");
    assert_eq!(row["count"], reads);
    assert!(row["share_percent"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_subcommand_that_fails_still_closes_its_trace() {
    let trace = TempFile::new("failed.json");
    // Nothing listens on this port: the login fails after the trace opened.
    let port = free_port();
    let url = format!("iscsi://127.0.0.1:{port}/{NAME}/0");
    let output = iscsi(&["inquiry", &url, "--trace", trace.path()]);
    assert!(!output.status.success());
    let trace = parse(&trace.0);
    assert!(trace["traceEvents"].is_array());
}

#[test]
fn trace_report_refuses_what_is_not_a_trace() {
    let missing = TempFile::new("missing.json");
    let not_json = TempFile::new("not.json");
    std::fs::write(&not_json.0, "this is not JSON").unwrap();
    let no_events = TempFile::new("no-events.json");
    std::fs::write(&no_events.0, r#"{"displayTimeUnit": "ns"}"#).unwrap();
    for (file, says) in [
        (&missing, "opening"),
        (&not_json, "not a Chrome trace"),
        (&no_events, "traceEvents"),
    ] {
        let output = iscsi(&["trace-report", file.path()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{} accepted", file.path());
        assert!(stderr.contains(says), "{}: {stderr}", file.path());
    }
}
