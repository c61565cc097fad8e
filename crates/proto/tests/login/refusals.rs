//! Every way the target refuses a login, each with the reason it gives
//! (the status class and detail of RFC 7143 11.13.5 and the words the
//! target's log prints).

use super::*;

#[test]
fn every_refusal_has_its_reason() {
    use LoginStage::*;
    let plain = Policy::default();
    let chap = Policy {
        chap: Some(chap_requirement(false)),
        ..Policy::default()
    };
    let one_secret = Policy {
        chap: Some(ChapRequirement {
            mutual: Some(Credentials::new("target0", "alice-secret-123")),
            ..chap_requirement(false)
        }),
        ..Policy::default()
    };
    let opening = |pairs: &[(&str, &str)]| {
        (
            raw_request(SecurityNegotiation, LoginOperationalNegotiation, true),
            text(pairs),
        )
    };
    let names = [
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("AuthMethod", "None"),
    ];
    let zero_response = format!("0x{}", "00".repeat(32));
    let cases: Vec<RefusalCase> = vec![
        (
            "no InitiatorName",
            &plain,
            vec![opening(&[("TargetName", TARGET)])],
            LoginStatus::MISSING_PARAMETER,
            RefusalReason::MissingKey {
                key: "InitiatorName".into(),
            },
        ),
        (
            "no TargetName",
            &plain,
            vec![opening(&[("InitiatorName", INITIATOR)])],
            LoginStatus::MISSING_PARAMETER,
            RefusalReason::MissingKey {
                key: "TargetName".into(),
            },
        ),
        (
            "a SessionType that does not exist",
            &plain,
            vec![opening(&[
                ("InitiatorName", INITIATOR),
                ("SessionType", "Bogus"),
            ])],
            LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
            RefusalReason::BadKey {
                key: "SessionType".into(),
                value: "Bogus".into(),
                why: "neither Normal nor Discovery".into(),
            },
        ),
        (
            "a malformed declaration",
            &plain,
            vec![(
                raw_request(LoginOperationalNegotiation, FullFeaturePhase, true),
                text(&[
                    ("InitiatorName", INITIATOR),
                    ("TargetName", TARGET),
                    ("MaxRecvDataSegmentLength", "lots"),
                ]),
            )],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::BadKey {
                key: "MaxRecvDataSegmentLength".into(),
                value: "lots".into(),
                why: "not a valid value for this declaration".into(),
            },
        ),
        (
            "a key twice",
            &plain,
            vec![opening(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("MaxBurstLength", "512"),
                ("MaxBurstLength", "512"),
            ])],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::Negotiation(iscsi_proto::text::NegotiationError::DuplicateKey(
                "MaxBurstLength".into(),
            )),
        ),
        (
            "malformed text",
            &plain,
            vec![(
                raw_request(SecurityNegotiation, LoginOperationalNegotiation, true),
                b"no equals sign\0".to_vec(),
            )],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::MalformedText(iscsi_proto::text::TextError::MissingEquals(
                "no equals sign".into(),
            )),
        ),
        (
            "T and C together",
            &plain,
            vec![{
                let mut request =
                    raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
                request.continue_flag = true;
                (request, text(&names))
            }],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::TransitWithContinue,
        ),
        (
            "a transit backwards",
            &plain,
            vec![(
                raw_request(LoginOperationalNegotiation, SecurityNegotiation, true),
                text(&names),
            )],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::BadTransit {
                from: LoginOperationalNegotiation,
                to: SecurityNegotiation,
            },
        ),
        (
            "the reserved stage",
            &plain,
            vec![(
                raw_request(LoginStage::from_u8(2), FullFeaturePhase, true),
                text(&names),
            )],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::NotALoginStage {
                stage: LoginStage::from_u8(2),
            },
        ),
        (
            "a request for another stage",
            &plain,
            vec![
                (
                    raw_request(SecurityNegotiation, LoginOperationalNegotiation, false),
                    text(&names),
                ),
                (
                    raw_request(LoginOperationalNegotiation, FullFeaturePhase, true),
                    Vec::new(),
                ),
            ],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::WrongStage {
                sent: LoginOperationalNegotiation,
                expected: SecurityNegotiation,
            },
        ),
        (
            "the CID changing",
            &plain,
            vec![
                (
                    raw_request(SecurityNegotiation, LoginOperationalNegotiation, false),
                    text(&names),
                ),
                {
                    let mut request =
                        raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
                    request.cid = 9;
                    (request, Vec::new())
                },
            ],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::IdentityChanged { field: "CID" },
        ),
        (
            "AuthMethod=None to a target requiring CHAP",
            &chap,
            vec![security(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("AuthMethod", "None"),
            ])],
            LoginStatus::AUTHENTICATION_FAILURE,
            RefusalReason::AuthMethodUnacceptable {
                offered: "None".into(),
                required: "CHAP",
            },
        ),
        (
            "the security stage skipped",
            &chap,
            vec![(
                raw_request(LoginOperationalNegotiation, FullFeaturePhase, true),
                text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]),
            )],
            LoginStatus::AUTHENTICATION_FAILURE,
            RefusalReason::NotAuthenticated,
        ),
        (
            "a CHAP algorithm the target does not accept",
            &chap,
            vec![chap_opening(), security(&[("CHAP_A", "9,15")])],
            LoginStatus::AUTHENTICATION_FAILURE,
            RefusalReason::ChapAlgorithmUnsupported {
                offered: "9,15".into(),
            },
        ),
        (
            "a CHAP user the target does not know",
            &chap,
            vec![
                chap_opening(),
                security(&[("CHAP_A", "5")]),
                security(&[("CHAP_N", "mallory"), ("CHAP_R", &zero_response)]),
            ],
            LoginStatus::AUTHENTICATION_FAILURE,
            RefusalReason::ChapUserUnknown {
                user: "mallory".into(),
            },
        ),
        (
            "a wrong CHAP response",
            &chap,
            vec![
                chap_opening(),
                security(&[("CHAP_A", "7")]),
                security(&[("CHAP_N", "alice"), ("CHAP_R", &zero_response)]),
            ],
            LoginStatus::AUTHENTICATION_FAILURE,
            RefusalReason::ChapSecretWrong {
                user: "alice".into(),
            },
        ),
        (
            "a malformed CHAP response",
            &chap,
            vec![
                chap_opening(),
                security(&[("CHAP_A", "5")]),
                security(&[("CHAP_N", "alice"), ("CHAP_R", "0xnothex")]),
            ],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::BadKey {
                key: "CHAP_R".into(),
                value: "0xnothex".into(),
                why: "not a valid CHAP value".into(),
            },
        ),
        (
            "a CHAP response without CHAP_N",
            &chap,
            vec![
                chap_opening(),
                security(&[("CHAP_A", "5")]),
                security(&[("CHAP_R", &zero_response)]),
            ],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::MissingKey {
                key: "CHAP_N".into(),
            },
        ),
        (
            "mutual CHAP asked of a target without it",
            &chap,
            vec![chap_opening(), security(&[("CHAP_A", "5")]), {
                let response = ChapAlgorithm::Md5.response(1, b"alice-secret-123", &[1; 32]);
                let response = iscsi_proto::login::chap::encode_binary(&response);
                let challenge = format!("0x{}", "77".repeat(32));
                let pairs = [
                    ("CHAP_N", "alice"),
                    ("CHAP_R", response.as_str()),
                    ("CHAP_I", "3"),
                    ("CHAP_C", challenge.as_str()),
                ];
                security(&pairs)
            }],
            LoginStatus::AUTHENTICATION_FAILURE,
            RefusalReason::Chap(iscsi_proto::login::chap::ChapError::MutualNotConfigured),
        ),
        (
            "CHAP keys to a target without CHAP",
            &plain,
            vec![security(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("CHAP_A", "5"),
            ])],
            LoginStatus::INITIATOR_ERROR,
            RefusalReason::ChapNotRequired,
        ),
        (
            "a target configured with one CHAP secret both ways",
            &one_secret,
            vec![chap_opening()],
            LoginStatus::TARGET_ERROR,
            RefusalReason::TargetError("the CHAP configuration uses one secret both ways"),
        ),
        (
            "an unknown target",
            &plain,
            vec![opening(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", "iqn.2026-11.rs.iscsi:nope"),
            ])],
            LoginStatus::NOT_FOUND,
            RefusalReason::UnknownTarget {
                name: "iqn.2026-11.rs.iscsi:nope".into(),
            },
        ),
    ];
    // Every case is checked and every mismatch reported, not just the first.
    let mut wrong = Vec::new();
    for (what, policy, requests, status, reason) in cases {
        let (refusal, _) = refusal_after(policy, &requests);
        if refusal.status != status || refusal.reason != reason {
            wrong.push(format!("{what}: got {refusal}, want {reason:?} ({status})"));
        }
        assert!(!refusal.to_string().contains("secret-123"), "{what}");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // A request after a refusal ended the login.
    let mut t = target();
    let (request, data) = opening(&[("TargetName", TARGET)]);
    refusal_of(&t.receive(&plain, &request, &data));
    let refusal = refusal_of(&t.receive(&plain, &request, &text(&names)));
    assert_eq!(refusal.status, LoginStatus::INVALID_DURING_LOGIN);
    assert_eq!(refusal.reason, RefusalReason::AfterLoginEnded);
}
