//! The TCP datamover: RFC 7143 PDU framing over a byte stream (RFC 7143
//! section 4.2.2 for the framing, 11.2 for the PDU layout, 13.12 for
//! MaxRecvDataSegmentLength), implementing the RFC 5047 primitives of the
//! crate root.
//!
//! Receiving keeps one buffer per connection, reused for every PDU. A data
//! segment is copied out of it with the data digest computed in the same
//! pass (the protocol core's fused copy+CRC32C); the large remainder of a
//! big segment is read by the kernel straight into the caller's destination
//! and digested right after, while it is still in cache. Sending hands the
//! encoder's header, data, padding and digest slices to one vectored write,
//! so a data segment is never copied into a PDU buffer; only PDUs with
//! short data are copied, when held back to leave together
//! ([`StreamSender::hold`]), and the receiver tells when the next PDU is
//! already buffered whole ([`StreamReceiver::has_whole_pdu`]), which is
//! when holding pays.
//!
//! [`StreamReceiver`] and [`StreamSender`] work over any tokio byte stream;
//! [`TcpDatamover`] pairs them over the two halves of a `TcpStream`.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::time::Instant;

use iscsi_proto::pdu::decoder::{Decoder, DecoderConfig, Event, Stage};
use iscsi_proto::pdu::encode::{DataTrailer, MAX_HEADER_LEN, encode_header};
use iscsi_proto::pdu::{BHS_LEN, Digests, Header, SegmentLengths, encode_pdu};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::primitives::{DatamoverError, PduReceiver, PduSender};
use crate::tap::{Direction, PduSummary, Tap};

/// Size of the receive buffer.
const BUFFER_SIZE: usize = 64 * 1024;

/// Bytes read into the receive buffer at a time, at most. Small enough
/// that a read made to fetch the next header takes few bytes of a large
/// data segment with it (those are copied once more, out of the buffer;
/// the rest of the segment is read by the kernel straight into place),
/// large enough that small PDUs arrive several per read. Measured with
/// 1 MiB reads in 256 KiB Data-In PDUs: reading 256 KiB at a time put a
/// user-space copy of most of the data on the profile (20% of the cycles).
const READ_CHUNK: usize = 16 * 1024;

/// Data still to come in a segment at or above which it is read by the
/// kernel straight into the caller's destination instead of through the
/// receive buffer (below it, one buffered read also picks up the next
/// headers).
const DIRECT_READ_THRESHOLD: usize = 16 * 1024;

/// The receive direction over any byte stream.
#[derive(Debug)]
pub struct StreamReceiver<R> {
    reader: R,
    decoder: Decoder,
    buffer: Vec<u8>,
    start: usize,
    end: usize,
    /// Data bytes of the current PDU not yet handed to the caller.
    data_pending: usize,
    /// Told of every PDU received.
    tap: Option<Tap>,
    /// The PDU being received, for the tap: what it is and when its header
    /// was decoded.
    tapped: Option<(PduSummary, Instant)>,
}

impl<R: AsyncRead + Unpin + Send> StreamReceiver<R> {
    /// The stream it receives from.
    pub fn get_ref(&self) -> &R {
        &self.reader
    }

    /// Receives from `reader` with login-phase settings (no digests,
    /// MaxRecvDataSegmentLength 8192).
    pub fn new(reader: R) -> Self {
        StreamReceiver {
            reader,
            decoder: Decoder::new(DecoderConfig::default()),
            buffer: vec![0; BUFFER_SIZE],
            start: 0,
            end: 0,
            data_pending: 0,
            tap: None,
            tapped: None,
        }
    }

