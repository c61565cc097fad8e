//! Negotiation (RFC 7143 sections 6 and 13): a table test per key (defaults,
//! ranges, result functions, special answers), the cross-key rules, the
//! originator's checks of answers, and two engines negotiating with each
//! other over random configurations.

use iscsi_proto::text::codec::{self, TextAssembler, TextPair};
use iscsi_proto::text::{
    Digest, NegotiationConfig, NegotiationError, Negotiator, Outcome, Role, SessionType, Stage,
};
use proptest::prelude::*;

type Configure = fn(&mut NegotiationConfig);

fn target_with(configure: Configure) -> Negotiator {
    let mut config = NegotiationConfig::default();
    configure(&mut config);
    Negotiator::new(Role::Target, config, true)
}

fn answer(negotiator: &mut Negotiator, key: &str, offered: &str) -> String {
    let answers = negotiator
        .receive(&[TextPair::new(key, offered)], Stage::Operational)
        .unwrap_or_else(|e| panic!("{key}={offered}: {e}"));
    assert_eq!(answers.len(), 1, "{key}={offered}: {answers:?}");
    assert_eq!(answers[0].key, key);
    answers[0].value.clone()
}

/// (key, this side's configuration, offered value, expected answer)
#[rustfmt::skip]
fn responder_table() -> Vec<(&'static str, Configure, &'static str, &'static str)> {
    vec![
        // 13.1 lists: the first offered value we accept.
        ("HeaderDigest", |c| c.header_digest = vec![Digest::Crc32c, Digest::None], "None,CRC32C", "None"),
        ("HeaderDigest", |c| c.header_digest = vec![Digest::Crc32c, Digest::None], "CRC32C,None", "CRC32C"),
        ("HeaderDigest", |c| c.header_digest = vec![Digest::Crc32c], "None", "Reject"),
        ("HeaderDigest", |c| c.header_digest = vec![Digest::None], "CRC32C,None", "None"),
        ("HeaderDigest", |c| c.header_digest = vec![Digest::Crc32c, Digest::None], "MD5,CRC32C", "CRC32C"),
        ("DataDigest", |c| c.data_digest = vec![Digest::Crc32c], "CRC32C", "CRC32C"),
        ("DataDigest", |_| {}, "CRC32C", "Reject"),
        // 13.2 MaxConnections: Minimum, 1..=65535.
        ("MaxConnections", |c| c.max_connections = 4, "8", "4"),
        ("MaxConnections", |c| c.max_connections = 4, "2", "2"),
        ("MaxConnections", |c| c.max_connections = 4, "0", "Reject"),
        ("MaxConnections", |c| c.max_connections = 4, "65536", "Reject"),
        ("MaxConnections", |c| c.max_connections = 4, "many", "Reject"),
        // 13.10 InitialR2T: OR.
        ("InitialR2T", |c| c.initial_r2t = false, "No", "No"),
        ("InitialR2T", |c| c.initial_r2t = false, "Yes", "Yes"),
        ("InitialR2T", |c| c.initial_r2t = true, "No", "Yes"),
        ("InitialR2T", |_| {}, "yes", "Reject"),
        // 13.11 ImmediateData: AND.
        ("ImmediateData", |c| c.immediate_data = true, "Yes", "Yes"),
        ("ImmediateData", |c| c.immediate_data = false, "Yes", "No"),
        ("ImmediateData", |c| c.immediate_data = true, "No", "No"),
        // 13.13 MaxBurstLength: Minimum, 512..=2^24-1, hex accepted.
        ("MaxBurstLength", |c| c.max_burst_length = 1 << 20, "262144", "262144"),
        ("MaxBurstLength", |c| c.max_burst_length = 65536, "262144", "65536"),
        ("MaxBurstLength", |c| c.max_burst_length = 1 << 20, "0x10000", "65536"),
        ("MaxBurstLength", |_| {}, "511", "Reject"),
        ("MaxBurstLength", |_| {}, "16777216", "Reject"),
        // 13.14 FirstBurstLength: Minimum, and never above MaxBurstLength.
        ("FirstBurstLength", |c| c.first_burst_length = 65536, "262144", "65536"),
        ("FirstBurstLength", |c| { c.first_burst_length = 1 << 20; c.max_burst_length = 1 << 20 }, "131072", "131072"),
        ("FirstBurstLength", |c| c.first_burst_length = 1 << 20, "524288", "262144"),
        // 13.15 DefaultTime2Wait: Maximum, 0..=3600.
        ("DefaultTime2Wait", |_| {}, "0", "2"),
        ("DefaultTime2Wait", |_| {}, "10", "10"),
        ("DefaultTime2Wait", |_| {}, "3601", "Reject"),
        // 13.16 DefaultTime2Retain: Minimum, 0..=3600.
        ("DefaultTime2Retain", |_| {}, "0", "0"),
        ("DefaultTime2Retain", |_| {}, "3600", "20"),
        // 13.17 MaxOutstandingR2T: Minimum, 1..=65535.
        ("MaxOutstandingR2T", |c| c.max_outstanding_r2t = 8, "16", "8"),
        ("MaxOutstandingR2T", |c| c.max_outstanding_r2t = 8, "4", "4"),
        ("MaxOutstandingR2T", |_| {}, "0", "Reject"),
        // 13.18, 13.19: OR.
        ("DataPDUInOrder", |c| c.data_pdu_in_order = false, "No", "No"),
        ("DataPDUInOrder", |c| c.data_pdu_in_order = true, "No", "Yes"),
        ("DataSequenceInOrder", |c| c.data_sequence_in_order = false, "Yes", "Yes"),
        // 13.20 ErrorRecoveryLevel: Minimum, 0..=2.
        ("ErrorRecoveryLevel", |_| {}, "2", "0"),
        ("ErrorRecoveryLevel", |c| c.error_recovery_level = 2, "1", "1"),
        ("ErrorRecoveryLevel", |_| {}, "3", "Reject"),
        // 13.23 TaskReporting: list.
        ("TaskReporting", |_| {}, "FastAbort,RFC3720", "RFC3720"),
        ("TaskReporting", |_| {}, "FastAbort", "Reject"),
        ("TaskReporting", |c| c.task_reporting = vec!["FastAbort".into(), "RFC3720".into()], "FastAbort,RFC3720", "FastAbort"),
        // 13.24 iSCSIProtocolLevel: Minimum, 0..=31.
        ("iSCSIProtocolLevel", |_| {}, "2", "1"),
        ("iSCSIProtocolLevel", |_| {}, "32", "Reject"),
        // 13.25: the obsoleted marker keys are rejected.
        ("IFMarker", |_| {}, "Yes", "Reject"),
        ("OFMarker", |_| {}, "No", "Reject"),
        ("IFMarkInt", |_| {}, "2048", "Reject"),
        ("OFMarkInt", |_| {}, "2048~8192", "Reject"),
        // RFC 7145 6.3 RDMAExtensions: AND.
        ("RDMAExtensions", |_| {}, "Yes", "No"),
        ("RDMAExtensions", |c| c.rdma_extensions = true, "Yes", "Yes"),
        // Keys nobody defined; private extensions.
        ("FooBar", |_| {}, "1", "NotUnderstood"),
        ("X-org.example.Feature", |_| {}, "on", "NotUnderstood"),
        ("X-org.example.Feature", |c| c.extensions = vec![TextPair::new("X-org.example.Feature", "off")], "on", "off"),
    ]
}

