//! DDP segment headers (RFC 5041 §4): the control byte, then the tagged or
//! the untagged buffer model's fields. The second byte is reserved for the
//! ULP (RDMAP puts its version and opcode there), and so are the first four
//! bytes after the control word of an untagged header (RDMAP: the STag a
//! Send with Invalidate names).
//!
//! ```text
//! tagged:   |T L rsvd DV|ULP ctrl| STag (4) | TO (8)                       = 14
//! untagged: |T L rsvd DV|ULP ctrl| ULP (4)  | QN (4) | MSN (4) | MO (4)  = 18
//! ```

use super::{WireError, be32, be64};

/// The DDP version this stack speaks (DV).
pub const VERSION: u8 = 1;
/// A tagged header's length.
pub const TAGGED_LEN: usize = 14;
/// An untagged header's length.
pub const UNTAGGED_LEN: usize = 18;

const T: u8 = 0x80;
const L: u8 = 0x40;
const DV: u8 = 0x03;

/// Which buffer model a segment uses, with its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// Tagged: placed at `to` in the region named by `stag`.
    Tagged {
        /// The data sink's STag.
        stag: u32,
        /// The tagged offset of the segment's first byte.
        to: u64,
    },
    /// Untagged: the `mo`th byte onwards of message `msn` on queue `qn`.
    Untagged {
        /// The 32 bits reserved for the ULP (RDMAP: invalidate STag).
        ulp: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number.
        msn: u32,
        /// Message offset.
        mo: u32,
    },
}

/// A DDP segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdpRepr {
    /// L: the last segment of its message.
    pub last: bool,
    /// DV (kept as received so the receiver can Terminate on a wrong one).
    pub version: u8,
    /// The byte reserved for the ULP (RDMAP's control byte).
    pub ulp_ctrl: u8,
    /// The buffer model's fields.
    pub buffer: Buffer,
}

impl DdpRepr {
    /// Parses the header at the start of `b` (a ULPDU).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < 2 {
            return Err(WireError::Truncated);
        }
        let c = b[0];
        let buffer = if c & T != 0 {
            if b.len() < TAGGED_LEN {
                return Err(WireError::Truncated);
            }
            Buffer::Tagged {
                stag: be32(b, 2),
                to: be64(b, 6),
            }
        } else {
            if b.len() < UNTAGGED_LEN {
                return Err(WireError::Truncated);
            }
            Buffer::Untagged {
                ulp: be32(b, 2),
                qn: be32(b, 6),
                msn: be32(b, 10),
                mo: be32(b, 14),
            }
        };
        Ok(DdpRepr {
            last: c & L != 0,
            version: c & DV,
            ulp_ctrl: b[1],
            buffer,
        })
    }

    /// Bytes of this header.
    pub const fn buffer_len(&self) -> usize {
        match self.buffer {
            Buffer::Tagged { .. } => TAGGED_LEN,
            Buffer::Untagged { .. } => UNTAGGED_LEN,
        }
    }

    /// Writes the header into `b[..buffer_len()]`.
    pub fn emit(&self, b: &mut [u8]) {
        let mut c = self.version & DV;
        if self.last {
            c |= L;
        }
        b[1] = self.ulp_ctrl;
        match self.buffer {
            Buffer::Tagged { stag, to } => {
                b[0] = c | T;
                b[2..6].copy_from_slice(&stag.to_be_bytes());
                b[6..14].copy_from_slice(&to.to_be_bytes());
            }
            Buffer::Untagged { ulp, qn, msn, mo } => {
                b[0] = c;
                b[2..6].copy_from_slice(&ulp.to_be_bytes());
                b[6..10].copy_from_slice(&qn.to_be_bytes());
                b[10..14].copy_from_slice(&msn.to_be_bytes());
                b[14..18].copy_from_slice(&mo.to_be_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Control 0x4143: untagged Send, last (iWarpRTTfake.c, the Go NFS client); QN 0, MSN 1, MO 0.
    static SEND: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    /// Control 0xC140: tagged Write, last; STag 0x00000102, TO 0x1122334455667788.
    static WRITE: [u8; 14] = [
        0xc1, 0x40, 0x00, 0x00, 0x01, 0x02, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
    ];

    fn send_bytes() -> [u8; 18] {
        let mut b = SEND;
        b[13] = 1; // MSN 1
        b
    }

    #[test]
    fn untagged_send() {
        let b = send_bytes();
        let r = DdpRepr::parse(&b).unwrap();
        assert_eq!(
            r,
            DdpRepr {
                last: true,
                version: 1,
                ulp_ctrl: 0x43,
                buffer: Buffer::Untagged {
                    ulp: 0,
                    qn: 0,
                    msn: 1,
                    mo: 0
                }
            }
        );
        let mut out = [0u8; 18];
        r.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn tagged_write() {
        let r = DdpRepr::parse(&WRITE).unwrap();
        assert_eq!(
            r,
            DdpRepr {
                last: true,
                version: 1,
                ulp_ctrl: 0x40,
                buffer: Buffer::Tagged {
                    stag: 0x102,
                    to: 0x1122_3344_5566_7788
                }
            }
        );
        assert_eq!(r.buffer_len(), 14);
        let mut out = [0u8; 14];
        r.emit(&mut out);
        assert_eq!(out, WRITE);
    }

    #[test]
    fn truncated() {
        assert_eq!(DdpRepr::parse(&WRITE[..13]), Err(WireError::Truncated));
        assert_eq!(DdpRepr::parse(&SEND[..17]), Err(WireError::Truncated));
        assert_eq!(DdpRepr::parse(&[0x41]), Err(WireError::Truncated));
    }
}
