//! Every refused login logs one line that says who, where, to what and
//! why: `iscsi --log-format json target` is driven into each refusal, by
//! `iscsi inquiry` where our initiator can ask for it (an unknown target,
//! an initiator outside the ACL, a wrong CHAP secret) and by Login PDUs
//! built by hand where it cannot (a CHAP algorithm the target does not
//! accept, no InitiatorName, bad key values). Each JSON line must name the
//! initiator, its address, the portal, the target asked for, the status and
//! the reason in words, and no secret. The text format keeps the same
//! fields, and a login that never finishes is logged with its peer.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use iscsi_proto::pdu::login::{Isid, LoginRequest, LoginResponse, LoginStage};
use iscsi_proto::pdu::{Digests, Header, Pdu, encode_pdu_to_vec, padding_len};
use iscsi_proto::text::TextPair;
use iscsi_test_peers::{Peer, free_port};
use serde_json::Value;

const ACL_TARGET: &str = "iqn.2026-11.rs.iscsi:refusals-acl";
const CHAP_TARGET: &str = "iqn.2026-11.rs.iscsi:refusals-chap";
const FRIEND: &str = "iqn.2026-11.rs.iscsi:friend";
const SECRET: &str = "alice-secret-123";
const WRONG_SECRET: &str = "not-the-secret-9";

/// `iscsi --log-format FORMAT target` on a free port with two targets: one
/// with an ACL that lists only [`FRIEND`], one requiring CHAP for alice.
fn refusing_target(format: &str) -> Peer {
    let port = free_port();
    let dir = std::env::temp_dir();
    let config = dir.join(format!("login-refusals-{}-{port}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            r#"listen = ["127.0.0.1:{port}"]
[[target]]
name = "{ACL_TARGET}"
luns = ["ram:1M"]
allowed_initiators = ["{FRIEND}"]
[[target]]
name = "{CHAP_TARGET}"
luns = ["ram:1M"]
chap = {{ user = "alice", secret = "{SECRET}" }}
"#
        ),
    )
    .expect("the configuration file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["--log-format", format, "target", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn");
    let mut peer = Peer::spawn(command, port);
    peer.owns_file(config.to_string_lossy().into_owned());
    peer
}

