//! One connection in full feature phase (RFC 7143 sections 4.2, 11).
//!
//! The connection's task reads PDUs; commands run concurrently:
//! - A SCSI Command is admitted against the session's CmdSN window. A read
//!   (or a command without data) is executed and answered (`execute`): by
//!   this task before it reads on when it moves under 64 KiB on a memory
//!   store, else by a task of its own, on the blocking pool when the store
//!   may block. A write keeps a buffer of its Expected Data Transfer Length: immediate
//!   data and every Data-Out are received straight into their place in it
//!   (the datamover's `receive_data_into`), R2Ts go out up to
//!   MaxOutstandingR2T at a time, and when the last byte is in, the write
//!   is handed to a task like a read.
//! - Responses from every task go through one [`Writer`], which stamps
//!   StatSN, ExpCmdSN and MaxCmdSN at the moment of sending, so StatSN
//!   follows the order on the wire and MaxCmdSN reflects commands finished.
//! - NOP-Out pings, Text (SendTargets, negotiation), Logout, task management
//!   (in a task of its own, so that waiting for aborted commands does not
//!   stop the reading), SNACK (Reject at ErrorRecoveryLevel 0; at 1 the
//!   Data-In or statuses asked for, sent again: `iscsi_target_core::retention`) and Reject
//!   for anything that breaks the rules.
//! - On target shutdown, an Asynchronous Message asks the initiator to log
//!   out; the connection is dropped if it has not done so in time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use iscsi_datamover::tap::Tap;
use iscsi_datamover::{
    BufferPool, DatamoverError, Gather, PduReceiver, PooledBuffer, Receiver, Sender, WRITE_PIECE,
    WriteBuffer,
};
use iscsi_proto::error::DecodeError;
use iscsi_proto::pdu::{
    AsyncEvent, AsyncMessage, Header, LogoutRequest, LogoutResponse, LogoutResponseCode, Lun,
    NopIn, NopOut, Pdu, RESERVED_TAG, Reject, RejectReason, ScsiCommand, SegmentLengths,
    SnackRequest, TaskFunction, TaskManagementRequest, TaskManagementResponse, TaskResponse,
    TextRequest,
};
use iscsi_proto::serial::{CmdSn, StatSn};
use iscsi_proto::state::{ConnectionEvent, ConnectionState, ConnectionStateMachine};
use iscsi_proto::text::SessionType;
use iscsi_proto::transfer::{DataOutProgress, Limits};
use iscsi_scsi::{CommandOutcome, DataOut, Nexus, ScsiTarget, TargetReset};
use iscsi_target_core::{Inserted, Keepalive, KeepaliveAction, TextExchange, TransferTags};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::recovery::Orphan;
use crate::task::StillAllegiant;
use crate::writer::{Resend, SentStatus};
pub(crate) use crate::writer::{Stat, Writer, WriterState};
use iscsi_target_core::retention::exp_stat_sn_of;

use crate::metrics::stats::SessionStats;
use crate::pending::{PendingWrite, WriteParts, Writes};
use crate::session::{Admission, Session, Task, record};
use crate::shared::Shared;
use write::PROTOCOL_SERVICE_CRC_ERROR;

mod execute;
mod planned;
mod requests;
mod respond;
mod task_management;
pub(crate) mod write;

use iscsi_target_core::answer::Residual;
use iscsi_target_core::command::{self, DamagedImmediate, Route};
use respond::{Response, respond, send_answer};
use task_management::task_management;

/// SAM status GOOD.
const GOOD: u8 = 0x00;
/// The largest write buffer a command may make the target allocate; the
/// Block Limits VPD page advertises less.
const MAX_WRITE_BUFFER: u32 = 32 << 20;
/// COMPARE AND WRITE (SBC-3 5.2).
const COMPARE_AND_WRITE: u8 = 0x89;
/// WRITE SAME(10) and (16): their Data-Out is exactly one block.
const WRITE_SAME_10: u8 = 0x41;
const WRITE_SAME_16: u8 = 0x93;
/// Seconds an initiator is given to log out when the target shuts down
/// (Parameter3 of the Asynchronous Message).
const LOGOUT_GRACE_SECONDS: u16 = 3;

/// Commands of this connection being executed or answered, so that a
/// logout can wait for them.
#[derive(Default)]
struct InFlight {
    count: AtomicU32,
    idle: Notify,
}

