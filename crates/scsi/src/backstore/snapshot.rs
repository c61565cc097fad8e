//! Point-in-time copies of a store taken while it serves
//! ([`super::Backstore::snapshots`]): what a snapshot is, what a store that
//! can take them offers, and why one was refused.
//!
//! A snapshot is *crash consistent*: it holds every write acknowledged
//! before it was asked for, none that started after it was taken, and of
//! the writes in between a set closed under dependence (a write in it that
//! was issued after another was acknowledged comes with that other one),
//! exactly what a power cut at one instant would have left. A file system
//! or database on the LUN recovers from it as from such a cut.
//!
//! Each store keeps its snapshots where its data lives, so they last as
//! long as it does: a RAM store in memory (sharing its chunks copy on
//! write), a file store beside the file (reflinked copies that share its
//! blocks), an RBD image as rbd snapshots.

use std::sync::Arc;

use super::Backstore;

/// The longest snapshot name.
pub const MAX_NAME_LEN: usize = 64;

/// What a snapshot is and holds, as a list shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its name, unique among the store's snapshots.
    pub name: String,
    /// The store's size when it was taken, in bytes.
    pub size_bytes: u64,
    /// When it was taken, in seconds since the Unix epoch, where the store
    /// records it.
    pub taken_unix: Option<u64>,
    /// Bytes only the snapshot holds now (the LUN has written over them
    /// since, and no other snapshot, clone or LUN serving it shares them):
    /// what deleting it frees, where the store can tell cheaply.
    pub held_bytes: Option<u64>,
}

/// Why a snapshot operation changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The store cannot do it; the words say what can.
    #[error("{0}")]
    Unsupported(String),
    /// The name is not one a snapshot may have.
    #[error(
        "snapshot name {0:?}: 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-', \
         not starting with '.' or '-'"
    )]
    BadName(String),
    /// A snapshot of that name exists already.
    #[error("a snapshot named {0:?} exists already")]
    Exists(String),
    /// No snapshot of that name.
    #[error("no snapshot named {0:?}")]
    NotFound(String),
    /// It cannot go while something still uses it (a clone made from it).
    #[error("snapshot {name:?} is in use: {by}")]
    InUse {
        /// The snapshot.
        name: String,
        /// What uses it, in words.
        by: String,
    },
    /// The store failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The snapshots of one store.
pub trait Snapshots: Send + Sync {
    /// Takes snapshot `name` of the store as it is now (crash consistent,
    /// see the module's words) while it serves.
    fn take(&self, name: &str) -> Result<SnapshotInfo, SnapshotError>;

    /// Every snapshot of the store, by name.
    fn list(&self) -> Result<Vec<SnapshotInfo>, SnapshotError>;

    /// Deletes snapshot `name` (a LUN serving it, or a clone that needs
    /// it, keeps what it holds where the store allows; else the store
    /// refuses with [`SnapshotError::InUse`]).
    fn delete(&self, name: &str) -> Result<(), SnapshotError>;

    /// Snapshot `name` as a store of its own, read-only (every write fails),
    /// with LU identifier `unique_id`.
    fn open(&self, name: &str, unique_id: u64) -> Result<Arc<dyn Backstore>, SnapshotError>;

    /// A writable store that starts as snapshot `name` and shares what it
    /// does not change with it: in memory for a RAM store (`to` must be
    /// `None`), the file `to` for a file store, the image `to` (in the
    /// snapshot's pool) for RBD. Where `to` exists already it is opened as
    /// it is (the clone made before a restart), without looking at the
    /// snapshot.
    fn clone_into(
        &self,
        name: &str,
        to: Option<&str>,
        unique_id: u64,
    ) -> Result<Arc<dyn Backstore>, SnapshotError>;
}

/// Checks a snapshot name: 1 to [`MAX_NAME_LEN`] ASCII letters, digits,
/// `.`, `_` or `-`, not starting with `.` or `-`, so that it is a file name
/// (no `/`, not `.` or `..`), an rbd snapshot name and a command-line word
/// all at once.
pub fn check_name(name: &str) -> Result<(), SnapshotError> {
    let fine = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if fine {
        Ok(())
    } else {
        Err(SnapshotError::BadName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["nightly", "2026-11-29T22.00", "a", "v_1", &"x".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "-rf",
            "a/b",
            "a b",
            "snap@1",
            "é",
            &"x".repeat(65),
        ] {
            assert!(
                matches!(check_name(bad), Err(SnapshotError::BadName(_))),
                "{bad:?}"
            );
        }
    }
}
