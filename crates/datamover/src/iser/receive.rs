//! The receive direction of an iSER connection (RFC 7145 sections 7.3,
//! 9.3-9.5).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use iscsi_iwarp::{RecvRequest, WcStatus};
use iscsi_proto::pdu::decoder::DecoderConfig;
use iscsi_proto::pdu::{DataIn, Digests, Header, Pdu, ScsiCommand, ScsiResponse};
use iscsi_proto::serial::{DataSn, StatSn};
use tokio::sync::mpsc;

use super::header::{ISER_VERSION, IserHeader};
use super::shared::{
    IserRole, Message, Placed, RemoteTask, Shared, Sink, lock, parse_message, transport,
};
use crate::primitives::{DatamoverError, PduReceiver};
use crate::tap::{Direction, PduSummary};
use crate::write_buffer::{WRITE_PIECE, WriteBuffer};

/// Where the data segment of the PDU being received is.
#[derive(Debug)]
enum Current {
    /// In a receive buffer (a Send): bytes `start..start + len`, posted
    /// again once the data is taken.
    Received {
        buffer: Vec<u8>,
        start: usize,
        len: usize,
        wr_id: u64,
    },
    /// In a buffer of its own (data placed by RDMA: a Data-Out from an
    /// RDMA Read, a Data-In from the initiator's read buffer).
    Placed(Placed),
}

/// The receive direction: Sends from the peer, plus the data RDMA placed,
/// handed up as the PDUs TCP would have carried.
#[derive(Debug)]
pub struct IserReceiver {
    shared: Arc<Shared>,
    completed_reads: mpsc::UnboundedReceiver<Result<(Header, Placed), DatamoverError>>,
    /// PDUs made ready ahead (a read's response behind its Data-In).
    queued: VecDeque<(Header, Current)>,
    current: Option<(Header, Current)>,
    decoder: DecoderConfig,
    /// A write whose command left its immediate data out was logged
    /// (once per connection: a peer that does it does it every time).
    unsent_immediate_logged: bool,
}

impl IserReceiver {
    pub(super) fn new(
        shared: Arc<Shared>,
        completed_reads: mpsc::UnboundedReceiver<Result<(Header, Placed), DatamoverError>>,
    ) -> Self {
        IserReceiver {
            shared,
            completed_reads,
            queued: VecDeque::new(),
            current: None,
            decoder: DecoderConfig {
                max_recv_data_segment_length: 8192,
                digests: Digests::default(),
                ..DecoderConfig::default()
            },
            unsent_immediate_logged: false,
        }
    }

    /// The RecvDataSegmentLength this side declared applies from now on.
    pub(crate) fn enable(&mut self, max_recv_data_segment_length: u32) {
        self.decoder.max_recv_data_segment_length =
            max_recv_data_segment_length.min(self.shared.config.recv_data_segment_length.max(8192));
    }

    /// Posts a receive buffer again. A stream that has just ended refuses
    /// it: the buffer is dropped and the next receive reports the end.
    fn repost(&self, wr_id: u64, buffer: Vec<u8>) -> Result<(), DatamoverError> {
        let mut buffer = buffer;
        buffer.resize(self.shared.config.receive_buffer_len(), 0);
        match self.shared.qp.post_recv(RecvRequest { wr_id, buffer }) {
            Ok(()) => Ok(()),
            Err(error) if self.shared.qp.error().is_some() => {
                tracing::debug!(%error, "receive not posted again: the stream has ended");
                Ok(())
            }
            Err(error) => Err(transport(error)),
        }
    }

    /// The next PDU: from a Send, or from data RDMA placed.
    async fn next_pdu(&mut self) -> Result<Option<(Header, Current)>, DatamoverError> {
        loop {
            if let Some(ready) = self.queued.pop_front() {
                return Ok(Some(ready));
            }
            let completion = tokio::select! {
                completion = self.shared.qp.recv_cq().next() => completion,
                Some(read) = self.completed_reads.recv() => {
                    let (header, data) = read?;
                    return Ok(Some((header, Current::Placed(data))));
                }
            };
            let Some(completion) = completion else {
                // The stream ended: between PDUs that is the peer's close;
                // a Terminate or an error says why.
                return match self.shared.qp.error() {
                    None | Some(iscsi_iwarp::Error::Closed) => Ok(None),
                    Some(error) => Err(transport(error)),
                };
            };
            if completion.status != WcStatus::Success {
                if completion.status == WcStatus::Flushed {
                    continue;
                }
                return Err(transport(format!(
                    "receive failed: {:?}",
                    completion.status
                )));
            }
            let Some(buffer) = completion.buffer else {
                return Err(transport("receive completion without its buffer"));
            };
            let len = completion.byte_len.min(buffer.len());
            if let Some(pdu) = self.message(buffer, len, completion.wr_id).await? {
                return Ok(Some(pdu));
            }
        }
    }

