//! The snapshots of an RBD LU ([`Snapshots`] for [`RbdBackstore`]): rbd
//! snapshots of its image, so that they live in the cluster as long as the
//! image does and every gateway of the image sees the same ones.
//!
//! - `take` is `rbd_snap_create` on the image the LU writes through.
//!   librbd makes it crash consistent: it blocks the image's new writes,
//!   waits until every write in flight has completed, records the snapshot
//!   and only then lets the held writes go on, with the new snapshot
//!   context. Every write acknowledged before `take` was called is in the
//!   snapshot, none issued after it returned is. (With the image's
//!   exclusive lock, the default, only the lock's owner writes; a gateway
//!   that does not own it has librbd ask the owner to take the snapshot,
//!   which blocks its own writes the same way.)
//! - `open` is the image opened read-only at the snapshot on a RADOS
//!   client of its own (as every LU has, [`crate`]), served as a store of
//!   its own ([`SnapshotStore`]): reads through the same synchronous and
//!   asynchronous paths as the image's, every write refused. It joins no
//!   gateway group, takes no lock, keeps no reservation record and runs no
//!   poll: nothing in a snapshot changes.
//! - `clone_into` makes the image `to` a clone of the snapshot (format 2,
//!   which needs no protection; format 1 on a cluster that refuses it,
//!   protecting the snapshot and noting in the image's metadata that this
//!   gateway did) and opens it as an ordinary [`RbdBackstore`].
//! - `delete` refuses while this gateway serves the snapshot as a LUN or a
//!   clone was made from it (a clone reads what it has not written from
//!   its snapshot), naming them; it unprotects only what it protected.

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use iscsi_scsi::backstore::{
    Allocation, AsyncIo, Backstore, IoFuture, SnapshotError, SnapshotInfo, Snapshots, WriteData,
    check_range, check_snapshot_name,
};
use iscsi_scsi::medium::LuOptions;

use crate::{ALLOCATION_EXTENTS, ALLOCATION_WINDOW, RbdBackstore, RbdSpec, ffi, run_from};

/// The image metadata key under which this gateway notes that it protected
/// snapshot NAME (`PREFIX` + NAME), for a clone of format 1: what
/// `delete` unprotects again, and nothing else.
pub(crate) const PROTECTED_BY_US: &str = "iscsi-rs.protected-for-clone.";

/// `EEXIST`, `ENOENT`, `EBUSY`, `EINVAL`, `ENOSYS` and `EOPNOTSUPP` (Linux).
const EEXIST: i32 = 17;
const ENOENT: i32 = 2;
const EBUSY: i32 = 16;
const EINVAL: i32 = 22;
const ENOSYS: i32 = 38;
const EOPNOTSUPP: i32 = 95;

/// The snapshots of this LU that this gateway serves as LUNs now
/// ([`Snapshots::open`]), by name: `delete` refuses them.
#[derive(Debug, Default)]
pub(crate) struct Served(Mutex<Vec<(String, Weak<SnapshotStore>)>>);

impl Served {
    fn add(&self, name: &str, store: &Arc<SnapshotStore>) {
        let mut served = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        served.retain(|(_, s)| s.strong_count() > 0);
        served.push((name.to_owned(), Arc::downgrade(store)));
    }

    /// How many LUNs serve snapshot `name` now.
    fn serving(&self, name: &str) -> usize {
        let mut served = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        served.retain(|(_, s)| s.strong_count() > 0);
        served.iter().filter(|(n, _)| n == name).count()
    }
}

/// Where `clone_into`'s `to` lies: `IMAGE` (in the origin's pool) or
/// `POOL/IMAGE`. The error says what is wrong with it.
fn clone_target<'a>(to: &'a str, origin_pool: &'a str) -> Result<(&'a str, &'a str), String> {
    let (pool, image) = match to.split_once('/') {
        Some((pool, image)) => (pool, image),
        None => (origin_pool, to),
    };
    let fine = |s: &str| !s.is_empty() && !s.contains(['/', '@', '\0']);
    if fine(pool) && fine(image) {
        Ok((pool, image))
    } else {
        Err(format!(
            "clone target {to:?}: an image name, or POOL/IMAGE, without '@' or a second '/'"
        ))
    }
}

