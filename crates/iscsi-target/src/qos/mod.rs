//! Quality of service: limits of commands and bytes a second on a LUN (all
//! its initiators together) or on an initiator (all its sessions and LUNs
//! of one target together), so that one noisy tenant cannot take every
//! core and every disk. Set in the file (`[[target.limit]]`), changed by a
//! reload without disturbing a session (each limit is changed in place).
//!
//! A command over a limit waits, on its own task of the shard that runs
//! it, for its turn (`bucket.rs`: a virtual schedule, so the waits of a
//! queue add up in arrival order); past the limit's queue, or a wait over
//! [`limit::MAX_WAIT`], it ends in TASK SET FULL (SAM-5 5.3.1), which
//! initiators answer by lowering their queue depth and sending it again:
//! nothing fails up to an application. What counts: every command that
//! reads or writes the medium (READ, WRITE, WRITE SAME, UNMAP, COMPARE AND
//! WRITE, VERIFY, EXTENDED COPY, SYNCHRONIZE CACHE...), one each, and the
//! bytes of data it carries.
//!
//! The unlimited case costs one load: the table is published with
//! `arc-swap` (no lock, no write to a shared cache line per command), and
//! an empty one says so before any lookup.

pub mod bucket;
pub mod limit;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use limit::{Admission, Limit, LimitFigures, LimitSpec};

/// What a limit applies to, within one target.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKey {
    /// One LUN, whoever uses it.
    Lun(u16),
    /// One initiator (its iSCSI name), on whatever LUN.
    Initiator(String),
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitKey::Lun(n) => write!(f, "LUN {n}"),
            LimitKey::Initiator(name) => write!(f, "initiator {name}"),
        }
    }
}

/// A limit of a target's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitEntry {
    /// What it applies to.
    pub key: LimitKey,
    /// What it allows.
    pub spec: LimitSpec,
}

/// The limits of one target while it serves.
#[derive(Debug, Default)]
pub struct TargetLimits {
    luns: HashMap<u16, Arc<Limit>>,
    initiators: HashMap<String, Arc<Limit>>,
}

impl TargetLimits {
    /// The limit of `key`, if it has one.
    pub fn get(&self, key: &LimitKey) -> Option<&Arc<Limit>> {
        match key {
            LimitKey::Lun(n) => self.luns.get(n),
            LimitKey::Initiator(name) => self.initiators.get(name),
        }
    }

