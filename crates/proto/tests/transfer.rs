//! Data transfer sequencing (RFC 7143 13.10-13.19, 11.7-11.8): plans for
//! every combination of the keys, whole transfers through both trackers
//! under random limits, and each rule a peer can break.

use iscsi_proto::pdu::RejectReason;
use iscsi_proto::transfer::{
    DataOutProgress, DataOutTracker, Limits, R2tTracker, Segment, TransferError,
    UNSOLICITED_TRANSFER_TAG, WritePlan, data_segments,
};
use proptest::prelude::*;

fn limits() -> Limits {
    Limits {
        max_send_segment: 8192,
        max_recv_segment: 8192,
        max_burst_length: 262_144,
        first_burst_length: 65_536,
        immediate_data: true,
        initial_r2t: true,
        max_outstanding_r2t: 1,
        data_pdu_in_order: true,
        data_sequence_in_order: true,
        error_recovery_level: 0,
    }
}

#[test]
fn write_plans_follow_immediate_data_initial_r2t_and_first_burst() {
    // (ImmediateData, InitialR2T, FirstBurstLength, segment, length) -> plan
    let table = [
        ((true, true, 65_536, 8192, 1 << 20), (8192, 0)),
        ((true, false, 65_536, 8192, 1 << 20), (8192, 57_344)),
        ((false, false, 65_536, 8192, 1 << 20), (0, 65_536)),
        ((false, true, 65_536, 8192, 1 << 20), (0, 0)),
        ((true, false, 65_536, 262_144, 4096), (4096, 0)),
        ((true, false, 65_536, 262_144, 1 << 20), (65_536, 0)),
        ((false, false, 65_536, 8192, 1000), (0, 1000)),
        ((true, true, 65_536, 8192, 0), (0, 0)),
    ];
    for ((immediate_data, initial_r2t, first_burst_length, segment, length), expected) in table {
        let limits = Limits {
            immediate_data,
            initial_r2t,
            first_burst_length,
            max_send_segment: segment,
            ..limits()
        };
        assert_eq!(
            limits.write_plan(length),
            WritePlan {
                immediate: expected.0,
                unsolicited: expected.1
            },
            "{immediate_data} {initial_r2t} {first_burst_length} {segment} {length}"
        );
    }
}

#[test]
fn r2ts_cover_the_rest_in_bursts() {
    assert_eq!(
        limits().r2t_bursts(1 << 20, 65_536),
        vec![
            (65_536, 262_144),
            (327_680, 262_144),
            (589_824, 262_144),
            (851_968, 196_608)
        ]
    );
    assert!(limits().r2t_bursts(4096, 4096).is_empty());
}

#[test]
fn a_sequence_is_cut_into_segments_with_data_sn_and_f() {
    assert_eq!(
        data_segments(100, 20_000, 8192),
        vec![
            Segment {
                offset: 100,
                length: 8192,
                data_sn: 0,
                last_in_sequence: false
            },
            Segment {
                offset: 8292,
                length: 8192,
                data_sn: 1,
                last_in_sequence: false
            },
            Segment {
                offset: 16_484,
                length: 3616,
                data_sn: 2,
                last_in_sequence: true
            },
        ]
    );
    assert!(data_segments(0, 0, 8192).is_empty());
}

