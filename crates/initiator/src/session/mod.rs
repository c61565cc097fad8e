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
//!
//! | module | owns |
//! |---|---|
//! | `connections` | the session's connections: the leading login and the further MC/S logins, each connection started, one picked for a command by [`crate::Scheduling`] |
//! | `execute` | a SCSI command: its tries (retries on a reinstated session, TASK REASSIGN on a reinstated connection), and one try on one connection (`Attempt`): the command, immediate, unsolicited and solicited data, R2Ts and R2T SNACKs |
//! | `task_management` | task management functions, and the commands a completed one ends |
//! | `recovery` | ERL 0 session reinstatement; ERL 2 connection reinstatement, logout for recovery and TASK REASSIGN |
//!
//! This module keeps [`Session`], the public face, and what its parts
//! share: the session's state (`Inner`), ITTs, and the exchange of one
//! PDU for its one reply.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use iscsi_proto::pdu::login::Isid;
use iscsi_proto::pdu::{
    Header, LogoutReason, LogoutRequest, LogoutResponseCode, Lun, NopOut, Pdu, RESERVED_TAG,
    TaskFunction, TaskResponse,
};
use iscsi_proto::serial::CmdSn;
use iscsi_proto::state::{ConnectionEvent, Role, SessionEvent, SessionState, SessionStateMachine};
use iscsi_proto::text::NegotiatedParameters;

use crate::buffers::ReadBuffers;
use crate::command::{Command, Response, Sense};
use crate::config::SessionConfig;
use crate::connection::{CommandWindow, Connection, SendCounters, TaskEvent};
use crate::error::Error;
use crate::login::random_isid;
use crate::url::IscsiUrl;
use iscsi_datamover::tap::{Tee, WireCounter, WireCounts, WireTap};

mod affinity;
pub use affinity::with_connection_affinity;
mod connections;
mod execute;
mod recovery;
mod task_management;

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
    /// Reinstatements that gave up: a command that was waiting for one
    /// fails with it instead of starting its own (at QD 32, one after the
    /// other, 32 times the wait).
    failed_reinstatements: AtomicU64,
    /// Set once a replacement timeout has run out with the session still
    /// down: the earliest time of the next login attempt. Until then a
    /// command fails at once instead of waiting a whole replacement
    /// timeout again (open-iscsi's FAILED session does the same: I/O is
    /// failed fast while it keeps trying to log in). Cleared by a login.
    expired: Mutex<Option<tokio::time::Instant>>,
    /// Connections reinstated with their CID at ErrorRecoveryLevel 2.
    connection_recoveries: AtomicU64,
    /// Tasks moved to a new connection by TASK REASSIGN.
    tasks_reassigned: AtomicU64,
    /// UNIT ATTENTIONs ASYMMETRIC ACCESS STATE CHANGED (2Ah/06h) received:
    /// a multipath set reads the port groups again when it moves.
    access_changes: AtomicU64,
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
            failed_reinstatements: AtomicU64::new(0),
            expired: Mutex::new(None),
            connection_recoveries: AtomicU64::new(0),
            tasks_reassigned: AtomicU64::new(0),
            access_changes: AtomicU64::new(0),
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

    /// The URL of LUN `lun` through this session's portal and target
    /// (without credentials).
    pub fn url(&self, lun: u64) -> IscsiUrl {
        let portal = &self.inner.portal;
        let (host, port) = portal.rsplit_once(':').unwrap_or((portal, "3260"));
        IscsiUrl {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: port.parse().unwrap_or(3260),
            target: Some(self.inner.target_name.clone()),
            lun,
            lun_named: true,
            user: None,
            secret: None,
            iser: self.inner.iser,
        }
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

    /// The SCSI commands each connection has carried since it logged in,
    /// by CID, in the session's connection order (what MC/S scheduling
    /// and [`with_connection_affinity`] did).
    pub fn commands_per_connection(&self) -> Vec<(u16, u64)> {
        self.inner
            .lock_connections()
            .iter()
            .map(|c| (c.cid, c.commands_registered.load(Ordering::Relaxed)))
            .collect()
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

    /// How many SNACK Requests the session sent at ErrorRecoveryLevel 1 or
    /// more (RFC 7143 7.3): Data/R2T SNACKs for a gap or a Data-In whose
    /// data digest failed, and Status SNACKs. One SNACK may cover a run of
    /// lost PDUs, so this counts requests, not lost PDUs.
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
        let response = self.inner.execute(command).await?;
        if response.status == crate::command::STATUS_CHECK_CONDITION
            && response
                .sense()
                .is_some_and(|s| (s.key, s.asc, s.ascq) == (Sense::UNIT_ATTENTION, 0x2A, 0x06))
        {
            self.inner.access_changes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(response)
    }

    /// How many UNIT ATTENTIONs ASYMMETRIC ACCESS STATE CHANGED (SPC-5
    /// 5.16.2.5) this session has received: the LU's target port groups
    /// changed state, and a host with several paths chooses again.
    pub fn access_changes(&self) -> u64 {
        self.inner.access_changes.load(Ordering::Relaxed)
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
