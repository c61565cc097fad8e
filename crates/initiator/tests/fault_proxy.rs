//! Our initiator and our target with the fault proxy between them: each
//! fault a network makes (a flipped bit that only a digest sees, a cut
//! connection, a cut in the middle of a PDU, a stalled link) at a chosen
//! PDU, and the data checked afterwards. At ErrorRecoveryLevel 0 the
//! answer to each is the same (RFC 7143 section 7.1.4.1): the connection
//! is dropped, the session reinstated, and the commands that never
//! completed are sent again; nothing acknowledged may be lost and no read
//! may return wrong data.

mod common;

use std::sync::Arc;
use std::time::Duration;

use iscsi_fault::{Direction, Fault, FaultProxy};
use iscsi_initiator::{Session, SessionConfig};
use iscsi_scsi::Backstore;
use iscsi_stores::RamBackstore;

const TARGET: &str = "iqn.2026-11.rs.iscsi:fault-proxy-tests";
const BLOCK: u32 = 512;
const LUN_BYTES: usize = 16 << 20;
/// Each I/O: 256 KiB, several Data-In / Data-Out PDUs and R2Ts each.
const IO: usize = 256 << 10;

/// The bytes of `round` at slot `slot`: different for every write.
fn pattern(round: u64, slot: usize) -> Vec<u8> {
    let seed = round.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ slot as u64;
    (0..IO)
        .map(|i| (seed.rotate_left((i % 61) as u32) as u8) ^ (i as u8))
        .collect()
}

/// Starts our target and a proxy in front of it with `faults`; returns the
/// session (through the proxy) and the proxy.
async fn through_proxy(
    faults: &[&str],
    digests: bool,
    erl: u8,
) -> (Arc<Session>, FaultProxy, tokio::sync::oneshot::Sender<()>) {
    let lun: Arc<dyn Backstore> = Arc::new(RamBackstore::new(LUN_BYTES as u64, BLOCK, 3).unwrap());
    let (tcp, _iser, stop) = common::our_target(TARGET, vec![lun], 64).await;
    let faults: Vec<Fault> = faults.iter().map(|f| f.parse().unwrap()).collect();
    let proxy = FaultProxy::start("127.0.0.1:0", tcp.as_str(), faults, None).unwrap();
    let mut config = SessionConfig::default();
    if digests {
        config.set("HeaderDigest", "CRC32C").unwrap();
        config.set("DataDigest", "CRC32C").unwrap();
    }
    config.set("ErrorRecoveryLevel", &erl.to_string()).unwrap();
    // Small bursts: many R2Ts and Data PDUs per command to aim at.
    config.set("MaxBurstLength", "65536").unwrap();
    config.set("FirstBurstLength", "16384").unwrap();
    config.set("MaxRecvDataSegmentLength", "32768").unwrap();
    let url = format!("iscsi://{}/{TARGET}/0", proxy.local_addr())
        .parse()
        .unwrap();
    let session = Session::connect(&url, config).await.unwrap();
    (Arc::new(session), proxy, stop)
}

