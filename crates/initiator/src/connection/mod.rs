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
//!
//! | module | owns |
//! |---|---|
//! | `tasks` | the task table: registering a task, routing a PDU to it by ITT, ending it (completed elsewhere, aborted, abandoned) |
//! | `reader` | the reader task: every PDU from the target read and dispatched; NOP-In pings answered |
//! | `data_in` | Data-In: checked against its command (DataSN, offset, length) and landed in the read's buffer |
//! | `status` | a SCSI task's end: its SCSI Response or Data-In status, sense and residual checked, a status held while Data-In is missing |
//! | `recovery` | ExpStatSN and what is lost on the way: Status, Data and R2T SNACKs and DataACK at ERL 1, the connection closed at ERL 0 |
//! | `writer` | the send side: the outbox, the writer task, the direct path ([`Sending`]), coalescing, the last write before a logout's close |
//! | `window` | the session's command window ([`CommandWindow`]), shared by its connections |
//!
//! This module keeps what they all share: the [`Connection`], the entries
//! of its task table, and its life (start, close).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use iscsi_datamover::Datamover;
use iscsi_datamover::iser::DataDescriptors;
use iscsi_datamover::tcp::PduBatch;
use iscsi_proto::pdu::{Header, ReadyToTransfer};
use iscsi_proto::serial::{CmdSn, StatSn};
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
use iscsi_proto::stat_sn::StatSns;
use reader::run_reader;
use writer::{Outbox, Wire, run_writer};

mod data_in;
mod reader;
mod recovery;
mod status;
mod tasks;
mod window;
mod writer;

pub(crate) use window::CommandWindow;
pub(crate) use writer::{POSTED_DATA_LIMIT, SendCounters, Sending};

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
    /// SCSI commands registered on this connection since it logged in.
    pub(crate) commands_registered: std::sync::atomic::AtomicU64,
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
            commands_registered: std::sync::atomic::AtomicU64::new(0),
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
}
