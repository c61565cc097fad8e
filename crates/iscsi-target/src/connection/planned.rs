//! READ and WRITE on a store with asynchronous I/O (`iscsi_scsi::AsyncIo`,
//! an RBD image): the SCSI layer checks the command
//! (`ScsiTarget::plan_io`) on the command's own task, the transfer runs on
//! the store's asynchronous I/O, and the task sleeps until it completes —
//! no blocking-pool thread held per command, and no hand-off to one and
//! back (what made a 4 KiB RBD command cost three thread switches).

use super::*;

use iscsi_scsi::{Planned, WriteData};

/// What a command run here ended with: its outcome and residual, and its
/// Data-In (empty for a write or after an error).
pub(super) struct Ran {
    pub(super) outcome: CommandOutcome,
    pub(super) residual: Residual,
    pub(super) data_in: Vec<u8>,
}

/// Runs a READ or WRITE(6/10/12/16) through the store's asynchronous I/O.
/// `Err` gives the buffers back when the command must take the synchronous
/// path instead: a write whose CDB asks for more data than the initiator
/// sent (an overflow, cut to the blocks that came: `run_command`), or one
/// that found an exclusive writer holding the LU (`Planned::Synchronous`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    session: &Session,
    task: &Task,
    command: &ScsiCommand,
    cdb: &[u8],
    mut data_out: WriteBuffer,
    data_in: Vec<u8>,
    buffers: &Arc<BufferPool>,
    pieces: &Arc<BufferPool>,
) -> Result<Ran, (WriteBuffer, Vec<u8>)> {
    let Some(scsi) = session.scsi.as_deref() else {
        return Err((data_out, data_in));
    };
    let residual = if command.write {
        let (residual, _, _) = execute::write_residual(scsi, command, cdb);
        if residual.overflow {
            return Err((data_out, data_in));
        }
        Some(residual)
    } else {
        None
    };
    if task.aborted.load(Ordering::Acquire) {
        // Aborted before it ran: never reaches the store (no status goes
        // out: `respond` sees the abort).
        buffers.give(data_in);
        data_out.give(buffers, pieces);
        let residual = residual.unwrap_or(Residual::NONE);
        return Ok(Ran {
            outcome: CommandOutcome::GOOD,
            residual,
            data_in: Vec::new(),
        });
    }
    let planned = scsi.plan_io(
        &session.nexus,
        command.lun.0,
        cdb,
        execute::data_out_view(&mut data_out),
    );
    let (outcome, data_in) = match planned {
        Planned::Synchronous => return Err((data_out, data_in)),
        Planned::Done(outcome) => {
            data_out.give(buffers, pieces);
            buffers.give(data_in);
            (outcome, Vec::new())
        }
        Planned::Io(io) if command.write => {
            buffers.give(data_in);
            let data = PooledWrite {
                buffer: Some(data_out),
                flat: Arc::clone(buffers),
                pieces: Arc::clone(pieces),
            };
            (io.write(Box::new(data)).await, Vec::new())
        }
        Planned::Io(io) => {
            data_out.give(buffers, pieces);
            let (data, outcome) = io.read(data_in).await;
            (outcome, data)
        }
    };
    let residual = residual.unwrap_or_else(|| Residual::of_data_in(command, data_in.len()));
    Ok(Ran {
        outcome,
        residual,
        data_in,
    })
}

/// A write's buffer while the store writes from it; back to its pool when
/// the store is done with it (which may be after the command's task is
/// gone).
struct PooledWrite {
    buffer: Option<WriteBuffer>,
    flat: Arc<BufferPool>,
    pieces: Arc<BufferPool>,
}

impl WriteData for PooledWrite {
    fn slices(&self) -> Vec<&[u8]> {
        self.buffer
            .as_ref()
            .map(WriteBuffer::slices)
            .unwrap_or_default()
    }
}

impl Drop for PooledWrite {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            buffer.give(&self.flat, &self.pieces);
        }
    }
}