/// `iscsi inquiry` of `url` as `initiator`, which the target refuses.
fn refused_inquiry(url: &str, initiator: &str) {
    let output = common::iscsi(&["inquiry", url, "--initiator-name", initiator]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{url}: {stderr}");
    assert!(stderr.contains("refused"), "{url}: {stderr}");
}

/// A connection speaking Login PDUs built by hand.
struct RawLogin {
    stream: TcpStream,
    tag: u32,
}

impl RawLogin {
    fn connect(port: u16) -> RawLogin {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        RawLogin { stream, tag: 1 }
    }

    /// Our address: the `peer` the target logs.
    fn address(&self) -> SocketAddr {
        self.stream.local_addr().expect("local address")
    }

    /// Sends a Login Request (CSG `current`, NSG `next`, T as `transit`)
    /// with `pairs`; the response.
    fn send(
        &mut self,
        current: LoginStage,
        next: LoginStage,
        transit: bool,
        pairs: &[(&str, &str)],
    ) -> LoginResponse {
        let pairs: Vec<TextPair> = pairs.iter().map(|(k, v)| TextPair::new(*k, *v)).collect();
        let mut data = Vec::new();
        iscsi_proto::text::codec::encode(&pairs, &mut data);
        let request = LoginRequest {
            transit,
            current_stage: current,
            next_stage: next,
            isid: Isid::from_bytes([0x80, 0x12, 0x34, 0x56, 0x00, 0x01]),
            initiator_task_tag: self.tag,
            cid: 1,
            ..LoginRequest::default()
        };
        self.tag += 1;
        let header = Header::new(Pdu::LoginRequest(request), data.len() as u32);
        let wire = encode_pdu_to_vec(&header, &data, Digests::default()).expect("encode");
        self.stream.write_all(&wire).expect("send");
        let mut bhs = [0u8; 48];
        self.stream.read_exact(&mut bhs).expect("a Login Response");
        let (pdu, lengths) = Pdu::decode_bhs(&bhs);
        let len = lengths.data_segment_length as usize;
        let mut segment = vec![0; len + padding_len(len)];
        self.stream.read_exact(&mut segment).expect("its data");
        match pdu {
            Pdu::LoginResponse(response) => response,
            other => panic!("a {:?} instead of a Login Response", other.opcode()),
        }
    }

    /// Sends the one request of a login that must be refused with `status`
    /// (class, detail).
    fn refused(&mut self, stage: LoginStage, pairs: &[(&str, &str)], status: (u8, u8)) {
        let next = match stage {
            LoginStage::SecurityNegotiation => LoginStage::LoginOperationalNegotiation,
            _ => LoginStage::FullFeaturePhase,
        };
        let response = self.send(stage, next, true, pairs);
        assert_eq!(
            (response.status.class, response.status.detail),
            status,
            "{pairs:?}"
        );
    }
}

/// The log's JSON lines, until `count` "login refused" lines are there.
fn refusal_lines(peer: &Peer, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = peer.log_so_far();
        let lines: Vec<Value> = log
            .lines()
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
            })
            .filter(|line: &Value| line["fields"]["message"] == "login refused")
            .collect();
        if lines.len() >= count || Instant::now() > deadline {
            assert_eq!(lines.len(), count, "{log}");
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One expected line: its initiator, target, status and reason.
struct Expected {
    case: &'static str,
    initiator: &'static str,
    /// The peer address, where the test knows it (hand-made logins).
    peer: Option<SocketAddr>,
    target: &'static str,
    status: &'static str,
    reason: String,
}

#[test]
fn every_refusal_reason_is_logged_with_who_where_and_why() {
    let peer = refusing_target("json");
    let port = peer.port;
    let url = |credentials: &str, target: &str| {
        format!("iscsi://{credentials}127.0.0.1:{port}/{target}/0")
    };
    let mut expected = Vec::new();

    // Through our initiator.
    let lost = "iqn.2026-11.rs.iscsi:lost";
    refused_inquiry(&url("", "iqn.2026-11.rs.iscsi:nope"), lost);
    expected.push(Expected {
        case: "unknown target",
        initiator: lost,
        peer: None,
        target: "iqn.2026-11.rs.iscsi:nope",
        status: "0x0203",
        reason: "unknown target \"iqn.2026-11.rs.iscsi:nope\"".into(),
    });
    let stranger = "iqn.2026-11.rs.iscsi:stranger";
    refused_inquiry(&url("", ACL_TARGET), stranger);
    expected.push(Expected {
        case: "not in the ACL",
        initiator: stranger,
        peer: None,
        target: ACL_TARGET,
        status: "0x0202",
        reason: format!("initiator \"{stranger}\" is not in the ACL of target \"{ACL_TARGET}\""),
    });
    let forgetful = "iqn.2026-11.rs.iscsi:forgetful";
    refused_inquiry(
        &url(&format!("alice%{WRONG_SECRET}@"), CHAP_TARGET),
        forgetful,
    );
    expected.push(Expected {
        case: "wrong CHAP secret",
        initiator: forgetful,
        peer: None,
        target: CHAP_TARGET,
        status: "0x0201",
        reason: "CHAP response wrong for user \"alice\"".into(),
    });
    let impostor = "iqn.2026-11.rs.iscsi:impostor";
    refused_inquiry(&url(&format!("bob%{WRONG_SECRET}@"), CHAP_TARGET), impostor);
    expected.push(Expected {
        case: "unknown CHAP user",
        initiator: impostor,
        peer: None,
        target: CHAP_TARGET,
        status: "0x0201",
        reason: "CHAP user \"bob\" is not the one the target accepts".into(),
    });

    // By hand: what our initiator never sends.
    use LoginStage::{LoginOperationalNegotiation as Operational, SecurityNegotiation as Security};
    let exotic = "iqn.2026-11.rs.iscsi:exotic";
    let mut login = RawLogin::connect(port);
    let response = login.send(
        Security,
        Operational,
        false,
        &[
            ("InitiatorName", exotic),
            ("TargetName", CHAP_TARGET),
            ("AuthMethod", "CHAP"),
        ],
    );
    assert_eq!(response.status.class, 0, "AuthMethod=CHAP is accepted");
    let response = login.send(Security, Operational, false, &[("CHAP_A", "9,128")]);
    assert_eq!((response.status.class, response.status.detail), (2, 1));
    expected.push(Expected {
        case: "CHAP algorithm unsupported",
        initiator: exotic,
        peer: Some(login.address()),
        target: CHAP_TARGET,
        status: "0x0201",
        reason: "no CHAP algorithm the target accepts in CHAP_A=\"9,128\"".into(),
    });

    let mut login = RawLogin::connect(port);
    login.refused(Security, &[("TargetName", ACL_TARGET)], (2, 7));
    expected.push(Expected {
        case: "no InitiatorName",
        initiator: "(not sent)",
        peer: Some(login.address()),
        target: ACL_TARGET,
        status: "0x0207",
        reason: "missing key InitiatorName".into(),
    });

    let odd = "iqn.2026-11.rs.iscsi:odd";
    let mut login = RawLogin::connect(port);
    login.refused(
        Security,
        &[
            ("InitiatorName", odd),
            ("TargetName", ACL_TARGET),
            ("SessionType", "Bogus"),
        ],
        (2, 9),
    );
    expected.push(Expected {
        case: "bad SessionType",
        initiator: odd,
        peer: Some(login.address()),
        target: ACL_TARGET,
        status: "0x0209",
        reason: "bad value \"Bogus\" for key SessionType: neither Normal nor Discovery".into(),
    });

    let browser = "iqn.2026-11.rs.iscsi:browser";
    let mut login = RawLogin::connect(port);
    login.refused(
        Operational,
        &[
            ("InitiatorName", browser),
            ("SessionType", "Discovery"),
            ("MaxRecvDataSegmentLength", "lots"),
        ],
        (2, 0),
    );
    expected.push(Expected {
        case: "bad declaration in a discovery login",
        initiator: browser,
        peer: Some(login.address()),
        target: "(discovery)",
        status: "0x0200",
        reason: "bad value \"lots\" for key MaxRecvDataSegmentLength: \
                 not a valid value for this declaration"
            .into(),
    });

    let lines = refusal_lines(&peer, expected.len());
    let portal = format!("127.0.0.1:{port}");
    // Every case is checked and every mismatch reported, not just the first.
    let mut wrong = Vec::new();
    for want in &expected {
        let matching: Vec<&Value> = lines
            .iter()
            .filter(|line| {
                let fields = &line["fields"];
                // The peer address is known for hand-made logins; our
                // initiator's is not, its name tells its line.
                match want.peer {
                    Some(peer) => fields["peer"] == peer.to_string(),
                    None => fields["initiator"] == want.initiator,
                }
            })
            .collect();
        let [line] = matching[..] else {
            wrong.push(format!("{}: {} lines", want.case, matching.len()));
            continue;
        };
        let fields = &line["fields"];
        let peer_ok = fields["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:"));
        for (field, ok) in [
            ("level", line["level"] == "WARN"),
            ("initiator", fields["initiator"] == want.initiator),
            ("peer", peer_ok),
            ("portal", fields["portal"] == portal.as_str()),
            ("target", fields["target"] == want.target),
            ("status", fields["status"] == want.status),
            ("reason", fields["reason"] == want.reason.as_str()),
        ] {
            if !ok {
                wrong.push(format!("{}: {field} wrong in {line}", want.case));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let log = peer.log_so_far();
    assert!(
        !log.contains(SECRET) && !log.contains(WRONG_SECRET),
        "{log}"
    );
}

/// The default text format says the same, as `key=value` on one line.
#[test]
fn the_text_format_names_the_same_fields() {
    let peer = refusing_target("text");
    let mut login = RawLogin::connect(peer.port);
    login.refused(
        LoginStage::SecurityNegotiation,
        &[
            ("InitiatorName", "iqn.2026-11.rs.iscsi:lost"),
            ("TargetName", "iqn.2026-11.rs.iscsi:nope"),
        ],
        (2, 3),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let log = peer.log_so_far();
        if let Some(line) = log.lines().find(|l| l.contains("login refused")) {
            break line.to_owned();
        }
        assert!(Instant::now() < deadline, "no refusal logged: {log}");
        std::thread::sleep(Duration::from_millis(50));
    };
    for field in [
        " WARN ".to_owned(),
        "initiator=iqn.2026-11.rs.iscsi:lost".to_owned(),
        format!("peer={}", login.address()),
        format!("portal=127.0.0.1:{}", peer.port),
        "target=iqn.2026-11.rs.iscsi:nope".to_owned(),
        "status=0x0203".to_owned(),
        "reason=unknown target \"iqn.2026-11.rs.iscsi:nope\"".to_owned(),
    ] {
        assert!(line.contains(&field), "{field} missing: {line}");
    }
}

/// A connection that never finishes its login is closed after the login
/// timeout (15 s), and the line says whose it was.
#[test]
fn a_login_timeout_names_the_peer_and_portal() {
    let peer = refusing_target("json");
    let silent = RawLogin::connect(peer.port);
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        let log = peer.log_so_far();
        if let Some(line) = log.lines().find(|l| l.contains("login timed out")) {
            break serde_json::from_str::<Value>(line).expect("JSON");
        }
        assert!(Instant::now() < deadline, "no timeout logged: {log}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let fields = &line["fields"];
    assert_eq!(line["level"], "WARN");
    assert_eq!(fields["peer"], silent.address().to_string());
    assert_eq!(fields["portal"], format!("127.0.0.1:{}", peer.port));
}
