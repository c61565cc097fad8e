//! [`RbdBackstore`]: a Ceph RBD image through librbd, on a RADOS client of
//! its own (one per LU, so that blocklisting one LU's client — the fencing
//! of a later gateway group — fences nothing else).
//!
//! librbd is called synchronously from the [`Backstore`] methods: the store
//! answers `may_block()`, so the target runs its commands on a thread pool
//! and a slow OSD holds one pool thread, not the connection.
//!
//! What the cluster can do better than the SCSI layer's generic code, it
//! does: COMPARE AND WRITE of one 512-byte sector in the OSD (atomic for
//! every gateway of the image, which the LU's own lock is not), WRITE SAME
//! as one `writesame` op per object, GET LBA STATUS from the image's
//! allocated extents. A thread per store polls the image's size once a
//! second, so that an `rbd resize` becomes CAPACITY DATA HAS CHANGED.
//! Snapshots are rbd snapshots of the image, served read-only or cloned
//! into images of their own (`snapshots.rs`).
//!
//! All `unsafe` is in [`ffi`].

mod fence;
mod ffi;
mod gateway;
mod liveness;
mod pr;
mod snapshots;

pub use liveness::heartbeat_port;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak, mpsc};
use std::time::Duration;

use arc_swap::ArcSwap;

use iscsi_scsi::alua::{AluaGroup, AluaView, GatewayGroup};

use iscsi_scsi::backstore::{
    Allocation, AsyncIo, Backstore, BackstoreOpenError, IoFuture, SharedPrStore, Snapshots,
    WriteData, check_block_size, check_range,
};

/// What `rbd:POOL/IMAGE[,conf=PATH][,id=USER][,timeout=SECONDS]` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    /// The pool.
    pub pool: String,
    /// The image.
    pub image: String,
    /// The ceph.conf to read; `None`: librados's default search.
    pub conf: Option<String>,
    /// The cephx user without `client.`; `None`: `admin`.
    pub id: Option<String>,
    /// Seconds a cluster operation may take (`rados_osd_op_timeout` and
    /// `rados_mon_op_timeout`); `None`: [`DEFAULT_TIMEOUT_S`].
    pub timeout_s: Option<u32>,
}

/// The default of [`RbdSpec::timeout_s`]. Without a timeout librados waits
/// for a lost cluster forever: every command on the LU hangs (and with it
/// a pool thread, and the LU's state lock where a reservation change is
/// being written), and the initiator's own command timer (Linux: 30 s)
/// then aborts and resets, which never completes either. Failing the op
/// after 30 s turns it into NOT READY / LOGICAL UNIT COMMUNICATION
/// TIME-OUT, which the initiator retries or sends down another path (the
/// op may or may not have landed: a retried write writes the same data).
/// The same value as the initiator's, so that a brief OSD hiccup (a
/// restart, a peering) passes unseen while a gone cluster is reported in
/// about the time the initiator would have given up anyway.
pub const DEFAULT_TIMEOUT_S: u32 = 30;

/// Options this gateway sets on its RADOS client, after the conf file (so
/// they win over it), and why:
/// - `rbd_cache=false`: a write completes only when the OSDs hold it, so
///   FUA and SYNCHRONIZE CACHE cost nothing extra and nothing acknowledged
///   sits in one gateway's memory — which a failover to another gateway
///   would lose (tcmu-runner does the same).
/// - `rbd_skip_partial_discard=false`: Pacific skips discards smaller than
///   `rbd_discard_granularity_bytes` (64 KiB) by default, leaving the old
///   data; UNMAP must leave zeros (LBPRZ), so partial ranges are zeroed.
/// - `client_mount_timeout=10`: an unreachable cluster fails the LUN in
///   10 s with a message naming the monitors, instead of librados's 300 s.
const CLIENT_OPTIONS: &[(&str, &str)] = &[
    ("rbd_cache", "false"),
    ("rbd_skip_partial_discard", "false"),
    ("client_mount_timeout", "10"),
    // WRITE SAME of zeros writes zeros (the blocks stay mapped, as on
    // every other store) instead of librbd's default of discarding them.
    ("rbd_discard_on_zeroed_write_same", "false"),
];

