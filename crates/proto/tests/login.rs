//! Login (RFC 7143 6.3, 11.12, 11.13, 12.1.3): the initiator and target
//! state machines against each other in memory, every PDU passing through
//! the real encoder and decoder, and every way a login can fail.

use std::sync::{Arc, Mutex};

use iscsi_proto::login::chap::{ChallengeHistory, ChapAlgorithm, Credentials};
use iscsi_proto::login::initiator::{
    InitiatorChapSettings, InitiatorLogin, InitiatorLoginConfig, InitiatorLoginError, InitiatorStep,
};
use iscsi_proto::login::target::{
    ChapRequirement, LoginOutcome, LoginPolicy, LoginRefusal, RefusalReason, SentNames,
    SessionRequest, TargetLogin, TargetSettings,
};
use iscsi_proto::pdu::login::{Isid, LoginRequest, LoginResponse, LoginStage, LoginStatus};
use iscsi_proto::pdu::{Pdu, SegmentLengths};
use iscsi_proto::serial::{CmdSn, StatSn};
use iscsi_proto::text::codec::TextPair;
use iscsi_proto::text::{Digest, NegotiationConfig, SessionType};

#[path = "login/refusals.rs"]
mod refusals;

const TARGET: &str = "iqn.2026-11.rs.iscsi:target0";
const INITIATOR: &str = "iqn.2026-11.rs.iscsi:initiator";

/// A policy with one target, an optional CHAP requirement and an ACL.
struct Policy {
    chap: Option<ChapRequirement>,
    allowed_initiator: Option<&'static str>,
    negotiation: NegotiationConfig,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            chap: None,
            allowed_initiator: None,
            negotiation: NegotiationConfig {
                header_digest: vec![Digest::Crc32c, Digest::None],
                data_digest: vec![Digest::Crc32c, Digest::None],
                max_burst_length: 262_144,
                declarations: vec![
                    TextPair::new("TargetPortalGroupTag", "1"),
                    TextPair::new("TargetAlias", "iscsi-rs test"),
                ],
                ..NegotiationConfig::default()
            },
        }
    }
}

impl LoginPolicy for Policy {
    fn settings(&self, request: &SessionRequest) -> Result<TargetSettings, LoginRefusal> {
        if request.session_type == SessionType::Normal
            && request.target_name.as_deref() != Some(TARGET)
        {
            return Err(LoginRefusal::unknown_target(
                request.target_name.clone().unwrap_or_default(),
            ));
        }
        if self
            .allowed_initiator
            .is_some_and(|allowed| allowed != request.initiator_name)
        {
            return Err(LoginRefusal::not_in_acl(&request.initiator_name, TARGET));
        }
        if request.tsih != 0 && request.tsih != 0x1234 {
            return Err(LoginRefusal::session_does_not_exist(request.tsih));
        }
        Ok(TargetSettings {
            negotiation: self.negotiation.clone(),
            chap: self.chap.clone(),
            tsih: 0x1234,
            leading: request.tsih == 0,
            command_window: 64,
        })
    }
}

fn initiator_config() -> InitiatorLoginConfig {
    InitiatorLoginConfig {
        initiator_name: INITIATOR.to_owned(),
        target_name: Some(TARGET.to_owned()),
        isid: Isid::from_bytes([0x80, 0x12, 0x34, 0x56, 0x00, 0x01]),
        tsih: 0,
        cid: 1,
        negotiation: NegotiationConfig {
            header_digest: vec![Digest::Crc32c, Digest::None],
            data_digest: vec![Digest::None],
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            immediate_data: true,
            initial_r2t: false,
            ..NegotiationConfig::default()
        },
        chap: None,
    }
}

fn history() -> Arc<Mutex<ChallengeHistory>> {
    Arc::new(Mutex::new(ChallengeHistory::default()))
}

