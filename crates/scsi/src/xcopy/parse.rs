//! The EXTENDED COPY (LID1) parameter list (SPC-4 §6.4, with SPC-3 §6.3's
//! LID1 header): a 16-byte header, CSCD descriptors, segment descriptors.
//! Pure: bytes in, a [`ParameterList`] or the sense to answer with out. It
//! never panics and allocates at most what [`MAX_CSCD_DESCRIPTORS`] and
//! [`MAX_SEGMENT_DESCRIPTORS`] allow, whatever the lengths claim.
//!
//! Only what this copy manager implements is accepted: identification CSCD
//! descriptors (E4h) naming a block device by an NAA designator, and
//! block device to block device segment descriptors (02h). Everything a
//! parameter list can get wrong is refused here, before any data moves;
//! what can only be known against the target's LUs (which LU a designator
//! names, ranges, reservations) is `super`'s.

use iscsi_sense::{Asc, FieldPointer, Sense, SenseKey};

/// Length of the parameter list header.
pub const HEADER_LEN: usize = 16;
/// Length of an identification CSCD descriptor (and of every CSCD
/// descriptor type but the 64-byte ones).
pub const CSCD_LEN: usize = 32;
/// Length of a block device to block device segment descriptor.
pub const B2B_LEN: usize = 28;
/// CSCD descriptor type code: identification descriptor.
pub const CSCD_IDENTIFICATION: u8 = 0xE4;
/// Segment descriptor type code: block device to block device.
pub const SEGMENT_BLOCK_TO_BLOCK: u8 = 0x02;

/// MAXIMUM CSCD DESCRIPTOR COUNT (RECEIVE COPY RESULTS, OPERATING
/// PARAMETERS).
pub const MAX_CSCD_DESCRIPTORS: u16 = 8;
/// MAXIMUM SEGMENT DESCRIPTOR COUNT.
pub const MAX_SEGMENT_DESCRIPTORS: u16 = 16;
/// MAXIMUM DESCRIPTOR LIST LENGTH in bytes (CSCD and segment descriptors
/// together); room for the counts above.
pub const MAX_DESCRIPTOR_LIST_LEN: u32 = 1024;

/// LIST ID USAGE (SPC-4 Table 108): what the copy manager keeps for
/// RECEIVE COPY RESULTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListIdUsage {
    /// 00b: the list identifier is valid and the status is held for COPY
    /// STATUS.
    Hold,
    /// 10b: the list identifier is valid, nothing is held.
    Discard,
    /// 11b: no list identifier (it must be zero).
    None,
}

/// One identification CSCD descriptor: the LU it names and the block
/// length the initiator assumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cscd {
    /// The NAA designator (the only kind our LUs report, VPD page 83h).
    pub naa: [u8; 16],
    /// DISK BLOCK LENGTH from the device type specific parameters.
    pub block_length: u32,
    /// Offset of this descriptor in the parameter list (for field pointers).
    pub at: u16,
}

/// A designator that cannot name one of our LUs (another type, association
/// or length): kept apart from [`Cscd`] so that the refusal (COPY TARGET
/// DEVICE NOT REACHABLE) is made where unknown NAA designators are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Designation {
    /// An NAA designator of logical unit association.
    Naa(Cscd),
    /// Anything else: no LU of ours answers to it.
    Unreachable,
}

/// One block device to block device segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// SOURCE CSCD DESCRIPTOR INDEX.
    pub src: u16,
    /// DESTINATION CSCD DESCRIPTOR INDEX.
    pub dst: u16,
    /// DC: the block count is in destination blocks (else source blocks).
    pub dc: bool,
    /// BLOCK DEVICE NUMBER OF BLOCKS.
    pub blocks: u16,
    /// SOURCE BLOCK DEVICE LOGICAL BLOCK ADDRESS.
    pub src_lba: u64,
    /// DESTINATION BLOCK DEVICE LOGICAL BLOCK ADDRESS.
    pub dst_lba: u64,
    /// Offset of this descriptor in the parameter list.
    pub at: u16,
}

