use iscsi_proto::pdu::Lun;
use iscsi_proto::serial::DataSn;
use iscsi_proto::transfer::Limits;

use super::*;

const KIB: u32 = 1024;
const ITT: u32 = 7;

fn limits(erl: u8, initial_r2t: bool) -> Limits {
    Limits {
        max_send_segment: 8 * KIB,
        max_recv_segment: 8 * KIB,
        max_burst_length: 16 * KIB,
        first_burst_length: 16 * KIB,
        immediate_data: false,
        initial_r2t,
        max_outstanding_r2t: 2,
        data_pdu_in_order: true,
        data_sequence_in_order: true,
        error_recovery_level: erl,
    }
}

/// Collections holding one 64 KiB WRITE (tag [`ITT`]) whose driver-side
/// state is a label, and its first R2Ts.
fn one_write(
    limits: Limits,
) -> (
    Collections<&'static str, &'static str>,
    Vec<ReadyToTransfer>,
) {
    let tracker = DataOutTracker::new(limits, 64 * KIB, 0).unwrap();
    let bursts = limits.r2t_bursts(64 * KIB, tracker.solicited_from());
    let write = Collecting {
        write: "write",
        tracker,
        solicit: Solicitation::new(Lun(0), ITT, bursts),
    };
    let mut writes = Collections::default();
    assert!(matches!(
        writes.insert(ITT, write),
        Inserted::Collecting { recovery_r2ts: 0 }
    ));
    let r2ts = writes.next_r2ts(ITT, limits.r2t_limit(), &mut TransferTags::default());
    (writes, r2ts)
}

fn data_out(ttt: u32, sn: u32, offset: u32, last: bool) -> DataOut {
    DataOut {
        final_flag: last,
        initiator_task_tag: ITT,
        target_transfer_tag: ttt,
        data_sn: DataSn::new(sn),
        buffer_offset: offset,
        ..DataOut::default()
    }
}

/// Notes a Data-Out placed, without sending what it frees (the tests ask
/// for R2Ts themselves).
fn placed(writes: &mut Collections<&'static str, &'static str>, progress: DataOutProgress) {
    let moved = writes.advance(ITT, progress, 0, &mut TransferTags::default());
    assert!(moved.r2ts.is_empty() && moved.complete.is_none());
}

/// Places the two PDUs answering `r2t` (16 KiB in 8 KiB PDUs).
fn answer(writes: &mut Collections<&'static str, &'static str>, r2t: &ReadyToTransfer) {
    for sn in 0..2 {
        let pdu = data_out(
            r2t.target_transfer_tag,
            sn,
            r2t.buffer_offset + sn * 8 * KIB,
            sn == 1,
        );
        match writes.placement(&pdu, 8 * KIB, |_| false) {
            Placement::Place { range, progress } => {
                assert_eq!(range.start, pdu.buffer_offset as usize);
                placed(writes, progress);
            }
            other => panic!("not placed: {other:?}"),
        }
    }
}

#[test]
fn a_write_solicits_while_the_limit_allows_and_completes_when_every_byte_is_in() {
    let limits = limits(0, true);
    let (mut writes, r2ts) = one_write(limits);
    let mut tags = TransferTags::default();
    tags.take();
    tags.take();
    assert_eq!(r2ts.len(), 2, "MaxOutstandingR2T");
    answer(&mut writes, &r2ts[0]);
    let more = writes.next_r2ts(ITT, limits.r2t_limit(), &mut tags);
    assert_eq!(more.len(), 1, "one slot freed");
    assert_eq!(more[0].r2t_sn.get(), 2);
    answer(&mut writes, &r2ts[1]);
    answer(&mut writes, &more[0]);
    let last = writes.next_r2ts(ITT, limits.r2t_limit(), &mut tags);
    for sn in 0..2 {
        let offset = last[0].buffer_offset + sn * 8 * KIB;
        let pdu = data_out(last[0].target_transfer_tag, sn, offset, sn == 1);
        let Placement::Place { progress, .. } = writes.placement(&pdu, 8 * KIB, |_| false) else {
            panic!("not placed");
        };
        let moved = writes.advance(ITT, progress, limits.r2t_limit(), &mut tags);
        assert!(moved.r2ts.is_empty());
        assert_eq!(
            moved.complete.map(|w| w.write),
            (sn == 1).then_some("write")
        );
    }
    assert_eq!(writes.collecting(), 0);
}

