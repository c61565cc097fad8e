//! [`ScsiTarget`]: a target's logical units by LUN number, the I_T
//! nexuses it knows, adding and removing LUNs while it runs, and the
//! resets of task management. A command on it is `dispatch.rs`.

use std::collections::HashSet;

use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::backstore::{Backstore, ResizeError};
use crate::lu::{self, LogicalUnit};
use crate::lun::MAX_LUNS;
use crate::nexus::{Nexus, NexusKey};
use crate::pr_shared;
use crate::spc::TargetIdentity;
use crate::xcopy_state::Held;
use iscsi_sense::{Asc, Sense};

/// What [`ScsiTarget::resize_lun`] did: the sizes in bytes before and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resized {
    /// Before.
    pub old: u64,
    /// After (the same when the medium already had that size).
    pub new: u64,
}

/// A SCSI target's set of logical units.
pub struct ScsiTarget {
    pub(crate) identity: TargetIdentity,
    /// The logical units by LUN number. Replaced whole when a LUN is added
    /// or removed while the target runs (a reload): a command loads the
    /// table without a lock or a shared write, and one that loaded the old
    /// table finishes on the LU it found, which lives while it is used.
    pub(crate) luns: ArcSwap<LunTable>,
    /// Serialises the writers of `luns` (add, remove), so that two changes
    /// at once cannot lose one.
    lun_changes: Mutex<()>,
    /// Every I_T nexus that has sent a command and not been lost: the
    /// nexuses a unit attention "for every I_T nexus" is queued for.
    /// Read by every command (is this nexus new?) and changed once per
    /// session, so it is swapped whole like `luns`: a command finds its
    /// nexus with a load and a lookup, no lock and no write that cores
    /// would share.
    pub(crate) nexuses: lu::KnownNexuses,
    /// Serialises the writers of `nexuses`.
    nexus_changes: Mutex<()>,
    /// Told which nexuses' tasks PREEMPT AND ABORT aborts.
    pub(crate) abort_handler: Mutex<Option<Arc<AbortHandler>>>,
    /// Whether a nexus's first command meets POWER ON, RESET, OR BUS DEVICE
    /// RESET OCCURRED.
    pub(crate) power_on_ua: AtomicBool,
    /// EXTENDED COPY statuses held for RECEIVE COPY RESULTS (COPY STATUS).
    pub(crate) copies: Mutex<Held>,
}

/// LUs indexed by LUN number (`None`: no LU there).
pub(crate) type LunTable = Vec<Option<Arc<LogicalUnit>>>;

/// Why a LUN could not be added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LunChangeError {
    /// The number is in use.
    Taken(u16),
    /// The number is not addressable (at most [`MAX_LUNS`] - 1).
    OutOfRange(u16),
}

impl std::fmt::Display for LunChangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Taken(n) => write!(f, "LUN {n} is in use"),
            Self::OutOfRange(n) => write!(f, "LUN {n}: at most {} LUNs", MAX_LUNS),
        }
    }
}

impl std::error::Error for LunChangeError {}

/// The transport's hook for PERSISTENT RESERVE OUT with PREEMPT AND ABORT
/// (SPC-4 §5.12.11.5): called with the LUN number and the I_T nexuses whose
/// registrations were preempted, whose tasks on that LU the transport must
/// abort (as ABORT TASK SET would, without a response for them).
pub type AbortHandler = dyn Fn(u16, &[NexusKey]) + Send + Sync;

/// The kind of reset the transport performed (SAM-5 §6.3, RFC 7143
/// §11.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetReset {
    /// TARGET WARM RESET: unit attention POWER ON, RESET, OR BUS DEVICE
    /// RESET OCCURRED (29h/00h).
    Warm,
    /// TARGET COLD RESET: as a power cycle, unit attention POWER ON OCCURRED
    /// (29h/01h).
    Cold,
}

impl std::fmt::Debug for ScsiTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScsiTarget")
            .field("identity", &self.identity)
            .field("luns", &self.luns)
            .field("nexuses", &self.nexuses)
            .finish_non_exhaustive()
    }
}

