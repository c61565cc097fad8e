//! The target's iSER portal driven message by message from a raw client:
//! the software iWARP stack under both ends, the client's iSER datamover
//! for the login and the RFC-shaped traffic, and Sends posted by hand for
//! what no datamover of ours would send.
//!
//! What it pins: libiscsi 1.19 (the `iser://` client QEMU ships in Debian
//! 12) sends a WRITE's SCSI Command as the headers alone, its
//! DataSegmentLength still the immediate data, and advertises the whole
//! write by Write STag from its first byte (lib/iser.c,
//! `iser_prepare_write_cmd` before libiscsi 1.20). The target takes every
//! byte from that buffer: both for a write within FirstBurstLength and for
//! one far beyond it, read back and compared.

mod common;

use common::*;
use iscsi_datamover::iser::{
    Advertised, CmHeader, IserConfig, IserDatamover, IserHeader, IserReceiver, IserRole, IserSender,
};
use iscsi_iwarp::{Access, QueuePair, SendOp, SendRequest, Sge};
use iscsi_proto::pdu::encode::{MAX_HEADER_LEN, encode_header};
use iscsi_proto::text::TextPair;

/// The InitiatorRecvDataSegmentLength the client declares.
const RECV_DATA_SEGMENT_LENGTH: u32 = 8192;

/// A client logged in over iSER.
struct IserClient {
    rx: IserReceiver,
    tx: IserSender,
    /// Another handle to the queue pair, for Sends posted by hand.
    qp: QueuePair,
    descriptors: iscsi_datamover::iser::DataDescriptors,
    cmd_sn: CmdSn,
    params: NegotiatedParameters,
    next_wr_id: u64,
}

impl IserClient {
    async fn login(address: SocketAddr) -> IserClient {
        let config = IserConfig {
            recv_data_segment_length: RECV_DATA_SEGMENT_LENGTH,
            receives: 64,
            send_with_invalidate: true,
            send_queue: 256,
        };
        let params = iscsi_iwarp::ConnectParams {
            private_data: CmHeader::ours(true).emit().to_vec(),
            ird: 16,
            ord: 1,
            caps: iscsi_iwarp::QpCaps {
                max_send_wr: config.send_queue,
                max_recv_wr: config.receives,
            },
            ..iscsi_iwarp::ConnectParams::default()
        };
        let stream = TcpStream::connect(address).await.unwrap();
        let qp = iscsi_iwarp::connect(stream, params, config.initial_receives())
            .await
            .expect("the RDMA stream");
        let raw = qp.clone();
        let mut dm = IserDatamover::new(qp, IserRole::Initiator, config);
        // What libiscsi offers (lib/login.c), over iSER (RFC 7145 6).
        let mut negotiation = NegotiationConfig {
            header_digest: vec![Digest::None],
            data_digest: vec![Digest::None],
            max_recv_data_segment_length: RECV_DATA_SEGMENT_LENGTH,
            first_burst_length: 262_144,
            max_burst_length: 16_776_192,
            immediate_data: true,
            initial_r2t: false,
            rdma_extensions: true,
            ..NegotiationConfig::default()
        };
        negotiation.declarations.push(TextPair::new(
            "InitiatorRecvDataSegmentLength",
            RECV_DATA_SEGMENT_LENGTH.to_string(),
        ));
        let done = log_in(&mut dm.sender, &mut dm.receiver, negotiation, 0, 1)
            .await
            .expect("login");
        dm.enable(RECV_DATA_SEGMENT_LENGTH);
        let descriptors = dm.descriptors();
        let (rx, tx) = dm.split();
        IserClient {
            rx,
            tx,
            qp: raw,
            descriptors,
            cmd_sn: done.exp_cmd_sn,
            params: done.parameters.clone(),
            next_wr_id: 1 << 48,
        }
    }

    /// A WRITE(10) or READ(10) command of `len` bytes at `lba` with task
    /// tag `itt`, numbered with the next CmdSN, its BHS counting `immediate`
    /// bytes of data.
    fn command(&mut self, itt: u32, write: bool, lba: u32, len: usize, immediate: u32) -> Header {
        let blocks = (len / BLOCK) as u16;
        let mut cdb = [0u8; 16];
        cdb[0] = if write { 0x2A } else { 0x28 };
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let cmd_sn = self.cmd_sn;
        self.cmd_sn = cmd_sn.next();
        let command = ScsiCommand {
            final_flag: true,
            read: !write,
            write,
            lun: Lun(0),
            initiator_task_tag: itt,
            expected_data_transfer_length: len as u32,
            cmd_sn,
            cdb,
            ..ScsiCommand::default()
        };
        Header::new(Pdu::ScsiCommand(command), immediate)
    }

    /// The immediate data libiscsi's iSCSI layer puts in a write of `len`
    /// bytes (lib/iscsi-command.c): up to FirstBurstLength and the
    /// target's TargetRecvDataSegmentLength.
    fn immediate(&self, len: usize) -> u32 {
        (len as u32)
            .min(self.params.first_burst_length)
            .min(self.params.max_send_data_segment_length)
            .min(8192)
    }

