//! The RAM store resized while it serves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use iscsi_scsi::backstore::{Backstore, ResizeError};

use super::{CHUNK, RamBackstore};

const MIB: u64 = 1 << 20;

fn bytes_at(store: &RamBackstore, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xEE; len];
    store.read_at(offset, &mut buf).unwrap();
    buf
}

#[test]
fn a_growth_serves_the_new_blocks_as_zeros_and_keeps_the_old() {
    let store = RamBackstore::new(MIB, 512, 1).unwrap();
    store.write_at(MIB - 512, &[7; 512]).unwrap();
    assert!(store.write_at(MIB, &[1; 512]).is_err(), "beyond the end");
    assert_eq!(store.resize(Some(64 * MIB), false).unwrap(), 64 * MIB);
    assert_eq!(store.block_count(), 64 * MIB / 512);
    assert_eq!(bytes_at(&store, MIB - 512, 512), vec![7; 512]);
    assert_eq!(bytes_at(&store, MIB, 4096), vec![0; 4096]);
    store.write_at(64 * MIB - 512, &[9; 512]).unwrap();
    assert_eq!(bytes_at(&store, 64 * MIB - 512, 512), vec![9; 512]);
}

#[test]
fn bad_sizes_are_refused_and_change_nothing() {
    let store = RamBackstore::new(MIB, 4096, 1).unwrap();
    for size in [0, 512, MIB + 512] {
        assert!(matches!(
            store.resize(Some(size), true),
            Err(ResizeError::InvalidSize { .. })
        ));
    }
    assert!(matches!(
        store.resize(Some(1 << 63), false),
        Err(ResizeError::TooLarge { .. })
    ));
    assert!(matches!(
        store.resize(None, false),
        Err(ResizeError::Unsupported(_))
    ));
    assert_eq!(store.block_count(), MIB / 4096);
}

#[test]
fn a_shrink_over_data_is_refused_unless_told_and_then_drops_it() {
    let store = RamBackstore::new(4 * MIB, 512, 1).unwrap();
    // Data in the middle of a chunk the new end cuts, and in a later one.
    let end = 2 * MIB + 4096;
    store.write_at(end + 512, &[3; 512]).unwrap();
    store.write_at(3 * MIB, &[4; 512]).unwrap();
    store.write_at(end - 512, &[5; 512]).unwrap();
    match store.resize(Some(end), false) {
        Err(ResizeError::DataBeyond { at, size }) => {
            assert_eq!((at, size), (end + 512, end));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.block_count(), 4 * MIB / 512, "nothing changed");
    // Zeros written beyond are not data.
    store.write_at(end + 512, &[0; 512]).unwrap();
    store.write_at(3 * MIB, &[0; 512]).unwrap();
    assert_eq!(store.resize(Some(end), false).unwrap(), end);
    // Told to discard: the data beyond goes, what is before stays.
    store.resize(Some(4 * MIB), false).unwrap();
    store.write_at(3 * MIB, &[4; 512]).unwrap();
    assert_eq!(store.resize(Some(end), true).unwrap(), end);
    assert!(store.write_at(end, &[1; 512]).is_err());
    store.resize(Some(4 * MIB), false).unwrap();
    assert_eq!(bytes_at(&store, end - 512, 512), vec![5; 512]);
    let rest = (4 * MIB - end) as usize;
    assert_eq!(bytes_at(&store, end, rest), vec![0; rest]);
    assert_eq!(store.allocated_bytes(), CHUNK, "the chunk of the end only");
}

/// A write that passed its range check just before a shrink must not land
/// beyond the new end: a later growth would show its bytes where the
/// initiator should find zeros. Writers hammer the last megabyte while the
/// store shrinks past it (discarding) and grows back, many times.
#[test]
fn writes_racing_a_shrink_never_land_beyond_it() {
    let store = Arc::new(RamBackstore::new(8 * MIB, 512, 1).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let offset = 7 * MIB + (i * 4096 + w * 512) % MIB;
                    let _ = store.write_at(offset, &[0xA5; 512]);
                    i += 1;
                }
            })
        })
        .collect();
    for _ in 0..200 {
        store.resize(Some(7 * MIB), true).unwrap();
        let beyond = store.data_beyond(7 * MIB);
        assert_eq!(beyond, None, "a write landed beyond the end");
        store.resize(Some(8 * MIB), false).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
}
