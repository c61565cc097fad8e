//! Block commands (SBC-3): READ(6/10/12/16), WRITE(6/10/12/16), READ
//! CAPACITY(10/16), SYNCHRONIZE CACHE(10/16), UNMAP, WRITE SAME(10/16),
//! GET LBA STATUS, COMPARE AND WRITE, VERIFY(10/12/16), WRITE AND
//! VERIFY(10/12/16), START STOP UNIT and PREVENT ALLOW MEDIUM REMOVAL.
//!
//! Every LBA range is checked in [`Lba`]/[`Blocks`] before it becomes a byte
//! offset; READ lands data directly in the caller's reused Data-In buffer.
//! Work buffers are bounded by [`MAX_TRANSFER_BYTES`] or [`IO_CHUNK`].

use crate::backstore::Backstore;
use crate::cdb::{self, Blocks, Lba, SA_GET_LBA_STATUS, SA_READ_CAPACITY_16, check_range, opcode};
use crate::lu::ModeParams;
use crate::medium::LoadEject;
use crate::spc::{
    MAX_COMPARE_AND_WRITE_BLOCKS, MAX_TRANSFER_BYTES, MAX_UNMAP_DESCRIPTORS, MAX_UNMAP_LBA_COUNT,
    MAX_WRITE_SAME_BLOCKS,
};
use iscsi_sense::Sense;

/// Largest buffer WRITE SAME, VERIFY and COMPARE loops use per step.
pub const IO_CHUNK: u64 = 1024 * 1024;

/// Most descriptors one GET LBA STATUS returns.
pub const MAX_LBA_STATUS_DESCRIPTORS: usize = 64;

/// DATA PROTECT / WRITE PROTECTED when SWP is set.
fn check_writable(mode: ModeParams) -> Result<(), Sense> {
    if mode.swp {
        Err(Sense::WRITE_PROTECTED)
    } else {
        Ok(())
    }
}

/// Writes `buf` at `offset`: through to stable storage for FUA or when the
/// write cache is disabled (WCE 0), else into the store's cache.
fn write_data(
    lu: &dyn Backstore,
    mode: ModeParams,
    offset: u64,
    buf: &[u8],
    fua: bool,
) -> Result<(), Sense> {
    let r = if fua || !mode.wce {
        lu.write_through(offset, buf)
    } else {
        lu.write_at(offset, buf)
    };
    r.map_err(Sense::write_failed)
}

