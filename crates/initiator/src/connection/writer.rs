//! A connection's send side: the outbox of posted PDUs, the writer task
//! that writes them in batches (holding new commands back as
//! [`Coalescing`](crate::config::Coalescing) says), the direct path
//! ([`Sending`]) for PDUs with large data, and the last write before a
//! logout's close. Nothing here reads from the target; the reading side
//! reaches it only through [`Connection::post`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, PoisonError};

use iscsi_datamover::tcp::PduBatch;
use iscsi_datamover::{DatamoverError, PduSender, Sender};
use iscsi_proto::pdu::Header;
use iscsi_proto::serial::CmdSn;

use super::Connection;
use crate::error::Error;

/// PDUs posted and not yet taken for writing.
#[derive(Debug)]
pub(super) struct Outbox {
    pub(super) batch: PduBatch,
    /// Something that must not wait (anything but a new command) is in
    /// the batch.
    pub(super) urgent: bool,
}

impl Outbox {
    /// Moves the posted PDUs to the end of `writing`.
    fn take_into(&mut self, writing: &mut PduBatch) {
        writing.append(&mut self.batch);
        self.urgent = false;
    }
}

/// Data segments up to this many bytes are posted (copied into the
/// outbox and written in a batch with other PDUs); larger ones are sent
/// directly from the caller's buffer. Copying 16 KiB costs well under a
/// microsecond; a write system call over loopback TCP costs several.
pub(crate) const POSTED_DATA_LIMIT: usize = 16 * 1024;

/// Bytes of allocation an emptied batch keeps for the next ones.
const BATCH_RETAIN: usize = 256 * 1024;

/// What a session's connections sent: PDUs, and the writes that carried
/// them (one write of a batch may take more than one system call when the
/// socket buffer fills).
#[derive(Debug, Default)]
pub(crate) struct SendCounters {
    pub(crate) pdus: AtomicU64,
    pub(crate) writes: AtomicU64,
    /// SNACK Requests sent, of every type (ERL 1 and up).
    pub(crate) snacks: AtomicU64,
    /// Recovery R2Ts answered: Data-Out sent again after the target lost
    /// it to a digest error (ERL 1).
    pub(crate) recovery_r2ts: AtomicU64,
}

impl SendCounters {
    fn count(&self, pdus: usize) {
        self.pdus.fetch_add(pdus as u64, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

/// The write side of a connection, behind the write lock.
#[derive(Debug)]
pub(super) struct Wire {
    pub(super) sender: Sender,
    /// The PDUs being written (taken from the outbox); empty between
    /// writes.
    pub(super) writing: PduBatch,
    pub(super) counters: Arc<SendCounters>,
}

impl Wire {
    /// Writes `writing`, then empties it.
    async fn write_batch(&mut self) -> Result<(), DatamoverError> {
        self.counters.count(self.writing.len());
        let result = self.sender.send_batch(&self.writing).await;
        self.writing.clear(BATCH_RETAIN);
        result
    }

    /// Writes `writing`, then `header` with `data` from the caller's
    /// buffer; empties `writing`.
    async fn write_after_batch(
        &mut self,
        header: &Header,
        data: &[u8],
    ) -> Result<(), DatamoverError> {
        self.counters.count(self.writing.len() + 1);
        let result = self
            .sender
            .send_control_after(&self.writing, header, data)
            .await;
        self.writing.clear(BATCH_RETAIN);
        result
    }
}

/// Breaks the connection if dropped before [`SendGuard::done`]: a PDU was
/// half written.
struct SendGuard<'a> {
    connection: &'a Connection,
    armed: bool,
}

impl SendGuard<'_> {
    fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for SendGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.connection.close();
        }
    }
}

/// The write lock of a connection, held across a run of direct sends.
pub(crate) struct Sending<'a> {
    connection: &'a Connection,
    wire: tokio::sync::MutexGuard<'a, Wire>,
}

