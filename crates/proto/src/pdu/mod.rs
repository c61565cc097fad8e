//! iSCSI PDU framing (RFC 7143 section 11.2): the 48-byte Basic Header
//! Segment (BHS), Additional Header Segments (AHS, TotalAHSLength in 4-byte
//! words), the optional header digest after BHS+AHS, the data segment
//! (DataSegmentLength, 24 bits) padded to a multiple of 4 bytes, and the
//! optional data digest after data and padding (section 11.1).
//!
//! This module owns the [`Opcode`] table, the typed [`Pdu`] enum over every
//! PDU family, the [`Header`] (BHS + AHS + data length) and the AHS codec.
//! Each PDU family's fields live in its own file: [`scsi`], [`data`],
//! [`task`], [`login`], [`text`], [`logout`], [`nop`], [`snack`],
//! [`async_msg`], [`reject`]. Sending is in [`encode`], receiving in
//! [`decoder`].
//!
//! Decoding is lenient where RFC 7143 says "reserved": reserved bits are
//! ignored and unknown code values are kept (`Other(u8)` variants), so a
//! higher layer decides how to answer them. Encoding writes reserved bits as
//! zero. [`Pdu::reserved_bits_clear`] tells whether a received BHS was
//! canonical (every reserved bit zero).

pub mod async_msg;
pub mod data;
pub mod decoder;
pub mod encode;
pub mod error;
pub mod login;
pub mod logout;
pub mod nop;
pub mod reject;
pub mod scsi;
pub mod snack;
pub(crate) mod stage;
pub mod task;
pub mod text;

pub(crate) mod wire;

use crate::pdu::error::{DecodeError, EncodeError};

pub use async_msg::{AsyncEvent, AsyncMessage};
pub use data::{DataIn, DataOut, ReadyToTransfer};
pub use decoder::{DecodedPdu, Decoder, DecoderConfig, Event, Need, Progress, Stage};
pub use encode::{DataTrailer, OutgoingPdu, encode_header, encode_pdu, encode_pdu_to_vec};
pub use login::{
    Isid, IsidType, LoginRequest, LoginResponse, LoginStage, LoginStatus, StatusClass,
};
pub use logout::{LogoutReason, LogoutRequest, LogoutResponse, LogoutResponseCode};
pub use nop::{NopIn, NopOut};
pub use reject::{Reject, RejectReason};
pub use scsi::{ScsiCommand, ScsiResponse, ServiceResponse, TaskAttribute};
pub use snack::{SnackRequest, SnackType};
pub use task::{TaskFunction, TaskManagementRequest, TaskManagementResponse, TaskResponse};
pub use text::{TextRequest, TextResponse};

/// Length of the Basic Header Segment (RFC 7143 section 11.2.1).
pub const BHS_LEN: usize = 48;
/// Length of a header or data digest, a CRC32C sent little-endian (RFC 7143
/// section 11.1, Appendix B.4).
pub const DIGEST_LEN: usize = 4;
/// The largest possible AHS: TotalAHSLength is one byte counting 4-byte
/// words (RFC 7143 section 11.2.1.2).
pub const MAX_AHS_LEN: usize = 255 * 4;
/// The largest DataSegmentLength the 24-bit field can carry (section
/// 11.2.1.3).
pub const MAX_DATA_SEGMENT_LENGTH: u32 = 0x00FF_FFFF;
/// The reserved tag value 0xffffffff, used where a tag field is unused
/// (e.g. the Target Transfer Tag of unsolicited data, RFC 7143 section
/// 11.7.4, or the Initiator Task Tag of Async Message and Reject).
pub const RESERVED_TAG: u32 = 0xFFFF_FFFF;

/// The number of zero bytes that pad `len` bytes to a multiple of 4 (RFC
/// 7143 section 11.1: every segment ends on a 4-byte word boundary).
pub const fn padding_len(len: usize) -> usize {
    (4 - (len % 4)) % 4
}

