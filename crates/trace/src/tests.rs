//! The writer fed known sequences of PDUs and steps, its output parsed
//! back as JSON and summed by the report.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iscsi_datamover::tap::{Direction, PduEvent, PduSummary, StepEvent, WireTap};
use iscsi_proto::pdu::Opcode;
use serde_json::Value;

use crate::report::{self, ReportError};
use crate::{FIRST_LANE_TRACK, RECEIVE_TRACK, SEND_TRACK, TRACKS_PER_CONNECTION, TraceWriter};

/// A writer's output kept in memory for the test to read.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.0.lock().unwrap()).expect("the trace parses")
    }

    fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

fn summary(opcode: Opcode, itt: u32) -> PduSummary {
    PduSummary {
        opcode,
        itt,
        data_length: 0,
        solicited: false,
        status: false,
        cdb_opcode: 0,
        read: false,
        write: false,
    }
}

fn command(itt: u32, cdb: u8) -> PduSummary {
    PduSummary {
        cdb_opcode: cdb,
        read: cdb == 0x28,
        write: cdb == 0x2a,
        ..summary(Opcode::ScsiCommand, itt)
    }
}

fn data_in(itt: u32, length: u32, status: bool) -> PduSummary {
    PduSummary {
        data_length: length,
        status,
        ..summary(Opcode::ScsiDataIn, itt)
    }
}

/// A PDU at microseconds `from`..`to` after `t0`.
fn event(t0: Instant, direction: Direction, pdu: PduSummary, (from, to): (u64, u64)) -> PduEvent {
    PduEvent {
        connection: 3,
        direction,
        pdu,
        start: t0 + Duration::from_micros(from),
        end: t0 + Duration::from_micros(to),
    }
}

fn complete_events(trace: &Value) -> Vec<&Value> {
    trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect()
}

fn named<'a>(events: &[&'a Value], name: &str) -> Vec<&'a Value> {
    events
        .iter()
        .copied()
        .filter(|e| e["name"] == name)
        .collect()
}

fn ts(event: &Value) -> f64 {
    event["ts"].as_f64().expect("ts")
}

fn dur(event: &Value) -> f64 {
    event["dur"].as_f64().expect("dur")
}

fn tid(track: u32) -> u64 {
    3 * TRACKS_PER_CONNECTION + u64::from(track)
}

#[test]
fn an_initiator_read_gives_its_pdus_and_one_command_span() {
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi bench").unwrap();
    let t0 = Instant::now();
    writer.pdu(&event(t0, Direction::Sent, command(7, 0x28), (10, 12)));
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(7, 262_144, false),
        (40, 90),
    ));
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(7, 262_144, true),
        (95, 150),
    ));
    writer.finish().unwrap();

    let trace = out.json();
    assert_eq!(trace["displayTimeUnit"], "ns");
    let metadata: Vec<&Value> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .collect();
    assert_eq!(metadata.len(), 1);
    assert_eq!(metadata[0]["args"]["name"], "iscsi bench");
    assert_eq!(metadata[0]["pid"], std::process::id());

    let events = complete_events(&trace);
    assert_eq!(events.len(), 4, "three PDUs and one command: {events:?}");
    let sent = named(&events, "send SCSI Command");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["tid"], tid(SEND_TRACK));
    assert_eq!(sent[0]["cat"], "pdu");
    assert_eq!(sent[0]["args"]["itt"], 7);
    assert_eq!(sent[0]["args"]["cdb"], "0x28");
    let received = named(&events, "recv Data-In");
    assert_eq!(received.len(), 2);
    assert!(received.iter().all(|e| e["tid"] == tid(RECEIVE_TRACK)));
    assert_eq!(received[0]["args"]["status"], false);
    assert_eq!(received[1]["args"]["status"], true);
    assert_eq!(received[1]["args"]["data_length"], 262_144);
    assert!((dur(received[1]) - 55.0).abs() < 1e-6);

    let span = named(&events, "READ(10)");
    assert_eq!(span.len(), 1);
    assert_eq!(span[0]["cat"], "command");
    assert_eq!(span[0]["tid"], tid(FIRST_LANE_TRACK));
    assert_eq!(span[0]["args"]["read"], true);
    // From the command's write (10 us) to the status's last byte (150 us).
    assert!((ts(span[0]) - ts(sent[0])).abs() < 1e-6);
    assert!((dur(span[0]) - 140.0).abs() < 1e-6, "{}", span[0]);
    assert_eq!(trace["otherData"]["commands_in_flight_at_end"], 0);
}

