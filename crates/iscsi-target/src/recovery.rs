//! ErrorRecoveryLevel 2 on the target: connection recovery (RFC 7143
//! section 7.2.2 allegiance reassignment, 11.5.1 TASK REASSIGN, 11.14.1
//! "remove the connection for recovery", and connection reinstatement).
//!
//! At ERL 2 a failed connection's tasks do not end with it. Each task has
//! an `Allegiance` (`task.rs`): the connection (its [`Writer`]) that answers it. When
//! that connection fails:
//! - a task still being executed keeps running; its answer, finding the
//!   writer closed, is parked in its allegiance;
//! - a write still collecting its data, and every status sent but not yet
//!   acknowledged (with its command's Data-In), become the session's
//!   [`Orphans`].
//!
//! After the initiator has logged the old connection out (a login with its
//! CID, or a Logout "remove the connection for recovery" on another one), a
//! TASK REASSIGN on any connection of the session moves a task there: the
//! answer is sent (again) from the DataSN the initiator asks for, a write
//! gets R2Ts for all the data it still lacks. What nobody reassigns within
//! DefaultTime2Retain is dropped (writes aborted, parked answers never
//! sent), and a session left with no connection ends then (until then a
//! new connection may continue it: section 8.3's N5, N7, N10 and N6).
//!
//! The bookkeeping of what is left is `iscsi_target_core::orphans`; this
//! file holds it under the session's lock, over the driver's own types.

use std::sync::{Mutex, PoisonError};

use iscsi_datamover::Gather;
use iscsi_target_core::orphans::{self, OrphanTable};

use crate::pending::PendingWrite;

/// What a failed connection left for a TASK REASSIGN: an answer with the
/// Data-In pieces it was sent from, or a write collecting its data.
pub(crate) type Orphan = orphans::Orphan<Gather, PendingWrite>;

/// A session's orphans, shared by its connections.
#[derive(Default)]
pub(crate) struct Orphans {
    table: Mutex<OrphanTable<Gather, PendingWrite>>,
}

impl Orphans {
    fn lock(&self) -> std::sync::MutexGuard<'_, OrphanTable<Gather, PendingWrite>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps what connection `origin` left of task `itt` (within
    /// `orphans::ORPHANED_BYTES`: the oldest answers go first, in the log).
    pub fn adopt(&self, itt: u32, orphan: Orphan, origin: u64) {
        for oldest in self.lock().adopt(itt, orphan, origin) {
            tracing::warn!(
                itt = oldest,
                "orphaned answers over their limit: the oldest dropped"
            );
        }
    }

    /// Takes what was left of task `itt`, for its reassignment.
    pub fn take(&self, itt: u32) -> Option<Orphan> {
        self.lock().take(itt)
    }

    /// Takes everything connection `origin` left (its Time2Retain is over).
    pub fn expire(&self, origin: u64) -> Vec<Orphan> {
        self.lock().expire(origin)
    }

    /// Takes them all (the session ends).
    pub fn drain(&self) -> Vec<Orphan> {
        self.lock().drain()
    }
}
