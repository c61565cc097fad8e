//! `iscsi target --metrics`: the counters a scrape shows are what the
//! client did, exactly — commands and bytes per op, the latency
//! histogram's counts, a CHECK CONDITION by sense key, a task management
//! function, a refused and an accepted login — during the workload, after
//! it, and after the session ended (its counts stay, its gauges drop).
//! `iscsi target status --json` shows the same per-LUN counters. A second
//! test runs libiscsi's iscsi-perf against it and checks the sums agree.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command as Process;
use std::time::{Duration, Instant};

use iscsi_initiator::scsi::rw10_cdb;
use iscsi_initiator::{Command, IscsiUrl, Session, SessionConfig};
use iscsi_test_peers::{Peer, free_port, have};

const TARGET: &str = "iqn.2026-11.rs.iscsi:metrics";
/// LUN 1 of two 16 MiB RAM LUNs: 32768 blocks of 512 bytes.
const LUN: u64 = 1;
const BLOCKS: u32 = 32768;

/// `GET /metrics`: the body, with its status line checked.
fn scrape(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("the metrics port");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a response head");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "not a whole exposition: {body}");
    body.to_owned()
}

/// Every sample of an exposition: `name{labels}` → value.
fn samples(body: &str) -> HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The value of `name{labels}` (0 when absent: sparse families).
fn value(samples: &HashMap<String, f64>, name: &str, labels: &str) -> u64 {
    let key = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    samples.get(&key).copied().unwrap_or(0.0) as u64
}

/// What the client did to LUN 1, as the target should count it.
#[derive(Clone, Debug, Default, PartialEq)]
struct Did {
    /// Commands answered, by op: read, write, other.
    commands: [u64; 3],
    read_bytes: u64,
    written_bytes: u64,
    /// CHECK CONDITIONs by sense key.
    sense: HashMap<u8, u64>,
}

/// What a scrape says of LUN 1, in the same shape.
fn seen(samples: &HashMap<String, f64>) -> Did {
    let lun = format!("target=\"{TARGET}\",lun=\"{LUN}\"");
    let commands = ["read", "write", "other"].map(|op| {
        value(
            samples,
            "iscsi_target_lun_commands_total",
            &format!("{lun},op=\"{op}\""),
        )
    });
    // The histogram counts the same commands.
    for (i, op) in ["read", "write", "other"].iter().enumerate() {
        let labels = format!("{lun},op=\"{op}\"");
        assert_eq!(
            value(
                samples,
                "iscsi_target_command_duration_seconds_count",
                &labels
            ),
            commands[i],
            "histogram count of {op}"
        );
        assert_eq!(
            value(
                samples,
                "iscsi_target_command_duration_seconds_bucket",
                &format!("le=\"+Inf\",{labels}")
            ),
            commands[i],
            "+Inf bucket of {op}"
        );
    }
    let keys = [
        (5u8, "illegal_request"),
        (6, "unit_attention"),
        (2, "not_ready"),
    ];
    let sense = keys
        .iter()
        .map(|&(k, name)| {
            let labels = format!("{lun},sense_key=\"{name}\"");
            (
                k,
                value(samples, "iscsi_target_lun_check_conditions_total", &labels),
            )
        })
        .filter(|&(_, n)| n > 0)
        .collect();
    Did {
        commands,
        read_bytes: value(samples, "iscsi_target_lun_read_bytes_total", &lun),
        written_bytes: value(samples, "iscsi_target_lun_written_bytes_total", &lun),
        sense,
    }
}

