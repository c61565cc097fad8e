//! Test support: writers in flight while snapshots are taken, and the
//! check that each snapshot holds one moment of them (the RAM and file
//! stores' snapshot tests).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use iscsi_scsi::backstore::{Backstore, Snapshots};

/// Writers at once.
const WRITERS: u64 = 3;
/// Slots each writer rewrites in turn.
pub(crate) const SLOTS: u64 = 8;

/// Each writer rewrites its own slots in turn, one write at a time, each
/// write `len` bytes of its generation number at `offset(writer, slot)`;
/// meanwhile `rounds` snapshots are taken, each opened and checked, then
/// deleted. Every snapshot must hold, of each writer, exactly a prefix of
/// its writes (the writes up to some generation and none after: a later
/// write is never in without the ones it followed), at least those
/// answered before `take` was called, none issued after it returned, and
/// no write in part.
pub(crate) fn snapshots_hold_one_moment<S>(
    store: Arc<S>,
    offset: fn(u64, u64) -> u64,
    len: usize,
    rounds: usize,
) where
    S: Backstore + Snapshots + 'static,
{
    let counters =
        || -> Arc<Vec<AtomicU64>> { Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect()) };
    let (answered, issued) = (counters(), counters());
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
                    let bytes: Vec<u8> = generation.to_le_bytes().repeat(len / 8);
                    store
                        .write_at(offset(w, generation % SLOTS), &bytes)
                        .unwrap();
                    answered[w as usize].store(generation, Ordering::SeqCst);
                }
            })
        })
        .collect();
    start.wait();
    // Each writer has a write answered before the first snapshot, so the
    // snapshots are taken under writes however the threads are scheduled
    // (on a loaded machine a writer could otherwise first run after the
    // last round).
    while answered.iter().any(|a| a.load(Ordering::SeqCst) == 0) {
        assert!(
            !writers.iter().any(|w| w.is_finished()),
            "a writer stopped before its first write was answered"
        );
        std::thread::yield_now();
    }
    for n in 0..rounds {
        let before: Vec<u64> = answered.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        let name = format!("s{n}");
        store.take(&name).unwrap();
        let after: Vec<u64> = issued.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        let snap = store.open(&name, 9).unwrap();
        for w in 0..WRITERS {
            // The generation each slot holds, whole.
            let held: Vec<u64> = (0..SLOTS)
                .map(|s| {
                    let mut bytes = vec![0xEE; len];
                    snap.read_at(offset(w, s), &mut bytes).unwrap();
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
        drop(snap);
        store.delete(&name).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
}
