//! The initiator against `iscsi target` in the same process: multiple
//! connections per session (MC/S, RFC 7143 6.3.3) with both scheduling
//! policies, many commands in flight over all connections, every byte
//! checked; CHAP one-way and mutual, and a wrong secret refused.

use std::sync::Arc;

use iscsi_initiator::{IscsiUrl, Scheduling, Session, SessionConfig};
use iscsi_scsi::{Backstore, RamBackstore};
use iscsi_target::{Server, TargetConfig, TargetEntry};
use rand::RngCore;
use tokio::sync::oneshot;

const TARGET: &str = "iqn.2026-11.rs.iscsi:initiator-tests";
const BLOCK: u32 = 512;

async fn start(tune: impl FnOnce(&mut TargetEntry)) -> (String, oneshot::Sender<()>) {
    let luns: Vec<Arc<dyn Backstore>> = (0..2)
        .map(|i| Arc::new(RamBackstore::new(32 << 20, BLOCK, i).unwrap()) as Arc<dyn Backstore>)
        .collect();
    let mut entry = TargetEntry {
        name: TARGET.to_owned(),
        alias: None,
        luns,
        chap: None,
        allowed_initiators: Vec::new(),
    };
    tune(&mut entry);
    let config = TargetConfig {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![entry],
        portal_group_tag: 1,
        negotiation: TargetConfig::default_negotiation(),
        command_window: 64,
        nop_in_interval: None,
    };
    let server = Server::bind(config).await.unwrap();
    let address = server.local_addrs()[0];
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.run_until(async {
        let _ = stopped.await;
    }));
    (format!("127.0.0.1:{}", address.port()), stop)
}

fn random(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::rng().fill_bytes(&mut data);
    data
}

async fn mcs_round_trip(scheduling: Scheduling) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (portal, _stop) = start(|_| {}).await;
    let url: IscsiUrl = format!("iscsi://{portal}/{TARGET}/0").parse().unwrap();
    let mut config = SessionConfig::default();
    config.negotiation.max_connections = 4;
    config.connections = 3;
    config.scheduling = scheduling;
    let session = Arc::new(Session::connect(&url, config).await.expect("login"));
    assert_eq!(session.connection_count(), 3, "three connections joined");
    // 96 writes of 64 KiB over both LUNs at once, then read everything back.
    let chunks: Vec<(u64, u64, Vec<u8>)> = (0..96u64)
        .map(|i| (i % 2, (i / 2) * 128, random(64 * 1024)))
        .collect();
    let mut writes = tokio::task::JoinSet::new();
    for (lun, lba, data) in chunks.clone() {
        let session = Arc::clone(&session);
        writes.spawn(async move { session.write(lun, lba, BLOCK, &data).await });
    }
    while let Some(done) = writes.join_next().await {
        done.unwrap().expect("write");
    }
    let mut reads = tokio::task::JoinSet::new();
    for (lun, lba, data) in chunks {
        let session = Arc::clone(&session);
        reads.spawn(async move {
            let back = session
                .read(lun, lba, BLOCK, vec![0; data.len()])
                .await
                .expect("read");
            assert!(
                back == data,
                "LUN {lun} LBA {lba} reads back what was written"
            );
        });
    }
    while let Some(done) = reads.join_next().await {
        done.unwrap();
    }
    assert_eq!(session.connection_count(), 3);
    session.logout().await.expect("logout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcs_round_robin() {
    mcs_round_trip(Scheduling::RoundRobin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcs_lun_affinity() {
    mcs_round_trip(Scheduling::LunAffinity).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_one_way_mutual_and_a_wrong_secret() {
    use iscsi_proto::login::chap::{ChapAlgorithm, Credentials};
    use iscsi_proto::login::target::ChapRequirement;
    let (portal, _stop) = start(|t| {
        t.chap = Some(ChapRequirement {
            algorithms: ChapAlgorithm::ALL.to_vec(),
            initiator: Credentials::new("alice", b"alice-secret-12"),
            mutual: Some(Credentials::new("target", b"target-secret-34")),
        });
    })
    .await;
    // One-way: the URL's credentials.
    let url: IscsiUrl = format!("iscsi://alice%alice-secret-12@{portal}/{TARGET}/1")
        .parse()
        .unwrap();
    let session = Session::connect(&url, SessionConfig::default())
        .await
        .expect("one-way CHAP");
    let data = random(4096);
    session.write(1, 8, BLOCK, &data).await.unwrap();
    assert_eq!(
        session.read(1, 8, BLOCK, vec![0; 4096]).await.unwrap(),
        data
    );
    session.logout().await.unwrap();
    // Mutual: the target proves itself too.
    let mut config = SessionConfig::default();
    config.set("CHAPUser", "alice").unwrap();
    config.set("CHAPSecret", "alice-secret-12").unwrap();
    config.set("TargetCHAPUser", "target").unwrap();
    config.set("TargetCHAPSecret", "target-secret-34").unwrap();
    let session = Session::connect(&url, config.clone())
        .await
        .expect("mutual CHAP");
    session.logout().await.unwrap();
    // The target answering with another secret is refused by us.
    config
        .set("TargetCHAPSecret", "not-the-target-secret")
        .unwrap();
    assert!(Session::connect(&url, config).await.is_err());
    // A wrong initiator secret is refused by the target.
    let wrong: IscsiUrl = format!("iscsi://alice%wrong-secret-00@{portal}/{TARGET}/1")
        .parse()
        .unwrap();
    assert!(
        Session::connect(&wrong, SessionConfig::default())
            .await
            .is_err()
    );
}
