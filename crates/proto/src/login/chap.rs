//! CHAP authentication for the login's security stage (RFC 7143 section
//! 12.1.3, over RFC 1994), one-way and mutual.
//!
//! The exchange, as keys in Login PDUs:
//!
//! 1. initiator: `CHAP_A=<algorithms, preferred first>`
//! 2. target: `CHAP_A=<chosen>`, `CHAP_I=<identifier>`, `CHAP_C=<challenge>`
//! 3. initiator: `CHAP_N=<name>`, `CHAP_R=<H(I || secret || C)>`, and for
//!    mutual authentication its own `CHAP_I`, `CHAP_C`
//! 4. target (mutual only): `CHAP_N`, `CHAP_R` answering the initiator's
//!    challenge, which the initiator verifies.
//!
//! Algorithms: MD5 (5, which RFC 7143 requires), SHA-1 (6), SHA-256 (7) and
//! SHA3-256 (8), the values the Linux target and initiator use. Binary values
//! go out as `0x` hexadecimal and are accepted in hexadecimal or `0b` base64.
//! A challenge that a side issued itself coming back (reflection), or one
//! seen before (reuse), fails the authentication, and so does configuring the
//! same secret for both directions.
//!
//! No randomness or clock is read here: the caller supplies each challenge
//! and identifier, fresh from its random source.

use std::collections::VecDeque;

use base64::Engine as _;
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::text::codec::TextPair;
use crate::text::keys::parse_number;

/// A CHAP hash algorithm and its CHAP_A code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChapAlgorithm {
    /// MD5, CHAP_A=5 (RFC 1994; required by RFC 7143).
    Md5,
    /// SHA-1, CHAP_A=6.
    Sha1,
    /// SHA-256, CHAP_A=7.
    Sha256,
    /// SHA3-256, CHAP_A=8.
    Sha3_256,
}

impl ChapAlgorithm {
    /// Every algorithm, strongest first: the default preference.
    pub const ALL: [ChapAlgorithm; 4] = [
        ChapAlgorithm::Sha3_256,
        ChapAlgorithm::Sha256,
        ChapAlgorithm::Sha1,
        ChapAlgorithm::Md5,
    ];

    /// The CHAP_A value.
    pub fn code(self) -> u8 {
        match self {
            ChapAlgorithm::Md5 => 5,
            ChapAlgorithm::Sha1 => 6,
            ChapAlgorithm::Sha256 => 7,
            ChapAlgorithm::Sha3_256 => 8,
        }
    }

    /// The algorithm with this CHAP_A value.
    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|a| u64::from(a.code()) == code)
    }

    /// The length of a response, in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha1 => 20,
            ChapAlgorithm::Sha256 | ChapAlgorithm::Sha3_256 => 32,
        }
    }

    /// The CHAP response `H(identifier || secret || challenge)` (RFC 1994
    /// section 4.1).
    pub fn response(self, identifier: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        fn hash<D: md5::Digest>(identifier: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
            let mut hasher = D::new();
            hasher.update([identifier]);
            hasher.update(secret);
            hasher.update(challenge);
            hasher.finalize().to_vec()
        }
        match self {
            ChapAlgorithm::Md5 => hash::<md5::Md5>(identifier, secret, challenge),
            ChapAlgorithm::Sha1 => hash::<sha1::Sha1>(identifier, secret, challenge),
            ChapAlgorithm::Sha256 => hash::<sha2::Sha256>(identifier, secret, challenge),
            ChapAlgorithm::Sha3_256 => hash::<sha3::Sha3_256>(identifier, secret, challenge),
        }
    }
}

