//! What the initiator puts on the wire when many commands of every kind run
//! at once, checked by a fake target that records each PDU: reads and small
//! writes (posted, sent in batches), writes whose immediate and unsolicited
//! data go out directly from the caller's buffer, and writes answered by an
//! R2T, through a command window narrower than the commands in flight.
//!
//! - Commands arrive in CmdSN order with no gap (RFC 7143 section
//!   4.2.2.1), whichever send path each took.
//! - Every Data-Out arrives after its command, at the offset and DataSN
//!   expected, and carries the command's bytes (sections 11.7, 13.10).
//! - Posted PDUs share writes: fewer writes than PDUs.
//! - Command coalescing never delays a lone command, and never holds
//!   commands back while fewer than `CoalesceMinInFlight` are at the target.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iscsi_datamover::tcp::TcpDatamover;
use iscsi_datamover::{PduReceiver, PduSender};
use iscsi_initiator::scsi::rw10_cdb;
use iscsi_initiator::{Command, IscsiUrl, Session, SessionConfig};
use iscsi_proto::pdu::{
    DataIn, Header, Pdu, RESERVED_TAG, ReadyToTransfer, ScsiResponse, ServiceResponse,
};
use iscsi_proto::serial::{CmdSn, DataSn, R2tSn, StatSn};
use tokio::net::TcpListener;

/// The target's command window: narrower than the commands in flight, so
/// that commands also wait for it to open.
const WINDOW: u32 = 16;
/// The target's MaxRecvDataSegmentLength: immediate data stops there and
/// the rest of the first burst follows as unsolicited Data-Out.
const TARGET_SEGMENT: usize = 8192;
const BLOCK: usize = 512;

/// The bytes of the command on `lba`, as written and as read.
fn pattern(lba: u32, length: usize) -> Vec<u8> {
    pattern_at(lba, 0..length)
}

/// Bytes `range` of [`pattern`].
fn pattern_at(lba: u32, range: std::ops::Range<usize>) -> Vec<u8> {
    range
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(lba.wrapping_mul(7)) as u8
        })
        .collect()
}

fn lba_of(cdb: &[u8; 16]) -> u32 {
    u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]])
}

struct WriteTask {
    lba: u32,
    expected: usize,
    received: usize,
    next_data_sn: u32,
    solicited: bool,
}

/// The fake target's state: what it saw wrong, and where the sequence
/// numbers stand.
struct Target {
    dm: TcpDatamover,
    stat_sn: StatSn,
    expected_cmd_sn: CmdSn,
    writes: HashMap<u32, WriteTask>,
    next_transfer_tag: u32,
    problems: Arc<Mutex<Vec<String>>>,
}

impl Target {
    fn problem(&self, what: String) {
        self.problems.lock().unwrap().push(what);
    }

    fn max_cmd_sn(&self) -> CmdSn {
        self.expected_cmd_sn.wrapping_add(WINDOW - 1)
    }

    async fn respond(&mut self, itt: u32) {
        let response = ScsiResponse {
            response: ServiceResponse::CommandCompleted,
            initiator_task_tag: itt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.expected_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
            ..ScsiResponse::default()
        };
        self.stat_sn = self.stat_sn.next();
        let header = Header::new(Pdu::ScsiResponse(response), 0);
        self.dm.sender.send_control(&header, &[]).await.unwrap();
    }

    /// Data of the write `itt` arrived: `final_pdu` ends a sequence.
    async fn progress(&mut self, itt: u32, final_pdu: bool) {
        let Some(task) = self.writes.get(&itt) else {
            return;
        };
        if task.received == task.expected {
            self.writes.remove(&itt);
            self.respond(itt).await;
        } else if final_pdu && !task.solicited {
            // The unsolicited part is over: ask for the rest in one R2T.
            let (offset, length) = (task.received as u32, (task.expected - task.received) as u32);
            let transfer_tag = self.next_transfer_tag;
            self.next_transfer_tag += 1;
            let task = self.writes.get_mut(&itt).unwrap();
            task.solicited = true;
            task.next_data_sn = 0;
            let r2t = ReadyToTransfer {
                initiator_task_tag: itt,
                target_transfer_tag: transfer_tag,
                stat_sn: self.stat_sn,
                exp_cmd_sn: self.expected_cmd_sn,
                max_cmd_sn: self.max_cmd_sn(),
                r2t_sn: R2tSn::new(0),
                buffer_offset: offset,
                desired_data_transfer_length: length,
                ..ReadyToTransfer::default()
            };
            let header = Header::new(Pdu::ReadyToTransfer(r2t), 0);
            self.dm.sender.send_control(&header, &[]).await.unwrap();
        }
    }