/// How often the size is read again: `rbd_get_size` costs a lock and a
/// sequence check (librbd re-reads the header only after the header
/// watch it keeps anyway was told of a change), so the poll is cheap and
/// a resize is noticed within this time. Polling rather than
/// `rbd_update_watch`: its callback runs on a librbd thread, where this
/// crate runs no Rust code (`ffi`), and a pipe from there would still
/// need a thread of ours to read it.
const SIZE_POLL: Duration = Duration::from_secs(1);

/// The longest range one GET LBA STATUS descriptor is looked up in: each
/// 4 MiB object in it costs librbd one `list_snaps` from the OSD.
const ALLOCATION_WINDOW: u64 = 1 << 30;

/// Extents asked of librbd per lookup: a run longer than this many
/// extents is reported in pieces (the next descriptor goes on).
const ALLOCATION_EXTENTS: usize = 64;

/// An RBD image as a logical unit's medium.
pub struct RbdBackstore {
    shared: Arc<Shared>,
    spec: RbdSpec,
    block_size: u32,
    unique_id: u64,
    /// The snapshots this gateway serves as LUNs now (`snapshots.rs`).
    served: snapshots::Served,
}

/// What every I/O reads of the image, whichever client it goes through.
#[derive(Debug)]
struct Medium {
    block_size: u32,
    /// The size in blocks, as last read: every command reads it, only a
    /// resize writes it.
    block_count: AtomicU64,
    /// Set by the poll when the header is gone: every I/O then fails with
    /// ENOENT (MEDIUM NOT PRESENT) instead of reaching librbd.
    removed: AtomicBool,
    /// Wakes the poll before its second is up ([`Medium::failed`]).
    wake: mpsc::SyncSender<()>,
}

impl Medium {
    fn size(&self) -> u64 {
        self.block_count.load(Ordering::Acquire) * u64::from(self.block_size)
    }

    /// `Err(ENOENT)` once the image was removed ([`Shared::poll_presence`]).
    fn present(&self) -> io::Result<()> {
        if self.removed.load(Ordering::Acquire) {
            Err(io::Error::from_raw_os_error(2))
        } else {
            Ok(())
        }
    }

    /// Looks at an I/O error of librbd's: ENOENT is what librbd answers
    /// once it found the image's header gone, and the poll is woken to
    /// confirm it at once. That matters beyond the error itself: from
    /// then on librbd (with the exclusive-lock feature) holds every write
    /// until its header watch is back, which for a removed image is
    /// never, so the sooner [`Medium::present`] refuses I/O, the fewer
    /// writes wait there for good.
    fn failed(&self, e: io::Error) -> io::Error {
        if e.kind() == io::ErrorKind::NotFound && !self.removed.load(Ordering::Acquire) {
            self.wake();
        }
        e
    }

    /// Wakes the poll now (the image may be gone, or the fence tripped).
    fn wake(&self) {
        // Full: a wake is pending already.
        let _ = self.wake.try_send(());
    }
}

