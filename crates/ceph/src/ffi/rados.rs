//! RADOS objects, watch/notify and fencing on an [`Image`]'s own client:
//! what the persistent reservation store of an RBD LU (`super::super::pr`)
//! needs from librados (Debian 12: 16.2.15; all functions below are in
//! its `rados/librados.h`). Pacific has no `rados_list_watchers` in the C
//! API, so the gateways' addresses for fencing are kept in the state
//! object itself (`rados_getaddrs` + `rados_get_instance_id`).
//!
//! Invariants every `unsafe` block below relies on, beyond those of
//! [`super`] (1-3: an `Image`'s handles live, non-null, until its drop):
//! 5. A write op (`rados_write_op_t`) is created, filled, operated and
//!    released within one call of [`Image::object_cas`], released once on
//!    every path (by [`WriteOp`]'s drop); every buffer handed to it lives
//!    until `rados_write_op_operate` returns (the op is synchronous).
//! 6. A watch's callback argument is a `Box<Sink>` leaked by
//!    [`Image::watch`] and freed only by [`WatchGuard`]'s drop, after
//!    `rados_unwatch2` and `rados_watch_flush` have returned: librados
//!    calls no callback of that watch after `rados_watch_flush` (its
//!    documented purpose), so the pointer is valid in every call. The
//!    guard holds an `Arc<Image>`, so the ioctx and client outlive it.
//! 7. The callbacks run on librados's threads and do nothing but write one
//!    fixed-size record into a pipe (a single `write` of fewer than
//!    `PIPE_BUF` bytes: atomic, never interleaved); everything else
//!    (reloading the state, acknowledging) happens on the reader's thread.
//! 8. Buffers librados allocates (`rados_notify2`'s reply,
//!    `rados_getaddrs`'s string) are copied into Rust memory and released
//!    once, with the function librados documents (`rados_buffer_free`; the
//!    address is `strdup`ed, so `free`).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io;
use std::os::fd::OwnedFd;
use std::ptr;
use std::sync::Arc;

use super::sys::{Api, RadosWriteOpT};
use super::{Image, check, cstring};

/// `LIBRADOS_CMPXATTR_OP_EQ`.
const CMPXATTR_OP_EQ: u8 = 1;
/// `LIBRADOS_CREATE_EXCLUSIVE`.
const CREATE_EXCLUSIVE: c_int = 1;

/// What a blocklisted client's operations fail with (`EBLOCKLISTED`, which
/// Ceph defines as `ESHUTDOWN`).
pub(crate) const EBLOCKLISTED: i32 = 108;

unsafe extern "C" {
    /// libc's `free`, for `rados_getaddrs`'s `strdup`ed string.
    fn free(p: *mut c_void);
}

/// A write op, released on drop (invariant 5).
struct WriteOp {
    api: &'static Api,
    op: RadosWriteOpT,
}

impl Drop for WriteOp {
    fn drop(&mut self) {
        // SAFETY: invariant 5 — created by rados_create_write_op, released once, here.
        unsafe { self.api.rados_release_write_op(self.op) };
    }
}

/// The answer to a notify: who acknowledged and who did not in time, each
/// as (client instance id, watch cookie).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct NotifyReply {
    pub acked: Vec<(u64, u64)>,
    pub timed_out: Vec<(u64, u64)>,
}

impl NotifyReply {
    /// Parses librados's reply buffer (librados.h, `rados_notify2`): le32
    /// acks, each le64 gid, le64 cookie, le32 length and that many bytes;
    /// then le32 timeouts, each le64 gid, le64 cookie. `None` when short.
    fn parse(mut b: &[u8]) -> Option<NotifyReply> {
        fn take<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
            let (head, rest) = b.split_first_chunk::<N>()?;
            *b = rest;
            Some(*head)
        }
        let mut reply = NotifyReply::default();
        let acks = u32::from_le_bytes(take(&mut b)?);
        for _ in 0..acks {
            let gid = u64::from_le_bytes(take(&mut b)?);
            let cookie = u64::from_le_bytes(take(&mut b)?);
            let len = u32::from_le_bytes(take(&mut b)?) as usize;
            b = b.get(len..)?;
            reply.acked.push((gid, cookie));
        }
        let timeouts = u32::from_le_bytes(take(&mut b)?);
        for _ in 0..timeouts {
            let gid = u64::from_le_bytes(take(&mut b)?);
            let cookie = u64::from_le_bytes(take(&mut b)?);
            reply.timed_out.push((gid, cookie));
        }
        Some(reply)
    }
}

