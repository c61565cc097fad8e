//! Per-logical-unit state shared by every session: unit attentions per I_T
//! nexus (SAM-5 §5.14), the SPC-2 reservation, persistent reservations, the
//! changeable mode parameters, and the lock that makes COMPARE AND WRITE
//! atomic against every other write.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use arc_swap::ArcSwap;
use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};

use crate::alua::AluaGroup;
use crate::backstore::{Backstore, SharedPrStore};
use crate::medium::{LuOptions, Medium};
use crate::nexus::NexusKey;
use crate::outcome::Fail;
use crate::pr_record::Gateway;
use crate::pr_state::PrState;
use crate::sanitize_state::SanitizeState;
use iscsi_sense::Sense;

/// The I_T nexuses that have sent the target a command (SAM-5 §5.14: the
/// nexuses a unit attention "for every I_T nexus" is queued for): owned
/// by the target, read by its LUs when a change made by another gateway
/// (a LOGICAL UNIT RESET) concerns every nexus of this one.
pub(crate) type KnownNexuses = Arc<ArcSwap<HashSet<NexusKey>>>;

/// Most unit attentions queued for one nexus; older ones are dropped first
/// (SAM-5 §5.14 lets a device server report only the most recent).
const MAX_QUEUED_UAS: usize = 8;

/// The mode parameters an initiator can change with MODE SELECT (SPC-4
/// §7.5); one set per LU, shared by every nexus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ModeParams {
    /// Caching page WCE: writes may stay in a volatile cache until
    /// SYNCHRONIZE CACHE. With WCE 0 every write is written through.
    pub wce: bool,
    /// Control page D_SENSE: report sense data in descriptor format.
    pub d_sense: bool,
    /// Control page SWP (software write protect): writes fail with DATA
    /// PROTECT / WRITE PROTECTED.
    pub swp: bool,
}

impl ModeParams {
    /// The default (power-on) values.
    pub const DEFAULT: Self = Self {
        wce: true,
        d_sense: false,
        swp: false,
    };

    /// As `pr_record` keeps them (bit 0 WCE, 1 D_SENSE, 2 SWP).
    pub(crate) const fn to_bits(self) -> u8 {
        (self.wce as u8) | (self.d_sense as u8) << 1 | (self.swp as u8) << 2
    }

    pub(crate) const fn from_bits(bits: u8) -> Self {
        Self {
            wce: bits & 1 != 0,
            d_sense: bits & 2 != 0,
            swp: bits & 4 != 0,
        }
    }
}

// A version 1 shared record means the power-on mode parameters.
const _: () = assert!(ModeParams::DEFAULT.to_bits() == crate::pr_record::DEFAULT_MODE);

/// The mutable state of one LU.
#[derive(Debug)]
pub(crate) struct LuState {
    /// Pending unit attentions per nexus.
    uas: HashMap<NexusKey, VecDeque<Sense>>,
    /// The holder of an SPC-2 RESERVE(6)/(10) reservation.
    pub spc2: Option<NexusKey>,
    /// Persistent reservations.
    pub pr: PrState,
    /// Current mode parameters.
    pub mode: ModeParams,
    /// SANITIZE running or failed: every command is checked against it.
    pub sanitize: SanitizeState,
    /// A removable medium's state (loaded or not, who prevents removal).
    pub medium: Medium,
    /// Whether APTPL can be honoured (the state lives in a cluster).
    pub ptpl_capable: bool,
    /// With a shared state ([`LogicalUnit::shared`]): the epoch `pr` is the
    /// state of, and the gateways the record lists.
    pub cluster: ClusterView,
}

/// What a gateway knows of the shared record besides the state itself.
#[derive(Debug, Default, Clone)]
pub(crate) struct ClusterView {
    pub epoch: u64,
    pub gateways: Vec<Gateway>,
    /// The record's count of LOGICAL UNIT RESETs as of `epoch`.
    pub resets: u64,
    /// The ASCQ of the last one's unit attention.
    pub reset_ascq: u8,
}