/// Why CHAP failed. [`ChapError::login_status`] gives the Login Response
/// status a target answers with (RFC 7143 11.13.5).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ChapError {
    /// A CHAP key the exchange needs now is absent.
    #[error("missing {0}")]
    MissingKey(&'static str),
    /// A value that does not parse.
    #[error("malformed {key}: {value:?}")]
    Malformed {
        /// The key.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// None of the offered algorithms is acceptable.
    #[error("no acceptable CHAP algorithm in {0:?}")]
    NoCommonAlgorithm(String),
    /// The peer chose an algorithm that was not offered.
    #[error("CHAP algorithm {0} was not offered")]
    AlgorithmNotOffered(String),
    /// The user name is not the configured one.
    #[error("unknown CHAP name {0:?}")]
    UnknownName(String),
    /// The response does not match.
    #[error("CHAP response does not match")]
    WrongResponse,
    /// The peer sent back a challenge this side issued.
    #[error("reflected CHAP challenge")]
    ReflectedChallenge,
    /// A challenge already seen.
    #[error("reused CHAP challenge")]
    ReusedChallenge,
    /// A challenge too short to be safe (shorter than the response).
    #[error("CHAP challenge of {0} bytes is too short")]
    ShortChallenge(usize),
    /// The initiator asked for mutual authentication the target is not
    /// configured for, or the initiator required it and the target did not
    /// answer.
    #[error("mutual CHAP not configured on both sides")]
    MutualNotConfigured,
    /// The same secret was configured for both directions (RFC 7143 12.1.3
    /// forbids it).
    #[error("the same CHAP secret may not authenticate both directions")]
    SameSecretBothWays,
    /// A CHAP key arrived when the exchange does not expect it.
    #[error("unexpected CHAP key at this point")]
    OutOfOrder,
}

impl ChapError {
    /// The Login Response status class and detail for this failure:
    /// authentication failure (0x0201) for credentials, initiator error
    /// (0x0200) for a malformed or out-of-order exchange.
    pub fn login_status(&self) -> (u8, u8) {
        match self {
            ChapError::MissingKey(_) | ChapError::Malformed { .. } | ChapError::OutOfOrder => {
                (0x02, 0x00)
            }
            _ => (0x02, 0x01),
        }
    }
}

/// The longest binary value accepted: 1024 bytes (challenges and responses
/// are far shorter; the bound keeps decoding cheap).
const MAX_BINARY_LEN: usize = 1024;

/// Encodes bytes as a CHAP binary value: `0x` and lowercase hexadecimal.
pub fn encode_binary(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 + 2 * bytes.len());
    out.push_str("0x");
    for byte in bytes {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Decodes a binary value: `0x`/`0X` hexadecimal or `0b`/`0B` base64
/// (RFC 7143 section 6, binary-value).
pub fn decode_binary(key: &'static str, value: &str) -> Result<Vec<u8>, ChapError> {
    let malformed = || ChapError::Malformed {
        key,
        value: value.chars().take(80).collect(),
    };
    if value.len() > 2 + 2 * MAX_BINARY_LEN {
        return Err(malformed());
    }
    if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if hex.is_empty() || hex.len() % 2 != 0 {
            return Err(malformed());
        }
        hex.as_bytes()
            .chunks_exact(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
                    .ok_or_else(malformed)
            })
            .collect()
    } else if let Some(b64) = value
        .strip_prefix("0b")
        .or_else(|| value.strip_prefix("0B"))
    {
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .filter(|b| !b.is_empty())
            .ok_or_else(malformed)
    } else {
        Err(malformed())
    }
}

/// A CHAP name and secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The CHAP_N name.
    pub name: String,
    /// The shared secret.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("name", &self.name)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// Credentials from a name and a secret.
    pub fn new(name: impl Into<String>, secret: impl Into<Vec<u8>>) -> Self {
        Credentials {
            name: name.into(),
            secret: secret.into(),
        }
    }
}

/// The challenges recently issued and received, so that a reflected or
/// replayed challenge is refused. Bounded; a target shares one across its
/// connections.
#[derive(Debug)]
pub struct ChallengeHistory {
    seen: VecDeque<Vec<u8>>,
    capacity: usize,
}

impl Default for ChallengeHistory {
    fn default() -> Self {
        Self::new(1024)
    }
}

