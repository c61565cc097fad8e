//! RDMAP (RFC 5040 §4): the control byte DDP reserves for it, the RDMA
//! Read Request header (§4.4) and the Terminate header (§4.8).
//!
//! ```text
//! control byte: | RV (2) | rsvd (2) | opcode (4) |
//! Read Request: sink STag (4) | sink TO (8) | size (4) | source STag (4) | source TO (8) = 28
//! Terminate:    | layer (4) | etype (4) | code (8) | M D R | rsvd (13) |  (+ optional copies)
//! ```

use super::{WireError, be32, be64};

/// The RDMAP version this stack speaks (RV).
pub const VERSION: u8 = 1;

/// RDMAP opcodes (RFC 5040 §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// 0: RDMA Write (tagged).
    Write = 0,
    /// 1: RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// 2: RDMA Read Response (tagged).
    ReadResponse = 2,
    /// 3: Send (untagged, QN 0).
    Send = 3,
    /// 4: Send with Invalidate.
    SendInvalidate = 4,
    /// 5: Send with Solicited Event.
    SendSe = 5,
    /// 6: Send with Solicited Event and Invalidate.
    SendSeInvalidate = 6,
    /// 7: Terminate (untagged, QN 2).
    Terminate = 7,
}

impl Opcode {
    /// The opcode from its 4 bits (`None` for the reserved 8-15).
    pub fn from_code(code: u8) -> Option<Opcode> {
        Some(match code {
            0 => Opcode::Write,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInvalidate,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInvalidate,
            7 => Opcode::Terminate,
            _ => return None,
        })
    }

    /// Whether the opcode uses the tagged buffer model.
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// Send family: whether it carries the Solicited Event bit.
    pub fn solicited(self) -> bool {
        matches!(self, Opcode::SendSe | Opcode::SendSeInvalidate)
    }

    /// Send family: whether it invalidates an STag of the receiver.
    pub fn invalidates(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }

    /// The untagged queue an opcode travels on.
    pub fn queue(self) -> Option<u32> {
        match self {
            Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate => {
                Some(0)
            }
            Opcode::ReadRequest => Some(1),
            Opcode::Terminate => Some(2),
            Opcode::Write | Opcode::ReadResponse => None,
        }
    }
}

/// The RDMAP control byte: version and raw opcode bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtrlRepr {
    /// RV.
    pub version: u8,
    /// The 4 opcode bits as received.
    pub opcode: u8,
}

impl CtrlRepr {
    /// Splits the byte (never fails: every value has a meaning or an error code).
    pub fn parse(byte: u8) -> Self {
        CtrlRepr {
            version: byte >> 6,
            opcode: byte & 0x0f,
        }
    }
    /// The byte for `opcode` at our version.
    pub fn byte(opcode: Opcode) -> u8 {
        (VERSION << 6) | opcode as u8
    }
}

/// The RDMA Read Request header that follows the untagged DDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequestRepr {
    /// The requester's sink STag (where Read Responses go).
    pub sink_stag: u32,
    /// The requester's sink TO.
    pub sink_to: u64,
    /// Bytes to read.
    pub size: u32,
    /// The responder's source STag.
    pub src_stag: u32,
    /// The responder's source TO.
    pub src_to: u64,
}

impl ReadRequestRepr {
    /// Bytes of the header.
    pub const LEN: usize = 28;

    /// Parses the first 28 bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Truncated);
        }
        Ok(ReadRequestRepr {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            src_stag: be32(b, 16),
            src_to: be64(b, 20),
        })
    }

    /// Writes the header into `b[..28]`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        b[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        b[20..28].copy_from_slice(&self.src_to.to_be_bytes());
    }
}

/// The Terminate control word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminateRepr {
    /// Layer (0 RDMAP, 1 DDP, 2 LLP).
    pub layer: u8,
    /// Error type.
    pub etype: u8,
    /// Error code.
    pub code: u8,
    /// M: the DDP segment length field is valid.
    pub m: bool,
    /// D: a copy of the terminated DDP header follows.
    pub d: bool,
    /// R: a copy of the terminated RDMAP header follows.
    pub r: bool,
}

impl TerminateRepr {
    /// Bytes of the control word (what we send; copies of headers are optional).
    pub const LEN: usize = 4;

    /// Parses the control word; whatever follows it is ignored.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Truncated);
        }
        Ok(TerminateRepr {
            layer: b[0] >> 4,
            etype: b[0] & 0x0f,
            code: b[1],
            m: b[2] & 0x80 != 0,
            d: b[2] & 0x40 != 0,
            r: b[2] & 0x20 != 0,
        })
    }

    /// Writes the control word into `b[..4]`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = (self.layer << 4) | (self.etype & 0x0f);
        b[1] = self.code;
        b[2] = (u8::from(self.m) << 7) | (u8::from(self.d) << 6) | (u8::from(self.r) << 5);
        b[3] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static READ_REQUEST: [u8; 28] = [
        0x00, 0x00, 0x01, 0x05, // sink STag
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, // sink TO
        0x00, 0x10, 0x00, 0x00, // size 1 MiB
        0x00, 0x00, 0x02, 0x07, // source STag
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // source TO
    ];
    /// DDP untagged error (1, 2), MSN no buffer (2).
    static TERMINATE: [u8; 4] = [0x12, 0x02, 0x00, 0x00];

    #[test]
    fn read_request() {
        let r = ReadRequestRepr::parse(&READ_REQUEST).unwrap();
        assert_eq!(
            r,
            ReadRequestRepr {
                sink_stag: 0x105,
                sink_to: 0x7f00_0000_1000,
                size: 1 << 20,
                src_stag: 0x207,
                src_to: 1 << 32
            }
        );
        let mut out = [0u8; 28];
        r.emit(&mut out);
        assert_eq!(out, READ_REQUEST);
        assert!(ReadRequestRepr::parse(&READ_REQUEST[..27]).is_err());
    }

    #[test]
    fn terminate() {
        let t = TerminateRepr::parse(&TERMINATE).unwrap();
        assert_eq!(
            (t.layer, t.etype, t.code, t.m, t.d, t.r),
            (1, 2, 2, false, false, false)
        );
        let mut out = [0u8; 4];
        t.emit(&mut out);
        assert_eq!(out, TERMINATE);
    }

    #[test]
    fn control_byte() {
        assert_eq!(CtrlRepr::byte(Opcode::Send), 0x43);
        assert_eq!(CtrlRepr::byte(Opcode::Write), 0x40);
        assert_eq!(
            CtrlRepr::parse(0x47),
            CtrlRepr {
                version: 1,
                opcode: 7
            }
        );
        assert_eq!(Opcode::from_code(8), None);
        assert_eq!(Opcode::SendSeInvalidate.queue(), Some(0));
    }
}
