//! The sans-I/O core of the receive and send paths: one FPDU decoded from
//! a byte buffer into a checked DDP/RDMAP segment (RFC 5044 §5 framing and
//! CRC, RFC 5041 §4 headers, RFC 5040 §4 opcodes), the per-queue MSN/MO
//! state that reassembles untagged messages (RFC 5041 §5.3), and FPDUs
//! encoded into a scratch buffer.
//!
//! Every rule a peer can break maps to the Terminate RFC 5040 §4.8 asks
//! for; nothing here allocates per FPDU or panics on any input.

use crate::error::{TerminateReason, ddp_code, ddp_etype, llp_code, rdmap_code, rdmap_etype};
use crate::wire::ddp::{self, Buffer, DdpRepr};
use crate::wire::mpa::{fpdu_len, pad_len};
use crate::wire::rdmap::{self, CtrlRepr, Opcode};
use crate::wire::{WireError, be16};

/// One decoded DDP segment, its payload borrowed from the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    /// The RDMAP message type.
    pub opcode: Opcode,
    /// DDP L: the message's last segment.
    pub last: bool,
    /// The buffer model's fields (queue numbers already checked against the opcode).
    pub buffer: Buffer,
    /// The bytes after the DDP header (for Read Request and Terminate: their RDMAP header).
    pub payload: &'a [u8],
}

/// Decodes the FPDU at the start of `buf`. `Ok(None)`: not all of it is
/// there yet (ask for more bytes; an FPDU is never longer than 65,541
/// bytes). `Ok(Some((segment, n)))`: the FPDU took `n` bytes. `Err`: the
/// peer broke a rule; the reason is the Terminate to send.
pub fn decode(buf: &[u8], crc: bool) -> Result<Option<(Segment<'_>, usize)>, TerminateReason> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let ulpdu_len = usize::from(be16(buf, 0));
    let total = fpdu_len(ulpdu_len);
    if buf.len() < total {
        return Ok(None);
    }
    if crc {
        let sent = u32::from_le_bytes([
            buf[total - 4],
            buf[total - 3],
            buf[total - 2],
            buf[total - 1],
        ]);
        let computed = iscsi_crc32c::crc32c(&buf[..total - 4]);
        if sent != computed {
            return Err(TerminateReason::llp(
                llp_code::CRC,
                format!(
                    "FPDU CRC {sent:#010x}, computed {computed:#010x}, on {}",
                    describe(&buf[2..2 + ulpdu_len])
                ),
            ));
        }
    }
    let ulpdu = &buf[2..2 + ulpdu_len];
    let segment = parse_ulpdu(ulpdu)?;
    Ok(Some((segment, total)))
}

/// What a ULPDU claims to be, for the message of a Terminate that refuses
/// it (a bad CRC says nothing of where the damage is: the headers, which
/// may themselves be damaged, are the one clue to which message it was).
fn describe(ulpdu: &[u8]) -> String {
    let len = ulpdu.len();
    match parse_ulpdu(ulpdu) {
        Ok(seg) => {
            let last = if seg.last { ", last" } else { "" };
            match seg.buffer {
                Buffer::Tagged { stag, to } => format!(
                    "a {len}-byte ULPDU: {:?}, STag {stag:#x}, TO {to:#x}{last}",
                    seg.opcode
                ),
                Buffer::Untagged { qn, msn, mo, .. } => format!(
                    "a {len}-byte ULPDU: {:?}, queue {qn}, MSN {msn}, MO {mo}{last}",
                    seg.opcode
                ),
            }
        }
        Err(_) => format!(
            "a {len}-byte ULPDU whose headers do not parse (first bytes {:02x?})",
            &ulpdu[..len.min(8)]
        ),
    }
}