#[test]
fn every_key_answers_by_its_result_function() {
    for (key, configure, offered, expected) in responder_table() {
        let mut target = target_with(configure);
        assert_eq!(
            answer(&mut target, key, offered),
            expected,
            "{key}={offered}"
        );
        let outcome = target.outcome(key).cloned();
        let expected_outcome = match expected {
            "Reject" => Outcome::Rejected,
            "NotUnderstood" => Outcome::NotUnderstood,
            "Irrelevant" => Outcome::Irrelevant,
            v => Outcome::Agreed(v.to_owned()),
        };
        assert_eq!(outcome, Some(expected_outcome), "{key}={offered}");
    }
}

#[test]
fn defaults_hold_when_nothing_is_negotiated() {
    let params = Negotiator::new(Role::Initiator, NegotiationConfig::default(), true)
        .finish()
        .unwrap();
    assert_eq!(params.header_digest, Digest::None);
    assert_eq!(params.data_digest, Digest::None);
    assert_eq!(params.max_connections, 1);
    assert!(params.initial_r2t);
    assert!(params.immediate_data);
    assert_eq!(params.max_send_data_segment_length, 8192);
    assert_eq!(params.max_recv_data_segment_length, 8192);
    assert_eq!(params.max_burst_length, 262_144);
    assert_eq!(params.first_burst_length, 65_536);
    assert_eq!(params.default_time2wait, 2);
    assert_eq!(params.default_time2retain, 20);
    assert_eq!(params.max_outstanding_r2t, 1);
    assert!(params.data_pdu_in_order);
    assert!(params.data_sequence_in_order);
    assert_eq!(params.error_recovery_level, 0);
    assert_eq!(params.task_reporting, "RFC3720");
    assert_eq!(params.iscsi_protocol_level, 1);
    assert!(!params.rdma_extensions);
}

