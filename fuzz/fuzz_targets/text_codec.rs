//! The text codec on arbitrary bytes: parsing never panics, what parses
//! re-encodes to something that parses to the same pairs, and the assembler
//! stays within its bound whatever the segmenting.
#![no_main]

use iscsi_proto::text::codec::{self, TextAssembler};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(pairs) = codec::parse(data) {
        let mut encoded = Vec::new();
        codec::encode(&pairs, &mut encoded);
        assert_eq!(codec::parse(&encoded).as_ref(), Ok(&pairs));
    }
    let split = data.first().map_or(1, |&b| usize::from(b) + 1);
    let mut assembler = TextAssembler::new(4096);
    for (segment, continues) in codec::fragment(data, split) {
        if let Ok(Some(text)) = assembler.push(segment, continues) {
            assert!(text.len() <= 4096);
        }
    }
});
