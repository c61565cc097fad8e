//! [`Session`]: a normal session in full feature phase over one or more
//! connections (RFC 7143 sections 4 and 4.1: MC/S).
//!
//! - Commands: every SCSI command takes an ITT and, unless immediate, the
//!   next CmdSN inside the window ExpCmdSN..=MaxCmdSN (section 4.2.2.1);
//!   a task whose window is closed waits until a response opens it. Many
//!   commands are in flight at once; each completes when its status
//!   arrives.
//! - Writes send immediate data and unsolicited Data-Out as ImmediateData,
//!   InitialR2T and FirstBurstLength allow (sections 4.2.5.2, 13.10,
//!   13.11, 13.14; `Limits::write_plan`), then answer each R2T (section
//!   11.8) with its Data-Out sequence, checked by `R2tTracker` (up to
//!   MaxOutstandingR2T outstanding, section 13.17).
//! - Timeouts: a command with no status in time fails with
//!   [`Error::Timeout`]; an ABORT TASK (section 11.5.1) is sent for it, and
//!   if even that goes unanswered the connection is dropped.
//! - ERL 0 recovery (section 7.1.4.1, 7.12.2): when a connection is lost,
//!   the session is reinstated (a leading login with the same ISID and
//!   TSIH 0, section 6.3.5) and the commands that never completed are
//!   sent again, up to `command_retries` times each.
//! - MC/S: after the leading login, further connections log in with the
//!   session's TSIH and their own CID; commands are spread by
//!   [`crate::Scheduling`]. Responses come back on the connection a
//!   command was sent on (connection allegiance, section 5.1).

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use iscsi_proto::pdu::login::Isid;
use iscsi_proto::pdu::{
    Ahs, DataOut, Header, LogoutReason, LogoutRequest, LogoutResponseCode, Lun, NopOut, Pdu,
    RESERVED_TAG, ScsiCommand, TaskFunction, TaskManagementRequest, TaskResponse,
};
use iscsi_proto::serial::{CmdSn, DataSn};
use iscsi_proto::state::{ConnectionEvent, Role, SessionEvent, SessionState, SessionStateMachine};
use iscsi_proto::text::NegotiatedParameters;
use iscsi_proto::transfer::{
    Limits, R2tTracker, Segment as DataSegment, TransferError, WritePlan, data_segments,
};
use tokio::sync::mpsc;

use crate::buffers::ReadBuffers;
use crate::command::{Command, DataTransfer, Response, encode_lun};
use crate::config::{Scheduling, SessionConfig};
use crate::connection::{
    CommandTag, CommandWindow, Connection, POSTED_DATA_LIMIT, ReadInto, SendCounters, Sending,
    SessionShared, TaskEvent,
};
use crate::error::Error;
use crate::login::{LoginRequestParams, login, random_isid};
use crate::url::IscsiUrl;
use iscsi_datamover::tap::{Tee, WireCounter, WireCounts, WireTap};

/// A logged-in normal session. Cheap to clone: clones share the session.
#[derive(Clone, Debug)]
pub struct Session {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: SessionConfig,
    portal: String,
    /// The session's connections are iSER ones (an `iser://` URL).
    iser: bool,
    target_name: String,
    isid: Isid,
    tsih: AtomicU16,
    window: Arc<CommandWindow>,
    /// Buffers for pooled reads, shared by the connections.
    read_buffers: Arc<ReadBuffers>,
    /// What the connections sent, over the session's life.
    sends: Arc<SendCounters>,
    /// PDUs and data bytes by kind, on all connections, over the session's
    /// life.
    wire: Arc<WireCounter>,
    /// What every connection's datamover is told of: `wire`, and the
    /// configuration's tap if there is one.
    tap: Arc<dyn WireTap>,
    connections: Mutex<Vec<Arc<Connection>>>,
    /// Bumped by every reinstatement.
    generation: AtomicU64,
    recovery: tokio::sync::Mutex<()>,
    next_itt: AtomicU32,
    next_connection: AtomicUsize,
    parameters: Mutex<Option<NegotiatedParameters>>,
    closed: AtomicBool,
    reinstatements: AtomicU64,
    /// Connections reinstated with their CID at ErrorRecoveryLevel 2.
    connection_recoveries: AtomicU64,
    /// Tasks moved to a new connection by TASK REASSIGN.
    tasks_reassigned: AtomicU64,
    /// The session's state (RFC 7143 8.3).
    lifecycle: Mutex<SessionStateMachine>,
}

/// A SCSI command at the target ([`Session::commands_in_flight`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Its Initiator Task Tag: what [`Session::abort_task`] takes.
    pub itt: u32,
    /// The LUN it is addressed to.
    pub lun: u64,
    /// Its CmdSN.
    pub cmd_sn: u32,
    /// How long since it was issued.
    pub age: Duration,
}

/// What a session has sent since it was opened, on all its connections
/// (reinstatements included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendStatistics {
    /// PDUs sent.
    pub pdus: u64,
    /// Writes that carried them: PDUs posted by tasks that ran together
    /// (the commands a batch of responses let go) leave in one write.
    pub writes: u64,
}

/// How one try of a command ended, when it did not complete.
enum AttemptError {
    /// The connection went away; the read buffer, if it came back.
    Lost(Option<Vec<u8>>),
    /// A task moved to a recovered connection is not at the target (it
    /// ended there, or the reassignment was refused): sent again as a new
    /// command; `reinstate` if only session recovery is left.
    Gone {
        buffer: Option<Vec<u8>>,
        reinstate: bool,
    },
    /// The command failed for good.
    Failed(Error),
}

impl From<Error> for AttemptError {
    fn from(error: Error) -> Self {
        AttemptError::Failed(error)
    }
}

/// Unregisters a task from its connection when the command's future ends
/// or is dropped.
struct Registration<'a> {
    connection: &'a Connection,
    itt: u32,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.connection.unregister(self.itt);
    }
}

/// How long a write at ErrorRecoveryLevel 1 waits for an R2T it is owed
/// before asking for it with an R2T SNACK. Targets send R2Ts as soon as
/// they want data, so a second of silence means one was lost; a SNACK
/// sent too early costs only a Reject or a copy, both ignored.
const R2T_SNACK_AFTER: Duration = Duration::from_secs(1);
/// The longest wait between R2T SNACKs for one write.
const R2T_SNACK_MAX_WAIT: Duration = Duration::from_secs(8);

/// The longest Time2Wait a logout for recovery is waited out (a target may
/// ask for up to 3600 s, RFC 7143 13.15; commands wait meanwhile).
const TIME2WAIT_MAX: Duration = Duration::from_secs(2);

/// How many times a TASK REASSIGN answered "task still allegiant" is sent
/// again, [`REASSIGN_RETRY_AFTER`] apart.
const REASSIGN_TRIES: u32 = 10;
const REASSIGN_RETRY_AFTER: Duration = Duration::from_millis(200);

/// How a try of a command starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// A new task: a new ITT and the next CmdSN.
    Fresh,
    /// The task of a recovered connection, moved to this one with TASK
    /// REASSIGN (ERL 2); its CmdSN, if the target may never have had it,
    /// to send it again with.
    Reassign(CmdSn),
}

/// A sentinel for "no CmdSN taken yet".
const NO_CMD_SN: u64 = u64::MAX;

