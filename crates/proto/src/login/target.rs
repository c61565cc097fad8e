//! The target's side of a login (RFC 7143 sections 6.3, 10.12, 10.13, 11.12,
//! 11.13): one [`TargetLogin`] per connection takes each Login Request and
//! says what to answer, until the connection enters full feature phase or
//! the login fails.
//!
//! The machine checks the stage transitions (CSG/NSG and the T and C bits),
//! that ISID, TSIH and CID stay fixed, the version, and the names the first
//! request must carry. It runs the security stage (AuthMethod, then CHAP if
//! the target requires it) and hands operational keys to the negotiation
//! engine. Long texts travel in both directions over several PDUs (the C
//! bit). Which targets exist, who may log in and where a session goes are the
//! driver's decisions, asked through [`LoginPolicy`]; randomness for the
//! CHAP challenge comes in through [`TargetLogin::new`].
//!
//! Every refusal is a [`LoginRefusal`]: the status the Login Response
//! carries and the reason in words, so that the driver's log can say why
//! (one status, 0x0200 or 0x0201, covers many causes).

use std::sync::{Arc, Mutex};

use crate::pdu::Opcode;
use crate::pdu::login::{LoginRequest, LoginResponse, LoginStage, LoginStatus};
use crate::serial::{CmdSn, StatSn};
use crate::text::codec::{self, TextAssembler, TextPair};
use crate::text::negotiation::NegotiationError;
use crate::text::{NegotiatedParameters, NegotiationConfig, Negotiator, Role, SessionType, Stage};

use super::chap::{ChallengeHistory, ChapAlgorithm, Credentials, TargetChap};
pub use super::refusal::{LoginRefusal, RefusalReason};

/// The largest text a login PDU carries: the MaxRecvDataSegmentLength every
/// side accepts during login (RFC 7143 13.12: its default, 8192).
pub const LOGIN_SEGMENT_LIMIT: usize = 8192;

/// What the first Login Request asks for, as the policy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRequest {
    /// InitiatorName.
    pub initiator_name: String,
    /// TargetName (absent for discovery sessions).
    pub target_name: Option<String>,
    /// SessionType.
    pub session_type: SessionType,
    /// The ISID, as its 6 wire bytes.
    pub isid: [u8; 6],
    /// The TSIH: 0 for a new session, else the session to join.
    pub tsih: u16,
    /// The connection ID.
    pub cid: u16,
}

/// CHAP as a target requires it.
#[derive(Clone, Debug)]
pub struct ChapRequirement {
    /// Acceptable algorithms, preferred first.
    pub algorithms: Vec<ChapAlgorithm>,
    /// The name and secret the initiator must prove.
    pub initiator: Credentials,
    /// The target's own name and secret, for mutual CHAP.
    pub mutual: Option<Credentials>,
}

/// How the target serves one login, decided by the policy.
#[derive(Clone, Debug)]
pub struct TargetSettings {
    /// The target's offers and limits.
    pub negotiation: NegotiationConfig,
    /// CHAP, if the target requires authentication.
    pub chap: Option<ChapRequirement>,
    /// The TSIH of the session this connection joins (a fresh one for a
    /// new session), sent in the final Login Response.
    pub tsih: u16,
    /// Whether this is the session's leading connection.
    pub leading: bool,
    /// MaxCmdSN - ExpCmdSN + 1 to grant in full feature phase.
    pub command_window: u32,
}

/// The driver's decisions during login.
pub trait LoginPolicy {
    /// The settings for this login, or the refusal: its status and why, so
    /// that the log can tell an unknown target
    /// ([`LoginRefusal::unknown_target`], 0x0203) from an initiator not in
    /// the ACL ([`LoginRefusal::not_in_acl`], 0x0202), a TSIH that names no
    /// session ([`LoginRefusal::session_does_not_exist`]), a full session
    /// ([`LoginRefusal::too_many_connections`]), ...
    fn settings(&self, request: &SessionRequest) -> Result<TargetSettings, LoginRefusal>;
}