/// A parsed EXTENDED COPY (LID1) parameter list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParameterList {
    /// LIST IDENTIFIER.
    pub list_id: u8,
    /// LIST ID USAGE.
    pub usage: ListIdUsage,
    /// The CSCD descriptors, in order (segments name them by index).
    pub cscds: Vec<Designation>,
    /// The segments, in order.
    pub segments: Vec<Segment>,
}

fn invalid_param(byte: usize, bit: Option<u8>) -> Sense {
    let byte = u16::try_from(byte).unwrap_or(u16::MAX);
    Sense::INVALID_FIELD_IN_PARAMETER_LIST.with_field_pointer(FieldPointer::param(byte, bit))
}

fn illegal(asc: Asc, byte: usize) -> Sense {
    let byte = u16::try_from(byte).unwrap_or(u16::MAX);
    Sense::new(SenseKey::IllegalRequest, asc).with_field_pointer(FieldPointer::param(byte, None))
}

/// COPY ABORTED / COPY TARGET DEVICE NOT REACHABLE: a CSCD the copy
/// manager cannot reach (an index past the list, a designator of no LU of
/// this target, an LU gone).
pub const UNREACHABLE: Sense =
    Sense::new(SenseKey::CopyAborted, Asc::COPY_TARGET_DEVICE_NOT_REACHABLE);

fn be16(d: &[u8], at: usize) -> u16 {
    let mut b = [0u8; 2];
    if let Some(s) = d.get(at..at + 2) {
        b.copy_from_slice(s);
    }
    u16::from_be_bytes(b)
}

fn be32(d: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    if let Some(s) = d.get(at..at + 4) {
        b.copy_from_slice(s);
    }
    u32::from_be_bytes(b)
}

fn be64(d: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = d.get(at..at + 8) {
        b.copy_from_slice(s);
    }
    u64::from_be_bytes(b)
}

