//! The storage engines of one machine: the [`Backstore`]s a LU keeps its
//! blocks in (RAM, a file, a block device) and the wrappers that change
//! what any store reports or does (LU options, latency, encryption).
//!
//! The SCSI semantics and the trait are in `iscsi-scsi`; a store beyond one
//! machine is a room of its own (`iscsi-ceph`). Nothing here knows SCSI
//! beyond the trait: the SCSI layer has range-checked every request in
//! LBAs before it reaches a store, and a store still refuses an
//! out-of-range byte range with an I/O error rather than panicking.
//!
//! | module | owns |
//! |---|---|
//! | `ram/` | [`RamBackstore`]: sparse, 64 KiB chunks allocated on first non-zero write; `chunk.rs` a chunk and its CRC32C, `table.rs` the radix tree of chunk slots, a lock each |
//! | `file.rs` | [`FileBackstore`]: a regular (possibly sparse) file, UNMAP punches holes, EXTENDED COPY by `copy_file_range` |
//! | `block.rs` | [`BlockBackstore`]: a block device (or any file), optionally `O_DIRECT` |
//! | `pieces.rs` | a write's pieces in vectored writes, zeros where a hole cannot be punched |
//! | `slow.rs` | [`SlowBackstore`]: any store behind a fixed latency (a slow device, for tests) |
//! | `encrypted.rs` | [`EncryptedBackstore`]: any store kept encrypted (AES-256-XTS) under a key that SANITIZE CRYPTOGRAPHIC ERASE replaces |
//! | `options.rs` | [`WithOptions`]: any store with LU options (read-only, removable, physical block size) |
//!
//! [`Backstore`]: iscsi_scsi::Backstore

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
    (@ $i:ident resize) => {
        fn resize(
            &self,
            size: Option<u64>,
            discard: bool,
        ) -> Result<u64, iscsi_scsi::backstore::ResizeError> {
            self.$i.resize(size, discard)
        }
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
        ) -> Option<std::io::Result<Vec<iscsi_scsi::backstore::Lent>>> {
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
        fn async_io(&self) -> Option<std::sync::Arc<dyn iscsi_scsi::backstore::AsyncIo>> {
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
            src: &dyn iscsi_scsi::backstore::Backstore,
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
        fn lu_options(&self) -> iscsi_scsi::LuOptions { self.$i.lu_options() }
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
        fn shared_pr(&self) -> Option<std::sync::Arc<dyn iscsi_scsi::backstore::SharedPrStore>> {
            self.$i.shared_pr()
        }
    };
    (@ $i:ident alua) => {
        fn alua(&self) -> Option<std::sync::Arc<iscsi_scsi::alua::AluaGroup>> { self.$i.alua() }
    };
    (@ $i:ident snapshots) => {
        fn snapshots(&self) -> Option<&dyn iscsi_scsi::backstore::Snapshots> {
            self.$i.snapshots()
        }
    };
    (@ $i:ident allocation_status) => {
        fn allocation_status(
            &self,
            offset: u64,
            max_len: u64,
        ) -> std::io::Result<iscsi_scsi::backstore::Allocation> {
            self.$i.allocation_status(offset, max_len)
        }
    };
}

mod block;
mod encrypted;
mod file;
mod options;
mod pieces;
mod ram;
mod slow;
#[cfg(test)]
mod snapshot_moments;

pub use block::{BlockBackstore, MEM_ALIGN};
pub use encrypted::{EncryptedBackstore, KEY_LEN};
pub use file::{FileBackstore, copy_file_range_all};
pub use options::WithOptions;
pub use ram::{RAM_CHUNK_SIZE, RamBackstore, RamBackstoreError};
pub use slow::SlowBackstore;