/// Encodes and decodes a login PDU through the real codec, checking that
/// the data segment length survives.
fn over_the_wire(pdu: Pdu, data_len: usize) -> Pdu {
    let lengths = SegmentLengths {
        total_ahs_words: 0,
        data_segment_length: data_len as u32,
    };
    let mut bhs = [0u8; 48];
    pdu.encode_bhs(lengths, &mut bhs);
    let (decoded, decoded_lengths) = Pdu::decode_bhs(&bhs);
    assert_eq!(decoded_lengths, lengths);
    decoded
}

fn over_the_wire_request(request: &LoginRequest, data_len: usize) -> LoginRequest {
    match over_the_wire(Pdu::LoginRequest(request.clone()), data_len) {
        Pdu::LoginRequest(decoded) => decoded,
        other => panic!("decoded as {other:?}"),
    }
}

fn over_the_wire_response(response: &LoginResponse, data_len: usize) -> LoginResponse {
    match over_the_wire(Pdu::LoginResponse(response.clone()), data_len) {
        Pdu::LoginResponse(decoded) => decoded,
        other => panic!("decoded as {other:?}"),
    }
}

struct Run {
    initiator:
        Result<Box<iscsi_proto::login::initiator::InitiatorLoginComplete>, InitiatorLoginError>,
    target: LoginOutcome,
    exchanges: usize,
    first_response_text: Vec<u8>,
}

/// The initiator's login machine the tests drive (tag 0x10, CmdSN 7).
fn initiator_login(config: InitiatorLoginConfig) -> InitiatorLogin {
    InitiatorLogin::new(config, 0x10, CmdSn::new(7), (9, vec![0x5A; 32]), history())
        .expect("valid initiator config")
}

/// Starts `initiator`: its first Login Request and text.
fn first_request(initiator: &mut InitiatorLogin) -> (LoginRequest, Vec<u8>) {
    let InitiatorStep::Send { request, data } = initiator.start() else {
        unreachable!("a login starts by sending")
    };
    (request, data)
}

fn run(policy: &Policy, config: InitiatorLoginConfig) -> Run {
    // Each end keeps its own challenge history, as two hosts would.
    let mut initiator = initiator_login(config);
    let mut target = TargetLogin::new(StatSn::new(100), 3, vec![0xA5; 32], history());
    let mut step = initiator.start();
    let mut first_response_text = None;
    for exchanges in 1..=32 {
        let InitiatorStep::Send { request, data } = step else {
            unreachable!()
        };
        assert!(
            data.len() <= 8192,
            "login text segment of {} bytes",
            data.len()
        );
        let answer = target.receive(policy, &over_the_wire_request(&request, data.len()), &data);
        first_response_text.get_or_insert_with(|| answer.data.clone());
        let response = over_the_wire_response(&answer.response, answer.data.len());
        let result = initiator.receive(&response, &answer.data);
        match (result, &answer.outcome) {
            (Ok(InitiatorStep::Complete(done)), outcome) => {
                return Run {
                    initiator: Ok(done),
                    target: outcome.clone(),
                    exchanges,
                    first_response_text: first_response_text.unwrap_or_default(),
                };
            }
            (Err(error), outcome) => {
                return Run {
                    initiator: Err(error),
                    target: outcome.clone(),
                    exchanges,
                    first_response_text: first_response_text.unwrap_or_default(),
                };
            }
            (Ok(next), LoginOutcome::Continue) => step = next,
            (Ok(_), outcome) => panic!("target ended ({outcome:?}) but the initiator goes on"),
        }
    }
    panic!("login did not finish in 32 exchanges");
}

fn text_has(text: &[u8], key: &str, value: &str) -> bool {
    iscsi_proto::text::codec::parse(text)
        .unwrap()
        .iter()
        .any(|p| p.key == key && p.value == value)
}

