//! [`FileBackstore`]: a logical unit stored in a regular file.
//!
//! Reads and writes are positional (`pread`/`pwrite`), so one open file is
//! shared by every session without a lock. A sparse file reads as zeros
//! past its end and in its holes. UNMAP punches holes
//! (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`); on a filesystem that
//! cannot, it writes zeros instead. GET LBA STATUS asks the filesystem
//! with `SEEK_DATA`/`SEEK_HOLE`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use rustix::fs::{FallocateFlags, SeekFrom};
use rustix::io::Errno;

mod snapshots;

use crate::pieces::write_zeros;
use iscsi_scsi::backstore::{
    Allocation, Backstore, BackstoreOpenError, ResizeError, check_block_size, check_range,
    check_size, out_of_range,
};

/// A logical unit backed by a regular file.
#[derive(Debug)]
pub struct FileBackstore {
    file: File,
    path: PathBuf,
    /// Bytes; changed only by [`Backstore::resize`].
    size: AtomicU64,
    block_size: u32,
    unique_id: u64,
    /// Cleared once the filesystem refuses to punch holes.
    punch: AtomicBool,
    /// One resize or snapshot at a time.
    resizing: Mutex<()>,
    /// A snapshot served read-only (opened `O_RDONLY`): every change fails.
    read_only: bool,
}

/// The first non-zero byte of `file` in `[from, end)`, if any: only the
/// extents the filesystem says hold data are read (`SEEK_DATA`), in
/// steps of 1 MiB.
fn first_data(file: &File, from: u64, end: u64) -> io::Result<Option<u64>> {
    let mut pos = from;
    let mut buf = vec![0u8; 1 << 20];
    while pos < end {
        // The fd's position is never used for I/O (see allocation_status).
        let data = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(Errno::NXIO) => return Ok(None),
            Err(_) => pos,
        };
        let hole = rustix::fs::seek(file, SeekFrom::Hole(data)).unwrap_or(end);
        let mut at = data;
        while at < hole.min(end) {
            let n = usize::try_from((hole.min(end) - at).min(buf.len() as u64)).unwrap_or(0);
            let chunk = &mut buf[..n];
            read_full(file, at, chunk)?;
            if let Some(i) = chunk.iter().position(|&b| b != 0) {
                return Ok(Some(at + i as u64));
            }
            at += n as u64;
        }
        pos = hole.max(data + 1);
    }
    Ok(None)
}