    /// Tells `tap` of every PDU received from now on.
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.tap = tap;
    }

    /// Reports the PDU that has just been taken in whole to the tap.
    fn tap_received(&mut self) {
        if let (Some(tap), Some((pdu, start))) = (&self.tap, self.tapped.take()) {
            tap.pdu(Direction::Received, pdu, start, Instant::now());
        }
    }

    /// Applies full feature phase settings from the next PDU on (RFC 5047
    /// `Notice_Key_Values`): the digests the peer sends and the
    /// MaxRecvDataSegmentLength this side declared.
    pub fn enable(&mut self, digests: Digests, max_recv_data_segment_length: u32) {
        self.decoder.set_config(DecoderConfig {
            max_recv_data_segment_length,
            digests,
            ..self.decoder.config()
        });
    }

    /// Whether the next PDU is in the receive buffer whole: taking it in
    /// (header and data) reads nothing more from the stream, so a caller
    /// that answers it at once does not wait on the peer meanwhile.
    pub fn has_whole_pdu(&self) -> bool {
        // Between PDUs: the last one taken in whole, nothing of the next
        // one fed to the decoder yet.
        let need = self.decoder.need();
        let between = match need.stage {
            Stage::Complete => true,
            Stage::Bhs => need.bytes == BHS_LEN,
            _ => false,
        };
        if self.data_pending > 0 || !between {
            return false;
        }
        let buffered = &self.buffer[self.start..self.end];
        let Some(bhs) = buffered.first_chunk::<BHS_LEN>() else {
            return false;
        };
        let lengths = SegmentLengths::of_bhs(bhs);
        buffered.len() >= lengths.pdu_len(self.decoder.config().digests)
    }

    /// Makes room and reads more bytes into the buffer. Returns the count
    /// (0 at end of stream).
    async fn fill(&mut self) -> Result<usize, DatamoverError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end + READ_CHUNK > self.buffer.len() {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let limit = (self.end + READ_CHUNK).min(self.buffer.len());
        if limit == self.end {
            // Unconsumed bytes fill the buffer: nothing of a PDU is kept
            // that long, so this is a caller bug, not end of stream.
            return Err(DatamoverError::Misuse("receive buffer full"));
        }
        let n = self.reader.read(&mut self.buffer[self.end..limit]).await?;
        self.end += n;
        Ok(n)
    }

    /// Feeds buffered bytes until the current PDU's end (padding read, data
    /// digest verified).
    async fn finish_pdu(&mut self) -> Result<(), DatamoverError> {
        loop {
            let progress = self.decoder.feed(&self.buffer[self.start..self.end])?;
            self.start += progress.consumed;
            match progress.event {
                Some(Event::End) => return Ok(()),
                Some(Event::Header(_)) | Some(Event::Data(_)) => {
                    return Err(DatamoverError::Misuse("PDU end expected"));
                }
                None if progress.consumed > 0 => continue,
                None => {}
            }
            if self.fill().await? == 0 {
                return Err(DatamoverError::Truncated);
            }
        }
    }
}

impl<R: AsyncRead + Unpin + Send> PduReceiver for StreamReceiver<R> {
    async fn receive_header(&mut self) -> Result<Option<Header>, DatamoverError> {
        if self.data_pending > 0 {
            return Err(DatamoverError::Misuse(
                "the previous PDU's data segment was not received",
            ));
        }
        loop {
            // Feed even with nothing buffered: the decoder reports the end
            // of a PDU on the call after its last byte, which may need no
            // new input.
            let progress = self.decoder.feed(&self.buffer[self.start..self.end])?;
            self.start += progress.consumed;
            match progress.event {
                Some(Event::Header(header)) => {
                    // The decoder has checked the length against our
                    // MaxRecvDataSegmentLength before anyone allocates.
                    self.data_pending = header.data_segment_length as usize;
                    if self.tap.is_some() {
                        self.tapped = Some((PduSummary::of(&header), Instant::now()));
                        if self.data_pending == 0 {
                            self.tap_received();
                        }
                    }
                    return Ok(Some(header));
                }
                Some(Event::End) => continue,
                Some(Event::Data(_)) => {
                    return Err(DatamoverError::Misuse("data where a header was expected"));
                }
                None if progress.consumed > 0 => continue,
                None => {}
            }
            if self.fill().await? == 0 {
                return if self.decoder.is_at_boundary() && self.start == self.end {
                    Ok(None)
                } else {
                    Err(DatamoverError::Truncated)
                };
            }
        }
    }

    async fn receive_data_into(&mut self, destination: &mut [u8]) -> Result<(), DatamoverError> {
        self.receive_data_into_slices(&mut [destination]).await
    }

