//! File and block backstores: round trips, sparse reads, hole punching,
//! allocation status, O_DIRECT, and a real loop device.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::*;
use iscsi_scsi::{Backstore, BackstoreOpenError};
use iscsi_stores::{BlockBackstore, FileBackstore, RamBackstore};

#[test]
fn file_round_trip_and_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lu.img");
    let f = FileBackstore::open(&path, Some(1 << 20), 512, 9).unwrap();
    assert_eq!(f.block_count(), 2048);
    assert_eq!(f.block_size(), 512);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    let data = pattern(3, 8192);
    f.write_at(4096, &data).unwrap();
    f.write_through(65536, &data).unwrap();
    f.flush().unwrap();
    let mut back = vec![0u8; 8192];
    f.read_at(4096, &mut back).unwrap();
    assert_eq!(back, data);
    drop(f);
    // Reopened without a size: the file's length.
    let f = FileBackstore::open(&path, None, 4096, 9).unwrap();
    assert_eq!(f.block_count(), 256);
    f.read_at(65536, &mut back).unwrap();
    assert_eq!(back, data);
    // Out of range is an error, never a panic.
    assert!(f.read_at(1 << 20, &mut [0u8; 1]).is_err());
    assert!(f.write_at(u64::MAX, &[0u8; 2]).is_err());
    assert!(f.unmap(u64::MAX - 1, 4).is_err());
    assert!(f.allocation_status(1 << 20, 1).is_err());
}

#[test]
fn file_bad_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.img");
    assert!(matches!(
        FileBackstore::open(&path, Some(1000), 512, 1),
        Err(BackstoreOpenError::InvalidSize { .. })
    ));
    assert!(matches!(
        FileBackstore::open(&path, Some(4096), 1000, 1),
        Err(BackstoreOpenError::UnsupportedBlockSize(1000))
    ));
    std::fs::write(&path, [0u8; 1000]).unwrap();
    assert!(FileBackstore::open(&path, None, 512, 1).is_err());
    assert!(matches!(
        FileBackstore::open(dir.path().join("missing"), None, 512, 1),
        Err(BackstoreOpenError::Io(_))
    ));
    // A longer file is used up to the given size, not truncated.
    std::fs::write(&path, vec![7u8; 8192]).unwrap();
    let f = FileBackstore::open(&path, Some(4096), 512, 1).unwrap();
    assert_eq!(f.block_count(), 8);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8192);
}

#[test]
fn file_sparse_reads_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.img");
    let f = FileBackstore::open(&path, Some(64 << 20), 512, 1).unwrap();
    let mut buf = vec![0xAAu8; 1 << 20];
    f.read_at(32 << 20, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    // Nothing was allocated by reading.
    assert!(f.allocated_bytes().unwrap() < (1 << 20));
}

#[test]
fn file_punch_hole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("punch.img");
    let f = FileBackstore::open(&path, Some(8 << 20), 512, 1).unwrap();
    f.write_at(0, &vec![0x5Au8; 4 << 20]).unwrap();
    f.flush().unwrap();
    let before = f.allocated_bytes().unwrap();
    assert!(before >= 4 << 20);
    f.unmap(0, 2 << 20).unwrap();
    let after = f.allocated_bytes().unwrap();
    assert!(after + (1 << 20) < before, "{before} -> {after}");
    let mut buf = vec![1u8; 4096];
    f.read_at(1 << 20, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    f.read_at(3 << 20, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5A));
    // Allocation status: hole, then data, then hole to the end.
    let a = f.allocation_status(0, 8 << 20).unwrap();
    assert!(!a.mapped);
    assert_eq!(a.len, 2 << 20);
    let a = f.allocation_status(2 << 20, 6 << 20).unwrap();
    assert!(a.mapped);
    assert_eq!(a.len, 2 << 20);
    let a = f.allocation_status(4 << 20, 4 << 20).unwrap();
    assert!(!a.mapped);
    assert_eq!(a.len, 4 << 20);
}

