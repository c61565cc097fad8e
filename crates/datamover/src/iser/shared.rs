//! What both directions of an iSER connection share (`Shared`): the queue
//! pair, the receive buffers and their pool, the tasks whose buffers are
//! advertised or being read, and the iSER Message a receive completion
//! holds (`parse_message`). `receive.rs` and `send.rs` use it; `mod.rs`
//! builds it and hands each direction its half.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{Bytes, BytesMut};
use iscsi_iwarp::{Access, MemoryRegion, QueuePair, RecvRequest, SendOp, SendRequest};
use iscsi_proto::pdu::{BHS_LEN, Header, Pdu};
use tokio::sync::{Semaphore, mpsc};

use super::header::{self, Advertised, IserHeader};
use crate::buffers::BufferPool;
use crate::primitives::DatamoverError;
use crate::tap::Tap;

/// Receives an initiator keeps beyond its commands' responses (see
/// [`DataDescriptors::commands_in_flight`]).
pub(super) const RECEIVE_RESERVE: usize = 32;

/// The largest AHS a receive buffer makes room for (TotalAHSLength is a
/// byte count of words: 255 words at most).
pub(super) const MAX_AHS: usize = 1020;

/// Which end of the iSCSI connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IserRole {
    /// The initiator: advertises buffers, sends commands.
    Initiator,
    /// The target: moves data with RDMA Writes and Reads.
    Target,
}

/// How an iSER connection is sized.
#[derive(Clone, Copy, Debug)]
pub struct IserConfig {
    /// The RecvDataSegmentLength this side declares
    /// (InitiatorRecvDataSegmentLength or TargetRecvDataSegmentLength,
    /// RFC 7145 6.5-6.6): the data a peer's Send may carry.
    pub recv_data_segment_length: u32,
    /// Receive buffers kept posted: at least the PDUs the peer may have in
    /// flight (the command window plus immediate PDUs).
    pub receives: usize,
    /// The peer takes Send with Invalidate (its CM header did not say
    /// otherwise; target side).
    pub send_with_invalidate: bool,
    /// Send-queue requests in flight at most (the QP's `max_send_wr`).
    pub send_queue: usize,
}

impl IserConfig {
    /// Bytes of each receive buffer.
    pub fn receive_buffer_len(&self) -> usize {
        header::HEADER_LEN + BHS_LEN + MAX_AHS + self.recv_data_segment_length as usize + 3
    }

    /// The receive buffers to post before the connection is accepted or
    /// made (a peer may Send the moment the RDMA stream is up).
    pub fn initial_receives(&self) -> Vec<RecvRequest> {
        (0..self.receives)
            .map(|i| RecvRequest {
                wr_id: i as u64,
                buffer: vec![0; self.receive_buffer_len()],
            })
            .collect()
    }
}

impl Default for IserConfig {
    fn default() -> Self {
        IserConfig {
            recv_data_segment_length: 8192,
            receives: 256,
            send_with_invalidate: true,
            send_queue: 512,
        }
    }
}

/// The buffers of the initiator named by one task (target side: from the
/// SCSI Command's iSER header).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RemoteTask {
    pub(super) write: Option<Advertised>,
    pub(super) read: Option<Advertised>,
    /// Bytes of the write sent unsolicited (immediate data): the Write
    /// Base Offset names the first byte after them (RFC 7145 9.1; Linux
    /// ib_iser advertises `MR base + unsolicited size`).
    pub(super) unsolicited: u32,
    /// The command's Expected Data Transfer Length: how the target lays
    /// out its write buffer (in pieces of `WRITE_PIECE` from that long).
    pub(super) expected: u32,
}

/// The buffers this initiator registered for one task.
#[derive(Default)]
pub(super) struct LocalTask {
    /// The write data the target RDMA Reads.
    pub(super) write: Option<MemoryRegion>,
    /// Where the target RDMA Writes the read data, and the Expected Data
    /// Transfer Length.
    pub(super) read: Option<(MemoryRegion, u32)>,
}

/// An RDMA Read the target issued for an R2T: what the Data-Out handed up
/// on completion says.
pub(super) struct PendingRead {
    pub(super) region: MemoryRegion,
    /// Where in the region the Read places its bytes.
    pub(super) start: usize,
    /// The region is a page-list one whose pages are pieces `first..` of
    /// the task's write buffer.
    pub(super) first_piece: Option<usize>,
    pub(super) header: Header,
}

