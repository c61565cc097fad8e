//! The write path of a connection: R2Ts (RFC 7143 11.8) while fewer than
//! the outstanding limit await data, each Data-Out placed by the core's
//! `Collections` and received in place, and what a digest error costs:
//! at ErrorRecoveryLevel 0 the write fails once the data still due is in
//! (`answer_when_drained`, 7.8); at 1 the lost bytes are asked for again with a recovery
//! R2T, and an R2T SNACK gets the R2Ts again (11.16).

use std::sync::Arc;

use iscsi_datamover::{DatamoverError, PduReceiver};
use iscsi_proto::error::DecodeError;
use iscsi_proto::pdu::{DataOut, Header, Pdu, RejectReason, ScsiCommand, SnackRequest};
use iscsi_proto::transfer::DataOutProgress;
use iscsi_scsi::CommandOutcome;
use iscsi_target_core::retention::Refusal;
use iscsi_target_core::{Advance, Collecting, Due, Placement, Stray};
use tracing::{debug, warn};

use super::{Connection, Receiver, Stat};
use crate::metrics::stats::SessionStats;
use crate::pending::{FailedWrite, PendingWrite, WriteParts};
use crate::session::Task;
use crate::writer::Resend;

/// SPC-4's PROTOCOL SERVICE CRC ERROR (ABORTED COMMAND, 47h/05h): the
/// status of a task whose data failed its digest at ErrorRecoveryLevel 0
/// (RFC 7143 7.8, 11.4.7.2).
pub(super) const PROTOCOL_SERVICE_CRC_ERROR: iscsi_scsi::Sense = iscsi_scsi::Sense::new(
    iscsi_scsi::SenseKey::AbortedCommand,
    iscsi_scsi::Asc::new(0x47, 0x05),
);