    /// One received Send: an iSCSI PDU, or Hello/HelloReply.
    async fn message(
        &mut self,
        buffer: Vec<u8>,
        len: usize,
        wr_id: u64,
    ) -> Result<Option<(Header, Current)>, DatamoverError> {
        let message = &buffer[..len];
        let (header, write, read, data) = match parse_message(message, self.decoder)? {
            Message::Control {
                header,
                write,
                read,
                data,
                unsent_immediate,
            } => {
                if unsent_immediate > 0 {
                    self.log_unsent_immediate(&header, unsent_immediate);
                }
                (header, write, read, data)
            }
            Message::Hello { version, .. } => {
                // RFC 5046-style peers open with Hello; Linux does not
                // (its CM private data says the same). Accept and answer.
                self.repost(wr_id, buffer)?;
                if self.shared.role == IserRole::Target {
                    let supported = version >> 4 >= ISER_VERSION && version & 0xf <= ISER_VERSION;
                    self.hello_reply(!supported).await?;
                    if !supported {
                        return Err(transport(format!(
                            "iSER Hello with versions {version:#x}: 10 is not among them"
                        )));
                    }
                }
                return Ok(None);
            }
            Message::HelloReply { reject, .. } => {
                self.repost(wr_id, buffer)?;
                if reject {
                    return Err(transport(
                        "the target rejected the iSER connection (HelloReply)",
                    ));
                }
                return Ok(None);
            }
        };
        let data_len = data.len();
        let start = data.start;
        match (&header.pdu, self.shared.role) {
            (Pdu::ScsiCommand(command), IserRole::Target) => {
                self.command_arrived(command, write, read, header.data_segment_length);
            }
            (Pdu::ScsiResponse(response), IserRole::Initiator) => {
                let response = response.clone();
                let current = Current::Received {
                    buffer,
                    start,
                    len: data_len,
                    wr_id,
                };
                return Ok(Some(self.response_arrived(header, response, current)));
            }
            _ => {}
        }
        Ok(Some((
            header,
            Current::Received {
                buffer,
                start,
                len: data_len,
                wr_id,
            },
        )))
    }

    /// Says once per connection why a write whose command carried none of
    /// the immediate data its BHS counted is taken whole by RDMA Read.
    fn log_unsent_immediate(&mut self, header: &Header, unsent: u32) {
        if std::mem::replace(&mut self.unsent_immediate_logged, true) {
            return;
        }
        let (itt, expected) = match &header.pdu {
            Pdu::ScsiCommand(command) => (
                command.initiator_task_tag,
                command.expected_data_transfer_length,
            ),
            _ => (0, 0),
        };
        tracing::warn!(
            peer = %self.shared.qp.peer_addr(),
            itt = format_args!("{itt:#x}"),
            announced = unsent,
            expected,
            "iSER: a SCSI Command's BHS counts {unsent} bytes of immediate data its message does not \
             carry, while its Write STag advertises the whole write (libiscsi before 1.20 does this); \
             taking every write of this connection that comes so as one without immediate data, \
             all of it fetched by RDMA Read"
        );
    }

    /// Target: remembers the buffers a SCSI Command advertised.
    fn command_arrived(
        &self,
        command: &ScsiCommand,
        write: Option<super::header::Advertised>,
        read: Option<super::header::Advertised>,
        immediate: u32,
    ) {
        if write.is_some() || read.is_some() {
            let task = RemoteTask {
                write,
                read,
                unsolicited: immediate,
                expected: command.expected_data_transfer_length,
            };
            lock(&self.shared.remote_tasks).insert(command.initiator_task_tag, task);
        }
    }

