//! What the driver keeps of a write collecting its data (the task, the
//! command, the buffer the data is received into) and of one that failed on
//! the way; `iscsi_target_core::collect` decides where each Data-Out goes
//! and when a write is complete. At ERL 2 a failed connection leaves its
//! writes to the session's orphans for a TASK REASSIGN (`recovery.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use iscsi_datamover::WriteBuffer;
use iscsi_proto::pdu::ScsiCommand;
use iscsi_scsi::CommandOutcome;
use iscsi_target_core::Collecting;

use crate::task::Task;

/// The driver's part of a write collecting its data.
pub(crate) struct WriteParts {
    pub(crate) task: Arc<Task>,
    pub(crate) command: ScsiCommand,
    pub(crate) cdb: Vec<u8>,
    pub(crate) buffer: WriteBuffer,
}

impl WriteParts {
    /// Whether task management aborted the write's task.
    pub(crate) fn aborted(&self) -> bool {
        self.task.aborted.load(Ordering::Acquire)
    }
}

/// A write collecting its data: its parts, its Data-Out tracker and its
/// R2Ts.
pub(crate) type PendingWrite = Collecting<WriteParts>;

/// A write that failed before all its data arrived: its status, sent once
/// the Data-Out still due has drained.
pub(crate) struct FailedWrite {
    pub(crate) task: Arc<Task>,
    pub(crate) command: ScsiCommand,
    pub(crate) outcome: CommandOutcome,
}

/// The writes of one connection.
pub(crate) type Writes = iscsi_target_core::Collections<WriteParts, FailedWrite>;
