//! Watching the PDUs a connection carries, for studies and traces.
//!
//! A [`WireTap`] is told of every PDU a [`StreamSender`](crate::tcp::StreamSender)
//! writes and a [`StreamReceiver`](crate::tcp::StreamReceiver) reads, as a
//! small [`PduSummary`] with the times the PDU went in or came out. Two
//! users need this and nothing more:
//!
//! - parameter studies (Shastry, Klotz and Russell's linear models) need the
//!   PDUs per command *actually seen on the wire*, not what the settings
//!   predict: [`WireCounter`] counts them with relaxed atomics;
//! - traces (the FKT study of Chadda, Palekar and Russell) need one event
//!   per PDU with its time, per connection.
//!
//! The tap sits in the datamover because it is the one place both roles'
//! PDUs pass; it only watches (no PDU is held, changed or copied), and a
//! connection without a tap pays one branch per PDU.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use iscsi_proto::pdu::{Header, Opcode, Pdu};

/// The Target Transfer Tag of unsolicited Data-Out (RFC 7143 section 11.7.4).
const UNSOLICITED_TTT: u32 = 0xffff_ffff;

/// Which way a PDU went, seen from this end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Written by this end.
    Sent,
    /// Read by this end.
    Received,
}

/// What a tap learns of one PDU: enough to classify and trace it, without
/// holding the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PduSummary {
    /// The opcode (RFC 7143 section 11.2.1.2).
    pub opcode: Opcode,
    /// The Initiator Task Tag, which names the task across PDUs.
    pub itt: u32,
    /// DataSegmentLength: data bytes, without padding and digests.
    pub data_length: u32,
    /// A Data-Out answering an R2T (its TTT is not 0xffffffff), rather than
    /// unsolicited data (section 11.7.4).
    pub solicited: bool,
    /// A PDU that ends a SCSI task: a SCSI Response, or a Data-In with the
    /// S bit (phase collapse, section 11.7.3).
    pub status: bool,
    /// For a SCSI Command: the CDB's operation code (0 otherwise).
    pub cdb_opcode: u8,
    /// For a SCSI Command: the R (read) and W (write) bits.
    pub read: bool,
    /// See `read`.
    pub write: bool,
}

impl PduSummary {
    /// Summarises a header.
    pub fn of(header: &Header) -> Self {
        let mut summary = PduSummary {
            opcode: header.pdu.opcode(),
            itt: 0,
            data_length: header.data_segment_length,
            solicited: false,
            status: false,
            cdb_opcode: 0,
            read: false,
            write: false,
        };
        // The hot PDUs name their tag directly; `initiator_task_tag()`
        // encodes a whole BHS, which is fine for the rare others.
        match &header.pdu {
            Pdu::ScsiCommand(c) => {
                summary.itt = c.initiator_task_tag;
                summary.cdb_opcode = c.cdb[0];
                summary.read = c.read;
                summary.write = c.write;
            }
            Pdu::DataOut(d) => {
                summary.itt = d.initiator_task_tag;
                summary.solicited = d.target_transfer_tag != UNSOLICITED_TTT;
            }
            Pdu::DataIn(d) => {
                summary.itt = d.initiator_task_tag;
                summary.status = d.status.is_some();
            }
            Pdu::ReadyToTransfer(r) => summary.itt = r.initiator_task_tag,
            Pdu::ScsiResponse(r) => {
                summary.itt = r.initiator_task_tag;
                summary.status = true;
            }
            other => summary.itt = other.initiator_task_tag(),
        }
        summary
    }
}

/// One PDU that crossed a tapped connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PduEvent {
    /// The connection, as numbered by whoever set the tap.
    pub connection: u64,
    /// Sent or received.
    pub direction: Direction,
    /// The PDU.
    pub pdu: PduSummary,
    /// Sent: when the write that carries it began. Received: when its
    /// header had been decoded.
    pub start: Instant,
    /// Sent: when that write had been accepted by the stream. Received:
    /// when its last byte (and data digest) had been taken in.
    pub end: Instant,
}

