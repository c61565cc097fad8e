//! Sessions: the state a session's connections share: the CmdSN window and
//! the task table (RFC 7143 sections 4.2.2.1, 6.3, 11.12), its connections
//! by CID, its lifecycle (RFC 7143 8.3) and counters. How a connection
//! logs in and joins or starts a session is `serve.rs`; the table of
//! running sessions is `registry.rs`.
//!
//! ErrorRecoveryLevel 0: a session ends when its last connection ends, and
//! a new leading login with the same initiator name and ISID reinstates it
//! (the old session's connections are closed and its tasks aborted, RFC
//! 7143 section 6.3.5).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use iscsi_proto::login::target::LoginComplete;
use iscsi_proto::pdu::Digests;
use iscsi_proto::serial::CmdSn;
use iscsi_proto::state::{Diagram, Machine, SessionEvent, SessionStateMachine};
use iscsi_proto::text::NegotiatedParameters;
use iscsi_scsi::{Nexus, ScsiTarget};
use iscsi_target_core::{Arriving, CommandWindow, Gaps, Refusal, SessionTasks, TaskHandle};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use crate::metrics::stats::{SessionLabels, SessionStats};
use crate::metrics::{Enrolled, Metrics};
use crate::recovery::{Orphan, Orphans};
use crate::task::Allegiance;
pub(crate) use crate::task::Task;
use crate::writer::{CmdWindow, Writer};

/// How long a login that reinstates a connection waits for the old one to
/// end (it closes at once unless a command is being received into it).
pub(crate) const CID_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The connection holding a CID.
struct CidHolder {
    number: u64,
    /// What status shows of it.
    about: ConnectionAbout,
    close: watch::Sender<bool>,
    /// Closed (its sender dropped) when the connection has ended.
    ended: watch::Receiver<bool>,
}

impl CidHolder {
    async fn close_and_wait(self) {
        Self::signal_and_wait(&self.close, self.ended).await;
    }

    async fn signal_and_wait(close: &watch::Sender<bool>, mut ended: watch::Receiver<bool>) {
        close.send_replace(true);
        let wait = ended.wait_for(|&done| done);
        if tokio::time::timeout(CID_RELEASE_WAIT, wait).await.is_err() {
            warn!("the connection being replaced did not end in time: going on");
        }
    }
}

/// A connection of a session as status shows it.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionAbout {
    /// CID.
    pub cid: u16,
    /// The initiator's address.
    pub peer: std::net::SocketAddr,
    /// The portal's address.
    pub local: std::net::SocketAddr,
    /// iSER (RDMA) rather than TCP.
    pub iser: bool,
    /// HeaderDigest and DataDigest in force.
    pub digests: Digests,
    /// MaxRecvDataSegmentLength each way: what the target may send, what
    /// it receives.
    pub max_send_segment: u32,
    /// What the initiator may send in one PDU.
    pub max_recv_segment: u32,
    /// The runtime shard it lives on (`None`: not on a shard).
    pub shard: Option<usize>,
}

/// The LUNs a session has sent commands to: one bit per LUN number,
/// set once (a load, then a store only the first time), so that a reload
/// can tell which sessions a LUN's removal would disturb without a lock on
/// the command path.
pub(crate) struct LunsUsed {
    bits: Box<[AtomicU64]>,
}