impl Connection {
    /// A Data-Out PDU (RFC 7143 11.7): placed by the core
    /// (`iscsi_target_core::collect`) against its write's R2Ts and
    /// unsolicited window, then received straight into place.
    pub(super) async fn data_out(
        &mut self,
        receiver: &mut Receiver,
        header: &Header,
        data_out: DataOut,
    ) -> Result<(), DatamoverError> {
        let itt = data_out.initiator_task_tag;
        let length = header.data_segment_length;
        let (range, progress) = match self
            .writes
            .placement(&data_out, length, WriteParts::aborted)
        {
            Placement::Place { range, progress } => (range, progress),
            Placement::Stray => return self.stray_data_out(receiver, header, &data_out).await,
            Placement::Aborted(write) => {
                self.data_or_reject(receiver, header).await?;
                self.end_aborted_write(write);
                return Ok(());
            }
            Placement::Refused(reason) => {
                // At ErrorRecoveryLevel 0 the write cannot be completed:
                // reject the PDU and end the command with CHECK CONDITION.
                debug!(?reason, "bad Data-Out");
                if self.data_or_reject(receiver, header).await?.is_some() {
                    self.reject(header, reason).await?;
                }
                // 0Ch/0Dh, NOT ENOUGH UNSOLICITED DATA: of RFC 7143
                // 11.4.7.2's iSCSI conditions, the one for data that does
                // not add up to the transfer.
                let sense = iscsi_scsi::Sense::new(
                    iscsi_scsi::SenseKey::AbortedCommand,
                    iscsi_scsi::Asc::new(0x0C, 0x0D),
                );
                self.fail_write(itt, sense, Some((&data_out, length)));
                return Ok(());
            }
        };
        let Some(pending) = self.writes.get_mut(itt) else {
            return Ok(());
        };
        match receiver
            .receive_data_in_buffer(&mut pending.write.buffer, range)
            .await
        {
            Ok(()) => {
                SessionStats::add(&self.session.stats.write_bytes, u64::from(length));
                self.solicit_and_keep(itt, progress).await
            }
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. }))
                if self.limits.error_recovery_level > 0 =>
            {
                // ErrorRecoveryLevel 1 (RFC 7143 7.8): reject the PDU and
                // ask for its data again with a recovery R2T once its
                // sequence has ended (13.19: in sequence order, one R2T is
                // outstanding at a time).
                warn!("data digest error in Data-Out: PDU rejected, data asked for again");
                self.reject(header, RejectReason::DataDigestError).await?;
                let asked = self.writes.lost(&data_out, length);
                SessionStats::add(&self.session.stats.recovery_r2ts, asked as u64);
                self.solicit_and_keep(itt, DataOutProgress::Continue).await
            }
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. })) => {
                warn!("data digest error in Data-Out: PDU rejected, write failed");
                self.reject(header, RejectReason::DataDigestError).await?;
                self.fail_write(itt, PROTOCOL_SERVICE_CRC_ERROR, None);
                Ok(())
            }
            Err(e) => {
                // The connection failed under the PDU: its bytes did not
                // arrive (at ERL 2 the write goes on elsewhere and they are
                // asked for again).
                self.writes.lost(&data_out, length);
                Err(e)
            }
        }
    }

    /// A Data-Out for no write collecting data: the rest of a failed
    /// write's data (its status goes out after the last of it), late data
    /// of an aborted write (dropped quietly), or a Reject.
    async fn stray_data_out(
        &mut self,
        receiver: &mut Receiver,
        header: &Header,
        data_out: &DataOut,
    ) -> Result<(), DatamoverError> {
        let rejected = self.data_or_reject(receiver, header).await?.is_none();
        match self.writes.stray(data_out, header.data_segment_length) {
            Stray::Drained(failed) => {
                self.answer_now(failed.task, failed.command, failed.outcome);
                Ok(())
            }
            Stray::Dropped => {
                debug!(
                    itt = data_out.initiator_task_tag,
                    "Data-Out for a failed or aborted write: dropped"
                );
                Ok(())
            }
            Stray::Unknown if self.session.aborted_unseen(data_out.initiator_task_tag) => {
                debug!(
                    itt = data_out.initiator_task_tag,
                    "Data-Out for a command aborted before it came: dropped"
                );
                Ok(())
            }
            // Answered already, for its digest.
            Stray::Unknown if rejected => Ok(()),
            Stray::Unknown => self.reject(header, RejectReason::InvalidPduField).await,
        }
    }

    /// Sends the R2Ts write `itt` may have outstanding (RFC 7143 11.8,
    /// 13.17), then starts the write if every byte is in. The write stays
    /// kept even when sending fails (the connection is failing: at ERL 2
    /// its writes wait for TASK REASSIGN, below they end with it), so no
    /// task is left that nothing will ever answer.
    pub(super) async fn solicit_and_keep(
        &mut self,
        itt: u32,
        progress: DataOutProgress,
    ) -> Result<(), DatamoverError> {
        let limit = self.limits.r2t_limit();
        let Advance { r2ts, complete } =
            self.writes
                .advance(itt, progress, limit, &mut self.transfer_tags);
        SessionStats::add(&self.session.stats.r2ts, r2ts.len() as u64);
        let mut sent = Ok(());
        for r2t in r2ts {
            sent = self
                .writer
                .send(Pdu::ReadyToTransfer(r2t), &[], Stat::Current)
                .await;
            if sent.is_err() {
                break;
            }
        }
        if let Some(pending) = complete {
            self.start_write(pending).await;
        }
        sent
    }

    /// Runs a write whose every byte is in.
    pub(super) async fn start_write(&mut self, pending: PendingWrite) {
        let Collecting { write, solicit, .. } = pending;
        let WriteParts {
            task,
            command,
            cdb,
            buffer,
        } = write;
        self.execute(task, command, cdb, buffer, solicit.sent())
            .await;
    }

    /// Ends a write that cannot complete with CHECK CONDITION, once the
    /// Data-Out still due is in; its further Data-Out is dropped.
    pub(super) fn fail_write(
        &mut self,
        itt: u32,
        sense: iscsi_scsi::Sense,
        refused: Option<(&DataOut, u32)>,
    ) {
        if let Some((write, due)) = self.writes.fail(itt, refused) {
            let WriteParts {
                task,
                command,
                buffer,
                ..
            } = write;
            self.give_write_buffer(buffer);
            self.answer_when_drained(task, command, CommandOutcome::check_condition(sense), due);
        }
    }

    /// Answers a write that failed before all its data arrived once the
    /// Data-Out in `due` is in: RFC 7143 7.8: the target "MUST wait to
    /// receive all the data ... before sending the SCSI Response PDU", so
    /// the initiator never sees the status of a task it is still sending
    /// data for. An ABORT TASK meanwhile ends the task at once; the status
    /// then never goes out.
    pub(super) fn answer_when_drained(
        &mut self,
        task: Arc<Task>,
        command: ScsiCommand,
        outcome: CommandOutcome,
        due: Due,
    ) {
        let itt = command.initiator_task_tag;
        let failed = FailedWrite {
            task,
            command,
            outcome,
        };
        if let Some(failed) = self.writes.answer_when_drained(itt, failed, due) {
            self.answer_now(failed.task, failed.command, failed.outcome);
        }
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
        Some(
            self.writes
                .r2t_replicas(snack)?
                .map(|r2ts| r2ts.into_iter().map(Resend::R2t).collect())
                .map_err(|why| (RejectReason::ProtocolError, why)),
        )
    }
}