impl Sending<'_> {
    /// Sends one PDU with its data straight from `data`, behind every PDU
    /// posted before it.
    pub(crate) async fn send(&mut self, header: &Header, data: &[u8]) -> Result<(), Error> {
        if !self.connection.is_alive() {
            return Err(Error::ConnectionLost);
        }
        self.connection
            .lock_outbox()
            .take_into(&mut self.wire.writing);
        self.write_after_batch(header, data).await
    }

    /// Takes the next CmdSN, if the window has room, and sends the command
    /// `header` builds for it with `data`, behind every PDU posted before
    /// (the CmdSN is taken and the outbox emptied under one hold of its
    /// lock: nothing posted later goes first). `None` when the window is
    /// closed: nothing was sent.
    pub(crate) async fn send_command(
        &mut self,
        itt: u32,
        data: &[u8],
        header: impl FnOnce(CmdSn) -> Header,
    ) -> Result<Option<CmdSn>, Error> {
        if !self.connection.is_alive() {
            return Err(Error::ConnectionLost);
        }
        let (cmd_sn, header) = {
            let mut outbox = self.connection.lock_outbox();
            let Some(cmd_sn) = self.connection.window.take() else {
                return Ok(None);
            };
            outbox.take_into(&mut self.wire.writing);
            self.connection.lock().mark_sent(itt, cmd_sn);
            (cmd_sn, header(cmd_sn))
        };
        self.write_after_batch(&header, data).await?;
        Ok(Some(cmd_sn))
    }

    /// Writes the batch taken from the outbox, then `header` and `data`.
    async fn write_after_batch(&mut self, header: &Header, data: &[u8]) -> Result<(), Error> {
        let guard = SendGuard {
            connection: self.connection,
            armed: true,
        };
        let result = self.wire.write_after_batch(header, data).await;
        guard.done();
        if let Err(e) = result {
            self.connection.close();
            return Err(e.into());
        }
        Ok(())
    }
}

impl Connection {
    pub(super) fn lock_outbox(&self) -> MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the writer should write what is posted now, rather than
    /// hold new commands back for others (see [`Coalescing`](crate::config::Coalescing)).
    fn should_write(&self) -> bool {
        let outbox = self.lock_outbox();
        if outbox.batch.is_empty() {
            return false;
        }
        if outbox.urgent || outbox.batch.len() >= self.coalescing.commands {
            return true;
        }
        // Not urgent: every posted PDU is a held command, counted in
        // `in_flight` but not at the target yet.
        let at_target = self.lock().in_flight.saturating_sub(outbox.batch.len());
        at_target < self.coalescing.min_in_flight
    }

