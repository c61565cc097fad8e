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
    use std::sync::Arc;

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

    /// Writers in flight while snapshots are taken, 16 KiB writes
    /// ([`crate::snapshot_moments::snapshots_hold_one_moment`]).
    #[test]
    fn snapshots_under_writes_hold_one_moment() {
        let dir = Folder::on_reflink("moment");
        let store =
            Arc::new(FileBackstore::open(dir.path("lun.img"), Some(4 * MIB), 512, 1).unwrap());
        let offset = |w: u64, s: u64| (w * crate::snapshot_moments::SLOTS + s) * 32768 + 512;
        crate::snapshot_moments::snapshots_hold_one_moment(store, offset, 16384, 10);
    }
}
