//! The table of an image's asynchronous requests (`aio.rs`): its eventfd
//! and what each request in flight owns until the reaper takes its
//! completion (invariant 6 of `aio.rs`). Apart from `aio.rs` so that the
//! [`Image`](super::Image) that holds it does not import the requests that
//! use the image.

use std::collections::HashMap;
use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::event::{EventfdFlags, eventfd};
use tokio::sync::oneshot;

use super::sys::{Api, IoVec, RbdImageT, check};
use iscsi_scsi::backstore::WriteData;

/// `EVENT_TYPE_EVENTFD` of `rbd_image_event_t` (librbd.h).
const EVENT_TYPE_EVENTFD: c_int = 2;

/// What a request in flight owns (invariant 6).
pub(super) enum Held {
    Read(Vec<u8>),
    /// The data and the iovec array pointing into it: held, never read.
    Write {
        _data: Box<dyn WriteData>,
        _iov: Vec<IoVec>,
    },
}

// SAFETY: the raw pointers in `Write`'s iovecs point into the boxed data
// beside them, which is `Send`; they are only read by librbd (invariant 6),
// never dereferenced by Rust code.
unsafe impl Send for Held {}

pub(super) struct Op {
    pub(super) held: Held,
    pub(super) done: oneshot::Sender<(Held, isize)>,
}

/// The eventfd, shared by the image and the reaper's `AsyncFd` so that it
/// is closed only when neither uses it (librbd writes it until the image
/// is closed).
pub(super) struct SharedFd(pub(super) Arc<OwnedFd>);

impl AsRawFd for SharedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// An image's asynchronous state: its eventfd and its requests in flight.
pub(super) struct Aio {
    pub(super) eventfd: Arc<OwnedFd>,
    ops: Mutex<HashMap<u64, Op>>,
    pub(super) next: AtomicU64,
    /// Whether a reaper task runs (one per image; started by the first
    /// request, again if its runtime went away).
    pub(super) reaping: Arc<AtomicBool>,
}

impl std::fmt::Debug for Aio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aio")
            .field("eventfd", &self.eventfd.as_raw_fd())
            .finish_non_exhaustive()
    }
}

impl Aio {
    /// An eventfd, registered with the open `image` as its event socket.
    pub(super) fn register(api: &Api, image: RbdImageT) -> io::Result<Aio> {
        let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        // SAFETY: invariant 1 — an open image; the fd is an eventfd that
        // stays open until the image is closed (`Image`'s drop closes the
        // image before its `Aio` goes).
        check(unsafe {
            api.rbd_set_image_notification(image, fd.as_raw_fd(), EVENT_TYPE_EVENTFD)
        })?;
        Ok(Aio {
            eventfd: Arc::new(fd),
            ops: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            reaping: Arc::new(AtomicBool::new(false)),
        })
    }

    pub(super) fn ops(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Op>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the reaper (so that it sees the image gone and ends).
    pub(super) fn wake(&self) {
        let _ = rustix::io::write(&*self.eventfd, &1u64.to_ne_bytes());
    }
}