/// Data RDMA placed in memory of its own: bytes `start..` of the sink
/// (those before `start` are not the PDU's; they let a Data-Out's sink be
/// laid out like the task's buffer, so the two can be exchanged instead of
/// copied).
#[derive(Debug)]
pub(super) struct Placed {
    pub(super) sink: Sink,
    pub(super) start: usize,
}

/// Where RDMA placed data.
#[derive(Debug)]
pub(super) enum Sink {
    /// One buffer (laid out as a flat write buffer, or a read's).
    Flat(Vec<u8>),
    /// Pages laid out as pieces `first..` of a write buffer in pieces of
    /// `WRITE_PIECE`.
    Pieces { pages: Vec<Vec<u8>>, first: usize },
}

impl Placed {
    /// Copies the bytes placed into `destinations`, in order (as many as
    /// their lengths add up to).
    pub(super) fn copy_out(&self, destinations: &mut [&mut [u8]]) {
        let pages = match &self.sink {
            Sink::Flat(buffer) => std::slice::from_ref(buffer),
            Sink::Pieces { pages, .. } => pages.as_slice(),
        };
        // Walk the pages from `start` and the destinations together.
        let (mut page, mut at) = (0usize, self.start);
        while page < pages.len() && at >= pages[page].len() {
            at -= pages[page].len();
            page += 1;
        }
        for d in destinations.iter_mut() {
            let mut filled = 0;
            while filled < d.len() {
                let Some(src) = pages.get(page) else { return };
                let n = (src.len() - at).min(d.len() - filled);
                d[filled..filled + n].copy_from_slice(&src[at..at + n]);
                filled += n;
                at += n;
                if at == src.len() {
                    page += 1;
                    at = 0;
                }
            }
        }
    }

    /// Every buffer of the sink back to the region pool.
    pub(super) fn give_back(self, shared: &Shared) {
        match self.sink {
            Sink::Flat(buffer) => shared.give_buffer(buffer),
            Sink::Pieces { pages, .. } => {
                for page in pages {
                    shared.give_buffer(page);
                }
            }
        }
    }
}

/// State both directions of a connection share.
pub(super) struct Shared {
    pub(super) qp: QueuePair,
    pub(super) role: IserRole,
    pub(super) config: IserConfig,
    /// Free send-queue slots: every request is signaled, and a slot comes
    /// back with its completion.
    pub(super) send_slots: Semaphore,
    pub(super) next_wr_id: AtomicU64,
    pub(super) remote_tasks: Mutex<HashMap<u32, RemoteTask>>,
    pub(super) local_tasks: Mutex<HashMap<u32, LocalTask>>,
    pub(super) reads: Mutex<HashMap<u64, PendingRead>>,
    pub(super) tap: Mutex<Option<Tap>>,
    /// RDMA Write payloads on the wire, by work request: each comes back
    /// to `free_payloads` when its Write completes.
    pub(super) payloads: Mutex<HashMap<u64, Bytes>>,
    pub(super) free_payloads: Mutex<Vec<BytesMut>>,
    /// Buffers for regions (read staging, RDMA Read sinks, write data),
    /// reused so a large transfer does not cost fresh pages each time.
    pub(super) free_buffers: BufferPool,
}

/// An RDMA Read for an R2T at most this far into its task's data gets a
/// sink laid out like the task's buffer (room for the bytes before it), so
/// that the target can take the sink as its buffer: a write's one burst
/// after its immediate data costs no copy.
pub(super) const SINK_PREFIX_MAX: usize = 64 * 1024;

/// Region buffers each pool keeps, at most (and no more than
/// [`POOLED_BYTES`] in all).
pub(super) const POOLED: usize = 256;
/// RDMA Write payload buffers kept, at most.
pub(super) const PAYLOADS_POOLED: usize = 32;
/// The largest buffer a pool keeps.
pub(super) const POOLED_MAX: usize = 16 << 20;
/// The bytes a region pool keeps, at most.
pub(super) const POOLED_BYTES: usize = 64 << 20;

