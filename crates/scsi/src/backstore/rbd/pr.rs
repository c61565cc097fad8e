//! [`RbdPrStore`]: the persistent reservation record of an RBD LU
//! ([`crate::pr_record`]) in one RADOS object in the image's pool,
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

use super::ffi::Image;
use super::ffi::rados::{EBLOCKLISTED, WatchEvent, WatchEvents, WatchGuard};
use crate::backstore::{PrEventHandler, SharedPrStore};

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

/// The record of one LU, through that LU's own RADOS client.
#[derive(Debug)]
pub(crate) struct RbdPrStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    image: Arc<Image>,
    oid: String,
    gid: u64,
    addr: String,
    watch: Mutex<Option<WatchGuard>>,
}

impl RbdPrStore {
    /// The store of the image `image` whose id is `image_id`.
    pub(crate) fn new(image: Arc<Image>, image_id: &str) -> io::Result<RbdPrStore> {
        let gid = image.instance_id();
        let addr = blocklist_addr(&image.addrs()?)?;
        Ok(RbdPrStore {
            inner: Arc::new(Inner {
                image,
                oid: format!("iscsi-rs.pr.{image_id}"),
                gid,
                addr,
                watch: Mutex::new(None),
            }),
        })
    }

    /// The object's name.
    #[cfg(test)]
    pub(crate) fn oid(&self) -> &str {
        &self.inner.oid
    }
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

impl SharedPrStore for RbdPrStore {
    fn read(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.image.object_read(&self.inner.oid, MAX_RECORD)
    }

    fn write_if(&self, expected: Option<u64>, epoch: u64, bytes: &[u8]) -> io::Result<bool> {
        let old = expected.map(|e| e.to_string());
        self.inner.image.object_cas(
            &self.inner.oid,
            EPOCH_XATTR,
            old.as_deref().map(str::as_bytes),
            epoch.to_string().as_bytes(),
            bytes,
        )
    }

    fn notify(&self) -> io::Result<Vec<u64>> {
        let reply = self
            .inner
            .image
            .notify(&self.inner.oid, b"pr", NOTIFY_TIMEOUT_MS)?;
        Ok(reply.acked.into_iter().map(|(gid, _)| gid).collect())
    }

    fn fence(&self, addrs: &[String]) -> io::Result<()> {
        for a in addrs {
            self.inner.image.blocklist_add(a, 0)?;
        }
        self.inner.image.wait_for_latest_osdmap()
    }

    fn me(&self) -> (u64, String) {
        (self.inner.gid, self.inner.addr.clone())
    }

    fn watch(&self, on_event: PrEventHandler) -> io::Result<()> {
        let events = self.inner.rewatch()?;
        let weak = Arc::downgrade(&self.inner);
        std::thread::Builder::new()
            .name("rbd-pr-watch".into())
            .spawn(move || run_watch(weak, events, on_event))?;
        Ok(())
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

/// The watch thread: each notify is handled (`on_event(false)`) and then
/// acknowledged if that says so; a broken watch is reported (`on_event(true)`) and
/// registered again, each second until that works (a fenced client never
/// does, and its LU's reservation state stays stale). Ends when the store
/// is dropped (its watch's pipe closes).
fn run_watch(weak: Weak<Inner>, first: WatchEvents, on_event: PrEventHandler) {
    let mut events = Some(first);
    loop {
        let Some(current) = &events else {
            std::thread::sleep(Duration::from_secs(1));
            let Some(inner) = weak.upgrade() else { return };
            if let Ok(fresh) = inner.rewatch() {
                events = Some(fresh);
                drop(inner);
                let _ = on_event(false);
            }
            continue;
        };
        let Some(event) = current.next() else { return };
        let Some(inner) = weak.upgrade() else { return };
        match event {
            WatchEvent::Notify {
                notify_id, cookie, ..
            } => {
                if !on_event(false) {
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
                let _ = on_event(true);
                if -err == EBLOCKLISTED {
                    eprintln!(
                        "rbd: this gateway's client of {} was blocklisted (fenced by another gateway)",
                        inner.oid
                    );
                }
                events = inner.rewatch().ok();
                drop(inner);
                if events.is_some() {
                    let _ = on_event(false);
                }
            }
        }
    }
}