#[test]
fn a_write_that_breaks_the_rules_answers_only_when_its_data_has_drained() {
    let (mut writes, r2ts) = one_write(limits(0, true));
    let (first, second) = (r2ts[0].target_transfer_tag, r2ts[1].target_transfer_tag);
    // DataSN 1 first: out of order. Its bytes came, though refused.
    let bad = data_out(first, 1, 8 * KIB, true);
    assert_eq!(
        writes.placement(&bad, 8 * KIB, |_| false),
        Placement::Refused(RejectReason::InvalidPduField)
    );
    let (write, due) = writes.fail(ITT, Some((&bad, 8 * KIB))).unwrap();
    assert_eq!(write, "write");
    assert_eq!(due.r2ts, [(first, 8 * KIB), (second, 16 * KIB)]);
    assert_eq!(writes.answer_when_drained(ITT, "failed", due), None);
    // The rest of both sequences is dropped, F bit or not; the status
    // waits for the last byte.
    let rest_of_first = data_out(first, 0, 0, false);
    assert_eq!(
        writes.placement(&rest_of_first, 8 * KIB, |_| false),
        Placement::Stray
    );
    assert_eq!(writes.stray(&rest_of_first, 8 * KIB), Stray::Dropped);
    let second_a = data_out(second, 0, 16 * KIB, false);
    assert_eq!(writes.stray(&second_a, 8 * KIB), Stray::Dropped);
    let second_b = data_out(second, 1, 24 * KIB, true);
    assert_eq!(writes.stray(&second_b, 8 * KIB), Stray::Drained("failed"));
    assert_eq!(writes.stray(&second_b, 8 * KIB), Stray::Unknown);
}

/// With DataPDUInOrder=No the PDU with the F bit may come first; when its
/// digest fails (ERL 0) the write waits for the rest by bytes (it once
/// waited for an F bit that had come already, and hung: found by the
/// simulator, seed 26).
#[test]
fn out_of_order_data_drains_by_bytes_not_by_the_f_bit() {
    let mut limits = limits(0, true);
    limits.data_pdu_in_order = false;
    let (mut writes, r2ts) = one_write(limits);
    let (first, second) = (r2ts[0].target_transfer_tag, r2ts[1].target_transfer_tag);
    let last_first = data_out(first, 1, 8 * KIB, true);
    assert!(matches!(
        writes.placement(&last_first, 8 * KIB, |_| false),
        Placement::Place { .. }
    ));
    // Its digest failed: the write fails, its bytes counted as come.
    let (_, due) = writes.fail(ITT, None).unwrap();
    assert_eq!(due.r2ts, [(first, 8 * KIB), (second, 16 * KIB)]);
    assert_eq!(writes.answer_when_drained(ITT, "failed", due), None);
    assert_eq!(
        writes.stray(&data_out(first, 0, 0, false), 8 * KIB),
        Stray::Dropped
    );
    assert_eq!(
        writes.stray(&data_out(second, 1, 24 * KIB, true), 8 * KIB),
        Stray::Dropped,
        "the F bit, with 8 KiB of the second burst still to come"
    );
    assert_eq!(
        writes.stray(&data_out(second, 0, 16 * KIB, false), 8 * KIB),
        Stray::Drained("failed")
    );
}

#[test]
fn nothing_due_answers_at_once_and_unsolicited_data_is_waited_for() {
    let mut writes: Collections<(), &str> = Collections::default();
    assert_eq!(
        writes.answer_when_drained(1, "now", Due::default()),
        Some("now")
    );
    let due = Due::unsolicited_after(&limits(0, false), 64 * KIB, 0);
    assert_eq!(due.unsolicited, 16 * KIB);
    assert!(Due::unsolicited_after(&limits(0, true), 64 * KIB, 0).is_nothing());
    assert_eq!(writes.answer_when_drained(1, "later", due), None);
    let mut unsolicited = data_out(UNSOLICITED_TRANSFER_TAG, 0, 0, false);
    unsolicited.initiator_task_tag = 1;
    assert_eq!(writes.stray(&unsolicited, 8 * KIB), Stray::Dropped);
    unsolicited.buffer_offset = 8 * KIB;
    unsolicited.final_flag = true;
    assert_eq!(writes.stray(&unsolicited, 8 * KIB), Stray::Drained("later"));
}

#[test]
fn an_aborted_write_ends_and_its_late_data_is_dropped_quietly() {
    let (mut writes, r2ts) = one_write(limits(0, true));
    let pdu = data_out(r2ts[0].target_transfer_tag, 0, 0, false);
    assert_eq!(
        writes.placement(&pdu, 8 * KIB, |_| true),
        Placement::Aborted("write")
    );
    assert_eq!(writes.stray(&pdu, 8 * KIB), Stray::Dropped);
    let mut other = pdu.clone();
    other.initiator_task_tag = ITT + 1;
    assert_eq!(writes.stray(&other, 8 * KIB), Stray::Unknown);
}

