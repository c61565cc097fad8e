//! Additional Header Segments (RFC 7143 section 11.2.2): the Extended CDB
//! and the Bidirectional Expected Read-Data Length.

use super::bhs::{MAX_AHS_LEN, padding_len};
use crate::pdu::error::{DecodeError, EncodeError};

/// One Additional Header Segment (RFC 7143 section 11.2.2).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Ahs {
    /// AHSType 1, Extended CDB (section 11.2.2.3): the CDB bytes beyond the
    /// first 16 (which are in the BHS).
    ExtendedCdb(Vec<u8>),
    /// AHSType 2, Bidirectional Expected Read-Data Length (section
    /// 11.2.2.4).
    BidiExpectedReadDataLength(u32),
    /// Any other AHSType (reserved, or 60-63 for non-iSCSI extensions).
    Other {
        /// AHSType (section 11.2.2.2).
        ahs_type: u8,
        /// The AHSLength bytes from byte 3 of the AHS on (the AHS-specific
        /// byte and what follows), without padding.
        specific: Vec<u8>,
    },
}

/// AHSType of an Extended CDB AHS.
const AHS_TYPE_EXTENDED_CDB: u8 = 1;
/// AHSType of a Bidirectional Expected Read-Data Length AHS.
const AHS_TYPE_BIDI_READ_LENGTH: u8 = 2;

impl Ahs {
    /// The bytes this AHS takes on the wire, padding included.
    pub fn wire_len(&self) -> usize {
        let effective = self.ahs_length();
        let len = 3 + effective;
        len + padding_len(len)
    }

    /// AHSLength: bytes after AHSType, without padding.
    fn ahs_length(&self) -> usize {
        match self {
            Ahs::ExtendedCdb(cdb) => 1 + cdb.len(),
            Ahs::BidiExpectedReadDataLength(_) => 5,
            Ahs::Other { specific, .. } => specific.len(),
        }
    }

    /// Decodes the AHS area (TotalAHSLength * 4 bytes) into its segments.
    pub fn decode_all(mut bytes: &[u8]) -> Result<Vec<Ahs>, DecodeError> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let (Some(&l0), Some(&l1), Some(&ahs_type)) =
                (bytes.first(), bytes.get(1), bytes.get(2))
            else {
                return Err(DecodeError::MalformedAhs {
                    reason: "fewer than 4 bytes left for an AHS",
                });
            };
            let ahs_length = usize::from(u16::from_be_bytes([l0, l1]));
            let len = 3 + ahs_length;
            let padded = len + padding_len(len);
            let (Some(specific), Some(rest)) = (bytes.get(3..len), bytes.get(padded..)) else {
                return Err(DecodeError::MalformedAhs {
                    reason: "AHSLength runs past TotalAHSLength",
                });
            };
            let ahs = match ahs_type {
                AHS_TYPE_EXTENDED_CDB => match specific.split_first() {
                    Some((_reserved, cdb)) => Ahs::ExtendedCdb(cdb.to_vec()),
                    None => {
                        return Err(DecodeError::MalformedAhs {
                            reason: "Extended CDB AHS with AHSLength 0",
                        });
                    }
                },
                AHS_TYPE_BIDI_READ_LENGTH => match specific {
                    [_reserved, a, b, c, d] => {
                        Ahs::BidiExpectedReadDataLength(u32::from_be_bytes([*a, *b, *c, *d]))
                    }
                    _ => {
                        return Err(DecodeError::MalformedAhs {
                            reason: "Bidirectional Read-Data Length AHS with AHSLength other than 5",
                        });
                    }
                },
                _ => Ahs::Other {
                    ahs_type,
                    specific: specific.to_vec(),
                },
            };
            out.push(ahs);
            bytes = rest;
        }
        Ok(out)
    }

    /// Encodes `all` into the front of `out`, returning the bytes written
    /// (a multiple of 4).
    pub fn encode_all(all: &[Ahs], out: &mut [u8]) -> Result<usize, EncodeError> {
        let total: usize = all.iter().map(Ahs::wire_len).sum();
        if total > MAX_AHS_LEN {
            return Err(EncodeError::AhsTooLong { length: total });
        }
        let available = out.len();
        let Some(area) = out.get_mut(..total) else {
            return Err(EncodeError::BufferTooSmall {
                needed: total,
                available,
            });
        };
        area.fill(0);
        let mut at = 0;
        for ahs in all {
            let ahs_length = ahs.ahs_length();
            let len = ahs.wire_len();
            let seg = area
                .get_mut(at..at + len)
                .ok_or(EncodeError::AhsTooLong { length: total })?;
            let l =
                u16::try_from(ahs_length).map_err(|_| EncodeError::AhsTooLong { length: total })?;
            seg[0..2].copy_from_slice(&l.to_be_bytes());
            match ahs {
                Ahs::ExtendedCdb(cdb) => {
                    seg[2] = AHS_TYPE_EXTENDED_CDB;
                    seg[4..4 + cdb.len()].copy_from_slice(cdb);
                }
                Ahs::BidiExpectedReadDataLength(n) => {
                    seg[2] = AHS_TYPE_BIDI_READ_LENGTH;
                    seg[4..8].copy_from_slice(&n.to_be_bytes());
                }
                Ahs::Other { ahs_type, specific } => {
                    seg[2] = *ahs_type;
                    seg[3..3 + specific.len()].copy_from_slice(specific);
                }
            }
            at += len;
        }
        Ok(total)
    }
}
