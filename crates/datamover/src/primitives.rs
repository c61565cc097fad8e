//! The RFC 5047 primitives as traits every transport implements
//! ([`PduReceiver`], [`PduSender`]), what a receive returns, and
//! [`DatamoverError`]; the helpers the TCP and iSER receivers share.

use std::future::Future;

use iscsi_proto::error::DecodeError;
use iscsi_proto::pdu::Header;
use thiserror::Error;

use crate::gather::Gather;
use crate::write_buffer::WriteBuffer;

/// Why a connection cannot go on (RFC 5047 `Connection_Terminate_Notify`).
/// Each message says its cause and is the end of the chain (no `source()`):
/// `anyhow`'s `{:#}`, which the CLI prints, would otherwise write the cause
/// twice ("i/o: connection reset: connection reset").
#[derive(Debug, Error)]
pub enum DatamoverError {
    /// The transport failed.
    #[error("i/o: {0}")]
    Io(std::io::Error),
    /// The peer sent bytes that are not a PDU we can accept. Some decode
    /// errors leave the connection usable (a data digest error is answered
    /// with a Reject, RFC 7143 section 7.8):
    /// [`DecodeError::requires_connection_drop`] says which.
    #[error("decode: {0}")]
    Decode(DecodeError),
    /// The peer closed the connection in the middle of a PDU.
    #[error("connection closed in the middle of a PDU")]
    Truncated,
    /// A caller asked for data in a way that does not match the PDU being
    /// received (a bug in the caller, reported rather than hidden).
    #[error("receive misuse: {0}")]
    Misuse(&'static str),
    /// Our own PDU could not be encoded (a bug, reported rather than hidden).
    #[error("encode: {0}")]
    Encode(String),
    /// The RDMA stream under iSER failed, or the peer broke an iSER rule
    /// (a message that holds no PDU, a task with no advertised buffer).
    #[error("iSER: {0}")]
    Transport(String),
}

impl From<std::io::Error> for DatamoverError {
    fn from(error: std::io::Error) -> Self {
        DatamoverError::Io(error)
    }
}

impl From<DecodeError> for DatamoverError {
    fn from(error: DecodeError) -> Self {
        DatamoverError::Decode(error)
    }
}

/// Decodes the BHS and AHS at the front of `bytes` (a PDU already
/// delimited by its transport, e.g. an iSER message): the header, checked
/// against `config` as the streaming decoder checks it, and its length.
pub(crate) fn decode_header(
    bytes: &[u8],
    config: iscsi_proto::pdu::decoder::DecoderConfig,
) -> Result<(Header, usize), DatamoverError> {
    use iscsi_proto::pdu::decoder::{Decoder, Event};
    let mut decoder = Decoder::new(config);
    let mut pos = 0;
    loop {
        let progress = decoder.feed(bytes.get(pos..).unwrap_or_default())?;
        pos += progress.consumed;
        match progress.event {
            Some(Event::Header(header)) => return Ok((header, pos)),
            Some(_) => return Err(DatamoverError::Misuse("header expected")),
            None if progress.consumed > 0 => continue,
            None => return Err(DatamoverError::Truncated),
        }
    }
}

/// Copies `source` into `destinations`, in order (their lengths add up to
/// its length).
pub(crate) fn scatter(source: &[u8], destinations: &mut [&mut [u8]]) {
    let mut at = 0;
    for d in destinations.iter_mut() {
        d.copy_from_slice(&source[at..at + d.len()]);
        at += d.len();
    }
}

/// A received PDU: its header and its whole data segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The decoded header (BHS and AHS), digest already verified.
    pub header: Header,
    /// The data segment, digest verified, padding removed.
    pub data: Vec<u8>,
}

/// The receive direction of one connection (RFC 5047 `Control_Notify` and
/// the data placement under `Get_Data`).
pub trait PduReceiver: Send {
    /// The next PDU's header, or `None` when the peer closed the connection
    /// between PDUs. Its `data_segment_length` bytes must then be taken with
    /// [`PduReceiver::receive_data_into`] or [`PduReceiver::receive_data`]
    /// before the next header (zero-length segments need no call).
    fn receive_header(
        &mut self,
    ) -> impl Future<Output = Result<Option<Header>, DatamoverError>> + Send;

