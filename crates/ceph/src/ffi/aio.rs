//! librbd's asynchronous reads and writes, completed through its eventfd
//! notification into the tokio reactor (issue 36 step 1): a command waits
//! on the target's own task, not on a pool thread, and no Rust code runs on
//! librbd's threads.
//!
//! How a request goes:
//! 1. [`Image::aio_read`] / [`Image::aio_write`], at the first poll of
//!    their future, create a completion with
//!    no callback, whose argument is the request's number; the buffer
//!    moves into the image's table of requests in flight (with a oneshot
//!    sender), then the request is submitted.
//! 2. When librbd completes a request made through its C API while the
//!    image has an event socket (`rbd_set_image_notification`), it queues
//!    the completion on the image and writes the eventfd
//!    (`librbd::io::AioCompletion::complete`, `native_async`).
//! 3. A reaper task of ours, woken by the eventfd through `AsyncFd`,
//!    takes the ready completions (`rbd_poll_io_events`), reads each one's
//!    number and return value, releases it, and hands the buffer and the
//!    result to the waiting future.
//!
//! The invariants of `ffi/mod.rs` hold (1: handles valid while the
//! [`Image`] lives; 2: thread-safe calls on an open image). Invariant 3
//! (buffers outlive a synchronous call) does not fit an asynchronous
//! request; in its place:
//! 6. Every buffer a submitted request reads or writes is owned by the
//!    image's table (`Aio::ops`) from before the submission until the
//!    reaper has taken the request's completion from librbd, and is not
//!    touched meanwhile: the pointers given to librbd point into heap
//!    memory (a `Vec`'s, or a boxed [`WriteData`]'s) that stays where it is
//!    when its owner moves into the table. A future dropped early only
//!    drops its receiver; the buffer goes when the request completes.
//! 7. A completion is released exactly once: by the reaper after
//!    `rbd_poll_io_events` returned it, or by the submitter when the
//!    submission failed (librbd then never completes it). Every completion
//!    created here is submitted through the C API on an image with an event
//!    socket, so it reaches the reaper; no other code of this crate makes
//!    asynchronous requests (the synchronous calls elsewhere use librbd's
//!    internal completions, which are never queued for the socket).
//! 8. `rbd_close` (in `Image`'s drop) returns only after every request in
//!    flight on the image has completed, so the table, dropped after it,
//!    frees no memory librbd still uses. Requests hold the image alive
//!    anyway: each waiting future holds an `Arc<Image>`.
//!
//! Tests: `aio_*` in `rbd/tests.rs`, against a ceph-dev cluster.

use std::ffi::{c_int, c_void};
use std::future::Future;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::Image;
use super::aio_table::{Held, Op, SharedFd};
use super::sys::{Api, IoVec, RbdCompletionT, RbdImageT};
use iscsi_scsi::backstore::{IoFuture, WriteData};

/// The most pieces one vectored request takes (Linux's IOV_MAX; librbd
/// refuses more).
const IOV_MAX: usize = 1024;

/// Completions taken from librbd per call.
const POLL_BATCH: usize = 32;

/// A buffer's address, carried into the future that submits the request.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);

// SAFETY: only an address, handed to librbd with the buffer it points
// into (invariant 6); Rust code never dereferences it.
unsafe impl Send for SendPtr {}

/// A request's result as librbd gives it: 0 or a byte count, or -errno.
fn result(ret: isize) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::from_raw_os_error(-ret as i32))
    } else {
        Ok(())
    }
}

/// The error of a request whose reaper went away before it completed (its
/// runtime shut down).
fn reaper_gone() -> io::Error {
    io::Error::other("the RBD completion reaper stopped (the runtime is shutting down)")
}