/// Which digests (CRC32C) are in use in one direction of a connection, as
/// negotiated by HeaderDigest and DataDigest (RFC 7143 sections 13.1 and
/// 11.1). Both are off during login until the login completes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Digests {
    /// A header digest follows BHS + AHS.
    pub header: bool,
    /// A data digest follows data segment + padding, when there is data.
    pub data: bool,
}

/// A Logical Unit Number field, the 8 bytes of SAM addressing kept as one
/// big-endian `u64` (RFC 7143 section 11.2.1.6); its structure is the SCSI
/// layer's business.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lun(pub u64);

/// Defines a one-byte coded field as an enum of the values RFC 7143 names
/// plus a catch-all variant that keeps any other value, so decoding never
/// fails and round-trips.
macro_rules! wire_enum {
    (
        $(#[$m:meta])*
        $name:ident {
            $( $(#[$vm:meta])* $var:ident = $val:expr, )*
        }
        $(#[$om:meta])*
        $other:ident
    ) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vm])* $var, )*
            $(#[$om])*
            $other(u8),
        }

        impl $name {
            /// The value for wire code `code` (unknown codes are kept).
            pub const fn from_u8(code: u8) -> Self {
                match code {
                    $( $val => $name::$var, )*
                    other => $name::$other(other),
                }
            }

            /// The wire code.
            pub const fn to_u8(self) -> u8 {
                match self {
                    $( $name::$var => $val, )*
                    $name::$other(code) => code,
                }
            }
        }
    };
}
pub(crate) use wire_enum;

/// The opcode in BHS byte 0, bits 2-7 (RFC 7143 section 11.2.1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// 0x00 NOP-Out (section 11.18).
    NopOut,
    /// 0x01 SCSI Command (section 11.3).
    ScsiCommand,
    /// 0x02 SCSI Task Management Function Request (section 11.5).
    TaskManagementRequest,
    /// 0x03 Login Request (section 11.12).
    LoginRequest,
    /// 0x04 Text Request (section 11.10).
    TextRequest,
    /// 0x05 SCSI Data-Out (section 11.7).
    ScsiDataOut,
    /// 0x06 Logout Request (section 11.14).
    LogoutRequest,
    /// 0x10 SNACK Request (section 11.16).
    SnackRequest,
    /// 0x20 NOP-In (section 11.19).
    NopIn,
    /// 0x21 SCSI Response (section 11.4).
    ScsiResponse,
    /// 0x22 SCSI Task Management Function Response (section 11.6).
    TaskManagementResponse,
    /// 0x23 Login Response (section 11.13).
    LoginResponse,
    /// 0x24 Text Response (section 11.11).
    TextResponse,
    /// 0x25 SCSI Data-In (section 11.7).
    ScsiDataIn,
    /// 0x26 Logout Response (section 11.15).
    LogoutResponse,
    /// 0x31 Ready To Transfer (R2T) (section 11.8).
    ReadyToTransfer,
    /// 0x32 Asynchronous Message (section 11.9).
    AsyncMessage,
    /// 0x3f Reject (section 11.17).
    Reject,
    /// 0x1c-0x1e: vendor-specific initiator opcodes (section 11.2.1.2).
    VendorInitiator(u8),
    /// 0x3c-0x3e: vendor-specific target opcodes (section 11.2.1.2).
    VendorTarget(u8),
    /// Any other 6-bit value: reserved.
    Reserved(u8),
}