#[test]
fn a_login_without_authentication_reaches_full_feature_phase() {
    let run = run(&Policy::default(), initiator_config());
    let done = run.initiator.expect("login succeeds");
    let LoginOutcome::Complete(target) = run.target else {
        panic!("target did not complete: {:?}", run.target)
    };
    assert_eq!(done.tsih, 0x1234, "the target assigns the TSIH");
    assert_eq!(target.tsih, 0x1234);
    assert!(target.leading);
    // Both sides hold the same parameters, by the result functions.
    let (i, t) = (&done.parameters, &target.parameters);
    assert_eq!(i.header_digest, Digest::Crc32c);
    assert_eq!(t.header_digest, Digest::Crc32c);
    assert_eq!(i.data_digest, Digest::None);
    assert_eq!(i.max_burst_length, 262_144);
    assert_eq!(t.max_burst_length, 262_144);
    // InitialR2T is an OR: the initiator's No against the target's Yes.
    assert!(i.initial_r2t && t.initial_r2t);
    assert!(i.immediate_data && t.immediate_data);
    assert_eq!(t.max_send_data_segment_length, 262_144);
    assert_eq!(i.max_send_data_segment_length, 8192);
    assert_eq!(target.request.initiator_name, INITIATOR);
    // TargetPortalGroupTag in the first response (RFC 7143 13.9).
    assert!(text_has(
        &run.first_response_text,
        "TargetPortalGroupTag",
        "1"
    ));
    assert_eq!(
        i.peer_declarations
            .get("TargetPortalGroupTag")
            .map(String::as_str),
        Some("1")
    );
    // The window the final response opens.
    assert_eq!(done.exp_cmd_sn, CmdSn::new(7));
    assert_eq!(done.max_cmd_sn, CmdSn::new(7 + 63));
    assert!(run.exchanges <= 3, "{} exchanges", run.exchanges);
}

fn chap_requirement(mutual: bool) -> ChapRequirement {
    ChapRequirement {
        algorithms: ChapAlgorithm::ALL.to_vec(),
        initiator: Credentials::new("alice", "alice-secret-123"),
        mutual: mutual.then(|| Credentials::new("target0", "target-secret-456")),
    }
}

fn chap_initiator(secret: &str, mutual: bool) -> InitiatorLoginConfig {
    InitiatorLoginConfig {
        chap: Some(InitiatorChapSettings {
            algorithms: vec![ChapAlgorithm::Sha256, ChapAlgorithm::Md5],
            credentials: Credentials::new("alice", secret),
            target: mutual.then(|| Credentials::new("target0", "target-secret-456")),
        }),
        ..initiator_config()
    }
}

#[test]
fn chap_one_way_and_mutual_succeed() {
    for mutual in [false, true] {
        let policy = Policy {
            chap: Some(chap_requirement(mutual)),
            ..Policy::default()
        };
        let run = run(&policy, chap_initiator("alice-secret-123", mutual));
        assert!(
            run.initiator.is_ok(),
            "mutual={mutual}: {:?}",
            run.initiator.err()
        );
        assert!(matches!(run.target, LoginOutcome::Complete(_)));
    }
}

#[test]
fn a_wrong_chap_secret_is_an_authentication_failure() {
    let policy = Policy {
        chap: Some(chap_requirement(false)),
        ..Policy::default()
    };
    let run = run(&policy, chap_initiator("not-the-secret!!", false));
    assert_eq!(
        run.initiator.unwrap_err(),
        InitiatorLoginError::Refused(LoginStatus::AUTHENTICATION_FAILURE)
    );
    // The log names the user, never the secret.
    let LoginOutcome::Failed(refusal) = run.target else {
        panic!("the target did not refuse: {:?}", run.target)
    };
    assert_eq!(refusal.status, LoginStatus::AUTHENTICATION_FAILURE);
    assert_eq!(
        refusal.reason,
        RefusalReason::ChapSecretWrong {
            user: "alice".into()
        }
    );
    assert!(!format!("{refusal} {refusal:?}").contains("secret-123"));
}

