//! Whole PDUs in and out of one TCP connection: the only place where the
//! socket meets the protocol core's streaming decoder and encoder.
//!
//! Reading keeps one buffer per connection, reused for every PDU. Writing
//! hands the encoder's header, data, padding and digest slices to one
//! vectored write, so a data segment is never copied into a PDU buffer.

use std::io::IoSlice;

use iscsi_proto::error::DecodeError;
use iscsi_proto::pdu::decoder::{Decoder, DecoderConfig, Event};
use iscsi_proto::pdu::encode::MAX_HEADER_LEN;
use iscsi_proto::pdu::{Digests, Header, encode_pdu};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bytes read from the socket at a time, at most.
const READ_CHUNK: usize = 256 * 1024;

/// Why a connection cannot go on.
#[derive(Debug, Error)]
pub(crate) enum ConnectionError {
    /// The socket failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent bytes that are not a PDU we can accept.
    #[error("decode: {0}")]
    Decode(#[from] DecodeError),
    /// The peer closed the connection in the middle of a PDU.
    #[error("connection closed in the middle of a PDU")]
    Truncated,
    /// Our own PDU could not be encoded (a bug, reported rather than hidden).
    #[error("encode: {0}")]
    Encode(String),
}

/// A received PDU: its header and data segment.
pub(crate) struct Incoming {
    pub header: Header,
    pub data: Vec<u8>,
}

/// One connection's PDU stream.
pub(crate) struct PduStream {
    stream: TcpStream,
    decoder: Decoder,
    buffer: Vec<u8>,
    start: usize,
    end: usize,
    send_digests: Digests,
    header_buf: Vec<u8>,
}

impl PduStream {
    /// Wraps an accepted socket, in login mode (no digests, 8 KiB segments).
    pub fn new(stream: TcpStream) -> std::io::Result<Self> {
        stream.set_nodelay(true)?;
        Ok(PduStream {
            stream,
            decoder: Decoder::new(DecoderConfig::default()),
            buffer: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            send_digests: Digests::default(),
            header_buf: vec![0; MAX_HEADER_LEN],
        })
    }

    /// The socket, for addresses.
    pub fn socket(&self) -> &TcpStream {
        &self.stream
    }

    /// Switches both directions to full feature phase settings: from the
    /// next PDU on, these digests and this receive limit apply.
    pub fn enter_full_feature(&mut self, digests: Digests, max_recv_data_segment_length: u32) {
        self.decoder.set_config(DecoderConfig {
            max_recv_data_segment_length,
            digests,
            ..self.decoder.config()
        });
        self.send_digests = digests;
    }

    /// The next whole PDU, or `None` when the peer closed the connection
    /// between PDUs.
    pub async fn read(&mut self) -> Result<Option<Incoming>, ConnectionError> {
        let mut current: Option<Incoming> = None;
        loop {
            // Feed even with nothing buffered: the decoder reports the end
            // of a PDU (after its data, padding and digest) on the call
            // after the last byte, which may need no new input.
            {
                let progress = self.decoder.feed(&self.buffer[self.start..self.end])?;
                self.start += progress.consumed;
                match progress.event {
                    Some(Event::Header(header)) => {
                        // The decoder has checked the length against our
                        // MaxRecvDataSegmentLength before we allocate.
                        let capacity = header.data_segment_length as usize;
                        current = Some(Incoming {
                            header,
                            data: Vec::with_capacity(capacity),
                        });
                        continue;
                    }
                    Some(Event::Data(chunk)) => {
                        if let Some(incoming) = current.as_mut() {
                            incoming.data.extend_from_slice(chunk);
                        }
                        continue;
                    }
                    Some(Event::End) => {
                        if let Some(incoming) = current.take() {
                            return Ok(Some(incoming));
                        }
                        continue;
                    }
                    None if progress.consumed > 0 => continue,
                    None => {}
                }
            }
            // Need more bytes.
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
            } else if self.end == self.buffer.len() {
                self.buffer.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let n = self.stream.read(&mut self.buffer[self.end..]).await?;
            if n == 0 {
                return if current.is_none()
                    && self.decoder.is_at_boundary()
                    && self.start == self.end
                {
                    Ok(None)
                } else {
                    Err(ConnectionError::Truncated)
                };
            }
            self.end += n;
        }
    }

    /// Sends one PDU: header and data in one vectored write.
    pub async fn write(&mut self, header: &Header, data: &[u8]) -> Result<(), ConnectionError> {
        let pdu = encode_pdu(header, data, self.send_digests, &mut self.header_buf)
            .map_err(|e| ConnectionError::Encode(e.to_string()))?;
        let slices = pdu.slices();
        write_all_vectored(&mut self.stream, &slices).await?;
        Ok(())
    }
}

/// Writes every byte of `slices` with as few `writev` calls as the socket
/// allows.
async fn write_all_vectored(stream: &mut TcpStream, slices: &[&[u8]]) -> std::io::Result<()> {
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
        let mut written = stream.write_vectored(&io).await?;
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
