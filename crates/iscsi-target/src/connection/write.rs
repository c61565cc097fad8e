//! The write path of a connection: R2Ts (RFC 7143 11.8) while fewer than
//! the outstanding limit await data, each Data-Out checked by the write's
//! `DataOutTracker` and received in place, and what a digest error costs:
//! at ErrorRecoveryLevel 0 the write fails once the data still due is in
//! (`Drain`, 7.8); at 1 the lost bytes are asked for again with a recovery
//! R2T, and an R2T SNACK gets the R2Ts again (11.16).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use iscsi_datamover::{DatamoverError, PduReceiver};
use iscsi_proto::error::DecodeError;
use iscsi_proto::pdu::{DataOut, Header, Pdu, RejectReason, ScsiCommand, SnackRequest, SnackType};
use iscsi_proto::transfer::{DataOutProgress, UNSOLICITED_TRANSFER_TAG};
use iscsi_scsi::CommandOutcome;
use tracing::{debug, warn};

use super::{Connection, Receiver, Stat};
use crate::metrics::stats::SessionStats;
pub(crate) use crate::pending::PendingWrite;
use crate::session::Task;
use crate::writer::Resend;
use iscsi_target_core::retention::Refusal;

/// SPC-4's PROTOCOL SERVICE CRC ERROR (ABORTED COMMAND, 47h/05h): the
/// status of a task whose data failed its digest at ErrorRecoveryLevel 0
/// (RFC 7143 7.8, 11.4.7.2).
pub(super) const PROTOCOL_SERVICE_CRC_ERROR: iscsi_scsi::Sense = iscsi_scsi::Sense::new(
    iscsi_scsi::SenseKey::AbortedCommand,
    iscsi_scsi::Asc::new(0x47, 0x05),
);

/// A failed write waiting for the Data-Out the initiator still owes.
pub(super) struct Drain {
    pub(super) task: Arc<Task>,
    command: ScsiCommand,
    outcome: CommandOutcome,
    /// R2Ts whose Data-Out sequence has not ended.
    transfer_tags: Vec<u32>,
    /// Whether the unsolicited burst has not ended.
    unsolicited: bool,
}

impl Drain {
    /// Notes the end (F bit) of the sequence with `transfer_tag`: true
    /// when nothing more is due.
    pub(super) fn sequence_ended(&mut self, transfer_tag: u32) -> bool {
        if transfer_tag == UNSOLICITED_TRANSFER_TAG {
            self.unsolicited = false;
        } else {
            self.transfer_tags.retain(|&tag| tag != transfer_tag);
        }
        !self.unsolicited && self.transfer_tags.is_empty()
    }
}

impl Connection {
    /// Sends R2Ts while fewer than MaxOutstandingR2T await their data
    /// (RFC 7143 11.8, 13.17).
    pub(super) async fn solicit(
        &mut self,
        pending: &mut PendingWrite,
    ) -> Result<(), DatamoverError> {
        let PendingWrite {
            tracker, solicit, ..
        } = pending;
        let r2ts = solicit.next_r2ts(tracker, self.limits.r2t_limit(), &mut self.transfer_tags);
        SessionStats::add(&self.session.stats.r2ts, r2ts.len() as u64);
        for r2t in r2ts {
            self.writer
                .send(Pdu::ReadyToTransfer(r2t), &[], Stat::Current)
                .await?;
        }
        Ok(())
    }

