//! Snapshots of a LUN taken while an initiator writes to it (issue 49):
//! taken over the control socket's handle, served read-only and cloned
//! writable by a reload that names them (`snapshot:0/NAME`,
//! `clone:0/NAME`), listed in the status, deleted only when no LUN serves
//! them; bad requests refused, changing nothing.

mod common;

use std::sync::Arc;

use common::pattern;
use common::start_from_toml as start;
use iscsi_initiator::{Error, Session, SessionConfig};
use iscsi_target::ParsedConfig;
use iscsi_target::reload::plan::Effect;
use iscsi_test_peers::free_port;

const TARGET: &str = "iqn.2026-11.rs.iscsi:snapshot";
const BLOCK: u32 = 512;

fn file(port: u16, more: &str) -> String {
    common::one_target(port, TARGET, &format!("0 = \"ram:8M\"\n{more}"))
}

/// A read, past the unit attentions a reload raises (REPORTED LUNS DATA
/// HAS CHANGED) on the first command of a LUN.
async fn read(session: &Session, lun: u64, lba: u64) -> Result<Vec<u8>, Error> {
    for _ in 0..3 {
        match session.read(lun, lba, BLOCK, vec![0; 65536]).await {
            Err(Error::Status {
                status: 0x02,
                sense: Some(sense),
            }) if sense.key == 0x06 => continue,
            other => return other,
        }
    }
    session.read(lun, lba, BLOCK, vec![0; 65536]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_taken_under_io_served_cloned_and_deleted() {
    let port = free_port();
    let (handle, _stop) = start(&file(port, "")).await;
    let session = common::login(port, TARGET, SessionConfig::default()).await;
    session.write(0, 0, BLOCK, &pattern(1)).await.unwrap();

    // Writes go on, verified, while the snapshot is taken.
    let io = common::VerifiedIo::start(Arc::clone(&session), 0, 1024);
    while io.verified() < 20 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let taken = handle.snapshot(TARGET, 0, "first").await.expect("taken");
    assert_eq!(taken.size_bytes, 8 << 20);
    session.write(0, 0, BLOCK, &pattern(2)).await.unwrap();

    // Bad requests: refused in words, nothing changed.
    let exists = handle.snapshot(TARGET, 0, "first").await.unwrap_err();
    assert!(exists.contains("exists already"), "{exists}");
    let bad = handle.snapshot(TARGET, 0, "../x").await.unwrap_err();
    assert!(bad.contains("snapshot name"), "{bad}");
    let no_lun = handle.snapshot(TARGET, 7, "x").await.unwrap_err();
    assert!(no_lun.contains("no LUN 7"), "{no_lun}");
    let no_target = handle.snapshot("iqn.none", 0, "x").await.unwrap_err();
    assert!(no_target.contains("no target"), "{no_target}");
    assert_eq!(handle.snapshots(TARGET, 0).await.unwrap().len(), 1);

    // Served read-only and cloned by a reload: free, the session stays.
    let parse = |t: &str| ParsedConfig::parse(t).expect("a valid file");
    let with = file(port, "1 = \"snapshot:0/first\"\n2 = \"clone:0/first\"\n");
    let report = handle.apply(parse(&with), false).await.expect("applied");
    assert_eq!(report.changes.len(), 2, "{report:?}");
    assert!(
        report.changes.iter().all(|c| c.effect == Effect::Free),
        "{report:?}"
    );
    assert_eq!(read(&session, 1, 0).await.unwrap(), pattern(1), "as taken");
    assert_eq!(read(&session, 0, 0).await.unwrap(), pattern(2), "moved on");
    match session.write(1, 0, BLOCK, &pattern(3)).await {
        Err(Error::Status {
            status: 0x02,
            sense: Some(sense),
        }) => assert_eq!(sense.key, 0x07, "DATA PROTECT"),
        other => panic!("a snapshot took a write: {other:?}"),
    }
    assert_eq!(read(&session, 2, 0).await.unwrap(), pattern(1));
    session.write(2, 0, BLOCK, &pattern(4)).await.unwrap();
    assert_eq!(read(&session, 2, 0).await.unwrap(), pattern(4));
    assert_eq!(read(&session, 1, 0).await.unwrap(), pattern(1));

    // Listed, with the LUN that serves it, in the status too.
    let list = handle.snapshots(TARGET, 0).await.unwrap();
    assert_eq!(list[0].served_as, [1]);
    let status = handle.status();
    let lun0 = &status.targets[0].luns[0];
    assert_eq!(lun0.snapshots.len(), 1);
    // LUNs 1 and 2 share what it holds: deleting it would free nothing.
    assert_eq!(lun0.snapshots[0].held_bytes, Some(0));

    // Deleting: refused while LUN 1 serves it; once the file no longer
    // names it, done, and the clone keeps its data.
    let served = handle
        .delete_snapshot(TARGET, 0, "first")
        .await
        .unwrap_err();
    assert!(served.contains("served as LUN 1"), "{served}");
    let clone_only = file(port, "2 = \"clone:0/first\"\n");
    handle
        .apply(parse(&clone_only), true)
        .await
        .expect("LUN 1 removed");
    handle.delete_snapshot(TARGET, 0, "first").await.unwrap();
    assert!(handle.snapshots(TARGET, 0).await.unwrap().is_empty());
    let gone = handle
        .delete_snapshot(TARGET, 0, "first")
        .await
        .unwrap_err();
    assert!(gone.contains("no snapshot named"), "{gone}");
    assert_eq!(read(&session, 2, 0).await.unwrap(), pattern(4));

    // A file that names a snapshot that is not there is refused whole.
    let missing = file(port, "2 = \"clone:0/first\"\n3 = \"snapshot:0/none\"\n");
    let error = handle.apply(parse(&missing), false).await.unwrap_err();
    assert!(error.to_string().contains("no snapshot named"), "{error}");

    let (result, _) = io.stop().await;
    result.expect("no I/O error across snapshots and reloads");
}
