//! The initiator's side of a login (RFC 7143 sections 6.3, 10.12, 10.13):
//! [`InitiatorLogin`] builds the first Login Request, then takes each Login
//! Response and says what to send next, until the connection reaches full
//! feature phase.
//!
//! It declares the names and session type, offers AuthMethod (CHAP when
//! credentials are configured, also `None` unless mutual authentication is
//! required) and runs CHAP. It sends its operational offers and checks every
//! response: same ISID, tag and stage; a T bit only when asked for; answers
//! admissible for what was offered. A redirection (status class 1) comes back
//! as [`InitiatorLoginError::Redirected`] with the TargetAddress to try.

use std::sync::{Arc, Mutex};

use thiserror::Error;

use crate::pdu::login::{Isid, LoginRequest, LoginResponse, LoginStage, LoginStatus};
use crate::serial::{CmdSn, StatSn};
use crate::text::codec::{self, TextAssembler, TextError, TextPair};
use crate::text::{
    NegotiatedParameters, NegotiationConfig, NegotiationError, Negotiator, Role, Stage,
};

use super::chap::{ChallengeHistory, ChapAlgorithm, ChapError, Credentials, InitiatorChap};
use super::target::LOGIN_SEGMENT_LIMIT;

/// CHAP as the initiator uses it.
#[derive(Clone, Debug)]
pub struct InitiatorChapSettings {
    /// Algorithms to offer, preferred first.
    pub algorithms: Vec<ChapAlgorithm>,
    /// The initiator's name and secret.
    pub credentials: Credentials,
    /// For mutual CHAP, the name and secret the target must prove.
    pub target: Option<Credentials>,
}

/// What the initiator logs in with.
#[derive(Clone, Debug)]
pub struct InitiatorLoginConfig {
    /// InitiatorName.
    pub initiator_name: String,
    /// TargetName; `None` logs in a discovery session.
    pub target_name: Option<String>,
    /// The ISID of the session.
    pub isid: Isid,
    /// 0 for a new session (or reinstatement), else the session to join.
    pub tsih: u16,
    /// The connection ID.
    pub cid: u16,
    /// Operational offers and limits.
    pub negotiation: NegotiationConfig,
    /// CHAP, if the initiator authenticates.
    pub chap: Option<InitiatorChapSettings>,
}

