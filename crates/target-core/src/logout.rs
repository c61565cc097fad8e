//! What a Logout Request does (RFC 7143 sections 11.14, 11.15): which
//! response it gets and what ends with it. The driver then does it:
//! drops writes still collecting data, waits for commands being executed,
//! releases the nexus when the session ends, closes.

use iscsi_proto::pdu::{LogoutReason, LogoutResponseCode};

/// What the Logout Request decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogoutPlan {
    /// This connection closes (and the whole session with it when
    /// `session`); the response says "closed successfully" once the
    /// connection's commands are over.
    Close {
        /// The session ends too (reason "close the session", or the last
        /// connection is closing: the nexus is lost either way).
        session_ends: bool,
        /// The initiator asked to close the whole session.
        close_session: bool,
    },
    /// ERL 2: the connection with this CID (another one) is closed and its
    /// tasks kept for TASK REASSIGN (RFC 7143 11.14.1); if no connection
    /// has it, the answer is "CID not found".
    RemoveForRecovery(u16),
    /// Answered with this response code and nothing else happens.
    Refuse(LogoutResponseCode),
}

/// The session as a logout sees it.
#[derive(Clone, Copy, Debug)]
pub struct LogoutContext {
    /// The CID of the connection the request came on.
    pub cid: u16,
    /// Connections in full feature phase.
    pub connections: u32,
    /// The session recovers connections (ErrorRecoveryLevel 2).
    pub recovers_connections: bool,
}

/// Decides a Logout Request with `reason` naming connection `cid`.
pub fn decide(reason: LogoutReason, cid: u16, context: LogoutContext) -> LogoutPlan {
    match reason {
        LogoutReason::CloseSession | LogoutReason::CloseConnection => {
            let close_session = reason == LogoutReason::CloseSession;
            LogoutPlan::Close {
                session_ends: close_session || context.connections <= 1,
                close_session,
            }
        }
        // Removing a connection for recovery needs ERL 2 and is asked for
        // on another connection.
        LogoutReason::RemoveConnectionForRecovery
            if context.recovers_connections && cid != context.cid =>
        {
            LogoutPlan::RemoveForRecovery(cid)
        }
        _ => LogoutPlan::Refuse(LogoutResponseCode::RecoveryNotSupported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(connections: u32, erl2: bool) -> LogoutContext {
        LogoutContext {
            cid: 1,
            connections,
            recovers_connections: erl2,
        }
    }

    #[test]
    fn closing_the_last_connection_ends_the_session() {
        let close = |n| decide(LogoutReason::CloseConnection, 1, context(n, false));
        assert_eq!(
            close(1),
            LogoutPlan::Close {
                session_ends: true,
                close_session: false
            }
        );
        assert_eq!(
            close(2),
            LogoutPlan::Close {
                session_ends: false,
                close_session: false
            }
        );
        assert_eq!(
            decide(LogoutReason::CloseSession, 1, context(3, false)),
            LogoutPlan::Close {
                session_ends: true,
                close_session: true
            }
        );
    }

    #[test]
    fn removing_a_connection_for_recovery_needs_erl2_and_another_cid() {
        let remove = LogoutReason::RemoveConnectionForRecovery;
        assert_eq!(
            decide(remove, 2, context(2, true)),
            LogoutPlan::RemoveForRecovery(2)
        );
        let refused = LogoutPlan::Refuse(LogoutResponseCode::RecoveryNotSupported);
        assert_eq!(decide(remove, 2, context(2, false)), refused);
        assert_eq!(decide(remove, 1, context(2, true)), refused);
    }
}
