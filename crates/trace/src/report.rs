//! The FKT study's analysis table from a trace: per step, the total time,
//! the count, the average and the share.
//!
//! A step is a complete event's name within its category: every
//! "recv Data-In" together, every "READ(10)" command span together, every
//! "execute READ(10)" step together. The share is of the *connection
//! time*: for each connection, from its first event's start to its last
//! event's end, summed over connections. That plays the part of the
//! study's "% of CPU" for a driver whose work is per connection:
//!
//! - a PDU row says how much of the time the connection was taking in (or
//!   writing out) PDUs of that kind; the receive and send directions are
//!   each one at a time, so those rows add up to at most 100% per
//!   direction, and the rest is shown as the direction's idle time (like
//!   the study's idle process);
//! - a command row sums overlapping spans: with 16 commands in flight it
//!   shows about 1600%, the average number in flight (Little's law), and
//!   its average is the command's latency;
//! - a step row (the target's SCSI execution) says how much of the time a
//!   thread was doing that step for the connection.
//!
//! The trace is read as a stream (one event at a time), so a trace of
//! gigabytes needs no more memory than its distinct steps and tracks.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::tracks::TRACKS_PER_CONNECTION;

/// Why a trace could not be summed. The message says the cause and is the
/// end of the chain (no `source()`): `anyhow`'s `{:#}`, which the CLI prints,
/// would otherwise write it twice.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Not JSON, or JSON that is not a trace.
    #[error("not a Chrome trace: {0}")]
    Json(serde_json::Error),
    /// An object without a `traceEvents` array.
    #[error("no \"traceEvents\" in the trace object")]
    NoTraceEvents,
    /// Events, but none with a duration.
    #[error("the trace has no complete (\"ph\":\"X\") events")]
    NoCompleteEvents,
}

impl From<serde_json::Error> for ReportError {
    fn from(error: serde_json::Error) -> Self {
        ReportError::Json(error)
    }
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The step: an event name, or "(receive idle)" / "(send idle)".
    pub name: String,
    /// The category: "pdu", "command", "step", "idle", or another trace's.
    pub kind: String,
    /// Time in the step, summed over its occurrences, in microseconds.
    pub total_us: f64,
    /// Occurrences.
    pub count: u64,
    /// `total_us / count`.
    pub average_us: f64,
    /// `total_us` over the connection time, in percent.
    pub share_percent: f64,
}

/// The table for one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The processes' names (`process_name` metadata), in trace order.
    pub processes: Vec<String>,
    /// Connections seen (PDU tracks grouped by connection).
    pub connections: usize,
    /// From each connection's first event to its last, summed: what the
    /// shares are of, in microseconds.
    pub connection_time_us: f64,
    /// What `share_percent` means, for readers of the JSON.
    pub share_of: &'static str,
    /// The rows, by total time, largest first.
    pub rows: Vec<Row>,
}

/// What `share_percent` is of.
pub const SHARE_OF: &str = "the connection time: each connection's first to last event, summed over connections; overlapping occurrences (commands in flight together) add up, so a command row's share is 100 x the average number in flight";

/// Reads a trace (the object form with `traceEvents`, or a bare array of
/// events) and sums it per step.
pub fn read(reader: impl Read) -> Result<Report, ReportError> {
    let mut sums = Sums::default();
    let mut deserializer = serde_json::Deserializer::from_reader(reader);
    let found = deserializer.deserialize_any(Root { sums: &mut sums })?;
    deserializer.end()?;
    if !found {
        return Err(ReportError::NoTraceEvents);
    }
    sums.report()
}

/// A `pid` or `tid`: numbers in our traces, strings in some others.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Hash)]
#[serde(untagged)]
enum Id {
    Number(i64),
    Text(String),
}

impl Default for Id {
    fn default() -> Self {
        Id::Number(0)
    }
}

/// The fields of an event the table needs; the rest are skipped unread.
#[derive(Debug, Deserialize)]
struct Event {
    #[serde(default)]
    name: String,
    #[serde(default)]
    cat: String,
    #[serde(default)]
    ph: String,
    #[serde(default)]
    ts: f64,
    #[serde(default)]
    dur: f64,
    #[serde(default)]
    pid: Id,
    #[serde(default)]
    tid: Id,
    #[serde(default)]
    args: Option<EventArgs>,
}

#[derive(Debug, Deserialize)]
struct EventArgs {
    name: Option<String>,
}

#[derive(Debug, Default)]
struct Step {
    total: f64,
    count: u64,
}

/// One direction of one connection: busy time as a union of intervals
/// (PDUs written together share one interval), in arrival order.
#[derive(Debug, Default)]
struct Direction {
    busy: f64,
    until: f64,
}

impl Direction {
    fn add(&mut self, start: f64, end: f64) {
        let from = start.max(self.until);
        if end > from {
            self.busy += end - from;
        }
        self.until = self.until.max(end);
    }
}

#[derive(Debug)]
struct Connection {
    first: f64,
    last: f64,
    receive: Direction,
    send: Direction,
    /// Whether the connection carried PDUs (tracks of other traces'
    /// threads that never do are not connections).
    pdus: bool,
}

