//! The streaming receive decoder (RFC 7143 section 11.1 framing): it says
//! how many bytes it needs next and for what ([`Decoder::need`]), parses the
//! header as soon as it is whole, and lets the caller land the data segment
//! wherever it wants while the decoder digests it chunk by chunk.
//!
//! Every PDU produces the events `Header`, then `Data` chunks (when the
//! caller feeds the data through [`Decoder::feed`]), then `End`. The data
//! segment may instead be delivered with [`Decoder::receive_data`] (copy and
//! CRC in one pass into the caller's buffer) or [`Decoder::data_received`]
//! (the caller already read it into place, e.g. straight from the socket
//! into a Data-Out's final buffer).
//!
//! Limits are checked from the BHS alone, before anything is allocated:
//! DataSegmentLength against MaxRecvDataSegmentLength (section 13.12;
//! 8192 during login), TotalAHSLength against an AHS limit. Digest settings
//! change with [`Decoder::set_config`] and apply from the next PDU (digests
//! are off during login and on, if negotiated, after it).
//!
//! A call that returns an error never consumes input. After a data digest
//! error the PDU has been skipped and decoding continues with the next PDU;
//! after an error that requires dropping the connection every call returns
//! [`DecodeError::Stopped`].

use iscsi_crc32c::{Crc32c, crc32c};

use super::ahs::Ahs;
use super::bhs::{DIGEST_LEN, Digests, MAX_AHS_LEN, padding_len};
use super::encode::MAX_HEADER_LEN;
use super::header::Header;
use super::typed::Pdu;
use super::wire::BHS_LEN;
use crate::pdu::error::DecodeError;

pub use super::stage::Stage;

/// Receive-side settings of one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecoderConfig {
    /// MaxRecvDataSegmentLength this side declared (RFC 7143 section 13.12):
    /// the largest DataSegmentLength accepted.
    pub max_recv_data_segment_length: u32,
    /// The largest TotalAHSLength accepted, in bytes (at most 1020).
    pub max_total_ahs_length: usize,
    /// Which digests the peer sends.
    pub digests: Digests,
}

impl Default for DecoderConfig {
    /// The login-phase settings: MaxRecvDataSegmentLength 8192 (the default
    /// of section 13.12, which applies during login), no digests.
    fn default() -> Self {
        DecoderConfig {
            max_recv_data_segment_length: 8192,
            max_total_ahs_length: MAX_AHS_LEN,
            digests: Digests::default(),
        }
    }
}

/// How many bytes the decoder needs next, and for what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Need {
    /// The part of the PDU.
    pub stage: Stage,
    /// Bytes left in that part (0 for [`Stage::Complete`]).
    pub bytes: usize,
}

/// Something the decoder found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A whole, verified header. Its `data_segment_length` bytes of data
    /// follow.
    Header(Header),
    /// A chunk of the data segment, borrowed from the input given to
    /// `feed`.
    Data(&'a [u8]),
    /// The PDU ended (padding read, data digest verified).
    End,
}

/// The result of one [`Decoder::feed`] call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress<'a> {
    /// Bytes of input consumed.
    pub consumed: usize,
    /// What was found, if anything; `None` means more input is needed.
    pub event: Option<Event<'a>>,
}

/// A streaming PDU decoder for one direction of one connection.
#[derive(Clone, Debug)]
pub struct Decoder {
    /// Settings for the current PDU.
    config: DecoderConfig,
    /// Settings to apply at the next PDU boundary.
    next_config: Option<DecoderConfig>,
    /// Current stage.
    stage: Stage,
    /// BHS, AHS and header digest of the current PDU.
    header: Box<[u8; MAX_HEADER_LEN]>,
    /// Bytes filled in the current header stage (offset into `header`), or
    /// in `trailer` for padding and data digest.
    filled: usize,
    /// AHS bytes of the current PDU.
    ahs_len: usize,
    /// DataSegmentLength of the current PDU.
    data_len: usize,
    /// Data bytes still to come.
    data_left: usize,
    /// Running data digest.
    data_crc: Crc32c,
    /// Padding and data digest bytes.
    trailer: [u8; DIGEST_LEN],
    /// An error to report on the next call (so erroring calls consume
    /// nothing).
    pending_error: Option<DecodeError>,
    /// Set after an error that requires dropping the connection.
    stopped: bool,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new(DecoderConfig::default())
    }
}