#[test]
fn get_lba_status_on_file_and_ram() {
    let dir = tempfile::tempdir().unwrap();
    let f = Arc::new(FileBackstore::open(dir.path().join("g.img"), Some(8 << 20), 512, 1).unwrap());
    let r = Arc::new(RamBackstore::new(8 << 20, 512, 2).unwrap());
    for store in [f as Arc<dyn Backstore>, r as Arc<dyn Backstore>] {
        let t = target_over(Arc::clone(&store));
        let n = nexus(1);
        // Blocks 2048..4096 (1 MiB..2 MiB) written.
        good(&t, &n, &write16(2048, 2048), &vec![0xC3; 1 << 20]);
        let d = good(&t, &n, &get_lba_status(0, 1024), &[]);
        let ds = lba_status(&d);
        assert_eq!(ds[0], (0, 2048, 1), "{store:?}");
        assert_eq!(ds[1], (2048, 2048, 0), "{store:?}");
        assert_eq!(ds[2], (4096, 16384 - 4096, 1), "{store:?}");
        assert_eq!(ds.len(), 3);
        // From the middle of the mapped range.
        let d = good(&t, &n, &get_lba_status(3000, 24), &[]);
        assert_eq!(lba_status(&d), vec![(3000, 1096, 0)]);
        // UNMAP through the SCSI layer, then it reads deallocated.
        let mut list = vec![0, 22, 0, 16, 0, 0, 0, 0];
        list.extend_from_slice(&2048u64.to_be_bytes());
        list.extend_from_slice(&2048u32.to_be_bytes());
        list.extend_from_slice(&[0; 4]);
        good(&t, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &list);
        let d = good(&t, &n, &get_lba_status(0, 24), &[]);
        assert_eq!(lba_status(&d), vec![(0, 16384, 1)]);
        // Beyond the end.
        check(
            &t,
            &n,
            &get_lba_status(16384, 24),
            &[],
            iscsi_scsi::Sense::LBA_OUT_OF_RANGE,
        );
        // Truncated to the allocation length.
        assert_eq!(good(&t, &n, &get_lba_status(0, 4), &[]).len(), 4);
    }
}

#[test]
fn block_backstore_on_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blk.img");
    std::fs::write(&path, vec![0u8; 4 << 20]).unwrap();
    for direct in [false, true] {
        let b = BlockBackstore::open(&path, direct, 5).unwrap();
        assert_eq!(b.block_size(), 512);
        assert_eq!(b.block_count(), 8192);
        assert_eq!(b.is_direct(), direct);
        exercise_block(&b);
    }
    std::fs::write(&path, [0u8; 1000]).unwrap();
    assert!(BlockBackstore::open(&path, false, 5).is_err());
}