fn limits_strategy() -> impl Strategy<Value = Limits> {
    (
        (
            512u32..70_000,
            512u32..70_000,
            512u32..300_000,
            512u32..300_000,
        ),
        (
            any::<bool>(),
            any::<bool>(),
            1u16..5,
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((send, recv, burst, first), (imm, r2t, outstanding, pdu, seq))| Limits {
                max_send_segment: send,
                max_recv_segment: recv,
                max_burst_length: burst,
                first_burst_length: first.min(burst),
                immediate_data: imm,
                initial_r2t: r2t,
                max_outstanding_r2t: outstanding,
                data_pdu_in_order: pdu,
                data_sequence_in_order: seq,
                error_recovery_level: 0,
            },
        )
}

/// The two ends of a connection see the same keys from opposite sides.
fn mirrored(limits: Limits) -> Limits {
    Limits {
        max_send_segment: limits.max_recv_segment,
        max_recv_segment: limits.max_send_segment,
        ..limits
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn data_in_covers_a_read_exactly_in_bursts(limits in limits_strategy(), length in 0u32..2_000_000) {
        let segments = limits.data_in_segments(length);
        let mut offset = 0;
        let mut sequence = 0;
        for (i, s) in segments.iter().enumerate() {
            prop_assert_eq!(s.offset, offset);
            prop_assert_eq!(s.data_sn, i as u32);
            prop_assert!(s.length > 0 && s.length <= limits.max_send_segment);
            sequence += s.length;
            prop_assert!(sequence <= limits.max_burst_length);
            if s.last_in_sequence {
                sequence = 0;
            }
            offset += s.length;
        }
        prop_assert_eq!(offset, length);
        prop_assert!(segments.last().is_none_or(|s| s.last_in_sequence));
    }

    #[test]
    fn a_whole_write_passes_both_trackers(
        limits in limits_strategy(),
        length in 0u32..1_500_000,
        seed in any::<u64>(),
    ) {
        // Initiator side: what it sends unsolicited.
        let initiator = limits;
        let target = mirrored(limits);
        let plan = initiator.write_plan(length);
        prop_assert!(plan.unsolicited_total() <= limits.first_burst_length.min(length));
        prop_assert!(plan.immediate <= initiator.max_send_segment);
        let mut tracker = DataOutTracker::new(target, length, plan.immediate).unwrap();
        let mut shuffle = Shuffle(seed | 1);
        let mut unsolicited = data_segments(plan.immediate, plan.unsolicited, initiator.max_send_segment);
        if !limits.data_pdu_in_order {
            shuffle.apply(&mut unsolicited);
        }
        for s in &unsolicited {
            tracker.data_out(UNSOLICITED_TRANSFER_TAG, s.data_sn, s.offset, s.length, s.last_in_sequence).unwrap();
        }
        // Target side: R2Ts for the rest, up to MaxOutstandingR2T at a time.
        let mut bursts = target.r2t_bursts(length, tracker.solicited_from());
        prop_assert!(bursts.iter().all(|&(_, l)| l <= limits.max_burst_length));
        if !limits.data_sequence_in_order {
            shuffle.apply(&mut bursts);
        }
        let mut r2ts = R2tTracker::new(initiator, length);
        for (r2t_sn, window) in bursts.chunks(usize::from(limits.max_outstanding_r2t)).enumerate() {
            let mut answers = Vec::new();
            for (i, &(offset, len)) in window.iter().enumerate() {
                let tag = (r2t_sn * 100 + i) as u32;
                let r2t_sn = (r2t_sn * usize::from(limits.max_outstanding_r2t) + i) as u32;
                tracker.r2t_sent(tag, offset, len);
                let segments = r2ts.r2t(r2t_sn, tag, offset, len).unwrap();
                answers.extend(segments.into_iter().map(|s| (tag, s)));
            }
            if !limits.data_pdu_in_order {
                shuffle.apply(&mut answers);
            } else {
                // Interleave answers to different R2Ts; each stays in order.
                answers.sort_by_key(|(tag, s)| (s.data_sn, *tag));
            }
            for (tag, s) in answers {
                let progress = tracker.data_out(tag, s.data_sn, s.offset, s.length, s.last_in_sequence).unwrap();
                if let DataOutProgress::R2tComplete(done) = progress {
                    prop_assert_eq!(done, tag);
                    r2ts.answered(tag);
                }
            }
            prop_assert_eq!(tracker.outstanding_r2ts(), 0);
        }
        prop_assert!(tracker.is_complete());
    }
}

/// A deterministic shuffle (xorshift), so failures reproduce.
struct Shuffle(u64);

impl Shuffle {
    fn apply<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            items.swap(i, (self.0 % (i as u64 + 1)) as usize);
        }
    }
}

