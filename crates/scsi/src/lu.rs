//! Per-logical-unit state shared by every session: unit attentions per I_T
//! nexus (SAM-5 §5.14), the SPC-2 reservation, persistent reservations, the
//! changeable mode parameters, and the lock that makes COMPARE AND WRITE
//! atomic against every other write.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::backstore::Backstore;
use crate::nexus::NexusKey;
use crate::pr::PrState;
use crate::sense::Sense;

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
}

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

    /// Forgets every unit attention pending for `nexus`.
    pub fn drop_nexus(&mut self, nexus: &NexusKey) {
        self.uas.remove(nexus);
    }
}

/// One logical unit.
#[derive(Debug)]
pub(crate) struct LogicalUnit {
    pub backstore: Arc<dyn Backstore>,
    state: Mutex<LuState>,
    /// Writes hold it shared; COMPARE AND WRITE holds it exclusively for its
    /// read, compare and write (SBC-3 §5.2: the whole command is atomic with
    /// respect to every other write to the LU).
    io: RwLock<()>,
}

impl LogicalUnit {
    pub fn new(backstore: Arc<dyn Backstore>) -> Self {
        Self {
            backstore,
            state: Mutex::new(LuState {
                uas: HashMap::new(),
                spc2: None,
                pr: PrState::default(),
                mode: ModeParams::DEFAULT,
            }),
            io: RwLock::new(()),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, LuState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shared write access (any write but COMPARE AND WRITE).
    pub fn write_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.io.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Exclusive write access (COMPARE AND WRITE).
    pub fn write_exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.io.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current mode parameters.
    pub fn mode(&self) -> ModeParams {
        self.state().mode
    }
}
