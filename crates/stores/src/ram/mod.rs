//! The sparse in-memory [`RamBackstore`].

mod chunk;
#[cfg(test)]
mod resize_tests;
mod snapshots;
mod table;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLockWriteGuard};

use bytes::Bytes;
use iscsi_crc32c::KnownCrc32c;

pub use chunk::RAM_CHUNK_SIZE;
use chunk::{Chunk, ChunkData};
use iscsi_scsi::backstore::{Allocation, Backstore, Lent, ResizeError, check_size};
use table::{ChunkTable, Locked};

/// Why a [`RamBackstore`] could not be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RamBackstoreError {
    /// The block size is neither 512 nor 4096.
    UnsupportedBlockSize(u32),
    /// The size is zero or not a multiple of the block size.
    InvalidSize {
        /// The requested size in bytes.
        size: u64,
        /// The requested block size.
        block_size: u32,
    },
}

impl fmt::Display for RamBackstoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnsupportedBlockSize(bs) => {
                write!(f, "unsupported block size {bs} (expected 512 or 4096)")
            }
            Self::InvalidSize { size, block_size } => write!(
                f,
                "size {size} is zero or not a multiple of the block size {block_size}"
            ),
        }
    }
}

impl std::error::Error for RamBackstoreError {}

const CHUNK: u64 = RAM_CHUNK_SIZE as u64;

/// A sparse in-memory backstore: 64 KiB chunks allocated on first non-zero
/// write, unwritten blocks read as zeros, UNMAP frees whole chunks.
///
/// Reads can borrow the chunks themselves ([`Backstore::lend`]): a chunk is
/// shared (`Arc`) with every read that lent it, and a write to a chunk that
/// is still lent copies it first (copy-on-write), so lent bytes never
/// change: a read sent from them shows the data as of the moment it ran.
#[derive(Debug)]
pub struct RamBackstore {
    /// Bytes; changed only by [`Backstore::resize`] (a load per command,
    /// no write).
    size: AtomicU64,
    block_size: u32,
    unique_id: u64,
    chunks: ChunkTable,
    /// One resize or snapshot at a time.
    resizing: Mutex<()>,
    /// A snapshot served read-only: every write fails.
    frozen: bool,
    /// The store's snapshots, by name ([`snapshots`]).
    snapshots: Mutex<std::collections::BTreeMap<String, snapshots::RamSnapshot>>,
}

/// A lent chunk as the owner of `Bytes` (no copy).
struct LentChunk(Chunk);

impl AsRef<[u8]> for LentChunk {
    fn as_ref(&self) -> &[u8] {
        &self.0.bytes
    }
}

/// What an unallocated chunk lends: zeros, never written.
static ZERO_CHUNK: [u8; RAM_CHUNK_SIZE] = [0; RAM_CHUNK_SIZE];

/// The CRC32C of [`ZERO_CHUNK`], for whole unallocated chunks lent.
#[derive(Debug)]
struct ZeroChunkCrc;

impl KnownCrc32c for ZeroChunkCrc {
    fn crc32c(&self) -> u32 {
        static CRC: LazyLock<u32> = LazyLock::new(|| iscsi_crc32c::crc32c(&ZERO_CHUNK));
        *CRC
    }
}

/// One shared [`ZeroChunkCrc`], so lending zeros allocates nothing.
static ZERO_CHUNK_CRC: LazyLock<Arc<dyn KnownCrc32c>> = LazyLock::new(|| Arc::new(ZeroChunkCrc));

/// The part of one chunk a byte range touches.
struct Piece {
    chunk: u64,
    /// Offset within the chunk.
    start: usize,
    /// Offset within the caller's buffer.
    buf_start: usize,
    len: usize,
}

/// Splits `[offset, offset + len)` into per-chunk pieces.
fn pieces(offset: u64, len: usize) -> impl Iterator<Item = Piece> {
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let pos = offset + done as u64;
        let chunk = pos / CHUNK;
        let start = (pos % CHUNK) as usize;
        let n = (RAM_CHUNK_SIZE - start).min(len - done);
        let p = Piece {
            chunk,
            start,
            buf_start: done,
            len: n,
        };
        done += n;
        Some(p)
    })
}

