//! The send direction of a connection: one lock that serialises its PDUs
//! and stamps StatSN, ExpCmdSN and MaxCmdSN at the moment of sending
//! (which numbers is `iscsi_target_core::stamp`'s decision). The tasks
//! that answer on a connection share its `Writer`; a task's allegiance
//! (`task.rs`) names one, which is how ERL 2 moves answers.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use iscsi_datamover::{DatamoverError, Gather, PduSender, Sender};
use iscsi_proto::pdu::{Header, Pdu};
use iscsi_proto::serial::{CmdSn, StatSn};
pub(crate) use iscsi_target_core::Stat;
use iscsi_target_core::StatSequence;

use iscsi_target_core::retention;

/// What a connection keeps of a status for a SNACK (ERL 1): the core's
/// retention over the very Data-In pieces sent.
pub(crate) type Retained = retention::Retained<Gather>;
/// A status sent and not yet acknowledged, with its Data-In as sent.
pub(crate) type SentStatus = retention::SentStatus<Gather>;
/// A PDU to send again for a SNACK.
pub(crate) type Resend = retention::Resend<Gather>;

/// The session's CmdSN window as a writer needs it: what ExpCmdSN and
/// MaxCmdSN to stamp (the session implements it; a writer needs nothing
/// else of its session).
pub(crate) trait CmdWindow: Send + Sync {
    /// ExpCmdSN and MaxCmdSN now.
    fn window_edges(&self) -> (CmdSn, CmdSn);
}

impl<T: CmdWindow + ?Sized> CmdWindow for Arc<T> {
    fn window_edges(&self) -> (CmdSn, CmdSn) {
        (**self).window_edges()
    }
}

/// The send direction of a connection, shared by the tasks that answer on
/// it (connection allegiance: a command is answered on the connection it
/// came in on, RFC 7143 5.3.2? see 4.2.3.1).
pub(crate) struct Writer {
    pub(crate) state: tokio::sync::Mutex<WriterState>,
    /// The session's CmdSN window, stamped into every PDU sent.
    pub(crate) window: Arc<dyn CmdWindow>,
    /// The connection's number in its session (`Session::take_cid`).
    pub(crate) number: u64,
    /// Set, under the lock of `state`, when the connection is gone: an
    /// answer for a task allegiant to it is parked instead (ERL 2).
    pub(crate) closed: std::sync::atomic::AtomicBool,
    /// At ErrorRecoveryLevel 1 and above: the statuses (and Data-In) not
    /// yet acknowledged, for SNACKs (`iscsi_target_core::retention`).
    pub(crate) retained: Option<std::sync::Mutex<Retained>>,
}

/// The sender and this connection's StatSN sequence, under the writer's
/// lock.
pub(crate) struct WriterState {
    pub(crate) sender: Sender,
    pub(crate) stats: StatSequence,
}

impl Writer {
    /// Sends one PDU.
    pub async fn send(&self, pdu: Pdu, data: &[u8], stat: Stat) -> Result<(), DatamoverError> {
        let mut state = self.lock().await;
        state.send(&*self.window, pdu, data, stat).await
    }

    /// Locks the writer for a run of PDUs (a command's Data-In and status).
    /// Nothing the holder sends is held back unless it asks
    /// ([`WriterState::hold`]); what an earlier holder held goes out before
    /// it.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, WriterState> {
        let mut state = self.state.lock().await;
        state.sender.hold(false);
        state
    }

    /// Writes what answers were held back (`WriterState::hold`).
    pub async fn flush(&self) -> Result<(), DatamoverError> {
        self.state.lock().await.sender.flush().await
    }

    /// Ends the send direction. Every answer under way has finished (or
    /// failed) when this returns, and none starts after: see
    /// [`Writer::is_closed`].
    pub(crate) async fn terminate(&self) {
        let mut state = self.state.lock().await;
        self.closed.store(true, Ordering::Release);
        let _ = state.sender.terminate().await;
    }

    /// Whether the connection is gone (its send direction terminated).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl WriterState {
    /// While `on`, short PDUs are held back by the datamover until the next
    /// write or [`Writer::flush`] (`Sender::hold`): the answers the
    /// connection's reader sends while more commands wait in its receive
    /// buffer leave together.
    pub fn hold(&mut self, on: bool) {
        self.sender.hold(on);
    }

    /// Stamps StatSN, ExpCmdSN and MaxCmdSN into `pdu` and sends it with
    /// `data` (a Data-In through `Put_Data`, the rest through
    /// `Send_Control`).
    pub async fn send(
        &mut self,
        window: &dyn CmdWindow,
        pdu: Pdu,
        data: &[u8],
        stat: Stat,
    ) -> Result<(), DatamoverError> {
        let header = self.stamped(window, pdu, data.len(), stat);
        if matches!(header.pdu, Pdu::DataIn(_)) {
            self.sender.put_data(&header, data).await
        } else {
            self.sender.send_control(&header, data).await
        }
    }

    /// Stamps and sends a Data-In whose data the datamover may keep until
    /// it is on the wire (`Put_Data` from an owned buffer: no copy over
    /// iSER).
    pub async fn send_data_in(
        &mut self,
        window: &dyn CmdWindow,
        pdu: Pdu,
        data: Gather,
        stat: Stat,
    ) -> Result<(), DatamoverError> {
        let header = self.stamped(window, pdu, data.len(), stat);
        self.sender.put_data_gather(&header, data).await
    }

    /// The StatSN the next status will carry.
    pub(crate) fn next_stat_sn(&self) -> StatSn {
        self.stats.next()
    }

    /// `pdu` with StatSN (advanced or not, per `stat`), ExpCmdSN and
    /// MaxCmdSN as of now, as a header for `data_len` bytes.
    fn stamped(
        &mut self,
        window: &dyn CmdWindow,
        mut pdu: Pdu,
        data_len: usize,
        stat: Stat,
    ) -> Header {
        let (exp, max) = window.window_edges();
        self.stats.stamp(&mut pdu, stat, exp, max);
        Header::new(pdu, data_len as u32)
    }
}