/// Aligned and unaligned I/O, UNMAP, range errors.
fn exercise_block(b: &BlockBackstore) {
    let data = pattern(9, 3 * 4096);
    b.write_at(8192, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    b.read_at(8192, &mut back).unwrap();
    assert_eq!(back, data);
    // Unaligned byte ranges work too (read-modify-write under O_DIRECT).
    b.write_at(8192 + 100, &[0xEE; 300]).unwrap();
    let mut small = [0u8; 500];
    b.read_at(8192, &mut small).unwrap();
    assert_eq!(&small[..100], &data[..100]);
    assert!(small[100..400].iter().all(|&x| x == 0xEE));
    assert_eq!(&small[400..], &data[400..500]);
    // Larger than one bounce buffer.
    let big = pattern(4, 3 << 19);
    b.write_through(0, &big).unwrap();
    let mut bigback = vec![0u8; big.len()];
    b.read_at(0, &mut bigback).unwrap();
    assert_eq!(bigback, big);
    b.unmap(4096, 8192).unwrap();
    let mut z = vec![1u8; 8192];
    b.read_at(4096, &mut z).unwrap();
    assert!(z.iter().all(|&x| x == 0));
    b.flush().unwrap();
    let end = b.block_count() * u64::from(b.block_size());
    assert!(b.read_at(end, &mut [0u8; 1]).is_err());
    assert!(b.write_at(end - 1, &[0u8; 2]).is_err());
    assert!(b.unmap(u64::MAX, 1).is_err());
    let a = b.allocation_status(0, end).unwrap();
    assert!(a.mapped);
    assert_eq!(a.len, end);
}

/// Detaches a loop device when dropped.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn block_backstore_on_loop_device() {
    if !Path::new("/dev/loop-control").exists() {
        println!("skipped: /dev/loop-control is absent, no loop devices here");
        return;
    }
    let image = tempfile::NamedTempFile::new_in("/dev/shm")
        .or_else(|_| tempfile::NamedTempFile::new())
        .unwrap();
    image.as_file().set_len(4 << 20).unwrap();
    let out = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(image.path())
        .output()
        .expect("running losetup");
    assert!(
        out.status.success(),
        "losetup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dev = Loop(String::from_utf8(out.stdout).unwrap().trim().to_string());
    for direct in [false, true] {
        let b = BlockBackstore::open(&dev.0, direct, 6).unwrap();
        assert_eq!(b.block_size(), 512, "BLKSSZGET");
        assert_eq!(b.block_count(), 8192);
        exercise_block(&b);
        // Through the SCSI layer as well.
        let t = target_over(Arc::new(b));
        let n = nexus(1);
        good(&t, &n, &write16(10, 2), &[0x42; 1024]);
        assert_eq!(good(&t, &n, &read16(10, 2), &[]), vec![0x42; 1024]);
    }
}

/// `write_pieces` on every store kind: pieces of a chunk and odd pieces,
/// aligned and not, a length shorter than the pieces; read back whole, the
/// bytes around untouched; too few bytes refused.
#[test]
fn every_store_takes_writes_in_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let file_path = dir.path().join("lu.img");
    let block_path = dir.path().join("blk.img");
    std::fs::write(&block_path, vec![0u8; 4 << 20]).unwrap();
    let stores: Vec<(&str, Box<dyn Backstore>)> = vec![
        ("ram", Box::new(RamBackstore::new(4 << 20, 512, 1).unwrap())),
        (
            "file",
            Box::new(FileBackstore::open(&file_path, Some(4 << 20), 512, 2).unwrap()),
        ),
        (
            "block",
            Box::new(BlockBackstore::open(&block_path, false, 3).unwrap()),
        ),
        (
            "block direct",
            Box::new(BlockBackstore::open(&block_path, true, 4).unwrap()),
        ),
    ];
    let chunk = iscsi_stores::RAM_CHUNK_SIZE;
    for (name, store) in stores {
        for (offset, lens, len) in [
            (0u64, vec![chunk, chunk, 512], 2 * chunk + 512),
            (512, vec![chunk, 1024, chunk], 2 * chunk + 1024),
            (3 * chunk as u64, vec![chunk, chunk], chunk + 4096),
            (1 << 20, vec![100, 412, 3000, 584], 4096),
        ] {
            let total: usize = lens.iter().sum();
            let data = pattern(offset as u8 ^ lens.len() as u8, total);
            let mut at = 0;
            let mut pieces: Vec<Vec<u8>> = lens
                .iter()
                .map(|&n| {
                    at += n;
                    data[at - n..at].to_vec()
                })
                .collect();
            let around = 4096u64;
            let start = offset.saturating_sub(around);
            let span = (offset - start) as usize + total + around as usize;
            let mut before = vec![0u8; span];
            store.read_at(start, &mut before).unwrap();
            store.write_pieces(offset, &mut pieces, len).unwrap();
            let mut after = vec![0u8; span];
            store.read_at(start, &mut after).unwrap();
            let at = (offset - start) as usize;
            assert!(after[at..at + len] == data[..len], "{name}: at {offset}");
            assert!(after[..at] == before[..at], "{name}: before {offset}");
            assert!(
                after[at + len..] == before[at + len..],
                "{name}: after {offset}"
            );
        }
        let mut short = vec![vec![1u8; 512]];
        assert!(store.write_pieces(0, &mut short, 1024).is_err(), "{name}");
        assert!(
            store.write_pieces(4 << 20, &mut short, 512).is_err(),
            "{name}"
        );
    }
}
