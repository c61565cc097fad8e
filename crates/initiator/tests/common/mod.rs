//! Test support shared by the fake targets of this crate's tests: a login
//! that accepts whatever the initiator offers.

use iscsi_datamover::tcp::TcpDatamover;
use iscsi_datamover::{DatamoverError, PduSender};
use iscsi_proto::pdu::login::{LoginRequest, LoginResponse, LoginStage, LoginStatus};
use iscsi_proto::pdu::{Header, Pdu};
use iscsi_proto::serial::StatSn;
use iscsi_proto::text::codec;

/// Answers one Login Request by echoing the initiator's offers (AuthMethod
/// None in the security stage), with a command window of `window` CmdSNs;
/// `overrides` replace the echoed value of a key (a target's declaration
/// such as its own MaxRecvDataSegmentLength).
pub async fn answer_login(
    dm: &mut TcpDatamover,
    request: &LoginRequest,
    data: &[u8],
    stat_sn: &mut StatSn,
    window: u32,
    overrides: &[(&str, &str)],
) -> Result<(), DatamoverError> {
    let pairs = codec::parse(data).unwrap_or_default();
    let mut answers: Vec<_> = pairs
        .into_iter()
        .filter(|p| {
            !matches!(
                p.key.as_str(),
                "InitiatorName" | "TargetName" | "SessionType" | "InitiatorAlias"
            )
        })
        .collect();
    if request.current_stage == LoginStage::SecurityNegotiation {
        answers.retain(|p| p.key == "AuthMethod");
        for p in &mut answers {
            p.value = "None".into();
        }
    }
    for p in &mut answers {
        if let Some((_, value)) = overrides.iter().find(|(key, _)| *key == p.key) {
            p.value = (*value).into();
        }
    }
    let mut text = Vec::new();
    codec::encode(&answers, &mut text);
    let response = LoginResponse {
        transit: request.transit,
        continue_flag: false,
        current_stage: request.current_stage,
        next_stage: request.next_stage,
        version_max: 0,
        version_active: 0,
        isid: request.isid,
        tsih: 7,
        initiator_task_tag: request.initiator_task_tag,
        stat_sn: *stat_sn,
        exp_cmd_sn: request.cmd_sn,
        max_cmd_sn: request.cmd_sn.wrapping_add(window - 1),
        status: LoginStatus::SUCCESS,
    };
    *stat_sn = stat_sn.next();
    let header = Header::new(Pdu::LoginResponse(response), text.len() as u32);
    dm.sender.send_control(&header, &text).await
}
