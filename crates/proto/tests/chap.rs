//! CHAP (RFC 7143 12.1.3): responses against independently computed
//! vectors, one-way and mutual exchanges between the two sides, and every
//! failure a peer can cause.

use iscsi_proto::login::chap::{
    ChallengeHistory, ChapAlgorithm, ChapError, Credentials, InitiatorChap, TargetChap,
    decode_binary, encode_binary,
};
use iscsi_proto::text::TextPair;

const CHALLENGE: [u8; 32] = {
    let mut c = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        c[i] = 0x10 + i as u8;
        i += 1;
    }
    c
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn responses_match_independently_computed_vectors() {
    // python3: hashlib.new(alg, bytes([0x2a]) + b"initiator-secret-12" + bytes(range(0x10, 0x30)))
    let vectors = [
        (ChapAlgorithm::Md5, "da0c4d71167f7fd23509c4fbfb102901"),
        (
            ChapAlgorithm::Sha1,
            "3e6d29cd1d79d2b2c7790d6c7083fff101b3492b",
        ),
        (
            ChapAlgorithm::Sha256,
            "29de68f68d7131f2bdf866ba8047b1a9555a1e15699ca042fd2460917f14b1c4",
        ),
        (
            ChapAlgorithm::Sha3_256,
            "d5e7bb272c21050b9113e0886a0e243f4d2b510b99baa433390d4f5be2968957",
        ),
    ];
    for (algorithm, expected) in vectors {
        let response = algorithm.response(0x2a, b"initiator-secret-12", &CHALLENGE);
        assert_eq!(hex(&response), expected, "{algorithm:?}");
        assert_eq!(response.len(), algorithm.digest_len());
    }
    assert_eq!(
        ChapAlgorithm::ALL.map(ChapAlgorithm::code),
        [8, 7, 6, 5],
        "the CHAP_A codes Linux uses"
    );
}

#[test]
fn binary_values_in_hex_and_base64() {
    assert_eq!(encode_binary(&[0x01, 0xab]), "0x01ab");
    assert_eq!(decode_binary("CHAP_C", "0x01AB"), Ok(vec![0x01, 0xab]));
    assert_eq!(decode_binary("CHAP_C", "0X01ab"), Ok(vec![0x01, 0xab]));
    assert_eq!(decode_binary("CHAP_C", "0bAas="), Ok(vec![0x01, 0xab]));
    for bad in ["", "0x", "0x1", "0xzz", "01ab", "0b!!", "0b"] {
        assert!(decode_binary("CHAP_C", bad).is_err(), "{bad:?}");
    }
    let huge = format!("0x{}", "00".repeat(2000));
    assert!(decode_binary("CHAP_C", &huge).is_err());
}

fn initiator_credentials() -> Credentials {
    Credentials::new("iqn.2026-11.rs.iscsi:initiator", "initiator-secret-12")
}

fn target_credentials() -> Credentials {
    Credentials::new("iqn.2026-11.rs.iscsi:target0", "target-secret-34567")
}