#[test]
fn a_target_step_nests_in_its_command_and_is_named_after_it() {
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi target").unwrap();
    let t0 = Instant::now();
    writer.pdu(&event(t0, Direction::Received, command(9, 0x2a), (0, 5)));
    writer.step(&StepEvent {
        connection: 3,
        itt: 9,
        name: "execute",
        start: t0 + Duration::from_micros(20),
        end: t0 + Duration::from_micros(30),
    });
    let response = PduSummary {
        status: true,
        ..summary(Opcode::ScsiResponse, 9)
    };
    writer.pdu(&event(t0, Direction::Sent, response, (31, 33)));
    writer.finish().unwrap();

    let trace = out.json();
    let events = complete_events(&trace);
    let step = named(&events, "execute WRITE(10)");
    let span = named(&events, "WRITE(10)");
    assert_eq!((step.len(), span.len()), (1, 1), "{events:?}");
    assert_eq!(step[0]["cat"], "step");
    assert_eq!(step[0]["tid"], span[0]["tid"]);
    assert!(ts(step[0]) >= ts(span[0]));
    assert!(ts(step[0]) + dur(step[0]) <= ts(span[0]) + dur(span[0]));
    assert!((dur(span[0]) - 33.0).abs() < 1e-6);
    assert_eq!(
        named(&events, "send SCSI Response")[0]["args"]["status"],
        true
    );
}

#[test]
fn a_command_in_flight_at_finish_leaves_a_trace_that_parses() {
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi bench").unwrap();
    let t0 = Instant::now();
    writer.pdu(&event(t0, Direction::Sent, command(1, 0x28), (0, 1)));
    writer.pdu(&event(t0, Direction::Sent, command(2, 0x28), (0, 1)));
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(1, 512, true),
        (5, 6),
    ));
    writer.finish().unwrap();
    // Late events and a second finish change nothing.
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(2, 512, true),
        (7, 8),
    ));
    writer.finish().unwrap();
    drop(writer);

    let trace = out.json();
    assert_eq!(trace["otherData"]["commands_in_flight_at_end"], 1);
    let events = complete_events(&trace);
    assert_eq!(named(&events, "READ(10)").len(), 1);
    assert_eq!(named(&events, "recv Data-In").len(), 1);
}

#[test]
fn dropping_an_unfinished_writer_closes_the_json() {
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi ls").unwrap();
    writer.pdu(&event(
        Instant::now(),
        Direction::Sent,
        summary(Opcode::LoginRequest, 0),
        (0, 1),
    ));
    drop(writer);
    let trace = out.json();
    assert_eq!(
        named(&complete_events(&trace), "send Login Request").len(),
        1
    );
}

#[test]
fn a_status_reported_before_its_command_still_closes_its_span() {
    // The initiator's reader can take in the status before its writer
    // reports the write that carried the command.
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi bench").unwrap();
    let t0 = Instant::now();
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(4, 512, true),
        (8, 9),
    ));
    writer.pdu(&event(t0, Direction::Sent, command(4, 0x28), (0, 2)));
    writer.finish().unwrap();
    let trace = out.json();
    let span = named(&complete_events(&trace), "READ(10)");
    assert_eq!(span.len(), 1);
    assert!((dur(span[0]) - 9.0).abs() < 1e-6);
    assert_eq!(trace["otherData"]["commands_in_flight_at_end"], 0);
}

/// The track of the READ(10) span of `itt`.
fn lane_of(trace: &Value, itt: u32) -> u64 {
    named(&complete_events(trace), "READ(10)")
        .iter()
        .find(|e| e["args"]["itt"] == itt)
        .map(|e| e["tid"].as_u64().unwrap())
        .unwrap()
}