impl Opcode {
    /// The opcode for the low 6 bits of `byte` (the I bit and bit 7 are
    /// ignored).
    pub const fn from_bits(byte: u8) -> Self {
        match byte & 0x3f {
            0x00 => Opcode::NopOut,
            0x01 => Opcode::ScsiCommand,
            0x02 => Opcode::TaskManagementRequest,
            0x03 => Opcode::LoginRequest,
            0x04 => Opcode::TextRequest,
            0x05 => Opcode::ScsiDataOut,
            0x06 => Opcode::LogoutRequest,
            0x10 => Opcode::SnackRequest,
            0x20 => Opcode::NopIn,
            0x21 => Opcode::ScsiResponse,
            0x22 => Opcode::TaskManagementResponse,
            0x23 => Opcode::LoginResponse,
            0x24 => Opcode::TextResponse,
            0x25 => Opcode::ScsiDataIn,
            0x26 => Opcode::LogoutResponse,
            0x31 => Opcode::ReadyToTransfer,
            0x32 => Opcode::AsyncMessage,
            0x3f => Opcode::Reject,
            v @ 0x1c..=0x1e => Opcode::VendorInitiator(v),
            v @ 0x3c..=0x3e => Opcode::VendorTarget(v),
            v => Opcode::Reserved(v),
        }
    }

    /// The 6-bit opcode value.
    pub const fn to_bits(self) -> u8 {
        match self {
            Opcode::NopOut => 0x00,
            Opcode::ScsiCommand => 0x01,
            Opcode::TaskManagementRequest => 0x02,
            Opcode::LoginRequest => 0x03,
            Opcode::TextRequest => 0x04,
            Opcode::ScsiDataOut => 0x05,
            Opcode::LogoutRequest => 0x06,
            Opcode::SnackRequest => 0x10,
            Opcode::NopIn => 0x20,
            Opcode::ScsiResponse => 0x21,
            Opcode::TaskManagementResponse => 0x22,
            Opcode::LoginResponse => 0x23,
            Opcode::TextResponse => 0x24,
            Opcode::ScsiDataIn => 0x25,
            Opcode::LogoutResponse => 0x26,
            Opcode::ReadyToTransfer => 0x31,
            Opcode::AsyncMessage => 0x32,
            Opcode::Reject => 0x3f,
            Opcode::VendorInitiator(v) | Opcode::VendorTarget(v) | Opcode::Reserved(v) => v & 0x3f,
        }
    }

    /// Whether initiators send this opcode (0x00-0x1f, section 11.2.1.2).
    pub const fn is_initiator_opcode(self) -> bool {
        self.to_bits() < 0x20
    }
}

/// The framing lengths carried in BHS bytes 4-7 (RFC 7143 sections
/// 11.2.1.3-11.2.1.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SegmentLengths {
    /// TotalAHSLength, in 4-byte words (padding included).
    pub total_ahs_words: u8,
    /// DataSegmentLength in bytes, without padding (24 bits).
    pub data_segment_length: u32,
}

impl SegmentLengths {
    /// TotalAHSLength in bytes.
    pub const fn total_ahs_len(self) -> usize {
        self.total_ahs_words as usize * 4
    }

    /// The lengths in a BHS's bytes 4-7.
    pub fn of_bhs(bhs: &[u8; BHS_LEN]) -> SegmentLengths {
        SegmentLengths {
            total_ahs_words: bhs[4],
            data_segment_length: wire::u24_at(bhs, 5),
        }
    }

    /// The whole PDU's length on the wire (section 4.2.2): BHS, AHS,
    /// header digest, data segment padded to 4 bytes, data digest (none
    /// without data).
    pub fn pdu_len(self, digests: Digests) -> usize {
        let data = self.data_segment_length as usize;
        let digest = |on: bool| if on { DIGEST_LEN } else { 0 };
        BHS_LEN
            + self.total_ahs_len()
            + digest(digests.header)
            + data
            + padding_len(data)
            + digest(digests.data && data > 0)
    }
}

/// A PDU whose opcode this crate does not interpret (vendor-specific or
/// reserved opcodes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnknownPdu {
    /// The BHS as received, with bytes 4-7 (the lengths) zeroed: the
    /// lengths are in [`SegmentLengths`]. A target answers it with a Reject
    /// "Command not supported" carrying the received header (section 11.17).
    pub bhs: Box<[u8; BHS_LEN]>,
}