/// What the store and its size poll share.
struct Shared {
    /// The client I/O goes through now: replaced when a fenced gateway
    /// rejoins ([`Shared::rejoin`]).
    client: ArcSwap<RbdAsync>,
    medium: Arc<Medium>,
    fence: Arc<fence::Fence>,
    /// The LU's persistent reservation record, shared with every gateway
    /// that exports the image.
    pr: Arc<pr::RbdPrStore>,
    /// What connecting a new client takes.
    reconnect: Reconnect,
    /// The gateway group and the LU's view in it; `None` outside a group.
    group: Option<(GatewayGroup, Arc<AluaGroup>)>,
    /// The current client's keeper (in a group): stopped, and the lock let
    /// go so that a peer takes over at once, when the store goes.
    keeper: Mutex<Option<gateway::Keeper>>,
    /// Set by the poll when the size changed, taken by
    /// [`Backstore::take_capacity_change`].
    resized: AtomicBool,
    /// The last size error the poll logged (errno), so that an image gone
    /// for good is said once, not every second.
    failing: AtomicU64,
    name: String,
    /// The image's header object (`rbd_header.<id>`), which the poll also
    /// looks for: librbd keeps answering from what it cached after the
    /// image is removed (for 30 s and more: nothing tells it), reading
    /// zeros from the data objects that are gone and writing new ones.
    header: String,
}

/// Where the store's client connects, kept to connect a new one.
struct Reconnect {
    spec: RbdSpec,
    options: Vec<(String, String)>,
    /// The image's id: a new client must find the same image, not one
    /// created under the same name since.
    image_id: String,
    /// The last reason a new client failed, logged once until it changes.
    failing: Mutex<Option<String>>,
}

impl Reconnect {
    fn open(&self) -> Result<ffi::Image, ffi::OpenError> {
        self.open_at(None)
    }

    /// A new client of the image's cluster with the store's options, and
    /// the image opened on it: its head, or snapshot `snap` read-only.
    fn open_at(&self, snap: Option<&str>) -> Result<ffi::Image, ffi::OpenError> {
        let options: Vec<(&str, &str)> = self
            .options
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        ffi::Image::open(ffi::Target {
            conf: self.spec.conf.as_deref(),
            id: self.spec.id.as_deref(),
            pool: &self.spec.pool,
            image: &self.spec.image,
            snap,
            options: &options,
        })
    }
}

impl Shared {
    /// The current client's image.
    fn image(&self) -> Arc<ffi::Image> {
        Arc::clone(&self.client.load().image)
    }