/// The range of chunks `[offset, offset + len)` touches (`len` > 0).
fn chunk_range(offset: u64, len: usize) -> (u64, u64) {
    (offset / CHUNK, (offset + len as u64 - 1) / CHUNK)
}

/// Copies `buf` into the locked chunks from byte `offset`.
fn copy_range(
    table: &ChunkTable,
    locked: &mut Locked<RwLockWriteGuard<'_, Option<Chunk>>>,
    offset: u64,
    buf: &[u8],
) {
    for p in pieces(offset, buf.len()) {
        let (Some(src), Some(slot)) = (
            buf.get(p.buf_start..p.buf_start + p.len),
            locked.get_mut(p.chunk),
        ) else {
            continue;
        };
        copy_in(table, slot, p.start, src);
    }
}

/// Copies `src` into `slot` at `start` (a piece of one chunk).
fn copy_in(table: &ChunkTable, slot: &mut Option<Chunk>, start: usize, src: &[u8]) {
    let chunk = match slot {
        Some(c) => c,
        // Zeros into an unallocated chunk change nothing.
        None if src.iter().all(|&b| b == 0) => return,
        None => {
            table.count(true);
            slot.insert(Arc::new(ChunkData::zeroed()))
        }
    };
    // A chunk a read still holds is copied first: the read keeps the
    // bytes it saw (and the CRC remembered for them).
    if let Some(dst) = Arc::make_mut(chunk)
        .bytes_mut()
        .get_mut(start..start + src.len())
    {
        dst.copy_from_slice(src);
    }
}

/// Makes `piece` (exactly one chunk long) the chunk in `slot`, leaving in
/// its place the chunk's old buffer when nothing else holds it (the caller
/// reuses it), else an empty one.
fn adopt(table: &ChunkTable, slot: &mut Option<Chunk>, piece: &mut Vec<u8>) {
    match slot {
        Some(chunk) => match Arc::get_mut(chunk) {
            Some(data) => {
                std::mem::swap(data.bytes_mut(), piece);
            }
            // A READ still holds the chunk: it keeps it as it was.
            None => *chunk = Arc::new(ChunkData::from_bytes(std::mem::take(piece))),
        },
        // Zeros into an unallocated chunk change nothing.
        None if piece.iter().all(|&b| b == 0) => {}
        None => {
            table.count(true);
            *slot = Some(Arc::new(ChunkData::from_bytes(std::mem::take(piece))));
        }
    }
}

impl RamBackstore {
    /// A zero-filled RAM disk of `size_bytes` (a non-zero multiple of
    /// `block_size`, which is 512 or 4096). Nothing is allocated up front.
    pub fn new(
        size_bytes: u64,
        block_size: u32,
        unique_id: u64,
    ) -> Result<Self, RamBackstoreError> {
        if block_size != 512 && block_size != 4096 {
            return Err(RamBackstoreError::UnsupportedBlockSize(block_size));
        }
        if size_bytes == 0 || !size_bytes.is_multiple_of(u64::from(block_size)) {
            return Err(RamBackstoreError::InvalidSize {
                size: size_bytes,
                block_size,
            });
        }
        Ok(Self {
            size: AtomicU64::new(size_bytes),
            block_size,
            unique_id,
            chunks: ChunkTable::new(size_bytes.div_ceil(CHUNK)),
            resizing: Mutex::new(()),
            frozen: false,
            snapshots: Mutex::default(),
        })
    }