impl InFlight {
    fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(Arc::clone(self))
    }

    async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Data buffers each connection's `BufferPool` keeps, at most. A buffer
/// comes back holding whatever it
/// held: the write path clears it before use, and a Data-In buffer is
/// scratch to `ScsiTarget::execute`, which a READ overwrites in place rather
/// than zeroing it again.
const BUFFERS_KEPT: usize = 64;

/// Write pieces (64 KiB each) each connection's piece pool keeps, at most
/// (and within half of `TargetConfig::buffer_pool_bytes`).
const PIECES_KEPT: usize = 1024;

// A write's pieces are what a RAM store can keep as its chunks.
const _: () = assert!(WRITE_PIECE == iscsi_stores::RAM_CHUNK_SIZE);

/// How long a logged-out connection is read for what the initiator still
/// had on the way.
const LOGOUT_DRAIN: Duration = Duration::from_secs(2);

/// Reads and drops what the initiator sent after its logout (Data-Out for
/// writes it had in flight: RFC 7143 11.14 lets a logout come with
/// commands outstanding) until it closes its side, for at most
/// [`LOGOUT_DRAIN`]. Closing a socket with unread bytes sends a TCP reset,
/// and a reset can overtake the logout response in the initiator's
/// receive queue: the logout would fail there as a lost connection.
async fn drain_after_logout(receiver: &mut Receiver) {
    let deadline = Instant::now() + LOGOUT_DRAIN;
    let mut dropped = 0u32;
    while let Ok(Ok(Some(_))) = tokio::time::timeout_at(deadline, receiver.receive_header()).await {
        match tokio::time::timeout_at(deadline, receiver.receive_data()).await {
            Ok(Ok(_)) => dropped += 1,
            _ => break,
        }
    }
    if dropped > 0 {
        debug!(dropped, "PDUs after the logout dropped");
    }
}

/// What the reading loop does after a PDU.
enum Flow {
    Continue,
    Stop,
}

/// One connection of a session in full feature phase.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    session: Arc<Session>,
    cid: u16,
    limits: Limits,
    /// The limits Data-In is cut by: `limits`, except that over iSER a
    /// Data-In is an RDMA Write, not bound by the initiator's receive
    /// buffers, so only MaxBurstLength cuts it (RFC 7145 7.3.5).
    data_in_limits: Limits,
    local: SocketAddr,
    writer: Arc<Writer>,
    in_flight: Arc<InFlight>,
    buffers: Arc<BufferPool>,
    /// Pieces of [`WRITE_PIECE`] that large writes are received into (a
    /// RAM store keeps them as its chunks, giving back the chunks they
    /// replaced).
    pieces: Arc<BufferPool>,
    /// Writes collecting their data, and those that failed on the way and
    /// wait for the rest of it before their status (the core decides,
    /// `iscsi_target_core::collect`; Data-Out the initiator still sends
    /// for an aborted write is dropped without a Reject).
    writes: Writes,
    /// The session's abort count when `writes` was last swept for
    /// aborted writes.
    aborts_swept: u64,
    /// Target Transfer Tags for R2Ts, pings and long Text answers.
    transfer_tags: TransferTags,
    /// A Text answer too long for one PDU, sent a part per Text Request
    /// that carries its tag (RFC 7143 11.10.2, 11.11.1).
    text: TextExchange,
    /// The connection's state (RFC 7143 8.1, 8.2): LOGGED_IN when created.
    state: ConnectionStateMachine,
    /// Told of each command's steps between its PDUs (`--trace`).
    tap: Option<Tap>,
    /// Whether this task has answered a command itself since the writer
    /// was last flushed: the answer may be held back (`WriterState::hold`).
    answers_held: bool,
}