impl ChallengeHistory {
    /// A history remembering the last `capacity` challenges.
    pub fn new(capacity: usize) -> Self {
        ChallengeHistory {
            seen: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    fn contains(&self, challenge: &[u8]) -> bool {
        self.seen.iter().any(|c| c == challenge)
    }

    fn remember(&mut self, challenge: &[u8]) {
        if self.seen.len() == self.capacity {
            self.seen.pop_front();
        }
        self.seen.push_back(challenge.to_vec());
    }
}

fn find<'a>(pairs: &'a [TextPair], key: &'static str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|p| p.key == key)
        .map(|p| p.value.as_str())
}

fn require<'a>(pairs: &'a [TextPair], key: &'static str) -> Result<&'a str, ChapError> {
    find(pairs, key).ok_or(ChapError::MissingKey(key))
}

fn parse_identifier(value: &str) -> Result<u8, ChapError> {
    parse_number(value)
        .and_then(|v| u8::try_from(v).ok())
        .ok_or_else(|| ChapError::Malformed {
            key: "CHAP_I",
            value: value.to_owned(),
        })
}

/// RFC 7143 12.1.3 forbids one secret for both directions.
fn check_distinct_secrets(own: &Credentials, peer: Option<&Credentials>) -> Result<(), ChapError> {
    if peer.is_some_and(|p| p.secret == own.secret) {
        return Err(ChapError::SameSecretBothWays);
    }
    Ok(())
}

/// Checks a peer's `CHAP_N`/`CHAP_R` against the credentials it must prove
/// and the challenge it was given; the response is compared in constant
/// time.
fn verify_proof(
    pairs: &[TextPair],
    expected: &Credentials,
    algorithm: ChapAlgorithm,
    identifier: u8,
    challenge: &[u8],
) -> Result<(), ChapError> {
    let name = require(pairs, "CHAP_N")?;
    let response = decode_binary("CHAP_R", require(pairs, "CHAP_R")?)?;
    if name != expected.name {
        return Err(ChapError::UnknownName(name.to_owned()));
    }
    let proof = algorithm.response(identifier, &expected.secret, challenge);
    if proof.len() != response.len() || !bool::from(proof.ct_eq(&response)) {
        return Err(ChapError::WrongResponse);
    }
    Ok(())
}

/// The target's side of CHAP.
#[derive(Debug)]
pub struct TargetChap {
    algorithms: Vec<ChapAlgorithm>,
    initiator: Credentials,
    mutual: Option<Credentials>,
    issued: Option<(ChapAlgorithm, u8, Vec<u8>)>,
    done: bool,
}

impl TargetChap {
    /// A target that accepts `algorithms` (preferred first), expects the
    /// initiator to prove `initiator`, and proves `mutual` when asked.
    pub fn new(
        algorithms: Vec<ChapAlgorithm>,
        initiator: Credentials,
        mutual: Option<Credentials>,
    ) -> Result<Self, ChapError> {
        check_distinct_secrets(&initiator, mutual.as_ref())?;
        Ok(TargetChap {
            algorithms,
            initiator,
            mutual,
            issued: None,
            done: false,
        })
    }

    /// Answers the initiator's `CHAP_A` with the chosen algorithm and a
    /// challenge (`identifier` and `challenge` from the caller's random
    /// source; the challenge at least as long as the digest).
    pub fn challenge(
        &mut self,
        pairs: &[TextPair],
        identifier: u8,
        challenge: Vec<u8>,
        history: &mut ChallengeHistory,
    ) -> Result<Vec<TextPair>, ChapError> {
        if self.issued.is_some() || self.done {
            return Err(ChapError::OutOfOrder);
        }
        let offered = require(pairs, "CHAP_A")?;
        let algorithm = offered
            .split(',')
            .filter_map(|code| parse_number(code).and_then(ChapAlgorithm::from_code))
            .find(|a| self.algorithms.contains(a))
            .ok_or_else(|| ChapError::NoCommonAlgorithm(offered.to_owned()))?;
        if challenge.len() < algorithm.digest_len() {
            return Err(ChapError::ShortChallenge(challenge.len()));
        }
        history.remember(&challenge);
        let answer = vec![
            TextPair::new("CHAP_A", algorithm.code().to_string()),
            TextPair::new("CHAP_I", identifier.to_string()),
            TextPair::new("CHAP_C", encode_binary(&challenge)),
        ];
        self.issued = Some((algorithm, identifier, challenge));
        Ok(answer)
    }

    /// Verifies the initiator's `CHAP_N`/`CHAP_R`; for mutual CHAP, answers
    /// its `CHAP_I`/`CHAP_C` with the target's `CHAP_N`/`CHAP_R`.
    pub fn verify(
        &mut self,
        pairs: &[TextPair],
        history: &mut ChallengeHistory,
    ) -> Result<Vec<TextPair>, ChapError> {
        let Some((algorithm, identifier, challenge)) = self.issued.take() else {
            return Err(ChapError::OutOfOrder);
        };
        verify_proof(pairs, &self.initiator, algorithm, identifier, &challenge)?;
        self.done = true;
        let (Some(mutual_identifier), Some(mutual_challenge)) =
            (find(pairs, "CHAP_I"), find(pairs, "CHAP_C"))
        else {
            return Ok(Vec::new());
        };
        let mutual = self.mutual.as_ref().ok_or(ChapError::MutualNotConfigured)?;
        let mutual_identifier = parse_identifier(mutual_identifier)?;
        let mutual_challenge = decode_binary("CHAP_C", mutual_challenge)?;
        if mutual_challenge == challenge {
            return Err(ChapError::ReflectedChallenge);
        }
        if history.contains(&mutual_challenge) {
            return Err(ChapError::ReusedChallenge);
        }
        if mutual_challenge.len() < algorithm.digest_len() {
            return Err(ChapError::ShortChallenge(mutual_challenge.len()));
        }
        history.remember(&mutual_challenge);
        let answer = algorithm.response(mutual_identifier, &mutual.secret, &mutual_challenge);
        Ok(vec![
            TextPair::new("CHAP_N", mutual.name.clone()),
            TextPair::new("CHAP_R", encode_binary(&answer)),
        ])
    }

