//! The only place this crate calls librados and librbd (Debian 12: Ceph
//! 16.2.15, `LIBRBD_VER` 1.16.0, `LIBRADOS_VER` 3.0.0). No maintained crate
//! wraps librbd (crates.io's `librbd-sys` 0.1.0 dates from 2016 and has no
//! AIO completions we could trust), so the few functions used are declared
//! by hand from `rbd/librbd.h` and `rados/librados.h`, once, in `sys.rs`,
//! which loads the libraries when the first image opens (not linked: the
//! default build needs no Ceph; the invariants of that loading, L1 to L3,
//! are in its header). Every call goes through the `sys::Api` an
//! [`Image`] holds, which exists only once the libraries are loaded.
//!
//! Invariants every `unsafe` block below relies on:
//! 1. A [`Image`] owns exactly one RADOS client (`rados_t`), one pool
//!    context (`rados_ioctx_t`) and one open image (`rbd_image_t`), created
//!    in that order by [`Image::open`] and released in the reverse order by
//!    its `Drop`, once: none is ever null while the `Image` lives, and none
//!    is reachable from outside this module, so nothing can close one twice
//!    or use one after its release.
//! 2. librados and librbd are thread safe for the calls used here once the
//!    client is connected and the image open (Ceph's C API documents the
//!    `rados_t`/`rbd_image_t` handles as usable from many threads; tcmu-runner
//!    and QEMU issue I/O on one image from several threads): hence `Send` and
//!    `Sync` for [`Image`]. Configuration (`rados_conf_*`) happens only
//!    before `rados_connect`, inside [`Image::open`], on one thread.
//! 3. Every pointer handed to C points into memory that outlives the call
//!    (these calls are synchronous; librbd copies or finishes with the
//!    buffer before returning) and every length passed is the length of
//!    that memory: buffers are Rust slices, strings are `CString`s kept in
//!    a local until the call returns.
//! 4. No Rust code runs on librbd's threads: the one callback handed to
//!    librbd (`rbd_diff_iterate2`'s, in `offload.rs`) runs on the calling
//!    thread (`offload.rs`, invariant 5); the watch callbacks of [`rados`]
//!    keep to invariant 7 there; asynchronous requests complete through an
//!    eventfd, with no callback (`aio.rs`, invariants 6 to 8; the table of
//!    requests in flight in `aio_table.rs`); nothing else is registered.
//!
//! `lock.rs` holds the calls of a gateway group (the exclusive lock, image
//! metadata, extended attributes), with one invariant of its own; `snap.rs`
//! those of snapshots and clones, with invariants S1 to S3 of its own.
//!
//! Errors are negative errno values, turned into [`io::Error`]s with
//! [`io::Error::from_raw_os_error`] so that the caller can match on the kind
//! (`NotFound` for a missing pool or image, `TimedOut` for an unreachable
//! cluster, `PermissionDenied` for a bad key).

mod aio;
mod aio_table;
mod lock;
pub(super) mod offload;
pub(super) mod rados;
pub(super) mod snap;
mod sys;

pub(super) use sys::api as load;

use std::ffi::{CStr, CString, c_int};
use std::io;
use std::ptr;

use sys::{Api, RadosIoctxT, RadosT, RbdImageT, check};

/// `LIBRADOS_OP_FLAG_FADVISE_FUA` (librados.h): the write is durable when
/// it completes, whatever caching the client has.
pub(super) const OP_FLAG_FADVISE_FUA: c_int = 0x80;

/// Where to connect and what to open ([`Image::open`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Target<'a> {
    /// A ceph.conf (its `mon host` and `keyring`); `None`: librados's
    /// default search (`$CEPH_CONF`, /etc/ceph/ceph.conf, ...).
    pub conf: Option<&'a str>,
    /// The cephx user without `client.` (`None`: `admin`).
    pub id: Option<&'a str>,
    /// The pool.
    pub pool: &'a str,
    /// The image.
    pub image: &'a str,
    /// A snapshot of the image to open instead of its head, read-only
    /// (`rbd_open_read_only`); `None`: the head, writable.
    pub snap: Option<&'a str>,
    /// Options set on this client after the conf file, before connecting.
    pub options: &'a [(&'a str, &'a str)],
}

/// Which step of [`Image::open`] failed, with librados's errno.
#[derive(Debug)]
pub(super) struct OpenError {
    /// What was being done ("connecting to the monitors 127.0.0.1:3300").
    pub step: String,
    /// The error librados or librbd returned.
    pub error: io::Error,
}

/// One open RBD image on a RADOS client of its own (invariant 1).
#[derive(Debug)]
pub(super) struct Image {
    /// librbd's and librados's functions (`sys.rs`): an `Image` exists
    /// only once they are loaded.
    api: &'static Api,
    cluster: RadosT,
    ioctx: RadosIoctxT,
    image: RbdImageT,
    /// The eventfd librbd signals completions on, and the requests in
    /// flight (`aio.rs`).
    aio: aio_table::Aio,
}