/// The names the initiator's first request sent, as far as they could be
/// read: the driver logs them with a refusal, which may come before (or
/// because) the login's [`SessionRequest`] could be made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SentNames {
    /// InitiatorName.
    pub initiator_name: Option<String>,
    /// TargetName.
    pub target_name: Option<String>,
    /// SessionType, as sent.
    pub session_type: Option<String>,
}

/// What a login step ended in.
#[derive(Clone, Debug)]
pub enum LoginOutcome {
    /// More Login Requests are due.
    Continue,
    /// The login succeeded: the connection is in full feature phase.
    Complete(Box<LoginComplete>),
    /// The login failed: the response carries the refusal's status; close
    /// the connection after sending it.
    Failed(LoginRefusal),
}

/// A completed login.
#[derive(Clone, Debug)]
pub struct LoginComplete {
    /// Who logged in and to what.
    pub request: SessionRequest,
    /// The TSIH of the session.
    pub tsih: u16,
    /// Whether this was the leading connection.
    pub leading: bool,
    /// The negotiated parameters.
    pub parameters: NegotiatedParameters,
    /// The StatSN the next response on this connection carries.
    pub next_stat_sn: StatSn,
}

/// One answer: the Login Response, its text, and what it means.
#[derive(Clone, Debug)]
pub struct LoginStep {
    /// The response header.
    pub response: LoginResponse,
    /// Its data segment (text), at most [`LOGIN_SEGMENT_LIMIT`] bytes.
    pub data: Vec<u8>,
    /// Where the login stands.
    pub outcome: LoginOutcome,
}

/// Where the login is.
#[derive(Debug)]
enum Phase {
    /// Nothing received yet.
    First,
    /// In a stage, after the first request.
    Stage(LoginStage),
    /// Finished, successfully or not; any further request is an error.
    Finished,
}

/// The target's login state machine for one connection.
#[derive(Debug)]
pub struct TargetLogin {
    phase: Phase,
    identity: Option<([u8; 6], u16, u16)>,
    names: SentNames,
    session: Option<SessionRequest>,
    settings: Option<TargetSettings>,
    negotiator: Option<Negotiator>,
    chap: Option<TargetChap>,
    chap_challenge: (u8, Vec<u8>),
    challenge_history: Arc<Mutex<ChallengeHistory>>,
    authenticated: bool,
    incoming: TextAssembler,
    outgoing: Vec<Vec<u8>>,
    stat_sn: StatSn,
}

/// A failure found while handling a request: the refusal to answer with.
type StepResult<T> = Result<T, LoginRefusal>;

/// A refusal with `status` for `reason`.
fn refuse(status: LoginStatus, reason: RefusalReason) -> LoginRefusal {
    LoginRefusal::new(status, reason)
}

/// An initiator error (0x0200) for `reason`.
fn initiator_error(reason: RefusalReason) -> LoginRefusal {
    refuse(LoginStatus::INITIATOR_ERROR, reason)
}

/// A target error (0x0300): something on this side failed.
fn target_error(what: &'static str) -> LoginRefusal {
    refuse(LoginStatus::TARGET_ERROR, RefusalReason::TargetError(what))
}

impl TargetLogin {
    /// A login starting with StatSN `initial_stat_sn`; `chap_identifier`
    /// and `chap_challenge` (at least 32 bytes) come from the driver's
    /// random source and are used if the target requires CHAP;
    /// `challenge_history` is shared by the target's connections so that a
    /// challenge is never accepted twice.
    pub fn new(
        initial_stat_sn: StatSn,
        chap_identifier: u8,
        chap_challenge: Vec<u8>,
        challenge_history: Arc<Mutex<ChallengeHistory>>,
    ) -> Self {
        TargetLogin {
            phase: Phase::First,
            identity: None,
            names: SentNames::default(),
            session: None,
            settings: None,
            negotiator: None,
            chap: None,
            chap_challenge: (chap_identifier, chap_challenge),
            challenge_history,
            authenticated: false,
            incoming: TextAssembler::default(),
            outgoing: Vec::new(),
            stat_sn: initial_stat_sn,
        }
    }