/// The words for the clones made from a snapshot.
fn describe_children(children: &[ffi::snap::Child]) -> String {
    let names: Vec<String> = children
        .iter()
        .map(|c| {
            let ns = if c.namespace.is_empty() {
                String::new()
            } else {
                format!("{}/", c.namespace)
            };
            let trash = if c.trash { " (in the trash)" } else { "" };
            format!("{}/{ns}{}{trash}", c.pool, c.image)
        })
        .collect();
    format!(
        "{} made from it: {} (remove {}, or make {} independent with `rbd flatten`, first)",
        if children.len() == 1 {
            "a clone was"
        } else {
            "clones were"
        },
        names.join(", "),
        if children.len() == 1 { "it" } else { "them" },
        if children.len() == 1 { "it" } else { "them" },
    )
}

/// Whether a failed clone of format 2 means the cluster does not do that
/// format (its OSDs or its settings), so that format 1 is worth a try.
fn refuses_format_2(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(EOPNOTSUPP | ENOSYS | EINVAL))
}

impl RbdBackstore {
    /// The client to run a snapshot operation through; in words when the
    /// image was removed or this gateway's client is fenced.
    pub(crate) fn snap_client(&self) -> Result<Arc<crate::RbdAsync>, SnapshotError> {
        self.client().map_err(|e| {
            let why = if e.kind() == io::ErrorKind::NotFound {
                "the image was removed".to_owned()
            } else {
                format!("the image cannot be reached now: {e}")
            };
            SnapshotError::Io(io::Error::new(
                e.kind(),
                format!("{}: {why}", self.shared.name),
            ))
        })
    }

    /// An error of librbd's on the origin, through the client's fence and
    /// presence checks, in words: "rbd:POOL/IMAGE: DOING: REASON".
    fn snap_error(&self, c: &crate::RbdAsync, doing: &str, e: io::Error) -> SnapshotError {
        let e = c.failed(e);
        SnapshotError::Io(io::Error::new(
            e.kind(),
            format!("{}: {doing}: {e}", self.shared.name),
        ))
    }

