//! Text Requests in full feature phase (RFC 7143 sections 11.10, 11.11):
//! SendTargets (section 13.3, Appendix C), negotiation of the keys that
//! may change after login, and long answers cut to the initiator's
//! MaxRecvDataSegmentLength and fetched part by part with a Target
//! Transfer Tag.
//!
//! ```text
//! initiator                         target
//!   Text Request  ITT=i TTT=ffffffff  ──▶  answer > limit: keep the rest
//!                                     ◀──  Text Response C=1 F=0 TTT=t (first part)
//!   Text Request  ITT=i TTT=t         ──▶
//!                                     ◀──  Text Response C=0 F=1 TTT=ffffffff (last part)
//! ```
//!
//! A new request (TTT = 0xffffffff) ends any unfinished answer; a TTT
//! that names no kept answer is refused.

use std::net::SocketAddr;

use iscsi_proto::pdu::{Lun, RESERVED_TAG, RejectReason, TextResponse};
use iscsi_proto::text::codec::{self, TextPair};
use iscsi_proto::text::{NegotiationConfig, Negotiator, Role, Stage};

use crate::tags::TransferTags;

/// The text exchanges of one connection: the part of a long answer not
/// yet fetched.
#[derive(Debug, Default)]
pub struct TextExchange {
    continuation: Option<Continuation>,
}

#[derive(Debug)]
struct Continuation {
    itt: u32,
    ttt: u32,
    rest: Vec<u8>,
}

/// What a Text Request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum TextAsk {
    /// A new request: these key=value pairs, to be answered with
    /// [`answer`].
    New(Vec<TextPair>),
    /// The next part of a long answer: send it with
    /// [`TextExchange::reply`].
    Rest(Vec<u8>),
}

/// One Text Response and its data segment.
#[derive(Debug, PartialEq, Eq)]
pub struct TextReply {
    /// The header (the writer stamps StatSN and the window).
    pub response: TextResponse,
    /// The key=value text it carries.
    pub data: Vec<u8>,
}

impl TextExchange {
    /// Reads a Text Request: its tags and data segment.
    pub fn receive(&mut self, itt: u32, ttt: u32, data: &[u8]) -> Result<TextAsk, RejectReason> {
        if ttt != RESERVED_TAG {
            return match self.continuation.take() {
                Some(kept) if kept.itt == itt && kept.ttt == ttt => Ok(TextAsk::Rest(kept.rest)),
                _ => Err(RejectReason::InvalidPduField),
            };
        }
        self.continuation = None;
        codec::parse(data)
            .map(TextAsk::New)
            .map_err(|_| RejectReason::ProtocolError)
    }

    /// The response carrying as much of `text` as `limit` (the initiator's
    /// MaxRecvDataSegmentLength) allows; the rest is kept under a new
    /// Target Transfer Tag for the initiator to fetch.
    pub fn reply(
        &mut self,
        itt: u32,
        mut text: Vec<u8>,
        limit: u32,
        tags: &mut TransferTags,
    ) -> TextReply {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let (final_flag, continue_flag, ttt) = if text.len() > limit {
            let rest = text.split_off(limit);
            let ttt = tags.take();
            self.continuation = Some(Continuation { itt, ttt, rest });
            (false, true, ttt)
        } else {
            (true, false, RESERVED_TAG)
        };
        TextReply {
            response: TextResponse {
                final_flag,
                continue_flag,
                lun: Lun(0),
                initiator_task_tag: itt,
                target_transfer_tag: ttt,
                ..TextResponse::default()
            },
            data: text,
        }
    }
}

/// The answer to a new request's pairs, encoded: SendTargets answered by
/// `send_targets`, every other key negotiated as full feature phase allows
/// under `negotiation`.
pub fn answer(
    pairs: Vec<TextPair>,
    send_targets: impl Fn(&str) -> Vec<TextPair>,
    negotiation: &NegotiationConfig,
) -> Result<Vec<u8>, RejectReason> {
    let mut answers = Vec::new();
    let mut rest = Vec::new();
    for pair in pairs {
        if pair.key == "SendTargets" {
            answers.extend(send_targets(&pair.value));
        } else {
            rest.push(pair);
        }
    }
    if !rest.is_empty() {
        let mut negotiator = Negotiator::new(Role::Target, negotiation.clone(), true);
        let more = negotiator
            .receive(&rest, Stage::FullFeature)
            .map_err(|_| RejectReason::ProtocolError)?;
        answers.extend(more);
    }
    let mut text = Vec::new();
    codec::encode(&answers, &mut text);
    Ok(text)
}

/// Who asks SendTargets, and where.
#[derive(Clone, Copy, Debug)]
pub struct Asker<'a> {
    /// A discovery session (else a normal session of `target`).
    pub discovery: bool,
    /// The normal session's target.
    pub target: Option<&'a str>,
    /// The portal address the connection reached.
    pub portal: SocketAddr,
    /// The portal group tag.
    pub portal_group_tag: u16,
}

/// The SendTargets answer (RFC 7143 Appendix C) for `value`: "All" lists
/// every target to a discovery session, "" this session's target, a name
/// that target; each with the address the connection reached.
pub fn send_targets<'t>(
    value: &str,
    asker: Asker<'_>,
    targets: impl IntoIterator<Item = &'t str>,
) -> Vec<TextPair> {
    let address = match asker.portal {
        SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
    };
    let mut answers = Vec::new();
    for target in targets {
        let wanted = match value {
            "All" => asker.discovery,
            "" => !asker.discovery && asker.target == Some(target),
            name => name == target,
        };
        if wanted {
            answers.push(TextPair::new("TargetName", target.to_owned()));
            answers.push(TextPair::new(
                "TargetAddress",
                format!("{address},{}", asker.portal_group_tag),
            ));
        }
    }
    answers
}

#[cfg(test)]
mod tests;