/// Why a login failed on the initiator's side.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum InitiatorLoginError {
    /// The target refused the login with this status (class 2 or 3).
    #[error("login refused: status class {:#04x} detail {:#04x}", .0.class, .0.detail)]
    Refused(LoginStatus),
    /// The target redirected the login (class 1) to this address.
    #[error("login redirected to {target_address:?}")]
    Redirected {
        /// The redirection status.
        status: LoginStatus,
        /// The TargetAddress value to try, if the target gave one.
        target_address: Option<String>,
    },
    /// The target broke the login rules.
    #[error("target protocol error: {0}")]
    Protocol(&'static str),
    /// The negotiation failed.
    #[error(transparent)]
    Negotiation(#[from] NegotiationError),
    /// CHAP failed (including a target that failed mutual authentication).
    #[error(transparent)]
    Chap(#[from] ChapError),
    /// Unparseable text from the target.
    #[error(transparent)]
    Text(#[from] TextError),
}

/// The next thing to do.
#[derive(Clone, Debug)]
pub enum InitiatorStep {
    /// Send this Login Request with this data segment.
    Send {
        /// The request header.
        request: LoginRequest,
        /// Its data segment (text).
        data: Vec<u8>,
    },
    /// The login is complete: full feature phase.
    Complete(Box<InitiatorLoginComplete>),
}

/// A completed login, seen from the initiator.
#[derive(Clone, Debug)]
pub struct InitiatorLoginComplete {
    /// The negotiated parameters.
    pub parameters: NegotiatedParameters,
    /// The TSIH the target assigned.
    pub tsih: u16,
    /// The StatSN expected next on this connection.
    pub exp_stat_sn: StatSn,
    /// The command window: ExpCmdSN..=MaxCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
}

/// The initiator's login state machine for one connection.
#[derive(Debug)]
pub struct InitiatorLogin {
    config: InitiatorLoginConfig,
    negotiator: Negotiator,
    chap: Option<InitiatorChap>,
    mutual_challenge: (u8, Vec<u8>),
    challenge_history: Arc<Mutex<ChallengeHistory>>,
    stage: LoginStage,
    initiator_task_tag: u32,
    cmd_sn: CmdSn,
    exp_stat_sn: StatSn,
    asked_transit: bool,
    authenticated: bool,
    incoming: TextAssembler,
    outgoing: Vec<Vec<u8>>,
    /// The T bit and NSG the last part of a continued text carries.
    final_transit: (bool, LoginStage),
    finished: bool,
}

type Step = Result<InitiatorStep, InitiatorLoginError>;

impl InitiatorLogin {
    /// A login with this configuration. `initiator_task_tag` and `cmd_sn`
    /// go in every Login Request (login is immediate: CmdSN does not
    /// advance); `mutual_challenge` (identifier and at least 32 random bytes)
    /// is used for mutual CHAP.
    pub fn new(
        config: InitiatorLoginConfig,
        initiator_task_tag: u32,
        cmd_sn: CmdSn,
        mutual_challenge: (u8, Vec<u8>),
        challenge_history: Arc<Mutex<ChallengeHistory>>,
    ) -> Result<Self, InitiatorLoginError> {
        let mut negotiation = config.negotiation.clone();
        negotiation.session_type = if config.target_name.is_some() {
            crate::text::SessionType::Normal
        } else {
            crate::text::SessionType::Discovery
        };
        negotiation
            .declarations
            .retain(|p| p.key != "InitiatorName" && p.key != "TargetName");
        negotiation.declarations.insert(
            0,
            TextPair::new("InitiatorName", config.initiator_name.clone()),
        );
        if let Some(target) = &config.target_name {
            negotiation
                .declarations
                .insert(1, TextPair::new("TargetName", target.clone()));
        }
        let chap = config
            .chap
            .as_ref()
            .map(|c| {
                InitiatorChap::new(
                    c.algorithms.clone(),
                    c.credentials.clone(),
                    c.target.clone(),
                )
            })
            .transpose()?;
        Ok(InitiatorLogin {
            negotiator: Negotiator::new(Role::Initiator, negotiation, config.tsih == 0),
            authenticated: chap.is_none(),
            chap,
            config,
            mutual_challenge,
            challenge_history,
            stage: LoginStage::SecurityNegotiation,
            initiator_task_tag,
            cmd_sn,
            exp_stat_sn: StatSn::new(0),
            asked_transit: false,
            incoming: TextAssembler::default(),
            outgoing: Vec::new(),
            final_transit: (false, LoginStage::SecurityNegotiation),
            finished: false,
        })
    }

    /// The first Login Request: names, session type and AuthMethod, in the
    /// security stage, asking to move on to the operational stage.
    pub fn start(&mut self) -> InitiatorStep {
        let mut pairs = self.negotiator.offers(Stage::Security);
        let methods = match &self.chap {
            Some(chap) if chap.is_mutual() => "CHAP",
            Some(_) => "CHAP,None",
            None => "None",
        };
        pairs.push(TextPair::new("AuthMethod", methods));
        self.request(pairs, LoginStage::LoginOperationalNegotiation)
    }

    /// Takes one Login Response and its data segment.
    pub fn receive(&mut self, response: &LoginResponse, data: &[u8]) -> Step {
        if self.finished {
            return Err(InitiatorLoginError::Protocol(
                "response after the login ended",
            ));
        }
        self.check(response)?;
        self.exp_stat_sn = response.stat_sn.next();
        if response.status != LoginStatus::SUCCESS {
            self.finished = true;
            return Err(self.failure(response, data));
        }
        if !self.outgoing.is_empty() {
            if response.transit || !data.is_empty() {
                return Err(InitiatorLoginError::Protocol(
                    "answer before our text was complete",
                ));
            }
            let part = self.outgoing.remove(0);
            let continues = !self.outgoing.is_empty();
            let (transit, next) = self.final_transit;
            return Ok(self.send(part, continues, transit && !continues, next));
        }
        let Some(text) = self.incoming.push(data, response.continue_flag)? else {
            // The target's text continues: ask for the rest.
            return Ok(self.send(Vec::new(), false, false, self.stage));
        };
        let pairs = codec::parse(&text)?;
        match self.stage {
            LoginStage::SecurityNegotiation => self.security(response, &pairs),
            LoginStage::LoginOperationalNegotiation => self.operational(response, &pairs),
            _ => Err(InitiatorLoginError::Protocol(
                "response in an unexpected stage",
            )),
        }
    }

    /// Every response echoes our ISID, tag and stage, and transits only
    /// when asked (RFC 7143 11.13). A refusal (status class 2 or 3) is
    /// believed on its tag alone: LIO zeroes the rest of the header, ISID
    /// included, in the Login Response that ends a login with an error
    /// (`iscsit_tx_login_rsp`).
    fn check(&self, response: &LoginResponse) -> Result<(), InitiatorLoginError> {
        if response.initiator_task_tag != self.initiator_task_tag
            || (response.isid != self.config.isid && response.status.class < 2)
        {
            return Err(InitiatorLoginError::Protocol("response for another login"));
        }
        if response.status == LoginStatus::SUCCESS {
            if response.current_stage != self.stage {
                return Err(InitiatorLoginError::Protocol("response in another stage"));
            }
            if response.transit && !self.asked_transit {
                return Err(InitiatorLoginError::Protocol("transit not requested"));
            }
            if response.version_active != 0 {
                return Err(InitiatorLoginError::Protocol("unsupported version"));
            }
        }
        Ok(())
    }

    fn failure(&self, response: &LoginResponse, data: &[u8]) -> InitiatorLoginError {
        if response.status.class == 1 {
            let target_address = codec::parse(data).ok().and_then(|pairs| {
                pairs
                    .into_iter()
                    .find(|p| p.key == "TargetAddress")
                    .map(|p| p.value)
            });
            InitiatorLoginError::Redirected {
                status: response.status,
                target_address,
            }
        } else {
            InitiatorLoginError::Refused(response.status)
        }
    }

    fn security(&mut self, response: &LoginResponse, pairs: &[TextPair]) -> Step {
        let (security, other): (Vec<TextPair>, Vec<TextPair>) = pairs
            .iter()
            .cloned()
            .partition(|p| p.key == "AuthMethod" || p.key.starts_with("CHAP_"));
        let mut answers = self.negotiator.receive(&other, Stage::Security)?;
        let find = |key: &str| {
            security
                .iter()
                .find(|p| p.key == key)
                .map(|p| p.value.as_str())
        };
        let mut transit = true;
        match find("AuthMethod") {
            Some("CHAP") => {
                let chap = self
                    .chap
                    .as_ref()
                    .ok_or(InitiatorLoginError::Protocol("CHAP chosen but not offered"))?;
                answers.push(chap.offer());
                transit = false;
            }
            Some("None") => {
                if self.chap.as_ref().is_some_and(InitiatorChap::is_mutual) {
                    return Err(InitiatorLoginError::Protocol("AuthMethod None not offered"));
                }
                self.chap = None;
                self.authenticated = true;
            }
            Some(_) => {
                return Err(InitiatorLoginError::Refused(
                    LoginStatus::AUTHENTICATION_FAILURE,
                ));
            }
            None => {}
        }
        if find("CHAP_C").is_some() {
            let chap = self
                .chap
                .as_mut()
                .ok_or(InitiatorLoginError::Protocol("CHAP challenge without CHAP"))?;
            let (identifier, challenge) = self.mutual_challenge.clone();
            let mut history = self
                .challenge_history
                .lock()
                .map_err(|_| InitiatorLoginError::Protocol("challenge history poisoned"))?;
            answers.extend(chap.respond(&security, identifier, challenge, &mut history)?);
            self.authenticated = chap.is_authenticated();
        }
        if find("CHAP_N").is_some() || find("CHAP_R").is_some() {
            let chap = self
                .chap
                .as_mut()
                .ok_or(InitiatorLoginError::Protocol("CHAP response without CHAP"))?;
            chap.verify_target(&security)?;
            self.authenticated = true;
        }
        if response.transit {
            if let Some(chap) = self.chap.as_mut()
                && chap.is_mutual()
                && !chap.is_authenticated()
            {
                // The target moved on without proving itself.
                chap.verify_target(&security)?;
            }
            if !self.authenticated {
                return Err(InitiatorLoginError::Protocol(
                    "transit before authentication",
                ));
            }
            return self.enter(response.next_stage, response);
        }
        Ok(self.request_with(answers, transit, LoginStage::LoginOperationalNegotiation))
    }

    fn operational(&mut self, response: &LoginResponse, pairs: &[TextPair]) -> Step {
        let answers = self.negotiator.receive(pairs, Stage::Operational)?;
        if response.transit {
            if !answers.is_empty() {
                return Err(InitiatorLoginError::Protocol(
                    "target transited with offers pending",
                ));
            }
            return self.enter(response.next_stage, response);
        }
        let mut out = answers;
        out.extend(self.negotiator.offers(Stage::Operational));
        Ok(self.request_with(out, true, LoginStage::FullFeaturePhase))
    }

    /// The target moved to `stage`.
    fn enter(&mut self, stage: LoginStage, response: &LoginResponse) -> Step {
        match stage {
            LoginStage::FullFeaturePhase => {
                self.finished = true;
                let parameters = self.negotiator.finish()?;
                Ok(InitiatorStep::Complete(Box::new(InitiatorLoginComplete {
                    parameters,
                    tsih: response.tsih,
                    exp_stat_sn: self.exp_stat_sn,
                    exp_cmd_sn: response.exp_cmd_sn,
                    max_cmd_sn: response.max_cmd_sn,
                })))
            }
            LoginStage::LoginOperationalNegotiation => {
                self.stage = stage;
                let offers = self.negotiator.offers(Stage::Operational);
                Ok(self.request_with(offers, true, LoginStage::FullFeaturePhase))
            }
            _ => Err(InitiatorLoginError::Protocol("transit to an invalid stage")),
        }
    }

    fn request(&mut self, pairs: Vec<TextPair>, next: LoginStage) -> InitiatorStep {
        self.request_with(pairs, true, next)
    }

    /// A request carrying `pairs`, split over several PDUs if longer than
    /// the target accepts during login.
    fn request_with(
        &mut self,
        pairs: Vec<TextPair>,
        transit: bool,
        next: LoginStage,
    ) -> InitiatorStep {
        let mut text = Vec::new();
        codec::encode(&pairs, &mut text);
        let mut parts: Vec<Vec<u8>> = codec::fragment(&text, LOGIN_SEGMENT_LIMIT)
            .into_iter()
            .map(|(part, _)| part.to_vec())
            .collect();
        let first = parts.remove(0);
        self.outgoing = parts;
        self.final_transit = (transit, next);
        let continues = !self.outgoing.is_empty();
        self.send(first, continues, transit && !continues, next)
    }

    fn send(
        &mut self,
        data: Vec<u8>,
        continues: bool,
        transit: bool,
        next: LoginStage,
    ) -> InitiatorStep {
        self.asked_transit = transit;
        let request = LoginRequest {
            transit,
            continue_flag: continues,
            current_stage: self.stage,
            next_stage: if transit {
                next
            } else {
                LoginStage::SecurityNegotiation
            },
            version_max: 0,
            version_min: 0,
            isid: self.config.isid,
            tsih: self.config.tsih,
            initiator_task_tag: self.initiator_task_tag,
            cid: self.config.cid,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        InitiatorStep::Send { request, data }
    }
}
