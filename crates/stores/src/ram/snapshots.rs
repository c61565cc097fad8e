//! Snapshots of a RAM store: tables that share its chunks.
//!
//! A snapshot is a second chunk table holding the same `Arc`s as the
//! store's at one moment ([`ChunkTable::cut`]). Taking one copies no byte:
//! a write to a chunk the snapshot shares copies the chunk first (the
//! copy on write that READs lending chunks already rely on), so the
//! snapshot costs memory only as the LUN writes over what it holds. A
//! snapshot served as a LUN, or cloned, gets a table of its own sharing
//! the snapshot's chunks in turn, so deleting the snapshot never takes
//! data from under them. Snapshots live as long as the store: a RAM LUN's
//! data does not outlive the target, nor do they.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use iscsi_scsi::backstore::{
    Backstore, SnapshotError, SnapshotInfo, Snapshots, check_snapshot_name,
};

use super::table::ChunkTable;
use super::{CHUNK, RamBackstore};

/// One snapshot of a [`RamBackstore`].
#[derive(Debug)]
pub(super) struct RamSnapshot {
    chunks: ChunkTable,
    /// The store's size when it was taken, in bytes.
    size: u64,
    taken_unix: Option<u64>,
}

impl RamBackstore {
    /// A store of its own sharing snapshot `name`'s chunks.
    fn store_of_snapshot(
        &self,
        name: &str,
        unique_id: u64,
        frozen: bool,
    ) -> Result<Arc<dyn Backstore>, SnapshotError> {
        let snapshots = self
            .snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let snapshot = snapshots
            .get(name)
            .ok_or_else(|| SnapshotError::NotFound(name.to_owned()))?;
        let chunks = ChunkTable::with_chunks(&snapshot.chunks, snapshot.chunks.cut());
        Ok(Arc::new(RamBackstore::with_table(
            chunks,
            snapshot.size,
            self.block_size,
            unique_id,
            frozen,
        )))
    }

    /// Bytes of `snapshot` nothing else holds (not the store, which wrote
    /// over them since, nor another snapshot, nor a LUN serving or cloning
    /// it): what deleting it frees now.
    fn held_by(snapshot: &RamSnapshot) -> u64 {
        let mut held = 0;
        let mut from = 0;
        while let Some(i) = snapshot.chunks.next_allocated(from) {
            let alone = snapshot.chunks.find(i).is_some_and(|slot| {
                slot.read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .is_some_and(|chunk| Arc::strong_count(chunk) == 1)
            });
            if alone {
                held += CHUNK;
            }
            let Some(next) = i.checked_add(1) else { break };
            from = next;
        }
        held
    }
}

impl Snapshots for RamBackstore {
    /// The chunk table's cut ([`ChunkTable::cut`]), under the resize lock
    /// so that the size recorded is the one the cut saw.
    fn take(&self, name: &str) -> Result<SnapshotInfo, SnapshotError> {
        check_snapshot_name(name)?;
        if self.frozen {
            return Err(SnapshotError::Unsupported(
                "this LUN serves a snapshot, which never changes: snapshot the LUN it was taken of"
                    .into(),
            ));
        }
        let _one = self.resizing.lock().unwrap_or_else(PoisonError::into_inner);
        let mut snapshots = self
            .snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if snapshots.contains_key(name) {
            return Err(SnapshotError::Exists(name.to_owned()));
        }
        let size = self.size.load(Ordering::Acquire);
        let chunks = ChunkTable::with_chunks(&self.chunks, self.chunks.cut());
        let taken_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs());
        snapshots.insert(
            name.to_owned(),
            RamSnapshot {
                chunks,
                size,
                taken_unix,
            },
        );
        Ok(SnapshotInfo {
            name: name.to_owned(),
            size_bytes: size,
            taken_unix,
            held_bytes: Some(0),
        })
    }

    fn list(&self) -> Result<Vec<SnapshotInfo>, SnapshotError> {
        let snapshots = self
            .snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(snapshots
            .iter()
            .map(|(name, snapshot)| SnapshotInfo {
                name: name.clone(),
                size_bytes: snapshot.size,
                taken_unix: snapshot.taken_unix,
                held_bytes: Some(Self::held_by(snapshot)),
            })
            .collect())
    }

    /// Frees what only the snapshot held; a LUN serving it or a clone of
    /// it keeps its own share.
    fn delete(&self, name: &str) -> Result<(), SnapshotError> {
        let mut snapshots = self
            .snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        snapshots
            .remove(name)
            .map(drop)
            .ok_or_else(|| SnapshotError::NotFound(name.to_owned()))
    }

    fn open(&self, name: &str, unique_id: u64) -> Result<Arc<dyn Backstore>, SnapshotError> {
        self.store_of_snapshot(name, unique_id, true)
    }

    fn clone_into(
        &self,
        name: &str,
        to: Option<&str>,
        unique_id: u64,
    ) -> Result<Arc<dyn Backstore>, SnapshotError> {
        if let Some(to) = to {
            return Err(SnapshotError::Unsupported(format!(
                "a clone of a RAM LUN lives in memory: it takes no destination (to={to})"
            )));
        }
        self.store_of_snapshot(name, unique_id, false)
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
