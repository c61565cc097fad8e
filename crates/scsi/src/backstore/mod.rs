//! Backstores: the storage behind a logical unit. Owns the [`Backstore`]
//! trait (byte-addressed, synchronous, shared between sessions) and its
//! implementations. A store beyond one machine lives in a crate of its own
//! (`iscsi-ceph`: RBD) and implements the trait from there.
//!
//! | module | owns |
//! |---|---|
//! | `ram.rs` | [`RamBackstore`]: sparse, 64 KiB chunks allocated on first non-zero write |
//! | `file.rs` | [`FileBackstore`]: a regular (possibly sparse) file, UNMAP punches holes |
//! | `block.rs` | [`BlockBackstore`]: a block device (or any file), optionally `O_DIRECT` |
//! | `slow.rs` | [`SlowBackstore`]: any store behind a fixed latency (a slow device, for tests) |
//! | `encrypted.rs` | [`EncryptedBackstore`]: any store kept encrypted (AES-256-XTS) under a key that SANITIZE CRYPTOGRAPHIC ERASE replaces |
//! | `options.rs` | [`WithOptions`]: any store with LU options (read-only, removable, physical block size) |
//!
//! The SCSI layer has already range-checked every request in LBAs before it
//! reaches a backstore; a backstore still refuses out-of-range byte ranges
//! with an I/O error rather than panicking.

/// Writes the named [`Backstore`] methods of a store that wraps another
/// (options, latency, encryption) as calls of the same method of its
/// field `$inner`: each wrapper spells out only what it changes, and says
/// by name what it passes through. A method left out gets the trait's
/// default, which is seldom what a wrapper means: name every one it does
/// not write itself. (Defined before the modules, which see it in
/// textual scope.)
macro_rules! delegate {
    ($inner:ident => $($method:ident),+ $(,)?) => { $( delegate!(@ $inner $method); )+ };
    (@ $i:ident block_size) => {
        fn block_size(&self) -> u32 { self.$i.block_size() }
    };
    (@ $i:ident block_count) => {
        fn block_count(&self) -> u64 { self.$i.block_count() }
    };
    (@ $i:ident read_at) => {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.$i.read_at(offset, buf)
        }
    };
    (@ $i:ident write_at) => {
        fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            self.$i.write_at(offset, buf)
        }
    };
    (@ $i:ident lend) => {
        fn lend(
            &self,
            offset: u64,
            len: usize,
        ) -> Option<std::io::Result<Vec<$crate::backstore::Lent>>> {
            self.$i.lend(offset, len)
        }
    };
    (@ $i:ident write_pieces) => {
        fn write_pieces(
            &self,
            offset: u64,
            pieces: &mut [Vec<u8>],
            len: usize,
        ) -> std::io::Result<()> {
            self.$i.write_pieces(offset, pieces, len)
        }
    };
    (@ $i:ident write_pieces_through) => {
        fn write_pieces_through(
            &self,
            offset: u64,
            pieces: &mut [Vec<u8>],
            len: usize,
        ) -> std::io::Result<()> {
            self.$i.write_pieces_through(offset, pieces, len)
        }
    };
    (@ $i:ident flush) => {
        fn flush(&self) -> std::io::Result<()> { self.$i.flush() }
    };
    (@ $i:ident unmap) => {
        fn unmap(&self, offset: u64, len: u64) -> std::io::Result<()> { self.$i.unmap(offset, len) }
    };
    (@ $i:ident unique_id) => {
        fn unique_id(&self) -> u64 { self.$i.unique_id() }
    };
    (@ $i:ident write_through) => {
        fn write_through(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            self.$i.write_through(offset, buf)
        }
    };
    (@ $i:ident is_thin) => {
        fn is_thin(&self) -> bool { self.$i.is_thin() }
    };
    (@ $i:ident may_block) => {
        fn may_block(&self) -> bool { self.$i.may_block() }
    };
    (@ $i:ident async_io) => {
        fn async_io(&self) -> Option<std::sync::Arc<dyn $crate::backstore::AsyncIo>> {
            self.$i.async_io()
        }
    };
    (@ $i:ident unmap_granularity) => {
        fn unmap_granularity(&self) -> u64 { self.$i.unmap_granularity() }
    };
    (@ $i:ident file) => {
        fn file(&self) -> Option<&std::fs::File> { self.$i.file() }
    };
    (@ $i:ident copy_from) => {
        fn copy_from(
            &self,
            src: &dyn $crate::backstore::Backstore,
            src_offset: u64,
            dst_offset: u64,
            len: u64,
        ) -> std::io::Result<()> {
            self.$i.copy_from(src, src_offset, dst_offset, len)
        }
    };
    (@ $i:ident atomic_write_max) => {
        fn atomic_write_max(&self) -> u64 { self.$i.atomic_write_max() }
    };
    (@ $i:ident can_block_erase) => {
        fn can_block_erase(&self) -> bool { self.$i.can_block_erase() }
    };
    (@ $i:ident can_crypto_erase) => {
        fn can_crypto_erase(&self) -> bool { self.$i.can_crypto_erase() }
    };
    (@ $i:ident crypto_erase) => {
        fn crypto_erase(&self) -> std::io::Result<()> { self.$i.crypto_erase() }
    };
    (@ $i:ident lu_options) => {
        fn lu_options(&self) -> $crate::LuOptions { self.$i.lu_options() }
    };
    (@ $i:ident compare_and_write) => {
        fn compare_and_write(
            &self,
            offset: u64,
            expect: &[u8],
            data: &[u8],
            through: bool,
        ) -> Option<std::io::Result<Option<u64>>> {
            self.$i.compare_and_write(offset, expect, data, through)
        }
    };
    (@ $i:ident write_same) => {
        fn write_same(
            &self,
            offset: u64,
            len: u64,
            pattern: &[u8],
            through: bool,
        ) -> Option<std::io::Result<()>> {
            self.$i.write_same(offset, len, pattern, through)
        }
    };
    (@ $i:ident take_capacity_change) => {
        fn take_capacity_change(&self) -> bool { self.$i.take_capacity_change() }
    };
    (@ $i:ident shared_pr) => {
        fn shared_pr(&self) -> Option<std::sync::Arc<dyn $crate::backstore::SharedPrStore>> {
            self.$i.shared_pr()
        }
    };
    (@ $i:ident alua) => {
        fn alua(&self) -> Option<std::sync::Arc<$crate::alua::AluaGroup>> { self.$i.alua() }
    };
    (@ $i:ident allocation_status) => {
        fn allocation_status(
            &self,
            offset: u64,
            max_len: u64,
        ) -> std::io::Result<$crate::backstore::Allocation> {
            self.$i.allocation_status(offset, max_len)
        }
    };
}