#[test]
fn overlapping_commands_take_separate_lanes_that_are_reused() {
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi bench").unwrap();
    let t0 = Instant::now();
    writer.pdu(&event(t0, Direction::Sent, command(1, 0x28), (0, 1)));
    writer.pdu(&event(t0, Direction::Sent, command(2, 0x28), (1, 2)));
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(1, 512, true),
        (3, 4),
    ));
    writer.pdu(&event(t0, Direction::Sent, command(3, 0x28), (5, 6)));
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(2, 512, true),
        (7, 8),
    ));
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(3, 512, true),
        (9, 10),
    ));
    writer.finish().unwrap();
    let trace = out.json();
    let lane_of = |itt: u32| lane_of(&trace, itt);
    assert_eq!(lane_of(1), tid(FIRST_LANE_TRACK));
    assert_eq!(lane_of(2), tid(FIRST_LANE_TRACK + 1));
    assert_eq!(
        lane_of(3),
        tid(FIRST_LANE_TRACK),
        "the freed lane is reused"
    );
    let names: Vec<&Value> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .collect();
    assert_eq!(names.len(), 4, "received, sent and two lanes: {names:?}");
}

/// A target's reader may time a command's PDU a moment before its writer
/// times another command's status, and then report it after: the freed
/// lane must not take a span that began before the lane's last one ended.
#[test]
fn a_lane_freed_after_a_command_began_is_not_given_to_it() {
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi target").unwrap();
    let t0 = Instant::now();
    writer.pdu(&event(t0, Direction::Received, command(1, 0x28), (0, 1)));
    writer.pdu(&event(t0, Direction::Received, command(2, 0x28), (2, 3)));
    // Command 3 arrives at 10 us, but its event comes after command 1's
    // status, which ended at 11 us.
    writer.pdu(&event(t0, Direction::Sent, data_in(1, 512, true), (8, 11)));
    writer.pdu(&event(t0, Direction::Received, command(3, 0x28), (10, 10)));
    writer.pdu(&event(t0, Direction::Sent, data_in(2, 512, true), (12, 13)));
    writer.pdu(&event(t0, Direction::Received, command(4, 0x28), (14, 14)));
    writer.pdu(&event(t0, Direction::Sent, data_in(3, 512, true), (15, 16)));
    writer.pdu(&event(t0, Direction::Sent, data_in(4, 512, true), (17, 18)));
    writer.finish().unwrap();
    let trace = out.json();
    let lane_of = |itt: u32| lane_of(&trace, itt);
    assert_eq!(lane_of(1), tid(FIRST_LANE_TRACK));
    assert_eq!(lane_of(2), tid(FIRST_LANE_TRACK + 1));
    assert_eq!(
        lane_of(3),
        tid(FIRST_LANE_TRACK + 2),
        "command 1's lane was busy when command 3 began"
    );
    assert_eq!(
        lane_of(4),
        tid(FIRST_LANE_TRACK),
        "a lane free since before a command began is reused"
    );
}

#[test]
fn the_report_sums_each_step_and_shares_the_connection_time() {
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi bench").unwrap();
    let t0 = Instant::now();
    // Two reads in flight together over 100 us of connection time.
    writer.pdu(&event(t0, Direction::Sent, command(1, 0x28), (0, 10)));
    writer.pdu(&event(t0, Direction::Sent, command(2, 0x28), (0, 10)));
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(1, 512, true),
        (50, 70),
    ));
    writer.pdu(&event(
        t0,
        Direction::Received,
        data_in(2, 512, true),
        (80, 100),
    ));
    writer.finish().unwrap();

    let report = report::read(out.bytes().as_slice()).unwrap();
    assert_eq!(report.processes, ["iscsi bench"]);
    assert_eq!(report.connections, 1);
    assert!((report.connection_time_us - 100.0).abs() < 1e-6);
    let row = |name: &str| {
        report
            .rows
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no row {name}: {:?}", report.rows))
    };
    let reads = row("READ(10)");
    assert_eq!((reads.kind.as_str(), reads.count), ("command", 2));
    assert!((reads.total_us - 170.0).abs() < 1e-6);
    assert!((reads.average_us - 85.0).abs() < 1e-6);
    assert!((reads.share_percent - 170.0).abs() < 1e-6);
    let data = row("recv Data-In");
    assert!((data.share_percent - 40.0).abs() < 1e-6);
    assert!((row("(receive idle)").share_percent - 60.0).abs() < 1e-6);
    // The two commands went out in one write: counted once as busy time.
    assert!((row("send SCSI Command").total_us - 20.0).abs() < 1e-6);
    assert!((row("(send idle)").share_percent - 90.0).abs() < 1e-6);
    assert_eq!(report.rows[0].name, "READ(10)", "sorted by total");
    let text = report.to_string();
    assert!(
        text.contains("READ(10)") && text.contains("share"),
        "{text}"
    );
}

