//! The iSER header and the iSER part of the connection's private data
//! (RFC 7145 section 9.2, 9.3-9.4 for Hello/HelloReply; the "iSER CM"
//! private data header as the Linux kernel's ib_iser and isert put it in
//! the RDMA CM / MPA private data).
//!
//! Every iSCSI control-type PDU travels in an RDMA Send prefixed by the
//! 28-byte iSER header:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | flags: opcode in the high nibble (1 iSCSI control-type, 2 Hello, 3 HelloReply); WSV 0x08, RSV 0x04 |
//! | 1-3 | reserved (Hello: version byte and iSER-IRD; HelloReply: version and iSER-ORD) |
//! | 4-7, 8-15 | Write STag and Write Base Offset (the initiator buffer the target RDMA Reads: Data-Out) |
//! | 16-19, 20-27 | Read STag and Read Base Offset (the initiator buffer the target RDMA Writes: Data-In) |
//!
//! Parsing never panics; `emit` writes exactly [`HEADER_LEN`] bytes.

use std::fmt;

/// Bytes of the iSER header.
pub const HEADER_LEN: usize = 28;

/// Opcode (high nibble of byte 0): an iSCSI control-type PDU follows.
const OPCODE_CONTROL: u8 = 0x1;
/// Opcode: iSER Hello (initiator to target, RFC 7145 9.3).
const OPCODE_HELLO: u8 = 0x2;
/// Opcode: iSER HelloReply (target to initiator, RFC 7145 9.4).
const OPCODE_HELLO_REPLY: u8 = 0x3;
/// Write STag Valid.
const WSV: u8 = 0x08;
/// Read STag Valid.
const RSV: u8 = 0x04;
/// HelloReply: the target rejects the connection.
const REJECT: u8 = 0x01;
/// The iSER version of RFC 7145 (10), in both nibbles of the version byte
/// of Hello (MaxVer|MinVer) and HelloReply (MaxVer|CurVer).
pub const ISER_VERSION: u8 = 10;

/// A buffer of the initiator named in the iSER header: its STag and the
/// tagged offset of the task's first byte (absolute, not zero-based: ZBVA
/// is not used, as the CM header says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advertised {
    /// The STag.
    pub stag: u32,
    /// The Base Offset (tagged offset of buffer offset 0).
    pub base: u64,
}

/// What the iSER header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IserHeader {
    /// An iSCSI control-type PDU follows; a SCSI Command may advertise
    /// its buffers.
    Control {
        /// WSV: the buffer the target RDMA Reads (Data-Out).
        write: Option<Advertised>,
        /// RSV: the buffer the target RDMA Writes (Data-In).
        read: Option<Advertised>,
    },
    /// Hello: the initiator's versions and iSER-IRD.
    Hello {
        /// MaxVer (high nibble) and MinVer (low nibble).
        version: u8,
        /// iSER-IRD.
        ird: u16,
    },
    /// HelloReply: the target's answer.
    HelloReply {
        /// The target cannot go on (REJ).
        reject: bool,
        /// MaxVer (high nibble) and CurVer (low nibble).
        version: u8,
        /// iSER-ORD.
        ord: u16,
    },
}

/// Why bytes are not an iSER header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer than [`HEADER_LEN`] bytes.
    Short(usize),
    /// An opcode RFC 7145 does not define.
    Opcode(u8),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Short(n) => {
                write!(f, "iSER message of {n} bytes: shorter than its header")
            }
            HeaderError::Opcode(op) => write!(f, "iSER opcode {op:#x} is not defined"),
        }
    }
}

impl IserHeader {
    /// A control-type header with no buffer advertised.
    pub const PLAIN: IserHeader = IserHeader::Control {
        write: None,
        read: None,
    };

    /// Parses the first [`HEADER_LEN`] bytes of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<IserHeader, HeaderError> {
        let h: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(HeaderError::Short(bytes.len()))?;
        let u32_at = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| (u64::from(u32_at(i)) << 32) | u64::from(u32_at(i + 4));
        let flags = h[0];
        match flags >> 4 {
            OPCODE_CONTROL => Ok(IserHeader::Control {
                write: (flags & WSV != 0).then(|| Advertised {
                    stag: u32_at(4),
                    base: u64_at(8),
                }),
                read: (flags & RSV != 0).then(|| Advertised {
                    stag: u32_at(16),
                    base: u64_at(20),
                }),
            }),
            OPCODE_HELLO => Ok(IserHeader::Hello {
                version: h[1],
                ird: u16::from_be_bytes([h[2], h[3]]),
            }),
            OPCODE_HELLO_REPLY => Ok(IserHeader::HelloReply {
                reject: flags & REJECT != 0,
                version: h[1],
                ord: u16::from_be_bytes([h[2], h[3]]),
            }),
            other => Err(HeaderError::Opcode(other)),
        }
    }

    /// The header's wire bytes.
    pub fn emit(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        match *self {
            IserHeader::Control { write, read } => {
                h[0] = OPCODE_CONTROL << 4;
                if let Some(w) = write {
                    h[0] |= WSV;
                    h[4..8].copy_from_slice(&w.stag.to_be_bytes());
                    h[8..16].copy_from_slice(&w.base.to_be_bytes());
                }
                if let Some(r) = read {
                    h[0] |= RSV;
                    h[16..20].copy_from_slice(&r.stag.to_be_bytes());
                    h[20..28].copy_from_slice(&r.base.to_be_bytes());
                }
            }
            IserHeader::Hello { version, ird } => {
                h[0] = OPCODE_HELLO << 4;
                h[1] = version;
                h[2..4].copy_from_slice(&ird.to_be_bytes());
            }
            IserHeader::HelloReply {
                reject,
                version,
                ord,
            } => {
                h[0] = (OPCODE_HELLO_REPLY << 4) | if reject { REJECT } else { 0 };
                h[1] = version;
                h[2..4].copy_from_slice(&ord.to_be_bytes());
            }
        }
        h
    }
}