    /// Initiator: a SCSI Response ends its task. A read's data, placed by
    /// the target's RDMA Writes, is handed up first as one Data-In of the
    /// bytes transferred (the Expected Data Transfer Length less an
    /// underflow residual), then the response.
    fn response_arrived(
        &mut self,
        header: Header,
        response: ScsiResponse,
        current: Current,
    ) -> (Header, Current) {
        let itt = response.initiator_task_tag;
        let task = lock(&self.shared.local_tasks).remove(&itt);
        let Some(mut task) = task else {
            return (header, current);
        };
        if let Some(region) = task.write.take() {
            self.shared.release(region);
        }
        let Some((region, expected)) = task.read.take() else {
            return (header, current);
        };
        let mut data = self.shared.qp.pd().deregister(region);
        // Only what the target says it transferred is handed up.
        let transferred = if response.residual_underflow {
            expected.saturating_sub(response.residual_count)
        } else {
            expected
        };
        let good = response.status == 0 || response.status == 0x04;
        if !good || transferred == 0 {
            return (header, current);
        }
        data.truncate(transferred as usize);
        let data_in = Header::new(
            Pdu::DataIn(DataIn {
                final_flag: true,
                initiator_task_tag: itt,
                target_transfer_tag: 0xFFFF_FFFF,
                stat_sn: StatSn::new(0),
                exp_cmd_sn: response.exp_cmd_sn,
                max_cmd_sn: response.max_cmd_sn,
                data_sn: DataSn::new(0),
                buffer_offset: 0,
                ..DataIn::default()
            }),
            transferred,
        );
        self.queued.push_back((header, current));
        (
            data_in,
            Current::Placed(Placed {
                sink: Sink::Flat(data),
                start: 0,
            }),
        )
    }

    /// Target: answers a Hello (RFC 7145 9.4).
    async fn hello_reply(&self, reject: bool) -> Result<(), DatamoverError> {
        let reply = IserHeader::HelloReply {
            reject,
            version: (ISER_VERSION << 4) | ISER_VERSION,
            ord: self.shared.qp.peer().ird,
        };
        let op = iscsi_iwarp::SendOp::Send {
            data: vec![iscsi_iwarp::Sge::Bytes(bytes::Bytes::copy_from_slice(
                &reply.emit(),
            ))],
            solicited: false,
            invalidate: None,
        };
        self.shared.post(op).await.map(drop)
    }

    /// Takes the current PDU's data, then posts its receive buffer again.
    fn take_current(&mut self) -> Result<Option<Current>, DatamoverError> {
        Ok(self.current.take().map(|(_, current)| current))
    }

    fn tapped(&self, header: &Header, start: Instant) {
        if let Some(tap) = lock(&self.shared.tap).as_ref() {
            tap.pdu(
                Direction::Received,
                PduSummary::of(header),
                start,
                Instant::now(),
            );
        }
    }
}

/// Lands bytes `range` of `sink`, laid out like `target` and as long, in
/// `target`, copying the smaller part: the bytes around the range from
/// `target` into `sink`, which then becomes `target` (immediate data before
/// a burst, other bursts after it are kept), or else the range itself.
/// Returns the buffer left over, for the region pool.
fn land(target: &mut Vec<u8>, mut sink: Vec<u8>, range: std::ops::Range<usize>) -> Vec<u8> {
    if target.len() - range.len() < range.len() {
        sink[..range.start].copy_from_slice(&target[..range.start]);
        sink[range.end..].copy_from_slice(&target[range.end..]);
        std::mem::swap(target, &mut sink);
    } else {
        target[range.clone()].copy_from_slice(&sink[range]);
    }
    sink
}

impl PduReceiver for IserReceiver {
    async fn receive_header(&mut self) -> Result<Option<Header>, DatamoverError> {
        if let Some((header, _)) = &self.current {
            if header.data_segment_length > 0 {
                return Err(DatamoverError::Misuse(
                    "the previous PDU's data segment was not received",
                ));
            }
            if let Some(Current::Received { buffer, wr_id, .. }) = self.take_current()? {
                self.repost(wr_id, buffer)?;
            }
        }
        let start = Instant::now();
        let Some((header, current)) = self.next_pdu().await? else {
            return Ok(None);
        };
        self.tapped(&header, start);
        if header.data_segment_length == 0 {
            if let Current::Received { buffer, wr_id, .. } = current {
                self.repost(wr_id, buffer)?;
            }
        } else {
            self.current = Some((header.clone(), current));
        }
        Ok(Some(header))
    }

    async fn receive_data_into(&mut self, destination: &mut [u8]) -> Result<(), DatamoverError> {
        self.receive_data_into_slices(&mut [destination]).await
    }

    /// Copied out of the received message, or out of the RDMA Read's sink
    /// where the data was placed.
    async fn receive_data_into_slices(
        &mut self,
        destinations: &mut [&mut [u8]],
    ) -> Result<(), DatamoverError> {
        let wanted: usize = destinations.iter().map(|d| d.len()).sum();
        let Some((header, current)) = self.current.take() else {
            return if wanted == 0 {
                Ok(())
            } else {
                Err(DatamoverError::Misuse(
                    "destination length differs from the data segment length",
                ))
            };
        };
        if wanted != header.data_segment_length as usize {
            self.current = Some((header, current));
            return Err(DatamoverError::Misuse(
                "destination length differs from the data segment length",
            ));
        }
        match current {
            Current::Received {
                buffer,
                start,
                len,
                wr_id,
            } => {
                crate::primitives::scatter(&buffer[start..start + len], destinations);
                self.repost(wr_id, buffer)?;
            }
            Current::Placed(placed) => {
                placed.copy_out(destinations);
                placed.give_back(&self.shared);
            }
        }
        Ok(())
    }

