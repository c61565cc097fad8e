//! [`TraceWriter`]: a [`WireTap`] that streams every PDU, command and step
//! it is told of to a Chrome Trace Event Format file.
//!
//! Memory stays bounded however long the trace: each event is formatted
//! into one reused line buffer and appended to a chunk of at most
//! [`CHUNK`] bytes; the only other state is the commands in flight (to
//! close their spans when their status passes) and the names already
//! given to tracks. A full chunk is written out by the thread that filled
//! it *after* releasing the events' lock, so the other connections' tasks
//! do not wait for a write system call to note their events.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use iscsi_datamover::tap::{Direction, PduEvent, StepEvent, WireTap};
use iscsi_proto::pdu::Opcode;

use crate::names::{cdb_name, pdu_name};
use crate::tracks::{
    COMMAND_LANES, FIRST_LANE_TRACK, RECEIVE_TRACK, SEND_TRACK, STEP_TRACK, TRACKS_PER_CONNECTION,
};

/// Commands whose spans are held open at once, over all connections. A
/// command that is never answered (aborted, or its connection dropped)
/// stays in the table until its tag is reused; this cap keeps a target
/// that traces for days from growing without end.
const MAX_PENDING: usize = 1 << 16;

/// Bytes of trace written per system call (a few thousand events).
const CHUNK: usize = 512 << 10;

/// A command whose span is open: from its SCSI Command PDU to its status.
#[derive(Clone, Copy, Debug)]
struct Pending {
    start: Instant,
    cdb: u8,
    read: bool,
    write: bool,
    /// The track its span (and its steps) go on.
    lane: u32,
}

/// The lanes of one connection: command spans overlap (many commands in
/// flight), and a timeline shows only properly nested slices on one
/// track, so each command in flight takes the lowest free lane.
///
/// A lane is free for a command only if its last span ended before that
/// command began: events are reported in the order their threads take the
/// lock, not in the order they were timed, so a command whose PDU was
/// timed a moment before another's status may be reported after it.
#[derive(Debug, Default)]
struct Lanes {
    /// Per lane: `None` while a command holds it, else when its last span
    /// ended.
    free_since: Vec<Option<Instant>>,
}

impl Lanes {
    fn take(&mut self, start: Instant) -> u32 {
        let free = self
            .free_since
            .iter()
            .position(|since| since.is_some_and(|since| since <= start));
        match free {
            Some(free) => {
                self.free_since[free] = None;
                free as u32
            }
            None if self.free_since.len() < COMMAND_LANES as usize => {
                self.free_since.push(None);
                self.free_since.len() as u32 - 1
            }
            // More in flight than lanes: the last lane is shared (its
            // slices may overlap on the timeline; the table is unaffected).
            None => COMMAND_LANES - 1,
        }
    }

    /// Frees `lane`, whose last slice ended at `end`.
    fn free(&mut self, lane: u32, end: Instant) {
        if let Some(since) = self.free_since.get_mut(lane as usize) {
            *since = Some(since.map_or(end, |since| since.max(end)));
        }
    }
}

/// Everything behind the events' lock.
struct State {
    /// False once finished: later events are ignored.
    open: bool,
    /// The event being formatted, reused from event to event.
    line: Vec<u8>,
    /// Events not written yet, up to [`CHUNK`] bytes.
    chunk: Vec<u8>,
    /// Whether an event has been written (for the separating comma).
    written: bool,
    /// Commands in flight by (connection, ITT).
    pending: HashMap<(u64, u32), Pending>,
    /// Statuses seen before their command: an initiator's reading task can
    /// take in a status before its writer has reported the write that sent
    /// the command. By (connection, ITT): when the status ended.
    early: HashMap<(u64, u32), Instant>,
    lanes: HashMap<u64, Lanes>,
    /// Tracks that have their `thread_name` metadata event.
    named: HashSet<u64>,
    events: u64,
    /// Commands whose span was lost: never answered before their tag came
    /// back, or beyond `MAX_PENDING`.
    spans_lost: u64,
}

/// Where full chunks go, behind a lock of its own (taken while holding the
/// events' lock, so chunks go out in order, and kept while writing).
struct Output {
    /// `None` once finished, or after a write failed.
    out: Option<Box<dyn Write + Send>>,
    /// The chunk last written, emptied, to be filled again.
    spare: Vec<u8>,
    /// The first write error, reported by `finish`.
    error: Option<io::Error>,
}

impl Output {
    fn write(&mut self, bytes: &[u8]) {
        if let Some(out) = self.out.as_mut()
            && let Err(error) = out.write_all(bytes)
        {
            // The file cannot be closed as valid JSON any more: stop, and
            // let `finish` say why.
            self.out = None;
            self.error.get_or_insert(error);
        }
    }
}

