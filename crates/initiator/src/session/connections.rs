//! The session's connections: what a login sends, the leading login (a
//! new session, or the reinstatement of ours) and the further logins of
//! an MC/S session, each logged-in connection started with what the
//! session shares with it, and the connection a command goes on, picked by
//! the scheduling policy. Recovery logs connections in through here too.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use iscsi_proto::text::NegotiatedParameters;
use iscsi_proto::transfer::Limits;

use super::Inner;
use super::affinity::CONNECTION_AFFINITY;
use crate::config::Scheduling;
use crate::connection::{Connection, SessionShared};
use crate::error::Error;
use crate::login::{LoginRequestParams, login};

impl Inner {
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
    pub(super) async fn establish(&self) -> Result<Vec<Arc<Connection>>, Error> {
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

    /// Logs in a connection with CID `cid` to the session (a further MC/S
    /// connection, or a connection reinstatement if `cid` is in use) and
    /// takes the command window its login response gives.
    pub(super) async fn join(&self, cid: u16) -> Result<crate::login::LoggedIn, Error> {
        let tsih = self.tsih.load(Ordering::Relaxed);
        let joined = login(&self.config, self.login_params(tsih, cid)).await?;
        let c = &joined.complete;
        self.window.update(c.exp_cmd_sn, c.max_cmd_sn);
        Ok(joined)
    }

    /// Starts a logged-in connection. A joining one (or a reinstated one)
    /// negotiated only its own keys: the leading-only ones (ErrorRecoveryLevel,
    /// the burst lengths...) are the session's, from `session`.
    pub(super) fn start(
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
    pub(super) fn pick(&self, lun: u64) -> Option<Arc<Connection>> {
        let connections = self.lock_connections();
        let count = connections.len();
        if count == 0 {
            return None;
        }
        let affinity = CONNECTION_AFFINITY.try_with(|index| *index).ok();
        let first = match (affinity, self.config.scheduling) {
            (Some(index), _) => index % count,
            (None, Scheduling::RoundRobin) => {
                self.next_connection.fetch_add(1, Ordering::Relaxed) % count
            }
            (None, Scheduling::LunAffinity) => (lun % count as u64) as usize,
        };
        (0..count)
            .map(|i| &connections[(first + i) % count])
            .find(|c| c.is_alive())
            .cloned()
    }
}
