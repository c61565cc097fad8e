//! The streaming decoder stage by stage: chunked feeding at every split
//! point, digest errors, limits checked from the BHS, truncated input, and
//! landing data in the caller's buffer.

use iscsi_proto::error::{DecodeError, Fault};
use iscsi_proto::pdu::*;
use proptest::prelude::*;

fn data_out(len: usize) -> Header {
    Header::new(
        Pdu::DataOut(DataOut {
            final_flag: true,
            initiator_task_tag: 7,
            ..Default::default()
        }),
        len as u32,
    )
}

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

fn config(digests: Digests) -> DecoderConfig {
    DecoderConfig {
        digests,
        ..DecoderConfig::default()
    }
}

/// Feeds `wire` in pieces cut at `cuts`, collecting header, data and ends.
fn feed_in_pieces(
    dec: &mut Decoder,
    wire: &[u8],
    cuts: &[usize],
) -> Result<(Vec<Header>, Vec<u8>, usize), DecodeError> {
    let (mut headers, mut data, mut ends) = (Vec::new(), Vec::new(), 0);
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    bounds.push(wire.len());
    bounds.sort();
    let mut start = 0;
    for end in bounds {
        let mut piece = &wire[start..end];
        loop {
            let p = dec.feed(piece)?;
            piece = &piece[p.consumed..];
            match p.event {
                Some(Event::Header(h)) => headers.push(h),
                Some(Event::Data(d)) => data.extend_from_slice(d),
                Some(Event::End) => ends += 1,
                None if piece.is_empty() => break,
                None => {}
            }
        }
        start = end;
    }
    // Drain a pending End / error.
    loop {
        let p = dec.feed(&[])?;
        match p.event {
            Some(Event::End) => ends += 1,
            Some(_) => unreachable!(),
            None => break,
        }
    }
    Ok((headers, data, ends))
}

proptest! {
    #[test]
    fn every_split_point(len in 0usize..100, cuts in prop::collection::vec(any::<usize>(), 0..6),
                         hd: bool, dd: bool) {
        let digests = Digests { header: hd, data: dd };
        let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let header = data_out(len);
        let mut wire = encode_pdu_to_vec(&header, &data, digests).unwrap();
        wire.extend(encode_pdu_to_vec(&header, &data, digests).unwrap());
        let mut dec = Decoder::new(config(digests));
        let (headers, got, ends) = feed_in_pieces(&mut dec, &wire, &cuts).unwrap();
        prop_assert_eq!(headers, vec![header.clone(), header]);
        prop_assert_eq!(got, [data.clone(), data].concat());
        prop_assert_eq!(ends, 2);
        prop_assert!(dec.is_at_boundary());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400), hd: bool, dd: bool) {
        let mut dec = Decoder::new(config(Digests { header: hd, data: dd }));
        let mut rest = &bytes[..];
        for _ in 0..1000 {
            match dec.feed(rest) {
                Ok(p) => {
                    rest = &rest[p.consumed..];
                    if p.event.is_none() && rest.is_empty() { break; }
                }
                Err(e) if e.requires_connection_drop() => break,
                Err(_) => {}
            }
        }
    }
}

#[test]
fn stages_and_needs() {
    let data = [9u8; 5];
    let wire = encode_pdu_to_vec(&data_out(5), &data, BOTH).unwrap();
    assert_eq!(wire.len(), 48 + 4 + 5 + 3 + 4);
    let mut dec = Decoder::new(config(BOTH));
    let mut at = 0;
    let mut seen = Vec::new();
    loop {
        let need = dec.need();
        seen.push(need);
        let p = dec.feed(&wire[at..at + need.bytes]).unwrap();
        assert_eq!(p.consumed, need.bytes);
        at += need.bytes;
        if p.event == Some(Event::End) {
            break;
        }
    }
    assert_eq!(at, wire.len());
    assert!(dec.is_at_boundary());
    let stages: Vec<_> = seen.iter().map(|n| (n.stage, n.bytes)).collect();
    assert_eq!(
        stages,
        [
            (Stage::Bhs, 48),
            (Stage::HeaderDigest, 4),
            (Stage::Data, 5),
            (Stage::Padding, 3),
            (Stage::DataDigest, 4),
        ]
    );
}