#[test]
fn data_out_errors() {
    let l = Limits {
        initial_r2t: false,
        ..limits()
    };
    let mut t = DataOutTracker::new(l, 100_000, 8192).unwrap();
    // Beyond the expected length, and an overflowing offset.
    let e = t
        .data_out(UNSOLICITED_TRANSFER_TAG, 0, 99_000, 2000, false)
        .unwrap_err();
    assert!(matches!(e, TransferError::BeyondExpectedLength { .. }));
    assert_eq!(e.reject_reason(), RejectReason::InvalidPduField);
    assert!(
        t.data_out(UNSOLICITED_TRANSFER_TAG, 0, u32::MAX, 2, false)
            .is_err()
    );
    // Overlapping the immediate data.
    assert!(matches!(
        t.data_out(UNSOLICITED_TRANSFER_TAG, 0, 4096, 8192, false),
        Err(TransferError::Overlap { .. })
    ));
    // Longer than our MaxRecvDataSegmentLength.
    let e = t
        .data_out(UNSOLICITED_TRANSFER_TAG, 0, 8192, 8193, false)
        .unwrap_err();
    assert_eq!(e.reject_reason(), RejectReason::ProtocolError);
    // DataSN and offset order (DataPDUInOrder=Yes).
    assert!(matches!(
        t.data_out(UNSOLICITED_TRANSFER_TAG, 1, 8192, 8192, false),
        Err(TransferError::DataSnOutOfOrder {
            got: 1,
            expected: 0
        })
    ));
    assert!(matches!(
        t.data_out(UNSOLICITED_TRANSFER_TAG, 0, 16_384, 8192, false),
        Err(TransferError::OffsetOutOfOrder { .. })
    ));
    t.data_out(UNSOLICITED_TRANSFER_TAG, 0, 8192, 8192, false)
        .unwrap();
    // Past FirstBurstLength without an R2T.
    assert!(matches!(
        t.data_out(UNSOLICITED_TRANSFER_TAG, 1, 65_536, 8192, false),
        Err(TransferError::UnsolicitedNotAllowed { .. })
            | Err(TransferError::OffsetOutOfOrder { .. })
    ));
    // Unknown tag, outside the R2T.
    assert_eq!(
        t.data_out(7, 0, 70_000, 100, true),
        Err(TransferError::UnknownTransferTag(7))
    );
    t.r2t_sent(7, 65_536, 20_000);
    assert!(matches!(
        t.data_out(7, 0, 80_000, 8192, false),
        Err(TransferError::OutsideR2t { .. })
    ));
    // Unsolicited data when InitialR2T=Yes and no immediate data allowed.
    let mut t = DataOutTracker::new(limits(), 100_000, 0).unwrap();
    assert!(matches!(
        t.data_out(UNSOLICITED_TRANSFER_TAG, 0, 0, 4096, true),
        Err(TransferError::UnsolicitedNotAllowed { .. })
    ));
    let no_immediate = Limits {
        immediate_data: false,
        ..limits()
    };
    assert!(DataOutTracker::new(no_immediate, 100_000, 512).is_err());
    assert!(DataOutTracker::new(limits(), 100_000, 8193).is_err());
    assert!(DataOutTracker::new(limits(), 100, 200).is_err());
}

#[test]
fn r2t_errors() {
    let l = Limits {
        max_outstanding_r2t: 2,
        ..limits()
    };
    let mut r = R2tTracker::new(l, 1 << 20);
    assert!(matches!(
        r.r2t(1, 1, 0, 4096),
        Err(TransferError::R2tSnOutOfOrder { .. })
    ));
    assert!(matches!(
        r.r2t(0, 1, 0, 262_145),
        Err(TransferError::InvalidR2t { .. })
    ));
    assert!(matches!(
        r.r2t(0, 1, (1 << 20) - 10, 4096),
        Err(TransferError::InvalidR2t { .. })
    ));
    assert!(matches!(
        r.r2t(0, 1, 0, 0),
        Err(TransferError::InvalidR2t { .. })
    ));
    r.r2t(0, 1, 262_144, 4096).unwrap();
    // DataSequenceInOrder=Yes: no going back.
    assert!(matches!(
        r.r2t(1, 2, 0, 4096),
        Err(TransferError::SequenceOutOfOrder { .. })
    ));
    r.r2t(1, 2, 266_240, 4096).unwrap();
    let e = r.r2t(2, 3, 270_336, 4096).unwrap_err();
    assert_eq!(e, TransferError::TooManyR2ts(2));
    assert_eq!(e.reject_reason(), RejectReason::ProtocolError);
    r.answered(1);
    assert_eq!(r.r2t(2, 3, 270_336, 4096).unwrap().len(), 1);
}

