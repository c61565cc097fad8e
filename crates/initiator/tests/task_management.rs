//! Task management that always finishes (issue: "TMF and teardown that
//! always finish"), against `iscsi target` with a LUN behind a latency (a
//! slow device), over TCP and iSER: ABORT TASK, ABORT TASK SET, LOGICAL
//! UNIT RESET and TARGET WARM RESET with 32 commands in flight end within a
//! bound (the store's latency and a margin, far below the command timeout
//! they would otherwise wait for), every command reached ends at once with
//! `Error::Aborted` or its status, commands to another LUN are untouched,
//! and the session goes on: what is read back is what the last
//! acknowledged write of each slot put there.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use iscsi_initiator::{Error, IscsiUrl, Session, SessionConfig};
use iscsi_proto::pdu::{TaskFunction, TaskResponse};
use iscsi_scsi::Backstore;
use iscsi_stores::{RamBackstore, SlowBackstore};

const TARGET: &str = "iqn.2026-11.rs.iscsi:task-management-tests";
const BLOCK: u32 = 512;
const LATENCY: Duration = Duration::from_millis(150);
/// What every function must finish within here: one store latency (a
/// command already in the store is waited for, RFC 7143 11.6.2) and a
/// generous margin for a loaded 2-core machine; the command timeout they
/// would wait for without it is 30 s.
const BOUND: Duration = Duration::from_secs(3);
const SLOT: usize = 64 * 1024;

/// LUN 0 is slow, LUN 1 is plain RAM.
async fn target() -> (String, String, tokio::sync::oneshot::Sender<()>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let slow: Arc<dyn Backstore> = Arc::new(SlowBackstore::new(
        Arc::new(RamBackstore::new(16 << 20, BLOCK, 1).unwrap()),
        LATENCY,
    ));
    let fast: Arc<dyn Backstore> = Arc::new(RamBackstore::new(16 << 20, BLOCK, 2).unwrap());
    common::our_target(TARGET, vec![slow, fast], 64).await
}

async fn connect(scheme: &str, portal: &str) -> Arc<Session> {
    let url: IscsiUrl = format!("{scheme}://{portal}/{TARGET}/0").parse().unwrap();
    Arc::new(
        Session::connect(&url, SessionConfig::default())
            .await
            .expect("login"),
    )
}

fn pattern(slot: u64, generation: u8) -> Vec<u8> {
    (0..SLOT)
        .map(|i| (i as u8) ^ (slot as u8).wrapping_mul(7) ^ generation)
        .collect()
}

/// Starts a 64 KiB write of generation `generation` to each of `slots` on
/// `lun`.
fn start_writes(
    session: &Arc<Session>,
    lun: u64,
    slots: std::ops::Range<u64>,
    generation: u8,
) -> tokio::task::JoinSet<(u64, Result<(), Error>)> {
    let mut writes = tokio::task::JoinSet::new();
    for slot in slots {
        let session = Arc::clone(session);
        writes.spawn(async move {
            let lba = slot * (SLOT as u64 / u64::from(BLOCK));
            let data = pattern(slot, generation);
            (slot, session.write(lun, lba, BLOCK, &data).await)
        });
    }
    writes
}

