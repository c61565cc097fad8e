//! How a command's data is cut into PDUs, and the checks a receiver applies
//! to what arrives: the rules RFC 7143 derives from the negotiated
//! MaxRecvDataSegmentLength (13.12), MaxBurstLength (13.13),
//! FirstBurstLength (13.14), InitialR2T (13.10), ImmediateData (13.11),
//! MaxOutstandingR2T (13.17), DataPDUInOrder (13.18) and DataSequenceInOrder
//! (13.19), and the data transfer rules of section 4.2.5 / 11.7-11.8.
//!
//! - Senders ask for a plan: [`Limits::write_plan`] (what the initiator may
//!   send unsolicited: immediate data, then unsolicited Data-Out up to
//!   FirstBurstLength), [`Limits::r2t_bursts`] (how a target solicits the
//!   rest, each R2T at most MaxBurstLength), [`data_segments`] (one sequence
//!   cut into PDUs of at most the receiver's MaxRecvDataSegmentLength, DataSN
//!   from 0, F on the last) and [`Limits::data_in_segments`] (a read's Data-In
//!   PDUs: sequences of at most MaxBurstLength, DataSN across the command,
//!   status in the last one when phase collapse applies).
//! - Receivers check with [`DataOutTracker`] (target side: every Data-Out
//!   inside its R2T or the unsolicited window, DataSN in order, no overlap,
//!   in offset order where the InOrder keys require it) and
//!   [`R2tTracker`] (initiator side: every R2T inside the command, at most
//!   MaxBurstLength, R2TSN in order, at most MaxOutstandingR2T outstanding).
//!
//! Offsets and lengths are `u32`: the Expected Data Transfer Length field
//! (11.3.5) bounds every transfer.

use thiserror::Error;

use crate::pdu::RejectReason;
use crate::text::NegotiatedParameters;

/// The negotiated values that shape data transfers on one connection, seen
/// from one side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest data segment this side may send (the peer's declared
    /// MaxRecvDataSegmentLength).
    pub max_send_segment: u32,
    /// The largest data segment the peer may send this side (ours).
    pub max_recv_segment: u32,
    /// MaxBurstLength.
    pub max_burst_length: u32,
    /// FirstBurstLength.
    pub first_burst_length: u32,
    /// ImmediateData.
    pub immediate_data: bool,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u16,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel: above 0 a target may ask for Data-Out again
    /// with a recovery R2T (RFC 7143 7.8).
    pub error_recovery_level: u8,
}

impl From<&NegotiatedParameters> for Limits {
    fn from(p: &NegotiatedParameters) -> Self {
        Limits {
            max_send_segment: p.max_send_data_segment_length,
            max_recv_segment: p.max_recv_data_segment_length,
            max_burst_length: p.max_burst_length,
            first_burst_length: p.first_burst_length,
            immediate_data: p.immediate_data,
            initial_r2t: p.initial_r2t,
            max_outstanding_r2t: p.max_outstanding_r2t,
            data_pdu_in_order: p.data_pdu_in_order,
            data_sequence_in_order: p.data_sequence_in_order,
            error_recovery_level: p.error_recovery_level,
        }
    }
}

/// One data PDU of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Buffer Offset.
    pub offset: u32,
    /// Data segment length.
    pub length: u32,
    /// DataSN.
    pub data_sn: u32,
    /// The F bit: last PDU of its sequence.
    pub last_in_sequence: bool,
}

/// The data of a task's Data-In as its sender keeps it for sending again
/// (a SNACK, a task reassignment): its length, and a piece of it by byte
/// range, shared rather than copied where the holder can
/// (`iscsi_datamover::Gather` shares its buffers; a `Vec<u8>` copies).
pub trait Payload: Clone {
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Whether it holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes `range` of it (within its length).
    fn slice(&self, range: std::ops::Range<usize>) -> Self;
}

impl Payload for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn slice(&self, range: std::ops::Range<usize>) -> Self {
        self[range].to_vec()
    }
}

/// What an initiator sends for a WRITE before any R2T.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritePlan {
    /// Bytes carried in the SCSI Command PDU itself (immediate data).
    pub immediate: u32,
    /// Bytes sent in unsolicited Data-Out PDUs after the command, starting
    /// at offset `immediate`.
    pub unsolicited: u32,
}