/// Every PDU of RFC 7143 section 11, as the typed fields of its BHS.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Pdu {
    /// NOP-Out (section 11.18).
    NopOut(NopOut),
    /// SCSI Command (section 11.3).
    ScsiCommand(ScsiCommand),
    /// Task Management Function Request (section 11.5).
    TaskManagementRequest(TaskManagementRequest),
    /// Login Request (section 11.12).
    LoginRequest(LoginRequest),
    /// Text Request (section 11.10).
    TextRequest(TextRequest),
    /// SCSI Data-Out (section 11.7).
    DataOut(DataOut),
    /// Logout Request (section 11.14).
    LogoutRequest(LogoutRequest),
    /// SNACK Request (section 11.16).
    SnackRequest(SnackRequest),
    /// NOP-In (section 11.19).
    NopIn(NopIn),
    /// SCSI Response (section 11.4).
    ScsiResponse(ScsiResponse),
    /// Task Management Function Response (section 11.6).
    TaskManagementResponse(TaskManagementResponse),
    /// Login Response (section 11.13).
    LoginResponse(LoginResponse),
    /// Text Response (section 11.11).
    TextResponse(TextResponse),
    /// SCSI Data-In (section 11.7).
    DataIn(DataIn),
    /// Logout Response (section 11.15).
    LogoutResponse(LogoutResponse),
    /// Ready To Transfer (section 11.8).
    ReadyToTransfer(ReadyToTransfer),
    /// Asynchronous Message (section 11.9).
    AsyncMessage(AsyncMessage),
    /// Reject (section 11.17).
    Reject(Reject),
    /// A vendor-specific or reserved opcode.
    Unknown(UnknownPdu),
}

