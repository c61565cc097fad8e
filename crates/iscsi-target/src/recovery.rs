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
//! No I/O here beyond handing PDUs to a writer: the decisions and the
//! bookkeeping.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use crate::pending::PendingWrite;
use crate::writer::SentStatus;

/// What a failed connection left for a TASK REASSIGN.
pub(crate) enum Orphan {
    /// A status sent (or being sent) when the connection failed, not
    /// acknowledged, with its command's Data-In.
    Answered(SentStatus),
    /// A write that was collecting its data.
    Collecting(Box<PendingWrite>),
}

/// The most Data-In bytes a session keeps for answers orphaned by failed
/// connections. Each connection keeps at most `iscsi_target_core::retention::RETAINED_BYTES`,
/// but an initiator that drops connection after connection would pile up
/// one such store per connection for Time2Retain: past this, the oldest
/// answers are dropped (a TASK REASSIGN for one gets "task does not exist",
/// and the initiator sends the command again).
pub(crate) const ORPHANED_BYTES: usize = 256 << 20;

/// A session's orphans, by Initiator Task Tag, each with the number of the
/// connection it came from (for the Time2Retain expiry of that connection's
/// state).
#[derive(Default)]
pub(crate) struct Orphans {
    table: Mutex<OrphanTable>,
}

#[derive(Default)]
struct OrphanTable {
    by_itt: HashMap<u32, (Orphan, u64)>,
    /// The answered orphans, oldest first, for eviction.
    answered: VecDeque<u32>,
    /// Their Data-In bytes.
    bytes: usize,
}

impl OrphanTable {
    fn remove(&mut self, itt: u32) -> Option<Orphan> {
        let (orphan, _) = self.by_itt.remove(&itt)?;
        if let Orphan::Answered(status) = &orphan {
            self.bytes -= status.data_in.len();
            self.answered.retain(|&a| a != itt);
        }
        Some(orphan)
    }
}

impl Orphans {
    fn lock(&self) -> std::sync::MutexGuard<'_, OrphanTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps what connection `origin` left of task `itt` (within
    /// [`ORPHANED_BYTES`]: the oldest answers go first).
    pub fn adopt(&self, itt: u32, orphan: Orphan, origin: u64) {
        let mut table = self.lock();
        table.remove(itt);
        if let Orphan::Answered(status) = &orphan {
            table.bytes += status.data_in.len();
            table.answered.push_back(itt);
        }
        table.by_itt.insert(itt, (orphan, origin));
        while table.bytes > ORPHANED_BYTES && table.answered.len() > 1 {
            let Some(oldest) = table.answered.front().copied() else {
                break;
            };
            table.remove(oldest);
            tracing::warn!(
                itt = oldest,
                "orphaned answers over their limit: the oldest dropped"
            );
        }
    }

    /// Takes what was left of task `itt`, for its reassignment.
    pub fn take(&self, itt: u32) -> Option<Orphan> {
        self.lock().remove(itt)
    }

    /// Takes everything connection `origin` left (its Time2Retain is over).
    pub fn expire(&self, origin: u64) -> Vec<Orphan> {
        let mut table = self.lock();
        let expired: Vec<u32> = table
            .by_itt
            .iter()
            .filter(|(_, (_, o))| *o == origin)
            .map(|(&itt, _)| itt)
            .collect();
        expired
            .into_iter()
            .filter_map(|itt| table.remove(itt))
            .collect()
    }

    /// Takes them all (the session ends).
    pub fn drain(&self) -> Vec<Orphan> {
        let mut table = std::mem::take(&mut *self.lock());
        table
            .by_itt
            .drain()
            .map(|(_, (orphan, _))| orphan)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_datamover::Gather;
    use iscsi_proto::pdu::{Lun, ScsiResponse};
    use iscsi_proto::serial::StatSn;
    use iscsi_proto::transfer::Limits;

    fn answered(itt: u32, bytes: usize) -> Orphan {
        Orphan::Answered(SentStatus {
            stat_sn: StatSn::new(0),
            response: ScsiResponse {
                initiator_task_tag: itt,
                ..ScsiResponse::default()
            },
            sense_data: Vec::new(),
            data_in: Gather::from(bytes::Bytes::from(vec![0u8; bytes])),
            lun: Lun(0),
            limits: Limits {
                max_send_segment: 8192,
                max_recv_segment: 8192,
                max_burst_length: 16384,
                first_burst_length: 8192,
                immediate_data: true,
                initial_r2t: true,
                max_outstanding_r2t: 1,
                data_pdu_in_order: true,
                data_sequence_in_order: true,
                error_recovery_level: 2,
            },
        })
    }

    #[test]
    fn orphaned_answers_are_bounded_oldest_first_and_expire_by_connection() {
        let orphans = Orphans::default();
        let chunk = ORPHANED_BYTES / 4;
        for itt in 0..6 {
            orphans.adopt(itt, answered(itt, chunk), u64::from(itt % 2));
        }
        // Four fit: the two oldest went.
        assert!(orphans.take(0).is_none() && orphans.take(1).is_none());
        assert!(orphans.take(2).is_some());
        assert_eq!(orphans.lock().bytes, 3 * chunk);
        // Connection 1's Time2Retain: 3 and 5 go, 4 stays.
        assert_eq!(orphans.expire(1).len(), 2);
        assert_eq!(orphans.lock().bytes, chunk);
        assert_eq!(orphans.drain().len(), 1);
        assert_eq!(orphans.lock().bytes, 0);
        assert!(orphans.lock().answered.is_empty());
    }
}
