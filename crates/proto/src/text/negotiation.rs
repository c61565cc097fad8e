//! The negotiation engine (RFC 7143 section 6 and the keys of section 13,
//! RFC 7145 section 6): one [`Negotiator`] per connection and side, fed the
//! pairs the peer sent and asked for the pairs to send, with no I/O.
//!
//! - An offer from the peer is answered by the key's result function: the
//!   first acceptable value of a list (6.1), the minimum or maximum of two
//!   numbers, the AND or OR of two booleans (6.2); declarations are recorded
//!   and not answered. Keys nobody defined get `NotUnderstood`, keys that do
//!   not apply here (a session-wide key in a discovery session, a
//!   leading-only key on a secondary connection, FirstBurstLength when
//!   neither immediate nor unsolicited data is allowed, MaxRecvDataSegmentLength
//!   under iSER) get `Irrelevant`, and unacceptable or malformed values get
//!   `Reject`.
//! - An answer to our own offer is checked against the result function: a
//!   list answer must be one of the values offered, a Minimum answer may not
//!   exceed the offer, and so on; anything else fails the negotiation.
//! - [`Negotiator::finish`] folds the outcome, defaults and the cross-key
//!   rules (FirstBurstLength <= MaxBurstLength; per-direction data segment
//!   lengths) into [`NegotiatedParameters`].
//!
//! Security keys (AuthMethod, CHAP_*) belong to the login's authentication
//! exchange; the engine leaves them to it.

use std::collections::BTreeMap;

use thiserror::Error;

use super::codec::TextPair;
use super::keys::{
    KeyDefinition, Sender, Usage, ValueKind, format_boolean, is_extension_key, lookup,
    parse_boolean, parse_number,
};

/// Which end of the connection this negotiator speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The initiator.
    Initiator,
    /// The target.
    Target,
}

/// Where in the connection's life a text exchange happens (RFC 7143 6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Login, security negotiation (CSG 0).
    Security,
    /// Login, operational negotiation (CSG 1).
    Operational,
    /// Full feature phase: Text Request/Response.
    FullFeature,
}

/// The session type the initiator declared (RFC 7143 13.21).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionType {
    /// A normal session, with SCSI commands.
    Normal,
    /// A discovery session: SendTargets only.
    Discovery,
}

/// A digest choice (RFC 7143 13.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Digest {
    /// No digest.
    None,
    /// CRC32C.
    Crc32c,
}

impl Digest {
    fn name(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }
}

/// What this side offers and accepts: for every negotiable key, its own
/// value (its limit, for numbers; its preference order, for lists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NegotiationConfig {
    /// The session type (used by the initiator, which declares it).
    pub session_type: SessionType,
    /// Acceptable header digests, most preferred first.
    pub header_digest: Vec<Digest>,
    /// Acceptable data digests, most preferred first.
    pub data_digest: Vec<Digest>,
    /// MaxConnections (13.2).
    pub max_connections: u16,
    /// InitialR2T (13.10).
    pub initial_r2t: bool,
    /// ImmediateData (13.11).
    pub immediate_data: bool,
    /// The largest data segment this side receives (13.12), declared.
    pub max_recv_data_segment_length: u32,
    /// MaxBurstLength (13.13).
    pub max_burst_length: u32,
    /// FirstBurstLength (13.14).
    pub first_burst_length: u32,
    /// DefaultTime2Wait, seconds (13.15).
    pub default_time2wait: u16,
    /// DefaultTime2Retain, seconds (13.16).
    pub default_time2retain: u16,
    /// MaxOutstandingR2T (13.17).
    pub max_outstanding_r2t: u16,
    /// DataPDUInOrder (13.18).
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder (13.19).
    pub data_sequence_in_order: bool,
    /// The highest ErrorRecoveryLevel this side supports (13.20).
    pub error_recovery_level: u8,
    /// TaskReporting values this side supports, preferred first (13.23).
    pub task_reporting: Vec<String>,
    /// iSCSIProtocolLevel (13.24; RFC 7144).
    pub iscsi_protocol_level: u8,
    /// RDMAExtensions (RFC 7145 6.3): whether iSER is wanted.
    pub rdma_extensions: bool,
    /// Declarations to send: InitiatorName, TargetName, aliases,
    /// TargetPortalGroupTag, X#NodeArchitecture, ... as `key=value` pairs.
    pub declarations: Vec<TextPair>,
    /// Private extension keys (`X-...`) this side offers, or answers with
    /// the configured value when the peer offers them.
    pub extensions: Vec<TextPair>,
}