/// What a watch delivers (read from its pipe by [`WatchEvents::next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchEvent {
    /// A notify arrived; acknowledge it with [`Image::notify_ack`] once
    /// handled.
    Notify {
        notify_id: u64,
        cookie: u64,
        notifier: u64,
    },
    /// The watch broke (disconnected, blocklisted): notifies may have been
    /// missed. `err` is a negative errno.
    Error { cookie: u64, err: i32 },
}

const RECORD: usize = 25;

/// What the callbacks write into (invariants 6 and 7).
struct Sink {
    pipe: OwnedFd,
}

fn put(arg: *mut c_void, record: &[u8; RECORD]) {
    // SAFETY: invariant 6 — `arg` is the leaked `Box<Sink>`, alive until
    // the watch is flushed, and only read here.
    let sink = unsafe { &*arg.cast::<Sink>() };
    // A full pipe blocks this librados thread until the reader drains it;
    // a closed reader (EPIPE) means nobody listens: nothing to do.
    let _ = rustix::io::write(&sink.pipe, record);
}

extern "C" fn on_notify(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    notifier: u64,
    _data: *mut c_void,
    _len: usize,
) {
    let mut r = [0u8; RECORD];
    r[1..9].copy_from_slice(&notify_id.to_le_bytes());
    r[9..17].copy_from_slice(&cookie.to_le_bytes());
    r[17..25].copy_from_slice(&notifier.to_le_bytes());
    put(arg, &r);
}

extern "C" fn on_error(arg: *mut c_void, cookie: u64, err: c_int) {
    let mut r = [1u8; RECORD];
    r[1..9].copy_from_slice(&cookie.to_le_bytes());
    r[9..17].copy_from_slice(&i64::from(err).to_le_bytes());
    put(arg, &r);
}

/// The reading end of a watch: blocking, one event at a time, `None` once
/// the watch is gone ([`WatchGuard`] dropped).
#[derive(Debug)]
pub(crate) struct WatchEvents {
    pipe: OwnedFd,
}

impl WatchEvents {
    /// The next event, waiting for it.
    pub(crate) fn next(&self) -> Option<WatchEvent> {
        let mut r = [0u8; RECORD];
        let mut got = 0;
        while got < RECORD {
            match rustix::io::read(&self.pipe, &mut r[got..]) {
                Ok(0) => return None,
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return None,
            }
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&r[at..at + 8]);
            u64::from_le_bytes(w)
        };
        Some(if r[0] == 0 {
            WatchEvent::Notify {
                notify_id: word(1),
                cookie: word(9),
                notifier: word(17),
            }
        } else {
            WatchEvent::Error {
                cookie: word(1),
                err: word(9) as i64 as i32,
            }
        })
    }
}

/// A registered watch; dropping it unwatches, flushes the callbacks and
/// then frees their argument (invariant 6), which ends [`WatchEvents`].
#[derive(Debug)]
pub(crate) struct WatchGuard {
    image: Arc<Image>,
    cookie: u64,
    sink: *mut c_void,
}

// SAFETY: the guard only holds the cookie and the sink's address; librados
// handles are thread safe (invariant 2) and the sink is only freed by drop.
unsafe impl Send for WatchGuard {}
// SAFETY: as for `Send`: no method touches the sink.
unsafe impl Sync for WatchGuard {}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        // SAFETY: invariant 6 — a cookie rados_watch2 returned, unwatched once.
        unsafe { self.image.api.rados_unwatch2(self.image.ioctx, self.cookie) };
        // SAFETY: invariants 1 and 6 — the client lives (the Arc); after
        // this no callback of the watch runs.
        unsafe { self.image.api.rados_watch_flush(self.image.cluster) };
        // SAFETY: invariant 6 — the Box leaked by `watch`, freed once, here,
        // after the last callback.
        drop(unsafe { Box::from_raw(self.sink.cast::<Sink>()) });
    }
}