impl LuState {
    /// Queues `sense` for `nexus`, replacing an identical pending one.
    pub fn raise_for(&mut self, nexus: &NexusKey, sense: Sense) {
        let q = self.uas.entry(nexus.clone()).or_default();
        q.retain(|s| *s != sense);
        if q.len() >= MAX_QUEUED_UAS {
            q.pop_front();
        }
        q.push_back(sense);
    }

    /// Queues `sense` for every nexus in `nexuses` except `except`.
    pub fn raise_for_all<'a>(
        &mut self,
        nexuses: impl IntoIterator<Item = &'a NexusKey>,
        except: Option<&NexusKey>,
        sense: Sense,
    ) {
        for n in nexuses {
            if Some(n) != except {
                self.raise_for(n, sense);
            }
        }
    }

    /// Takes the oldest unit attention pending for `nexus`.
    pub fn take_ua(&mut self, nexus: &NexusKey) -> Option<Sense> {
        let q = self.uas.get_mut(nexus)?;
        let s = q.pop_front();
        if q.is_empty() {
            self.uas.remove(nexus);
        }
        s
    }

    /// What a LOGICAL UNIT RESET (or a target reset) does to the state
    /// (SAM-5 §6.3.3): the SPC-2 reservation is released, mode parameters
    /// return to their defaults, every prevention of medium removal ends
    /// (SBC-3 §5.11; the medium stays loaded or ejected as it was), and
    /// every nexus of `nexuses` gets `ua`. Persistent reservations survive
    /// (SPC-4 §5.12.3).
    pub fn reset<'a>(&mut self, nexuses: impl IntoIterator<Item = &'a NexusKey>, ua: Sense) {
        self.spc2 = None;
        self.mode = ModeParams::DEFAULT;
        self.medium.prevented.clear();
        self.raise_for_all(nexuses, None, ua);
    }

    /// Forgets every unit attention pending for `nexus`.
    pub fn drop_nexus(&mut self, nexus: &NexusKey) {
        self.uas.remove(nexus);
    }

    /// Whether a command other than RESERVE and RELEASE (which conflict
    /// with any registration) can run without looking at this state: no
    /// unit attention pending for anybody, no SPC-2 or persistent
    /// reservation, no sanitize running or failed.
    /// An ejected medium is not quiet either: every command must look.
    fn is_quiet(&self) -> bool {
        self.uas.is_empty()
            && self.spc2.is_none()
            && self.pr.reservation.is_none()
            && self.sanitize.is_idle()
            && !self.medium.ejected
    }
}

/// One logical unit.
#[derive(Debug)]
pub(crate) struct LogicalUnit {
    pub backstore: Arc<dyn Backstore>,
    /// Where the persistent reservation state is kept when other gateways
    /// share it ([`Backstore::shared_pr`]); `None`: in `state` only.
    pub shared: Option<Arc<dyn SharedPrStore>>,
    /// With `shared`: the cached state cannot be trusted (the watch broke,
    /// this gateway was fenced, the record did not load) until a reload
    /// succeeds; persistent reservation commands fail meanwhile.
    pub pr_stale: AtomicBool,
    /// The store's [`Backstore::lu_options`], read once.
    pub options: LuOptions,
    state: Mutex<LuState>,
    /// [`LuState::is_quiet`] as of the last change of the state: every
    /// command to the LU, from every session on every core, reads it, and
    /// only a change (a unit attention, a reservation) writes it, so the
    /// common command takes no lock and writes no line the cores share.
    quiet: AtomicBool,
    /// The state's mode parameters, for the same reason.
    mode: AtomicU8,
    /// Writes hold it shared; COMPARE AND WRITE holds it exclusively for its
    /// read, compare and write (SBC-3 §5.2: the whole command is atomic with
    /// respect to every other write to the LU). Sharded by thread: a write
    /// takes only its own thread's shard, so writes from many cores do not
    /// share the lock's cache line; the exclusive holder takes them all.
    io: ShardedLock<()>,
    /// Writes in flight through the store's [`AsyncIo`](crate::backstore::AsyncIo),
    /// which cannot hold `io` across their wait: counted instead, and
    /// [`LogicalUnit::write_exclusive`] waits for the count to drain.
    async_writes: AtomicUsize,
    /// Moved on when the state the commands were checked against may have
    /// changed behind them (a fenced gateway rejoining: see
    /// [`LogicalUnit::write_shared_at`]).
    io_epoch: AtomicU64,
    /// The target's nexuses (see [`KnownNexuses`]).
    pub nexuses: KnownNexuses,
    /// The store's ALUA group ([`Backstore::alua`]), read once: `None` for
    /// an LU that one process alone serves.
    pub alua: Option<Arc<AluaGroup>>,
    /// The generation of `alua`'s view whose change this LU has reported
    /// (ASYMMETRIC ACCESS STATE CHANGED to every nexus, once).
    alua_seen: AtomicU64,
}

