//! The send direction of an iSER connection (RFC 7145 sections 7.3, 9.5).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use iscsi_iwarp::{Access, LocalBuffer, RemoteBuffer, SendOp, Sge};
use iscsi_proto::pdu::encode::{MAX_HEADER_LEN, encode_header};
use iscsi_proto::pdu::{DataIn, DataOut, Header, Pdu, ScsiCommand, ScsiResponse, ServiceResponse};
use iscsi_proto::serial::DataSn;

use super::header::{Advertised, HEADER_LEN, IserHeader};
use super::shared::{IserRole, LocalTask, PendingRead, SINK_PREFIX_MAX, Shared, lock, transport};
use crate::primitives::{DatamoverError, PduSender};
use crate::tap::{Direction, PduSummary};
use crate::tcp::PduBatch;
use crate::write_buffer::WRITE_PIECE;

/// A Data-In's data: borrowed (copied into a payload buffer of the
/// connection's) or a buffer the Write can go out from as it is.
enum Payload<'a> {
    Borrowed(&'a [u8]),
    Owned(bytes::Bytes),
    /// Shared pieces: one RDMA Write with the pieces as its gather list,
    /// none copied.
    Gather(crate::gather::Gather),
}

impl Payload<'_> {
    fn is_empty(&self) -> bool {
        match self {
            Payload::Borrowed(data) => data.is_empty(),
            Payload::Owned(data) => data.is_empty(),
            Payload::Gather(data) => data.is_empty(),
        }
    }
}

/// The send direction: every PDU becomes a Send, a Write or a Read.
#[derive(Debug)]
pub struct IserSender {
    shared: Arc<Shared>,
}

