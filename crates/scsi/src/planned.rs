//! [`PlannedIo`]: a READ or WRITE the SCSI layer has checked, whose I/O the
//! transport runs on the store's [`AsyncIo`] (the quinn-proto split: the
//! protocol decides, the I/O happens outside). Everything a command must
//! pass — unit attentions, reservations, ALUA access, range, write
//! protection — is decided by [`ScsiTarget::plan_io`](crate::target::ScsiTarget::plan_io)
//! exactly as for a command it runs itself; only the wait for the medium
//! moves to the transport's task.

use std::io;
use std::sync::Arc;

use crate::backstore::{AsyncIo, WriteData};
use crate::lu::AsyncWritePermit;
use crate::outcome::CommandOutcome;
use crate::sbc::Transfer;
use iscsi_sense::Sense;

/// What [`ScsiTarget::plan_io`](crate::target::ScsiTarget::plan_io) decided.
pub enum Planned {
    /// The command passed every check: run its transfer, then answer with
    /// what [`PlannedIo::read`] or [`PlannedIo::write`] returns.
    Io(PlannedIo),
    /// The command is answered already (refused, or nothing to move).
    Done(CommandOutcome),
    /// A write that found an exclusive writer (COMPARE AND WRITE, ORWRITE,
    /// SANITIZE) holding the LU: run it with [`ScsiTarget::execute_lending`](crate::target::ScsiTarget::execute_lending)
    /// off the async runtime, where waiting for that writer is fine.
    Synchronous,
}

/// What the dispatch leaves for [`ScsiTarget::plan_io`](crate::target::ScsiTarget::plan_io).
pub(crate) enum PlanSlot {
    /// Nothing planned: the command was answered.
    Empty,
    /// A transfer for the caller to run.
    Io(PlannedIo),
    /// See [`Planned::Synchronous`].
    Synchronous,
}

/// A checked READ or WRITE and the store to run it on.
pub struct PlannedIo {
    /// What it moves.
    pub transfer: Transfer,
    io: Arc<dyn AsyncIo>,
    /// For a write: the LU's shared write access, until it completes.
    _permit: Option<AsyncWritePermit>,
    /// The LU's D_SENSE when the command was checked.
    descriptor_sense: bool,
}

impl PlannedIo {
    pub(crate) fn new(
        transfer: Transfer,
        io: Arc<dyn AsyncIo>,
        permit: Option<AsyncWritePermit>,
        descriptor_sense: bool,
    ) -> Self {
        PlannedIo {
            transfer,
            io,
            _permit: permit,
            descriptor_sense,
        }
    }

    /// Reads the transfer into `buf` (resized to its length; only growth
    /// is zeroed): the data, empty after an error, and the outcome.
    pub async fn read(self, mut buf: Vec<u8>) -> (Vec<u8>, CommandOutcome) {
        buf.resize(self.transfer.len, 0);
        let (mut buf, result) = self.io.read(self.transfer.offset, buf).await;
        match result {
            Ok(()) => (buf, CommandOutcome::GOOD),
            Err(e) => {
                buf.clear();
                (buf, self.failed(e, Sense::read_failed).await)
            }
        }
    }

    /// Writes the transfer's length from `data` (at least that long).
    pub async fn write(self, data: Box<dyn WriteData>) -> CommandOutcome {
        let Transfer {
            offset,
            len,
            through,
            ..
        } = self.transfer;
        let result: io::Result<()> = self.io.write(offset, data, len, through).await;
        match result {
            Ok(()) => CommandOutcome::GOOD,
            Err(e) => self.failed(e, Sense::write_failed).await,
        }
    }

    /// The outcome of a failed transfer: BUSY when the store asks for the
    /// command again soon ([`io::ErrorKind::WouldBlock`]: a READ or WRITE
    /// sent again leaves the medium as one run of it would, whatever of it
    /// got there), once the store says the retry is worth it
    /// ([`AsyncIo::ready`]) and with the LU's write access given back
    /// first; else CHECK CONDITION with `sense` of the error.
    async fn failed(self, e: io::Error, sense: fn(io::Error) -> Sense) -> CommandOutcome {
        if e.kind() == io::ErrorKind::WouldBlock {
            let PlannedIo { io, _permit, .. } = self;
            drop(_permit);
            io.ready().await;
            return CommandOutcome::BUSY;
        }
        CommandOutcome {
            descriptor_sense: self.descriptor_sense,
            ..CommandOutcome::check_condition(sense(e))
        }
    }
}
