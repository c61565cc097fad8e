//! The FUSE file system of `iscsi mount`: a root directory with one
//! regular file per LUN, `lun0`, `lun1`, ..., each of its LUN's size.
//!
//! Each request is answered from a task on the tokio runtime, so the one
//! FUSE thread only hands requests over and many reach the target at once
//! (the kernel keeps several reads and writes outstanding). A write is
//! answered only once the target has acknowledged it: nothing the kernel
//! was told is written waits in this process, so a kill of it loses no
//! acknowledged write. There is no write-back cache for the same reason.
//!
//! The files keep their LUN's size, as a block device does: truncating
//! (`dd` without `conv=notrunc` opens with O_TRUNC) changes nothing, and a
//! write past the end is short, or fails with ENOSPC.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use iscsi_initiator::disk::{self, Disk};
use tokio::runtime::Handle;

/// How long the kernel may keep our attributes and names: they never
/// change while mounted.
const TTL: Duration = Duration::from_secs(3600);
/// The largest read or write the kernel sends us (its ceiling for FUSE).
const MAX_IO: u32 = 1 << 20;

/// One LUN's file.
pub struct LunFile {
    /// The file's name, `lun` and the LUN number.
    pub name: String,
    /// The LUN, in bytes.
    pub disk: Arc<Disk>,
    /// Writes refused: the LUN is write protected or `--read-only`.
    pub read_only: bool,
}

/// The mounted file system.
pub struct LunFs {
    files: Vec<LunFile>,
    runtime: Handle,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

impl LunFs {
    /// Files `files`, served from tasks of `runtime`, owned by whoever
    /// mounted them.
    pub fn new(files: Vec<LunFile>, runtime: Handle) -> LunFs {
        LunFs {
            files,
            runtime,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            mounted_at: SystemTime::now(),
        }
    }

    /// The file of inode `ino`: the root is 1, LUN file `i` is `i + 2`.
    fn file(&self, ino: INodeNo) -> Option<&LunFile> {
        let index = u64::from(ino).checked_sub(2)?;
        self.files.get(usize::try_from(index).ok()?)
    }

    fn root_attr(&self) -> FileAttr {
        self.attr(INodeNo::ROOT, FileType::Directory, 0, 0o755, 512)
    }

    fn file_attr(&self, index: usize) -> FileAttr {
        let file = &self.files[index];
        let limits = file.disk.limits();
        let perm = if file.read_only { 0o444 } else { 0o644 };
        // st_blksize, the I/O size programs use for a buffer: the
        // physical block, or the target's optimal transfer when larger.
        let blksize = limits
            .optimal_transfer
            .unwrap_or(0)
            .max(limits.physical_block_size)
            .min(MAX_IO);
        let mut attr = self.attr(
            INodeNo(index as u64 + 2),
            FileType::RegularFile,
            limits.bytes(),
            perm,
            blksize,
        );
        attr.blocks = limits.bytes().div_ceil(512);
        attr
    }

    fn attr(&self, ino: INodeNo, kind: FileType, size: u64, perm: u16, blksize: u32) -> FileAttr {
        FileAttr {
            ino,
            size,
            blocks: 0,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize,
        }
    }