mod async_io;
mod block;
mod encrypted;
mod file;
mod options;
mod ram;
mod slow;

use std::fmt;
use std::io;
use std::sync::Arc;

pub use async_io::{AsyncIo, IoFuture, WriteData};
pub use block::{BlockBackstore, MEM_ALIGN};
pub use encrypted::{EncryptedBackstore, KEY_LEN};
pub use file::FileBackstore;
pub use file::copy_file_range_all;
pub use options::WithOptions;
pub use ram::{RAM_CHUNK_SIZE, RamBackstore, RamBackstoreError};
pub use slow::SlowBackstore;

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
    /// [`RAM_CHUNK_SIZE`], so that it lands in its final place as it
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
    /// replaces the key ([`EncryptedBackstore`]).
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
    /// removable, physical block size): [`WithOptions`] sets them, any
    /// other store has none.
    fn lu_options(&self) -> crate::LuOptions {
        crate::LuOptions::DEFAULT
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

    /// The ALUA group of the LU this store is the medium of: a store that
    /// several gateways serve (RBD) hands the LU the shared state its
    /// owner-keeper changes, and the LU then answers with implicit ALUA
    /// (see [`crate::alua`]). Every store that one process alone serves
    /// has none, and its LU reports no target port groups, exactly as
    /// before ALUA existed.
    fn alua(&self) -> Option<std::sync::Arc<crate::alua::AluaGroup>> {
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

/// Why a [`FileBackstore`] or [`BlockBackstore`] could not be opened.
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
pub fn check_block_size(block_size: u32) -> Result<(), BackstoreOpenError> {
    if block_size.is_power_of_two() && (512..=65536).contains(&block_size) {
        Ok(())
    } else {
        Err(BackstoreOpenError::UnsupportedBlockSize(block_size))
    }
}

/// The error of a byte range past the end of a store.
pub fn out_of_range() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "byte range beyond the end of the backstore",
    )
}

/// `Ok` when `[offset, offset + len)` lies within `size` bytes.
pub fn check_range(offset: u64, len: u64, size: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(out_of_range()),
    }
}