impl Default for LunsUsed {
    fn default() -> Self {
        LunsUsed {
            bits: (0..iscsi_scsi::MAX_LUNS / 64)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }
}

impl LunsUsed {
    /// A command reached `lun` (the LUN field as sent; an address that
    /// names no LUN number is ignored).
    pub fn note(&self, lun: u64) {
        let Some(n) = iscsi_scsi::decode_lun(lun) else {
            return;
        };
        let (word, bit) = (usize::from(n) / 64, 1u64 << (n % 64));
        if let Some(slot) = self.bits.get(word)
            && slot.load(Ordering::Relaxed) & bit == 0
        {
            slot.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// The LUN numbers noted, ascending.
    pub fn numbers(&self) -> Vec<u16> {
        let mut numbers = Vec::new();
        for (word, slot) in (0u16..).zip(self.bits.iter()) {
            let bits = slot.load(Ordering::Relaxed);
            for bit in 0..64u16 {
                if bits & (1 << bit) != 0 {
                    numbers.push(word * 64 + bit);
                }
            }
        }
        numbers
    }
}

/// What the core's task table asks of a task.
impl TaskHandle for Task {
    fn itt(&self) -> u32 {
        self.itt
    }
    fn lun(&self) -> u64 {
        self.lun
    }
    fn cmd_sn(&self) -> CmdSn {
        self.cmd_sn
    }
    fn is_done(&self) -> bool {
        Task::is_done(self)
    }
}

/// What admitting a command's CmdSN decided (RFC 7143 4.2.2.1).
#[derive(Debug)]
pub(crate) enum Admission {
    /// Deliver it.
    Accepted(Arc<Task>),
    /// Outside the window, or a duplicate: silently ignored.
    OutOfWindow,
    /// Its Initiator Task Tag is already in use by a live task.
    TagInUse,
}

/// One session: what its connections share.
pub(crate) struct Session {
    /// TSIH.
    pub tsih: u16,
    /// ISID.
    pub isid: [u8; 6],
    /// InitiatorName.
    pub initiator_name: String,
    /// TargetName (None for discovery).
    pub target_name: Option<String>,
    /// Session-wide negotiated parameters (from the leading login).
    pub params: NegotiatedParameters,
    /// The SCSI target (None for discovery sessions).
    pub scsi: Option<Arc<ScsiTarget>>,
    /// The I_T nexus the SCSI layer knows this session by (reservations,
    /// unit attentions).
    pub nexus: Nexus,
    /// The CmdSN window and the task table, under one lock.
    state: Mutex<SessionTasks<Task>>,
    /// Woken when ExpCmdSN moves (a command arrived that closes a gap).
    received: Notify,
    /// Becomes `true` to close every connection (logout of the session,
    /// reinstatement, target reset).
    pub(crate) close: watch::Sender<bool>,
    /// Becomes `true` when an operator asks the session to end (`iscsi
    /// target logout`): each connection asks its initiator to log out, as
    /// at shutdown.
    logout_asked: watch::Sender<bool>,
    /// The LUNs the session has sent commands to.
    pub luns_used: LunsUsed,
    /// When the leading login completed.
    pub since: std::time::SystemTime,
    /// Connections in full feature phase.
    pub(crate) connections: AtomicU32,
    /// Per CID, the connection that has it: a number telling it from a
    /// later one with the same CID, what closes it when a login with its
    /// CID reinstates it (RFC 7143 6.3.4) or a logout removes it for
    /// recovery, and what says it has ended.
    by_cid: Mutex<HashMap<u16, CidHolder>>,
    /// At ErrorRecoveryLevel 2: what failed connections left for TASK
    /// REASSIGN (`recovery`).
    pub orphans: Orphans,
    /// Numbers connections for `by_cid`.
    next_connection: AtomicU64,
    /// The session's state (RFC 7143 8.3).
    lifecycle: Mutex<SessionStateMachine>,
    /// A "close the session" logout succeeded (session closure, 6.3.6),
    /// as opposed to failure or reinstatement.
    pub(crate) closed_by_logout: AtomicBool,
    /// Counters for the session's statistics, summed by the metrics
    /// endpoint while the session lives and folded into its target's
    /// totals when it is dropped.
    pub stats: Enrolled,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        metrics: &Arc<Metrics>,
        complete: &LoginComplete,
        scsi: Option<Arc<ScsiTarget>>,
        target_port: u16,
        window: u32,
        cmd_sn: CmdSn,
        lifecycle: SessionStateMachine,
    ) -> Self {
        let isid = complete
            .request
            .isid
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        Session {
            nexus: Nexus::iscsi(&complete.request.initiator_name, isid, target_port),
            tsih: complete.tsih,
            isid: complete.request.isid,
            initiator_name: complete.request.initiator_name.clone(),
            target_name: complete.request.target_name.clone(),
            params: complete.parameters.clone(),
            scsi,
            state: Mutex::new(SessionTasks::new(CommandWindow::new(cmd_sn, window))),
            received: Notify::new(),
            close: watch::channel(false).0,
            logout_asked: watch::channel(false).0,
            luns_used: LunsUsed::default(),
            since: std::time::SystemTime::now(),
            connections: AtomicU32::new(0),
            by_cid: Mutex::new(HashMap::new()),
            orphans: Orphans::default(),
            next_connection: AtomicU64::new(0),
            lifecycle: Mutex::new(lifecycle),
            closed_by_logout: AtomicBool::new(false),
            stats: metrics.enroll(SessionStats::new(SessionLabels {
                target: complete.request.target_name.clone(),
                initiator: complete.request.initiator_name.clone(),
                tsih: complete.tsih,
            })),
        }
    }

    /// Gives CID `cid` to a connection that has just logged in, closing
    /// the connection that had it (connection reinstatement, RFC 7143
    /// 6.3.4: a login with a CID in use implicitly logs that connection
    /// out; below ErrorRecoveryLevel 2 its tasks end with it, at 2 they
    /// wait for TASK REASSIGN). Returns once the old connection has ended
    /// (at most [`CID_RELEASE_WAIT`]), so that what it left is in place
    /// before the new one takes a PDU; then the connection's number (for
    /// [`Session::release_cid`]), what tells it that it is to close, and
    /// what it drops when it has ended.
    pub async fn take_cid(
        &self,
        about: ConnectionAbout,
    ) -> (u64, watch::Receiver<bool>, watch::Sender<bool>) {
        let cid = about.cid;
        let number = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let (close, replaced) = watch::channel(false);
        let (ended_tx, ended) = watch::channel(false);
        let old = self
            .by_cid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                cid,
                CidHolder {
                    number,
                    about,
                    close,
                    ended,
                },
            );
        if let Some(old) = old {
            info!(
                tsih = self.tsih,
                cid, "connection reinstatement: closing the connection that had this CID"
            );
            old.close_and_wait().await;
        }
        (number, replaced, ended_tx)
    }

