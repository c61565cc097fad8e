//! The iSER datamover (RFC 7145): iSCSI over an RDMA-capable protocol,
//! implementing the same RFC 5047 primitives as the TCP datamover, so the
//! iSCSI layer above does not know which one it drives.
//!
//! It uses only the verbs of `iscsi-iwarp` (protection domain, memory
//! regions with STags, a queue pair's sends, receives and completions): it
//! knows nothing of MPA framing, DDP sequence numbers or CRC, so an
//! rdma-core backend can replace the software iWARP stack under it.
//!
//! | iSCSI | over iSER (RFC 7145 section 7) |
//! |---|---|
//! | control-type PDUs (everything but Data-In, R2T and solicited Data-Out) | an RDMA Send: the 28-byte iSER header, then BHS, AHS and data segment (no padding, no digests) |
//! | Data-In (`put_data`, target) | an RDMA Write into the initiator's Read STag at Read Base Offset + buffer offset |
//! | R2T (target) | an RDMA Read Request from the initiator's Write STag; its completion is handed up as the Data-Out the R2T asked for, so the iSCSI layer's write path is the same as over TCP |
//! | SCSI Command (initiator) | the Send advertises a registered buffer: RSV for a read (Data-In lands in it; when the SCSI Response arrives the data is handed up as one Data-In before it), WSV for a write whose data is not all immediate ([`DataDescriptors::data_out`] registered it) |
//! | SCSI Response (target) | a Send, with Invalidate of the task's STag when the initiator allows it; status is never collapsed into Data-In (a Data-In with status becomes a Write and a SCSI Response) |
//!
//! Receive buffers: each holds the iSER header, BHS, the largest AHS and
//! this side's RecvDataSegmentLength; a fixed number is kept posted and
//! each is posted again as soon as its PDU has been taken. A Send that
//! finds none posted is fatal to the RDMA stream (on real hardware too),
//! which is why the count follows the command window.
//!
//! | module | owns |
//! |---|---|
//! | [`header`] | the iSER header, Hello/HelloReply, the iSER CM private data header |
//! | `receive.rs` | [`IserReceiver`]: Sends in, Data-Out from completed RDMA Reads (target), Data-In before a read's response (initiator) |
//! | `send.rs` | [`IserSender`]: Sends, RDMA Writes for Data-In, RDMA Reads for R2Ts, buffers advertised in SCSI Commands |
//! | `shared.rs` | what both directions share: the queue pair, receive buffers, tasks in flight, [`IserConfig`], [`Message`] |
//! | `mod.rs` | [`IserDatamover`]: connecting, accepting, and the split into both directions |

pub mod header;
mod receive;
mod send;
mod shared;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use iscsi_iwarp::QueuePair;
use tokio::sync::{Semaphore, mpsc};

pub use header::{Advertised, CmHeader, IserHeader};
pub use receive::IserReceiver;
pub use send::IserSender;
pub use shared::{DataDescriptors, IserConfig, IserRole, Message, parse_message};

use crate::buffers::BufferPool;
use crate::tap::Tap;
use shared::{POOLED, POOLED_BYTES, POOLED_MAX, Shared, lock, run_send_completions};

/// One iSER connection as a datamover: RFC 5047
/// `Allocate_Connection_Resources` on creation (receive buffers were
/// posted when the RDMA stream was made: [`IserConfig::initial_receives`]).
#[derive(Debug)]
pub struct IserDatamover {
    /// The receive direction.
    pub receiver: IserReceiver,
    /// The send direction.
    pub sender: IserSender,
    descriptors: DataDescriptors,
    local: SocketAddr,
    peer: SocketAddr,
}

impl IserDatamover {
    /// Wraps an established queue pair whose initial receives were posted
    /// from `config` (wr_ids 0..receives).
    pub fn new(qp: QueuePair, role: IserRole, config: IserConfig) -> Self {
        let local = qp.local_addr();
        let peer = qp.peer_addr();
        let shared = Arc::new(Shared {
            qp,
            role,
            config,
            send_slots: Semaphore::new(config.send_queue),
            next_wr_id: AtomicU64::new(1 << 32),
            remote_tasks: Mutex::default(),
            local_tasks: Mutex::default(),
            reads: Mutex::default(),
            tap: Mutex::default(),
            payloads: Mutex::default(),
            free_payloads: Mutex::default(),
            free_buffers: BufferPool::bounded(POOLED, POOLED_MAX, POOLED_BYTES),
        });
        let (reads_done, reads_in) = mpsc::unbounded_channel();
        tokio::spawn(run_send_completions(Arc::clone(&shared), reads_done));
        IserDatamover {
            receiver: IserReceiver::new(Arc::clone(&shared), reads_in),
            sender: IserSender::new(Arc::clone(&shared)),
            descriptors: DataDescriptors {
                shared: (role == IserRole::Initiator).then_some(shared),
            },
            local,
            peer,
        }
    }

    /// RFC 5047 `Notice_Key_Values` + `Enable_Datamover`: the data
    /// segments a peer's Send may carry from now on (the RecvDataSegmentLength
    /// this side declared; never more than the receive buffers hold).
    pub fn enable(&mut self, max_recv_data_segment_length: u32) {
        self.receiver.enable(max_recv_data_segment_length);
    }

    /// Tells `tap` of every PDU sent and received from now on.
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        *lock(&self.sender.shared().tap) = tap;
    }

    /// The handle through which an initiator describes write data.
    pub fn descriptors(&self) -> DataDescriptors {
        self.descriptors.clone()
    }

    /// This end's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The two directions, to drive from separate tasks.
    pub fn split(self) -> (IserReceiver, IserSender) {
        (self.receiver, self.sender)
    }
}