impl WritePlan {
    /// All bytes sent without an R2T; the target solicits the rest.
    pub fn unsolicited_total(&self) -> u32 {
        self.immediate + self.unsolicited
    }
}

impl Limits {
    /// The unsolicited part of a WRITE of `length` bytes (RFC 7143 13.10,
    /// 13.11, 13.14): immediate data up to FirstBurstLength and one data
    /// segment, then, without InitialR2T, unsolicited Data-Out up to
    /// FirstBurstLength in all.
    pub fn write_plan(&self, length: u32) -> WritePlan {
        let first_burst = self.first_burst_length.min(length);
        let immediate = if self.immediate_data {
            first_burst.min(self.max_send_segment)
        } else {
            0
        };
        let unsolicited = if self.initial_r2t {
            0
        } else {
            first_burst - immediate
        };
        WritePlan {
            immediate,
            unsolicited,
        }
    }

    /// How many R2Ts a target keeps outstanding per task: MaxOutstandingR2T,
    /// except 1 where data is recovered with R2Ts in sequence order (RFC
    /// 7143 13.19: with DataSequenceInOrder=Yes a target "may retry at
    /// most the last R2T", so at ErrorRecoveryLevel above 0 MaxOutstandingR2T
    /// "MUST be set to 1"; a target sending fewer than negotiated keeps to
    /// that whatever the peer answered).
    pub fn r2t_limit(&self) -> usize {
        if self.error_recovery_level > 0 && self.data_sequence_in_order {
            1
        } else {
            usize::from(self.max_outstanding_r2t.max(1))
        }
    }

    /// The R2Ts a target sends for a WRITE of `length` bytes of which the
    /// first `unsolicited` arrive unsolicited: `(offset, length)` of each,
    /// at most MaxBurstLength, in offset order.
    pub fn r2t_bursts(&self, length: u32, unsolicited: u32) -> Vec<(u32, u32)> {
        let burst = self.max_burst_length.max(1);
        let mut bursts = Vec::new();
        let mut offset = unsolicited.min(length);
        while offset < length {
            let len = burst.min(length - offset);
            bursts.push((offset, len));
            offset += len;
        }
        bursts
    }

    /// A READ's Data-In PDUs for `length` bytes: segments of at most the
    /// initiator's MaxRecvDataSegmentLength (`max_send_segment` on the
    /// target), grouped in sequences of at most MaxBurstLength whose last
    /// PDU has F; DataSN counts across the whole command (11.7.5, 11.8).
    pub fn data_in_segments(&self, length: u32) -> Vec<Segment> {
        let burst = self.max_burst_length.max(1);
        let mut segments = Vec::new();
        let mut sequence_start = 0;
        while sequence_start < length {
            let sequence_len = burst.min(length - sequence_start);
            for mut segment in data_segments(sequence_start, sequence_len, self.max_send_segment) {
                segment.data_sn = u32::try_from(segments.len()).unwrap_or(u32::MAX);
                segments.push(segment);
            }
            sequence_start += sequence_len;
        }
        segments
    }
}

/// One sequence of `length` bytes from `offset`, cut into PDUs of at most
/// `max_segment` bytes, DataSN from 0, F on the last (RFC 7143 11.7.5: the
/// DataSN of Data-Out restarts with every R2T's sequence).
pub fn data_segments(offset: u32, length: u32, max_segment: u32) -> Vec<Segment> {
    let max_segment = max_segment.max(1);
    let count = length.div_ceil(max_segment);
    (0..count)
        .map(|i| {
            let start = i * max_segment;
            Segment {
                offset: offset + start,
                length: max_segment.min(length - start),
                data_sn: i,
                last_in_sequence: i + 1 == count,
            }
        })
        .collect()
}

