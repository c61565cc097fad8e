//! The calls a gateway group needs beside I/O: the image's managed
//! exclusive lock (who owns the LU), its metadata (the preferred owner),
//! extended attributes of an object in the image's pool (its header:
//! gateways' heartbeats and the owner's port), and whether an object (the
//! header: the image was not removed) exists.
//!
//! The invariants of [`super`] (its header) hold here too: every call is
//! on the handles of an open [`Image`] (invariant 1), synchronous, with
//! buffers and C strings that outlive it (invariant 3), and none registers
//! a callback (invariant 4). Besides:
//! 5. `rbd_lock_get_owners` fills the caller's array of `char *` with
//!    strings librbd allocates; they are read while the array lives and
//!    given back with `rbd_lock_get_owners_cleanup` exactly once, for the
//!    count librbd reported, before the array goes.

use std::ffi::{CStr, c_char, c_int};
use std::io;
use std::ptr;

use super::{Image, check, cstring};

/// `RBD_LOCK_MODE_EXCLUSIVE` (librbd.h `rbd_lock_mode_t`).
const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

/// Most lock owners asked for at once: an exclusive lock has one.
const MAX_OWNERS: usize = 8;

impl Image {
    /// Whether this client holds the image's exclusive lock. librbd asks
    /// the OSD (it asserts the lock on the header), so a client that has
    /// been blocklisted learns it here (`ESHUTDOWN`, Ceph's EBLOCKLISTED).
    pub(crate) fn is_lock_owner(&self) -> io::Result<bool> {
        let mut owner: c_int = 0;
        // SAFETY: invariants 1 and 3 — an open image; `owner` is a valid int to write.
        check(unsafe { self.api.rbd_is_exclusive_lock_owner(self.image, &mut owner) })?;
        Ok(owner != 0)
    }

    /// Takes the exclusive lock. This also puts the image in librbd's
    /// application-managed mode (its StandardPolicy): the lock no longer
    /// moves to a peer that writes; only [`Image::lock_break`] takes it.
    pub(crate) fn lock_acquire(&self) -> io::Result<()> {
        // SAFETY: invariant 1 — an open image; no memory is passed.
        check(unsafe {
            self.api
                .rbd_lock_acquire(self.image, RBD_LOCK_MODE_EXCLUSIVE)
        })?;
        Ok(())
    }

    /// Lets the exclusive lock go (a clean hand-over).
    pub(crate) fn lock_release(&self) -> io::Result<()> {
        // SAFETY: invariant 1 — an open image; no memory is passed.
        check(unsafe { self.api.rbd_lock_release(self.image) })?;
        Ok(())
    }

    /// The holders of the exclusive lock (their client addresses, as
    /// [`Image::lock_break`] takes them); empty when nobody holds it.
    pub(crate) fn lock_owners(&self) -> io::Result<Vec<String>> {
        let mut owners: [*mut c_char; MAX_OWNERS] = [ptr::null_mut(); MAX_OWNERS];
        let mut count = MAX_OWNERS;
        let mut mode: c_int = 0;
        // SAFETY: invariants 1, 3 and 5 — `owners` has room for `count`
        // pointers, `mode` and `count` are valid to write.
        let ret = unsafe {
            self.api
                .rbd_lock_get_owners(self.image, &mut mode, owners.as_mut_ptr(), &mut count)
        };
        if ret == -libc_enoent() {
            return Ok(Vec::new());
        }
        check(ret)?;
        let count = count.min(MAX_OWNERS);
        let names = owners[..count]
            .iter()
            .filter(|p| !p.is_null())
            // SAFETY: invariant 5 — librbd set these to NUL-terminated
            // strings that live until the cleanup below.
            .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .collect();
        // SAFETY: invariant 5 — the strings librbd gave, for its count, once.
        unsafe {
            self.api
                .rbd_lock_get_owners_cleanup(owners.as_mut_ptr(), count)
        };
        Ok(names)
    }

    /// Breaks `owner`'s exclusive lock. librbd first blocklists the
    /// owner's client (`rbd_blocklist_on_break_lock`, on by default), so
    /// a gateway that was only paused cannot write once it resumes.
    pub(crate) fn lock_break(&self, owner: &str) -> io::Result<()> {
        let owner = cstring("lock owner", owner)?;
        // SAFETY: invariants 1 and 3 — an open image; `owner` lives across the call.
        check(unsafe {
            self.api
                .rbd_lock_break(self.image, RBD_LOCK_MODE_EXCLUSIVE, owner.as_ptr())
        })?;
        Ok(())
    }

    /// The image metadata value of `key`; `None` when it is not set.
    pub(crate) fn metadata(&self, key: &str) -> io::Result<Option<String>> {
        let key = cstring("metadata key", key)?;
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: invariants 1 and 3 — `key` lives across the call; `buf`
        // is writable for `len` bytes; librbd writes the needed length
        // into `len` and returns -ERANGE when it is bigger.
        let ret = unsafe {
            self.api
                .rbd_metadata_get(self.image, key.as_ptr(), buf.as_mut_ptr().cast(), &mut len)
        };
        if ret == -libc_enoent() {
            return Ok(None);
        }
        check(ret)?;
        Ok(Some(super::from_buf(&buf)))
    }

    /// Sets extended attribute `name` of object `oid` in the image's pool
    /// (creating the object if need be).
    pub(crate) fn set_xattr(&self, oid: &str, name: &str, value: &[u8]) -> io::Result<()> {
        let oid = cstring("object", oid)?;
        let name = cstring("attribute", name)?;
        // SAFETY: invariants 1 and 3 — a valid ioctx; both strings and
        // `value` (for its length) live across the call.
        check(unsafe {
            self.api.rados_setxattr(
                self.ioctx,
                oid.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
            )
        })?;
        Ok(())
    }

    /// Extended attribute `name` of object `oid` (at most 256 bytes);
    /// `None` when the object or the attribute does not exist.
    pub(crate) fn xattr(&self, oid: &str, name: &str) -> io::Result<Option<Vec<u8>>> {
        let oid = cstring("object", oid)?;
        let name = cstring("attribute", name)?;
        let mut buf = vec![0u8; 256];
        // SAFETY: invariants 1 and 3 — a valid ioctx; both strings live
        // across the call and `buf` is writable for its length.
        let ret = unsafe {
            self.api.rados_getxattr(
                self.ioctx,
                oid.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if ret == -libc_enoent() || ret == -libc_enodata() {
            return Ok(None);
        }
        let n = usize::try_from(check(ret)?).unwrap_or(0);
        buf.truncate(n);
        Ok(Some(buf))
    }

    /// Whether object `oid` exists in the image's pool.
    pub(crate) fn object_exists(&self, oid: &str) -> io::Result<bool> {
        let oid = cstring("object", oid)?;
        let (mut size, mut mtime) = (0u64, 0i64);
        // SAFETY: invariants 1 and 3 — a valid ioctx; `oid` lives across
        // the call; `size` and `mtime` (time_t: 64 bits on the 64-bit
        // Linux librados runs on) are valid to write.
        let ret = unsafe {
            self.api
                .rados_stat(self.ioctx, oid.as_ptr(), &mut size, &mut mtime)
        };
        if ret == -libc_enoent() {
            return Ok(false);
        }
        check(ret)?;
        Ok(true)
    }
}

/// ENOENT (2 on Linux, where librados runs).
const fn libc_enoent() -> c_int {
    2
}

/// ENODATA (61 on Linux): the attribute is not set.
const fn libc_enodata() -> c_int {
    61
}