/// A step of one task's work that the wire does not show (the target's
/// SCSI execution, its wait for the connection's writer), timed by the
/// code that does it and reported through the same tap as the PDUs, so a
/// trace holds both on one clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepEvent {
    /// The connection, as numbered by whoever set the tap.
    pub connection: u64,
    /// The Initiator Task Tag of the task the step worked for.
    pub itt: u32,
    /// What the step was, e.g. `"execute"`.
    pub name: &'static str,
    /// When the step began.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
}

/// Something told of every PDU on the connections it is set on. Calls come
/// from the connections' own tasks, concurrently: keep them short.
pub trait WireTap: Send + Sync + Debug {
    /// One PDU was sent or received. A sent PDU is reported once its write
    /// has returned, with the time the write took.
    fn pdu(&self, event: &PduEvent);

    /// A PDU is about to be written on `connection`. Counters count sent
    /// PDUs here rather than in [`WireTap::pdu`]: the peer's answer can
    /// arrive, and a caller read the counts, in the moment between the
    /// write returning and its `pdu` report, so a count taken there would
    /// miss a command already answered. (A PDU whose write then fails is
    /// counted all the same; its connection is gone.)
    fn sending(&self, connection: u64, pdu: &PduSummary) {
        let _ = (connection, pdu);
    }

    /// One step of a task's work between its PDUs. Only traces want these;
    /// counting taps keep the default, which ignores them.
    fn step(&self, event: &StepEvent) {
        let _ = event;
    }
}

/// A tap on one connection: the shared tap and the number it gives this
/// connection's events.
#[derive(Clone, Debug)]
pub struct Tap {
    tap: Arc<dyn WireTap>,
    connection: u64,
}

impl Tap {
    /// Tells `tap` of this connection's PDUs, numbered `connection`.
    pub fn new(tap: Arc<dyn WireTap>, connection: u64) -> Self {
        Tap { tap, connection }
    }

    /// Reports one PDU about to be written.
    pub fn sending(&self, pdu: &PduSummary) {
        self.tap.sending(self.connection, pdu);
    }

    /// Reports one PDU.
    pub fn pdu(&self, direction: Direction, pdu: PduSummary, start: Instant, end: Instant) {
        self.tap.pdu(&PduEvent {
            connection: self.connection,
            direction,
            pdu,
            start,
            end,
        });
    }

    /// Reports one step of the task `itt`'s work on this connection.
    pub fn step(&self, name: &'static str, itt: u32, start: Instant, end: Instant) {
        self.tap.step(&StepEvent {
            connection: self.connection,
            itt,
            name,
            start,
            end,
        });
    }
}

/// Several taps as one (a session's counter and a user's trace).
#[derive(Debug)]
pub struct Tee(pub Vec<Arc<dyn WireTap>>);

impl WireTap for Tee {
    fn pdu(&self, event: &PduEvent) {
        for tap in &self.0 {
            tap.pdu(event);
        }
    }

    fn step(&self, event: &StepEvent) {
        for tap in &self.0 {
            tap.step(event);
        }
    }

    fn sending(&self, connection: u64, pdu: &PduSummary) {
        for tap in &self.0 {
            tap.sending(connection, pdu);
        }
    }
}