    /// Handles one Login Request and its data segment.
    pub fn receive(
        &mut self,
        policy: &dyn LoginPolicy,
        request: &LoginRequest,
        data: &[u8],
    ) -> LoginStep {
        let first = matches!(self.phase, Phase::First);
        match self.step(policy, request, data) {
            Ok(step) => step,
            Err(refusal) => {
                if first && self.names == SentNames::default() && !request.continue_flag {
                    // Refused before the text was read (the version, the
                    // stages): the names still belong in the log.
                    if let Ok(pairs) = codec::parse(data) {
                        self.note_names(&pairs);
                    }
                }
                self.fail(request, refusal)
            }
        }
    }

    /// The answer to a PDU other than a Login Request during login (its
    /// opcode `received`): status 0x020B "invalid request during login"
    /// (RFC 7143 11.13.5); the connection closes.
    pub fn invalid_request(
        &mut self,
        request_template: &LoginRequest,
        received: Opcode,
    ) -> LoginStep {
        let refusal = refuse(
            LoginStatus::INVALID_DURING_LOGIN,
            RefusalReason::NotALoginRequest { opcode: received },
        );
        self.fail(request_template, refusal)
    }

    /// The names the initiator sent in its first request, as far as they
    /// were read; all `None` before that request, or if its text did not
    /// parse.
    pub fn sent_names(&self) -> &SentNames {
        &self.names
    }

    fn fail(&mut self, request: &LoginRequest, refusal: LoginRefusal) -> LoginStep {
        self.phase = Phase::Finished;
        let response = self.response(request, false, request.current_stage, refusal.status, 1);
        LoginStep {
            response,
            data: Vec::new(),
            outcome: LoginOutcome::Failed(refusal),
        }
    }

    fn note_names(&mut self, pairs: &[TextPair]) {
        let find = |key: &str| pairs.iter().find(|p| p.key == key).map(|p| p.value.clone());
        self.names = SentNames {
            initiator_name: find("InitiatorName"),
            target_name: find("TargetName"),
            session_type: find("SessionType"),
        };
    }

    fn step(
        &mut self,
        policy: &dyn LoginPolicy,
        request: &LoginRequest,
        data: &[u8],
    ) -> StepResult<LoginStep> {
        let current = match self.phase {
            Phase::Finished => {
                return Err(refuse(
                    LoginStatus::INVALID_DURING_LOGIN,
                    RefusalReason::AfterLoginEnded,
                ));
            }
            Phase::First => {
                // RFC 7143 11.12.4: only version 0x00 exists.
                if request.version_min > 0 {
                    return Err(refuse(
                        LoginStatus::UNSUPPORTED_VERSION,
                        RefusalReason::UnsupportedVersion {
                            min: request.version_min,
                            max: request.version_max,
                        },
                    ));
                }
                request.current_stage
            }
            Phase::Stage(stage) => stage,
        };
        self.check_identity(request)?;
        check_transition(request, current)?;

        // Our previous response was continued: an empty request asks for
        // the next part (RFC 7143 11.13.2).
        if !self.outgoing.is_empty() {
            if !data.is_empty() || request.transit {
                return Err(initiator_error(RefusalReason::ExpectedEmptyRequest));
            }
            let part = self.outgoing.remove(0);
            let more = !self.outgoing.is_empty();
            return Ok(self.answer(request, false, current, part, more, LoginOutcome::Continue));
        }
        // The initiator's text continues in the next PDU: acknowledge with
        // an empty response.
        let text = self
            .incoming
            .push(data, request.continue_flag)
            .map_err(|e| initiator_error(RefusalReason::MalformedText(e)))?;
        let Some(text) = text else {
            return Ok(self.answer(
                request,
                false,
                current,
                Vec::new(),
                false,
                LoginOutcome::Continue,
            ));
        };
        let pairs =
            codec::parse(&text).map_err(|e| initiator_error(RefusalReason::MalformedText(e)))?;
        if matches!(self.phase, Phase::First) {
            self.note_names(&pairs);
            self.first_request(policy, request, &pairs)?;
        }
        self.phase = Phase::Stage(current);

        let mut answers = Vec::new();
        let ready = match current {
            LoginStage::SecurityNegotiation => self.security(&pairs, &mut answers)?,
            LoginStage::LoginOperationalNegotiation => self.operational(&pairs, &mut answers)?,
            stage => return Err(initiator_error(RefusalReason::NotALoginStage { stage })),
        };
        let transit = request.transit && ready;
        let mut outcome = LoginOutcome::Continue;
        if transit {
            self.phase = Phase::Stage(request.next_stage);
            if request.next_stage == LoginStage::FullFeaturePhase {
                outcome = LoginOutcome::Complete(Box::new(self.complete()?));
            }
        }
        let mut text = Vec::new();
        codec::encode(&answers, &mut text);
        let mut parts: Vec<Vec<u8>> = codec::fragment(&text, LOGIN_SEGMENT_LIMIT)
            .into_iter()
            .map(|(part, _)| part.to_vec())
            .collect();
        let first = parts.remove(0);
        if !parts.is_empty() {
            // A long answer: send it in parts and finish the stage change
            // only when the initiator has pulled them all.
            self.outgoing = parts;
            self.phase = Phase::Stage(current);
            return Ok(self.answer(request, false, current, first, true, LoginOutcome::Continue));
        }
        Ok(self.answer(request, transit, current, first, false, outcome))
    }