#[test]
fn rejected_and_irrelevant_keys_keep_their_defaults() {
    let mut target = target_with(|_| {});
    answer(&mut target, "MaxBurstLength", "100");
    answer(&mut target, "IFMarker", "Yes");
    let params = target.finish().unwrap();
    assert_eq!(params.max_burst_length, 262_144);
}

#[test]
fn first_burst_length_is_bounded_by_the_max_burst_length_of_the_same_exchange() {
    let mut target = target_with(|c| {
        c.max_burst_length = 1 << 20;
        c.first_burst_length = 1 << 20;
    });
    // FirstBurstLength before MaxBurstLength in the PDU: still bounded.
    let answers = target
        .receive(
            &[
                TextPair::new("FirstBurstLength", "262144"),
                TextPair::new("MaxBurstLength", "16384"),
            ],
            Stage::Operational,
        )
        .unwrap();
    assert_eq!(
        answers,
        vec![
            TextPair::new("FirstBurstLength", "16384"),
            TextPair::new("MaxBurstLength", "16384")
        ]
    );
    let params = target.finish().unwrap();
    assert!(params.first_burst_length <= params.max_burst_length);
}

#[test]
fn first_burst_length_is_irrelevant_without_unsolicited_data() {
    let mut target = target_with(|c| c.immediate_data = false);
    let answers = target
        .receive(
            &[
                TextPair::new("ImmediateData", "No"),
                TextPair::new("FirstBurstLength", "65536"),
            ],
            Stage::Operational,
        )
        .unwrap();
    assert_eq!(answers[1], TextPair::new("FirstBurstLength", "Irrelevant"));
    assert!(!target.finish().unwrap().allows_unsolicited_data());
}

#[test]
fn session_keys_are_irrelevant_in_discovery_sessions() {
    let mut target = target_with(|c| c.header_digest = vec![Digest::Crc32c, Digest::None]);
    let answers = target
        .receive(
            &[
                TextPair::new("MaxBurstLength", "65536"),
                TextPair::new("HeaderDigest", "CRC32C"),
                TextPair::new("SessionType", "Discovery"),
                TextPair::new("InitialR2T", "No"),
            ],
            Stage::Operational,
        )
        .unwrap();
    assert_eq!(
        answers,
        vec![
            TextPair::new("MaxBurstLength", "Irrelevant"),
            TextPair::new("HeaderDigest", "CRC32C"),
            TextPair::new("InitialR2T", "Irrelevant"),
        ]
    );
    assert_eq!(target.session_type(), SessionType::Discovery);
}

/// The kernel initiator (open-iscsi) sends ErrorRecoveryLevel in a
/// discovery login and refuses the login unless the answer is a number;
/// tgt answers all three of these keys there (testdata/captures/discovery).
#[test]
fn recovery_and_timer_keys_are_negotiated_in_discovery_sessions() {
    let mut target = target_with(|_| {});
    let answers = target
        .receive(
            &[
                TextPair::new("SessionType", "Discovery"),
                TextPair::new("ErrorRecoveryLevel", "0"),
                TextPair::new("DefaultTime2Wait", "2"),
                TextPair::new("DefaultTime2Retain", "0"),
            ],
            Stage::Operational,
        )
        .unwrap();
    assert_eq!(
        answers,
        vec![
            TextPair::new("ErrorRecoveryLevel", "0"),
            TextPair::new("DefaultTime2Wait", "2"),
            TextPair::new("DefaultTime2Retain", "0"),
        ]
    );
}

#[test]
fn leading_only_keys_are_irrelevant_on_secondary_connections() {
    let mut target = Negotiator::new(Role::Target, NegotiationConfig::default(), false);
    assert_eq!(answer(&mut target, "MaxBurstLength", "65536"), "Irrelevant");
    assert_eq!(answer(&mut target, "HeaderDigest", "None"), "None");
}

