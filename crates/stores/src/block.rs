//! [`BlockBackstore`]: a logical unit on a block device (a regular file
//! works too).
//!
//! The size comes from `lseek(SEEK_END)`, the logical block size from the
//! `BLKSSZGET` ioctl (512 for a regular file). With `direct`, the device is
//! opened `O_DIRECT` and every transfer goes through a bounce buffer aligned
//! in memory (to [`MEM_ALIGN`]), on disk and in length (to the logical block
//! size);
//! unaligned byte ranges are widened (reads) or read-modify-written
//! (writes, serialised by a lock). UNMAP uses
//! `fallocate(PUNCH_HOLE | KEEP_SIZE)`, which the kernel turns into a discard
//! or zero-out on block devices, and falls back to writing zeros.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use rustix::fs::OFlags;

use crate::file::{read_full, try_punch_hole};
use crate::pieces::write_zeros;
use iscsi_scsi::backstore::{
    Backstore, BackstoreOpenError, ResizeError, check_block_size, check_range, check_size,
    out_of_range,
};

/// Memory alignment of `O_DIRECT` bounce buffers (a page; at least any
/// logical block size in use up to 4096).
pub const MEM_ALIGN: usize = 4096;

/// Largest bounce buffer one `O_DIRECT` transfer step uses.
const BOUNCE_MAX: u64 = 1024 * 1024;

/// A logical unit on a block device.
#[derive(Debug)]
pub struct BlockBackstore {
    file: File,
    path: PathBuf,
    /// Bytes: the device's length when opened or last resized.
    size: AtomicU64,
    block_size: u32,
    unique_id: u64,
    direct: bool,
    punch: AtomicBool,
    /// Serialises read-modify-write of partial blocks in `direct` mode.
    rmw: Mutex<()>,
}

/// A zeroed buffer of `len` bytes whose start is aligned to `align` (a power
/// of two), carved out of an over-allocated `Vec` without `unsafe`.
struct Aligned {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize, align: usize) -> Self {
        let storage = vec![0u8; len.saturating_add(align)];
        let addr = storage.as_ptr() as usize;
        let start = addr.wrapping_neg() & (align.max(1) - 1);
        Self {
            storage,
            start,
            len,
        }
    }

    fn as_slice(&self) -> &[u8] {
        self.storage
            .get(self.start..self.start + self.len)
            .unwrap_or_default()
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        self.storage
            .get_mut(self.start..self.start + self.len)
            .unwrap_or_default()
    }
}

impl BlockBackstore {
    /// Opens the block device (or regular file) at `path` read-write. The
    /// size is its length; the block size is the device's logical block size
    /// (`BLKSSZGET`) or 512 for a regular file. `direct` bypasses the page
    /// cache (`O_DIRECT`).
    pub fn open(
        path: impl AsRef<Path>,
        direct: bool,
        unique_id: u64,
    ) -> Result<Self, BackstoreOpenError> {
        let path = path.as_ref();
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if direct {
            options.custom_flags(OFlags::DIRECT.bits() as i32);
        }
        let mut file = options.open(path)?;
        let is_block = file.metadata()?.file_type().is_block_device();
        let block_size = if is_block {
            rustix::fs::ioctl_blksszget(&file).map_err(io::Error::from)?
        } else {
            512
        };
        check_block_size(block_size)?;
        let size = file.seek(SeekFrom::End(0))?;
        if size == 0 || !size.is_multiple_of(u64::from(block_size)) {
            return Err(BackstoreOpenError::InvalidSize { size, block_size });
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
            size: AtomicU64::new(size),
            block_size,
            unique_id,
            direct,
            punch: AtomicBool::new(true),
            rmw: Mutex::new(()),
        })
    }

    /// The path the store was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Whether the store was opened `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Offset and length alignment of `O_DIRECT` transfers: the logical
    /// block size. (Memory is aligned to [`MEM_ALIGN`].)
    pub fn alignment(&self) -> u64 {
        u64::from(self.block_size)
    }

    /// The aligned range `[start, end)` covering `[offset, offset + len)`,
    /// clipped to the device (whose size is a multiple of the block size).
    fn widen(&self, offset: u64, len: u64) -> (u64, u64) {
        let a = self.alignment();
        let start = offset / a * a;
        let end = offset.saturating_add(len).div_ceil(a).saturating_mul(a);
        (start, end.min(self.size()))
    }

    /// `O_DIRECT` read of `[offset, offset + buf.len())` in aligned steps.
    fn direct_read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let want = ((buf.len() - done) as u64).min(BOUNCE_MAX);
            let (start, end) = self.widen(pos, want);
            let span = usize::try_from(end - start).map_err(|_| out_of_range())?;
            let mut bounce = Aligned::new(span, MEM_ALIGN.max(self.block_size as usize));
            read_full(&self.file, start, bounce.as_mut_slice())?;
            let skip = usize::try_from(pos - start).map_err(|_| out_of_range())?;
            let n = usize::try_from(want).unwrap_or(0);
            let src = bounce
                .as_slice()
                .get(skip..skip + n)
                .ok_or_else(out_of_range)?;
            let dst = buf.get_mut(done..done + n).ok_or_else(out_of_range)?;
            dst.copy_from_slice(src);
            done += n;
        }
        Ok(())
    }

    /// `O_DIRECT` write in aligned steps; partial blocks at either end are
    /// read first (under the read-modify-write lock).
    fn direct_write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.direct_write_from(offset, buf.len(), |from, dst| {
            dst.copy_from_slice(&buf[from..from + dst.len()]);
        })
    }

    /// An `O_DIRECT` write of `len` bytes at `offset`, each aligned bounce
    /// buffer filled by `fill(from, dst)` with the `dst.len()` source bytes
    /// from byte `from` on.
    fn direct_write_from(
        &self,
        offset: u64,
        len: usize,
        fill: impl Fn(usize, &mut [u8]),
    ) -> io::Result<()> {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let want = ((len - done) as u64).min(BOUNCE_MAX);
            let (start, end) = self.widen(pos, want);
            let span = usize::try_from(end - start).map_err(|_| out_of_range())?;
            let mut bounce = Aligned::new(span, MEM_ALIGN.max(self.block_size as usize));
            let partial = start != pos || end != pos + want;
            let _guard = partial.then(|| self.rmw.lock().unwrap_or_else(PoisonError::into_inner));
            if partial {
                read_full(&self.file, start, bounce.as_mut_slice())?;
            }
            let skip = usize::try_from(pos - start).map_err(|_| out_of_range())?;
            let n = usize::try_from(want).unwrap_or(0);
            fill(
                done,
                bounce
                    .as_mut_slice()
                    .get_mut(skip..skip + n)
                    .ok_or_else(out_of_range)?,
            );
            self.file.write_all_at(bounce.as_slice(), start)?;
            done += n;
        }
        Ok(())
    }
}

