//! The Basic Header Segment's framing (RFC 7143 sections 11.1, 11.2.1):
//! its length, the digests and padding around segments, the opcode table,
//! the segment lengths of bytes 4-7, the LUN field, and `wire_enum!`, which
//! every PDU family's coded fields are made with.

use super::wire::{self, BHS_LEN};

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