#[test]
fn protocol_errors() {
    let mut target = target_with(|_| {});
    let twice = [
        TextPair::new("MaxBurstLength", "65536"),
        TextPair::new("MaxBurstLength", "65536"),
    ];
    assert!(matches!(
        target.receive(&twice, Stage::Operational),
        Err(NegotiationError::DuplicateKey(_))
    ));
    let mut target = target_with(|_| {});
    answer(&mut target, "MaxBurstLength", "65536");
    assert!(matches!(
        target.receive(
            &[TextPair::new("MaxBurstLength", "4096")],
            Stage::Operational
        ),
        Err(NegotiationError::DuplicateKey(_))
    ));
    // A reply to our answer is not a second offer: tgt answers our
    // FirstBurstLength=Irrelevant with FirstBurstLength=Reject. The outcome
    // stands; a second real offer is still an error.
    let mut initiator = Negotiator::new(
        Role::Initiator,
        NegotiationConfig {
            initial_r2t: true,
            immediate_data: false,
            ..NegotiationConfig::default()
        },
        true,
    );
    let offer = [
        TextPair::new("InitialR2T", "No"),
        TextPair::new("ImmediateData", "No"),
        TextPair::new("FirstBurstLength", "1048576"),
    ];
    let answers = initiator.receive(&offer, Stage::Operational).unwrap();
    assert!(
        answers.contains(&TextPair::new("FirstBurstLength", "Irrelevant")),
        "{answers:?}"
    );
    let echo = [TextPair::new("FirstBurstLength", "Reject")];
    assert_eq!(
        initiator.receive(&echo, Stage::Operational).unwrap(),
        Vec::new()
    );
    assert!(matches!(
        initiator.receive(
            &[TextPair::new("FirstBurstLength", "65536")],
            Stage::Operational
        ),
        Err(NegotiationError::DuplicateKey(_))
    ));
    let mut target = target_with(|_| {});
    assert!(matches!(
        target.receive(&[TextPair::new("TargetAlias", "x")], Stage::Operational),
        Err(NegotiationError::WrongSender(_))
    ));
    let mut initiator = Negotiator::new(Role::Initiator, NegotiationConfig::default(), true);
    assert!(matches!(
        initiator.receive(
            &[TextPair::new("InitiatorName", "iqn.x")],
            Stage::Operational
        ),
        Err(NegotiationError::WrongSender(_))
    ));
    let mut target = target_with(|_| {});
    assert!(matches!(
        target.receive(&[TextPair::new("CHAP_A", "5")], Stage::Operational),
        Err(NegotiationError::SecurityKeyOutOfStage(_))
    ));
    let mut target = target_with(|_| {});
    assert_eq!(
        target.receive(&[TextPair::new("CHAP_A", "5")], Stage::Security),
        Ok(vec![]),
        "security keys are the authentication exchange's"
    );
    for bad in ["100", "16777216", "lots"] {
        let mut target = target_with(|_| {});
        assert!(matches!(
            target.receive(
                &[TextPair::new("MaxRecvDataSegmentLength", bad)],
                Stage::Operational
            ),
            Err(NegotiationError::InvalidDeclaration { .. })
        ));
    }
    let mut target = target_with(|_| {});
    assert!(
        target
            .receive(&[TextPair::new("SessionType", "Other")], Stage::Security)
            .is_err()
    );
    assert_eq!(NegotiationError::LOGIN_STATUS, (0x02, 0x00));
}

#[test]
fn full_feature_text_cannot_renegotiate_login_keys() {
    let mut target = target_with(|_| {});
    let answers = target
        .receive(
            &[TextPair::new("MaxBurstLength", "65536")],
            Stage::FullFeature,
        )
        .unwrap();
    assert_eq!(answers, vec![TextPair::new("MaxBurstLength", "Reject")]);
}

fn initiator_offering(configure: Configure) -> (Negotiator, Vec<TextPair>) {
    let mut config = NegotiationConfig::default();
    configure(&mut config);
    let mut initiator = Negotiator::new(Role::Initiator, config, true);
    let offers = initiator.offers(Stage::Operational);
    (initiator, offers)
}