    /// A store of `size` bytes holding `chunks` ([`ChunkTable::with_chunks`]):
    /// a snapshot (`frozen`) or a clone of one.
    fn with_table(
        chunks: ChunkTable,
        size: u64,
        block_size: u32,
        unique_id: u64,
        frozen: bool,
    ) -> Self {
        Self {
            size: AtomicU64::new(size),
            block_size,
            unique_id,
            chunks,
            resizing: Mutex::new(()),
            frozen,
            snapshots: Mutex::default(),
        }
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// The first byte at or after `end` that is not zero, if any: data a
    /// shrink to `end` would drop.
    fn data_beyond(&self, end: u64) -> Option<u64> {
        let mut chunk = end / CHUNK;
        let mut skip = (end % CHUNK) as usize;
        loop {
            chunk = self.chunks.next_allocated(chunk)?;
            if chunk * CHUNK > end {
                skip = 0;
            }
            let slot = self.chunks.find(chunk)?;
            let held = slot.read().unwrap_or_else(PoisonError::into_inner);
            let first = held
                .as_ref()
                .and_then(|c| c.bytes.get(skip..)?.iter().position(|&b| b != 0));
            if let Some(at) = first {
                return Some(chunk * CHUNK + (skip + at) as u64);
            }
            chunk = chunk.checked_add(1)?;
        }
    }

    /// Drops every byte at or after `end`: the rest of its chunk zeroed,
    /// the chunks after it freed, so that a later growth reads zeros there.
    fn drop_beyond(&self, end: u64) {
        let tail = (end % CHUNK) as usize;
        if tail != 0
            && let Some(slot) = self.chunks.find(end / CHUNK)
            && let Some(c) = slot
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut()
            && let Some(rest) = Arc::make_mut(c).bytes_mut().get_mut(tail..)
        {
            rest.fill(0);
        }
        let mut from = end.div_ceil(CHUNK);
        while let Some(chunk) = self.chunks.next_allocated(from) {
            if let Some(slot) = self.chunks.find(chunk) {
                let mut slot = slot.write().unwrap_or_else(PoisonError::into_inner);
                if slot.take().is_some() {
                    self.chunks.count(false);
                }
            }
            let Some(next) = chunk.checked_add(1) else {
                break;
            };
            from = next;
        }
    }

    /// Bytes of memory currently allocated for data.
    pub fn allocated_bytes(&self) -> u64 {
        self.chunks.allocated() * CHUNK
    }

    /// [`RamBackstore::check_range`] for a change: a snapshot takes none.
    fn check_write(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.frozen {
            return Err(io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                "a snapshot of a RAM LUN is read-only",
            ));
        }
        self.check_range(offset, len)
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "byte range beyond the end of the RAM backstore",
            )),
        }
    }
}

