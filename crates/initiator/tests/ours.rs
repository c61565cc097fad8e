//! The initiator against `iscsi target` in the same process: multiple
//! connections per session (MC/S, RFC 7143 6.3.3) with both scheduling
//! policies, many commands in flight over all connections, every byte
//! checked; CHAP one-way and mutual, and a wrong secret refused.

use std::sync::Arc;

use iscsi_initiator::scsi::rw10_cdb;
use iscsi_initiator::{
    Command, IscsiUrl, Residual, Scheduling, Session, SessionConfig, WireCounts,
};
use iscsi_scsi::Backstore;
use iscsi_stores::RamBackstore;
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
        luns: iscsi_target::numbered(luns),
        chap: None,
        allowed_initiators: Vec::new(),
        limits: Vec::new(),
    };
    tune(&mut entry);
    let config = TargetConfig {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        iser: Vec::new(),
        targets: vec![entry],
        portal_group_tag: 1,
        gateway_group: Vec::new(),
        negotiation: TargetConfig::default_negotiation(),
        command_window: 64,
        nop_in_interval: None,
        buffer_pool_bytes: iscsi_target::DEFAULT_BUFFER_POOL_BYTES,
        send_buffer_bytes: Some(iscsi_target::DEFAULT_SEND_BUFFER_BYTES),
        cores: Some(2),
        naa_company_id: iscsi_scsi::spc::NAA_COMPANY_ID,
        tap: None,
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
    // Every other read lands in the session's pool, whose buffers pass
    // from read to read (and LUN to LUN) still holding earlier data.
    let mut reads = tokio::task::JoinSet::new();
    for (i, (lun, lba, data)) in chunks.into_iter().enumerate() {
        let session = Arc::clone(&session);
        reads.spawn(async move {
            let back = if i % 2 == 0 {
                session
                    .read(lun, lba, BLOCK, vec![0; data.len()])
                    .await
                    .expect("read")
            } else {
                let cdb = rw10_cdb(false, lba as u32, (data.len() / BLOCK as usize) as u16);
                let command = Command::read_pooled(lun, &cdb, data.len() as u32);
                let response = session.execute(command).await.expect("pooled read");
                let back = response.check().expect("GOOD").data;
                session.recycle(back.clone());
                back
            };
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

/// A connection affinity (what `iscsi attach` gives each ublk queue) puts
/// every command issued under it on that connection of an MC/S session,
/// whatever the scheduling; outside it the scheduling spreads them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_affinity_keeps_commands_on_one_connection() {
    let (portal, _stop) = start(|_| {}).await;
    let url: IscsiUrl = format!("iscsi://{portal}/{TARGET}/0").parse().unwrap();
    let mut config = SessionConfig::default();
    config.negotiation.max_connections = 4;
    config.connections = 3;
    let session = Arc::new(Session::connect(&url, config).await.expect("login"));
    let before = session.commands_per_connection();
    assert_eq!(before.len(), 3);
    for index in [1usize, 5] {
        let session = Arc::clone(&session);
        iscsi_initiator::with_connection_affinity(index, async move {
            // (Tasks spawned inside would not inherit the affinity: a
            // task-local belongs to the task that runs the scope.)
            for lba in 0..20u32 {
                let cdb = rw10_cdb(false, lba, 1);
                let command = Command::read(0, &cdb, vec![0; BLOCK as usize]);
                session.execute(command).await.expect("READ(10)");
            }
        })
        .await;
    }
    let after = session.commands_per_connection();
    let carried: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a.1 - b.1).collect();
    // Index 1 and index 5 (5 % 3 = 2).
    assert_eq!(carried, [0, 20, 20], "{after:?}");
    // Without one, round robin uses every connection again.
    for lba in 0..30u32 {
        let cdb = rw10_cdb(false, lba, 1);
        session
            .execute(Command::read(0, &cdb, vec![0; BLOCK as usize]))
            .await
            .unwrap();
    }
    let spread = session.commands_per_connection();
    assert!(
        spread.iter().zip(&after).all(|(s, a)| s.1 > a.1),
        "{spread:?}"
    );
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

/// A loopback proxy between the initiator and the target whose
/// connections the test can cut at any moment.
struct Proxy {
    address: String,
    links: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(target: String) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let links: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accepted = Arc::clone(&links);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let link = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                accepted.lock().unwrap().push(link);
            }
        });
        Proxy { address, links }
    }

    /// Drops every connection through the proxy, in the middle of whatever
    /// it carries.
    fn cut(&self) {
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }
}