/// Checks one ULPDU's DDP and RDMAP headers.
pub fn parse_ulpdu(ulpdu: &[u8]) -> Result<Segment<'_>, TerminateReason> {
    if ulpdu.len() < 2 {
        return Err(TerminateReason::malformed(format!(
            "a ULPDU of {} bytes has no DDP control word",
            ulpdu.len()
        )));
    }
    let tagged = ulpdu[0] & 0x80 != 0;
    let dv = ulpdu[0] & 0x03;
    if dv != ddp::VERSION {
        return Err(if tagged {
            TerminateReason::ddp(
                ddp_etype::TAGGED,
                ddp_code::T_VERSION,
                format!("DDP version {dv}"),
            )
        } else {
            TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_VERSION,
                format!("DDP version {dv}"),
            )
        });
    }
    let ctrl = CtrlRepr::parse(ulpdu[1]);
    if ctrl.version != rdmap::VERSION {
        return Err(TerminateReason::rdmap(
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::VERSION,
            format!("RDMAP version {}", ctrl.version),
        ));
    }
    let Some(opcode) = Opcode::from_code(ctrl.opcode) else {
        return Err(TerminateReason::rdmap(
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::OPCODE,
            format!("reserved RDMAP opcode {}", ctrl.opcode),
        ));
    };
    if opcode.is_tagged() != tagged {
        return Err(TerminateReason::rdmap(
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::OPCODE,
            format!(
                "{opcode:?} in the {} buffer model",
                if tagged { "tagged" } else { "untagged" }
            ),
        ));
    }
    let hdr = DdpRepr::parse(ulpdu).map_err(|_: WireError| {
        TerminateReason::malformed(format!(
            "a {}-byte ULPDU is too short for its DDP header",
            ulpdu.len()
        ))
    })?;
    if let Buffer::Untagged { qn, .. } = hdr.buffer {
        if qn > 2 {
            return Err(TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_INVALID_QN,
                format!("queue number {qn}"),
            ));
        }
        if opcode.queue() != Some(qn) {
            return Err(TerminateReason::rdmap(
                rdmap_etype::REMOTE_OPERATION,
                rdmap_code::OPCODE,
                format!("{opcode:?} on queue {qn}"),
            ));
        }
    }
    Ok(Segment {
        opcode,
        last: hdr.last,
        buffer: hdr.buffer,
        payload: &ulpdu[hdr.buffer_len()..],
    })
}

/// Where an untagged segment goes, once its MSN and MO were found right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Queue number.
    pub qn: u32,
    /// Byte offset in the message.
    pub mo: usize,
    /// The message is complete with this segment.
    pub last: bool,
}

/// The untagged queues' receive state (RFC 5041 §5.3): the MSN expected
/// next on each queue (the first is 1) and the offset the current message
/// has reached. TCP delivers in order, so the MSN and MO of every segment
/// are known exactly; any other value is the peer's mistake.
#[derive(Clone, Debug)]
pub struct Reassembly {
    next_msn: [u32; 3],
    mo: [usize; 3],
}

impl Default for Reassembly {
    fn default() -> Self {
        Reassembly {
            next_msn: [1; 3],
            mo: [0; 3],
        }
    }
}

impl Reassembly {
    /// Checks an untagged segment of `len` payload bytes and advances.
    /// Read Requests and Terminates fit in one segment: a second one is an
    /// invalid MO.
    pub fn accept(&mut self, segment: &Segment<'_>) -> Result<Placement, TerminateReason> {
        let Buffer::Untagged { qn, msn, mo, .. } = segment.buffer else {
            return Err(TerminateReason::malformed(
                "a tagged segment given to reassembly",
            ));
        };
        let q = qn as usize;
        if q >= 3 {
            return Err(TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_INVALID_QN,
                format!("queue number {qn}"),
            ));
        }
        if msn != self.next_msn[q] {
            return Err(TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_MSN_RANGE,
                format!("MSN {msn} on queue {qn}, expected {}", self.next_msn[q]),
            ));
        }
        let mo = mo as usize;
        if mo != self.mo[q] || (q != 0 && (mo != 0 || !segment.last)) {
            return Err(TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_INVALID_MO,
                format!("MO {mo} on queue {qn} (MSN {msn}), expected {}", self.mo[q]),
            ));
        }
        let end = mo + segment.payload.len();
        if end > u32::MAX as usize {
            return Err(TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_TOO_LONG,
                "an untagged message beyond 4 GiB",
            ));
        }
        if segment.last {
            self.next_msn[q] = self.next_msn[q].wrapping_add(1);
            self.mo[q] = 0;
        } else {
            self.mo[q] = end;
        }
        Ok(Placement {
            qn,
            mo,
            last: segment.last,
        })
    }
}

