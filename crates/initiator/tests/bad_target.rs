//! A fake target on loopback that logs in correctly, then misbehaves on
//! the first SCSI command: data beyond the buffer, a residual that does not
//! match the data, silence, a PDU that has no place in full feature phase.
//! Each must give that command a clear error: no panic, no hang. A
//! command that times out is aborted before its error is reported.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use iscsi_datamover::tcp::TcpDatamover;
use iscsi_datamover::{PduReceiver, PduSender};
use iscsi_initiator::{Command, Error, IscsiUrl, Session, SessionConfig};
use iscsi_proto::pdu::login::LoginResponse;
use iscsi_proto::pdu::{
    DataIn, Header, Pdu, ScsiResponse, TaskFunction, TaskManagementResponse, TaskResponse,
};
use iscsi_proto::serial::{DataSn, StatSn};
use tokio::net::TcpListener;

#[derive(Clone, Copy)]
enum Misbehaviour {
    DataBeyondBuffer,
    WrongResidual,
    Silence,
    /// Silence to the command, but an answer to ABORT TASK.
    SilenceThenAbort,
    LoginResponseInFullFeature,
    /// BUSY status to the first [`BUSY_ANSWERS`] commands, then the data.
    BusyThenData,
}

/// How many commands [`Misbehaviour::BusyThenData`] answers BUSY.
const BUSY_ANSWERS: u32 = 3;
/// The commands the fake target received (BusyThenData).
static RECEIVED: AtomicU32 = AtomicU32::new(0);

/// The ITT of the last ABORT TASK the fake target answered.
static ABORTED: AtomicU32 = AtomicU32::new(0);

/// Answers the login by echoing the initiator's offers, then misbehaves.
async fn serve(listener: TcpListener, misbehaviour: Misbehaviour) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut dm = TcpDatamover::new(stream).unwrap();
            let mut stat_sn = StatSn::new(1);
            loop {
                let Ok(Some(received)) = dm.receiver.receive().await else {
                    return;
                };
                match received.header.pdu {
                    Pdu::LoginRequest(request) => {
                        common::answer_login(
                            &mut dm,
                            &request,
                            &received.data,
                            &mut stat_sn,
                            32,
                            &[],
                        )
                        .await
                        .unwrap();
                    }
                    Pdu::ScsiCommand(command) => {
                        let data_in = |residual: bool| DataIn {
                            final_flag: true,
                            status: Some(0),
                            initiator_task_tag: command.initiator_task_tag,
                            target_transfer_tag: 0xffff_ffff,
                            stat_sn,
                            exp_cmd_sn: command.cmd_sn.next(),
                            max_cmd_sn: command.cmd_sn.wrapping_add(32),
                            data_sn: DataSn::new(0),
                            residual_underflow: residual,
                            residual_count: 0,
                            ..DataIn::default()
                        };
                        match misbehaviour {
                            Misbehaviour::DataBeyondBuffer => {
                                let h = Header::new(Pdu::DataIn(data_in(false)), 8192);
                                let _ = dm.sender.send_control(&h, &[0; 8192]).await;
                            }
                            Misbehaviour::WrongResidual => {
                                let h = Header::new(Pdu::DataIn(data_in(false)), 512);
                                let _ = dm.sender.send_control(&h, &[0; 512]).await;
                            }
                            Misbehaviour::Silence | Misbehaviour::SilenceThenAbort => {}
                            Misbehaviour::BusyThenData => {
                                let n = RECEIVED.fetch_add(1, Ordering::SeqCst);
                                let h = if n < BUSY_ANSWERS {
                                    let busy = ScsiResponse {
                                        status: 0x08,
                                        initiator_task_tag: command.initiator_task_tag,
                                        stat_sn,
                                        exp_cmd_sn: command.cmd_sn.next(),
                                        max_cmd_sn: command.cmd_sn.wrapping_add(32),
                                        ..ScsiResponse::default()
                                    };
                                    Header::new(Pdu::ScsiResponse(busy), 0)
                                } else {
                                    Header::new(Pdu::DataIn(data_in(false)), 512)
                                };
                                stat_sn = stat_sn.next();
                                let data = if n < BUSY_ANSWERS {
                                    &[][..]
                                } else {
                                    &[7u8; 512][..]
                                };
                                let _ = dm.sender.send_control(&h, data).await;
                            }
                            Misbehaviour::LoginResponseInFullFeature => {
                                let h =
                                    Header::new(Pdu::LoginResponse(LoginResponse::default()), 0);
                                let _ = dm.sender.send_control(&h, &[]).await;
                            }
                        }
                    }
                    Pdu::TaskManagementRequest(request)
                        if matches!(misbehaviour, Misbehaviour::SilenceThenAbort)
                            && request.function == TaskFunction::AbortTask =>
                    {
                        // Answered a little later: the initiator must wait.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        ABORTED.store(request.referenced_task_tag, Ordering::SeqCst);
                        let response = TaskManagementResponse {
                            response: TaskResponse::FunctionComplete,
                            initiator_task_tag: request.initiator_task_tag,
                            stat_sn,
                            exp_cmd_sn: request.cmd_sn,
                            max_cmd_sn: request.cmd_sn.wrapping_add(32),
                        };
                        stat_sn = stat_sn.next();
                        let h = Header::new(Pdu::TaskManagementResponse(response), 0);
                        let _ = dm.sender.send_control(&h, &[]).await;
                    }
                    _ => {}
                }
            }
        });
    }
}