/// ErrorRecoveryLevel 1 (RFC 7143 7.8): a Data-Out whose data failed its
/// digest is taken back, its R2T ends without it, and a recovery R2T for
/// exactly that range completes the write.
#[test]
fn a_discarded_data_out_is_asked_for_again_with_a_recovery_r2t() {
    let l = Limits {
        error_recovery_level: 1,
        ..limits()
    };
    assert_eq!(l.r2t_limit(), 1, "13.19: one outstanding R2T in order");
    assert_eq!(
        Limits {
            max_outstanding_r2t: 4,
            data_sequence_in_order: false,
            ..l
        }
        .r2t_limit(),
        4
    );
    // 8 KiB immediate, then one R2T for 0x2000..0x8000 in three PDUs.
    let mut t = DataOutTracker::new(l, 0x8000, 0x2000).unwrap();
    t.r2t_sent(7, 0x2000, 0x6000);
    assert_eq!(
        t.data_out(7, 0, 0x2000, 0x2000, false),
        Ok(DataOutProgress::Continue)
    );
    assert_eq!(
        t.data_out(7, 1, 0x4000, 0x2000, false),
        Ok(DataOutProgress::Continue)
    );
    // The middle one fails its digest.
    assert_eq!(t.discard(7, 0x4000, 0x2000), DataOutProgress::Continue);
    assert_eq!(
        t.data_out(7, 2, 0x6000, 0x2000, true),
        Ok(DataOutProgress::R2tComplete(7)),
        "the sequence ends without the discarded bytes"
    );
    assert!(!t.is_complete());
    assert_eq!(t.take_lost(), vec![(0x4000, 0x2000)]);
    assert!(t.take_lost().is_empty());
    t.r2t_sent(8, 0x4000, 0x2000);
    assert_eq!(
        t.data_out(8, 0, 0x4000, 0x2000, true),
        Ok(DataOutProgress::R2tComplete(8))
    );
    assert!(t.is_complete());

    // The last PDU of a sequence discarded: the discard ends the R2T.
    let mut t = DataOutTracker::new(l, 0x4000, 0).unwrap();
    t.r2t_sent(1, 0, 0x4000);
    t.data_out(1, 0, 0, 0x2000, false).unwrap();
    t.data_out(1, 1, 0x2000, 0x2000, true).unwrap();
    // Already complete by coverage when the digest failed.
    assert!(t.is_complete());
    t.discard(1, 0x2000, 0x2000);
    assert!(!t.is_complete());
    assert_eq!(t.take_lost(), vec![(0x2000, 0x2000)]);

    // Immediate data and unsolicited Data-Out are discarded the same way.
    let mut u = DataOutTracker::new(l, 0x4000, 0x1000).unwrap();
    assert_eq!(
        u.discard(UNSOLICITED_TRANSFER_TAG, 0, 0x1000),
        DataOutProgress::Continue
    );
    assert_eq!(u.take_lost(), vec![(0, 0x1000)]);

    // The initiator answers a recovery R2T behind the sequence order only
    // at ERL 1 and above.
    let mut r = R2tTracker::new(l, 0x8000);
    r.r2t(0, 7, 0x2000, 0x6000).unwrap();
    r.answered(7);
    assert_eq!(r.recoveries(), 0);
    assert_eq!(r.r2t(1, 8, 0x4000, 0x2000).unwrap().len(), 1);
    assert_eq!(r.recoveries(), 1);
    let mut r = R2tTracker::new(l, 0x8000).after_unsolicited(0x2000);
    assert_eq!(r.r2t(0, 9, 0, 0x1000).unwrap().len(), 1);
    assert_eq!(r.recoveries(), 1, "immediate data asked for again");
    let mut r = R2tTracker::new(limits(), 0x8000);
    r.r2t(0, 7, 0x2000, 0x6000).unwrap();
    r.answered(7);
    assert!(matches!(
        r.r2t(1, 8, 0x4000, 0x2000),
        Err(TransferError::SequenceOutOfOrder { .. })
    ));
}
