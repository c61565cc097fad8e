//! Snapshots of the RAM store: what they hold, and the moment they hold it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use iscsi_scsi::backstore::{Backstore, SnapshotError, Snapshots};

use super::super::{CHUNK, RamBackstore};

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

    // What it holds that the store no longer shares: the two chunks
    // written over or unmapped since.
    let list = store.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].held_bytes, Some(2 * CHUNK));
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

/// Writes in flight while snapshots are taken. Each writer rewrites its
/// own slots in turn, one write at a time, each write a generation
/// number filling 8 KiB across a chunk boundary. Every snapshot must hold,
/// of each writer, exactly a prefix of its writes (the writes up to some
/// generation and none after: a later write is never in without the ones
/// it followed), at least those answered before `take` was called, none
/// issued after it returned, and no write in part.
#[test]
fn snapshots_under_writes_hold_one_moment() {
    const WRITERS: u64 = 3;
    const SLOTS: u64 = 8;
    const LEN: usize = 8192;
    let store = Arc::new(RamBackstore::new(64 * MIB, 512, 1).unwrap());
    // Writer w's slot s: 4 KiB before the end of chunk w * SLOTS + s.
    let offset = |w: u64, s: u64| (w * SLOTS + s + 1) * CHUNK - 4096;
    let answered: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let issued: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WRITERS as usize + 1));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, answered, issued) = (store.clone(), answered.clone(), issued.clone());
            let (stop, start) = (stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut generation = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    generation += 1;
                    issued[w as usize].store(generation, Ordering::SeqCst);
                    let bytes: Vec<u8> = generation.to_le_bytes().repeat(LEN / 8);
                    store
                        .write_at(offset(w, generation % SLOTS), &bytes)
                        .unwrap();
                    answered[w as usize].store(generation, Ordering::SeqCst);
                }
            })
        })
        .collect();
    start.wait();
    let mut checked = 0;
    for n in 0..40 {
        let before: Vec<u64> = answered.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        let name = format!("s{n}");
        store.take(&name).unwrap();
        let after: Vec<u64> = issued.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        let snap = store.open(&name, 9).unwrap();
        for w in 0..WRITERS {
            // The generation each slot holds, whole.
            let held: Vec<u64> = (0..SLOTS)
                .map(|s| {
                    let bytes = bytes_at(&*snap, offset(w, s), LEN);
                    let first = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                    assert!(
                        bytes.chunks(8).all(|g| g == first.to_le_bytes()),
                        "{name}: writer {w} slot {s} holds a write in part"
                    );
                    first
                })
                .collect();
            // The prefix: its last write is the newest generation held,
            // and every slot holds the last write to it up to that one.
            let last = held.iter().copied().max().unwrap();
            for (s, &g) in (0..SLOTS).zip(&held) {
                let expected = (1..=last).rev().find(|g| g % SLOTS == s).unwrap_or(0);
                assert_eq!(g, expected, "{name}: writer {w} slot {s}: not a prefix");
            }
            let w = w as usize;
            assert!(last >= before[w], "{name}: an answered write is missing");
            assert!(last <= after[w], "{name}: holds a write issued after");
        }
        store.delete(&name).unwrap();
        checked += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
    assert_eq!(checked, 40);
    assert!(
        answered.iter().all(|a| a.load(Ordering::SeqCst) > 0),
        "every writer wrote"
    );
}