    /// Takes the write lock, for direct sends.
    pub(crate) async fn sending(&self) -> Sending<'_> {
        Sending {
            connection: self,
            wire: self.wire.lock().await,
        }
    }

    /// Posts one PDU (its data copied): the writer task sends it at once,
    /// behind every PDU posted or sent before. Never waits.
    pub(crate) fn post(&self, header: &Header, data: &[u8]) -> Result<(), Error> {
        if !self.is_alive() {
            return Err(Error::ConnectionLost);
        }
        let mut outbox = self.lock_outbox();
        outbox.batch.push(header, data)?;
        outbox.urgent = true;
        drop(outbox);
        self.posted.notify_one();
        Ok(())
    }

    /// Posts an immediate PDU `header` builds from the CmdSN it carries
    /// (the next one, not taken: RFC 7143 4.2.2.1), read under the
    /// outbox's lock, so every command numbered below it leaves before it
    /// and every command numbered from it on after: what a task management
    /// function reaches is then exactly what its CmdSN says.
    pub(crate) fn post_immediate(
        &self,
        header: impl FnOnce(CmdSn) -> Header,
    ) -> Result<CmdSn, Error> {
        if !self.is_alive() {
            return Err(Error::ConnectionLost);
        }
        let mut outbox = self.lock_outbox();
        let cmd_sn = self.window.current();
        outbox.batch.push(&header(cmd_sn), &[])?;
        outbox.urgent = true;
        drop(outbox);
        self.posted.notify_one();
        Ok(cmd_sn)
    }

    /// Takes the next CmdSN, if the window has room, and posts the command
    /// `header` builds for it with `data`, under one hold of the outbox's
    /// lock, so commands leave in CmdSN order. `None` when the window is
    /// closed: nothing was posted.
    pub(crate) fn post_command(
        &self,
        itt: u32,
        data: &[u8],
        header: impl FnOnce(CmdSn) -> Header,
    ) -> Result<Option<CmdSn>, Error> {
        if !self.is_alive() {
            return Err(Error::ConnectionLost);
        }
        let mut outbox = self.lock_outbox();
        let Some(cmd_sn) = self.window.take() else {
            return Ok(None);
        };
        self.lock().mark_sent(itt, cmd_sn);
        if let Err(error) = outbox.batch.push(&header(cmd_sn), data) {
            drop(outbox);
            // The CmdSN is taken but will never be sent: the target would
            // wait for it forever. ERL 0 recovers from a closed connection.
            self.close();
            return Err(error.into());
        }
        drop(outbox);
        self.posted.notify_one();
        Ok(Some(cmd_sn))
    }

    /// Posts the command `header` builds with the CmdSN it first had (a
    /// retry, RFC 7143 7.2.1: the target never received it, and its CmdSN
    /// is the hole it waits for), taking nothing from the window.
    pub(crate) fn post_command_numbered(
        &self,
        itt: u32,
        data: &[u8],
        cmd_sn: CmdSn,
        header: impl FnOnce(CmdSn) -> Header,
    ) -> Result<(), Error> {
        if !self.is_alive() {
            return Err(Error::ConnectionLost);
        }
        let mut outbox = self.lock_outbox();
        self.lock().mark_sent(itt, cmd_sn);
        if let Err(error) = outbox.batch.push(&header(cmd_sn), data) {
            drop(outbox);
            self.close();
            return Err(error.into());
        }
        outbox.urgent = true;
        drop(outbox);
        self.posted.notify_one();
        Ok(())
    }

    /// Writes what was posted, then closes the send direction (after a
    /// logout).
    pub(crate) async fn terminate(&self) {
        self.finished.store(true, Ordering::SeqCst);
        let mut wire = self.wire.lock().await;
        if self.is_alive() {
            let guard = SendGuard {
                connection: self,
                armed: true,
            };
            self.lock_outbox().take_into(&mut wire.writing);
            let _ = wire.write_batch().await;
            guard.done();
        }
        let _ = wire.sender.terminate().await;
        drop(wire);
        self.close();
    }
}

/// The writer task: writes what is posted, all of it at once. Woken by the
/// first post after a write; the tasks made ready together with that
/// poster run before it and post theirs too, so one write carries them
/// all. Ends when the connection closes.
pub(super) async fn run_writer(connection: Arc<Connection>) {
    let result = tokio::select! {
        result = write_loop(&connection) => result,
        () = connection.closed() => Ok(()),
    };
    if !connection.finished.load(Ordering::SeqCst) {
        // Closed, not logged out: the send direction ends now (the socket
        // would otherwise stay half open until the connection is dropped,
        // and the target would go on with it as if nothing happened).
        let mut wire = connection.wire.lock().await;
        let _ = wire.sender.terminate().await;
    }
    if let Err(error) = result {
        if !connection.finished.load(Ordering::SeqCst) {
            tracing::warn!(cid = connection.cid, %error, "sending failed: connection lost");
        }
        connection.close();
    }
}

async fn write_loop(connection: &Connection) -> Result<(), DatamoverError> {
    loop {
        connection.posted.notified().await;
        if !connection.should_write() {
            // Commands held back: the next post or ended task wakes us.
            continue;
        }
        let mut wire = connection.wire.lock().await;
        if !connection.is_alive() {
            return Ok(());
        }
        loop {
            connection.lock_outbox().take_into(&mut wire.writing);
            if wire.writing.is_empty() {
                break;
            }
            wire.write_batch().await?;
        }
    }
}