#[derive(Debug, Default)]
struct Sums {
    processes: Vec<String>,
    steps: HashMap<(String, String), Step>,
    connections: HashMap<(Id, i64), Connection>,
    complete: u64,
}

impl Sums {
    fn add(&mut self, event: Event) {
        if event.ph == "M" {
            if event.name == "process_name"
                && let Some(name) = event.args.and_then(|a| a.name)
            {
                self.processes.push(name);
            }
            return;
        }
        if event.ph != "X" {
            return;
        }
        self.complete += 1;
        let (start, end) = (event.ts, event.ts + event.dur.max(0.0));
        // Our tids are connection * 1000 + track; another trace's threads
        // each count as a connection of their own.
        let connection = match &event.tid {
            Id::Number(tid) => tid / TRACKS_PER_CONNECTION as i64,
            Id::Text(_) => -1,
        };
        let entry = self
            .connections
            .entry((event.pid, connection))
            .or_insert(Connection {
                first: start,
                last: end,
                receive: Direction::default(),
                send: Direction::default(),
                pdus: false,
            });
        entry.first = entry.first.min(start);
        entry.last = entry.last.max(end);
        if event.cat == "pdu" {
            entry.pdus = true;
            if event.name.starts_with("recv ") {
                entry.receive.add(start, end);
            } else if event.name.starts_with("send ") {
                entry.send.add(start, end);
            }
        }
        let step = self.steps.entry((event.cat, event.name)).or_default();
        step.total += event.dur.max(0.0);
        step.count += 1;
    }

    fn report(self) -> Result<Report, ReportError> {
        if self.complete == 0 {
            return Err(ReportError::NoCompleteEvents);
        }
        let any_pdus = self.connections.values().any(|c| c.pdus);
        let connections: Vec<&Connection> = self
            .connections
            .values()
            .filter(|c| c.pdus || !any_pdus)
            .collect();
        let time: f64 = connections.iter().map(|c| c.last - c.first).sum();
        let share = |total: f64| {
            if time > 0.0 {
                100.0 * total / time
            } else {
                0.0
            }
        };
        let mut rows: Vec<Row> = self
            .steps
            .into_iter()
            .map(|((kind, name), step)| Row {
                name,
                kind,
                total_us: step.total,
                count: step.count,
                average_us: step.total / step.count as f64,
                share_percent: share(step.total),
            })
            .collect();
        if any_pdus {
            let idle = |busy: f64| Row {
                name: String::new(),
                kind: "idle".to_owned(),
                total_us: (time - busy).max(0.0),
                count: connections.len() as u64,
                average_us: (time - busy).max(0.0) / connections.len() as f64,
                share_percent: share((time - busy).max(0.0)),
            };
            let receive: f64 = connections.iter().map(|c| c.receive.busy).sum();
            let send: f64 = connections.iter().map(|c| c.send.busy).sum();
            rows.push(Row {
                name: "(receive idle)".to_owned(),
                ..idle(receive)
            });
            rows.push(Row {
                name: "(send idle)".to_owned(),
                ..idle(send)
            });
        }
        rows.sort_by(|a, b| {
            b.total_us
                .total_cmp(&a.total_us)
                .then_with(|| a.name.cmp(&b.name))
        });
        Ok(Report {
            processes: self.processes,
            connections: connections.len(),
            connection_time_us: time,
            share_of: SHARE_OF,
            rows,
        })
    }
}

/// The top level: `{"traceEvents": [...], ...}` or `[...]`. Says whether
/// it found the events.
struct Root<'a> {
    sums: &'a mut Sums,
}

impl<'de> Visitor<'de> for Root<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with \"traceEvents\" or an array of events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        Events { sums: self.sums }.visit_seq(seq)?;
        Ok(true)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "traceEvents" {
                map.next_value_seed(Events {
                    sums: &mut *self.sums,
                })?;
                found = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// The array of events, summed one at a time.
struct Events<'a> {
    sums: &'a mut Sums,
}

impl<'de> DeserializeSeed<'de> for Events<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Events<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of trace events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(event) = seq.next_element::<Event>()? {
            self.sums.add(event);
        }
        Ok(())
    }
}

/// The table as text, with a header saying what the share is of.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        if !self.processes.is_empty() {
            writeln!(f, "process: {}", self.processes.join(", "))?;
        }
        writeln!(
            f,
            "{} connection(s), {:.3} s of connection time",
            self.connections,
            self.connection_time_us / 1e6
        )?;
        writeln!(
            f,
            "share = time in the step / connection time; commands in flight together add up"
        )?;
        writeln!(
            f,
            "(a command row's share is 100 x the average number in flight)"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<width$}  {:<7}  {:>12}  {:>9}  {:>11}  {:>8}",
            "step", "kind", "total ms", "count", "average us", "share"
        )?;
        for row in &self.rows {
            writeln!(
                f,
                "{:<width$}  {:<7}  {:>12.3}  {:>9}  {:>11.3}  {:>7.2}%",
                row.name,
                row.kind,
                row.total_us / 1000.0,
                row.count,
                row.average_us,
                row.share_percent
            )?;
        }
        Ok(())
    }
}
