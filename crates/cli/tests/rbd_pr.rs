//! Persistent reservations across a gateway group (issue 36 step 4): two
//! `iscsi target` processes (config files with portal_group_tag 1 and 2)
//! export one RBD image of a running cluster (`scripts/ceph-dev start`,
//! `ISCSI_CEPH_CONF`). Initiator A registers and reserves (type 5, Write
//! Exclusive, Registrants Only) through gateway 1; initiator B, unregistered, gets
//! RESERVATION CONFLICT on a write through gateway 2; READ KEYS and READ
//! FULL STATUS read the same through both; then, with gateway 1 stopped
//! (SIGSTOP), B's PREEMPT AND ABORT through gateway 2 completes only after
//! gateway 1 is fenced, and nothing A writes through gateway 1 afterwards
//! lands in the image. Built only with the cargo feature `ceph-tests`.
#![cfg(feature = "ceph-tests")]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::ceph::{Image, conf, rbd};
use common::libiscsi;
use iscsi_initiator::{Command as ScsiCommand, IscsiUrl, Session, SessionConfig};
use iscsi_test_peers::{Peer, free_port};

const NAME: &str = "iqn.2026-11.rs.iscsi:rbd-pr";

/// One gateway: `iscsi target --config` with its own port and
/// portal_group_tag (the relative target port of its nexuses).
struct Gateway {
    peer: Peer,
    port: u16,
    file: std::path::PathBuf,
}

impl Gateway {
    fn start(image: &str, tag: u16) -> Gateway {
        let port = free_port();
        let file = std::env::temp_dir().join(format!(
            "iscsi-rs-rbd-pr-{}-{port}.toml",
            std::process::id()
        ));
        std::fs::write(
            &file,
            format!(
                "listen = [\"127.0.0.1:{port}\"]\nportal_group_tag = {tag}\n\
                 [[target]]\nname = \"{NAME}\"\nluns = [\"rbd:{image},conf={}\"]\n",
                conf()
            ),
        )
        .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
        command
            .args(["target", "--config"])
            .arg(&file)
            .env("RUST_LOG", "warn");
        Gateway {
            peer: Peer::spawn(command, port),
            port,
            file,
        }
    }

    /// SIGSTOP, returning once every thread of the gateway has stopped.
    fn stop(&self) {
        iscsi_test_peers::stop_process(self.peer.pid());
    }

    fn resume(&self) {
        iscsi_test_peers::signal_process(self.peer.pid(), "-CONT");
    }

    async fn session(&self, initiator: &str) -> Arc<Session> {
        let url: IscsiUrl = format!("iscsi://127.0.0.1:{}/{NAME}/0", self.port)
            .parse()
            .unwrap();
        let config = SessionConfig {
            initiator_name: initiator.into(),
            ..SessionConfig::default()
        };
        Arc::new(Session::connect(&url, config).await.unwrap())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.resume();
        self.peer.terminate(Duration::from_secs(15));
        let _ = std::fs::remove_file(&self.file);
    }
}

const A: &str = "iqn.2026-11.rs.iscsi:initiator-a";
const B: &str = "iqn.2026-11.rs.iscsi:initiator-b";
const GOOD: u8 = 0;
const CONFLICT: u8 = 0x18;