    /// ISID, TSIH and CID may not change during one login (RFC 7143 6.3).
    fn check_identity(&mut self, request: &LoginRequest) -> StepResult<()> {
        let identity = (request.isid.to_bytes(), request.tsih, request.cid);
        match self.identity {
            None => {
                self.identity = Some(identity);
                Ok(())
            }
            Some(seen) if seen == identity => Ok(()),
            Some((isid, tsih, _)) => {
                let field = if isid != identity.0 {
                    "ISID"
                } else if tsih != identity.1 {
                    "TSIH"
                } else {
                    "CID"
                };
                Err(initiator_error(RefusalReason::IdentityChanged { field }))
            }
        }
    }

    /// The names and session type the first request must carry (RFC 7143
    /// 6.3, 13.4, 13.5, 13.21), then the policy's decision.
    fn first_request(
        &mut self,
        policy: &dyn LoginPolicy,
        request: &LoginRequest,
        pairs: &[TextPair],
    ) -> StepResult<()> {
        let find = |key: &str| pairs.iter().find(|p| p.key == key).map(|p| p.value.clone());
        let initiator_name =
            find("InitiatorName").ok_or_else(|| LoginRefusal::missing_key("InitiatorName"))?;
        let session_type = match find("SessionType").as_deref() {
            None | Some("Normal") => SessionType::Normal,
            Some("Discovery") => SessionType::Discovery,
            Some(other) => {
                return Err(refuse(
                    LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
                    RefusalReason::BadKey {
                        key: "SessionType".into(),
                        value: other.into(),
                        why: "neither Normal nor Discovery".into(),
                    },
                ));
            }
        };
        let target_name = find("TargetName");
        if session_type == SessionType::Normal && target_name.is_none() {
            return Err(LoginRefusal::missing_key("TargetName"));
        }
        let session = SessionRequest {
            initiator_name,
            target_name,
            session_type,
            isid: request.isid.to_bytes(),
            tsih: request.tsih,
            cid: request.cid,
        };
        let settings = policy.settings(&session)?;
        // The target's declarations (TargetPortalGroupTag, TargetAlias) go
        // in the first response (RFC 7143 13.9): the stage handlers take
        // them from the negotiator on first use.
        let negotiator =
            Negotiator::new(Role::Target, settings.negotiation.clone(), settings.leading);
        if let Some(chap) = &settings.chap {
            self.chap = Some(
                TargetChap::new(
                    chap.algorithms.clone(),
                    chap.initiator.clone(),
                    chap.mutual.clone(),
                )
                .map_err(|_| target_error("the CHAP configuration uses one secret both ways"))?,
            );
        } else {
            self.authenticated = true;
        }
        self.negotiator = Some(negotiator);
        self.settings = Some(settings);
        self.session = Some(session);
        Ok(())
    }

