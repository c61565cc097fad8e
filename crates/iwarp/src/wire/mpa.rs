//! MPA (RFC 5044 §7.1, RFC 6581 §5): the start-up frames and the FPDU
//! framing sizes.
//!
//! ```text
//! 0               16    17    18       20
//! | Key (16 ASCII) |flags| rev | PD_Len | private data ...
//! ```
//! Flags (the high byte of the 16-bit word): M 0x80 (markers), C 0x40
//! (CRC), R 0x20 (reject, replies only), 0x10 "enhanced" (RFC 6581: the
//! private data starts with the IRD/ORD words). An FPDU is
//! `ULPDU_Length (2, BE) | ULPDU | pad to 4 | CRC (4, LE)`.

use super::{WireError, be16};

/// The initiator's key.
pub const REQUEST_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// The responder's key.
pub const REPLY_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// A start-up frame without its private data.
pub const HEADER_LEN: usize = 20;
/// The most private data RFC 5044 allows in a start-up frame.
pub const MAX_PRIVATE_DATA_RFC: usize = 512;
/// The most private data we send: Linux caps it at 256 (`RDMA_MAX_PRIVATE_DATA`).
pub const MAX_PRIVATE_DATA: usize = 256;
/// Bytes an FPDU adds around its ULPDU when it needs no pad: length and CRC.
pub const FPDU_OVERHEAD: usize = 6;
/// The largest ULPDU (`ULPDU_Length` is 16 bits) keeping `2 + ULPDU` 4-aligned.
pub const MAX_ULPDU: usize = 65534;

mod field {
    pub const KEY: std::ops::Range<usize> = 0..16;
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LEN: usize = 18;
}

/// Flag bits of the start-up frame's flags byte.
pub mod flags {
    /// Markers wanted by the sender of the frame.
    pub const MARKERS: u8 = 0x80;
    /// CRC wanted.
    pub const CRC: u8 = 0x40;
    /// Rejected (replies only).
    pub const REJECT: u8 = 0x20;
    /// RFC 6581 enhanced connection establishment: IRD/ORD words lead the private data.
    pub const ENHANCED: u8 = 0x10;
}

/// A parsed start-up frame header (the private data follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartFrameRepr {
    /// "MPA ID Rep Frame" (true) or "MPA ID Req Frame" (false).
    pub reply: bool,
    /// M: the sender wants to receive markers.
    pub markers: bool,
    /// C: the sender wants CRC.
    pub crc: bool,
    /// R: the reply rejects the connection.
    pub reject: bool,
    /// RFC 6581 enhanced mode (IRD/ORD words in the private data).
    pub enhanced: bool,
    /// MPA revision (1: RFC 5044, 2: RFC 6581).
    pub revision: u8,
    /// Length of the private data that follows.
    pub pd_len: u16,
}

impl StartFrameRepr {
    /// Parses the 20-byte header; reserved flag bits are ignored (siw uses one privately).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let reply = match &b[field::KEY] {
            k if k == REQUEST_KEY => false,
            k if k == REPLY_KEY => true,
            _ => return Err(WireError::BadKey),
        };
        let f = b[field::FLAGS];
        Ok(StartFrameRepr {
            reply,
            markers: f & flags::MARKERS != 0,
            crc: f & flags::CRC != 0,
            reject: f & flags::REJECT != 0,
            enhanced: f & flags::ENHANCED != 0,
            revision: b[field::REV],
            pd_len: be16(b, field::PD_LEN),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into `b[..20]`.
    pub fn emit(&self, b: &mut [u8]) {
        b[field::KEY].copy_from_slice(if self.reply { REPLY_KEY } else { REQUEST_KEY });
        let mut f = 0;
        for (on, bit) in [
            (self.markers, flags::MARKERS),
            (self.crc, flags::CRC),
            (self.reject, flags::REJECT),
            (self.enhanced, flags::ENHANCED),
        ] {
            if on {
                f |= bit;
            }
        }
        b[field::FLAGS] = f;
        b[field::REV] = self.revision;
        b[field::PD_LEN..field::PD_LEN + 2].copy_from_slice(&self.pd_len.to_be_bytes());
    }
}

/// The RFC 6581 IRD/ORD words that lead an enhanced frame's private data.
///
/// ```text
/// |P|Z| IRD (14) | W|R| ORD (14) |
/// ```
/// P: peer-to-peer (an RTR follows the reply); Z/W/R: the RTR may be a
/// zero-length Send / RDMA Write / RDMA Read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrdOrdRepr {
    /// Peer-to-peer mode asked for (or agreed, in a reply).
    pub p2p: bool,
    /// RTR by zero-length Send.
    pub send_rtr: bool,
    /// RTR by zero-length RDMA Write.
    pub write_rtr: bool,
    /// RTR by zero-length RDMA Read.
    pub read_rtr: bool,
    /// Inbound RDMA Read Requests the sender accepts outstanding (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read Requests the sender will issue outstanding (14 bits).
    pub ord: u16,
}

/// The largest IRD or ORD the 14-bit fields hold.
pub const MAX_IRD_ORD: u16 = 0x3fff;

impl IrdOrdRepr {
    /// Bytes of the two words.
    pub const LEN: usize = 4;

