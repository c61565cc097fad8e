//! Discovery (RFC 7143 section 4.3 and Appendix C): a discovery session
//! logs in without a TargetName, asks `SendTargets=All` in a Text Request
//! (section 11.10) and collects the answer, which may span several Text
//! Responses: while a response has the C bit (or no F bit) set, an empty
//! Text Request with the response's Target Transfer Tag asks for the rest
//! (section 11.10.2, 11.11.2). Then it logs out.

use iscsi_datamover::{Datamover, PduReceiver, PduSender};
use iscsi_proto::pdu::login::Isid;
use iscsi_proto::pdu::{Header, LogoutReason, LogoutRequest, Lun, Pdu, RESERVED_TAG, TextRequest};
use iscsi_proto::serial::{CmdSn, StatSn};
use iscsi_proto::text::codec::{self, TextAssembler};

use crate::config::SessionConfig;
use crate::error::Error;
use crate::login::{LoginRequestParams, login, random_isid};
use crate::url::{format_portal, parse_portal};

/// The longest SendTargets answer accepted: room for thousands of
/// targets and portals, and still a bound on what a target can make us
/// hold.
const MAX_SEND_TARGETS_TEXT: usize = 4 << 20;

/// One target a portal reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredTarget {
    /// The target's iSCSI name.
    pub name: String,
    /// Its portals as `host:port` with their portal group tag, if given.
    pub addresses: Vec<TargetAddress>,
}

/// One TargetAddress value (RFC 7143 section 13.9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetAddress {
    /// `host:port` (IPv6 in brackets).
    pub portal: String,
    /// The portal group tag, if given.
    pub portal_group_tag: Option<u16>,
}

/// Parses a `SendTargets` answer: `TargetName=` starts a target, each
/// following `TargetAddress=` belongs to it.
pub fn parse_send_targets(text: &[u8]) -> Result<Vec<DiscoveredTarget>, Error> {
    let pairs = codec::parse(text).map_err(|e| Error::Protocol(format!("SendTargets: {e}")))?;
    let mut targets: Vec<DiscoveredTarget> = Vec::new();
    for pair in pairs {
        match pair.key.as_str() {
            "TargetName" => targets.push(DiscoveredTarget {
                name: pair.value,
                addresses: Vec::new(),
            }),
            "TargetAddress" => {
                let target = targets.last_mut().ok_or_else(|| {
                    Error::Protocol("TargetAddress before any TargetName".to_owned())
                })?;
                let (address, tag) = match pair.value.rsplit_once(',') {
                    Some((address, tag)) => (address, tag.parse().ok()),
                    None => (pair.value.as_str(), None),
                };
                let portal = parse_portal(address)
                    .map(|(host, port)| format_portal(&host, port))
                    .unwrap_or_else(|| address.to_owned());
                target.addresses.push(TargetAddress {
                    portal,
                    portal_group_tag: tag,
                });
            }
            _ => {}
        }
    }
    Ok(targets)
}

/// Asks the portal `host:port` which targets it serves (iSCSI over TCP).
pub async fn discover(
    portal: &str,
    config: &SessionConfig,
) -> Result<Vec<DiscoveredTarget>, Error> {
    discover_on(portal, false, config).await
}

/// Asks the portal of `url` which targets it serves, over the URL's
/// transport (`iscsi://` or `iser://`); the URL's target and LUN, if any,
/// are not used.
pub async fn discover_url(
    url: &crate::url::IscsiUrl,
    config: &SessionConfig,
) -> Result<Vec<DiscoveredTarget>, Error> {
    discover_on(&url.portal(), url.iser, config).await
}