impl LogicalUnit {
    pub fn new(backstore: Arc<dyn Backstore>, nexuses: KnownNexuses) -> Self {
        let shared = backstore.shared_pr();
        let alua = backstore.alua();
        Self {
            options: backstore.lu_options(),
            pr_stale: AtomicBool::new(shared.is_some()),
            backstore,
            state: Mutex::new(LuState {
                uas: HashMap::new(),
                spc2: None,
                pr: PrState::default(),
                mode: ModeParams::DEFAULT,
                sanitize: SanitizeState::Idle,
                medium: Medium::default(),
                ptpl_capable: shared.is_some(),
                cluster: ClusterView::default(),
            }),
            shared,
            quiet: AtomicBool::new(true),
            mode: AtomicU8::new(ModeParams::DEFAULT.to_bits()),
            io: ShardedLock::new(()),
            async_writes: AtomicUsize::new(0),
            io_epoch: AtomicU64::new(0),
            nexuses,
            alua_seen: AtomicU64::new(alua.as_ref().map_or(0, |a| a.generation())),
            alua,
        }
    }

    /// Whether the ALUA view changed since the LU last looked: true once
    /// per change, for the one caller that then raises the unit attention
    /// (two commands that see the change at once cannot both report it).
    pub fn alua_changed(&self) -> bool {
        let Some(group) = &self.alua else {
            return false;
        };
        let now = group.generation();
        let seen = self.alua_seen.load(Ordering::Acquire);
        now != seen
            && self
                .alua_seen
                .compare_exchange(seen, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The state, locked; what the holder changes is published to
    /// [`LogicalUnit::is_quiet`] and [`LogicalUnit::mode`] when it lets go.
    pub fn state(&self) -> LuStateGuard<'_> {
        LuStateGuard {
            lu: self,
            guard: self.state.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Whether no unit attention or reservation is held on the LU: a
    /// command but RESERVE and RELEASE may then skip
    /// [`LogicalUnit::state`].
    pub fn is_quiet(&self) -> bool {
        self.quiet.load(Ordering::Acquire)
    }

    /// Shared write access (any write but COMPARE AND WRITE).
    pub fn write_shared(&self) -> ShardedLockReadGuard<'_, ()> {
        self.io.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The I/O epoch, read before a command is checked.
    pub fn io_epoch(&self) -> u64 {
        self.io_epoch.load(Ordering::Acquire)
    }

    /// Moves the I/O epoch on, under [`LogicalUnit::write_exclusive`]:
    /// the writes checked before it can no longer start.
    pub(crate) fn next_io_epoch(&self) {
        self.io_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// [`LogicalUnit::write_shared`] for a write checked in I/O epoch
    /// `epoch`: refused when the epoch moved on meanwhile, because the
    /// state it was checked against (a reservation, say) may be gone. The
    /// write does not run; it ends in BUSY, as the commands the fenced store
    /// refused just before it did, and sent again it is checked against the
    /// state the rejoin brought.
    pub(crate) fn write_shared_at(&self, epoch: u64) -> Result<ShardedLockReadGuard<'_, ()>, Fail> {
        let guard = self.write_shared();
        self.still_in(epoch)?;
        Ok(guard)
    }

    /// [`LogicalUnit::write_exclusive`] for a write checked in I/O epoch
    /// `epoch` (see [`LogicalUnit::write_shared_at`]).
    pub(crate) fn write_exclusive_at(
        &self,
        epoch: u64,
    ) -> Result<ShardedLockWriteGuard<'_, ()>, Fail> {
        let guard = self.write_exclusive();
        self.still_in(epoch)?;
        Ok(guard)
    }

    fn still_in(&self, epoch: u64) -> Result<(), Fail> {
        if self.io_epoch() == epoch {
            Ok(())
        } else {
            Err(Fail::Busy)
        }
    }

    /// Exclusive write access (COMPARE AND WRITE, ORWRITE, SANITIZE): no
    /// other write starts while it is held, and the asynchronous writes
    /// already in flight have ended when it is granted.
    pub fn write_exclusive(&self) -> ShardedLockWriteGuard<'_, ()> {
        let guard = self.io.write().unwrap_or_else(PoisonError::into_inner);
        // A wait on the store's I/O (milliseconds at most), by commands
        // that run on the blocking pool; rare enough to poll.
        while self.async_writes.load(Ordering::Acquire) != 0 {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        guard
    }

    /// Shared write access for a write through the store's asynchronous
    /// I/O, held until the permit drops (after the write completed): an
    /// exclusive writer waits for it. `None` while an exclusive writer
    /// holds the LU: the caller is on an async task, which must not wait
    /// for a lock held through a whole COMPARE AND WRITE or SANITIZE, so the
    /// command takes the synchronous path (the blocking pool) instead.
    pub fn write_async(self: &Arc<Self>) -> Option<AsyncWritePermit> {
        let _shared = match self.io.try_read() {
            Ok(shared) => shared,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        self.async_writes.fetch_add(1, Ordering::AcqRel);
        Some(AsyncWritePermit(Arc::clone(self)))
    }

    /// The current mode parameters.
    pub fn mode(&self) -> ModeParams {
        ModeParams::from_bits(self.mode.load(Ordering::Acquire))
    }

    /// The mode parameters the commands that write obey: the current ones,
    /// with SWP set on a read-only LU (every write then ends in DATA
    /// PROTECT / WRITE PROTECTED where it checks SWP). MODE SENSE reports
    /// the current ones.
    pub fn io_mode(&self) -> ModeParams {
        let mut mode = self.mode();
        mode.swp |= self.options.read_only;
        mode
    }
}

/// The locked state of one LU (see [`LogicalUnit::state`]).
pub(crate) struct LuStateGuard<'a> {
    lu: &'a LogicalUnit,
    guard: MutexGuard<'a, LuState>,
}

impl Deref for LuStateGuard<'_> {
    type Target = LuState;

    fn deref(&self) -> &LuState {
        &self.guard
    }
}

impl DerefMut for LuStateGuard<'_> {
    fn deref_mut(&mut self) -> &mut LuState {
        &mut self.guard
    }
}

