//! Sending PDUs without a concatenating copy (RFC 7143 section 11.1): the
//! header (BHS, AHS, optional header digest) is written into a buffer the
//! caller owns, and the data segment stays where it is; padding and data
//! digest are tiny arrays. The I/O layer writes the four pieces of
//! [`OutgoingPdu::slices`] with one vectored write.
//!
//! Digests are CRC32C, sent little-endian (Appendix B.4): the header digest
//! covers BHS and AHS, the data digest covers the data and its padding and
//! is only sent when there is data.

use iscsi_crc32c::{crc32c, crc32c_append};

use super::ahs::Ahs;
use super::bhs::{
    DIGEST_LEN, Digests, MAX_AHS_LEN, MAX_DATA_SEGMENT_LENGTH, SegmentLengths, padding_len,
};
use super::header::Header;
use super::wire::BHS_LEN;
use crate::pdu::error::EncodeError;

/// The largest header: BHS, the largest AHS and a header digest.
pub const MAX_HEADER_LEN: usize = BHS_LEN + MAX_AHS_LEN + DIGEST_LEN;

/// Zero bytes for padding.
const ZEROS: [u8; 3] = [0; 3];

/// Writes `header`'s BHS, AHS and (when `header_digest`) header digest into
/// the front of `out`, returning the bytes written. A buffer of
/// [`MAX_HEADER_LEN`] bytes always suffices.
pub fn encode_header(
    header: &Header,
    header_digest: bool,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    if header.data_segment_length > MAX_DATA_SEGMENT_LENGTH {
        return Err(EncodeError::DataSegmentTooLong {
            length: usize::try_from(header.data_segment_length).unwrap_or(usize::MAX),
        });
    }
    let ahs_len: usize = header.ahs.iter().map(Ahs::wire_len).sum();
    let total_ahs_words =
        u8::try_from(ahs_len / 4).map_err(|_| EncodeError::AhsTooLong { length: ahs_len })?;
    let digest_len = if header_digest { DIGEST_LEN } else { 0 };
    let needed = BHS_LEN + ahs_len + digest_len;
    let available = out.len();
    let too_small = EncodeError::BufferTooSmall { needed, available };
    let out = out.get_mut(..needed).ok_or(too_small.clone())?;
    let (bhs, rest) = out.split_at_mut(BHS_LEN);
    let bhs: &mut [u8; BHS_LEN] = bhs.try_into().map_err(|_| too_small.clone())?;
    let written = Ahs::encode_all(&header.ahs, rest)?;
    header.pdu.encode_bhs(
        SegmentLengths {
            total_ahs_words,
            data_segment_length: header.data_segment_length,
        },
        bhs,
    );
    let header_len = BHS_LEN + written;
    if header_digest {
        let crc = crc32c(out.get(..header_len).ok_or(too_small.clone())?);
        out.get_mut(header_len..header_len + DIGEST_LEN)
            .ok_or(too_small)?
            .copy_from_slice(&crc.to_le_bytes());
    }
    Ok(needed)
}

/// What follows a data segment on the wire: 0-3 zero bytes of padding and,
/// when data digests are on and there is data, the 4-byte digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataTrailer {
    /// Padding length, 0-3.
    pad_len: usize,
    /// The data digest, if one is sent.
    digest: Option<[u8; DIGEST_LEN]>,
}

impl DataTrailer {
    /// The trailer for `data`, computing the digest if `data_digest`.
    pub fn new(data: &[u8], data_digest: bool) -> Self {
        let crc = if data_digest && !data.is_empty() {
            crc32c(data)
        } else {
            0
        };
        DataTrailer::from_data_crc(data.len(), crc, data_digest)
    }

    /// The trailer for `data_len` bytes whose CRC32C (without padding) the
    /// caller already has, e.g. from filling the buffer with
    /// `iscsi_crc32c::copy_with_crc32c`.
    pub fn from_data_crc(data_len: usize, data_crc: u32, data_digest: bool) -> Self {
        let pad_len = padding_len(data_len);
        let digest = (data_digest && data_len > 0).then(|| {
            let crc = crc32c_append(data_crc, ZEROS.get(..pad_len).unwrap_or(&[]));
            crc.to_le_bytes()
        });
        DataTrailer { pad_len, digest }
    }

    /// The padding bytes (zeros).
    pub fn padding(&self) -> &'static [u8] {
        ZEROS.get(..self.pad_len).unwrap_or(&[])
    }

    /// The data digest bytes, empty when none is sent.
    pub fn digest(&self) -> &[u8] {
        match &self.digest {
            Some(d) => d,
            None => &[],
        }
    }
}

/// An encoded PDU as four pieces for one vectored write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutgoingPdu<'a> {
    /// BHS, AHS and header digest.
    pub header: &'a [u8],
    /// The data segment, unpadded.
    pub data: &'a [u8],
    /// Padding and data digest.
    pub trailer: DataTrailer,
}

impl<'a> OutgoingPdu<'a> {
    /// Header, data, padding, data digest, in wire order (some may be
    /// empty).
    pub fn slices(&self) -> [&[u8]; 4] {
        [
            self.header,
            self.data,
            self.trailer.padding(),
            self.trailer.digest(),
        ]
    }

    /// Total bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.slices().iter().map(|s| s.len()).sum()
    }
}

/// Encodes `header` into `header_buf` and pairs it with `data` and its
/// trailer. `header.data_segment_length` must equal `data.len()`.
pub fn encode_pdu<'a>(
    header: &Header,
    data: &'a [u8],
    digests: Digests,
    header_buf: &'a mut [u8],
) -> Result<OutgoingPdu<'a>, EncodeError> {
    if usize::try_from(header.data_segment_length).ok() != Some(data.len()) {
        return Err(EncodeError::DataLengthMismatch {
            header: header.data_segment_length,
            data: data.len(),
        });
    }
    let len = encode_header(header, digests.header, header_buf)?;
    let header_bytes: &'a [u8] = header_buf;
    Ok(OutgoingPdu {
        header: header_bytes.get(..len).unwrap_or(&[]),
        data,
        trailer: DataTrailer::new(data, digests.data),
    })
}

/// Encodes a whole PDU into one new `Vec` (for tests and simple callers).
pub fn encode_pdu_to_vec(
    header: &Header,
    data: &[u8],
    digests: Digests,
) -> Result<Vec<u8>, EncodeError> {
    let mut buf = [0u8; MAX_HEADER_LEN];
    let pdu = encode_pdu(header, data, digests, &mut buf)?;
    Ok(pdu.slices().concat())
}