/// [`start_writes`], then waits until all are at the target (LUN 0 is
/// slow: they stay there for a while).
async fn writes_in_flight(
    session: &Arc<Session>,
    lun: u64,
    slots: std::ops::Range<u64>,
    generation: u8,
) -> tokio::task::JoinSet<(u64, Result<(), Error>)> {
    let count = slots.end - slots.start;
    let writes = start_writes(session, lun, slots, generation);
    // Setup, not what is measured: on a loaded machine getting them all
    // out may take longer than BOUND.
    let deadline = Instant::now() + Duration::from_secs(30);
    while (session
        .commands_in_flight()
        .iter()
        .filter(|c| c.lun == lun)
        .count() as u64)
        < count
    {
        assert!(Instant::now() < deadline, "the writes never got out");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    writes
}

/// Every write's outcome, each of which must come within `BOUND` of
/// `since`: `Ok`, or `Err(Aborted(function))`.
async fn outcomes(
    mut writes: tokio::task::JoinSet<(u64, Result<(), Error>)>,
    function: TaskFunction,
    since: Instant,
) -> Vec<(u64, bool)> {
    let mut ended = Vec::new();
    while let Some(done) = writes.join_next().await {
        let (slot, result) = done.unwrap();
        assert!(
            since.elapsed() < BOUND,
            "slot {slot} ended {:?} after {function:?}",
            since.elapsed()
        );
        match result {
            Ok(()) => ended.push((slot, false)),
            Err(Error::Aborted(f)) if f == function => ended.push((slot, true)),
            Err(other) => panic!("slot {slot}: {other} (expected aborted by {function:?})"),
        }
    }
    ended.sort();
    ended
}

/// Reads `slot` of `lun` and says which of the two generations it holds.
async fn generation_of(session: &Session, lun: u64, slot: u64, old: u8, new: u8) -> u8 {
    let lba = slot * (SLOT as u64 / u64::from(BLOCK));
    let data = session
        .read(lun, lba, BLOCK, vec![0; SLOT])
        .await
        .expect("read back");
    if data == pattern(slot, new) {
        new
    } else if data == pattern(slot, old) {
        old
    } else {
        panic!("slot {slot} holds neither generation {old} nor {new}")
    }
}

async fn a_task_set_function_ends_every_command_it_reaches(scheme: &str, function: TaskFunction) {
    let (tcp, iser, _stop) = target().await;
    let session = connect(scheme, if scheme == "iser" { &iser } else { &tcp }).await;
    // Generation 1 everywhere, acknowledged.
    let first = writes_in_flight(&session, 0, 0..32, 1).await;
    for (slot, aborted) in outcomes(first, function, Instant::now()).await {
        assert!(!aborted, "slot {slot}");
    }
    // Generation 2 on LUN 0 (slow), LUN 1 busy beside it.
    let slow = writes_in_flight(&session, 0, 0..32, 2).await;
    let fast = start_writes(&session, 1, 0..8, 2);
    let started = Instant::now();
    match function {
        TaskFunction::AbortTaskSet => session.abort_task_set(0).await,
        TaskFunction::LogicalUnitReset => session.lun_reset(0).await,
        other => session.task_management(other, 0).await,
    }
    .unwrap_or_else(|e| panic!("{function:?}: {e}"));
    let took = started.elapsed();
    assert!(took < BOUND, "{function:?} took {took:?}");
    let ended = outcomes(slow, function, started).await;
    let aborted = ended.iter().filter(|(_, a)| *a).count();
    assert!(aborted > 0, "{function:?} reached no command: {ended:?}");
    // LUN 1: a warm reset of the target reaches it; the others do not.
    let reaches_lun1 = function == TaskFunction::TargetWarmReset;
    let mut fast = fast;
    while let Some(done) = fast.join_next().await {
        let (slot, result) = done.unwrap();
        match result {
            Ok(()) => {}
            Err(Error::Aborted(f)) if reaches_lun1 && f == function => {}
            Err(other) => panic!("LUN 1 slot {slot}: {other}"),
        }
    }
    // The session goes on (a reset's UNIT ATTENTION is retried), and an
    // acknowledged write is there; an aborted one may or may not be.
    let mut reads = tokio::task::JoinSet::new();
    for (slot, was_aborted) in ended {
        let session = Arc::clone(&session);
        reads.spawn(async move {
            let found = generation_of(&session, 0, slot, 1, 2).await;
            assert!(
                was_aborted || found == 2,
                "slot {slot}: acknowledged write lost"
            );
        });
    }
    while let Some(read) = reads.join_next().await {
        read.unwrap();
    }
    assert!(session.commands_in_flight().is_empty());
    session.logout().await.expect("logout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_set_ends_its_commands_at_once_over_tcp() {
    a_task_set_function_ends_every_command_it_reaches("iscsi", TaskFunction::AbortTaskSet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_set_ends_its_commands_at_once_over_iser() {
    a_task_set_function_ends_every_command_it_reaches("iser", TaskFunction::AbortTaskSet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lun_reset_ends_its_commands_at_once() {
    a_task_set_function_ends_every_command_it_reaches("iscsi", TaskFunction::LogicalUnitReset)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_warm_reset_ends_every_command_at_once() {
    a_task_set_function_ends_every_command_it_reaches("iscsi", TaskFunction::TargetWarmReset).await;
}

/// ABORT TASK of the oldest of 16 writes: that one ends aborted (or, had
/// it finished first, "task does not exist" and its own status), the
/// others with their status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_ends_only_its_command() {
    let (tcp, _iser, _stop) = target().await;
    let session = connect("iscsi", &tcp).await;
    let writes = writes_in_flight(&session, 0, 0..16, 1).await;
    let oldest = session.commands_in_flight()[0];
    let started = Instant::now();
    let result = session.abort_task(oldest.itt).await;
    assert!(
        started.elapsed() < BOUND,
        "ABORT TASK took {:?}",
        started.elapsed()
    );
    let ended = outcomes(writes, TaskFunction::AbortTask, started).await;
    let aborted: Vec<u64> = ended.iter().filter(|(_, a)| *a).map(|(s, _)| *s).collect();
    match result {
        Ok(()) => assert_eq!(aborted.len(), 1, "{ended:?}"),
        Err(Error::TaskManagement(TaskResponse::TaskDoesNotExist)) => {
            assert!(aborted.is_empty(), "{ended:?}")
        }
        Err(other) => panic!("ABORT TASK: {other}"),
    }
    // A tag no command has: "task does not exist", nothing ended.
    assert!(matches!(
        session.abort_task(0x7fff_0000).await,
        Err(Error::TaskManagement(TaskResponse::TaskDoesNotExist))
    ));
    session.logout().await.expect("logout");
}

/// A logout while 1 MiB writes are sending their Data-Out succeeds: the
/// target reads what was still on the way after its response instead of
/// closing on unread bytes, whose TCP reset could overtake the response
/// (4 logouts in 7 failed as "connection lost" before). The writes cut
/// short end with an error, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logout_with_writes_sending_data_succeeds() {
    let (tcp, _iser, _stop) = target().await;
    for round in 0..5 {
        let session = connect("iscsi", &tcp).await;
        let mut writes = tokio::task::JoinSet::new();
        for slot in 0..16u64 {
            let session = Arc::clone(&session);
            writes.spawn(async move {
                let data = vec![slot as u8; 1 << 20];
                session.write(1, slot * 2048, BLOCK, &data).await
            });
        }
        while session.commands_in_flight().len() < 8 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let started = Instant::now();
        session
            .logout()
            .await
            .unwrap_or_else(|e| panic!("round {round}: logout: {e}"));
        assert!(
            started.elapsed() < BOUND,
            "logout took {:?}",
            started.elapsed()
        );
        while let Some(done) = writes.join_next().await {
            if let Err(error) = done.unwrap() {
                assert!(
                    matches!(error, Error::SessionClosed | Error::ConnectionLost),
                    "round {round}: {error}"
                );
            }
        }
    }
}
