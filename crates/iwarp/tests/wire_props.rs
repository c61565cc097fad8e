//! Property tests: every header emitted from random fields parses back to
//! the same fields, and no byte string makes the decoder panic.

use iscsi_iwarp::fpdu::{self, Encoder, Reassembly};
use iscsi_iwarp::wire::ddp::{Buffer, DdpRepr};
use iscsi_iwarp::wire::mpa::{IrdOrdRepr, StartFrameRepr};
use iscsi_iwarp::wire::rdmap::{ReadRequestRepr, TerminateRepr};
use proptest::prelude::*;

fn ddp() -> impl Strategy<Value = DdpRepr> {
    let tagged = (any::<u32>(), any::<u64>()).prop_map(|(stag, to)| Buffer::Tagged { stag, to });
    let untagged = (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())
        .prop_map(|(ulp, qn, msn, mo)| Buffer::Untagged { ulp, qn, msn, mo });
    (
        any::<bool>(),
        0u8..4,
        any::<u8>(),
        prop_oneof![tagged, untagged],
    )
        .prop_map(|(last, version, ulp_ctrl, buffer)| DdpRepr {
            last,
            version,
            ulp_ctrl,
            buffer,
        })
}

proptest! {
    #[test]
    fn ddp_round_trip(h in ddp()) {
        let mut b = vec![0u8; h.buffer_len()];
        h.emit(&mut b);
        prop_assert_eq!(DdpRepr::parse(&b).unwrap(), h);
    }

    #[test]
    fn read_request_round_trip(a in any::<u32>(), b in any::<u64>(), c in any::<u32>(), d in any::<u32>(), e in any::<u64>()) {
        let r = ReadRequestRepr { sink_stag: a, sink_to: b, size: c, src_stag: d, src_to: e };
        let mut buf = [0u8; 28];
        r.emit(&mut buf);
        prop_assert_eq!(ReadRequestRepr::parse(&buf).unwrap(), r);
    }

    #[test]
    fn terminate_round_trip(layer in 0u8..16, etype in 0u8..16, code in any::<u8>(), m in any::<bool>(), d in any::<bool>(), r in any::<bool>()) {
        let t = TerminateRepr { layer, etype, code, m, d, r };
        let mut buf = [0u8; 4];
        t.emit(&mut buf);
        prop_assert_eq!(TerminateRepr::parse(&buf).unwrap(), t);
    }

    #[test]
    fn start_frame_round_trip(reply in any::<bool>(), f in 0u8..16, revision in any::<u8>(), pd_len in any::<u16>(),
                              ird in 0u16..0x4000, ord in 0u16..0x4000, p in any::<[bool; 4]>()) {
        let h = StartFrameRepr { reply, markers: f & 8 != 0, crc: f & 4 != 0, reject: f & 2 != 0, enhanced: f & 1 != 0, revision, pd_len };
        let mut b = [0u8; 20];
        h.emit(&mut b);
        prop_assert_eq!(StartFrameRepr::parse(&b).unwrap(), h);
        let w = IrdOrdRepr { p2p: p[0], send_rtr: p[1], write_rtr: p[2], read_rtr: p[3], ird, ord };
        let mut b = [0u8; 4];
        w.emit(&mut b);
        prop_assert_eq!(IrdOrdRepr::parse(&b).unwrap(), w);
    }

    #[test]
    fn fpdu_round_trip(h in ddp(), payload in proptest::collection::vec(any::<u8>(), 0..300), crc in any::<bool>()) {
        let mut h = h;
        h.version = 1;
        let mut out = Vec::new();
        Encoder { crc }.push(&mut out, &h, &[], &[&payload]);
        prop_assert_eq!(out.len() % 4, 0);
        if let Ok(Some((seg, n))) = fpdu::decode(&out, crc) {
            prop_assert_eq!(n, out.len());
            prop_assert_eq!(seg.payload, &payload[..]);
            prop_assert_eq!(seg.buffer, h.buffer);
        }
    }

    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2000), crc in any::<bool>()) {
        let mut r = Reassembly::default();
        let mut at = 0;
        while let Ok(Some((seg, n))) = fpdu::decode(&bytes[at..], crc) {
            prop_assert!(n >= 8);
            if matches!(seg.buffer, Buffer::Untagged { .. }) {
                let _ = r.accept(&seg);
            }
            at += n;
        }
    }
}
