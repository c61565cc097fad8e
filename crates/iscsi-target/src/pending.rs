//! A write collecting its data (R2Ts sent, Data-Out received in place):
//! the connection's write path (`connection/write.rs`) drives it, and at
//! ERL 2 a failed connection leaves it to the session's orphans for a TASK
//! REASSIGN (`recovery.rs`).

use std::collections::VecDeque;
use std::sync::Arc;

use iscsi_datamover::WriteBuffer;
use iscsi_proto::pdu::{ReadyToTransfer, ScsiCommand};
use iscsi_proto::transfer::DataOutTracker;

use crate::task::Task;

/// A write collecting its data.
pub(crate) struct PendingWrite {
    pub(crate) task: Arc<Task>,
    pub(crate) command: ScsiCommand,
    pub(crate) cdb: Vec<u8>,
    pub(crate) buffer: WriteBuffer,
    pub(crate) tracker: DataOutTracker,
    /// Solicited bursts not yet asked for: (offset, length).
    pub(crate) bursts: VecDeque<(u32, u32)>,
    pub(crate) r2ts_sent: u32,
    /// The R2Ts sent whose data has not all arrived, as sent: what an R2T
    /// SNACK gets again (RFC 7143 11.16: "exact replicas").
    pub(crate) r2ts: Vec<ReadyToTransfer>,
}