/// PERSISTENT RESERVE OUT: its status.
async fn prout(s: &Session, sa: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let cdb = [0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut p = Vec::new();
    p.extend_from_slice(&key.to_be_bytes());
    p.extend_from_slice(&sa_key.to_be_bytes());
    p.extend_from_slice(&[0; 8]);
    s.execute(ScsiCommand::write(0, &cdb, &p))
        .await
        .unwrap()
        .status
}

/// PERSISTENT RESERVE IN: its data.
async fn prin(s: &Session, sa: u8) -> Vec<u8> {
    let cdb = [0x5E, sa, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let r = s
        .execute(ScsiCommand::read(0, &cdb, vec![0; 0x1000]))
        .await
        .unwrap();
    assert_eq!(r.status, GOOD, "PR IN {sa}: sense {:02x?}", r.sense);
    r.data[..r.received as usize].to_vec()
}

/// WRITE(10) of one 512-byte block at `lba`: its status.
async fn write(s: &Session, lba: u32, byte: u8) -> u8 {
    let mut cdb = [0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    s.execute(ScsiCommand::write(0, &cdb, &[byte; 512]))
        .await
        .map(|r| r.status)
        .unwrap_or(0xFF)
}

/// TEST UNIT READY until GOOD: past the unit attentions a new nexus may
/// be told first.
async fn past_attentions(s: &Session) {
    for _ in 0..8 {
        let r = s.execute(ScsiCommand::new(0, &[0; 6])).await.unwrap();
        if r.status == GOOD {
            return;
        }
    }
    panic!("TEST UNIT READY never became GOOD");
}

#[test]
fn reservations_hold_across_two_gateways_and_preempt_fences_a_stopped_one() {
    let image = Image::new("pr", "16M");
    let g1 = Gateway::start(&image, 1);
    let g2 = Gateway::start(&image, 2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (preempt_took, late_writes) = runtime.block_on(async {
        let a = g1.session(A).await;
        let b = g2.session(B).await;
        past_attentions(&a).await;
        past_attentions(&b).await;
        assert_eq!(prout(&a, 0x06, 0, 0, 0xAA).await, GOOD);
        assert_eq!(prout(&a, 0x01, 5, 0xAA, 0).await, GOOD);
        assert_eq!(write(&a, 8, 0x11).await, GOOD);
        // B is not registered: its write through the other gateway conflicts.
        assert_eq!(write(&b, 9, 0x22).await, CONFLICT);
        // Every PR IN service action reads the same through both gateways.
        for sa in 0..4 {
            assert_eq!(prin(&a, sa).await, prin(&b, sa).await, "PR IN {sa}");
        }
        let full = prin(&a, 3).await;
        // READ FULL STATUS: A's registration, holder, through port 1.
        assert_eq!(&full[8..16], &0xAAu64.to_be_bytes());
        assert_eq!(full[20] & 1, 1, "R_HOLDER");
        assert_eq!(&full[26..28], &1u16.to_be_bytes());
        assert_eq!(prout(&b, 0x06, 0, 0, 0xBB).await, GOOD);

        // Gateway 1 stops: it cannot acknowledge B's preemption.
        g1.stop();
        let start = Instant::now();
        assert_eq!(prout(&b, 0x05, 5, 0xBB, 0xAA).await, GOOD);
        let took = start.elapsed();
        assert_eq!(write(&b, 10, 0x33).await, GOOD);
        g1.resume();
        // A writes through gateway 1, which still holds the old state in
        // its memory: fenced, none of it lands.
        let mut statuses = Vec::new();
        for lba in 100..104 {
            statuses.push(write(&a, lba, 0x44).await);
        }
        // Gateway 1 finds itself fenced: its cached reservations are stale
        // and it never answers from them: NOT READY, LOGICAL UNIT
        // COMMUNICATION FAILURE while it rejoins, then the state it reloaded
        // (B's key alone). The rejoin starts when the fence trips and takes
        // milliseconds, so either may come first.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let cdb = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
            let r = a
                .execute(ScsiCommand::read(0, &cdb, vec![0; 0x1000]))
                .await
                .unwrap();
            let sense = r.sense().map(|s| (s.key, s.asc, s.ascq));
            if r.status == 2 && sense == Some((2, 0x08, 0)) {
                break;
            }
            // READ KEYS: the list's length at 4..8, the keys from 8 on.
            let keys: Vec<u64> = r.data
                [8..8 + u32::from_be_bytes(r.data[4..8].try_into().unwrap()) as usize]
                .chunks(8)
                .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
                .collect();
            if r.status == GOOD && keys == [0xBB] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "gateway 1 still answers PR IN from its stale state: {} {sense:?} keys {keys:x?}",
                r.status
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (took, statuses)
    });
    assert!(
        late_writes.iter().all(|&s| s != GOOD),
        "writes through the fenced gateway succeeded: {late_writes:02x?}"
    );
    // The preemption waited for gateway 1's acknowledgement (5 s) and then
    // fenced it.
    assert!(preempt_took >= Duration::from_secs(4), "{preempt_took:?}");
    let export = std::env::temp_dir().join(format!("iscsi-rs-rbd-pr-{}.raw", std::process::id()));
    let out = rbd(&["export", &image, export.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw = std::fs::read(&export).unwrap();
    std::fs::remove_file(&export).unwrap();
    assert!(raw[8 * 512..9 * 512].iter().all(|&x| x == 0x11));
    assert!(raw[9 * 512..10 * 512].iter().all(|&x| x == 0));
    assert!(raw[10 * 512..11 * 512].iter().all(|&x| x == 0x33));
    assert!(
        raw[100 * 512..104 * 512].iter().all(|&x| x == 0),
        "a write through the fenced gateway landed"
    );
    drop((g1, g2));
    let _ = rbd(&["rm", &image]);
}

/// libiscsi's whole suite (as on one RBD LUN: [`libiscsi::run_suite`])
/// with its two URLs on two gateways, so that its second initiator (the
/// multipath, multi-initiator, reservation and reset tests) goes through
/// the other gateway: none fails, and exactly what skips on one RBD LUN
/// skips ([`libiscsi::RBD_SKIPS`], each with its reason), and ORWRITE,
/// which two gateways outside a group do not offer
/// ([`libiscsi::TWO_GATEWAYS_SKIPS`]); COMPARE AND WRITE passes, the
/// suite checking the refusal beyond Block Limits' one block.
#[test]
fn libiscsi_suite_passes_across_two_gateways() {
    iscsi_test_peers::require("iscsi-test-cu", "libiscsi-bin");
    let image = Image::new("pr-suite", "64M");
    let g1 = Gateway::start(&image, 1);
    let g2 = Gateway::start(&image, 2);
    let url = |g: &Gateway| format!("iscsi://127.0.0.1:{}/{NAME}/0", g.port);
    let run = libiscsi::run_suite(&url(&g1), &url(&g2));
    drop((g1, g2));
    let _ = rbd(&["rm", &image]);
    let skips: Vec<_> = libiscsi::RBD_SKIPS
        .iter()
        .chain(libiscsi::TWO_GATEWAYS_SKIPS)
        .copied()
        .collect();
    run.assert_passes("two gateways", &skips);
}