/// Scrapes until LUN 1's counters are `want` (a status reaches the client
/// a moment before the target has counted it), then checks they are
/// exactly that; returns the samples.
fn expect(port: u16, want: &Did) -> HashMap<String, f64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = samples(&scrape(port));
        let got = seen(&s);
        if got == *want || Instant::now() > deadline {
            assert_eq!(got, *want, "the target's counters against the client's");
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Did {
    /// Runs one command and counts what the client saw of it.
    async fn run(&mut self, session: &Session, command: Command<'_>, op: usize) -> u8 {
        let written = match &command.data {
            iscsi_initiator::DataTransfer::Write(data) => data.len() as u64,
            _ => 0,
        };
        let response = session.execute(command).await.expect("the command");
        self.commands[op] += 1;
        self.read_bytes += u64::from(response.received);
        if response.status == 0 {
            self.written_bytes += written;
        }
        if let Some(sense) = response.sense() {
            *self.sense.entry(sense.key).or_default() += 1;
        }
        response.status
    }
}

fn start_target(extra: &[&str]) -> (Peer, u16, u16, String) {
    let port = free_port();
    let metrics_port = free_port();
    let control = std::env::temp_dir()
        .join(format!(
            "iscsi-rs-metrics-{}-{port}.sock",
            std::process::id()
        ))
        .to_string_lossy()
        .into_owned();
    let mut command = Process::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args([
            "target",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--name",
            TARGET,
        ])
        .args([
            "--lun",
            "ram:16M",
            "--lun",
            "ram:16M",
            "--control",
            &control,
        ])
        .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
        .args(extra)
        .env("RUST_LOG", "warn");
    let mut peer = Peer::spawn(command, port);
    peer.owns_file(control.clone());
    (peer, port, metrics_port, control)
}

#[test]
fn a_scrape_counts_exactly_what_the_client_did() {
    let (_target, port, metrics_port, control) = start_target(&["--metrics-sessions"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let before = samples(&scrape(metrics_port));
    assert_eq!(
        value(
            &before,
            "iscsi_target_sessions",
            &format!("target=\"{TARGET}\"")
        ),
        0
    );
    assert_eq!(seen(&before), Did::default());

    runtime.block_on(async {
        // A refused login: a target name nobody serves (02/03, "not found":
        // other_fail in the MIB's terms).
        let nobody: IscsiUrl = format!("iscsi://127.0.0.1:{port}/iqn.2026-11.rs.iscsi:nobody/0")
            .parse()
            .unwrap();
        assert!(
            Session::connect(&nobody, SessionConfig::default())
                .await
                .is_err()
        );

        let url: IscsiUrl = format!("iscsi://127.0.0.1:{port}/{TARGET}/{LUN}")
            .parse()
            .unwrap();
        let session = Session::connect(&url, SessionConfig::default())
            .await
            .unwrap();
        let mut did = Did::default();
        // The first command to a new nexus may be answered with a UNIT
        // ATTENTION: whatever it gets is counted like the rest.
        did.run(&session, Command::new(LUN, &[0u8; 6]), 2).await;

        const WRITES: u32 = 7;
        let data = vec![0x5au8; 8192];
        for i in 0..WRITES {
            let cdb = rw10_cdb(true, i * 16, 16);
            let status = did.run(&session, Command::write(LUN, &cdb, &data), 1).await;
            assert_eq!(status, 0);
        }
        let s = expect(metrics_port, &did);
        let sessions = format!("target=\"{TARGET}\"");
        assert_eq!(value(&s, "iscsi_target_sessions", &sessions), 1);
        assert_eq!(value(&s, "iscsi_target_connections", &sessions), 1);
        assert_eq!(did.written_bytes, u64::from(WRITES) * 8192);

        const READS: u32 = 5;
        for i in 0..READS {
            let cdb = rw10_cdb(false, i * 8, 8);
            let status = did
                .run(&session, Command::read(LUN, &cdb, vec![0; 4096]), 0)
                .await;
            assert_eq!(status, 0);
        }
        // A read past the end: CHECK CONDITION, ILLEGAL REQUEST.
        let cdb = rw10_cdb(false, BLOCKS, 1);
        let status = did
            .run(&session, Command::read(LUN, &cdb, vec![0; 512]), 0)
            .await;
        assert_eq!(status, 2);
        assert_eq!(did.read_bytes, u64::from(READS) * 4096);
        assert_eq!(did.sense.get(&5), Some(&1));

        session.lun_reset(LUN).await.expect("LOGICAL UNIT RESET");
        let s = expect(metrics_port, &did);
        let tmf = format!(
            "target=\"{TARGET}\",function=\"logical_unit_reset\",response=\"function_complete\""
        );
        assert_eq!(value(&s, "iscsi_target_task_management_total", &tmf), 1);
        assert_eq!(
            value(&s, "iscsi_target_login_attempts_total", "result=\"accept\""),
            1
        );
        assert_eq!(
            value(
                &s,
                "iscsi_target_login_attempts_total",
                "result=\"other_fail\""
            ),
            1
        );
        let session_series = format!(
            "target=\"{TARGET}\",initiator=\"{}\",tsih=\"{}\"",
            session.config().initiator_name,
            session.tsih()
        );
        assert_eq!(
            value(&s, "iscsi_target_session_read_bytes_total", &session_series),
            did.read_bytes
        );
        // Latencies are positive, and under the largest finite bound.
        let labels = format!("target=\"{TARGET}\",lun=\"{LUN}\",op=\"write\"");
        let sum = s[&format!("iscsi_target_command_duration_seconds_sum{{{labels}}}")];
        assert!(sum > 0.0 && sum < 10.0, "sum of write latencies {sum}");

        // `status --json` shows the same counters for the LUN.
        let status = common::succeeds(&["target", "status", "--json", "--control", &control]);
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        let lun = &status["targets"][0]["luns"][1];
        assert_eq!(lun["lun"], LUN);
        assert_eq!(lun["counters"]["read_commands"], did.commands[0]);
        assert_eq!(lun["counters"]["write_commands"], did.commands[1]);
        assert_eq!(lun["counters"]["read_bytes"], did.read_bytes);
        assert_eq!(lun["counters"]["written_bytes"], did.written_bytes);

        session.logout().await.unwrap();
        // The session's gauges and series go; its counts stay. The series
        // go with the session itself, which may outlive its place in the
        // gauge by a task still finishing: both are waited for.
        let deadline = Instant::now() + Duration::from_secs(5);
        let s = loop {
            let s = samples(&scrape(metrics_port));
            let gone = value(&s, "iscsi_target_sessions", &sessions) == 0
                && !s.keys().any(|k| k.starts_with("iscsi_target_session_"));
            if gone || Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(value(&s, "iscsi_target_sessions", &sessions), 0);
        assert_eq!(value(&s, "iscsi_target_connections", &sessions), 0);
        assert_eq!(seen(&s), did, "counts after the session ended");
        assert_eq!(value(&s, "iscsi_target_task_management_total", &tmf), 1);
        assert!(
            !s.keys().any(|k| k.starts_with("iscsi_target_session_")),
            "an ended session's series stay"
        );
    });
}

#[test]
fn the_endpoint_answers_only_get_metrics() {
    let (_target, _, metrics_port, _) = start_target(&[]);
    let ask = |request: &[u8]| {
        let mut stream = TcpStream::connect(("127.0.0.1", metrics_port)).unwrap();
        stream.write_all(request).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.lines().next().unwrap_or_default().to_owned()
    };
    assert_eq!(ask(b"GET / HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 Not Found");
    assert_eq!(
        ask(b"PUT /metrics HTTP/1.1\r\n\r\n"),
        "HTTP/1.1 405 Method Not Allowed"
    );
    assert_eq!(ask(b"hello\r\n\r\n"), "HTTP/1.1 400 Bad Request");
    let huge = [b'a'; 20_000];
    assert_eq!(ask(&huge), "HTTP/1.1 431 Request Header Fields Too Large");
    assert!(ask(b"HEAD /metrics HTTP/1.0\r\n\r\n").ends_with("200 OK"));
}

/// libiscsi's iscsi-perf (4 KiB reads for two seconds): every READ it
/// was answered is in the counters, with exactly 4096 bytes each, and
/// the histogram counts them all.
#[test]
fn iscsi_perf_reads_are_counted() {
    if !have("iscsi-perf") {
        eprintln!("skipped: iscsi-perf (libiscsi-bin) is not installed");
        return;
    }
    let (_target, port, metrics_port, _) = start_target(&[]);
    let url = format!("iscsi://127.0.0.1:{port}/{TARGET}/{LUN}");
    let output = Process::new("timeout")
        .args(["-s", "INT", "2", "iscsi-perf", "-b", "8", "-m", "8", &url])
        .output()
        .expect("iscsi-perf runs");
    let s = samples(&scrape(metrics_port));
    let lun = format!("target=\"{TARGET}\",lun=\"{LUN}\"");
    let reads = value(
        &s,
        "iscsi_target_lun_commands_total",
        &format!("{lun},op=\"read\""),
    );
    assert!(
        reads > 100,
        "iscsi-perf's reads were not counted ({reads}): {}",
        String::from_utf8_lossy(&output.stdout)
    );
    // Its other commands (READ CAPACITY, INQUIRY...) bring a few bytes of
    // their own.
    let other = value(
        &s,
        "iscsi_target_lun_commands_total",
        &format!("{lun},op=\"other\""),
    );
    let bytes = value(&s, "iscsi_target_lun_read_bytes_total", &lun);
    assert!(
        bytes >= reads * 4096 && bytes <= reads * 4096 + other * 4096,
        "{bytes} bytes for {reads} reads and {other} other commands"
    );
    assert_eq!(value(&s, "iscsi_target_lun_written_bytes_total", &lun), 0);
    let count = value(
        &s,
        "iscsi_target_command_duration_seconds_count",
        &format!("{lun},op=\"read\""),
    );
    assert_eq!(count, reads);
    assert_eq!(
        value(&s, "iscsi_target_login_attempts_total", "result=\"accept\""),
        1
    );
}
