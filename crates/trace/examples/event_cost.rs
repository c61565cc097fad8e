//! The cost of one traced PDU, away from the network: a `TraceWriter`
//! writing to a file is told of many reads (a command sent, a Data-In
//! with status received: three events each, with the command span) from
//! one thread and then from two, and the time per event is printed. The
//! figure to hold against a PDU's own cost (`iscsi pdu-bench`).
//!
//! `cargo run --release -p iscsi-trace --example event_cost [EVENTS]`

use std::sync::Arc;
use std::time::Instant;

use iscsi_datamover::tap::{Direction, PduEvent, PduSummary, WireTap};
use iscsi_proto::pdu::Opcode;
use iscsi_trace::TraceWriter;

/// Reads `commands` commands on `connection` through `writer`.
fn reads(writer: &TraceWriter, connection: u64, commands: u32) {
    for itt in 0..commands {
        let now = Instant::now();
        let pdu = PduSummary {
            opcode: Opcode::ScsiCommand,
            itt,
            data_length: 0,
            solicited: false,
            status: false,
            cdb_opcode: 0x28,
            read: true,
            write: false,
        };
        let event = |direction, pdu| PduEvent {
            connection,
            direction,
            pdu,
            start: now,
            end: now,
        };
        writer.pdu(&event(Direction::Sent, pdu));
        let data_in = PduSummary {
            opcode: Opcode::ScsiDataIn,
            data_length: 4096,
            status: true,
            cdb_opcode: 0,
            read: false,
            ..pdu
        };
        writer.pdu(&event(Direction::Received, data_in));
    }
}

fn main() -> std::io::Result<()> {
    let events: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(3_000_000);
    let commands = events / 3;
    let path = std::env::temp_dir().join(format!("iscsi-trace-cost-{}.json", std::process::id()));
    for threads in [1u64, 2] {
        let writer = Arc::new(TraceWriter::create(&path, "event_cost")?);
        let start = Instant::now();
        std::thread::scope(|scope| {
            for connection in 0..threads {
                let writer = Arc::clone(&writer);
                scope.spawn(move || reads(&writer, connection + 1, commands / threads as u32));
            }
        });
        writer.finish()?;
        let elapsed = start.elapsed();
        let bytes = std::fs::metadata(&path)?.len();
        println!(
            "{threads} thread(s): {:.0} ns per event ({} events, {:.1} bytes each)",
            elapsed.as_nanos() as f64 / f64::from(commands / threads as u32 * threads as u32 * 3),
            commands * 3,
            bytes as f64 / f64::from(commands * 3)
        );
    }
    std::fs::remove_file(&path)
}