    async fn discard_data(&mut self, scratch: &mut [u8]) -> Result<(), DatamoverError> {
        match self.current.take() {
            Some((header, Current::Placed(placed)))
                if header.data_segment_length as usize == scratch.len() =>
            {
                // Placed by RDMA already: nothing to copy.
                placed.give_back(&self.shared);
                Ok(())
            }
            current => {
                self.current = current;
                self.receive_data_into(scratch).await
            }
        }
    }

    async fn receive_data_in_place(
        &mut self,
        buffer: &mut Vec<u8>,
        range: std::ops::Range<usize>,
    ) -> Result<(), DatamoverError> {
        // A sink laid out like `buffer` is landed in it by `land`.
        let fits = match &self.current {
            Some((
                header,
                Current::Placed(Placed {
                    sink: Sink::Flat(sink),
                    start,
                }),
            )) => {
                *start == range.start
                    && sink.len() == buffer.len()
                    && range.len() == header.data_segment_length as usize
                    && range.end <= buffer.len()
            }
            _ => false,
        };
        let taken = if fits { self.current.take() } else { None };
        let Some((
            _,
            Current::Placed(Placed {
                sink: Sink::Flat(placed),
                ..
            }),
        )) = taken
        else {
            let destination = buffer.get_mut(range).ok_or(DatamoverError::Misuse(
                "the data segment's range is outside the buffer",
            ))?;
            return self.receive_data_into(destination).await;
        };
        self.shared.give_buffer(land(buffer, placed, range));
        Ok(())
    }

    /// Data an RDMA Read placed in pages laid out as `buffer`'s pieces is
    /// landed page by page (`land`: a page wholly new is exchanged for its
    /// piece, no copy); anything else is copied into place.
    async fn receive_data_in_buffer(
        &mut self,
        buffer: &mut WriteBuffer,
        range: std::ops::Range<usize>,
    ) -> Result<(), DatamoverError> {
        if buffer.is_flat() {
            return crate::primitives::receive_data_in_buffer_by_parts(self, buffer, range).await;
        }
        let laid_out = match &self.current {
            Some((
                header,
                Current::Placed(Placed {
                    sink: Sink::Pieces { pages, first },
                    start,
                }),
            )) => {
                buffer.piece_len() == WRITE_PIECE
                    && first * WRITE_PIECE + start == range.start
                    && range.len() == header.data_segment_length as usize
                    && range.end <= buffer.len()
                    && pages.iter().enumerate().all(|(i, page)| {
                        buffer
                            .pieces_mut()
                            .get(first + i)
                            .is_some_and(|piece| piece.len() == page.len())
                    })
            }
            _ => false,
        };
        let taken = if laid_out { self.current.take() } else { None };
        let Some((
            _,
            Current::Placed(Placed {
                sink: Sink::Pieces { pages, first },
                ..
            }),
        )) = taken
        else {
            return crate::primitives::receive_data_in_buffer_by_parts(self, buffer, range).await;
        };
        for (i, page) in pages.into_iter().enumerate() {
            let index = first + i;
            let base = index * WRITE_PIECE;
            let piece = &mut buffer.pieces_mut()[index];
            // The part of this piece the burst covers.
            let covered = range.start.max(base) - base..range.end.min(base + piece.len()) - base;
            self.shared.give_buffer(land(piece, page, covered));
        }
        Ok(())
    }

    async fn receive_data(&mut self) -> Result<Vec<u8>, DatamoverError> {
        let len = self
            .current
            .as_ref()
            .map_or(0, |(header, _)| header.data_segment_length as usize);
        if let Some((
            _,
            Current::Placed(Placed {
                start: 0,
                sink: Sink::Flat(_),
            }),
        )) = &self.current
        {
            // Placed data is already a buffer of its own: no copy.
            if let Some((
                _,
                Current::Placed(Placed {
                    sink: Sink::Flat(mut buffer),
                    ..
                }),
            )) = self.current.take()
            {
                buffer.truncate(len);
                return Ok(buffer);
            }
        }
        let mut data = vec![0; len];
        self.receive_data_into(&mut data).await?;
        Ok(data)
    }
}
