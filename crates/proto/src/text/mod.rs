//! Text keys and their negotiation (RFC 7143 sections 6 and 13, RFC 7145
//! section 6).
//!
//! - [`codec`]: the `key=value\0` format of Login and Text data segments,
//!   continuation over several PDUs (the C bit) and splitting a text into
//!   segments a peer accepts.
//! - [`keys`]: the table of every key with its type, range, default, result
//!   function, scope, use and sender.
//! - [`negotiation`]: the engine that offers, answers and checks answers,
//!   and produces the negotiated parameters.

pub mod codec;
pub mod keys;
pub mod negotiation;

pub use codec::{TextAssembler, TextError, TextPair};
pub use negotiation::{
    Digest, NegotiatedParameters, NegotiationConfig, NegotiationError, Negotiator, Outcome, Role,
    SessionType, Stage,
};