/// Parses a parameter list of `data.len()` bytes (the CDB's PARAMETER LIST
/// LENGTH, already cut to what arrived). `Ok(None)`: an empty list, which
/// is not an error and copies nothing (SPC-4 §6.4.1).
///
/// The checks run in the order libiscsi's suite and Linux's target agree
/// on: the header's lengths against the limits and against the data, then
/// the CSCD descriptors (count, type, fields), then the segments (count,
/// type, length, indexes).
pub fn parse(data: &[u8]) -> Result<Option<ParameterList>, Sense> {
    if data.is_empty() {
        return Ok(None);
    }
    if data.len() < HEADER_LEN {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let list_id = data[0];
    let flags = data[1];
    if flags & 0xC0 != 0 {
        return Err(invalid_param(1, Some(7)));
    }
    if flags & 0x20 != 0 {
        // STR (sequential striped) is a hint for stream devices only; we
        // have none, so it is accepted and ignored.
    }
    let usage = match (flags >> 3) & 0x03 {
        0b00 => ListIdUsage::Hold,
        0b10 => ListIdUsage::Discard,
        0b11 if list_id == 0 => ListIdUsage::None,
        0b11 => return Err(invalid_param(0, None)),
        _ => return Err(invalid_param(1, Some(4))),
    };
    let cscd_len = usize::from(be16(data, 2));
    let seg_len = be32(data, 8);
    let inline_len = be32(data, 12);
    if data[4..8].iter().any(|&b| b != 0) {
        return Err(invalid_param(4, None));
    }
    let descriptors = u64::try_from(cscd_len).unwrap_or(u64::MAX) + u64::from(seg_len);
    if descriptors > u64::from(MAX_DESCRIPTOR_LIST_LEN) {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    if inline_len != 0 {
        // MAXIMUM INLINE DATA LENGTH is 0: no segment type we implement
        // uses inline data.
        return Err(invalid_param(12, None));
    }
    // Bounded by MAX_DESCRIPTOR_LIST_LEN above.
    let seg_len = usize::try_from(seg_len).unwrap_or(usize::MAX);
    if HEADER_LEN + cscd_len + seg_len > data.len() {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let cscds = parse_cscds(data, cscd_len)?;
    let segments = parse_segments(data, HEADER_LEN + cscd_len, seg_len, cscds.len())?;
    Ok(Some(ParameterList {
        list_id,
        usage,
        cscds,
        segments,
    }))
}

fn parse_cscds(data: &[u8], len: usize) -> Result<Vec<Designation>, Sense> {
    if len / CSCD_LEN > usize::from(MAX_CSCD_DESCRIPTORS) {
        return Err(illegal(Asc::TOO_MANY_TARGET_DESCRIPTORS, 2));
    }
    let mut out = Vec::with_capacity(len / CSCD_LEN);
    let mut at = HEADER_LEN;
    let end = HEADER_LEN + len;
    while at < end {
        let kind = data.get(at).copied().unwrap_or(0);
        if kind != CSCD_IDENTIFICATION {
            return Err(illegal(Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE, at));
        }
        let Some(d) = data.get(at..at + CSCD_LEN).filter(|_| at + CSCD_LEN <= end) else {
            // The list length cuts the last descriptor.
            return Err(invalid_param(2, None));
        };
        // Byte 1: LU ID TYPE (bits 7-6, ignored: SPC-4 leaves it to
        // descriptors that address LUNs, not designators), NUL (bit 5,
        // obsolete in SPC-4: a null device we do not offer), PERIPHERAL
        // DEVICE TYPE (bits 4-0: block devices only).
        if d[1] & 0x20 != 0 {
            return Err(invalid_param(at + 1, Some(5)));
        }
        if d[1] & 0x1F != 0 {
            return Err(invalid_param(at + 1, Some(4)));
        }
        // Bytes 4-23: a designation descriptor (4-byte header, at most 16
        // bytes of designator). Bytes 28-31: PAD (byte 28 bit 2) and DISK
        // BLOCK LENGTH.
        let code_set = d[4] & 0x0F;
        let association = (d[5] >> 4) & 0x03;
        let designator_type = d[5] & 0x0F;
        let designator_len = usize::from(d[7]);
        if designator_len > 16 {
            return Err(invalid_param(at + 7, None));
        }
        let block_length = be32(d, 28) & 0x00FF_FFFF;
        let naa = code_set == 0x01 && association == 0 && designator_type == 0x03;
        out.push(if naa && designator_len == 16 {
            let mut id = [0u8; 16];
            id.copy_from_slice(&d[8..24]);
            Designation::Naa(Cscd {
                naa: id,
                block_length,
                at: u16::try_from(at).unwrap_or(u16::MAX),
            })
        } else {
            Designation::Unreachable
        });
        at += CSCD_LEN;
    }
    Ok(out)
}

fn parse_segments(
    data: &[u8],
    start: usize,
    len: usize,
    cscds: usize,
) -> Result<Vec<Segment>, Sense> {
    let mut out = Vec::new();
    let mut at = start;
    let end = start + len;
    while at < end {
        if out.len() >= usize::from(MAX_SEGMENT_DESCRIPTORS) {
            return Err(illegal(Asc::TOO_MANY_SEGMENT_DESCRIPTORS, 8));
        }
        if at + 4 > end {
            return Err(invalid_param(8, None));
        }
        let kind = data[at];
        if kind != SEGMENT_BLOCK_TO_BLOCK {
            return Err(illegal(Asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE, at));
        }
        if usize::from(be16(data, at + 2)) != B2B_LEN - 4 {
            return Err(invalid_param(at + 2, None));
        }
        if at + B2B_LEN > end {
            return Err(invalid_param(8, None));
        }
        let d = &data[at..at + B2B_LEN];
        // Byte 1: DC (bit 1), CAT (bit 0: how a residue is handled, moot
        // when both block lengths divide the segment, which we require).
        if d[1] & 0xFC != 0 {
            return Err(invalid_param(at + 1, Some(7)));
        }
        let seg = Segment {
            src: be16(d, 4),
            dst: be16(d, 6),
            dc: d[1] & 0x02 != 0,
            blocks: be16(d, 10),
            src_lba: be64(d, 12),
            dst_lba: be64(d, 20),
            at: u16::try_from(at).unwrap_or(u16::MAX),
        };
        // An index past the CSCD list names nothing the copy manager can
        // reach (what libiscsi's suite and Linux's target answer).
        if usize::from(seg.src) >= cscds || usize::from(seg.dst) >= cscds {
            return Err(UNREACHABLE);
        }
        out.push(seg);
        at += B2B_LEN;
    }
    Ok(out)
}

/// A parameter list as an initiator sends it (tests, and a tool that
/// copies): list identifier `list_id`, an identification CSCD descriptor
/// (NAA, 16 bytes) per designator of `ids`, then a block-to-block segment
/// per (source CSCD, destination CSCD, blocks, source LBA, destination
/// LBA) of `segs`.
///
/// # Panics
/// With more descriptors than the list's length fields can count (over
/// 2,047 CSCDs).
pub fn encode_list(list_id: u8, ids: &[[u8; 16]], segs: &[(u16, u16, u16, u64, u64)]) -> Vec<u8> {
    let mut v = vec![0u8; HEADER_LEN];
    v[0] = list_id;
    v[2..4].copy_from_slice(&u16::try_from(ids.len() * CSCD_LEN).unwrap().to_be_bytes());
    v[8..12].copy_from_slice(&u32::try_from(segs.len() * B2B_LEN).unwrap().to_be_bytes());
    for id in ids {
        let mut d = [0u8; CSCD_LEN];
        d[0] = CSCD_IDENTIFICATION;
        d[4..8].copy_from_slice(&[0x01, 0x03, 0x00, 16]);
        d[8..24].copy_from_slice(id);
        d[29..32].copy_from_slice(&[0, 0x02, 0x00]);
        v.extend_from_slice(&d);
    }
    for &(src, dst, blocks, src_lba, dst_lba) in segs {
        let mut d = [0u8; B2B_LEN];
        d[0] = SEGMENT_BLOCK_TO_BLOCK;
        d[2..4].copy_from_slice(&24u16.to_be_bytes());
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src_lba.to_be_bytes());
        d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        v.extend_from_slice(&d);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of identification descriptors naming `naa` and segments.
    fn list(naa: &[[u8; 16]], segs: &[(u16, u16, u16, u64, u64)]) -> Vec<u8> {
        encode_list(1, naa, segs)
    }

    const A: [u8; 16] = [0x60, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];

    #[test]
    fn parses_identification_and_block_to_block() {
        let v = list(&[A, A], &[(0, 1, 8, 0, 100)]);
        let p = parse(&v).unwrap().unwrap();
        assert_eq!(p.list_id, 1);
        assert_eq!(p.usage, ListIdUsage::Hold);
        assert_eq!(p.cscds.len(), 2);
        let Designation::Naa(c) = p.cscds[0] else {
            panic!("not NAA")
        };
        assert_eq!(c.naa, A);
        assert_eq!(c.block_length, 512);
        assert_eq!(
            p.segments,
            vec![Segment {
                src: 0,
                dst: 1,
                dc: false,
                blocks: 8,
                src_lba: 0,
                dst_lba: 100,
                at: 80,
            }]
        );
    }

    #[test]
    fn empty_list_copies_nothing() {
        assert_eq!(parse(&[]), Ok(None));
    }

    #[test]
    fn lengths_beyond_the_data_are_a_length_error() {
        let v = list(&[A], &[(0, 0, 8, 0, 100)]);
        for cut in [1, 15, HEADER_LEN + CSCD_LEN - 1, v.len() - 1] {
            assert_eq!(
                parse(&v[..cut]),
                Err(Sense::PARAMETER_LIST_LENGTH_ERROR),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn descriptor_list_longer_than_the_limit_is_a_length_error() {
        let mut v = list(&[A], &[]);
        v[8..12].copy_from_slice(&2000u32.to_be_bytes());
        assert_eq!(parse(&v), Err(Sense::PARAMETER_LIST_LENGTH_ERROR));
        // Even when the claimed lengths would overflow.
        v[2..4].copy_from_slice(&u16::MAX.to_be_bytes());
        v[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse(&v), Err(Sense::PARAMETER_LIST_LENGTH_ERROR));
    }

    #[test]
    fn too_many_descriptors() {
        let many = vec![A; usize::from(MAX_CSCD_DESCRIPTORS) + 1];
        let e = parse(&list(&many, &[(0, 0, 1, 0, 0)])).unwrap_err();
        assert_eq!(e.asc, Asc::TOO_MANY_TARGET_DESCRIPTORS);
        let segs = vec![(0, 0, 1, 0, 0); usize::from(MAX_SEGMENT_DESCRIPTORS) + 1];
        let e = parse(&list(&[A], &segs)).unwrap_err();
        assert_eq!(e.asc, Asc::TOO_MANY_SEGMENT_DESCRIPTORS);
    }

    #[test]
    fn unsupported_types_are_named() {
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[HEADER_LEN] = 0xE0;
        let e = parse(&v).unwrap_err();
        assert_eq!(e.asc, Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE);
        assert_eq!(e.field_pointer, Some(FieldPointer::param(16, None)));
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[HEADER_LEN + CSCD_LEN] = 0x03;
        let e = parse(&v).unwrap_err();
        assert_eq!(e.asc, Asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE);
    }

    #[test]
    fn bad_fields_point_at_themselves() {
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[1] = 0x08; // LIST ID USAGE 01b: reserved
        assert_eq!(parse(&v), Err(invalid_param(1, Some(4))));
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[1] = 0x18; // 11b with a list identifier
        assert_eq!(parse(&v), Err(invalid_param(0, None)));
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[HEADER_LEN + 1] = 0x20; // NUL
        assert_eq!(parse(&v), Err(invalid_param(17, Some(5))));
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[HEADER_LEN + 1] = 0x01; // a sequential-access device
        assert_eq!(parse(&v), Err(invalid_param(17, Some(4))));
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[12..16].copy_from_slice(&1u32.to_be_bytes()); // inline data
        assert_eq!(parse(&v), Err(invalid_param(12, None)));
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[HEADER_LEN + CSCD_LEN + 3] = 20; // descriptor length
        assert_eq!(parse(&v), Err(invalid_param(50, None)));
    }

    #[test]
    fn an_index_past_the_list_is_unreachable() {
        let v = list(&[A], &[(0, 1, 8, 0, 100)]);
        assert_eq!(parse(&v), Err(UNREACHABLE));
    }

    #[test]
    fn other_designators_parse_but_reach_nothing() {
        let mut v = list(&[A], &[(0, 0, 1, 0, 0)]);
        v[HEADER_LEN + 5] = 0x02; // EUI-64
        let p = parse(&v).unwrap().unwrap();
        assert_eq!(p.cscds, vec![Designation::Unreachable]);
    }

    #[test]
    fn never_panics_on_any_prefix_or_byte() {
        let v = list(&[A, A], &[(0, 1, 8, 0, 100), (1, 0, 8, 5, 6)]);
        for cut in 0..=v.len() {
            let _ = parse(&v[..cut]);
        }
        for i in 0..v.len() {
            for b in [0x00, 0x01, 0x7F, 0x80, 0xFF] {
                let mut w = v.clone();
                w[i] = b;
                let _ = parse(&w);
            }
        }
    }
}