/// Bytes of the iSER CM header in the connection's private data.
pub const CM_HEADER_LEN: usize = 4;
/// CM header flag: zero-based virtual addressing is not supported
/// (initiator) / not used (target): tagged offsets are absolute.
const CM_ZBVA_NOT_SUPPORTED: u8 = 0x80;
/// CM header flag: the initiator cannot take Send with Invalidate
/// (initiator) / the target will not use it (target).
const CM_SEND_WITH_INVALIDATE_NOT_SUPPORTED: u8 = 0x40;

/// The 4-byte iSER CM header that follows the RFC 6581 IRD/ORD words in
/// the MPA private data (Linux `struct iser_cm_hdr`). A peer that sends no
/// private data at all (RFC 5046 style, Hello instead) reads as the
/// defaults: ZBVA not used, Send with Invalidate allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmHeader {
    /// Tagged offsets are zero-based (we never use it; a peer that asks
    /// for it is refused).
    pub zero_based: bool,
    /// Send with Invalidate may be used for the SCSI Response.
    pub send_with_invalidate: bool,
}

impl CmHeader {
    /// What this implementation says: absolute offsets, and Send with
    /// Invalidate as configured.
    pub fn ours(send_with_invalidate: bool) -> CmHeader {
        CmHeader {
            zero_based: false,
            send_with_invalidate,
        }
    }

    /// Parses a peer's private data (the ULP part, after the IRD/ORD
    /// words). Empty private data is the RFC 5046 style: defaults.
    pub fn parse(private_data: &[u8]) -> CmHeader {
        let flags = private_data
            .first()
            .copied()
            .unwrap_or(CM_ZBVA_NOT_SUPPORTED);
        CmHeader {
            zero_based: flags & CM_ZBVA_NOT_SUPPORTED == 0,
            send_with_invalidate: flags & CM_SEND_WITH_INVALIDATE_NOT_SUPPORTED == 0,
        }
    }

    /// The 4 wire bytes.
    pub fn emit(&self) -> [u8; CM_HEADER_LEN] {
        let mut flags = 0;
        if !self.zero_based {
            flags |= CM_ZBVA_NOT_SUPPORTED;
        }
        if !self.send_with_invalidate {
            flags |= CM_SEND_WITH_INVALIDATE_NOT_SUPPORTED;
        }
        [flags, 0, 0, 0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SCSI Command's iSER header with both buffers, as Wireshark's
    /// packet-iser.c lays it out (flags 0x1C).
    const BIDI: [u8; HEADER_LEN] = [
        0x1C, 0, 0, 0, // flags, reserved
        0x00, 0x00, 0x12, 0x34, // write STag
        0x00, 0x00, 0x7f, 0xff, 0x00, 0x10, 0x00, 0x00, // write base offset
        0x00, 0x00, 0x56, 0x78, // read STag
        0x00, 0x00, 0x7f, 0xff, 0x00, 0x20, 0x00, 0x00, // read base offset
    ];

    #[test]
    fn control_header_round_trips_through_fixed_bytes() {
        let header = IserHeader::parse(&BIDI).unwrap();
        assert_eq!(
            header,
            IserHeader::Control {
                write: Some(Advertised {
                    stag: 0x1234,
                    base: 0x7fff_0010_0000
                }),
                read: Some(Advertised {
                    stag: 0x5678,
                    base: 0x7fff_0020_0000
                }),
            }
        );
        assert_eq!(header.emit(), BIDI);
        let plain = IserHeader::PLAIN.emit();
        assert_eq!(plain[0], 0x10);
        assert!(plain[1..].iter().all(|&b| b == 0));
    }

    #[test]
    fn hello_and_reply_parse() {
        let hello = IserHeader::Hello {
            version: 0xAA,
            ird: 16,
        };
        let bytes = hello.emit();
        assert_eq!(&bytes[..4], &[0x20, 0xAA, 0, 16]);
        assert_eq!(IserHeader::parse(&bytes).unwrap(), hello);
        let reply = IserHeader::HelloReply {
            reject: true,
            version: 0xAA,
            ord: 4,
        };
        assert_eq!(&reply.emit()[..4], &[0x31, 0xAA, 0, 4]);
        assert_eq!(IserHeader::parse(&reply.emit()).unwrap(), reply);
    }

    #[test]
    fn bad_headers_are_errors() {
        assert_eq!(IserHeader::parse(&BIDI[..27]), Err(HeaderError::Short(27)));
        let mut bad = BIDI;
        bad[0] = 0x40;
        assert_eq!(IserHeader::parse(&bad), Err(HeaderError::Opcode(4)));
    }

    #[test]
    fn cm_header_matches_linux_initiators() {
        // ib_iser: 80 00 00 00 (absolute offsets, Send with Invalidate ok).
        let kernel = CmHeader::parse(&[0x80, 0, 0, 0]);
        assert!(!kernel.zero_based && kernel.send_with_invalidate);
        // libiscsi: c0 00 00 00 (no remote invalidation).
        let libiscsi = CmHeader::parse(&[0xc0, 0, 0, 0]);
        assert!(!libiscsi.zero_based && !libiscsi.send_with_invalidate);
        assert_eq!(CmHeader::ours(true).emit(), [0x80, 0, 0, 0]);
        assert_eq!(CmHeader::ours(false).emit(), [0xc0, 0, 0, 0]);
        assert_eq!(CmHeader::parse(&[]), CmHeader::ours(true));
    }
}