/// Appends FPDUs to a scratch buffer (the sender's batch): header bytes
/// and payload copied once, the CRC computed over the bytes as they land.
pub struct Encoder {
    /// Whether CRCs are computed (else the CRC field is zero, as siw sends it).
    pub crc: bool,
}

impl Encoder {
    /// Starts an FPDU whose body (after `hdr` and `extra`) will be
    /// `body_len` bytes that the caller appends; returns where it began,
    /// for [`Encoder::finish`].
    pub fn begin(&self, out: &mut Vec<u8>, hdr: &DdpRepr, extra: &[u8], body_len: usize) -> usize {
        let start = out.len();
        let ulpdu_len = hdr.buffer_len() + extra.len() + body_len;
        debug_assert!(ulpdu_len <= 65535);
        out.extend_from_slice(&(ulpdu_len as u16).to_be_bytes());
        let h = out.len();
        out.resize(h + hdr.buffer_len(), 0);
        hdr.emit(&mut out[h..]);
        out.extend_from_slice(extra);
        start
    }

    /// Ends the FPDU begun at `start`: pad and CRC.
    pub fn finish(&self, out: &mut Vec<u8>, start: usize) {
        let ulpdu_len = out.len() - start - 2;
        out.resize(out.len() + pad_len(ulpdu_len), 0);
        let crc = if self.crc {
            iscsi_crc32c::crc32c(&out[start..])
        } else {
            0
        };
        out.extend_from_slice(&crc.to_le_bytes());
    }

