//! ErrorRecoveryLevel 2 on the target, PDU by PDU (RFC 7143 7.2.2, 11.5.1,
//! 11.14.1): a connection that fails leaves its tasks for TASK REASSIGN on
//! its replacement — a write halfway through its data is asked for the
//! rest, a read whose answer was lost with the connection gets its Data-In
//! and status again — and bad input during recovery gets the RFC's answer:
//! TASK REASSIGN of a task that does not exist, of one still allegiant to a
//! live connection, a logout for recovery naming no connection.

mod common;

use common::*;

/// [`offers`] at ErrorRecoveryLevel 2.
fn erl2_offers() -> NegotiationConfig {
    NegotiationConfig {
        error_recovery_level: 2,
        ..offers()
    }
}

fn reassign(itt: u32, task: u32, client: &Client) -> Pdu {
    Pdu::TaskManagementRequest(TaskManagementRequest {
        immediate: true,
        function: TaskFunction::TaskReassign,
        lun: Lun(0),
        initiator_task_tag: itt,
        referenced_task_tag: task,
        cmd_sn: client.cmd_sn,
        ..TaskManagementRequest::default()
    })
}

async fn tmf_response(client: &mut Client, itt: u32) -> TaskResponse {
    match client.receive().await.header.pdu {
        Pdu::TaskManagementResponse(r) => {
            assert_eq!(r.initiator_task_tag, itt);
            r.response
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_halfway_through_its_data_is_reassigned_and_asked_for_the_rest() {
    let target = Target::start(|_| {}).await;
    let mut first = Client::login(target.address, erl2_offers(), 0).await;
    assert_eq!(first.params.error_recovery_level, 2);
    let old_shard = target.shards_of(first.tsih)[0].1;
    let data = pattern(64 * BLOCK, 41);
    let itt = first.itt();
    first.write10(itt, 100, 64, &[]).await;
    let Pdu::ReadyToTransfer(r2t) = first.receive().await.header.pdu else {
        panic!("no R2T");
    };
    assert_eq!(
        (r2t.buffer_offset, r2t.desired_data_transfer_length),
        (0, 16384)
    );
    // Half the burst, then the connection fails.
    let half = DataOut {
        final_flag: false,
        lun: Lun(0),
        initiator_task_tag: itt,
        target_transfer_tag: r2t.target_transfer_tag,
        data_sn: DataSn::new(0),
        buffer_offset: 0,
        ..DataOut::default()
    };
    first.send(Pdu::DataOut(half), &data[..8192]).await;
    let (tsih, cmd_sn) = (first.tsih, first.cmd_sn);
    drop(first);
    // Connection reinstatement (same CID), then the task moves there.
    let mut second = Client::try_login(target.address, erl2_offers(), tsih, 1)
        .await
        .expect("the CID is reinstated");
    // The task moves to a connection on another runtime shard (core).
    let new_shard = target.shards_of(tsih)[0].1;
    assert!(
        old_shard.is_some() && new_shard != old_shard,
        "{old_shard:?} {new_shard:?}"
    );
    second.cmd_sn = cmd_sn;
    second.send(reassign(0x700, itt, &second), &[]).await;
    assert_eq!(
        tmf_response(&mut second, 0x700).await,
        TaskResponse::FunctionComplete
    );
    // R2Ts for everything not received (the rest of the first burst and
    // all of the second), numbered on from the first connection's.
    let mut asked = Vec::new();
    let status = loop {
        match second.receive().await.header.pdu {
            Pdu::ReadyToTransfer(r2t) => {
                assert_eq!(r2t.initiator_task_tag, itt);
                assert!(r2t.r2t_sn.get() >= 1, "R2TSN numbering restarted");
                asked.push((r2t.buffer_offset, r2t.desired_data_transfer_length));
                second
                    .answer_r2t(
                        itt,
                        r2t.target_transfer_tag,
                        r2t.buffer_offset,
                        r2t.desired_data_transfer_length,
                        &data,
                    )
                    .await;
            }
            Pdu::ScsiResponse(r) => break r.status,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(status, 0);
    // Exactly what was missing, in bursts of at most MaxBurstLength: from
    // 8192 on, or from 0 if the reinstatement closed the old connection
    // before it had read the half burst.
    asked.sort();
    let mut at = asked.first().map_or(0, |&(offset, _)| offset);
    assert!(at == 8192 || at == 0, "{asked:?}");
    for &(offset, length) in &asked {
        assert_eq!(offset, at, "{asked:?}");
        assert!(length <= 16384, "{asked:?}");
        at += length;
    }
    assert_eq!(at, 64 * BLOCK as u32, "{asked:?}");
    assert_eq!(target.lun_bytes(100 * BLOCK as u64, 64 * BLOCK), data);
    target.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answer_lost_with_its_connection_is_sent_again_on_reassignment() {
    let target = Target::start(|_| {}).await;
    let mut first = Client::login(target.address, erl2_offers(), 0).await;
    let data = pattern(8 * BLOCK, 43);
    assert_eq!(first.write_blocks(200, &data).await, 0);
    let itt = first.itt();
    first.read10(itt, 200, 8).await;
    // The answer goes out (the status in a SCSI Response of its own at
    // ERL 1 and above); this side never reads it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (tsih, cmd_sn) = (first.tsih, first.cmd_sn);
    drop(first);
    let mut second = Client::try_login(target.address, erl2_offers(), tsih, 1)
        .await
        .expect("the CID is reinstated");
    second.cmd_sn = cmd_sn;
    // ExpDataSN 0: the data acknowledgement point unchanged (no DataACK
    // was asked for): every Data-In again.
    second.send(reassign(0x701, itt, &second), &[]).await;
    assert_eq!(
        tmf_response(&mut second, 0x701).await,
        TaskResponse::FunctionComplete
    );
    let mut read = vec![0; 8 * BLOCK];
    loop {
        let received = second.receive().await;
        match received.header.pdu {
            Pdu::DataIn(d) => {
                assert_eq!(d.initiator_task_tag, itt);
                let at = d.buffer_offset as usize;
                read[at..at + received.data.len()].copy_from_slice(&received.data);
            }
            Pdu::ScsiResponse(r) => {
                assert_eq!(r.initiator_task_tag, itt);
                assert_eq!(r.status, 0);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(read, data);
    // The session goes on over the new connection.
    assert_eq!(second.read_blocks(200, 8).await, data);
    target.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reassignments_get_the_rfc_answers_and_the_session_goes_on() {
    let target = Target::start(|_| {}).await;
    let mut first = Client::login(target.address, erl2_offers(), 0).await;
    let mut second = Client::try_login(target.address, erl2_offers(), first.tsih, 2)
        .await
        .expect("a second connection joins");
    // A task that never existed (the target answers at ERL 2 on the
    // joining connection too: the leading-only keys are the session's).
    second.cmd_sn = first.cmd_sn;
    second
        .send(reassign(0x710, 0x0BAD_0BAD, &second), &[])
        .await;
    assert_eq!(
        tmf_response(&mut second, 0x710).await,
        TaskResponse::TaskDoesNotExist
    );
    // A write waiting for data on the first connection, which is alive:
    // still allegiant (11.6.1, response 3), and it goes on there.
    let data = pattern(4 * BLOCK, 45);
    let itt = first.itt();
    first.write10(itt, 300, 4, &[]).await;
    let Pdu::ReadyToTransfer(r2t) = first.receive().await.header.pdu else {
        panic!("no R2T");
    };
    second.cmd_sn = first.cmd_sn;
    second.send(reassign(0x711, itt, &second), &[]).await;
    assert_eq!(
        tmf_response(&mut second, 0x711).await,
        TaskResponse::TaskStillAllegiant
    );
    first
        .answer_r2t(
            itt,
            r2t.target_transfer_tag,
            r2t.buffer_offset,
            r2t.desired_data_transfer_length,
            &data,
        )
        .await;
    match first.receive().await.header.pdu {
        Pdu::ScsiResponse(r) => assert_eq!((r.initiator_task_tag, r.status), (itt, 0)),
        other => panic!("unexpected {other:?}"),
    }
    let remove_for_recovery = |itt: u32, cid: u16, cmd_sn: CmdSn| {
        Pdu::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: LogoutReason::RemoveConnectionForRecovery,
            initiator_task_tag: itt,
            cid,
            cmd_sn,
            ..LogoutRequest::default()
        })
    };
    // A logout for recovery of a CID the session does not have.
    second
        .send(remove_for_recovery(0x720, 9, first.cmd_sn), &[])
        .await;
    match second.receive().await.header.pdu {
        Pdu::LogoutResponse(r) => {
            assert_eq!(
                r.response,
                iscsi_proto::pdu::LogoutResponseCode::CidNotFound
            )
        }
        other => panic!("unexpected {other:?}"),
    }
    // A logout for recovery of the first connection: it is closed, the
    // response says how long its tasks are kept.
    second
        .send(remove_for_recovery(0x721, 1, first.cmd_sn), &[])
        .await;
    match second.receive().await.header.pdu {
        Pdu::LogoutResponse(r) => {
            assert_eq!(
                r.response,
                iscsi_proto::pdu::LogoutResponseCode::ClosedSuccessfully
            );
            assert_eq!(r.time2retain, second.params.default_time2retain);
        }
        other => panic!("unexpected {other:?}"),
    }
    let closed = timeout(PATIENCE, first.rx.receive())
        .await
        .expect("the first connection is closed in time");
    assert!(matches!(closed, Ok(None) | Err(_)), "{closed:?}");
    second.cmd_sn = first.cmd_sn;
    assert_eq!(second.read_blocks(300, 4).await, data);
    target.stop().await;
}
