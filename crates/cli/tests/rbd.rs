//! `iscsi target --lun rbd:POOL/IMAGE` against a real one-node Ceph cluster
//! (`scripts/ceph-dev start`; its conf at /run/iscsi-rs-ceph/ceph.conf, or
//! `ISCSI_CEPH_CONF`): data written through our initiator lands in the
//! image (read back by `rbd export`), UNMAP reads zeros, and a missing image
//! or an unreachable cluster stops the target with a message naming what
//! failed; QEMU's driver writes across the gateway's fence and rejoin
//! without an error. Built only with the cargo feature `ceph-tests`.
#![cfg(feature = "ceph-tests")]

mod common;

use std::process::Command;
use std::sync::Arc;

use common::ceph::{Image, conf, rbd};
use common::{iscsi, libiscsi};
use iscsi_initiator::{Disk, IscsiUrl, Session, SessionConfig};
use iscsi_test_peers::{Peer, free_port};

const NAME: &str = "iqn.2026-11.rs.iscsi:rbd-test";

/// `iscsi target` exporting `image` as LUN 0 on a free port, and its URL.
fn gateway(image: &Image) -> (Peer, IscsiUrl) {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["target", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--name", NAME, "--lun"])
        .arg(format!("rbd:{},conf={}", &**image, conf()))
        .env("RUST_LOG", "warn");
    let target = Peer::spawn(command, port);
    let url = format!("iscsi://127.0.0.1:{port}/{NAME}/0")
        .parse()
        .unwrap();
    (target, url)
}

#[test]
fn reads_writes_and_unmaps_an_rbd_image() {
    let image = Image::new("rw", "64M");
    let (mut target, url) = gateway(&image);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let data: Vec<u8> = (0..(3u32 << 20) + 123)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    runtime.block_on(async {
        let session = Arc::new(
            Session::connect(&url, SessionConfig::default())
                .await
                .unwrap(),
        );
        let disk = Disk::open(session, 0).await.unwrap();
        let limits = disk.limits();
        assert_eq!(limits.bytes(), 64 << 20);
        assert!(limits.discard.is_some() && limits.unmapped_read_zeros);
        // Unaligned, across the 4 MiB object boundary at 4 MiB.
        disk.write(4 << 20 | 1000, &data, false).await.unwrap();
        disk.write(0, &data[..8192], true).await.unwrap();
        disk.flush().await.unwrap();
        assert!(disk.read(4 << 20 | 1000, data.len()).await.unwrap() == data);
        // UNMAP of 1 MiB inside the written range reads zeros, the rest stays.
        disk.discard(5 << 20, 1 << 20).await.unwrap();
        let back = disk.read(4 << 20, 4 << 20).await.unwrap();
        let at = |offset: usize| offset - (4 << 20);
        assert!(back[at(5 << 20)..at(6 << 20)].iter().all(|&b| b == 0));
        assert!(back[at(4 << 20 | 1000)..at(5 << 20)] == data[..(1 << 20) - 1000]);
        let end = (4 << 20 | 1000) + data.len();
        assert!(back[at(6 << 20)..at(end)] == data[(2 << 20) - 1000..]);
    });

    // What the image holds, read by librbd's own CLI.
    let export = std::env::temp_dir().join(format!("iscsi-rs-rbd-{}.raw", std::process::id()));
    let out = rbd(&["export", &image, export.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw = std::fs::read(&export).unwrap();
    std::fs::remove_file(&export).unwrap();
    assert!(raw[..8192] == data[..8192]);
    assert!(raw[4 << 20 | 1000..5 << 20] == data[..(1 << 20) - 1000]);
    assert!(raw[5 << 20..6 << 20].iter().all(|&b| b == 0));

    // The CLI's own read agrees.
    let out = iscsi(&[
        "read",
        &url.to_string(),
        "--offset",
        "0",
        "--length",
        "8192",
    ]);
    assert!(out.status.success() && out.stdout == data[..8192]);
    // Stopped the way a service manager stops it, so that it closes the
    // image: a killed client's watch holds `rbd rm` for 30 s.
    assert!(
        target
            .terminate(std::time::Duration::from_secs(10))
            .is_some_and(|status| status.success())
    );
}

/// `iscsi target` with `lun`, expected to exit with an error: its stderr.
fn refused(lun: &str) -> String {
    let port = free_port().to_string();
    let out = iscsi(&[
        "target",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--name",
        NAME,
        "--lun",
        lun,
    ]);
    assert!(!out.status.success(), "the target started with {lun}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_image_is_refused_by_name() {
    let said = refused(&format!("rbd:rbd/no-such-image,conf={}", conf()));
    assert!(
        said.contains("opening image \"no-such-image\" in pool \"rbd\""),
        "{said}"
    );
}

#[test]
fn an_unreachable_cluster_is_refused_naming_the_monitors() {
    let path = std::env::temp_dir().join(format!("iscsi-rs-rbd-{}.conf", std::process::id()));
    let keyring = std::path::Path::new(&conf()).with_file_name("keyring");
    std::fs::write(
        &path,
        format!(
            "[global]\nmon host = v2:127.0.0.1:1\nkeyring = {}\n",
            keyring.display()
        ),
    )
    .unwrap();
    let said = refused(&format!("rbd:rbd/img,conf={}", path.display()));
    std::fs::remove_file(&path).unwrap();
    assert!(
        said.contains("connecting as client.admin to the monitors") && said.contains("127.0.0.1:1"),
        "{said}"
    );
}

/// libiscsi's suite (`iscsi-test-cu -S -d`, every family but
/// Sanitize.Reset, which needs a slow LUN: conformance.rs) on an RBD LUN,
/// with a second URL for the multipath tests: none fails, and exactly the
/// tests of [`RBD_SKIPS`] skip.
#[test]
fn libiscsi_suite_passes_on_an_rbd_lun() {
    iscsi_test_peers::require("iscsi-test-cu", "libiscsi-bin");
    let image = Image::new("suite", "64M");
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["target", "--control", "none"])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--name", NAME])
        .arg("--lun")
        .arg(format!("rbd:{},conf={}", &*image, conf()))
        .args(["--lun", "ram:64M"])
        .env("RUST_LOG", "warn");
    let mut target = Peer::spawn(command, port);
    let url = format!("iscsi://127.0.0.1:{port}/{NAME}/0");
    let run = libiscsi::run_suite(&url, &url);
    target.terminate(std::time::Duration::from_secs(10));
    run.assert_passes("RBD LUN", libiscsi::RBD_SKIPS);
}

/// `rbd resize` under a running gateway: a session logged in before sees
/// CAPACITY DATA HAS CHANGED (2Ah/09h) on its next command, then READ
/// CAPACITY gives the new size; a shrink is seen the same way.
#[test]
fn a_resized_image_raises_capacity_data_has_changed() {
    let image = Image::new("resize", "64M");
    let (mut target, url) = gateway(&image);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let session = Session::connect(&url, SessionConfig::default())
            .await
            .unwrap();
        assert_eq!(session.read_capacity(0).await.unwrap().blocks, 64 << 11);
        for (size, blocks) in [("128M", 128u64 << 11), ("32M", 32 << 11)] {
            let out = rbd(&["resize", &image, "--size", size, "--allow-shrink"]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            // The gateway reads the size once a second.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let sense = loop {
                let cdb = [0u8; 6];
                let r = session
                    .execute(iscsi_initiator::Command::new(0, &cdb))
                    .await
                    .unwrap();
                if let Some(sense) = r.sense() {
                    break sense;
                }
                assert!(std::time::Instant::now() < deadline, "no unit attention");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            };
            assert_eq!((sense.key, sense.asc, sense.ascq), (0x06, 0x2A, 0x09));
            assert_eq!(session.read_capacity(0).await.unwrap().blocks, blocks);
        }
    });
    assert!(
        target
            .terminate(std::time::Duration::from_secs(10))
            .is_some_and(|status| status.success())
    );
}

/// A fence nobody sees, as QEMU sees it (issue 48 item 1): qemu-io (QEMU's
/// own iSCSI driver, over libiscsi) writes 200 MiB in 64 KiB writes
/// through a gateway whose RADOS client is blocklisted by hand part way
/// (`ceph osd blocklist add`, the image header's watcher). The gateway
/// rejoins with a new client; commands that met the fence end in BUSY once
/// it has, which QEMU sends again (it gives up after five tries within
/// about 2.7 s, where NOT READY fails at once). Every write must succeed
/// and read back, and the gateway must have been fenced and rejoined.
#[test]
fn a_fence_is_no_error_to_qemu() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;

    let image = Image::new("fence-qemu", "256M");
    let (mut target, url) = gateway(&image);
    let url = url.to_string();
    // Two halves with a pause between: the blocklist lands during the
    // first or the pause, so the second meets the fence (or the rejoin).
    let write = |from: u32, to: u32| -> String {
        (from..to)
            .map(|i| format!("write -P 0xab {} 64k\n", u64::from(i) * 65536))
            .collect()
    };
    let script = format!("{}sleep 2000\n{}", write(0, 1600), write(1600, 3200));
    let mut qemu = Command::new("qemu-io")
        .args(["-f", "raw", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-io runs (qemu-utils + qemu-block-extra: scripts/test installs them)");
    // From a thread of its own: qemu-io reads its commands as it runs
    // them and writes a line for each, which is read below meanwhile.
    let mut stdin = qemu.stdin.take().unwrap();
    let feeding = std::thread::spawn(move || stdin.write_all(script.as_bytes()));
    // Its writes under way, the gateway's client goes.
    let mut lines = BufReader::new(qemu.stdout.take().unwrap()).lines();
    let mut wrote = 0;
    for line in lines.by_ref() {
        if line.unwrap().contains("wrote 65536") {
            wrote += 1;
            if wrote == 100 {
                break;
            }
        }
    }
    assert_eq!(wrote, 100, "qemu-io did not write");
    blocklist_watchers(&image);
    for line in lines {
        if line.unwrap().contains("wrote 65536") {
            wrote += 1;
        }
    }
    feeding.join().unwrap().unwrap();
    let mut errors = String::new();
    std::io::Read::read_to_string(&mut qemu.stderr.take().unwrap(), &mut errors).unwrap();
    assert!(qemu.wait().unwrap().success(), "{errors}");
    assert_eq!(wrote, 3200, "qemu-io: {errors}");
    let retries = errors.matches("BUSY").count();
    assert!(
        errors
            .lines()
            .all(|l| l.contains("BUSY") || l.trim().is_empty()),
        "qemu-io: {errors}"
    );
    let back = Command::new("qemu-io")
        .args(["-f", "raw", &url, "-c", "read -P 0xab 0 200M"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&back.stdout);
    assert!(
        back.status.success()
            && said.contains("read 209715200/209715200")
            && !said.contains("fail"),
        "{said}{}",
        String::from_utf8_lossy(&back.stderr)
    );
    let log = target.log_so_far();
    assert!(log.contains("was blocklisted"), "{log}");
    assert!(log.contains("serving again"), "{log}");
    eprintln!("qemu-io across the fence: {retries} BUSY answers sent again, none failed");
    assert!(
        target
            .terminate(std::time::Duration::from_secs(10))
            .is_some_and(|status| status.success())
    );
}

/// Blocklists every RADOS client watching `image`'s header (`rbd status`
/// names them), as another gateway or an operator fencing this one would
/// (`ceph osd blocklist add`).
fn blocklist_watchers(image: &Image) {
    let status = rbd(&["status", image]);
    let watchers: Vec<String> = String::from_utf8_lossy(&status.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("watcher=").map(str::to_owned))
        .collect();
    assert!(!watchers.is_empty(), "no watcher of {}", &**image);
    for watcher in &watchers {
        let out = Command::new("ceph")
            .args(["-c", &conf(), "osd", "blocklist", "add", watcher])
            .output()
            .expect("the ceph CLI runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A bounded rejoin (issue 48 item 2): a WRITE whose Data-Out has not
/// come holds nothing of the LU, since a write takes the LU's write
/// access only once all its data is in (`PlannedIo`, `ScsiTarget::execute`),
/// so a rejoin never waits for an initiator. What a rejoin waits for is
/// the store writes in flight, each bounded by the RADOS op timeout
/// (`timeout=`, 30 s by default) and failed at once by the blocklist.
///
/// A proxy holds the first Data-Out of session A's 1 MiB write for
/// [`HELD`]; meanwhile the gateway is blocklisted and session B writes
/// through the fence. B's write must complete (after BUSY, retried)
/// before A's data has even arrived: were the rejoin waiting for A, B
/// would complete only after it. A's write then completes too, checked
/// against the state the rejoin brought, and both read back.
#[test]
fn a_write_waiting_for_its_data_does_not_hold_a_rejoin() {
    // Twice the fence's own grace (`REJOIN_GRACE`, 10 s): a rejoin that
    // took longer than that would fail B's write with NOT READY anyway.
    const HELD: std::time::Duration = std::time::Duration::from_secs(20);
    let image = Image::new("fence-data-out", "64M");
    let (mut target, url) = gateway(&image);
    let fault: iscsi_fault::Fault = format!("delay={}s@data-out#1", HELD.as_secs())
        .parse()
        .unwrap();
    let proxy =
        iscsi_fault::FaultProxy::start("127.0.0.1:0", url.portal(), vec![fault], None).unwrap();
    let proxied: IscsiUrl = format!("iscsi://{}/{NAME}/0", proxy.local_addr())
        .parse()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let a_data = vec![0xa5u8; 1 << 20];
    let b_data = vec![0x5bu8; 1 << 20];
    runtime.block_on(async {
        let open = |url: IscsiUrl| async move {
            let mut config = SessionConfig::default();
            // A's write waits HELD for its data.
            config.timeouts.command = 3 * HELD;
            let session = Session::connect(&url, config).await.unwrap();
            Disk::open(Arc::new(session), 0).await.unwrap()
        };
        let a = Arc::new(open(proxied).await);
        let b = open(url.clone()).await;
        let writing = {
            let (a, data) = (Arc::clone(&a), a_data.clone());
            tokio::spawn(async move {
                let result = a.write(0, &data, false).await;
                (result, std::time::Instant::now())
            })
        };
        // A's write is in: its first Data-Out is held.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while proxy.fired() != [1] {
            assert!(std::time::Instant::now() < deadline, "A sent no Data-Out");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let fenced_at = std::time::Instant::now();
        blocklist_watchers(&image);
        b.write(8 << 20, &b_data, false).await.unwrap();
        let b_done = std::time::Instant::now();
        eprintln!(
            "through the fence while A's data was held: B's write took {:?}",
            b_done - fenced_at
        );
        let (a_result, a_done) = writing.await.unwrap();
        a_result.unwrap();
        assert!(b_done < a_done, "B's write waited for A's data");
        assert!(b.read(0, 1 << 20).await.unwrap() == a_data);
        assert!(b.read(8 << 20, 1 << 20).await.unwrap() == b_data);
    });
    let log = target.log_so_far();
    assert!(log.contains("was blocklisted"), "{log}");
    assert!(log.contains("serving again"), "{log}");
    drop(proxy);
    assert!(
        target
            .terminate(std::time::Duration::from_secs(10))
            .is_some_and(|status| status.success())
    );
}
