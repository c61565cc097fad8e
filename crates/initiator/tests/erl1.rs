//! ErrorRecoveryLevel 1 against a scripted target: a Data-In with the A
//! bit is acknowledged with a DataACK SNACK (RFC 7143 11.7.2, 11.16) that
//! names the next DataSN expected and echoes the LUN and Target Transfer
//! Tag; at ERL 0 the A bit is not the initiator's business.

mod common;

use std::time::Duration;

use iscsi_datamover::tcp::TcpDatamover;
use iscsi_datamover::{PduReceiver, PduSender};
use iscsi_initiator::{Command, IscsiUrl, Session, SessionConfig};
use iscsi_proto::pdu::{DataIn, Header, Lun, Pdu, SnackRequest, SnackType};
use iscsi_proto::serial::{DataSn, StatSn};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const TTT: u32 = 0x1234;

/// Logs in (echoing the offers), answers one 8 KiB READ with two Data-In,
/// the first with the A bit, and reports every SNACK it sees.
async fn serve(listener: TcpListener, snacks: mpsc::UnboundedSender<SnackRequest>) {
    let (stream, _) = listener.accept().await.unwrap();
    let mut dm = TcpDatamover::new(stream).unwrap();
    let mut stat_sn = StatSn::new(1);
    loop {
        let Ok(Some(received)) = dm.receiver.receive().await else {
            return;
        };
        match received.header.pdu {
            Pdu::LoginRequest(request) => {
                common::answer_login(&mut dm, &request, &received.data, &mut stat_sn, 32, &[])
                    .await
                    .unwrap();
            }
            Pdu::ScsiCommand(command) => {
                for (data_sn, last) in [(0, false), (1, true)] {
                    let pdu = DataIn {
                        final_flag: true,
                        acknowledge: !last,
                        status: last.then_some(0),
                        lun: Lun(0x0001_0000_0000_0000),
                        initiator_task_tag: command.initiator_task_tag,
                        target_transfer_tag: if last { 0xffff_ffff } else { TTT },
                        stat_sn,
                        exp_cmd_sn: command.cmd_sn.next(),
                        max_cmd_sn: command.cmd_sn.wrapping_add(32),
                        data_sn: DataSn::new(data_sn),
                        buffer_offset: data_sn * 4096,
                        ..DataIn::default()
                    };
                    let header = Header::new(Pdu::DataIn(pdu), 4096);
                    dm.sender.send_control(&header, &[7; 4096]).await.unwrap();
                }
                stat_sn = stat_sn.next();
            }
            Pdu::SnackRequest(snack) => {
                let _ = snacks.send(snack);
            }
            _ => {}
        }
    }
}

async fn read_with(erl: &str) -> Vec<SnackRequest> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (snacks, mut seen) = mpsc::unbounded_channel();
    tokio::spawn(serve(listener, snacks));
    let url: IscsiUrl = format!("iscsi://127.0.0.1:{port}/iqn.2026-11.test:fake/0")
        .parse()
        .unwrap();
    let mut config = SessionConfig::default();
    config.set("ErrorRecoveryLevel", erl).unwrap();
    let session = Session::connect(&url, config).await.unwrap();
    let cdb = iscsi_initiator::scsi::rw10_cdb(false, 0, 16);
    let response = tokio::time::timeout(
        Duration::from_secs(5),
        session.execute(Command::read(0, &cdb, vec![0; 8192])),
    )
    .await
    .expect("the read must not hang")
    .unwrap();
    assert_eq!(response.status, 0);
    assert!(response.data.iter().all(|&b| b == 7));
    // Whatever was sent went before the status's completion was seen.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut all = Vec::new();
    while let Ok(snack) = seen.try_recv() {
        all.push(snack);
    }
    all
}

#[tokio::test]
async fn a_data_in_with_the_a_bit_is_acknowledged_at_erl_1() {
    let snacks = read_with("1").await;
    assert_eq!(snacks.len(), 1, "{snacks:?}");
    let ack = &snacks[0];
    assert_eq!(ack.snack_type, SnackType::DataAck);
    assert_eq!(ack.beg_run, 1, "BegRun: the next DataSN expected");
    assert_eq!(ack.run_length, 0);
    assert_eq!(ack.target_transfer_tag, TTT);
    assert_eq!(ack.lun, Lun(0x0001_0000_0000_0000));
    assert_eq!(ack.initiator_task_tag, 0xffff_ffff);
}

#[tokio::test]
async fn at_erl_0_no_snack_is_sent() {
    assert!(read_with("0").await.is_empty());
}
