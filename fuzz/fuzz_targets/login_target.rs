//! The target's login state machine fed arbitrary PDUs: each 48-byte
//! header goes through the real BHS decoder, followed by a data segment of
//! the length it names (bounded by what is left). No panic, every failure
//! is a class 2 or 3 status with a reason in words, and a completed login
//! has a non-zero TSIH.
#![no_main]

use std::sync::{Arc, Mutex};

use iscsi_proto::login::chap::{ChallengeHistory, ChapAlgorithm, Credentials};
use iscsi_proto::login::target::{
    ChapRequirement, LoginOutcome, LoginPolicy, LoginRefusal, SessionRequest, TargetLogin,
    TargetSettings,
};
use iscsi_proto::pdu::Pdu;
use iscsi_proto::serial::StatSn;
use iscsi_proto::text::NegotiationConfig;
use libfuzzer_sys::fuzz_target;

struct Policy {
    chap: bool,
}

impl LoginPolicy for Policy {
    fn settings(&self, request: &SessionRequest) -> Result<TargetSettings, LoginRefusal> {
        if request.tsih > 1 {
            return Err(LoginRefusal::session_does_not_exist(request.tsih));
        }
        Ok(TargetSettings {
            negotiation: NegotiationConfig::default(),
            chap: self.chap.then(|| ChapRequirement {
                algorithms: ChapAlgorithm::ALL.to_vec(),
                initiator: Credentials::new("i", "initiator-secret-1"),
                mutual: Some(Credentials::new("t", "target-secret-123")),
            }),
            tsih: 1,
            leading: request.tsih == 0,
            command_window: 32,
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let policy = Policy { chap: flags & 1 != 0 };
    let history = Arc::new(Mutex::new(ChallengeHistory::new(8)));
    let mut login = TargetLogin::new(StatSn::new(0), 1, vec![7; 32], history);
    while rest.len() >= 48 {
        let (header, tail) = rest.split_at(48);
        let bhs: &[u8; 48] = header.try_into().expect("48 bytes");
        let (pdu, lengths) = Pdu::decode_bhs(bhs);
        let len = (lengths.data_segment_length as usize).min(tail.len()).min(16 * 1024);
        let (segment, tail) = tail.split_at(len);
        rest = tail;
        let step = match pdu {
            Pdu::LoginRequest(request) => login.receive(&policy, &request, segment),
            _ => break,
        };
        assert!(step.data.len() <= 8192);
        match step.outcome {
            LoginOutcome::Continue => {}
            LoginOutcome::Failed(refusal) => {
                assert!(refusal.status.class >= 2);
                assert_eq!(step.response.status, refusal.status);
                // The reason is words for a log line, whatever the input.
                assert!(!refusal.reason.to_string().is_empty());
                break;
            }
            LoginOutcome::Complete(done) => {
                assert_ne!(done.tsih, 0);
                break;
            }
        }
    }
});