#[test]
fn a_target_that_fails_mutual_chap_is_refused_by_the_initiator() {
    let mut requirement = chap_requirement(true);
    requirement.mutual = Some(Credentials::new("target0", "impostor-secret-9"));
    let policy = Policy {
        chap: Some(requirement),
        ..Policy::default()
    };
    let run = run(&policy, chap_initiator("alice-secret-123", true));
    assert!(matches!(run.initiator, Err(InitiatorLoginError::Chap(_))));
}

#[test]
fn a_target_requiring_chap_refuses_an_initiator_without_it() {
    let policy = Policy {
        chap: Some(chap_requirement(false)),
        ..Policy::default()
    };
    let run = run(&policy, initiator_config());
    assert_eq!(
        run.initiator.unwrap_err(),
        InitiatorLoginError::Refused(LoginStatus::AUTHENTICATION_FAILURE)
    );
}

#[test]
fn discovery_sessions_need_no_target_name() {
    let run = run(
        &Policy::default(),
        InitiatorLoginConfig {
            target_name: None,
            ..initiator_config()
        },
    );
    let done = run.initiator.expect("discovery login succeeds");
    assert_eq!(done.parameters.session_type, SessionType::Discovery);
}

#[test]
fn the_policy_refuses_unknown_targets_strangers_and_unknown_sessions() {
    let run1 = run(
        &Policy::default(),
        InitiatorLoginConfig {
            target_name: Some("iqn.2026-11.rs.iscsi:nope".into()),
            ..initiator_config()
        },
    );
    assert_eq!(
        run1.initiator.unwrap_err(),
        InitiatorLoginError::Refused(LoginStatus::NOT_FOUND)
    );
    assert_eq!(
        refusal_reason(&run1.target),
        RefusalReason::UnknownTarget {
            name: "iqn.2026-11.rs.iscsi:nope".into()
        }
    );
    let policy = Policy {
        allowed_initiator: Some("iqn.2026-11.rs.iscsi:someone-else"),
        ..Policy::default()
    };
    let run2 = run(&policy, initiator_config());
    assert_eq!(
        run2.initiator.unwrap_err(),
        InitiatorLoginError::Refused(LoginStatus::AUTHORIZATION_FAILURE)
    );
    assert_eq!(
        refusal_reason(&run2.target),
        RefusalReason::NotInAcl {
            initiator: INITIATOR.into(),
            target: TARGET.into()
        }
    );
    let run3 = run(
        &Policy::default(),
        InitiatorLoginConfig {
            tsih: 0x9999,
            ..initiator_config()
        },
    );
    assert_eq!(
        run3.initiator.unwrap_err(),
        InitiatorLoginError::Refused(LoginStatus::SESSION_DOES_NOT_EXIST)
    );
    assert_eq!(
        refusal_reason(&run3.target),
        RefusalReason::SessionDoesNotExist { tsih: 0x9999 }
    );
}