    /// Lands the current PDU's data segment in `destination`, which must be
    /// exactly `data_segment_length` bytes long (for a Data-Out: its final
    /// place in the task's buffer), and verifies the data digest.
    fn receive_data_into(
        &mut self,
        destination: &mut [u8],
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send;

    /// Takes the current PDU's data segment only to drop it (a load
    /// generator's read: received, checked, not kept). `scratch`, exactly
    /// `data_segment_length` bytes, is room the transport may receive it
    /// into; data a transport has already placed elsewhere (iSER) is not
    /// copied again.
    fn discard_data(
        &mut self,
        scratch: &mut [u8],
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send {
        self.receive_data_into(scratch)
    }

    /// Lands the current PDU's data segment at `buffer[range]` (`range`
    /// exactly `data_segment_length` long; for a Data-Out, its place in
    /// the task's buffer), keeping every byte of `buffer` outside `range`.
    /// A transport that has already placed the data in a buffer of the
    /// same length at the same offset (iSER: the RDMA Read's sink) may
    /// exchange the buffers instead of copying; `buffer` may therefore come
    /// back as a different allocation of the same length.
    fn receive_data_in_place(
        &mut self,
        buffer: &mut Vec<u8>,
        range: std::ops::Range<usize>,
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send {
        async move {
            let destination = buffer.get_mut(range).ok_or(DatamoverError::Misuse(
                "the data segment's range is outside the buffer",
            ))?;
            self.receive_data_into(destination).await
        }
    }

    /// Lands the current PDU's data segment in `destinations`, in order
    /// (their lengths add up to `data_segment_length`), and verifies the
    /// data digest. The default receives it whole and copies it out.
    fn receive_data_into_slices(
        &mut self,
        destinations: &mut [&mut [u8]],
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send {
        async move {
            match destinations {
                [] => self.receive_data_into(&mut []).await,
                [one] => self.receive_data_into(one).await,
                many => {
                    let data = self.receive_data().await?;
                    if many.iter().map(|d| d.len()).sum::<usize>() != data.len() {
                        return Err(DatamoverError::Misuse(
                            "destination length differs from the data segment length",
                        ));
                    }
                    scatter(&data, many);
                    Ok(())
                }
            }
        }
    }

    /// Lands the current PDU's data segment at `range` of a write's
    /// `buffer` (`range` exactly `data_segment_length` long), keeping every
    /// other byte: in a flat buffer as [`PduReceiver::receive_data_in_place`]
    /// does, across the pieces of one in pieces.
    fn receive_data_in_buffer(
        &mut self,
        buffer: &mut WriteBuffer,
        range: std::ops::Range<usize>,
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send {
        receive_data_in_buffer_by_parts(self, buffer, range)
    }

    /// The current PDU's data segment in a new buffer, digest verified.
    fn receive_data(&mut self) -> impl Future<Output = Result<Vec<u8>, DatamoverError>> + Send;

    /// The next whole PDU, or `None` when the peer closed the connection
    /// between PDUs.
    fn receive(&mut self) -> impl Future<Output = Result<Option<Received>, DatamoverError>> + Send {
        async {
            let Some(header) = self.receive_header().await? else {
                return Ok(None);
            };
            let data = self.receive_data().await?;
            Ok(Some(Received { header, data }))
        }
    }
}

/// [`PduReceiver::receive_data_in_buffer`] through the receiver's other
/// primitives: a flat buffer in place, one in pieces as a slice per piece
/// the range covers (what a transport that cannot place data itself does,
/// and what iSER does with data it did not place in the pieces).
pub(crate) async fn receive_data_in_buffer_by_parts<R: PduReceiver + ?Sized>(
    receiver: &mut R,
    buffer: &mut WriteBuffer,
    range: std::ops::Range<usize>,
) -> Result<(), DatamoverError> {
    if let Some(flat) = buffer.flat_mut() {
        return receiver.receive_data_in_place(flat, range).await;
    }
    let mut slices = buffer.slices_mut(range).ok_or(DatamoverError::Misuse(
        "the data segment's range is outside the buffer",
    ))?;
    receiver.receive_data_into_slices(&mut slices).await
}

/// The send direction of one connection (RFC 5047 `Send_Control` and
/// `Put_Data`).
pub trait PduSender: Send {
    /// `Send_Control`: a control PDU (any opcode but Data-In) with its data
    /// segment (immediate data, text, sense, ping data).
    fn send_control(
        &mut self,
        header: &Header,
        data: &[u8],
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send;

    /// `Put_Data`: a SCSI Data-In carrying `data` straight from the
    /// caller's buffer (over TCP, one Data-In PDU; over iSER, an RDMA Write
    /// into the initiator's buffer).
    fn put_data(
        &mut self,
        header: &Header,
        data: &[u8],
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send {
        self.send_control(header, data)
    }

    /// `Put_Data` from a buffer the datamover may keep until the data is
    /// on the wire (RFC 5047 leaves the buffer to the datamover until
    /// `Put_Data` completes): over iSER the RDMA Write goes out from it
    /// with no copy; over TCP this is [`PduSender::put_data`].
    fn put_data_owned(
        &mut self,
        header: &Header,
        data: bytes::Bytes,
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send {
        async move { self.put_data(header, &data).await }
    }

    /// `Put_Data` from data in shared pieces (a backstore's lent memory),
    /// none of them copied where the transport can help it: over TCP one
    /// vectored write of the header, the pieces and the digest; over iSER
    /// one RDMA Write with the pieces as its gather list. The default joins them (one copy).
    fn put_data_gather(
        &mut self,
        header: &Header,
        data: Gather,
    ) -> impl Future<Output = Result<(), DatamoverError>> + Send {
        async move { self.put_data_owned(header, data.joined()).await }
    }

    /// `Connection_Terminate`: flushes and closes the send direction.
    fn terminate(&mut self) -> impl Future<Output = Result<(), DatamoverError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::DatamoverError;
    use std::error::Error as _;

    #[test]
    fn an_io_error_is_said_once_and_ends_the_chain() {
        let error = DatamoverError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset",
        ));
        assert_eq!(error.to_string(), "i/o: connection reset");
        assert!(error.source().is_none());
        let decode = DatamoverError::from(iscsi_proto::error::DecodeError::HeaderDigestMismatch {
            received: 1,
            computed: 2,
        });
        assert_eq!(
            decode.to_string(),
            "decode: header digest mismatch: received 0x00000001, computed 0x00000002"
        );
        assert!(decode.source().is_none());
    }
}