    async fn serve(mut self) {
        loop {
            let Ok(Some(received)) = self.dm.receiver.receive().await else {
                return;
            };
            match received.header.pdu {
                Pdu::LoginRequest(request) => {
                    self.expected_cmd_sn = request.cmd_sn;
                    let segment = TARGET_SEGMENT.to_string();
                    common::answer_login(
                        &mut self.dm,
                        &request,
                        &received.data,
                        &mut self.stat_sn,
                        WINDOW,
                        &[("MaxRecvDataSegmentLength", &segment)],
                    )
                    .await
                    .unwrap();
                }
                Pdu::ScsiCommand(command) => {
                    if command.cmd_sn != self.expected_cmd_sn {
                        self.problem(format!(
                            "CmdSN {} arrived where {} was next",
                            command.cmd_sn.get(),
                            self.expected_cmd_sn.get()
                        ));
                    }
                    self.expected_cmd_sn = command.cmd_sn.next();
                    let itt = command.initiator_task_tag;
                    let lba = lba_of(&command.cdb);
                    let expected = command.expected_data_transfer_length as usize;
                    if command.read {
                        let data = pattern(lba, expected);
                        let data_in = DataIn {
                            final_flag: true,
                            status: Some(0),
                            initiator_task_tag: itt,
                            target_transfer_tag: RESERVED_TAG,
                            stat_sn: self.stat_sn,
                            exp_cmd_sn: self.expected_cmd_sn,
                            max_cmd_sn: self.max_cmd_sn(),
                            data_sn: DataSn::new(0),
                            ..DataIn::default()
                        };
                        self.stat_sn = self.stat_sn.next();
                        let header = Header::new(Pdu::DataIn(data_in), data.len() as u32);
                        self.dm.sender.send_control(&header, &data).await.unwrap();
                        continue;
                    }
                    if received.data != pattern_at(lba, 0..received.data.len()) {
                        self.problem(format!("immediate data of LBA {lba} differs"));
                    }
                    self.writes.insert(
                        itt,
                        WriteTask {
                            lba,
                            expected,
                            received: received.data.len(),
                            next_data_sn: 0,
                            solicited: false,
                        },
                    );
                    self.progress(itt, command.final_flag).await;
                }
                Pdu::DataOut(data_out) => {
                    let itt = data_out.initiator_task_tag;
                    let Some(task) = self.writes.get_mut(&itt) else {
                        self.problem(format!("Data-Out for ITT {itt:#x} before its command"));
                        continue;
                    };
                    let offset = data_out.buffer_offset as usize;
                    let end = offset + received.data.len();
                    let mut problems = Vec::new();
                    if offset != task.received || end > task.expected {
                        problems.push(format!(
                            "Data-Out at {offset}..{end} where {} of {} were in",
                            task.received, task.expected
                        ));
                    } else if received.data != pattern_at(task.lba, offset..end) {
                        problems.push(format!("Data-Out of LBA {} differs", task.lba));
                    }
                    if data_out.data_sn.get() != task.next_data_sn {
                        problems.push(format!(
                            "DataSN {} where {} was next",
                            data_out.data_sn.get(),
                            task.next_data_sn
                        ));
                    }
                    task.next_data_sn += 1;
                    task.received = end.min(task.expected);
                    for problem in problems {
                        self.problem(problem);
                    }
                    self.progress(itt, data_out.final_flag).await;
                }
                Pdu::LogoutRequest(_) | Pdu::NopOut(_) => return,
                other => self.problem(format!("unexpected {:?}", other.opcode())),
            }
        }
    }
}