async fn discover_on(
    portal: &str,
    iser: bool,
    config: &SessionConfig,
) -> Result<Vec<DiscoveredTarget>, Error> {
    let logged_in = login(
        config,
        LoginRequestParams {
            portal: portal.to_owned(),
            target_name: None,
            isid: Isid::from_bytes(config.isid.unwrap_or_else(random_isid)),
            tsih: 0,
            cid: 0,
            cmd_sn: CmdSn::new(1),
            initiator_task_tag: 0,
            tap: config.tap.clone(),
            iser,
        },
    )
    .await?;
    let mut datamover = logged_in.datamover;
    let timeout = config.timeouts.management;
    let work = async {
        let mut cmd_sn = logged_in.complete.exp_cmd_sn;
        let mut exp_stat_sn = logged_in.complete.exp_stat_sn;
        let text = send_targets(&mut datamover, &mut cmd_sn, &mut exp_stat_sn).await?;
        let targets = parse_send_targets(&text)?;
        let logout = Header::new(
            Pdu::LogoutRequest(LogoutRequest {
                immediate: true,
                reason: LogoutReason::CloseSession,
                initiator_task_tag: 2,
                cid: 0,
                cmd_sn,
                exp_stat_sn,
            }),
            0,
        );
        datamover.sender.send_control(&logout, &[]).await?;
        // The answer is a courtesy: the targets are known already.
        let _ = datamover.receiver.receive().await;
        let _ = datamover.sender.terminate().await;
        Ok(targets)
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| Error::Timeout {
            timeout,
            waiting_for: "the SendTargets answer",
        })?
}

async fn send_targets(
    datamover: &mut Datamover,
    cmd_sn: &mut CmdSn,
    exp_stat_sn: &mut StatSn,
) -> Result<Vec<u8>, Error> {
    const ITT: u32 = 1;
    let mut all = Vec::new();
    let mut assembler = TextAssembler::new(MAX_SEND_TARGETS_TEXT);
    let mut request_data = b"SendTargets=All\0".to_vec();
    let mut target_transfer_tag = RESERVED_TAG;
    loop {
        let request = Header::new(
            Pdu::TextRequest(TextRequest {
                immediate: false,
                final_flag: true,
                continue_flag: false,
                lun: Lun(0),
                initiator_task_tag: ITT,
                target_transfer_tag,
                cmd_sn: *cmd_sn,
                exp_stat_sn: *exp_stat_sn,
            }),
            request_data.len() as u32,
        );
        datamover
            .sender
            .send_control(&request, &request_data)
            .await?;
        // Text Requests are not immediate: each takes a CmdSN.
        *cmd_sn = cmd_sn.next();
        request_data.clear();
        let received = loop {
            let received = datamover
                .receiver
                .receive()
                .await?
                .ok_or(Error::ConnectionLost)?;
            match &received.header.pdu {
                Pdu::NopIn(_) | Pdu::AsyncMessage(_) => continue,
                _ => break received,
            }
        };
        let Pdu::TextResponse(response) = &received.header.pdu else {
            return Err(Error::Protocol(format!(
                "{:?} answering SendTargets",
                received.header.pdu.opcode()
            )));
        };
        if response.initiator_task_tag != ITT {
            return Err(Error::Protocol("Text Response for another task".to_owned()));
        }
        if response.final_flag && response.continue_flag {
            return Err(Error::Protocol(
                "Text Response with both F and C".to_owned(),
            ));
        }
        *exp_stat_sn = response.stat_sn.next();
        let whole = assembler
            .push(&received.data, response.continue_flag)
            .map_err(|e| Error::Protocol(format!("SendTargets: {e}")))?;
        if let Some(text) = whole {
            all.extend_from_slice(&text);
            if response.final_flag {
                return Ok(all);
            }
        }
        // C bit (the text continues) or no F bit (the target has more):
        // an empty request with its Target Transfer Tag asks for the rest.
        target_transfer_tag = response.target_transfer_tag;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_targets_answer() {
        let text = b"TargetName=iqn.a:one\0TargetAddress=10.0.0.1:3260,1\0TargetAddress=[fe80::1]:3261,2\0TargetName=iqn.a:two\0";
        let targets = parse_send_targets(text).unwrap();
        assert_eq!(targets.len(), 2);
        assert_eq!(targets[0].name, "iqn.a:one");
        assert_eq!(targets[0].addresses[1].portal, "[fe80::1]:3261");
        assert_eq!(targets[0].addresses[1].portal_group_tag, Some(2));
        assert!(targets[1].addresses.is_empty());
        assert!(parse_send_targets(b"TargetAddress=1.2.3.4\0").is_err());
    }
}
