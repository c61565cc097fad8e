//! File and block stores, and the wrappers over them, resized while they
//! serve (the RAM store's own tests are in `src/ram/resize_tests.rs`).

use std::sync::Arc;

use iscsi_scsi::backstore::{Backstore, ResizeError};
use iscsi_stores::{BlockBackstore, EncryptedBackstore, FileBackstore, RamBackstore};

const MIB: u64 = 1 << 20;

fn read(store: &dyn Backstore, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xEE; len];
    store.read_at(offset, &mut buf).unwrap();
    buf
}

#[test]
fn a_file_grows_sparsely_and_a_restart_opens_it_at_the_new_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let store = FileBackstore::open(&path, Some(MIB), 512, 1).unwrap();
    store.write_at(MIB - 512, &[7; 512]).unwrap();
    assert_eq!(store.resize(Some(16 * MIB), false).unwrap(), 16 * MIB);
    assert_eq!(store.block_count(), 16 * MIB / 512);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 * MIB);
    assert_eq!(read(&store, MIB - 512, 512), vec![7; 512]);
    assert_eq!(read(&store, MIB, 4096), vec![0; 4096]);
    store.write_at(16 * MIB - 512, &[8; 512]).unwrap();
    drop(store);
    let again = FileBackstore::open(&path, None, 512, 1).unwrap();
    assert_eq!(again.block_count(), 16 * MIB / 512);
    assert_eq!(read(&again, 16 * MIB - 512, 512), vec![8; 512]);
}

#[test]
fn a_file_extended_by_hand_is_taken_at_its_length() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let store = FileBackstore::open(&path, Some(MIB), 512, 1).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(3 * MIB)
        .unwrap();
    assert_eq!(store.block_count(), MIB / 512, "not before it is asked");
    assert_eq!(store.resize(None, false).unwrap(), 3 * MIB);
    assert_eq!(store.block_count(), 3 * MIB / 512);
}

#[test]
fn a_file_shrinks_only_over_zeros_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let store = FileBackstore::open(&path, Some(8 * MIB), 512, 1).unwrap();
    store.write_at(MIB, &[1; 4096]).unwrap();
    store.write_at(6 * MIB + 512, &[2; 512]).unwrap();
    // Zeros written (allocated, yet no data) are not in the way.
    store.write_at(4 * MIB, &[0; 65536]).unwrap();
    match store.resize(Some(4 * MIB), false) {
        Err(ResizeError::DataBeyond { at, size }) => {
            assert_eq!((at, size), (6 * MIB + 512, 4 * MIB))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.block_count(), 8 * MIB / 512, "nothing changed");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 * MIB);
    store.write_at(6 * MIB + 512, &[0; 512]).unwrap();
    assert_eq!(store.resize(Some(4 * MIB), false).unwrap(), 4 * MIB);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * MIB);
    assert!(
        store.write_at(4 * MIB, &[1; 512]).is_err(),
        "beyond the end"
    );
    // Told to discard: the data goes with the file's tail.
    store.write_at(3 * MIB, &[3; 512]).unwrap();
    assert_eq!(store.resize(Some(2 * MIB), true).unwrap(), 2 * MIB);
    store.resize(Some(4 * MIB), false).unwrap();
    assert_eq!(read(&store, 3 * MIB, 512), vec![0; 512]);
    assert_eq!(read(&store, MIB, 4096), vec![1; 4096]);
    for bad in [0, 1000] {
        assert!(matches!(
            store.resize(Some(bad), true),
            Err(ResizeError::InvalidSize { .. })
        ));
    }
}

/// A block store over a regular file (what a loop device's backing file
/// is): the LU follows the device's length, and only that.
#[test]
fn a_block_store_follows_its_device() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk");
    std::fs::File::create(&path).unwrap().set_len(MIB).unwrap();
    let store = BlockBackstore::open(&path, false, 1).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(2 * MIB)
        .unwrap();
    assert!(matches!(
        store.resize(Some(4 * MIB), false),
        Err(ResizeError::Unsupported(_))
    ));
    assert_eq!(store.block_count(), MIB / 512);
    assert_eq!(store.resize(Some(2 * MIB), false).unwrap(), 2 * MIB);
    assert_eq!(store.resize(None, false).unwrap(), 2 * MIB);
    store.write_at(2 * MIB - 512, &[5; 512]).unwrap();
    assert_eq!(read(&store, 2 * MIB - 512, 512), vec![5; 512]);
}

/// The encryption wraps the store: a growth reads zeros (never-written
/// units), a shrink sees the ciphertext as data.
#[test]
fn an_encrypted_store_resizes_through_to_its_medium() {
    let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(MIB, 512, 1).unwrap());
    let store = EncryptedBackstore::with_memory_key(ram).unwrap();
    store.write_at(MIB - 512, &[6; 512]).unwrap();
    store.resize(Some(2 * MIB), false).unwrap();
    assert_eq!(read(&store, MIB, 4096), vec![0; 4096]);
    assert_eq!(read(&store, MIB - 512, 512), vec![6; 512]);
    assert!(matches!(
        store.resize(Some(MIB - 512), false),
        Err(ResizeError::DataBeyond { .. })
    ));
    assert_eq!(store.resize(Some(MIB - 512), true).unwrap(), MIB - 512);
}