    /// A Data-Out PDU (RFC 7143 11.7): checked against its write's R2Ts
    /// and unsolicited window, then received straight into place.
    pub(super) async fn data_out(
        &mut self,
        receiver: &mut Receiver,
        header: &Header,
        data_out: DataOut,
    ) -> Result<(), DatamoverError> {
        let itt = data_out.initiator_task_tag;
        let length = header.data_segment_length;
        let Some(pending) = self.pending_writes.get_mut(&itt) else {
            let rejected = self.data_or_reject(receiver, header).await?.is_none();
            if let Some(drain) = self.draining.get_mut(&itt) {
                if data_out.final_flag
                    && drain.sequence_ended(data_out.target_transfer_tag)
                    && let Some(drain) = self.draining.remove(&itt)
                {
                    self.answer_now(drain.task, drain.command, drain.outcome);
                }
                return Ok(());
            }
            if self.aborted_writes.contains(&itt) {
                debug!(itt, "Data-Out for an aborted write: dropped");
                return Ok(());
            }
            if rejected {
                // Answered already, for its digest.
                return Ok(());
            }
            // Data-Out for no write in progress.
            return self.reject(header, RejectReason::InvalidPduField).await;
        };
        if pending.task.aborted.load(Ordering::Acquire) {
            self.data_or_reject(receiver, header).await?;
            self.drop_aborted_write(itt);
            return Ok(());
        }
        let progress = pending.tracker.data_out(
            data_out.target_transfer_tag,
            data_out.data_sn.get(),
            data_out.buffer_offset,
            length,
            data_out.final_flag,
        );
        let progress = match progress {
            Ok(progress) => progress,
            Err(e) => {
                // At ErrorRecoveryLevel 0 the write cannot be completed:
                // reject the PDU and end the command with CHECK CONDITION.
                debug!(error = %e, "bad Data-Out");
                if self.data_or_reject(receiver, header).await?.is_some() {
                    self.reject(header, e.reject_reason()).await?;
                }
                self.fail_write(
                    itt,
                    iscsi_scsi::Sense::new(
                        iscsi_scsi::SenseKey::AbortedCommand,
                        // 0Ch/0Dh, NOT ENOUGH UNSOLICITED DATA: of RFC 7143
                        // 11.4.7.2's iSCSI conditions, the one for data that
                        // does not add up to the transfer.
                        iscsi_scsi::Asc::new(0x0C, 0x0D),
                    ),
                );
                return Ok(());
            }
        };
        let start = data_out.buffer_offset as usize;
        let end = start + length as usize;
        match receiver
            .receive_data_in_buffer(&mut pending.buffer, start..end)
            .await
        {
            Ok(()) => {}
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. }))
                if self.limits.error_recovery_level > 0 =>
            {
                // ErrorRecoveryLevel 1 (RFC 7143 7.8): reject the PDU and
                // ask for its data again with a recovery R2T once its
                // sequence has ended (13.19: in sequence order, one R2T is
                // outstanding at a time).
                warn!("data digest error in Data-Out: PDU rejected, data asked for again");
                self.reject(header, RejectReason::DataDigestError).await?;
                let Some(mut pending) = self.pending_writes.remove(&itt) else {
                    return Ok(());
                };
                pending.tracker.discard(
                    data_out.target_transfer_tag,
                    data_out.buffer_offset,
                    length,
                );
                self.requeue_lost(&mut pending);
                return self.solicit_and_keep(itt, pending).await;
            }
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. })) => {
                warn!("data digest error in Data-Out: PDU rejected, write failed");
                self.reject(header, RejectReason::DataDigestError).await?;
                self.fail_write(itt, PROTOCOL_SERVICE_CRC_ERROR);
                return Ok(());
            }
            Err(e) => {
                // The connection failed under the PDU: its bytes did not
                // arrive (at ERL 2 the write goes on elsewhere and they are
                // asked for again).
                pending.tracker.discard(
                    data_out.target_transfer_tag,
                    data_out.buffer_offset,
                    length,
                );
                return Err(e);
            }
        }
        SessionStats::add(&self.session.stats.write_bytes, u64::from(length));
        let mut pending = match self.pending_writes.remove(&itt) {
            Some(p) => p,
            None => return Ok(()),
        };
        if let DataOutProgress::R2tComplete(tag) = progress {
            pending.solicit.answered(tag);
        }
        self.solicit_and_keep(itt, pending).await
    }

    /// Sends the R2Ts `pending` may have outstanding, then starts the write
    /// if every byte is in, or keeps it until the rest comes. It is kept
    /// even when sending fails (the connection is failing: at ERL 2 its
    /// writes wait for TASK REASSIGN, below they end with it), so no task
    /// is left that nothing will ever answer.
    pub(super) async fn solicit_and_keep(
        &mut self,
        itt: u32,
        mut pending: PendingWrite,
    ) -> Result<(), DatamoverError> {
        let sent = self.solicit(&mut pending).await;
        if self.session.scsi.is_some() && pending.tracker.is_complete() {
            self.start_write(pending).await;
        } else {
            self.pending_writes.insert(itt, pending);
        }
        sent
    }

    /// Puts the ranges a write's tracker discarded first in line for R2Ts:
    /// recovery R2Ts (RFC 7143 7.8), sent as outstanding R2Ts allow.
    pub(super) fn requeue_lost(&self, pending: &mut PendingWrite) {
        let lost = pending.tracker.take_lost();
        let asked = pending.solicit.ask_again_first(lost);
        SessionStats::add(&self.session.stats.recovery_r2ts, asked as u64);
    }

    /// Ends a write that cannot complete with CHECK CONDITION; its further
    /// Data-Out is dropped.
    pub(super) fn fail_write(&mut self, itt: u32, sense: iscsi_scsi::Sense) {
        if let Some(pending) = self.pending_writes.remove(&itt) {
            self.give_write_buffer(pending.buffer);
            let transfer_tags = pending.tracker.outstanding_transfer_tags();
            let unsolicited = pending.tracker.awaiting_unsolicited();
            self.answer_when_drained(
                pending.task,
                pending.command,
                CommandOutcome::check_condition(sense),
                transfer_tags,
                unsolicited,
            );
        }
    }

    /// Whether a WRITE of `expected` bytes with `immediate` bytes in its
    /// command PDU is followed by unsolicited Data-Out (InitialR2T=No: up
    /// to FirstBurstLength in all, RFC 7143 13.10-13.11).
    pub(super) fn unsolicited_follows(&self, expected: u32, immediate: u32) -> bool {
        !self.limits.initial_r2t && immediate < self.limits.first_burst_length.min(expected)
    }

    /// Answers a write that failed before all its data arrived once the
    /// Data-Out still due is in: the unsolicited burst if `unsolicited`,
    /// and the sequences answering `transfer_tags`' R2Ts. RFC 7143 7.8: the
    /// target "MUST wait to receive all the data ... before sending the
    /// SCSI Response PDU", so the initiator never sees the status of a task
    /// it is still sending data for. An ABORT TASK meanwhile ends the task
    /// at once; the status then never goes out.
    pub(super) fn answer_when_drained(
        &mut self,
        task: Arc<Task>,
        command: ScsiCommand,
        outcome: CommandOutcome,
        transfer_tags: Vec<u32>,
        unsolicited: bool,
    ) {
        if transfer_tags.is_empty() && !unsolicited {
            self.answer_now(task, command, outcome);
            return;
        }
        let itt = command.initiator_task_tag;
        let drain = Drain {
            task,
            command,
            outcome,
            transfer_tags,
            unsolicited,
        };
        self.draining.insert(itt, drain);
    }

    pub(super) async fn start_write(&mut self, pending: PendingWrite) {
        let PendingWrite {
            task,
            command,
            cdb,
            buffer,
            solicit,
            ..
        } = pending;
        self.execute(task, command, cdb, buffer, solicit.sent())
            .await;
    }

    /// The answer to an R2T SNACK for a write still collecting its data
    /// (`None` for any other SNACK): the R2Ts it asks for that still await
    /// data, as they were sent (RFC 7143 11.16; the writer fills in the
    /// current StatSN, ExpCmdSN and MaxCmdSN), or a protocol error for a
    /// run starting past the R2Ts sent.
    pub(super) fn r2t_replicas(
        &self,
        snack: &SnackRequest,
    ) -> Option<Result<Vec<Resend>, Refusal>> {
        if snack.snack_type != SnackType::DataR2t {
            return None;
        }
        let pending = self.pending_writes.get(&snack.initiator_task_tag)?;
        Some(
            pending
                .solicit
                .replicas(snack.beg_run, snack.run_length)
                .map(|r2ts| r2ts.into_iter().map(Resend::R2t).collect())
                .map_err(|why| (RejectReason::ProtocolError, why)),
        )
    }
}