#[test]
fn an_originator_checks_every_answer() {
    let (mut initiator, offers) = initiator_offering(|c| c.max_burst_length = 1 << 20);
    assert!(offers.contains(&TextPair::new("MaxBurstLength", "1048576")));
    // Minimum: an answer above the offer is inadmissible.
    assert!(matches!(
        initiator.receive(
            &[TextPair::new("MaxBurstLength", "2097152")],
            Stage::Operational
        ),
        Err(NegotiationError::InadmissibleAnswer { .. })
    ));
    let (mut initiator, _) = initiator_offering(|c| c.max_burst_length = 1 << 20);
    initiator
        .receive(
            &[TextPair::new("MaxBurstLength", "524288")],
            Stage::Operational,
        )
        .unwrap();
    assert_eq!(initiator.finish().unwrap().max_burst_length, 524_288);
    // Maximum: an answer below the offer is inadmissible.
    let (mut initiator, _) = initiator_offering(|c| c.default_time2wait = 10);
    assert!(
        initiator
            .receive(
                &[TextPair::new("DefaultTime2Wait", "5")],
                Stage::Operational
            )
            .is_err()
    );
    // A list answer must be one of the values offered.
    let (mut initiator, _) =
        initiator_offering(|c| c.header_digest = vec![Digest::Crc32c, Digest::None]);
    assert!(
        initiator
            .receive(&[TextPair::new("HeaderDigest", "MD5")], Stage::Operational)
            .is_err()
    );
    // AND offered No cannot be answered Yes; OR offered Yes cannot be No.
    let (mut initiator, _) = initiator_offering(|c| c.immediate_data = false);
    assert!(
        initiator
            .receive(&[TextPair::new("ImmediateData", "Yes")], Stage::Operational)
            .is_err()
    );
    let (mut initiator, _) = initiator_offering(|c| c.data_pdu_in_order = true);
    initiator.receive(&[], Stage::Operational).unwrap();
    // DataPDUInOrder=Yes is the default, so it was not offered at all.
    assert!(initiator.pending_offers().is_empty());
    // A Reject leaves the default.
    let (mut initiator, _) = initiator_offering(|c| c.max_outstanding_r2t = 8);
    initiator
        .receive(
            &[TextPair::new("MaxOutstandingR2T", "Reject")],
            Stage::Operational,
        )
        .unwrap();
    assert_eq!(initiator.finish().unwrap().max_outstanding_r2t, 1);
}

#[test]
fn implicit_boolean_results_need_no_answer() {
    // 6.2: AND offered No and OR offered Yes decide the result alone.
    let (initiator, offers) = initiator_offering(|c| c.immediate_data = false);
    assert!(offers.contains(&TextPair::new("ImmediateData", "No")));
    assert!(initiator.is_complete());
    assert!(!initiator.finish().unwrap().immediate_data);
    // OR offered No needs an answer.
    let (initiator, _) = initiator_offering(|c| c.initial_r2t = false);
    assert!(!initiator.is_complete());
    assert_eq!(initiator.pending_offers(), vec!["InitialR2T"]);
    assert!(matches!(
        initiator.finish(),
        Err(NegotiationError::MissingAnswer(_))
    ));
}

#[test]
fn the_first_login_pdu_declares_names_and_session_type() {
    let config = NegotiationConfig {
        declarations: vec![
            TextPair::new("InitiatorName", "iqn.2026-11.rs.iscsi:initiator"),
            TextPair::new("TargetName", "iqn.2026-11.rs.iscsi:target0"),
        ],
        ..NegotiationConfig::default()
    };
    let mut initiator = Negotiator::new(Role::Initiator, config, true);
    let first = initiator.offers(Stage::Security);
    assert_eq!(
        first,
        vec![
            TextPair::new("InitiatorName", "iqn.2026-11.rs.iscsi:initiator"),
            TextPair::new("TargetName", "iqn.2026-11.rs.iscsi:target0"),
            TextPair::new("SessionType", "Normal"),
        ]
    );
    // Not again in the operational stage; the data segment length is declared.
    let operational = initiator.offers(Stage::Operational);
    assert_eq!(
        operational,
        vec![TextPair::new("MaxRecvDataSegmentLength", "8192")]
    );
}

#[test]
fn iser_replaces_the_data_segment_length_keys() {
    let config = NegotiationConfig {
        rdma_extensions: true,
        declarations: vec![TextPair::new("InitiatorRecvDataSegmentLength", "262144")],
        ..NegotiationConfig::default()
    };
    let mut initiator = Negotiator::new(Role::Initiator, config, true);
    initiator
        .receive(
            &[
                TextPair::new("RDMAExtensions", "Yes"),
                TextPair::new("TargetRecvDataSegmentLength", "131072"),
            ],
            Stage::Operational,
        )
        .unwrap();
    let params = initiator.finish().unwrap();
    assert!(params.rdma_extensions);
    assert_eq!(params.max_send_data_segment_length, 131_072);
    assert_eq!(params.max_recv_data_segment_length, 262_144);
}

