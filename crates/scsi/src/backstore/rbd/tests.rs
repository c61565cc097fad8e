//! Against a running cluster: `scripts/ceph-dev start` (its conf at
//! /run/iscsi-rs-ceph/ceph.conf, or wherever `ISCSI_CEPH_CONF` says). Each
//! test creates its own image with the `rbd` CLI and removes it after.
//! Each `unsafe` block of `ffi` runs here: open (create, conf, set,
//! connect, ioctx, rbd_open, and the release of a half-built client on each
//! failure), size, id, fsid, read, write (with and without FUA), discard,
//! flush, and the close on drop.

use std::process::Command;

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

/// The exclusive lock's calls (`ffi/lock.rs`): acquire, owners, break
/// (which blocklists the holder), release; metadata and xattrs.
#[test]
fn the_lock_moves_only_when_broken_and_the_old_holder_is_fenced() {
    let image = TestImage::new("lock", "16M");
    let a = RbdBackstore::open(&image.spec(), 512).unwrap();
    let b = RbdBackstore::open(&image.spec(), 512).unwrap();
    assert!(a.image.lock_owners().unwrap().is_empty());
    a.image.lock_acquire().unwrap();
    assert!(a.image.is_lock_owner().unwrap());
    assert!(!b.image.is_lock_owner().unwrap());
    let owners = b.image.lock_owners().unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    // Application-managed: B cannot simply take it.
    assert!(b.image.lock_acquire().is_err());
    b.image.lock_break(&owners[0]).unwrap();
    b.image.lock_acquire().unwrap();
    assert!(b.image.is_lock_owner().unwrap());
    b.write_at(0, &[7u8; 512]).unwrap();
    // A was blocklisted by the break: its writes fail with ESHUTDOWN.
    let e = a.write_at(0, &[1u8; 512]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(108), "{e}");
    b.image.lock_release().unwrap();
    assert!(b.image.lock_owners().unwrap().is_empty());
    // Unblocklist A's client is not needed: it goes with `a`.
}

#[test]
fn metadata_and_xattrs_read_back() {
    let image = TestImage::new("meta", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    assert_eq!(store.image.metadata(gateway::PREFERRED_KEY).unwrap(), None);
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
            .image
            .metadata(gateway::PREFERRED_KEY)
            .unwrap()
            .as_deref(),
        Some("2")
    );
    // The header object: it goes with the image.
    let oid = format!("rbd_header.{}", store.image.id().unwrap());
    assert_eq!(store.image.xattr(&oid, "test.hb.1").unwrap(), None);
    store.image.set_xattr(&oid, "test.hb.1", b"42").unwrap();
    assert_eq!(
        store.image.xattr(&oid, "test.hb.1").unwrap().as_deref(),
        Some(&b"42"[..])
    );
    assert_eq!(store.image.xattr(&oid, "test.hb.2").unwrap(), None);
}

/// Two gateways in one group over one image: one owns it (active/optimized
/// on both), the other is standby; when the owner goes (its store
/// dropped, which lets the lock go) the other takes it.
#[test]
fn two_gateways_agree_on_one_owner_and_the_survivor_takes_over() {
    use crate::alua::AccessState::*;
    let image = TestImage::new("group", "16M");
    let open = |port| {
        let group = GatewayGroup::new(port, [1, 2]);
        RbdBackstore::open_in_group(&image.spec(), 512, Some(&group)).unwrap()
    };
    let a = open(1);
    let b = open(2);
    let (ga, gb) = (a.alua().unwrap(), b.alua().unwrap());
    let settled = |want: [crate::alua::AccessState; 2]| {
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
    assert!(a.image.is_lock_owner().unwrap());
    drop(a);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while gb.state_of(2) != ActiveOptimized {
        assert!(std::time::Instant::now() < until, "{:?}", gb.view());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(b.image.is_lock_owner().unwrap());
    b.write_at(0, &[3u8; 512]).unwrap();
}
