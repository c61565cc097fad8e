//! Gateways over one medium for the crate's unit tests: the shared
//! reservation record in memory, with watch, notify and fence as RADOS
//! gives them to `pr_shared` ([`SharedPrStore`]), so that the protocol
//! between gateways runs here without a cluster. Each watcher has a thread
//! of its own that takes its events in order, as a RADOS client's watch
//! does; a notify waits for every watcher's answer up to [`NOTIFY_WAIT`].

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::backstore::{Backstore, PrEvent, PrEventHandler, SharedPrStore};
use crate::test_store::TestStore;

/// How long a notify waits for the watchers' answers: far beyond what any
/// test holds a watcher up, so that only a watcher that is gone is late.
const NOTIFY_WAIT: Duration = Duration::from_secs(30);

/// One event for a watcher's thread, and where its answer goes.
type Delivery = (PrEvent, Sender<bool>);

/// The record, its watchers and the clients fenced, shared by every
/// gateway of one medium.
#[derive(Debug, Default)]
pub(crate) struct Cluster {
    record: Mutex<Option<(u64, Vec<u8>)>>,
    watchers: Mutex<Vec<(u64, Sender<Delivery>)>>,
    fenced: Mutex<Vec<String>>,
    next_gid: AtomicU64,
}

impl Cluster {
    /// The addresses fenced so far.
    pub(crate) fn fenced(&self) -> Vec<String> {
        lock(&self.fenced).clone()
    }

    /// The watch of client `gid` goes (its process died): it answers no
    /// notify from now on.
    pub(crate) fn lose(&self, gid: u64) {
        lock(&self.watchers).retain(|(g, _)| *g != gid);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One gateway's client of the record.
#[derive(Debug)]
pub(crate) struct Client {
    cluster: Arc<Cluster>,
    gid: u64,
}

/// The address of client `gid`, as the record lists it.
fn addr_of(gid: u64) -> String {
    format!("127.0.0.1:0/{gid}")
}

impl SharedPrStore for Client {
    fn read(&self) -> io::Result<Option<Vec<u8>>> {
        Ok(lock(&self.cluster.record).as_ref().map(|(_, b)| b.clone()))
    }

    fn write_if(&self, expected: Option<u64>, epoch: u64, bytes: &[u8]) -> io::Result<bool> {
        let mut record = lock(&self.cluster.record);
        if record.as_ref().map(|(e, _)| *e) != expected {
            return Ok(false);
        }
        *record = Some((epoch, bytes.to_vec()));
        Ok(true)
    }

    fn notify(&self) -> io::Result<Vec<u64>> {
        let watchers: Vec<_> = lock(&self.cluster.watchers).clone();
        let answers: Vec<_> = watchers
            .into_iter()
            .filter_map(|(gid, to)| {
                let (tx, rx) = channel();
                to.send((PrEvent::Changed, tx)).ok().map(|()| (gid, rx))
            })
            .collect();
        let deadline = Instant::now() + NOTIFY_WAIT;
        Ok(answers
            .into_iter()
            .filter(|(_, rx)| {
                let left = deadline.saturating_duration_since(Instant::now());
                rx.recv_timeout(left) == Ok(true)
            })
            .map(|(gid, _)| gid)
            .collect())
    }

    fn fence(&self, addrs: &[String]) -> io::Result<()> {
        lock(&self.cluster.fenced).extend(addrs.iter().cloned());
        lock(&self.cluster.watchers).retain(|(g, _)| !addrs.contains(&addr_of(*g)));
        Ok(())
    }

    fn me(&self) -> (u64, String) {
        (self.gid, addr_of(self.gid))
    }

    fn watch(&self, on_event: PrEventHandler) -> io::Result<()> {
        let (to, from) = channel::<Delivery>();
        std::thread::spawn(move || {
            for (event, answer) in from {
                let _ = answer.send(on_event(event));
            }
        });
        lock(&self.cluster.watchers).push((self.gid, to));
        Ok(())
    }
}

/// A gateway's store: the medium every gateway shares, and its client of
/// the record.
#[derive(Debug)]
pub(crate) struct GatewayStore {
    medium: Arc<TestStore>,
    client: Arc<Client>,
}

impl GatewayStore {
    /// A new gateway (a new client id) of `medium` in `cluster`.
    pub(crate) fn new(cluster: &Arc<Cluster>, medium: &Arc<TestStore>) -> Self {
        let gid = cluster.next_gid.fetch_add(1, Ordering::Relaxed) + 1;
        Self {
            medium: Arc::clone(medium),
            client: Arc::new(Client {
                cluster: Arc::clone(cluster),
                gid,
            }),
        }
    }

    /// Its client's id.
    pub(crate) fn gid(&self) -> u64 {
        self.client.gid
    }
}

impl Backstore for GatewayStore {
    fn block_size(&self) -> u32 {
        self.medium.block_size()
    }

    fn block_count(&self) -> u64 {
        self.medium.block_count()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.medium.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.medium.write_at(offset, buf)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.medium.unmap(offset, len)
    }

    fn unique_id(&self) -> u64 {
        self.medium.unique_id()
    }

    fn shared_pr(&self) -> Option<Arc<dyn SharedPrStore>> {
        Some(Arc::clone(&self.client) as Arc<dyn SharedPrStore>)
    }
}