impl Connection {
    /// A connection that has just completed its login: everything it
    /// needs comes from that login, hence the argument count.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shared: Arc<Shared>,
        session: Arc<Session>,
        cid: u16,
        limits: Limits,
        local: SocketAddr,
        stat_sn: StatSn,
        sender: Sender,
        state: ConnectionStateMachine,
        tap: Option<Tap>,
        placed_data: bool,
        error_recovery_level: u8,
        number: u64,
    ) -> Self {
        let writer = Arc::new(Writer {
            state: tokio::sync::Mutex::new(WriterState {
                sender,
                stats: iscsi_target_core::StatSequence::new(stat_sn),
            }),
            window: Arc::clone(&session) as Arc<dyn crate::writer::CmdWindow>,
            number,
            closed: std::sync::atomic::AtomicBool::new(false),
            retained: (error_recovery_level >= 1).then(Default::default),
        });
        let pool_bytes = shared.config().buffer_pool_bytes;
        Connection {
            shared,
            session,
            cid,
            limits,
            data_in_limits: if placed_data {
                Limits {
                    max_send_segment: limits.max_burst_length,
                    ..limits
                }
            } else {
                limits
            },
            local,
            writer,
            in_flight: Arc::default(),
            // Half the configured bytes for whole buffers, half for pieces.
            buffers: Arc::new(BufferPool::bounded(
                BUFFERS_KEPT,
                MAX_WRITE_BUFFER as usize,
                pool_bytes / 2,
            )),
            pieces: Arc::new(BufferPool::bounded(
                PIECES_KEPT,
                WRITE_PIECE,
                pool_bytes / 2,
            )),
            writes: Writes::default(),
            aborts_swept: 0,
            transfer_tags: TransferTags::default(),
            text: TextExchange::default(),
            state,
            tap,
            answers_held: false,
        }
    }

    /// Applies a connection event (RFC 7143 8.1, 8.2).
    fn record(&mut self, event: ConnectionEvent) {
        record(&mut self.state, event, &format!("cid {}", self.cid));
    }

    /// Reads and serves PDUs until logout, the peer's close, an error, the
    /// session's close, a login with this connection's CID (`replaced`)
    /// or the end of the shutdown grace period. Says whether the
    /// connection ended by a successful logout (T13), and, when it failed
    /// in a session at ErrorRecoveryLevel 2, returns its writer: the tasks
    /// allegiant to it wait for TASK REASSIGN until Time2Retain is over.
    pub async fn run(
        mut self,
        mut receiver: Receiver,
        mut replaced: tokio::sync::watch::Receiver<bool>,
    ) -> (Result<(), DatamoverError>, bool, Option<Arc<Writer>>) {
        let mut stopped_by_logout = false;
        let mut shutdown = self.shared.shutdown.clone();
        let mut logout_asked = self.session.logout_asked();
        let mut closing = self.session.closing();
        let mut logout_deadline: Option<Instant> = None;
        let ping_interval = self.shared.config().nop_in_interval;
        let mut keepalive = Keepalive::new(ping_interval, Instant::now().into_std());
        // One timer for the connection's life, moved only when it fires:
        // a PDU just notes the time. (A timer armed per PDU was an insert
        // and a removal in the runtime's timer wheel for every PDU.)
        let far = || Instant::now() + Duration::from_secs(86_400 * 365);
        let mut ping_timer = std::pin::pin!(tokio::time::sleep_until(
            keepalive.deadline().map_or_else(far, Instant::from_std)
        ));
        let result = loop {
            if *closing.borrow() {
                if self.state.state() != ConnectionState::Free {
                    // Closed by a "close the session" logout on another
                    // connection, a reinstatement or a target reset.
                    self.record(ConnectionEvent::SessionClosedElsewhere);
                }
                break Ok(());
            }
            if *replaced.borrow() {
                // Connection reinstatement (RFC 7143 6.3.4): an implicit
                // logout of this connection (T8).
                info!(cid = self.cid, "replaced by a login with the same CID");
                self.record(ConnectionEvent::SessionClosedElsewhere);
                break Ok(());
            }
            if (*shutdown.borrow() || *logout_asked.borrow()) && logout_deadline.is_none() {
                match self.request_logout().await {
                    Ok(deadline) => logout_deadline = Some(deadline),
                    Err(e) => break Err(e),
                }
            }
            let deadline = logout_deadline;
            let header = tokio::select! {
                header = receiver.receive_header() => header,
                _ = shutdown.changed() => continue,
                Ok(()) = logout_asked.changed() => continue,
                _ = closing.changed() => continue,
                Ok(()) = replaced.changed() => continue,
                _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)).await },
                    if deadline.is_some() => {
                    info!(cid = self.cid, "no logout after the logout request: dropping the connection");
                    break Ok(());
                }
                _ = ping_timer.as_mut(), if ping_interval.is_some() => {
                    match keepalive.timer_fired(Instant::now().into_std()) {
                        KeepaliveAction::Rearm(due) => ping_timer.as_mut().reset(due.into()),
                        KeepaliveAction::Drop => {
                            warn!(cid = self.cid, "no answer to the NOP-In ping: dropping the connection");
                            break Ok(());
                        }
                        KeepaliveAction::Ping => {
                            if let Err(e) = self.ping().await {
                                break Err(e);
                            }
                            if let Some(due) = keepalive.pinged(Instant::now().into_std()) {
                                ping_timer.as_mut().reset(due.into());
                            }
                        }
                    }
                    continue;
                }
            };
            // Anything from the initiator shows the connection is alive.
            keepalive.heard(Instant::now().into_std());
            let header = match header {
                Ok(Some(header)) => header,
                Ok(None) => break Ok(()),
                Err(e) => {
                    if matches!(
                        e,
                        DatamoverError::Decode(DecodeError::HeaderDigestMismatch { .. })
                    ) {
                        SessionStats::add(&self.session.stats.header_digest_errors, 1);
                    }
                    break Err(e);
                }
            };
            self.sweep_aborted_writes();
            match self.dispatch(&mut receiver, header).await {
                // Answers held back go out once no whole PDU is left to
                // take in: before the reader can wait for the initiator.
                Ok(Flow::Continue) if self.answers_held && !receiver.has_whole_pdu() => {
                    self.answers_held = false;
                    if let Err(e) = self.writer.flush().await {
                        break Err(e);
                    }
                }
                Ok(Flow::Continue) => {}
                Ok(Flow::Stop) => {
                    stopped_by_logout = true;
                    break Ok(());
                }
                Err(e) => break Err(e),
            }
        };
        let logged_out = self.state.state() == ConnectionState::Free;
        if !logged_out && *closing.borrow() {
            // The session closed while the peer was closing this
            // connection too: a clean close, not a failure (T8, T18, T13).
            self.record(ConnectionEvent::SessionClosedElsewhere);
        } else if !logged_out {
            // The transport went away, failed, or is dropped for silence
            // (T15, T16, T17). ErrorRecoveryLevel 0 keeps no connection
            // state for a later cleanup (Time2Retain 0): the cleanup ends
            // at once (M1).
            self.record(ConnectionEvent::TransportLost);
            self.record(ConnectionEvent::CleanupTimedOut);
        }
        // Below ERL 2, or closed for good, the connection's tasks end with
        // it: writes still collecting data die. At ERL 2 a connection that
        // failed or was replaced (connection reinstatement, or a logout
        // removing it for recovery) leaves them for TASK REASSIGN.
        let recovers =
            self.session.recovers_connections() && !stopped_by_logout && !*closing.borrow();
        if !stopped_by_logout {
            // An answer stuck sending to a peer that stopped reading holds
            // the writer's lock (and its task) until the socket goes:
            // the send fails now, so the writer ends and the tasks with it.
            receiver.sever();
        }
        if recovers {
            self.leave_tasks().await;
        } else {
            self.abandon_pending_writes();
            self.writer.terminate().await;
        }
        for failed in self.writes.take_draining() {
            self.session.abort(&failed.task);
        }
        if stopped_by_logout {
            drain_after_logout(&mut receiver).await;
        }
        let left = recovers.then(|| Arc::clone(&self.writer));
        (result, stopped_by_logout && !*closing.borrow(), left)
    }

    /// ERL 2: the connection is gone, its tasks are not (RFC 7143 7.2.2).
    /// Writes collecting data, and the statuses sent but not acknowledged,
    /// become the session's orphans; commands being executed park their
    /// answers once the writer is closed (which this does first: an answer
    /// under way finishes, or fails and is kept, before it returns).
    async fn leave_tasks(&mut self) {
        self.writer.terminate().await;
        let number = self.writer.number;
        let orphans = &self.session.orphans;
        let writes = self.writes.collecting();
        for (itt, pending) in self.writes.take_all() {
            orphans.adopt(itt, Orphan::Collecting(Box::new(pending)), number);
        }
        let statuses = match &self.writer.retained {
            Some(retained) => retained
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take_all(),
            None => Vec::new(),
        };
        let answered = statuses.len();
        for status in statuses {
            let itt = status.response.initiator_task_tag;
            orphans.adopt(itt, Orphan::Answered(status), number);
        }
        info!(
            cid = self.cid,
            writes, answered, "connection failed: its tasks wait for reassignment (ERL 2)"
        );
    }

    /// Ends the writes task management aborted while they waited for
    /// Data-Out (it runs beside this loop and cannot reach them): their
    /// buffers go back at the next PDU rather than when the connection
    /// ends, however many aborts come. One atomic load while there was no
    /// abort.
    fn sweep_aborted_writes(&mut self) {
        let aborts = self.session.stats.aborts.load(Ordering::Relaxed);
        if aborts == self.aborts_swept {
            return;
        }
        self.aborts_swept = aborts;
        for write in self.writes.sweep_aborted(WriteParts::aborted) {
            self.end_aborted_write(write);
        }
    }

    /// Ends a write the core took out as aborted: its task is finished and
    /// its buffer goes back (the initiator goes on answering its R2Ts until
    /// it has the function's response, RFC 7143 11.5.1; the core drops
    /// that Data-Out quietly).
    pub(super) fn end_aborted_write(&mut self, write: WriteParts) {
        self.session.finish(&write.task);
        self.give_write_buffer(write.buffer);
    }

    /// Aborts every write still waiting for Data-Out on this connection
    /// (its end, or a logout): they end without a status.
    fn abandon_pending_writes(&mut self) {
        for (_, pending) in self.writes.take_all() {
            self.session.abort(&pending.write.task);
            pending.write.buffer.give(&self.buffers, &self.pieces);
        }
    }

    /// A buffer for a write of `len` bytes: in pieces of [`WRITE_PIECE`]
    /// when it is that long or longer (a RAM store keeps whole pieces as
    /// its chunks, files take them in one vectored write; over TCP the
    /// kernel reads into them, over iSER the RDMA Read's sink pages are
    /// exchanged for them), else one buffer.
    fn write_buffer(&self, len: usize) -> WriteBuffer {
        if len >= WRITE_PIECE {
            WriteBuffer::in_pieces(&self.pieces, len, WRITE_PIECE)
        } else {
            WriteBuffer::flat(&self.buffers, len)
        }
    }

    /// Returns a write's buffer to the pool it came from.
    pub(super) fn give_write_buffer(&self, buffer: WriteBuffer) {
        buffer.give(&self.buffers, &self.pieces);
    }

    /// A NOP-In ping (RFC 7143 11.19): a Target Transfer Tag that asks for
    /// a NOP-Out answer, the reserved Initiator Task Tag, StatSN not
    /// advanced.
    async fn ping(&mut self) -> Result<(), DatamoverError> {
        let tag = self.transfer_tags.take();
        let ping = NopIn {
            lun: Lun(0),
            initiator_task_tag: RESERVED_TAG,
            target_transfer_tag: tag,
            ..NopIn::default()
        };
        self.writer.send(Pdu::NopIn(ping), &[], Stat::Current).await
    }

    /// Asks the initiator to log out (RFC 7143 11.9.1, AsyncEvent 1) and
    /// returns when to give up waiting.
    async fn request_logout(&mut self) -> Result<Instant, DatamoverError> {
        info!(
            cid = self.cid,
            "requesting logout (target shutting down, or the operator asked)"
        );
        self.record(ConnectionEvent::LogoutRequestedByTarget);
        let message = AsyncMessage {
            lun: Lun(0),
            async_event: AsyncEvent::LogoutRequest,
            parameter3: LOGOUT_GRACE_SECONDS,
            ..AsyncMessage::default()
        };
        self.writer
            .send(Pdu::AsyncMessage(message), &[], Stat::Advance)
            .await?;
        Ok(Instant::now() + Duration::from_secs(u64::from(LOGOUT_GRACE_SECONDS) + 1))
    }

    async fn dispatch(
        &mut self,
        receiver: &mut Receiver,
        header: Header,
    ) -> Result<Flow, DatamoverError> {
        if let (Some(retained), Some(exp_stat_sn)) =
            (&self.writer.retained, exp_stat_sn_of(&header.pdu))
        {
            // Statuses before ExpStatSN are acknowledged (RFC 7143
            // 4.2.2.2): no SNACK may ask for them again.
            retained
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .acknowledge(exp_stat_sn);
        }
        match header.pdu.clone() {
            Pdu::ScsiCommand(command) => self.scsi_command(receiver, &header, command).await?,
            Pdu::DataOut(data_out) => self.data_out(receiver, &header, data_out).await?,
            Pdu::NopOut(nop) => {
                let Some(data) = self.data_or_reject(receiver, &header).await? else {
                    return Ok(Flow::Continue);
                };
                self.nop_out(nop, &data).await?;
            }
            Pdu::TextRequest(request) => {
                let Some(data) = self.data_or_reject(receiver, &header).await? else {
                    return Ok(Flow::Continue);
                };
                self.text(&header, request, &data).await?;
            }
            Pdu::LogoutRequest(request) => {
                let Some(_) = self.data_or_reject(receiver, &header).await? else {
                    return Ok(Flow::Continue);
                };
                return self.logout(request).await;
            }
            Pdu::TaskManagementRequest(request)
                if request.function == TaskFunction::TaskReassign =>
            {
                let Some(_) = self.data_or_reject(receiver, &header).await? else {
                    return Ok(Flow::Continue);
                };
                self.task_reassign(request).await?;
            }
            Pdu::TaskManagementRequest(request) => {
                let Some(_) = self.data_or_reject(receiver, &header).await? else {
                    return Ok(Flow::Continue);
                };
                let session = Arc::clone(&self.session);
                let shared = Arc::clone(&self.shared);
                let writer = Arc::clone(&self.writer);
                // Aborting waits for the tasks concerned; reading goes on.
                tokio::spawn(async move {
                    if let Err(error) = task_management(&shared, &session, &writer, request).await {
                        debug!(%error, "task management response not sent");
                    }
                });
            }
            Pdu::SnackRequest(snack) => {
                let Some(_) = self.data_or_reject(receiver, &header).await? else {
                    return Ok(Flow::Continue);
                };
                self.snack(&header, &snack).await?;
            }
            _ => {
                let Some(_) = self.data_or_reject(receiver, &header).await? else {
                    return Ok(Flow::Continue);
                };
                self.reject(&header, RejectReason::CommandNotSupported)
                    .await?;
            }
        }
        Ok(Flow::Continue)
    }

    /// The data segment of a PDU, or `None` after answering a data digest
    /// error with a Reject (RFC 7143 7.8: the PDU is discarded, the
    /// connection goes on). Every PDU whose data is received goes through
    /// here, those whose data is dropped unread included: a write failed at
    /// ERL 0 still drains its Data-Out, and a second corrupted one among
    /// them must not cost the connection.
    async fn data_or_reject(
        &mut self,
        receiver: &mut Receiver,
        header: &Header,
    ) -> Result<Option<Vec<u8>>, DatamoverError> {
        match receiver.receive_data().await {
            Ok(data) => Ok(Some(data)),
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. })) => {
                warn!("data digest error: PDU rejected");
                self.reject(header, RejectReason::DataDigestError).await?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    async fn reject(&self, header: &Header, reason: RejectReason) -> Result<(), DatamoverError> {
        self.session.stats.rejected(reason.to_u8());
        reject(&self.writer, header, reason).await
    }

    /// A SCSI Command PDU (RFC 7143 11.3).
    async fn scsi_command(
        &mut self,
        receiver: &mut Receiver,
        header: &Header,
        command: ScsiCommand,
    ) -> Result<(), DatamoverError> {
        let immediate_len = header.data_segment_length;
        let itt = command.initiator_task_tag;
        let task =
            match self
                .session
                .admit(command.cmd_sn, command.immediate, itt, command.lun.0, true)
            {
                Admission::Accepted(task) => task,
                Admission::OutOfWindow if self.session.aborted_unseen(itt) => {
                    debug!(itt, "a command aborted before it came: dropped");
                    self.data_or_reject(receiver, header).await?;
                    return Ok(());
                }
                Admission::OutOfWindow => {
                    warn!(
                        cmd_sn = command.cmd_sn.get(),
                        "CmdSN outside the window: command ignored"
                    );
                    self.data_or_reject(receiver, header).await?;
                    return Ok(());
                }
                Admission::TagInUse => {
                    if self.data_or_reject(receiver, header).await?.is_none() {
                        return Ok(());
                    }
                    return self.reject(header, RejectReason::TaskInProgress).await;
                }
            };
        task.allegiance.pledge(&self.writer, self.data_in_limits);
        self.session.luns_used.note(command.lun.0);
        let cdb = header.full_cdb().unwrap_or_else(|| command.cdb.to_vec());
        let expected = command.expected_data_transfer_length;
        let serves_scsi = self.session.scsi.is_some();
        let route = command::route(
            &command,
            immediate_len,
            &self.limits,
            serves_scsi,
            MAX_WRITE_BUFFER,
        );
        let mut tracker = match route {
            Route::Reject(reason) => {
                debug!(itt, ?reason, "SCSI command rejected");
                let rejected = self.data_or_reject(receiver, header).await?.is_none();
                self.session.finish(&task);
                if rejected {
                    return Ok(());
                }
                return self.reject(header, reason).await;
            }
            Route::Run => {
                self.execute(task, command, cdb, WriteBuffer::default(), 0)
                    .await;
                return Ok(());
            }
            Route::TooLong(due) => {
                self.data_or_reject(receiver, header).await?;
                let outcome =
                    CommandOutcome::check_condition(iscsi_scsi::Sense::INVALID_FIELD_IN_CDB);
                self.answer_when_drained(task, command, outcome, due);
                return Ok(());
            }
            Route::Collect(tracker) => tracker,
        };
        // Not zeroed: the write runs only once its tracker has seen every
        // byte of the Expected Data Transfer Length arrive exactly once
        // (no gaps, no overlaps: `DataOutTracker::is_complete`), so no old
        // contents of a reused buffer can reach the backstore. A write that
        // fails before then gives the buffer back unused.
        let mut buffer = self.write_buffer(expected as usize);
        match receiver
            .receive_data_in_buffer(&mut buffer, 0..immediate_len as usize)
            .await
        {
            Ok(()) => {
                SessionStats::add(&self.session.stats.write_bytes, u64::from(immediate_len));
            }
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. })) => {
                // RFC 7143 7.8: the PDU is rejected; at ErrorRecoveryLevel
                // 1 its data is asked for again with a recovery R2T, at 0
                // the task ends in CHECK CONDITION, PROTOCOL SERVICE CRC
                // ERROR, once the unsolicited data still due is in.
                self.reject(header, RejectReason::DataDigestError).await?;
                let damaged =
                    command::damaged_immediate(&command, immediate_len, &mut tracker, &self.limits);
                if let DamagedImmediate::Fail(due) = damaged {
                    warn!("data digest error in immediate data: PDU rejected, write failed");
                    self.give_write_buffer(buffer);
                    let outcome = CommandOutcome::check_condition(PROTOCOL_SERVICE_CRC_ERROR);
                    self.answer_when_drained(task, command, outcome, due);
                    return Ok(());
                }
                warn!("data digest error in immediate data: PDU rejected, data asked for again");
            }
            Err(e) => {
                // The connection failed under the command's own data: the
                // task ends here (ERL 2 has nothing of it to go on with:
                // a TASK REASSIGN finds no task, and the initiator sends
                // the command again).
                self.session.abort(&task);
                self.give_write_buffer(buffer);
                return Err(e);
            }
        }
        let solicit = command::solicitation(&command, &tracker, &self.limits);
        let pending = PendingWrite {
            write: WriteParts {
                task,
                command,
                cdb,
                buffer,
            },
            tracker,
            solicit,
        };
        match self.writes.insert(itt, pending) {
            Inserted::Complete(pending) => {
                self.start_write(pending).await;
                return Ok(());
            }
            Inserted::Collecting { recovery_r2ts } => {
                SessionStats::add(&self.session.stats.recovery_r2ts, recovery_r2ts as u64);
            }
        }
        self.solicit_and_keep(itt, DataOutProgress::Continue).await
    }

    /// Answers a command with `outcome` without executing it.
    fn answer_now(&self, task: Arc<Task>, command: ScsiCommand, outcome: CommandOutcome) {
        let guard = self.in_flight.enter();
        let session = Arc::clone(&self.session);
        let tap = self.tap.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let response = Response {
                command: &command,
                outcome,
                data_in: Gather::default(),
                residual: Residual::NONE,
                r2ts: 0,
                written: 0,
                tap: tap.as_ref(),
                hold: false,
            };
            if let Err(error) = respond(&session, &task, response).await {
                debug!(%error, "response not sent");
            }
        });
    }
}

/// A Reject with the offending header as its data (RFC 7143 11.17).
async fn reject(
    writer: &Writer,
    header: &Header,
    reason: RejectReason,
) -> Result<(), DatamoverError> {
    let mut bhs = [0u8; 48];
    header.pdu.encode_bhs(
        SegmentLengths {
            total_ahs_words: 0,
            data_segment_length: header.data_segment_length,
        },
        &mut bhs,
    );
    let reject = Reject {
        reason,
        data_sn_or_r2t_sn: 0,
        ..Reject::default()
    };
    writer.send(Pdu::Reject(reject), &bhs, Stat::Advance).await
}
