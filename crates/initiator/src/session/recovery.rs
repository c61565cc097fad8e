//! Recovery from a lost connection. ERL 0: the session is reinstated (a
//! leading login with the same ISID, RFC 7143 6.3.5) and its commands are
//! sent again. ERL 2: the lost connection is logged out for recovery over
//! another one (11.14.1, reason 2) or by a login with its CID, a new
//! connection logs in with that CID (6.3.4), and each task is moved there
//! with TASK REASSIGN (11.5.1). The rest of the session goes on meanwhile.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use iscsi_proto::pdu::{
    Header, LogoutReason, LogoutRequest, LogoutResponseCode, Lun, Pdu, TaskFunction,
    TaskManagementRequest, TaskResponse,
};
use iscsi_proto::serial::{CmdSn, DataSn};
use iscsi_proto::state::{SessionEvent, SessionState};

use super::Inner;
use crate::command::encode_lun;
use crate::connection::Connection;
use crate::error::Error;

/// The longest Time2Wait a logout for recovery is waited out (a target may
/// ask for up to 3600 s, RFC 7143 13.15; commands wait meanwhile).
const TIME2WAIT_MAX: Duration = Duration::from_secs(2);

/// How many times a TASK REASSIGN answered "task still allegiant" is sent
/// again, [`REASSIGN_RETRY_AFTER`] apart.
const REASSIGN_TRIES: u32 = 10;

const REASSIGN_RETRY_AFTER: Duration = Duration::from_millis(200);

/// The most time between two reinstatement attempts.
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);

/// When to try logging in again after a loss: `reconnect_attempts` times,
/// or until `replacement_timeout` has passed, 250 ms apart at first and
/// 250 ms more each time (at most [`RETRY_PAUSE_MAX`]).
struct Retries {
    attempt: u32,
    limit: Limit,
}

enum Limit {
    Attempts(u32),
    Until(tokio::time::Instant),
}

impl Retries {
    fn new(config: &crate::config::SessionConfig) -> Retries {
        let limit = match config.replacement_timeout {
            Some(timeout) => Limit::Until(tokio::time::Instant::now() + timeout),
            None => Limit::Attempts(config.reconnect_attempts.max(1)),
        };
        Retries { attempt: 0, limit }
    }

    /// When the replacement timeout runs out, if one does: no login
    /// attempt may run past it (a login to a hung target would otherwise
    /// wait out its whole login timeout, 15 s by default, beyond it).
    fn deadline(&self) -> Option<tokio::time::Instant> {
        match self.limit {
            Limit::Until(deadline) => Some(deadline),
            Limit::Attempts(_) => None,
        }
    }

    /// One attempt, at once: a session whose replacement timeout has run
    /// out tries a login now and then, not a whole schedule each time.
    fn once() -> Retries {
        Retries {
            attempt: 0,
            limit: Limit::Attempts(1),
        }
    }

    /// Waits for the next attempt's time and returns its number, or `None`
    /// when no attempt is left. The first comes at once, and there is
    /// always one.
    async fn next(&mut self) -> Option<u32> {
        let attempt = self.attempt;
        let pause = (Duration::from_millis(250) * attempt).min(RETRY_PAUSE_MAX);
        match self.limit {
            Limit::Attempts(n) if attempt >= n => return None,
            Limit::Until(deadline) if attempt > 0 => {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return None;
                }
                tokio::time::sleep(pause.min(deadline - now)).await;
            }
            _ if attempt > 0 => tokio::time::sleep(pause).await,
            _ => {}
        }
        self.attempt += 1;
        Some(attempt)
    }
}