impl Decoder {
    /// A decoder at the start of a PDU.
    pub fn new(config: DecoderConfig) -> Self {
        Decoder {
            config,
            next_config: None,
            stage: Stage::Bhs,
            header: Box::new([0; MAX_HEADER_LEN]),
            filled: 0,
            ahs_len: 0,
            data_len: 0,
            data_left: 0,
            data_crc: Crc32c::new(),
            trailer: [0; DIGEST_LEN],
            pending_error: None,
            stopped: false,
        }
    }

    /// The settings in force for the current PDU.
    pub fn config(&self) -> DecoderConfig {
        self.next_config.unwrap_or(self.config)
    }

    /// Changes the settings from the next PDU on (immediately when between
    /// PDUs), e.g. to switch digests on once login completes.
    pub fn set_config(&mut self, config: DecoderConfig) {
        if self.stage == Stage::Bhs && self.filled == 0 {
            self.config = config;
            self.next_config = None;
        } else {
            self.next_config = Some(config);
        }
    }

    /// What the decoder needs next. A caller that wants to read exactly one
    /// PDU at a time reads `bytes` bytes and feeds them.
    pub fn need(&self) -> Need {
        let bytes = match self.stage {
            Stage::Bhs => BHS_LEN.saturating_sub(self.filled),
            Stage::Ahs => (BHS_LEN + self.ahs_len).saturating_sub(self.filled),
            Stage::HeaderDigest => {
                (BHS_LEN + self.ahs_len + DIGEST_LEN).saturating_sub(self.filled)
            }
            Stage::Data => self.data_left,
            Stage::Padding => padding_len(self.data_len).saturating_sub(self.filled),
            Stage::DataDigest => DIGEST_LEN.saturating_sub(self.filled),
            Stage::Complete => 0,
        };
        Need {
            stage: self.stage,
            bytes,
        }
    }

    /// Whether the decoder is between PDUs (nothing of the next one read).
    pub fn is_at_boundary(&self) -> bool {
        self.stage == Stage::Bhs && self.filled == 0 && self.pending_error.is_none()
    }