impl Session {
    /// Connects to the target of `url` and logs in (leading connection,
    /// then `config.connections - 1` more if MaxConnections allows). CHAP
    /// credentials in the URL override `config.chap`'s user and secret.
    pub async fn connect(url: &IscsiUrl, config: SessionConfig) -> Result<Session, Error> {
        let config = config.with_url_credentials(url);
        let target_name = url.target_name()?.to_owned();
        let isid = Isid::from_bytes(config.isid.unwrap_or_else(random_isid));
        let wire = Arc::new(WireCounter::default());
        let tap: Arc<dyn WireTap> = match &config.tap {
            Some(user) => Arc::new(Tee(vec![wire.clone(), user.clone()])),
            None => wire.clone(),
        };
        let inner = Arc::new(Inner {
            wire,
            tap,
            portal: url.portal(),
            iser: url.iser,
            target_name,
            isid,
            tsih: AtomicU16::new(0),
            window: Arc::new(CommandWindow::new(CmdSn::new(1), CmdSn::new(1))),
            read_buffers: Arc::default(),
            sends: Arc::default(),
            connections: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            recovery: tokio::sync::Mutex::new(()),
            next_itt: AtomicU32::new(rand::random::<u32>() & 0x00ff_ffff),
            next_connection: AtomicUsize::new(0),
            parameters: Mutex::new(None),
            closed: AtomicBool::new(false),
            reinstatements: AtomicU64::new(0),
            connection_recoveries: AtomicU64::new(0),
            tasks_reassigned: AtomicU64::new(0),
            lifecycle: Mutex::new(SessionStateMachine::new(Role::Initiator)),
            config,
        });
        let connections = inner.establish().await?;
        *inner.lock_connections() = connections;
        inner.record(SessionEvent::ConnectionLoggedIn);
        Ok(Session { inner })
    }

    /// The parameters negotiated by the leading login (always `Some` once
    /// [`Session::connect`] returned).
    pub fn parameters(&self) -> Option<NegotiatedParameters> {
        self.inner
            .parameters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The TSIH the target gave the session (RFC 7143 section 11.13.6).
    pub fn tsih(&self) -> u16 {
        self.inner.tsih.load(Ordering::Relaxed)
    }

    /// The ISID of the session.
    pub fn isid(&self) -> Isid {
        self.inner.isid
    }

    /// Connections currently usable.
    pub fn connection_count(&self) -> usize {
        self.inner
            .lock_connections()
            .iter()
            .filter(|c| c.is_alive())
            .count()
    }

    /// PDUs sent and the writes that carried them.
    pub fn send_statistics(&self) -> SendStatistics {
        SendStatistics {
            pdus: self.inner.sends.pdus.load(Ordering::Relaxed),
            writes: self.inner.sends.writes.load(Ordering::Relaxed),
        }
    }

    /// PDUs and data bytes by kind (SCSI commands, Data-In, R2T, Data-Out,
    /// immediate, unsolicited and solicited data...) exactly as they went
    /// over this session's connections since it was opened. Take the
    /// difference of two readings ([`WireCounts::since`]) for a window.
    pub fn wire_counts(&self) -> WireCounts {
        self.inner.wire.counts()
    }

    /// How many Data SNACKs the session sent: at ErrorRecoveryLevel 1, one
    /// per Data-In whose data digest failed, recovered within the
    /// connection (RFC 7143 7.3).
    pub fn snacks_sent(&self) -> u64 {
        self.inner.sends.snacks.load(Ordering::Relaxed)
    }

    /// How many recovery R2Ts the session answered: at ErrorRecoveryLevel
    /// 1, Data-Out the target lost to a data digest error and asked for
    /// again (RFC 7143 7.8).
    pub fn recovery_r2ts_answered(&self) -> u64 {
        self.inner.sends.recovery_r2ts.load(Ordering::Relaxed)
    }

    /// How many times the session was reinstated after a lost connection.
    pub fn reinstatements(&self) -> u64 {
        self.inner.reinstatements.load(Ordering::Relaxed)
    }

    /// How many connections were recovered at ErrorRecoveryLevel 2: logged
    /// in again with their CID (connection reinstatement) while the rest
    /// of the session went on.
    pub fn connection_recoveries(&self) -> u64 {
        self.inner.connection_recoveries.load(Ordering::Relaxed)
    }

    /// How many commands a recovered connection's failure interrupted were
    /// moved to its replacement with TASK REASSIGN (RFC 7143 11.5.1) and
    /// went on there, rather than being sent again.
    pub fn tasks_reassigned(&self) -> u64 {
        self.inner.tasks_reassigned.load(Ordering::Relaxed)
    }

    /// Drops the connection with CID `cid` without logging out, as a
    /// failure of its path would (tests of connection recovery): at
    /// ErrorRecoveryLevel 2 its commands go on over its replacement.
    /// Whether there was one.
    pub fn drop_connection(&self, cid: u16) -> bool {
        let connections = self.inner.lock_connections();
        match connections.iter().find(|c| c.cid == cid && c.is_alive()) {
            Some(connection) => {
                connection.close();
                true
            }
            None => false,
        }
    }

    /// The configuration the session was opened with.
    pub fn config(&self) -> &SessionConfig {
        &self.inner.config
    }

    /// Runs one SCSI command and returns its status, sense and residual
    /// (a read's buffer comes back in [`Response::data`]). A status other
    /// than GOOD is not an error here: see [`Response::check`].
    pub async fn execute(&self, command: Command<'_>) -> Result<Response, Error> {
        self.inner.execute(command).await
    }

    /// Sends a NOP-Out ping and waits for its NOP-In (RFC 7143 section
    /// 11.18); returns the round trip time.
    pub async fn ping(&self) -> Result<Duration, Error> {
        let inner = &self.inner;
        let connection = inner.pick(0).ok_or(Error::ConnectionLost)?;
        let itt = inner.itt();
        let header = Header::new(
            Pdu::NopOut(NopOut {
                immediate: true,
                lun: Lun(0),
                initiator_task_tag: itt,
                target_transfer_tag: RESERVED_TAG,
                cmd_sn: inner.window.current(),
                exp_stat_sn: connection.exp_stat_sn(),
            }),
            0,
        );
        let start = Instant::now();
        let (reply, _) = inner.exchange(&connection, itt, header, &[]).await?;
        match reply.pdu {
            Pdu::NopIn(_) => Ok(start.elapsed()),
            other => Err(Error::Protocol(format!(
                "{:?} answering a NOP-Out",
                other.opcode()
            ))),
        }
    }

    /// Sends a task management function (RFC 7143 section 11.5) for `lun`
    /// and waits for its response; anything but "function complete" is an
    /// error. When it completes, this session's commands it reached (by
    /// LUN, for a reset of the target all, and in every case only those
    /// numbered before it) end with [`Error::Aborted`] at once: the target
    /// sends them no status (11.6.2).
    pub async fn task_management(&self, function: TaskFunction, lun: u64) -> Result<(), Error> {
        let connection = self.inner.pick(lun).ok_or(Error::ConnectionLost)?;
        self.inner
            .task_management(&connection, function, lun, RESERVED_TAG, None)
            .await
    }

    /// Whether the session was logged out (or closed): it takes no more
    /// commands.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// The SCSI commands at the target now (sent, no status yet), oldest
    /// first: what [`Session::abort_task`] can name.
    pub fn commands_in_flight(&self) -> Vec<InFlight> {
        let mut commands: Vec<InFlight> = self
            .inner
            .lock_connections()
            .iter()
            .flat_map(|connection| connection.commands())
            .filter_map(|(itt, tag)| {
                Some(InFlight {
                    itt,
                    lun: tag.lun,
                    cmd_sn: tag.cmd_sn?.get(),
                    age: tag.registered.elapsed(),
                })
            })
            .collect();
        commands.sort_by_key(|c| std::cmp::Reverse(c.age));
        commands
    }

    /// ABORT TASK (RFC 7143 section 11.5.1) for the command `itt` (from
    /// [`Session::commands_in_flight`]): once the target has completed it,
    /// the command's caller gets [`Error::Aborted`]. "Task does not exist"
    /// ([`Error::TaskManagement`]) means the command had ended first: its
    /// caller gets its status as usual.
    pub async fn abort_task(&self, itt: u32) -> Result<(), Error> {
        let found = self.inner.lock_connections().iter().find_map(|connection| {
            let (_, tag) = connection.commands().into_iter().find(|(t, _)| *t == itt)?;
            Some((Arc::clone(connection), tag))
        });
        let Some((connection, tag)) = found else {
            return Err(Error::TaskManagement(TaskResponse::TaskDoesNotExist));
        };
        self.inner
            .task_management(
                &connection,
                TaskFunction::AbortTask,
                tag.lun,
                itt,
                tag.cmd_sn,
            )
            .await
    }

    /// LOGICAL UNIT RESET (RFC 7143 section 11.5.1).
    pub async fn lun_reset(&self, lun: u64) -> Result<(), Error> {
        self.task_management(TaskFunction::LogicalUnitReset, lun)
            .await
    }

    /// ABORT TASK SET: aborts every task of this session on `lun`.
    pub async fn abort_task_set(&self, lun: u64) -> Result<(), Error> {
        self.task_management(TaskFunction::AbortTaskSet, lun).await
    }

    /// Logs the session out (RFC 7143 section 11.14, reason "close the
    /// session") and closes its connections.
    pub async fn logout(&self) -> Result<(), Error> {
        let inner = &self.inner;
        if inner.closed.swap(true, Ordering::SeqCst) {
            return Err(Error::SessionClosed);
        }
        let connections = std::mem::take(&mut *inner.lock_connections());
        let Some(connection) = connections.iter().find(|c| c.is_alive()).cloned() else {
            return Err(Error::ConnectionLost);
        };
        let itt = inner.itt();
        let header = Header::new(
            Pdu::LogoutRequest(LogoutRequest {
                immediate: true,
                reason: LogoutReason::CloseSession,
                initiator_task_tag: itt,
                cid: connection.cid,
                cmd_sn: inner.window.current(),
                exp_stat_sn: connection.exp_stat_sn(),
            }),
            0,
        );
        connection.record(ConnectionEvent::LogoutStarted);
        let result = inner.exchange(&connection, itt, header, &[]).await;
        let closed = matches!(
            &result,
            Ok((reply, _)) if matches!(&reply.pdu, Pdu::LogoutResponse(r)
                if r.response == LogoutResponseCode::ClosedSuccessfully)
        );
        for c in &connections {
            if closed && !Arc::ptr_eq(c, &connection) && c.rfc_state().is_full_feature() {
                // The session closed by a logout on another connection (T8).
                c.record(ConnectionEvent::SessionClosedElsewhere);
            }
            c.terminate().await;
        }
        let (reply, _) = result?;
        match reply.pdu {
            Pdu::LogoutResponse(r) if r.response == LogoutResponseCode::ClosedSuccessfully => {
                inner.record(SessionEvent::Closed);
                Ok(())
            }
            Pdu::LogoutResponse(r) => {
                Err(Error::Protocol(format!("logout refused: {:?}", r.response)))
            }
            other => Err(Error::Protocol(format!(
                "{:?} answering a logout",
                other.opcode()
            ))),
        }
    }

    /// Hands a pooled read's buffer ([`Command::read_pooled`]) back for the
    /// next pooled read; any buffer will do.
    pub fn recycle(&self, buffer: Vec<u8>) {
        self.inner.read_buffers.give(buffer);
    }

    /// Drops every connection without logging out, as a network failure
    /// would (for tests of recovery and for callers that detect a hung
    /// path themselves). The next command reinstates the session.
    pub fn drop_connections(&self) {
        for connection in self.inner.lock_connections().iter() {
            connection.close();
        }
    }
}

impl Inner {
    /// Applies a session event (RFC 7143 8.3); an event the RFC does not
    /// allow is a bug here, reported (and fatal in debug builds).
    fn record(&self, event: SessionEvent) {
        let mut lifecycle = self
            .lifecycle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        crate::connection::record_transition(&mut lifecycle, event, None);
    }