fn challenge(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

struct Exchange {
    target: TargetChap,
    initiator: InitiatorChap,
    target_history: ChallengeHistory,
    initiator_history: ChallengeHistory,
}

fn exchange(mutual: bool, initiator_algorithms: Vec<ChapAlgorithm>) -> Exchange {
    Exchange {
        target: TargetChap::new(
            ChapAlgorithm::ALL.to_vec(),
            initiator_credentials(),
            Some(target_credentials()),
        )
        .unwrap(),
        initiator: InitiatorChap::new(
            initiator_algorithms,
            initiator_credentials(),
            mutual.then(target_credentials),
        )
        .unwrap(),
        target_history: ChallengeHistory::default(),
        initiator_history: ChallengeHistory::default(),
    }
}

#[test]
fn one_way_and_mutual_exchanges_succeed_with_every_algorithm() {
    for algorithm in ChapAlgorithm::ALL {
        for mutual in [false, true] {
            let mut x = exchange(mutual, vec![algorithm]);
            let offer = x.initiator.offer();
            assert_eq!(offer, TextPair::new("CHAP_A", algorithm.code().to_string()));
            let step2 = x
                .target
                .challenge(&[offer], 7, challenge(1, 32), &mut x.target_history)
                .unwrap();
            assert_eq!(
                step2[0],
                TextPair::new("CHAP_A", algorithm.code().to_string())
            );
            let step3 = x
                .initiator
                .respond(&step2, 9, challenge(2, 32), &mut x.initiator_history)
                .unwrap();
            assert_eq!(step3.len(), if mutual { 4 } else { 2 });
            let step4 = x.target.verify(&step3, &mut x.target_history).unwrap();
            assert!(x.target.is_authenticated());
            if mutual {
                assert_eq!(step4[0].key, "CHAP_N");
                x.initiator.verify_target(&step4).unwrap();
            } else {
                assert!(step4.is_empty());
            }
            assert!(
                x.initiator.is_authenticated(),
                "{algorithm:?} mutual={mutual}"
            );
        }
    }
}

#[test]
fn the_target_picks_the_first_offered_algorithm_it_accepts() {
    let mut x = exchange(false, vec![ChapAlgorithm::Sha256, ChapAlgorithm::Md5]);
    let answer = x
        .target
        .challenge(
            &[TextPair::new("CHAP_A", "99,7,5")],
            1,
            challenge(3, 32),
            &mut x.target_history,
        )
        .unwrap();
    assert_eq!(answer[0], TextPair::new("CHAP_A", "7"));
    let mut target =
        TargetChap::new(vec![ChapAlgorithm::Md5], initiator_credentials(), None).unwrap();
    assert!(matches!(
        target.challenge(
            &[TextPair::new("CHAP_A", "7,8")],
            1,
            challenge(3, 32),
            &mut ChallengeHistory::default()
        ),
        Err(ChapError::NoCommonAlgorithm(_))
    ));
}

fn run_to_response(x: &mut Exchange) -> Vec<TextPair> {
    let offer = x.initiator.offer();
    let step2 = x
        .target
        .challenge(&[offer], 7, challenge(1, 32), &mut x.target_history)
        .unwrap();
    x.initiator
        .respond(&step2, 9, challenge(2, 32), &mut x.initiator_history)
        .unwrap()
}

#[test]
fn wrong_secret_or_name_is_an_authentication_failure() {
    let mut x = exchange(false, vec![ChapAlgorithm::Md5]);
    x.initiator = InitiatorChap::new(
        vec![ChapAlgorithm::Md5],
        Credentials::new("iqn.2026-11.rs.iscsi:initiator", "not-the-secret"),
        None,
    )
    .unwrap();
    let step3 = run_to_response(&mut x);
    let error = x.target.verify(&step3, &mut x.target_history).unwrap_err();
    assert_eq!(error, ChapError::WrongResponse);
    assert_eq!(error.login_status(), (0x02, 0x01));

    let mut x = exchange(false, vec![ChapAlgorithm::Md5]);
    let mut step3 = run_to_response(&mut x);
    step3[0].value = "someone-else".into();
    assert!(matches!(
        x.target.verify(&step3, &mut x.target_history),
        Err(ChapError::UnknownName(_))
    ));
}

#[test]
fn a_target_with_the_wrong_mutual_secret_is_refused() {
    let mut x = exchange(true, vec![ChapAlgorithm::Sha256]);
    x.target = TargetChap::new(
        ChapAlgorithm::ALL.to_vec(),
        initiator_credentials(),
        Some(Credentials::new(
            "iqn.2026-11.rs.iscsi:target0",
            "impostor-secret",
        )),
    )
    .unwrap();
    let step3 = run_to_response(&mut x);
    let step4 = x.target.verify(&step3, &mut x.target_history).unwrap();
    assert_eq!(
        x.initiator.verify_target(&step4),
        Err(ChapError::WrongResponse)
    );
    assert!(!x.initiator.is_authenticated());
    // A target that does not answer the mutual challenge fails too.
    let mut x = exchange(true, vec![ChapAlgorithm::Sha256]);
    let step3 = run_to_response(&mut x);
    x.target.verify(&step3, &mut x.target_history).unwrap();
    assert_eq!(
        x.initiator.verify_target(&[]),
        Err(ChapError::MutualNotConfigured)
    );
}

#[test]
fn mutual_requested_of_a_target_without_mutual_credentials_fails() {
    let mut x = exchange(true, vec![ChapAlgorithm::Md5]);
    x.target = TargetChap::new(ChapAlgorithm::ALL.to_vec(), initiator_credentials(), None).unwrap();
    let step3 = run_to_response(&mut x);
    assert_eq!(
        x.target.verify(&step3, &mut x.target_history),
        Err(ChapError::MutualNotConfigured)
    );
}

#[test]
fn reflected_and_reused_challenges_are_refused() {
    // Reflection: the initiator's mutual challenge is the target's own.
    let mut x = exchange(true, vec![ChapAlgorithm::Md5]);
    let offer = x.initiator.offer();
    let step2 = x
        .target
        .challenge(&[offer], 7, challenge(1, 32), &mut x.target_history)
        .unwrap();
    let mut step3 = x
        .initiator
        .respond(&step2, 9, challenge(2, 32), &mut x.initiator_history)
        .unwrap();
    step3[3].value = encode_binary(&challenge(1, 32));
    assert_eq!(
        x.target.verify(&step3, &mut x.target_history),
        Err(ChapError::ReflectedChallenge)
    );
    // The initiator will not send the target's challenge back either.
    let mut x = exchange(true, vec![ChapAlgorithm::Md5]);
    let offer = x.initiator.offer();
    let step2 = x
        .target
        .challenge(&[offer], 7, challenge(1, 32), &mut x.target_history)
        .unwrap();
    assert_eq!(
        x.initiator
            .respond(&step2, 9, challenge(1, 32), &mut x.initiator_history),
        Err(ChapError::ReflectedChallenge)
    );
    // Reuse: a challenge the shared history has seen on another connection.
    let mut history = ChallengeHistory::default();
    let mut first = exchange(true, vec![ChapAlgorithm::Md5]);
    let step3 = {
        let offer = first.initiator.offer();
        let step2 = first
            .target
            .challenge(&[offer], 7, challenge(1, 32), &mut history)
            .unwrap();
        first
            .initiator
            .respond(&step2, 9, challenge(2, 32), &mut first.initiator_history)
            .unwrap()
    };
    first.target.verify(&step3, &mut history).unwrap();
    let mut second = exchange(true, vec![ChapAlgorithm::Md5]);
    let offer = second.initiator.offer();
    let step2 = second
        .target
        .challenge(&[offer], 7, challenge(5, 32), &mut history)
        .unwrap();
    // The initiator replays its earlier mutual challenge.
    let replay = second
        .initiator
        .respond(&step2, 9, challenge(2, 32), &mut second.initiator_history)
        .unwrap();
    assert_eq!(
        second.target.verify(&replay, &mut history),
        Err(ChapError::ReusedChallenge)
    );
    // An initiator refuses a target challenge it has seen before.
    let mut initiator_history = ChallengeHistory::default();
    let mut x = exchange(false, vec![ChapAlgorithm::Md5]);
    let offer = x.initiator.offer();
    let step2 = x
        .target
        .challenge(&[offer], 7, challenge(1, 32), &mut x.target_history)
        .unwrap();
    x.initiator
        .respond(&step2, 9, vec![], &mut initiator_history)
        .unwrap();
    let mut again = exchange(false, vec![ChapAlgorithm::Md5]);
    assert_eq!(
        again
            .initiator
            .respond(&step2, 9, vec![], &mut initiator_history),
        Err(ChapError::ReusedChallenge)
    );
}

#[test]
fn short_challenges_same_secrets_and_order_are_checked() {
    let mut target =
        TargetChap::new(vec![ChapAlgorithm::Sha256], initiator_credentials(), None).unwrap();
    assert_eq!(
        target.challenge(
            &[TextPair::new("CHAP_A", "7")],
            1,
            vec![1; 16],
            &mut ChallengeHistory::default()
        ),
        Err(ChapError::ShortChallenge(16))
    );
    assert_eq!(
        TargetChap::new(
            vec![ChapAlgorithm::Md5],
            initiator_credentials(),
            Some(Credentials::new("t", "initiator-secret-12"))
        )
        .unwrap_err(),
        ChapError::SameSecretBothWays
    );
    assert_eq!(
        InitiatorChap::new(
            vec![ChapAlgorithm::Md5],
            initiator_credentials(),
            Some(Credentials::new("t", "initiator-secret-12"))
        )
        .unwrap_err(),
        ChapError::SameSecretBothWays
    );
    let mut target =
        TargetChap::new(vec![ChapAlgorithm::Md5], initiator_credentials(), None).unwrap();
    assert_eq!(
        target.verify(&[], &mut ChallengeHistory::default()),
        Err(ChapError::OutOfOrder)
    );
    assert_eq!(
        target.challenge(&[], 1, vec![0; 16], &mut ChallengeHistory::default()),
        Err(ChapError::MissingKey("CHAP_A"))
    );
    assert_eq!(ChapError::MissingKey("CHAP_A").login_status(), (0x02, 0x00));
    let mut initiator =
        InitiatorChap::new(vec![ChapAlgorithm::Md5], initiator_credentials(), None).unwrap();
    assert!(matches!(
        initiator.respond(
            &[
                TextPair::new("CHAP_A", "7"),
                TextPair::new("CHAP_I", "1"),
                TextPair::new("CHAP_C", "0x00")
            ],
            1,
            vec![],
            &mut ChallengeHistory::default()
        ),
        Err(ChapError::AlgorithmNotOffered(_))
    ));
    assert!(format!("{:?}", initiator_credentials()).contains("redacted"));
}
