//! One connection in full feature phase: the only place where PDUs from
//! the target are read. A reader task per connection takes each PDU and
//! routes it by Initiator Task Tag to the task waiting for it:
//!
//! - Data-In (RFC 7143 section 11.7) lands straight in the command's own
//!   buffer through `receive_data_into`, after its DataSN, offset and
//!   length were checked against the command (section 11.7.4-11.7.5);
//!   status in the last Data-In completes the command (phase collapse,
//!   section 11.7.1).
//! - SCSI Response (11.4), R2T (11.8), Text (11.11), Task Management
//!   (11.6), Logout (11.15) and NOP-In replies (11.19) go to the waiting
//!   task through its channel; a Reject (11.17) fails the rejected task,
//!   but for a data digest error, after which the target ends the task.
//! - An unsolicited NOP-In with a Target Transfer Tag is answered with a
//!   NOP-Out echoing its tag and data (section 11.18.3).
//! - ExpStatSN (section 4.2.2.2) and the session's command window
//!   (ExpCmdSN/MaxCmdSN, section 4.2.2.1) advance from every PDU that
//!   carries them.
//!
//! Sending has two paths that keep one order on the wire:
//!
//! - Posting ([`Connection::post`], [`Connection::post_command`]): a PDU
//!   with little data is encoded, data copied, into the connection's
//!   outbox, and its task goes on at once. A writer task writes whatever
//!   the outbox holds in one system call, so the commands of all the tasks
//!   that a batch of responses woke leave together (one segment, one
//!   wake-up of the target, instead of one each). Posting never waits, so
//!   a caller that gives up on a command can never leave half a PDU.
//! - Direct ([`Connection::sending`]): a PDU with a large data segment is
//!   written from the caller's buffer without a copy, under the write
//!   lock, behind everything posted before it.
//!
//! A command's CmdSN is taken under the outbox's lock in both paths, so
//! commands leave in CmdSN order (RFC 7143 section 4.2.2.1). A direct send
//! abandoned halfway (its future dropped) breaks the connection rather than
//! leaving a partial PDU on the wire. Whatever makes the connection
//! unusable fails every outstanding task with [`TaskEvent::Lost`], handing
//! read buffers back for a retry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use iscsi_datamover::iser::DataDescriptors;
use iscsi_datamover::tcp::PduBatch;
use iscsi_datamover::{Datamover, DatamoverError, PduReceiver, PduSender, Receiver, Sender};
use iscsi_proto::error::DecodeError;
use iscsi_proto::pdu::{
    AsyncEvent, DataIn, Header, Lun, NopIn, NopOut, Pdu, RESERVED_TAG, ReadyToTransfer,
    RejectReason, ScsiResponse, ServiceResponse, SnackRequest, SnackType, TaskFunction,
};
use iscsi_proto::serial::{CmdSn, DataSn, StatSn};
use iscsi_proto::state::{
    ConnectionEvent, ConnectionState as RfcConnectionState, ConnectionStateMachine, Diagram,
    Machine,
};
use iscsi_proto::transfer::Limits;
use tokio::sync::{Notify, mpsc};

use crate::buffers::ReadBuffers;
use crate::command::{Residual, Response};
use crate::config::Coalescing;
use crate::error::Error;
use crate::stat_sn::{Arrived, StatSns};

/// What the reader task tells a waiting task.
#[derive(Debug)]
pub(crate) enum TaskEvent {
    /// An R2T for this command.
    R2t(ReadyToTransfer),
    /// The SCSI command completed (or failed in a way that ends it).
    Scsi(Result<Response, Error>),
    /// A reply PDU for a non-SCSI task (text, TMF, logout, NOP).
    Reply(Header, Vec<u8>),
    /// The target rejected the task's PDU.
    Rejected(iscsi_proto::pdu::RejectReason),
    /// The connection is gone; the read buffer, if any, comes back.
    Lost(Option<Vec<u8>>),
}

/// Where a read command's data lands.
#[derive(Debug)]
pub(crate) enum ReadInto {
    /// The caller's buffer, as long as the Expected Data Transfer Length.
    Buffer(Vec<u8>),
    /// A buffer of the session's pool, attached when data arrives, for a
    /// read of this many bytes.
    Pooled(u32),
    /// Nowhere: a read of this many bytes whose data is received, checked
    /// and dropped (a load generator's read).
    Discarded(u32),
}

/// Which of [`ReadInto`]'s destinations a read has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadMode {
    Own,
    Pooled,
    Discarded,
}

/// Where a read command's Data-In stands.
#[derive(Debug)]
struct ReadProgress {
    /// The caller's buffer; `None` while the reader is landing data in it.
    /// Empty for a pooled read until its first Data-In, and for a
    /// discarded read.
    buffer: Option<Vec<u8>>,
    /// Where the buffer comes from.
    mode: ReadMode,
    /// Expected Data Transfer Length.
    expected: u32,
    /// Bytes landed so far.
    received: u32,
    /// The DataSN expected next.
    next_data_sn: u32,
    /// The offset expected next (DataPDUInOrder).
    next_offset: u32,
    /// ERL 1: DataSNs whose data failed its digest, asked for again with a
    /// Data SNACK (RFC 7143 7.3): the task ends only once they are in.
    missing: Vec<u32>,
    /// A status that arrived while data was missing, kept until it is in.
    held: Option<HeldStatus>,
    /// That status's StatSN, not acknowledged until then.
    held_stat_sn: Option<StatSn>,
}

/// A status held back until a read's missing Data-In arrives.
#[derive(Debug)]
struct HeldStatus {
    status: u8,
    residual: Result<Residual, Error>,
    sense: Vec<u8>,
}

