//! Backstores: the storage behind a logical unit. Owns the [`Backstore`]
//! trait (byte-addressed, synchronous, shared between sessions), what a
//! store may do faster than the generic path (lending its memory, copy and
//! compare offloads, [`AsyncIo`]), and the checks every store makes. The
//! stores themselves live in rooms of their own and implement the trait
//! from there: `iscsi-stores` (RAM, file, block device, and the wrappers:
//! options, latency, encryption), `iscsi-ceph` (an RBD image, gateway
//! groups).
//!
//! The SCSI layer has already range-checked every request in LBAs before it
//! reaches a backstore; a backstore still refuses out-of-range byte ranges
//! with an I/O error rather than panicking.

mod async_io;
mod resize;
mod snapshot;

use std::fmt;
use std::io;
use std::sync::Arc;

pub use async_io::{AsyncIo, IoFuture, WriteData};
pub use resize::{ResizeError, check_size};
pub use snapshot::{
    MAX_NAME_LEN as MAX_SNAPSHOT_NAME_LEN, SnapshotError, SnapshotInfo, Snapshots,
    check_name as check_snapshot_name,
};

/// A piece of a store's own memory lent to a READ ([`Backstore::lend`]),
/// with the CRC32C of the whole piece when the store can tell it without
/// reading the bytes again (a whole RAM chunk: computed once, kept until a
/// write replaces the chunk), so a data digest over it costs nothing.
#[derive(Clone, Debug)]
pub struct Lent {
    /// The bytes; they never change.
    pub bytes: bytes::Bytes,
    /// What knows the CRC32C of exactly `bytes`, if anything does.
    pub crc: Option<std::sync::Arc<dyn iscsi_crc32c::KnownCrc32c>>,
}

/// The provisioning status of a run of bytes (for GET LBA STATUS, SBC-3
/// §5.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Whether the run is mapped (backed by storage); `false` means
    /// deallocated, reading as zeros.
    pub mapped: bool,
    /// Length of the run in bytes, from the offset asked about; at least 1
    /// and at most the length asked about.
    pub len: u64,
}

/// The persistent reservation state of an LU kept outside the gateway,
/// shared by every gateway that exports the LU's medium (an RBD image:
/// one RADOS object in its pool). Bytes only: what they hold, and the
/// protocol (compare-and-set on an epoch, notify, fence), is
/// `crate::pr_shared`'s and `crate::pr_record`'s.
pub trait SharedPrStore: Send + Sync + fmt::Debug {
    /// The stored record; `None` while there is none.
    fn read(&self) -> io::Result<Option<Vec<u8>>>;
    /// Stores `bytes` as epoch `epoch` if the stored epoch is `expected`
    /// now (`None`: if nothing is stored yet), atomically. `Ok(false)`:
    /// another gateway's change came first.
    fn write_if(&self, expected: Option<u64>, epoch: u64, bytes: &[u8]) -> io::Result<bool>;
    /// Tells every gateway watching the record that it changed and waits,
    /// bounded, for each to acknowledge (which each does once it has
    /// reloaded): the client ids that acknowledged, this one's included.
    fn notify(&self) -> io::Result<Vec<u64>>;
    /// Fences the clients at `addrs` (their I/O to the medium fails from
    /// now on) and returns once the cluster enforces it.
    fn fence(&self, addrs: &[String]) -> io::Result<()>;
    /// This gateway's client of the medium: its id and its address.
    fn me(&self) -> (u64, String);
    /// Starts calling `on_event` on a thread of the store's: a
    /// [`PrEvent::Changed`] another gateway notified, [`PrEvent::Broken`]
    /// when the watch broke (changes may have been missed, or this client
    /// was fenced); after a break the store watches again and sends
    /// `Changed` once it does. A notify is acknowledged after `on_event`
    /// returns, and only if it returns `true` (the change is in force
    /// here): a gateway that could not reload must not acknowledge, so that
    /// the notifier fences it rather than trust its stale copy. A store
    /// whose client was fenced and which connected a new one sends
    /// [`PrEvent::Rejoined`], and serves data again only if that returns
    /// `true`.
    fn watch(&self, on_event: PrEventHandler) -> io::Result<()>;
}