    /// Each destination in turn: what is buffered is copied out with the
    /// digest computed in the same pass; a long stretch still on its way
    /// is read by the kernel straight into place and digested at once,
    /// while in cache.
    async fn receive_data_into_slices(
        &mut self,
        destinations: &mut [&mut [u8]],
    ) -> Result<(), DatamoverError> {
        if destinations.iter().map(|d| d.len()).sum::<usize>() != self.data_pending {
            return Err(DatamoverError::Misuse(
                "destination length differs from the data segment length",
            ));
        }
        if self.data_pending == 0 {
            return Ok(());
        }
        for destination in destinations.iter_mut() {
            let destination: &mut [u8] = destination;
            let mut filled = 0;
            while filled < destination.len() {
                if self.start < self.end {
                    let n = self.decoder.receive_data(
                        &mut destination[filled..],
                        &self.buffer[self.start..self.end],
                    )?;
                    self.start += n;
                    filled += n;
                    continue;
                }
                let left = destination.len() - filled;
                if left >= DIRECT_READ_THRESHOLD {
                    let n = self.reader.read(&mut destination[filled..]).await?;
                    if n == 0 {
                        return Err(DatamoverError::Truncated);
                    }
                    self.decoder
                        .data_received(&destination[filled..filled + n])?;
                    filled += n;
                } else if self.fill().await? == 0 {
                    return Err(DatamoverError::Truncated);
                }
            }
        }
        self.data_pending = 0;
        debug_assert!(matches!(
            self.decoder.need().stage,
            Stage::Padding | Stage::DataDigest | Stage::Complete
        ));
        self.finish_pdu().await?;
        self.tap_received();
        Ok(())
    }

    async fn receive_data(&mut self) -> Result<Vec<u8>, DatamoverError> {
        let mut data = vec![0; self.data_pending];
        self.receive_data_into(&mut data).await?;
        Ok(data)
    }
}

/// PDUs encoded back to back into one buffer (each with its header
/// digest, data, padding and data digest), to be written together: many
/// small PDUs then cost one system call and, over TCP with Nagle's
/// algorithm off, usually one segment instead of one each. RFC 7143
/// section 4.2.2.1 asks only that a connection carry commands in CmdSN
/// order, which a batch keeps: PDUs go out in the order they were pushed.
///
/// The data segment is copied into the batch, so a batch is for PDUs with
/// small data (commands, immediate data of a small write, NOP-Outs); a
/// large segment goes out without a copy through
/// [`StreamSender::send_control_after`], behind the batch.
#[derive(Debug, Default)]
pub struct PduBatch {
    bytes: Vec<u8>,
    pdus: usize,
    digests: Digests,
    /// What each PDU is, for a tap on the sender that writes the batch.
    summaries: Vec<PduSummary>,
}

impl PduBatch {
    /// An empty batch for a connection with these digests (they must be
    /// the ones the sending [`StreamSender`] was enabled with).
    pub fn new(digests: Digests) -> Self {
        PduBatch {
            bytes: Vec::new(),
            pdus: 0,
            digests,
            summaries: Vec::new(),
        }
    }

    /// Encodes one PDU at the end of the batch.
    pub fn push(&mut self, header: &Header, data: &[u8]) -> Result<(), DatamoverError> {
        let mut header_buf = [0u8; MAX_HEADER_LEN];
        let pdu = encode_pdu(header, data, self.digests, &mut header_buf)
            .map_err(|e| DatamoverError::Encode(e.to_string()))?;
        self.bytes.reserve(pdu.wire_len());
        for slice in pdu.slices() {
            self.bytes.extend_from_slice(slice);
        }
        self.pdus += 1;
        self.summaries.push(PduSummary::of(header));
        Ok(())
    }

    /// PDUs in the batch.
    pub fn len(&self) -> usize {
        self.pdus
    }

    /// Whether the batch holds no PDU.
    pub fn is_empty(&self) -> bool {
        self.pdus == 0
    }

    /// The encoded PDUs, as they go on the wire.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Each PDU of the batch again: its header and its data segment (for
    /// a transport that sends PDUs one message each, such as iSER).
    pub fn pdus(&self) -> Result<Vec<(Header, &[u8])>, DatamoverError> {
        let config = DecoderConfig {
            max_recv_data_segment_length: u32::MAX,
            digests: self.digests,
            ..DecoderConfig::default()
        };
        let mut pdus = Vec::with_capacity(self.pdus);
        let mut rest = &self.bytes[..];
        while !rest.is_empty() {
            let (header, header_len) = crate::primitives::decode_header(rest, config)?;
            let data_len = header.data_segment_length as usize;
            let padding = data_len.wrapping_neg() & 3;
            let digest = if self.digests.data && data_len > 0 {
                4
            } else {
                0
            };
            let data = rest
                .get(header_len..header_len + data_len)
                .ok_or(DatamoverError::Truncated)?;
            rest = rest
                .get(header_len + data_len + padding + digest..)
                .ok_or(DatamoverError::Truncated)?;
            pdus.push((header, data));
        }
        Ok(pdus)
    }