/// PDUs and data bytes by the kinds the parameter studies count, as one
/// end saw them. Sent and received are not told apart: each kind goes one
/// way only (an initiator sends commands and Data-Out, and receives Data-In,
/// R2Ts and responses; a target the reverse).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireCounts {
    /// SCSI Command PDUs.
    pub scsi_commands: u64,
    /// SCSI Data-In PDUs.
    pub data_in: u64,
    /// R2T PDUs.
    pub r2t: u64,
    /// SCSI Data-Out PDUs, solicited and unsolicited.
    pub data_out: u64,
    /// Immediate data: bytes in the data segments of SCSI Commands.
    pub immediate_bytes: u64,
    /// Unsolicited data: bytes in Data-Out PDUs with TTT 0xffffffff.
    pub unsolicited_bytes: u64,
    /// Solicited data: bytes in Data-Out PDUs answering R2Ts.
    pub solicited_bytes: u64,
    /// SCSI Response PDUs (a read whose status rode on its last Data-In
    /// has none).
    pub scsi_responses: u64,
    /// Every PDU, of any kind, both ways.
    pub pdus: u64,
}

impl WireCounts {
    /// What was counted between `earlier` and `self`.
    pub fn since(&self, earlier: &WireCounts) -> WireCounts {
        WireCounts {
            scsi_commands: self.scsi_commands - earlier.scsi_commands,
            data_in: self.data_in - earlier.data_in,
            r2t: self.r2t - earlier.r2t,
            data_out: self.data_out - earlier.data_out,
            immediate_bytes: self.immediate_bytes - earlier.immediate_bytes,
            unsolicited_bytes: self.unsolicited_bytes - earlier.unsolicited_bytes,
            solicited_bytes: self.solicited_bytes - earlier.solicited_bytes,
            scsi_responses: self.scsi_responses - earlier.scsi_responses,
            pdus: self.pdus - earlier.pdus,
        }
    }
}

/// A [`WireTap`] that counts [`WireCounts`], for any number of connections.
#[derive(Debug, Default)]
pub struct WireCounter {
    scsi_commands: AtomicU64,
    data_in: AtomicU64,
    r2t: AtomicU64,
    data_out: AtomicU64,
    immediate_bytes: AtomicU64,
    unsolicited_bytes: AtomicU64,
    solicited_bytes: AtomicU64,
    scsi_responses: AtomicU64,
    pdus: AtomicU64,
}

impl WireCounter {
    /// The counts so far.
    pub fn counts(&self) -> WireCounts {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WireCounts {
            scsi_commands: get(&self.scsi_commands),
            data_in: get(&self.data_in),
            r2t: get(&self.r2t),
            data_out: get(&self.data_out),
            immediate_bytes: get(&self.immediate_bytes),
            unsolicited_bytes: get(&self.unsolicited_bytes),
            solicited_bytes: get(&self.solicited_bytes),
            scsi_responses: get(&self.scsi_responses),
            pdus: get(&self.pdus),
        }
    }
}

impl WireCounter {
    fn count(&self, pdu: &PduSummary) {
        let add = |counter: &AtomicU64, n: u64| {
            counter.fetch_add(n, Ordering::Relaxed);
        };
        let bytes = u64::from(pdu.data_length);
        add(&self.pdus, 1);
        match pdu.opcode {
            Opcode::ScsiCommand => {
                add(&self.scsi_commands, 1);
                add(&self.immediate_bytes, bytes);
            }
            Opcode::ScsiDataOut => {
                add(&self.data_out, 1);
                if pdu.solicited {
                    add(&self.solicited_bytes, bytes);
                } else {
                    add(&self.unsolicited_bytes, bytes);
                }
            }
            Opcode::ScsiDataIn => add(&self.data_in, 1),
            Opcode::ReadyToTransfer => add(&self.r2t, 1),
            Opcode::ScsiResponse => add(&self.scsi_responses, 1),
            _ => {}
        }
    }
}

/// Received PDUs are counted when read, sent ones before they are written
/// (see [`WireTap::sending`]).
impl WireTap for WireCounter {
    fn pdu(&self, event: &PduEvent) {
        if event.direction == Direction::Received {
            self.count(&event.pdu);
        }
    }