/// What [`SharedPrStore::watch`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrEvent {
    /// Another gateway changed the record: reload it.
    Changed,
    /// The watch broke: changes may have been missed until it is back.
    Broken,
    /// This gateway's client was fenced (blocklisted) and the store now
    /// has a new one, watching already, which is not yet in the record's
    /// list of gateways: drain what was admitted on the old state, join
    /// the record again and reload it. The store serves no data I/O until
    /// this returns `true` (a `false` leaves it fenced, to try again).
    Rejoined,
}

/// What [`SharedPrStore::watch`] calls; the result says whether to
/// acknowledge (or, for [`PrEvent::Rejoined`], whether the LU may serve).
pub type PrEventHandler = Arc<dyn Fn(PrEvent) -> bool + Send + Sync>;

/// The storage behind one logical unit.
pub trait Backstore: Send + Sync + fmt::Debug {
    /// Logical block size in bytes.
    fn block_size(&self) -> u32;
    /// Number of logical blocks.
    fn block_count(&self) -> u64;
    /// The medium's size in bytes: [`Backstore::block_count`] blocks of
    /// [`Backstore::block_size`].
    fn size_bytes(&self) -> u64 {
        self.block_count()
            .saturating_mul(u64::from(self.block_size()))
    }
    /// Fills `buf` from byte `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` at byte `offset`.
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// `len` bytes from `offset` as shared pieces of the store's own
    /// memory, in order, instead of a copy (`None`: this store does not
    /// lend; use [`Backstore::read_at`]). Lent bytes never change: a write
    /// after the loan leaves them as they were (the store copies what is
    /// still lent), so data sent from them is the data as of the read.
    fn lend(&self, offset: u64, len: usize) -> Option<io::Result<Vec<Lent>>> {
        let _ = (offset, len);
        None
    }
    /// Writes the first `len` bytes of the concatenation of `pieces` at
    /// `offset` (a transport receives a large write in pieces of
    /// `iscsi_stores::RAM_CHUNK_SIZE`, so that it lands in its final place as it
    /// arrives). A store whose memory is made of such chunks (RAM) keeps a
    /// piece of exactly that length that lands on one whole chunk, leaving
    /// in its place a buffer of the same length with unspecified contents
    /// (the memory it replaced, for the caller to reuse) or an empty one;
    /// files take the pieces in one vectored write. The default writes
    /// each piece in turn.
    fn write_pieces(&self, offset: u64, pieces: &mut [Vec<u8>], len: usize) -> io::Result<()> {
        check_pieces(pieces, len)?;
        for_each_piece(offset, pieces, len, |at, bytes| self.write_at(at, bytes))
    }

    /// [`Backstore::write_pieces`], durable before it returns (WRITE with
    /// FUA=1): the default writes them and then flushes everything.
    fn write_pieces_through(
        &self,
        offset: u64,
        pieces: &mut [Vec<u8>],
        len: usize,
    ) -> io::Result<()> {
        self.write_pieces(offset, pieces, len)?;
        self.flush()
    }

    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Deallocates `len` bytes from `offset` (thin provisioning); the range
    /// reads as zeros afterwards. RAM frees the chunks.
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()>;
    /// A stable per-LU identifier used for the NAA designator and unit serial
    /// number.
    fn unique_id(&self) -> u64;

    /// Writes `buf` at `offset` and makes it durable before returning (WRITE
    /// with FUA=1 and WRITE AND VERIFY, SBC-3 §5.41). The default writes and
    /// then flushes everything.
    fn write_through(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write_at(offset, buf)?;
        self.flush()
    }

    /// Whether the store is thin provisioned: [`Backstore::unmap`] really
    /// deallocates and [`Backstore::allocation_status`] tells mapped from
    /// unmapped ranges. Reported as LBPME in READ CAPACITY(16) (SBC-3
    /// §5.16.2). Unmapped ranges always read as zeros (LBPRZ).
    fn is_thin(&self) -> bool {
        false
    }

