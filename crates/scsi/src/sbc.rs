//! Block commands (SBC-3): READ(6/10/12/16), WRITE(6/10/12/16), READ
//! CAPACITY(10/16), SYNCHRONIZE CACHE(10/16) and UNMAP.
//!
//! Every LBA range is checked in [`Lba`]/[`Blocks`] before it becomes a byte
//! offset; READ lands data directly in the caller's reused Data-In buffer.

use crate::backstore::Backstore;
use crate::cdb::{self, Blocks, Lba, SA_READ_CAPACITY_16, check_range, opcode};
use crate::sense::Sense;
use crate::spc::{MAX_TRANSFER_BYTES, MAX_UNMAP_DESCRIPTORS, MAX_UNMAP_LBA_COUNT};

fn capacity(lu: &dyn Backstore) -> Blocks {
    Blocks(lu.block_count())
}

/// READ CAPACITY(10): last LBA (0xFFFFFFFF when it does not fit) and block
/// size. PMI 0 with a non-zero LBA field is an invalid field.
pub fn read_capacity_10(
    lu: &dyn Backstore,
    cdb: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    let lba = cdb::be32(cdb, 2)?;
    let pmi = cdb::byte(cdb, 8)? & 0x01 != 0;
    if !pmi && lba != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let last = lu.block_count().saturating_sub(1);
    let last = u32::try_from(last).unwrap_or(u32::MAX);
    data_in.extend_from_slice(&last.to_be_bytes());
    data_in.extend_from_slice(&lu.block_size().to_be_bytes());
    Ok(())
}

/// SERVICE ACTION IN(16): only READ CAPACITY(16) is supported.
pub fn service_action_in_16(
    lu: &dyn Backstore,
    cdb: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    if cdb::byte(cdb, 1)? & 0x1F != SA_READ_CAPACITY_16 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let alloc = cdb::be32(cdb, 10)?;
    let last = lu.block_count().saturating_sub(1);
    data_in.extend_from_slice(&last.to_be_bytes());
    data_in.extend_from_slice(&lu.block_size().to_be_bytes());
    // Byte 12: no protection; byte 13: one logical block per physical block;
    // bytes 14-15: LBPME (thin provisioned), LBPRZ (unmapped reads zero),
    // lowest aligned LBA 0.
    data_in.extend_from_slice(&[0x00, 0x00, 0x80 | 0x40, 0x00]);
    data_in.resize(32, 0);
    data_in.truncate(usize::try_from(alloc).unwrap_or(usize::MAX));
    Ok(())
}

/// READ and WRITE of every size.
///
/// Precondition (guaranteed by the transport): a WRITE's `data_out` holds at
/// least `blocks * block_size` bytes; a shorter one is refused with INVALID
/// FIELD IN CDB and nothing is written. Extra bytes are ignored.
pub fn read_write(
    lu: &dyn Backstore,
    cdb: &[u8],
    data_out: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    let rw = cdb::parse_rw(cdb).ok_or(Sense::INVALID_OPCODE)??;
    if rw.protect != 0 {
        // No protection information: RDPROTECT/WRPROTECT must be zero.
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    check_range(rw.lba, rw.blocks, capacity(lu))?;
    let bs = lu.block_size();
    let bytes = rw.blocks.bytes(bs);
    if bytes > MAX_TRANSFER_BYTES {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    if bytes == 0 {
        return Ok(());
    }
    let len = usize::try_from(bytes).map_err(|_| Sense::INVALID_FIELD_IN_CDB)?;
    let offset = rw.lba.byte_offset(bs);
    if rw.write {
        let src = data_out.get(..len).ok_or(Sense::INVALID_FIELD_IN_CDB)?;
        lu.write_at(offset, src).map_err(|_| Sense::WRITE_ERROR)?;
        if rw.fua {
            lu.flush().map_err(|_| Sense::WRITE_ERROR)?;
        }
    } else {
        data_in.resize(len, 0);
        lu.read_at(offset, data_in).map_err(|_| Sense::READ_ERROR)?;
    }
    Ok(())
}

/// SYNCHRONIZE CACHE(10/16): range check (0 blocks = to the end), then flush.
pub fn synchronize_cache(lu: &dyn Backstore, cdb: &[u8]) -> Result<(), Sense> {
    let (lba, blocks) = if cdb.first() == Some(&opcode::SYNCHRONIZE_CACHE_16) {
        (cdb::be64(cdb, 2)?, u64::from(cdb::be32(cdb, 10)?))
    } else {
        (u64::from(cdb::be32(cdb, 2)?), u64::from(cdb::be16(cdb, 7)?))
    };
    check_range(Lba(lba), Blocks(blocks), capacity(lu))?;
    lu.flush().map_err(|_| Sense::WRITE_ERROR)
}

/// UNMAP: validates the whole parameter list (lengths, descriptor count,
/// every range) before deallocating anything.
pub fn unmap(lu: &dyn Backstore, cdb: &[u8], data_out: &[u8]) -> Result<(), Sense> {
    if cdb::byte(cdb, 1)? & 0x01 != 0 {
        // ANCHOR: not supported (ANC_SUP 0).
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let param_len = usize::from(cdb::be16(cdb, 7)?);
    if param_len == 0 {
        return Ok(());
    }
    let params = data_out
        .get(..param_len)
        .ok_or(Sense::INVALID_FIELD_IN_CDB)?;
    if param_len < 8 {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let field = |at: usize, n: usize| {
        params
            .get(at..at + n)
            .ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)
    };
    let be = |s: &[u8]| s.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    let desc_len = usize::try_from(be(field(2, 2)?)).unwrap_or(usize::MAX);
    let descriptors = params.get(8..).unwrap_or(&[]);
    let desc_len = desc_len.min(descriptors.len()) / 16 * 16;
    let count = desc_len / 16;
    if count > MAX_UNMAP_DESCRIPTORS as usize {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    }
    let list = descriptors.get(..desc_len).unwrap_or(&[]);
    let cap = capacity(lu);
    let mut ranges = Vec::with_capacity(count);
    for d in list.chunks_exact(16) {
        let lba = Lba(be(d.get(0..8).unwrap_or(&[])));
        let n = be(d.get(8..12).unwrap_or(&[]));
        if n > u64::from(MAX_UNMAP_LBA_COUNT) {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        check_range(lba, Blocks(n), cap)?;
        ranges.push((lba, Blocks(n)));
    }
    let bs = lu.block_size();
    for (lba, n) in ranges {
        if n.0 > 0 {
            lu.unmap(lba.byte_offset(bs), n.bytes(bs))
                .map_err(|_| Sense::WRITE_ERROR)?;
        }
    }
    Ok(())
}