impl Inner {
    /// Reinstates the session after a lost connection, unless another task
    /// already did since `seen_generation`.
    pub(super) async fn recover(&self, seen_generation: u64) -> Result<(), Error> {
        let failures = self.failed_reinstatements.load(Ordering::SeqCst);
        // A failed session (its replacement timeout ran out) fails at once
        // while another command's login attempt is under way, rather than
        // queueing behind it.
        let failed = self
            .config
            .replacement_timeout
            .filter(|_| self.lock_expired().is_some());
        let _recovery = match failed {
            Some(timeout) => match self.recovery.try_lock() {
                Ok(guard) => guard,
                Err(_) => return Err(Error::ReplacementTimeoutExpired { timeout }),
            },
            None => self.recovery.lock().await,
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::SessionClosed);
        }
        if self.failed_reinstatements.load(Ordering::SeqCst) != failures {
            return Err(Error::ConnectionLost);
        }
        if self.generation.load(Ordering::SeqCst) != seen_generation && self.pick(0).is_some() {
            return Ok(());
        }
        let expired = *self.lock_expired();
        if let (Some(next_try), Some(timeout)) = (expired, self.config.replacement_timeout)
            && tokio::time::Instant::now() < next_try
        {
            return Err(Error::ReplacementTimeoutExpired { timeout });
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
        let mut schedule = match expired {
            Some(_) => Retries::once(),
            None => Retries::new(&self.config),
        };
        while let Some(attempt) = schedule.next().await {
            let established = match schedule.deadline() {
                // The attempt made at the deadline still gets its time.
                Some(deadline) => tokio::time::timeout_at(
                    deadline.max(tokio::time::Instant::now() + RETRY_PAUSE_MAX),
                    self.establish(),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Timeout {
                        timeout: self.config.replacement_timeout.unwrap_or_default(),
                        waiting_for: "a login within the replacement timeout",
                    })
                }),
                None => self.establish().await,
            };
            match established {
                Ok(connections) => {
                    *self.lock_connections() = connections;
                    // The reinstatement cleared the failed instance (N6);
                    // the new one is logged in (N1).
                    self.record(SessionEvent::TimedOutOrReinstated);
                    self.record(SessionEvent::ConnectionLoggedIn);
                    self.generation.fetch_add(1, Ordering::SeqCst);
                    self.reinstatements.fetch_add(1, Ordering::Relaxed);
                    *self.lock_expired() = None;
                    tracing::info!(attempt, "session reinstated");
                    return Ok(());
                }
                Err(error) => {
                    tracing::warn!(attempt, %error, "reinstating the session failed");
                    last_error = error;
                }
            }
        }
        self.failed_reinstatements.fetch_add(1, Ordering::SeqCst);
        if let Some(timeout) = self.config.replacement_timeout {
            let next_try = tokio::time::Instant::now() + RETRY_PAUSE_MAX;
            if self.lock_expired().replace(next_try).is_none() {
                tracing::warn!(
                    ?timeout,
                    error = %last_error,
                    "the replacement timeout ran out: commands fail at once until a login succeeds"
                );
            }
            // Every command of a failed session fails alike, the first ones
            // too (the last login's error is in the log).
            return Err(Error::ReplacementTimeoutExpired { timeout });
        }
        Err(last_error)
    }

    fn lock_expired(&self) -> std::sync::MutexGuard<'_, Option<tokio::time::Instant>> {
        self.expired.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a lost connection is recovered on its own, its tasks moved
    /// to its replacement (ErrorRecoveryLevel 2, RFC 7143 7.2.2).
    pub(super) fn recovers_connections(&self) -> bool {
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
        let mut schedule = Retries::new(&self.config);
        while let Some(attempt) = schedule.next().await {
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
    pub(super) async fn recover_connection(
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
    pub(super) async fn reassign(
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SessionConfig;

    /// The attempts' times (ms after the loss) a configuration gives, on
    /// tokio's paused clock.
    async fn schedule(config: &SessionConfig) -> Vec<u128> {
        let start = tokio::time::Instant::now();
        let mut retries = Retries::new(config);
        let mut times = Vec::new();
        while retries.next().await.is_some() {
            times.push(start.elapsed().as_millis());
        }
        times
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_by_count_or_until_the_replacement_timeout() {
        let mut config = SessionConfig {
            reconnect_attempts: 3,
            ..SessionConfig::default()
        };
        assert_eq!(schedule(&config).await, [0, 250, 750]);
        config.reconnect_attempts = 0;
        assert_eq!(schedule(&config).await, [0], "always one attempt");
        // 250 ms more each time up to 2 s apart, the last at the deadline.
        config.replacement_timeout = Some(Duration::from_secs(10));
        assert_eq!(
            schedule(&config).await,
            [0, 250, 750, 1500, 2500, 3750, 5250, 7000, 9000, 10000]
        );
    }
}