/// `blocks` blocks as a byte count no larger than `limit`, else INVALID
/// FIELD IN CDB (the MAXIMUM TRANSFER LENGTH of the Block Limits page).
fn transfer_len(blocks: Blocks, bs: u32, limit: u64) -> Result<usize, Sense> {
    let bytes = blocks.bytes(bs);
    if bytes > limit {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    usize::try_from(bytes).map_err(|_| Sense::INVALID_FIELD_IN_CDB)
}

/// Compares the medium from `offset` with `expect`, one bounded chunk at a
/// time; `Err(MISCOMPARE)` with the offset of the first differing byte
/// (relative to `offset`) in INFORMATION.
fn compare_medium(lu: &dyn Backstore, offset: u64, expect: &[u8]) -> Result<(), Sense> {
    let mut buf = Vec::new();
    for (i, want) in expect.chunks(IO_CHUNK as usize).enumerate() {
        let start = (i as u64).saturating_mul(IO_CHUNK);
        buf.resize(want.len(), 0);
        lu.read_at(offset.saturating_add(start), &mut buf)
            .map_err(Sense::read_failed)?;
        if let Some(k) = buf.iter().zip(want).position(|(a, b)| a != b) {
            return Err(Sense::miscompare(start.saturating_add(k as u64)));
        }
    }
    Ok(())
}

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

/// SERVICE ACTION IN(16): READ CAPACITY(16) (SBC-3 §5.16) and GET LBA
/// STATUS (SBC-3 §5.6).
pub fn service_action_in_16(
    lu: &dyn Backstore,
    cdb: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    match cdb::byte(cdb, 1)? & 0x1F {
        SA_READ_CAPACITY_16 => read_capacity_16(lu, cdb, data_in),
        SA_GET_LBA_STATUS => get_lba_status(lu, cdb, data_in),
        _ => Err(Sense::INVALID_FIELD_IN_CDB),
    }
}

/// GET LBA STATUS (SBC-3 §5.6): LBA status descriptors from the starting
/// LBA, as many as the allocation length holds (at most
/// [`MAX_LBA_STATUS_DESCRIPTORS`], at least one).
pub fn get_lba_status(lu: &dyn Backstore, cdb: &[u8], data_in: &mut Vec<u8>) -> Result<(), Sense> {
    let lba = cdb::be64(cdb, 2)?;
    let alloc = usize::try_from(cdb::be32(cdb, 10)?).unwrap_or(usize::MAX);
    let cap = lu.block_count();
    if lba >= cap {
        return Err(Sense::LBA_OUT_OF_RANGE);
    }
    let bs = u64::from(lu.block_size());
    let max_desc = (alloc.saturating_sub(8) / 16).clamp(1, MAX_LBA_STATUS_DESCRIPTORS);
    data_in.extend_from_slice(&[0; 8]);
    let mut pos = lba;
    let mut count = 0;
    while pos < cap && count < max_desc {
        // One descriptor covers at most u32::MAX blocks.
        let want = (cap - pos).min(u64::from(u32::MAX));
        let a = lu
            .allocation_status(pos * bs, want * bs)
            .map_err(Sense::read_failed)?;
        // A partly mapped block counts as mapped.
        let (mapped, blocks) = if a.mapped {
            (true, a.len.div_ceil(bs))
        } else if a.len / bs == 0 {
            (true, 1)
        } else {
            (false, a.len / bs)
        };
        let blocks = blocks.clamp(1, want);
        data_in.extend_from_slice(&pos.to_be_bytes());
        data_in.extend_from_slice(&u32::try_from(blocks).unwrap_or(u32::MAX).to_be_bytes());
        // PROVISIONING STATUS: 0 mapped, 1 deallocated.
        data_in.extend_from_slice(&[u8::from(!mapped), 0, 0, 0]);
        pos += blocks;
        count += 1;
    }
    let len = u32::try_from(data_in.len().saturating_sub(4)).unwrap_or(u32::MAX);
    if let Some(f) = data_in.get_mut(0..4) {
        f.copy_from_slice(&len.to_be_bytes());
    }
    data_in.truncate(alloc);
    Ok(())
}

/// READ CAPACITY(16) (SBC-3 §5.16).
fn read_capacity_16(lu: &dyn Backstore, cdb: &[u8], data_in: &mut Vec<u8>) -> Result<(), Sense> {
    let alloc = cdb::be32(cdb, 10)?;
    let last = lu.block_count().saturating_sub(1);
    data_in.extend_from_slice(&last.to_be_bytes());
    data_in.extend_from_slice(&lu.block_size().to_be_bytes());
    // Byte 12: no protection; byte 13: LOGICAL BLOCKS PER PHYSICAL BLOCK
    // EXPONENT (3 for 512e); bytes 14-15: LBPME (thin provisioned), LBPRZ
    // (unmapped blocks read as zeros, true of every store), lowest aligned
    // LBA 0.
    let lbpme = if lu.is_thin() { 0x80 } else { 0 };
    let lbppbe = lu.lu_options().lbppbe(lu.block_size());
    data_in.extend_from_slice(&[0x00, lbppbe, lbpme | 0x40, 0x00]);
    data_in.resize(32, 0);
    data_in.truncate(usize::try_from(alloc).unwrap_or(usize::MAX));
    Ok(())
}

/// What a READ or WRITE moves, once every check has passed
/// ([`plan_read_write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// The first byte on the medium.
    pub offset: u64,
    /// How many bytes.
    pub len: usize,
    /// A WRITE (else a READ).
    pub write: bool,
    /// A WRITE that must be on stable storage when it completes: FUA, or
    /// the write cache off (WCE 0).
    pub through: bool,
}