/// Why received data or an R2T breaks the transfer rules. At
/// ErrorRecoveryLevel 0 the answer is a Reject of the PDU with the reason
/// [`TransferError::reject_reason`] (RFC 7143 11.17.1) and, as the task
/// cannot complete, a check condition or a dropped connection by the
/// caller's policy.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TransferError {
    /// Data beyond the command's Expected Data Transfer Length.
    #[error("data at {offset}+{length} beyond the expected {expected} bytes")]
    BeyondExpectedLength {
        /// Buffer Offset.
        offset: u32,
        /// Segment length.
        length: u32,
        /// Expected Data Transfer Length.
        expected: u32,
    },
    /// A segment longer than the receiver's MaxRecvDataSegmentLength.
    #[error("segment of {length} bytes exceeds MaxRecvDataSegmentLength {max}")]
    SegmentTooLong {
        /// Its length.
        length: u32,
        /// The limit.
        max: u32,
    },
    /// Unsolicited data the negotiation does not allow, or beyond
    /// FirstBurstLength.
    #[error("unsolicited data at {offset}+{length} not allowed (window {window} bytes)")]
    UnsolicitedNotAllowed {
        /// Buffer Offset.
        offset: u32,
        /// Length.
        length: u32,
        /// The unsolicited window.
        window: u32,
    },
    /// Data-Out for a Target Transfer Tag with no R2T outstanding.
    #[error("no outstanding R2T with target transfer tag {0:#x}")]
    UnknownTransferTag(u32),
    /// Data-Out outside the R2T it answers.
    #[error("data at {offset}+{length} outside its R2T {r2t_offset}+{r2t_length}")]
    OutsideR2t {
        /// Buffer Offset.
        offset: u32,
        /// Length.
        length: u32,
        /// The R2T's Buffer Offset.
        r2t_offset: u32,
        /// The R2T's Desired Data Transfer Length.
        r2t_length: u32,
    },
    /// A DataSN other than the next one expected.
    #[error("DataSN {got}, expected {expected}")]
    DataSnOutOfOrder {
        /// Received.
        got: u32,
        /// Expected.
        expected: u32,
    },
    /// Data overlapping bytes already received.
    #[error("data at {offset}+{length} overlaps data already received")]
    Overlap {
        /// Buffer Offset.
        offset: u32,
        /// Length.
        length: u32,
    },
    /// Data out of offset order where DataPDUInOrder requires order.
    #[error("data at {offset}, expected offset {expected} (DataPDUInOrder=Yes)")]
    OffsetOutOfOrder {
        /// Received offset.
        offset: u32,
        /// Expected offset.
        expected: u32,
    },
    /// An R2T larger than MaxBurstLength or outside the command.
    #[error(
        "R2T {offset}+{length} invalid for a {expected}-byte write, MaxBurstLength {max_burst}"
    )]
    InvalidR2t {
        /// Buffer Offset.
        offset: u32,
        /// Desired Data Transfer Length.
        length: u32,
        /// Expected Data Transfer Length.
        expected: u32,
        /// MaxBurstLength.
        max_burst: u32,
    },
    /// More R2Ts outstanding than MaxOutstandingR2T.
    #[error("more than {0} R2Ts outstanding")]
    TooManyR2ts(u16),
    /// An R2TSN other than the next one.
    #[error("R2TSN {got}, expected {expected}")]
    R2tSnOutOfOrder {
        /// Received.
        got: u32,
        /// Expected.
        expected: u32,
    },
    /// An R2T out of offset order where DataSequenceInOrder requires order.
    #[error("R2T at offset {offset} before offset {expected} (DataSequenceInOrder=Yes)")]
    SequenceOutOfOrder {
        /// Received offset.
        offset: u32,
        /// The lowest offset allowed.
        expected: u32,
    },
}

impl TransferError {
    /// The Reject reason (RFC 7143 11.17.1): "Invalid PDU field" (0x09)
    /// for offsets, lengths, tags and sequence numbers; "Protocol error"
    /// (0x04) for data the negotiated keys forbid.
    pub fn reject_reason(&self) -> RejectReason {
        match self {
            TransferError::UnsolicitedNotAllowed { .. }
            | TransferError::SegmentTooLong { .. }
            | TransferError::TooManyR2ts(_)
            | TransferError::OffsetOutOfOrder { .. }
            | TransferError::SequenceOutOfOrder { .. } => RejectReason::ProtocolError,
            _ => RejectReason::InvalidPduField,
        }
    }
}

/// The byte ranges received so far, kept sorted and merged: what overlap
/// and completion checks need, in memory proportional to the number of
/// gaps, not of PDUs.
#[derive(Clone, Debug, Default)]
struct Ranges {
    ranges: Vec<(u32, u32)>,
}

impl Ranges {
    fn overlaps(&self, start: u32, end: u32) -> bool {
        self.ranges.iter().any(|&(s, e)| start < e && s < end)
    }