impl Backstore for BlockBackstore {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.size() / u64::from(self.block_size)
    }

    /// The LU is the whole device: its size is read again (grown by its
    /// owner: `lvextend`, a new partition table, a larger loop file). A
    /// size given must be the device's; data beyond a device that shrank
    /// is gone already, so `discard` changes nothing here.
    fn resize(&self, size: Option<u64>, discard: bool) -> Result<u64, ResizeError> {
        let _ = discard;
        let device = (&self.file).seek(SeekFrom::End(0))?;
        check_size(device, self.block_size)?;
        if let Some(size) = size
            && size != device
        {
            return Err(ResizeError::Unsupported(format!(
                "a block LUN is its whole device, {device} bytes now: resize the device \
                 ({}), then resize the LUN without a size",
                self.path.display()
            )));
        }
        self.size.store(device, Ordering::Release);
        Ok(device)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        if self.direct {
            self.direct_read(offset, buf)
        } else {
            read_full(&self.file, offset, buf)
        }
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        if self.direct {
            self.direct_write(offset, buf)
        } else {
            self.file.write_all_at(buf, offset)
        }
    }

    /// Buffered: one vectored write; `O_DIRECT`: the pieces gathered into
    /// the aligned bounce buffers a flat write uses (no more copies).
    fn write_pieces(&self, offset: u64, pieces: &mut [Vec<u8>], len: usize) -> io::Result<()> {
        check_range(offset, len as u64, self.size())?;
        if !self.direct {
            return crate::pieces::write_pieces_at(&self.file, offset, pieces, len);
        }
        iscsi_scsi::backstore::check_pieces(pieces, len)?;
        let pieces = &*pieces;
        self.direct_write_from(offset, len, |from, dst| {
            crate::pieces::copy_from_pieces(pieces, from, dst);
        })
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, len, self.size())?;
        if len == 0 {
            return Ok(());
        }
        let bs = u64::from(self.block_size);
        let aligned = offset.is_multiple_of(bs) && len.is_multiple_of(bs);
        if aligned && try_punch_hole(&self.file, &self.punch, offset, len)? {
            return Ok(());
        }
        write_zeros(offset, len, |at, zeros| self.write_at(at, zeros))
    }

    fn unique_id(&self) -> u64 {
        self.unique_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_aligned() {
        for align in [512usize, 4096] {
            for len in [0usize, 1, 4096, 10000] {
                let mut a = Aligned::new(len, align);
                assert_eq!(a.as_slice().len(), len);
                assert_eq!(a.as_mut_slice().as_ptr() as usize % align, 0);
            }
        }
    }
}