#[cfg(test)]
mod tests {
    use iscsi_proto::pdu::decoder::DecoderConfig;
    use iscsi_proto::pdu::encode::{MAX_HEADER_LEN, encode_header};
    use iscsi_proto::pdu::{NopOut, ScsiCommand};

    use super::shared::*;
    use super::*;
    use iscsi_proto::pdu::{BHS_LEN, Header, Pdu};

    const WSV: Advertised = Advertised {
        stag: 0x1234,
        base: 0x7f00_0000_1000,
    };

    fn config() -> DecoderConfig {
        DecoderConfig {
            max_recv_data_segment_length: 8192,
            ..DecoderConfig::default()
        }
    }

    /// A WRITE of `expected` bytes whose BHS counts `announced` bytes of
    /// immediate data.
    fn write(announced: u32, expected: u32) -> Header {
        let command = ScsiCommand {
            final_flag: true,
            write: true,
            initiator_task_tag: 7,
            expected_data_transfer_length: expected,
            cdb: [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
            ..ScsiCommand::default()
        };
        Header::new(Pdu::ScsiCommand(command), announced)
    }

    /// The iSER header, the BHS and `data`, as one Send carries them.
    fn message(write: Option<Advertised>, header: &Header, data: &[u8]) -> Vec<u8> {
        let mut out = IserHeader::Control { write, read: None }.emit().to_vec();
        let mut bhs = [0u8; MAX_HEADER_LEN];
        let len = encode_header(header, false, &mut bhs).unwrap();
        out.extend_from_slice(&bhs[..len]);
        out.extend_from_slice(data);
        out
    }

    fn parsed(bytes: &[u8]) -> (Header, std::ops::Range<usize>, u32) {
        match parse_message(bytes, config()).expect("a valid message") {
            Message::Control {
                header,
                data,
                unsent_immediate,
                ..
            } => (header, data, unsent_immediate),
            other => panic!("expected a control PDU, got {other:?}"),
        }
    }

    #[test]
    fn immediate_data_carried_as_announced_is_handed_up() {
        let data = [0xA5; 512];
        let bytes = message(Some(WSV), &write(512, 4096), &data);
        let (header, range, unsent) = parsed(&bytes);
        assert_eq!(header.data_segment_length, 512);
        assert_eq!(&bytes[range], &data[..]);
        assert_eq!(unsent, 0);
        // With its padding (RFC 7143 framing) too.
        let bytes = message(Some(WSV), &write(510, 4096), &[1; 512]);
        let (header, range, unsent) = parsed(&bytes);
        assert_eq!(
            (header.data_segment_length, range.len(), unsent),
            (510, 510, 0)
        );
    }

    /// libiscsi 1.19: the headers alone, DataSegmentLength still the
    /// immediate data, the whole write behind the Write STag. Handed up as
    /// a write without immediate data.
    #[test]
    fn a_write_whose_immediate_data_stayed_behind_its_write_stag_is_taken_whole() {
        for (announced, expected) in [(512, 512), (8192, 8192), (8192, 1 << 20)] {
            let bytes = message(Some(WSV), &write(announced, expected), &[]);
            assert_eq!(bytes.len(), header::HEADER_LEN + BHS_LEN);
            let (header, range, unsent) = parsed(&bytes);
            assert_eq!(
                header.data_segment_length, 0,
                "sequenced as no immediate data"
            );
            assert!(range.is_empty() && range.end <= bytes.len());
            assert_eq!(unsent, announced);
            let Pdu::ScsiCommand(command) = header.pdu else {
                panic!("not a command");
            };
            assert_eq!(command.expected_data_transfer_length, expected);
        }
    }

    /// Every other shortfall stays the error it was.
    #[test]
    fn any_other_missing_data_segment_is_refused() {
        let refused = |bytes: Vec<u8>, why: &str| {
            let error = parse_message(&bytes, config()).expect_err(why);
            assert!(
                error.to_string().contains("does not hold a PDU"),
                "{why}: {error}"
            );
        };
        // Part of the immediate data: not the libiscsi shape.
        refused(
            message(Some(WSV), &write(512, 4096), &[0; 100]),
            "partial data",
        );
        // No Write STag: nothing to fetch the data from.
        refused(message(None, &write(512, 4096), &[]), "no WSV");
        // More immediate data than the write's whole transfer.
        refused(message(Some(WSV), &write(1024, 512), &[]), "DSL > EDTL");
        // A read (or any command without the W bit).
        let mut read = write(512, 512);
        if let Pdu::ScsiCommand(command) = &mut read.pdu {
            command.write = false;
            command.read = true;
        }
        refused(message(Some(WSV), &read, &[]), "not a write");
        // Another PDU that announces data it does not carry.
        let nop = Header::new(
            Pdu::NopOut(NopOut {
                immediate: true,
                target_transfer_tag: 0xFFFF_FFFF,
                ..NopOut::default()
            }),
            64,
        );
        refused(message(Some(WSV), &nop, &[]), "a NOP-Out");
        // More data than announced, beyond padding.
        refused(message(Some(WSV), &write(512, 4096), &[0; 516]), "too long");
    }

    /// Truncated and arbitrary messages are errors, never panics.
    #[test]
    fn cut_messages_are_errors() {
        let bytes = message(Some(WSV), &write(512, 512), &[]);
        for len in 0..bytes.len() {
            assert!(
                parse_message(&bytes[..len], config()).is_err(),
                "{len} bytes"
            );
        }
    }
}