/// tgt 1.0.85's iSER target answers our `InitiatorRecvDataSegmentLength`
/// declaration with `NotUnderstood`: nothing was negotiated, the login goes
/// on with the RFC's default for the target's receive length. A
/// NotUnderstood for a declaration we never made is still an error.
#[test]
fn a_declaration_the_peer_does_not_understand_keeps_the_default() {
    let config = NegotiationConfig {
        rdma_extensions: true,
        declarations: vec![TextPair::new("InitiatorRecvDataSegmentLength", "8192")],
        ..NegotiationConfig::default()
    };
    let mut initiator = Negotiator::new(Role::Initiator, config.clone(), true);
    let offers = initiator.offers(Stage::Operational);
    assert!(
        offers
            .iter()
            .any(|p| p.key == "InitiatorRecvDataSegmentLength")
    );
    initiator
        .receive(
            &[
                TextPair::new("RDMAExtensions", "Yes"),
                TextPair::new("InitiatorRecvDataSegmentLength", "NotUnderstood"),
            ],
            Stage::Operational,
        )
        .expect("a NotUnderstood declaration is not fatal");
    let params = initiator.finish().unwrap();
    assert!(params.rdma_extensions);
    assert_eq!(params.max_send_data_segment_length, 8192);

    let mut fresh = Negotiator::new(Role::Initiator, NegotiationConfig::default(), true);
    assert!(
        fresh
            .receive(
                &[TextPair::new(
                    "TargetRecvDataSegmentLength",
                    "NotUnderstood"
                )],
                Stage::Operational,
            )
            .is_err()
    );
}

/// Runs a whole operational negotiation between two engines, in memory, the
/// way login PDUs carry it: each side answers what it received and adds
/// its own offers, until nothing is left to say.
fn negotiate(
    initiator_config: NegotiationConfig,
    target_config: NegotiationConfig,
) -> (Negotiator, Negotiator) {
    let mut initiator = Negotiator::new(Role::Initiator, initiator_config, true);
    let mut target = Negotiator::new(Role::Target, target_config, true);
    let mut to_target = initiator.offers(Stage::Operational);
    for _round in 0..8 {
        let mut to_initiator = target.receive(&to_target, Stage::Operational).unwrap();
        to_initiator.extend(target.offers(Stage::Operational));
        to_target = initiator
            .receive(&to_initiator, Stage::Operational)
            .unwrap();
        to_target.extend(initiator.offers(Stage::Operational));
        if to_target.is_empty() && initiator.is_complete() && target.is_complete() {
            return (initiator, target);
        }
    }
    panic!("negotiation did not converge");
}

fn config_strategy() -> impl Strategy<Value = NegotiationConfig> {
    let digests = prop_oneof![
        Just(vec![Digest::None]),
        Just(vec![Digest::Crc32c]),
        Just(vec![Digest::Crc32c, Digest::None]),
        Just(vec![Digest::None, Digest::Crc32c]),
    ];
    (
        (
            digests.clone(),
            digests,
            1u16..=8,
            any::<bool>(),
            any::<bool>(),
        ),
        (512u32..=(1 << 24) - 1, 512u32..=1 << 20, 512u32..=1 << 20),
        (
            0u16..=3600,
            0u16..=3600,
            1u16..=64,
            any::<bool>(),
            any::<bool>(),
            0u8..=2,
        ),
    )
        .prop_map(
            |(
                (header_digest, data_digest, max_connections, initial_r2t, immediate_data),
                (max_recv_data_segment_length, max_burst_length, first_burst_length),
                (wait, retain, max_outstanding_r2t, pdu_in_order, sequence_in_order, erl),
            )| NegotiationConfig {
                header_digest,
                data_digest,
                max_connections,
                initial_r2t,
                immediate_data,
                max_recv_data_segment_length,
                max_burst_length,
                first_burst_length,
                default_time2wait: wait,
                default_time2retain: retain,
                max_outstanding_r2t,
                data_pdu_in_order: pdu_in_order,
                data_sequence_in_order: sequence_in_order,
                error_recovery_level: erl,
                ..NegotiationConfig::default()
            },
        )
}

