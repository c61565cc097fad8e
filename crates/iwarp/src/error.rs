//! Errors, and the Terminate reasons of RFC 5040 §4.8 (layer, error type,
//! error code) that say whose rule was broken.

use std::fmt;

/// Why a stream ended or a call failed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The socket failed (the OS error as text, so that the error stays `Clone`).
    #[error("I/O error: {0}")]
    Io(String),
    /// The stream is closed (TCP closed, or disconnected by us).
    #[error("the stream is closed")]
    Closed,
    /// `max_send_wr` (or `max_recv_wr`) requests are posted and not yet completed.
    #[error("the queue is full")]
    QueueFull,
    /// A start-up frame that is not one, a rejected request, markers demanded, bad revision...
    #[error("MPA start-up: {0}")]
    Mpa(String),
    /// We sent a Terminate: the peer broke a rule.
    #[error("we terminated the stream: {0}")]
    LocalTerminate(TerminateReason),
    /// The peer sent a Terminate.
    #[error("the peer terminated the stream: {0}")]
    RemoteTerminate(TerminateReason),
    /// The MPA exchange did not finish in time.
    #[error("timed out")]
    Timeout,
    /// API misuse (unknown local STag, region too small...), reported not hidden.
    #[error("misuse: {0}")]
    Misuse(String),
    /// A driver task of ours failed (a bug): the stream is ended rather
    /// than left silent.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe => Error::Closed,
            _ => Error::Io(e.to_string()),
        }
    }
}

/// The layer a Terminate blames (RFC 5040 §4.8, "Layer").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// 0: RDMAP.
    Rdmap = 0,
    /// 1: DDP.
    Ddp = 1,
    /// 2: the lower layer protocol, here MPA.
    Llp = 2,
}

impl Layer {
    /// The layer from its 4-bit code (`None` for reserved values).
    pub fn from_code(code: u8) -> Option<Layer> {
        match code {
            0 => Some(Layer::Rdmap),
            1 => Some(Layer::Ddp),
            2 => Some(Layer::Llp),
            _ => None,
        }
    }
}

/// RDMAP error types (RFC 5040 §4.8).
pub mod rdmap_etype {
    /// Local catastrophic error.
    pub const LOCAL_CATASTROPHIC: u8 = 0;
    /// Remote protection error (STag, bounds, access).
    pub const REMOTE_PROTECTION: u8 = 1;
    /// Remote operation error (version, opcode, invalidation...).
    pub const REMOTE_OPERATION: u8 = 2;
}

/// RDMAP error codes (RFC 5040 §4.8).
pub mod rdmap_code {
    /// Invalid STag.
    pub const INVALID_STAG: u8 = 0x00;
    /// Base or bounds violation.
    pub const BASE_BOUNDS: u8 = 0x01;
    /// Access rights violation.
    pub const ACCESS_RIGHTS: u8 = 0x02;
    /// STag not associated with this RDMAP stream.
    pub const STAG_NOT_ASSOCIATED: u8 = 0x03;
    /// Tagged offset wrap.
    pub const TO_WRAP: u8 = 0x04;
    /// Invalid RDMAP version.
    pub const VERSION: u8 = 0x05;
    /// Unexpected opcode.
    pub const OPCODE: u8 = 0x06;
    /// Catastrophic error, localized to this stream.
    pub const CATASTROPHIC_STREAM: u8 = 0x07;
    /// Catastrophic error, global.
    pub const CATASTROPHIC_GLOBAL: u8 = 0x08;
    /// The STag cannot be invalidated.
    pub const CANNOT_INVALIDATE: u8 = 0x09;
    /// Unspecified.
    pub const UNSPECIFIED: u8 = 0xff;
}

/// DDP error types (RFC 5041 §7.2).
pub mod ddp_etype {
    /// Local catastrophic error.
    pub const LOCAL_CATASTROPHIC: u8 = 0;
    /// Tagged buffer error.
    pub const TAGGED: u8 = 1;
    /// Untagged buffer error.
    pub const UNTAGGED: u8 = 2;
}

/// DDP error codes (RFC 5041 §7.2): tagged (T_) and untagged (U_).
pub mod ddp_code {
    /// Tagged: invalid STag.
    pub const T_INVALID_STAG: u8 = 0;
    /// Tagged: base or bounds violation.
    pub const T_BASE_BOUNDS: u8 = 1;
    /// Tagged: STag not associated with this stream.
    pub const T_STAG_NOT_ASSOCIATED: u8 = 2;
    /// Tagged: TO wrap.
    pub const T_TO_WRAP: u8 = 3;
    /// Tagged: invalid DDP version.
    pub const T_VERSION: u8 = 4;
    /// Untagged: invalid QN.
    pub const U_INVALID_QN: u8 = 1;
    /// Untagged: invalid MSN, no buffer available.
    pub const U_NO_BUFFER: u8 = 2;
    /// Untagged: invalid MSN, MSN out of range.
    pub const U_MSN_RANGE: u8 = 3;
    /// Untagged: invalid MO.
    pub const U_INVALID_MO: u8 = 4;
    /// Untagged: message too long for the buffer.
    pub const U_TOO_LONG: u8 = 5;
    /// Untagged: invalid DDP version.
    pub const U_VERSION: u8 = 6;
}

/// MPA (LLP) error codes (RFC 5044 §8, RFC 6581 §9); the error type is always 0.
pub mod llp_code {
    /// TCP connection closed, terminated or lost.
    pub const TCP_CLOSED: u8 = 1;
    /// MPA CRC error.
    pub const CRC: u8 = 2;
    /// FPDU start marker mismatch.
    pub const MARKER: u8 = 3;
    /// Invalid MPA Request or Reply frame.
    pub const INVALID_FRAME: u8 = 4;
    /// Local catastrophic error.
    pub const LOCAL_CATASTROPHIC: u8 = 5;
    /// Insufficient IRD resources (RFC 6581).
    pub const INSUFFICIENT_IRD: u8 = 6;
    /// No matching RTR (RFC 6581).
    pub const NO_MATCHING_RTR: u8 = 7;
}

/// The blame a Terminate carries: layer, error type and code (RFC 5040
/// §4.8), and a sentence for people (not on the wire).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TerminateReason {
    /// The layer whose rule was broken.
    pub layer: Layer,
    /// The error type within the layer.
    pub etype: u8,
    /// The error code within the type.
    pub code: u8,
    /// What happened, for logs.
    pub message: String,
}

impl TerminateReason {
    /// A reason with the given codes.
    pub fn new(layer: Layer, etype: u8, code: u8, message: impl Into<String>) -> Self {
        TerminateReason {
            layer,
            etype,
            code,
            message: message.into(),
        }
    }
    /// An RDMAP-layer reason.
    pub fn rdmap(etype: u8, code: u8, message: impl Into<String>) -> Self {
        Self::new(Layer::Rdmap, etype, code, message)
    }
    /// A DDP-layer reason.
    pub fn ddp(etype: u8, code: u8, message: impl Into<String>) -> Self {
        Self::new(Layer::Ddp, etype, code, message)
    }
    /// An MPA-layer reason (error type 0).
    pub fn llp(code: u8, message: impl Into<String>) -> Self {
        Self::new(Layer::Llp, 0, code, message)
    }
    /// A malformed segment that fits no finer code: RDMAP catastrophic error
    /// localized to the stream.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::rdmap(
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::CATASTROPHIC_STREAM,
            message,
        )
    }
}

impl fmt::Display for TerminateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} layer, error type {}, code {:#04x}: {}",
            self.layer, self.etype, self.code, self.message
        )
    }
}