impl Drop for LuStateGuard<'_> {
    /// Publishes the state's summary while the lock is still held (the
    /// guard's fields drop after this), so the last writer's summary is
    /// the one that stays.
    fn drop(&mut self) {
        self.lu
            .quiet
            .store(self.guard.is_quiet(), Ordering::Release);
        self.lu
            .mode
            .store(self.guard.mode.to_bits(), Ordering::Release);
    }
}

/// A write in flight through the store's asynchronous I/O
/// ([`LogicalUnit::write_async`]).
pub struct AsyncWritePermit(Arc<LogicalUnit>);

impl Drop for AsyncWritePermit {
    fn drop(&mut self) {
        self.0.async_writes.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store::TestStore;

    /// A write checked before the epoch moved (a rejoin) does not start
    /// after it, shared or exclusive; one checked after it does.
    #[test]
    fn a_write_checked_before_the_epoch_moved_is_refused() {
        let store: Arc<dyn Backstore> = Arc::new(TestStore::new(1 << 20, 512, 1));
        let lu = LogicalUnit::new(store, KnownNexuses::default());
        let before = lu.io_epoch();
        assert!(lu.write_shared_at(before).is_ok());
        assert!(lu.write_exclusive_at(before).is_ok());
        lu.next_io_epoch();
        assert_eq!(lu.write_shared_at(before).err(), Some(Fail::Busy));
        assert_eq!(lu.write_exclusive_at(before).err(), Some(Fail::Busy));
        let now = lu.io_epoch();
        assert!(lu.write_shared_at(now).is_ok());
        assert!(lu.write_exclusive_at(now).is_ok());
    }
}