impl Default for NegotiationConfig {
    /// The values RFC 7143 section 13 gives as defaults: negotiating with
    /// this configuration sends nothing but the data segment length.
    fn default() -> Self {
        NegotiationConfig {
            session_type: SessionType::Normal,
            header_digest: vec![Digest::None],
            data_digest: vec![Digest::None],
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: vec!["RFC3720".to_owned()],
            iscsi_protocol_level: 1,
            rdma_extensions: false,
            declarations: Vec::new(),
            extensions: Vec::new(),
        }
    }
}

impl NegotiationConfig {
    /// This side's own value for `key`, as it goes on the wire.
    fn local_value(&self, key: &str) -> Option<String> {
        let list = |digests: &[Digest]| {
            digests
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(",")
        };
        Some(match key {
            "HeaderDigest" => list(&self.header_digest),
            "DataDigest" => list(&self.data_digest),
            "MaxConnections" => self.max_connections.to_string(),
            "InitialR2T" => format_boolean(self.initial_r2t).to_owned(),
            "ImmediateData" => format_boolean(self.immediate_data).to_owned(),
            "MaxRecvDataSegmentLength" => self.max_recv_data_segment_length.to_string(),
            "MaxBurstLength" => self.max_burst_length.to_string(),
            "FirstBurstLength" => self.first_burst_length.to_string(),
            "DefaultTime2Wait" => self.default_time2wait.to_string(),
            "DefaultTime2Retain" => self.default_time2retain.to_string(),
            "MaxOutstandingR2T" => self.max_outstanding_r2t.to_string(),
            "DataPDUInOrder" => format_boolean(self.data_pdu_in_order).to_owned(),
            "DataSequenceInOrder" => format_boolean(self.data_sequence_in_order).to_owned(),
            "ErrorRecoveryLevel" => self.error_recovery_level.to_string(),
            "TaskReporting" => self.task_reporting.join(","),
            "iSCSIProtocolLevel" => self.iscsi_protocol_level.to_string(),
            "RDMAExtensions" => format_boolean(self.rdma_extensions).to_owned(),
            "SessionType" => match self.session_type {
                SessionType::Normal => "Normal".to_owned(),
                SessionType::Discovery => "Discovery".to_owned(),
            },
            _ => {
                return self
                    .declarations
                    .iter()
                    .chain(&self.extensions)
                    .find(|p| p.key == key)
                    .map(|p| p.value.clone());
            }
        })
    }
}

/// How one key ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Both sides agree on this value.
    Agreed(String),
    /// The key does not apply; its default holds.
    Irrelevant,
    /// One side does not know the key; its default holds.
    NotUnderstood,
    /// The responder refused the offered values; the default holds.
    Rejected,
}

/// A negotiation that cannot go on: the peer broke a rule of section 6.
/// A target ends the login with status 0x0200 (initiator error,
/// [`NegotiationError::LOGIN_STATUS`]); an initiator drops the connection.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum NegotiationError {
    /// The same key twice in one negotiation.
    #[error("key {0} offered more than once")]
    DuplicateKey(String),
    /// A key the peer's role may not send.
    #[error("key {0} may not be sent by the peer")]
    WrongSender(String),
    /// An answer outside what was offered (6.1, 6.2).
    #[error("answer {key}={value} is not admissible for what was offered")]
    InadmissibleAnswer {
        /// The key.
        key: String,
        /// The answer received.
        value: String,
    },
    /// A declaration with a malformed or out-of-range value.
    #[error("invalid declaration {key}={value}")]
    InvalidDeclaration {
        /// The key.
        key: String,
        /// The value received.
        value: String,
    },
    /// An offer of ours that was never answered, with no implicit result.
    #[error("no answer to the offer of {0}")]
    MissingAnswer(String),
    /// A security key outside the security stage.
    #[error("security key {0} outside the security negotiation stage")]
    SecurityKeyOutOfStage(String),
}

