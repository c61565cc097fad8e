//! A LUN used the way an operating system uses a disk: byte-addressed reads
//! and writes, flush, discard and write-zeroes, with the limits a block
//! layer needs (block sizes, maximum transfer, discard granularity, write
//! cache) and each failure as the errno a program expects.
//!
//! This is what `iscsi mount` (a FUSE file per LUN) and `iscsi attach` (a
//! ublk block device) have in common, and what `iscsi read`/`write`/`copy`
//! use for their LUN ends: one place that knows how a request that is not
//! a whole number of blocks, or is larger than the target takes in one
//! command, becomes SCSI commands.
//!
//! Writes that do not cover whole blocks are read-modify-write of the edge
//! blocks. Two of them on the same block, or one and a whole-block write,
//! would lose one of the writes if they interleaved, so partial writes run
//! alone (an exclusive lock) and whole-block writes run together (shared).
//! Reads take no lock: like a disk, a read concurrent with a write of the
//! same bytes may see either.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::RwLock;

use crate::command::{Command, Sense};
use crate::error::Error;
use crate::multipath::Multipath;
use crate::multipath::alua::Resend;
use crate::scsi::Capacity;
use crate::session::Session;

/// Bytes per command when the target states no MAXIMUM TRANSFER LENGTH.
const DEFAULT_MAX_TRANSFER: u32 = 1 << 20;
/// The most bytes per command we send even when the target takes more:
/// larger commands only hold more memory per request.
const MAX_TRANSFER_CAP: u32 = 8 << 20;
/// Blocks per WRITE SAME when the target states no MAXIMUM WRITE SAME
/// LENGTH.
const DEFAULT_WRITE_SAME_BLOCKS: u64 = 1 << 16;
/// Blocks per UNMAP descriptor when the target states no MAXIMUM UNMAP LBA
/// COUNT (it offered UNMAP, so it takes some).
const DEFAULT_UNMAP_BLOCKS: u32 = 1 << 16;

/// What a block layer needs to know about a LUN, from READ CAPACITY (16),
/// the Block Limits (B0h) and Logical Block Provisioning (B2h) VPD pages
/// and the Caching mode page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskLimits {
    /// Bytes per logical block.
    pub block_size: u32,
    /// Bytes per physical block (a multiple of the logical block size).
    pub physical_block_size: u32,
    /// Number of logical blocks.
    pub blocks: u64,
    /// Bytes per READ or WRITE: whole blocks, at least one.
    pub max_transfer: u32,
    /// The OPTIMAL TRANSFER LENGTH in bytes, when the target states one.
    pub optimal_transfer: Option<u32>,
    /// UNMAP, when the LUN is thin provisioned and offers it.
    pub discard: Option<DiscardLimits>,
    /// Blocks per WRITE SAME.
    pub write_same_blocks: u64,
    /// The LUN has a volatile write cache (WCE): a flush is needed for
    /// durability.
    pub write_cache: bool,
    /// The LUN is write protected (the WP bit of MODE SENSE).
    pub read_only: bool,
    /// Unmapped blocks read as zeros (LBPRZ), so an UNMAP zeroes.
    pub unmapped_read_zeros: bool,
}

/// The LUN's UNMAP limits (SBC-4 6.6.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscardLimits {
    /// Blocks per UNMAP command (MAXIMUM UNMAP LBA COUNT).
    pub max_blocks: u32,
    /// Descriptors per UNMAP command (MAXIMUM UNMAP BLOCK DESCRIPTOR
    /// COUNT).
    pub max_descriptors: u32,
    /// OPTIMAL UNMAP GRANULARITY in blocks (1 when not stated).
    pub granularity: u32,
    /// UNMAP GRANULARITY ALIGNMENT in blocks (0 when not stated).
    pub alignment: u32,
}