#[test]
fn the_report_reads_a_bare_array_and_refuses_what_is_not_a_trace() {
    let array = br#"[{"name":"work","ph":"X","ts":0,"dur":5,"pid":1,"tid":"main"},
                     {"name":"mark","ph":"i","ts":1,"pid":1,"tid":"main"}]"#;
    let report = report::read(&array[..]).unwrap();
    assert_eq!(report.rows.len(), 1);
    assert_eq!((report.rows[0].count, report.rows[0].total_us), (1, 5.0));
    assert!((report.rows[0].share_percent - 100.0).abs() < 1e-6);

    assert!(matches!(
        report::read(&b"not json"[..]),
        Err(ReportError::Json(_))
    ));
    assert!(matches!(
        report::read(&b"42"[..]),
        Err(ReportError::Json(_))
    ));
    assert!(matches!(
        report::read(&br#"{"events": []}"#[..]),
        Err(ReportError::NoTraceEvents)
    ));
    assert!(matches!(
        report::read(&br#"{"traceEvents": []}"#[..]),
        Err(ReportError::NoCompleteEvents)
    ));
    assert!(matches!(
        report::read(&b"[]"[..]),
        Err(ReportError::NoCompleteEvents)
    ));
    assert!(matches!(
        report::read(&br#"{"traceEvents": [{"ph":"X"}"#[..]),
        Err(ReportError::Json(_))
    ));
}

#[test]
fn a_trace_of_many_chunks_keeps_every_event_in_order() {
    let out = Shared::default();
    let writer = TraceWriter::new(out.clone(), "iscsi bench").unwrap();
    let t0 = Instant::now();
    let commands = 20_000u32;
    for itt in 0..commands {
        let at = u64::from(itt) * 10;
        writer.pdu(&event(
            t0,
            Direction::Sent,
            command(itt, 0x28),
            (at, at + 1),
        ));
        writer.pdu(&event(
            t0,
            Direction::Received,
            data_in(itt, 4096, true),
            (at + 5, at + 6),
        ));
    }
    // Several chunks went out before the finish.
    assert!(out.bytes().len() > 1 << 20);
    writer.finish().unwrap();
    let trace = out.json();
    let events = complete_events(&trace);
    let spans = named(&events, "READ(10)");
    assert_eq!(spans.len(), commands as usize);
    assert_eq!(named(&events, "recv Data-In").len(), commands as usize);
    let sent = named(&events, "send SCSI Command");
    assert!(sent.windows(2).all(|w| ts(w[0]) < ts(w[1])));
    assert_eq!(
        trace["otherData"]["events"],
        3 * u64::from(commands) + 1 + 3,
        "three per command, the process name and three tracks"
    );
}

/// A file system that fills up after `room` bytes.
struct Full {
    room: usize,
}

impl Write for Full {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if bytes.len() > self.room {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left",
            ));
        }
        self.room -= bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_write_error_is_reported_by_finish() {
    let writer = TraceWriter::new(Full { room: 100_000 }, "iscsi bench").unwrap();
    let t0 = Instant::now();
    for itt in 0..20_000 {
        writer.pdu(&event(t0, Direction::Sent, command(itt, 0x28), (0, 1)));
    }
    let error = writer.finish().expect_err("the disk filled up");
    assert_eq!(error.kind(), std::io::ErrorKind::StorageFull);
    // Reported once; later calls have nothing more to say.
    writer.finish().unwrap();
}

#[test]
fn a_json_error_is_said_once_and_ends_the_chain() {
    let json = serde_json::from_str::<Value>("{x").unwrap_err();
    let said = json.to_string();
    let error = ReportError::from(json);
    assert_eq!(error.to_string(), format!("not a Chrome trace: {said}"));
    assert!(std::error::Error::source(&error).is_none());
}
