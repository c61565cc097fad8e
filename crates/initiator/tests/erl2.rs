//! ErrorRecoveryLevel 2 between our initiator and `iscsi target`:
//! connection recovery (RFC 7143 7.2.2). A connection of a session is cut
//! with commands in flight on it (64 KiB writes and reads in a store that
//! holds each for a while, so some are being executed, some collecting
//! data and some answered when the cut comes); the initiator logs in a
//! new connection with the same CID and moves each interrupted task there
//! with TASK REASSIGN. What must hold: every command completes, with no
//! session reinstatement, the tasks were reassigned (not sent again), and
//! what is read back is what was written. Over 4 connections the other
//! three go on meanwhile; over 1 the session has no connection for a
//! moment (session continuation).

mod common;

use std::sync::Arc;
use std::time::Duration;

use iscsi_initiator::{Error, IscsiUrl, Session, SessionConfig};
use iscsi_scsi::Backstore;
use iscsi_stores::{RamBackstore, SlowBackstore};

const TARGET: &str = "iqn.2026-11.rs.iscsi:erl2-tests";
const BLOCK: u32 = 512;
const SLOT: usize = 64 * 1024;
const SLOTS: u64 = 64;

async fn target(latency: Duration) -> (String, tokio::sync::oneshot::Sender<()>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let store: Arc<dyn Backstore> = Arc::new(SlowBackstore::new(
        Arc::new(RamBackstore::new(16 << 20, BLOCK, 1).unwrap()),
        latency,
    ));
    let (tcp, _iser, stop) = common::our_target(TARGET, vec![store], 128).await;
    (tcp, stop)
}

async fn connect(portal: &str, connections: u16) -> Arc<Session> {
    let url: IscsiUrl = format!("iscsi://{portal}/{TARGET}/0").parse().unwrap();
    let mut config = SessionConfig::default();
    config.set("ErrorRecoveryLevel", "2").unwrap();
    // Small bursts: a 64 KiB write takes several R2Ts, so a cut finds
    // writes halfway through their data.
    config.set("MaxBurstLength", "16384").unwrap();
    config.set("FirstBurstLength", "8192").unwrap();
    config
        .set("MaxConnections", &connections.to_string())
        .unwrap();
    config.connections = connections;
    let session = Session::connect(&url, config).await.expect("login");
    assert_eq!(session.parameters().unwrap().error_recovery_level, 2);
    assert_eq!(session.connection_count(), usize::from(connections));
    Arc::new(session)
}

fn pattern(slot: u64, generation: u8) -> Vec<u8> {
    (0..SLOT)
        .map(|i| (i as u8) ^ (slot as u8).wrapping_mul(13) ^ generation.wrapping_mul(101))
        .collect()
}

fn lba(slot: u64) -> u64 {
    slot * (SLOT as u64 / u64::from(BLOCK))
}

/// Waits until at least `count` commands are at the target.
async fn in_flight(session: &Session, count: usize) {
    for _ in 0..2000 {
        if session.commands_in_flight().len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the commands never got out");
}

async fn writes_survive_a_cut(connections: u16, cut: u16) {
    let (portal, _stop) = target(Duration::from_millis(40)).await;
    let session = connect(&portal, connections).await;
    let mut writes = tokio::task::JoinSet::new();
    for slot in 0..SLOTS {
        let session = Arc::clone(&session);
        writes.spawn(async move {
            let result = session.write(0, lba(slot), BLOCK, &pattern(slot, 1)).await;
            (slot, result)
        });
    }
    in_flight(&session, SLOTS as usize / 2).await;
    assert!(session.drop_connection(cut));
    while let Some(done) = writes.join_next().await {
        let (slot, result) = done.unwrap();
        result.unwrap_or_else(|e| panic!("write of slot {slot}: {e}"));
    }
    // The reads, cut again.
    let mut reads = tokio::task::JoinSet::new();
    for slot in 0..SLOTS {
        let session = Arc::clone(&session);
        reads.spawn(async move {
            let data = session.read(0, lba(slot), BLOCK, vec![0; SLOT]).await;
            (slot, data)
        });
    }
    in_flight(&session, SLOTS as usize / 2).await;
    assert!(session.drop_connection(cut));
    while let Some(done) = reads.join_next().await {
        let (slot, data) = done.unwrap();
        let data = data.unwrap_or_else(|e| panic!("read of slot {slot}: {e}"));
        assert!(data == pattern(slot, 1), "slot {slot}: wrong data");
    }
    assert_eq!(session.reinstatements(), 0, "the session was reinstated");
    assert_eq!(session.connection_recoveries(), 2);
    assert!(
        session.tasks_reassigned() > 0,
        "no task was reassigned (all sent again?)"
    );
    assert_eq!(session.connection_count(), usize::from(connections));
    assert!(session.commands_in_flight().is_empty());
    session.logout().await.expect("logout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_of_four_is_recovered_and_its_tasks_reassigned() {
    writes_survive_a_cut(4, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_connection_cut_is_recovered_by_session_continuation() {
    writes_survive_a_cut(1, 0).await;
}

/// Below ERL 2 nothing changes: a cut ends the session, which is
/// reinstated and the commands sent again (and the target, offering 2,
/// gives what the initiator asks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl_1_a_cut_still_reinstates_the_session() {
    // Each write held 250 ms: `in_flight` must see 8 of them out at once,
    // and a target on its own cores finished 5 ms ones between two polls.
    let (portal, _stop) = target(Duration::from_millis(250)).await;
    let url: IscsiUrl = format!("iscsi://{portal}/{TARGET}/0").parse().unwrap();
    let mut config = SessionConfig::default();
    config.set("ErrorRecoveryLevel", "1").unwrap();
    config.set("MaxConnections", "2").unwrap();
    config.connections = 2;
    let session = Arc::new(Session::connect(&url, config).await.expect("login"));
    assert_eq!(session.parameters().unwrap().error_recovery_level, 1);
    let mut writes = tokio::task::JoinSet::new();
    for slot in 0..16 {
        let session = Arc::clone(&session);
        writes.spawn(async move { session.write(0, lba(slot), BLOCK, &pattern(slot, 3)).await });
    }
    in_flight(&session, 8).await;
    session.drop_connection(1);
    while let Some(done) = writes.join_next().await {
        done.unwrap().expect("write");
    }
    assert_eq!(session.connection_recoveries(), 0);
    assert!(session.reinstatements() >= 1);
    let _: Result<(), Error> = session.logout().await;
}
