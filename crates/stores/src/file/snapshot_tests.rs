//! Snapshots of the file store. Most need a file system that shares
//! blocks: they are built with the feature `reflink-tests`, and
//! `ISCSI_REFLINK_DIR` names a folder on XFS or btrfs for them
//! (`scripts/reflink-dir` mounts an XFS image; `.ci/run` and `scripts/test`
//! run them so). The temporary folder shows the refusal where it cannot.

use iscsi_scsi::backstore::{Backstore, SnapshotError, Snapshots};

use super::super::FileBackstore;

const MIB: u64 = 1 << 20;

#[test]
fn a_file_system_without_reflink_is_refused_in_words() {
    let dir = std::env::temp_dir().join(format!("stores-noreflink-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lun.img");
    let store = FileBackstore::open(&path, Some(MIB), 512, 1).unwrap();
    store.write_at(0, &[1; 512]).unwrap();
    let fs_shares = std::process::Command::new("cp")
        .arg("--reflink=always")
        .arg(&path)
        .arg(dir.join("probe"))
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    match store.take("one") {
        Err(SnapshotError::Unsupported(words)) => {
            assert!(!fs_shares, "the file system shares blocks: {words}");
            assert!(
                words.contains("reflink") && words.contains("XFS"),
                "{words}"
            );
            assert!(store.list().unwrap().is_empty(), "nothing left behind");
        }
        Ok(_) => assert!(fs_shares, "a snapshot where cp --reflink fails"),
        Err(other) => panic!("{other}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "reflink-tests")]
mod on_reflink {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Barrier};

    use super::*;

    /// A fresh folder under `ISCSI_REFLINK_DIR`, removed at the end.
    struct Folder(PathBuf);

    impl Folder {
        fn on_reflink(what: &str) -> Folder {
            let base = std::env::var("ISCSI_REFLINK_DIR").expect(
                "ISCSI_REFLINK_DIR: a folder on XFS or btrfs (scripts/reflink-dir makes one; \
                 .ci/run and scripts/test set it)",
            );
            let dir = PathBuf::from(base).join(format!("stores-{what}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Folder(dir)
        }

        fn path(&self, name: &str) -> String {
            self.0.join(name).to_str().unwrap().to_owned()
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn bytes_at(store: &dyn Backstore, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0xEE; len];
        store.read_at(offset, &mut buf).unwrap();
        buf
    }

    #[test]
    fn a_snapshot_keeps_the_file_as_it_was_and_serves_read_only() {
        let dir = Folder::on_reflink("keep");
        let store = FileBackstore::open(dir.path("lun.img"), Some(4 * MIB), 512, 1).unwrap();
        store.write_at(4096, &[1; 8192]).unwrap();
        let info = store.take("before").unwrap();
        assert_eq!(info.size_bytes, 4 * MIB);
        assert!(info.taken_unix.is_some());
        store.write_at(4096, &[2; 8192]).unwrap();
        store.resize(Some(8 * MIB), false).unwrap();
        assert!(
            std::path::Path::new(&dir.path("lun.img.snapshots/before")).exists(),
            "beside the file"
        );

        let snap = store.open("before", 5).unwrap();
        assert_eq!(snap.block_count(), 4 * MIB / 512);
        assert_eq!(bytes_at(&*snap, 4096, 8192), vec![1; 8192]);
        assert_eq!(bytes_at(&store, 4096, 8192), vec![2; 8192]);
        assert!(snap.write_at(0, &[9; 512]).is_err());
        assert!(snap.unmap(0, 512).is_err());
        assert!(snap.resize(Some(MIB), true).is_err());
        assert!(snap.snapshots().unwrap().take("x").is_err());

        // Refusals change nothing.
        assert!(matches!(
            store.take("before"),
            Err(SnapshotError::Exists(_))
        ));
        assert_eq!(
            bytes_at(&*store.open("before", 5).unwrap(), 4096, 512),
            vec![1; 512]
        );
        assert!(matches!(store.take("../x"), Err(SnapshotError::BadName(_))));
        assert!(matches!(
            store.open("none", 1),
            Err(SnapshotError::NotFound(_))
        ));
        assert!(matches!(
            store.delete("none"),
            Err(SnapshotError::NotFound(_))
        ));

        // A clone: writable, its own file, made once.
        let to = dir.path("clone.img");
        let clone = store.clone_into("before", Some(&to), 6).unwrap();
        clone.write_at(4096, &[3; 512]).unwrap();
        assert_eq!(bytes_at(&*snap, 4096, 512), vec![1; 512]);
        drop(clone);
        let again = store.clone_into("before", Some(&to), 6).unwrap();
        assert_eq!(
            bytes_at(&*again, 4096, 512),
            vec![3; 512],
            "opened as it is"
        );
        assert!(matches!(
            store.clone_into("before", None, 6),
            Err(SnapshotError::Unsupported(_))
        ));

        // Deleting leaves the LUN serving it and the clone whole.
        store.take("second").unwrap();
        let names: Vec<_> = store.list().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["before", "second"]);
        store.delete("before").unwrap();
        assert_eq!(bytes_at(&*snap, 4096, 512), vec![1; 512]);
        assert_eq!(bytes_at(&*again, 4096, 512), vec![3; 512]);
        assert_eq!(store.list().unwrap().len(), 1);
    }

    /// Writers in flight while snapshots are taken, as for the RAM store
    /// (`ram/snapshot_tests.rs`): each snapshot holds of each writer a prefix
    /// of its writes, every one answered before `take`, none issued after.
    #[test]
    fn snapshots_under_writes_hold_one_moment() {
        const WRITERS: u64 = 3;
        const SLOTS: u64 = 8;
        const LEN: usize = 16384;
        let dir = Folder::on_reflink("moment");
        let store =
            Arc::new(FileBackstore::open(dir.path("lun.img"), Some(4 * MIB), 512, 1).unwrap());
        let offset = |w: u64, s: u64| (w * SLOTS + s) * LEN as u64 * 2 + 512;
        let answered: Arc<Vec<AtomicU64>> =
            Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
        let issued: Arc<Vec<AtomicU64>> =
            Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
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
        for n in 0..10 {
            let before: Vec<u64> = answered.iter().map(|a| a.load(Ordering::SeqCst)).collect();
            let name = format!("s{n}");
            store.take(&name).unwrap();
            let after: Vec<u64> = issued.iter().map(|a| a.load(Ordering::SeqCst)).collect();
            let snap = store.open(&name, 9).unwrap();
            for w in 0..WRITERS {
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
        assert!(answered.iter().all(|a| a.load(Ordering::SeqCst) > 0));
    }
}