impl Pdu {
    /// This PDU's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Pdu::NopOut(_) => Opcode::NopOut,
            Pdu::ScsiCommand(_) => Opcode::ScsiCommand,
            Pdu::TaskManagementRequest(_) => Opcode::TaskManagementRequest,
            Pdu::LoginRequest(_) => Opcode::LoginRequest,
            Pdu::TextRequest(_) => Opcode::TextRequest,
            Pdu::DataOut(_) => Opcode::ScsiDataOut,
            Pdu::LogoutRequest(_) => Opcode::LogoutRequest,
            Pdu::SnackRequest(_) => Opcode::SnackRequest,
            Pdu::NopIn(_) => Opcode::NopIn,
            Pdu::ScsiResponse(_) => Opcode::ScsiResponse,
            Pdu::TaskManagementResponse(_) => Opcode::TaskManagementResponse,
            Pdu::LoginResponse(_) => Opcode::LoginResponse,
            Pdu::TextResponse(_) => Opcode::TextResponse,
            Pdu::DataIn(_) => Opcode::ScsiDataIn,
            Pdu::LogoutResponse(_) => Opcode::LogoutResponse,
            Pdu::ReadyToTransfer(_) => Opcode::ReadyToTransfer,
            Pdu::AsyncMessage(_) => Opcode::AsyncMessage,
            Pdu::Reject(_) => Opcode::Reject,
            Pdu::Unknown(u) => Opcode::from_bits(u.bhs[0]),
        }
    }

    /// The Initiator Task Tag (BHS bytes 16-19, section 11.2.1.8), for every
    /// PDU (0xffffffff where the PDU's format fixes it so).
    pub fn initiator_task_tag(&self) -> u32 {
        match self {
            Pdu::Unknown(u) => wire::u32_at(&u.bhs, 16),
            other => {
                let mut bhs = [0u8; BHS_LEN];
                other.encode_bhs(SegmentLengths::default(), &mut bhs);
                wire::u32_at(&bhs, 16)
            }
        }
    }

    /// Decodes a Basic Header Segment. Never fails: unknown opcodes become
    /// [`Pdu::Unknown`], unknown codes are kept, reserved bits are ignored.
    pub fn decode_bhs(bhs: &[u8; BHS_LEN]) -> (Pdu, SegmentLengths) {
        let lengths = SegmentLengths::of_bhs(bhs);
        let pdu = match Opcode::from_bits(bhs[0]) {
            Opcode::NopOut => Pdu::NopOut(NopOut::decode(bhs)),
            Opcode::ScsiCommand => Pdu::ScsiCommand(ScsiCommand::decode(bhs)),
            Opcode::TaskManagementRequest => {
                Pdu::TaskManagementRequest(TaskManagementRequest::decode(bhs))
            }
            Opcode::LoginRequest => Pdu::LoginRequest(LoginRequest::decode(bhs)),
            Opcode::TextRequest => Pdu::TextRequest(TextRequest::decode(bhs)),
            Opcode::ScsiDataOut => Pdu::DataOut(DataOut::decode(bhs)),
            Opcode::LogoutRequest => Pdu::LogoutRequest(LogoutRequest::decode(bhs)),
            Opcode::SnackRequest => Pdu::SnackRequest(SnackRequest::decode(bhs)),
            Opcode::NopIn => Pdu::NopIn(NopIn::decode(bhs)),
            Opcode::ScsiResponse => Pdu::ScsiResponse(ScsiResponse::decode(bhs)),
            Opcode::TaskManagementResponse => {
                Pdu::TaskManagementResponse(TaskManagementResponse::decode(bhs))
            }
            Opcode::LoginResponse => Pdu::LoginResponse(LoginResponse::decode(bhs)),
            Opcode::TextResponse => Pdu::TextResponse(TextResponse::decode(bhs)),
            Opcode::ScsiDataIn => Pdu::DataIn(DataIn::decode(bhs)),
            Opcode::LogoutResponse => Pdu::LogoutResponse(LogoutResponse::decode(bhs)),
            Opcode::ReadyToTransfer => Pdu::ReadyToTransfer(ReadyToTransfer::decode(bhs)),
            Opcode::AsyncMessage => Pdu::AsyncMessage(AsyncMessage::decode(bhs)),
            Opcode::Reject => Pdu::Reject(Reject::decode(bhs)),
            Opcode::VendorInitiator(_) | Opcode::VendorTarget(_) | Opcode::Reserved(_) => {
                let mut raw = Box::new(*bhs);
                raw[4..8].fill(0);
                Pdu::Unknown(UnknownPdu { bhs: raw })
            }
        };
        (pdu, lengths)
    }

    /// Encodes this PDU's BHS into `out`, with the framing `lengths` in
    /// bytes 4-7 (DataSegmentLength is masked to 24 bits; [`encode_header`]
    /// checks it first). Reserved bits are written as zero.
    pub fn encode_bhs(&self, lengths: SegmentLengths, out: &mut [u8; BHS_LEN]) {
        *out = [0; BHS_LEN];
        match self {
            Pdu::NopOut(p) => p.encode(out),
            Pdu::ScsiCommand(p) => p.encode(out),
            Pdu::TaskManagementRequest(p) => p.encode(out),
            Pdu::LoginRequest(p) => p.encode(out),
            Pdu::TextRequest(p) => p.encode(out),
            Pdu::DataOut(p) => p.encode(out),
            Pdu::LogoutRequest(p) => p.encode(out),
            Pdu::SnackRequest(p) => p.encode(out),
            Pdu::NopIn(p) => p.encode(out),
            Pdu::ScsiResponse(p) => p.encode(out),
            Pdu::TaskManagementResponse(p) => p.encode(out),
            Pdu::LoginResponse(p) => p.encode(out),
            Pdu::TextResponse(p) => p.encode(out),
            Pdu::DataIn(p) => p.encode(out),
            Pdu::LogoutResponse(p) => p.encode(out),
            Pdu::ReadyToTransfer(p) => p.encode(out),
            Pdu::AsyncMessage(p) => p.encode(out),
            Pdu::Reject(p) => p.encode(out),
            Pdu::Unknown(u) => *out = *u.bhs,
        }
        out[4] = lengths.total_ahs_words;
        wire::put_u24(out, 5, lengths.data_segment_length);
    }

    /// Whether every reserved bit of `bhs` is zero and every fixed field
    /// holds its fixed value, i.e. re-encoding the decoded PDU gives the same
    /// bytes. RFC 7143 (section 11.2.1) lets a receiver ignore reserved bits;
    /// this is for stricter checking and for tests.
    pub fn reserved_bits_clear(bhs: &[u8; BHS_LEN]) -> bool {
        let (pdu, lengths) = Pdu::decode_bhs(bhs);
        let mut again = [0u8; BHS_LEN];
        pdu.encode_bhs(lengths, &mut again);
        again == *bhs
    }
}