/// Checks a READ or WRITE CDB against the LU (protection, range, transfer
/// size, write protection, the data that came) and says what it moves;
/// `None` when it moves nothing (a transfer length of 0).
pub(crate) fn plan_read_write(
    lu: &dyn Backstore,
    mode: ModeParams,
    cdb: &[u8],
    data_out_len: usize,
) -> Result<Option<Transfer>, Sense> {
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
        return Ok(None);
    }
    let len = usize::try_from(bytes).map_err(|_| Sense::INVALID_FIELD_IN_CDB)?;
    if rw.write {
        check_writable(mode)?;
        if data_out_len < len {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
    }
    Ok(Some(Transfer {
        offset: rw.lba.byte_offset(bs),
        len,
        write: rw.write,
        through: rw.write && (rw.fua || !mode.wce),
    }))
}

/// READ and WRITE of every size.
///
/// Precondition (guaranteed by the transport): a WRITE's `data_out` holds at
/// least `blocks * block_size` bytes; a shorter one is refused with INVALID
/// FIELD IN CDB and nothing is written. Extra bytes are ignored.
pub(crate) fn read_write(
    lu: &dyn Backstore,
    mode: ModeParams,
    cdb: &[u8],
    data_out: crate::data_out::DataOut<'_>,
    data_in: &mut Vec<u8>,
    lent: Option<&mut Vec<crate::backstore::Lent>>,
) -> Result<(), Sense> {
    // For a READ, `data_in` arrives holding scratch bytes (see
    // `ScsiTarget::execute`). Take them: every early return leaves the
    // response empty, and only a read that succeeds hands them back, every
    // byte overwritten. A WRITE's (empty) buffer stays with the caller,
    // capacity and all, for the next command.
    let mut scratch = if cdb::is_read(cdb) {
        std::mem::take(data_in)
    } else {
        Vec::new()
    };
    let Some(Transfer {
        offset,
        len,
        write,
        through,
    }) = plan_read_write(lu, mode, cdb, data_out.len())?
    else {
        return Ok(());
    };
    if write {
        match data_out {
            crate::data_out::DataOut::Flat(data) => {
                let data = &data[..len];
                let r = if through {
                    lu.write_through(offset, data)
                } else {
                    lu.write_at(offset, data)
                };
                r.map_err(Sense::write_failed)?;
            }
            crate::data_out::DataOut::Pieces { pieces, .. } => {
                let r = if through {
                    lu.write_pieces_through(offset, pieces, len)
                } else {
                    lu.write_pieces(offset, pieces, len)
                };
                r.map_err(Sense::write_failed)?;
            }
        }
    } else if let Some((loan, lent)) = lent
        .filter(|_| len >= LEND_MIN)
        .and_then(|lent| Some((lu.lend(offset, len)?, lent)))
    {
        // The store lent its memory: nothing copied; the scratch buffer
        // goes back to the caller as it came (its length is what a
        // buffer pool needs to reuse it without zeroing it again).
        *lent = loan.map_err(Sense::read_failed)?;
        *data_in = scratch;
    } else {
        // Only growth is zeroed: a reused buffer is overwritten, not
        // cleared (a 1 MiB memset per READ was 9% of the target's CPU time).
        scratch.resize(len, 0);
        lu.read_at(offset, &mut scratch)
            .map_err(Sense::read_failed)?;
        *data_in = scratch;
    }
    Ok(())
}

/// READs shorter than this are copied even from a store that lends: for
/// them a copy costs less than lending's allocations and reference counts
/// (`scripts/bench-ab`, 4 KiB random reads at QD 32: 98000 IOPS copied,
/// 82000 lent; 1 MiB reads: 3-6% less target CPU lent).
pub const LEND_MIN: usize = 64 * 1024;

/// SYNCHRONIZE CACHE(10/16): range check (0 blocks = to the end), then flush.
pub fn synchronize_cache(lu: &dyn Backstore, cdb: &[u8]) -> Result<(), Sense> {
    let (lba, blocks) = if cdb.first() == Some(&opcode::SYNCHRONIZE_CACHE_16) {
        (cdb::be64(cdb, 2)?, u64::from(cdb::be32(cdb, 10)?))
    } else {
        (u64::from(cdb::be32(cdb, 2)?), u64::from(cdb::be16(cdb, 7)?))
    };
    check_range(Lba(lba), Blocks(blocks), capacity(lu))?;
    lu.flush().map_err(Sense::write_failed)
}