    fn insert(&mut self, start: u32, end: u32) {
        if start == end {
            return;
        }
        let at = self.ranges.partition_point(|&(s, _)| s < start);
        self.ranges.insert(at, (start, end));
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.ranges.len());
        for &(s, e) in &self.ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        self.ranges = merged;
    }

    /// Forgets `start..end` (bytes that were received, then discarded).
    fn remove(&mut self, start: u32, end: u32) {
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for &(s, e) in &self.ranges {
            if e <= start || end <= s {
                kept.push((s, e));
                continue;
            }
            if s < start {
                kept.push((s, start));
            }
            if end < e {
                kept.push((end, e));
            }
        }
        self.ranges = kept;
    }

    fn covered(&self, start: u32, end: u32) -> u32 {
        self.ranges
            .iter()
            .map(|&(s, e)| e.min(end).saturating_sub(s.max(start)))
            .sum()
    }
}

/// An R2T the target has sent and not yet seen completed.
#[derive(Clone, Debug)]
struct OutstandingR2t {
    transfer_tag: u32,
    offset: u32,
    length: u32,
    next_data_sn: u32,
    next_offset: u32,
    /// Bytes of its sequence that arrived and were discarded (a data
    /// digest error): asked for again with a recovery R2T, so this one is
    /// complete without them.
    excused: u32,
}

/// What a completed Data-Out PDU means for its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOutProgress {
    /// More data is due.
    Continue,
    /// The R2T with this Target Transfer Tag is complete: its tag may be
    /// reused, and another R2T may be sent.
    R2tComplete(u32),
    /// The unsolicited burst is complete.
    UnsolicitedComplete,
}

/// The target's check of a WRITE's incoming data: immediate data,
/// unsolicited Data-Out (Target Transfer Tag 0xFFFFFFFF) and the Data-Out
/// answering each R2T.
#[derive(Clone, Debug)]
pub struct DataOutTracker {
    limits: Limits,
    expected_length: u32,
    unsolicited_window: u32,
    unsolicited_next_data_sn: u32,
    unsolicited_next_offset: u32,
    received: Ranges,
    outstanding: Vec<OutstandingR2t>,
    /// Ranges discarded and not yet asked for again.
    lost: Vec<(u32, u32)>,
    /// Unsolicited bytes that arrived and were discarded (a digest error):
    /// the initiator will not send them unsolicited again.
    unsolicited_excused: u32,
}

/// The Target Transfer Tag of unsolicited Data-Out (RFC 7143 11.7.4).
pub const UNSOLICITED_TRANSFER_TAG: u32 = 0xFFFF_FFFF;

impl DataOutTracker {
    /// A tracker for a WRITE of `expected_length` bytes whose command PDU
    /// carried `immediate` bytes.
    pub fn new(
        limits: Limits,
        expected_length: u32,
        immediate: u32,
    ) -> Result<Self, TransferError> {
        if immediate > expected_length {
            return Err(TransferError::BeyondExpectedLength {
                offset: 0,
                length: immediate,
                expected: expected_length,
            });
        }
        // Immediate data only where negotiated, and at most FirstBurstLength
        // and one data segment (13.11, 13.14).
        let allowed = if limits.immediate_data {
            limits.first_burst_length.min(limits.max_recv_segment)
        } else {
            0
        };
        if immediate > allowed {
            return Err(TransferError::UnsolicitedNotAllowed {
                offset: 0,
                length: immediate,
                window: allowed,
            });
        }
        let unsolicited_window = if limits.initial_r2t {
            immediate
        } else {
            limits.first_burst_length.min(expected_length)
        };
        let mut received = Ranges::default();
        received.insert(0, immediate);
        Ok(DataOutTracker {
            limits,
            expected_length,
            unsolicited_window,
            unsolicited_next_data_sn: 0,
            unsolicited_next_offset: immediate,
            received,
            outstanding: Vec::new(),
            lost: Vec::new(),
            unsolicited_excused: 0,
        })
    }

    /// The bytes a target must solicit with R2Ts: everything past the
    /// unsolicited window (sent or not: RFC 7143 does not re-solicit the
    /// unsolicited part at ERL 0).
    pub fn solicited_from(&self) -> u32 {
        self.unsolicited_window
    }

    /// Records an R2T sent for `offset..offset + length` with `transfer_tag`.
    pub fn r2t_sent(&mut self, transfer_tag: u32, offset: u32, length: u32) {
        self.outstanding.push(OutstandingR2t {
            transfer_tag,
            offset,
            length,
            next_data_sn: 0,
            next_offset: offset,
            excused: 0,
        });
    }