/// Writes every slot of the LUN, then reads them all back and rewrites
/// half of them, 8 commands at a time, and checks every read against the
/// last acknowledged write of its slot.
async fn write_read_verify(session: &Arc<Session>) {
    let slots = LUN_BYTES / IO;
    let mut round = 1u64;
    let mut tasks: tokio::task::JoinSet<Result<(), iscsi_initiator::Error>> =
        tokio::task::JoinSet::new();
    for slot in 0..slots {
        let session = session.clone();
        tasks.spawn(async move {
            let lba = (slot * IO / BLOCK as usize) as u64;
            session.write(0, lba, BLOCK, &pattern(1, slot)).await
        });
        if tasks.len() == 8 {
            tasks.join_next().await.unwrap().unwrap().expect("write");
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().expect("write");
    }
    round += 1;
    let mut tasks = tokio::task::JoinSet::new();
    for slot in 0..slots {
        let session = session.clone();
        tasks.spawn(async move {
            let lba = (slot * IO / BLOCK as usize) as u64;
            let data = session
                .read(0, lba, BLOCK, vec![0; IO])
                .await
                .expect("read");
            assert!(data == pattern(1, slot), "slot {slot} read back wrong");
            if slot % 2 == 0 {
                session
                    .write(0, lba, BLOCK, &pattern(round, slot))
                    .await
                    .expect("rewrite");
            }
        });
        if tasks.len() == 8 {
            tasks.join_next().await.unwrap().unwrap();
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    for slot in 0..slots {
        let lba = (slot * IO / BLOCK as usize) as u64;
        let data = session
            .read(0, lba, BLOCK, vec![0; IO])
            .await
            .expect("read");
        let want = if slot % 2 == 0 {
            pattern(round, slot)
        } else {
            pattern(1, slot)
        };
        assert!(data == want, "slot {slot} lost its last acknowledged write");
    }
}

/// Runs the workload through `fault` and checks that it fired once, cost
/// the session exactly `reinstatements` reinstatements and lost nothing.
async fn recovers(fault: &str, digests: bool, reinstatements: u64) -> Vec<iscsi_fault::FaultEvent> {
    recovers_at(0, fault, digests, reinstatements).await
}

/// [`recovers`] at ErrorRecoveryLevel `erl`.
async fn recovers_at(
    erl: u8,
    fault: &str,
    digests: bool,
    reinstatements: u64,
) -> Vec<iscsi_fault::FaultEvent> {
    let (session, proxy, _stop) = through_proxy(&[fault], digests, erl).await;
    write_read_verify(&session).await;
    assert_eq!(proxy.fired(), [1], "{fault} did not fire once");
    assert_eq!(
        session.reinstatements(),
        reinstatements,
        "{fault}: reinstatements"
    );
    session.logout().await.unwrap();
    proxy.events()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transparent_proxy_changes_nothing() {
    let (session, proxy, _stop) = through_proxy(&[], true, 0).await;
    write_read_verify(&session).await;
    assert_eq!(session.reinstatements(), 0);
    assert_eq!(proxy.connections(), 1);
    session.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_data_in_is_caught_by_its_digest() {
    let events = recovers("corrupt-data@data-in#5", true, 1).await;
    let fault = events.iter().find(|e| e.fault.is_some()).unwrap();
    assert_eq!(fault.direction, Some(Direction::ToInitiator));
    assert!(
        fault.pdu.as_deref().unwrap().starts_with("data-in"),
        "{fault}"
    );
    assert!(fault.what.starts_with("flipped data byte"), "{fault}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_data_out_is_caught_by_its_digest() {
    recovers("corrupt-data@data-out#7", true, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_command_header_is_caught_by_its_digest() {
    recovers("corrupt-header@scsi-command#12", true, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_r2t_header_is_caught_by_its_digest() {
    recovers("corrupt-header@r2t#9", true, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_before_a_response_is_recovered() {
    recovers("cut@scsi-response#20", false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_inside_a_data_out_is_recovered() {
    // 3 MiB into the stream: inside some Data-Out's data segment.
    let events = recovers("cut-after=3000001@to-target", false, 1).await;
    assert!(
        events
            .iter()
            .any(|e| e.what.contains("then cut the connection")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_the_timeouts_is_only_a_pause() {
    let started = std::time::Instant::now();
    recovers("stall=300ms@data-in#40", true, 0).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_immediate_data_is_caught_by_its_digest() {
    recovers("corrupt-data@scsi-command#6", true, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl_1_a_corrupted_data_in_is_asked_for_again() {
    let (session, proxy, _stop) = through_proxy(
        &["corrupt-data@data-in#5", "corrupt-data@data-in%97"],
        true,
        1,
    )
    .await;
    assert_eq!(session.parameters().unwrap().error_recovery_level, 1);
    write_read_verify(&session).await;
    let fired: u64 = proxy.fired().iter().sum();
    assert!(fired >= 2, "{fired}");
    assert_eq!(
        session.reinstatements(),
        0,
        "recovered within the connection"
    );
    // One Data SNACK per corrupted Data-In the read was waiting for (a
    // corrupted copy of one it already had costs none).
    let snacks = session.snacks_sent();
    assert!(
        (1..=fired).contains(&snacks),
        "{snacks} SNACKs for {fired} corruptions"
    );
    session.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_data_in_is_asked_for_at_erl_1_and_retried_at_erl_0() {
    // Not the last of its command: that one carries the status at ERL 0.
    let fault = "drop@data-in#41";
    recovers_at(1, fault, false, 0).await;
    recovers_at(0, fault, false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_status_is_asked_for_at_erl_1_and_retried_at_erl_0() {
    let fault = "drop@scsi-response#30";
    recovers_at(1, fault, false, 0).await;
    recovers_at(0, fault, false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl_1_a_corrupted_data_out_is_asked_for_again_with_a_recovery_r2t() {
    let (session, proxy, _stop) = through_proxy(
        &["corrupt-data@data-out#5", "corrupt-data@data-out%89"],
        true,
        1,
    )
    .await;
    write_read_verify(&session).await;
    let fired: u64 = proxy.fired().iter().sum();
    assert!(fired >= 2, "{fired}");
    assert_eq!(session.reinstatements(), 0, "recovered in the connection");
    // Every corrupted Data-Out was data the target needed: each one is
    // asked for again once, not the whole command retried.
    assert_eq!(session.recovery_r2ts_answered(), fired);
    session.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl_1_corrupted_immediate_data_is_asked_for_again_with_a_recovery_r2t() {
    let (session, proxy, _stop) = through_proxy(&["corrupt-data@scsi-command#6"], true, 1).await;
    write_read_verify(&session).await;
    assert_eq!(proxy.fired(), [1]);
    assert_eq!(session.reinstatements(), 0);
    assert_eq!(session.recovery_r2ts_answered(), 1);
    session.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl_1_a_lost_r2t_is_asked_for_again_with_an_r2t_snack() {
    // The R2T is simply not delivered: at ERL 1 the write asks for it
    // after a second without one (RFC 7143 11.16), not after the command
    // timeout with a reinstatement.
    let (session, proxy, _stop) = through_proxy(&["drop@r2t#20"], false, 1).await;
    let started = std::time::Instant::now();
    write_read_verify(&session).await;
    assert_eq!(proxy.fired(), [1]);
    assert_eq!(session.reinstatements(), 0, "recovered in the connection");
    assert_eq!(session.snacks_sent(), 1, "one R2T SNACK");
    assert!(started.elapsed() < Duration::from_secs(20));
    session.logout().await.unwrap();
}