/// The connection is cut while many writes are in flight: the session is
/// reinstated (ERL 0), the writes that never completed are retried, every
/// write is acknowledged, and every acknowledged byte reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_write_loses_nothing_acknowledged() {
    let (portal, _stop) = start(|_| {}).await;
    let proxy = Proxy::start(portal).await;
    let url: IscsiUrl = format!("iscsi://{}/{TARGET}/0", proxy.address)
        .parse()
        .unwrap();
    let session = Arc::new(
        Session::connect(&url, SessionConfig::default())
            .await
            .unwrap(),
    );
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let chunks: Vec<(u64, Vec<u8>)> = (0..128u64).map(|i| (i * 512, random(256 * 1024))).collect();
    let mut writes = tokio::task::JoinSet::new();
    for (lba, data) in chunks.clone() {
        let session = Arc::clone(&session);
        let done = Arc::clone(&done);
        writes.spawn(async move {
            let result = session.write(0, lba, BLOCK, &data).await;
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            result
        });
    }
    // Cut once some writes are acknowledged and others are on the wire.
    while done.load(std::sync::atomic::Ordering::SeqCst) < 16 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    proxy.cut();
    while let Some(result) = writes.join_next().await {
        result
            .unwrap()
            .expect("every write is acknowledged in the end");
    }
    assert!(session.reinstatements() >= 1, "the session was reinstated");
    for (lba, data) in chunks {
        let back = session
            .read(0, lba, BLOCK, vec![0; data.len()])
            .await
            .unwrap();
        assert!(back == data, "LBA {lba} holds what was acknowledged");
    }
    session.logout().await.unwrap();
}

/// A pooled read gets a buffer other reads used before: what comes back is
/// exactly the data the target sent, never bytes of an earlier read, also
/// when the target sends less than expected (an underflow). A discarded
/// read counts its data and keeps none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_reads_return_only_the_data_sent() {
    let (portal, _stop) = start(|_| {}).await;
    let url: IscsiUrl = format!("iscsi://{portal}/{TARGET}/0").parse().unwrap();
    let session = Session::connect(&url, SessionConfig::default())
        .await
        .expect("login");
    let written = random(8 * BLOCK as usize);
    session.write(0, 16, BLOCK, &written).await.expect("write");
    session.recycle(vec![0xEE; 64 * 1024]);
    let cdb = rw10_cdb(false, 16, 8);
    let response = session
        .execute(Command::read_pooled(0, &cdb, written.len() as u32))
        .await
        .expect("pooled read");
    assert_eq!(response.residual, Residual::None);
    assert_eq!(response.data, written);
    session.recycle(response.data);
    // One block asked for with room for 8: the target sends 512 bytes and
    // reports the underflow; the buffer it lands in held 8 blocks before.
    let cdb = rw10_cdb(false, 16, 1);
    let response = session
        .execute(Command::read_pooled(0, &cdb, written.len() as u32))
        .await
        .expect("short read");
    assert_eq!(response.residual, Residual::Underflow(7 * BLOCK));
    assert_eq!(response.received, BLOCK);
    assert_eq!(response.data, written[..BLOCK as usize]);
    session.recycle(response.data);
    // A discarded read: all the data received and checked, none kept.
    let cdb = rw10_cdb(false, 16, 8);
    let response = session
        .execute(Command::read_discarded(0, &cdb, written.len() as u32))
        .await
        .expect("discarded read");
    assert_eq!(response.residual, Residual::None);
    assert_eq!(response.received, written.len() as u32);
    assert!(response.data.is_empty());
    // No data at all (TEST UNIT READY with an expected length): empty.
    let response = session
        .execute(Command::read_pooled(0, &[0; 6], 4096))
        .await
        .expect("no data");
    assert!(response.data.is_empty());
    session.logout().await.expect("logout");
}

/// A session to `url` with `keys` set on the default configuration.
async fn connect_with(url: &IscsiUrl, keys: &[(&str, &str)]) -> Session {
    let mut config = SessionConfig::default();
    for (key, value) in keys {
        config.set(key, value).unwrap();
    }
    Session::connect(url, config).await.expect("login")
}