    /// How many R2Ts await their data.
    pub fn outstanding_r2ts(&self) -> usize {
        self.outstanding.len()
    }

    /// Checks one Data-Out and records it.
    pub fn data_out(
        &mut self,
        transfer_tag: u32,
        data_sn: u32,
        offset: u32,
        length: u32,
        last_in_sequence: bool,
    ) -> Result<DataOutProgress, TransferError> {
        let end = offset
            .checked_add(length)
            .filter(|&end| end <= self.expected_length)
            .ok_or(TransferError::BeyondExpectedLength {
                offset,
                length,
                expected: self.expected_length,
            })?;
        if length > self.limits.max_recv_segment {
            return Err(TransferError::SegmentTooLong {
                length,
                max: self.limits.max_recv_segment,
            });
        }
        if self.received.overlaps(offset, end) {
            return Err(TransferError::Overlap { offset, length });
        }
        let in_order = self.limits.data_pdu_in_order;
        let progress = if transfer_tag == UNSOLICITED_TRANSFER_TAG {
            if end > self.unsolicited_window {
                return Err(TransferError::UnsolicitedNotAllowed {
                    offset,
                    length,
                    window: self.unsolicited_window,
                });
            }
            check_order(
                &mut self.unsolicited_next_data_sn,
                &mut self.unsolicited_next_offset,
                data_sn,
                offset,
                end,
                in_order,
            )?;
            if last_in_sequence {
                DataOutProgress::UnsolicitedComplete
            } else {
                DataOutProgress::Continue
            }
        } else {
            let index = self
                .outstanding
                .iter()
                .position(|r| r.transfer_tag == transfer_tag)
                .ok_or(TransferError::UnknownTransferTag(transfer_tag))?;
            let r2t = &mut self.outstanding[index];
            if offset < r2t.offset || end > r2t.offset + r2t.length {
                return Err(TransferError::OutsideR2t {
                    offset,
                    length,
                    r2t_offset: r2t.offset,
                    r2t_length: r2t.length,
                });
            }
            check_order(
                &mut r2t.next_data_sn,
                &mut r2t.next_offset,
                data_sn,
                offset,
                end,
                in_order,
            )?;
            self.received.insert(offset, end);
            return Ok(self.progress_of_r2t(index));
        };
        self.received.insert(offset, end);
        Ok(progress)
    }

    /// Takes back a Data-Out [`DataOutTracker::data_out`] accepted whose
    /// data then failed its digest (RFC 7143 7.8, ErrorRecoveryLevel 1):
    /// its bytes count as missing, to be asked for again
    /// ([`DataOutTracker::take_lost`]), and the sequence it was part of
    /// may end without them. Returns `R2tComplete` if that ends its R2T.
    pub fn discard(&mut self, transfer_tag: u32, offset: u32, length: u32) -> DataOutProgress {
        let end = offset.saturating_add(length).min(self.expected_length);
        if offset >= end {
            return DataOutProgress::Continue;
        }
        self.received.remove(offset, end);
        self.lost.push((offset, end - offset));
        if transfer_tag == UNSOLICITED_TRANSFER_TAG {
            self.unsolicited_excused += end - offset;
        }
        let Some(index) = self
            .outstanding
            .iter()
            .position(|r| r.transfer_tag == transfer_tag)
        else {
            return DataOutProgress::Continue;
        };
        self.outstanding[index].excused += end - offset;
        self.progress_of_r2t(index)
    }

    /// Whether the outstanding R2T at `index` has all its data (received,
    /// or discarded and to be asked for again): then it is done with.
    fn progress_of_r2t(&mut self, index: usize) -> DataOutProgress {
        let r2t = &self.outstanding[index];
        let (start, stop) = (r2t.offset, r2t.offset + r2t.length);
        if self.received.covered(start, stop) + r2t.excused < stop - start {
            return DataOutProgress::Continue;
        }
        let tag = r2t.transfer_tag;
        self.outstanding.remove(index);
        DataOutProgress::R2tComplete(tag)
    }