#[derive(Debug)]
struct TaskEntry {
    events: mpsc::UnboundedSender<TaskEvent>,
    read: Option<ReadProgress>,
    /// A SCSI command handed to the wire (counted in `in_flight`).
    sent: bool,
    /// For a SCSI command: its LUN, and its CmdSN once it has one (what a
    /// task management function's reach is judged by).
    command: Option<CommandTag>,
}

/// What task management needs to know of a SCSI command.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CommandTag {
    pub(crate) lun: u64,
    pub(crate) cmd_sn: Option<CmdSn>,
    pub(crate) registered: std::time::Instant,
}

#[derive(Debug)]
struct ConnectionState {
    tasks: HashMap<u32, TaskEntry>,
    /// SCSI commands handed to the wire whose task has not ended.
    in_flight: usize,
    /// ExpStatSN, and the statuses received past a hole (ERL 1).
    stat_sns: StatSns,
    alive: bool,
}

impl ConnectionState {
    /// Removes a task, keeping `in_flight` true.
    fn remove_task(&mut self, itt: u32) -> Option<TaskEntry> {
        let task = self.tasks.remove(&itt)?;
        if task.sent {
            self.in_flight -= 1;
        }
        Some(task)
    }

    /// Counts the task `itt` as a command at the target, numbered
    /// `cmd_sn`.
    fn mark_sent(&mut self, itt: u32, cmd_sn: CmdSn) {
        if let Some(task) = self.tasks.get_mut(&itt) {
            if let Some(command) = &mut task.command {
                command.cmd_sn = Some(cmd_sn);
            }
            if !task.sent {
                task.sent = true;
                self.in_flight += 1;
            }
        }
    }
}

/// PDUs posted and not yet taken for writing.
#[derive(Debug)]
struct Outbox {
    batch: PduBatch,
    /// Something that must not wait (anything but a new command) is in
    /// the batch.
    urgent: bool,
}

impl Outbox {
    /// Moves the posted PDUs to the end of `writing`.
    fn take_into(&mut self, writing: &mut PduBatch) {
        writing.append(&mut self.batch);
        self.urgent = false;
    }
}

/// The session's command window (RFC 7143 section 4.2.2.1), shared by its
/// connections.
#[derive(Debug)]
pub(crate) struct CommandWindow {
    state: Mutex<WindowState>,
    /// Woken when MaxCmdSN moves.
    opened: Notify,
}

#[derive(Clone, Copy, Debug)]
struct WindowState {
    /// The CmdSN the next non-immediate command takes.
    next: CmdSn,
    exp: CmdSn,
    max: CmdSn,
}