    /// Consumes bytes from the front of `input` until an event occurs or the
    /// input runs out. In the data stage the event is a borrowed chunk of
    /// `input`; the data digest is updated as it passes.
    pub fn feed<'a>(&mut self, input: &'a [u8]) -> Result<Progress<'a>, DecodeError> {
        self.check_errors()?;
        let mut consumed = 0;
        loop {
            let rest = input.get(consumed..).unwrap_or(&[]);
            match self.stage {
                Stage::Complete => {
                    self.start_next_pdu();
                    return Ok(Progress {
                        consumed,
                        event: Some(Event::End),
                    });
                }
                Stage::Data => {
                    let n = rest.len().min(self.data_left);
                    if n == 0 {
                        return Ok(Progress {
                            consumed,
                            event: None,
                        });
                    }
                    let chunk = rest.get(..n).unwrap_or(&[]);
                    self.take_data(chunk);
                    return Ok(Progress {
                        consumed: consumed + n,
                        event: Some(Event::Data(chunk)),
                    });
                }
                _ => {}
            }
            let need = self.need().bytes;
            let n = need.min(rest.len());
            if n == 0 && need > 0 {
                return Ok(Progress {
                    consumed,
                    event: None,
                });
            }
            let bytes = rest.get(..n).unwrap_or(&[]);
            consumed += n;
            match self.stage {
                Stage::Bhs | Stage::Ahs | Stage::HeaderDigest => {
                    if let Some(dst) = self.header.get_mut(self.filled..self.filled + n) {
                        dst.copy_from_slice(bytes);
                    }
                    self.filled += n;
                }
                Stage::Padding | Stage::DataDigest => {
                    if let Some(dst) = self.trailer.get_mut(self.filled..self.filled + n) {
                        dst.copy_from_slice(bytes);
                    }
                    self.filled += n;
                }
                Stage::Data | Stage::Complete => {}
            }
            if self.need().bytes > 0 {
                continue;
            }
            match self.advance() {
                Ok(Some(header)) => {
                    return Ok(Progress {
                        consumed,
                        event: Some(Event::Header(header)),
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    // Report on the next call, so that this one's consumption
                    // is not lost.
                    self.pending_error = Some(e);
                    return Ok(Progress {
                        consumed,
                        event: None,
                    });
                }
            }
        }
    }

    /// Records that the caller placed `chunk` (the next bytes of the data
    /// segment) in its own buffer; the decoder digests it. `chunk` must not
    /// exceed the bytes left in the segment ([`Decoder::need`]).
    pub fn data_received(&mut self, chunk: &[u8]) -> Result<(), DecodeError> {
        self.check_errors()?;
        self.check_data_call("data_received", chunk.len())?;
        self.take_data(chunk);
        Ok(())
    }

    /// Copies the next data bytes from `src` into `dst`, computing the data
    /// digest in the same pass (`iscsi_crc32c`'s fused copy). Copies as many
    /// bytes as `src`, `dst` and the segment allow, and returns that count.
    pub fn receive_data(&mut self, dst: &mut [u8], src: &[u8]) -> Result<usize, DecodeError> {
        self.check_errors()?;
        self.check_data_call("receive_data", 0)?;
        let n = src.len().min(dst.len()).min(self.data_left);
        if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
            if self.config.digests.data {
                self.data_crc.update_copy(d, s);
            } else {
                d.copy_from_slice(s);
            }
        }
        self.data_left -= n;
        if self.data_left == 0 {
            self.after_data();
        }
        Ok(n)
    }

    /// Returns the pending or sticky error, if any.
    fn check_errors(&mut self) -> Result<(), DecodeError> {
        if self.stopped {
            return Err(DecodeError::Stopped);
        }
        if let Some(e) = self.pending_error.take() {
            if e.requires_connection_drop() {
                self.stopped = true;
            } else {
                self.start_next_pdu();
            }
            return Err(e);
        }
        Ok(())
    }

    /// Checks a data call: in the data stage with at most `len` bytes left.
    fn check_data_call(&self, call: &'static str, len: usize) -> Result<(), DecodeError> {
        if self.stage != Stage::Data || len > self.data_left {
            return Err(DecodeError::WrongStage {
                call,
                stage: self.stage,
                remaining: self.need().bytes,
            });
        }
        Ok(())
    }

    /// Accounts for (and digests) the next `chunk` of data.
    fn take_data(&mut self, chunk: &[u8]) {
        if self.config.digests.data {
            self.data_crc.update(chunk);
        }
        self.data_left = self.data_left.saturating_sub(chunk.len());
        if self.data_left == 0 {
            self.after_data();
        }
    }

    /// Moves past the data segment.
    fn after_data(&mut self) {
        self.filled = 0;
        self.stage = if padding_len(self.data_len) > 0 {
            Stage::Padding
        } else if self.config.digests.data {
            Stage::DataDigest
        } else {
            Stage::Complete
        };
    }

    /// Resets for the next PDU, applying pending settings.
    fn start_next_pdu(&mut self) {
        if let Some(config) = self.next_config.take() {
            self.config = config;
        }
        self.stage = Stage::Bhs;
        self.filled = 0;
        self.ahs_len = 0;
        self.data_len = 0;
        self.data_left = 0;
        self.data_crc = Crc32c::new();
    }

    /// Acts on a completed stage. Returns the header when it is whole.
    fn advance(&mut self) -> Result<Option<Header>, DecodeError> {
        match self.stage {
            Stage::Bhs => {
                let total_ahs = usize::from(self.header[4]) * 4;
                let dsl = u32::from_be_bytes([0, self.header[5], self.header[6], self.header[7]]);
                if dsl > self.config.max_recv_data_segment_length {
                    return Err(DecodeError::DataSegmentTooLong {
                        length: dsl,
                        max: self.config.max_recv_data_segment_length,
                    });
                }
                let max_ahs = self.config.max_total_ahs_length.min(MAX_AHS_LEN);
                if total_ahs > max_ahs {
                    return Err(DecodeError::AhsTooLong {
                        length: total_ahs,
                        max: max_ahs,
                    });
                }
                self.ahs_len = total_ahs;
                self.data_len = usize::try_from(dsl).unwrap_or(usize::MAX);
                if total_ahs > 0 {
                    self.stage = Stage::Ahs;
                    Ok(None)
                } else {
                    self.after_ahs()
                }
            }
            Stage::Ahs => self.after_ahs(),
            Stage::HeaderDigest => {
                let end = BHS_LEN + self.ahs_len;
                let covered = self.header.get(..end).unwrap_or(&[]);
                let computed = crc32c(covered);
                let received = self.digest_at(end);
                if computed != received {
                    return Err(DecodeError::HeaderDigestMismatch { received, computed });
                }
                self.finish_header().map(Some)
            }
            Stage::Padding => {
                if self.config.digests.data {
                    let pad = self.trailer.get(..self.filled).unwrap_or(&[]);
                    self.data_crc.update(pad);
                    self.filled = 0;
                    self.stage = Stage::DataDigest;
                } else {
                    self.stage = Stage::Complete;
                }
                Ok(None)
            }
            Stage::DataDigest => {
                let received = u32::from_le_bytes(self.trailer);
                let computed = self.data_crc.value();
                self.stage = Stage::Complete;
                if computed != received {
                    return Err(DecodeError::DataDigestMismatch {
                        received,
                        computed,
                        rejected_bhs: Box::new(self.bhs()),
                    });
                }
                Ok(None)
            }
            Stage::Data | Stage::Complete => Ok(None),
        }
    }

    /// After the AHS: on to the header digest, or the header is whole.
    fn after_ahs(&mut self) -> Result<Option<Header>, DecodeError> {
        if self.config.digests.header {
            self.stage = Stage::HeaderDigest;
            Ok(None)
        } else {
            self.finish_header().map(Some)
        }
    }

    /// Parses the whole header and moves to the data stage.
    fn finish_header(&mut self) -> Result<Header, DecodeError> {
        let bhs = self.bhs();
        let ahs_bytes = self
            .header
            .get(BHS_LEN..BHS_LEN + self.ahs_len)
            .unwrap_or(&[]);
        let ahs = Ahs::decode_all(ahs_bytes)?;
        let (pdu, lengths) = Pdu::decode_bhs(&bhs);
        self.data_left = self.data_len;
        self.filled = 0;
        if self.data_len == 0 {
            self.stage = Stage::Complete;
        } else {
            self.stage = Stage::Data;
        }
        Ok(Header {
            pdu,
            ahs,
            data_segment_length: lengths.data_segment_length,
        })
    }

    /// The current BHS.
    fn bhs(&self) -> [u8; BHS_LEN] {
        let mut bhs = [0u8; BHS_LEN];
        if let Some(src) = self.header.get(..BHS_LEN) {
            bhs.copy_from_slice(src);
        }
        bhs
    }

    /// The little-endian digest at `at` in the header buffer.
    fn digest_at(&self, at: usize) -> u32 {
        let mut d = [0u8; DIGEST_LEN];
        if let Some(src) = self.header.get(at..at + DIGEST_LEN) {
            d.copy_from_slice(src);
        }
        u32::from_le_bytes(d)
    }
}