/// One received iSER message (the payload of an RDMA Send), parsed.
#[derive(Debug)]
pub enum Message {
    /// An iSCSI control-type PDU.
    Control {
        /// Its BHS and AHS, checked as the streaming decoder checks them.
        header: Header,
        /// WSV: the initiator's buffer for Data-Out.
        write: Option<Advertised>,
        /// RSV: the initiator's buffer for Data-In.
        read: Option<Advertised>,
        /// Where its data segment lies in the message.
        data: std::ops::Range<usize>,
        /// Immediate data the BHS counted but the message did not carry
        /// (0 when it carried what the BHS says): a write whose data all
        /// waits behind its Write STag (see `unsent_immediate`). The
        /// header says DataSegmentLength 0 instead, so the write is
        /// sequenced and fetched as one sent without immediate data.
        unsent_immediate: u32,
    },
    /// Hello (RFC 7145 9.3).
    Hello {
        /// MaxVer and MinVer.
        version: u8,
        /// iSER-IRD.
        ird: u16,
    },
    /// HelloReply (RFC 7145 9.4).
    HelloReply {
        /// REJ.
        reject: bool,
        /// MaxVer and CurVer.
        version: u8,
        /// iSER-ORD.
        ord: u16,
    },
}

/// Parses one iSER message: the iSER header, then (for a control-type
/// PDU) the BHS and AHS with `config`'s limits, and the data segment, which
/// may or may not carry its padding (the Send's length delimits the PDU;
/// RFC 7143 framing pads it). A data segment the message lacks is an error
/// but in the one shape `unsent_immediate` accepts. Never panics.
pub fn parse_message(
    message: &[u8],
    config: iscsi_proto::pdu::decoder::DecoderConfig,
) -> Result<Message, DatamoverError> {
    let (write, read) = match IserHeader::parse(message).map_err(transport)? {
        IserHeader::Control { write, read } => (write, read),
        IserHeader::Hello { version, ird } => return Ok(Message::Hello { version, ird }),
        IserHeader::HelloReply {
            reject,
            version,
            ord,
        } => {
            return Ok(Message::HelloReply {
                reject,
                version,
                ord,
            });
        }
    };
    let pdu = &message[header::HEADER_LEN..];
    let (mut header, header_len) = crate::primitives::decode_header(pdu, config)?;
    let data_len = header.data_segment_length as usize;
    // The decoder took `header_len` bytes from `pdu`: the rest is data.
    let carried = pdu.len() - header_len;
    let unsent = if (data_len..=data_len + 3).contains(&carried) {
        0
    } else if let Some(unsent) = unsent_immediate(&header, write, carried) {
        header.data_segment_length = 0;
        unsent
    } else {
        return Err(transport(format!(
            "iSER message of {} bytes does not hold a PDU of {header_len} header and {data_len} data bytes",
            pdu.len()
        )));
    };
    let start = header::HEADER_LEN + header_len;
    Ok(Message::Control {
        data: start..start + header.data_segment_length as usize,
        header,
        write,
        read,
        unsent_immediate: unsent,
    })
}

/// The immediate data a SCSI Command's BHS counts but its message left out
/// (`carried` data bytes: none), when the write is still whole behind its
/// Write STag; `None` for any other mismatch, which stays an error.
///
/// Why: libiscsi 1.19 and earlier (lib/iser.c, `iser_prepare_write_cmd`;
/// fixed upstream by dfbc669 "iser: send immediate data", in 1.20) send a
/// write's command as the headers alone, its DataSegmentLength still the
/// immediate data its iSCSI layer chose, and advertise the whole write by
/// Write STag from its first byte. That is the libiscsi QEMU ships in
/// Debian 12 (its `iser://` disks): taking the command as one without
/// immediate data, the target's R2Ts (InitialR2T=Yes over iSER) fetch
/// every byte from offset 0 of that buffer, which is where that libiscsi
/// placed it.
pub(super) fn unsent_immediate(
    header: &Header,
    write: Option<Advertised>,
    carried: usize,
) -> Option<u32> {
    let Pdu::ScsiCommand(command) = &header.pdu else {
        return None;
    };
    let announced = header.data_segment_length;
    (carried == 0
        && announced > 0
        && command.write
        && write.is_some()
        && announced <= command.expected_data_transfer_length)
        .then_some(announced)
}

