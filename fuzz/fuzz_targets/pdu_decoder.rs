//! The streaming PDU decoder on arbitrary bytes, fed in arbitrary chunk
//! sizes: no panic, no hang, no header whose data segment exceeds the
//! configured MaxRecvDataSegmentLength, and the same PDUs as decoding the
//! whole buffer at once.
#![no_main]

use iscsi_proto::pdu::decoder::{DecodedPdu, Decoder, DecoderConfig, Event};
use iscsi_proto::pdu::Digests;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [a, b, rest @ ..] = data else {
        return;
    };
    let config = DecoderConfig {
        max_recv_data_segment_length: 512 + u32::from(*a) * 1024,
        digests: Digests {
            header: b & 1 != 0,
            data: b & 2 != 0,
        },
        ..DecoderConfig::default()
    };
    let chunk = usize::from(b >> 2) + 1;
    let mut decoder = Decoder::new(config);
    let mut headers = Vec::new();
    let mut pos = 0;
    let mut stalls = 0;
    while pos < rest.len() && stalls < 4 {
        let end = (pos + chunk).min(rest.len());
        let Ok(progress) = decoder.feed(&rest[pos..end]) else {
            break;
        };
        pos += progress.consumed;
        match progress.event {
            Some(Event::Header(header)) => {
                assert!(header.data_segment_length <= config.max_recv_data_segment_length);
                headers.push(header);
                stalls = 0;
            }
            Some(_) => stalls = 0,
            None if progress.consumed == 0 => stalls += 1,
            None => stalls = 0,
        }
    }
    if let Ok((whole, _)) = DecodedPdu::decode_all(config, rest) {
        for (streamed, decoded) in headers.iter().zip(&whole) {
            assert_eq!(streamed, &decoded.header);
        }
    }
});