async fn session_to(misbehaviour: Misbehaviour) -> Result<Session, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(serve(listener, misbehaviour));
    let url: IscsiUrl = format!("iscsi://127.0.0.1:{port}/iqn.2026-11.test:fake/0")
        .parse()
        .unwrap();
    let mut config = SessionConfig::default();
    config.timeouts.command = Duration::from_millis(500);
    config.timeouts.management = Duration::from_millis(300);
    config.command_retries = 0;
    Session::connect(&url, config).await
}

async fn one_read(misbehaviour: Misbehaviour) -> Result<(), Error> {
    let session = session_to(misbehaviour).await?;
    let cdb = iscsi_initiator::scsi::rw10_cdb(false, 0, 1);
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        session.execute(Command::read(0, &cdb, vec![0; 512 * 8])),
    )
    .await
    .expect("the command must not hang");
    outcome.map(drop)
}

#[tokio::test]
async fn data_in_beyond_the_buffer() {
    let error = one_read(Misbehaviour::DataBeyondBuffer).await.unwrap_err();
    assert!(
        matches!(&error, Error::Protocol(m) if m.contains("beyond")),
        "{error}"
    );
}

#[tokio::test]
async fn residual_that_does_not_match() {
    let error = one_read(Misbehaviour::WrongResidual).await.unwrap_err();
    assert!(
        matches!(&error, Error::Protocol(m) if m.contains("residual")),
        "{error}"
    );
}

#[tokio::test]
async fn silent_target_times_out() {
    let error = one_read(Misbehaviour::Silence).await.unwrap_err();
    assert!(matches!(error, Error::Timeout { .. }), "{error}");
}

#[tokio::test]
async fn unexpected_pdu_fails_the_command() {
    let error = one_read(Misbehaviour::LoginResponseInFullFeature)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::ConnectionLost), "{error}");
}

#[tokio::test]
async fn a_timed_out_command_is_aborted_before_its_error_is_reported() {
    ABORTED.store(0, Ordering::SeqCst);
    let error = one_read(Misbehaviour::SilenceThenAbort).await.unwrap_err();
    assert!(matches!(error, Error::Timeout { .. }), "{error}");
    assert_ne!(
        ABORTED.load(Ordering::SeqCst),
        0,
        "the error came before the target had answered ABORT TASK"
    );
}

/// A command that ends in BUSY is sent again a little later, as Linux and
/// QEMU do (a fenced RBD gateway answers BUSY while it rejoins): the read
/// helpers see only the data.
#[tokio::test]
async fn a_busy_command_is_sent_again_until_it_runs() {
    RECEIVED.store(0, Ordering::SeqCst);
    let session = session_to(Misbehaviour::BusyThenData).await.unwrap();
    let data = tokio::time::timeout(
        Duration::from_secs(5),
        session.read(0, 0, 512, vec![0; 512]),
    )
    .await
    .expect("the command must not hang")
    .unwrap();
    assert_eq!(data, vec![7u8; 512]);
    assert_eq!(RECEIVED.load(Ordering::SeqCst), BUSY_ANSWERS + 1);
}