    /// The fence tripped: connects a new client and goes on through it
    /// (see `fence.rs`). Runs on the poll's thread, a second apart while
    /// it fails; the reason is logged when it changes.
    fn rejoin(&self) {
        // The fenced client's keeper first, so that no look of it runs
        // once the fence is open again.
        drop(
            self.keeper
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let generation = self.fence.generation() + 1;
        match self.connect_again(generation) {
            Ok(()) => {
                *self
                    .reconnect
                    .failing
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
            }
            Err(why) => {
                let mut failing = self
                    .reconnect
                    .failing
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if failing.as_deref() != Some(why.as_str()) {
                    tracing::error!(
                        "{}: rejoining after the fence: {why}; trying again",
                        self.name
                    );
                    *failing = Some(why);
                }
            }
        }
    }

    fn connect_again(&self, generation: u64) -> Result<(), String> {
        let image = self
            .reconnect
            .open()
            .map_err(|e| format!("{}: {}", e.step, e.error))?;
        let id = image
            .id()
            .map_err(|e| format!("reading the image's id: {e}"))?;
        if id != self.reconnect.image_id {
            return Err(format!(
                "the image is another one now (id {id}, was {}): not serving it",
                self.reconnect.image_id
            ));
        }
        let image = Arc::new(image);
        // Refused by the fence until it opens for this generation.
        self.client.store(Arc::new(RbdAsync {
            image: Arc::clone(&image),
            generation,
            medium: Arc::clone(&self.medium),
            fence: Arc::clone(&self.fence),
        }));
        match self.pr.rejoin(Arc::clone(&image), generation) {
            Ok(true) => {}
            Ok(false) => return Err("joining the reservation record failed".into()),
            Err(e) => return Err(format!("watching the reservation record: {e}")),
        }
        self.fence.rejoined(generation);
        // The port stays unavailable until the keeper's first look.
        self.start_keeper(image, generation)
            .map_err(|e| format!("starting the keeper: {e}"))
    }

    /// In a gateway group, starts the keeper of `image`, the client of
    /// generation `generation` (nothing outside a group).
    fn start_keeper(&self, image: Arc<ffi::Image>, generation: u64) -> io::Result<()> {
        let Some((group, alua)) = &self.group else {
            return Ok(());
        };
        let keeper = gateway::start(
            image,
            generation,
            self.name.clone(),
            group.clone(),
            Arc::clone(alua),
            Arc::clone(&self.fence),
        )?;
        *self.keeper.lock().unwrap_or_else(PoisonError::into_inner) = Some(keeper);
        Ok(())
    }

    /// Whether the image is still there (its header object exists); says
    /// so in the log when that changes. An error reaching the cluster
    /// leaves the answer as it was.
    fn poll_presence(&self) {
        let Ok(present) = self.image().object_exists(&self.header) else {
            return;
        };
        let was_removed = self.medium.removed.swap(!present, Ordering::AcqRel);
        if !present && !was_removed {
            tracing::error!(
                "{}: the image was removed (its header {} is gone): every command fails with \
                 MEDIUM NOT PRESENT until the LUN is removed",
                self.name,
                self.header
            );
        } else if present && was_removed {
            tracing::warn!("{}: the image's header is back: serving again", self.name);
        }
    }

    /// Reads the image's size and publishes a change.
    fn poll_size(&self) {
        match self.image().size() {
            Ok(size) => {
                if self.failing.swap(0, Ordering::Relaxed) != 0 {
                    tracing::info!("{}: the image answers again", self.name);
                }
                let blocks = size / u64::from(self.medium.block_size);
                let old = self.medium.block_count.swap(blocks, Ordering::AcqRel);
                if old != blocks {
                    tracing::warn!(
                        "{}: the image was resized to {size} bytes ({blocks} blocks of {}, \
                         was {old}): CAPACITY DATA HAS CHANGED for every nexus",
                        self.name,
                        self.medium.block_size
                    );
                    self.resized.store(true, Ordering::Release);
                }
            }
            Err(e) => {
                let code = e.raw_os_error().unwrap_or(-1) as u64;
                if self.failing.swap(code, Ordering::Relaxed) != code {
                    let why = if e.kind() == io::ErrorKind::NotFound {
                        " (the image was removed: every command fails until the LUN is \
                         removed or the image comes back)"
                    } else {
                        ""
                    };
                    tracing::error!("{}: reading the image's size: {e}{why}", self.name);
                }
            }
        }
    }
}

/// The size poll's loop: runs every [`SIZE_POLL`], or at once when an I/O
/// error wakes it ([`Medium::failed`]), until the store is gone.
fn poll_sizes(shared: Weak<Shared>, wake: mpsc::Receiver<()>) {
    while let Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) = wake.recv_timeout(SIZE_POLL) {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.fence.tripped() {
            shared.rejoin();
            continue;
        }
        shared.poll_presence();
        shared.poll_size();
    }
}

impl fmt::Debug for RbdBackstore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdBackstore")
            .field("pool", &self.spec.pool)
            .field("image", &self.spec.image)
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count())
            .finish()
    }
}

impl RbdBackstore {
    /// Connects to the cluster `spec` names and opens its image, with
    /// logical blocks of `block_size` bytes. The image's size must be a
    /// multiple of `block_size`. The error names the step that failed (the
    /// monitors tried, the pool, the image) and librados's reason.
    ///
    /// The LU identifier comes from the cluster's fsid, the pool and the
    /// image's id, not from the target's name: every gateway that exports
    /// the image reports the same identifier, which multipath needs to see
    /// one device behind several gateways.
    pub fn open(spec: &RbdSpec, block_size: u32) -> Result<RbdBackstore, BackstoreOpenError> {
        Self::open_in_group(spec, block_size, None)
    }