    /// The session's RFC 7143 state.
    fn session_state(&self) -> SessionState {
        self.lifecycle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .state()
    }

    fn lock_connections(&self) -> MutexGuard<'_, Vec<Arc<Connection>>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A fresh Initiator Task Tag (never the reserved 0xffffffff).
    fn itt(&self) -> u32 {
        loop {
            let itt = self.next_itt.fetch_add(1, Ordering::Relaxed);
            if itt != RESERVED_TAG {
                return itt;
            }
        }
    }

    /// What a login of connection `cid` into session `tsih` (0: a new one)
    /// sends.
    fn login_params(&self, tsih: u16, cid: u16) -> LoginRequestParams<'_> {
        LoginRequestParams {
            portal: self.portal.clone(),
            target_name: Some(&self.target_name),
            isid: self.isid,
            tsih,
            cid,
            cmd_sn: self.window.current(),
            initiator_task_tag: self.itt(),
            tap: Some(self.tap.clone()),
            iser: self.iser,
        }
    }

    /// Logs in the leading connection (TSIH 0: a new session, or the
    /// reinstatement of ours) and the others of an MC/S session.
    async fn establish(&self) -> Result<Vec<Arc<Connection>>, Error> {
        let login_cmd_sn = self.window.current();
        let leading = login(&self.config, self.login_params(0, 0)).await?;
        let complete = &leading.complete;
        // The first command after a leading login carries the Login
        // Request's CmdSN (RFC 7143 11.12.8, RFC 3720 10.12.8's example):
        // taken from what we sent, not from the response's ExpCmdSN, which
        // tgt 1.0.85's iSER target gives one too high (its NOP-In then says
        // ExpCmdSN 1, and a command numbered 2 would wait there forever).
        let exp = if complete.exp_cmd_sn == login_cmd_sn.next() {
            login_cmd_sn
        } else {
            complete.exp_cmd_sn
        };
        self.window.reset(exp, complete.max_cmd_sn);
        self.tsih.store(complete.tsih, Ordering::Relaxed);
        let parameters = complete.parameters.clone();
        let wanted = self
            .config
            .connections
            .clamp(1, parameters.max_connections.max(1));
        let mut connections = vec![self.start(0, leading, None)];
        for cid in 1..wanted {
            match self.join(cid).await {
                Ok(joined) => connections.push(self.start(cid, joined, Some(&parameters))),
                Err(error) => {
                    tracing::warn!(cid, %error, "could not add a connection to the session");
                    break;
                }
            }
        }
        *self
            .parameters
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(parameters);
        Ok(connections)
    }