/// `Ok` when `pieces` hold at least `len` bytes (a write's length).
pub fn check_pieces(pieces: &[Vec<u8>], len: usize) -> io::Result<()> {
    if pieces.iter().map(Vec::len).sum::<usize>() < len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "fewer bytes in the pieces than the write's length",
        ));
    }
    Ok(())
}

/// Writes the first `len` bytes of the concatenation of `pieces` to `file`
/// at `offset` in vectored writes (`pwritev`), resumed after a short one.
/// Calls `write` with each piece's share of the first `len` bytes of the
/// concatenation of `pieces` and the offset it goes to from `offset`, in
/// order, stopping at the first failure: how a store without a vectored
/// write takes [`Backstore::write_pieces`].
pub(crate) fn for_each_piece(
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

pub(crate) fn write_pieces_at(
    file: &std::fs::File,
    offset: u64,
    pieces: &[Vec<u8>],
    len: usize,
) -> io::Result<()> {
    check_pieces(pieces, len)?;
    let mut slices: Vec<&[u8]> = Vec::with_capacity(pieces.len());
    let mut left = len;
    for piece in pieces {
        let n = piece.len().min(left);
        if n > 0 {
            slices.push(&piece[..n]);
        }
        left -= n;
    }
    let mut at = offset;
    let mut first = 0;
    while first < slices.len() {
        // At most IOV_MAX (1024) slices per call.
        let batch: Vec<io::IoSlice<'_>> = slices[first..]
            .iter()
            .take(1024)
            .map(|s| io::IoSlice::new(s))
            .collect();
        let mut written = match rustix::io::pwritev(file, &batch, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        at += written as u64;
        // Drop the slices written whole, cut the one written in part.
        while let Some(slice) = slices.get_mut(first) {
            if written < slice.len() {
                *slice = &slice[written..];
                break;
            }
            written -= slice.len();
            first += 1;
        }
    }
    Ok(())
}

/// Fills `dst` from the concatenation of `pieces`, starting at byte
/// `from` of it (the caller has checked that enough bytes are there).
pub(crate) fn copy_from_pieces(pieces: &[Vec<u8>], from: usize, dst: &mut [u8]) {
    let mut skip = from;
    let mut done = 0;
    for piece in pieces {
        if done == dst.len() {
            break;
        }
        if skip >= piece.len() {
            skip -= piece.len();
            continue;
        }
        let n = (piece.len() - skip).min(dst.len() - done);
        dst[done..done + n].copy_from_slice(&piece[skip..skip + n]);
        done += n;
        skip = 0;
    }
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

/// Zero-fill granule for stores that cannot deallocate.
const ZERO_CHUNK: usize = 1024 * 1024;

/// Writes zeros over `[offset, offset + len)` through `write`, one bounded
/// chunk at a time (the UNMAP fallback where punching holes is unsupported).
pub(crate) fn write_zeros(
    offset: u64,
    len: u64,
    mut write: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let zeros = vec![0u8; usize::try_from(len).unwrap_or(ZERO_CHUNK).min(ZERO_CHUNK)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeros.len() as u64);
        let chunk = zeros.get(..usize::try_from(n).unwrap_or(0)).unwrap_or(&[]);
        write(offset + done, chunk)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_from_pieces_starts_anywhere() {
        let pieces = vec![vec![1u8, 2, 3], vec![], vec![4, 5], vec![6, 7, 8, 9]];
        let all: Vec<u8> = (1..=9).collect();
        for from in 0..9 {
            for n in 0..=9 - from {
                let mut dst = vec![0u8; n];
                copy_from_pieces(&pieces, from, &mut dst);
                assert_eq!(dst, all[from..from + n], "from {from}, {n} bytes");
            }
        }
    }

    #[test]
    fn write_pieces_at_writes_them_in_order() {
        let file = tempfile::tempfile().unwrap();
        let pieces = vec![vec![1u8; 3000], vec![2; 5000], vec![3; 100]];
        write_pieces_at(&file, 10, &pieces, 8050).unwrap();
        let mut back = vec![0u8; 8060];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 0).unwrap();
        assert!(back[..10].iter().all(|&b| b == 0));
        assert!(back[10..3010].iter().all(|&b| b == 1));
        assert!(back[3010..8010].iter().all(|&b| b == 2));
        assert!(back[8010..8060].iter().all(|&b| b == 3));
        assert_eq!(
            file.metadata().unwrap().len(),
            8060,
            "nothing past the length"
        );
        assert!(write_pieces_at(&file, 0, &pieces, 9000).is_err());
    }
}
