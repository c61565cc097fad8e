//! Against a running cluster: `scripts/ceph-dev start` (its conf at
//! /run/iscsi-rs-ceph/ceph.conf, or wherever `ISCSI_CEPH_CONF` says). Each
//! test creates its own image with the `rbd` CLI and removes it after.
//! Each `unsafe` block of `ffi` runs here: open (create, conf, set,
//! connect, ioctx, rbd_open, and the release of a half-built client on each
//! failure), size, id, fsid, read, write (with and without FUA), the
//! vectored write and its completion, discard, flush, compare-and-write,
//! writesame, diff-iterate and its callback, and the close on drop; the
//! asynchronous requests in `tests/aio.rs`; snapshots and clones
//! (`ffi/snap.rs`) in `tests/snapshots.rs`.

use std::process::Command;

mod aio;
mod pr;
mod snapshots;

use super::*;

fn conf() -> String {
    std::env::var("ISCSI_CEPH_CONF").unwrap_or_else(|_| "/run/iscsi-rs-ceph/ceph.conf".into())
}

/// An image created for one test, removed on drop.
struct TestImage(String);

impl TestImage {
    fn new(tag: &str, size: &str) -> TestImage {
        let name = format!("scsi-{tag}-{}", std::process::id());
        let conf = conf();
        let _ = Command::new("rbd")
            .args(["-c", &conf, "rm", &format!("rbd/{name}")])
            .output();
        let out = Command::new("rbd")
            .args([
                "-c",
                &conf,
                "create",
                &format!("rbd/{name}"),
                "--size",
                size,
            ])
            .output()
            .expect("the rbd CLI runs (scripts/ceph-dev installs it)");
        assert!(
            out.status.success(),
            "rbd create failed (is scripts/ceph-dev running, conf {conf}?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        TestImage(name)
    }

    fn spec(&self) -> RbdSpec {
        RbdSpec {
            pool: "rbd".into(),
            image: self.0.clone(),
            conf: Some(conf()),
            id: None,
            timeout_s: None,
        }
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let _ = Command::new("rbd")
            .args(["-c", &conf(), "rm", &format!("rbd/{}", self.0)])
            .output();
    }
}

#[test]
fn opens_sizes_and_identifies_the_image() {
    let image = TestImage::new("open", "64M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    assert_eq!(store.block_size(), 512);
    assert_eq!(store.block_count(), 64 << 11);
    assert!(store.is_thin() && store.may_block());
    // The same image through a second client: the same identifier.
    let again = RbdBackstore::open(&image.spec(), 4096).unwrap();
    assert_eq!(again.block_count(), 64 << 8);
    assert_eq!(store.unique_id(), again.unique_id());
    let other = TestImage::new("open-other", "64M");
    let other = RbdBackstore::open(&other.spec(), 512).unwrap();
    assert_ne!(store.unique_id(), other.unique_id());
}

#[test]
fn writes_read_back_across_objects_with_and_without_fua() {
    let image = TestImage::new("rw", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    // 4 MiB objects: this write straddles the first boundary.
    let at = (4 << 20) - 4096;
    let data: Vec<u8> = (0..16384u32).map(|i| (i * 7 + 3) as u8).collect();
    store.write_at(at, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    store.read_at(at, &mut back).unwrap();
    assert_eq!(back, data);
    store.write_through(0, &data[..4096]).unwrap();
    let mut pieces = vec![vec![1u8; 1024], vec![2u8; 1024]];
    store.write_pieces_through(8192, &mut pieces, 1536).unwrap();
    // Pieces across an object boundary, in one vectored request.
    let mut big: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i; 65536]).collect();
    let edge = (8 << 20) - 5 * 65536;
    store
        .write_pieces(edge, &mut big, 16 * 65536 - 100)
        .unwrap();
    let mut seen = vec![0u8; 16 * 65536];
    store.read_at(edge, &mut seen).unwrap();
    for (i, piece) in seen.chunks(65536).enumerate() {
        let want = if i == 15 { 65536 - 100 } else { 65536 };
        assert!(piece[..want].iter().all(|&b| b == i as u8), "piece {i}");
        assert!(piece[want..].iter().all(|&b| b == 0), "piece {i}");
    }
    store.flush().unwrap();
    let mut head = vec![0u8; 8192 + 2048];
    store.read_at(0, &mut head).unwrap();
    assert_eq!(&head[..4096], &data[..4096]);
    assert!(head[8192..9216].iter().all(|&b| b == 1));
    assert!(head[9216..9728].iter().all(|&b| b == 2));
    assert!(head[9728..].iter().all(|&b| b == 0));
    // Seen by another client (nothing stayed in this one's memory).
    let other = RbdBackstore::open(&image.spec(), 512).unwrap();
    let mut seen = vec![0u8; data.len()];
    other.read_at(at, &mut seen).unwrap();
    assert_eq!(seen, data);
}

#[test]
fn unmap_reads_zeros_even_for_a_partial_object() {
    let image = TestImage::new("unmap", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    store.write_at(0, &vec![0xA5; 1 << 20]).unwrap();
    // 512 bytes: far below Pacific's default discard granularity.
    store.unmap(4096, 512).unwrap();
    store.unmap(65536, 128 << 10).unwrap();
    let mut back = vec![0u8; 1 << 20];
    store.read_at(0, &mut back).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0xA5));
    assert!(back[4096..4608].iter().all(|&b| b == 0));
    assert!(back[4608..65536].iter().all(|&b| b == 0xA5));
    assert!(back[65536..(192 << 10)].iter().all(|&b| b == 0));
    assert!(back[(192 << 10)..].iter().all(|&b| b == 0xA5));
}

#[test]
fn out_of_range_is_an_error_not_a_call() {
    let image = TestImage::new("range", "4M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let mut buf = [0u8; 512];
    assert!(store.read_at(4 << 20, &mut buf).is_err());
    assert!(store.write_at((4 << 20) - 256, &buf).is_err());
    assert!(store.unmap(0, (4 << 20) + 512).is_err());
}

#[test]
fn a_missing_image_or_pool_is_named() {
    let mut spec = TestImage::new("missing", "4M").spec();
    spec.image = "no-such-image".into();
    let e = RbdBackstore::open(&spec, 512).unwrap_err().to_string();
    assert!(
        e.contains("opening image \"no-such-image\" in pool \"rbd\""),
        "{e}"
    );
    spec.pool = "no-such-pool".into();
    let e = RbdBackstore::open(&spec, 512).unwrap_err().to_string();
    assert!(e.contains("opening pool \"no-such-pool\""), "{e}");
}

#[test]
fn a_size_not_in_whole_blocks_is_refused() {
    // 4098 KiB: whole 512-byte blocks, not whole 4096-byte ones.
    let image = TestImage::new("odd", "4098K");
    assert_eq!(
        RbdBackstore::open(&image.spec(), 512)
            .unwrap()
            .block_count(),
        4098 * 2
    );
    assert!(matches!(
        RbdBackstore::open(&image.spec(), 4096),
        Err(BackstoreOpenError::InvalidSize {
            size: 4_196_352,
            block_size: 4096
        })
    ));
    assert!(matches!(
        RbdBackstore::open(&image.spec(), 513),
        Err(BackstoreOpenError::UnsupportedBlockSize(513))
    ));
}

#[test]
fn an_unreachable_cluster_names_the_monitors_tried() {
    // A conf whose monitor is a loopback port nothing listens on, with the
    // dev cluster's keyring: the connect times out (client_mount_timeout).
    let dir = tempfile::tempdir().unwrap();
    let keyring = std::path::Path::new(&conf()).with_file_name("keyring");
    let path = dir.path().join("ceph.conf");
    std::fs::write(
        &path,
        format!(
            "[global]\nmon host = v2:127.0.0.1:1\nkeyring = {}\n",
            keyring.display()
        ),
    )
    .unwrap();
    let spec = RbdSpec {
        pool: "rbd".into(),
        image: "anything".into(),
        conf: Some(path.to_str().unwrap().into()),
        id: None,
        timeout_s: None,
    };
    let e = RbdBackstore::open(&spec, 512).unwrap_err().to_string();
    assert!(
        e.contains("connecting as client.admin to the monitors") && e.contains("127.0.0.1:1"),
        "{e}"
    );
    // A conf that does not exist is named too.
    let spec = RbdSpec {
        conf: Some("/nonexistent/ceph.conf".into()),
        ..spec
    };
    let e = RbdBackstore::open(&spec, 512).unwrap_err().to_string();
    assert!(e.contains("reading /nonexistent/ceph.conf"), "{e}");
}

#[test]
fn an_unknown_user_is_refused_at_connect() {
    let mut spec = TestImage::new("user", "4M").spec();
    spec.id = Some("nobody".into());
    let e = RbdBackstore::open(&spec, 512).unwrap_err().to_string();
    assert!(e.contains("connecting as client.nobody"), "{e}");
}

/// `rbd resize` from the CLI (another client, as an operator would).
fn resize(image: &TestImage, size: &str) {
    let out = Command::new("rbd")
        .args(["-c", &conf(), "resize", &format!("rbd/{}", image.0)])
        .args(["--size", size, "--allow-shrink"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn compare_and_write_in_the_osd_matches_and_reports_the_miscompare_offset() {
    let image = TestImage::new("caw", "8M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let old: Vec<u8> = (0..512u32).map(|i| i as u8).collect();
    let new = vec![0x5Au8; 512];
    // In the second object, so that an offset counted from the image or
    // from the object would not pass for one counted from the range.
    let at = (4 << 20) + 4096 + 512;
    store.write_at(at, &old).unwrap();
    // A match writes.
    assert!(matches!(
        store.compare_and_write(at, &old, &new, false),
        Some(Ok(None))
    ));
    let mut back = vec![0u8; 512];
    store.read_at(at, &mut back).unwrap();
    assert_eq!(back, new);
    // Through a second client (another gateway), with a stale expectation:
    // the first differing byte, counted from the start of the range, and
    // nothing written.
    let other = RbdBackstore::open(&image.spec(), 512).unwrap();
    let mut stale = new.clone();
    stale[37] ^= 1;
    let r = other.compare_and_write(at, &stale, &old, true);
    assert!(matches!(r, Some(Ok(Some(37)))), "{r:?}");
    store.read_at(at, &mut back).unwrap();
    assert_eq!(back, new);
    // A range that starts inside its sector: byte 37 of it, still.
    let r = other.compare_and_write(at + 128, &stale[128..384], &old[..256], false);
    assert!(matches!(r, Some(Ok(None))), "{r:?}");
    let mut stale = old[..256].to_vec();
    stale[37] ^= 1;
    let r = other.compare_and_write(at + 128, &stale, &new[..256], false);
    assert!(matches!(r, Some(Ok(Some(37)))), "{r:?}");
    // More than one 512-byte sector: librbd cannot, the SCSI layer does it.
    assert!(
        store
            .compare_and_write(0, &[0; 1024], &[1; 1024], false)
            .is_none()
    );
    assert!(
        store
            .compare_and_write(256, &[0; 512], &[1; 512], false)
            .is_none()
    );
    // Out of range: an error, not a call.
    assert!(matches!(
        store.compare_and_write(8 << 20, &[0; 512], &[1; 512], false),
        Some(Err(_))
    ));
}

#[test]
fn write_same_repeats_one_block_across_objects() {
    let image = TestImage::new("ws", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let block: Vec<u8> = (0..512u32).map(|i| (i * 3 + 1) as u8).collect();
    // From 512 bytes before the first object boundary, into the third object.
    let at = (4 << 20) - 512;
    let len = (4 << 20) + 1024;
    assert!(matches!(
        store.write_same(at, len, &block, true),
        Some(Ok(()))
    ));
    let mut back = vec![0u8; len as usize + 1024];
    store.read_at(at - 512, &mut back).unwrap();
    assert!(back[..512].iter().all(|&b| b == 0));
    for chunk in back[512..512 + len as usize].chunks(512) {
        assert_eq!(chunk, &block[..]);
    }
    assert!(back[512 + len as usize..].iter().all(|&b| b == 0));
    // Zeros are written, not discarded: the blocks stay mapped.
    let zeros = (12 << 20) as u64;
    assert!(matches!(
        store.write_same(zeros, 4096, &[0; 512], false),
        Some(Ok(()))
    ));
    assert!(store.allocation_status(zeros, 4096).unwrap().mapped);
    assert!(matches!(
        store.write_same(16 << 20, 512, &block, false),
        Some(Err(_))
    ));
}

#[test]
fn allocation_follows_what_was_written_and_discarded() {
    let image = TestImage::new("alloc", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let all = 16 << 20;
    // Never written: one deallocated run over the whole window.
    assert_eq!(
        store.allocation_status(0, all).unwrap(),
        Allocation {
            mapped: false,
            len: all
        }
    );
    // 4 KiB in the second object: the first object is a hole up to it, and
    // the run from there is mapped, no longer than the object.
    store.write_at((4 << 20) + 8192, &[7; 4096]).unwrap();
    assert_eq!(
        store.allocation_status(0, all).unwrap(),
        Allocation {
            mapped: false,
            len: 4 << 20
        }
    );
    let run = store.allocation_status(4 << 20, all - (4 << 20)).unwrap();
    assert!(run.mapped, "{run:?}");
    assert!((12288..=4 << 20).contains(&run.len), "{run:?}");
    // The third object written too: the runs join.
    store.write_at(8 << 20, &vec![9; 4 << 20]).unwrap();
    let run = store.allocation_status(12 << 20, 4 << 20).unwrap();
    assert!(!run.mapped, "{run:?}");
    // Discarding the whole second object deallocates it.
    store.unmap(4 << 20, 4 << 20).unwrap();
    let run = store.allocation_status(0, all).unwrap();
    assert_eq!(
        run,
        Allocation {
            mapped: false,
            len: 8 << 20
        }
    );
    assert!(store.allocation_status(8 << 20, 4 << 20).unwrap().mapped);
    assert!(store.allocation_status(0, all + 512).is_err());
}

#[test]
fn a_resize_is_noticed_and_raises_capacity_data_has_changed() {
    use iscsi_scsi::{Asc, Nexus, ScsiTarget, Sense, TargetIdentity, status};
    let image = TestImage::new("resize", "8M");
    let store = Arc::new(RbdBackstore::open(&image.spec(), 512).unwrap());
    assert!(!store.take_capacity_change());
    let target = ScsiTarget::new(
        TargetIdentity::new("iqn.2026-11.test:rbd"),
        vec![store.clone() as Arc<dyn Backstore>],
    );
    let nexus = Nexus::iscsi("iqn.2024-01.test:init", 1, 1);
    let read_capacity =
        |din: &mut Vec<u8>| target.execute(&nexus, 0, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], din);
    let mut din = Vec::new();
    // The nexus's first commands take its power-on unit attention.
    while read_capacity(&mut din).status != status::GOOD {}
    assert_eq!(
        u32::from_be_bytes(din[..4].try_into().unwrap()),
        (8 << 11) - 1
    );
    resize(&image, "16M");
    // The poll runs every second; librbd re-reads the header once its watch
    // hears of the change.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.block_count() != 16 << 11 {
        assert!(std::time::Instant::now() < deadline, "resize not seen");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let outcome = read_capacity(&mut din);
    assert_eq!(
        outcome.sense,
        Some(Sense::unit_attention(Asc::CAPACITY_DATA_HAS_CHANGED))
    );
    assert_eq!(read_capacity(&mut din).status, status::GOOD);
    assert_eq!(
        u32::from_be_bytes(din[..4].try_into().unwrap()),
        (16 << 11) - 1
    );
    // A shrink too, read at once here instead of waiting for the poll.
    resize(&image, "4M");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.block_count() != 4 << 11 {
        assert!(std::time::Instant::now() < deadline, "shrink not seen");
        store.poll_size_now();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut block = [0u8; 512];
    assert!(store.read_at(4 << 20, &mut block).is_err());
    assert!(store.take_capacity_change());
    assert!(!store.take_capacity_change());
}

#[test]
fn a_removed_image_fails_every_io_with_medium_not_present() {
    use iscsi_scsi::{Nexus, ScsiTarget, Sense, TargetIdentity, status};
    let image = TestImage::new("removed", "8M");
    let store = Arc::new(RbdBackstore::open(&image.spec(), 512).unwrap());
    store.write_at(0, &[7u8; 4096]).unwrap();
    let target = ScsiTarget::new(
        TargetIdentity::new("iqn.2026-11.test:rbd"),
        vec![store.clone() as Arc<dyn Backstore>],
    );
    let nexus = Nexus::iscsi("iqn.2024-01.test:init", 1, 1);
    let read10 = [0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0];
    let mut din = Vec::new();
    while target.execute(&nexus, 0, &read10, &[], &mut din).status != status::GOOD {}
    // `rbd rm` refuses while the gateway has the image open (its watch);
    // what gets it removed under a gateway is a cluster that lost the
    // gateway's watch (a partition) or a forced removal: the header goes.
    let oid = format!("rbd_header.{}", store.shared.image().id().unwrap());
    let out = Command::new("rados")
        .args(["-c", &conf(), "-p", "rbd", "rm", &oid])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // librbd may go on answering from its cache; the poll (every second,
    // or at once when librbd answers ENOENT) notices the header is gone.
    // Only writes after that are sent here: one that reached librbd
    // before would wait there for good (`Medium::failed`).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut block = [0u8; 512];
    while !store.shared.medium.removed.load(Ordering::Acquire) {
        assert!(
            std::time::Instant::now() < deadline,
            "the removal was not noticed"
        );
        let _ = store.read_at(0, &mut block);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let e = store.read_at(0, &mut block).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    let e = store.write_at(0, &block).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let io = store.async_io().unwrap();
    let (_, r) = rt.block_on(io.read(0, vec![0; 512]));
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::NotFound);
    let outcome = target.execute(&nexus, 0, &read10, &[], &mut din);
    assert_eq!(outcome.sense, Some(Sense::MEDIUM_NOT_PRESENT));
}

/// The early wake of the poll ([`Medium::failed`]): only ENOENT, once per
/// poll, and never while the removal is known already.
#[test]
fn only_enoent_from_librbd_wakes_the_poll() {
    let (wake, woken) = mpsc::sync_channel(1);
    let medium = Medium {
        block_size: 512,
        block_count: AtomicU64::new(8),
        removed: AtomicBool::new(false),
        wake,
    };
    let e = medium.failed(io::Error::from_raw_os_error(5));
    assert_eq!(e.raw_os_error(), Some(5), "the error goes on unchanged");
    assert!(woken.try_recv().is_err(), "EIO wakes nothing");
    let e = medium.failed(io::Error::from_raw_os_error(2));
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    // A second before the poll ran: the wake is pending, nothing blocks.
    medium.failed(io::Error::from_raw_os_error(2));
    assert!(woken.try_recv().is_ok());
    assert!(woken.try_recv().is_err(), "one wake, not one per error");
    medium.removed.store(true, Ordering::Release);
    medium.failed(io::Error::from_raw_os_error(2));
    assert!(woken.try_recv().is_err(), "known removed: no wake");
}

/// The exclusive lock's calls (`ffi/lock.rs`): acquire, owners, break
/// (which blocklists the holder), release; metadata and xattrs.
#[test]
fn the_lock_moves_only_when_broken_and_the_old_holder_is_fenced() {
    let image = TestImage::new("lock", "16M");
    let a = RbdBackstore::open(&image.spec(), 512).unwrap();
    let b = RbdBackstore::open(&image.spec(), 512).unwrap();
    assert!(a.shared.image().lock_owners().unwrap().is_empty());
    a.shared.image().lock_acquire().unwrap();
    assert!(a.shared.image().is_lock_owner().unwrap());
    assert!(!b.shared.image().is_lock_owner().unwrap());
    let owners = b.shared.image().lock_owners().unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    // Application-managed: B cannot simply take it.
    assert!(b.shared.image().lock_acquire().is_err());
    b.shared.image().lock_break(&owners[0]).unwrap();
    b.shared.image().lock_acquire().unwrap();
    assert!(b.shared.image().is_lock_owner().unwrap());
    b.write_at(0, &[7u8; 512]).unwrap();
    // A was blocklisted by the break: its write fails (ESHUTDOWN), which
    // trips its fence, and the fence says "again soon" (EAGAIN: BUSY)
    // while A rejoins.
    let e = a.write_at(0, &[1u8; 512]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(11), "{e}");
    assert!(a.shared.fence.tripped());
    b.shared.image().lock_release().unwrap();
    assert!(b.shared.image().lock_owners().unwrap().is_empty());
    // Unblocklist A's client is not needed: it goes with `a`.
}

#[test]
fn metadata_and_xattrs_read_back() {
    let image = TestImage::new("meta", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    assert_eq!(
        store
            .shared
            .image()
            .metadata(gateway::PREFERRED_KEY)
            .unwrap(),
        None
    );
    let out = Command::new("rbd")
        .args([
            "-c",
            &conf(),
            "image-meta",
            "set",
            &format!("rbd/{}", image.0),
            gateway::PREFERRED_KEY,
            "2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        store
            .shared
            .image()
            .metadata(gateway::PREFERRED_KEY)
            .unwrap()
            .as_deref(),
        Some("2")
    );
    // The header object: it goes with the image.
    let oid = format!("rbd_header.{}", store.shared.image().id().unwrap());
    assert_eq!(store.shared.image().xattr(&oid, "test.hb.1").unwrap(), None);
    store
        .shared
        .image()
        .set_xattr(&oid, "test.hb.1", b"42")
        .unwrap();
    assert_eq!(
        store
            .shared
            .image()
            .xattr(&oid, "test.hb.1")
            .unwrap()
            .as_deref(),
        Some(&b"42"[..])
    );
    assert_eq!(store.shared.image().xattr(&oid, "test.hb.2").unwrap(), None);
}

/// Two gateways in one group over one image: one owns it (active/optimized
/// on both), the other is standby; when the owner goes (its store
/// dropped, which lets the lock go) the other takes it.
#[test]
fn two_gateways_agree_on_one_owner_and_the_survivor_takes_over() {
    use iscsi_scsi::alua::AccessState::*;
    let image = TestImage::new("group", "16M");
    let open = |port| {
        let group = GatewayGroup::new(port, [1, 2]);
        RbdBackstore::open_in_group(&image.spec(), 512, Some(&group)).unwrap()
    };
    let a = open(1);
    let b = open(2);
    let (ga, gb) = (a.alua().unwrap(), b.alua().unwrap());
    let settled = |want: [iscsi_scsi::alua::AccessState; 2]| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let now = |g: &AluaGroup| [g.state_of(1), g.state_of(2)];
            if now(&ga) == want && now(&gb) == want {
                return;
            }
            assert!(
                std::time::Instant::now() < until,
                "{:?} {:?}",
                now(&ga),
                now(&gb)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    settled([ActiveOptimized, Standby]);
    assert_eq!(ga.view(), gb.view());
    assert!(a.shared.image().is_lock_owner().unwrap());
    drop(a);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while gb.state_of(2) != ActiveOptimized {
        assert!(std::time::Instant::now() < until, "{:?}", gb.view());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(b.shared.image().is_lock_owner().unwrap());
    b.write_at(0, &[3u8; 512]).unwrap();
}

/// Sends `signal` to the cluster's OSD (its PID file beside the conf, as
/// scripts/ceph-dev writes it).
fn osd_pid() -> u32 {
    let conf = conf();
    let run = std::path::Path::new(&conf)
        .parent()
        .unwrap()
        .join("run/osd.0.pid");
    std::fs::read_to_string(&run)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Resumes the OSD however the test ends.
struct Resume;

impl Drop for Resume {
    fn drop(&mut self) {
        iscsi_test_peers::signal_process(osd_pid(), "-CONT");
    }
}

/// The cluster lost mid-run: with `timeout=3` a write and a read to a
/// stopped OSD fail in bounded time with an error that the SCSI layer
/// turns into NOT READY / LOGICAL UNIT COMMUNICATION TIME-OUT (not a
/// MEDIUM ERROR, which an initiator takes as final), and once the OSD
/// runs again the same client serves again with what was acknowledged
/// before intact. Ignored in the ordinary run because it stops the
/// cluster's only OSD under every other test: scripts/test runs it alone.
#[test]
#[ignore = "stops the cluster's OSD: run alone (scripts/test does)"]
fn a_lost_cluster_times_out_not_ready_and_serves_again() {
    use iscsi_scsi::sense::Sense;
    let image = TestImage::new("lost", "16M");
    let spec = RbdSpec {
        timeout_s: Some(3),
        ..image.spec()
    };
    let store = RbdBackstore::open(&spec, 512).unwrap();
    let before = vec![0x5a; 65536];
    store.write_at(0, &before).unwrap();
    // Stopped in every thread before the test goes on.
    iscsi_test_peers::stop_process(osd_pid());
    let resume = Resume;
    let started = std::time::Instant::now();
    let e = store.write_at(65536, &[0xa5; 4096]).unwrap_err();
    let write_took = started.elapsed();
    let started = std::time::Instant::now();
    let mut buf = vec![0; 4096];
    let r = store.read_at(0, &mut buf).unwrap_err();
    let read_took = started.elapsed();
    drop(resume);
    for (e, took) in [(&e, write_took), (&r, read_took)] {
        assert_eq!(
            Sense::for_io_error(e, Sense::WRITE_ERROR),
            Sense::LU_COMMUNICATION_TIMEOUT,
            "{e}"
        );
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(15),
            "{took:?}"
        );
    }
    // Back: the same store writes and reads again (no restart), and the
    // data acknowledged before the loss is there.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let after = vec![0xc3; 4096];
    while let Err(e) = store.write_at(65536, &after) {
        assert!(std::time::Instant::now() < deadline, "still failing: {e}");
    }
    let mut got = vec![0; 65536 + 4096];
    store.read_at(0, &mut got).unwrap();
    assert!(got[..65536] == before[..], "acknowledged data lost");
    assert!(got[65536..] == after[..]);
}