impl IserSender {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        IserSender { shared }
    }

    pub(super) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Tells `tap` of every PDU sent and received from now on.
    pub fn set_tap(&mut self, tap: Option<crate::tap::Tap>) {
        *lock(&self.shared.tap) = tap;
    }

    /// Tells the tap of one PDU about to be sent (counters count it here,
    /// see [`crate::tap::WireTap::sending`]), and gives the time it begins.
    fn tap_sending(&self, header: &Header) -> Instant {
        if let Some(tap) = lock(&self.shared.tap).as_ref() {
            tap.sending(&PduSummary::of(header));
        }
        Instant::now()
    }

    /// Tells the tap of one PDU sent.
    fn tapped(&self, header: &Header, start: Instant) {
        if let Some(tap) = lock(&self.shared.tap).as_ref() {
            tap.pdu(
                Direction::Sent,
                PduSummary::of(header),
                start,
                Instant::now(),
            );
        }
    }

    /// One control-type PDU in a Send: iSER header, BHS, AHS and data
    /// (no padding: the Send's length delimits the PDU).
    async fn send_message(
        &self,
        iser: IserHeader,
        header: &Header,
        data: &[u8],
        invalidate: Option<u32>,
    ) -> Result<(), DatamoverError> {
        if header.data_segment_length as usize != data.len() {
            return Err(DatamoverError::Misuse(
                "data length differs from the header's DataSegmentLength",
            ));
        }
        let mut message = Vec::with_capacity(HEADER_LEN + MAX_HEADER_LEN + data.len());
        message.extend_from_slice(&iser.emit());
        let mut bhs = [0u8; MAX_HEADER_LEN];
        let len = encode_header(header, false, &mut bhs)
            .map_err(|e| DatamoverError::Encode(e.to_string()))?;
        message.extend_from_slice(&bhs[..len]);
        message.extend_from_slice(data);
        let op = SendOp::Send {
            data: vec![Sge::Bytes(Bytes::from(message))],
            solicited: false,
            invalidate,
        };
        self.shared.post(op).await.map(drop)
    }

    /// Target: an R2T becomes an RDMA Read of the burst from the
    /// initiator's Write STag; its completion comes back through the
    /// receiver as the Data-Out the R2T asks for.
    async fn read_burst(&self, header: &Header) -> Result<(), DatamoverError> {
        let Pdu::ReadyToTransfer(r2t) = &header.pdu else {
            return Err(DatamoverError::Misuse("not an R2T"));
        };
        let itt = r2t.initiator_task_tag;
        let advertised = lock(&self.shared.remote_tasks).get(&itt).and_then(|task| {
            task.write
                .map(|write| (write, task.unsolicited, task.expected))
        });
        let Some((Advertised { stag, base }, unsolicited, expected)) = advertised else {
            // The initiator asked for a write it gave no buffer for: no
            // way to get the data (RFC 7145 7.3.1 requires WSV).
            return Err(transport(format!(
                "write task {itt:#x} needs solicited data but its command advertised no Write STag"
            )));
        };
        let length = r2t.desired_data_transfer_length;
        let (offset, expected) = (r2t.buffer_offset as usize, expected as usize);
        let (region, start, first_piece) = if expected >= WRITE_PIECE && length > 0 {
            // The target receives this write in pieces of `WRITE_PIECE`
            // (`WriteBuffer`): the sink is a page-list region of those
            // pieces the burst touches, each as long as its piece, so that
            // the target takes the pages as its pieces (no copy).
            let first = offset / WRITE_PIECE;
            let last = (offset + length as usize - 1) / WRITE_PIECE;
            let pages = (first..=last)
                .map(|k| {
                    let piece_end = ((k + 1) * WRITE_PIECE).min(expected);
                    self.shared
                        .take_buffer(piece_end.saturating_sub(k * WRITE_PIECE))
                })
                .collect();
            let region = self
                .shared
                .qp
                .pd()
                .register_pages(pages, Access::LOCAL_WRITE);
            (region, offset - first * WRITE_PIECE, Some(first))
        } else {
            // A burst near the start of the data lands where it will lie in
            // the task's buffer (see `SINK_PREFIX_MAX`); a later one at
            // offset 0.
            let start = if offset <= SINK_PREFIX_MAX { offset } else { 0 };
            let region = self.shared.register(
                self.shared.take_buffer(start + length as usize),
                Access::LOCAL_WRITE,
            );
            (region, start, None)
        };
        let local = LocalBuffer {
            stag: region.stag(),
            offset: start,
            len: length as usize,
        };
        // The Write Base Offset names the first solicited byte (RFC 7145
        // 9.1): the R2T's offset counts from the start of the data.
        let Some(solicited) = r2t.buffer_offset.checked_sub(unsolicited) else {
            return Err(transport(format!(
                "R2T at offset {} inside the {unsolicited} unsolicited bytes of task {itt:#x}",
                r2t.buffer_offset
            )));
        };
        let remote = RemoteBuffer {
            stag,
            to: base.wrapping_add(u64::from(solicited)),
        };
        let data_out = Header::new(
            Pdu::DataOut(DataOut {
                final_flag: true,
                lun: r2t.lun,
                initiator_task_tag: itt,
                target_transfer_tag: r2t.target_transfer_tag,
                exp_stat_sn: iscsi_proto::serial::StatSn::new(0),
                data_sn: DataSn::new(0),
                buffer_offset: r2t.buffer_offset,
            }),
            length,
        );
        let wr_id = self
            .shared
            .next_wr_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.shared.reads).insert(
            wr_id,
            PendingRead {
                region,
                start,
                first_piece,
                header: data_out,
            },
        );
        if let Err(error) = self
            .shared
            .post_as(wr_id, SendOp::RdmaRead { local, remote })
            .await
        {
            if let Some(read) = lock(&self.shared.reads).remove(&wr_id) {
                self.shared.release(read.region);
            }
            return Err(error);
        }
        Ok(())
    }

    /// Target: the SCSI Response ends the task; it invalidates the task's
    /// STag when the initiator takes Send with Invalidate (RFC 7145
    /// 7.3.4; the Read STag when there is one, as Linux isert does).
    async fn respond(&self, header: &Header, data: &[u8], itt: u32) -> Result<(), DatamoverError> {
        let task = lock(&self.shared.remote_tasks).remove(&itt);
        let invalidate = task
            .filter(|_| self.shared.config.send_with_invalidate)
            .and_then(|task| task.read.or(task.write))
            .map(|buffer| buffer.stag);
        self.send_message(IserHeader::PLAIN, header, data, invalidate)
            .await
    }

    /// Initiator: the SCSI Command's iSER header advertises a registered
    /// buffer for the read data (RSV) and, when the write data was
    /// described, for it (WSV).
    fn advertise(&self, command: &ScsiCommand, immediate: usize) -> IserHeader {
        let itt = command.initiator_task_tag;
        let mut tasks = lock(&self.shared.local_tasks);
        let described = tasks.remove(&itt);
        let mut task = LocalTask::default();
        if let Some(described) = described {
            task.write = described.write;
            if let Some((region, _)) = described.read {
                self.shared.release(region);
            }
        }
        let expected = command.expected_data_transfer_length;
        // Data all sent in the command needs no buffer on the target side.
        if (!command.write || immediate as u32 >= expected)
            && let Some(region) = task.write.take()
        {
            self.shared.release(region);
        }
        if command.read && expected > 0 {
            let region = self.shared.register(
                self.shared.take_buffer(expected as usize),
                Access::REMOTE_WRITE,
            );
            task.read = Some((region, expected));
        }
        let write = task.write.as_ref().map(|region| Advertised {
            stag: region.stag(),
            base: region.addr(),
        });
        let read = task.read.as_ref().map(|(region, _)| Advertised {
            stag: region.stag(),
            base: region.addr(),
        });
        if task.write.is_some() || task.read.is_some() {
            tasks.insert(itt, task);
        }
        IserHeader::Control { write, read }
    }

    /// A Data-In as an RDMA Write of its data into the initiator's Read
    /// STag at its offset. A Data-In carrying status (phase collapse) is
    /// followed by the SCSI Response iSER requires instead (RFC 7145
    /// 7.3.5).
    async fn write_data_in(
        &self,
        data_in: &DataIn,
        data: Payload<'_>,
    ) -> Result<(), DatamoverError> {
        let itt = data_in.initiator_task_tag;
        if !data.is_empty() {
            let advertised = lock(&self.shared.remote_tasks)
                .get(&itt)
                .and_then(|task| task.read);
            let Some(Advertised { stag, base }) = advertised else {
                return Err(transport(format!(
                    "read task {itt:#x} has data but its command advertised no Read STag"
                )));
            };
            let to = base.wrapping_add(u64::from(data_in.buffer_offset));
            let wr_id = self
                .shared
                .next_wr_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // One Write whatever the pieces: FPDUs cut across a gather's
            // pieces stay MULPDU-sized (one Write per 64 KiB chunk made
            // every other FPDU a sliver and cost the initiator a copy of
            // each out of its receive buffer).
            let sges: Vec<Sge> = match data {
                Payload::Borrowed(data) => vec![Sge::Bytes(self.shared.payload(wr_id, data))],
                Payload::Owned(data) => vec![Sge::Bytes(data)],
                Payload::Gather(data) => data.pieces().iter().cloned().map(Sge::Bytes).collect(),
            };
            let op = SendOp::RdmaWrite {
                data: sges,
                remote: RemoteBuffer { stag, to },
            };
            if let Err(error) = self.shared.post_as(wr_id, op).await {
                self.shared.payload_done(wr_id);
                return Err(error);
            }
        }
        if let Some(status) = data_in.status {
            let response = ScsiResponse {
                bidi_read_residual_overflow: false,
                bidi_read_residual_underflow: false,
                residual_overflow: data_in.residual_overflow,
                residual_underflow: data_in.residual_underflow,
                response: ServiceResponse::CommandCompleted,
                status,
                initiator_task_tag: itt,
                snack_tag: 0,
                stat_sn: data_in.stat_sn,
                exp_cmd_sn: data_in.exp_cmd_sn,
                max_cmd_sn: data_in.max_cmd_sn,
                exp_data_sn: DataSn::new(data_in.data_sn.get().wrapping_add(1)),
                bidi_read_residual_count: 0,
                residual_count: data_in.residual_count,
            };
            let header = Header::new(Pdu::ScsiResponse(response), 0);
            self.respond(&header, &[], itt).await?;
        }
        Ok(())
    }

    /// Sends one PDU the way its kind travels over iSER.
    async fn send_pdu(&self, header: &Header, data: &[u8]) -> Result<(), DatamoverError> {
        let start = self.tap_sending(header);
        match (&header.pdu, self.shared.role) {
            (Pdu::ReadyToTransfer(_), IserRole::Target) => self.read_burst(header).await?,
            (Pdu::ScsiResponse(response), IserRole::Target) => {
                self.respond(header, data, response.initiator_task_tag)
                    .await?
            }
            (Pdu::DataIn(data_in), IserRole::Target) => {
                self.write_data_in(data_in, Payload::Borrowed(data)).await?
            }
            (Pdu::ScsiCommand(command), IserRole::Initiator) => {
                let iser = self.advertise(command, data.len());
                self.send_message(iser, header, data, None).await?
            }
            _ => {
                self.send_message(IserHeader::PLAIN, header, data, None)
                    .await?
            }
        }
        self.tapped(header, start);
        Ok(())
    }

    /// `Send_Control` for every PDU of `batch` (the initiator's posted
    /// PDUs), in order.
    pub async fn send_batch(&mut self, batch: &PduBatch) -> Result<(), DatamoverError> {
        for (header, data) in batch.pdus()? {
            self.send_pdu(&header, data).await?;
        }
        Ok(())
    }

    /// `Send_Control` behind a batch.
    pub async fn send_control_after(
        &mut self,
        batch: &PduBatch,
        header: &Header,
        data: &[u8],
    ) -> Result<(), DatamoverError> {
        self.send_batch(batch).await?;
        self.send_pdu(header, data).await
    }
}