    /// The security stage: AuthMethod, then CHAP. Returns whether the stage
    /// may end.
    fn security(&mut self, pairs: &[TextPair], answers: &mut Vec<TextPair>) -> StepResult<bool> {
        let negotiator = self
            .negotiator
            .as_mut()
            .ok_or_else(|| target_error("no negotiator in the security stage"))?;
        answers.extend(declarations_pending(negotiator));
        let (security, other): (Vec<TextPair>, Vec<TextPair>) = pairs
            .iter()
            .cloned()
            .partition(|p| p.key == "AuthMethod" || p.key.starts_with("CHAP_"));
        answers.extend(
            negotiator
                .receive(&other, Stage::Security)
                .map_err(negotiation_refusal)?,
        );
        let find = |key: &str| security.iter().find(|p| p.key == key);
        if let Some(offer) = find("AuthMethod") {
            let offered: Vec<&str> = offer.value.split(',').collect();
            let chosen = if self.chap.is_some() {
                offered.contains(&"CHAP").then_some("CHAP")
            } else {
                offered.contains(&"None").then_some("None")
            };
            let Some(chosen) = chosen else {
                return Err(refuse(
                    LoginStatus::AUTHENTICATION_FAILURE,
                    RefusalReason::AuthMethodUnacceptable {
                        offered: offer.value.clone(),
                        required: if self.chap.is_some() { "CHAP" } else { "None" },
                    },
                ));
            };
            answers.push(TextPair::new("AuthMethod", chosen));
            return Ok(self.authenticated);
        }
        let Some(chap) = self.chap.as_mut() else {
            return if security.is_empty() {
                Ok(true)
            } else {
                Err(initiator_error(RefusalReason::ChapNotRequired))
            };
        };
        let mut history = self
            .challenge_history
            .lock()
            .map_err(|_| target_error("the CHAP challenge history is poisoned"))?;
        let user = find("CHAP_N").map(|p| p.value.as_str());
        if find("CHAP_A").is_some() {
            let (identifier, challenge) = self.chap_challenge.clone();
            answers.extend(
                chap.challenge(&security, identifier, challenge, &mut history)
                    .map_err(|e| LoginRefusal::chap(e, user))?,
            );
            Ok(false)
        } else if find("CHAP_N").is_some() || find("CHAP_R").is_some() {
            answers.extend(
                chap.verify(&security, &mut history)
                    .map_err(|e| LoginRefusal::chap(e, user))?,
            );
            self.authenticated = true;
            Ok(true)
        } else {
            Ok(self.authenticated)
        }
    }

    /// The operational stage: everything goes to the negotiation engine.
    /// Returns whether the stage may end: we are authenticated and no offer
    /// of ours awaits an answer.
    fn operational(&mut self, pairs: &[TextPair], answers: &mut Vec<TextPair>) -> StepResult<bool> {
        if !self.authenticated {
            // Skipping the security stage of a target that requires it.
            return Err(not_authenticated());
        }
        let negotiator = self
            .negotiator
            .as_mut()
            .ok_or_else(|| target_error("no negotiator in the operational stage"))?;
        answers.extend(declarations_pending(negotiator));
        answers.extend(
            negotiator
                .receive(pairs, Stage::Operational)
                .map_err(negotiation_refusal)?,
        );
        let offers = negotiator.offers(Stage::Operational);
        let new_offers = offers
            .iter()
            .any(|p| negotiator.pending_offers().contains(&p.key.as_str()));
        answers.extend(offers);
        Ok(!new_offers && negotiator.is_complete())
    }

    fn complete(&mut self) -> StepResult<LoginComplete> {
        let (Some(negotiator), Some(settings), Some(session)) =
            (&self.negotiator, &self.settings, &self.session)
        else {
            return Err(target_error("completing a login that never started"));
        };
        if !self.authenticated {
            return Err(not_authenticated());
        }
        let parameters = negotiator.finish().map_err(negotiation_refusal)?;
        Ok(LoginComplete {
            request: session.clone(),
            tsih: settings.tsih,
            leading: settings.leading,
            parameters,
            // The final response carries the current StatSN; the next
            // response is one on.
            next_stat_sn: self.stat_sn.next(),
        })
    }