    /// Starts a logged-in connection. A joining one (or a reinstated one)
    /// negotiated only its own keys: the leading-only ones (ErrorRecoveryLevel,
    /// the burst lengths...) are the session's, from `session`.
    /// Logs in a connection with CID `cid` to the session (a further MC/S
    /// connection, or a connection reinstatement if `cid` is in use) and
    /// takes the command window its login response gives.
    async fn join(&self, cid: u16) -> Result<crate::login::LoggedIn, Error> {
        let tsih = self.tsih.load(Ordering::Relaxed);
        let joined = login(&self.config, self.login_params(tsih, cid)).await?;
        let c = &joined.complete;
        self.window.update(c.exp_cmd_sn, c.max_cmd_sn);
        Ok(joined)
    }

    fn start(
        &self,
        cid: u16,
        mut logged_in: crate::login::LoggedIn,
        session: Option<&NegotiatedParameters>,
    ) -> Arc<Connection> {
        if let Some(session) = session {
            logged_in.complete.parameters = session.joined_by(&logged_in.complete.parameters);
        }
        let mut limits = Limits::from(&logged_in.complete.parameters);
        if let Some(cap) = self.config.max_xmit_data_segment_length {
            limits.max_send_segment = limits.max_send_segment.min(cap);
        }
        let exp_stat_sn = logged_in.complete.exp_stat_sn;
        Connection::start(
            cid,
            limits,
            exp_stat_sn,
            logged_in.datamover,
            SessionShared {
                window: self.window.clone(),
                buffers: self.read_buffers.clone(),
                sends: self.sends.clone(),
                coalescing: self.config.coalescing,
                error_recovery_level: logged_in.complete.parameters.error_recovery_level,
            },
            logged_in.state,
        )
    }

    /// The connection for a command on `lun`, by the scheduling policy;
    /// `None` if no connection is usable.
    fn pick(&self, lun: u64) -> Option<Arc<Connection>> {
        let connections = self.lock_connections();
        let count = connections.len();
        if count == 0 {
            return None;
        }
        let first = match self.config.scheduling {
            Scheduling::RoundRobin => self.next_connection.fetch_add(1, Ordering::Relaxed) % count,
            Scheduling::LunAffinity => (lun % count as u64) as usize,
        };
        (0..count)
            .map(|i| &connections[(first + i) % count])
            .find(|c| c.is_alive())
            .cloned()
    }

