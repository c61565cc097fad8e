//! Snapshots and clones of an [`Image`] (Debian 12: librbd 16.2.15; every
//! function below is in its `rbd/librbd.h`): take, list, remove, protect,
//! the children of one snapshot, and a clone of one into a new image.
//! `crate::snapshots` makes the store's `Snapshots` of them.
//!
//! The invariants of [`super`] (its header) hold here too: every call is
//! on the handles of an open [`Image`] (invariant 1), synchronous, with
//! buffers and C strings that outlive it (invariant 3), and none registers
//! a callback (invariant 4). Besides:
//! - S1. Strings librbd allocates into the caller's array (`rbd_snap_list`'s
//!   names, `rbd_list_children3`'s specs) are copied into Rust memory while
//!   the array lives and given back exactly once, with the function librbd
//!   pairs with the call (`rbd_snap_list_end`,
//!   `rbd_linked_image_spec_list_cleanup`), before the array goes. The
//!   array is zeroed before the call, so an entry librbd did not fill
//!   holds null pointers, which are skipped here and which librbd's
//!   cleanup hands to `free` (which ignores them).
//! - S2. A handle made here besides the image's own (a pool context, the
//!   image opened read-only at a snapshot, an image options object) is put
//!   at once into a guard whose drop releases it exactly once, before the
//!   method that made it returns; it is made from the [`Image`]'s client,
//!   which the `&self` borrow keeps alive until then (an image opened on a
//!   pool context is closed before the context goes: declared after it).
//! - S3. `rbd_snap_list` needs room for one entry more than there are
//!   snapshots (the null-named end) and `rbd_list_children3` room for
//!   every child; each answers -ERANGE with the count it needs written
//!   back, and writes nothing else then. The array is grown to that count
//!   and the call repeated, so librbd never writes past it.

use std::ffi::{CStr, c_char, c_int};
use std::io;
use std::ptr;

use super::sys::{
    Api, RadosIoctxT, RbdImageOptionsT, RbdImageT, RbdLinkedImageSpec, RbdSnapInfo, Timespec,
};
use super::{Image, check, cstring};

/// `RBD_IMAGE_OPTION_CLONE_FORMAT` (librbd.h, the image options' enum).
const RBD_IMAGE_OPTION_CLONE_FORMAT: c_int = 12;

/// `ENOENT` and `ERANGE` (Linux, where librbd runs).
const ENOENT: c_int = 2;
const ERANGE: c_int = 34;

/// How often a list is asked again because it grew between the call that
/// sized the array and the one that filled it.
const LIST_TRIES: usize = 8;

/// One snapshot as `rbd_snap_list` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapEntry {
    /// librbd's id of it (what its timestamp is asked by).
    pub id: u64,
    /// The image's size when it was taken, in bytes.
    pub size: u64,
    pub name: String,
}

/// A clone made from a snapshot, as `rbd_list_children3` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Child {
    pub pool: String,
    /// The pool's namespace ("" for the default one).
    pub namespace: String,
    pub image: String,
    /// Whether the clone lies in the pool's trash (removed, not yet purged).
    pub trash: bool,
}

/// A pool context of the image's client, destroyed on drop (S2).
struct PoolCtx<'a> {
    image: &'a Image,
    ioctx: RadosIoctxT,
}

impl Drop for PoolCtx<'_> {
    fn drop(&mut self) {
        // SAFETY: S2 — created by rados_ioctx_create below, released once, here.
        unsafe { self.image.api.rados_ioctx_destroy(self.ioctx) };
    }
}

/// An image opened read-only besides the [`Image`]'s own, closed on drop
/// (S2).
struct OpenedReadOnly {
    api: &'static Api,
    image: RbdImageT,
}

impl Drop for OpenedReadOnly {
    fn drop(&mut self) {
        // SAFETY: S2 — opened by rbd_open_read_only, closed once, here; no
        // request is in flight on it (only synchronous calls were made).
        unsafe { self.api.rbd_close(self.image) };
    }
}