    /// Parses the first 4 bytes of private data.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Truncated);
        }
        let i = be16(b, 0);
        let o = be16(b, 2);
        Ok(IrdOrdRepr {
            p2p: i & 0x8000 != 0,
            send_rtr: i & 0x4000 != 0,
            write_rtr: o & 0x8000 != 0,
            read_rtr: o & 0x4000 != 0,
            ird: i & MAX_IRD_ORD,
            ord: o & MAX_IRD_ORD,
        })
    }

    /// Writes the two words into `b[..4]` (IRD/ORD above 0x3fff are clamped).
    pub fn emit(&self, b: &mut [u8]) {
        let i = self.ird.min(MAX_IRD_ORD)
            | if self.p2p { 0x8000 } else { 0 }
            | if self.send_rtr { 0x4000 } else { 0 };
        let o = self.ord.min(MAX_IRD_ORD)
            | if self.write_rtr { 0x8000 } else { 0 }
            | if self.read_rtr { 0x4000 } else { 0 };
        b[0..2].copy_from_slice(&i.to_be_bytes());
        b[2..4].copy_from_slice(&o.to_be_bytes());
    }
}

/// Pad bytes after a ULPDU of `ulpdu_len` so that the FPDU stays 4-aligned.
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (2 + ulpdu_len) % 4) % 4
}

/// The whole FPDU's length for a ULPDU of `ulpdu_len` bytes.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    2 + ulpdu_len + pad_len(ulpdu_len) + 4
}

/// The largest ULPDU that keeps one FPDU within one TCP segment of `mss`
/// bytes (RFC 5044 §4.4 without markers), rounded so that no pad is
/// needed, and within the 16-bit length field.
pub const fn mulpdu_for_mss(mss: usize) -> usize {
    let room = if mss > FPDU_OVERHEAD + 128 {
        mss - FPDU_OVERHEAD
    } else {
        128
    };
    let room = if room > MAX_ULPDU { MAX_ULPDU } else { room };
    // 2 + ULPDU must be a multiple of 4.
    ((room + 2) & !3) - 2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Linux kernel's iSER initiator over siw (PEERS.md).
    static LINUX_REQUEST: [u8; 28] = [
        b'M', b'P', b'A', b' ', b'I', b'D', b' ', b'R', b'e', b'q', b' ', b'F', b'r', b'a', b'm',
        b'e', 0x10, 0x02, 0x00, 0x08, 0x00, 0x80, 0x00, 0x01, 0x80, 0x00, 0x00, 0x00,
    ];
    /// tgt's reply over siw (PEERS.md).
    static TGT_REPLY: [u8; 24] = [
        b'M', b'P', b'A', b' ', b'I', b'D', b' ', b'R', b'e', b'p', b' ', b'F', b'r', b'a', b'm',
        b'e', 0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x80,
    ];

    #[test]
    fn linux_request_parses_and_emits() {
        let r = StartFrameRepr::parse(&LINUX_REQUEST).unwrap();
        assert_eq!(
            r,
            StartFrameRepr {
                reply: false,
                markers: false,
                crc: false,
                reject: false,
                enhanced: true,
                revision: 2,
                pd_len: 8
            }
        );
        let io = IrdOrdRepr::parse(&LINUX_REQUEST[20..]).unwrap();
        assert_eq!((io.ird, io.ord, io.p2p), (128, 1, false));
        let mut out = [0u8; 28];
        r.emit(&mut out);
        io.emit(&mut out[20..]);
        out[24..].copy_from_slice(&LINUX_REQUEST[24..]);
        assert_eq!(out, LINUX_REQUEST);
    }

    #[test]
    fn tgt_reply_parses_and_emits() {
        let r = StartFrameRepr::parse(&TGT_REPLY).unwrap();
        assert!(r.reply && r.enhanced && !r.crc && !r.reject);
        assert_eq!(r.pd_len, 4);
        let io = IrdOrdRepr::parse(&TGT_REPLY[20..]).unwrap();
        assert_eq!((io.ird, io.ord), (1, 128));
        let mut out = [0u8; 24];
        r.emit(&mut out);
        io.emit(&mut out[20..]);
        assert_eq!(out, TGT_REPLY);
    }

    #[test]
    fn libiscsi_ird_ord() {
        let io = IrdOrdRepr::parse(&[0x00, 0x04, 0x00, 0x00, 0xc0, 0, 0, 0]).unwrap();
        assert_eq!((io.ird, io.ord, io.p2p), (4, 0, false));
    }

    #[test]
    fn bad_key_and_truncation() {
        let mut b = LINUX_REQUEST;
        b[3] = b'x';
        assert_eq!(StartFrameRepr::parse(&b), Err(WireError::BadKey));
        assert_eq!(
            StartFrameRepr::parse(&LINUX_REQUEST[..19]),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(pad_len(18), 0);
        assert_eq!(pad_len(19), 3);
        assert_eq!(fpdu_len(18 + 5), 32);
        assert_eq!(mulpdu_for_mss(1448), 1442);
        assert_eq!(mulpdu_for_mss(65483), 65474);
        assert_eq!(mulpdu_for_mss(1 << 20), MAX_ULPDU);
        for mss in [500, 1448, 9000, 65483, 100_000] {
            let m = mulpdu_for_mss(mss);
            assert_eq!(pad_len(m), 0);
            assert!(fpdu_len(m) <= mss.max(134) && m <= 65535);
        }
    }
}