    /// Loads librbd and librados unless this process already has (the first
    /// image to open does it too): what a configuration check runs, so that
    /// a gateway without them says so before it opens anything. The error
    /// says what to install ("librbd.so.1 not found: install librbd1", kind
    /// `NotFound`). `$ISCSI_LIBRBD` names another file to load than
    /// `librbd.so.1` (tests; a librbd outside the loader's search path).
    pub fn load_library() -> io::Result<()> {
        ffi::load().map(drop)
    }

    /// [`RbdBackstore::open`] for a gateway of `group`: the LU answers with
    /// implicit ALUA, and a keeper thread decides from the cluster which
    /// gateway owns it (the image's exclusive lock; see `gateway.rs`). It
    /// starts transitioning on every port until the first look.
    pub fn open_in_group(
        spec: &RbdSpec,
        block_size: u32,
        group: Option<&GatewayGroup>,
    ) -> Result<RbdBackstore, BackstoreOpenError> {
        check_block_size(block_size)?;
        let timeout = spec.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S).to_string();
        let mut options: Vec<(String, String)> = CLIENT_OPTIONS
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        options.push(("rados_osd_op_timeout".into(), timeout.clone()));
        options.push(("rados_mon_op_timeout".into(), timeout));
        let mut reconnect = Reconnect {
            spec: spec.clone(),
            options,
            image_id: String::new(),
            failing: Mutex::new(None),
        };
        let image = reconnect.open().map_err(|e| {
            BackstoreOpenError::Io(io::Error::new(
                e.error.kind(),
                format!("rbd:{}/{}: {}: {}", spec.pool, spec.image, e.step, e.error),
            ))
        })?;
        let named = |what: &str| {
            let spec = spec.clone();
            let what = what.to_owned();
            move |e: io::Error| {
                io::Error::new(
                    e.kind(),
                    format!("rbd:{}/{}: {what}: {e}", spec.pool, spec.image),
                )
            }
        };
        let size = image.size().map_err(named("reading the size"))?;
        if size == 0 || size % u64::from(block_size) != 0 {
            return Err(BackstoreOpenError::InvalidSize { size, block_size });
        }
        let image_id = image.id().map_err(named("reading the image's id"))?;
        let identity = format!(
            "{}/{}/{}",
            image.fsid().map_err(named("reading the cluster's fsid"))?,
            spec.pool,
            image_id
        );
        reconnect.image_id = image_id.clone();
        let image = Arc::new(image);
        let name = format!("rbd:{}/{}", spec.pool, spec.image);
        let group = group.map(|group| {
            let alua = Arc::new(AluaGroup::new(AluaView::owned_by(
                group.members.clone(),
                None,
            )));
            (group.clone(), alua)
        });
        let fence = Arc::new(fence::Fence::new(
            group.as_ref().map_or(0, |(g, _)| g.port),
            name.clone(),
            group.as_ref().map(|(_, alua)| Arc::clone(alua)),
        ));
        let pr = pr::RbdPrStore::new(Arc::clone(&image), &image_id, Arc::clone(&fence))
            .map_err(named("reading this client's address"))?;
        let (wake, woken) = mpsc::sync_channel(1);
        let medium = Arc::new(Medium {
            block_size,
            block_count: AtomicU64::new(size / u64::from(block_size)),
            removed: AtomicBool::new(false),
            wake,
        });
        let generation = fence.generation();
        let shared = Arc::new(Shared {
            client: ArcSwap::from_pointee(RbdAsync {
                image: Arc::clone(&image),
                generation,
                medium: Arc::clone(&medium),
                fence: Arc::clone(&fence),
            }),
            medium,
            fence,
            pr: Arc::new(pr),
            reconnect,
            group,
            keeper: Mutex::new(None),
            resized: AtomicBool::new(false),
            failing: AtomicU64::new(0),
            name,
            header: format!("rbd_header.{image_id}"),
        });
        shared
            .start_keeper(image, generation)
            .map_err(named("starting the gateway group's keeper"))?;
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("rbd-size".into())
            .spawn(move || poll_sizes(weak, woken))
            .map_err(|e| BackstoreOpenError::Io(named("starting the size poll")(e)))?;
        Ok(RbdBackstore {
            shared,
            spec: spec.clone(),
            block_size,
            unique_id: fnv1a(identity.as_bytes()),
            served: snapshots::Served::default(),
        })
    }

    fn size(&self) -> u64 {
        self.shared.medium.size()
    }

    /// The client to run a command through, unless the image was removed
    /// ([`Medium::present`]) or the client is fenced ([`fence::Fence`]).
    fn client(&self) -> io::Result<Arc<RbdAsync>> {
        let client = self.shared.client.load_full();
        client.admit()?;
        Ok(client)
    }

    /// Reads the size now instead of at the next poll (tests).
    #[cfg(all(test, feature = "ceph-tests"))]
    fn poll_size_now(&self) {
        self.shared.poll_size();
    }
}

