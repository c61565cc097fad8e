//! ErrorRecoveryLevel 1 on the wire (RFC 7143 7.8, 11.16): a Data-Out
//! lost to its digest asked for again with a recovery R2T, and R2T, Data
//! and status SNACKs answered with the same PDUs again.

use crate::common::*;
use crate::{corrupted, raw_write};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl_1_a_data_out_lost_to_its_digest_is_asked_for_with_a_recovery_r2t() {
    // RFC 7143 7.8 at ERL 1: the PDU is rejected and its data asked for
    // again with a recovery R2T; 13.19: with DataSequenceInOrder=Yes one
    // R2T is outstanding at a time, whatever MaxOutstandingR2T says.
    let target = Target::start(|_| {}).await;
    let mut client = Client::login(target.address, erl1_offers(), 0).await;
    assert_eq!(client.params.max_outstanding_r2t, 4);
    let data = pattern(64 * 1024, 5);
    let itt = client.itt();
    client.write10(itt, 400, 128, &[]).await;
    let r2t = |pdu: Pdu| match pdu {
        Pdu::ReadyToTransfer(r2t) => r2t,
        other => panic!("expected an R2T, got {other:?}"),
    };
    let first = r2t(client.receive().await.header.pdu);
    assert_eq!((first.r2t_sn.get(), first.buffer_offset), (0, 0));
    assert_eq!(first.desired_data_transfer_length, 16 * 1024);
    let more = timeout(Duration::from_millis(300), client.rx.receive()).await;
    assert!(more.is_err(), "a second R2T outstanding: {more:?}");
    // The first 8 KiB arrive; the second fail their digest.
    client
        .answer_r2t(itt, first.target_transfer_tag, 0, 8192, &data)
        .await;
    let bad = DataOut {
        final_flag: true,
        initiator_task_tag: itt,
        target_transfer_tag: first.target_transfer_tag,
        data_sn: DataSn::new(1),
        buffer_offset: 8192,
        ..DataOut::default()
    };
    raw_write(&mut client.tx, &corrupted(bad, &data[8192..16384])).await;
    match client.receive().await.header.pdu {
        Pdu::Reject(r) => assert_eq!(r.reason, RejectReason::DataDigestError),
        other => panic!("expected the Reject, got {other:?}"),
    }
    let recovery = r2t(client.receive().await.header.pdu);
    assert_eq!(
        (
            recovery.r2t_sn.get(),
            recovery.buffer_offset,
            recovery.desired_data_transfer_length
        ),
        (1, 8192, 8192),
        "a recovery R2T for exactly the lost bytes, next in R2TSN"
    );
    assert_ne!(recovery.target_transfer_tag, first.target_transfer_tag);
    let mut r2t_sn = 1;
    let mut next = recovery;
    loop {
        client
            .answer_r2t(
                itt,
                next.target_transfer_tag,
                next.buffer_offset,
                next.desired_data_transfer_length,
                &data,
            )
            .await;
        let pdu = client.receive().await.header.pdu;
        if let Pdu::ScsiResponse(response) = pdu {
            assert_eq!(response.status, 0, "GOOD");
            break;
        }
        next = r2t(pdu);
        r2t_sn += 1;
        assert_eq!(next.r2t_sn.get(), r2t_sn);
    }
    assert_eq!(r2t_sn, 4, "the recovery R2T and three more bursts");
    assert_eq!(target.lun_bytes(400 * BLOCK as u64, data.len()), data);
    target.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl_1_an_r2t_snack_gets_the_same_r2t_again() {
    // RFC 7143 11.16: R2Ts asked for by a SNACK are exact replicas.
    let target = Target::start(|_| {}).await;
    let mut client = Client::login(target.address, erl1_offers(), 0).await;
    let data = pattern(32 * 1024, 6);
    let itt = client.itt();
    client.write10(itt, 500, 64, &[]).await;
    let r2t = |pdu: Pdu| match pdu {
        Pdu::ReadyToTransfer(r2t) => r2t,
        other => panic!("expected an R2T, got {other:?}"),
    };
    let first = r2t(client.receive().await.header.pdu);
    let r2t_snack = |beg_run, run_length| {
        Pdu::SnackRequest(SnackRequest {
            snack_type: SnackType::DataR2t,
            initiator_task_tag: itt,
            target_transfer_tag: RESERVED_TAG,
            beg_run,
            run_length,
            ..SnackRequest::default()
        })
    };
    // As if the R2T had been lost: all from R2TSN 0.
    client.send(r2t_snack(0, 0), &[]).await;
    let again = r2t(client.receive().await.header.pdu);
    assert_eq!(
        (again.r2t_sn, again.target_transfer_tag, again.buffer_offset),
        (first.r2t_sn, first.target_transfer_tag, first.buffer_offset)
    );
    assert_eq!(
        again.desired_data_transfer_length,
        first.desired_data_transfer_length
    );
    // An R2T never sent: a protocol error, and the write goes on.
    client.send(r2t_snack(7, 1), &[]).await;
    match client.receive().await.header.pdu {
        Pdu::Reject(reject) => assert_eq!(reject.reason, RejectReason::ProtocolError),
        other => panic!("expected a Reject, got {other:?}"),
    }
    let mut next = again;
    loop {
        client
            .answer_r2t(
                itt,
                next.target_transfer_tag,
                next.buffer_offset,
                next.desired_data_transfer_length,
                &data,
            )
            .await;
        match client.receive().await.header.pdu {
            Pdu::ScsiResponse(response) => {
                assert_eq!(response.status, 0);
                break;
            }
            pdu => next = r2t(pdu),
        }
    }
    assert_eq!(target.lun_bytes(500 * BLOCK as u64, data.len()), data);
    target.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl_1_snacks_get_the_same_data_and_status_again() {
    let target = Target::start(|_| {}).await;
    let mut client = Client::login(target.address, erl1_offers(), 0).await;
    assert_eq!(client.params.error_recovery_level, 1);
    let data = pattern(32 * 1024, 9);
    assert_eq!(client.write_blocks(300, &data).await, 0);
    let itt = client.itt();
    client.read10(itt, 300, 64).await;
    // 32 KiB in 8 KiB Data-In (MaxRecvDataSegmentLength), DataSN 0-3, and
    // at ERL 1 the status in a SCSI Response of its own.
    let mut first = Vec::new();
    let stat_sn = loop {
        let pdu = client.receive().await;
        match pdu.header.pdu {
            Pdu::DataIn(d) => {
                assert_eq!(d.status, None, "no phase collapse at ERL 1");
                first.push((d.data_sn.get(), d.buffer_offset, d.final_flag, pdu.data));
            }
            Pdu::ScsiResponse(r) => {
                assert_eq!(r.status, 0);
                break r.stat_sn;
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(first.len(), 4);
    let snack = |snack_type, itt, beg_run, run_length, exp_stat_sn: StatSn| {
        Pdu::SnackRequest(SnackRequest {
            snack_type,
            initiator_task_tag: itt,
            target_transfer_tag: RESERVED_TAG,
            exp_stat_sn,
            beg_run,
            run_length,
            ..SnackRequest::default()
        })
    };
    // Data SNACK for DataSN 1 and 2: the same PDUs again.
    client
        .send(snack(SnackType::DataR2t, itt, 1, 2, stat_sn), &[])
        .await;
    for want in &first[1..3] {
        let pdu = client.receive().await;
        let Pdu::DataIn(d) = pdu.header.pdu else {
            panic!("expected a Data-In, got {:?}", pdu.header.pdu);
        };
        assert_eq!(
            (d.data_sn.get(), d.buffer_offset, d.final_flag, pdu.data),
            want.clone()
        );
        assert_eq!(d.status, None);
    }
    // Status SNACK: the SCSI Response again, with its StatSN.
    client
        .send(
            snack(SnackType::Status, RESERVED_TAG, stat_sn.get(), 1, stat_sn),
            &[],
        )
        .await;
    match client.receive().await.header.pdu {
        Pdu::ScsiResponse(r) => {
            assert_eq!((r.initiator_task_tag, r.stat_sn), (itt, stat_sn));
        }
        other => panic!("expected the status again, got {other:?}"),
    }
    // What was never sent, and what is acknowledged, gets a Reject.
    let mut expect_reject = async |pdu: Pdu, reason: RejectReason| {
        client.send(pdu, &[]).await;
        match client.receive().await.header.pdu {
            Pdu::Reject(r) => assert_eq!(r.reason, reason),
            other => panic!("expected a Reject, got {other:?}"),
        }
    };
    let never = snack(SnackType::DataR2t, itt, 4, 1, stat_sn);
    expect_reject(never, RejectReason::ProtocolError).await;
    let unknown = snack(SnackType::DataR2t, itt + 100, 0, 0, stat_sn);
    expect_reject(unknown, RejectReason::ProtocolError).await;
    let data_ack = snack(SnackType::DataAck, itt, 0, 0, stat_sn);
    expect_reject(data_ack, RejectReason::InvalidDataAck).await;
    let acknowledged = snack(SnackType::DataR2t, itt, 0, 0, stat_sn.next());
    expect_reject(acknowledged, RejectReason::ProtocolError).await;
    // The connection goes on.
    assert_eq!(client.read_blocks(300, 64).await, data);
    target.stop().await;
}