    /// Reinstates the session after a lost connection, unless another task
    /// already did since `seen_generation`.
    async fn recover(&self, seen_generation: u64) -> Result<(), Error> {
        let _recovery = self.recovery.lock().await;
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::SessionClosed);
        }
        if self.generation.load(Ordering::SeqCst) != seen_generation && self.pick(0).is_some() {
            return Ok(());
        }
        for connection in self.lock_connections().iter() {
            connection.close();
        }
        // Session reinstatement needs the session FAILED (RFC 7143 6.3.5):
        // every connection is gone now (N5).
        if self.session_state() == SessionState::LoggedIn {
            self.record(SessionEvent::Failed);
        }
        let mut last_error = Error::ConnectionLost;
        for attempt in 0..self.config.reconnect_attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt))).await;
            }
            match self.establish().await {
                Ok(connections) => {
                    *self.lock_connections() = connections;
                    // The reinstatement cleared the failed instance (N6);
                    // the new one is logged in (N1).
                    self.record(SessionEvent::TimedOutOrReinstated);
                    self.record(SessionEvent::ConnectionLoggedIn);
                    self.generation.fetch_add(1, Ordering::SeqCst);
                    self.reinstatements.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(attempt, "session reinstated");
                    return Ok(());
                }
                Err(error) => {
                    tracing::warn!(attempt, %error, "reinstating the session failed");
                    last_error = error;
                }
            }
        }
        Err(last_error)
    }

    /// Whether a lost connection is recovered on its own, its tasks moved
    /// to its replacement (ErrorRecoveryLevel 2, RFC 7143 7.2.2).
    fn recovers_connections(&self) -> bool {
        self.parameters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|p| p.error_recovery_level >= 2)
    }

    /// ERL 2: logs in a new connection with the CID of `lost` (connection
    /// reinstatement, RFC 7143 6.3.4: the target logs the old one out and
    /// keeps its tasks for TASK REASSIGN) in its place among the session's
    /// connections; the rest of the session goes on meanwhile. Returns the
    /// replacement (one already made, if another task got there first).
    async fn reinstate_connection(&self, lost: &Arc<Connection>) -> Result<Arc<Connection>, Error> {
        let _recovery = self.recovery.lock().await;
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::SessionClosed);
        }
        let replaced = self
            .lock_connections()
            .iter()
            .find(|c| c.cid == lost.cid && !Arc::ptr_eq(c, lost) && c.is_alive())
            .cloned();
        if let Some(replacement) = replaced {
            return Ok(replacement);
        }
        lost.close();
        // Over a connection still up, the lost one is first logged out for
        // recovery (RFC 7143 11.14.1, explicit); with none, the login with
        // its CID logs it out (implicit). Both are the RFC's; a target may
        // take one better than the other (LIO 6.1 counts a connection being
        // reinstated against MaxConnections).
        let other = self
            .lock_connections()
            .iter()
            .find(|c| c.is_alive() && !Arc::ptr_eq(c, lost))
            .cloned();
        if let Some(other) = other {
            match self.logout_for_recovery(&other, lost.cid).await {
                Ok(time2wait) => tokio::time::sleep(time2wait.min(TIME2WAIT_MAX)).await,
                Err(error) => {
                    tracing::warn!(cid = lost.cid, %error, "logout for recovery failed: logging in with the CID");
                }
            }
        }
        let mut last_error = Error::ConnectionLost;
        for attempt in 0..self.config.reconnect_attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt))).await;
            }
            match self.join(lost.cid).await {
                Ok(logged_in) => {
                    let session = self
                        .parameters
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone();
                    let replacement = self.start(lost.cid, logged_in, session.as_ref());
                    let mut connections = self.lock_connections();
                    match connections.iter_mut().find(|c| Arc::ptr_eq(c, lost)) {
                        Some(slot) => *slot = Arc::clone(&replacement),
                        None => connections.push(Arc::clone(&replacement)),
                    }
                    drop(connections);
                    self.connection_recoveries.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(cid = lost.cid, attempt, "connection reinstated (ERL 2)");
                    return Ok(replacement);
                }
                Err(error) => {
                    tracing::warn!(cid = lost.cid, attempt, %error, "reinstating the connection failed");
                    last_error = error;
                }
            }
        }
        Err(last_error)
    }

    /// Logs out connection `cid` for recovery over `over` (RFC 7143
    /// 11.14.1, reason 2): its tasks stay for TASK REASSIGN. Returns
    /// Time2Wait (11.15.2); "CID not found" is taken as done (the target
    /// has already cleaned that connection up).
    async fn logout_for_recovery(&self, over: &Connection, cid: u16) -> Result<Duration, Error> {
        let itt = self.itt();
        let header = Header::new(
            Pdu::LogoutRequest(LogoutRequest {
                immediate: true,
                reason: LogoutReason::RemoveConnectionForRecovery,
                initiator_task_tag: itt,
                cid,
                cmd_sn: self.window.current(),
                exp_stat_sn: over.exp_stat_sn(),
            }),
            0,
        );
        let (reply, _) = self.exchange(over, itt, header, &[]).await?;
        match reply.pdu {
            Pdu::LogoutResponse(r) => match r.response {
                LogoutResponseCode::ClosedSuccessfully => {
                    tracing::info!(
                        cid,
                        time2wait = r.time2wait,
                        time2retain = r.time2retain,
                        "connection logged out for recovery"
                    );
                    Ok(Duration::from_secs(u64::from(r.time2wait)))
                }
                LogoutResponseCode::CidNotFound => Ok(Duration::ZERO),
                other => Err(Error::Protocol(format!(
                    "logout for recovery refused: {other:?}"
                ))),
            },
            other => Err(Error::Protocol(format!(
                "{:?} answering a logout",
                other.opcode()
            ))),
        }
    }

    /// [`Inner::reinstate_connection`] for a command that must be done by
    /// `deadline` (its `timeout`): the replacement, or `None` if connection
    /// recovery failed (logged; the session is reinstated instead).
    async fn recover_connection(
        &self,
        lost: &Arc<Connection>,
        deadline: tokio::time::Instant,
        timeout: Duration,
    ) -> Result<Option<Arc<Connection>>, Error> {
        let recovered = tokio::time::timeout_at(deadline, self.reinstate_connection(lost))
            .await
            .map_err(|_| Error::Timeout {
                timeout,
                waiting_for: "the connection to be reinstated",
            })?;
        match recovered {
            Ok(replacement) => Ok(Some(replacement)),
            Err(error) => {
                tracing::warn!(%error, "connection recovery failed: reinstating the session");
                Ok(None)
            }
        }
    }

    /// TASK REASSIGN (RFC 7143 11.5.1) of task `itt` to `connection`, with
    /// ExpDataSN 0 (the data acknowledgement point unchanged: the initiator
    /// asks for no DataACK, so the target sends all its Data-In again).
    /// "Task still allegiant" is asked again a few times: the target may
    /// still be logging the old connection out. Returns the response and
    /// the ExpCmdSN that came with it.
    async fn reassign(
        &self,
        connection: &Connection,
        itt: u32,
        lun: u64,
        cmd_sn: CmdSn,
    ) -> Result<(TaskResponse, CmdSn), Error> {
        let mut tries = 0;
        loop {
            let tmf_itt = self.itt();
            let exp_stat_sn = connection.exp_stat_sn();
            let header = |current: CmdSn| {
                Header::new(
                    Pdu::TaskManagementRequest(TaskManagementRequest {
                        immediate: true,
                        function: TaskFunction::TaskReassign,
                        lun: Lun(encode_lun(lun)),
                        initiator_task_tag: tmf_itt,
                        referenced_task_tag: itt,
                        cmd_sn: current,
                        exp_stat_sn,
                        ref_cmd_sn: cmd_sn,
                        exp_data_sn: DataSn::new(0),
                    }),
                    0,
                )
            };
            let (reply, _) = self
                .exchange_posted(connection, tmf_itt, || {
                    connection.post_immediate(header)?;
                    Ok(())
                })
                .await?;
            let Pdu::TaskManagementResponse(r) = reply.pdu else {
                return Err(Error::Protocol(format!(
                    "{:?} answering TASK REASSIGN",
                    reply.pdu.opcode()
                )));
            };
            if r.response == TaskResponse::TaskStillAllegiant && tries < REASSIGN_TRIES {
                tries += 1;
                tokio::time::sleep(REASSIGN_RETRY_AFTER).await;
                continue;
            }
            return Ok((r.response, r.exp_cmd_sn));
        }
    }

    async fn execute(self: &Arc<Self>, command: Command<'_>) -> Result<Response, Error> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::SessionClosed);
        }
        if command.cdb.is_empty() || command.cdb.len() > 16 + 255 * 4 - 4 {
            return Err(Error::InvalidCommand("CDB length"));
        }
        let reads = matches!(
            command.data,
            DataTransfer::Read(_) | DataTransfer::PooledRead(_) | DataTransfer::DiscardedRead(_)
        );
        let discarded = matches!(command.data, DataTransfer::DiscardedRead(_));
        let pooled = matches!(command.data, DataTransfer::PooledRead(_));
        let write_owner = match &command.data {
            DataTransfer::SharedWrite(bytes) => Some(bytes.clone()),
            _ => None,
        };
        let (mut read_into, write_data, expected_length) = match command.data {
            DataTransfer::None => (None, None, 0),
            DataTransfer::Read(buffer) => {
                let length = u32::try_from(buffer.len())
                    .map_err(|_| Error::InvalidCommand("transfer over 4 GiB"))?;
                (Some(ReadInto::Buffer(buffer)), None, length)
            }
            DataTransfer::PooledRead(length) => (Some(ReadInto::Pooled(length)), None, length),
            DataTransfer::DiscardedRead(length) => {
                (Some(ReadInto::Discarded(length)), None, length)
            }
            DataTransfer::Write(data) => {
                let length = u32::try_from(data.len())
                    .map_err(|_| Error::InvalidCommand("transfer over 4 GiB"))?;
                (None, Some(data), length)
            }
            DataTransfer::SharedWrite(_) => {
                let data = write_owner.as_deref().unwrap_or_default();
                let length = u32::try_from(data.len())
                    .map_err(|_| Error::InvalidCommand("transfer over 4 GiB"))?;
                (None, Some(data), length)
            }
        };
        let timeout = self.config.timeouts.command;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut retries = 0;
        // ERL 2: a lost connection is reinstated and its task moved there.
        let mut connection_recovery = self.recovers_connections();
        let mut resume: Option<(u32, CmdSn, Arc<Connection>)> = None;
        loop {
            let generation = self.generation.load(Ordering::SeqCst);
            let (connection, itt, start) = match resume.take() {
                Some((itt, cmd_sn, connection)) => (connection, itt, Start::Reassign(cmd_sn)),
                None => {
                    let Some(connection) = self.pick(command.lun) else {
                        let lost = self.lock_connections().first().cloned();
                        if let (true, Some(lost)) = (connection_recovery, lost) {
                            // ERL 2: no connection is usable; a reinstated
                            // one continues the session (RFC 7143 8.3 N4).
                            match self.recover_connection(&lost, deadline, timeout).await? {
                                Some(_) => continue,
                                None => connection_recovery = false,
                            }
                        }
                        tokio::time::timeout_at(deadline, self.recover(generation))
                            .await
                            .map_err(|_| Error::Timeout {
                                timeout,
                                waiting_for: "the session to be reinstated",
                            })??;
                        continue;
                    };
                    (connection, self.itt(), Start::Fresh)
                }
            };
            let sent_cmd_sn = AtomicU64::new(match start {
                Start::Reassign(cmd_sn) => u64::from(cmd_sn.get()),
                Start::Fresh => NO_CMD_SN,
            });
            let attempt = Attempt {
                inner: self,
                start,
                connection: &connection,
                itt,
                lun: command.lun,
                cdb: command.cdb,
                attribute: command.attribute,
                expected_length,
                write_data,
                write_owner: write_owner.as_ref(),
                sent_cmd_sn: &sent_cmd_sn,
            };
            let outcome = tokio::time::timeout_at(deadline, attempt.run(read_into.take())).await;
            let (buffer, gone) = match outcome {
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(AttemptError::Failed(error))) => return Err(error),
                Ok(Err(AttemptError::Lost(buffer))) => (buffer, false),
                Ok(Err(AttemptError::Gone { buffer, reinstate })) => {
                    // Sent again as a new command: on the connection it was
                    // reassigned to, or, if `reinstate`, after session
                    // recovery.
                    tracing::info!(
                        itt,
                        reinstate,
                        "reassigned task not at the target: sending it again"
                    );
                    connection_recovery &= !reinstate;
                    (buffer, !reinstate)
                }
                Err(_) => {
                    let cmd_sn = sent_cmd_sn.load(Ordering::SeqCst);
                    if cmd_sn != NO_CMD_SN {
                        // The target may still run the command: the caller
                        // hears of the timeout once it no longer can, so a
                        // write of the same blocks sent next never races it.
                        self.abort_timed_out(&connection, itt, command.lun, cmd_sn as u32)
                            .await;
                    }
                    return Err(Error::Timeout {
                        timeout,
                        waiting_for: "the command's status",
                    });
                }
            };
            if retries >= self.config.command_retries {
                return Err(Error::ConnectionLost);
            }
            retries += 1;
            read_into = match buffer {
                _ if discarded => Some(ReadInto::Discarded(expected_length)),
                _ if pooled => {
                    if let Some(buffer) = buffer {
                        self.read_buffers.give(buffer);
                    }
                    Some(ReadInto::Pooled(expected_length))
                }
                Some(buffer) => Some(ReadInto::Buffer(buffer)),
                None if reads => Some(ReadInto::Buffer(vec![0; expected_length as usize])),
                None => None,
            };
            if gone {
                continue;
            }
            if connection_recovery {
                match self
                    .recover_connection(&connection, deadline, timeout)
                    .await?
                {
                    Some(replacement) => {
                        let cmd_sn = sent_cmd_sn.load(Ordering::SeqCst);
                        if cmd_sn != NO_CMD_SN {
                            tracing::info!(
                                itt,
                                cid = connection.cid,
                                "command interrupted by a lost connection: reassigning it"
                            );
                            resume = Some((itt, CmdSn::new(cmd_sn as u32), replacement));
                        }
                        continue;
                    }
                    None => connection_recovery = false,
                }
            }
            tracing::info!(
                itt,
                retries,
                "command interrupted by a lost connection: retrying"
            );
            tokio::time::timeout_at(deadline, self.recover(generation))
                .await
                .map_err(|_| Error::Timeout {
                    timeout,
                    waiting_for: "the session to be reinstated",
                })??;
        }
    }

    /// Sends ABORT TASK for a timed-out command and waits for its answer
    /// (after which the task has no further effect, SAM-5 7.2; "task does
    /// not exist" means it had ended); drops the connection if the target
    /// does not answer that either, which ends the task with it (RFC 7143
    /// 7.1.4.1).
    async fn abort_timed_out(&self, connection: &Connection, itt: u32, lun: u64, cmd_sn: u32) {
        let result = self
            .task_management(
                connection,
                TaskFunction::AbortTask,
                lun,
                itt,
                Some(CmdSn::new(cmd_sn)),
            )
            .await;
        match result {
            Ok(()) | Err(Error::TaskManagement(_)) => {}
            Err(error) => {
                tracing::warn!(%error, "ABORT TASK failed: dropping the connection");
                connection.close();
            }
        }
    }

    async fn task_management(
        &self,
        connection: &Connection,
        function: TaskFunction,
        lun: u64,
        referenced_task_tag: u32,
        ref_cmd_sn: Option<CmdSn>,
    ) -> Result<(), Error> {
        let itt = self.itt();
        let exp_stat_sn = connection.exp_stat_sn();
        let header = |cmd_sn: CmdSn| {
            Header::new(
                Pdu::TaskManagementRequest(TaskManagementRequest {
                    immediate: true,
                    function,
                    lun: Lun(encode_lun(lun)),
                    initiator_task_tag: itt,
                    referenced_task_tag,
                    cmd_sn,
                    exp_stat_sn,
                    ref_cmd_sn: ref_cmd_sn.unwrap_or(cmd_sn),
                    exp_data_sn: DataSn::new(0),
                }),
                0,
            )
        };
        let mut sent_as = None;
        let (reply, _) = self
            .exchange_posted(connection, itt, || {
                sent_as = Some(connection.post_immediate(header)?);
                Ok(())
            })
            .await?;
        match reply.pdu {
            Pdu::TaskManagementResponse(r) if r.response == TaskResponse::FunctionComplete => {
                if let Some(tmf_cmd_sn) = sent_as {
                    self.end_aborted(function, lun, referenced_task_tag, tmf_cmd_sn);
                }
                Ok(())
            }
            Pdu::TaskManagementResponse(r) => Err(Error::TaskManagement(r.response)),
            other => Err(Error::Protocol(format!(
                "{:?} answering a task management request",
                other.opcode()
            ))),
        }
    }

    /// Ends this session's commands a completed task management function
    /// reached: the target has ended them without a status (RFC 7143
    /// 11.6.2), and every status sent before the function's response has
    /// been taken already (statuses are read in order), so a command still
    /// waiting now never gets one. A set or reset reaches the commands
    /// numbered before it (the function's CmdSN is read when it is queued
    /// behind them, [`Connection::post_immediate`]); TASK REASSIGN and
    /// the like end nothing.
    fn end_aborted(&self, function: TaskFunction, lun: u64, task: u32, tmf_cmd_sn: CmdSn) {
        let before = |tag: &CommandTag| tag.cmd_sn.is_some_and(|sn| sn.lt(tmf_cmd_sn));
        let reached = |itt: u32, tag: &CommandTag| match function {
            TaskFunction::AbortTask => itt == task,
            TaskFunction::AbortTaskSet
            | TaskFunction::ClearTaskSet
            | TaskFunction::LogicalUnitReset => tag.lun == lun && before(tag),
            TaskFunction::TargetWarmReset | TaskFunction::TargetColdReset => before(tag),
            _ => false,
        };
        let ended: usize = self
            .lock_connections()
            .iter()
            .map(|connection| connection.end_aborted(function, reached))
            .sum();
        if ended > 0 {
            tracing::info!(?function, lun, ended, "commands ended by task management");
        }
    }

    /// Sends one PDU and waits for the one reply to its ITT, within the
    /// management timeout.
    async fn exchange(
        &self,
        connection: &Connection,
        itt: u32,
        header: Header,
        data: &[u8],
    ) -> Result<(Header, Vec<u8>), Error> {
        self.exchange_posted(connection, itt, || connection.post(&header, data))
            .await
    }

    /// Registers `itt`, runs `post` (which sends its PDU), and waits for
    /// the one reply to it, within the management timeout.
    async fn exchange_posted(
        &self,
        connection: &Connection,
        itt: u32,
        post: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(Header, Vec<u8>), Error> {
        let timeout = self.config.timeouts.management;
        let mut events = connection.register(itt, None, None).map_err(|(e, _)| e)?;
        let _registration = Registration { connection, itt };
        let work = async {
            post()?;
            match events.recv().await {
                Some(TaskEvent::Reply(header, data)) => Ok((header, data)),
                Some(TaskEvent::Rejected(reason)) => Err(Error::Rejected(reason)),
                Some(TaskEvent::Scsi(Err(error))) => Err(error),
                Some(_) | None => Err(Error::ConnectionLost),
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| Error::Timeout {
                timeout,
                waiting_for: "a reply from the target",
            })?
    }
}

/// One try of a SCSI command on one connection.
struct Attempt<'a> {
    inner: &'a Inner,
    start: Start,
    connection: &'a Connection,
    itt: u32,
    lun: u64,
    cdb: &'a [u8],
    attribute: iscsi_proto::pdu::TaskAttribute,
    expected_length: u32,
    write_data: Option<&'a [u8]>,
    /// The shared buffer `write_data` lies in, when the caller gave one.
    write_owner: Option<&'a bytes::Bytes>,
    sent_cmd_sn: &'a AtomicU64,
}

