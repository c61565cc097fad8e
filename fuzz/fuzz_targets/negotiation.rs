//! The negotiation engine fed arbitrary pairs, in both roles and every
//! stage, over several exchanges: no panic, every answer answers a key that
//! was sent, and finishing either succeeds or names the problem.
#![no_main]

use iscsi_proto::text::codec;
use iscsi_proto::text::{NegotiationConfig, Negotiator, Role, Stage};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let role = if selector & 1 == 0 { Role::Target } else { Role::Initiator };
    let leading = selector & 2 == 0;
    let mut negotiator = Negotiator::new(role, NegotiationConfig::default(), leading);
    let _ = negotiator.offers(Stage::Security);
    for (i, chunk) in rest.split(|&b| b == 0xFF).take(8).enumerate() {
        let stage = match (usize::from(selector >> 2) + i) % 3 {
            0 => Stage::Security,
            1 => Stage::Operational,
            _ => Stage::FullFeature,
        };
        let Ok(pairs) = codec::parse(chunk) else {
            continue;
        };
        match negotiator.receive(&pairs, stage) {
            Ok(answers) => {
                for answer in &answers {
                    assert!(pairs.iter().any(|p| p.key == answer.key));
                }
            }
            Err(_) => break,
        }
        let _ = negotiator.offers(stage);
    }
    let _ = negotiator.is_complete();
    if let Ok(params) = negotiator.finish() {
        assert!(params.first_burst_length <= params.max_burst_length);
    }
});
