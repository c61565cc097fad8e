//! Why a target refused a login, in words.
//!
//! The Login Response carries only a status class and detail (RFC 7143
//! 11.13.5), and one status covers many causes: 0x0200 "initiator error"
//! is a bad stage transition, malformed text, a malformed CHAP value...;
//! 0x0201 "authentication failure" is a wrong CHAP secret, an unknown CHAP
//! user or no common CHAP algorithm. The person reading the target's log
//! needs the cause, so every refusal of [`super::target::TargetLogin`] and
//! of a [`super::target::LoginPolicy`] is a [`LoginRefusal`]: the status
//! that goes on the wire, unchanged, and a [`RefusalReason`] that says
//! what was wrong, naming the key, value, user or target concerned. A CHAP
//! secret is never part of a reason.

use thiserror::Error;

use super::chap::ChapError;
use crate::pdu::Opcode;
use crate::pdu::login::{LoginStage, LoginStatus};
use crate::text::codec::TextError;
use crate::text::negotiation::NegotiationError;

/// A refused login: the status the Login Response carries and the reason.
///
/// Displays as the reason followed by the status, e.g. `CHAP response
/// wrong for user "alice" (status 0x0201 authentication failure)`.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{reason} (status {status})")]
pub struct LoginRefusal {
    /// The Status-Class and Status-Detail sent to the initiator.
    pub status: LoginStatus,
    /// What was wrong, for the log.
    pub reason: RefusalReason,
}

impl LoginRefusal {
    /// A refusal with `status` on the wire because of `reason`.
    pub fn new(status: LoginStatus, reason: RefusalReason) -> Self {
        LoginRefusal { status, reason }
    }

    /// 0x0203: no target by that name.
    pub fn unknown_target(name: impl Into<String>) -> Self {
        Self::new(
            LoginStatus::NOT_FOUND,
            RefusalReason::UnknownTarget { name: name.into() },
        )
    }

    /// 0x0202: the target's ACL does not list the initiator.
    pub fn not_in_acl(initiator: impl Into<String>, target: impl Into<String>) -> Self {
        Self::new(
            LoginStatus::AUTHORIZATION_FAILURE,
            RefusalReason::NotInAcl {
                initiator: initiator.into(),
                target: target.into(),
            },
        )
    }

    /// 0x0207: a key the login needs was not sent.
    pub fn missing_key(key: impl Into<String>) -> Self {
        Self::new(
            LoginStatus::MISSING_PARAMETER,
            RefusalReason::MissingKey { key: key.into() },
        )
    }

    /// 0x020a: the TSIH names no session this connection may join.
    pub fn session_does_not_exist(tsih: u16) -> Self {
        Self::new(
            LoginStatus::SESSION_DOES_NOT_EXIST,
            RefusalReason::SessionDoesNotExist { tsih },
        )
    }

    /// 0x0206: the session has all the connections it negotiated.
    pub fn too_many_connections(tsih: u16, max: u32) -> Self {
        Self::new(
            LoginStatus::TOO_MANY_CONNECTIONS,
            RefusalReason::TooManyConnections { tsih, max },
        )
    }

    /// What a CHAP failure is refused with: the status CHAP gives it
    /// ([`ChapError::login_status`]) and the reason that names the user,
    /// the algorithms or the key concerned. `user` is the CHAP_N the
    /// initiator sent, if any, for the reasons that name it.
    pub fn chap(error: ChapError, user: Option<&str>) -> Self {
        let (class, detail) = error.login_status();
        let user = user.unwrap_or("(not sent)").to_owned();
        let reason = match error {
            ChapError::MissingKey(key) => RefusalReason::MissingKey { key: key.into() },
            ChapError::Malformed { key, value } => RefusalReason::BadKey {
                key: key.into(),
                value,
                why: "not a valid CHAP value".into(),
            },
            ChapError::NoCommonAlgorithm(offered) => {
                RefusalReason::ChapAlgorithmUnsupported { offered }
            }
            ChapError::UnknownName(user) => RefusalReason::ChapUserUnknown { user },
            ChapError::WrongResponse => RefusalReason::ChapSecretWrong { user },
            other => RefusalReason::Chap(other),
        };
        Self::new(LoginStatus::new(class, detail), reason)
    }
}