/// One RADOS client of the LU, and the store's READ and WRITE through
/// librbd's AIO on it (`ffi/aio.rs`): the command waits on the target's
/// task, woken through the image's eventfd, instead of holding a pool
/// thread through a synchronous call. A command planned on a client that
/// has been fenced since fails instead of reaching its successor.
struct RbdAsync {
    image: Arc<ffi::Image>,
    /// Its generation ([`fence::Fence`]).
    generation: u64,
    medium: Arc<Medium>,
    fence: Arc<fence::Fence>,
}

impl RbdAsync {
    /// `Ok` while this client may serve and the image is there.
    fn admit(&self) -> io::Result<()> {
        self.medium.present()?;
        self.fence.admit(self.generation)
    }

    /// Passes an I/O error on, tripping the fence first when it says this
    /// client was blocklisted, waking the poll when it says the image is
    /// gone.
    fn failed(&self, e: io::Error) -> io::Error {
        failed(&self.fence, self.generation, &self.medium, e)
    }
}

impl AsyncIo for RbdAsync {
    fn read(&self, offset: u64, buf: Vec<u8>) -> IoFuture<(Vec<u8>, io::Result<()>)> {
        if let Err(e) = check_range(offset, buf.len() as u64, self.medium.size()) {
            return Box::pin(std::future::ready((buf, Err(e))));
        }
        if let Err(e) = self.admit() {
            return Box::pin(std::future::ready((buf, Err(e))));
        }
        let read = self.image.aio_read(offset, buf);
        let (fence, generation) = (Arc::clone(&self.fence), self.generation);
        let medium = Arc::clone(&self.medium);
        Box::pin(async move {
            let (buf, r) = read.await;
            (buf, r.map_err(|e| failed(&fence, generation, &medium, e)))
        })
    }

    /// FUA as an op flag on a write in one buffer (see
    /// [`Backstore::write_through`]); a write in pieces takes no flags, and
    /// needs none with the client's cache off.
    fn write(
        &self,
        offset: u64,
        data: Box<dyn WriteData>,
        len: usize,
        through: bool,
    ) -> IoFuture<io::Result<()>> {
        if let Err(e) = check_range(offset, len as u64, self.medium.size()) {
            return Box::pin(std::future::ready(Err(e)));
        }
        if let Err(e) = self.admit() {
            return Box::pin(std::future::ready(Err(e)));
        }
        let write = self.image.aio_write(offset, data, len, fua(through));
        let (fence, generation) = (Arc::clone(&self.fence), self.generation);
        let medium = Arc::clone(&self.medium);
        Box::pin(async move {
            write
                .await
                .map_err(|e| failed(&fence, generation, &medium, e))
        })
    }

    /// Once the fence has opened again (the rejoin done), at most
    /// [`fence::HOLD_AT_MOST`] from now.
    fn ready(&self) -> IoFuture<()> {
        let fence = Arc::clone(&self.fence);
        Box::pin(async move { fence.rejoined_within(fence::HOLD_AT_MOST).await })
    }
}

