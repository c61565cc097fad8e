//! Text exchanges: long answers in parts, SendTargets per session type.

use iscsi_proto::pdu::{RESERVED_TAG as NONE, RejectReason};
use iscsi_proto::text::NegotiationConfig;
use iscsi_proto::text::codec::{self, TextPair};

use super::{Asker, TextAsk, TextExchange, answer, send_targets};
use crate::tags::TransferTags;

#[test]
fn a_long_answer_goes_in_parts_fetched_by_its_tag() {
    let (mut exchange, mut tags) = (TextExchange::default(), TransferTags::default());
    let first = exchange.reply(7, b"abcdefghij".to_vec(), 4, &mut tags);
    assert_eq!(first.data, b"abcd");
    assert!(first.response.continue_flag && !first.response.final_flag);
    let ttt = first.response.target_transfer_tag;
    assert_ne!(ttt, NONE);

    let Ok(TextAsk::Rest(rest)) = exchange.receive(7, ttt, b"") else {
        panic!("the rest was not kept");
    };
    let second = exchange.reply(7, rest, 4, &mut tags);
    assert_eq!(second.data, b"efgh");
    let ttt2 = second.response.target_transfer_tag;
    assert_ne!(ttt2, ttt, "each part has a tag of its own");
    let Ok(TextAsk::Rest(rest)) = exchange.receive(7, ttt2, b"") else {
        panic!("the last part was not kept");
    };
    let last = exchange.reply(7, rest, 4, &mut tags);
    assert_eq!(last.data, b"ij");
    assert!(last.response.final_flag && !last.response.continue_flag);
    assert_eq!(last.response.target_transfer_tag, NONE);
}

#[test]
fn a_tag_that_names_nothing_kept_is_refused_and_a_new_request_forgets() {
    let (mut exchange, mut tags) = (TextExchange::default(), TransferTags::default());
    assert_eq!(
        exchange.receive(1, 5, b""),
        Err(RejectReason::InvalidPduField)
    );
    let ttt = exchange
        .reply(1, vec![b'x'; 10], 4, &mut tags)
        .response
        .target_transfer_tag;
    // Another task's tag, or the right tag from another ITT: refused.
    assert_eq!(
        exchange.receive(2, ttt, b""),
        Err(RejectReason::InvalidPduField)
    );
    let ttt = exchange
        .reply(1, vec![b'x'; 10], 4, &mut tags)
        .response
        .target_transfer_tag;
    assert!(matches!(
        exchange.receive(3, NONE, b""),
        Ok(TextAsk::New(_))
    ));
    assert_eq!(
        exchange.receive(1, ttt, b""),
        Err(RejectReason::InvalidPduField)
    );
}

#[test]
fn text_that_does_not_parse_is_a_protocol_error() {
    let mut exchange = TextExchange::default();
    assert_eq!(
        exchange.receive(1, NONE, b"NoEqualsSign\0"),
        Err(RejectReason::ProtocolError)
    );
}

fn names(pairs: &[TextPair]) -> Vec<&str> {
    pairs
        .iter()
        .filter(|p| p.key == "TargetName")
        .map(|p| p.value.as_str())
        .collect()
}

#[test]
fn send_targets_lists_what_each_session_may_see() {
    let targets = ["iqn.a", "iqn.b"];
    let discovery = Asker {
        discovery: true,
        target: None,
        portal: "127.0.0.1:3260".parse().unwrap(),
        portal_group_tag: 1,
    };
    let normal = Asker {
        discovery: false,
        target: Some("iqn.b"),
        portal: "[::1]:3261".parse().unwrap(),
        portal_group_tag: 2,
    };
    assert_eq!(names(&send_targets("All", discovery, targets)), targets);
    assert!(names(&send_targets("All", normal, targets)).is_empty());
    assert_eq!(names(&send_targets("", normal, targets)), ["iqn.b"]);
    assert!(names(&send_targets("", discovery, targets)).is_empty());
    assert_eq!(names(&send_targets("iqn.a", normal, targets)), ["iqn.a"]);
    let pairs = send_targets("", normal, targets);
    assert_eq!(pairs[1], TextPair::new("TargetAddress", "[::1]:3261,2"));
    let pairs = send_targets("iqn.a", discovery, targets);
    assert_eq!(pairs[1], TextPair::new("TargetAddress", "127.0.0.1:3260,1"));
}

#[test]
fn an_answer_holds_send_targets_and_negotiated_keys() {
    let pairs = vec![
        TextPair::new("SendTargets", "All"),
        TextPair::new("MaxRecvDataSegmentLength", "65536"),
        TextPair::new("X-com.example.Unknown", "1"),
    ];
    let text = answer(
        pairs,
        |value| vec![TextPair::new("TargetName", format!("asked:{value}"))],
        &NegotiationConfig::default(),
    )
    .unwrap();
    // A declaration needs no answer; an unknown key is not understood.
    assert_eq!(
        codec::parse(&text).unwrap(),
        [
            TextPair::new("TargetName", "asked:All"),
            TextPair::new("X-com.example.Unknown", "NotUnderstood"),
        ]
    );
    // The same key twice is a protocol error.
    let refused = answer(
        vec![
            TextPair::new("MaxRecvDataSegmentLength", "8192"),
            TextPair::new("MaxRecvDataSegmentLength", "8192"),
        ],
        |_| Vec::new(),
        &NegotiationConfig::default(),
    );
    assert_eq!(refused, Err(RejectReason::ProtocolError));
}