impl DiskLimits {
    /// The limits from READ CAPACITY and the pages as the target returned
    /// them (`None`: the target does not have that page). Values a target
    /// gets wrong (a maximum transfer under one block, a physical block
    /// exponent past 2^16) are clamped, not trusted.
    pub fn from_pages(
        capacity: &Capacity,
        block_limits: Option<&[u8]>,
        provisioning: Option<&[u8]>,
        caching_mode: Option<&[u8]>,
    ) -> DiskLimits {
        let bs = capacity.block_size.max(1);
        let field32 = |page: Option<&[u8]>, at: usize| {
            page.and_then(|p| p.get(at..at + 4))
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .unwrap_or(0)
        };
        let max_blocks = field32(block_limits, 8);
        let max_transfer = match u64::from(max_blocks) * u64::from(bs) {
            0 => DEFAULT_MAX_TRANSFER,
            bytes => bytes.min(u64::from(MAX_TRANSFER_CAP)) as u32,
        };
        let max_transfer = (max_transfer / bs).max(1) * bs;
        let optimal = u64::from(field32(block_limits, 12)) * u64::from(bs);
        let optimal_transfer = (optimal > 0).then(|| optimal.min(u64::from(u32::MAX)) as u32);
        let lbpu = provisioning
            .and_then(|p| p.get(5))
            .is_some_and(|b| b & 0x80 != 0);
        let discard = (capacity.thin_provisioned && lbpu).then(|| {
            let alignment = field32(block_limits, 32);
            DiscardLimits {
                max_blocks: match field32(block_limits, 20) {
                    0 => DEFAULT_UNMAP_BLOCKS,
                    n => n,
                },
                max_descriptors: field32(block_limits, 24).clamp(1, 256),
                granularity: field32(block_limits, 28).max(1),
                alignment: if alignment & 0x8000_0000 != 0 {
                    alignment & 0x7fff_ffff
                } else {
                    0
                },
            }
        });
        let write_same = block_limits
            .and_then(|p| p.get(36..44))
            .map(|b| u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .unwrap_or(0);
        let (write_cache, read_only) = caching_mode.map_or((false, false), parse_caching_mode);
        let exponent = u32::from(capacity.physical_block_exponent).min(16);
        DiskLimits {
            block_size: bs,
            physical_block_size: bs.saturating_mul(1 << exponent),
            blocks: capacity.blocks,
            max_transfer,
            optimal_transfer,
            discard,
            write_same_blocks: match write_same {
                0 => DEFAULT_WRITE_SAME_BLOCKS,
                n => n.min(u64::from(u32::MAX)),
            },
            write_cache,
            read_only,
            unmapped_read_zeros: capacity.unmapped_read_zeros,
        }
    }

    /// The LUN's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// (WCE, WP) from MODE SENSE (10) data for the Caching page (08h): the
/// WP bit of the header's DEVICE-SPECIFIC PARAMETER (SBC-4 6.5.1) and the
/// WCE bit of the page (SBC-4 6.5.5).
fn parse_caching_mode(data: &[u8]) -> (bool, bool) {
    let read_only = data.get(3).is_some_and(|b| b & 0x80 != 0);
    let descriptors = data
        .get(6..8)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    let page = data.get(8 + descriptors..).unwrap_or_default();
    let write_cache = page.first().is_some_and(|code| code & 0x3f == 0x08)
        && page.get(2).is_some_and(|b| b & 0x04 != 0);
    (write_cache, read_only)
}

/// A LUN of a logged-in session, or of a multipath set, addressed in
/// bytes.
pub struct Disk {
    paths: Arc<Multipath>,
    limits: DiskLimits,
    /// Partial-block writes hold it exclusively, whole-block writes shared
    /// (see the module doc).
    writes: RwLock<()>,
    /// WRITE SAME was refused as an unsupported command: zeroes go as
    /// data.
    no_write_same: AtomicBool,
}

impl Disk {
    /// Opens LUN `lun` of `session`: reads its capacity, limits and cache
    /// mode. A target without a page gets the defaults the page would
    /// have meant.
    pub async fn open(session: Arc<Session>, lun: u64) -> Result<Disk, Error> {
        Disk::over(Arc::new(Multipath::single(session, lun))).await
    }

    /// Opens the LU a multipath set reaches, as [`Disk::open`] does: every
    /// command goes through [`Multipath::run`], so it moves to another
    /// path when its own fails or refuses it by its access state.
    pub async fn over(paths: Arc<Multipath>) -> Result<Disk, Error> {
        let capacity = paths
            .run(Resend::Idempotent, |s, lun| async move {
                s.read_capacity(lun).await
            })
            .await?;
        if capacity.block_size == 0 || capacity.block_size > 1 << 20 {
            return Err(Error::Protocol(format!(
                "READ CAPACITY gave a block size of {} bytes",
                capacity.block_size
            )));
        }
        let vpd = async |page| {
            paths
                .run(Resend::Idempotent, move |s, lun| async move {
                    s.inquiry_vpd(lun, page).await
                })
                .await
                .ok()
        };
        let block_limits = vpd(0xB0).await;
        let provisioning = vpd(0xB2).await;
        let caching = paths
            .run(Resend::Idempotent, |s, lun| async move {
                caching_mode_page(&s, lun).await
            })
            .await
            .ok();
        let limits = DiskLimits::from_pages(
            &capacity,
            block_limits.as_deref(),
            provisioning.as_deref(),
            caching.as_deref(),
        );
        Ok(Disk {
            paths,
            limits,
            writes: RwLock::new(()),
            no_write_same: AtomicBool::new(false),
        })
    }

    /// The LUN's limits.
    pub fn limits(&self) -> &DiskLimits {
        &self.limits
    }

    /// The LUN number (through the first path).
    pub fn lun(&self) -> u64 {
        self.paths.lun()
    }

    /// The paths the LU is reached through (one for [`Disk::open`]).
    pub fn paths(&self) -> &Arc<Multipath> {
        &self.paths
    }

    fn check_range(&self, offset: u64, length: u64) -> Result<(), Error> {
        match offset.checked_add(length) {
            Some(end) if end <= self.limits.bytes() => Ok(()),
            _ => Err(Error::InvalidCommand("beyond the end of the LUN")),
        }
    }

    /// Reads `length` bytes at byte `offset` (any alignment), in commands
    /// of at most the maximum transfer.
    pub async fn read(&self, offset: u64, length: usize) -> Result<Vec<u8>, Error> {
        self.read_with(offset, length, Vec::new()).await
    }

    /// [`Disk::read`] into `buffer` where it can (a range of whole blocks
    /// in one command: the buffer is handed to the session and comes back
    /// holding the data), so that a caller that keeps its buffers (a ublk
    /// queue, one per tag) neither allocates nor zeroes one per read.
    pub async fn read_with(
        &self,
        offset: u64,
        length: usize,
        buffer: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        self.check_range(offset, length as u64)?;
        let bs = u64::from(self.limits.block_size);
        let first = offset / bs;
        let end = (offset + length as u64).div_ceil(bs);
        let mut data = self.read_blocks(first, end - first, buffer).await?;
        let skip = (offset - first * bs) as usize;
        if skip > 0 {
            data.drain(..skip);
        }
        data.truncate(length);
        Ok(data)
    }

    /// Reads `blocks` blocks at `lba`, into `buffer` when one command
    /// does (its length is set; only bytes it never had are zeroed).
    async fn read_blocks(
        &self,
        lba: u64,
        blocks: u64,
        mut buffer: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let bs = self.limits.block_size;
        if blocks <= self.per_command() {
            // One command: its buffer is the answer, with no copy into a
            // second one (every 4 KiB read of `iscsi attach` comes here).
            buffer.resize((blocks * u64::from(bs)) as usize, 0);
            // The caller's buffer goes with the first try; a try on
            // another path gets a new one (a failed read keeps none).
            let first = std::sync::Mutex::new(Some(buffer));
            let length = buffer_length(bs, blocks);
            return self
                .paths
                .run(Resend::Idempotent, |s, lun| {
                    let buffer = first
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take()
                        .unwrap_or_else(|| vec![0; length]);
                    async move { s.read(lun, lba, bs, buffer).await }
                })
                .await;
        }
        Box::pin(self.read_pieces(lba, blocks)).await
    }

    /// [`Disk::read_blocks`] of more than one command's worth, in commands
    /// of the maximum transfer. Boxed by its caller (see
    /// [`Disk::write_unaligned`]).
    async fn read_pieces(&self, lba: u64, blocks: u64) -> Result<Vec<u8>, Error> {
        let bs = self.limits.block_size;
        let mut out = Vec::with_capacity((blocks * u64::from(bs)) as usize);
        for (at, count) in pieces(lba, blocks, self.per_command()) {
            let length = buffer_length(bs, count);
            let data = self
                .paths
                .run(Resend::Idempotent, |s, lun| async move {
                    s.read(lun, at, bs, vec![0; length]).await
                })
                .await?;
            out.extend_from_slice(&data);
        }
        Ok(out)
    }

    /// Blocks per READ or WRITE.
    fn per_command(&self) -> u64 {
        u64::from(self.limits.max_transfer / self.limits.block_size)
    }

    /// Writes `data` at byte `offset` (any alignment: the partial blocks at
    /// either end are read, patched and written back). With `fua`, each
    /// command carries FUA: acknowledged means on stable storage.
    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Error> {
        self.check_range(offset, data.len() as u64)?;
        let bs = u64::from(self.limits.block_size);
        if offset.is_multiple_of(bs) && (data.len() as u64).is_multiple_of(bs) {
            let _shared = self.writes.read().await;
            return self.write_blocks(offset / bs, data, fua).await;
        }
        Box::pin(self.write_unaligned(offset, data, fua)).await
    }

    /// [`Disk::write`] of a range that does not start and end on block
    /// boundaries: the edge blocks are read, patched and written back, with
    /// every other write held off meanwhile. Boxed by its caller: a path
    /// aligned writes never take should not size every write's future.
    async fn write_unaligned(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Error> {
        let bs = u64::from(self.limits.block_size);
        let _alone = self.writes.write().await;
        let first = offset / bs;
        let end = (offset + data.len() as u64).div_ceil(bs);
        let skip = (offset - first * bs) as usize;
        // Only the two edge blocks need their old contents.
        let mut blocks = vec![0u8; ((end - first) * bs) as usize];
        let head = self.read_blocks(first, 1, Vec::new()).await?;
        blocks[..bs as usize].copy_from_slice(&head);
        if end - first > 1 && !(offset + data.len() as u64).is_multiple_of(bs) {
            let tail = self.read_blocks(end - 1, 1, Vec::new()).await?;
            let at = blocks.len() - bs as usize;
            blocks[at..].copy_from_slice(&tail);
        }
        blocks[skip..skip + data.len()].copy_from_slice(data);
        self.write_blocks(first, &blocks, fua).await
    }

    async fn write_blocks(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), Error> {
        let bs = self.limits.block_size;
        let mut from = 0usize;
        for (at, count) in pieces(lba, data.len() as u64 / u64::from(bs), self.per_command()) {
            let to = from + (count * u64::from(bs)) as usize;
            let piece = &data[from..to];
            self.paths
                .run(Resend::Idempotent, |s, lun| async move {
                    match fua {
                        true => s.write_fua(lun, at, bs, piece).await,
                        false => s.write(lun, at, bs, piece).await,
                    }
                })
                .await?;
            from = to;
        }
        Ok(())
    }

    /// SYNCHRONIZE CACHE of the whole LUN: every write acknowledged before
    /// is on stable storage once this returns.
    pub async fn flush(&self) -> Result<(), Error> {
        self.paths
            .run(Resend::Idempotent, |s, lun| async move {
                s.synchronize_cache(lun).await
            })
            .await
    }

    /// UNMAPs the whole blocks inside `offset..offset + length`: the
    /// storage may be released, and what they read afterwards is zeros only
    /// if [`DiskLimits::unmapped_read_zeros`]. Partial blocks at the edges
    /// are left as they are. Fails with [`Error::InvalidCommand`] when the
    /// LUN does not offer UNMAP.
    pub async fn discard(&self, offset: u64, length: u64) -> Result<(), Error> {
        self.check_range(offset, length)?;
        let limits = self
            .limits
            .discard
            .ok_or(Error::InvalidCommand("the LUN does not offer UNMAP"))?;
        let bs = u64::from(self.limits.block_size);
        let first = offset.div_ceil(bs);
        let end = (offset + length) / bs;
        if end <= first {
            return Ok(());
        }
        let _shared = self.writes.read().await;
        self.unmap_blocks(&limits, first, end - first).await
    }

    async fn unmap_blocks(
        &self,
        limits: &DiscardLimits,
        lba: u64,
        blocks: u64,
    ) -> Result<(), Error> {
        let ranges: Vec<(u64, u32)> = pieces(lba, blocks, u64::from(limits.max_blocks))
            .map(|(at, count)| (at, count as u32))
            .collect();
        // One command carries at most MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT
        // descriptors, and at most MAXIMUM UNMAP LBA COUNT blocks in all.
        let per_command = (limits.max_descriptors as usize).max(1);
        let mut start = 0;
        while start < ranges.len() {
            let mut end = start;
            let mut total = 0u64;
            while end < ranges.len()
                && end - start < per_command
                && total + u64::from(ranges[end].1) <= u64::from(limits.max_blocks)
            {
                total += u64::from(ranges[end].1);
                end += 1;
            }
            let batch = &ranges[start..end];
            self.paths
                .run(Resend::Idempotent, |s, lun| async move {
                    s.unmap(lun, batch).await
                })
                .await?;
            start = end;
        }
        Ok(())
    }

    /// Makes `offset..offset + length` read as zeros. With `may_unmap`,
    /// whole blocks may be UNMAPped where that reads back as zeros
    /// (hole punching); otherwise, and for the partial blocks at the edges,
    /// zeros are written (WRITE SAME, or plain writes where the target
    /// does not have it).
    pub async fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_unmap: bool,
    ) -> Result<(), Error> {
        self.check_range(offset, length)?;
        if length == 0 {
            return Ok(());
        }
        let bs = u64::from(self.limits.block_size);
        let first = offset.div_ceil(bs);
        let end = (offset + length) / bs;
        if end <= first {
            let zeros = vec![0u8; length as usize];
            return self.write(offset, &zeros, false).await;
        }
        let head = first * bs - offset;
        if head > 0 {
            self.write(offset, &vec![0u8; head as usize], false).await?;
        }
        let tail = offset + length - end * bs;
        if tail > 0 {
            self.write(end * bs, &vec![0u8; tail as usize], false)
                .await?;
        }
        let _shared = self.writes.read().await;
        let blocks = end - first;
        match self.limits.discard {
            Some(limits) if may_unmap && self.limits.unmapped_read_zeros => {
                self.unmap_blocks(&limits, first, blocks).await
            }
            _ => self.zero_blocks(first, blocks).await,
        }
    }

    async fn zero_blocks(&self, lba: u64, blocks: u64) -> Result<(), Error> {
        if !self.no_write_same.load(Ordering::Relaxed) {
            match self.write_same_zeros(lba, blocks).await {
                Err(Error::Status {
                    sense:
                        Some(Sense {
                            key: 0x05,
                            asc: 0x20,
                            ..
                        }),
                    ..
                }) => self.no_write_same.store(true, Ordering::Relaxed),
                done => return done,
            }
        }
        let zeros = vec![0u8; self.limits.max_transfer as usize];
        let bs = u64::from(self.limits.block_size);
        for (at, count) in pieces(lba, blocks, self.per_command()) {
            self.write_blocks(at, &zeros[..(count * bs) as usize], false)
                .await?;
        }
        Ok(())
    }

    /// WRITE SAME (16) of a zero block (SBC-4 5.50), in commands of at
    /// most MAXIMUM WRITE SAME LENGTH blocks.
    async fn write_same_zeros(&self, lba: u64, blocks: u64) -> Result<(), Error> {
        let zero = &vec![0u8; self.limits.block_size as usize][..];
        let per_command = self.limits.write_same_blocks.min(u64::from(u32::MAX));
        for (at, count) in pieces(lba, blocks, per_command) {
            let mut cdb = [0u8; 16];
            cdb[0] = 0x93;
            cdb[2..10].copy_from_slice(&at.to_be_bytes());
            cdb[10..14].copy_from_slice(&(count as u32).to_be_bytes());
            self.paths
                .run(Resend::Idempotent, |s, lun| async move {
                    s.run_checked(|_| Command::write(lun, &cdb, zero), Vec::new())
                        .await
                })
                .await?;
        }
        Ok(())
    }
}

/// MODE SENSE (10) of the Caching page (08h), current values, no block
/// descriptors.
async fn caching_mode_page(session: &Session, lun: u64) -> Result<Vec<u8>, Error> {
    const LENGTH: u16 = 64;
    let [hi, lo] = LENGTH.to_be_bytes();
    let cdb = [0x5a, 0x08, 0x08, 0, 0, 0, 0, hi, lo, 0];
    let response = session
        .run_checked(|b| Command::read(lun, &cdb, b), vec![0; LENGTH as usize])
        .await?;
    let mut data = response.data;
    data.truncate(response.received as usize);
    Ok(data)
}

/// Bytes of `blocks` blocks of `block_size` (a command's, so it fits).
fn buffer_length(block_size: u32, blocks: u64) -> usize {
    (blocks * u64::from(block_size)) as usize
}

/// `(lba, blocks)` pieces of at most `per_piece` blocks covering `blocks`
/// blocks from `lba`.
fn pieces(lba: u64, blocks: u64, per_piece: u64) -> impl Iterator<Item = (u64, u64)> {
    let per_piece = per_piece.max(1);
    (0..blocks.div_ceil(per_piece)).map(move |i| {
        let at = i * per_piece;
        (lba + at, per_piece.min(blocks - at))
    })
}

/// The errno a program expects for `error`, as Linux's block layer and
/// SCSI disk driver would give it: ENODATA for a medium error, ENOSPC when
/// a thin LUN is out of space, EROFS when it is write protected, EBADE for
/// a reservation conflict, EOPNOTSUPP for a command the LUN does not have,
/// ETIMEDOUT when the target did not answer in time, EINVAL for a request
/// we refused to send, and EIO for every other failure (a lost
/// connection, a target that failed the command).
pub fn errno(error: &Error) -> i32 {
    const SENSE_MEDIUM_ERROR: u8 = 0x03;
    const SENSE_ILLEGAL_REQUEST: u8 = 0x05;
    const SENSE_DATA_PROTECT: u8 = 0x07;
    const STATUS_RESERVATION_CONFLICT: u8 = 0x18;
    match error {
        Error::Status { status, .. } if *status == STATUS_RESERVATION_CONFLICT => libc::EBADE,
        Error::Status {
            sense: Some(sense), ..
        } => match (sense.key, sense.asc, sense.ascq) {
            (SENSE_MEDIUM_ERROR, _, _) => libc::ENODATA,
            // SPACE ALLOCATION FAILED WRITE PROTECT (27h/07h).
            (SENSE_DATA_PROTECT, 0x27, 0x07) => libc::ENOSPC,
            (SENSE_DATA_PROTECT, _, _) => libc::EROFS,
            // INVALID COMMAND OPERATION CODE (20h/00h).
            (SENSE_ILLEGAL_REQUEST, 0x20, _) => libc::EOPNOTSUPP,
            // LOGICAL BLOCK ADDRESS OUT OF RANGE (21h/00h).
            (SENSE_ILLEGAL_REQUEST, 0x21, _) => libc::EINVAL,
            _ => libc::EIO,
        },
        Error::Timeout { .. } => libc::ETIMEDOUT,
        Error::InvalidCommand(_) => libc::EINVAL,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(thin: bool, zeros: bool, exponent: u8) -> Capacity {
        Capacity {
            blocks: 1 << 20,
            block_size: 512,
            thin_provisioned: thin,
            unmapped_read_zeros: zeros,
            physical_block_exponent: exponent,
        }
    }

    fn block_limits(max_transfer: u32, unmap_blocks: u32, descriptors: u32) -> Vec<u8> {
        let mut page = vec![0u8; 64];
        page[1] = 0xb0;
        page[3] = 0x3c;
        page[8..12].copy_from_slice(&max_transfer.to_be_bytes());
        page[12..16].copy_from_slice(&8u32.to_be_bytes());
        page[20..24].copy_from_slice(&unmap_blocks.to_be_bytes());
        page[24..28].copy_from_slice(&descriptors.to_be_bytes());
        page[28..32].copy_from_slice(&8u32.to_be_bytes());
        page[32..36].copy_from_slice(&(0x8000_0000u32 | 2).to_be_bytes());
        page[36..44].copy_from_slice(&4096u64.to_be_bytes());
        page
    }

    #[test]
    fn limits_come_from_the_pages() {
        let provisioning = [0, 0xb2, 0, 4, 0, 0x80, 0, 0];
        let caching = [0, 0x1a, 0, 0x80, 0, 0, 0, 0, 0x08, 0x12, 0x04, 0];
        let limits = DiskLimits::from_pages(
            &capacity(true, true, 3),
            Some(&block_limits(2048, 1 << 20, 16)),
            Some(&provisioning),
            Some(&caching),
        );
        assert_eq!(limits.physical_block_size, 4096);
        assert_eq!(limits.max_transfer, 1 << 20);
        assert_eq!(limits.optimal_transfer, Some(4096));
        assert_eq!(
            limits.discard,
            Some(DiscardLimits {
                max_blocks: 1 << 20,
                max_descriptors: 16,
                granularity: 8,
                alignment: 2,
            })
        );
        assert_eq!(limits.write_same_blocks, 4096);
        assert!(limits.write_cache && limits.read_only && limits.unmapped_read_zeros);
    }

    #[test]
    fn missing_pages_mean_defaults() {
        let limits = DiskLimits::from_pages(&capacity(true, false, 0), None, None, None);
        assert_eq!(limits.max_transfer, DEFAULT_MAX_TRANSFER);
        assert_eq!(limits.physical_block_size, 512);
        // Thin, but without the B2 page's LBPU bit: no UNMAP.
        assert_eq!(limits.discard, None);
        assert!(!limits.write_cache && !limits.read_only);
    }

    #[test]
    fn odd_values_are_clamped() {
        // A transfer limit past the cap, and an exponent past 2^16.
        let limits = DiskLimits::from_pages(
            &capacity(false, false, 15),
            Some(&block_limits(u32::MAX, 0, 0)),
            None,
            None,
        );
        assert_eq!(limits.max_transfer, MAX_TRANSFER_CAP);
        assert_eq!(limits.physical_block_size, 512 << 15);
        // A short page is read as far as it goes.
        let limits = DiskLimits::from_pages(
            &capacity(false, false, 0),
            Some(&[0, 0xb0, 0, 4]),
            None,
            None,
        );
        assert_eq!(limits.max_transfer, DEFAULT_MAX_TRANSFER);
        // A caching page after block descriptors.
        let mut mode = vec![0u8; 8 + 8 + 20];
        mode[7] = 8;
        mode[16] = 0x08;
        mode[18] = 0x04;
        assert_eq!(parse_caching_mode(&mode), (true, false));
        assert_eq!(parse_caching_mode(&[0, 1]), (false, false));
    }

    #[test]
    fn pieces_cover_the_range() {
        let all: Vec<_> = pieces(10, 25, 10).collect();
        assert_eq!(all, [(10, 10), (20, 10), (30, 5)]);
        assert_eq!(pieces(0, 0, 8).count(), 0);
        assert_eq!(
            pieces(5, 3, 0).collect::<Vec<_>>(),
            [(5, 1), (6, 1), (7, 1)]
        );
    }

    #[test]
    fn errors_become_the_errno_linux_gives() {
        let check = |key, asc, ascq| Error::Status {
            status: 0x02,
            sense: Sense::parse(&[0x72, key, asc, ascq, 0, 0, 0, 0]),
        };
        assert_eq!(errno(&check(0x03, 0x11, 0)), libc::ENODATA);
        assert_eq!(errno(&check(0x07, 0x27, 0x07)), libc::ENOSPC);
        assert_eq!(errno(&check(0x07, 0x27, 0x00)), libc::EROFS);
        assert_eq!(errno(&check(0x05, 0x20, 0)), libc::EOPNOTSUPP);
        assert_eq!(errno(&check(0x05, 0x21, 0)), libc::EINVAL);
        assert_eq!(errno(&check(0x04, 0x44, 0)), libc::EIO);
        let conflict = Error::Status {
            status: 0x18,
            sense: None,
        };
        assert_eq!(errno(&conflict), libc::EBADE);
        assert_eq!(errno(&Error::ConnectionLost), libc::EIO);
        assert_eq!(
            errno(&Error::Timeout {
                timeout: std::time::Duration::from_secs(1),
                waiting_for: "a status"
            }),
            libc::ETIMEDOUT
        );
    }
}