    /// Every limit, LUNs first, in order.
    pub fn all(&self) -> Vec<(LimitKey, &Arc<Limit>)> {
        let mut all: Vec<_> = self
            .luns
            .iter()
            .map(|(n, l)| (LimitKey::Lun(*n), l))
            .chain(
                self.initiators
                    .iter()
                    .map(|(i, l)| (LimitKey::Initiator(i.clone()), l)),
            )
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// Every target's limits: what a command looks its own up in.
#[derive(Debug, Default)]
pub struct QosTable {
    targets: HashMap<String, TargetLimits>,
}

impl QosTable {
    /// The table for `targets` (name, limits), keeping the running limits
    /// of `old` whose key stays, changed in place to their new values
    /// (their waiting commands and counters kept).
    pub fn build<'a>(
        targets: impl IntoIterator<Item = (&'a str, &'a [LimitEntry])>,
        old: &QosTable,
    ) -> QosTable {
        let mut table = QosTable::default();
        for (name, entries) in targets {
            if entries.is_empty() {
                continue;
            }
            let mut limits = TargetLimits::default();
            for entry in entries {
                let kept = old.targets.get(name).and_then(|t| t.get(&entry.key));
                let limit = match kept {
                    Some(limit) => {
                        if limit.spec() != entry.spec {
                            limit.set(entry.spec);
                        }
                        Arc::clone(limit)
                    }
                    None => Arc::new(Limit::new(entry.spec)),
                };
                match &entry.key {
                    LimitKey::Lun(n) => limits.luns.insert(*n, limit),
                    LimitKey::Initiator(i) => limits.initiators.insert(i.clone(), limit),
                };
            }
            table.targets.insert(name.to_owned(), limits);
        }
        table
    }

    /// Whether no target has a limit (every command goes at once).
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// The limits of target `name`.
    pub fn target(&self, name: &str) -> Option<&TargetLimits> {
        self.targets.get(name)
    }

    /// What a command of `bytes` on LUN `lun` of `target`, from
    /// `initiator`, must do first (`cdb` tells whether it counts).
    pub fn admit(
        &self,
        target: &str,
        initiator: &str,
        lun: u16,
        cdb: &[u8],
        bytes: u64,
    ) -> Admission {
        let Some(limits) = self.targets.get(target) else {
            return Admission::Go;
        };
        if !counts(cdb) {
            return Admission::Go;
        }
        match (limits.luns.get(&lun), limits.initiators.get(initiator)) {
            (None, None) => Admission::Go,
            (Some(l), None) | (None, Some(l)) => limit::admit(&[l], bytes),
            (Some(l), Some(i)) => limit::admit(&[l, i], bytes),
        }
    }
}

/// Whether a command reads or writes the medium (what a limit counts):
/// not INQUIRY, TEST UNIT READY, REPORT LUNS, MODE SENSE, READ CAPACITY,
/// reservations and the like, which an initiator needs answered promptly
/// to manage the LU.
pub fn counts(cdb: &[u8]) -> bool {
    use iscsi_scsi::cdb::opcode::*;
    let Some(&op) = cdb.first() else {
        return false;
    };
    matches!(
        op,
        READ_6
            | READ_10
            | READ_12
            | READ_16
            | WRITE_6
            | WRITE_10
            | WRITE_12
            | WRITE_16
            | WRITE_ATOMIC_16
            | WRITE_SAME_10
            | WRITE_SAME_16
            | WRITE_AND_VERIFY_10
            | WRITE_AND_VERIFY_12
            | WRITE_AND_VERIFY_16
            | VERIFY_10
            | VERIFY_12
            | VERIFY_16
            | COMPARE_AND_WRITE
            | ORWRITE_16
            | UNMAP
            | EXTENDED_COPY
            | SYNCHRONIZE_CACHE_10
            | SYNCHRONIZE_CACHE_16
            | PRE_FETCH_10
            | PRE_FETCH_16
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(iops: u64, queue: u32) -> LimitSpec {
        LimitSpec {
            iops: Some(iops),
            bytes_per_second: None,
            burst_iops: Some(1),
            burst_bytes: None,
            queue,
        }
    }

    const READ_10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

    #[test]
    fn only_limited_media_commands_wait_and_a_full_queue_refuses() {
        let entries = vec![
            LimitEntry {
                key: LimitKey::Lun(1),
                spec: spec(10, 2),
            },
            LimitEntry {
                key: LimitKey::Initiator("iqn.a".into()),
                spec: spec(1000, 100),
            },
        ];
        let table = QosTable::build([("t", entries.as_slice())], &QosTable::default());
        assert!(!table.is_empty());
        // Another target, another LUN, a command that does not count: go.
        assert!(matches!(
            table.admit("u", "iqn.b", 1, &READ_10, 512),
            Admission::Go
        ));
        assert!(matches!(
            table.admit("t", "iqn.b", 0, &READ_10, 512),
            Admission::Go
        ));
        let inquiry = [0x12, 0, 0, 0, 96, 0];
        // LUN 1 at 10 a second, a burst of 1, a queue of 2.
        assert!(matches!(
            table.admit("t", "iqn.b", 1, &READ_10, 512),
            Admission::Go
        ));
        let first = table.admit("t", "iqn.b", 1, &READ_10, 512);
        let second = table.admit("t", "iqn.a", 1, &READ_10, 512);
        assert!(matches!(first, Admission::Wait { .. }));
        assert!(matches!(second, Admission::Wait { .. }));
        assert!(matches!(
            table.admit("t", "iqn.b", 1, &inquiry, 0),
            Admission::Go
        ));
        assert!(matches!(
            table.admit("t", "iqn.b", 1, &READ_10, 512),
            Admission::Full
        ));
        let figures = table
            .target("t")
            .unwrap()
            .get(&LimitKey::Lun(1))
            .unwrap()
            .figures();
        assert_eq!(
            (figures.waiting, figures.delayed, figures.refused),
            (2, 2, 1)
        );
        // A place given up makes room.
        drop(first);
        assert!(matches!(
            table.admit("t", "iqn.b", 1, &READ_10, 512),
            Admission::Wait { .. }
        ));
    }

    #[test]
    fn a_rebuild_keeps_a_limit_whose_key_stays_and_changes_it_in_place() {
        let one = [LimitEntry {
            key: LimitKey::Lun(0),
            spec: spec(10, 8),
        }];
        let old = QosTable::build([("t", one.as_slice())], &QosTable::default());
        let before = Arc::clone(old.target("t").unwrap().get(&LimitKey::Lun(0)).unwrap());
        let raised = [LimitEntry {
            key: LimitKey::Lun(0),
            spec: spec(20, 8),
        }];
        let new = QosTable::build([("t", raised.as_slice())], &old);
        let after = new.target("t").unwrap().get(&LimitKey::Lun(0)).unwrap();
        assert!(Arc::ptr_eq(&before, after));
        assert_eq!(after.spec().iops, Some(20));
        let none = QosTable::build([("t", &[][..])], &new);
        assert!(none.is_empty());
    }
}
