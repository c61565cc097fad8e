//! What RECEIVE COPY RESULTS (COPY STATUS) reports: the statuses of
//! finished copies and the list identifiers of running ones, which the
//! target holds per I_T nexus and LU.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::nexus::NexusKey;

/// Copy statuses held per I_T nexus and LU for COPY STATUS; the oldest
/// goes first.
const MAX_HELD: usize = 16;

/// What COPY STATUS reports of one finished EXTENDED COPY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyStatus {
    pub(crate) list_id: u8,
    pub(crate) ok: bool,
    pub(crate) segments: u16,
    pub(crate) bytes: u64,
}

/// The statuses held for COPY STATUS (LIST ID USAGE 00b), by the nexus
/// that sent the copy and the LU it was sent to; dropped with the nexus.
#[derive(Debug, Default)]
pub(crate) struct Held {
    by_nexus: HashMap<(NexusKey, u16), VecDeque<CopyStatus>>,
    /// The list identifiers of copies running now, by nexus and LU: a
    /// second copy with one of them is OPERATION IN PROGRESS (SPC-4
    /// §6.4.3.2).
    pub(crate) running: HashSet<(NexusKey, u16, u8)>,
}

impl Held {
    pub(crate) fn keep(&mut self, key: &NexusKey, lun: u16, status: CopyStatus) {
        let q = self.by_nexus.entry((key.clone(), lun)).or_default();
        q.retain(|s| s.list_id != status.list_id);
        if q.len() >= MAX_HELD {
            q.pop_front();
        }
        q.push_back(status);
    }

    pub(crate) fn find(&self, key: &NexusKey, lun: u16, list_id: u8) -> Option<CopyStatus> {
        self.by_nexus
            .get(&(key.clone(), lun))?
            .iter()
            .find(|s| s.list_id == list_id)
            .copied()
    }

    /// Forgets what was held for `key` (its nexus was lost).
    pub(crate) fn drop_nexus(&mut self, key: &NexusKey) {
        self.by_nexus.retain(|(k, _), _| k != key);
    }
}