    /// Whether reads and writes may wait on a device (file, block). The
    /// transport runs commands for such stores on a thread pool; a store
    /// that only touches memory answers `false` and its commands run
    /// inline, without the hand-off.
    fn may_block(&self) -> bool {
        true
    }

    /// Reads and writes that complete without holding a thread, for a
    /// store that waits on the network ([`AsyncIo`]); `None`: the
    /// synchronous methods only. A store offering them still answers the
    /// synchronous ones (every command but READ and WRITE uses those).
    fn async_io(&self) -> Option<std::sync::Arc<dyn AsyncIo>> {
        None
    }

    /// The granule (in bytes) in which [`Backstore::unmap`] frees storage;
    /// reported as the OPTIMAL UNMAP GRANULARITY of the Block Limits VPD
    /// page.
    fn unmap_granularity(&self) -> u64 {
        u64::from(self.block_size())
    }

    /// The open regular file behind this store, if it is one: an EXTENDED
    /// COPY between two such stores is left to the kernel
    /// (`copy_file_range`), which may share extents instead of moving bytes.
    fn file(&self) -> Option<&std::fs::File> {
        None
    }

    /// Copies `len` bytes from `src` at `src_offset` into this store at
    /// `dst_offset` (EXTENDED COPY, `crate::xcopy`; the caller has
    /// range-checked both and keeps `len` to a few MiB so that a LUN removed
    /// meanwhile is noticed between calls). The default is
    /// [`copy_through_memory`]: a store that lends (RAM) hands over its
    /// chunks with no copy, anything else is read into one bounded buffer.
    fn copy_from(
        &self,
        src: &dyn Backstore,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> io::Result<()> {
        copy_through_memory(src, src_offset, self, dst_offset, len)
    }

    /// The longest write, in bytes, that this store makes all-or-nothing:
    /// a concurrent read sees all of it or none of it, and after a crash
    /// or power loss the range holds all of it or none of it. Reported
    /// (in blocks, bounded by the transfer limits) as the MAXIMUM ATOMIC
    /// TRANSFER LENGTH of the Block Limits VPD page; WRITE ATOMIC(16)
    /// exists on the LU only when it is at least one block. The default,
    /// 0: a store that writes through the kernel's page cache or to a
    /// device cannot promise even one block to a concurrent `pread`
    /// (buffered reads take no lock against a write copying into the same
    /// page), nor to a crash what the device's own atomic unit does not.
    fn atomic_write_max(&self) -> u64 {
        0
    }

    /// Whether SANITIZE BLOCK ERASE (SBC-4 §4.11) is honest on this store:
    /// [`Backstore::unmap`] of the whole store then [`Backstore::flush`]
    /// leaves the old data neither in the LU's view nor in the store's own
    /// medium as far as the store can reach it. Requires a thin store
    /// (libiscsi and SBC-4 read a block erase as "everything deallocated").
    fn can_block_erase(&self) -> bool {
        false
    }

    /// Whether SANITIZE CRYPTOGRAPHIC ERASE (SBC-4 §4.11) is honest on this
    /// store: its data is kept encrypted and [`Backstore::crypto_erase`]
    /// replaces the key (`iscsi_stores::EncryptedBackstore`).
    fn can_crypto_erase(&self) -> bool {
        false
    }

    /// Replaces the key the store's data is encrypted with: what was
    /// written before reads as indeterminate data from then on. Stores
    /// that are not encrypted refuse.
    fn crypto_erase(&self) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the store is not encrypted",
        ))
    }

    /// Where the LU's persistent reservation state is kept when it is
    /// shared with other gateways exporting the same medium (an RBD image:
    /// a RADOS object beside it); `None` (the default): in the LU's memory.
    fn shared_pr(&self) -> Option<std::sync::Arc<dyn SharedPrStore>> {
        None
    }

    /// The options of the LU this store is the medium of (read-only,
    /// removable, physical block size): `iscsi_stores::WithOptions` sets them, any
    /// other store has none.
    fn lu_options(&self) -> crate::medium::LuOptions {
        crate::medium::LuOptions::DEFAULT
    }

    /// COMPARE AND WRITE done by the store itself, atomic against every
    /// writer of the medium, which for a store shared by several gateways
    /// (RBD) the LU's own lock is not: compares the `expect.len()` bytes at
    /// `offset` with `expect` and, only if all are equal, writes `data`
    /// (as long) there, durable before it returns when `through`.
    /// `Some(Ok(None))`: written; `Some(Ok(Some(k)))`: byte `k` of the
    /// range is the first that differs, and nothing was written. `None`
    /// (the default, and a store's answer for a range it cannot do in one
    /// step): the SCSI layer reads, compares and writes under the LU's
    /// exclusive write lock.
    fn compare_and_write(
        &self,
        offset: u64,
        expect: &[u8],
        data: &[u8],
        through: bool,
    ) -> Option<io::Result<Option<u64>>> {
        let _ = (offset, expect, data, through);
        None
    }

    /// Whether [`Backstore::compare_and_write`] does the `len` bytes at
    /// `offset` in one step (it answers `Some` for them). Asked before the
    /// command takes the LU's lock: a compare the store cannot do is atomic
    /// only while no other gateway serves the LU.
    fn compares_in_one_step(&self, offset: u64, len: u64) -> bool {
        let _ = (offset, len);
        false
    }

    /// WRITE SAME done by the store: `pattern` (one logical block) written
    /// to every block of the `len` bytes from `offset` in one request that
    /// carries the pattern once, durable before it returns when `through`.
    /// `None` (the default): the SCSI layer writes buffers of repeated
    /// blocks instead.
    fn write_same(
        &self,
        offset: u64,
        len: u64,
        pattern: &[u8],
        through: bool,
    ) -> Option<io::Result<()>> {
        let _ = (offset, len, pattern, through);
        None
    }

    /// Whether the medium was resized under the LU (an RBD image by `rbd
    /// resize`) since the last call that answered `true`;
    /// [`Backstore::block_count`] already gives the new size. The LU then
    /// raises CAPACITY DATA HAS CHANGED for every nexus. Asked by every
    /// command: one load of a flag that only a resize writes. The default:
    /// a store whose size never changes.
    fn take_capacity_change(&self) -> bool {
        false
    }

    /// Changes the medium's size to `size` bytes while it serves, or, with
    /// `None`, to what the medium holds now (a block device its owner grew,
    /// a file extended by hand): the new size in bytes. Growing exposes
    /// zeros, or what a device holds there; shrinking drops what lies
    /// beyond the new end, so a store that can tell data lies there
    /// answers [`ResizeError::DataBeyond`] unless `discard`. Commands
    /// beyond the new end fail from the moment it returns. The caller (the
    /// SCSI target) raises CAPACITY DATA HAS CHANGED. The default: a store
    /// whose size is not ours to change.
    fn resize(&self, size: Option<u64>, discard: bool) -> Result<u64, ResizeError> {
        let _ = (size, discard);
        Err(ResizeError::Unsupported(
            "this kind of store cannot be resized while it serves".into(),
        ))
    }

    /// The ALUA group of the LU this store is the medium of: a store that
    /// several gateways serve (RBD) hands the LU the shared state its
    /// owner-keeper changes, and the LU then answers with implicit ALUA
    /// (see [`crate::alua`]). Every store that one process alone serves
    /// has none, and its LU reports no target port groups, exactly as
    /// before ALUA existed.
    fn alua(&self) -> Option<std::sync::Arc<crate::alua::AluaGroup>> {
        None
    }

    /// The store's point-in-time copies ([`Snapshots`]), if it can take
    /// them while it serves. The default: it cannot.
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        None
    }

    /// The provisioning status of the run of bytes starting at `offset`, at
    /// most `max_len` (> 0) long. The default: everything mapped.
    fn allocation_status(&self, offset: u64, max_len: u64) -> io::Result<Allocation> {
        let end = offset.checked_add(max_len);
        let size = self.block_count().checked_mul(u64::from(self.block_size()));
        match (end, size) {
            (Some(end), Some(size)) if end <= size && max_len > 0 => Ok(Allocation {
                mapped: true,
                len: max_len,
            }),
            _ => Err(out_of_range()),
        }
    }
}

