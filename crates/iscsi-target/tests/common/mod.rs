//! The raw client and target the wire tests share: a target on a free
//! loopback port with one RAM LUN, and an initiator connection built on the
//! protocol core and the datamover, driven PDU by PDU.

#![allow(dead_code, unused_imports)]

pub use std::net::SocketAddr;
pub use std::sync::{Arc, Mutex};
pub use std::time::Duration;

pub use iscsi_datamover::tcp::{PduBatch, StreamReceiver, StreamSender, TcpDatamover};
pub use iscsi_datamover::{PduReceiver, PduSender, Received};
pub use iscsi_proto::login::chap::ChallengeHistory;
pub use iscsi_proto::login::initiator::{
    InitiatorLogin, InitiatorLoginComplete, InitiatorLoginConfig, InitiatorStep,
};
pub use iscsi_proto::pdu::login::Isid;
pub use iscsi_proto::pdu::{
    AsyncEvent, DataOut, Digests, Header, LogoutReason, LogoutRequest, Lun, NopOut, Pdu,
    RESERVED_TAG, RejectReason, ScsiCommand, SnackRequest, SnackType, TaskFunction,
    TaskManagementRequest, TaskResponse,
};
pub use iscsi_proto::serial::{CmdSn, DataSn, StatSn};
pub use iscsi_proto::text::{Digest, NegotiatedParameters, NegotiationConfig};
pub use iscsi_scsi::Backstore;
pub use iscsi_stores::RamBackstore;
pub use iscsi_target::{Server, TargetConfig, TargetEntry};
pub use tokio::io::AsyncWriteExt;
pub use tokio::net::TcpStream;
pub use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
pub use tokio::sync::oneshot;
pub use tokio::time::timeout;

pub const TARGET: &str = "iqn.2026-11.rs.iscsi:wire";
pub const INITIATOR: &str = "iqn.2026-11.rs.iscsi:wire-client";
pub const BLOCK: usize = 512;
pub const RESERVED: u32 = 0xFFFF_FFFF;
/// How long any single expected PDU may take.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A target on a free loopback port, shut down when dropped.
pub struct Target {
    pub address: SocketAddr,
    /// The iSER portal, when the tuned config names one.
    pub iser: Option<SocketAddr>,
    pub lun: Arc<RamBackstore>,
    pub shutdown: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    pub handle: iscsi_target::server::ServerHandle,
}

impl Target {
    pub async fn start(tune: impl FnOnce(&mut TargetConfig)) -> Target {
        let lun = Arc::new(RamBackstore::new(16 << 20, BLOCK as u32, 7).expect("a RAM LUN"));
        let mut config = TargetConfig {
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            iser: Vec::new(),
            targets: vec![TargetEntry {
                name: TARGET.to_owned(),
                alias: None,
                luns: iscsi_target::numbered(vec![Arc::clone(&lun) as Arc<dyn Backstore>]),
                chap: None,
                allowed_initiators: Vec::new(),
                limits: Vec::new(),
            }],
            portal_group_tag: 1,
            gateway_group: Vec::new(),
            negotiation: TargetConfig::default_negotiation(),
            command_window: 32,
            nop_in_interval: None,
            buffer_pool_bytes: iscsi_target::DEFAULT_BUFFER_POOL_BYTES,
            send_buffer_bytes: Some(iscsi_target::DEFAULT_SEND_BUFFER_BYTES),
            // Two shards whatever the machine: a session's second connection
            // lands on the other one, so MC/S, task reassignment and aborts
            // are tested across cores.
            cores: Some(2),
            naa_company_id: iscsi_scsi::spc::NAA_COMPANY_ID,
            tap: None,
        };
        tune(&mut config);
        let server = Server::bind(config).await.expect("bind");
        let address = server.local_addrs()[0];
        let iser = server.iser_addrs().first().copied();
        let handle = server.handle();
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run_until(async {
            let _ = stop.await;
        }));
        Target {
            address,
            iser,
            lun,
            shutdown: Some(shutdown),
            task,
            handle,
        }
    }

    /// The runtime shard each connection of session `tsih` lives on, by
    /// CID (what `iscsi target status` shows).
    pub fn shards_of(&self, tsih: u16) -> Vec<(u16, Option<usize>)> {
        self.handle
            .status()
            .sessions
            .iter()
            .filter(|s| s.tsih == tsih)
            .flat_map(|s| s.connections.iter().map(|c| (c.cid, c.shard)))
            .collect()
    }

    pub fn lun_bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        self.lun.read_at(offset, &mut buf).unwrap();
        buf
    }

    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let _ = timeout(Duration::from_secs(30), &mut self.task).await;
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A raw initiator connection in full feature phase.
pub struct Client {
    pub rx: StreamReceiver<OwnedReadHalf>,
    pub tx: StreamSender<OwnedWriteHalf>,
    pub cmd_sn: CmdSn,
    pub max_cmd_sn: CmdSn,
    pub params: NegotiatedParameters,
    pub tsih: u16,
    pub next_itt: u32,
}