/// One Additional Header Segment (RFC 7143 section 11.2.2).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Ahs {
    /// AHSType 1, Extended CDB (section 11.2.2.3): the CDB bytes beyond the
    /// first 16 (which are in the BHS).
    ExtendedCdb(Vec<u8>),
    /// AHSType 2, Bidirectional Expected Read-Data Length (section
    /// 11.2.2.4).
    BidiExpectedReadDataLength(u32),
    /// Any other AHSType (reserved, or 60-63 for non-iSCSI extensions).
    Other {
        /// AHSType (section 11.2.2.2).
        ahs_type: u8,
        /// The AHSLength bytes from byte 3 of the AHS on (the AHS-specific
        /// byte and what follows), without padding.
        specific: Vec<u8>,
    },
}

/// AHSType of an Extended CDB AHS.
const AHS_TYPE_EXTENDED_CDB: u8 = 1;
/// AHSType of a Bidirectional Expected Read-Data Length AHS.
const AHS_TYPE_BIDI_READ_LENGTH: u8 = 2;

impl Ahs {
    /// The bytes this AHS takes on the wire, padding included.
    pub fn wire_len(&self) -> usize {
        let effective = self.ahs_length();
        let len = 3 + effective;
        len + padding_len(len)
    }

    /// AHSLength: bytes after AHSType, without padding.
    fn ahs_length(&self) -> usize {
        match self {
            Ahs::ExtendedCdb(cdb) => 1 + cdb.len(),
            Ahs::BidiExpectedReadDataLength(_) => 5,
            Ahs::Other { specific, .. } => specific.len(),
        }
    }