impl NegotiationError {
    /// The login status class and detail a target answers with: initiator
    /// error (RFC 7143 11.13.5).
    pub const LOGIN_STATUS: (u8, u8) = (0x02, 0x00);
}

/// The per-key bookkeeping of one negotiation.
#[derive(Clone, Debug, Default)]
struct KeyState {
    /// The value we offered, awaiting or having received an answer.
    offered: Option<String>,
    /// Whether the peer offered it (so we answered).
    peer_offered: bool,
    outcome: Option<Outcome>,
}

/// The result of a negotiation: what both sides use from now on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NegotiatedParameters {
    /// Session type.
    pub session_type: SessionType,
    /// HeaderDigest for this connection.
    pub header_digest: Digest,
    /// DataDigest for this connection.
    pub data_digest: Digest,
    /// MaxConnections.
    pub max_connections: u16,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// The largest data segment this side may send: the peer's declared
    /// MaxRecvDataSegmentLength (or, under iSER, its RecvDataSegmentLength).
    pub max_send_data_segment_length: u32,
    /// The largest data segment the peer may send this side: our declaration.
    pub max_recv_data_segment_length: u32,
    /// MaxBurstLength.
    pub max_burst_length: u32,
    /// FirstBurstLength, never above MaxBurstLength.
    pub first_burst_length: u32,
    /// DefaultTime2Wait, seconds.
    pub default_time2wait: u16,
    /// DefaultTime2Retain, seconds.
    pub default_time2retain: u16,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u16,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel.
    pub error_recovery_level: u8,
    /// TaskReporting.
    pub task_reporting: String,
    /// iSCSIProtocolLevel.
    pub iscsi_protocol_level: u8,
    /// RDMAExtensions: iSER in use.
    pub rdma_extensions: bool,
    /// Everything the peer declared (names, aliases, portal group tag,
    /// X# keys, SendTargets), by key.
    pub peer_declarations: BTreeMap<String, String>,
    /// The private extension keys both sides agreed on.
    pub extensions: Vec<TextPair>,
}

impl NegotiatedParameters {
    /// The parameters of a connection that joined this session (or
    /// reinstated one of its connections): the session's leading-only keys
    /// ("LO", RFC 7143 13: MaxConnections, InitialR2T, ImmediateData,
    /// MaxBurstLength, FirstBurstLength, DefaultTime2Wait,
    /// DefaultTime2Retain, MaxOutstandingR2T, DataPDUInOrder,
    /// DataSequenceInOrder, ErrorRecoveryLevel, ...), which a non-leading
    /// login does not negotiate, with `connection`'s own digests and data
    /// segment lengths.
    pub fn joined_by(&self, connection: &NegotiatedParameters) -> NegotiatedParameters {
        NegotiatedParameters {
            header_digest: connection.header_digest,
            data_digest: connection.data_digest,
            max_send_data_segment_length: connection.max_send_data_segment_length,
            max_recv_data_segment_length: connection.max_recv_data_segment_length,
            peer_declarations: connection.peer_declarations.clone(),
            ..self.clone()
        }
    }

    /// Whether the initiator may send data before an R2T (immediate or
    /// unsolicited Data-Out): FirstBurstLength is irrelevant otherwise
    /// (13.14).
    pub fn allows_unsolicited_data(&self) -> bool {
        self.immediate_data || !self.initial_r2t
    }
}

/// One connection's negotiation, on one side.
#[derive(Clone, Debug)]
pub struct Negotiator {
    role: Role,
    config: NegotiationConfig,
    leading: bool,
    session_type: SessionType,
    keys: BTreeMap<String, KeyState>,
    peer_declarations: BTreeMap<String, String>,
}

impl Negotiator {
    /// A negotiation for `role` with this side's `config`; `leading` is
    /// whether this is the session's first connection (LO keys apply).
    pub fn new(role: Role, config: NegotiationConfig, leading: bool) -> Self {
        let session_type = match role {
            Role::Initiator => config.session_type,
            Role::Target => SessionType::Normal,
        };
        Negotiator {
            role,
            config,
            leading,
            session_type,
            keys: BTreeMap::new(),
            peer_declarations: BTreeMap::new(),
        }
    }

    /// The session type, as declared so far.
    pub fn session_type(&self) -> SessionType {
        self.session_type
    }