impl ScsiTarget {
    /// A target whose LUN numbers are 0.. in the order of `luns` (at most
    /// 16384 are addressable; the rest are ignored).
    pub fn new(identity: TargetIdentity, luns: Vec<Arc<dyn Backstore>>) -> Self {
        let numbered = (0u16..).zip(luns.into_iter().take(MAX_LUNS));
        Self::with_luns(identity, numbered)
    }

    /// A target whose LUs have the numbers given (numbers of
    /// [`MAX_LUNS`] and above are ignored; a number given twice keeps the
    /// last store).
    pub fn with_luns(
        identity: TargetIdentity,
        luns: impl IntoIterator<Item = (u16, Arc<dyn Backstore>)>,
    ) -> Self {
        let mut table: LunTable = Vec::new();
        let nexuses: lu::KnownNexuses = Arc::new(ArcSwap::from_pointee(HashSet::new()));
        for (n, store) in luns {
            let i = usize::from(n);
            if i >= MAX_LUNS {
                continue;
            }
            if table.len() <= i {
                table.resize(i + 1, None);
            }
            table[i] = Some(pr_shared::logical_unit(store, &nexuses));
        }
        Self {
            identity,
            luns: ArcSwap::from_pointee(table),
            lun_changes: Mutex::new(()),
            nexuses,
            nexus_changes: Mutex::new(()),
            abort_handler: Mutex::new(None),
            power_on_ua: AtomicBool::new(false),
            copies: Mutex::new(Held::default()),
        }
    }

    /// With `on`, every I_T nexus's first command to each LU (after login,
    /// or after [`ScsiTarget::nexus_lost`]) reports the unit attention POWER
    /// ON, RESET, OR BUS DEVICE RESET OCCURRED (SAM-5 §5.14: a new nexus has
    /// not seen the power-on). Off by default: many initiators and test
    /// suites expect the first command after login to succeed.
    pub fn set_power_on_unit_attention(&self, on: bool) {
        self.power_on_ua.store(on, Ordering::Relaxed);
    }

