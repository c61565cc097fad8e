//! QoS limits (issue 49) through our initiator: a LUN limited to 500
//! commands a second holds an initiator at QD 32 to it while another LUN
//! runs free; a reload raising the limit takes effect at once; a queue too
//! short for the initiator's depth answers TASK SET FULL, which the
//! initiator sends again, so nothing fails; the status shows it all.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::start_from_toml as start;
use iscsi_initiator::{Session, SessionConfig};
use iscsi_target::ParsedConfig;
use iscsi_target::qos::LimitKey;
use iscsi_test_peers::free_port;

const TARGET: &str = "iqn.2026-11.rs.iscsi:qos";

fn file(port: u16, limit: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nnop_in_interval_seconds = 0\n\
         [[target]]\nname = \"{TARGET}\"\nluns = [\"ram:64M\", \"ram:64M\"]\n\
         [[target.limit]]\nlun = 0\n{limit}\n"
    )
}

/// `depth` tasks reading 4 KiB from `lun` until `stop`; each completion
/// counted in `done`, any error returned.
fn load(
    session: &Arc<Session>,
    lun: u64,
    depth: u64,
    stop: &Arc<AtomicBool>,
    done: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<Result<(), iscsi_initiator::Error>>> {
    (0..depth)
        .map(|i| {
            let (session, stop, done) = (Arc::clone(session), Arc::clone(stop), Arc::clone(done));
            tokio::spawn(async move {
                let mut lba = i * 8;
                while !stop.load(Ordering::Relaxed) {
                    session.read(lun, lba % 100_000, 512, vec![0; 4096]).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                    lba += 8 * depth;
                }
                Ok(())
            })
        })
        .collect()
}

/// Completions of `done` over `window`.
async fn rate(done: &AtomicU64, window: Duration) -> (u64, Duration) {
    let before = done.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    (done.load(Ordering::Relaxed) - before, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_lun_holds_its_rate_beside_a_free_one() {
    let port = free_port();
    let (handle, _stop) = start(&file(port, "iops = 500")).await;
    let a = common::login(port, TARGET, SessionConfig::default()).await;
    let b = common::login(port, TARGET, SessionConfig::default()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (done_a, done_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = load(&a, 0, 32, &stop, &done_a);
    tasks.extend(load(&b, 1, 4, &stop, &done_b));
    // The burst (50) spent, then two seconds at the limit: the bucket lets
    // through at most 500 a second (plus its burst once, which the first
    // half second spent), and a target on a busy machine still keeps up
    // with that.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (held, took) = rate(&done_a, Duration::from_secs(2)).await;
    let free = done_b.load(Ordering::Relaxed);
    let allowed = 500.0 * took.as_secs_f64();
    assert!(
        (held as f64) <= allowed + 50.0 && (held as f64) >= allowed * 0.8,
        "LUN 0 at {held} commands in {took:?} against 500 a second"
    );
    assert!(free > 3 * 500 * 2, "LUN 1, unlimited, did {free} beside it");
    let status = handle.status();
    let limit = &status.targets[0].limits[0];
    assert_eq!(limit.applies_to, LimitKey::Lun(0));
    assert!(limit.now.waiting > 0 && limit.now.delayed > 0, "{limit:?}");
    assert!(
        (400..=600).contains(&limit.now.iops_now),
        "the status says {} IOPS now",
        limit.now.iops_now
    );

    // Raised by a reload: free, and in force at once.
    let parse = |t: &str| ParsedConfig::parse(t).expect("a valid file");
    let report = handle
        .apply(parse(&file(port, "iops = 2000")), false)
        .await
        .expect("a limit changed without force");
    assert_eq!(report.changes.len(), 1, "{report:?}");
    assert!(
        report.changes[0]
            .to_string()
            .contains("500 IOPS (burst 50), queue 256 -> 2000 IOPS")
    );
    let (raised, took) = rate(&done_a, Duration::from_secs(1)).await;
    assert!(
        raised as f64 >= 1000.0 * took.as_secs_f64(),
        "{raised} commands in {took:?} after raising the limit to 2000 a second"
    );

    // A queue of 4 for a depth of 32: TASK SET FULL, sent again by the
    // initiator; still no error.
    handle
        .apply(parse(&file(port, "iops = 500\nqueue = 4")), false)
        .await
        .expect("a queue changed without force");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let refused = handle.status().targets[0].limits[0].now.refused;
    assert!(refused > 0, "no TASK SET FULL with a queue of 4 at QD 32");

    // Removed: the LUN runs free again.
    handle
        .apply(
            parse(&file(port, "iops = 500").replace("[[target.limit]]\nlun = 0\niops = 500\n", "")),
            false,
        )
        .await
        .expect("a limit removed without force");
    assert!(handle.status().targets[0].limits.is_empty());
    let (unlimited, took) = rate(&done_a, Duration::from_secs(1)).await;
    assert!(
        unlimited as f64 > 1500.0 * took.as_secs_f64(),
        "{unlimited} in {took:?} without a limit"
    );

    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap().expect("no command failed");
    }
}

/// A command waiting its turn under a slow limit is aborted at once: an
/// ABORT TASK and a LUN reset do not wait for the limit. At 1 command a
/// second with a burst of 1, the last of four reads would start 3 s on;
/// the abort and the reset each end well before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_command_is_aborted_without_waiting_for_its_turn() {
    let port = free_port();
    let (_handle, _stop) = start(&file(port, "iops = 1\nburst_iops = 1")).await;
    let session = common::login(port, TARGET, SessionConfig::default()).await;
    let reads: Vec<_> = (0..4u64)
        .map(|i| {
            let s = Arc::clone(&session);
            tokio::spawn(async move { s.read(0, i * 8, 512, vec![0; 4096]).await })
        })
        .collect();
    // Wait until all four are at the target (the first answered).
    let mut waiting = Vec::new();
    for _ in 0..200 {
        waiting = session.commands_in_flight();
        if waiting.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waiting.len(), 3, "three reads wait their turn");
    let started = Instant::now();
    session
        .abort_task(waiting[2].itt)
        .await
        .expect("ABORT TASK");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the abort of the last waited {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    session.lun_reset(0).await.expect("LUN RESET");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the reset waited {:?}",
        started.elapsed()
    );
    let mut aborted = 0;
    for read in reads {
        if matches!(read.await.unwrap(), Err(iscsi_initiator::Error::Aborted(_))) {
            aborted += 1;
        }
    }
    assert!(aborted >= 2, "{aborted} reads ended aborted");
    // The LUN still serves (its next turn comes within a second).
    session
        .read(0, 0, 512, vec![0; 4096])
        .await
        .expect("a read after the reset");
}

/// An initiator's limit holds all its sessions together, on whatever LUN,
/// and leaves other initiators alone: two sessions of one initiator on
/// two LUNs share 400 commands a second while a third initiator runs free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_limit_holds_all_its_sessions_together() {
    let port = free_port();
    let text = format!(
        "listen = [\"127.0.0.1:{port}\"]\nnop_in_interval_seconds = 0\n\
         [[target]]\nname = \"{TARGET}\"\nluns = [\"ram:64M\", \"ram:64M\"]\n\
         [[target.limit]]\ninitiator = \"iqn.2026-11.rs.iscsi:noisy\"\niops = 400\n"
    );
    let (handle, _stop) = start(&text).await;
    let noisy_a = common::login_as(port, TARGET, "iqn.2026-11.rs.iscsi:noisy", 1).await;
    let noisy_b = common::login_as(port, TARGET, "iqn.2026-11.rs.iscsi:noisy", 2).await;
    let quiet = common::login_as(port, TARGET, "iqn.2026-11.rs.iscsi:quiet", 3).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (noisy, free) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = load(&noisy_a, 0, 16, &stop, &noisy);
    tasks.extend(load(&noisy_b, 1, 16, &stop, &noisy));
    tasks.extend(load(&quiet, 1, 4, &stop, &free));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let free_before = free.load(Ordering::Relaxed);
    let (held, took) = rate(&noisy, Duration::from_secs(2)).await;
    let free_during = free.load(Ordering::Relaxed) - free_before;
    let allowed = 400.0 * took.as_secs_f64();
    assert!(
        (held as f64) <= allowed + 40.0 && (held as f64) >= allowed * 0.8,
        "the noisy initiator's two sessions did {held} in {took:?} against 400 a second"
    );
    assert!(
        free_during > 3 * 800,
        "the quiet initiator did {free_during} beside it"
    );
    let limits = &handle.status().targets[0].limits;
    assert_eq!(
        limits[0].applies_to,
        LimitKey::Initiator("iqn.2026-11.rs.iscsi:noisy".into())
    );
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap().expect("no command failed");
    }
}
