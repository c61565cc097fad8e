//! The R2Ts of one WRITE (RFC 7143 sections 11.8, 13.17): the solicited
//! part cut in bursts of at most MaxBurstLength, asked for while fewer
//! than MaxOutstandingR2T await their data, each R2T kept as sent until
//! its data is in, so that an R2T SNACK gets exact replicas (11.16).
//!
//! ```text
//!  EDTL:  [ immediate | unsolicited ][ burst 0 ][ burst 1 ][ burst 2 ]...
//!                                     R2TSN 0    R2TSN 1    (waits for a
//!                                     TTT a      TTT b       free slot)
//! ```
//!
//! A range lost to a data digest error (ERL 1) is asked for again first, by
//! a recovery R2T with the next R2TSN (7.8); after a TASK REASSIGN (ERL 2)
//! only what never arrived is solicited again.
//!
//! The Data-Out side (offsets, DataSN, which R2T a PDU answers) is
//! `iscsi_proto::transfer::DataOutTracker`; this keeps what the target
//! asked for.

use std::collections::VecDeque;

use iscsi_proto::pdu::{Lun, ReadyToTransfer};
use iscsi_proto::serial::R2tSn;
use iscsi_proto::transfer::{DataOutTracker, data_segments};

use crate::planted::{self, Bug};
use crate::tags::TransferTags;

/// The R2Ts of one WRITE.
#[derive(Clone, Debug)]
pub struct Solicitation {
    lun: Lun,
    itt: u32,
    /// Bursts not yet asked for: (offset, length).
    bursts: VecDeque<(u32, u32)>,
    /// R2Ts sent so far: the next R2TSN.
    sent: u32,
    /// The R2Ts whose data has not all arrived, as sent.
    awaiting: Vec<ReadyToTransfer>,
}

impl Solicitation {
    /// The R2Ts for a WRITE to `lun` with tag `itt` whose solicited part
    /// is `bursts` (`Limits::r2t_bursts`).
    pub fn new(lun: Lun, itt: u32, bursts: Vec<(u32, u32)>) -> Self {
        Solicitation {
            lun,
            itt,
            bursts: bursts.into(),
            sent: 0,
            awaiting: Vec::new(),
        }
    }

    /// The R2Ts to send now: while fewer than `limit` await their data.
    /// Each is recorded in `tracker` (which then accepts its Data-Out) and
    /// kept for SNACKs; the caller sends them in order (the writer stamps
    /// StatSN and the window).
    pub fn next_r2ts(
        &mut self,
        tracker: &mut DataOutTracker,
        limit: usize,
        tags: &mut TransferTags,
    ) -> Vec<ReadyToTransfer> {
        let mut out = Vec::new();
        while tracker.outstanding_r2ts() < limit {
            let Some((offset, length)) = self.bursts.pop_front() else {
                break;
            };
            let tag = tags.take();
            tracker.r2t_sent(tag, offset, length);
            let r2t = ReadyToTransfer {
                lun: self.lun,
                initiator_task_tag: self.itt,
                target_transfer_tag: tag,
                r2t_sn: R2tSn::new(self.sent),
                buffer_offset: offset,
                desired_data_transfer_length: length,
                ..ReadyToTransfer::default()
            };
            self.sent += 1;
            self.awaiting.push(r2t.clone());
            out.push(r2t);
        }
        out
    }

    /// The data of the R2T with Target Transfer Tag `tag` is all in: a
    /// SNACK can no longer ask for it.
    pub fn answered(&mut self, tag: u32) {
        self.awaiting.retain(|r2t| r2t.target_transfer_tag != tag);
    }

    /// Ranges lost to a digest error (ERL 1): asked for first, in order,
    /// by recovery R2Ts. Returns how many.
    pub fn ask_again_first(&mut self, lost: Vec<(u32, u32)>) -> usize {
        if planted::active(Bug::RecoveryR2tNeverSent) {
            return 0;
        }
        let count = lost.len();
        for range in lost.into_iter().rev() {
            self.bursts.push_front(range);
        }
        count
    }

    /// After a TASK REASSIGN (ERL 2): only `missing` (what never arrived)
    /// is solicited again, in bursts of at most `max_burst`; the R2Ts of
    /// the old connection are gone with it.
    pub fn restart(&mut self, missing: Vec<(u32, u32)>, max_burst: u32) {
        self.bursts = missing
            .into_iter()
            .flat_map(|(offset, length)| {
                data_segments(offset, length, max_burst)
                    .into_iter()
                    .map(|s| (s.offset, s.length))
            })
            .collect();
        self.awaiting.clear();
    }

    /// Whether every burst has been asked for (none left to send).
    pub fn all_sent(&self) -> bool {
        self.bursts.is_empty()
    }