    /// Moves every PDU of `other` to the end of this batch, leaving
    /// `other` empty (without a copy when this batch is empty).
    pub fn append(&mut self, other: &mut PduBatch) {
        if self.is_empty() {
            std::mem::swap(self, other);
        } else {
            self.bytes.extend_from_slice(&other.bytes);
            self.pdus += other.pdus;
            self.summaries.append(&mut other.summaries);
            other.bytes.clear();
            other.pdus = 0;
        }
    }

    /// Empties the batch; keeps up to `retain` bytes of its allocation
    /// for the next PDUs (a burst of large PDUs is not kept for good).
    pub fn clear(&mut self, retain: usize) {
        self.bytes.clear();
        self.bytes.shrink_to(retain);
        self.pdus = 0;
        self.summaries.clear();
    }
}

/// The most data a PDU may carry and still be held back
/// ([`StreamSender::hold`]) rather than written at once: the answers to
/// short commands. Held PDUs are copied into the batch.
const HOLD_DATA_MAX: usize = 64 * 1024;

/// The most bytes held back at once: a PDU that would go past it is
/// written at once, with everything held before it.
const HELD_MAX: usize = 256 * 1024;

/// The send direction over any byte stream.
#[derive(Debug)]
pub struct StreamSender<W> {
    writer: W,
    digests: Digests,
    header_buf: Vec<u8>,
    /// Told of every PDU sent.
    tap: Option<Tap>,
    /// Whether short PDUs are held back (see [`StreamSender::hold`]).
    holding: bool,
    /// PDUs held back, in order; written before anything else is.
    held: PduBatch,
}

impl<W: AsyncWrite + Unpin + Send> StreamSender<W> {
    /// Sends on `writer` with login-phase settings (no digests).
    pub fn new(writer: W) -> Self {
        StreamSender {
            writer,
            digests: Digests::default(),
            header_buf: vec![0; MAX_HEADER_LEN],
            tap: None,
            holding: false,
            held: PduBatch::default(),
        }
    }

    /// While `on`, a PDU with a short data segment is not written but held
    /// back, to go out in one write with the next PDU written or at
    /// [`StreamSender::flush`]: the answers to a run of short commands
    /// that arrived together leave in one segment, which costs one system
    /// call here and one wake-up of the peer instead of one each. Held
    /// PDUs keep their order among everything sent; the caller must flush
    /// before it waits for the peer.
    pub fn hold(&mut self, on: bool) {
        self.holding = on;
    }

