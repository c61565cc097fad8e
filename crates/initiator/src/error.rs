//! Why an initiator operation failed, said by whose fault it was: the
//! caller's input ([`Error::Url`], [`Error::InvalidCommand`]), the network
//! ([`Error::Connect`], [`Error::Datamover`], [`Error::ConnectionLost`],
//! [`Error::Timeout`]), the target breaking the protocol
//! ([`Error::Protocol`], [`Error::Rejected`]), the target refusing
//! ([`Error::Login`], [`Error::TaskManagement`]) or the SCSI layer answering
//! with a status other than GOOD ([`Error::Status`]).
//!
//! No variant both prints an inner error and returns it as its `source()`:
//! `anyhow`'s `{:#}` (what the `iscsi` CLI prints) writes every error of the
//! chain, so such a variant would say its cause twice ("Connection refused
//! (os error 111): Connection refused (os error 111)"). Each message says it
//! all instead, and the chain ends at it.

use std::time::Duration;

use iscsi_datamover::DatamoverError;
use iscsi_proto::login::initiator::InitiatorLoginError;
use iscsi_proto::pdu::{RejectReason, TaskFunction, TaskResponse};

use crate::sense::Sense;

/// An initiator failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is not of the form `iscsi://[user[%secret]@]host[:port]/target-iqn/lun`.
    #[error("invalid iSCSI URL {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A configuration value is invalid (an unknown key, a bad number).
    #[error("invalid setting: {0}")]
    Config(String),
    /// The TCP connection could not be made.
    #[error("connecting to {address}: {error}")]
    Connect {
        /// The address tried.
        address: String,
        /// The socket error (in the message, not a `source`: see the
        /// module doc).
        error: std::io::Error,
    },
    /// The login failed (refused, redirected too often, CHAP failure,
    /// negotiation failure or a target breaking the login rules). A refusal
    /// is spelled out with the meaning RFC 7143 section 11.13.5 gives its
    /// status. (Not a `source`: the text already says it all, and a chain
    /// printed with `{:#}` would say it twice.)
    #[error("login: {}", describe_login_error(.0))]
    Login(InitiatorLoginError),
    /// The transport failed or delivered bytes that are not a valid PDU.
    /// (In the message, not a `source`: see the module doc.)
    #[error("connection: {0}")]
    Datamover(DatamoverError),
    /// The connection was lost while the command was outstanding, and it
    /// could not be retried (retries exhausted or reconnection failed).
    #[error("connection lost")]
    ConnectionLost,
    /// The session has been down for longer than its replacement timeout:
    /// commands fail at once (a login is tried again now and then, and a
    /// successful one ends this).
    #[error("the session has been down longer than its replacement timeout ({timeout:?})")]
    ReplacementTimeoutExpired {
        /// The session's replacement timeout.
        timeout: std::time::Duration,
    },
    /// The target sent something RFC 7143 does not allow here: the
    /// command's outcome is unknown.
    #[error("target protocol violation: {0}")]
    Protocol(String),
    /// The target rejected our PDU (RFC 7143 section 11.17).
    #[error("target rejected the PDU: {0:?}")]
    Rejected(RejectReason),
    /// No answer in time.
    #[error("no answer within {timeout:?} while {waiting_for}")]
    Timeout {
        /// The configured limit that expired.
        timeout: Duration,
        /// What we were waiting for.
        waiting_for: &'static str,
    },
    /// A task management function did not complete (RFC 7143 section 11.6.1).
    #[error("task management function failed: {0:?}")]
    TaskManagement(TaskResponse),
    /// The command was ended by a task management function this session
    /// sent (ABORT TASK, ABORT TASK SET, a reset) that the target
    /// completed. No status will come and the task has no further effect
    /// (RFC 7143 11.6.2); how much of a write reached the medium before
    /// is unknown, as for any command that failed.
    #[error("aborted by {0:?}")]
    Aborted(TaskFunction),
    /// The SCSI command completed with a status other than GOOD.
    #[error("SCSI status {}{status:#04x}{}", status_name(*status), sense.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
    Status {
        /// The SCSI status byte.
        status: u8,
        /// The decoded sense data, if any.
        sense: Option<Sense>,
    },
    /// The target answered with a service response other than "command
    /// completed at target" (RFC 7143 section 11.4.3).
    #[error("target failure (service response {0:#04x})")]
    TargetFailure(u8),
    /// The command cannot be sent as asked (a CDB too long, a transfer over
    /// 4 GiB, a buffer that does not match the expected length).
    #[error("invalid command: {0}")]
    InvalidCommand(&'static str),
    /// No path of a multipath set took the command within its no-path
    /// timeout: every path failed, or none was active (a takeover that
    /// did not finish).
    #[error("no path to the LU took the command within {waited:?}: {paths}")]
    NoPath {
        /// The no-path timeout.
        waited: Duration,
        /// Each path and its state.
        paths: String,
    },
    /// The session was logged out or closed.
    #[error("session closed")]
    SessionClosed,
}