/// Why a store could not be opened (a file, a block device, an RBD image).
#[derive(Debug)]
pub enum BackstoreOpenError {
    /// Opening, sizing or inspecting the file failed.
    Io(io::Error),
    /// The block size is not a power of two from 512 to 65536.
    UnsupportedBlockSize(u32),
    /// The size is zero or not a multiple of the block size.
    InvalidSize {
        /// The size in bytes.
        size: u64,
        /// The block size.
        block_size: u32,
    },
}

impl fmt::Display for BackstoreOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "backstore I/O error: {e}"),
            Self::UnsupportedBlockSize(bs) => write!(f, "unsupported block size {bs}"),
            Self::InvalidSize { size, block_size } => write!(
                f,
                "size {size} is zero or not a multiple of the block size {block_size}"
            ),
        }
    }
}

impl std::error::Error for BackstoreOpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for BackstoreOpenError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Accepts block sizes that are powers of two from 512 to 65536.
#[inline]
pub fn check_block_size(block_size: u32) -> Result<(), BackstoreOpenError> {
    if block_size.is_power_of_two() && (512..=65536).contains(&block_size) {
        Ok(())
    } else {
        Err(BackstoreOpenError::UnsupportedBlockSize(block_size))
    }
}

/// The error of a byte range past the end of a store.
#[inline]
pub fn out_of_range() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "byte range beyond the end of the backstore",
    )
}