#[test]
fn the_sweep_ends_aborted_writes_in_tag_order() {
    let (mut writes, _) = one_write(limits(0, true));
    for itt in [30, 10, 20] {
        let tracker = DataOutTracker::new(limits(0, true), 8 * KIB, 0).unwrap();
        let bursts = limits(0, true).r2t_bursts(8 * KIB, 0);
        let write = Collecting {
            write: if itt == 20 { "kept" } else { "aborted" },
            tracker,
            solicit: Solicitation::new(Lun(0), itt, bursts),
        };
        writes.insert(itt, write);
    }
    assert_eq!(writes.sweep_aborted(|w| *w == "aborted"), ["aborted"; 2]);
    let tags: Vec<u32> = writes.take_all().into_iter().map(|(itt, _)| itt).collect();
    assert_eq!(tags, [ITT, 20]);
}

#[test]
fn a_digest_error_at_erl_1_asks_for_the_lost_bytes_first() {
    let limits = limits(1, true);
    let (mut writes, r2ts) = one_write(limits);
    assert_eq!(r2ts.len(), 1, "one R2T outstanding at ERL 1 (13.19)");
    let mut tags = TransferTags::default();
    tags.take();
    let first = data_out(r2ts[0].target_transfer_tag, 0, 0, false);
    let Placement::Place { progress, .. } = writes.placement(&first, 8 * KIB, |_| false) else {
        panic!("not placed");
    };
    assert_eq!(progress, DataOutProgress::Continue);
    // Its data failed the digest; the sequence then ends.
    assert_eq!(writes.lost(&first, 8 * KIB), 1);
    let second = data_out(r2ts[0].target_transfer_tag, 1, 8 * KIB, true);
    let Placement::Place { progress, .. } = writes.placement(&second, 8 * KIB, |_| false) else {
        panic!("not placed");
    };
    let next = writes
        .advance(ITT, progress, limits.r2t_limit(), &mut tags)
        .r2ts;
    assert_eq!(
        (
            next[0].r2t_sn.get(),
            next[0].buffer_offset,
            next[0].desired_data_transfer_length
        ),
        (1, 0, 8 * KIB),
        "the recovery R2T first, with the next R2TSN"
    );
    // An R2T SNACK gets what still awaits data, as sent: not the first
    // R2T, whose sequence ended.
    let snack = SnackRequest {
        snack_type: SnackType::DataR2t,
        initiator_task_tag: ITT,
        ..SnackRequest::default()
    };
    let replicas = writes.r2t_replicas(&snack).unwrap().unwrap();
    assert_eq!(replicas, [next[0].clone()]);
    let status = SnackRequest {
        snack_type: SnackType::Status,
        ..snack
    };
    assert!(writes.r2t_replicas(&status).is_none());
}

#[test]
fn a_reassigned_write_solicits_only_what_never_arrived() {
    let limits = limits(2, true);
    let (mut writes, r2ts) = one_write(limits);
    answer(&mut writes, &r2ts[0]);
    let write = writes.take(ITT).unwrap();
    let mut fresh = Collections::<&str, &str>::default();
    fresh.reassigned(ITT, write, limits.max_burst_length);
    let mut tags = TransferTags::default();
    let again = fresh.next_r2ts(ITT, 8, &mut tags);
    let ranges: Vec<(u32, u32)> = again
        .iter()
        .map(|r| (r.buffer_offset / KIB, r.desired_data_transfer_length / KIB))
        .collect();
    assert_eq!(ranges, [(16, 16), (32, 16), (48, 16)]);
}

#[test]
fn a_write_whose_data_all_came_with_it_runs_at_once() {
    let mut limits = limits(0, true);
    limits.immediate_data = true;
    let tracker = DataOutTracker::new(limits, 4 * KIB, 4 * KIB).unwrap();
    let write = Collecting {
        write: "small",
        tracker,
        solicit: Solicitation::new(Lun(0), ITT, Vec::new()),
    };
    let mut writes: Collections<&str, &str> = Collections::default();
    match writes.insert(ITT, write) {
        Inserted::Complete(write) => assert_eq!(write.write, "small"),
        other => panic!("kept: {other:?}"),
    }
    assert_eq!(writes.collecting(), 0);
}
