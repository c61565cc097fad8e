//! [`RbdPrStore`]: the persistent reservation record of an RBD LU
//! ([`iscsi_scsi::pr_record`]) in one RADOS object in the image's pool,
//! `iscsi-rs.pr.<image id>`, changed by compare-and-set on its xattr
//! `epoch` (`rados_write_op_cmpxattr` + `setxattr` + `write_full` in one
//! op), watched by every gateway, and the gateways fenced by blocklisting
//! the RADOS client this LU's I/O goes through — the same client, so a
//! fenced gateway's writes to the image fail too.
//!
//! The watch's events come through a pipe (`ffi::rados`, no Rust beyond a
//! `write` on librados's threads) to a thread of this store, which calls
//! the SCSI layer's handler (it reloads) and only then acknowledges.

use std::io;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::fence::Fence;
use super::ffi::Image;
use super::ffi::rados::{EBLOCKLISTED, WatchEvent, WatchEvents, WatchGuard};
use iscsi_scsi::backstore::{PrEvent, PrEventHandler, SharedPrStore};

/// How long a notify waits for every gateway's acknowledgement; a gateway
/// that takes longer is fenced. Reloading is one small object read, so a
/// healthy gateway answers in milliseconds; this bounds how long a PERSISTENT
/// RESERVE OUT waits for a stopped one (well within initiators' command
/// timeouts of 30 s and more).
const NOTIFY_TIMEOUT_MS: u64 = 5000;

/// Largest record read (256 registrations of the longest names fit in
/// under 300 KiB).
const MAX_RECORD: usize = 1 << 20;

/// The xattr holding the epoch, as decimal ASCII.
const EPOCH_XATTR: &str = "epoch";

/// The record of one LU, through that LU's own RADOS client (replaced
/// when a fenced gateway rejoins: [`RbdPrStore::rejoin`]).
pub(crate) struct RbdPrStore {
    inner: ArcSwap<Inner>,
    /// What [`SharedPrStore::watch`] was given, for the watch of a new
    /// client.
    handler: Mutex<Option<PrEventHandler>>,
    fence: Arc<Fence>,
}

impl std::fmt::Debug for RbdPrStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdPrStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// One client's view of the record.
#[derive(Debug)]
struct Inner {
    image: Arc<Image>,
    /// The client's generation ([`Fence`]).
    generation: u64,
    oid: String,
    gid: u64,
    addr: String,
    watch: Mutex<Option<WatchGuard>>,
}

impl Inner {
    fn new(image: Arc<Image>, generation: u64, oid: String) -> io::Result<Inner> {
        let gid = image.instance_id();
        let addr = blocklist_addr(&image.addrs()?)?;
        Ok(Inner {
            image,
            generation,
            oid,
            gid,
            addr,
            watch: Mutex::new(None),
        })
    }
}

impl RbdPrStore {
    /// The store of the image `image` whose id is `image_id`, through the
    /// client of `fence`'s current generation.
    pub(crate) fn new(
        image: Arc<Image>,
        image_id: &str,
        fence: Arc<Fence>,
    ) -> io::Result<RbdPrStore> {
        let inner = Inner::new(image, fence.generation(), format!("iscsi-rs.pr.{image_id}"))?;
        Ok(RbdPrStore {
            inner: ArcSwap::from_pointee(inner),
            handler: Mutex::new(None),
            fence,
        })
    }

    /// The object's name.
    #[cfg(all(test, feature = "ceph-tests"))]
    pub(crate) fn oid(&self) -> String {
        self.inner.load().oid.clone()
    }

    /// Goes on through `image`, a new client of generation `generation`
    /// (the old one was fenced): watches through it, then tells the SCSI
    /// layer ([`PrEvent::Rejoined`]), which joins the record with it.
    /// Whether the LU may serve again (`true` when nobody watches).
    pub(crate) fn rejoin(&self, image: Arc<Image>, generation: u64) -> io::Result<bool> {
        let oid = self.inner.load().oid.clone();
        let inner = Arc::new(Inner::new(image, generation, oid)?);
        let handler = self
            .handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(handler) = handler else {
            self.inner.store(inner);
            return Ok(true);
        };
        let events = inner.rewatch()?;
        // The old client's watch thread ends when its watch goes with it.
        self.inner.store(Arc::clone(&inner));
        spawn_watch(
            &inner,
            events,
            Arc::clone(&handler),
            Arc::clone(&self.fence),
        )?;
        Ok(handler(PrEvent::Rejoined))
    }
}

/// Starts the thread that hands `inner`'s watch events to `handler`.
fn spawn_watch(
    inner: &Arc<Inner>,
    events: WatchEvents,
    handler: PrEventHandler,
    fence: Arc<Fence>,
) -> io::Result<()> {
    let weak = Arc::downgrade(inner);
    std::thread::Builder::new()
        .name("rbd-pr-watch".into())
        .spawn(move || run_watch(weak, events, handler, fence))?;
    Ok(())
}