// SAFETY: invariant 2 — the handles are used from many threads only after
// `open` returned, for calls librados/librbd make thread safe.
unsafe impl Send for Image {}
// SAFETY: as for `Send`: every method takes `&self` and only issues
// thread-safe librbd I/O calls on the handles.
unsafe impl Sync for Image {}

fn cstring(what: &str, text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {text:?} holds a NUL byte"),
        )
    })
}

/// Reads a NUL-terminated string that C wrote into `buf`.
fn from_buf(buf: &[u8]) -> String {
    CStr::from_bytes_until_nul(buf)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A half-built [`Image`]: what [`Image::open`] has created so far,
/// released on an early return (reverse order, invariant 1).
struct Partial {
    api: &'static Api,
    cluster: RadosT,
    ioctx: RadosIoctxT,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.ioctx.is_null() {
            // SAFETY: invariant 1 — created by rados_ioctx_create, released once, here.
            unsafe { self.api.rados_ioctx_destroy(self.ioctx) };
        }
        if !self.cluster.is_null() {
            // SAFETY: invariant 1 — created by rados_create, released once, here (after its ioctx).
            unsafe { self.api.rados_shutdown(self.cluster) };
        }
    }
}

impl Partial {
    /// `rados_conf_get(option)` as a string ("" when it fails).
    fn conf_get(&self, option: &str) -> String {
        let Ok(name) = CString::new(option) else {
            return String::new();
        };
        let mut buf = vec![0u8; 1024];
        // SAFETY: invariant 3 — `name` lives across the call, `buf` is
        // writable for its length; librados NUL-terminates within it.
        let ret = unsafe {
            self.api.rados_conf_get(
                self.cluster,
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if ret < 0 {
            return String::new();
        }
        from_buf(&buf)
    }
}

impl Image {
    /// Creates a RADOS client, reads the conf, sets `options`, connects,
    /// opens the pool and then the image. The error says which step failed.
    pub(super) fn open(target: Target<'_>) -> Result<Image, OpenError> {
        let fail = |step: String| move |error: io::Error| OpenError { step, error };
        let id = target
            .id
            .map(|id| cstring("user", id))
            .transpose()
            .map_err(fail("naming the user".into()))?;
        let api = sys::api().map_err(fail("loading librbd".into()))?;
        let mut partial = Partial {
            api,
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
        };
        // SAFETY: invariant 3 — `id` (or null: the default user) lives across
        // the call; `partial.cluster` receives the handle, released by `Partial`.
        check(unsafe {
            api.rados_create(
                &mut partial.cluster,
                id.as_ref().map_or(ptr::null(), |id| id.as_ptr()),
            )
        })
        .map_err(fail("creating a RADOS client".into()))?;
        let conf = target
            .conf
            .map(|conf| cstring("conf", conf))
            .transpose()
            .map_err(fail("reading the conf".into()))?;
        // SAFETY: invariants 2 and 3 — not connected yet; `conf` (or null:
        // the default search path) lives across the call.
        check(unsafe {
            api.rados_conf_read_file(
                partial.cluster,
                conf.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            )
        })
        .map_err(fail(format!(
            "reading {}",
            target.conf.unwrap_or("the default ceph.conf")
        )))?;
        for (option, value) in target.options {
            let name = cstring("option", option).map_err(fail("setting options".into()))?;
            let value_c = cstring("value", value).map_err(fail("setting options".into()))?;
            // SAFETY: invariants 2 and 3 — not connected yet; both strings live across the call.
            check(unsafe { api.rados_conf_set(partial.cluster, name.as_ptr(), value_c.as_ptr()) })
                .map_err(fail(format!("setting {option}={value}")))?;
        }
        // SAFETY: invariant 1 — a created, configured, not yet connected client.
        check(unsafe { api.rados_connect(partial.cluster) }).map_err(|error| OpenError {
            step: format!(
                "connecting as client.{} to the monitors {}",
                target.id.unwrap_or("admin"),
                partial.conf_get("mon_host")
            ),
            error,
        })?;
        let pool = cstring("pool", target.pool).map_err(fail("naming the pool".into()))?;
        // SAFETY: invariants 1 and 3 — a connected client; `pool` lives
        // across the call; `partial.ioctx` receives the handle, released by `Partial`.
        check(unsafe {
            api.rados_ioctx_create(partial.cluster, pool.as_ptr(), &mut partial.ioctx)
        })
        .map_err(fail(format!("opening pool {:?}", target.pool)))?;
        let name = cstring("image", target.image).map_err(fail("naming the image".into()))?;
        let mut image: RbdImageT = ptr::null_mut();
        match target.snap {
            // SAFETY: invariants 1 and 3 — a valid ioctx; `name` lives across
            // the call; a null snapshot name opens the image's head.
            None => check(unsafe {
                api.rbd_open(partial.ioctx, name.as_ptr(), &mut image, ptr::null())
            })
            .map_err(fail(format!(
                "opening image {:?} in pool {:?}",
                target.image, target.pool
            )))?,
            Some(snap) => {
                let snap_c =
                    cstring("snapshot", snap).map_err(fail("naming the snapshot".into()))?;
                // SAFETY: invariants 1 and 3 — a valid ioctx; `name` and
                // `snap_c` live across the call.
                check(unsafe {
                    api.rbd_open_read_only(
                        partial.ioctx,
                        name.as_ptr(),
                        &mut image,
                        snap_c.as_ptr(),
                    )
                })
                .map_err(fail(format!(
                    "opening snapshot {snap:?} of image {:?} in pool {:?}",
                    target.image, target.pool
                )))?
            }
        };
        let aio = match aio_table::Aio::register(api, image) {
            Ok(aio) => aio,
            Err(error) => {
                // SAFETY: invariant 1 — opened just above, closed once, here.
                unsafe { api.rbd_close(image) };
                return Err(OpenError {
                    step: "setting the image's event notification".into(),
                    error,
                });
            }
        };
        let built = Image {
            api,
            cluster: partial.cluster,
            ioctx: partial.ioctx,
            image,
            aio,
        };
        // The handles now belong to `built` (its Drop releases them).
        std::mem::forget(partial);
        Ok(built)
    }

    /// The image's size in bytes.
    pub(super) fn size(&self) -> io::Result<u64> {
        let mut size = 0u64;
        // SAFETY: invariants 1 and 3 — an open image; `size` is a valid u64 to write.
        check(unsafe { self.api.rbd_get_size(self.image, &mut size) })?;
        Ok(size)
    }

    /// The image's id (stable for the image's life, unlike its name).
    pub(super) fn id(&self) -> io::Result<String> {
        let mut buf = vec![0u8; 64];
        // SAFETY: invariants 1 and 3 — `buf` is writable for its length;
        // librbd NUL-terminates the id within it or returns -ERANGE.
        check(unsafe {
            self.api
                .rbd_get_id(self.image, buf.as_mut_ptr().cast(), buf.len())
        })?;
        Ok(from_buf(&buf))
    }

    /// The cluster's fsid.
    pub(super) fn fsid(&self) -> io::Result<String> {
        let mut buf = vec![0u8; 64];
        // SAFETY: invariants 1 and 3 — a connected client; `buf` (37 bytes
        // needed) is writable for its length.
        check(unsafe {
            self.api
                .rados_cluster_fsid(self.cluster, buf.as_mut_ptr().cast(), buf.len())
        })?;
        Ok(from_buf(&buf))
    }

    /// Fills `buf` from `offset` (a short read is an error: the caller has
    /// range-checked, so the image ended under us).
    pub(super) fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: invariants 1 and 3 — `rest` is writable for `rest.len()`
            // bytes for the whole (synchronous) call.
            let n = unsafe {
                self.api.rbd_read2(
                    self.image,
                    offset + done as u64,
                    rest.len(),
                    rest.as_mut_ptr().cast(),
                    0,
                )
            };
            match n {
                n if n < 0 => return Err(io::Error::from_raw_os_error(-n as i32)),
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => done += n as usize,
            }
        }
        Ok(())
    }

