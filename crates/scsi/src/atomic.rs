//! WRITE ATOMIC(16) (SBC-4 §5.48, atomic writes §4.29) and the atomic
//! fields of the Block Limits VPD page (SBC-4 §6.6.4).
//!
//! An atomic write is all-or-nothing: a read running beside it sees all of
//! it or none of it, and a crash leaves all of it or none of it. Only the
//! store knows what it can promise ([`Backstore::atomic_write_max`]); the
//! limits here are that promise in blocks, bounded by what a command may
//! move, and a store that promises nothing has no WRITE ATOMIC at all
//! (INVALID COMMAND OPERATION CODE, and REPORT SUPPORTED OPERATION CODES
//! leaves it out), as SBC-4 asks when MAXIMUM ATOMIC TRANSFER LENGTH is 0.

use crate::backstore::Backstore;
use crate::cdb::MAX_TRANSFER_BYTES;
use crate::cdb::{self, Blocks, Lba, check_range};
use crate::data_out::DataOut;
use crate::lu::ModeParams;
use iscsi_sense::{FieldPointer, Sense};

/// What one LU advertises for atomic writes, in logical blocks (the five
/// atomic fields of the Block Limits VPD page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicLimits {
    /// MAXIMUM ATOMIC TRANSFER LENGTH: 0 when the LU has no atomic writes.
    pub max: u32,
    /// ATOMIC ALIGNMENT: 0, no alignment asked of the starting LBA (a store
    /// that makes any write atomic has no preferred boundary).
    pub alignment: u32,
    /// ATOMIC TRANSFER LENGTH GRANULARITY: 0, any number of blocks.
    pub granularity: u32,
    /// MAXIMUM ATOMIC TRANSFER LENGTH WITH ATOMIC BOUNDARY: with an ATOMIC
    /// BOUNDARY only each boundary-sized piece need be atomic, which a
    /// store that makes the whole write atomic gives for free, so the
    /// limit is the same as without.
    pub max_with_boundary: u32,
    /// MAXIMUM ATOMIC BOUNDARY SIZE: likewise.
    pub max_boundary: u32,
}

impl AtomicLimits {
    /// The limits of `lu`: its promise in whole blocks, no more than the
    /// MAXIMUM TRANSFER LENGTH (libiscsi and SBC-4: never above it) and
    /// than the CDB's 16-bit TRANSFER LENGTH can ask for.
    pub fn of(lu: &dyn Backstore) -> Self {
        let bs = u64::from(lu.block_size().max(1));
        let max = (lu.atomic_write_max() / bs)
            .min(MAX_TRANSFER_BYTES / bs)
            .min(u64::from(u16::MAX));
        let max = u32::try_from(max).unwrap_or(0);
        Self {
            max,
            alignment: 0,
            granularity: 0,
            max_with_boundary: max,
            max_boundary: max,
        }
    }

    /// Whether the LU offers WRITE ATOMIC(16).
    pub fn supported(&self) -> bool {
        self.max > 0
    }

    /// The five fields as they appear from byte 44 of the Block Limits
    /// page.
    pub fn vpd_bytes(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        let fields = [
            self.max,
            self.alignment,
            self.granularity,
            self.max_with_boundary,
            self.max_boundary,
        ];
        for (dst, f) in b.chunks_exact_mut(4).zip(fields) {
            dst.copy_from_slice(&f.to_be_bytes());
        }
        b
    }
}

/// INVALID FIELD IN CDB naming TRANSFER LENGTH (bytes 12-13): too long for
/// an atomic write, or not a multiple of the granularity.
const BAD_LENGTH: Sense =
    Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(12, None));

/// WRITE ATOMIC(16): the checks of SBC-4 §5.48.2 in the order WRITE(16)
/// makes its own (protection, range, then the atomic limits), then one
/// write the store makes all-or-nothing; FUA (or WCE 0) writes through.
/// DPO is accepted and means nothing here (no cache to keep data out of).
///
/// Precondition (the transport's): `data_out` holds at least the
/// TRANSFER LENGTH in bytes; a shorter one is INVALID FIELD IN CDB and
/// nothing is written.
pub(crate) fn write_atomic_16(
    lu: &dyn Backstore,
    mode: ModeParams,
    cdb: &[u8],
    data_out: DataOut<'_>,
) -> Result<(), Sense> {
    let limits = AtomicLimits::of(lu);
    if !limits.supported() {
        return Err(Sense::INVALID_OPCODE);
    }
    let b1 = cdb::byte(cdb, 1)?;
    if b1 & 0xE0 != 0 {
        // WRPROTECT: no protection information on any of our LUs.
        return Err(Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(1, Some(7))));
    }
    if b1 & 0x07 != 0 {
        // Reserved bits 2-0.
        return Err(Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(1, Some(2))));
    }
    let fua = b1 & 0x08 != 0;
    let lba = Lba(cdb::be64(cdb, 2)?);
    let boundary = u32::from(cdb::be16(cdb, 10)?);
    let blocks = u32::from(cdb::be16(cdb, 12)?);
    check_range(lba, Blocks(u64::from(blocks)), Blocks(lu.block_count()))?;
    let max = if boundary == 0 {
        limits.max
    } else if boundary > limits.max_boundary {
        return Err(Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(10, None)));
    } else {
        limits.max_with_boundary
    };
    if blocks > max {
        return Err(BAD_LENGTH);
    }
    if limits.alignment > 1 && !lba.0.is_multiple_of(u64::from(limits.alignment)) {
        return Err(Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(2, None)));
    }
    if limits.granularity > 1 && !blocks.is_multiple_of(limits.granularity) {
        return Err(BAD_LENGTH);
    }
    if blocks == 0 {
        return Ok(());
    }
    if mode.swp {
        return Err(Sense::WRITE_PROTECTED);
    }
    let bs = lu.block_size();
    let len = usize::try_from(Blocks(u64::from(blocks)).bytes(bs))
        .map_err(|_| Sense::INVALID_FIELD_IN_CDB)?;
    if data_out.len() < len {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let offset = lba.byte_offset(bs);
    let through = fua || !mode.wce;
    // One call to the store: it is the store's single write that is
    // atomic (`atomic_write_max`), never a sequence of them.
    let r = match data_out {
        DataOut::Flat(data) => match data.get(..len) {
            Some(d) if through => lu.write_through(offset, d),
            Some(d) => lu.write_at(offset, d),
            None => return Err(Sense::INVALID_FIELD_IN_CDB),
        },
        DataOut::Pieces { pieces, .. } if through => lu.write_pieces_through(offset, pieces, len),
        DataOut::Pieces { pieces, .. } => lu.write_pieces(offset, pieces, len),
    };
    r.map_err(Sense::write_failed)
}