/// One entity address out of `rados_getaddrs`'s vector
/// (`[v2:127.0.0.1:0/3720795,v1:127.0.0.1:0/3720795]` or a bare address):
/// the first, without its `v2:`/`v1:`/`any:` prefix, which is what the
/// monitor's blocklist matches (it ignores the address type).
pub(crate) fn blocklist_addr(addrs: &str) -> io::Result<String> {
    let first = addrs
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .next()
        .unwrap_or_default();
    let bare = ["v2:", "v1:", "any:"]
        .iter()
        .find_map(|p| first.strip_prefix(p))
        .unwrap_or(first);
    if bare.is_empty() || !bare.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("no client address in {addrs:?}"),
        ));
    }
    Ok(bare.to_owned())
}

impl RbdPrStore {
    /// Passes an error of `inner`'s client on, tripping the fence first
    /// when it says the client was blocklisted: a gateway may learn it
    /// from its reservation record before any data I/O tells it.
    fn failed(&self, inner: &Inner, e: io::Error) -> io::Error {
        self.fence.check(inner.generation, e)
    }
}

impl SharedPrStore for RbdPrStore {
    fn read(&self) -> io::Result<Option<Vec<u8>>> {
        let inner = self.inner.load();
        inner
            .image
            .object_read(&inner.oid, MAX_RECORD)
            .map_err(|e| self.failed(&inner, e))
    }

    fn write_if(&self, expected: Option<u64>, epoch: u64, bytes: &[u8]) -> io::Result<bool> {
        let old = expected.map(|e| e.to_string());
        let inner = self.inner.load();
        inner
            .image
            .object_cas(
                &inner.oid,
                EPOCH_XATTR,
                old.as_deref().map(str::as_bytes),
                epoch.to_string().as_bytes(),
                bytes,
            )
            .map_err(|e| self.failed(&inner, e))
    }

    fn notify(&self) -> io::Result<Vec<u64>> {
        let inner = self.inner.load();
        let reply = inner
            .image
            .notify(&inner.oid, b"pr", NOTIFY_TIMEOUT_MS)
            .map_err(|e| self.failed(&inner, e))?;
        Ok(reply.acked.into_iter().map(|(gid, _)| gid).collect())
    }

    fn fence(&self, addrs: &[String]) -> io::Result<()> {
        let inner = self.inner.load();
        let fence = || {
            for a in addrs {
                inner.image.blocklist_add(a, 0)?;
            }
            inner.image.wait_for_latest_osdmap()
        };
        fence().map_err(|e| self.failed(&inner, e))
    }

    fn me(&self) -> (u64, String) {
        let inner = self.inner.load();
        (inner.gid, inner.addr.clone())
    }

    fn watch(&self, on_event: PrEventHandler) -> io::Result<()> {
        *self.handler.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&on_event));
        let inner = self.inner.load_full();
        let events = inner.rewatch()?;
        spawn_watch(&inner, events, on_event, Arc::clone(&self.fence))
    }
}

impl Inner {
    /// (Re)registers the watch, dropping a previous one.
    fn rewatch(&self) -> io::Result<WatchEvents> {
        let mut slot = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
        drop(slot.take());
        let (guard, events) = self.image.watch(&self.oid)?;
        *slot = Some(guard);
        Ok(events)
    }
}

/// The watch thread: each notify is handled ([`PrEvent::Changed`]) and then
/// acknowledged if that says so; a broken watch is reported ([`PrEvent::Broken`]) and
/// registered again, each second until that works (a fenced client never
/// does: it trips the fence, and the store rejoins with a new client and a
/// watch thread of its own). Ends when its client is dropped (its watch's
/// pipe closes).
fn run_watch(weak: Weak<Inner>, first: WatchEvents, on_event: PrEventHandler, fence: Arc<Fence>) {
    let mut events = Some(first);
    loop {
        let Some(current) = &events else {
            std::thread::sleep(Duration::from_secs(1));
            let Some(inner) = weak.upgrade() else { return };
            if !fence.serving(inner.generation) {
                // This client is done with: a new one watches.
                return;
            }
            if let Ok(fresh) = inner.rewatch() {
                events = Some(fresh);
                drop(inner);
                let _ = on_event(PrEvent::Changed);
            }
            continue;
        };
        let Some(event) = current.next() else { return };
        let Some(inner) = weak.upgrade() else { return };
        match event {
            WatchEvent::Notify {
                notify_id, cookie, ..
            } => {
                if !on_event(PrEvent::Changed) {
                    eprintln!(
                        "rbd: not acknowledging a reservation notify on {}: the change could not be loaded",
                        inner.oid
                    );
                } else if let Err(e) = inner.image.notify_ack(&inner.oid, notify_id, cookie) {
                    eprintln!(
                        "rbd: acknowledging a reservation notify on {}: {e}",
                        inner.oid
                    );
                }
            }
            WatchEvent::Error { err, .. } => {
                if !fence.serving(inner.generation) {
                    return;
                }
                let _ = on_event(PrEvent::Broken);
                if -err == EBLOCKLISTED {
                    // The store rejoins with a new client.
                    fence.trip(inner.generation);
                    return;
                }
                events = inner.rewatch().ok();
                drop(inner);
                if events.is_some() {
                    let _ = on_event(PrEvent::Changed);
                }
            }
        }
    }
}
