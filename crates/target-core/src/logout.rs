//! What a Logout Request does (RFC 7143 sections 11.14, 11.15): which
//! response it gets and what ends with it. The driver then does it:
//! drops writes still collecting data, waits for commands being executed,
//! releases the nexus when the session ends, closes.

use iscsi_proto::pdu::{LogoutReason, LogoutResponseCode};

/// What the Logout Request decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogoutPlan {
    /// This connection closes; the response says "closed successfully"
    /// once the connection's commands are over. Whether the session ends
    /// with it is [`ends_session`], asked then.
    Close {
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
    /// The session recovers connections (ErrorRecoveryLevel 2).
    pub recovers_connections: bool,
}

/// Decides a Logout Request with `reason` naming connection `cid`.
pub fn decide(reason: LogoutReason, cid: u16, context: LogoutContext) -> LogoutPlan {
    match reason {
        LogoutReason::CloseSession | LogoutReason::CloseConnection => LogoutPlan::Close {
            close_session: reason == LogoutReason::CloseSession,
        },
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

/// Whether a closing logout ends the session, its nexus lost: asked to
/// close the session, or closing the last of its `connections` (counted
/// once the connection's commands are over: another may have ended
/// meanwhile).
pub fn ends_session(close_session: bool, connections: u32) -> bool {
    close_session || connections <= 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(erl2: bool) -> LogoutContext {
        LogoutContext {
            cid: 1,
            recovers_connections: erl2,
        }
    }

    #[test]
    fn closing_the_last_connection_ends_the_session() {
        let close = |reason| decide(reason, 1, context(false));
        assert_eq!(
            close(LogoutReason::CloseConnection),
            LogoutPlan::Close {
                close_session: false
            }
        );
        assert_eq!(
            close(LogoutReason::CloseSession),
            LogoutPlan::Close {
                close_session: true
            }
        );
        assert!(ends_session(false, 1));
        assert!(!ends_session(false, 2));
        assert!(ends_session(true, 3));
    }

    #[test]
    fn removing_a_connection_for_recovery_needs_erl2_and_another_cid() {
        let remove = LogoutReason::RemoveConnectionForRecovery;
        assert_eq!(
            decide(remove, 2, context(true)),
            LogoutPlan::RemoveForRecovery(2)
        );
        let refused = LogoutPlan::Refuse(LogoutResponseCode::RecoveryNotSupported);
        assert_eq!(decide(remove, 2, context(false)), refused);
        assert_eq!(decide(remove, 1, context(true)), refused);
    }
}