pub fn offers() -> NegotiationConfig {
    NegotiationConfig {
        header_digest: vec![Digest::Crc32c],
        data_digest: vec![Digest::Crc32c],
        max_recv_data_segment_length: 8192,
        max_burst_length: 16 * 1024,
        first_burst_length: 8192,
        immediate_data: true,
        initial_r2t: true,
        max_outstanding_r2t: 4,
        max_connections: 4,
        ..NegotiationConfig::default()
    }
}

/// [`offers`] at ErrorRecoveryLevel 1.
pub fn erl1_offers() -> NegotiationConfig {
    NegotiationConfig {
        error_recovery_level: 1,
        ..offers()
    }
}

pub const ISID: [u8; 6] = [0x80, 0x12, 0x34, 0x56, 0x00, 0x01];

/// The login phase as INITIATOR to TARGET with ISID, over any datamover
/// (TCP here, iSER in iser_wire.rs): the login state machine driven to its
/// end, each response awaited for at most PATIENCE.
pub async fn log_in(
    sender: &mut impl PduSender,
    receiver: &mut impl PduReceiver,
    negotiation: NegotiationConfig,
    tsih: u16,
    cid: u16,
) -> Result<Box<InitiatorLoginComplete>, String> {
    let config = InitiatorLoginConfig {
        initiator_name: INITIATOR.to_owned(),
        target_name: Some(TARGET.to_owned()),
        isid: Isid::from_bytes(ISID),
        tsih,
        cid,
        negotiation,
        chap: None,
    };
    let mut login = InitiatorLogin::new(
        config,
        0x1000,
        CmdSn::new(1),
        (1, vec![7; 32]),
        Arc::new(Mutex::new(ChallengeHistory::default())),
    )
    .unwrap();
    let mut step = login.start();
    loop {
        match step {
            InitiatorStep::Send { request, data } => {
                let header = Header::new(Pdu::LoginRequest(request), data.len() as u32);
                sender.send_control(&header, &data).await.unwrap();
                let reply = timeout(PATIENCE, receiver.receive())
                    .await
                    .expect("a login response")
                    .unwrap()
                    .expect("a login response");
                let Pdu::LoginResponse(response) = &reply.header.pdu else {
                    panic!("not a login response: {:?}", reply.header.pdu);
                };
                step = login
                    .receive(response, &reply.data)
                    .map_err(|e| format!("{e:?}"))?;
            }
            InitiatorStep::Complete(done) => return Ok(done),
        }
    }
}

impl Client {
    pub async fn login(address: SocketAddr, negotiation: NegotiationConfig, tsih: u16) -> Client {
        Self::try_login(address, negotiation, tsih, 1)
            .await
            .expect("login succeeds")
    }

    pub async fn try_login(
        address: SocketAddr,
        negotiation: NegotiationConfig,
        tsih: u16,
        cid: u16,
    ) -> Result<Client, String> {
        let stream = TcpStream::connect(address).await.unwrap();
        let mut transport = TcpDatamover::new(stream).unwrap();
        let done = log_in(
            &mut transport.sender,
            &mut transport.receiver,
            negotiation,
            tsih,
            cid,
        )
        .await?;
        let digests = Digests {
            header: done.parameters.header_digest == Digest::Crc32c,
            data: done.parameters.data_digest == Digest::Crc32c,
        };
        transport.enable(digests, done.parameters.max_recv_data_segment_length);
        let (rx, tx) = transport.split();
        Ok(Client {
            rx,
            tx,
            cmd_sn: done.exp_cmd_sn,
            max_cmd_sn: done.max_cmd_sn,
            params: done.parameters.clone(),
            tsih: done.tsih,
            next_itt: 1,
        })
    }

    pub fn itt(&mut self) -> u32 {
        let itt = self.next_itt;
        self.next_itt += 1;
        itt
    }

    pub fn take_cmd_sn(&mut self) -> CmdSn {
        let sn = self.cmd_sn;
        self.cmd_sn = sn.next();
        sn
    }

    pub async fn send(&mut self, pdu: Pdu, data: &[u8]) {
        let header = Header::new(pdu, data.len() as u32);
        self.tx.send_control(&header, data).await.unwrap();
    }

    pub async fn receive(&mut self) -> Received {
        let received = timeout(PATIENCE, self.rx.receive())
            .await
            .expect("a PDU in time")
            .expect("a decodable PDU")
            .expect("the connection open");
        if let Some(max) = max_cmd_sn(&received.header.pdu) {
            self.max_cmd_sn = max;
        }
        received
    }

    /// The next `n` PDUs, each of which must be an R2T.
    pub async fn receive_r2ts(&mut self, n: usize) -> Vec<iscsi_proto::pdu::data::ReadyToTransfer> {
        let mut r2ts = Vec::with_capacity(n);
        for _ in 0..n {
            match self.receive().await.header.pdu {
                Pdu::ReadyToTransfer(r2t) => r2ts.push(r2t),
                other => panic!("expected an R2T, got {other:?}"),
            }
        }
        r2ts
    }

    /// A WRITE(10) command PDU for `blocks` at `lba`, with `immediate` as
    /// its data segment.
    pub async fn write10(&mut self, itt: u32, lba: u32, blocks: u16, immediate: &[u8]) {
        self.command10(itt, true, lba, blocks, immediate).await;
    }