    /// Appends one FPDU: `hdr`, then `extra` (an RDMAP header), then the
    /// payload pieces. Their total must fit in one ULPDU (the caller cut
    /// segments at the MULPDU).
    pub fn push(&self, out: &mut Vec<u8>, hdr: &DdpRepr, extra: &[u8], payload: &[&[u8]]) {
        let body: usize = payload.iter().map(|p| p.len()).sum();
        let start = self.begin(out, hdr, extra, body);
        for p in payload {
            out.extend_from_slice(p);
        }
        self.finish(out, start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Send of "hello" (QN 0, MSN 1, MO 0, last) as one FPDU with CRC
    /// (ULPDU 23 bytes, 3 pad bytes).
    /// The CRC was computed independently (a bitwise CRC32C in Python over
    /// the 24 bytes before it: reflected 0x82F63B78, init and final xor
    /// all ones) and is stored little-endian.
    static SEND_HELLO: [u8; 32] = [
        0x00, 0x17, // ULPDU_Length 23 = 18 + 5
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, // DDP/RDMAP
        b'h', b'e', b'l', b'l', b'o', // payload
        0, 0, 0, // pad to 4
        CRC[0], CRC[1], CRC[2], CRC[3],
    ];
    const CRC: [u8; 4] = SEND_HELLO_CRC.to_le_bytes();
    const SEND_HELLO_CRC: u32 = 0x0CB1_90B9;

    #[test]
    fn decodes_send_with_crc() {
        let (seg, n) = decode(&SEND_HELLO, true).unwrap().unwrap();
        assert_eq!(n, 32);
        assert_eq!(seg.opcode, Opcode::Send);
        assert!(seg.last);
        assert_eq!(seg.payload, b"hello");
        assert_eq!(
            seg.buffer,
            Buffer::Untagged {
                ulp: 0,
                qn: 0,
                msn: 1,
                mo: 0
            }
        );
        for cut in 0..32 {
            assert_eq!(decode(&SEND_HELLO[..cut], true).unwrap(), None);
        }
    }

    #[test]
    fn encodes_the_same_bytes() {
        let hdr = DdpRepr {
            last: true,
            version: 1,
            ulp_ctrl: CtrlRepr::byte(Opcode::Send),
            buffer: Buffer::Untagged {
                ulp: 0,
                qn: 0,
                msn: 1,
                mo: 0,
            },
        };
        let mut out = Vec::new();
        Encoder { crc: true }.push(&mut out, &hdr, &[], &[b"he", b"llo"]);
        assert_eq!(out, SEND_HELLO);
        out.clear();
        Encoder { crc: false }.push(&mut out, &hdr, &[], &[b"hello"]);
        assert_eq!(&out[..28], &SEND_HELLO[..28]);
        assert_eq!(&out[28..], &[0, 0, 0, 0]);
    }

    #[test]
    fn bad_crc_is_an_llp_error() {
        let mut b = SEND_HELLO;
        b[20] ^= 1;
        let e = decode(&b, true).unwrap_err();
        assert_eq!(
            (e.layer, e.etype, e.code),
            (crate::error::Layer::Llp, 0, llp_code::CRC)
        );
        // Without CRC the field is not looked at.
        assert!(decode(&b, false).unwrap().is_some());
    }

    #[test]
    fn header_rules() {
        let check = |mutate: &dyn Fn(&mut [u8; 32]), layer, etype, code| {
            let mut b = SEND_HELLO;
            mutate(&mut b);
            let e = decode(&b, false).unwrap_err();
            assert_eq!((e.layer, e.etype, e.code), (layer, etype, code), "{e}");
        };
        use crate::error::Layer::*;
        check(
            &|b| b[2] = 0x42,
            Ddp,
            ddp_etype::UNTAGGED,
            ddp_code::U_VERSION,
        );
        check(
            &|b| b[3] = 0x83,
            Rdmap,
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::VERSION,
        );
        check(
            &|b| b[3] = 0x49,
            Rdmap,
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::OPCODE,
        );
        check(
            &|b| b[3] = 0x40,
            Rdmap,
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::OPCODE,
        );
        check(
            &|b| b[11] = 7,
            Ddp,
            ddp_etype::UNTAGGED,
            ddp_code::U_INVALID_QN,
        );
        check(
            &|b| b[11] = 1,
            Rdmap,
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::OPCODE,
        );
        // A ULPDU too short for its header.
        check(
            &|b| {
                b[1] = 4;
            },
            Rdmap,
            rdmap_etype::REMOTE_OPERATION,
            rdmap_code::CATASTROPHIC_STREAM,
        );
    }

    #[test]
    fn reassembly_checks_msn_and_mo() {
        let seg = |msn, mo, last, payload: &'static [u8]| Segment {
            opcode: Opcode::Send,
            last,
            buffer: Buffer::Untagged {
                ulp: 0,
                qn: 0,
                msn,
                mo,
            },
            payload,
        };
        let mut r = Reassembly::default();
        assert_eq!(r.accept(&seg(1, 0, false, b"abc")).unwrap().mo, 0);
        assert_eq!(
            r.accept(&seg(1, 3, true, b"de")).unwrap(),
            Placement {
                qn: 0,
                mo: 3,
                last: true
            }
        );
        let e = r.accept(&seg(3, 0, true, b"x")).unwrap_err();
        assert_eq!(e.code, ddp_code::U_MSN_RANGE);
        let mut r = Reassembly::default();
        r.accept(&seg(1, 0, false, b"abc")).unwrap();
        assert_eq!(
            r.accept(&seg(1, 4, true, b"x")).unwrap_err().code,
            ddp_code::U_INVALID_MO
        );
    }
}