impl PduSender for IserSender {
    async fn send_control(&mut self, header: &Header, data: &[u8]) -> Result<(), DatamoverError> {
        self.send_pdu(header, data).await
    }

    /// `Put_Data`: an RDMA Write of the Data-In's data into the
    /// initiator's Read STag at the Data-In's offset. A Data-In carrying
    /// status (phase collapse) is followed by the SCSI Response iSER
    /// requires instead (RFC 7145 7.3.5).
    async fn put_data(&mut self, header: &Header, data: &[u8]) -> Result<(), DatamoverError> {
        self.send_pdu(header, data).await
    }

    /// `Put_Data` from a buffer the Write can go out from as it is.
    async fn put_data_owned(
        &mut self,
        header: &Header,
        data: bytes::Bytes,
    ) -> Result<(), DatamoverError> {
        match (&header.pdu, self.shared.role) {
            (Pdu::DataIn(data_in), IserRole::Target) => {
                let start = self.tap_sending(header);
                self.write_data_in(data_in, Payload::Owned(data)).await?;
                self.tapped(header, start);
                Ok(())
            }
            _ => self.send_pdu(header, &data).await,
        }
    }

    /// `Put_Data` from shared pieces: an RDMA Write from each, as it is.
    async fn put_data_gather(
        &mut self,
        header: &Header,
        data: crate::gather::Gather,
    ) -> Result<(), DatamoverError> {
        match (&header.pdu, self.shared.role) {
            (Pdu::DataIn(data_in), IserRole::Target) => {
                let start = self.tap_sending(header);
                self.write_data_in(data_in, Payload::Gather(data)).await?;
                self.tapped(header, start);
                Ok(())
            }
            _ => self.send_pdu(header, &data.joined()).await,
        }
    }

    async fn terminate(&mut self) -> Result<(), DatamoverError> {
        self.shared.qp.disconnect().await;
        Ok(())
    }
}