impl Image {
    /// Reads `buf.len()` bytes from `offset`; the buffer comes back with
    /// the result. The request is made when the future is first polled,
    /// which must be within a tokio runtime (the reaper's).
    pub(crate) fn aio_read(
        self: &Arc<Self>,
        offset: u64,
        mut buf: Vec<u8>,
    ) -> impl Future<Output = (Vec<u8>, io::Result<()>)> + Send + 'static {
        let image = Arc::clone(self);
        async move {
            let (ptr, len) = (SendPtr(buf.as_mut_ptr()), buf.len());
            let started = image.start(Held::Read(buf), |api, image, c| {
                // SAFETY: invariants 1 and 6 — `ptr..ptr+len` is the heap
                // memory of the Vec now held in the table until this
                // request's completion is reaped.
                unsafe { api.rbd_aio_read2(image, offset, len, ptr.0.cast(), c, 0) }
            });
            let (held, outcome) = match started {
                Ok(done) => match done.await {
                    // A short read is an error: the caller range-checked.
                    Ok((held, ret)) if ret >= 0 && (ret as usize) < len => {
                        (held, Err(io::ErrorKind::UnexpectedEof.into()))
                    }
                    Ok((held, ret)) => (held, result(ret)),
                    Err(_) => return (Vec::new(), Err(reaper_gone())),
                },
                Err((held, e)) => (held, Err(e)),
            };
            match held {
                Held::Read(buf) => (buf, outcome),
                Held::Write { .. } => (Vec::new(), outcome),
            }
        }
    }

    /// Writes the first `len` bytes of `data` at `offset` with librados op
    /// flags `flags` (one buffer) — or, in pieces, as one `rbd_aio_writev`
    /// per [`IOV_MAX`] pieces, which takes no flags (with the client's
    /// cache off a completed write is on the OSDs, FUA or not).
    pub(crate) fn aio_write(
        self: &Arc<Self>,
        offset: u64,
        data: Box<dyn WriteData>,
        len: usize,
        flags: c_int,
    ) -> IoFuture<io::Result<()>> {
        let image = Arc::clone(self);
        Box::pin(async move { image.write_now(offset, data, len, flags).await })
    }

    /// [`Image::aio_write`], the request made now.
    fn write_now(
        self: &Arc<Self>,
        offset: u64,
        data: Box<dyn WriteData>,
        len: usize,
        flags: c_int,
    ) -> IoFuture<io::Result<()>> {
        let slices = data.slices();
        if slices.len() > IOV_MAX {
            // More pieces than one request takes: rare (a 64 KiB piece
            // size makes 64 MiB), so the data is gathered instead.
            let mut whole = Vec::with_capacity(len);
            for slice in slices {
                let n = slice.len().min(len - whole.len());
                whole.extend_from_slice(&slice[..n]);
            }
            return self.write_now(offset, Box::new(whole), len, flags);
        }
        let mut iov = Vec::with_capacity(slices.len());
        let mut left = len;
        for slice in slices {
            let n = slice.len().min(left);
            if n == 0 {
                break;
            }
            iov.push(IoVec {
                base: slice.as_ptr().cast(),
                len: n,
            });
            left -= n;
        }
        let started = if left > 0 {
            None
        } else if let [one] = iov[..] {
            let (base, n) = (one.base, one.len);
            Some(self.start(
                Held::Write {
                    _data: data,
                    _iov: iov,
                },
                |api, image, c| {
                    // SAFETY: invariants 1 and 6 — `base..base+n` lies in the
                    // boxed data held in the table until the completion is reaped.
                    unsafe { api.rbd_aio_write2(image, offset, n, base.cast(), c, flags) }
                },
            ))
        } else {
            let (array, count) = (iov.as_ptr(), iov.len() as c_int);
            Some(self.start(
                Held::Write {
                    _data: data,
                    _iov: iov,
                },
                |api, image, c| {
                    // SAFETY: invariants 1 and 6 — the iovec array (a Vec's heap
                    // memory) and every piece it points to are held in the table
                    // until the completion is reaped; `count` is its length, at
                    // most IOV_MAX.
                    unsafe { api.rbd_aio_writev(image, array, count, offset, c) }
                },
            ))
        };
        Box::pin(async move {
            match started {
                None => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "write data shorter than its length",
                )),
                Some(Ok(done)) => match done.await {
                    // A write's completion holds 0 or an error.
                    Ok((_, ret)) => result(ret),
                    Err(_) => Err(reaper_gone()),
                },
                Some(Err((_, e))) => Err(e),
            }
        })
    }

    /// Puts `held` in the table under a new completion and submits the
    /// request with `submit` (invariants 6 and 7). On failure `held` comes
    /// back with the error.
    #[allow(clippy::type_complexity)]
    fn start(
        self: &Arc<Self>,
        held: Held,
        submit: impl FnOnce(&Api, RbdImageT, RbdCompletionT) -> c_int,
    ) -> Result<oneshot::Receiver<(Held, isize)>, (Held, io::Error)> {
        if let Err(e) = self.ensure_reaper() {
            return Err((held, e));
        }
        let aio = &self.aio;
        let id = aio.next.fetch_add(1, Ordering::Relaxed);
        let mut c: RbdCompletionT = ptr::null_mut();
        // SAFETY: `c` receives the handle; no callback is registered, so
        // nothing of ours runs on librbd's threads; the argument is a
        // number, never dereferenced.
        let r = unsafe {
            self.api
                .rbd_aio_create_completion(id as *mut c_void, None, &mut c)
        };
        if r < 0 {
            return Err((held, io::Error::from_raw_os_error(-r)));
        }
        let (done, waiting) = oneshot::channel();
        aio.ops().insert(id, Op { held, done });
        let r = submit(self.api, self.image, c);
        if r < 0 {
            // SAFETY: invariant 7 — a submission that failed never
            // completes: the completion is ours to release, once.
            unsafe { self.api.rbd_aio_release(c) };
            let op = aio.ops().remove(&id);
            let e = io::Error::from_raw_os_error(-r);
            return match op {
                Some(op) => Err((op.held, e)),
                None => Err((Held::Read(Vec::new()), e)),
            };
        }
        Ok(waiting)
    }

    /// Starts the image's reaper on the current runtime unless one runs.
    fn ensure_reaper(self: &Arc<Self>) -> io::Result<()> {
        let aio = &self.aio;
        if aio.reaping.load(Ordering::Acquire) || aio.reaping.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let started = (|| {
            let handle = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
            let _entered = handle.enter();
            // SAFETY: `SharedFd` holds the eventfd by an `Arc`, so it stays
            // open, the same descriptor, for the `AsyncFd`'s whole life.
            let fd = unsafe {
                AsyncFd::register_with_interest(
                    SharedFd(Arc::clone(&aio.eventfd)),
                    tokio::io::Interest::READABLE,
                )
            }
            .map_err(io::Error::from)?;
            let running = Running(Arc::clone(&aio.reaping));
            handle.spawn(reap(Arc::downgrade(self), fd, running));
            Ok(())
        })();
        if started.is_err() {
            aio.reaping.store(false, Ordering::Release);
        }
        started
    }

    /// Hands every completion librbd has ready to its waiting future.
    fn drain_completions(&self) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(&*self.aio.eventfd, &mut counter);
        loop {
            let mut ready = [ptr::null_mut(); POLL_BATCH];
            // SAFETY: invariants 1 and 7 — an open image; `ready` has room
            // for POLL_BATCH handles, each a completion of ours.
            let n = unsafe {
                self.api
                    .rbd_poll_io_events(self.image, ready.as_mut_ptr(), POLL_BATCH as c_int)
            };
            let n = usize::try_from(n).unwrap_or(0).min(POLL_BATCH);
            for &c in &ready[..n] {
                // SAFETY: invariant 7 — `c` was returned by
                // rbd_poll_io_events: completed, not yet released; it is
                // read, then released once, here.
                let (id, ret) = unsafe {
                    let id = self.api.rbd_aio_get_arg(c) as u64;
                    let ret = self.api.rbd_aio_get_return_value(c);
                    self.api.rbd_aio_release(c);
                    (id, ret)
                };
                if let Some(op) = self.aio.ops().remove(&id) {
                    // The future may be gone: the buffer then drops here.
                    let _ = op.done.send((op.held, ret));
                }
            }
            if n < POLL_BATCH {
                return;
            }
        }
    }
}

/// Clears the image's "reaping" flag when its reaper ends, however it ends
/// (the next request starts another).
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The reaper: drains completions, then waits for the eventfd; ends when
/// the image is gone (its drop wakes us) or the runtime shuts down.
async fn reap(image: Weak<Image>, fd: AsyncFd<SharedFd>, _running: Running) {
    loop {
        {
            let Some(image) = image.upgrade() else {
                return;
            };
            image.drain_completions();
        }
        let Ok(mut ready) = fd.readable().await else {
            return;
        };
        // Cleared before the drain reads the counter: a notification that
        // comes after the read sets it again.
        ready.clear_ready();
    }
}
