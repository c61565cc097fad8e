//! ExpStatSN and what is lost on the way (RFC 7143 7.9): a gap in the
//! statuses asks for them again with a Status SNACK at ErrorRecoveryLevel
//! 1 and closes the connection at 0; lost Data-In and R2Ts are asked for
//! with Data/R2T SNACKs (7.3, 11.16); a Data-In with the A bit is
//! acknowledged (DataACK); recovery R2Ts answered are counted. Apart from
//! the reading because the tasks of a write ask for R2T SNACKs too.

use std::sync::atomic::Ordering;

use iscsi_proto::pdu::{DataIn, Header, Lun, Pdu, RESERVED_TAG, SnackRequest, SnackType};
use iscsi_proto::serial::StatSn;

use super::{Connection, TaskEntry};
use iscsi_proto::stat_sn::Arrived;

impl Connection {
    /// Takes note of a status's StatSN. One past ExpStatSN means statuses
    /// between were lost (a header digest error, RFC 7143 7.9): at ERL 1 a
    /// Status SNACK asks for them again; at ERL 0 their commands would
    /// wait forever, so the connection is closed and they are retried on a
    /// reinstated session.
    pub(super) fn advance_stat_sn(&self, stat_sn: StatSn) {
        self.note_stat_sn(stat_sn, false);
    }

    /// Takes note of the StatSN of task `itt`'s status: a read still
    /// missing Data-In holds it unacknowledged (`StatSns`) until the data
    /// is in, or the target would drop the data a SNACK asks for.
    pub(super) fn status_arrived(&self, itt: u32, stat_sn: StatSn) {
        let hold = {
            let mut state = self.lock();
            match state.tasks.get_mut(&itt) {
                Some(TaskEntry {
                    read: Some(read), ..
                }) if !read.missing.is_empty() => {
                    read.held_stat_sn = Some(stat_sn);
                    true
                }
                _ => false,
            }
        };
        self.note_stat_sn(stat_sn, hold);
    }

    fn note_stat_sn(&self, stat_sn: StatSn, hold: bool) {
        let arrived = {
            let mut state = self.lock();
            if !state.alive {
                // Closed: its tasks went back to the session without these
                // statuses, so they must not be acknowledged (at ERL 2 the
                // target keeps an unacknowledged status for TASK REASSIGN).
                return;
            }
            state.stat_sns.arrived(stat_sn, hold)
        };
        match arrived {
            Arrived::Fine => {}
            Arrived::Gap { first, count } if self.recovers_data => {
                tracing::warn!(first = first.get(), count, "statuses missing: Status SNACK");
                self.snack(SnackType::Status, RESERVED_TAG, first.get(), count);
            }
            Arrived::Gap { first, count } => {
                tracing::warn!(
                    first = first.get(),
                    count,
                    "statuses missing at ERL 0: closing the connection"
                );
                self.close();
            }
            Arrived::Overflow => {
                tracing::warn!("thousands of statuses past a hole: closing the connection");
                self.close();
            }
        }
    }

    /// Answers a Data-In with the A bit (RFC 7143 11.7.2): unless data
    /// before it is missing, a DataACK SNACK whose BegRun is the next DataSN
    /// expected, with the Data-In's LUN and Target Transfer Tag (11.16).
    pub(super) fn acknowledge_data(&self, itt: u32, data_in: &DataIn) {
        let holes = self.lock().tasks.get(&itt).is_some_and(|task| {
            task.read
                .as_ref()
                .is_some_and(|read| !read.missing.is_empty())
        });
        if holes {
            return;
        }
        let ack = SnackRequest {
            snack_type: SnackType::DataAck,
            lun: data_in.lun,
            initiator_task_tag: RESERVED_TAG,
            target_transfer_tag: data_in.target_transfer_tag,
            exp_stat_sn: self.exp_stat_sn(),
            beg_run: data_in.data_sn.get().wrapping_add(1),
            run_length: 0,
        };
        if let Err(error) = self.post(&Header::new(Pdu::SnackRequest(ack), 0), &[]) {
            tracing::debug!(%error, "sending a DataACK failed");
        }
    }

    /// Whether lost data and R2Ts are asked for again (ErrorRecoveryLevel
    /// 1 or more) rather than ending the connection.
    pub(crate) fn recovers_data(&self) -> bool {
        self.recovers_data
    }

    /// Asks again for task `itt`'s R2Ts from R2TSN `beg_run` (all that
    /// follow when `run_length` is 0): an R2T SNACK (RFC 7143 11.16).
    pub(crate) fn r2t_snack(&self, itt: u32, beg_run: u32, run_length: u32) {
        self.snack(SnackType::DataR2t, itt, beg_run, run_length);
    }

    /// Counts a recovery R2T answered (RFC 7143 7.8).
    pub(crate) fn recovery_r2t_answered(&self) {
        self.snacks.recovery_r2ts.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends a SNACK (RFC 7143 11.16) asking for `run_length` Data-In
    /// (type Data/R2T, of task `itt`) or statuses (type Status) from
    /// `beg_run` on.
    pub(super) fn snack(&self, snack_type: SnackType, itt: u32, beg_run: u32, run_length: u32) {
        let snack = SnackRequest {
            snack_type,
            lun: Lun::default(),
            initiator_task_tag: itt,
            target_transfer_tag: RESERVED_TAG,
            exp_stat_sn: self.exp_stat_sn(),
            beg_run,
            run_length,
        };
        self.snacks.snacks.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = self.post(&Header::new(Pdu::SnackRequest(snack), 0), &[]) {
            tracing::debug!(%error, "sending a SNACK failed");
        }
    }
}
