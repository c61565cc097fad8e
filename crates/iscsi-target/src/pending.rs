//! A write collecting its data (R2Ts sent, Data-Out received in place):
//! the connection's write path (`connection/write.rs`) drives it, and at
//! ERL 2 a failed connection leaves it to the session's orphans for a TASK
//! REASSIGN (`recovery.rs`).

use std::sync::Arc;

use iscsi_datamover::WriteBuffer;
use iscsi_proto::pdu::ScsiCommand;
use iscsi_proto::transfer::DataOutTracker;
use iscsi_target_core::Solicitation;

use crate::task::Task;

/// A write collecting its data.
pub(crate) struct PendingWrite {
    pub(crate) task: Arc<Task>,
    pub(crate) command: ScsiCommand,
    pub(crate) cdb: Vec<u8>,
    pub(crate) buffer: WriteBuffer,
    pub(crate) tracker: DataOutTracker,
    /// Its R2Ts: those to send, those sent and awaiting data (what an
    /// R2T SNACK gets again, RFC 7143 11.16).
    pub(crate) solicit: Solicitation,
}