/// A [`WireTap`] writing a Chrome Trace Event Format file (for Perfetto,
/// `chrome://tracing` and `iscsi trace-report`): one complete event per
/// PDU, one per SCSI command from its command PDU to its status, one per
/// [`StepEvent`]. Call [`TraceWriter::finish`] to close the JSON; dropping
/// the writer unfinished finishes it too, ignoring errors.
pub struct TraceWriter {
    /// Time 0 of the trace.
    origin: Instant,
    /// The `pid` of every event: this process.
    pid: u32,
    state: Mutex<State>,
    output: Mutex<Output>,
}

impl std::fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl TraceWriter {
    /// Creates (or truncates) `path` and starts a trace there for the
    /// process named `process` (e.g. "iscsi target").
    pub fn create(path: &Path, process: &str) -> io::Result<TraceWriter> {
        TraceWriter::new(File::create(path)?, process)
    }

    /// Starts a trace on `out` for the process named `process`. The writer
    /// buffers: `out` is written a chunk at a time.
    pub fn new(out: impl Write + Send + 'static, process: &str) -> io::Result<TraceWriter> {
        let writer = TraceWriter {
            origin: Instant::now(),
            pid: std::process::id(),
            state: Mutex::new(State {
                open: true,
                line: Vec::with_capacity(512),
                chunk: Vec::with_capacity(CHUNK + 4096),
                written: false,
                pending: HashMap::new(),
                early: HashMap::new(),
                lanes: HashMap::new(),
                named: HashSet::new(),
                events: 0,
                spans_lost: 0,
            }),
            output: Mutex::new(Output {
                out: Some(Box::new(out)),
                spare: Vec::with_capacity(CHUNK + 4096),
                error: None,
            }),
        };
        let name = serde_json::to_string(process).map_err(io::Error::other)?;
        let mut state = writer.lock();
        state
            .chunk
            .extend_from_slice(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
        let pid = writer.pid;
        state.line.clear();
        let _ = write!(
            state.line,
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":{name}}}}}"
        );
        state.emit();
        drop(state);
        Ok(writer)
    }

    /// Closes the JSON (commands still in flight are counted in
    /// `otherData`, without spans) and flushes it. Events after this are
    /// ignored. Returns the first error met while writing.
    pub fn finish(&self) -> io::Result<()> {
        let mut state = self.lock();
        let mut output = self.output.lock().unwrap_or_else(|e| e.into_inner());
        if !state.open {
            return match output.error.take() {
                Some(error) => Err(error),
                None => Ok(()),
            };
        }
        state.open = false;
        let tail = format!(
            "\n],\"otherData\":{{\"producer\":\"iscsi-rs {}\",\"events\":{},\
             \"commands_in_flight_at_end\":{},\"command_spans_lost\":{},\
             \"tracks\":\"tid = connection * {} + track: {} received PDUs, {} sent PDUs, {}-{} commands in flight (one lane each, with their steps), {} steps of unknown commands\"}}}}\n",
            env!("CARGO_PKG_VERSION"),
            state.events,
            state.pending.len(),
            state.spans_lost,
            TRACKS_PER_CONNECTION,
            RECEIVE_TRACK,
            SEND_TRACK,
            FIRST_LANE_TRACK,
            STEP_TRACK - 1,
            STEP_TRACK,
        );
        state.chunk.extend_from_slice(tail.as_bytes());
        output.write(&state.chunk);
        state.chunk = Vec::new();
        state.pending.clear();
        state.early.clear();
        if let Some(mut out) = output.out.take()
            && let Err(error) = out.flush()
        {
            output.error.get_or_insert(error);
        }
        match output.error.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Releases the events' lock, first writing the chunk out if it is
    /// full: the next chunk is started, and the full one written while
    /// only the output is locked.
    fn release(&self, mut state: MutexGuard<'_, State>) {
        if state.chunk.len() < CHUNK {
            return;
        }
        let mut output = self.output.lock().unwrap_or_else(|e| e.into_inner());
        let spare = std::mem::take(&mut output.spare);
        let mut full = std::mem::replace(&mut state.chunk, spare);
        drop(state);
        output.write(&full);
        full.clear();
        output.spare = full;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves at worst a half-written
        // line: keep tracing rather than poison every connection.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Microseconds since the trace began, as `123.456`.
    fn timestamp(&self, line: &mut Vec<u8>, at: Instant) {
        push_micros(line, nanos(at.saturating_duration_since(self.origin)));
    }

    /// Writes the common head of a complete event, up to `"args":`.
    fn head(
        &self,
        state: &mut State,
        name: &[&str],
        category: &str,
        tid: u64,
        start: Instant,
        end: Instant,
    ) {
        state.line.clear();
        state.line.extend_from_slice(b"{\"name\":\"");
        for part in name {
            state.line.extend_from_slice(part.as_bytes());
        }
        let line = &mut state.line;
        line.extend_from_slice(b"\",\"cat\":\"");
        line.extend_from_slice(category.as_bytes());
        line.extend_from_slice(b"\",\"ph\":\"X\",\"pid\":");
        push_u64(line, u64::from(self.pid));
        line.extend_from_slice(b",\"tid\":");
        push_u64(line, tid);
        line.extend_from_slice(b",\"ts\":");
        self.timestamp(line, start);
        line.extend_from_slice(b",\"dur\":");
        push_micros(line, nanos(end.saturating_duration_since(start)));
        line.extend_from_slice(b",\"args\":");
    }

    /// Gives a track its name the first time it is used.
    fn name_track(&self, state: &mut State, connection: u64, track: u32) {
        let tid = tid(connection, track);
        if !state.named.insert(tid) {
            return;
        }
        let what = match track {
            RECEIVE_TRACK => "received".to_owned(),
            SEND_TRACK => "sent".to_owned(),
            STEP_TRACK => "steps of unknown commands".to_owned(),
            lane => format!("commands {}", lane - FIRST_LANE_TRACK + 1),
        };
        state.line.clear();
        let _ = write!(
            state.line,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{tid},\"args\":{{\"name\":\"connection {connection} {what}\"}}}},\n\
             {{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{},\"tid\":{tid},\"args\":{{\"sort_index\":{tid}}}}}",
            self.pid, self.pid
        );
        state.emit();
    }

    fn command_span(&self, state: &mut State, connection: u64, itt: u32, p: Pending, end: Instant) {
        let track = FIRST_LANE_TRACK + p.lane;
        self.name_track(state, connection, track);
        let name = cdb_name(p.cdb);
        self.head(
            state,
            &[&name],
            "command",
            tid(connection, track),
            p.start,
            end,
        );
        let line = &mut state.line;
        line.extend_from_slice(b"{\"itt\":");
        push_u64(line, u64::from(itt));
        line.extend_from_slice(b",\"cdb\":");
        push_hex_byte(line, p.cdb);
        line.extend_from_slice(b",\"read\":");
        push_bool(line, p.read);
        line.extend_from_slice(b",\"write\":");
        push_bool(line, p.write);
        line.extend_from_slice(b"}}");
        state.emit();
        if let Some(lanes) = state.lanes.get_mut(&connection) {
            lanes.free(p.lane, end);
        }
    }

    /// Opens the span of a command whose SCSI Command PDU has passed.
    fn command_started(&self, state: &mut State, event: &PduEvent) {
        let key = (event.connection, event.pdu.itt);
        let early = state.early.remove(&key);
        let old = state.pending.remove(&key);
        if old.is_some() {
            // Never answered (aborted, or its status lost with its
            // connection): its tag is in use again.
            state.spans_lost += 1;
        } else if early.is_none() && state.pending.len() >= MAX_PENDING {
            state.spans_lost += 1;
            return;
        }
        let lanes = state.lanes.entry(event.connection).or_default();
        if let Some(old) = old {
            // Its steps may have ended up to now.
            lanes.free(old.lane, Instant::now());
        }
        let pending = Pending {
            start: event.start,
            cdb: event.pdu.cdb_opcode,
            read: event.pdu.read,
            write: event.pdu.write,
            lane: lanes.take(event.start),
        };
        match early {
            Some(end) => self.command_span(state, event.connection, event.pdu.itt, pending, end),
            None => {
                state.pending.insert(key, pending);
            }
        }
    }

    /// Closes the span of the command a status PDU ended.
    fn command_ended(&self, state: &mut State, event: &PduEvent) {
        let key = (event.connection, event.pdu.itt);
        match state.pending.remove(&key) {
            Some(pending) => {
                self.command_span(state, event.connection, event.pdu.itt, pending, event.end)
            }
            None if state.early.len() < MAX_PENDING => {
                state.early.insert(key, event.end);
            }
            None => state.spans_lost += 1,
        }
    }
}

impl State {
    /// Appends the formatted line to the chunk, after a separator.
    fn emit(&mut self) {
        if self.written {
            self.chunk.extend_from_slice(b",\n");
        }
        self.chunk.extend_from_slice(&self.line);
        self.written = true;
        self.events += 1;
    }
}

/// A duration in nanoseconds (584 years fit in a u64).
fn nanos(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

// The hot path's formatting, without `core::fmt`: an event is a dozen
// numbers, and `write!` made them a third of an event's cost.

/// Appends `n` in decimal.
fn push_u64(line: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    line.extend_from_slice(&digits[at..]);
}

/// Appends nanoseconds as microseconds with three decimals, `12.345`.
fn push_micros(line: &mut Vec<u8>, nanos: u64) {
    push_u64(line, nanos / 1000);
    let fraction = nanos % 1000;
    line.extend_from_slice(&[
        b'.',
        b'0' + (fraction / 100) as u8,
        b'0' + (fraction / 10 % 10) as u8,
        b'0' + (fraction % 10) as u8,
    ]);
}

/// Appends a byte as a JSON string `"0x2a"`.
fn push_hex_byte(line: &mut Vec<u8>, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    line.extend_from_slice(&[
        b'"',
        b'0',
        b'x',
        HEX[usize::from(byte >> 4)],
        HEX[usize::from(byte & 15)],
        b'"',
    ]);
}

fn push_bool(line: &mut Vec<u8>, value: bool) {
    line.extend_from_slice(if value { b"true" } else { b"false" });
}

/// The `tid` of a connection's track.
fn tid(connection: u64, track: u32) -> u64 {
    connection * TRACKS_PER_CONNECTION + u64::from(track)
}

impl WireTap for TraceWriter {
    fn pdu(&self, event: &PduEvent) {
        let mut state = self.lock();
        if !state.open {
            return;
        }
        let pdu = &event.pdu;
        let (verb, track) = match event.direction {
            Direction::Sent => ("send ", SEND_TRACK),
            Direction::Received => ("recv ", RECEIVE_TRACK),
        };
        self.name_track(&mut state, event.connection, track);
        let name = pdu_name(pdu.opcode);
        self.head(
            &mut state,
            &[verb, &name],
            "pdu",
            tid(event.connection, track),
            event.start,
            event.end,
        );
        let line = &mut state.line;
        line.extend_from_slice(b"{\"itt\":");
        push_u64(line, u64::from(pdu.itt));
        line.extend_from_slice(b",\"data_length\":");
        push_u64(line, u64::from(pdu.data_length));
        match pdu.opcode {
            Opcode::ScsiDataOut => {
                line.extend_from_slice(b",\"solicited\":");
                push_bool(line, pdu.solicited);
            }
            Opcode::ScsiDataIn | Opcode::ScsiResponse => {
                line.extend_from_slice(b",\"status\":");
                push_bool(line, pdu.status);
            }
            Opcode::ScsiCommand => {
                line.extend_from_slice(b",\"cdb\":");
                push_hex_byte(line, pdu.cdb_opcode);
            }
            _ => {}
        }
        line.extend_from_slice(b"}}");
        state.emit();
        if pdu.opcode == Opcode::ScsiCommand {
            self.command_started(&mut state, event);
        } else if pdu.status {
            self.command_ended(&mut state, event);
        }
        self.release(state);
    }

    fn step(&self, event: &StepEvent) {
        let mut state = self.lock();
        if !state.open {
            return;
        }
        // A step goes on its command's lane, nested in the command's span,
        // and is named after the command so the table splits reads from
        // writes.
        let key = (event.connection, event.itt);
        let (track, command) = match state.pending.get(&key) {
            Some(p) => (FIRST_LANE_TRACK + p.lane, Some(cdb_name(p.cdb))),
            None => (STEP_TRACK, None),
        };
        self.name_track(&mut state, event.connection, track);
        let (separator, command) = match &command {
            Some(name) => (" ", name.as_ref()),
            None => ("", ""),
        };
        self.head(
            &mut state,
            &[event.name, separator, command],
            "step",
            tid(event.connection, track),
            event.start,
            event.end,
        );
        state.line.extend_from_slice(b"{\"itt\":");
        push_u64(&mut state.line, u64::from(event.itt));
        state.line.extend_from_slice(b"}}");
        state.emit();
        self.release(state);
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_as_core_fmt_would() {
        for n in [0u64, 7, 10, 999, 1000, 123_456_789, u64::MAX] {
            let mut line = Vec::new();
            push_u64(&mut line, n);
            assert_eq!(line, n.to_string().as_bytes());
        }
        for nanos in [0u64, 5, 1_000, 1_234_567, 90_010] {
            let mut line = Vec::new();
            push_micros(&mut line, nanos);
            let expected = format!("{}.{:03}", nanos / 1000, nanos % 1000);
            assert_eq!(String::from_utf8(line).unwrap(), expected);
        }
        let mut line = Vec::new();
        push_hex_byte(&mut line, 0x0a);
        push_bool(&mut line, false);
        assert_eq!(line, b"\"0x0a\"false");
    }
}
