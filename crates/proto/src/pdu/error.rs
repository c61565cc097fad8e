//! Errors of the PDU codec, each saying whose fault it was ([`Fault`]) and
//! what RFC 7143 says to do about it: the Reject reason to answer with
//! ([`DecodeError::reject_reason`], section 11.17.1) and whether the
//! connection must be dropped ([`DecodeError::requires_connection_drop`],
//! section 7.8 and each variant).

use thiserror::Error;

use crate::pdu::reject::RejectReason;
use crate::pdu::stage::Stage;

/// Whose fault an error is, in the manner of rustls' `InvalidMessage` /
/// `PeerMisbehaved` / `ApiMisuse` split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The bytes are corrupt or not a valid encoding (including digest
    /// failures: the network or the peer damaged them).
    MalformedBytes,
    /// The bytes are well formed but break a negotiated limit or a protocol
    /// rule.
    ProtocolViolation,
    /// This side's caller used the API wrongly; the peer is not to blame.
    ApiMisuse,
}

/// An error receiving PDUs.
///
/// The streaming decoder never consumes input in a call that returns an
/// error, so the caller's byte accounting stays exact.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The header digest (CRC32C over BHS and AHS) does not match. The PDU
    /// boundary can no longer be trusted (the length fields may be corrupt)
    /// and RFC 7143 has no sync-and-steering layer, so the connection must be
    /// dropped (section 7.8); recovery is at the session or connection level.
    #[error("header digest mismatch: received {received:#010x}, computed {computed:#010x}")]
    HeaderDigestMismatch {
        /// The digest on the wire.
        received: u32,
        /// The digest of the bytes received.
        computed: u32,
    },
    /// The data digest does not match. The PDU has been consumed and is
    /// discarded; a target answers with a Reject "data (payload) digest
    /// error" carrying `rejected_bhs` (sections 7.8, 11.17.1). The
    /// connection stays usable.
    #[error("data digest mismatch: received {received:#010x}, computed {computed:#010x}")]
    DataDigestMismatch {
        /// The digest on the wire.
        received: u32,
        /// The digest of the bytes received.
        computed: u32,
        /// The BHS of the discarded PDU, for the Reject's data segment.
        rejected_bhs: Box<[u8; 48]>,
    },
    /// DataSegmentLength exceeds the MaxRecvDataSegmentLength this side
    /// declared (section 13.12). Detected from the BHS alone, before any
    /// buffer is allocated. The decoder does not read the oversize segment:
    /// the connection is dropped (optionally after a Reject "protocol
    /// error", section 11.17.1).
    #[error("DataSegmentLength {length} exceeds MaxRecvDataSegmentLength {max}")]
    DataSegmentTooLong {
        /// DataSegmentLength from the BHS.
        length: u32,
        /// The configured limit.
        max: u32,
    },
    /// TotalAHSLength exceeds the configured AHS limit.
    #[error("TotalAHSLength of {length} bytes exceeds the limit of {max}")]
    AhsTooLong {
        /// TotalAHSLength in bytes.
        length: usize,
        /// The configured limit in bytes.
        max: usize,
    },
    /// An AHS's own length disagrees with TotalAHSLength or with its type
    /// (section 11.2.2).
    #[error("malformed AHS: {reason}")]
    MalformedAhs {
        /// What was wrong.
        reason: &'static str,
    },
    /// The decoder stopped at an earlier error that requires dropping the
    /// connection; it decodes nothing more.
    #[error("the decoder stopped at an earlier fatal error")]
    Stopped,
    /// A data call ([`crate::pdu::Decoder::data_received`],
    /// [`crate::pdu::Decoder::receive_data`]) was made outside the data
    /// stage, or with more bytes than the segment has left.
    #[error("{call} is not valid now: the decoder expects {stage:?} ({remaining} bytes)")]
    WrongStage {
        /// The call made.
        call: &'static str,
        /// The stage the decoder is in.
        stage: Stage,
        /// Bytes left in that stage.
        remaining: usize,
    },
}

impl DecodeError {
    /// Whose fault the error is.
    pub fn fault(&self) -> Fault {
        match self {
            DecodeError::HeaderDigestMismatch { .. }
            | DecodeError::DataDigestMismatch { .. }
            | DecodeError::MalformedAhs { .. } => Fault::MalformedBytes,
            DecodeError::DataSegmentTooLong { .. } | DecodeError::AhsTooLong { .. } => {
                Fault::ProtocolViolation
            }
            DecodeError::Stopped | DecodeError::WrongStage { .. } => Fault::ApiMisuse,
        }
    }

    /// The Reject reason RFC 7143 section 11.17.1 prescribes for this error,
    /// when a Reject is the answer (or may precede closing the connection).
    pub fn reject_reason(&self) -> Option<RejectReason> {
        match self {
            DecodeError::DataDigestMismatch { .. } => Some(RejectReason::DataDigestError),
            DecodeError::DataSegmentTooLong { .. } | DecodeError::AhsTooLong { .. } => {
                Some(RejectReason::ProtocolError)
            }
            DecodeError::MalformedAhs { .. } => Some(RejectReason::InvalidPduField),
            DecodeError::HeaderDigestMismatch { .. }
            | DecodeError::Stopped
            | DecodeError::WrongStage { .. } => None,
        }
    }

    /// Whether the connection must be dropped: the byte stream can no
    /// longer be parsed (section 7.8 for header digests) or this decoder
    /// refuses to continue. After such an error the decoder answers every
    /// call with [`DecodeError::Stopped`].
    pub fn requires_connection_drop(&self) -> bool {
        match self {
            DecodeError::HeaderDigestMismatch { .. }
            | DecodeError::DataSegmentTooLong { .. }
            | DecodeError::AhsTooLong { .. }
            | DecodeError::MalformedAhs { .. }
            | DecodeError::Stopped => true,
            DecodeError::DataDigestMismatch { .. } | DecodeError::WrongStage { .. } => false,
        }
    }
}

/// An error encoding a PDU; always the caller's ([`Fault::ApiMisuse`]).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// The data segment does not fit the 24-bit DataSegmentLength (section
    /// 11.2.1.3).
    #[error("data segment of {length} bytes exceeds the 24-bit DataSegmentLength")]
    DataSegmentTooLong {
        /// The length asked for.
        length: usize,
    },
    /// The AHSs do not fit TotalAHSLength (255 words, section 11.2.1.2).
    #[error("AHS of {length} bytes exceeds 1020")]
    AhsTooLong {
        /// Their wire length.
        length: usize,
    },
    /// The header does not fit the buffer given.
    #[error("header needs {needed} bytes, buffer has {available}")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// `Header::data_segment_length` differs from the data given.
    #[error("header says {header} data bytes, {data} given")]
    DataLengthMismatch {
        /// The header's DataSegmentLength.
        header: u32,
        /// The data's length.
        data: usize,
    },
}

impl EncodeError {
    /// Whose fault the error is: always the caller's.
    pub fn fault(&self) -> Fault {
        Fault::ApiMisuse
    }
}