/// Locks a mutex, ignoring poisoning (no code here panics holding one).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An error of the RDMA stream, as the datamover reports it.
pub(super) fn transport(error: impl std::fmt::Display) -> DatamoverError {
    DatamoverError::Transport(error.to_string())
}

impl Shared {
    /// Posts one send-queue request, waiting for a free slot first.
    pub(super) async fn post(&self, op: SendOp) -> Result<u64, DatamoverError> {
        let wr_id = self.next_wr_id.fetch_add(1, Ordering::Relaxed);
        self.post_as(wr_id, op).await?;
        Ok(wr_id)
    }

    /// Posts `op` under a work request id the caller chose.
    pub(super) async fn post_as(&self, wr_id: u64, op: SendOp) -> Result<(), DatamoverError> {
        let permit = self.send_slots.acquire().await.map_err(|_| self.ended())?;
        permit.forget();
        let request = SendRequest {
            wr_id,
            signaled: true,
            op,
        };
        if let Err(error) = self.qp.post_send(request) {
            self.send_slots.add_permits(1);
            return Err(transport(error));
        }
        Ok(())
    }

    /// Why nothing more can be sent.
    pub(super) fn ended(&self) -> DatamoverError {
        match self.qp.error() {
            Some(error) => transport(error),
            None => transport("the RDMA stream is closed"),
        }
    }

    /// A buffer of `len` bytes, reused when one is free. Its bytes are
    /// whatever it held: every use fills what it hands on (an RDMA Read
    /// completes only when all its bytes are placed; a read's data is
    /// handed up only as far as the target says it transferred).
    pub(super) fn take_buffer(&self, len: usize) -> Vec<u8> {
        let mut buffer = self.free_buffers.take_filled(len);
        if buffer.len() >= len {
            buffer.truncate(len);
        } else {
            buffer.resize(len, 0);
        }
        buffer
    }

    /// Keeps `buffer` for a later region.
    pub(super) fn give_buffer(&self, buffer: Vec<u8>) {
        self.free_buffers.give(buffer);
    }

    /// `data` in a payload buffer that can go on the wire without another
    /// copy, remembered under `wr_id` until its Write completes.
    pub(super) fn payload(&self, wr_id: u64, data: &[u8]) -> Bytes {
        let mut buffer = lock(&self.free_payloads).pop().unwrap_or_default();
        buffer.clear();
        buffer.extend_from_slice(data);
        let payload = buffer.freeze();
        lock(&self.payloads).insert(wr_id, payload.clone());
        payload
    }

    /// A Write's payload is off the wire: its buffer can be reused.
    pub(super) fn payload_done(&self, wr_id: u64) {
        let Some(payload) = lock(&self.payloads).remove(&wr_id) else {
            return;
        };
        if let Ok(buffer) = payload.try_into_mut()
            && buffer.capacity() <= POOLED_MAX
        {
            let mut free = lock(&self.free_payloads);
            if free.len() < PAYLOADS_POOLED {
                free.push(buffer);
            }
        }
    }

    /// Registers `buffer` for the peer's access.
    pub(super) fn register(&self, buffer: Vec<u8>, access: Access) -> MemoryRegion {
        self.qp.pd().register(buffer, access)
    }

    /// Deregisters a region whose task is over; its buffer is reused.
    pub(super) fn release(&self, region: MemoryRegion) {
        self.give_buffer(self.qp.pd().deregister(region));
    }

    /// Forgets what a finished task had registered (initiator) or
    /// advertised (target).
    pub(super) fn end_task(&self, itt: u32) {
        lock(&self.remote_tasks).remove(&itt);
        let local = lock(&self.local_tasks).remove(&itt);
        if let Some(local) = local {
            self.release_local(local);
        }
    }

    pub(super) fn release_local(&self, local: LocalTask) {
        if let Some(region) = local.write {
            self.release(region);
        }
        if let Some((region, _)) = local.read {
            self.release(region);
        }
    }
}