/// UNMAP (SBC-3 §5.28): validates the whole parameter list (lengths,
/// descriptor count, every range) before deallocating anything.
pub(crate) fn unmap(
    lu: &dyn Backstore,
    mode: ModeParams,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<(), Sense> {
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
    check_writable(mode)?;
    let bs = lu.block_size();
    for (lba, n) in ranges {
        if n.0 > 0 {
            lu.unmap(lba.byte_offset(bs), n.bytes(bs))
                .map_err(Sense::write_failed)?;
        }
    }
    Ok(())
}

/// WRITE SAME(10)/(16) (SBC-3 §5.42, §5.43): one block (or zeros with
/// NDOB) written to every block of the range; with UNMAP and a block of
/// zeros, the range is deallocated instead (unmapped blocks read as zeros,
/// LBPRZ). NUMBER OF LOGICAL BLOCKS 0 means "to the last LBA" (WSNZ 0),
/// limited like any other count by MAXIMUM WRITE SAME LENGTH.
pub(crate) fn write_same(
    lu: &dyn Backstore,
    mode: ModeParams,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<(), Sense> {
    let sixteen = cdb.first() == Some(&opcode::WRITE_SAME_16);
    let b1 = cdb::byte(cdb, 1)?;
    // WRPROTECT (7-5), ANCHOR (4), PBDATA/LBDATA (2-1, obsolete), and in
    // WRITE SAME(10) the reserved bit 0.
    let reserved = if sixteen { 0xF6 } else { 0xF7 };
    if b1 & reserved != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let unmap = b1 & 0x08 != 0;
    // UNMAP=1 needs logical block provisioning (LBPWS/LBPWS10 in VPD B2
    // are only set for thin stores).
    if unmap && !lu.is_thin() {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let ndob = sixteen && b1 & 0x01 != 0;
    let (lba, n) = if sixteen {
        (cdb::be64(cdb, 2)?, u64::from(cdb::be32(cdb, 10)?))
    } else {
        (u64::from(cdb::be32(cdb, 2)?), u64::from(cdb::be16(cdb, 7)?))
    };
    let cap = lu.block_count();
    // "To the last LBA" needs a starting LBA inside the medium.
    if n == 0 && lba >= cap {
        return Err(Sense::LBA_OUT_OF_RANGE);
    }
    let count = if n == 0 { cap - lba } else { n };
    check_range(Lba(lba), Blocks(count), Blocks(cap))?;
    if count > u64::from(MAX_WRITE_SAME_BLOCKS) {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    // Before the Data-Out is looked at: a write-protected medium refuses
    // the command whatever it carries (libiscsi's ReadOnly.ReadOnlySBC
    // sends WRITE SAME with UNMAP and no block).
    check_writable(mode)?;
    let bs = lu.block_size();
    let block_len = bs as usize;
    let zero_block;
    let block = if ndob {
        zero_block = vec![0u8; block_len];
        &zero_block[..]
    } else {
        data_out
            .get(..block_len)
            .ok_or(Sense::INVALID_FIELD_IN_CDB)?
    };
    if count == 0 {
        return Ok(());
    }
    let offset = Lba(lba).byte_offset(bs);
    let total = Blocks(count).bytes(bs);
    // UNMAP=1 deallocates the range whatever the data block holds (SBC-3
    // 5.45 lets the device server unmap instead of writing); with LBPRZ the
    // blocks then read as zeros, which is what Linux's target does and
    // libiscsi's suite checks.
    if unmap {
        return lu.unmap(offset, total).map_err(Sense::write_failed);
    }
    // A store that repeats the block itself is sent it once (RBD: one
    // `writesame` op per object instead of every byte).
    if let Some(r) = lu.write_same(offset, total, block, !mode.wce) {
        return r.map_err(Sense::write_failed);
    }
    let per_step = (IO_CHUNK / u64::from(bs)).max(1).min(count);
    let mut pattern = Vec::with_capacity(usize::try_from(per_step).unwrap_or(1) * block_len);
    for _ in 0..per_step {
        pattern.extend_from_slice(block);
    }
    let mut done = 0u64;
    while done < count {
        let n = (count - done).min(per_step);
        let bytes = usize::try_from(Blocks(n).bytes(bs)).unwrap_or(0);
        let chunk = pattern.get(..bytes).unwrap_or_default();
        write_data(lu, mode, offset + Blocks(done).bytes(bs), chunk, false)?;
        done += n;
    }
    Ok(())
}

/// Whether the store does COMPARE AND WRITE `cdb` in one step
/// ([`Backstore::compares_in_one_step`]), atomic whoever else writes the
/// medium; a CDB that does not parse, or moves nothing, says yes: it
/// fails (or succeeds) before any compare.
pub(crate) fn compares_in_one_step(lu: &dyn Backstore, cdb: &[u8]) -> bool {
    let (Ok(lba), Ok(n)) = (cdb::be64(cdb, 2), cdb::byte(cdb, 13)) else {
        return true;
    };
    let bs = lu.block_size();
    n == 0 || lu.compares_in_one_step(Lba(lba).byte_offset(bs), Blocks(u64::from(n)).bytes(bs))
}

/// COMPARE AND WRITE (SBC-3 §5.2): the Data-Out holds NUMBER OF LOGICAL
/// BLOCKS blocks to compare, then as many to write. A store that does it
/// in one step ([`Backstore::compare_and_write`]: RBD, in the OSD, atomic
/// across gateways) does; otherwise it is read, compare, write, and the
/// caller holds the LU's exclusive write lock, so no other write lands
/// between the compare and the write. A mismatch is MISCOMPARE with the
/// offset of the first differing byte (from the start of the Data-Out,
/// SBC-4 §5.3) in INFORMATION, and nothing is written.
pub(crate) fn compare_and_write(
    lu: &dyn Backstore,
    mode: ModeParams,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<(), Sense> {
    let b1 = cdb::byte(cdb, 1)?;
    // WRPROTECT must be 0; bit 0 and bit 2 are reserved.
    if b1 & 0xE5 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let fua = b1 & 0x08 != 0;
    let lba = Lba(cdb::be64(cdb, 2)?);
    let n = cdb::byte(cdb, 13)?;
    let bs = lu.block_size();
    check_range(lba, Blocks(u64::from(n)), Blocks(lu.block_count()))?;
    if n == 0 {
        return Ok(());
    }
    if n > MAX_COMPARE_AND_WRITE_BLOCKS {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let len = transfer_len(Blocks(u64::from(n)), bs, MAX_TRANSFER_BYTES / 2)?;
    let data = data_out
        .get(..len.saturating_mul(2))
        .ok_or(Sense::INVALID_FIELD_IN_CDB)?;
    let (verify, write) = data.split_at(len);
    check_writable(mode)?;
    let offset = lba.byte_offset(bs);
    if let Some(r) = lu.compare_and_write(offset, verify, write, fua || !mode.wce) {
        return match r {
            Ok(None) => Ok(()),
            Ok(Some(at)) => Err(Sense::miscompare(at)),
            Err(e) => Err(Sense::write_failed(e)),
        };
    }
    compare_medium(lu, offset, verify)?;
    write_data(lu, mode, offset, write, fua)
}

/// VERIFY(10/12/16) (SBC-3 §5.33-5.35). BYTCHK 00b: the range must be
/// readable. 01b: the Data-Out must equal the medium. 11b: every block must
/// equal the one block of Data-Out. A mismatch is MISCOMPARE with the
/// offset of the first differing byte (from the first verified block) in
/// INFORMATION.
pub(crate) fn verify(lu: &dyn Backstore, cdb: &[u8], data_out: &[u8]) -> Result<(), Sense> {
    let b1 = cdb::byte(cdb, 1)?;
    // VRPROTECT must be 0 (no protection information); bit 0 is reserved.
    if b1 & 0xE1 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let bytchk = (b1 >> 1) & 0x03;
    if bytchk == 0x02 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let (lba, n) = cdb::verify_lba_and_len(cdb)?;
    check_range(lba, n, Blocks(lu.block_count()))?;
    if n.0 == 0 {
        return Ok(());
    }
    let bs = lu.block_size();
    let offset = lba.byte_offset(bs);
    match bytchk {
        0x00 => {
            let total = n.bytes(bs);
            let mut buf = vec![0u8; usize::try_from(total.min(IO_CHUNK)).unwrap_or(0)];
            let mut done = 0u64;
            while done < total {
                let step = (total - done).min(IO_CHUNK);
                let part = buf
                    .get_mut(..usize::try_from(step).unwrap_or(0))
                    .unwrap_or_default();
                lu.read_at(offset + done, part)
                    .map_err(Sense::read_failed)?;
                done += step;
            }
            Ok(())
        }
        0x01 => {
            let len = transfer_len(n, bs, MAX_TRANSFER_BYTES)?;
            let expect = data_out.get(..len).ok_or(Sense::INVALID_FIELD_IN_CDB)?;
            compare_medium(lu, offset, expect)
        }
        _ => {
            let block = data_out
                .get(..bs as usize)
                .ok_or(Sense::INVALID_FIELD_IN_CDB)?;
            let total = n.bytes(bs);
            let per_step = (IO_CHUNK / u64::from(bs)).max(1);
            let mut buf = Vec::new();
            let mut done = 0u64;
            while done < total {
                let blocks = ((total - done) / u64::from(bs)).min(per_step);
                buf.resize(usize::try_from(Blocks(blocks).bytes(bs)).unwrap_or(0), 0);
                lu.read_at(offset + done, &mut buf)
                    .map_err(Sense::read_failed)?;
                for (i, got) in buf.chunks(bs as usize).enumerate() {
                    if let Some(k) = got.iter().zip(block).position(|(a, b)| a != b) {
                        let at = done + (i as u64) * u64::from(bs) + k as u64;
                        return Err(Sense::miscompare(at));
                    }
                }
                done += Blocks(blocks).bytes(bs);
            }
            Ok(())
        }
    }
}

/// WRITE AND VERIFY(10/12/16) (SBC-3 §5.38-5.40): the data is written
/// through to stable storage; with BYTCHK 01b it is read back and compared.
pub(crate) fn write_and_verify(
    lu: &dyn Backstore,
    mode: ModeParams,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<(), Sense> {
    let b1 = cdb::byte(cdb, 1)?;
    // WRPROTECT must be 0; bit 0 and bit 3 are reserved; BYTCHK 1xb is
    // not supported.
    if b1 & 0xE9 != 0 || b1 & 0x04 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let bytchk = b1 & 0x02 != 0;
    let (lba, n) = cdb::verify_lba_and_len(cdb)?;
    check_range(lba, n, Blocks(lu.block_count()))?;
    let bs = lu.block_size();
    let len = transfer_len(n, bs, MAX_TRANSFER_BYTES)?;
    if len == 0 {
        return Ok(());
    }
    let src = data_out.get(..len).ok_or(Sense::INVALID_FIELD_IN_CDB)?;
    check_writable(mode)?;
    let offset = lba.byte_offset(bs);
    write_data(lu, mode, offset, src, true)?;
    if bytchk {
        compare_medium(lu, offset, src)?;
    }
    Ok(())
}

/// START STOP UNIT (SBC-3 §5.25): stopping (START 0) without NO_FLUSH
/// first synchronizes the cache. Says whether LOEJ asks to load or eject
/// the medium (POWER CONDITION 0 only: any other ignores LOEJ and START),
/// which the caller does for a removable LU and ignores for a fixed one.
pub(crate) fn start_stop_unit(lu: &dyn Backstore, cdb: &[u8]) -> Result<Option<LoadEject>, Sense> {
    let b1 = cdb::byte(cdb, 1)?;
    let b3 = cdb::byte(cdb, 3)?;
    let b4 = cdb::byte(cdb, 4)?;
    if b1 & 0xFE != 0 || b3 & 0xF0 != 0 || b4 & 0x08 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    // POWER CONDITION: every value is accepted and none changes anything
    // (there is no power to manage); a value other than 0 makes LOEJ and
    // START ignored. libiscsi's StartStopUnit.PwrCnd expects GOOD for all
    // fifteen, and that the medium stays.
    let start = b4 & 0x01 != 0;
    let loej = b4 & 0x02 != 0;
    let no_flush = b4 & 0x04 != 0;
    if !start && !no_flush {
        lu.flush().map_err(Sense::write_failed)?;
    }
    Ok(match (b4 >> 4, loej, start) {
        (0, true, false) => Some(LoadEject::Eject),
        (0, true, true) => Some(LoadEject::Load),
        _ => None,
    })
}

/// PREVENT ALLOW MEDIUM REMOVAL (SBC-3 §5.11): says whether the PREVENT
/// field asks to prevent removal (01b; the obsolete 1xb values count as
/// their low bit). Only a removable LU keeps it.
pub(crate) fn prevent_allow(cdb: &[u8]) -> Result<bool, Sense> {
    let b4 = cdb::byte(cdb, 4)?;
    if b4 & 0xFC != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    Ok(b4 & 0x01 != 0)
}

/// PRE-FETCH(10/16) (SBC-3 5.9, 5.10): the range is checked; the data is
/// already as close to the initiator as this device can bring it (RAM,
/// or the host's page cache), so the command completes with GOOD.
pub fn pre_fetch(lu: &dyn Backstore, cdb: &[u8]) -> Result<(), Sense> {
    let sixteen = cdb.first() == Some(&opcode::PRE_FETCH_16);
    // Byte 1: IMMED (bit 1); everything else reserved.
    if cdb::byte(cdb, 1)? & !0x02 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let (lba, n) = if sixteen {
        (cdb::be64(cdb, 2)?, u64::from(cdb::be32(cdb, 10)?))
    } else {
        (u64::from(cdb::be32(cdb, 2)?), u64::from(cdb::be16(cdb, 7)?))
    };
    check_range(Lba(lba), Blocks(n), capacity(lu))
}

/// ORWRITE(16) (SBC-3 5.11): each byte of the Data-Out is ORed into the
/// medium. The caller holds the LU's exclusive write lock, so the read,
/// the OR and the write are atomic against other writes.
pub(crate) fn orwrite(
    lu: &dyn Backstore,
    mode: ModeParams,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<(), Sense> {
    let b1 = cdb::byte(cdb, 1)?;
    // ORPROTECT (7-5) must be zero (no protection information); bit 2 and
    // bit 0 are reserved; DPO (4) and FUA (3) are honoured.
    if b1 & 0xE5 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let fua = b1 & 0x08 != 0;
    let lba = Lba(cdb::be64(cdb, 2)?);
    let blocks = Blocks(u64::from(cdb::be32(cdb, 10)?));
    check_range(lba, blocks, capacity(lu))?;
    let bs = lu.block_size();
    let len = transfer_len(blocks, bs, MAX_TRANSFER_BYTES)?;
    if len == 0 {
        return Ok(());
    }
    check_writable(mode)?;
    let data = data_out.get(..len).ok_or(Sense::INVALID_FIELD_IN_CDB)?;
    let offset = lba.byte_offset(bs);
    let step = usize::try_from(IO_CHUNK).unwrap_or(1 << 20);
    let mut medium = vec![0u8; step.min(len)];
    for (i, chunk) in data.chunks(step).enumerate() {
        let at = offset + (i * step) as u64;
        let old = &mut medium[..chunk.len()];
        lu.read_at(at, old).map_err(Sense::read_failed)?;
        for (m, d) in old.iter_mut().zip(chunk) {
            *m |= d;
        }
        write_data(lu, mode, at, old, fua)?;
    }
    Ok(())
}

/// READ DEFECT DATA(10/12) (SBC-3 5.12, 5.13): a device with no defects
/// returns the header alone, with the list format and the PLISTV/GLISTV
/// bits echoing the request and a DEFECT LIST LENGTH of zero.
pub fn read_defect_data(cdb: &[u8], data_in: &mut Vec<u8>) -> Result<(), Sense> {
    if cdb.first() == Some(&opcode::READ_DEFECT_DATA_12) {
        let request = cdb::byte(cdb, 1)? & 0x1F;
        let alloc = cdb::be32(cdb, 6)? as usize;
        // Byte 1: PLISTV, GLISTV, format; bytes 2-3 generation; 4-7 length.
        let header = [0, request, 0, 0, 0, 0, 0, 0];
        data_in.extend_from_slice(&header[..alloc.min(header.len())]);
    } else {
        let request = cdb::byte(cdb, 2)? & 0x1F;
        let alloc = usize::from(cdb::be16(cdb, 7)?);
        let header = [0, request, 0, 0];
        data_in.extend_from_slice(&header[..alloc.min(header.len())]);
    }
    Ok(())
}