impl Backstore for RamBackstore {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.size() / u64::from(self.block_size)
    }

    /// Growing publishes the new size (every chunk beyond the old end is
    /// unallocated: zeros); shrinking refuses where non-zero bytes lie
    /// beyond the new end (unless `discard`), then publishes the smaller
    /// size and drops those bytes. A write that checked its range before
    /// the size shrank checks it again under its chunks' locks, so none
    /// lands beyond the end after the drop (a later growth would show it).
    fn resize(&self, size: Option<u64>, discard: bool) -> Result<u64, ResizeError> {
        let Some(size) = size else {
            return Err(ResizeError::Unsupported(
                "a RAM LUN has no medium to take its size from: give the new size".into(),
            ));
        };
        check_size(size, self.block_size)?;
        if self.frozen {
            return Err(ResizeError::Unsupported(
                "a snapshot keeps the size it was taken at".into(),
            ));
        }
        let max = self.chunks.reach().saturating_mul(CHUNK);
        if size > max {
            return Err(ResizeError::TooLarge {
                size,
                max,
                why: ", what its chunk table reaches (a larger one needs a new store)".into(),
            });
        }
        let _one = self.resizing.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.size();
        if size >= old {
            self.size.store(size, Ordering::Release);
            return Ok(size);
        }
        let refuse = |at| Err(ResizeError::DataBeyond { at, size });
        if !discard && let Some(at) = self.data_beyond(size) {
            return refuse(at);
        }
        self.size.store(size, Ordering::Release);
        // A write that passed its check before the store may have landed
        // since the look above: look again now that no other can.
        if !discard && let Some(at) = self.data_beyond(size) {
            self.size.store(old, Ordering::Release);
            return refuse(at);
        }
        self.drop_beyond(size);
        Ok(size)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let (first, last) = chunk_range(offset, buf.len());
        let mut locked = self.chunks.read(first, last);
        for p in pieces(offset, buf.len()) {
            let Some(dst) = buf.get_mut(p.buf_start..p.buf_start + p.len) else {
                continue;
            };
            match locked
                .chunk(p.chunk)
                .and_then(|c| c.bytes.get(p.start..p.start + p.len))
            {
                Some(src) => dst.copy_from_slice(src),
                None => dst.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check_write(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let (first, last) = chunk_range(offset, buf.len());
        let mut locked = self.chunks.write(first, last);
        // Again under the locks: a shrink may have come between (`resize`).
        self.check_range(offset, buf.len() as u64)?;
        copy_range(&self.chunks, &mut locked, offset, buf);
        Ok(())
    }

    /// A piece of exactly one chunk, landing on a chunk boundary, becomes
    /// that chunk (no copy): the chunk's old buffer goes back in the
    /// piece's place when nothing else holds it, and a chunk a READ still
    /// holds is left to the READ (it keeps the bytes it saw, as with
    /// copy-on-write). Any other piece is copied in. The whole write is one
    /// step against every other read and write, as [`Backstore::write_at`] is
    /// (it holds all its chunks' locks at once).
    fn write_pieces(&self, offset: u64, pieces: &mut [Vec<u8>], len: usize) -> io::Result<()> {
        self.check_write(offset, len as u64)?;
        iscsi_scsi::backstore::check_pieces(pieces, len)?;
        if len == 0 {
            return Ok(());
        }
        let (first, last) = chunk_range(offset, len);
        let mut locked = self.chunks.write(first, last);
        self.check_range(offset, len as u64)?;
        let mut at = offset;
        let mut left = len;
        for piece in pieces.iter_mut() {
            if left == 0 {
                break;
            }
            let n = piece.len().min(left);
            // Only a buffer of exactly a chunk's capacity is kept: a longer
            // allocation cut short would hold memory nobody can use.
            if piece.len() == RAM_CHUNK_SIZE
                && piece.capacity() == RAM_CHUNK_SIZE
                && n == RAM_CHUNK_SIZE
                && at.is_multiple_of(CHUNK)
            {
                if let Some(slot) = locked.get_mut(at / CHUNK) {
                    adopt(&self.chunks, slot, piece);
                }
            } else {
                copy_range(&self.chunks, &mut locked, at, &piece[..n]);
            }
            at += n as u64;
            left -= n;
        }
        Ok(())
    }

    /// The chunks themselves, each piece a `Bytes` sharing its chunk
    /// (unallocated ones lend zeros): no byte is copied, and writes that
    /// follow copy the chunks still lent instead of changing them. A whole
    /// chunk comes with its CRC32C, computed on the first digest that asks
    /// and remembered until a write changes the chunk.
    fn lend(&self, offset: u64, len: usize) -> Option<io::Result<Vec<Lent>>> {
        if let Err(e) = self.check_range(offset, len as u64) {
            return Some(Err(e));
        }
        if len == 0 {
            return Some(Ok(Vec::new()));
        }
        let (first, last) = chunk_range(offset, len);
        let mut locked = self.chunks.read(first, last);
        let lent = pieces(offset, len)
            .map(|p| {
                let whole = p.len == RAM_CHUNK_SIZE;
                match locked.chunk(p.chunk) {
                    Some(c) => Lent {
                        bytes: Bytes::from_owner(LentChunk(Arc::clone(c)))
                            .slice(p.start..p.start + p.len),
                        crc: whole.then(|| Arc::clone(c) as Arc<dyn KnownCrc32c>),
                    },
                    None => Lent {
                        bytes: Bytes::from_static(&ZERO_CHUNK[p.start..p.start + p.len]),
                        crc: whole.then(|| Arc::clone(&ZERO_CHUNK_CRC)),
                    },
                }
            })
            .collect();
        Some(Ok(lent))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_write(offset, len)?;
        // Chunk by chunk: an UNMAP may cover the whole store, too many
        // chunks to hold at once, and SBC-3 promises no atomicity for it.
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let chunk = pos / CHUNK;
            let start = pos % CHUNK;
            let n = (CHUNK - start).min(end - pos);
            if let Some(slot) = self.chunks.find(chunk) {
                let mut slot = slot.write().unwrap_or_else(PoisonError::into_inner);
                if let Some(c) = slot.as_mut()
                    && n != CHUNK
                {
                    let (s, e) = (start as usize, (start + n) as usize);
                    if let Some(dst) = Arc::make_mut(c).bytes_mut().get_mut(s..e) {
                        dst.fill(0);
                    }
                }
                let free = slot
                    .as_ref()
                    .is_some_and(|c| n == CHUNK || c.bytes.iter().all(|&b| b == 0));
                if free {
                    *slot = None;
                    self.chunks.count(false);
                }
            }
            pos += n;
        }
        Ok(())
    }

    fn unique_id(&self) -> u64 {
        self.unique_id
    }

    fn is_thin(&self) -> bool {
        true
    }

    fn may_block(&self) -> bool {
        false
    }

    fn unmap_granularity(&self) -> u64 {
        CHUNK
    }

    /// Any length: a write holds the locks of all its chunks at once
    /// (taken in ascending order) and a read holds all of its own, so
    /// neither sees part of the other (`table.rs`, which also closes the
    /// race with chunks not yet made). A crash loses the whole store, so
    /// no write survives in part either.
    fn atomic_write_max(&self) -> u64 {
        u64::MAX
    }

    /// Unmapping drops the chunks: the bytes are freed to the allocator
    /// and every block reads as zeros.
    fn can_block_erase(&self) -> bool {
        true
    }

    /// Copies sharing the chunks, in memory ([`snapshots`]).
    fn snapshots(&self) -> Option<&dyn iscsi_scsi::backstore::Snapshots> {
        Some(self)
    }

    /// A chunk is mapped exactly when it is allocated.
    fn allocation_status(&self, offset: u64, max_len: u64) -> io::Result<Allocation> {
        self.check_range(offset, max_len)?;
        if max_len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty range"));
        }
        let mapped_at = |chunk: u64| {
            self.chunks.find(chunk).is_some_and(|slot| {
                slot.read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_some()
            })
        };
        let end = offset + max_len;
        let first = offset / CHUNK;
        let mapped = mapped_at(first);
        let mut pos = (first + 1).saturating_mul(CHUNK);
        while pos < end && mapped_at(pos / CHUNK) == mapped {
            pos = pos.saturating_add(CHUNK);
        }
        Ok(Allocation {
            mapped,
            len: pos.min(end) - offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read spanning chunks never sees part of one write: not in the
    /// steady state, and not in the race where the write makes the part
    /// of the tree the read found missing (a fresh store each round, both
    /// started together, the read's range long enough that the write can
    /// make the part and lock its first chunks while the read walks it).
    #[test]
    fn reads_never_see_a_torn_write() {
        let len = 64 * RAM_CHUNK_SIZE;
        let offset = 64 * 1024 * 1024 - 512;
        for round in 0..300u32 {
            let store = Arc::new(RamBackstore::new(256 << 20, 512, 1).unwrap());
            let start = Arc::new(std::sync::Barrier::new(2));
            let writer = {
                let (store, start) = (Arc::clone(&store), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    for i in 1..=3u8 {
                        store.write_at(offset, &vec![i; len]).unwrap();
                    }
                })
            };
            let mut buf = vec![0u8; len];
            start.wait();
            while !writer.is_finished() {
                store.read_at(offset, &mut buf).unwrap();
                let first = buf[0];
                if let Some(at) = buf.iter().position(|&b| b != first) {
                    panic!("round {round}: torn read, {first} then {} at {at}", buf[at]);
                }
            }
            writer.join().unwrap();
        }
    }

    #[test]
    fn rejects_bad_geometry() {
        assert!(RamBackstore::new(1000, 512, 1).is_err());
        assert!(RamBackstore::new(0, 512, 1).is_err());
        assert!(RamBackstore::new(4096, 1024, 1).is_err());
        assert!(RamBackstore::new(4096, 4096, 1).is_ok());
    }

    #[test]
    fn sparse_reads_zero_and_unmap_frees() {
        let r = RamBackstore::new(1 << 20, 512, 7).unwrap();
        let mut buf = vec![0xAAu8; 4096];
        r.read_at(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(r.allocated_bytes(), 0);
        r.write_at(0, &vec![0u8; 8192]).unwrap();
        assert_eq!(r.allocated_bytes(), 0);
        // A write straddling a chunk boundary allocates two chunks.
        let data: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8 + 1).collect();
        r.write_at(CHUNK - 512, &data).unwrap();
        assert_eq!(r.allocated_bytes(), 2 * CHUNK);
        let mut back = vec![0u8; 1024];
        r.read_at(CHUNK - 512, &mut back).unwrap();
        assert_eq!(back, data);
        r.unmap(0, 2 * CHUNK).unwrap();
        assert_eq!(r.allocated_bytes(), 0);
        r.read_at(CHUNK - 512, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }

    /// Pieces of `lens` bytes, piece `i` filled with `i + 1 + salt`.
    fn pieces_of(lens: &[usize], salt: u8) -> Vec<Vec<u8>> {
        lens.iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8 + 1 + salt; n])
            .collect()
    }

    fn read(r: &RamBackstore, offset: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        r.read_at(offset, &mut b).unwrap();
        b
    }

    #[test]
    fn whole_aligned_pieces_become_chunks_and_the_old_buffers_come_back() {
        let c = RAM_CHUNK_SIZE;
        let r = RamBackstore::new(1 << 20, 512, 7).unwrap();
        let mut first = pieces_of(&[c, c, 100], 0);
        let addresses: Vec<*const u8> = first.iter().map(|p| p.as_ptr()).collect();
        r.write_pieces(CHUNK, &mut first, 2 * c + 100).unwrap();
        // New chunks took the pieces: their slots are empty now; the
        // short tail was copied.
        assert!(first[0].is_empty() && first[1].is_empty());
        assert_eq!(first[2], vec![3u8; 100]);
        assert_eq!(r.allocated_bytes(), 3 * CHUNK);
        assert_eq!(read(&r, CHUNK, c), vec![1u8; c]);
        assert_eq!(read(&r, 2 * CHUNK, c), vec![2u8; c]);
        assert_eq!(read(&r, 3 * CHUNK, 101)[..100], vec![3u8; 100][..]);
        // Overwriting chunks nothing else holds exchanges the buffers: the
        // caller gets the chunks' old memory (old bytes) back.
        let mut second = pieces_of(&[c, c], 10);
        r.write_pieces(CHUNK, &mut second, 2 * c).unwrap();
        assert_eq!(second[0].as_ptr(), addresses[0]);
        assert_eq!(second[1].as_ptr(), addresses[1]);
        assert_eq!(second[0].len(), c);
        assert_eq!(read(&r, CHUNK, c), vec![11u8; c]);
        assert_eq!(read(&r, 2 * CHUNK, c), vec![12u8; c]);
    }

    #[test]
    fn a_lent_chunk_keeps_its_bytes_when_a_piece_replaces_it() {
        let c = RAM_CHUNK_SIZE;
        let r = RamBackstore::new(1 << 20, 512, 7).unwrap();
        r.write_at(0, &vec![5u8; c]).unwrap();
        let lent = r.lend(0, c).unwrap().unwrap();
        let crc_before = lent[0].crc.as_ref().unwrap().crc32c();
        let mut pieces = pieces_of(&[c], 0);
        r.write_pieces(0, &mut pieces, c).unwrap();
        assert!(pieces[0].is_empty(), "the piece became the chunk");
        assert_eq!(&lent[0].bytes[..], &vec![5u8; c][..], "the read's bytes");
        assert_eq!(crc_before, iscsi_crc32c::crc32c(&vec![5u8; c]));
        assert_eq!(read(&r, 0, c), vec![1u8; c]);
        let lent = r.lend(0, c).unwrap().unwrap();
        assert_eq!(
            lent[0].crc.as_ref().unwrap().crc32c(),
            iscsi_crc32c::crc32c(&vec![1u8; c]),
            "the new chunk's CRC is its own"
        );
    }

    #[test]
    fn unaligned_or_partial_pieces_are_copied() {
        let c = RAM_CHUNK_SIZE;
        let r = RamBackstore::new(1 << 20, 512, 7).unwrap();
        // Pieces of a chunk's length that straddle chunk boundaries.
        let mut pieces = pieces_of(&[c, c], 0);
        r.write_pieces(512, &mut pieces, 2 * c).unwrap();
        assert_eq!(pieces[0], vec![1u8; c], "copied, not taken");
        let back = read(&r, 0, 2 * c + 1024);
        assert!(back[..512].iter().all(|&b| b == 0));
        assert!(back[512..512 + c].iter().all(|&b| b == 1));
        assert!(back[512 + c..512 + 2 * c].iter().all(|&b| b == 2));
        assert!(back[512 + 2 * c..].iter().all(|&b| b == 0));
        // A write shorter than its pieces uses only its length; a piece
        // longer than a chunk (one flat buffer) is copied.
        let mut long = vec![vec![9u8; 2 * c]];
        r.write_pieces(4 * CHUNK, &mut long, c).unwrap();
        assert_eq!(long[0].len(), 2 * c);
        assert_eq!(read(&r, 4 * CHUNK, c), vec![9u8; c]);
        assert_eq!(read(&r, 5 * CHUNK, 16), vec![0u8; 16]);
        // Zero pieces into unallocated chunks allocate nothing.
        let before = r.allocated_bytes();
        let mut zeros = vec![vec![0u8; c]];
        r.write_pieces(8 * CHUNK, &mut zeros, c).unwrap();
        assert_eq!(r.allocated_bytes(), before);
        // Too few bytes, or out of range: refused, nothing written.
        let mut short = vec![vec![7u8; 10]];
        assert!(r.write_pieces(0, &mut short, 11).is_err());
        assert!(r.write_pieces((1 << 20) - 5, &mut short, 10).is_err());
    }

    /// A command spanning chunks is one step: readers on other threads see
    /// one writer's bytes or the other's, never a mix, while writers to
    /// other chunks go on beside them.
    #[test]
    fn commands_across_chunks_are_not_torn() {
        let r = Arc::new(RamBackstore::new(8 * CHUNK, 512, 7).unwrap());
        // Half a chunk either side of the boundary between chunks 0 and 1.
        let (at, len) = (CHUNK / 2, RAM_CHUNK_SIZE);
        std::thread::scope(|s| {
            for v in [1u8, 2] {
                let r = &r;
                s.spawn(move || {
                    for i in 0..2000 {
                        r.write_at(at, &vec![v; len]).unwrap();
                        // Another chunk, at the same time.
                        r.write_at(4 * CHUNK + (i % 8) * 512, &[v; 512]).unwrap();
                    }
                });
            }
            let r = &r;
            s.spawn(move || {
                let mut buf = vec![0u8; len];
                for _ in 0..2000 {
                    r.read_at(at, &mut buf).unwrap();
                    assert!(buf.iter().all(|&b| b == buf[0]), "a torn read");
                    let lent = r.lend(at, len).unwrap().unwrap();
                    let first = lent[0].bytes[0];
                    assert!(lent.iter().all(|l| l.bytes.iter().all(|&b| b == first)));
                }
            });
        });
        assert_eq!(r.allocated_bytes(), 3 * CHUNK);
    }

    #[test]
    fn partial_unmap_zeroes() {
        let r = RamBackstore::new(1 << 20, 512, 7).unwrap();
        r.write_at(0, &[1u8; 1024]).unwrap();
        r.unmap(0, 512).unwrap();
        let mut b = [9u8; 1024];
        r.read_at(0, &mut b).unwrap();
        assert!(b[..512].iter().all(|&x| x == 0));
        assert!(b[512..].iter().all(|&x| x == 1));
        assert_eq!(r.allocated_bytes(), CHUNK);
        r.unmap(512, 512).unwrap();
        assert_eq!(r.allocated_bytes(), 0);
    }

    /// Lent pieces are the chunks themselves, and keep the bytes they had
    /// when lent whatever is written or unmapped afterwards.
    #[test]
    fn lent_bytes_never_change() {
        let r = RamBackstore::new(1 << 20, 512, 7).unwrap();
        let old: Vec<u8> = (0..2 * RAM_CHUNK_SIZE)
            .map(|i| (i % 249) as u8 + 1)
            .collect();
        r.write_at(CHUNK / 2, &old[..CHUNK as usize]).unwrap();
        // Half a chunk of zeros (unallocated), then written data.
        let lent = r.lend(0, RAM_CHUNK_SIZE + 4096).unwrap().unwrap();
        let joined: Vec<u8> = lent.iter().flat_map(|b| b.bytes.iter().copied()).collect();
        assert_eq!(lent.len(), 2, "one piece per chunk");
        assert!(joined[..RAM_CHUNK_SIZE / 2].iter().all(|&b| b == 0));
        assert_eq!(
            &joined[RAM_CHUNK_SIZE / 2..],
            &old[..RAM_CHUNK_SIZE / 2 + 4096]
        );
        // Overwritten and unmapped while lent: the loan is unchanged, a
        // new read sees the new bytes.
        r.write_at(0, &vec![0xEE; RAM_CHUNK_SIZE + 4096]).unwrap();
        r.unmap(CHUNK, CHUNK).unwrap();
        let after: Vec<u8> = lent.iter().flat_map(|b| b.bytes.iter().copied()).collect();
        assert_eq!(after, joined);
        let mut now = vec![0u8; RAM_CHUNK_SIZE];
        r.read_at(0, &mut now).unwrap();
        assert!(now.iter().all(|&b| b == 0xEE));
        // Once the loan is dropped, writes go in place again.
        drop(lent);
        r.write_at(0, &[1u8; 512]).unwrap();
        assert!(r.lend(1 << 20, 1).unwrap().is_err(), "beyond the end");
    }

    /// A whole chunk is lent with its CRC32C: that of the bytes lent, for
    /// allocated and unallocated chunks, and a write in between (with or
    /// without a loan outstanding) is never answered with the old CRC.
    #[test]
    fn whole_chunks_are_lent_with_their_crc() {
        let r = RamBackstore::new(1 << 20, 512, 7).unwrap();
        let crc_of = |lent: &Lent| lent.crc.as_ref().map(|c| c.crc32c());
        let data: Vec<u8> = (0..RAM_CHUNK_SIZE).map(|i| (i % 253) as u8).collect();
        r.write_at(CHUNK, &data).unwrap();
        // Chunk 0 unallocated, chunk 1 written, then half of chunk 2.
        let lent = r.lend(0, 2 * RAM_CHUNK_SIZE + 512).unwrap().unwrap();
        assert_eq!(lent.len(), 3);
        for piece in &lent[..2] {
            assert_eq!(crc_of(piece), Some(iscsi_crc32c::crc32c(&piece.bytes)));
        }
        assert_eq!(crc_of(&lent[1]), Some(iscsi_crc32c::crc32c(&data)));
        assert!(lent[2].crc.is_none(), "part of a chunk has no known CRC");
        let part = r.lend(CHUNK + 512, 4096).unwrap().unwrap();
        assert!(part[0].crc.is_none());
        // Written while lent (copy-on-write): the loan keeps its CRC, a new
        // loan has the new bytes' CRC.
        r.write_at(CHUNK + 100, &[0xAB; 7]).unwrap();
        assert_eq!(crc_of(&lent[1]), Some(iscsi_crc32c::crc32c(&data)));
        let again = r.lend(CHUNK, RAM_CHUNK_SIZE).unwrap().unwrap();
        let mut expected = data.clone();
        expected[100..107].fill(0xAB);
        assert_eq!(crc_of(&again[0]), Some(iscsi_crc32c::crc32c(&expected)));
        // Written with no loan outstanding (in place): the remembered CRC
        // goes with the change.
        drop((lent, part, again));
        r.write_at(CHUNK, &[0x11; 512]).unwrap();
        expected[..512].fill(0x11);
        let last = r.lend(CHUNK, RAM_CHUNK_SIZE).unwrap().unwrap();
        assert_eq!(crc_of(&last[0]), Some(iscsi_crc32c::crc32c(&expected)));
        drop(last);
        r.unmap(CHUNK, 512).unwrap();
        expected[..512].fill(0);
        let unmapped = r.lend(CHUNK, RAM_CHUNK_SIZE).unwrap().unwrap();
        assert_eq!(crc_of(&unmapped[0]), Some(iscsi_crc32c::crc32c(&expected)));
    }

    #[test]
    fn out_of_range_is_error() {
        let r = RamBackstore::new(4096, 512, 7).unwrap();
        assert!(r.read_at(4096, &mut [0u8; 1]).is_err());
        assert!(r.write_at(u64::MAX, &[0u8; 2]).is_err());
        assert!(r.unmap(0, 4097).is_err());
    }
}