    /// How `key` ended, if it did.
    pub fn outcome(&self, key: &str) -> Option<&Outcome> {
        self.keys.get(key).and_then(|s| s.outcome.as_ref())
    }

    /// The value the peer declared for `key`, if any.
    pub fn peer_declaration(&self, key: &str) -> Option<&str> {
        self.peer_declarations.get(key).map(String::as_str)
    }

    fn peer_may_send(&self, def: &KeyDefinition) -> bool {
        matches!(
            (def.sender, self.role),
            (Sender::Both, _)
                | (Sender::Initiator, Role::Target)
                | (Sender::Target, Role::Initiator)
        )
    }

    fn we_may_send(&self, def: &KeyDefinition) -> bool {
        matches!(
            (def.sender, self.role),
            (Sender::Both, _)
                | (Sender::Initiator, Role::Initiator)
                | (Sender::Target, Role::Target)
        )
    }

    /// Why a key does not apply here, making the answer `Irrelevant`.
    fn irrelevant(&self, def: &KeyDefinition) -> bool {
        (def.irrelevant_in_discovery && self.session_type == SessionType::Discovery)
            || (def.usage == Usage::LeadingOnly && !self.leading)
            || (def.name == "MaxRecvDataSegmentLength"
                && self.agreed_bool_or_default("RDMAExtensions", false))
            || (def.name == "FirstBurstLength"
                && self.agreed_bool_or_default("InitialR2T", true)
                && !self.agreed_bool_or_default("ImmediateData", true))
    }

    fn usable_in(def: &KeyDefinition, stage: Stage) -> bool {
        match def.usage {
            Usage::SecurityOnly => stage == Stage::Security,
            Usage::FullFeatureOnly => stage == Stage::FullFeature,
            Usage::InitialOnly | Usage::LeadingOnly => stage != Stage::FullFeature,
            Usage::All => true,
        }
    }

    fn agreed(&self, key: &str) -> Option<&str> {
        match self.outcome(key) {
            Some(Outcome::Agreed(v)) => Some(v),
            _ => None,
        }
    }

    fn agreed_bool_or_default(&self, key: &str, default: bool) -> bool {
        self.agreed(key).and_then(parse_boolean).unwrap_or(default)
    }

    /// The pairs this side sends unprompted at `stage`: offers of every
    /// negotiable key whose configured value differs from the RFC default
    /// (an unsent key takes its default), and declarations. Each key is
    /// offered once per negotiation, and never when the peer offered it
    /// first (then it was answered instead).
    pub fn offers(&mut self, stage: Stage) -> Vec<TextPair> {
        let mut out = Vec::new();
        if stage == Stage::Security {
            // Declarations travel in the first login PDUs, before
            // authentication (RFC 7143 6.3): the initiator's names and
            // session type, the target's alias and portal group tag.
            // Operational keys wait for the operational stage.
            let mut keys: Vec<String> = self
                .config
                .declarations
                .iter()
                .map(|p| p.key.clone())
                .collect();
            // SessionType is leading only (RFC 7143 13.21: "Use: LO"):
            // a connection joining a session does not send it.
            if self.role == Role::Initiator && self.leading {
                keys.push("SessionType".to_owned());
            }
            for key in keys {
                self.declare(&key, &mut out);
            }
            return out;
        }
        for def in super::keys::KEYS {
            if !Self::usable_in(def, stage) || !self.we_may_send(def) || self.irrelevant(def) {
                continue;
            }
            if matches!(def.kind, ValueKind::Security | ValueKind::Obsolete) {
                continue;
            }
            let Some(value) = self.config.local_value(def.name) else {
                continue;
            };
            let state = self.keys.entry(def.name.to_owned()).or_default();
            if state.offered.is_some() || state.peer_offered {
                continue;
            }
            let declaration = matches!(def.kind, ValueKind::Declarative(_));
            // The data segment length is always declared: peers commonly
            // size their buffers from it even when it is the default.
            let always = def.name == "MaxRecvDataSegmentLength" || declaration;
            if !always && value == def.default {
                continue;
            }
            if def.name == "SessionType" && self.role == Role::Target {
                continue;
            }
            state.offered = Some(value.clone());
            if declaration {
                state.outcome = Some(Outcome::Agreed(value.clone()));
            }
            out.push(TextPair::new(def.name, value));
        }
        for extension in &self.config.extensions {
            let state = self.keys.entry(extension.key.clone()).or_default();
            if state.offered.is_none() && !state.peer_offered {
                state.offered = Some(extension.value.clone());
                out.push(extension.clone());
            }
        }
        out
    }