    /// Decodes the AHS area (TotalAHSLength * 4 bytes) into its segments.
    pub fn decode_all(mut bytes: &[u8]) -> Result<Vec<Ahs>, DecodeError> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let (Some(&l0), Some(&l1), Some(&ahs_type)) =
                (bytes.first(), bytes.get(1), bytes.get(2))
            else {
                return Err(DecodeError::MalformedAhs {
                    reason: "fewer than 4 bytes left for an AHS",
                });
            };
            let ahs_length = usize::from(u16::from_be_bytes([l0, l1]));
            let len = 3 + ahs_length;
            let padded = len + padding_len(len);
            let (Some(specific), Some(rest)) = (bytes.get(3..len), bytes.get(padded..)) else {
                return Err(DecodeError::MalformedAhs {
                    reason: "AHSLength runs past TotalAHSLength",
                });
            };
            let ahs = match ahs_type {
                AHS_TYPE_EXTENDED_CDB => match specific.split_first() {
                    Some((_reserved, cdb)) => Ahs::ExtendedCdb(cdb.to_vec()),
                    None => {
                        return Err(DecodeError::MalformedAhs {
                            reason: "Extended CDB AHS with AHSLength 0",
                        });
                    }
                },
                AHS_TYPE_BIDI_READ_LENGTH => match specific {
                    [_reserved, a, b, c, d] => {
                        Ahs::BidiExpectedReadDataLength(u32::from_be_bytes([*a, *b, *c, *d]))
                    }
                    _ => {
                        return Err(DecodeError::MalformedAhs {
                            reason: "Bidirectional Read-Data Length AHS with AHSLength other than 5",
                        });
                    }
                },
                _ => Ahs::Other {
                    ahs_type,
                    specific: specific.to_vec(),
                },
            };
            out.push(ahs);
            bytes = rest;
        }
        Ok(out)
    }

    /// Encodes `all` into the front of `out`, returning the bytes written
    /// (a multiple of 4).
    pub fn encode_all(all: &[Ahs], out: &mut [u8]) -> Result<usize, EncodeError> {
        let total: usize = all.iter().map(Ahs::wire_len).sum();
        if total > MAX_AHS_LEN {
            return Err(EncodeError::AhsTooLong { length: total });
        }
        let available = out.len();
        let Some(area) = out.get_mut(..total) else {
            return Err(EncodeError::BufferTooSmall {
                needed: total,
                available,
            });
        };
        area.fill(0);
        let mut at = 0;
        for ahs in all {
            let ahs_length = ahs.ahs_length();
            let len = ahs.wire_len();
            let seg = area
                .get_mut(at..at + len)
                .ok_or(EncodeError::AhsTooLong { length: total })?;
            let l =
                u16::try_from(ahs_length).map_err(|_| EncodeError::AhsTooLong { length: total })?;
            seg[0..2].copy_from_slice(&l.to_be_bytes());
            match ahs {
                Ahs::ExtendedCdb(cdb) => {
                    seg[2] = AHS_TYPE_EXTENDED_CDB;
                    seg[4..4 + cdb.len()].copy_from_slice(cdb);
                }
                Ahs::BidiExpectedReadDataLength(n) => {
                    seg[2] = AHS_TYPE_BIDI_READ_LENGTH;
                    seg[4..8].copy_from_slice(&n.to_be_bytes());
                }
                Ahs::Other { ahs_type, specific } => {
                    seg[2] = *ahs_type;
                    seg[3..3 + specific.len()].copy_from_slice(specific);
                }
            }
            at += len;
        }
        Ok(total)
    }
}

/// A PDU's whole header: the BHS fields, its AHSs and the length of the data
/// segment that follows (RFC 7143 section 11.1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// The BHS fields.
    pub pdu: Pdu,
    /// The Additional Header Segments, in wire order.
    pub ahs: Vec<Ahs>,
    /// DataSegmentLength: bytes of data, without padding.
    pub data_segment_length: u32,
}

impl Header {
    /// A header with no AHS.
    pub fn new(pdu: Pdu, data_segment_length: u32) -> Self {
        Header {
            pdu,
            ahs: Vec::new(),
            data_segment_length,
        }
    }

    /// The full CDB of a SCSI Command: the 16 BHS bytes followed by the
    /// Extended CDB AHS, if any (RFC 7143 sections 11.3.5, 11.2.2.3). `None`
    /// for other PDUs.
    pub fn full_cdb(&self) -> Option<Vec<u8>> {
        let Pdu::ScsiCommand(cmd) = &self.pdu else {
            return None;
        };
        let mut cdb = cmd.cdb.to_vec();
        for ahs in &self.ahs {
            if let Ahs::ExtendedCdb(ext) = ahs {
                cdb.extend_from_slice(ext);
            }
        }
        Some(cdb)
    }

    /// The Bidirectional Expected Read-Data Length AHS value, if present
    /// (RFC 7143 section 11.2.2.4).
    pub fn bidi_expected_read_data_length(&self) -> Option<u32> {
        self.ahs.iter().find_map(|a| match a {
            Ahs::BidiExpectedReadDataLength(n) => Some(*n),
            _ => None,
        })
    }
}
