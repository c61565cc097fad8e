//! Both sides of CHAP fed arbitrary pairs at every step: no panic, and
//! nothing authenticates without the right response.
#![no_main]

use iscsi_proto::login::chap::{
    ChallengeHistory, ChapAlgorithm, Credentials, InitiatorChap, TargetChap,
};
use iscsi_proto::text::codec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut steps = data.split(|&b| b == 0xFF).map(|chunk| codec::parse(chunk).unwrap_or_default());
    let initiator = Credentials::new("iqn.2026-11.rs.iscsi:fuzz-i", "initiator-secret-1");
    let target = Credentials::new("iqn.2026-11.rs.iscsi:fuzz-t", "target-secret-12");
    let mut history = ChallengeHistory::new(16);
    let mut t = TargetChap::new(ChapAlgorithm::ALL.to_vec(), initiator.clone(), Some(target.clone()))
        .expect("distinct secrets");
    let first = steps.next().unwrap_or_default();
    let _ = t.challenge(&first, 1, vec![0xA5; 32], &mut history);
    let second = steps.next().unwrap_or_default();
    if t.verify(&second, &mut history).is_ok() {
        // Only a response computed with the secret over our challenge passes.
        let response = second.iter().find(|p| p.key == "CHAP_R").map(|p| p.value.clone());
        assert!(response.is_some());
    }
    let mut i = InitiatorChap::new(ChapAlgorithm::ALL.to_vec(), initiator, Some(target))
        .expect("distinct secrets");
    let third = steps.next().unwrap_or_default();
    let _ = i.respond(&third, 2, vec![0x5A; 32], &mut history);
    let fourth = steps.next().unwrap_or_default();
    let _ = i.verify_target(&fourth);
});