/// What every failed I/O of a client goes through: the fence looks for
/// EBLOCKLISTED ([`fence::Fence::check_io`]), the medium for ENOENT
/// ([`Medium::failed`]). An I/O that trips the fence wakes the poll, which
/// rejoins at once rather than at its next second: the commands waiting
/// for it ([`AsyncIo::ready`]) wait that much less.
fn failed(fence: &fence::Fence, generation: u64, medium: &Medium, e: io::Error) -> io::Error {
    let tripped = fence.tripped();
    let e = fence.check_io(generation, e);
    if !tripped && fence.tripped() {
        medium.wake();
    }
    medium.failed(e)
}

/// librados op flags for a write that must be durable when it completes.
fn fua(through: bool) -> std::ffi::c_int {
    if through { ffi::OP_FLAG_FADVISE_FUA } else { 0 }
}

/// FNV-1a, 64 bits: a stable hash (the same in every gateway and release).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3)
    })
}

impl Backstore for RbdBackstore {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.shared.medium.block_count.load(Ordering::Acquire)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        let c = self.client()?;
        c.image.read(offset, buf).map_err(|e| c.failed(e))
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        let c = self.client()?;
        c.image.write(offset, buf, 0).map_err(|e| c.failed(e))
    }

    /// FUA on the write itself: with the client's cache off a completed
    /// write is on the OSDs already, and the flag keeps it so if a conf
    /// file turns a cache on; no image-wide flush.
    fn write_through(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        let c = self.client()?;
        c.image
            .write(offset, buf, ffi::OP_FLAG_FADVISE_FUA)
            .map_err(|e| c.failed(e))
    }

    /// One request for all the pieces, gathered into one buffer: the
    /// synchronous API has no vectored write, and a request per piece
    /// costs a round trip each, in series. (A WRITE command's pieces go
    /// through [`AsyncIo`] as one `rbd_aio_writev`, uncopied; this path is
    /// for the rarer commands that write through the synchronous methods.)
    fn write_pieces(&self, offset: u64, pieces: &mut [Vec<u8>], len: usize) -> io::Result<()> {
        iscsi_scsi::backstore::check_pieces(pieces, len)?;
        check_range(offset, len as u64, self.size())?;
        let mut whole = Vec::with_capacity(len);
        for piece in pieces.iter() {
            let n = piece.len().min(len - whole.len());
            whole.extend_from_slice(&piece[..n]);
        }
        let c = self.client()?;
        c.image.write(offset, &whole, 0).map_err(|e| c.failed(e))
    }

    /// As [`Backstore::write_pieces`]: with the client's cache off a
    /// completed write is already on the OSDs.
    fn write_pieces_through(
        &self,
        offset: u64,
        pieces: &mut [Vec<u8>],
        len: usize,
    ) -> io::Result<()> {
        self.write_pieces(offset, pieces, len)
    }

    fn flush(&self) -> io::Result<()> {
        let c = self.client()?;
        c.image.flush().map_err(|e| c.failed(e))
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, len, self.size())?;
        let c = self.client()?;
        c.image.discard(offset, len).map_err(|e| c.failed(e))
    }

    fn unique_id(&self) -> u64 {
        self.unique_id
    }

    fn is_thin(&self) -> bool {
        true
    }

    fn async_io(&self) -> Option<Arc<dyn AsyncIo>> {
        Some(self.shared.client.load_full() as Arc<dyn AsyncIo>)
    }

    /// In the OSD when the range lies in one 512-byte sector (librbd
    /// refuses more: see [`ffi::offload::CAW_SECTOR`]), which is what VMware's ATS
    /// sends on a 512-byte LU; anything larger is left to the SCSI layer's
    /// compare and write under the LU's lock, which it runs only while no
    /// other gateway serves the LU (a gateway group, or this one alone in
    /// the reservation record) and refuses otherwise.
    fn compare_and_write(
        &self,
        offset: u64,
        expect: &[u8],
        data: &[u8],
        through: bool,
    ) -> Option<io::Result<Option<u64>>> {
        let len = data.len() as u64;
        if !self.compares_in_one_step(offset, len) {
            return None;
        }
        if let Err(e) = check_range(offset, len, self.size()) {
            return Some(Err(e));
        }
        Some(self.client().and_then(|c| {
            c.image
                .compare_and_write(offset, expect, data, fua(through))
                .map_err(|e| c.failed(e))
        }))
    }

    /// Within one 512-byte sector (see `compare_and_write`).
    fn compares_in_one_step(&self, offset: u64, len: u64) -> bool {
        len != 0 && offset % ffi::offload::CAW_SECTOR + len <= ffi::offload::CAW_SECTOR
    }

    fn write_same(
        &self,
        offset: u64,
        len: u64,
        pattern: &[u8],
        through: bool,
    ) -> Option<io::Result<()>> {
        if let Err(e) = check_range(offset, len, self.size()) {
            return Some(Err(e));
        }
        Some(self.client().and_then(|c| {
            c.image
                .write_same(offset, len, pattern, fua(through))
                .map_err(|e| c.failed(e))
        }))
    }

    /// From the extents librbd reports as holding data (whole objects'
    /// worth of data, or what was written of them), looked up in at most
    /// [`ALLOCATION_WINDOW`] bytes.
    fn allocation_status(&self, offset: u64, max_len: u64) -> io::Result<Allocation> {
        if max_len == 0 {
            return Err(iscsi_scsi::backstore::out_of_range());
        }
        check_range(offset, max_len, self.size())?;
        let window = max_len.min(ALLOCATION_WINDOW);
        let c = self.client()?;
        let extents = c
            .image
            .allocated(offset, window, ALLOCATION_EXTENTS)
            .map_err(|e| c.failed(e))?;
        Ok(run_from(offset, window, &extents))
    }

    fn take_capacity_change(&self) -> bool {
        self.shared.resized.load(Ordering::Relaxed)
            && self.shared.resized.swap(false, Ordering::AcqRel)
    }

    fn shared_pr(&self) -> Option<Arc<dyn SharedPrStore>> {
        Some(Arc::clone(&self.shared.pr) as Arc<dyn SharedPrStore>)
    }

    /// The LU's ALUA view, which the keeper sets; `None` outside a group.
    fn alua(&self) -> Option<Arc<AluaGroup>> {
        self.shared.group.as_ref().map(|(_, alua)| Arc::clone(alua))
    }

    /// rbd snapshots of the image (`snapshots.rs`).
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }
}

/// The run that starts at `offset` in a window of `window` bytes, given
/// the extents librbd reported in it (in order, none before `offset`):
/// mapped up to the end of the contiguous extents holding data from
/// `offset`, else unmapped up to the first extent (or the window's end).
fn run_from(offset: u64, window: u64, extents: &[ffi::offload::Extent]) -> Allocation {
    let end = offset + window;
    let mut present = extents.iter().filter(|e| e.len > 0 && e.offset < end);
    let Some(first) = present.next() else {
        return Allocation {
            mapped: false,
            len: window,
        };
    };
    if first.offset > offset {
        return Allocation {
            mapped: false,
            len: first.offset - offset,
        };
    }
    let mapped = first.exists;
    let mut run_end = first.offset + first.len;
    for e in present {
        if e.offset != run_end || e.exists != mapped {
            break;
        }
        run_end = e.offset + e.len;
    }
    Allocation {
        mapped,
        len: run_end.min(end).saturating_sub(offset).max(1),
    }
}

// Against a running cluster (scripts/ceph-dev): the cargo feature
// `ceph-tests`, as scripts/test runs them.
#[cfg(all(test, feature = "ceph-tests"))]
mod tests;