/// `Ok` when `[offset, offset + len)` lies within `size` bytes.
#[inline]
pub fn check_range(offset: u64, len: u64, size: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(out_of_range()),
    }
}

/// `Ok` when `pieces` hold at least `len` bytes (a write's length).
#[inline]
pub fn check_pieces(pieces: &[Vec<u8>], len: usize) -> io::Result<()> {
    if pieces.iter().map(Vec::len).sum::<usize>() < len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "fewer bytes in the pieces than the write's length",
        ));
    }
    Ok(())
}

/// Calls `write` with each piece's share of the first `len` bytes of the
/// concatenation of `pieces` and the offset it goes to from `offset`, in
/// order, stopping at the first failure: how a store without a vectored
/// write takes [`Backstore::write_pieces`].
pub fn for_each_piece(
    offset: u64,
    pieces: &[Vec<u8>],
    len: usize,
    mut write: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = offset;
    let mut left = len;
    for piece in pieces {
        if left == 0 {
            break;
        }
        let n = piece.len().min(left);
        write(at, &piece[..n])?;
        at += n as u64;
        left -= n;
    }
    Ok(())
}

/// The largest buffer [`copy_through_memory`] reads into at once: a copy
/// never holds a whole segment in memory.
pub const COPY_PIECE: usize = 4 << 20;

/// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`
/// through memory, at most [`COPY_PIECE`] at a time: the lent pieces of a
/// store that lends (RAM chunks, shared rather than copied out), else one
/// reused buffer. What every store can do; the fallback of
/// [`Backstore::copy_from`].
pub fn copy_through_memory<D: Backstore + ?Sized>(
    src: &dyn Backstore,
    src_offset: u64,
    dst: &D,
    dst_offset: u64,
    len: u64,
) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from((len - done).min(COPY_PIECE as u64)).unwrap_or(COPY_PIECE);
        let (from, to) = (src_offset + done, dst_offset + done);
        match src.lend(from, n) {
            Some(lent) => {
                let mut at = to;
                for piece in lent? {
                    dst.write_at(at, &piece.bytes)?;
                    at += piece.bytes.len() as u64;
                }
                if at != to + n as u64 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "a store lent fewer bytes than asked for",
                    ));
                }
            }
            None => {
                buf.resize(n, 0);
                src.read_at(from, &mut buf)?;
                dst.write_at(to, &buf)?;
            }
        }
        done += n as u64;
    }
    Ok(())
}