    /// How many R2Ts were sent (the next R2TSN).
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// The answer to an R2T SNACK for `run_length` R2Ts from `beg_run`
    /// (0: all from it): the ones still awaiting data, as sent, or why
    /// not.
    pub fn replicas(
        &self,
        beg_run: u32,
        run_length: u32,
    ) -> Result<Vec<ReadyToTransfer>, &'static str> {
        if beg_run >= self.sent {
            return Err("R2T SNACK for an R2T never sent");
        }
        let wanted = |sn: u32| sn >= beg_run && (run_length == 0 || sn - beg_run < run_length);
        Ok(self
            .awaiting
            .iter()
            .filter(|r2t| wanted(r2t.r2t_sn.get()))
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use iscsi_proto::transfer::Limits;

    use super::*;

    const KIB: u32 = 1024;

    fn limits(max_outstanding: u16) -> Limits {
        Limits {
            max_send_segment: 8 * KIB,
            max_recv_segment: 8 * KIB,
            max_burst_length: 64 * KIB,
            first_burst_length: 64 * KIB,
            immediate_data: false,
            initial_r2t: true,
            max_outstanding_r2t: max_outstanding,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }

    /// A 256 KiB WRITE with InitialR2T=Yes: four bursts to solicit.
    fn write(max_outstanding: u16) -> (Solicitation, DataOutTracker, Limits) {
        let limits = limits(max_outstanding);
        let tracker = DataOutTracker::new(limits, 256 * KIB, 0).unwrap();
        let bursts = limits.r2t_bursts(256 * KIB, tracker.solicited_from());
        (Solicitation::new(Lun(0), 9, bursts), tracker, limits)
    }

    fn offsets(r2ts: &[ReadyToTransfer]) -> Vec<(u32, u32)> {
        r2ts.iter()
            .map(|r| (r.r2t_sn.get(), r.buffer_offset / KIB))
            .collect()
    }

    #[test]
    fn r2ts_go_out_while_fewer_than_the_limit_await_data() {
        let (mut solicit, mut tracker, limits) = write(2);
        let mut tags = TransferTags::default();
        let first = solicit.next_r2ts(&mut tracker, limits.r2t_limit(), &mut tags);
        assert_eq!(offsets(&first), [(0, 0), (1, 64)]);
        assert!(first.iter().all(|r| r.initiator_task_tag == 9));
        assert!(
            solicit
                .next_r2ts(&mut tracker, limits.r2t_limit(), &mut tags)
                .is_empty()
        );
        // The first R2T's data arrives whole: one more goes out.
        let tag = first[0].target_transfer_tag;
        for sn in 0..8 {
            tracker
                .data_out(tag, sn, sn * 8 * KIB, 8 * KIB, sn == 7)
                .unwrap();
        }
        solicit.answered(tag);
        let next = solicit.next_r2ts(&mut tracker, limits.r2t_limit(), &mut tags);
        assert_eq!(offsets(&next), [(2, 128)]);
        assert_eq!(solicit.sent(), 3);
    }

    #[test]
    fn a_snack_gets_the_r2ts_still_awaiting_data_as_sent() {
        let (mut solicit, mut tracker, _) = write(4);
        let mut tags = TransferTags::default();
        let sent = solicit.next_r2ts(&mut tracker, 4, &mut tags);
        solicit.answered(sent[1].target_transfer_tag);
        let again = solicit.replicas(0, 0).unwrap();
        assert_eq!(offsets(&again), [(0, 0), (2, 128), (3, 192)]);
        assert_eq!(again[0], sent[0], "an exact replica");
        assert_eq!(offsets(&solicit.replicas(2, 1).unwrap()), [(2, 128)]);
        assert!(solicit.replicas(4, 0).is_err(), "never sent");
    }

    #[test]
    fn lost_ranges_are_asked_for_first_and_reassignment_starts_over() {
        let (mut solicit, mut tracker, limits) = write(1);
        let mut tags = TransferTags::default();
        let first = solicit.next_r2ts(&mut tracker, 1, &mut tags);
        assert_eq!(offsets(&first), [(0, 0)]);
        // All of its data came, 8 KiB of it with a bad digest.
        let tag = first[0].target_transfer_tag;
        for (sn, offset) in (0..8).map(|i| (i, i * 8 * KIB)) {
            tracker.data_out(tag, sn, offset, 8 * KIB, sn == 7).unwrap();
        }
        tracker.discard(tag, 8 * KIB, 8 * KIB);
        solicit.answered(tag);
        assert_eq!(solicit.ask_again_first(tracker.take_lost()), 1);
        let recovery = solicit.next_r2ts(&mut tracker, 1, &mut tags);
        assert_eq!(
            (recovery[0].r2t_sn.get(), recovery[0].buffer_offset),
            (1, 8 * KIB)
        );
        assert_eq!(recovery[0].desired_data_transfer_length, 8 * KIB);

        solicit.restart(vec![(0, 100 * KIB)], limits.max_burst_length);
        assert!(solicit.replicas(0, 0).unwrap().is_empty());
        let mut fresh = DataOutTracker::new(limits, 256 * KIB, 0).unwrap();
        let again = solicit.next_r2ts(&mut fresh, 4, &mut tags);
        assert_eq!(offsets(&again), [(2, 0), (3, 64)]);
        assert_eq!(again[1].desired_data_transfer_length, 36 * KIB);
    }
}