    /// Sends this side's configured declaration of `key`, once.
    fn declare(&mut self, key: &str, out: &mut Vec<TextPair>) {
        if lookup(key).is_some_and(|def| !self.we_may_send(def)) {
            return;
        }
        let Some(value) = self.config.local_value(key) else {
            return;
        };
        let state = self.keys.entry(key.to_owned()).or_default();
        if state.offered.is_none() {
            state.offered = Some(value.clone());
            state.outcome = Some(Outcome::Agreed(value.clone()));
            out.push(TextPair::new(key, value));
        }
    }

    /// Takes the pairs the peer sent at `stage` and returns the answers to
    /// send back. Answers to our own offers are checked and recorded.
    /// Security keys are left to the authentication exchange during the
    /// security stage and are an error at any other.
    pub fn receive(
        &mut self,
        pairs: &[TextPair],
        stage: Stage,
    ) -> Result<Vec<TextPair>, NegotiationError> {
        for (i, pair) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|p| p.key == pair.key) {
                return Err(NegotiationError::DuplicateKey(pair.key.clone()));
            }
        }
        // SessionType first: it decides which keys are relevant. Then
        // everything but FirstBurstLength, whose relevance and bound depend
        // on InitialR2T, ImmediateData and MaxBurstLength.
        let rank = |p: &&TextPair| match p.key.as_str() {
            "SessionType" => 0,
            "FirstBurstLength" => 2,
            _ => 1,
        };
        let mut ordered: Vec<&TextPair> = pairs.iter().collect();
        ordered.sort_by_key(rank);
        let mut answers = Vec::new();
        for pair in ordered {
            if let Some(answer) = self.receive_pair(pair, stage)? {
                answers.push(answer);
            }
        }
        // Keep the peer's order in the answers, as peers expect.
        answers.sort_by_key(|a: &TextPair| pairs.iter().position(|p| p.key == a.key));
        Ok(answers)
    }

    fn receive_pair(
        &mut self,
        pair: &TextPair,
        stage: Stage,
    ) -> Result<Option<TextPair>, NegotiationError> {
        let key = pair.key.as_str();
        let Some(def) = lookup(key) else {
            return Ok(self.receive_unknown(pair));
        };
        if def.usage == Usage::SecurityOnly {
            return if stage == Stage::Security {
                Ok(None)
            } else {
                Err(NegotiationError::SecurityKeyOutOfStage(pair.key.clone()))
            };
        }
        if matches!(def.kind, ValueKind::Declarative(_)) {
            self.receive_declaration(def, pair)?;
            return Ok(None);
        }
        let state = self.keys.entry(pair.key.clone()).or_default();
        if let Some(offered) = state.offered.clone() {
            if state.outcome.is_some() {
                return Err(NegotiationError::DuplicateKey(pair.key.clone()));
            }
            let outcome = answer_outcome(def, &offered, &pair.value)?;
            self.set_outcome(key, outcome);
            return Ok(None);
        }
        if state.peer_offered {
            // A reply to our answer, not a second offer: tgt 1.0.85 answers
            // our `FirstBurstLength=Irrelevant` (its offer, while InitialR2T=Yes
            // and ImmediateData=No) with `FirstBurstLength=Reject`. An answer
            // needs no answer (RFC 7143 section 6.2); the key's outcome stands.
            if state.outcome.is_some()
                && matches!(
                    pair.value.as_str(),
                    "Reject" | "Irrelevant" | "NotUnderstood"
                )
            {
                return Ok(None);
            }
            return Err(NegotiationError::DuplicateKey(pair.key.clone()));
        }
        state.peer_offered = true;
        if !self.peer_may_send(def) {
            return Err(NegotiationError::WrongSender(pair.key.clone()));
        }
        // The obsoleted markers (13.25) and keys used outside their stage
        // are refused.
        let (outcome, answer) =
            if matches!(def.kind, ValueKind::Obsolete) || !Self::usable_in(def, stage) {
                (Outcome::Rejected, "Reject".to_owned())
            } else if self.irrelevant(def) {
                (Outcome::Irrelevant, "Irrelevant".to_owned())
            } else {
                match self.respond(def, &pair.value) {
                    Some(value) => (Outcome::Agreed(value.clone()), value),
                    None => (Outcome::Rejected, "Reject".to_owned()),
                }
            };
        self.set_outcome(key, outcome);
        Ok(Some(TextPair::new(key, answer)))
    }

    fn set_outcome(&mut self, key: &str, outcome: Outcome) {
        self.keys.entry(key.to_owned()).or_default().outcome = Some(outcome);
    }

    /// Our answer to the peer's offer of `value`, or `None` for `Reject`.
    fn respond(&self, def: &KeyDefinition, value: &str) -> Option<String> {
        let ours = self.config.local_value(def.name)?;
        match def.kind {
            ValueKind::List(legal) => {
                let acceptable: Vec<&str> = ours.split(',').collect();
                value
                    .split(',')
                    .find(|v| legal.contains(v) && acceptable.contains(v))
                    .map(str::to_owned)
            }
            ValueKind::NumberMin { min, max } | ValueKind::NumberMax { min, max } => {
                let offered = parse_number(value).filter(|v| (min..=max).contains(v))?;
                let own = parse_number(&ours)?;
                let mut result = if matches!(def.kind, ValueKind::NumberMin { .. }) {
                    offered.min(own)
                } else {
                    offered.max(own)
                };
                if def.name == "FirstBurstLength" {
                    // 13.14: FirstBurstLength MUST NOT exceed MaxBurstLength:
                    // the agreed one, else the most our pending offer allows,
                    // else the default.
                    let burst = self
                        .agreed("MaxBurstLength")
                        .or_else(|| {
                            self.keys
                                .get("MaxBurstLength")
                                .and_then(|s| s.offered.as_deref())
                        })
                        .and_then(parse_number)
                        .unwrap_or(262_144);
                    result = result.min(burst.max(min));
                }
                Some(result.to_string())
            }
            ValueKind::BooleanAnd | ValueKind::BooleanOr => {
                let offered = parse_boolean(value)?;
                let own = parse_boolean(&ours)?;
                let result = if def.kind == ValueKind::BooleanAnd {
                    offered && own
                } else {
                    offered || own
                };
                Some(format_boolean(result).to_owned())
            }
            ValueKind::Declarative(_) | ValueKind::Security | ValueKind::Obsolete => None,
        }
    }

    fn receive_declaration(
        &mut self,
        def: &KeyDefinition,
        pair: &TextPair,
    ) -> Result<(), NegotiationError> {
        let invalid = || NegotiationError::InvalidDeclaration {
            key: pair.key.clone(),
            value: pair.value.clone(),
        };
        if !self.peer_may_send(def) {
            return Err(NegotiationError::WrongSender(pair.key.clone()));
        }
        // A peer that does not know one of our declarations says so: tgt
        // 1.0.85's iSER target answers `InitiatorRecvDataSegmentLength=
        // NotUnderstood` (it knows only MaxRecvDataSegmentLength). Nothing
        // was negotiated; the default stands (RFC 7143 section 6.2).
        if matches!(
            pair.value.as_str(),
            "NotUnderstood" | "Irrelevant" | "Reject"
        ) && self
            .keys
            .get(&pair.key)
            .is_some_and(|state| state.offered.is_some())
        {
            return Ok(());
        }
        if let ValueKind::Declarative(Some((min, max))) = def.kind {
            parse_number(&pair.value)
                .filter(|v| (min..=max).contains(v))
                .ok_or_else(invalid)?;
        }
        if def.name == "SessionType" {
            self.session_type = match pair.value.as_str() {
                "Normal" => SessionType::Normal,
                "Discovery" => SessionType::Discovery,
                _ => return Err(invalid()),
            };
        }
        self.peer_declarations
            .insert(pair.key.clone(), pair.value.clone());
        Ok(())
    }

    /// A key this implementation does not define: a configured private
    /// extension is answered with its configured value (or recorded, when
    /// it answers our offer); `X#` keys are declarations; anything else is
    /// `NotUnderstood` (RFC 7143 6).
    fn receive_unknown(&mut self, pair: &TextPair) -> Option<TextPair> {
        let state = self.keys.entry(pair.key.clone()).or_default();
        if state.offered.is_some() && state.outcome.is_none() {
            state.outcome = Some(match pair.value.as_str() {
                "NotUnderstood" => Outcome::NotUnderstood,
                "Irrelevant" => Outcome::Irrelevant,
                "Reject" => Outcome::Rejected,
                v => Outcome::Agreed(v.to_owned()),
            });
            return None;
        }
        if pair.key.starts_with("X#") {
            self.peer_declarations
                .insert(pair.key.clone(), pair.value.clone());
            return None;
        }
        state.peer_offered = true;
        let configured = is_extension_key(&pair.key)
            .then(|| self.config.extensions.iter().find(|e| e.key == pair.key))
            .flatten();
        let (outcome, answer) = match configured {
            Some(ext) => (Outcome::Agreed(ext.value.clone()), ext.value.clone()),
            None => (Outcome::NotUnderstood, "NotUnderstood".to_owned()),
        };
        state.outcome = Some(outcome);
        Some(TextPair::new(pair.key.clone(), answer))
    }

    /// The keys we offered that have no answer yet.
    pub fn pending_offers(&self) -> Vec<&str> {
        self.keys
            .iter()
            .filter(|(_, s)| s.offered.is_some() && s.outcome.is_none())
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// Every offer answered (or implicitly decided, 6.2: AND offered as
    /// `No`, OR offered as `Yes`).
    pub fn is_complete(&self) -> bool {
        self.pending_offers()
            .iter()
            .all(|key| implicit_result(key, self.keys[*key].offered.as_deref()).is_some())
    }

    /// The negotiated parameters: agreed values, else the implicit boolean
    /// results, else the RFC defaults; then the cross-key rules.
    pub fn finish(&self) -> Result<NegotiatedParameters, NegotiationError> {
        let value = |key: &str| -> Result<String, NegotiationError> {
            let state = self.keys.get(key);
            if let Some(Outcome::Agreed(v)) = state.and_then(|s| s.outcome.as_ref()) {
                return Ok(v.clone());
            }
            if let Some(offered) = state.and_then(|s| s.offered.as_deref())
                && state.and_then(|s| s.outcome.as_ref()).is_none()
            {
                return implicit_result(key, Some(offered))
                    .map(str::to_owned)
                    .ok_or_else(|| NegotiationError::MissingAnswer(key.to_owned()));
            }
            Ok(lookup(key).map_or("", |d| d.default).to_owned())
        };
        let number = |key: &str| -> Result<u64, NegotiationError> {
            let v = value(key)?;
            parse_number(&v).ok_or(NegotiationError::InadmissibleAnswer {
                key: key.to_owned(),
                value: v,
            })
        };
        let boolean = |key: &str| -> Result<bool, NegotiationError> {
            let v = value(key)?;
            parse_boolean(&v).ok_or(NegotiationError::InadmissibleAnswer {
                key: key.to_owned(),
                value: v,
            })
        };
        let digest = |key: &str| -> Result<Digest, NegotiationError> {
            Ok(match value(key)?.as_str() {
                "CRC32C" => Digest::Crc32c,
                _ => Digest::None,
            })
        };
        let rdma_extensions = boolean("RDMAExtensions")?;
        let (ours_key, theirs_key) = match self.role {
            Role::Initiator => (
                "InitiatorRecvDataSegmentLength",
                "TargetRecvDataSegmentLength",
            ),
            Role::Target => (
                "TargetRecvDataSegmentLength",
                "InitiatorRecvDataSegmentLength",
            ),
        };
        let declared = |key: &str| {
            self.peer_declarations
                .get(key)
                .and_then(|v| parse_number(v))
                .unwrap_or(8192)
        };
        let (max_send, max_recv) = if rdma_extensions {
            (
                declared(theirs_key),
                self.config
                    .local_value(ours_key)
                    .and_then(|v| parse_number(&v))
                    .unwrap_or(u64::from(self.config.max_recv_data_segment_length)),
            )
        } else {
            (
                declared("MaxRecvDataSegmentLength"),
                u64::from(self.config.max_recv_data_segment_length),
            )
        };
        let max_burst_length = number("MaxBurstLength")?;
        let first_burst_length = number("FirstBurstLength")?.min(max_burst_length);
        let narrow = |v: u64| u16::try_from(v).unwrap_or(u16::MAX);
        let extensions = self
            .config
            .extensions
            .iter()
            .filter_map(|e| match self.outcome(&e.key) {
                Some(Outcome::Agreed(v)) => Some(TextPair::new(e.key.clone(), v.clone())),
                _ => None,
            })
            .collect();
        Ok(NegotiatedParameters {
            session_type: self.session_type,
            header_digest: digest("HeaderDigest")?,
            data_digest: digest("DataDigest")?,
            max_connections: narrow(number("MaxConnections")?),
            initial_r2t: boolean("InitialR2T")?,
            immediate_data: boolean("ImmediateData")?,
            max_send_data_segment_length: u32::try_from(max_send).unwrap_or(u32::MAX),
            max_recv_data_segment_length: u32::try_from(max_recv).unwrap_or(u32::MAX),
            max_burst_length: u32::try_from(max_burst_length).unwrap_or(u32::MAX),
            first_burst_length: u32::try_from(first_burst_length).unwrap_or(u32::MAX),
            default_time2wait: narrow(number("DefaultTime2Wait")?),
            default_time2retain: narrow(number("DefaultTime2Retain")?),
            max_outstanding_r2t: narrow(number("MaxOutstandingR2T")?),
            data_pdu_in_order: boolean("DataPDUInOrder")?,
            data_sequence_in_order: boolean("DataSequenceInOrder")?,
            error_recovery_level: u8::try_from(number("ErrorRecoveryLevel")?).unwrap_or(0),
            task_reporting: value("TaskReporting")?,
            iscsi_protocol_level: u8::try_from(number("iSCSIProtocolLevel")?).unwrap_or(1),
            rdma_extensions,
            peer_declarations: self.peer_declarations.clone(),
            extensions,
        })
    }
}