impl Image {
    /// Reads object `oid` whole (at most `max` bytes; longer is an
    /// error); `None` when it does not exist.
    pub(crate) fn object_read(&self, oid: &str, max: usize) -> io::Result<Option<Vec<u8>>> {
        let name = cstring("object", oid)?;
        let mut buf = vec![0u8; max + 1];
        // SAFETY: invariants 1 and 3 — `buf` is writable for its length and
        // `name` lives across the (synchronous) call.
        let n = unsafe {
            self.api.rados_read(
                self.ioctx,
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
            )
        };
        if n == -libc_enoent() {
            return Ok(None);
        }
        let n = check(n)? as usize;
        if n > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("object {oid} is longer than {max} bytes"),
            ));
        }
        buf.truncate(n);
        Ok(Some(buf))
    }

    /// Size and mtime of object `oid`; `None` when it does not exist
    /// (tests: what a compare-and-set left).
    #[cfg(all(test, feature = "ceph-tests"))]
    pub(crate) fn object_stat(&self, oid: &str) -> io::Result<Option<(u64, i64)>> {
        let name = cstring("object", oid)?;
        let (mut size, mut mtime) = (0u64, 0i64);
        // SAFETY: invariants 1 and 3 — `name` lives across the call; both
        // outputs are valid to write.
        let r = unsafe {
            self.api
                .rados_stat(self.ioctx, name.as_ptr(), &mut size, &mut mtime)
        };
        if r == -libc_enoent() {
            return Ok(None);
        }
        check(r)?;
        Ok(Some((size, mtime)))
    }

    /// Removes object `oid` (tests' cleanup); a missing one is fine.
    #[cfg(all(test, feature = "ceph-tests"))]
    pub(crate) fn object_remove(&self, oid: &str) -> io::Result<()> {
        let name = cstring("object", oid)?;
        // SAFETY: invariants 1 and 3 — `name` lives across the call.
        let r = unsafe { self.api.rados_remove(self.ioctx, name.as_ptr()) };
        if r == -libc_enoent() {
            return Ok(());
        }
        check(r).map(drop)
    }

    /// Compare-and-set: replaces object `oid`'s content with `data` and its
    /// xattr `xattr` with `new`, in one atomic op, if the xattr equals
    /// `expected` now; `expected` `None`: only if the object does not exist
    /// (it is created). `Ok(false)`: the condition did not hold (another
    /// writer got there first).
    pub(crate) fn object_cas(
        &self,
        oid: &str,
        xattr: &str,
        expected: Option<&[u8]>,
        new: &[u8],
        data: &[u8],
    ) -> io::Result<bool> {
        let name = cstring("object", oid)?;
        let attr = cstring("xattr", xattr)?;
        let op = WriteOp {
            api: self.api,
            // SAFETY: invariant 5 — no arguments; the op is released by `WriteOp`.
            op: unsafe { self.api.rados_create_write_op() },
        };
        if op.op.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        match expected {
            // SAFETY: invariant 5 — a live op; `attr` and `old` outlive the
            // operate below (locals of this function).
            Some(old) => unsafe {
                self.api.rados_write_op_cmpxattr(
                    op.op,
                    attr.as_ptr(),
                    CMPXATTR_OP_EQ,
                    old.as_ptr().cast(),
                    old.len(),
                )
            },
            // SAFETY: invariant 5 — a live op; a null category is allowed.
            None => unsafe {
                self.api
                    .rados_write_op_create(op.op, CREATE_EXCLUSIVE, ptr::null())
            },
        }
        // SAFETY: invariant 5 — a live op; `attr`, `new` and `data` outlive
        // the operate below.
        unsafe {
            self.api
                .rados_write_op_setxattr(op.op, attr.as_ptr(), new.as_ptr().cast(), new.len());
            self.api
                .rados_write_op_write_full(op.op, data.as_ptr().cast(), data.len());
        }
        // SAFETY: invariants 1 and 5 — a live op and ioctx; `name` lives
        // across the call; a null mtime means "now".
        let r = unsafe {
            self.api
                .rados_write_op_operate(op.op, self.ioctx, name.as_ptr(), ptr::null_mut(), 0)
        };
        // ECANCELED: the xattr differed; EEXIST: created meanwhile; ENOENT
        // (or ENODATA) with an expected value: removed meanwhile.
        match -r {
            0 => Ok(true),
            125 | 17 | 2 | 61 => Ok(false),
            _ => check(r).map(|_| true),
        }
    }

    /// Registers a watch on `oid`: the returned events carry each notify
    /// (to be acknowledged with [`Image::notify_ack`]) and watch errors.
    pub(crate) fn watch(self: &Arc<Image>, oid: &str) -> io::Result<(WatchGuard, WatchEvents)> {
        let name = cstring("object", oid)?;
        let (reader, writer) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let sink = Box::into_raw(Box::new(Sink { pipe: writer })).cast::<c_void>();
        let mut cookie = 0u64;
        // SAFETY: invariants 1, 3 and 6 — `name` lives across the call; the
        // sink stays alive until the guard's drop has flushed the watch.
        let r = unsafe {
            self.api.rados_watch2(
                self.ioctx,
                name.as_ptr(),
                &mut cookie,
                on_notify,
                on_error,
                sink,
            )
        };
        if r < 0 {
            // SAFETY: invariant 6 — the watch was not registered, so no
            // callback has the pointer: freed once, here.
            drop(unsafe { Box::from_raw(sink.cast::<Sink>()) });
            return Err(io::Error::from_raw_os_error(-r));
        }
        Ok((
            WatchGuard {
                image: Arc::clone(self),
                cookie,
                sink,
            },
            WatchEvents { pipe: reader },
        ))
    }

    /// Acknowledges notify `notify_id` to watch `cookie` on `oid`.
    pub(crate) fn notify_ack(&self, oid: &str, notify_id: u64, cookie: u64) -> io::Result<()> {
        let name = cstring("object", oid)?;
        // SAFETY: invariants 1 and 3 — `name` lives across the call; no payload.
        check(unsafe {
            self.api
                .rados_notify_ack(self.ioctx, name.as_ptr(), notify_id, cookie, ptr::null(), 0)
        })
        .map(drop)
    }

    /// Notifies every watcher of `oid` with `payload` and waits up to
    /// `timeout_ms` for their acknowledgements: who acked and who did not.
    pub(crate) fn notify(
        &self,
        oid: &str,
        payload: &[u8],
        timeout_ms: u64,
    ) -> io::Result<NotifyReply> {
        let name = cstring("object", oid)?;
        let len = c_int::try_from(payload.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut reply: *mut c_char = ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: invariants 1 and 3 — `name` and `payload` live across the
        // (synchronous) call; the reply pointer and length are valid to write.
        let r = unsafe {
            self.api.rados_notify2(
                self.ioctx,
                name.as_ptr(),
                payload.as_ptr().cast(),
                len,
                timeout_ms,
                &mut reply,
                &mut reply_len,
            )
        };
        let parsed = if reply.is_null() {
            None
        } else {
            // SAFETY: invariant 8 — librados wrote `reply_len` bytes at `reply`.
            let bytes =
                unsafe { std::slice::from_raw_parts(reply.cast::<u8>(), reply_len) }.to_vec();
            // SAFETY: invariant 8 — librados's buffer, released once, here.
            unsafe { self.api.rados_buffer_free(reply) };
            NotifyReply::parse(&bytes)
        };
        // With some watchers timed out the call fails with ETIMEDOUT but
        // the reply still lists who did and did not answer.
        if r < 0 && r != -110 {
            return Err(io::Error::from_raw_os_error(-r));
        }
        parsed.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "a notify reply that does not parse",
            )
        })
    }

    /// This client's instance id (the gid notify replies name).
    pub(crate) fn instance_id(&self) -> u64 {
        // SAFETY: invariant 1 — a connected client.
        unsafe { self.api.rados_get_instance_id(self.cluster) }
    }

    /// This client's addresses as librados prints them (an address vector
    /// such as `[v2:127.0.0.1:0/1234,v1:...]`).
    pub(crate) fn addrs(&self) -> io::Result<String> {
        let mut out: *mut c_char = ptr::null_mut();
        // SAFETY: invariants 1 and 3 — a connected client; `out` is valid to write.
        check(unsafe { self.api.rados_getaddrs(self.cluster, &mut out) })?;
        if out.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        // SAFETY: invariant 8 — a NUL-terminated string librados strdup'ed.
        let s = unsafe { CStr::from_ptr(out) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: invariant 8 — strdup'ed, freed once, here.
        unsafe { free(out.cast()) };
        Ok(s)
    }

    /// Blocklists the client at `addr` (one entity address, `IP:PORT/NONCE`)
    /// for `expire_seconds` (0: the cluster's default).
    pub(crate) fn blocklist_add(&self, addr: &str, expire_seconds: u32) -> io::Result<()> {
        let a = cstring("address", addr)?;
        // SAFETY: invariants 1 and 3 — `a` lives across the call; librados
        // only reads it (the C signature lacks the const).
        check(unsafe {
            self.api
                .rados_blocklist_add(self.cluster, a.as_ptr().cast_mut(), expire_seconds)
        })
        .map(drop)
    }

    /// Waits until this client has the latest OSD map (after a blocklist:
    /// the OSDs then refuse the fenced client).
    pub(crate) fn wait_for_latest_osdmap(&self) -> io::Result<()> {
        // SAFETY: invariant 1 — a connected client.
        check(unsafe { self.api.rados_wait_for_latest_osdmap(self.cluster) }).map(drop)
    }
}

/// `ENOENT`.
const fn libc_enoent() -> c_int {
    2
}

#[cfg(test)]
mod tests {
    use super::NotifyReply;

    #[test]
    fn notify_reply_parses_and_refuses_short_buffers() {
        let mut b = Vec::new();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&7u64.to_le_bytes());
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(b"ok");
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&8u64.to_le_bytes());
        b.extend_from_slice(&10u64.to_le_bytes());
        let r = NotifyReply::parse(&b).unwrap();
        assert_eq!(r.acked, vec![(7, 9)]);
        assert_eq!(r.timed_out, vec![(8, 10)]);
        for cut in 0..b.len() {
            assert!(NotifyReply::parse(&b[..cut]).is_none(), "{cut}");
        }
    }
}