    /// Closes the connection with CID `cid` (a Logout "remove the
    /// connection for recovery" on another connection, RFC 7143 11.14.1)
    /// and waits until it has ended: whether there was one.
    pub async fn close_cid(&self, cid: u16) -> bool {
        let holder = self
            .by_cid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&cid)
            .map(|h| (h.close.clone(), h.ended.clone()));
        match holder {
            Some((close, ended)) => {
                CidHolder::signal_and_wait(&close, ended).await;
                true
            }
            None => false,
        }
    }

    /// The session's connections, by CID.
    pub fn connections_about(&self) -> Vec<ConnectionAbout> {
        let mut about: Vec<ConnectionAbout> = self
            .by_cid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|h| h.about.clone())
            .collect();
        about.sort_by_key(|a| a.cid);
        about
    }

    /// Commands received and not yet answered (the task table's size).
    pub fn commands_in_flight(&self) -> usize {
        self.lock().len()
    }

    /// Asks every connection to have its initiator log out (Asynchronous
    /// Message "logout requested", RFC 7143 11.9.1); one that does not is
    /// dropped after the grace period.
    pub fn ask_logout(&self) {
        self.logout_asked.send_replace(true);
    }

    /// A receiver that sees [`Session::ask_logout`].
    pub fn logout_asked(&self) -> watch::Receiver<bool> {
        self.logout_asked.subscribe()
    }

    /// Whether a connection of the session has CID `cid`.
    pub fn has_cid(&self, cid: u16) -> bool {
        self.by_cid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&cid)
    }

    /// Connection `number` has ended: its CID is free, unless a later
    /// connection has taken it.
    pub fn release_cid(&self, cid: u16, number: u64) {
        let mut by_cid = self.by_cid.lock().unwrap_or_else(PoisonError::into_inner);
        if by_cid.get(&cid).is_some_and(|h| h.number == number) {
            by_cid.remove(&cid);
        }
    }

    /// Whether the session keeps a failed connection's tasks for TASK
    /// REASSIGN (ErrorRecoveryLevel 2, RFC 7143 7.2.2).
    pub fn recovers_connections(&self) -> bool {
        self.params.error_recovery_level >= 2
    }

    /// DefaultTime2Retain: how long a failed connection's tasks wait for
    /// a reassignment (RFC 7143 13.16).
    pub fn time2retain(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.params.default_time2retain))
    }

    /// Connection `origin`'s Time2Retain is over: the tasks it left that
    /// nobody reassigned end (writes aborted, parked answers dropped).
    /// Returns how many.
    pub fn expire_connection(&self, origin: &Writer, number: u64) -> usize {
        let mut ended = 0;
        for orphan in self.orphans.expire(number) {
            ended += 1;
            if let Orphan::Collecting(pending) = orphan {
                self.abort(&pending.write.task);
            }
        }
        for task in self.tasks(None) {
            if task.allegiance.is_to(origin) {
                ended += 1;
                task.allegiance.forget();
                // Ends it: an executing task ends when the SCSI layer is
                // done with it; its answer, finding the writer closed, is
                // parked and dropped with the task.
                self.abort(&task);
                if task.allegiance.forget() {
                    // Its answer was parked: it is done executing.
                    self.finish(&task);
                }
            }
        }
        ended
    }

    /// Applies a session event (RFC 7143 8.3) and logs the transition.
    pub fn record(&self, event: SessionEvent) {
        let mut lifecycle = self
            .lifecycle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        record(&mut *lifecycle, event, &format!("tsih {}", self.tsih));
    }

    /// The session's RFC 7143 8.3 state.
    pub fn lifecycle_state(&self) -> iscsi_proto::state::SessionState {
        self.lifecycle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .state()
    }

    /// Marks the session as closed by a successful "close the session"
    /// logout, and asks every connection to close.
    pub fn close_by_logout(&self) {
        self.closed_by_logout.store(true, Ordering::Release);
        self.close();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SessionTasks<Task>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// ExpCmdSN and MaxCmdSN as they stand (RFC 7143 4.2.2.1): the window
    /// shrinks by one for each command received and not yet finished.
    pub fn window_edges(&self) -> (CmdSn, CmdSn) {
        self.lock().window().edges()
    }

    /// Admits a command PDU (SCSI Command, or a Text/NOP/TMF carrying a
    /// CmdSN): checks its CmdSN against the window unless immediate, and
    /// registers its task under its Initiator Task Tag when `task` is true.
    pub fn admit(
        &self,
        cmd_sn: CmdSn,
        immediate: bool,
        itt: u32,
        lun: u64,
        task: bool,
    ) -> Admission {
        let pdu = Arriving {
            cmd_sn,
            immediate,
            itt,
            task,
        };
        let gaps = self.gaps();
        let mut state = self.lock();
        match state.admit(pdu, gaps) {
            Ok(true) => self.received.notify_waiters(),
            Ok(false) => {}
            Err(Refusal::OutOfWindow) => return Admission::OutOfWindow,
            Err(Refusal::TagInUse) => return Admission::TagInUse,
        }
        let handle = Arc::new(Task {
            itt,
            lun,
            cmd_sn,
            windowed: pdu.windowed(),
            aborted: AtomicBool::new(false),
            executing: AtomicBool::new(false),
            done: AtomicBool::new(!task),
            finished: Notify::new(),
            allegiance: Allegiance::default(),
            arrived: std::time::Instant::now(),
        });
        if task {
            state.register(Arc::clone(&handle), pdu.windowed());
        }
        Admission::Accepted(handle)
    }

    /// Waits until every command numbered before `before` has arrived
    /// (ExpCmdSN has reached it), at most `limit`; says whether they all
    /// did. Over one connection they have (TCP keeps their order); over
    /// several, a command numbered before a task management function may
    /// still be on its way on another connection, and the function must
    /// reach it, as the initiator counts it among those the function ended
    /// (RFC 7143 11.6.2).
    pub async fn received_before(&self, before: CmdSn, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.received.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().window().received_before(before) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Marks a CmdSN as received without a task (RFC 7143 11.5.1: an ABORT
    /// TASK for a command not yet arrived whose RefCmdSN is in the window).
    pub fn consume_cmd_sn(&self, cmd_sn: CmdSn) -> bool {
        matches!(
            self.admit(cmd_sn, false, 0, 0, false),
            Admission::Accepted(_)
        )
    }

    /// Gaps in CmdSN are skipped on one connection below ERL 2 and waited
    /// for otherwise: across connections, and at ERL 2 because commands
    /// lost with a failed connection come again on its replacement, in any
    /// order (RFC 7143 7.2.1).
    fn gaps(&self) -> Gaps {
        if self.connections.load(Ordering::Acquire) <= 1 && !self.recovers_connections() {
            Gaps::Skip
        } else {
            Gaps::Wait
        }
    }

    /// ABORT TASK of a command not yet arrived: its CmdSN taken as
    /// received and its tag remembered, if it is in the window
    /// (`SessionTasks::abort_unseen`, RFC 7143 11.5.1).
    pub fn abort_unseen(&self, itt: u32, ref_cmd_sn: CmdSn, cmd_sn: CmdSn) -> bool {
        let gaps = self.gaps();
        let mut state = self.lock();
        let taken = state.abort_unseen(itt, ref_cmd_sn, cmd_sn, gaps);
        if taken {
            self.received.notify_waiters();
        }
        taken
    }

    /// Whether `itt` names a command aborted before it arrived.
    pub fn aborted_unseen(&self, itt: u32) -> bool {
        self.lock().aborted_unseen(itt)
    }

    /// Ends a task: frees its window slot (before its status goes out, so
    /// that the status carries the grown MaxCmdSN) and wakes anyone waiting
    /// for it.
    pub fn finish(&self, task: &Task) {
        let mut state = self.lock();
        Self::finish_locked(&mut state, task);
    }

    /// Ends a task about to send its status, unless it was aborted: returns
    /// whether the status may go out. Atomic with [`Session::abort`], so a
    /// task either reports its status or is reported aborted, never both.
    pub fn complete(&self, task: &Task) -> bool {
        let mut state = self.lock();
        let aborted = task.aborted.load(Ordering::Acquire);
        Self::finish_locked(&mut state, task);
        !aborted
    }

    /// Aborts a live task: returns `false` if it is already over. A task
    /// still collecting its data ends at once; one being executed ends when
    /// the SCSI layer is done with it ([`Task::wait`]).
    pub fn abort(&self, task: &Task) -> bool {
        let mut state = self.lock();
        if task.is_done() {
            return false;
        }
        task.aborted.store(true, Ordering::Release);
        if !task.executing.load(Ordering::Acquire) {
            Self::finish_locked(&mut state, task);
        }
        true
    }

    fn finish_locked(state: &mut SessionTasks<Task>, task: &Task) {
        if task.done.swap(true, Ordering::AcqRel) {
            return;
        }
        state.finish(task, task.windowed);
        task.finished.notify_waiters();
    }

    /// The live task with this tag.
    pub fn task(&self, itt: u32) -> Option<Arc<Task>> {
        self.lock().get(itt).cloned()
    }

    /// Live tasks, optionally only those addressed to `lun`.
    pub fn tasks(&self, lun: Option<u64>) -> Vec<Arc<Task>> {
        self.lock().select(lun)
    }

    /// The tasks a function numbered `before` ends in this session
    /// (`SessionTasks::before`).
    pub fn tasks_before(&self, lun: Option<u64>, before: CmdSn) -> Vec<Arc<Task>> {
        self.lock().before(lun, before)
    }

    /// Connections in full feature phase.
    pub fn connection_count(&self) -> u32 {
        self.connections.load(Ordering::Acquire)
    }

    /// Asks every connection of the session to close.
    pub fn close(&self) {
        self.close.send_replace(true);
    }

    /// A receiver that sees [`Session::close`].
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.close.subscribe()
    }

    /// Aborts the live tasks addressed to `lun` (another nexus preempted
    /// this one's reservation with PREEMPT AND ABORT).
    pub fn abort_lun(&self, lun: u64) {
        for task in self.tasks(Some(lun)) {
            if self.abort(&task) {
                SessionStats::add(&self.stats.aborts, 1);
            }
        }
    }

    /// Whether any task of the session is not over (one aborted while at
    /// the store is over only when the store lets go of it).
    pub(crate) fn has_live_tasks(&self) -> bool {
        !self.lock().quiesced()
    }

    /// Ends every task (as `abort_all`) and waits until each is over, at
    /// most until `deadline`; whether all are. (A session being reinstated
    /// may still admit a command on a connection the initiator has not
    /// given up: that one is the initiator's own concurrent write, not a
    /// leftover, and is not waited for.)
    pub(crate) async fn abort_all_and_wait(&self, deadline: tokio::time::Instant) -> bool {
        let tasks = self.tasks(None);
        self.abort_all();
        for task in tasks {
            if tokio::time::timeout_at(deadline, task.wait())
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Aborts every live task (the session is going away).
    pub(crate) fn abort_all(&self) {
        for task in self.tasks(None) {
            self.abort(&task);
            if task.allegiance.forget() {
                // Its answer was parked (ERL 2): it is done executing, and
                // nothing else would end it.
                self.finish(&task);
            }
        }
    }
}

impl CmdWindow for Session {
    fn window_edges(&self) -> (CmdSn, CmdSn) {
        Session::window_edges(self)
    }
}

/// Applies `event` to a section 8 state machine and logs the transition;
/// `subject` says whose machine it is (a CID, a TSIH). An event the RFC
/// has no transition for is a bug in this driver: it is logged (and fails
/// debug builds), the state is kept.
pub(crate) fn record<D: Diagram>(machine: &mut Machine<D>, event: D::Event, subject: &str) {
    match machine.handle(event) {
        Ok(t) => {
            debug!(subject, transition = t.label, from = %t.from, to = %t.to, "{} state", D::NAME)
        }
        Err(error) => {
            warn!(subject, %error, "state machine");
            debug_assert!(false, "{error}");
        }
    }
}