#[test]
fn header_digest_mismatch_drops_connection() {
    let mut wire = encode_pdu_to_vec(&data_out(4), &[1, 2, 3, 4], BOTH).unwrap();
    wire[20] ^= 1; // corrupt the BHS
    let mut dec = Decoder::new(config(BOTH));
    let p = dec.feed(&wire).unwrap();
    assert_eq!((p.consumed, p.event), (52, None));
    let err = dec.feed(&wire[52..]).unwrap_err();
    assert!(matches!(err, DecodeError::HeaderDigestMismatch { .. }));
    assert!(err.requires_connection_drop());
    assert_eq!(err.reject_reason(), None);
    assert_eq!(err.fault(), Fault::MalformedBytes);
    assert_eq!(dec.feed(&wire[52..]), Err(DecodeError::Stopped));
}

#[test]
fn data_digest_mismatch_rejects_and_continues() {
    let mut wire = encode_pdu_to_vec(&data_out(4), &[1, 2, 3, 4], BOTH).unwrap();
    let good = wire.clone();
    wire[53] ^= 0x80; // corrupt the data
    wire.extend_from_slice(&good);
    let mut dec = Decoder::new(config(BOTH));
    let err = feed_in_pieces(&mut dec, &wire, &[]).unwrap_err();
    let DecodeError::DataDigestMismatch { rejected_bhs, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(&rejected_bhs[..], &good[..48]);
    assert_eq!(err.reject_reason(), Some(RejectReason::DataDigestError));
    assert!(!err.requires_connection_drop());
    // The bad PDU is consumed; the next one decodes.
    let (headers, data, ends) = feed_in_pieces(&mut dec, &wire[good.len()..], &[]).unwrap();
    assert_eq!((headers.len(), data, ends), (1, vec![1, 2, 3, 4], 1));
}

#[test]
fn oversize_data_segment_rejected_from_bhs_alone() {
    let mut bhs = [0u8; 48];
    data_out(0).pdu.encode_bhs(
        SegmentLengths {
            total_ahs_words: 0,
            data_segment_length: 0xFF_FFFF,
        },
        &mut bhs,
    );
    // Only the BHS is given: the error comes before any data is read.
    let mut dec = Decoder::default();
    assert_eq!(dec.feed(&bhs).unwrap().consumed, 48);
    let err = dec.feed(&[]).unwrap_err();
    assert_eq!(
        err,
        DecodeError::DataSegmentTooLong {
            length: 0xFF_FFFF,
            max: 8192
        }
    );
    assert!(err.requires_connection_drop());
    assert_eq!(err.reject_reason(), Some(RejectReason::ProtocolError));
    assert_eq!(
        DecodedPdu::decode(DecoderConfig::default(), &bhs),
        Err(DecodeError::DataSegmentTooLong {
            length: 0xFF_FFFF,
            max: 8192
        })
    );
    // Exactly the limit is fine.
    let wire = encode_pdu_to_vec(&data_out(8192), &vec![0; 8192], Digests::default()).unwrap();
    assert!(
        DecodedPdu::decode(DecoderConfig::default(), &wire)
            .unwrap()
            .is_some()
    );
}

#[test]
fn ahs_limit_and_malformed_ahs() {
    let mut bhs = [0u8; 48];
    data_out(0).pdu.encode_bhs(
        SegmentLengths {
            total_ahs_words: 2,
            data_segment_length: 0,
        },
        &mut bhs,
    );
    let cfg = DecoderConfig {
        max_total_ahs_length: 4,
        ..DecoderConfig::default()
    };
    assert_eq!(
        DecodedPdu::decode(cfg, &bhs),
        Err(DecodeError::AhsTooLong { length: 8, max: 4 })
    );
    // AHSLength 100 inside an 8-byte AHS area.
    let mut wire = bhs.to_vec();
    wire.extend_from_slice(&[0, 100, 9, 0, 0, 0, 0, 0]);
    let err = DecodedPdu::decode(DecoderConfig::default(), &wire).unwrap_err();
    assert!(matches!(err, DecodeError::MalformedAhs { .. }));
    assert_eq!(err.reject_reason(), Some(RejectReason::InvalidPduField));
}

#[test]
fn truncated_input_is_incomplete_not_an_error() {
    let wire = encode_pdu_to_vec(&data_out(10), &[3; 10], BOTH).unwrap();
    for cut in 0..wire.len() {
        assert_eq!(
            DecodedPdu::decode(config(BOTH), &wire[..cut]),
            Ok(None),
            "cut {cut}"
        );
    }
    let (all, used) = DecodedPdu::decode_all(
        config(BOTH),
        &[wire.clone(), wire.clone(), wire[..7].to_vec()].concat(),
    )
    .unwrap();
    assert_eq!((all.len(), used), (2, 2 * wire.len()));
}

#[test]
fn data_lands_in_the_callers_buffer() {
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let wire = encode_pdu_to_vec(&data_out(1000), &data, BOTH).unwrap();
    let mut dec = Decoder::new(config(BOTH));
    let p = dec.feed(&wire[..52]).unwrap();
    assert!(matches!(p.event, Some(Event::Header(_))));
    // Fused copy + CRC into a buffer the caller chose, in uneven chunks.
    let mut target = vec![0u8; 1000];
    let mut at = 0;
    while at < 1000 {
        let end = (at + 333).min(1000);
        let n = dec
            .receive_data(&mut target[at..end], &wire[52 + at..52 + end])
            .unwrap();
        at += n;
    }
    assert_eq!(target, data);
    // Wrong-stage calls are the caller's fault and consume nothing.
    let err = dec.data_received(&[0]).unwrap_err();
    assert_eq!(err.fault(), Fault::ApiMisuse);
    let p = dec.feed(&wire[1052..]).unwrap();
    assert_eq!(p.event, Some(Event::End));

    // The caller read the data into place itself.
    let mut dec = Decoder::new(config(BOTH));
    dec.feed(&wire[..52]).unwrap();
    dec.data_received(&wire[52..552]).unwrap();
    dec.data_received(&wire[552..1052]).unwrap();
    assert_eq!(dec.feed(&wire[1052..]).unwrap().event, Some(Event::End));
}

#[test]
fn digests_switch_on_at_the_next_pdu() {
    let plain = encode_pdu_to_vec(&data_out(3), &[1, 2, 3], Digests::default()).unwrap();
    let digested = encode_pdu_to_vec(&data_out(3), &[1, 2, 3], BOTH).unwrap();
    let mut dec = Decoder::default();
    // Mid-PDU the change is deferred.
    dec.feed(&plain[..48]).unwrap();
    dec.set_config(config(BOTH));
    assert_eq!(dec.config().digests, BOTH);
    let wire = [&plain[48..], &digested[..]].concat();
    let (headers, data, ends) = feed_in_pieces(&mut dec, &wire, &[]).unwrap();
    assert_eq!((headers.len(), data, ends), (1, vec![1, 2, 3, 1, 2, 3], 2));
}

#[test]
fn encode_errors() {
    let mut small = [0u8; 40];
    assert!(matches!(
        encode_header(&data_out(0), false, &mut small),
        Err(iscsi_proto::error::EncodeError::BufferTooSmall {
            needed: 48,
            available: 40
        })
    ));
    assert!(encode_pdu_to_vec(&data_out(2), &[1], Digests::default()).is_err());
    let big = Header::new(data_out(0).pdu, 1 << 24);
    assert!(encode_header(&big, false, &mut [0u8; 100]).is_err());
    let mut buf = [0u8; encode::MAX_HEADER_LEN];
    let pdu = encode_pdu(&data_out(5), &[1; 5], BOTH, &mut buf).unwrap();
    assert_eq!(pdu.slices().map(<[u8]>::len), [52, 5, 3, 4]);
    assert_eq!(pdu.wire_len(), 64);
}