/// The reason of a refused login, checking it is one.
fn refusal_reason(outcome: &LoginOutcome) -> RefusalReason {
    match outcome {
        LoginOutcome::Failed(refusal) => refusal.reason.clone(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_long_text_travels_over_several_pdus() {
    // 300 private extension keys make a first request far beyond 8 KiB.
    let mut config = initiator_config();
    config.negotiation.extensions = (0..300)
        .map(|i| TextPair::new(format!("X-rs.iscsi.test.key{i:04}"), "a".repeat(40)))
        .collect();
    let run = run(&Policy::default(), config);
    assert!(run.initiator.is_ok(), "{:?}", run.initiator.err());
    assert!(run.exchanges > 3, "only {} exchanges", run.exchanges);
}

fn raw_request(current: LoginStage, next: LoginStage, transit: bool) -> LoginRequest {
    LoginRequest {
        transit,
        continue_flag: false,
        current_stage: current,
        next_stage: next,
        isid: Isid::from_bytes([0x80, 0, 0, 1, 0, 1]),
        initiator_task_tag: 1,
        cid: 1,
        ..LoginRequest::default()
    }
}

fn names() -> Vec<u8> {
    let mut text = Vec::new();
    iscsi_proto::text::codec::encode(
        &[
            TextPair::new("InitiatorName", INITIATOR),
            TextPair::new("TargetName", TARGET),
            TextPair::new("AuthMethod", "None"),
        ],
        &mut text,
    );
    text
}

fn target() -> TargetLogin {
    TargetLogin::new(StatSn::new(1), 1, vec![1; 32], history())
}

fn status_of(step: &iscsi_proto::login::target::LoginStep) -> LoginStatus {
    refusal_of(step).status
}

/// The refusal a step ended in; the response on the wire carries its
/// status.
fn refusal_of(step: &iscsi_proto::login::target::LoginStep) -> LoginRefusal {
    match &step.outcome {
        LoginOutcome::Failed(refusal) => {
            assert_eq!(step.response.status, refusal.status);
            refusal.clone()
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn malformed_logins_get_the_rfc_status() {
    use LoginStage::*;
    let policy = Policy::default();
    // Missing InitiatorName.
    let mut text = Vec::new();
    iscsi_proto::text::codec::encode(&[TextPair::new("TargetName", TARGET)], &mut text);
    let step = target().receive(
        &policy,
        &raw_request(SecurityNegotiation, LoginOperationalNegotiation, true),
        &text,
    );
    assert_eq!(status_of(&step), LoginStatus::MISSING_PARAMETER);
    // A version we do not speak.
    let mut request = raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
    request.version_min = 1;
    request.version_max = 2;
    assert_eq!(
        status_of(&target().receive(&policy, &request, &names())),
        LoginStatus::UNSUPPORTED_VERSION
    );
    // T and C together; a transit backwards; the reserved stage.
    let mut request = raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
    request.continue_flag = true;
    assert_eq!(
        status_of(&target().receive(&policy, &request, &names())),
        LoginStatus::INITIATOR_ERROR
    );
    let request = raw_request(LoginOperationalNegotiation, SecurityNegotiation, true);
    assert_eq!(
        status_of(&target().receive(&policy, &request, &names())),
        LoginStatus::INITIATOR_ERROR
    );
    let request = raw_request(LoginStage::from_u8(2), FullFeaturePhase, true);
    assert_eq!(
        status_of(&target().receive(&policy, &request, &names())),
        LoginStatus::INITIATOR_ERROR
    );
    // Garbage text.
    let request = raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
    assert_eq!(
        status_of(&target().receive(&policy, &request, b"no equals sign\0")),
        LoginStatus::INITIATOR_ERROR
    );
    // The ISID changes in the middle of a login.
    let mut t = target();
    let step = t.receive(
        &policy,
        &raw_request(SecurityNegotiation, LoginOperationalNegotiation, false),
        &names(),
    );
    assert!(matches!(step.outcome, LoginOutcome::Continue));
    let mut request = raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
    request.isid = Isid::from_bytes([0x80, 0, 0, 2, 0, 1]);
    assert_eq!(
        status_of(&t.receive(&policy, &request, b"")),
        LoginStatus::INITIATOR_ERROR
    );
    // Anything after the login ended.
    let request = raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
    assert_eq!(
        status_of(&t.receive(&policy, &request, b"")),
        LoginStatus::INVALID_DURING_LOGIN
    );
    // A non-login PDU during login.
    let mut t = target();
    assert_eq!(
        status_of(&t.invalid_request(
            &raw_request(SecurityNegotiation, SecurityNegotiation, false),
            iscsi_proto::pdu::Opcode::NopOut
        )),
        LoginStatus::INVALID_DURING_LOGIN
    );
}

#[test]
fn a_skipped_security_stage_is_refused_when_chap_is_required() {
    let policy = Policy {
        chap: Some(chap_requirement(false)),
        ..Policy::default()
    };
    let mut text = Vec::new();
    iscsi_proto::text::codec::encode(
        &[
            TextPair::new("InitiatorName", INITIATOR),
            TextPair::new("TargetName", TARGET),
        ],
        &mut text,
    );
    let request = raw_request(
        LoginStage::LoginOperationalNegotiation,
        LoginStage::FullFeaturePhase,
        true,
    );
    assert_eq!(
        status_of(&target().receive(&policy, &request, &text)),
        LoginStatus::AUTHENTICATION_FAILURE
    );
}

/// LIO ends a refused login with a Login Response whose header is cleared
/// but for the opcode, the status and the Initiator Task Tag: the ISID
/// comes back zero. The refusal is what the initiator must report, not
/// "a response for another login" (found against LIO in the Linux VM).
#[test]
fn a_refusal_with_a_cleared_isid_is_still_the_refusal() {
    let mut initiator = initiator_login(initiator_config());
    let (request, _) = first_request(&mut initiator);
    let refusal = LoginResponse {
        initiator_task_tag: request.initiator_task_tag,
        status: LoginStatus::AUTHENTICATION_FAILURE,
        ..LoginResponse::default()
    };
    assert_eq!(
        initiator
            .receive(&over_the_wire_response(&refusal, 0), &[])
            .err(),
        Some(InitiatorLoginError::Refused(
            LoginStatus::AUTHENTICATION_FAILURE
        ))
    );
    // A success with a foreign ISID is still not ours.
    let mut initiator = initiator_login(initiator_config());
    let (request, _) = first_request(&mut initiator);
    let foreign = LoginResponse {
        initiator_task_tag: request.initiator_task_tag,
        ..LoginResponse::default()
    };
    assert!(matches!(
        initiator.receive(&over_the_wire_response(&foreign, 0), &[]),
        Err(InitiatorLoginError::Protocol(_))
    ));
}

/// SessionType is leading-only (RFC 7143 13.21): a connection joining a
/// session (TSIH set) does not send it. LIO answers NotUnderstood there,
/// which made every MC/S join fail.
#[test]
fn a_connection_joining_a_session_sends_no_session_type() {
    let leading = run(&Policy::default(), initiator_config());
    assert!(leading.initiator.is_ok());
    let joining = InitiatorLoginConfig {
        tsih: 0x1234,
        cid: 2,
        ..initiator_config()
    };
    let (_, data) = first_request(&mut initiator_login(joining.clone()));
    assert!(!String::from_utf8_lossy(&data).contains("SessionType"));
    assert!(text_has(&data, "InitiatorName", INITIATOR));
    // And our target accepts such a join.
    let joined = run(&Policy::default(), joining);
    assert!(joined.initiator.is_ok(), "{:?}", joined.initiator.err());
}

/// A login text of these pairs.
fn text(pairs: &[(&str, &str)]) -> Vec<u8> {
    let pairs: Vec<TextPair> = pairs.iter().map(|(k, v)| TextPair::new(*k, *v)).collect();
    let mut text = Vec::new();
    iscsi_proto::text::codec::encode(&pairs, &mut text);
    text
}

/// Feeds `requests` to a fresh target under `policy`: every one but the
/// last must be answered, the last refused. The refusal, and the names the
/// target read.
fn refusal_after(
    policy: &Policy,
    requests: &[(LoginRequest, Vec<u8>)],
) -> (LoginRefusal, SentNames) {
    let mut target = target();
    let (last, earlier) = requests.split_last().expect("a request");
    for (request, data) in earlier {
        let step = target.receive(policy, request, data);
        assert!(
            matches!(step.outcome, LoginOutcome::Continue),
            "{:?}",
            step.outcome
        );
    }
    let refusal = refusal_of(&target.receive(policy, &last.0, &last.1));
    (refusal, target.sent_names().clone())
}

/// The first request of a CHAP login: names and AuthMethod=CHAP.
fn chap_opening() -> (LoginRequest, Vec<u8>) {
    use LoginStage::*;
    (
        raw_request(SecurityNegotiation, LoginOperationalNegotiation, false),
        text(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP"),
        ]),
    )
}

fn security(pairs: &[(&str, &str)]) -> (LoginRequest, Vec<u8>) {
    use LoginStage::*;
    (
        raw_request(SecurityNegotiation, LoginOperationalNegotiation, false),
        text(pairs),
    )
}

/// What a case of [`every_refusal_has_its_reason`] is: what it shows, the
/// policy, the requests, and the status and reason of the refusal.
type RefusalCase<'a> = (
    &'a str,
    &'a Policy,
    Vec<(LoginRequest, Vec<u8>)>,
    LoginStatus,
    RefusalReason,
);

/// Every way the target's machine refuses a login has its own reason, in
/// words, beside the unchanged status on the wire: the log can say which
/// of the many causes of 0x0200 or 0x0201 it was.
/// A refusal before the text is read (the version) still knows the names
/// the initiator sent, for the log; a refusal of a text without them says
/// so.
#[test]
fn the_names_sent_are_known_for_every_refusal() {
    use LoginStage::*;
    let mut request = raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
    request.version_min = 1;
    request.version_max = 2;
    let (refusal, names) = refusal_after(&Policy::default(), &[(request, names())]);
    assert_eq!(refusal.status, LoginStatus::UNSUPPORTED_VERSION);
    assert_eq!(
        refusal.reason,
        RefusalReason::UnsupportedVersion { min: 1, max: 2 }
    );
    assert_eq!(names.initiator_name.as_deref(), Some(INITIATOR));
    assert_eq!(names.target_name.as_deref(), Some(TARGET));

    let request = raw_request(SecurityNegotiation, LoginOperationalNegotiation, true);
    let (_, names) = refusal_after(
        &Policy::default(),
        &[(request, text(&[("TargetName", TARGET)]))],
    );
    assert_eq!(names.initiator_name, None);
    assert_eq!(names.target_name.as_deref(), Some(TARGET));
}

/// While the target's long answer continues, a request must be empty: one
/// with text is refused, and says so.
#[test]
fn text_while_our_answer_continues_is_refused_with_its_reason() {
    use LoginStage::*;
    let mut pairs = vec![
        ("InitiatorName".to_owned(), INITIATOR.to_owned()),
        ("TargetName".to_owned(), TARGET.to_owned()),
    ];
    // Unknown keys are each answered NotUnderstood: the answer to 300 of
    // them is longer than one login PDU carries.
    pairs.extend((0..300).map(|i| (format!("X-rs.iscsi.test.key{i:04}"), "a".repeat(20))));
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let first = (
        raw_request(LoginOperationalNegotiation, FullFeaturePhase, true),
        text(&pairs),
    );
    let mut target = target();
    let step = target.receive(&Policy::default(), &first.0, &first.1);
    assert!(step.response.continue_flag, "the answer fits one PDU");
    let again = raw_request(LoginOperationalNegotiation, FullFeaturePhase, false);
    let refusal = refusal_of(&target.receive(&Policy::default(), &again, b"Late=1\0"));
    assert_eq!(refusal.status, LoginStatus::INITIATOR_ERROR);
    assert_eq!(refusal.reason, RefusalReason::ExpectedEmptyRequest);
}

/// A PDU that is not a Login Request, during login, is named.
#[test]
fn a_pdu_other_than_a_login_request_is_named() {
    let mut target = target();
    let refusal = refusal_of(&target.invalid_request(
        &LoginRequest::default(),
        iscsi_proto::pdu::Opcode::ScsiCommand,
    ));
    assert_eq!(refusal.status, LoginStatus::INVALID_DURING_LOGIN);
    assert_eq!(
        refusal.to_string(),
        "a ScsiCommand PDU (opcode 0x01) during login (status 0x020b invalid request during login)"
    );
}