    /// Writes `buf` at `offset` with librados op flags `flags`.
    pub(super) fn write(&self, offset: u64, buf: &[u8], flags: c_int) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let rest = &buf[done..];
            // SAFETY: invariants 1 and 3 — `rest` is readable for
            // `rest.len()` bytes for the whole (synchronous) call.
            let n = unsafe {
                self.api.rbd_write2(
                    self.image,
                    offset + done as u64,
                    rest.len(),
                    rest.as_ptr().cast(),
                    flags,
                )
            };
            match n {
                n if n < 0 => return Err(io::Error::from_raw_os_error(-n as i32)),
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => done += n as usize,
            }
        }
        Ok(())
    }

    /// Deallocates `len` bytes from `offset`.
    pub(super) fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: invariant 1 — an open image; no memory is passed.
        check(unsafe { self.api.rbd_discard(self.image, offset, len) })?;
        Ok(())
    }

    /// Makes every completed write durable.
    pub(super) fn flush(&self) -> io::Result<()> {
        // SAFETY: invariant 1 — an open image; no memory is passed.
        check(unsafe { self.api.rbd_flush(self.image) })?;
        Ok(())
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: invariant 1 — the image is open and closed once, here,
        // before its pool context and client go (`Partial` below).
        // rbd_close returns once every request in flight completed
        // (`aio.rs`, invariant 8).
        unsafe { self.api.rbd_close(self.image) };
        // The reaper sees the image gone and ends.
        self.aio.wake();
        drop(Partial {
            api: self.api,
            cluster: self.cluster,
            ioctx: self.ioctx,
        });
    }
}