    fn attr_of(&self, ino: INodeNo) -> Option<FileAttr> {
        if ino == INodeNo::ROOT {
            return Some(self.root_attr());
        }
        self.file(ino)?;
        Some(self.file_attr((u64::from(ino) - 2) as usize))
    }
}

/// The FUSE answer for an initiator failure, logged: the program sees an
/// errno, the operator the reason.
fn failed(what: &str, name: &str, offset: u64, error: &iscsi_initiator::Error) -> Errno {
    tracing::warn!(file = name, offset, "{what}: {error}");
    Errno::from_i32(disk::errno(error))
}

impl Filesystem for LunFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Larger requests than the kernel's 128 KiB default: one SCSI
        // command each, up to the LUNs' smallest maximum transfer.
        let largest = self
            .files
            .iter()
            .map(|f| f.disk.limits().max_transfer)
            .min()
            .unwrap_or(MAX_IO)
            .min(MAX_IO);
        // FUSE_ASYNC_DIO: an asynchronous direct request (libaio, io_uring)
        // is passed on as it comes, not waited for one after the other.
        let _ = config.add_capabilities(InitFlags::FUSE_MAX_PAGES | InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_write(largest);
        let _ = config.set_max_readahead(largest);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        match self.files.iter().position(|f| OsStr::new(&f.name) == name) {
            Some(index) => reply.entry(&TTL, &self.file_attr(index), fuser::Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// The files' size, mode and times are the LUN's: a change is accepted
    /// and ignored (see the module doc), so `dd` and `cp` work as on a
    /// block device.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.attr_of(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(file) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let wants_write = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
        if wants_write && file.read_only {
            return reply.error(Errno::EROFS);
        }
        // O_DIRECT bypasses the page cache here too: each request reaches
        // the target as it was made (what fio --direct=1 measures), and
        // direct writes go in parallel (the kernel otherwise holds the
        // file's lock for each: one write at a time, whatever the depth).
        let open_flags = if flags.0 & libc::O_DIRECT != 0 {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(0), open_flags);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let end = offset
            .saturating_add(u64::from(size))
            .min(file.disk.limits().bytes());
        if offset >= end {
            return reply.data(&[]);
        }
        let disk = Arc::clone(&file.disk);
        let name = file.name.clone();
        self.runtime.spawn(async move {
            match disk.read(offset, (end - offset) as usize).await {
                Ok(data) => reply.data(&data),
                Err(error) => reply.error(failed("read", &name, offset, &error)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(file) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if file.read_only {
            return reply.error(Errno::EROFS);
        }
        let size = file.disk.limits().bytes();
        let fits = size.saturating_sub(offset).min(data.len() as u64) as usize;
        if fits == 0 && !data.is_empty() {
            return reply.error(Errno::ENOSPC);
        }
        // O_SYNC and O_DSYNC: acknowledged means durable, so FUA.
        let fua = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let disk = Arc::clone(&file.disk);
        let name = file.name.clone();
        let data = data[..fits].to_vec();
        self.runtime.spawn(async move {
            match disk.write(offset, &data, fua).await {
                Ok(()) => reply.written(data.len() as u32),
                Err(error) => reply.error(failed("write", &name, offset, &error)),
            }
        });
    }

    /// A close: every write was acknowledged by the target already, and
    /// close(2) promises no durability, so nothing to do.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// fsync and fdatasync: SYNCHRONIZE CACHE.
    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(file) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let disk = Arc::clone(&file.disk);
        let name = file.name.clone();
        self.runtime.spawn(async move {
            match disk.flush().await {
                Ok(()) => reply.ok(),
                Err(error) => reply.error(failed("fsync", &name, 0, &error)),
            }
        });
    }

    /// Hole punching (PUNCH_HOLE with KEEP_SIZE) unmaps where the LUN reads
    /// unmapped blocks as zeros, else writes zeros; ZERO_RANGE writes zeros
    /// (WRITE SAME); plain allocation inside the file is already done.
    /// Nothing may grow the file.
    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let Some(file) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if file.read_only {
            return reply.error(Errno::EROFS);
        }
        let size = file.disk.limits().bytes();
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let end = offset.saturating_add(length);
        let zero = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let may_unmap = match zero {
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => true,
            libc::FALLOC_FL_ZERO_RANGE => false,
            0 => {
                return if end <= size || keep_size {
                    reply.ok()
                } else {
                    reply.error(Errno::ENOSPC)
                };
            }
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        if end > size && !keep_size {
            return reply.error(Errno::ENOSPC);
        }
        let end = end.min(size);
        if offset >= end {
            return reply.ok();
        }
        let disk = Arc::clone(&file.disk);
        let name = file.name.clone();
        self.runtime.spawn(async move {
            match disk.write_zeroes(offset, end - offset, may_unmap).await {
                Ok(()) => reply.ok(),
                Err(error) => reply.error(failed("fallocate", &name, offset, &error)),
            }
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == INodeNo::ROOT {
            reply.opened(FileHandle(0), FopenFlags::empty());
        } else {
            reply.error(Errno::ENOTDIR);
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
        ]
        .into_iter()
        .chain(self.files.iter().enumerate().map(|(i, f)| {
            (
                INodeNo(i as u64 + 2),
                FileType::RegularFile,
                f.name.as_str(),
            )
        }));
        for (i, (ino, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(ino, i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bytes: u64 = self.files.iter().map(|f| f.disk.limits().bytes()).sum();
        let files = self.files.len() as u64 + 1;
        reply.statfs(bytes.div_ceil(512), 0, 0, files, 0, 512, 255, 512);
    }
}
