//! The MPA start-up frame parser on arbitrary bytes: no panic, and what
//! parses re-emits to the same header bytes (reserved flag bits aside)
//! and the same IRD/ORD words.
#![no_main]

use iscsi_iwarp::wire::mpa::{HEADER_LEN, IrdOrdRepr, StartFrameRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(hdr) = StartFrameRepr::parse(data) else {
        return;
    };
    let mut out = [0u8; HEADER_LEN];
    hdr.emit(&mut out);
    assert_eq!(StartFrameRepr::parse(&out), Ok(hdr));
    assert_eq!(out[..16], data[..16]);
    assert_eq!(out[16], data[16] & 0xf0);
    assert_eq!(out[17..20], data[17..20]);
    let pd = &data[HEADER_LEN..];
    if let Ok(words) = IrdOrdRepr::parse(pd) {
        let mut w = [0u8; 4];
        words.emit(&mut w);
        assert_eq!(w, pd[..4]);
    }
});