    /// The snapshot `name` as a list shows it; `None` when there is none.
    fn snapshot_info(
        &self,
        c: &crate::RbdAsync,
        name: &str,
    ) -> Result<Option<SnapshotInfo>, SnapshotError> {
        let all = c
            .image
            .snap_list()
            .map_err(|e| self.snap_error(c, "listing the snapshots", e))?;
        Ok(all
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| info_of(&c.image, s)))
    }

    /// Makes image `image` in pool `pool` a clone of snapshot `name`:
    /// format 2, else (the cluster refuses it) format 1. An image made
    /// meanwhile by someone else is fine.
    fn make_clone(
        &self,
        c: &crate::RbdAsync,
        name: &str,
        pool: &str,
        image: &str,
    ) -> Result<(), SnapshotError> {
        let doing = format!("cloning snapshot {name:?} into image {pool}/{image}");
        match c.image.clone_snap(&self.spec.image, name, pool, image, 2) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(EEXIST) => Ok(()),
            Err(e) if refuses_format_2(&e) => {
                tracing::info!(
                    "{}: the cluster refuses clones of format 2 ({e}): protecting snapshot \
                     {name:?} for a clone of format 1",
                    self.shared.name
                );
                self.clone_format_1(c, name, pool, image)
                    .map_err(|v1| self.clone_error(c, &doing, name, e, Some(v1)))
            }
            Err(e) => Err(self.clone_error(c, &doing, name, e, None)),
        }
    }

    /// A clone of format 1: the snapshot protected first (noted in the
    /// image's metadata when this gateway did it, so that `delete`
    /// unprotects it again), unprotected again when the clone fails. The
    /// error of the step that failed.
    pub(crate) fn clone_format_1(
        &self,
        c: &crate::RbdAsync,
        name: &str,
        pool: &str,
        image: &str,
    ) -> Result<(), (String, io::Error)> {
        let step = |what: &str| {
            let what = what.to_owned();
            move |e| (what, e)
        };
        let protected = c
            .image
            .snap_is_protected(name)
            .map_err(step("asking whether it is protected"))?;
        let ours = format!("{PROTECTED_BY_US}{name}");
        if !protected {
            c.image
                .snap_protect(name)
                .map_err(step("protecting it for a clone of format 1"))?;
            if let Err(e) = c.image.metadata_set(&ours, "1") {
                let _ = c.image.snap_unprotect(name);
                return Err((
                    "noting in the image's metadata that it was protected".into(),
                    e,
                ));
            }
        }
        match c.image.clone_snap(&self.spec.image, name, pool, image, 1) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(EEXIST) => Ok(()),
            Err(e) => {
                if !protected {
                    let _ = c.image.snap_unprotect(name);
                    let _ = c.image.metadata_remove(&ours);
                }
                Err(("a clone of format 1".into(), e))
            }
        }
    }

    /// The error of a clone that failed (`v2`: the error of format 2;
    /// `v1`: the step of format 1 that failed, if tried); NotFound when the
    /// snapshot is gone.
    fn clone_error(
        &self,
        c: &crate::RbdAsync,
        doing: &str,
        name: &str,
        v2: io::Error,
        v1: Option<(String, io::Error)>,
    ) -> SnapshotError {
        let gone = |e: &io::Error| e.raw_os_error() == Some(ENOENT);
        if (gone(&v2) || v1.as_ref().is_some_and(|(_, e)| gone(e)))
            && !c.image.snap_exists(name).unwrap_or(true)
        {
            return SnapshotError::NotFound(name.to_owned());
        }
        match v1 {
            None => self.snap_error(c, doing, v2),
            Some((step, e)) => self.snap_error(
                c,
                doing,
                io::Error::new(
                    e.kind(),
                    format!("the cluster refuses format 2 ({v2}); {step} failed: {e}"),
                ),
            ),
        }
    }
}

/// A snapshot's entry as [`Snapshots::list`] gives it.
fn info_of(image: &ffi::Image, s: ffi::snap::SnapEntry) -> SnapshotInfo {
    SnapshotInfo {
        taken_unix: image.snap_timestamp(s.id).ok(),
        name: s.name,
        size_bytes: s.size,
        held_bytes: None,
    }
}

impl Snapshots for RbdBackstore {
    fn take(&self, name: &str) -> Result<SnapshotInfo, SnapshotError> {
        check_snapshot_name(name)?;
        let c = self.snap_client()?;
        let doing = format!("taking snapshot {name:?}");
        if c.image
            .snap_exists(name)
            .map_err(|e| self.snap_error(&c, &doing, e))?
        {
            return Err(SnapshotError::Exists(name.to_owned()));
        }
        match c.image.snap_create(name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(EEXIST) => {
                return Err(SnapshotError::Exists(name.to_owned()));
            }
            Err(e) => return Err(self.snap_error(&c, &doing, e)),
        }
        self.snapshot_info(&c, name)?.ok_or_else(|| {
            SnapshotError::Io(io::Error::other(format!(
                "{}: snapshot {name:?} was taken but is not in the image's list of snapshots \
                 (removed at once by someone else?)",
                self.shared.name
            )))
        })
    }

    fn list(&self) -> Result<Vec<SnapshotInfo>, SnapshotError> {
        let c = self.snap_client()?;
        let all = c
            .image
            .snap_list()
            .map_err(|e| self.snap_error(&c, "listing the snapshots", e))?;
        Ok(all.into_iter().map(|s| info_of(&c.image, s)).collect())
    }