    /// The ranges discarded since the last call, to solicit again with
    /// recovery R2Ts: (offset, length).
    pub fn take_lost(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.lost)
    }

    /// The bytes the initiator still owes: for each R2T awaiting data its
    /// Target Transfer Tag and the bytes of it not yet arrived, and the
    /// unsolicited bytes not yet arrived. Bytes, not F bits: with
    /// DataPDUInOrder=No the PDU with the F bit need not come last (RFC
    /// 7143 13.18), so a sequence is over when all of it is in.
    pub fn still_due(&self) -> (Vec<(u32, u32)>, u32) {
        let r2ts = self
            .outstanding
            .iter()
            .map(|r| {
                let arrived = self.received.covered(r.offset, r.offset + r.length) + r.excused;
                (r.transfer_tag, r.length.saturating_sub(arrived))
            })
            .collect();
        let arrived = self.received.covered(0, self.unsolicited_window) + self.unsolicited_excused;
        (r2ts, self.unsolicited_window.saturating_sub(arrived))
    }

    /// Whether every byte of the WRITE has arrived.
    pub fn is_complete(&self) -> bool {
        self.received.covered(0, self.expected_length) == self.expected_length
    }

    /// The write moves to a new connection (TASK REASSIGN, ErrorRecoveryLevel
    /// 2, RFC 7143 7.2.2 and 11.5.1): the R2Ts sent on the old one
    /// are void, and so is whatever unsolicited data did not arrive (the
    /// initiator sends none after a reassignment). Returns every range not
    /// received, to be asked for with R2Ts on the new connection, in order.
    pub fn reassigned(&mut self) -> Vec<(u32, u32)> {
        self.outstanding.clear();
        self.lost.clear();
        // Only the prefix that arrived whole stays unsolicited: further
        // unsolicited Data-Out would be a protocol error now.
        let prefix = self
            .received
            .ranges
            .first()
            .filter(|&&(start, _)| start == 0)
            .map_or(0, |&(_, end)| end);
        self.unsolicited_window = self.unsolicited_window.min(prefix);
        let mut gaps = Vec::new();
        let mut at = 0;
        for &(s, e) in &self.received.ranges {
            if s > at {
                gaps.push((at, s - at));
            }
            at = at.max(e);
        }
        if at < self.expected_length {
            gaps.push((at, self.expected_length - at));
        }
        gaps
    }
}

/// With DataPDUInOrder=Yes (13.18) the PDUs of a sequence arrive in order:
/// each DataSN is the next one (11.7.5) and each offset follows on from the
/// last. With No, they may come in any order; the overlap and range checks
/// still apply.
fn check_order(
    next_data_sn: &mut u32,
    next_offset: &mut u32,
    data_sn: u32,
    offset: u32,
    end: u32,
    in_order: bool,
) -> Result<(), TransferError> {
    if !in_order {
        return Ok(());
    }
    if data_sn != *next_data_sn {
        return Err(TransferError::DataSnOutOfOrder {
            got: data_sn,
            expected: *next_data_sn,
        });
    }
    if offset != *next_offset {
        return Err(TransferError::OffsetOutOfOrder {
            offset,
            expected: *next_offset,
        });
    }
    *next_data_sn = next_data_sn.wrapping_add(1);
    *next_offset = (*next_offset).max(end);
    Ok(())
}

/// The initiator's check of the R2Ts a target sends for one WRITE.
#[derive(Clone, Debug)]
pub struct R2tTracker {
    limits: Limits,
    expected_length: u32,
    next_r2t_sn: u32,
    lowest_next_offset: u32,
    outstanding: Vec<(u32, u32, u32)>,
    recoveries: u32,
    /// Where the data sent unsolicited (immediate and unsolicited
    /// Data-Out) ends.
    unsolicited_end: u32,
    /// Bytes asked for by R2Ts other than recovery R2Ts.
    requested: u64,
    /// The WRITE was reassigned to a new connection (ErrorRecoveryLevel 2):
    /// the target asks again, in R2Ts numbered on from its own count, for
    /// whatever it lacks, so the next R2TSN and the sequence order start
    /// afresh.
    reassigned: bool,
}

impl R2tTracker {
    /// A tracker for a WRITE of `expected_length` bytes.
    pub fn new(limits: Limits, expected_length: u32) -> Self {
        R2tTracker {
            limits,
            expected_length,
            next_r2t_sn: 0,
            lowest_next_offset: 0,
            outstanding: Vec::new(),
            recoveries: 0,
            unsolicited_end: 0,
            requested: 0,
            reassigned: false,
        }
    }

