//! A LUN resized while an initiator writes to it (issue 49): grown by a
//! reload and by the control socket's `resize`, with a verified write/read
//! loop that must see no error; a shrink refused without force, and over
//! data without discard, changing nothing.

mod common;

use std::sync::Arc;

use common::pattern;
use common::start_from_toml as start;
use iscsi_initiator::{Session, SessionConfig};
use iscsi_target::ParsedConfig;
use iscsi_target::reload::ReloadError;
use iscsi_target::reload::plan::Effect;
use iscsi_test_peers::free_port;

const TARGET: &str = "iqn.2026-11.rs.iscsi:resize";
const BLOCK: u32 = 512;
const MIB: u64 = 1 << 20;

fn file(port: u16, lun0: &str) -> String {
    common::one_target(port, TARGET, &format!("0 = \"{lun0}\"\n"))
}

async fn capacity(session: &Session) -> u64 {
    let c = session.read_capacity(0).await.expect("READ CAPACITY");
    c.blocks * u64::from(c.block_size)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_grows_under_io_and_shrinks_only_when_told() {
    let port = free_port();
    let (handle, _stop) = start(&file(port, "ram:8M")).await;
    let session = common::login(port, TARGET, SessionConfig::default()).await;
    assert_eq!(capacity(&session).await, 8 * MIB);
    let io = common::VerifiedIo::start(Arc::clone(&session), 0, 0);

    // Grown by a reload: free, the session stays, the new end is usable.
    let parse = |t: &str| ParsedConfig::parse(t).expect("a valid file");
    let report = handle
        .apply(parse(&file(port, "ram:16M")), false)
        .await
        .expect("a growth needs no force");
    assert_eq!(report.changes.len(), 1, "{report:?}");
    let change = &report.changes[0];
    assert_eq!(change.effect, Effect::Free, "{change}");
    assert!(
        change.detail.contains("grows from 8388608 to 16777216"),
        "{change}"
    );
    assert_eq!(capacity(&session).await, 16 * MIB);
    let end = 16 * MIB / u64::from(BLOCK) - 128;
    session.write(0, end, BLOCK, &pattern(0xE0)).await.unwrap();

    // Grown by the control socket.
    let report = handle
        .resize(TARGET, 0, Some(32 * MIB), false, false)
        .await
        .expect("resize");
    assert_eq!((report.old, report.new), (16 * MIB, 32 * MIB));
    assert!(
        report
            .note
            .as_deref()
            .is_some_and(|n| n.contains("ram:16M")),
        "{report:?}"
    );
    assert_eq!(capacity(&session).await, 32 * MIB);

    // The file still says 16M: reloading it is a shrink, refused without
    // force, naming the session.
    match handle.apply(parse(&file(port, "ram:16M")), false).await {
        Err(ReloadError::Refused(plan)) => {
            let change = plan.disruptive().next().expect("the shrink");
            assert_eq!(change.effect, Effect::Shrinks);
            assert_eq!(change.sessions.len(), 1, "{change}");
        }
        other => panic!("not refused: {other:?}"),
    }
    // The block written near 16M lies beyond 8M: a shrink to 8M, forced,
    // is refused over it and changes nothing, by reload and by resize.
    match handle.apply(parse(&file(port, "ram:8M")), true).await {
        Err(ReloadError::Apply { error, .. }) => {
            assert!(error.contains("beyond the new end"), "{error}")
        }
        other => panic!("shrunk over data: {other:?}"),
    }
    assert_eq!(capacity(&session).await, 32 * MIB);
    let refused = handle.resize(TARGET, 0, Some(8 * MIB), false, false).await;
    assert!(refused.unwrap_err().contains("--force"));
    let refused = handle.resize(TARGET, 0, Some(8 * MIB), true, false).await;
    assert!(refused.unwrap_err().contains("beyond the new end"));
    assert_eq!(capacity(&session).await, 32 * MIB);
    // Forced to 16M, beyond which nothing was written: done, and the
    // block near the end kept.
    handle
        .apply(parse(&file(port, "ram:16M")), true)
        .await
        .expect("a forced shrink over nothing");
    assert_eq!(capacity(&session).await, 16 * MIB);
    assert_eq!(
        session.read(0, end, BLOCK, vec![0; 65536]).await.unwrap(),
        pattern(0xE0)
    );

    let (result, verified) = io.stop().await;
    result.expect("no I/O error through the resizes");
    assert!(verified > 0);
    assert!(
        handle
            .resize("iqn.none", 0, None, false, false)
            .await
            .is_err()
    );
    assert!(handle.resize(TARGET, 9, None, false, false).await.is_err());
    session.logout().await.expect("logout");
}
