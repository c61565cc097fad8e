//! Snapshots of the RAM store: what they hold, and the moment they hold it.

use std::sync::Arc;

use iscsi_scsi::backstore::{Backstore, SnapshotError, Snapshots};

use super::super::{CHUNK, RamBackstore};
use crate::snapshot_moments::{SLOTS, snapshots_hold_one_moment};

const MIB: u64 = 1 << 20;

fn bytes_at(store: &dyn Backstore, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xEE; len];
    store.read_at(offset, &mut buf).unwrap();
    buf
}

#[test]
fn a_snapshot_keeps_what_the_store_held_when_it_was_taken() {
    let store = RamBackstore::new(4 * MIB, 512, 1).unwrap();
    store.write_at(0, &[1; 4096]).unwrap();
    store.write_at(CHUNK, &[2; 512]).unwrap();
    let info = store.take("before").unwrap();
    assert_eq!((info.name.as_str(), info.size_bytes), ("before", 4 * MIB));
    store.write_at(0, &[3; 4096]).unwrap();
    store.unmap(CHUNK, CHUNK).unwrap();
    store.write_at(3 * MIB, &[4; 512]).unwrap();
    store.resize(Some(8 * MIB), false).unwrap();

    let snap = store.open("before", 77).unwrap();
    assert_eq!(snap.unique_id(), 77);
    assert_eq!(
        snap.block_count(),
        4 * MIB / 512,
        "the size it was taken at"
    );
    assert_eq!(bytes_at(&*snap, 0, 4096), vec![1; 4096]);
    assert_eq!(bytes_at(&*snap, CHUNK, 512), vec![2; 512]);
    assert_eq!(bytes_at(&*snap, 3 * MIB, 512), vec![0; 512]);
    assert_eq!(
        bytes_at(&store, 0, 4096),
        vec![3; 4096],
        "the store moved on"
    );
    assert_eq!(bytes_at(&store, CHUNK, 512), vec![0; 512]);

    // Read-only, every way in.
    assert!(snap.write_at(0, &[9; 512]).is_err());
    assert!(snap.write_pieces(0, &mut [vec![9; 512]], 512).is_err());
    assert!(snap.unmap(0, 512).is_err());
    assert!(snap.resize(Some(MIB), true).is_err());
    assert!(snap.snapshots().unwrap().take("again").is_err());
    assert_eq!(bytes_at(&*snap, 0, 512), vec![1; 512]);

    // What deleting it frees: nothing while the LUN serving it holds the
    // same chunks; once that goes, the two chunks the store wrote over or
    // unmapped since (the third it still shares).
    let list = store.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].held_bytes, Some(0));
    drop(snap);
    assert_eq!(store.list().unwrap()[0].held_bytes, Some(2 * CHUNK));
    // Two snapshots of one moment share its chunks: deleting either
    // frees nothing the other holds.
    store.take("x1").unwrap();
    store.take("x2").unwrap();
    store.write_at(3 * MIB, &[5; 512]).unwrap();
    let held = |name: &str| {
        let list = store.list().unwrap();
        list.into_iter()
            .find(|i| i.name == name)
            .unwrap()
            .held_bytes
    };
    assert_eq!((held("x1"), held("x2")), (Some(0), Some(0)));
    store.delete("x2").unwrap();
    assert_eq!(held("x1"), Some(CHUNK), "now x1 alone holds the old chunk");
    assert_eq!(held("before"), Some(2 * CHUNK));
}

#[test]
fn a_clone_is_writable_and_changes_nothing_else() {
    let store = RamBackstore::new(MIB, 4096, 1).unwrap();
    store.write_at(8192, &[5; 4096]).unwrap();
    store.take("base").unwrap();
    let clone = store.clone_into("base", None, 2).unwrap();
    assert_eq!(bytes_at(&*clone, 8192, 4096), vec![5; 4096]);
    clone.write_at(8192, &[6; 4096]).unwrap();
    assert_eq!(bytes_at(&*clone, 8192, 4096), vec![6; 4096]);
    assert_eq!(bytes_at(&store, 8192, 4096), vec![5; 4096]);
    let snap = store.open("base", 3).unwrap();
    assert_eq!(bytes_at(&*snap, 8192, 4096), vec![5; 4096]);
    // A clone takes snapshots of its own.
    clone.snapshots().unwrap().take("of-clone").unwrap();
    assert!(matches!(
        store.clone_into("base", Some("/tmp/x"), 4),
        Err(SnapshotError::Unsupported(_))
    ));
    // Deleting the snapshot leaves what was made of it whole.
    store.delete("base").unwrap();
    assert_eq!(bytes_at(&*snap, 8192, 4096), vec![5; 4096]);
    assert_eq!(bytes_at(&*clone, 8192, 4096), vec![6; 4096]);
}

#[test]
fn bad_requests_are_refused_and_change_nothing() {
    let store = RamBackstore::new(MIB, 512, 1).unwrap();
    store.write_at(0, &[1; 512]).unwrap();
    store.take("one").unwrap();
    store.write_at(0, &[2; 512]).unwrap();
    assert!(matches!(store.take("one"), Err(SnapshotError::Exists(_))));
    let snap = store.open("one", 1).unwrap();
    assert_eq!(bytes_at(&*snap, 0, 512), vec![1; 512], "the first kept");
    for bad in ["", "../x", "a/b", ".x"] {
        assert!(matches!(store.take(bad), Err(SnapshotError::BadName(_))));
    }
    assert!(matches!(
        store.open("two", 1),
        Err(SnapshotError::NotFound(_))
    ));
    assert!(matches!(
        store.delete("two"),
        Err(SnapshotError::NotFound(_))
    ));
    assert_eq!(store.list().unwrap().len(), 1);
}

/// Writers in flight while snapshots are taken, each write 8 KiB across a
/// chunk boundary ([`snapshots_hold_one_moment`]).
#[test]
fn snapshots_under_writes_hold_one_moment() {
    let store = Arc::new(RamBackstore::new(64 * MIB, 512, 1).unwrap());
    // Writer w's slot s: 4 KiB before the end of chunk w * SLOTS + s.
    snapshots_hold_one_moment(store, |w, s| (w * SLOTS + s + 1) * CHUNK - 4096, 8192, 40);
}