/// Starts a fake target on a free loopback port and logs in to it with
/// `keys` set; returns the session and the list the target writes its
/// findings to.
async fn connect(keys: &[(&str, &str)]) -> (Session, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let problems = Arc::new(Mutex::new(Vec::new()));
    let target_problems = problems.clone();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        Target {
            dm: TcpDatamover::new(stream).unwrap(),
            stat_sn: StatSn::new(1),
            expected_cmd_sn: CmdSn::new(0),
            writes: HashMap::new(),
            next_transfer_tag: 1,
            problems: target_problems,
        }
        .serve()
        .await;
    });
    let url: IscsiUrl = format!("iscsi://127.0.0.1:{port}/iqn.2026-11.test:order/0")
        .parse()
        .unwrap();
    let mut config = SessionConfig::default();
    config.timeouts.command = Duration::from_secs(10);
    for (key, value) in keys {
        config.set(key, value).unwrap();
    }
    (Session::connect(&url, config).await.unwrap(), problems)
}

/// Reads `length` bytes at `lba` from the fake target and checks them.
async fn read_pattern(session: &Session, lba: u32, length: usize) {
    let cdb = rw10_cdb(false, lba, (length / BLOCK) as u16);
    let response = session
        .execute(Command::read(0, &cdb, vec![0; length]))
        .await
        .unwrap()
        .check()
        .unwrap();
    assert!(response.data == pattern(lba, length), "read of LBA {lba}");
}

#[tokio::test]
async fn concurrent_commands_of_every_size_leave_in_cmd_sn_order_and_share_writes() {
    let (session, problems) = connect(&[
        ("ImmediateData", "Yes"),
        ("InitialR2T", "No"),
        ("FirstBurstLength", "65536"),
        ("MaxBurstLength", "1048576"),
    ])
    .await;

    // Reads and writes of 4 KiB (posted), writes of 12 KiB (posted
    // immediate data and Data-Out), 64 KiB (direct: immediate data and
    // unsolicited Data-Out) and 256 KiB (direct, then an R2T).
    let sizes = [4096usize, 4096, 12 * 1024, 64 * 1024, 256 * 1024];
    let mut commands = tokio::task::JoinSet::new();
    for i in 0..80u32 {
        let session = session.clone();
        let length = sizes[i as usize % sizes.len()];
        let read = i % sizes.len() as u32 == 0;
        commands.spawn(async move {
            let lba = i * 1024;
            if read {
                read_pattern(&session, lba, length).await;
            } else {
                let cdb = rw10_cdb(true, lba, (length / BLOCK) as u16);
                let data = pattern(lba, length);
                session
                    .execute(Command::write(0, &cdb, &data))
                    .await
                    .unwrap()
                    .check()
                    .unwrap();
            }
        });
    }
    while let Some(done) = commands.join_next().await {
        done.unwrap();
    }
    let sent = session.send_statistics();
    session.drop_connections();
    let problems = problems.lock().unwrap().clone();
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(sent.pdus >= 80, "{sent:?}");
    assert!(
        sent.writes < sent.pdus,
        "PDUs posted together must share writes: {sent:?}"
    );
}

#[tokio::test]
async fn a_lone_command_is_never_held_back() {
    // Below CoalesceMinInFlight (8 by default) commands at the target,
    // every command leaves in a write of its own, at once.
    let (session, problems) = connect(&[]).await;
    for i in 0..20 {
        read_pattern(&session, i * 8, 4096).await;
    }
    let sent = session.send_statistics();
    session.drop_connections();
    assert!(problems.lock().unwrap().is_empty());
    assert_eq!(sent.pdus, 20, "{sent:?}");
    assert_eq!(sent.writes, 20, "{sent:?}");
}

#[tokio::test]
async fn held_commands_leave_when_too_few_are_at_the_target() {
    // More commands may wait together (16) than must be at the target
    // (8): ten commands posted at once are all held, none is at the
    // target yet, so they must leave now rather than wait for each other
    // until the command timeout.
    let (session, problems) =
        connect(&[("CoalesceCommands", "16"), ("CoalesceMinInFlight", "8")]).await;
    for _round in 0..5 {
        let mut reads = tokio::task::JoinSet::new();
        for i in 0..10u32 {
            let session = session.clone();
            reads.spawn(async move { read_pattern(&session, i * 8, 4096).await });
        }
        let all = async {
            while let Some(done) = reads.join_next().await {
                done.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .expect("held commands stalled");
    }
    session.drop_connections();
    assert!(problems.lock().unwrap().is_empty());
}