/// An image options object, destroyed on drop (S2).
struct ImageOptions {
    api: &'static Api,
    opts: RbdImageOptionsT,
}

impl Drop for ImageOptions {
    fn drop(&mut self) {
        // SAFETY: S2 — created by rbd_image_options_create, destroyed once, here.
        unsafe { self.api.rbd_image_options_destroy(self.opts) };
    }
}

/// A string librbd wrote, copied; "" for a null pointer.
///
/// # Safety
/// `p` is null or a NUL-terminated string that lives across the call.
unsafe fn copied(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Image {
    /// Whether the image has a snapshot named `snap`.
    pub(crate) fn snap_exists(&self, snap: &str) -> io::Result<bool> {
        let name = cstring("snapshot", snap)?;
        let mut exists = false;
        // SAFETY: invariants 1 and 3 — `name` lives across the call;
        // `exists` is a valid bool to write.
        check(unsafe {
            self.api
                .rbd_snap_exists(self.image, name.as_ptr(), &mut exists)
        })?;
        Ok(exists)
    }

    /// Takes snapshot `snap` of the image's head. librbd blocks the
    /// image's new writes, waits for those in flight, records the
    /// snapshot and lets the writes go on (`SnapshotCreateRequest`).
    pub(crate) fn snap_create(&self, snap: &str) -> io::Result<()> {
        let name = cstring("snapshot", snap)?;
        // SAFETY: invariants 1 and 3 — an open image; `name` lives across the call.
        check(unsafe { self.api.rbd_snap_create(self.image, name.as_ptr()) }).map(drop)
    }

    /// Every snapshot of the image, in librbd's order (by id: oldest first).
    pub(crate) fn snap_list(&self) -> io::Result<Vec<SnapEntry>> {
        let mut room: c_int = 16;
        for _ in 0..LIST_TRIES {
            let mut array: Vec<RbdSnapInfo> = (0..room.max(1))
                .map(|_| RbdSnapInfo {
                    id: 0,
                    size: 0,
                    name: ptr::null(),
                })
                .collect();
            let mut max = c_int::try_from(array.len()).unwrap_or(c_int::MAX);
            // SAFETY: invariants 1 and 3, S3 — `array` has room for `max`
            // entries and `max` is a valid int to write.
            let n = unsafe {
                self.api
                    .rbd_snap_list(self.image, array.as_mut_ptr(), &mut max)
            };
            if n == -ERANGE {
                room = max.max(room.saturating_mul(2));
                continue;
            }
            let n = usize::try_from(check(n)?).unwrap_or(0).min(array.len());
            let entries = array[..n]
                .iter()
                .filter(|e| !e.name.is_null())
                .map(|e| SnapEntry {
                    id: e.id,
                    size: e.size,
                    // SAFETY: S1 — a name librbd strdup'ed, alive until the
                    // list_end below.
                    name: unsafe { copied(e.name) },
                })
                .collect();
            // SAFETY: S1 — the array librbd filled and ended with a null
            // name (it had room: S3); its names are freed once, here.
            unsafe { self.api.rbd_snap_list_end(array.as_mut_ptr()) };
            return Ok(entries);
        }
        Err(io::Error::other(
            "the image's list of snapshots kept changing while it was read",
        ))
    }

    /// When snapshot `id` was taken, in seconds since the Unix epoch.
    pub(crate) fn snap_timestamp(&self, id: u64) -> io::Result<u64> {
        let mut at = Timespec::default();
        // SAFETY: invariants 1 and 3 — `at` is a valid timespec to write.
        check(unsafe { self.api.rbd_snap_get_timestamp(self.image, id, &mut at) })?;
        Ok(u64::try_from(at.tv_sec).unwrap_or(0))
    }

    /// Removes snapshot `snap` (librbd refuses a protected one: EBUSY).
    pub(crate) fn snap_remove(&self, snap: &str) -> io::Result<()> {
        let name = cstring("snapshot", snap)?;
        // SAFETY: invariants 1 and 3 — `name` lives across the call.
        check(unsafe { self.api.rbd_snap_remove(self.image, name.as_ptr()) }).map(drop)
    }

    /// Protects snapshot `snap` from removal (what a clone of format 1
    /// needs of its parent); EBUSY when it is protected already.
    pub(crate) fn snap_protect(&self, snap: &str) -> io::Result<()> {
        let name = cstring("snapshot", snap)?;
        // SAFETY: invariants 1 and 3 — `name` lives across the call.
        check(unsafe { self.api.rbd_snap_protect(self.image, name.as_ptr()) }).map(drop)
    }

    /// Lets snapshot `snap` be removed again (EBUSY while it has clones).
    pub(crate) fn snap_unprotect(&self, snap: &str) -> io::Result<()> {
        let name = cstring("snapshot", snap)?;
        // SAFETY: invariants 1 and 3 — `name` lives across the call.
        check(unsafe { self.api.rbd_snap_unprotect(self.image, name.as_ptr()) }).map(drop)
    }

    /// Whether snapshot `snap` is protected.
    pub(crate) fn snap_is_protected(&self, snap: &str) -> io::Result<bool> {
        let name = cstring("snapshot", snap)?;
        let mut protected: c_int = 0;
        // SAFETY: invariants 1 and 3 — `name` lives across the call;
        // `protected` is a valid int to write.
        check(unsafe {
            self.api
                .rbd_snap_is_protected(self.image, name.as_ptr(), &mut protected)
        })?;
        Ok(protected != 0)
    }

    /// The clones made from snapshot `snap` of this image, which is named
    /// `image` in its pool (the children of one snapshot are listed on a
    /// handle opened at that snapshot).
    pub(crate) fn snap_children(&self, image: &str, snap: &str) -> io::Result<Vec<Child>> {
        let name = cstring("image", image)?;
        let snap_c = cstring("snapshot", snap)?;
        let mut at: RbdImageT = ptr::null_mut();
        // SAFETY: invariants 1 and 3 — the image's own ioctx; both strings
        // live across the call; `at` receives a handle that the guard
        // below closes (S2).
        check(unsafe {
            self.api
                .rbd_open_read_only(self.ioctx, name.as_ptr(), &mut at, snap_c.as_ptr())
        })?;
        let at = OpenedReadOnly {
            api: self.api,
            image: at,
        };
        let mut room = 8usize;
        for _ in 0..LIST_TRIES {
            let mut array: Vec<RbdLinkedImageSpec> = (0..room.max(1))
                .map(|_| RbdLinkedImageSpec {
                    pool_id: 0,
                    pool_name: ptr::null_mut(),
                    pool_namespace: ptr::null_mut(),
                    image_id: ptr::null_mut(),
                    image_name: ptr::null_mut(),
                    trash: false,
                })
                .collect();
            let mut max = array.len();
            // SAFETY: invariants 1 and 3, S3 — an open handle; `array` has
            // room for `max` entries, `max` is valid to write.
            let r = unsafe {
                self.api
                    .rbd_list_children3(at.image, array.as_mut_ptr(), &mut max)
            };
            if r == -ERANGE {
                room = max.max(room.saturating_mul(2));
                continue;
            }
            check(r)?;
            let n = max.min(array.len());
            let children = array[..n]
                .iter()
                .filter(|c| !c.image_name.is_null() || !c.image_id.is_null())
                .map(|c| {
                    // SAFETY: S1 — each pointer is null or a string librbd
                    // strdup'ed, alive until the cleanup below.
                    unsafe {
                        Child {
                            pool: copied(c.pool_name),
                            namespace: copied(c.pool_namespace),
                            image: if c.image_name.is_null() {
                                copied(c.image_id)
                            } else {
                                copied(c.image_name)
                            },
                            trash: c.trash,
                        }
                    }
                })
                .collect();
            // SAFETY: S1 — the `n` entries librbd filled, freed once, here
            // (null pointers in them are passed to `free`, which ignores them).
            unsafe {
                self.api
                    .rbd_linked_image_spec_list_cleanup(array.as_mut_ptr(), n)
            };
            return Ok(children);
        }
        Err(io::Error::other(
            "the snapshot's list of clones kept changing while it was read",
        ))
    }

    /// A pool context of this client for `pool` (S2).
    fn pool(&self, pool: &str) -> io::Result<PoolCtx<'_>> {
        let name = cstring("pool", pool)?;
        let mut ioctx: RadosIoctxT = ptr::null_mut();
        // SAFETY: invariants 1 and 3 — a connected client; `name` lives
        // across the call; `ioctx` receives the handle, released by the
        // guard (S2).
        check(unsafe {
            self.api
                .rados_ioctx_create(self.cluster, name.as_ptr(), &mut ioctx)
        })?;
        Ok(PoolCtx { image: self, ioctx })
    }

    /// Whether image `image` exists in pool `pool` (NotFound: no such pool).
    pub(crate) fn image_exists(&self, pool: &str, image: &str) -> io::Result<bool> {
        let ctx = self.pool(pool)?;
        let name = cstring("image", image)?;
        let mut opened: RbdImageT = ptr::null_mut();
        // SAFETY: invariants 1 and 3, S2 — a live pool context; `name`
        // lives across the call; a null snapshot name opens the head, and
        // the handle is closed by the guard below.
        let r = unsafe {
            self.api
                .rbd_open_read_only(ctx.ioctx, name.as_ptr(), &mut opened, ptr::null())
        };
        if r == -ENOENT {
            return Ok(false);
        }
        check(r)?;
        drop(OpenedReadOnly {
            api: self.api,
            image: opened,
        });
        Ok(true)
    }

    /// Makes image `child` in pool `pool` a clone of snapshot `snap` of
    /// this image (named `parent` in its pool), of clone format `format`
    /// (2: needs no protection of the snapshot; 1: needs it protected).
    pub(crate) fn clone_snap(
        &self,
        parent: &str,
        snap: &str,
        pool: &str,
        child: &str,
        format: u64,
    ) -> io::Result<()> {
        let parent = cstring("image", parent)?;
        let snap = cstring("snapshot", snap)?;
        let child = cstring("image", child)?;
        let ctx = self.pool(pool)?;
        let mut opts: RbdImageOptionsT = ptr::null_mut();
        // SAFETY: S2 — `opts` receives the object, destroyed by the guard.
        unsafe { self.api.rbd_image_options_create(&mut opts) };
        if opts.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        let opts = ImageOptions {
            api: self.api,
            opts,
        };
        // SAFETY: S2 — a live options object; no memory is passed.
        check(unsafe {
            self.api
                .rbd_image_options_set_uint64(opts.opts, RBD_IMAGE_OPTION_CLONE_FORMAT, format)
        })?;
        // SAFETY: invariants 1 and 3, S2 — the image's own ioctx and a live
        // pool context of the same client; the three strings and the
        // options object live across the (synchronous) call.
        check(unsafe {
            self.api.rbd_clone3(
                self.ioctx,
                parent.as_ptr(),
                snap.as_ptr(),
                ctx.ioctx,
                child.as_ptr(),
                opts.opts,
            )
        })
        .map(drop)
    }

    /// Sets image metadata `key` to `value`.
    pub(crate) fn metadata_set(&self, key: &str, value: &str) -> io::Result<()> {
        let key = cstring("metadata key", key)?;
        let value = cstring("metadata value", value)?;
        // SAFETY: invariants 1 and 3 — both strings live across the call.
        check(unsafe {
            self.api
                .rbd_metadata_set(self.image, key.as_ptr(), value.as_ptr())
        })
        .map(drop)
    }

    /// Removes image metadata `key`; one not set is fine.
    pub(crate) fn metadata_remove(&self, key: &str) -> io::Result<()> {
        let key = cstring("metadata key", key)?;
        // SAFETY: invariants 1 and 3 — `key` lives across the call.
        let r = unsafe { self.api.rbd_metadata_remove(self.image, key.as_ptr()) };
        if r == -ENOENT {
            return Ok(());
        }
        check(r).map(drop)
    }
}