    /// A READ(10) command PDU for `blocks` at `lba`.
    pub async fn read10(&mut self, itt: u32, lba: u32, blocks: u16) {
        self.command10(itt, false, lba, blocks, &[]).await;
    }

    pub async fn command10(&mut self, itt: u32, write: bool, lba: u32, blocks: u16, data: &[u8]) {
        let command = self.command10_pdu(itt, write, lba, blocks);
        self.send(command, data).await;
    }

    /// A READ(10) or WRITE(10) command PDU, numbered with the next CmdSN.
    pub fn command10_pdu(&mut self, itt: u32, write: bool, lba: u32, blocks: u16) -> Pdu {
        let mut cdb = [0u8; 16];
        cdb[0] = if write { 0x2A } else { 0x28 };
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let command = ScsiCommand {
            final_flag: true,
            read: !write,
            write,
            lun: Lun(0),
            initiator_task_tag: itt,
            expected_data_transfer_length: u32::from(blocks) * BLOCK as u32,
            cmd_sn: self.take_cmd_sn(),
            cdb,
            ..ScsiCommand::default()
        };
        Pdu::ScsiCommand(command)
    }

    /// An immediate NOP-Out asking for an answer (a ping) with `itt`.
    pub fn ping(&self, itt: u32) -> Pdu {
        Pdu::NopOut(NopOut {
            immediate: true,
            initiator_task_tag: itt,
            target_transfer_tag: RESERVED,
            cmd_sn: self.cmd_sn,
            ..NopOut::default()
        })
    }

    /// Sends `pdus` (without data segments) in one write, so that the
    /// target finds them all in its receive buffer at once.
    pub async fn send_together(&mut self, pdus: Vec<Pdu>) {
        let mut batch = PduBatch::new(self.tx.digests());
        for pdu in pdus {
            batch.push(&Header::new(pdu, 0), &[]).unwrap();
        }
        self.tx.send_batch(&batch).await.unwrap();
    }

    /// Sends the Data-Out answering one R2T, cut by the target's
    /// MaxRecvDataSegmentLength.
    pub async fn answer_r2t(&mut self, itt: u32, ttt: u32, offset: u32, length: u32, data: &[u8]) {
        let segment = self.params.max_send_data_segment_length;
        let mut sent = 0;
        let mut data_sn = 0;
        while sent < length {
            let n = segment.min(length - sent);
            let at = offset + sent;
            let pdu = DataOut {
                final_flag: sent + n == length,
                lun: Lun(0),
                initiator_task_tag: itt,
                target_transfer_tag: ttt,
                data_sn: DataSn::new(data_sn),
                buffer_offset: at,
                ..DataOut::default()
            };
            self.send(Pdu::DataOut(pdu), &data[at as usize..(at + n) as usize])
                .await;
            sent += n;
            data_sn += 1;
        }
    }

    /// Reads `blocks` at `lba` to their status; returns the data.
    pub async fn read_blocks(&mut self, lba: u32, blocks: u16) -> Vec<u8> {
        let itt = self.itt();
        self.read10(itt, lba, blocks).await;
        let mut data = vec![0; usize::from(blocks) * BLOCK];
        loop {
            let pdu = self.receive().await;
            match pdu.header.pdu {
                Pdu::DataIn(d) => {
                    assert_eq!(d.initiator_task_tag, itt);
                    let at = d.buffer_offset as usize;
                    data[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                    if let Some(status) = d.status {
                        assert_eq!(status, 0);
                        return data;
                    }
                }
                Pdu::ScsiResponse(r) => {
                    assert_eq!(r.status, 0, "read failed");
                    return data;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Writes `data` at `lba` to its status, answering every R2T.
    pub async fn write_blocks(&mut self, lba: u32, data: &[u8]) -> u8 {
        let itt = self.itt();
        let blocks = (data.len() / BLOCK) as u16;
        self.write10(itt, lba, blocks, &[]).await;
        loop {
            let pdu = self.receive().await;
            match pdu.header.pdu {
                Pdu::ReadyToTransfer(r2t) => {
                    self.answer_r2t(
                        itt,
                        r2t.target_transfer_tag,
                        r2t.buffer_offset,
                        r2t.desired_data_transfer_length,
                        data,
                    )
                    .await;
                }
                Pdu::ScsiResponse(r) => return r.status,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

pub fn max_cmd_sn(pdu: &Pdu) -> Option<CmdSn> {
    Some(match pdu {
        Pdu::ScsiResponse(p) => p.max_cmd_sn,
        Pdu::DataIn(p) => p.max_cmd_sn,
        Pdu::ReadyToTransfer(p) => p.max_cmd_sn,
        Pdu::NopIn(p) => p.max_cmd_sn,
        Pdu::TaskManagementResponse(p) => p.max_cmd_sn,
        Pdu::Reject(p) => p.max_cmd_sn,
        Pdu::AsyncMessage(p) => p.max_cmd_sn,
        Pdu::LogoutResponse(p) => p.max_cmd_sn,
        _ => return None,
    })
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}