    fn answer(
        &mut self,
        request: &LoginRequest,
        transit: bool,
        current: LoginStage,
        data: Vec<u8>,
        continues: bool,
        outcome: LoginOutcome,
    ) -> LoginStep {
        let complete = matches!(outcome, LoginOutcome::Complete(_));
        let window = self
            .settings
            .as_ref()
            .map_or(1, |s| s.command_window.max(1));
        let mut response = self.response(request, transit, current, LoginStatus::SUCCESS, window);
        response.continue_flag = continues;
        if transit {
            response.next_stage = request.next_stage;
        }
        if complete {
            response.tsih = self.settings.as_ref().map_or(request.tsih, |s| s.tsih);
            self.phase = Phase::Finished;
        }
        LoginStep {
            response,
            data,
            outcome,
        }
    }

    /// A response echoing the request's ISID, TSIH and tag, with the next
    /// StatSN and the command window (login requests are immediate and do
    /// not advance CmdSN, RFC 7143 11.12.6).
    fn response(
        &mut self,
        request: &LoginRequest,
        transit: bool,
        current: LoginStage,
        status: LoginStatus,
        window: u32,
    ) -> LoginResponse {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.next();
        let exp_cmd_sn: CmdSn = request.cmd_sn;
        LoginResponse {
            transit,
            continue_flag: false,
            current_stage: current,
            next_stage: LoginStage::SecurityNegotiation,
            version_max: 0,
            version_active: 0,
            isid: request.isid,
            tsih: request.tsih,
            initiator_task_tag: request.initiator_task_tag,
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn: exp_cmd_sn.wrapping_add(window - 1),
            status,
        }
    }
}

/// The target's configured declarations not sent yet: the negotiator
/// records each as sent, so this returns them once, in the first response.
fn declarations_pending(negotiator: &mut Negotiator) -> Vec<TextPair> {
    negotiator.offers(Stage::Security)
}

/// The refusal of a negotiation that broke section 6's rules (0x0200): a
/// malformed declaration is a bad key, named as such.
fn negotiation_refusal(error: NegotiationError) -> LoginRefusal {
    let (class, detail) = NegotiationError::LOGIN_STATUS;
    let reason = match error {
        NegotiationError::InvalidDeclaration { key, value } => RefusalReason::BadKey {
            key,
            value,
            why: "not a valid value for this declaration".into(),
        },
        other => RefusalReason::Negotiation(other),
    };
    refuse(LoginStatus::new(class, detail), reason)
}

/// 0x0201: past the security stage of a target that requires CHAP without
/// authenticating.
fn not_authenticated() -> LoginRefusal {
    refuse(
        LoginStatus::AUTHENTICATION_FAILURE,
        RefusalReason::NotAuthenticated,
    )
}

/// RFC 7143 11.12.1-11.12.3: the CSG is the stage we are in; with T set,
/// the NSG is a later stage (not the reserved 2) and C is clear.
fn check_transition(request: &LoginRequest, current: LoginStage) -> StepResult<()> {
    let rank = |stage: LoginStage| match stage {
        LoginStage::SecurityNegotiation => Some(0),
        LoginStage::LoginOperationalNegotiation => Some(1),
        LoginStage::FullFeaturePhase => Some(3),
        _ => None,
    };
    if request.current_stage != current {
        return Err(initiator_error(RefusalReason::WrongStage {
            sent: request.current_stage,
            expected: current,
        }));
    }
    if rank(current).is_none_or(|r| r > 1) {
        return Err(initiator_error(RefusalReason::NotALoginStage {
            stage: current,
        }));
    }
    if request.transit {
        if request.continue_flag {
            return Err(initiator_error(RefusalReason::TransitWithContinue));
        }
        match (rank(current), rank(request.next_stage)) {
            (Some(from), Some(to)) if to > from => {}
            _ => {
                return Err(initiator_error(RefusalReason::BadTransit {
                    from: current,
                    to: request.next_stage,
                }));
            }
        }
    }
    Ok(())
}