    /// A WRITE as libiscsi 1.19 sends it: `data` registered whole for the
    /// target's RDMA Reads and advertised from its first byte; a Send of
    /// the iSER header and the BHS only, whose DataSegmentLength counts
    /// the immediate data libiscsi's iSCSI layer chose (the write's length
    /// up to FirstBurstLength and the target's receive size), none of
    /// which the Send carries. Returns the SCSI status.
    async fn libiscsi_write(&mut self, itt: u32, lba: u32, data: &[u8]) -> u8 {
        let immediate = (data.len() as u32)
            .min(self.params.first_burst_length)
            .min(self.params.max_send_data_segment_length);
        assert!(immediate > 0, "the target allows immediate data");
        let header = self.command(itt, true, lba, data.len(), immediate);
        let region = self.qp.pd().register(data.to_vec(), Access::REMOTE_READ);
        let write = Advertised {
            stag: region.stag(),
            base: region.addr(),
        };
        let mut message = IserHeader::Control {
            write: Some(write),
            read: None,
        }
        .emit()
        .to_vec();
        let mut bhs = [0u8; MAX_HEADER_LEN];
        let len = encode_header(&header, false, &mut bhs).unwrap();
        message.extend_from_slice(&bhs[..len]);
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        self.qp
            .post_send(SendRequest {
                wr_id,
                // Unsignaled: the datamover counts its send slots by the
                // completions it sees.
                signaled: false,
                op: SendOp::Send {
                    data: vec![Sge::Bytes(bytes::Bytes::from(message))],
                    solicited: false,
                    invalidate: None,
                },
            })
            .unwrap();
        let status = self.status(itt).await;
        self.qp.pd().deregister(region);
        status
    }

    /// An RFC 7145 WRITE through the client's datamover: the immediate
    /// data in the command's Send, the rest behind its Write STag.
    async fn rfc_write(&mut self, itt: u32, lba: u32, data: &[u8]) -> u8 {
        let immediate = self.immediate(data.len());
        let header = self.command(itt, true, lba, data.len(), immediate);
        self.descriptors
            .data_out(itt, data, None, immediate as usize);
        self.tx
            .send_control(&header, &data[..immediate as usize])
            .await
            .unwrap();
        self.status(itt).await
    }

    /// Reads `len` bytes at `lba` through the client's datamover (the
    /// target's RDMA Writes into an advertised buffer).
    async fn read(&mut self, itt: u32, lba: u32, len: usize) -> Vec<u8> {
        let header = self.command(itt, false, lba, len, 0);
        self.tx.send_control(&header, &[]).await.unwrap();
        let mut data = vec![0; len];
        loop {
            let pdu = self.receive().await;
            match pdu.header.pdu {
                Pdu::DataIn(d) => {
                    assert_eq!(d.initiator_task_tag, itt);
                    let at = d.buffer_offset as usize;
                    data[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                }
                Pdu::ScsiResponse(r) => {
                    assert_eq!(r.initiator_task_tag, itt);
                    assert_eq!(r.status, 0, "read failed");
                    return data;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// The SCSI status of task `itt` (nothing else may come first).
    async fn status(&mut self, itt: u32) -> u8 {
        match self.receive().await.header.pdu {
            Pdu::ScsiResponse(r) => {
                assert_eq!(r.initiator_task_tag, itt);
                r.status
            }
            other => panic!("expected the SCSI Response, got {other:?}"),
        }
    }

    async fn receive(&mut self) -> Received {
        timeout(PATIENCE, self.rx.receive())
            .await
            .expect("a PDU in time")
            .expect("the target keeps the connection")
            .expect("the connection open")
    }
}

async fn iser_target() -> (Target, IserClient) {
    let target = Target::start(|c| c.iser = vec!["127.0.0.1:0".parse().unwrap()]).await;
    let client = IserClient::login(target.iser.expect("an iSER portal")).await;
    assert!(client.params.rdma_extensions);
    assert!(client.params.initial_r2t, "InitialR2T=Yes over iSER");
    assert!(client.params.immediate_data);
    (target, client)
}

/// A write within FirstBurstLength (all of it would be immediate data,
/// none of it is in the Send), one far beyond it (8 KiB announced, 1 MiB
/// in several bursts), and one of a single block: each lands whole.
/// RFC-shaped writes before and after them keep working on the same
/// connection, the CmdSN sequence unbroken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libiscsi_writes_without_their_immediate_data_are_fetched_whole() {
    let (target, mut client) = iser_target().await;
    assert!(client.params.first_burst_length >= 8192);
    let writes = [
        (16 * 1024, "rfc"),
        (4096, "libiscsi"),
        (BLOCK, "libiscsi"),
        (1 << 20, "libiscsi"),
        (3 * 64 * 1024, "rfc"),
        (64 * 1024, "libiscsi"),
    ];
    let mut lba = 0u32;
    for (itt, (len, shape)) in (1u32..).zip(writes) {
        let data = pattern(len, itt as u8);
        let status = match shape {
            "rfc" => client.rfc_write(itt, lba, &data).await,
            _ => client.libiscsi_write(itt, lba, &data).await,
        };
        assert_eq!(status, 0, "{shape} write of {len} bytes");
        assert!(
            target.lun_bytes(u64::from(lba) * BLOCK as u64, len) == data,
            "{shape} write of {len} bytes at LBA {lba}: the LUN holds other bytes"
        );
        let back = client.read(itt + 1000, lba, len).await;
        assert!(
            back == data,
            "{shape} write of {len} bytes read back different"
        );
        lba += (len / BLOCK) as u32;
    }
    target.stop().await;
}