impl CommandWindow {
    /// A window as a login left it.
    pub(crate) fn new(exp: CmdSn, max: CmdSn) -> Self {
        CommandWindow {
            state: Mutex::new(WindowState {
                next: exp,
                exp,
                max,
            }),
            opened: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, WindowState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Restarts the window after a session reinstatement.
    pub(crate) fn reset(&self, exp: CmdSn, max: CmdSn) {
        *self.lock() = WindowState {
            next: exp,
            exp,
            max,
        };
        self.opened.notify_waiters();
    }

    /// Takes in ExpCmdSN and MaxCmdSN from a target PDU; ignored if
    /// MaxCmdSN < ExpCmdSN - 1 or if older than what we have (4.2.2.1).
    pub(crate) fn update(&self, exp: CmdSn, max: CmdSn) {
        if max.next().lt(exp) {
            return;
        }
        let mut state = self.lock();
        let mut moved = false;
        if exp.gt(state.exp) {
            state.exp = exp;
        }
        if max.gt(state.max) {
            state.max = max;
            moved = true;
        }
        drop(state);
        if moved {
            self.opened.notify_waiters();
        }
    }

    /// Whether a non-immediate command may be sent now.
    pub(crate) fn is_open(&self) -> bool {
        let state = self.lock();
        state.next.le(state.max)
    }

    /// Takes the next CmdSN if the window has room.
    pub(crate) fn take(&self) -> Option<CmdSn> {
        let mut state = self.lock();
        if state.next.le(state.max) {
            let sn = state.next;
            state.next = sn.next();
            Some(sn)
        } else {
            None
        }
    }

    /// The CmdSN an immediate PDU carries (not advanced, section 3.2.2.1).
    pub(crate) fn current(&self) -> CmdSn {
        self.lock().next
    }

    /// Waits until the window may have room (re-check with [`Self::take`]).
    pub(crate) async fn wait_open(&self) {
        loop {
            let notified = self.opened.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_open() {
                return;
            }
            notified.await;
        }
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
    /// Data SNACKs sent for Data-In lost to digest errors (ERL 1).
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
struct Wire {
    sender: Sender,
    /// The PDUs being written (taken from the outbox); empty between
    /// writes.
    writing: PduBatch,
    counters: Arc<SendCounters>,
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

/// One full feature phase connection.
#[derive(Debug)]
pub(crate) struct Connection {
    /// The CID (section 13.2 / 11.12.8).
    pub(crate) cid: u16,
    /// The transfer limits negotiated on this connection.
    pub(crate) limits: Limits,
    /// ErrorRecoveryLevel 1 or more: a Data-In whose data digest fails is
    /// asked for again with a SNACK instead of ending the connection.
    recovers_data: bool,
    /// Data-In PDUs arrive one by one, so a status's ExpDataSN can be
    /// checked against them: over TCP. Over iSER the data is placed by RDMA
    /// Writes the initiator does not see one by one (RFC 7145 7.3.5).
    sees_data_ins: bool,
    /// The write lock: the stream, held by the writer task or a direct send.
    wire: tokio::sync::Mutex<Wire>,
    /// Counts the SNACKs sent (the session's send counters).
    snacks: Arc<SendCounters>,
    /// PDUs posted and not yet taken for writing, in wire order.
    outbox: Mutex<Outbox>,
    /// When new commands may wait for others.
    coalescing: Coalescing,
    /// Woken when a PDU is posted.
    posted: Notify,
    /// Woken when the connection closes: the reader and the writer stop.
    closed: Notify,
    state: Mutex<ConnectionState>,
    window: Arc<CommandWindow>,
    /// The session's read buffers, for pooled reads.
    buffers: Arc<ReadBuffers>,
    closing: AtomicBool,
    /// Set once we close on purpose (logout): the end of the stream is
    /// then expected, not a loss.
    finished: AtomicBool,
    /// The connection's state (RFC 7143 8.1, 8.2).
    lifecycle: Mutex<ConnectionStateMachine>,
    /// Where a write's data is described before its command, for a
    /// transport that fetches it (iSER); a no-op over TCP.
    pub(crate) descriptors: DataDescriptors,
    /// Over iSER: one permit per command awaiting its response, as many as
    /// the connection has receive buffers for its responses.
    pub(crate) response_slots: Option<Arc<tokio::sync::Semaphore>>,
}

/// Applies `event` to a section 8 state machine and traces the RFC's
/// transition; `cid` is the connection's (`None` for the session). An
/// event the RFC does not allow is a bug here, reported (and fatal in
/// debug builds) with the state left as it was.
pub(crate) fn record_transition<D: Diagram>(
    machine: &mut Machine<D>,
    event: D::Event,
    cid: Option<u16>,
) {
    match machine.handle(event) {
        Ok(t) => {
            tracing::debug!(?cid, transition = t.label, from = %t.from, to = %t.to, "{} state", D::NAME)
        }
        Err(error) => {
            tracing::warn!(?cid, %error, "state machine");
            debug_assert!(false, "{error}");
        }
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

/// What a session's connections share with it.
#[derive(Clone, Debug)]
pub(crate) struct SessionShared {
    /// The command window (one per session, RFC 7143 section 4.2.2.1).
    pub(crate) window: Arc<CommandWindow>,
    /// Buffers for pooled reads.
    pub(crate) buffers: Arc<ReadBuffers>,
    /// What the connections sent.
    pub(crate) sends: Arc<SendCounters>,
    /// When new commands may wait for others.
    pub(crate) coalescing: Coalescing,
    /// The session's ErrorRecoveryLevel.
    pub(crate) error_recovery_level: u8,
}

impl Connection {
    /// Starts the reader and writer tasks over `datamover`.
    pub(crate) fn start(
        cid: u16,
        limits: Limits,
        exp_stat_sn: StatSn,
        datamover: Datamover,
        shared: SessionShared,
        lifecycle: ConnectionStateMachine,
    ) -> Arc<Connection> {
        let descriptors = datamover.descriptors();
        let response_slots = descriptors
            .commands_in_flight()
            .map(|n| Arc::new(tokio::sync::Semaphore::new(n)));
        let (receiver, sender) = datamover.split();
        let SessionShared {
            window,
            buffers,
            sends,
            coalescing,
            error_recovery_level,
        } = shared;
        let digests = sender.digests();
        let snacks = Arc::clone(&sends);
        let connection = Arc::new(Connection {
            cid,
            limits,
            recovers_data: error_recovery_level >= 1,
            sees_data_ins: !descriptors.wanted(),
            snacks,
            wire: tokio::sync::Mutex::new(Wire {
                sender,
                writing: PduBatch::new(digests),
                counters: sends,
            }),
            outbox: Mutex::new(Outbox {
                batch: PduBatch::new(digests),
                urgent: false,
            }),
            coalescing,
            posted: Notify::new(),
            closed: Notify::new(),
            state: Mutex::new(ConnectionState {
                tasks: HashMap::new(),
                in_flight: 0,
                stat_sns: StatSns::new(exp_stat_sn),
                alive: true,
            }),
            window,
            buffers,
            closing: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            lifecycle: Mutex::new(lifecycle),
            descriptors,
            response_slots,
        });
        tokio::spawn(run_reader(connection.clone(), receiver));
        tokio::spawn(run_writer(connection.clone()));
        connection
    }

    fn lock(&self) -> MutexGuard<'_, ConnectionState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_outbox(&self) -> MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a connection event (RFC 7143 8.1, 8.2).
    pub(crate) fn record(&self, event: ConnectionEvent) {
        let mut lifecycle = self
            .lifecycle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        record_transition(&mut lifecycle, event, Some(self.cid));
    }

    /// The connection's RFC 7143 state.
    pub(crate) fn rfc_state(&self) -> RfcConnectionState {
        self.lifecycle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .state()
    }

    /// Whether the connection can still carry commands.
    pub(crate) fn is_alive(&self) -> bool {
        self.lock().alive
    }

    /// The ExpStatSN our next PDU carries.
    pub(crate) fn exp_stat_sn(&self) -> StatSn {
        self.lock().stat_sns.expected()
    }

    /// The session's command window.
    pub(crate) fn window(&self) -> &CommandWindow {
        &self.window
    }

    /// Registers a task under `itt`; `read` says where a read's data lands,
    /// `lun` is a SCSI command's.
    pub(crate) fn register(
        &self,
        itt: u32,
        read: Option<ReadInto>,
        lun: Option<u64>,
    ) -> Result<mpsc::UnboundedReceiver<TaskEvent>, (Error, Option<Vec<u8>>)> {
        let (events, receiver) = mpsc::unbounded_channel();
        let mut state = self.lock();
        if !state.alive {
            let buffer = match read {
                Some(ReadInto::Buffer(buffer)) => Some(buffer),
                _ => None,
            };
            return Err((Error::ConnectionLost, buffer));
        }
        let read = read.map(|read| {
            let (buffer, expected, mode) = match read {
                ReadInto::Buffer(buffer) => {
                    let expected = buffer.len() as u32;
                    (buffer, expected, ReadMode::Own)
                }
                ReadInto::Pooled(expected) => (Vec::new(), expected, ReadMode::Pooled),
                ReadInto::Discarded(expected) => (Vec::new(), expected, ReadMode::Discarded),
            };
            ReadProgress {
                buffer: Some(buffer),
                mode,
                expected,
                received: 0,
                next_data_sn: 0,
                next_offset: 0,
                missing: Vec::new(),
                held: None,
                held_stat_sn: None,
            }
        });
        state.tasks.insert(
            itt,
            TaskEntry {
                events,
                read,
                sent: false,
                command: lun.map(|lun| CommandTag {
                    lun,
                    cmd_sn: None,
                    registered: std::time::Instant::now(),
                }),
            },
        );
        Ok(receiver)
    }

    /// The SCSI commands at the target (sent, not ended), by ITT.
    pub(crate) fn commands(&self) -> Vec<(u32, CommandTag)> {
        self.lock()
            .tasks
            .iter()
            .filter_map(|(&itt, task)| Some((itt, task.command?)))
            .filter(|(_, command)| command.cmd_sn.is_some())
            .collect()
    }

    /// Ends the SCSI commands `aborted` picks with [`Error::Aborted`]: a
    /// task management function the target completed ended them there,
    /// and no status of theirs will come (RFC 7143 11.6.2). Returns how
    /// many.
    pub(crate) fn end_aborted(
        &self,
        function: TaskFunction,
        aborted: impl Fn(u32, &CommandTag) -> bool,
    ) -> usize {
        let ended: Vec<(u32, TaskEntry)> = {
            let mut state = self.lock();
            let itts: Vec<u32> = state
                .tasks
                .iter()
                .filter(|(itt, task)| task.command.is_some_and(|c| aborted(**itt, &c)))
                .map(|(&itt, _)| itt)
                .collect();
            itts.into_iter()
                .filter_map(|itt| Some((itt, state.remove_task(itt)?)))
                .collect()
        };
        let count = ended.len();
        for (itt, task) in ended {
            self.descriptors.forget(itt);
            let _ = task
                .events
                .send(TaskEvent::Scsi(Err(Error::Aborted(function))));
        }
        if count > 0 && !self.lock_outbox().batch.is_empty() {
            self.posted.notify_one();
        }
        count
    }

    /// Forgets a task (completed elsewhere, timed out or abandoned); its
    /// read buffer, if the reader is not landing data in it right now.
    pub(crate) fn unregister(&self, itt: u32) -> Option<Vec<u8>> {
        self.descriptors.forget(itt);
        self.end_task(itt)
            .and_then(|t| t.read.and_then(|r| r.buffer))
    }

    /// Removes the task `itt` from the table. Fewer commands may then be
    /// at the target, so commands held back may have to leave now: the
    /// writer is woken if any are posted.
    fn end_task(&self, itt: u32) -> Option<TaskEntry> {
        let task = self.lock().remove_task(itt);
        if !self.lock_outbox().batch.is_empty() {
            self.posted.notify_one();
        }
        task
    }

    /// Whether the writer should write what is posted now, rather than
    /// hold new commands back for others (see [`Coalescing`]).
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

    /// Resolves once the connection is closed.
    async fn closed(&self) {
        loop {
            let notified = self.closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.is_alive() {
                return;
            }
            notified.await;
        }
    }

    /// Makes the connection unusable: the reader stops and every
    /// outstanding task gets [`TaskEvent::Lost`].
    pub(crate) fn close(&self) {
        let tasks = {
            let mut state = self.lock();
            state.alive = false;
            state.in_flight = 0;
            std::mem::take(&mut state.tasks)
        };
        for (_, task) in tasks {
            let buffer = task.read.and_then(|r| r.buffer);
            let _ = task.events.send(TaskEvent::Lost(buffer));
        }
        if !self.closing.swap(true, Ordering::SeqCst) {
            self.closed.notify_waiters();
        }
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

    /// Takes note of a status's StatSN. One past ExpStatSN means statuses
    /// between were lost (a header digest error, RFC 7143 7.9): at ERL 1 a
    /// Status SNACK asks for them again; at ERL 0 their commands would
    /// wait forever, so the connection is closed and they are retried on a
    /// reinstated session.
    fn advance_stat_sn(&self, stat_sn: StatSn) {
        self.note_stat_sn(stat_sn, false);
    }

    /// Takes note of the StatSN of task `itt`'s status: a read still
    /// missing Data-In holds it unacknowledged (`StatSns`) until the data
    /// is in, or the target would drop the data a SNACK asks for.
    fn status_arrived(&self, itt: u32, stat_sn: StatSn) {
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

    /// Sends `event` to the task `itt`; `remove` when it ends the task.
    fn route(&self, itt: u32, event: TaskEvent, remove: bool) {
        let sender = if remove {
            self.end_task(itt).map(|t| t.events)
        } else {
            self.lock().tasks.get(&itt).map(|t| t.events.clone())
        };
        match sender {
            Some(events) => {
                let _ = events.send(event);
            }
            None => tracing::debug!(itt, "reply for a task no longer waiting"),
        }
    }

    /// A Data-In PDU: check it against the command, land its data in the
    /// command's buffer, complete the command if it carries status.
    async fn data_in(
        &self,
        data_in: DataIn,
        length: u32,
        receiver: &mut Receiver,
    ) -> Result<(), Error> {
        self.window.update(data_in.exp_cmd_sn, data_in.max_cmd_sn);
        let itt = data_in.initiator_task_tag;
        enum Plan {
            /// Into this buffer at this offset; for a pooled read still
            /// without its buffer, the length of the one to attach.
            Land(Vec<u8>, usize, Option<usize>),
            /// A discarded read's data at this offset: through a scratch
            /// buffer of the pool (the read's own empty one is kept).
            Scratch(Vec<u8>, usize),
            Discard,
            Fail(Error),
            /// Lost PDUs that ERL 0 cannot ask for again: the connection
            /// ends and its commands are retried.
            Drop(Error),
        }
        let data_sn = data_in.data_sn.get();
        let mut again = false;
        let mut gap = None;
        let plan = {
            let mut state = self.lock();
            match state.tasks.get_mut(&itt) {
                None => Plan::Discard,
                Some(TaskEntry { read: None, .. }) => Plan::Fail(Error::Protocol(
                    "Data-In for a command that reads nothing".to_owned(),
                )),
                Some(TaskEntry {
                    read: Some(read), ..
                }) => check_data_in(
                    read,
                    &data_in,
                    length,
                    self.limits.data_pdu_in_order,
                    self.recovers_data,
                )
                .map_or_else(Plan::Fail, |(start, arrival)| {
                    if arrival == Arrival::Duplicate {
                        return Plan::Discard;
                    }
                    again = arrival == Arrival::Again;
                    if let Arrival::AfterGap(first) = arrival {
                        if !self.recovers_data {
                            return Plan::Drop(Error::Protocol(format!(
                                "Data-In DataSN {first} to {} lost at ERL 0",
                                data_sn.wrapping_sub(1)
                            )));
                        }
                        read.missing.extend(first..data_sn);
                        gap = Some((first, data_sn - first));
                    }
                    match read.buffer.take() {
                        Some(buffer) => {
                            let expected = read.expected as usize;
                            match read.mode {
                                ReadMode::Discarded => Plan::Scratch(buffer, start),
                                ReadMode::Pooled if buffer.len() != expected => {
                                    Plan::Land(buffer, start, Some(expected))
                                }
                                ReadMode::Own | ReadMode::Pooled => Plan::Land(buffer, start, None),
                            }
                        }
                        None => Plan::Discard,
                    }
                }),
            }
        };
        let landing = Landing {
            itt,
            data_sn,
            length,
            again,
        };
        match plan {
            Plan::Land(mut buffer, start, attach) => {
                if let Some(expected) = attach {
                    buffer = self.buffers.take(expected, !self.limits.data_pdu_in_order);
                }
                let end = start + length as usize;
                let landed = receiver.receive_data_into(&mut buffer[start..end]).await;
                self.landed(landing, buffer, end, landed)?;
            }
            Plan::Scratch(own, start) => {
                let mut scratch = self.buffers.take(length as usize, false);
                let landed = receiver.discard_data(&mut scratch).await;
                self.buffers.give(scratch);
                self.landed(landing, own, start + length as usize, landed)?;
            }
            Plan::Discard => {
                match receiver.receive_data().await {
                    // Data nobody waits for (a duplicate, a task gone):
                    // at ERL 1 its digest error costs nothing.
                    Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. }))
                        if self.recovers_data => {}
                    other => {
                        other?;
                    }
                }
                if !self.lock().tasks.contains_key(&itt) {
                    tracing::debug!(itt, "Data-In for a task no longer waiting");
                }
            }
            Plan::Fail(error) => {
                receiver.receive_data().await?;
                self.fail_scsi(itt, error);
                return Ok(());
            }
            Plan::Drop(error) => {
                receiver.receive_data().await?;
                tracing::warn!(itt, %error, "closing the connection");
                return Err(error);
            }
        }
        if let Some((first, count)) = gap {
            tracing::warn!(itt, first, count, "Data-In missing: Data SNACK");
            self.snack(SnackType::DataR2t, itt, first, count);
        }
        if data_in.acknowledge && self.recovers_data {
            self.acknowledge_data(itt, &data_in);
        }
        if let Some(status) = data_in.status {
            self.status_arrived(itt, data_in.stat_sn);
            if !data_in.final_flag {
                self.fail_scsi(
                    itt,
                    Error::Protocol("Data-In with status but no F bit".into()),
                );
                return Ok(());
            }
            let residual = residual(
                data_in.residual_overflow,
                data_in.residual_underflow,
                data_in.residual_count,
            );
            self.complete_scsi(itt, status, residual, Vec::new());
        }
        Ok(())
    }

    /// Gives a read its buffer back once a Data-In's data has been taken
    /// off the stream (`end` is where it ends in the buffer), and notes how
    /// that went. At ERL 1 a data digest error only loses that PDU's data:
    /// a Data SNACK asks for it again (RFC 7143 7.3, 11.16), and a task
    /// whose status came meanwhile ends when the last missing PDU is in.
    fn landed(
        &self,
        landing: Landing,
        buffer: Vec<u8>,
        end: usize,
        outcome: Result<(), DatamoverError>,
    ) -> Result<(), Error> {
        let Landing {
            itt,
            data_sn,
            length,
            again,
        } = landing;
        let lost = match &outcome {
            Ok(()) => false,
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. }))
                if self.recovers_data =>
            {
                true
            }
            Err(_) => false,
        };
        let mut complete = None;
        let mut ask_again = None;
        {
            let mut state = self.lock();
            if let Some(TaskEntry {
                read: Some(read), ..
            }) = state.tasks.get_mut(&itt)
            {
                read.buffer = Some(buffer);
                if !again {
                    read.next_data_sn = data_sn.wrapping_add(1);
                    read.next_offset = read.next_offset.max(end as u32);
                }
                if lost {
                    if !read.missing.contains(&data_sn) {
                        read.missing.push(data_sn);
                    }
                    // The last PDU of the read is asked for as "all from
                    // BegRun" (RunLength 0): LIO refuses a RunLength that
                    // reaches its last DataSN (Linux 6.1,
                    // iscsit_handle_recovery_datain counts one short).
                    let last = end as u32 >= read.expected;
                    ask_again = Some(if last { 0 } else { 1 });
                } else if outcome.is_ok() {
                    read.received += length;
                    read.missing.retain(|&sn| sn != data_sn);
                    if read.missing.is_empty() {
                        complete = read.held.take();
                        if let Some(stat_sn) = read.held_stat_sn.take() {
                            state.stat_sns.release(stat_sn);
                        }
                    }
                }
            }
        }
        if let Some(run_length) = ask_again {
            tracing::warn!(
                itt,
                data_sn,
                "Data-In data digest error: asking for it again"
            );
            self.snack(SnackType::DataR2t, itt, data_sn, run_length);
            return Ok(());
        }
        if let Some(held) = complete {
            tracing::info!(
                itt,
                "missing Data-In arrived: the held status completes the task"
            );
            self.complete_scsi(itt, held.status, held.residual, held.sense);
        }
        outcome.map_err(Error::from)
    }

    /// Answers a Data-In with the A bit (RFC 7143 11.7.2): unless data
    /// before it is missing, a DataACK SNACK whose BegRun is the next DataSN
    /// expected, with the Data-In's LUN and Target Transfer Tag (11.16).
    fn acknowledge_data(&self, itt: u32, data_in: &DataIn) {
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
    fn snack(&self, snack_type: SnackType, itt: u32, beg_run: u32, run_length: u32) {
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

    fn fail_scsi(&self, itt: u32, error: Error) {
        tracing::warn!(itt, %error, "command failed");
        self.route(itt, TaskEvent::Scsi(Err(error)), true);
    }

    /// Ends a SCSI task with its status, checking the residual against the
    /// data that arrived (RFC 7143 section 11.4.5).
    fn complete_scsi(
        &self,
        itt: u32,
        status: u8,
        residual: Result<Residual, Error>,
        sense: Vec<u8>,
    ) {
        {
            let mut state = self.lock();
            if let Some(TaskEntry {
                read: Some(read), ..
            }) = state.tasks.get_mut(&itt)
                && !read.missing.is_empty()
            {
                tracing::info!(itt, missing = ?read.missing, "status before missing Data-In: held");
                read.held = Some(HeldStatus {
                    status,
                    residual,
                    sense,
                });
                return;
            }
        }
        let Some(task) = self.end_task(itt) else {
            tracing::debug!(itt, "status for a task no longer waiting");
            return;
        };
        let outcome = residual.and_then(|residual| {
            let mut response = Response {
                status,
                sense,
                residual,
                ..Response::default()
            };
            if let Some(read) = task.read {
                let buffer = read
                    .buffer
                    .ok_or_else(|| Error::Protocol("status while data was landing".into()))?;
                if status == crate::command::STATUS_GOOD {
                    let expected_received = match residual {
                        Residual::None | Residual::Overflow(_) => Some(read.expected),
                        Residual::Underflow(n) => read.expected.checked_sub(n),
                    };
                    if expected_received != Some(read.received) {
                        return Err(Error::Protocol(format!(
                            "residual {residual:?} does not match: {} of {} bytes received",
                            read.received, read.expected
                        )));
                    }
                }
                response.data = buffer;
                if read.mode == ReadMode::Pooled {
                    // Only as far as the data reached: the rest of a reused
                    // buffer holds an earlier read's bytes.
                    response.data.truncate(read.next_offset as usize);
                }
                response.received = read.received;
            }
            Ok(response)
        });
        let _ = task.events.send(TaskEvent::Scsi(outcome));
    }

    fn scsi_response(&self, response: ScsiResponse, data: Vec<u8>) -> Result<(), Error> {
        self.window.update(response.exp_cmd_sn, response.max_cmd_sn);
        let itt = response.initiator_task_tag;
        // ExpDataSN past the Data-In received: the last ones were lost
        // (RFC 7143 7.9). ERL 1 asks for them (and the status waits for
        // them); ERL 0 ends the connection and retries the command.
        let tail = {
            let mut state = self.lock();
            match state.tasks.get_mut(&itt) {
                Some(TaskEntry {
                    read: Some(read), ..
                }) if self.sees_data_ins
                    && DataSn::new(read.next_data_sn).lt(response.exp_data_sn) =>
                {
                    let (first, end) = (read.next_data_sn, response.exp_data_sn.get());
                    if self.recovers_data {
                        read.missing.extend(first..end);
                        read.next_data_sn = end;
                    }
                    Some((first, end - first))
                }
                _ => None,
            }
        };
        if let Some((first, count)) = tail {
            if !self.recovers_data {
                return Err(Error::Protocol(format!(
                    "{count} Data-In from DataSN {first} lost at ERL 0"
                )));
            }
            tracing::warn!(itt, first, count, "last Data-In missing: Data SNACK");
        }
        self.status_arrived(itt, response.stat_sn);
        if let Some((first, _)) = tail {
            // Everything from `first` on is missing: RunLength 0, "all".
            self.snack(SnackType::DataR2t, itt, first, 0);
        }
        if response.response != ServiceResponse::CommandCompleted {
            self.fail_scsi(itt, Error::TargetFailure(response.response.to_u8()));
            return Ok(());
        }
        let sense = match data.len() {
            0 => Vec::new(),
            1 => {
                self.fail_scsi(itt, Error::Protocol("truncated sense length".into()));
                return Ok(());
            }
            _ => {
                let length = usize::from(u16::from_be_bytes([data[0], data[1]]));
                match data.get(2..2 + length) {
                    Some(sense) => sense.to_vec(),
                    None => {
                        self.fail_scsi(
                            itt,
                            Error::Protocol("sense longer than its segment".into()),
                        );
                        return Ok(());
                    }
                }
            }
        };
        let residual = residual(
            response.residual_overflow,
            response.residual_underflow,
            response.residual_count,
        );
        self.complete_scsi(itt, response.status, residual, sense);
        Ok(())
    }

    /// Answers a target's ping (RFC 7143 section 11.18.3).
    fn answer_ping(&self, nop: NopIn, data: Vec<u8>) {
        let header = Header::new(
            Pdu::NopOut(NopOut {
                immediate: true,
                lun: nop.lun,
                initiator_task_tag: RESERVED_TAG,
                target_transfer_tag: nop.target_transfer_tag,
                cmd_sn: self.window.current(),
                exp_stat_sn: self.exp_stat_sn(),
            }),
            data.len() as u32,
        );
        if let Err(error) = self.post(&header, &data) {
            tracing::debug!(%error, "answering a NOP-In failed");
        }
    }
}

/// How a Data-In's DataSN stands to what came before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrival {
    /// The next one.
    Next,
    /// One missing before, sent again for a SNACK.
    Again,
    /// Past a gap: the DataSNs from this one up to it were lost (RFC 7143
    /// 7.9: a header digest error, or a PDU dropped on the way).
    AfterGap(u32),
    /// At ERL 1, one received already (a SNACK's answer can repeat some).
    Duplicate,
}

/// Checks one Data-In against its command; returns where its data goes,
/// and how its DataSN stands.
fn check_data_in(
    read: &ReadProgress,
    data_in: &DataIn,
    length: u32,
    in_order: bool,
    recovering: bool,
) -> Result<(usize, Arrival), Error> {
    let data_sn = data_in.data_sn.get();
    let arrival = if data_sn == read.next_data_sn {
        Arrival::Next
    } else if read.missing.contains(&data_sn) {
        Arrival::Again
    } else if DataSn::new(data_sn).gt(DataSn::new(read.next_data_sn)) {
        Arrival::AfterGap(read.next_data_sn)
    } else if recovering {
        // Already here: sent again for a SNACK that asked for more than
        // was missing.
        Arrival::Duplicate
    } else {
        return Err(Error::Protocol(format!(
            "Data-In DataSN {data_sn} where {} was expected",
            read.next_data_sn
        )));
    };
    data_in
        .buffer_offset
        .checked_add(length)
        .filter(|&end| end <= read.expected)
        .ok_or_else(|| {
            Error::Protocol(format!(
                "Data-In at {}+{length} beyond the {}-byte buffer",
                data_in.buffer_offset, read.expected
            ))
        })?;
    if in_order && arrival == Arrival::Next && data_in.buffer_offset != read.next_offset {
        return Err(Error::Protocol(format!(
            "Data-In at offset {} where {} was expected",
            data_in.buffer_offset, read.next_offset
        )));
    }
    Ok((data_in.buffer_offset as usize, arrival))
}

/// One Data-In's data being taken off the stream.
struct Landing {
    itt: u32,
    data_sn: u32,
    length: u32,
    /// Sent again for a SNACK.
    again: bool,
}

fn residual(overflow: bool, underflow: bool, count: u32) -> Result<Residual, Error> {
    match (overflow, underflow) {
        (false, false) => Ok(Residual::None),
        (true, false) => Ok(Residual::Overflow(count)),
        (false, true) => Ok(Residual::Underflow(count)),
        (true, true) => Err(Error::Protocol(
            "both residual overflow and underflow".into(),
        )),
    }
}

async fn run_reader(connection: Arc<Connection>, mut receiver: Receiver) {
    let result = tokio::select! {
        result = read_loop(&connection, &mut receiver) => result,
        () = connection.closed() => Ok(()),
    };
    if let Err(error) = result
        && !connection.finished.load(Ordering::SeqCst)
    {
        tracing::warn!(cid = connection.cid, %error, "connection lost");
    }
    // Not ended by a logout, the connection failed (T15, T16, T17). ERL 0
    // keeps nothing of it for a cleanup: its tasks go back to the session,
    // which reinstates itself (M1).
    match connection.rfc_state() {
        RfcConnectionState::Free => {}
        RfcConnectionState::CleanupWait => connection.record(ConnectionEvent::CleanupTimedOut),
        _ => {
            connection.record(ConnectionEvent::TransportLost);
            connection.record(ConnectionEvent::CleanupTimedOut);
        }
    }
    connection.close();
}

/// The writer task: writes what is posted, all of it at once. Woken by the
/// first post after a write; the tasks made ready together with that
/// poster run before it and post theirs too, so one write carries them
/// all. Ends when the connection closes.
async fn run_writer(connection: Arc<Connection>) {
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

async fn read_loop(connection: &Arc<Connection>, receiver: &mut Receiver) -> Result<(), Error> {
    loop {
        let Some(header) = receiver.receive_header().await? else {
            return Err(Error::ConnectionLost);
        };
        let length = header.data_segment_length;
        match header.pdu {
            Pdu::DataIn(data_in) => connection.data_in(data_in, length, receiver).await?,
            Pdu::ScsiResponse(response) => {
                let data = receiver.receive_data().await?;
                connection.scsi_response(response, data)?;
            }
            Pdu::ReadyToTransfer(r2t) => {
                if length != 0 {
                    return Err(Error::Protocol("R2T with a data segment".into()));
                }
                connection.window.update(r2t.exp_cmd_sn, r2t.max_cmd_sn);
                connection.route(r2t.initiator_task_tag, TaskEvent::R2t(r2t), false);
            }
            Pdu::NopIn(ref nop) => {
                let nop = nop.clone();
                let data = receiver.receive_data().await?;
                connection.window.update(nop.exp_cmd_sn, nop.max_cmd_sn);
                if nop.initiator_task_tag == RESERVED_TAG {
                    // Unsolicited: StatSN is not advanced (11.19.2).
                    if nop.target_transfer_tag != RESERVED_TAG {
                        connection.answer_ping(nop, data);
                    }
                } else {
                    connection.advance_stat_sn(nop.stat_sn);
                    connection.route(nop.initiator_task_tag, TaskEvent::Reply(header, data), true);
                }
            }
            Pdu::TextResponse(ref text) => {
                let (itt, stat_sn, exp, max) = (
                    text.initiator_task_tag,
                    text.stat_sn,
                    text.exp_cmd_sn,
                    text.max_cmd_sn,
                );
                let data = receiver.receive_data().await?;
                connection.advance_stat_sn(stat_sn);
                connection.window.update(exp, max);
                connection.route(itt, TaskEvent::Reply(header, data), false);
            }
            Pdu::TaskManagementResponse(ref tmf) => {
                let (itt, stat_sn, exp, max) = (
                    tmf.initiator_task_tag,
                    tmf.stat_sn,
                    tmf.exp_cmd_sn,
                    tmf.max_cmd_sn,
                );
                let data = receiver.receive_data().await?;
                connection.advance_stat_sn(stat_sn);
                connection.window.update(exp, max);
                connection.route(itt, TaskEvent::Reply(header, data), true);
            }
            Pdu::LogoutResponse(ref logout) => {
                // Only a logout of this connection or its session puts it
                // in IN_LOGOUT; one removing another connection for
                // recovery (ERL 2) leaves this one as it was.
                if connection.rfc_state() == RfcConnectionState::InLogout {
                    use iscsi_proto::pdu::LogoutResponseCode::ClosedSuccessfully;
                    if logout.response == ClosedSuccessfully {
                        // The target closes the connection next: its end
                        // of stream is expected, not a loss.
                        connection.finished.store(true, Ordering::SeqCst);
                        connection.record(ConnectionEvent::LogoutSucceeded);
                    } else {
                        connection.record(ConnectionEvent::LogoutFailed);
                    }
                }
                let (itt, stat_sn, exp, max) = (
                    logout.initiator_task_tag,
                    logout.stat_sn,
                    logout.exp_cmd_sn,
                    logout.max_cmd_sn,
                );
                let data = receiver.receive_data().await?;
                connection.advance_stat_sn(stat_sn);
                connection.window.update(exp, max);
                connection.route(itt, TaskEvent::Reply(header, data), true);
            }
            Pdu::Reject(reject) => {
                let data = receiver.receive_data().await?;
                connection.advance_stat_sn(reject.stat_sn);
                connection
                    .window
                    .update(reject.exp_cmd_sn, reject.max_cmd_sn);
                // The data segment is the rejected PDU's header (11.17.3).
                let itt = data
                    .get(16..20)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                tracing::warn!(reason = ?reject.reason, ?itt, "target rejected a PDU");
                // Data lost to a data digest error (a Data-Out, or a
                // command's immediate data) does not end its task: the
                // target processes the rest, asks for the data again with a
                // recovery R2T or ends the task with a status (RFC 7143
                // 7.8, 11.17.1 note 1), which the task waits for.
                let carries_data = matches!(data.first().map(|b| b & 0x3f), Some(0x01 | 0x05));
                let awaits_target = carries_data && reject.reason == RejectReason::DataDigestError;
                if let (Some(itt), false) = (itt, awaits_target) {
                    connection.route(itt, TaskEvent::Rejected(reject.reason), true);
                }
            }
            Pdu::AsyncMessage(message) => {
                receiver.receive_data().await?;
                connection.advance_stat_sn(message.stat_sn);
                connection
                    .window
                    .update(message.exp_cmd_sn, message.max_cmd_sn);
                match message.async_event {
                    AsyncEvent::LogoutRequest
                    | AsyncEvent::ConnectionDrop
                    | AsyncEvent::AllConnectionsDrop => {
                        if message.async_event == AsyncEvent::LogoutRequest {
                            // T11 (T12, T14 when asked again).
                            connection.record(ConnectionEvent::LogoutRequestedByTarget);
                        }
                        // ERL 0: leave, and let the session reinstate
                        // itself and retry (section 11.9.1).
                        tracing::info!(event = ?message.async_event, "target asks us to leave");
                        return Ok(());
                    }
                    event => tracing::debug!(?event, "asynchronous message"),
                }
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {:?} from the target",
                    other.opcode()
                )));
            }
        }
    }
}
