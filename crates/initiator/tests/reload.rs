//! A running target reloaded under I/O (issue 34): LUNs added and removed,
//! an ACL changed, and files that fail at each step. Our initiator keeps a
//! verified write/read loop on one LUN through all of it, which must see no
//! error; a session using a LUN makes its removal a refusal until forced;
//! a reload that fails leaves the running state exactly as it was.

mod common;

use std::sync::Arc;

use common::start_from_toml as start;
use iscsi_initiator::{Error, Session};
use iscsi_target::reload::ReloadError;
use iscsi_target::reload::plan::Effect;
use iscsi_target::{ParsedConfig, ServerHandle};
use iscsi_test_peers::free_port;

const TARGET: &str = "iqn.2026-11.rs.iscsi:reload";
const OTHER: &str = "iqn.2026-11.rs.iscsi:reload-other";
const BLOCK: u32 = 512;

/// The file with `listen` and the target's `[target.lun]` lines.
fn file(port: u16, extra_listen: &str, luns: &str, acl: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"{extra_listen}]\nnop_in_interval_seconds = 0\n\
         [[target]]\nname = \"{TARGET}\"\n{acl}\n[target.lun]\n{luns}\n"
    )
}

async fn connect(port: u16, initiator: &str, isid: u8) -> Arc<Session> {
    common::login_as(port, TARGET, initiator, isid).await
}

async fn luns(session: &Session) -> Vec<u64> {
    session.report_luns().await.expect("REPORT LUNS")
}

/// What a failed reload must leave as it was: targets, ACLs, LUNs and
/// their stores and users (not the counters, which B's I/O moves).
fn shape(handle: &ServerHandle) -> Vec<String> {
    handle
        .status()
        .targets
        .iter()
        .map(|t| {
            let luns: Vec<String> = t
                .luns
                .iter()
                .map(|l| format!("{}={} used by {:?}", l.lun, l.backstore, l.used_by))
                .collect();
            format!(
                "{} acl {:?} chap {} luns {luns:?}",
                t.name, t.allowed_initiators, t.chap
            )
        })
        .collect()
}