    fn delete(&self, name: &str) -> Result<(), SnapshotError> {
        check_snapshot_name(name)?;
        let c = self.snap_client()?;
        let doing = format!("deleting snapshot {name:?}");
        if !c
            .image
            .snap_exists(name)
            .map_err(|e| self.snap_error(&c, &doing, e))?
        {
            return Err(SnapshotError::NotFound(name.to_owned()));
        }
        let in_use = |by: String| SnapshotError::InUse {
            name: name.to_owned(),
            by,
        };
        match self.served.serving(name) {
            0 => {}
            n => {
                return Err(in_use(format!(
                    "this gateway serves it as {} (remove {} first)",
                    if n == 1 { "a LUN" } else { "LUNs" },
                    if n == 1 { "that LUN" } else { "those LUNs" }
                )));
            }
        }
        let children = c
            .image
            .snap_children(&self.spec.image, name)
            .map_err(|e| self.snap_error(&c, &format!("listing the clones of {name:?}"), e))?;
        if !children.is_empty() {
            return Err(in_use(describe_children(&children)));
        }
        let ours = format!("{PROTECTED_BY_US}{name}");
        if c.image
            .snap_is_protected(name)
            .map_err(|e| self.snap_error(&c, &doing, e))?
        {
            let protected_here = c
                .image
                .metadata(&ours)
                .map_err(|e| self.snap_error(&c, &doing, e))?
                .is_some();
            if !protected_here {
                return Err(in_use(format!(
                    "it is protected (`rbd snap protect`), not by this gateway: unprotect it \
                     with `rbd snap unprotect {}/{}@{name}` to delete it",
                    self.spec.pool, self.spec.image
                )));
            }
            c.image
                .snap_unprotect(name)
                .map_err(|e| self.snap_error(&c, &format!("unprotecting {name:?}"), e))?;
        }
        match c.image.snap_remove(name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(ENOENT) => {
                return Err(SnapshotError::NotFound(name.to_owned()));
            }
            Err(e) if e.raw_os_error() == Some(EBUSY) => {
                return Err(in_use(format!(
                    "librbd refuses to remove it now ({e}): it was protected or cloned meanwhile"
                )));
            }
            Err(e) => return Err(self.snap_error(&c, &doing, e)),
        }
        if let Err(e) = c.image.metadata_remove(&ours) {
            tracing::warn!(
                "{}: snapshot {name:?} deleted, but its note {ours:?} stays in the image's \
                 metadata: {e}",
                self.shared.name
            );
        }
        Ok(())
    }