/// What went over the wire while `data` was written to LUN 0 from LBA 0.
/// The tap hears of a batch once its write has returned, in the writer
/// task, which can be after the target's response has already completed
/// the command: the counts are read once they have stopped changing.
async fn counted_write(session: &Session, data: &[u8]) -> WireCounts {
    let before = session.wire_counts();
    session.write(0, 0, BLOCK, data).await.expect("write");
    let mut counts = session.wire_counts().since(&before);
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let now = session.wire_counts().since(&before);
        if now == counts {
            break;
        }
        counts = now;
    }
    counts
}

/// The session's wire counts are what went over the wire, PDU by PDU: a
/// 64 KiB read at MaxRecvDataSegmentLength 8192 comes as 8 Data-Ins; a
/// 64 KiB write with InitialR2T=Yes, ImmediateData=No and 16 KiB bursts
/// goes as 4 R2T-solicited Data-Outs; with ImmediateData=Yes and a 16 KiB
/// first burst, 16 KiB rides in the command and 3 R2Ts fetch the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_counts_are_the_pdus_on_the_wire() {
    let (portal, _stop) = start(|_| {}).await;
    let url: IscsiUrl = format!("iscsi://{portal}/{TARGET}/0").parse().unwrap();
    let data = random(64 * 1024);
    let blocks = (data.len() / BLOCK as usize) as u16;

    let session = connect_with(
        &url,
        &[
            ("MaxRecvDataSegmentLength", "8192"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "No"),
            ("MaxBurstLength", "16384"),
            ("FirstBurstLength", "16384"),
        ],
    )
    .await;
    let write = counted_write(&session, &data).await;
    assert_eq!(write.scsi_commands, 1);
    assert_eq!((write.r2t, write.data_out), (4, 4), "{write:?}");
    assert_eq!(write.solicited_bytes, 65536);
    assert_eq!(write.immediate_bytes + write.unsolicited_bytes, 0);
    assert_eq!(write.scsi_responses, 1);

    let before = session.wire_counts();
    let read = session
        .execute(Command::read(
            0,
            &rw10_cdb(false, 0, blocks),
            vec![0; 65536],
        ))
        .await
        .expect("read");
    assert_eq!(read.check().expect("status").data, data);
    let read = session.wire_counts().since(&before);
    assert_eq!((read.scsi_commands, read.data_in), (1, 8), "{read:?}");
    assert_eq!(read.data_out + read.r2t, 0);
    session.logout().await.expect("logout");

    let session = connect_with(
        &url,
        &[
            ("InitialR2T", "Yes"),
            ("ImmediateData", "Yes"),
            ("MaxBurstLength", "16384"),
            ("FirstBurstLength", "16384"),
            ("TcpNoDelay", "No"),
        ],
    )
    .await;
    let write = counted_write(&session, &data).await;
    assert_eq!(write.immediate_bytes, 16384, "{write:?}");
    assert_eq!((write.r2t, write.data_out), (3, 3), "{write:?}");
    assert_eq!(write.solicited_bytes, 49152);
    session.logout().await.expect("logout");

    // MaxXmitDataSegmentLength caps what we send below the target's 256
    // KiB: 8 KiB immediate data, then each 16 KiB burst in two Data-Outs.
    let session = connect_with(
        &url,
        &[
            ("InitialR2T", "Yes"),
            ("MaxBurstLength", "16384"),
            ("FirstBurstLength", "16384"),
            ("MaxXmitDataSegmentLength", "8192"),
        ],
    )
    .await;
    let write = counted_write(&session, &data).await;
    assert_eq!(write.immediate_bytes, 8192, "{write:?}");
    // 57344 solicited bytes: bursts of 16 KiB (3.5 of them, 4 R2Ts) in
    // PDUs of at most 8 KiB.
    assert_eq!((write.r2t, write.data_out), (4, 7), "{write:?}");
    let read = session
        .execute(Command::read(
            0,
            &rw10_cdb(false, 0, blocks),
            vec![0; 65536],
        ))
        .await
        .expect("read");
    assert_eq!(read.check().expect("status").data, data);
    session.logout().await.expect("logout");
}