/// What was wrong with a refused login. Each displays in words, naming
/// what the initiator sent; none holds a secret.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RefusalReason {
    /// TargetName names no target here (0x0203).
    #[error("unknown target {name:?}")]
    UnknownTarget {
        /// The TargetName sent.
        name: String,
    },
    /// The target's ACL does not list the initiator (0x0202).
    #[error("initiator {initiator:?} is not in the ACL of target {target:?}")]
    NotInAcl {
        /// The InitiatorName sent.
        initiator: String,
        /// The target whose ACL it is.
        target: String,
    },
    /// A key the login needs was not sent: InitiatorName, TargetName for a
    /// normal session (0x0207), a CHAP key the exchange is at (0x0200).
    #[error("missing key {key}")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A key's value is not acceptable: a SessionType other than Normal or
    /// Discovery (0x0209), a malformed CHAP value or declaration (0x0200).
    #[error("bad value {value:?} for key {key}: {why}")]
    BadKey {
        /// The key.
        key: String,
        /// The value sent (at most the first 80 characters of a CHAP one).
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// The security stage offered no AuthMethod the target accepts: it
    /// requires CHAP and was offered `None` only, or requires none and
    /// was offered only CHAP (0x0201).
    #[error("AuthMethod {offered:?} offered, the target requires {required}")]
    AuthMethodUnacceptable {
        /// The AuthMethod value sent.
        offered: String,
        /// What the target requires: "CHAP" or "None".
        required: &'static str,
    },
    /// The initiator offered no CHAP algorithm the target accepts (0x0201).
    #[error("no CHAP algorithm the target accepts in CHAP_A={offered:?}")]
    ChapAlgorithmUnsupported {
        /// The CHAP_A value sent.
        offered: String,
    },
    /// CHAP_N is not the user the target is configured for (0x0201).
    #[error("CHAP user {user:?} is not the one the target accepts")]
    ChapUserUnknown {
        /// The CHAP_N sent.
        user: String,
    },
    /// CHAP_R does not match: the initiator's secret is not the target's
    /// (0x0201).
    #[error("CHAP response wrong for user {user:?}")]
    ChapSecretWrong {
        /// The CHAP_N sent.
        user: String,
    },
    /// Any other CHAP failure: mutual CHAP asked of a target without it, a
    /// reflected or reused challenge, CHAP keys out of order (0x0201 or
    /// 0x0200, as [`ChapError::login_status`] says).
    #[error("CHAP: {0}")]
    Chap(ChapError),
    /// CHAP keys sent to a target that requires no authentication (0x0200).
    #[error("CHAP keys sent but the target requires no authentication")]
    ChapNotRequired,
    /// The operational stage or full feature phase asked for before the
    /// initiator authenticated to a target that requires CHAP (0x0201).
    #[error("left the security stage without authenticating (the target requires CHAP)")]
    NotAuthenticated,
    /// Version-min above the only version there is, 0 (0x0205).
    #[error("iSCSI version {min}..={max} asked for; only version 0 exists")]
    UnsupportedVersion {
        /// Version-min sent.
        min: u8,
        /// Version-max sent.
        max: u8,
    },
    /// The TSIH names no session this connection may join: none by that
    /// handle, or one of another initiator, ISID or target (0x020a).
    #[error("no session with TSIH {tsih:#06x} for this initiator, ISID and target")]
    SessionDoesNotExist {
        /// The TSIH sent.
        tsih: u16,
    },
    /// The session already has MaxConnections connections (0x0206).
    #[error("session {tsih:#06x} already has its MaxConnections={max} connections")]
    TooManyConnections {
        /// The session's TSIH.
        tsih: u16,
        /// Its MaxConnections.
        max: u32,
    },
    /// The ISID, TSIH or CID changed between the requests of one login
    /// (RFC 7143 6.3, 0x0200).
    #[error("{field} changed during the login")]
    IdentityChanged {
        /// "ISID", "TSIH" or "CID".
        field: &'static str,
    },
    /// CSG is not a stage a login can be in (0x0200).
    #[error("CSG {} is not a login stage", stage_name(*.stage))]
    NotALoginStage {
        /// The CSG sent.
        stage: LoginStage,
    },
    /// CSG is not the stage the login is in (0x0200).
    #[error("a request for stage {} while the login is in {}", stage_name(*.sent), stage_name(*.expected))]
    WrongStage {
        /// The CSG sent.
        sent: LoginStage,
        /// The stage the login is in.
        expected: LoginStage,
    },
    /// T set with an NSG that is not a later stage (0x0200).
    #[error("a transit from {} to {}, which is not forward", stage_name(*.from), stage_name(*.to))]
    BadTransit {
        /// CSG.
        from: LoginStage,
        /// NSG.
        to: LoginStage,
    },
    /// T and C both set (RFC 7143 11.12.2, 0x0200).
    #[error("the T and C bits both set")]
    TransitWithContinue,
    /// A request with text or T while the target's response continues: it
    /// should have been empty, asking for the rest (RFC 7143 11.13.2,
    /// 0x0200).
    #[error("text or the T bit in a request that should fetch the rest of a continued response")]
    ExpectedEmptyRequest,
    /// The login text does not parse or is too long (0x0200).
    #[error("malformed login text: {0}")]
    MalformedText(TextError),
    /// The negotiation broke a rule of RFC 7143 section 6 (0x0200).
    #[error("negotiation: {0}")]
    Negotiation(NegotiationError),
    /// A Login Request after the login had ended (0x020b).
    #[error("a Login Request after the login had ended")]
    AfterLoginEnded,
    /// A PDU other than a Login Request during login (0x020b).
    #[error("a {opcode:?} PDU (opcode {:#04x}) during login", .opcode.to_bits())]
    NotALoginRequest {
        /// Its opcode.
        opcode: Opcode,
    },
    /// The target itself failed (0x0300): its CHAP configuration, a lock.
    #[error("target error: {0}")]
    TargetError(&'static str),
}

/// A login stage in the RFC's words.
fn stage_name(stage: LoginStage) -> String {
    match stage {
        LoginStage::SecurityNegotiation => "SecurityNegotiation (0)".into(),
        LoginStage::LoginOperationalNegotiation => "LoginOperationalNegotiation (1)".into(),
        LoginStage::FullFeaturePhase => "FullFeaturePhase (3)".into(),
        LoginStage::Reserved(code) => format!("reserved ({code})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_the_reason_then_the_status() {
        let refusal = LoginRefusal::chap(ChapError::WrongResponse, Some("alice"));
        assert_eq!(
            refusal.to_string(),
            "CHAP response wrong for user \"alice\" (status 0x0201 authentication failure)"
        );
        assert_eq!(
            LoginRefusal::unknown_target("iqn.x:y").to_string(),
            "unknown target \"iqn.x:y\" (status 0x0203 target not found)"
        );
    }

    /// CHAP's statuses are kept: a malformed value is an initiator error,
    /// credentials an authentication failure.
    #[test]
    fn chap_failures_keep_their_status() {
        let malformed = LoginRefusal::chap(
            ChapError::Malformed {
                key: "CHAP_R",
                value: "0xZZ".into(),
            },
            Some("alice"),
        );
        assert_eq!(malformed.status, LoginStatus::INITIATOR_ERROR);
        assert!(
            matches!(malformed.reason, RefusalReason::BadKey { ref key, .. } if key == "CHAP_R")
        );
        let algorithm = LoginRefusal::chap(ChapError::NoCommonAlgorithm("9".into()), None);
        assert_eq!(algorithm.status, LoginStatus::AUTHENTICATION_FAILURE);
        assert_eq!(
            algorithm.reason.to_string(),
            "no CHAP algorithm the target accepts in CHAP_A=\"9\""
        );
        let reused = LoginRefusal::chap(ChapError::ReusedChallenge, None);
        assert_eq!(reused.status, LoginStatus::AUTHENTICATION_FAILURE);
        assert_eq!(reused.reason.to_string(), "CHAP: reused CHAP challenge");
    }

    #[test]
    fn stages_are_named() {
        let reason = RefusalReason::BadTransit {
            from: LoginStage::LoginOperationalNegotiation,
            to: LoginStage::SecurityNegotiation,
        };
        assert_eq!(
            reason.to_string(),
            "a transit from LoginOperationalNegotiation (1) to SecurityNegotiation (0), which is not forward"
        );
    }
}