    /// Writes every PDU held back ([`StreamSender::hold`]).
    pub async fn flush(&mut self) -> Result<(), DatamoverError> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        let result = self.write_batch(&held).await;
        self.restore_held(held);
        result
    }

    /// Writes `batch` as it is (nothing held goes before it).
    async fn write_batch(&mut self, batch: &PduBatch) -> Result<(), DatamoverError> {
        let start = self.tap_sending(&batch.summaries, None);
        self.writer.write_all(&batch.bytes).await?;
        self.tap_sent(&batch.summaries, None, start);
        Ok(())
    }

    /// Whether a PDU of `data_len` bytes of data is held back now, rather
    /// than written (a header whose length disagrees is refused either
    /// way, by the encoder).
    fn holds(&self, data_len: usize) -> bool {
        self.holding
            && data_len <= HOLD_DATA_MAX
            && self.held.bytes.len() + MAX_HEADER_LEN + data_len + 8 <= HELD_MAX
    }

    /// Writes what is held back, then one PDU (`slices`, from its header
    /// on) in the same vectored write, and tells the tap of them all.
    async fn write_behind_held(
        &mut self,
        header: &Header,
        slices: &[&[u8]],
    ) -> Result<(), DatamoverError> {
        let held = std::mem::take(&mut self.held);
        let start = self.tap_sending(&held.summaries, Some(header));
        let mut all: Vec<&[u8]> = Vec::with_capacity(slices.len() + 1);
        all.push(&held.bytes);
        all.extend_from_slice(slices);
        let result = write_all_vectored(&mut self.writer, &all)
            .await
            .map_err(DatamoverError::from);
        if result.is_ok() {
            self.tap_sent(&held.summaries, Some(header), start);
        }
        drop(all);
        self.restore_held(held);
        result
    }

    /// Puts back the held batch after writing it: emptied, its allocation
    /// kept for the next run.
    fn restore_held(&mut self, mut held: PduBatch) {
        held.clear(HELD_MAX);
        self.held = held;
    }

    /// Tells `tap` of every PDU sent from now on.
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.tap = tap;
    }

    /// Tells the tap of the PDUs one write is about to carry (a batch, then
    /// perhaps one more), and gives the time the write begins, when a tap
    /// wants it.
    fn tap_sending(&self, batch: &[PduSummary], last: Option<&Header>) -> Option<Instant> {
        let tap = self.tap.as_ref()?;
        for pdu in batch {
            tap.sending(pdu);
        }
        if let Some(header) = last {
            tap.sending(&PduSummary::of(header));
        }
        Some(Instant::now())
    }

    /// Reports the PDUs of one write (a batch, then perhaps one more) to
    /// the tap.
    fn tap_sent(&self, batch: &[PduSummary], last: Option<&Header>, start: Option<Instant>) {
        if let (Some(tap), Some(start)) = (&self.tap, start) {
            let end = Instant::now();
            for pdu in batch {
                tap.pdu(Direction::Sent, *pdu, start, end);
            }
            if let Some(header) = last {
                tap.pdu(Direction::Sent, PduSummary::of(header), start, end);
            }
        }
    }

    /// Applies the negotiated digests from the next PDU on (RFC 5047
    /// `Notice_Key_Values`).
    pub fn enable(&mut self, digests: Digests) {
        self.digests = digests;
        // Nothing is held during login, when keys are applied.
        debug_assert!(self.held.is_empty());
        self.held = PduBatch::new(digests);
    }

    /// The underlying stream, for writing bytes that are not a well-formed
    /// PDU (tests of how a peer handles corrupted input).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.writer
    }

    /// The digests PDUs are sent with (for a [`PduBatch`] of this
    /// connection).
    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// Writes every PDU of `batch`, in order, with as few writes as the
    /// stream allows (one, unless the socket buffer fills). The batch is
    /// left as it was.
    pub async fn send_batch(&mut self, batch: &PduBatch) -> Result<(), DatamoverError> {
        self.flush().await?;
        self.write_batch(batch).await
    }

    /// `Send_Control` behind a batch: the batch's PDUs, then `header` with
    /// `data` (not copied), in one vectored write where the stream takes
    /// it all.
    pub async fn send_control_after(
        &mut self,
        batch: &PduBatch,
        header: &Header,
        data: &[u8],
    ) -> Result<(), DatamoverError> {
        self.flush().await?;
        let start = self.tap_sending(&batch.summaries, Some(header));
        let pdu = encode_pdu(header, data, self.digests, &mut self.header_buf)
            .map_err(|e| DatamoverError::Encode(e.to_string()))?;
        let [pdu_header, pdu_data, padding, digest] = pdu.slices();
        write_all_vectored(
            &mut self.writer,
            &[&batch.bytes, pdu_header, pdu_data, padding, digest],
        )
        .await?;
        self.tap_sent(&batch.summaries, Some(header), start);
        Ok(())
    }
}

impl<W: AsyncWrite + Unpin + Send> PduSender for StreamSender<W> {
    /// Held back while holding and short (the PDUs held before it then stay
    /// before it), else written at once behind whatever was held, in one
    /// vectored write.
    async fn send_control(&mut self, header: &Header, data: &[u8]) -> Result<(), DatamoverError> {
        if self.holds(data.len()) {
            return self.held.push(header, data);
        }
        let mut header_buf = std::mem::take(&mut self.header_buf);
        let result = match encode_pdu(header, data, self.digests, &mut header_buf) {
            Ok(pdu) => self.write_behind_held(header, &pdu.slices()).await,
            Err(e) => Err(DatamoverError::Encode(e.to_string())),
        };
        self.header_buf = header_buf;
        result
    }