proptest! {
    #[test]
    fn two_engines_agree_by_the_result_functions(
        ours in config_strategy(),
        theirs in config_strategy(),
    ) {
        let (initiator, target) = negotiate(ours.clone(), theirs.clone());
        let i = initiator.finish().unwrap();
        let t = target.finish().unwrap();
        // Both sides hold the same session and connection parameters...
        prop_assert_eq!(i.header_digest, t.header_digest);
        prop_assert_eq!(i.data_digest, t.data_digest);
        prop_assert_eq!(i.max_connections, t.max_connections);
        prop_assert_eq!(i.initial_r2t, t.initial_r2t);
        prop_assert_eq!(i.immediate_data, t.immediate_data);
        prop_assert_eq!(i.max_burst_length, t.max_burst_length);
        prop_assert_eq!(i.first_burst_length, t.first_burst_length);
        prop_assert_eq!(i.default_time2wait, t.default_time2wait);
        prop_assert_eq!(i.default_time2retain, t.default_time2retain);
        prop_assert_eq!(i.max_outstanding_r2t, t.max_outstanding_r2t);
        prop_assert_eq!(i.data_pdu_in_order, t.data_pdu_in_order);
        prop_assert_eq!(i.data_sequence_in_order, t.data_sequence_in_order);
        prop_assert_eq!(i.error_recovery_level, t.error_recovery_level);
        // ...each direction's segment limit is the receiver's declaration...
        prop_assert_eq!(i.max_send_data_segment_length, theirs.max_recv_data_segment_length);
        prop_assert_eq!(t.max_send_data_segment_length, ours.max_recv_data_segment_length);
        // ...and the values are the result functions of the two configurations.
        prop_assert_eq!(i.max_connections, ours.max_connections.min(theirs.max_connections));
        prop_assert_eq!(i.initial_r2t, ours.initial_r2t || theirs.initial_r2t);
        prop_assert_eq!(i.immediate_data, ours.immediate_data && theirs.immediate_data);
        prop_assert_eq!(i.max_burst_length, ours.max_burst_length.min(theirs.max_burst_length));
        prop_assert_eq!(i.default_time2wait, ours.default_time2wait.max(theirs.default_time2wait));
        prop_assert_eq!(i.default_time2retain, ours.default_time2retain.min(theirs.default_time2retain));
        prop_assert_eq!(i.max_outstanding_r2t, ours.max_outstanding_r2t.min(theirs.max_outstanding_r2t));
        prop_assert_eq!(i.data_pdu_in_order, ours.data_pdu_in_order || theirs.data_pdu_in_order);
        prop_assert_eq!(i.error_recovery_level, ours.error_recovery_level.min(theirs.error_recovery_level));
        prop_assert!(i.first_burst_length <= i.max_burst_length);
        if i.allows_unsolicited_data() {
            prop_assert!(i.first_burst_length <= ours.first_burst_length.min(theirs.first_burst_length));
        }
        let digest = |mine: &[Digest], peer: &[Digest]| {
            mine.iter().copied().find(|d| peer.contains(d))
        };
        // The initiator offers only when it differs from the default (None);
        // then the target picks the first of the initiator's list it accepts.
        if ours.header_digest != vec![Digest::None] {
            match digest(&ours.header_digest, &theirs.header_digest) {
                Some(d) => prop_assert_eq!(i.header_digest, d),
                None => prop_assert_eq!(i.header_digest, Digest::None),
            }
        }
    }
}

#[test]
fn a_long_text_crosses_pdus_with_the_continue_bit() {
    // A SendTargets-sized answer split at a small MaxRecvDataSegmentLength.
    let pairs: Vec<TextPair> = (0..200)
        .flat_map(|i| {
            [
                TextPair::new("TargetName", format!("iqn.2026-11.rs.iscsi:target{i}")),
                TextPair::new("TargetAddress", format!("127.0.0.1:3260,{i}")),
            ]
        })
        .collect();
    let mut text = Vec::new();
    codec::encode(&pairs, &mut text);
    let segments = codec::fragment(&text, 512);
    assert!(segments.len() > 10);
    let mut assembler = TextAssembler::default();
    let mut assembled = None;
    for (segment, continues) in segments {
        assert!(segment.len() <= 512);
        assembled = assembler.push(segment, continues).unwrap();
    }
    assert_eq!(codec::parse(&assembled.unwrap()).unwrap(), pairs);
}