/// Drains the send completions: gives back send-queue slots and hands each
/// finished RDMA Read up to the receiver as the Data-Out its R2T asked for.
pub(super) async fn run_send_completions(
    shared: Arc<Shared>,
    completed_reads: mpsc::UnboundedSender<Result<(Header, Placed), DatamoverError>>,
) {
    while let Some(completion) = shared.qp.send_cq().next().await {
        shared.send_slots.add_permits(1);
        shared.payload_done(completion.wr_id);
        let failed = completion.status != iscsi_iwarp::WcStatus::Success;
        let read = lock(&shared.reads).remove(&completion.wr_id);
        if let Some(read) = read {
            let sink = match read.first_piece {
                Some(first) => Sink::Pieces {
                    pages: shared.qp.pd().deregister_pages(read.region),
                    first,
                },
                None => Sink::Flat(shared.qp.pd().deregister(read.region)),
            };
            let placed = Placed {
                sink,
                start: read.start,
            };
            let outcome = if failed {
                placed.give_back(&shared);
                Err(transport(format!(
                    "RDMA Read for a Data-Out failed: {:?}",
                    completion.status
                )))
            } else {
                Ok((read.header, placed))
            };
            if completed_reads.send(outcome).is_err() {
                break;
            }
        } else if failed {
            tracing::debug!(status = ?completion.status, opcode = ?completion.opcode, "send request failed");
        }
    }
    // The stream is over: nobody waits for a slot in vain.
    shared.send_slots.close();
}

/// RFC 5047's DataDescriptorOut for an initiator: the data of a write
/// handed to the datamover with its command, for transports where the
/// target fetches it (iSER: registered for RDMA Read). Over TCP the data
/// is sent in answer to R2Ts instead, and this does nothing.
#[derive(Clone, Default)]
pub struct DataDescriptors {
    pub(super) shared: Option<Arc<Shared>>,
}

impl DataDescriptors {
    /// Whether write data must be described before its command is sent.
    pub fn wanted(&self) -> bool {
        self.shared.is_some()
    }

    /// How many commands may await their responses at once: every response
    /// is a Send that needs a posted receive (a Send with none ends the RDMA
    /// stream), so an iSER initiator keeps its commands in flight below its
    /// receives, whatever command window the target grants. A reserve is
    /// kept for the PDUs a target sends on its own (NOP-In, Asynchronous
    /// Message, Reject) and for task management and text answers. `None`
    /// over TCP.
    pub fn commands_in_flight(&self) -> Option<usize> {
        self.shared.as_ref().map(|shared| {
            shared
                .config
                .receives
                .saturating_sub(RECEIVE_RESERVE)
                .max(1)
        })
    }

    /// Registers the solicited part of a write for the task `itt`: `data`
    /// from byte `solicited_from` (what is not sent unsolicited) to the end
    /// of the Expected Data Transfer Length. The SCSI Command that follows
    /// advertises it, its Write Base Offset naming byte `solicited_from`
    /// (RFC 7145 9.1, as Linux ib_iser does). A task still registered under
    /// the same tag (a command that ended without a response) is released
    /// first. When `owner` is given, `data` is all of it: the region
    /// shares it, with no copy. Either way the region is frozen, so the
    /// target's RDMA Reads are answered straight from it.
    pub fn data_out(&self, itt: u32, data: &[u8], owner: Option<&Bytes>, solicited_from: usize) {
        let Some(shared) = &self.shared else {
            return;
        };
        let solicited = match owner {
            Some(owner) if owner.len() == data.len() && solicited_from <= owner.len() => {
                owner.slice(solicited_from..)
            }
            _ => {
                let data = data.get(solicited_from..).unwrap_or_default();
                let mut buffer = shared.take_buffer(data.len());
                buffer.copy_from_slice(data);
                Bytes::from(buffer)
            }
        };
        let region = shared
            .qp
            .pd()
            .register_frozen(solicited, Access::REMOTE_READ);
        let old = lock(&shared.local_tasks).insert(
            itt,
            LocalTask {
                write: Some(region),
                read: None,
            },
        );
        if let Some(old) = old {
            shared.release_local(old);
        }
    }

    /// Forgets whatever was registered for `itt` (the task ended without a
    /// response: aborted, timed out, connection lost).
    pub fn forget(&self, itt: u32) {
        if let Some(shared) = &self.shared {
            shared.end_task(itt);
        }
    }
}

impl std::fmt::Debug for DataDescriptors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataDescriptors")
            .field("wanted", &self.wanted())
            .finish()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("peer", &self.qp.peer_addr())
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}