impl From<DatamoverError> for Error {
    fn from(error: DatamoverError) -> Self {
        Error::Datamover(error)
    }
}

impl From<InitiatorLoginError> for Error {
    fn from(error: InitiatorLoginError) -> Self {
        Error::Login(error)
    }
}

/// A login failure in words; a refusal with its status's meaning (RFC 7143
/// section 11.13.5), e.g. "refused by the target: authentication failure
/// (status 0x0201)".
fn describe_login_error(error: &InitiatorLoginError) -> String {
    let InitiatorLoginError::Refused(status) = error else {
        return error.to_string();
    };
    let meaning = status.meaning();
    format!(
        "refused by the target: {meaning} (status {:#04x}{:02x})",
        status.class, status.detail
    )
}

/// The name of a SCSI status byte (SAM-5 5.3.1) and a space, or nothing
/// for a value SAM does not define.
fn status_name(status: u8) -> &'static str {
    match status {
        0x00 => "GOOD ",
        0x02 => "CHECK CONDITION ",
        0x04 => "CONDITION MET ",
        0x08 => "BUSY ",
        0x18 => "RESERVATION CONFLICT ",
        0x28 => "TASK SET FULL ",
        0x30 => "ACA ACTIVE ",
        0x40 => "TASK ABORTED ",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::pdu::login::LoginStatus;

    /// What the CLI printed for a port where nothing listens: the OS error
    /// once, not once per link of the chain.
    #[test]
    fn a_connect_failure_says_its_cause_once() {
        let error = Error::Connect {
            address: "127.0.0.1:3999".to_owned(),
            error: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(
            anyhow_like(&error),
            "connecting to 127.0.0.1:3999: connection refused"
        );
        let lost = Error::from(DatamoverError::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(anyhow_like(&lost), "connection: i/o: connection reset");
    }

    #[test]
    fn a_check_condition_is_in_words_then_codes() {
        let missing = Error::Status {
            status: 0x02,
            sense: Sense::parse(&[0x72, 0x05, 0x25, 0x00, 0, 0, 0, 0]),
        };
        assert_eq!(
            anyhow_like(&missing),
            "SCSI status CHECK CONDITION 0x02: Illegal Request: Logical unit not supported (ASC 0x25, ASCQ 0x00)"
        );
    }

    #[test]
    fn a_refusal_says_what_it_means_once() {
        let error = Error::from(InitiatorLoginError::Refused(
            LoginStatus::AUTHENTICATION_FAILURE,
        ));
        assert_eq!(
            anyhow_like(&error),
            "login: refused by the target: authentication failure (status 0x0201)"
        );
    }

    #[test]
    fn a_status_is_named_where_sam_names_it() {
        let conflict = Error::Status {
            status: 0x18,
            sense: None,
        };
        assert_eq!(
            conflict.to_string(),
            "SCSI status RESERVATION CONFLICT 0x18"
        );
        let odd = Error::Status {
            status: 0x3f,
            sense: None,
        };
        assert_eq!(odd.to_string(), "SCSI status 0x3f");
    }

    /// The message with its source chain, as `anyhow`'s `{:#}` prints it.
    fn anyhow_like(error: &Error) -> String {
        let mut text = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(s) = source {
            text += &format!(": {s}");
            source = s.source();
        }
        text
    }
}