    /// Installs the hook PREEMPT AND ABORT calls (see [`AbortHandler`]).
    /// Without one, PREEMPT AND ABORT behaves as PREEMPT: commands here run
    /// to completion, so the core itself holds no task to abort.
    pub fn set_abort_handler(&self, handler: impl Fn(u16, &[NexusKey]) + Send + Sync + 'static) {
        *self
            .abort_handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(handler));
    }

    /// The number of logical units.
    pub fn lun_count(&self) -> usize {
        self.luns.load().iter().flatten().count()
    }

    /// The LUN numbers in use, ascending.
    pub fn lun_numbers(&self) -> Vec<u16> {
        lun_numbers(&self.luns.load())
    }

    /// Adds a logical unit as LUN `n` while the target runs. Every nexus
    /// that has sent this target a command gets REPORTED LUNS DATA HAS
    /// CHANGED (3Fh/0Eh) on each other LU (SPC-4 §6.33: the inventory
    /// changed); the new LU starts with no reservations and default mode
    /// parameters.
    pub fn add_lun(&self, n: u16, store: Arc<dyn Backstore>) -> Result<(), LunChangeError> {
        let i = usize::from(n);
        if i >= MAX_LUNS {
            return Err(LunChangeError::OutOfRange(n));
        }
        let _writer = self
            .lun_changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut table = LunTable::clone(&self.luns.load());
        if table.get(i).is_some_and(Option::is_some) {
            return Err(LunChangeError::Taken(n));
        }
        if table.len() <= i {
            table.resize(i + 1, None);
        }
        table[i] = Some(pr_shared::logical_unit(store, &self.nexuses));
        self.luns.store(Arc::new(table));
        self.inventory_changed(Some(n));
        Ok(())
    }

    /// Removes LUN `n` while the target runs and returns its store.
    /// Commands that reached the LU before finish on it; later ones get
    /// LOGICAL UNIT NOT SUPPORTED. Every nexus that has sent this target a
    /// command gets REPORTED LUNS DATA HAS CHANGED on each remaining LU.
    /// Its persistent reservations go with it.
    pub fn remove_lun(&self, n: u16) -> Option<Arc<dyn Backstore>> {
        let _writer = self
            .lun_changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut table = LunTable::clone(&self.luns.load());
        let removed = table.get_mut(usize::from(n))?.take()?;
        while table.last().is_some_and(Option::is_none) {
            table.pop();
        }
        self.luns.store(Arc::new(table));
        self.inventory_changed(None);
        Some(Arc::clone(&removed.backstore))
    }

    /// Queues REPORTED LUNS DATA HAS CHANGED on every LU but `new` for
    /// every known nexus.
    fn inventory_changed(&self, new: Option<u16>) {
        let nexuses = self.known_nexuses();
        let sense = Sense::unit_attention(Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
        for (n, lu) in self.luns.load().iter().enumerate() {
            let Some(lu) = lu else { continue };
            if new.is_some_and(|new| usize::from(new) == n) {
                continue;
            }
            lu.state().raise_for_all(&nexuses, None, sense);
        }
    }

    /// The identity this target reports.
    pub fn identity(&self) -> &TargetIdentity {
        &self.identity
    }

    /// The backstore of LUN number `lun`, if it exists.
    pub fn backstore(&self, lun: u16) -> Option<Arc<dyn Backstore>> {
        self.lu(lun).map(|lu| Arc::clone(&lu.backstore))
    }

    /// `f` of the backstore of LUN number `lun`, if it exists, without
    /// touching the store's reference count: what the transport asks on
    /// every command (a count written from every core would be a cache
    /// line all of them share).
    pub fn with_backstore<R>(
        &self,
        lun: u16,
        f: impl FnOnce(&Arc<dyn Backstore>) -> R,
    ) -> Option<R> {
        let table = self.luns.load();
        let lu = table.get(usize::from(lun))?.as_ref()?;
        Some(f(&lu.backstore))
    }

    /// The LU numbered `lun`, if there is one.
    pub(crate) fn lu(&self, lun: u16) -> Option<Arc<LogicalUnit>> {
        self.luns.load().get(usize::from(lun))?.clone()
    }

    pub(crate) fn known_nexuses(&self) -> Vec<NexusKey> {
        self.nexuses.load().iter().cloned().collect()
    }

    /// Adds or removes `key` in the known nexuses; says whether the set
    /// changed.
    pub(crate) fn change_nexuses(&self, key: &NexusKey, add: bool) -> bool {
        let _changing = self
            .nexus_changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.nexuses.load();
        if current.contains(key) == add {
            return false;
        }
        let mut next = HashSet::clone(&current);
        if add {
            next.insert(key.clone());
        } else {
            next.remove(key);
        }
        self.nexuses.store(Arc::new(next));
        true
    }

    /// Queues a unit attention on LUN number `lun` for every I_T nexus that
    /// has sent this target a command (SAM-5 §5.14). Each nexus's next
    /// command other than INQUIRY, REPORT LUNS and REQUEST SENSE ends in
    /// CHECK CONDITION with it; REQUEST SENSE returns and clears it.
    pub fn raise_unit_attention(&self, lun: u16, sense: Sense) {
        let nexuses = self.known_nexuses();
        if let Some(lu) = self.lu(lun) {
            lu.state().raise_for_all(&nexuses, None, sense);
        }
    }

    /// Resizes the medium of LUN number `lun` while it serves
    /// ([`Backstore::resize`]: `None` takes what the medium holds now) and,
    /// when its size changed, raises CAPACITY DATA HAS CHANGED for every
    /// nexus (SBC-4 §4.14: READ CAPACITY answers the new size from now on,
    /// and each initiator hears of it on its next command). Refused while a
    /// SANITIZE runs or failed on the LU: the LU's state is held across
    /// the check and the resize, so none starts between them.
    pub fn resize_lun(
        &self,
        lun: u16,
        size: Option<u64>,
        discard: bool,
    ) -> Result<Resized, ResizeError> {
        let lu = self.lu(lun).ok_or(ResizeError::NoLun(lun))?;
        let (old, new) = {
            let state = lu.state();
            if !state.sanitize.is_idle() {
                return Err(ResizeError::Sanitizing);
            }
            let old = lu.backstore.size_bytes();
            (old, lu.backstore.resize(size, discard)?)
        };
        if new != old {
            self.raise_unit_attention(lun, Sense::unit_attention(Asc::CAPACITY_DATA_HAS_CHANGED));
        }
        Ok(Resized { old, new })
    }

    /// The transport lost `nexus` (its session ended, SAM-5 §6.3.4): an
    /// SPC-2 reservation it held is released and its pending unit
    /// attentions are dropped. Persistent reservations and registrations
    /// are kept (SPC-4 §5.12.3).
    pub fn nexus_lost(&self, nexus: &Nexus) {
        let key = nexus.key();
        self.change_nexuses(key, false);
        self.copies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drop_nexus(key);
        for lu in self.luns.load().iter().flatten() {
            if let Some(store) = &lu.shared {
                pr_shared::nexus_lost(lu, store.as_ref(), key);
            }
            let mut st = lu.state();
            if st.spc2.as_ref() == Some(key) {
                st.spc2 = None;
            }
            st.medium.prevented.remove(key);
            st.drop_nexus(key);
        }
    }

    /// LOGICAL UNIT RESET of LUN number `lun` (SAM-5 §7.7): commands run to
    /// completion here, so no task state remains; the SPC-2 reservation is
    /// released, mode parameters return to their defaults and every nexus
    /// gets BUS DEVICE RESET FUNCTION OCCURRED (29h/03h). Persistent
    /// reservations survive (SPC-4 §5.12.3). On an LU a gateway group
    /// shares, every other gateway does the same for its nexuses
    /// (`pr_shared::lun_reset`); this waits for them to acknowledge (a
    /// cluster round trip; more, and a fence, when one does not answer),
    /// so a transport calls it where it may block.
    pub fn lun_reset(&self, lun: u16) {
        let nexuses = self.known_nexuses();
        if let Some(lu) = self.lu(lun) {
            Self::reset_lu(&lu, &nexuses, Asc::BUS_DEVICE_RESET);
        }
    }

    /// TARGET WARM RESET or TARGET COLD RESET (RFC 7143 §11.5.1): every LU
    /// is reset as by [`ScsiTarget::lun_reset`] (on every gateway of a
    /// group that shares it, and it blocks as that does), with the unit
    /// attention of [`TargetReset`].
    pub fn target_reset(&self, kind: TargetReset) {
        let nexuses = self.known_nexuses();
        let asc = match kind {
            TargetReset::Warm => Asc::POWER_ON_RESET,
            TargetReset::Cold => Asc::POWER_ON_OCCURRED,
        };
        for lu in self.luns.load().iter().flatten() {
            Self::reset_lu(lu, &nexuses, asc);
        }
    }

    /// Resets `lu` ([`lu::LuState::reset`]) with the unit attention `asc`
    /// for `nexuses`, and on an LU a gateway group shares, for every other
    /// gateway's nexuses too (`pr_shared::lun_reset`).
    fn reset_lu(lu: &LogicalUnit, nexuses: &[NexusKey], asc: Asc) {
        lu.state().reset(nexuses, Sense::unit_attention(asc));
        if let Some(store) = &lu.shared {
            pr_shared::lun_reset(lu, store.as_ref(), asc.ascq);
        }
    }
}

/// The numbers of the LUs in `table`, ascending.
pub(crate) fn lun_numbers(table: &LunTable) -> Vec<u16> {
    (0u16..)
        .zip(table.iter())
        .filter_map(|(n, lu)| lu.as_ref().map(|_| n))
        .collect()
}