    /// One vectored write: the header, every piece where it lies, the
    /// padding and the data digest (over the pieces in turn, a piece whose
    /// CRC32C is known combined from it: `Gather::crc32c`).
    async fn put_data_gather(
        &mut self,
        header: &Header,
        data: crate::gather::Gather,
    ) -> Result<(), DatamoverError> {
        if usize::try_from(header.data_segment_length).ok() != Some(data.len()) {
            return Err(DatamoverError::Encode(format!(
                "data segment length {} but {} bytes of data",
                header.data_segment_length,
                data.len()
            )));
        }
        // One piece whose CRC is not known already: the ordinary path
        // (digest computed while encoding, held back when short) without
        // the slice list.
        if let [one] = data.pieces()
            && !(self.digests.data && data.has_known_crcs())
        {
            return self.send_control(header, one).await;
        }
        let mut header_buf = std::mem::take(&mut self.header_buf);
        let result = match encode_header(header, self.digests.header, &mut header_buf) {
            Ok(len) => {
                let crc = if self.digests.data { data.crc32c() } else { 0 };
                let trailer = DataTrailer::from_data_crc(data.len(), crc, self.digests.data);
                let mut slices: Vec<&[u8]> = Vec::with_capacity(data.pieces().len() + 3);
                slices.push(&header_buf[..len]);
                slices.extend(data.pieces().iter().map(|piece| &piece[..]));
                slices.push(trailer.padding());
                slices.push(trailer.digest());
                self.write_behind_held(header, &slices).await
            }
            Err(e) => Err(DatamoverError::Encode(e.to_string())),
        };
        self.header_buf = header_buf;
        result
    }

    /// Writes what is held back, then closes the send direction.
    async fn terminate(&mut self) -> Result<(), DatamoverError> {
        let flushed = self.flush().await;
        self.writer.shutdown().await?;
        flushed
    }
}

/// Writes every byte of `slices` with as few vectored writes as the stream
/// allows.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    writer: &mut W,
    slices: &[&[u8]],
) -> std::io::Result<()> {
    let mut index = 0;
    let mut offset = 0;
    while index < slices.len() {
        if slices[index].len() == offset {
            index += 1;
            offset = 0;
            continue;
        }
        let mut io: Vec<IoSlice<'_>> = Vec::with_capacity(slices.len() - index);
        io.push(IoSlice::new(&slices[index][offset..]));
        io.extend(slices[index + 1..].iter().map(|s| IoSlice::new(s)));
        let mut written = writer.write_vectored(&io).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 && index < slices.len() {
            let left = slices[index].len() - offset;
            if written >= left {
                written -= left;
                index += 1;
                offset = 0;
            } else {
                offset += written;
                written = 0;
            }
        }
    }
    Ok(())
}

/// One TCP connection as a datamover (RFC 5047
/// `Allocate_Connection_Resources` on creation): TCP_NODELAY on, login-phase
/// settings until [`TcpDatamover::enable`].
#[derive(Debug)]
pub struct TcpDatamover {
    /// The receive direction.
    pub receiver: StreamReceiver<OwnedReadHalf>,
    /// The send direction.
    pub sender: StreamSender<OwnedWriteHalf>,
    local: SocketAddr,
    peer: SocketAddr,
}

impl TcpDatamover {
    /// Wraps a connected socket.
    pub fn new(stream: TcpStream) -> std::io::Result<Self> {
        stream.set_nodelay(true)?;
        let local = stream.local_addr()?;
        let peer = stream.peer_addr()?;
        let (read, write) = stream.into_split();
        Ok(TcpDatamover {
            receiver: StreamReceiver::new(read),
            sender: StreamSender::new(write),
            local,
            peer,
        })
    }

    /// RFC 5047 `Notice_Key_Values` + `Enable_Datamover`: from the next PDU
    /// in each direction, the negotiated digests apply, and received data
    /// segments are bounded by the MaxRecvDataSegmentLength this side
    /// declared.
    pub fn enable(&mut self, digests: Digests, max_recv_data_segment_length: u32) {
        self.receiver.enable(digests, max_recv_data_segment_length);
        self.sender.enable(digests);
    }

    /// Tells `tap` of every PDU sent and received from now on (login
    /// PDUs too, when set before the login).
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.receiver.set_tap(tap.clone());
        self.sender.set_tap(tap);
    }

    /// Turns Nagle's algorithm off (`true`, the default: every PDU leaves
    /// at once) or on (small writes wait for outstanding data to be
    /// acknowledged; a setting parameter studies compare).
    pub fn set_nodelay(&self, nodelay: bool) -> std::io::Result<()> {
        self.sender.writer.as_ref().set_nodelay(nodelay)
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
    pub fn split(self) -> (StreamReceiver<OwnedReadHalf>, StreamSender<OwnedWriteHalf>) {
        (self.receiver, self.sender)
    }
}
