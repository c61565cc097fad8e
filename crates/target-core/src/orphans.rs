//! ErrorRecoveryLevel 2: what a failed connection leaves for a TASK
//! REASSIGN (RFC 7143 sections 6.2.2, 11.5.1), by Initiator Task Tag, each
//! with the number of the connection it came from so that the connection's
//! DefaultTime2Retain can expire it.
//!
//! Two kinds are left: a status sent and not acknowledged, with its
//! command's Data-In (what [`crate::retention`] kept), and a write still
//! collecting its data (the driver's own state of it, `W`). Memory is
//! bounded: past [`ORPHANED_BYTES`] of Data-In the oldest answers go (a
//! TASK REASSIGN for one then gets "task does not exist", and the
//! initiator sends the command again).

use std::collections::{HashMap, VecDeque};

use iscsi_proto::transfer::Payload;

use crate::retention::SentStatus;

/// The most Data-In bytes a session keeps for answers orphaned by failed
/// connections. Each connection keeps at most
/// [`RETAINED_BYTES`](crate::retention::RETAINED_BYTES), but an initiator
/// that drops connection after connection would pile up one such store
/// per connection for Time2Retain.
pub const ORPHANED_BYTES: usize = 256 << 20;

/// What a failed connection left of one task.
pub enum Orphan<D, W> {
    /// A status sent (or being sent) when the connection failed, not
    /// acknowledged, with its command's Data-In.
    Answered(SentStatus<D>),
    /// A write that was collecting its data.
    Collecting(Box<W>),
}

/// A session's orphans.
pub struct OrphanTable<D, W> {
    by_itt: HashMap<u32, (Orphan<D, W>, u64)>,
    /// The answered orphans, oldest first, for eviction.
    answered: VecDeque<u32>,
    /// Their Data-In bytes.
    bytes: usize,
}

impl<D, W> Default for OrphanTable<D, W> {
    fn default() -> Self {
        Self {
            by_itt: HashMap::new(),
            answered: VecDeque::new(),
            bytes: 0,
        }
    }
}

impl<D: Payload, W> OrphanTable<D, W> {
    /// Keeps what connection `origin` left of task `itt` (replacing what
    /// was kept of it before); returns the tasks whose answers were dropped
    /// to stay within [`ORPHANED_BYTES`], oldest first.
    pub fn adopt(&mut self, itt: u32, orphan: Orphan<D, W>, origin: u64) -> Vec<u32> {
        self.take(itt);
        if let Orphan::Answered(status) = &orphan {
            self.bytes += status.data_in.len();
            self.answered.push_back(itt);
        }
        self.by_itt.insert(itt, (orphan, origin));
        let mut dropped = Vec::new();
        while self.bytes > ORPHANED_BYTES && self.answered.len() > 1 {
            let Some(oldest) = self.answered.front().copied() else {
                break;
            };
            self.take(oldest);
            dropped.push(oldest);
        }
        dropped
    }

    /// Takes what was left of task `itt`, for its reassignment.
    pub fn take(&mut self, itt: u32) -> Option<Orphan<D, W>> {
        let (orphan, _) = self.by_itt.remove(&itt)?;
        if let Orphan::Answered(status) = &orphan {
            self.bytes -= status.data_in.len();
            self.answered.retain(|&a| a != itt);
        }
        Some(orphan)
    }

    /// Takes everything connection `origin` left (its Time2Retain is over).
    pub fn expire(&mut self, origin: u64) -> Vec<Orphan<D, W>> {
        let expired: Vec<u32> = self
            .by_itt
            .iter()
            .filter(|(_, (_, o))| *o == origin)
            .map(|(&itt, _)| itt)
            .collect();
        expired
            .into_iter()
            .filter_map(|itt| self.take(itt))
            .collect()
    }

    /// Takes them all (the session ends).
    pub fn drain(&mut self) -> Vec<Orphan<D, W>> {
        let table = std::mem::take(self);
        table
            .by_itt
            .into_values()
            .map(|(orphan, _)| orphan)
            .collect()
    }

    /// The Data-In bytes kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Table = OrphanTable<Vec<u8>, ()>;

    fn answered(itt: u32, bytes: usize) -> Orphan<Vec<u8>, ()> {
        Orphan::Answered(crate::retention::tests::sent(itt, 0, bytes))
    }

    #[test]
    fn orphaned_answers_are_bounded_oldest_first_and_expire_by_connection() {
        let mut orphans = Table::default();
        let chunk = ORPHANED_BYTES / 4;
        let mut dropped = Vec::new();
        for itt in 0..6 {
            dropped.extend(orphans.adopt(itt, answered(itt, chunk), u64::from(itt % 2)));
        }
        // Four fit: the two oldest went.
        assert_eq!(dropped, [0, 1]);
        assert!(orphans.take(0).is_none() && orphans.take(1).is_none());
        assert!(orphans.take(2).is_some());
        assert_eq!(orphans.bytes(), 3 * chunk);
        // Connection 1's Time2Retain: 3 and 5 go, 4 stays.
        assert_eq!(orphans.expire(1).len(), 2);
        assert_eq!(orphans.bytes(), chunk);
        assert_eq!(orphans.drain().len(), 1);
        assert_eq!(orphans.bytes(), 0);
        assert!(orphans.answered.is_empty());
    }

    #[test]
    fn a_task_left_twice_is_kept_once_and_a_write_costs_no_bytes() {
        let mut orphans = Table::default();
        orphans.adopt(7, answered(7, 100), 1);
        orphans.adopt(7, answered(7, 300), 2);
        assert_eq!(orphans.bytes(), 300);
        orphans.adopt(8, Orphan::Collecting(Box::new(())), 2);
        assert_eq!(orphans.bytes(), 300);
        assert_eq!(orphans.expire(2).len(), 2);
        assert_eq!(orphans.bytes(), 0);
        assert!(orphans.take(7).is_none());
    }
}