fn parse(text: &str) -> ParsedConfig {
    ParsedConfig::parse(text).expect("a valid file")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_io_loses_nothing_and_refuses_what_disturbs() {
    let port = free_port();
    let three = "0 = \"ram:8M\"\n1 = \"ram:8M\"\n2 = \"ram:8M\"";
    let (handle, _stop) = start(&file(port, "", three, "")).await;
    let a = connect(port, "iqn.2026-11.rs.iscsi:a", 1).await;
    let b = connect(port, "iqn.2026-11.rs.iscsi:b", 2).await;
    let tsih_a = handle
        .status()
        .sessions
        .iter()
        .find(|s| s.initiator.ends_with(":a"))
        .map(|s| s.tsih)
        .expect("session a");

    // A uses LUNs 0 and 1; B keeps writing and verifying LUN 2 throughout.
    let pattern = |seed: u8| vec![seed; 64 * 1024];
    a.write(0, 0, BLOCK, &pattern(0xA0)).await.unwrap();
    a.write(1, 0, BLOCK, &pattern(0xA1)).await.unwrap();
    let io = common::VerifiedIo::start(Arc::clone(&b), 2, 0);

    // Removing LUN 1, which A used: refused, naming A, and nothing moved.
    let without_1 = file(port, "", "0 = \"ram:8M\"\n2 = \"ram:8M\"", "");
    match handle.apply(parse(&without_1), false).await {
        Err(ReloadError::Refused(plan)) => {
            let change = plan.disruptive().next().expect("one disruptive change");
            assert_eq!(change.effect, Effect::LunInUse);
            assert!(change.object.ends_with("LUN 1"), "{change}");
            assert_eq!(
                change.sessions.iter().map(|s| s.tsih).collect::<Vec<_>>(),
                [tsih_a]
            );
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(luns(&a).await, [0, 1, 2]);

    // Forced: LUN 1 goes the SPC way; A's LUN 0 and B's LUN 2 stay.
    let report = handle.apply(parse(&without_1), true).await.expect("forced");
    assert!(report.forced && report.changes.len() == 1, "{report:?}");
    assert_eq!(luns(&a).await, [0, 2]);
    match a.read(1, 0, BLOCK, vec![0; 512]).await {
        Err(Error::Status {
            status: 0x02,
            sense: Some(sense),
        }) => {
            assert_eq!((sense.key, sense.asc, sense.ascq), (0x05, 0x25, 0x00))
        }
        other => panic!("LUN 1 still answers: {other:?}"),
    }
    assert_eq!(
        a.read(0, 0, BLOCK, vec![0; 65536]).await.unwrap(),
        pattern(0xA0)
    );

    // Adding LUN 5 and a second portal is free.
    let second = free_port();
    let with_5 = file(
        port,
        &format!(", \"127.0.0.1:{second}\""),
        "0 = \"ram:8M\"\n2 = \"ram:8M\"\n5 = \"ram:4M\"",
        "",
    );
    let report = handle
        .apply(parse(&with_5), false)
        .await
        .expect("additions");
    assert_eq!(report.changes.len(), 2, "{report:?}");
    assert_eq!(luns(&a).await, [0, 2, 5]);
    a.write(5, 0, BLOCK, &pattern(0xA5)).await.unwrap();
    let c = connect(second, "iqn.2026-11.rs.iscsi:c", 3).await;
    assert_eq!(
        c.read(5, 0, BLOCK, vec![0; 65536]).await.unwrap(),
        pattern(0xA5)
    );
    c.logout().await.expect("logout");
    // The target ends the session just after answering the logout.
    for _ in 0..500 {
        if handle.status().sessions.len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(handle.status().sessions.len(), 2, "c's session ended");

    // Failing reloads change nothing: a store that cannot open (beside a
    // new target that could), then a portal that cannot bind (beside a new
    // LUN that could).
    let before = shape(&handle);
    let bad_store = format!(
        "{}[[target]]\nname = \"{OTHER}\"\nluns = [\"ram:1M\"]\n",
        file(
            port,
            &format!(", \"127.0.0.1:{second}\""),
            "0 = \"ram:8M\"\n2 = \"ram:8M\"\n5 = \"ram:4M\"\n6 = \"file:/nonexistent/iscsi-rs/x.img,size=1M\"",
            "",
        )
    );
    match handle.apply(parse(&bad_store), true).await {
        Err(ReloadError::Apply { error, .. }) => assert!(error.contains("LUN 6"), "{error}"),
        other => panic!("applied: {other:?}"),
    }
    // The portal fails after a new file LUN was created: the file goes too.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().port();
    let created =
        std::env::temp_dir().join(format!("iscsi-rs-reload-{}-{port}.img", std::process::id()));
    let bad_portal = file(
        port,
        &format!(", \"127.0.0.1:{second}\", \"127.0.0.1:{busy}\""),
        &format!(
            "0 = \"ram:8M\"\n2 = \"ram:8M\"\n5 = \"ram:4M\"\n7 = \"file:{},size=1M\"",
            created.display()
        ),
        "",
    );
    match handle.apply(parse(&bad_portal), true).await {
        Err(ReloadError::Apply { error, .. }) => {
            assert!(error.contains(&busy.to_string()), "{error}")
        }
        other => panic!("applied: {other:?}"),
    }
    assert!(
        !created.exists(),
        "the failed reload left {} behind",
        created.display()
    );
    assert_eq!(shape(&handle), before);
    assert_eq!(handle.status().portals.len(), 2);
    assert_eq!(luns(&a).await, [0, 2, 5]);

    // An ACL that leaves B out ends B's session: refused unless forced.
    let acl = "allowed_initiators = [\"iqn.2026-11.rs.iscsi:a\"]";
    let shut_b = file(
        port,
        &format!(", \"127.0.0.1:{second}\""),
        "0 = \"ram:8M\"\n2 = \"ram:8M\"\n5 = \"ram:4M\"",
        acl,
    );
    match handle.apply(parse(&shut_b), false).await {
        Err(ReloadError::Refused(plan)) => {
            let change = plan.disruptive().next().unwrap();
            assert_eq!(change.effect, Effect::EndsSessions);
            assert!(
                change.sessions.iter().all(|s| s.initiator.ends_with(":b")),
                "{change}"
            );
        }
        other => panic!("not refused: {other:?}"),
    }

    let (result, verified) = io.stop().await;
    result.expect("B's I/O saw no error through every reload");
    assert!(verified > 0);
    let still = b.read(2, 0, BLOCK, vec![0; 65536]).await.unwrap();
    assert_eq!(still.len(), 65536);

    // The operator ends A's session: the target asks it to log out, and
    // it is gone from the registry (our initiator leaves at once).
    assert_eq!(
        handle.logout(tsih_a).as_deref(),
        Some("iqn.2026-11.rs.iscsi:a")
    );
    assert_eq!(handle.logout(999), None);
    for _ in 0..500 {
        if handle.status().sessions.iter().all(|s| s.tsih != tsih_a) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        handle.status().sessions.iter().all(|s| s.tsih != tsih_a),
        "session {tsih_a} still there after logout"
    );
}

/// `status` against a known workload from our initiator: the session's
/// counters move by exactly what it did, and its connection, keys and
/// LUN use are the ones it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_exactly_what_the_initiator_did() {
    let port = free_port();
    let (handle, _stop) = start(&file(port, "", "0 = \"ram:8M\"\n1 = \"ram:8M\"", "")).await;
    let a = connect(port, "iqn.2026-11.rs.iscsi:counted", 9).await;
    let counters = |h: &ServerHandle| h.status().sessions[0].counters.clone();
    let before = counters(&handle);
    for i in 0..10u64 {
        a.write(1, i * 128, BLOCK, &vec![i as u8; 64 * 1024])
            .await
            .unwrap();
    }
    for i in 0..7u64 {
        a.read(1, i * 32, BLOCK, vec![0; 16 * 1024]).await.unwrap();
    }
    let after = counters(&handle);
    let moved = |name: &str| after[name] - before[name];
    assert_eq!(moved("commands"), 17);
    assert_eq!(moved("write_bytes"), 10 * 64 * 1024);
    assert_eq!(moved("read_bytes"), 7 * 16 * 1024);
    assert_eq!(moved("errors"), 0);
    let status = handle.status();
    let session = &status.sessions[0];
    assert_eq!(session.initiator, "iqn.2026-11.rs.iscsi:counted");
    assert_eq!(session.isid, "800000000009");
    assert_eq!(session.target.as_deref(), Some(TARGET));
    assert_eq!(session.commands_in_flight, 0);
    assert!(session.luns_used.contains(&1), "{:?}", session.luns_used);
    assert_eq!(
        session.negotiated["ErrorRecoveryLevel"],
        session.error_recovery_level.to_string()
    );
    assert_eq!(session.connections.len(), 1);
    let connection = &session.connections[0];
    assert_eq!(connection.portal.port(), port);
    assert_eq!(connection.transport, "tcp");
    assert_eq!(status.targets[0].luns[1].used_by, [session.tsih]);
}