    /// Whether the initiator has proved itself.
    pub fn is_authenticated(&self) -> bool {
        self.done
    }
}

/// The initiator's side of CHAP.
#[derive(Debug)]
pub struct InitiatorChap {
    algorithms: Vec<ChapAlgorithm>,
    credentials: Credentials,
    /// For mutual CHAP: the target's expected name and secret.
    target: Option<Credentials>,
    algorithm: Option<ChapAlgorithm>,
    sent: Option<(u8, Vec<u8>)>,
    done: bool,
}

impl InitiatorChap {
    /// An initiator proving `credentials`, offering `algorithms` (preferred
    /// first), and, with `target`, requiring the target to prove those.
    pub fn new(
        algorithms: Vec<ChapAlgorithm>,
        credentials: Credentials,
        target: Option<Credentials>,
    ) -> Result<Self, ChapError> {
        check_distinct_secrets(&credentials, target.as_ref())?;
        Ok(InitiatorChap {
            algorithms,
            credentials,
            target,
            algorithm: None,
            sent: None,
            done: false,
        })
    }

    /// Whether this initiator asks the target to authenticate too.
    pub fn is_mutual(&self) -> bool {
        self.target.is_some()
    }

    /// The `CHAP_A` offer.
    pub fn offer(&self) -> TextPair {
        let codes: Vec<String> = self
            .algorithms
            .iter()
            .map(|a| a.code().to_string())
            .collect();
        TextPair::new("CHAP_A", codes.join(","))
    }

    /// Answers the target's challenge with `CHAP_N`/`CHAP_R`; for mutual
    /// CHAP, adds this side's `CHAP_I`/`CHAP_C` (`identifier` and
    /// `challenge` from the caller's random source).
    pub fn respond(
        &mut self,
        pairs: &[TextPair],
        identifier: u8,
        challenge: Vec<u8>,
        history: &mut ChallengeHistory,
    ) -> Result<Vec<TextPair>, ChapError> {
        if self.algorithm.is_some() {
            return Err(ChapError::OutOfOrder);
        }
        let chosen = require(pairs, "CHAP_A")?;
        let algorithm = parse_number(chosen)
            .and_then(ChapAlgorithm::from_code)
            .filter(|a| self.algorithms.contains(a))
            .ok_or_else(|| ChapError::AlgorithmNotOffered(chosen.to_owned()))?;
        let target_identifier = parse_identifier(require(pairs, "CHAP_I")?)?;
        let target_challenge = decode_binary("CHAP_C", require(pairs, "CHAP_C")?)?;
        if history.contains(&target_challenge) {
            return Err(ChapError::ReusedChallenge);
        }
        history.remember(&target_challenge);
        self.algorithm = Some(algorithm);
        let response = algorithm.response(
            target_identifier,
            &self.credentials.secret,
            &target_challenge,
        );
        let mut answer = vec![
            TextPair::new("CHAP_N", self.credentials.name.clone()),
            TextPair::new("CHAP_R", encode_binary(&response)),
        ];
        if self.target.is_some() {
            if challenge.len() < algorithm.digest_len() {
                return Err(ChapError::ShortChallenge(challenge.len()));
            }
            if challenge == target_challenge {
                return Err(ChapError::ReflectedChallenge);
            }
            history.remember(&challenge);
            answer.push(TextPair::new("CHAP_I", identifier.to_string()));
            answer.push(TextPair::new("CHAP_C", encode_binary(&challenge)));
            self.sent = Some((identifier, challenge));
        } else {
            self.done = true;
        }
        Ok(answer)
    }

    /// Verifies the target's `CHAP_N`/`CHAP_R` (mutual CHAP only).
    pub fn verify_target(&mut self, pairs: &[TextPair]) -> Result<(), ChapError> {
        let (Some(target), Some(algorithm), Some((identifier, challenge))) =
            (&self.target, self.algorithm, &self.sent)
        else {
            return Err(ChapError::OutOfOrder);
        };
        if find(pairs, "CHAP_N").is_none() {
            return Err(ChapError::MutualNotConfigured);
        }
        verify_proof(pairs, target, algorithm, *identifier, challenge)?;
        self.done = true;
        Ok(())
    }

    /// Whether authentication is complete on this side.
    pub fn is_authenticated(&self) -> bool {
        self.done
    }
}