    fn open(&self, name: &str, unique_id: u64) -> Result<Arc<dyn Backstore>, SnapshotError> {
        check_snapshot_name(name)?;
        let c = self.snap_client()?;
        let doing = format!("opening snapshot {name:?}");
        if !c
            .image
            .snap_exists(name)
            .map_err(|e| self.snap_error(&c, &doing, e))?
        {
            return Err(SnapshotError::NotFound(name.to_owned()));
        }
        let title = format!("{}@{name}", self.shared.name);
        let image = self.shared.reconnect.open_at(Some(name)).map_err(|e| {
            match e.error.raw_os_error() {
                Some(ENOENT) if e.step.starts_with("opening snapshot") => {
                    SnapshotError::NotFound(name.to_owned())
                }
                _ => SnapshotError::Io(io::Error::new(
                    e.error.kind(),
                    format!("{title}: {}: {}", e.step, e.error),
                )),
            }
        })?;
        let size = image.size().map_err(|e| {
            SnapshotError::Io(io::Error::new(
                e.kind(),
                format!("{title}: reading the snapshot's size: {e}"),
            ))
        })?;
        let block_size = self.block_size;
        if size == 0 || size % u64::from(block_size) != 0 {
            return Err(SnapshotError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{title}: its size, {size} bytes, is not a whole number of the LU's \
                     {block_size}-byte blocks"
                ),
            )));
        }
        let store = Arc::new(SnapshotStore {
            io: Arc::new(SnapshotIo {
                image: Arc::new(image),
                size,
                title: title.clone(),
            }),
            block_size,
            unique_id,
        });
        self.served.add(name, &store);
        Ok(store)
    }

    fn clone_into(
        &self,
        name: &str,
        to: Option<&str>,
        unique_id: u64,
    ) -> Result<Arc<dyn Backstore>, SnapshotError> {
        check_snapshot_name(name)?;
        let Some(to) = to else {
            return Err(SnapshotError::Unsupported(
                "an RBD clone needs the image to make it in: clone:LUN/NAME,to=IMAGE \
                 (or to=POOL/IMAGE)"
                    .into(),
            ));
        };
        let (pool, image) = clone_target(to, &self.spec.pool)
            .map_err(|why| SnapshotError::Io(io::Error::new(io::ErrorKind::InvalidInput, why)))?;
        let c = self.snap_client()?;
        let exists = c.image.image_exists(pool, image).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                SnapshotError::Io(io::Error::new(
                    e.kind(),
                    format!("{}: no pool {pool:?} to clone into: {e}", self.shared.name),
                ))
            } else {
                self.snap_error(&c, &format!("looking for image {pool}/{image}"), e)
            }
        })?;
        if !exists {
            if !c
                .image
                .snap_exists(name)
                .map_err(|e| self.snap_error(&c, &format!("looking for {name:?}"), e))?
            {
                return Err(SnapshotError::NotFound(name.to_owned()));
            }
            self.make_clone(&c, name, pool, image)?;
            tracing::info!(
                "{}: image {pool}/{image} made a clone of snapshot {name:?}",
                self.shared.name
            );
        }
        let spec = RbdSpec {
            pool: pool.to_owned(),
            image: image.to_owned(),
            ..self.spec.clone()
        };
        let mut store = RbdBackstore::open(&spec, self.block_size).map_err(|e| {
            SnapshotError::Io(io::Error::other(format!(
                "opening the clone rbd:{pool}/{image}: {e}"
            )))
        })?;
        store.unique_id = unique_id;
        Ok(Arc::new(store))
    }
}

/// A snapshot of an RBD image served read-only ([`Snapshots::open`]).
pub(crate) struct SnapshotStore {
    io: Arc<SnapshotIo>,
    block_size: u32,
    unique_id: u64,
}

/// The snapshot's client and its reads ([`AsyncIo`]); every write fails.
struct SnapshotIo {
    image: Arc<ffi::Image>,
    size: u64,
    /// `rbd:POOL/IMAGE@SNAP`, for errors.
    title: String,
}

impl SnapshotIo {
    /// What every write fails with.
    fn read_only(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::ReadOnlyFilesystem,
            format!("{}: a snapshot is read-only", self.title),
        )
    }
}

impl fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotStore")
            .field("snapshot", &self.io.title)
            .field("block_size", &self.block_size)
            .field("size", &self.io.size)
            .finish()
    }
}

impl AsyncIo for SnapshotIo {
    fn read(&self, offset: u64, buf: Vec<u8>) -> IoFuture<(Vec<u8>, io::Result<()>)> {
        if let Err(e) = check_range(offset, buf.len() as u64, self.size) {
            return Box::pin(std::future::ready((buf, Err(e))));
        }
        Box::pin(self.image.aio_read(offset, buf))
    }

    fn write(
        &self,
        _offset: u64,
        _data: Box<dyn WriteData>,
        _len: usize,
        _through: bool,
    ) -> IoFuture<io::Result<()>> {
        Box::pin(std::future::ready(Err(self.read_only())))
    }
}

