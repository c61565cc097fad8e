//! Snapshots of a file store: reflinked copies beside the file.
//!
//! Snapshot `NAME` of `/srv/disk.img` is the file
//! `/srv/disk.img.snapshots/NAME`, made by `FICLONE` (ioctl_ficlone(2)):
//! the file system shares the blocks of both files and copies one only
//! when either is written, so a snapshot costs no copy and lasts across
//! restarts like the LUN's own file. The clone is one step against every
//! write: XFS and btrfs hold the inode lock that a `pwrite` takes too,
//! and write back what the page cache holds first, so every write the
//! target answered before (its bytes in the page cache) is in it, and no
//! write is in it in part. A file system that cannot share blocks (ext4,
//! tmpfs) refuses, and so does the snapshot, in words: a full copy of a
//! large LUN is not a snapshot an operator asked for.
//!
//! A snapshot is made under a hidden name and renamed into place (never
//! over another), so one that failed half-way never shows; a clone the
//! same way into its destination.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};

use rustix::fs::{CWD, RenameFlags};
use rustix::io::Errno;

use super::FileBackstore;
use iscsi_scsi::backstore::{
    Backstore, SnapshotError, SnapshotInfo, Snapshots, check_snapshot_name,
};

/// What follows the LUN's file name in the name of its snapshots' folder.
const FOLDER_SUFFIX: &str = ".snapshots";

impl FileBackstore {
    /// The folder of this file's snapshots: `PATH.snapshots`.
    fn snapshot_folder(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(FOLDER_SUFFIX);
        PathBuf::from(name)
    }

    /// Snapshot `name`'s file, the name checked.
    fn snapshot_path(&self, name: &str) -> Result<PathBuf, SnapshotError> {
        check_snapshot_name(name)?;
        Ok(self.snapshot_folder().join(name))
    }
}

/// Makes `to` a reflinked copy of `from` (at most `len` bytes of it), with
/// `mode`: cloned under a hidden name in `to`'s folder, made durable, and
/// renamed into place unless `to` exists (then [`SnapshotError::Exists`]).
fn reflink(from: &File, to: &Path, len: u64, mode: u32) -> Result<(), SnapshotError> {
    let folder = to.parent().unwrap_or(Path::new("."));
    let file_name = to.file_name().unwrap_or_default().to_string_lossy();
    let hidden = folder.join(format!(".{file_name}.partial-{}", std::process::id()));
    let made = (|| {
        let copy = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&hidden)?;
        rustix::fs::ioctl_ficlone(&copy, from).map_err(|e| refused(e, to))?;
        if copy.metadata()?.len() > len {
            copy.set_len(len)?;
        }
        copy.sync_all()?;
        match rustix::fs::renameat_with(CWD, &hidden, CWD, to, RenameFlags::NOREPLACE) {
            Ok(()) => {}
            Err(Errno::EXIST) => return Err(SnapshotError::Exists(file_name.clone().into())),
            Err(e) => return Err(io::Error::from(e).into()),
        }
        File::open(folder)?.sync_all()?;
        Ok(())
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&hidden);
    }
    made
}

/// What a failed `FICLONE` means: for a file system that cannot share
/// blocks, a refusal that says which can.
fn refused(errno: Errno, to: &Path) -> SnapshotError {
    match errno {
        Errno::OPNOTSUPP | Errno::NOTTY | Errno::INVAL | Errno::XDEV => {
            SnapshotError::Unsupported(format!(
                "the file system of {} cannot share blocks between files (reflink), so a \
                 snapshot there would be a full copy: keep file LUNs to snapshot on XFS \
                 (reflink=1, the default since xfsprogs 5.1) or btrfs",
                to.display()
            ))
        }
        other => SnapshotError::Io(other.into()),
    }
}

fn info(name: String, meta: &std::fs::Metadata) -> SnapshotInfo {
    SnapshotInfo {
        name,
        size_bytes: meta.len(),
        taken_unix: u64::try_from(meta.mtime()).ok(),
        held_bytes: None,
    }
}

impl Snapshots for FileBackstore {
    /// A reflink of the whole file into `PATH.snapshots/NAME`, under the
    /// resize lock (the size recorded is the one cloned).
    fn take(&self, name: &str) -> Result<SnapshotInfo, SnapshotError> {
        let path = self.snapshot_path(name)?;
        if self.read_only {
            return Err(SnapshotError::Unsupported(
                "this LUN serves a snapshot, which never changes: snapshot the LUN it was taken of"
                    .into(),
            ));
        }
        let _one = self.resizing.lock().unwrap_or_else(PoisonError::into_inner);
        if path.exists() {
            return Err(SnapshotError::Exists(name.to_owned()));
        }
        let folder = self.snapshot_folder();
        std::fs::create_dir_all(&folder)
            .map_err(|e| io::Error::new(e.kind(), format!("making {}: {e}", folder.display())))?;
        let mode = self.file.metadata()?.permissions().mode() & 0o777;
        reflink(&self.file, &path, self.size(), mode)?;
        Ok(info(name.to_owned(), &std::fs::metadata(&path)?))
    }

    fn list(&self) -> Result<Vec<SnapshotInfo>, SnapshotError> {
        let entries = match std::fs::read_dir(self.snapshot_folder()) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut list = Vec::new();
        for entry in entries {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let meta = entry.metadata()?;
            // Hidden names are clones under way; anything else is not ours.
            if check_snapshot_name(&name).is_ok() && meta.is_file() {
                list.push(info(name, &meta));
            }
        }
        list.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(list)
    }

    /// Unlinks the snapshot's file: a LUN serving it keeps its open file
    /// until it goes, and a clone shares blocks, not the file.
    fn delete(&self, name: &str) -> Result<(), SnapshotError> {
        match std::fs::remove_file(self.snapshot_path(name)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(SnapshotError::NotFound(name.to_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn open(&self, name: &str, unique_id: u64) -> Result<Arc<dyn Backstore>, SnapshotError> {
        let path = self.snapshot_path(name)?;
        match FileBackstore::open_read_only(&path, self.block_size, unique_id) {
            Ok(store) => Ok(Arc::new(store)),
            Err(iscsi_scsi::BackstoreOpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
                Err(SnapshotError::NotFound(name.to_owned()))
            }
            Err(e) => Err(io::Error::other(e.to_string()).into()),
        }
    }

    /// A reflink of the snapshot to `to`, made when `to` does not exist.
    fn clone_into(
        &self,
        name: &str,
        to: Option<&str>,
        unique_id: u64,
    ) -> Result<Arc<dyn Backstore>, SnapshotError> {
        let Some(to) = to else {
            return Err(SnapshotError::Unsupported(
                "a clone of a file LUN needs a file of its own: clone:LUN/NAME,to=PATH".into(),
            ));
        };
        let snapshot = self.snapshot_path(name)?;
        if !Path::new(to).exists() {
            let from = File::open(&snapshot).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => SnapshotError::NotFound(name.to_owned()),
                _ => e.into(),
            })?;
            let meta = from.metadata()?;
            reflink(
                &from,
                Path::new(to),
                meta.len(),
                meta.permissions().mode() & 0o777,
            )?;
        }
        FileBackstore::open(to, None, self.block_size, unique_id)
            .map(|store| Arc::new(store) as Arc<dyn Backstore>)
            .map_err(|e| io::Error::other(format!("{to}: {e}")).into())
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
