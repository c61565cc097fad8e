//! The initiator's login state machine fed arbitrary Login Responses after
//! its first request: no panic, and it never completes on a response that
//! did not echo its ISID and tag.
#![no_main]

use std::sync::{Arc, Mutex};

use iscsi_proto::login::chap::{ChallengeHistory, ChapAlgorithm, Credentials};
use iscsi_proto::login::initiator::{
    InitiatorChapSettings, InitiatorLogin, InitiatorLoginConfig, InitiatorStep,
};
use iscsi_proto::pdu::Pdu;
use iscsi_proto::pdu::login::Isid;
use iscsi_proto::serial::CmdSn;
use iscsi_proto::text::NegotiationConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let isid = Isid::from_bytes([0x80, 1, 2, 3, 4, 5]);
    let config = InitiatorLoginConfig {
        initiator_name: "iqn.2026-11.rs.iscsi:fuzz".into(),
        target_name: (flags & 1 != 0).then(|| "iqn.2026-11.rs.iscsi:t".into()),
        isid,
        tsih: 0,
        cid: 0,
        negotiation: NegotiationConfig::default(),
        chap: (flags & 2 != 0).then(|| InitiatorChapSettings {
            algorithms: ChapAlgorithm::ALL.to_vec(),
            credentials: Credentials::new("i", "initiator-secret-1"),
            target: (flags & 4 != 0).then(|| Credentials::new("t", "target-secret-123")),
        }),
    };
    let history = Arc::new(Mutex::new(ChallengeHistory::new(8)));
    let Ok(mut login) = InitiatorLogin::new(config, 1, CmdSn::new(0), (2, vec![9; 32]), history)
    else {
        return;
    };
    let _ = login.start();
    while rest.len() >= 48 {
        let (header, tail) = rest.split_at(48);
        let bhs: &[u8; 48] = header.try_into().expect("48 bytes");
        let (pdu, lengths) = Pdu::decode_bhs(bhs);
        let len = (lengths.data_segment_length as usize).min(tail.len()).min(16 * 1024);
        let (segment, tail) = tail.split_at(len);
        rest = tail;
        let Pdu::LoginResponse(response) = pdu else {
            break;
        };
        match login.receive(&response, segment) {
            Ok(InitiatorStep::Send { data, .. }) => assert!(data.len() <= 8192),
            Ok(InitiatorStep::Complete(_)) => {
                assert_eq!(response.isid, isid);
                assert_eq!(response.initiator_task_tag, 1);
                break;
            }
            Err(_) => break,
        }
    }
});