impl Backstore for SnapshotStore {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.io.size / u64::from(self.block_size)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.io.size)?;
        self.io.image.read(offset, buf)
    }

    fn write_at(&self, _offset: u64, _buf: &[u8]) -> io::Result<()> {
        Err(self.io.read_only())
    }

    fn write_pieces(&self, _offset: u64, _pieces: &mut [Vec<u8>], _len: usize) -> io::Result<()> {
        Err(self.io.read_only())
    }

    /// Nothing is ever written, so nothing waits to be made durable.
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn unmap(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(self.io.read_only())
    }

    fn unique_id(&self) -> u64 {
        self.unique_id
    }

    fn is_thin(&self) -> bool {
        true
    }

    fn async_io(&self) -> Option<Arc<dyn AsyncIo>> {
        Some(Arc::clone(&self.io) as Arc<dyn AsyncIo>)
    }

    /// Read-only: the LU refuses every command that would write with DATA
    /// PROTECT / WRITE PROTECTED before it reaches the store.
    fn lu_options(&self) -> LuOptions {
        LuOptions {
            read_only: true,
            ..LuOptions::DEFAULT
        }
    }

    /// As the image's own ([`RbdBackstore`]): from the extents librbd
    /// reports as holding data in the snapshot.
    fn allocation_status(&self, offset: u64, max_len: u64) -> io::Result<Allocation> {
        if max_len == 0 {
            return Err(iscsi_scsi::backstore::out_of_range());
        }
        check_range(offset, max_len, self.io.size)?;
        let window = max_len.min(ALLOCATION_WINDOW);
        let extents = self
            .io
            .image
            .allocated(offset, window, ALLOCATION_EXTENTS)?;
        Ok(run_from(offset, window, &extents))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_targets_take_the_origins_pool_unless_named() {
        assert_eq!(clone_target("copy", "rbd"), Ok(("rbd", "copy")));
        assert_eq!(clone_target("other/copy", "rbd"), Ok(("other", "copy")));
        for bad in ["", "/copy", "other/", "a/b/c", "img@snap", "other/img@snap"] {
            let e = clone_target(bad, "rbd").unwrap_err();
            assert!(
                e.contains(&format!("{bad:?}")) && e.contains("POOL/IMAGE"),
                "{e}"
            );
        }
    }

    #[test]
    fn clones_are_named_in_words() {
        let child = |pool: &str, ns: &str, image: &str, trash| ffi::snap::Child {
            pool: pool.into(),
            namespace: ns.into(),
            image: image.into(),
            trash,
        };
        assert_eq!(
            describe_children(&[child("rbd", "", "copy", false)]),
            "a clone was made from it: rbd/copy (remove it, or make it independent with \
             `rbd flatten`, first)"
        );
        assert_eq!(
            describe_children(&[child("rbd", "", "a", false), child("ssd", "ns", "b", true)]),
            "clones were made from it: rbd/a, ssd/ns/b (in the trash) (remove them, or make \
             them independent with `rbd flatten`, first)"
        );
    }

    #[test]
    fn only_a_refusal_of_the_format_falls_back_to_format_1() {
        for code in [EOPNOTSUPP, ENOSYS, EINVAL] {
            assert!(refuses_format_2(&io::Error::from_raw_os_error(code)));
        }
        for code in [EEXIST, ENOENT, EBUSY, 13, 110, 108] {
            assert!(!refuses_format_2(&io::Error::from_raw_os_error(code)));
        }
    }

    #[test]
    fn served_snapshots_are_counted_while_they_live() {
        let served = Served::default();
        assert_eq!(served.serving("a"), 0);
        // A store needs a cluster; the registry only holds weak pointers,
        // which a dropped Arc of anything leaves dead: checked with the
        // list itself.
        served.0.lock().unwrap().push(("a".into(), Weak::new()));
        assert_eq!(served.serving("a"), 0, "a dead entry is not served");
        assert!(served.0.lock().unwrap().is_empty(), "and is pruned");
    }
}