/// A whole PDU with its data in an owned buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedPdu {
    /// The header.
    pub header: Header,
    /// The data segment, unpadded.
    pub data: Vec<u8>,
}

impl DecodedPdu {
    /// Decodes the first whole PDU in `input` with settings `config`.
    /// Returns the PDU and the bytes it took, or `None` when `input` holds
    /// no whole PDU yet (nothing is kept; call again with more bytes). The
    /// data buffer is allocated only after the length checks.
    pub fn decode(
        config: DecoderConfig,
        input: &[u8],
    ) -> Result<Option<(DecodedPdu, usize)>, DecodeError> {
        let mut decoder = Decoder::new(config);
        let mut pos = 0;
        let mut header = None;
        let mut data = Vec::new();
        loop {
            let progress = decoder.feed(input.get(pos..).unwrap_or(&[]))?;
            pos += progress.consumed;
            match progress.event {
                None => {
                    if decoder.pending_error.is_some() {
                        continue;
                    }
                    return Ok(None);
                }
                Some(Event::Header(h)) => {
                    data = Vec::with_capacity(decoder.data_len);
                    header = Some(h);
                }
                Some(Event::Data(chunk)) => data.extend_from_slice(chunk),
                Some(Event::End) => {
                    return Ok(header.map(|header| (DecodedPdu { header, data }, pos)));
                }
            }
        }
    }

    /// Decodes every whole PDU at the front of `input`, returning them and
    /// the bytes they took (a trailing partial PDU is left).
    pub fn decode_all(
        config: DecoderConfig,
        input: &[u8],
    ) -> Result<(Vec<DecodedPdu>, usize), DecodeError> {
        let mut out = Vec::new();
        let mut pos = 0;
        while let Some((pdu, used)) = DecodedPdu::decode(config, input.get(pos..).unwrap_or(&[]))? {
            out.push(pdu);
            pos += used;
        }
        Ok((out, pos))
    }
}