    fn sending(&self, _connection: u64, pdu: &PduSummary) {
        self.count(pdu);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::pdu::data::{DataIn, DataOut};
    use iscsi_proto::pdu::{Lun, scsi::ScsiCommand};
    use iscsi_proto::serial::{CmdSn, DataSn, StatSn};

    fn data_out(ttt: u32, length: u32) -> Header {
        Header::new(
            Pdu::DataOut(DataOut {
                final_flag: true,
                lun: Lun(0),
                initiator_task_tag: 7,
                target_transfer_tag: ttt,
                exp_stat_sn: StatSn::new(1),
                data_sn: DataSn::new(0),
                buffer_offset: 0,
            }),
            length,
        )
    }

    fn event(header: &Header) -> PduEvent {
        let now = Instant::now();
        PduEvent {
            connection: 1,
            direction: Direction::Received,
            pdu: PduSummary::of(header),
            start: now,
            end: now,
        }
    }

    #[test]
    fn data_out_is_counted_as_solicited_or_unsolicited_by_its_ttt() {
        let counter = WireCounter::default();
        counter.pdu(&event(&data_out(UNSOLICITED_TTT, 8192)));
        counter.pdu(&event(&data_out(0x10, 4096)));
        counter.pdu(&event(&data_out(0x11, 4096)));
        let counts = counter.counts();
        assert_eq!(counts.data_out, 3);
        assert_eq!(counts.unsolicited_bytes, 8192);
        assert_eq!(counts.solicited_bytes, 8192);
        assert_eq!(counts.pdus, 3);
        assert_eq!(counts.since(&WireCounts::default()), counts);
    }

    #[test]
    fn a_command_counts_its_immediate_data_and_names_its_task() {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x2a;
        let header = Header::new(
            Pdu::ScsiCommand(ScsiCommand {
                immediate: false,
                final_flag: false,
                read: false,
                write: true,
                attr: Default::default(),
                lun: Lun(0),
                initiator_task_tag: 42,
                expected_data_transfer_length: 65536,
                cmd_sn: CmdSn::new(1),
                exp_stat_sn: StatSn::new(1),
                cdb,
            }),
            16384,
        );
        let summary = PduSummary::of(&header);
        assert_eq!(
            (summary.itt, summary.cdb_opcode, summary.write),
            (42, 0x2a, true)
        );
        let counter = WireCounter::default();
        counter.pdu(&event(&header));
        let counts = counter.counts();
        assert_eq!((counts.scsi_commands, counts.immediate_bytes), (1, 16384));
    }

    /// The target's answer can be counted, and read, before the command's
    /// write is reported done: the command must already be in the counts.
    #[test]
    fn a_sent_pdu_is_counted_once_before_its_write_is_reported() {
        let counter = Arc::new(WireCounter::default());
        let tap = Tap::new(Arc::new(Tee(vec![counter.clone()])), 1);
        let header = data_out(0x10, 4096);
        tap.sending(&PduSummary::of(&header));
        assert_eq!((counter.counts().data_out, counter.counts().pdus), (1, 1));
        let sent = PduEvent {
            direction: Direction::Sent,
            ..event(&header)
        };
        counter.pdu(&sent);
        assert_eq!(counter.counts().pdus, 1, "a sent PDU is not counted twice");
    }

    #[test]
    fn a_data_in_with_status_ends_its_task() {
        let data_in = |status: Option<u8>| {
            Header::new(
                Pdu::DataIn(DataIn {
                    final_flag: true,
                    acknowledge: false,
                    residual_overflow: false,
                    residual_underflow: false,
                    status,
                    lun: Lun(0),
                    initiator_task_tag: 9,
                    target_transfer_tag: UNSOLICITED_TTT,
                    stat_sn: StatSn::new(1),
                    exp_cmd_sn: CmdSn::new(1),
                    max_cmd_sn: CmdSn::new(2),
                    data_sn: DataSn::new(0),
                    buffer_offset: 0,
                    residual_count: 0,
                }),
                512,
            )
        };
        assert!(PduSummary::of(&data_in(Some(0))).status);
        assert!(!PduSummary::of(&data_in(None)).status);
    }
}