impl Attempt<'_> {
    async fn run(self, read: Option<ReadInto>) -> Result<Response, AttemptError> {
        let connection = self.connection;
        let reads = read.is_some();
        // Over iSER, a slot among the receives that will take responses
        // (held until this attempt ends).
        // The semaphore is never closed, so acquiring cannot fail.
        let _slot = match &connection.response_slots {
            Some(slots) => Arc::clone(slots).acquire_owned().await.ok(),
            None => None,
        };
        let mut events = connection
            .register(self.itt, read, Some(self.lun))
            .map_err(|(_, buffer)| AttemptError::Lost(buffer))?;
        let _registration = Registration {
            connection,
            itt: self.itt,
        };
        let limits = connection.limits;
        let plan = match self.write_data {
            Some(_) => limits.write_plan(self.expected_length),
            None => WritePlan {
                immediate: 0,
                unsolicited: 0,
            },
        };
        let mut tracker = self.write_data.map(|_| {
            R2tTracker::new(limits, self.expected_length)
                .after_unsolicited(plan.immediate + plan.unsolicited)
        });
        let numbered = match self.start {
            Start::Fresh => None,
            Start::Reassign(cmd_sn) => {
                let reassigned = self
                    .inner
                    .reassign(connection, self.itt, self.lun, cmd_sn)
                    .await;
                let (response, exp_cmd_sn) = match reassigned {
                    Ok(answer) => answer,
                    Err(error) => return Err(self.lost_or(error, &mut events)),
                };
                match response {
                    TaskResponse::FunctionComplete => {
                        // It goes on here: a read's Data-In and status, a
                        // write's R2Ts for what the target lacks.
                        self.inner.tasks_reassigned.fetch_add(1, Ordering::Relaxed);
                        if let Some(tracker) = tracker.as_mut() {
                            tracker.reassigned();
                        }
                        None
                    }
                    // The target never had it (ExpCmdSN has not passed it):
                    // the same task again, with its CmdSN (RFC 7143 7.2.1).
                    TaskResponse::TaskDoesNotExist if !cmd_sn.lt(exp_cmd_sn) => Some(cmd_sn),
                    other => {
                        tracing::warn!(
                            itt = self.itt,
                            cmd_sn = cmd_sn.get(),
                            exp_cmd_sn = exp_cmd_sn.get(),
                            ?other,
                            "TASK REASSIGN refused"
                        );
                        let buffer = self.connection.unregister(self.itt);
                        return Err(AttemptError::Gone {
                            buffer,
                            reinstate: other != TaskResponse::TaskDoesNotExist,
                        });
                    }
                }
            }
        };
        let send = match (self.start, numbered) {
            (Start::Fresh, _) => self.send_command(reads, &plan, None).await,
            (Start::Reassign(_), Some(cmd_sn)) => {
                self.send_command(reads, &plan, Some(cmd_sn)).await
            }
            (Start::Reassign(_), None) => Ok(()),
        };
        if let Err(error) = send {
            return Err(self.lost_or(error, &mut events));
        }
        // At ERL 1 an R2T lost on the way is asked for again (RFC 7143
        // 11.16): a write that waits for an R2T this long sends an R2T
        // SNACK, then again at twice the wait, up to a limit.
        let recovers = connection.recovers_data();
        let mut r2t_wait = R2T_SNACK_AFTER;
        let mut snacked = false;
        loop {
            let awaits_r2t = recovers && tracker.as_ref().is_some_and(R2tTracker::awaits_r2t);
            let event = if awaits_r2t {
                match tokio::time::timeout(r2t_wait, events.recv()).await {
                    Ok(event) => event,
                    Err(_) => {
                        let next = tracker.as_ref().map_or(0, R2tTracker::next_r2t_sn);
                        tracing::warn!(
                            itt = self.itt,
                            r2t_sn = next,
                            "no R2T for {r2t_wait:?}: R2T SNACK"
                        );
                        connection.r2t_snack(self.itt, next, 0);
                        snacked = true;
                        r2t_wait = (r2t_wait * 2).min(R2T_SNACK_MAX_WAIT);
                        continue;
                    }
                }
            } else {
                events.recv().await
            };
            let Some(event) = event else { break };
            match event {
                TaskEvent::Scsi(result) => return result.map_err(AttemptError::Failed),
                TaskEvent::Lost(buffer) => return Err(AttemptError::Lost(buffer)),
                TaskEvent::Rejected(reason) if snacked => {
                    // The SNACK asked for an R2T the target had not sent
                    // yet: it comes when the target is ready.
                    tracing::debug!(itt = self.itt, ?reason, "R2T SNACK refused");
                    snacked = false;
                }
                TaskEvent::Rejected(reason) => {
                    return Err(AttemptError::Failed(Error::Rejected(reason)));
                }
                TaskEvent::R2t(r2t) => {
                    r2t_wait = R2T_SNACK_AFTER;
                    let (Some(tracker), Some(data)) = (tracker.as_mut(), self.write_data) else {
                        connection.close();
                        return Err(AttemptError::Failed(Error::Protocol(
                            "R2T for a command that writes nothing".into(),
                        )));
                    };
                    let recoveries = tracker.recoveries();
                    let segments = match tracker.r2t(
                        r2t.r2t_sn.get(),
                        r2t.target_transfer_tag,
                        r2t.buffer_offset,
                        r2t.desired_data_transfer_length,
                    ) {
                        Ok(segments) => segments,
                        Err(TransferError::R2tSnOutOfOrder { got, expected }) if recovers => {
                            if got.wrapping_sub(expected) < 0x8000_0000 {
                                // R2Ts before this one were lost: ask for
                                // them all again, this one included.
                                connection.r2t_snack(self.itt, expected, 0);
                                snacked = true;
                            }
                            // Else a copy of one already answered (a
                            // SNACK's answer crossing the original).
                            continue;
                        }
                        Err(error) => {
                            // ERL 0: the task cannot go on; the connection
                            // is in an unknown state.
                            connection.close();
                            return Err(AttemptError::Failed(Error::Protocol(format!(
                                "bad R2T: {error}"
                            ))));
                        }
                    };
                    if tracker.recoveries() > recoveries {
                        tracing::info!(
                            itt = self.itt,
                            offset = r2t.buffer_offset,
                            length = r2t.desired_data_transfer_length,
                            "recovery R2T: sending the data again"
                        );
                        connection.recovery_r2t_answered();
                    }
                    let sent = self
                        .send_data_out(
                            data,
                            r2t.target_transfer_tag,
                            r2t.desired_data_transfer_length,
                            segments,
                        )
                        .await;
                    if let Err(error) = sent {
                        return Err(self.lost_or(error, &mut events));
                    }
                    tracker.answered(r2t.target_transfer_tag);
                }
                TaskEvent::Reply(header, _) => {
                    tracing::debug!(opcode = ?header.pdu.opcode(), "ignoring a reply for a SCSI task");
                }
            }
        }
        Err(AttemptError::Lost(None))
    }

    /// A send failed: the connection is closed, so the task's buffer comes
    /// back through its channel as `Lost`.
    fn lost_or(
        &self,
        error: Error,
        events: &mut mpsc::UnboundedReceiver<TaskEvent>,
    ) -> AttemptError {
        if let Some(buffer) = self.connection.unregister(self.itt) {
            return AttemptError::Lost(Some(buffer));
        }
        while let Ok(event) = events.try_recv() {
            if let TaskEvent::Lost(buffer) = event {
                return AttemptError::Lost(buffer);
            }
        }
        match error {
            Error::ConnectionLost | Error::Datamover(_) => AttemptError::Lost(None),
            other => AttemptError::Failed(other),
        }
    }

    /// Sends the SCSI Command with its immediate data, then the
    /// unsolicited Data-Out. A command whose data is small is posted (it
    /// leaves in a batch with others); a larger one is sent directly from
    /// the caller's buffer. Either way its CmdSN is taken in the same hold
    /// of the outbox's lock that queues or writes it, so the CmdSN order on
    /// the wire is the order taken.
    async fn send_command(
        &self,
        reads: bool,
        plan: &WritePlan,
        numbered: Option<CmdSn>,
    ) -> Result<(), Error> {
        let connection = self.connection;
        let window = connection.window();
        let data = self.write_data.unwrap_or_default();
        let immediate = &data[..plan.immediate as usize];
        let header = |cmd_sn: CmdSn| self.command_header(reads, plan, cmd_sn);
        let unsolicited = (plan.immediate + plan.unsolicited) as usize;
        if self.write_data.is_some()
            && unsolicited < self.expected_length as usize
            && connection.descriptors.wanted()
        {
            // The target will fetch the rest itself (iSER: RDMA Read).
            connection
                .descriptors
                .data_out(self.itt, data, self.write_owner, unsolicited);
        }
        if let Some(cmd_sn) = numbered {
            connection.post_command_numbered(self.itt, immediate, cmd_sn, header)?;
            return self
                .send_data_out(data, RESERVED_TAG, plan.unsolicited, self.unsolicited(plan))
                .await;
        }
        if unsolicited <= POSTED_DATA_LIMIT {
            while connection
                .post_command(self.itt, immediate, header)?
                .is_none()
            {
                window.wait_open().await;
            }
            return self
                .send_data_out(data, RESERVED_TAG, plan.unsolicited, self.unsolicited(plan))
                .await;
        }
        let mut sending = loop {
            let mut sending = connection.sending().await;
            if sending
                .send_command(self.itt, immediate, header)
                .await?
                .is_some()
            {
                break sending;
            }
            drop(sending);
            window.wait_open().await;
        };
        self.write_data_out(&mut sending, data, RESERVED_TAG, self.unsolicited(plan))
            .await
    }

    /// The SCSI Command PDU (RFC 7143 section 11.3) numbered `cmd_sn`.
    fn command_header(&self, reads: bool, plan: &WritePlan, cmd_sn: CmdSn) -> Header {
        self.sent_cmd_sn
            .store(u64::from(cmd_sn.get()), Ordering::SeqCst);
        let mut cdb = [0u8; 16];
        let head = self.cdb.len().min(16);
        cdb[..head].copy_from_slice(&self.cdb[..head]);
        let mut header = Header::new(
            Pdu::ScsiCommand(ScsiCommand {
                immediate: false,
                final_flag: plan.unsolicited == 0,
                read: reads,
                write: self.write_data.is_some(),
                attr: self.attribute,
                lun: Lun(encode_lun(self.lun)),
                initiator_task_tag: self.itt,
                expected_data_transfer_length: self.expected_length,
                cmd_sn,
                exp_stat_sn: self.connection.exp_stat_sn(),
                cdb,
            }),
            plan.immediate,
        );
        if self.cdb.len() > 16 {
            header.ahs.push(Ahs::ExtendedCdb(self.cdb[16..].to_vec()));
        }
        header
    }

    /// The unsolicited Data-Out PDUs of `plan` (RFC 7143 section 13.10).
    fn unsolicited(&self, plan: &WritePlan) -> Vec<DataSegment> {
        data_segments(
            plan.immediate,
            plan.unsolicited,
            self.connection.limits.max_send_segment,
        )
    }

    /// Sends one Data-Out sequence (unsolicited, or the answer to an R2T
    /// with `target_transfer_tag`) of `length` bytes: posted when small,
    /// sent directly from the caller's buffer otherwise.
    async fn send_data_out(
        &self,
        data: &[u8],
        target_transfer_tag: u32,
        length: u32,
        segments: impl IntoIterator<Item = DataSegment>,
    ) -> Result<(), Error> {
        let connection = self.connection;
        if length as usize <= POSTED_DATA_LIMIT {
            for segment in segments {
                let (header, range) = self.data_out(target_transfer_tag, &segment);
                connection.post(&header, &data[range])?;
            }
            return Ok(());
        }
        let mut sending = connection.sending().await;
        self.write_data_out(&mut sending, data, target_transfer_tag, segments)
            .await
    }

    /// Writes the Data-Out PDUs of `segments` directly from `data`, under
    /// the write lock `sending` holds.
    async fn write_data_out(
        &self,
        sending: &mut Sending<'_>,
        data: &[u8],
        target_transfer_tag: u32,
        segments: impl IntoIterator<Item = DataSegment>,
    ) -> Result<(), Error> {
        for segment in segments {
            let (header, range) = self.data_out(target_transfer_tag, &segment);
            sending.send(&header, &data[range]).await?;
        }
        Ok(())
    }

    /// The Data-Out PDU (RFC 7143 section 11.7) of `segment`, and where
    /// its data lies in the command's buffer.
    fn data_out(
        &self,
        target_transfer_tag: u32,
        segment: &DataSegment,
    ) -> (Header, std::ops::Range<usize>) {
        let start = segment.offset as usize;
        let header = Header::new(
            Pdu::DataOut(DataOut {
                final_flag: segment.last_in_sequence,
                lun: Lun(encode_lun(self.lun)),
                initiator_task_tag: self.itt,
                target_transfer_tag,
                exp_stat_sn: self.connection.exp_stat_sn(),
                data_sn: DataSn::new(segment.data_sn),
                buffer_offset: segment.offset,
            }),
            segment.length,
        );
        (header, start..start + segment.length as usize)
    }
}