    /// The same, for a WRITE that sent its first `unsolicited` bytes
    /// unsolicited: an R2T for them asks for them again.
    pub fn after_unsolicited(mut self, unsolicited: u32) -> Self {
        self.unsolicited_end = unsolicited.min(self.expected_length);
        self
    }

    /// Checks an R2T and returns the Data-Out PDUs that answer it.
    pub fn r2t(
        &mut self,
        r2t_sn: u32,
        transfer_tag: u32,
        offset: u32,
        length: u32,
    ) -> Result<Vec<Segment>, TransferError> {
        if self.reassigned {
            // The first R2T on the new connection sets the numbering.
            self.next_r2t_sn = r2t_sn;
        }
        if r2t_sn != self.next_r2t_sn {
            return Err(TransferError::R2tSnOutOfOrder {
                got: r2t_sn,
                expected: self.next_r2t_sn,
            });
        }
        let invalid = TransferError::InvalidR2t {
            offset,
            length,
            expected: self.expected_length,
            max_burst: self.limits.max_burst_length,
        };
        let end = offset
            .checked_add(length)
            .filter(|&end| end <= self.expected_length)
            .ok_or(invalid.clone())?;
        if length == 0 || length > self.limits.max_burst_length {
            return Err(invalid);
        }
        if self.outstanding.len() >= usize::from(self.limits.max_outstanding_r2t) {
            return Err(TransferError::TooManyR2ts(self.limits.max_outstanding_r2t));
        }
        // A recovery R2T asks again for data already asked for (RFC 7143
        // 7.8, 13.19): only at ErrorRecoveryLevel 1 and above.
        let recovery = self.limits.error_recovery_level > 0
            && end <= self.lowest_next_offset.max(self.unsolicited_end);
        if self.limits.data_sequence_in_order
            && offset < self.lowest_next_offset
            && !recovery
            && !self.reassigned
        {
            return Err(TransferError::SequenceOutOfOrder {
                offset,
                expected: self.lowest_next_offset,
            });
        }
        self.next_r2t_sn = self.next_r2t_sn.wrapping_add(1);
        if self.reassigned {
            // Whatever the target asks for now is what it lacks: the
            // order and the totals start afresh.
            self.reassigned = false;
            self.lowest_next_offset = end;
            self.requested = u64::from(self.expected_length);
            self.outstanding.push((transfer_tag, offset, length));
            return Ok(data_segments(offset, length, self.limits.max_send_segment));
        }
        self.recoveries += u32::from(recovery);
        if !recovery {
            self.requested += u64::from(length);
        }
        self.lowest_next_offset = self.lowest_next_offset.max(end);
        self.outstanding.push((transfer_tag, offset, length));
        Ok(data_segments(offset, length, self.limits.max_send_segment))
    }

    /// The R2TSN the next R2T must carry.
    pub fn next_r2t_sn(&self) -> u32 {
        self.next_r2t_sn
    }

    /// Whether the WRITE waits for an R2T: every R2T received is answered
    /// and data is still to be asked for. A target sends the next R2T as
    /// soon as it wants more, so one that does not come for long may have
    /// been lost (at ErrorRecoveryLevel 1, asked for with an R2T SNACK).
    pub fn awaits_r2t(&self) -> bool {
        self.outstanding.is_empty()
            && u64::from(self.unsolicited_end) + self.requested < u64::from(self.expected_length)
    }

    /// How many recovery R2Ts (asking again for data already asked for)
    /// were accepted.
    pub fn recoveries(&self) -> u32 {
        self.recoveries
    }

    /// The WRITE moved to a new connection (TASK REASSIGN, RFC 7143 11.5.1):
    /// the R2Ts of the old one are void, and the next R2T, whatever its
    /// R2TSN and offset, starts the new connection's.
    pub fn reassigned(&mut self) {
        self.outstanding.clear();
        self.reassigned = true;
        // The target sends what it lacks without being asked: no R2T is
        // overdue (and none may come, if it has all the data).
        self.requested = u64::from(self.expected_length);
    }

    /// Marks the R2T with `transfer_tag` answered (its last Data-Out sent).
    pub fn answered(&mut self, transfer_tag: u32) {
        self.outstanding.retain(|&(tag, _, _)| tag != transfer_tag);
    }
}