/// The result a boolean offer implies without an answer (RFC 7143 6.2):
/// AND offered `No` is `No`, OR offered `Yes` is `Yes`.
fn implicit_result<'a>(key: &str, offered: Option<&'a str>) -> Option<&'a str> {
    let def = lookup(key)?;
    match (def.kind, offered?) {
        (ValueKind::BooleanAnd, v @ "No") | (ValueKind::BooleanOr, v @ "Yes") => Some(v),
        _ => None,
    }
}

/// Checks the peer's answer to our offer of `offered` against the key's
/// result function and returns how the key ended.
fn answer_outcome(
    def: &KeyDefinition,
    offered: &str,
    answer: &str,
) -> Result<Outcome, NegotiationError> {
    let inadmissible = || NegotiationError::InadmissibleAnswer {
        key: def.name.to_owned(),
        value: answer.to_owned(),
    };
    match answer {
        "NotUnderstood" => return Ok(Outcome::NotUnderstood),
        "Irrelevant" => return Ok(Outcome::Irrelevant),
        "Reject" => return Ok(Outcome::Rejected),
        _ => {}
    }
    let admissible = match def.kind {
        ValueKind::List(_) => offered.split(',').any(|v| v == answer),
        ValueKind::NumberMin { min, max } => match (parse_number(answer), parse_number(offered)) {
            (Some(a), Some(o)) => a >= min && a <= max && a <= o,
            _ => false,
        },
        ValueKind::NumberMax { min, max } => match (parse_number(answer), parse_number(offered)) {
            (Some(a), Some(o)) => a >= min && a <= max && a >= o,
            _ => false,
        },
        ValueKind::BooleanAnd => match (parse_boolean(answer), parse_boolean(offered)) {
            (Some(a), Some(o)) => o || !a,
            _ => false,
        },
        ValueKind::BooleanOr => match (parse_boolean(answer), parse_boolean(offered)) {
            (Some(a), Some(o)) => !o || a,
            _ => false,
        },
        ValueKind::Declarative(_) | ValueKind::Security | ValueKind::Obsolete => false,
    };
    if admissible {
        Ok(Outcome::Agreed(answer.to_owned()))
    } else {
        Err(inadmissible())
    }
}