/// Reads into `buf` from `offset` until it is full; whatever lies past the
/// end of the file reads as zeros.
pub(crate) fn read_full(file: &File, mut offset: u64, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => {
                buf.fill(0);
                return Ok(());
            }
            Ok(n) => {
                let rest = std::mem::take(&mut buf);
                let n = n.min(rest.len());
                buf = rest.get_mut(n..).unwrap_or_default();
                offset = offset.checked_add(n as u64).ok_or_else(out_of_range)?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`
/// with `copy_file_range` (the kernel moves the bytes, or shares extents on
/// a filesystem that can). `Ok(n)`: the bytes copied, fewer than `len` when
/// the source ended early or the kernel cannot copy between these files
/// (another filesystem, a block device): the caller copies the rest another
/// way.
pub fn copy_file_range_all(
    src: &File,
    src_offset: u64,
    dst: &File,
    dst_offset: u64,
    len: u64,
) -> io::Result<u64> {
    let (mut from, mut to) = (src_offset, dst_offset);
    let mut done = 0u64;
    while done < len {
        let want = usize::try_from(len - done).unwrap_or(usize::MAX);
        match rustix::fs::copy_file_range(src, Some(&mut from), dst, Some(&mut to), want) {
            Ok(0) => break,
            Ok(n) => done += n as u64,
            Err(Errno::INTR) => {}
            Err(Errno::XDEV | Errno::NOSYS | Errno::INVAL | Errno::OPNOTSUPP) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Whether an `fallocate` error means "this file cannot punch holes".
fn punch_unsupported(e: Errno) -> bool {
    matches!(
        e,
        Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL | Errno::NODEV
    )
}

/// Deallocates `len` bytes at `offset` with `fallocate(PUNCH_HOLE |
/// KEEP_SIZE)` while `punch` says the file can: `Ok(true)` when done,
/// `Ok(false)` when the caller must write zeros instead (and, if the file
/// turned out not to support punching, `punch` is cleared for next time).
pub(crate) fn try_punch_hole(
    file: &File,
    punch: &AtomicBool,
    offset: u64,
    len: u64,
) -> io::Result<bool> {
    if !punch.load(Ordering::Relaxed) {
        return Ok(false);
    }
    let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    match rustix::fs::fallocate(file, flags, offset, len) {
        Ok(()) => Ok(true),
        Err(e) if punch_unsupported(e) => {
            punch.store(false, Ordering::Relaxed);
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

impl FileBackstore {
    /// Opens (creating if needed) the file at `path` as a logical unit of
    /// `block_size`-byte blocks (a power of two from 512 to 65536).
    ///
    /// With `size`, the file is extended (sparsely) to `size` bytes when
    /// shorter; a longer file is left alone and only its first `size` bytes
    /// are used. Without `size`, the file must exist and its length is the
    /// LU's size. Either way the size must be a non-zero multiple of the
    /// block size.
    pub fn open(
        path: impl AsRef<Path>,
        size: Option<u64>,
        block_size: u32,
        unique_id: u64,
    ) -> Result<Self, BackstoreOpenError> {
        check_block_size(block_size)?;
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(size.is_some())
            .truncate(false)
            .open(path)?;
        let len = file.metadata()?.len();
        let size = match size {
            Some(size) => {
                if size == 0 || !size.is_multiple_of(u64::from(block_size)) {
                    return Err(BackstoreOpenError::InvalidSize { size, block_size });
                }
                if len < size {
                    file.set_len(size)?;
                }
                size
            }
            None => len,
        };
        Self::serving(file, path, size, block_size, unique_id, false)
    }

    /// Opens the file at `path` read-only, at its length: every write,
    /// UNMAP or resize fails (a snapshot served as a LUN).
    pub fn open_read_only(
        path: impl AsRef<Path>,
        block_size: u32,
        unique_id: u64,
    ) -> Result<Self, BackstoreOpenError> {
        check_block_size(block_size)?;
        let path = path.as_ref();
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        Self::serving(file, path, size, block_size, unique_id, true)
    }

    /// The store of `file` opened at `path`, `size` bytes of it served
    /// (a non-zero multiple of the block size, else refused).
    fn serving(
        file: File,
        path: &Path,
        size: u64,
        block_size: u32,
        unique_id: u64,
        read_only: bool,
    ) -> Result<Self, BackstoreOpenError> {
        if size == 0 || !size.is_multiple_of(u64::from(block_size)) {
            return Err(BackstoreOpenError::InvalidSize { size, block_size });
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
            size: AtomicU64::new(size),
            block_size,
            unique_id,
            punch: AtomicBool::new(!read_only),
            resizing: Mutex::new(()),
            read_only,
        })
    }

    /// The range check of a change: a read-only store takes none.
    fn check_write(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!("{} is a snapshot, served read-only", self.path.display()),
            ));
        }
        check_range(offset, len, self.size())
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// The path the store was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes the filesystem has allocated to the file (`st_blocks * 512`).
    pub fn allocated_bytes(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.metadata()?.blocks().saturating_mul(512))
    }
}

impl Backstore for FileBackstore {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.size() / u64::from(self.block_size)
    }

    /// Growing extends the file (sparsely, zeros) where it is shorter;
    /// `None` takes the file's length now (extended by hand). Shrinking
    /// truncates the file to the new end, so a restart opens it at that
    /// size too; it is refused where a non-zero byte lies beyond the new
    /// end, in the LU or past it in the file (unless `discard`). A write
    /// that checked its range just before the shrink can still extend the
    /// file after the truncation (no lock per write): its bytes lie beyond
    /// the LU's end and a later growth would show them; a shrink of a LUN
    /// initiators still write near its end is the user's to avoid.
    fn resize(&self, size: Option<u64>, discard: bool) -> Result<u64, ResizeError> {
        if self.read_only {
            return Err(ResizeError::Unsupported(
                "a snapshot keeps the size it was taken at".into(),
            ));
        }
        let _one = self.resizing.lock().unwrap_or_else(PoisonError::into_inner);
        let len = self.file.metadata()?.len();
        let size = size.unwrap_or(len);
        check_size(size, self.block_size)?;
        let old = self.size();
        if size >= old {
            if len < size {
                self.file.set_len(size)?;
            }
            self.size.store(size, Ordering::Release);
            return Ok(size);
        }
        if !discard && let Some(at) = first_data(&self.file, size, len)? {
            return Err(ResizeError::DataBeyond { at, size });
        }
        self.size.store(size, Ordering::Release);
        if let Err(e) = self.file.set_len(size) {
            self.size.store(old, Ordering::Release);
            return Err(e.into());
        }
        Ok(size)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        read_full(&self.file, offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check_write(offset, buf.len() as u64)?;
        self.file.write_all_at(buf, offset)
    }

    /// One vectored write of all the pieces.
    fn write_pieces(&self, offset: u64, pieces: &mut [Vec<u8>], len: usize) -> io::Result<()> {
        self.check_write(offset, len as u64)?;
        crate::pieces::write_pieces_at(&self.file, offset, pieces, len)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn file(&self) -> Option<&File> {
        Some(&self.file)
    }

    /// `copy_file_range` from another file store; through memory from
    /// anything else, or for what the kernel would not copy.
    fn copy_from(
        &self,
        src: &dyn Backstore,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> io::Result<()> {
        self.check_write(dst_offset, len)?;
        check_range(src_offset, len, src.size_bytes())?;
        let done = match src.file() {
            Some(f) => copy_file_range_all(f, src_offset, &self.file, dst_offset, len)?,
            None => 0,
        };
        iscsi_scsi::backstore::copy_through_memory(
            src,
            src_offset + done,
            self,
            dst_offset + done,
            len - done,
        )
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_write(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if try_punch_hole(&self.file, &self.punch, offset, len)? {
            return Ok(());
        }
        write_zeros(offset, len, |at, zeros| self.file.write_all_at(zeros, at))
    }

    fn unique_id(&self) -> u64 {
        self.unique_id
    }

    /// Reflinked copies beside the file ([`snapshots`]).
    fn snapshots(&self) -> Option<&dyn iscsi_scsi::backstore::Snapshots> {
        Some(self)
    }

    fn is_thin(&self) -> bool {
        true
    }

    /// Unmapping punches holes (or, where the filesystem cannot, writes
    /// zeros) and `flush` makes that durable: the data is gone from the
    /// LU and from the file. What the filesystem then does with the freed
    /// blocks on its device is beyond the store's reach.
    fn can_block_erase(&self) -> bool {
        true
    }

    fn unmap_granularity(&self) -> u64 {
        // Filesystems punch whole filesystem blocks; 4 KiB is the common one.
        u64::from(self.block_size).max(4096)
    }

    /// `SEEK_DATA`/`SEEK_HOLE` from `offset`; a filesystem that does not
    /// support them reports everything mapped.
    fn allocation_status(&self, offset: u64, max_len: u64) -> io::Result<Allocation> {
        check_range(offset, max_len, self.size())?;
        if max_len == 0 {
            return Err(out_of_range());
        }
        let end = offset + max_len;
        let mapped_all = Allocation {
            mapped: true,
            len: max_len,
        };
        // The fd's file position is never used for I/O (pread/pwrite only),
        // so moving it here races with nothing.
        let data = match rustix::fs::seek(&self.file, SeekFrom::Data(offset)) {
            Ok(d) => d,
            // No data at or after `offset`: a hole to the end.
            Err(Errno::NXIO) => {
                return Ok(Allocation {
                    mapped: false,
                    len: max_len,
                });
            }
            Err(_) => return Ok(mapped_all),
        };
        if data > offset {
            return Ok(Allocation {
                mapped: false,
                len: data.min(end) - offset,
            });
        }
        let hole = match rustix::fs::seek(&self.file, SeekFrom::Hole(offset)) {
            Ok(h) => h,
            Err(_) => return Ok(mapped_all),
        };
        Ok(Allocation {
            mapped: true,
            len: hole.clamp(offset + 1, end) - offset,
        })
    }
}
