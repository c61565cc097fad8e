//! The initiator library against tgtd (Debian package `tgt`): discovery,
//! INQUIRY, READ CAPACITY, REPORT LUNS, random data written and read back
//! (single commands and many in flight, immediate/unsolicited/solicited
//! data), SYNCHRONIZE CACHE, task management, pings, logout, and a session
//! reinstated after its connection is dropped.

use iscsi_initiator::{IscsiUrl, Session, SessionConfig, discover};
use iscsi_test_peers::Tgtd;
use rand::RngCore;

/// The tgtd target name.
const TGT_NAME: &str = "iqn.2026-11.test:initiator-tgt";

const SIZE: u64 = 64 << 20;

fn random(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::rng().fill_bytes(&mut data);
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgtd_end_to_end() {
    let tgtd = Tgtd::start(TGT_NAME, SIZE);
    let targets = discover(
        &format!("127.0.0.1:{}", tgtd.port()),
        &SessionConfig::default(),
    )
    .await
    .expect("discovery");
    assert!(targets.iter().any(|t| t.name == TGT_NAME), "{targets:?}");

    let url: IscsiUrl = tgtd.url().parse().unwrap();
    let session = Session::connect(&url, SessionConfig::default())
        .await
        .expect("login");
    let luns = session.report_luns().await.expect("REPORT LUNS");
    assert!(luns.contains(&1), "{luns:?}");
    let inquiry = session.inquiry(1).await.expect("INQUIRY");
    assert_eq!(inquiry.device_type, 0);
    let capacity = session.read_capacity(1).await.expect("READ CAPACITY");
    assert_eq!(capacity.bytes(), SIZE);
    let c10 = session.read_capacity10(1).await.expect("READ CAPACITY 10");
    assert_eq!(c10.blocks, capacity.blocks);
    session.test_unit_ready(1).await.expect("TUR");
    session.ping().await.expect("NOP-Out ping");
    let bs = capacity.block_size;

    // Sizes around the immediate, first burst and R2T limits.
    for (lba, len) in [
        (0u64, 512usize),
        (8, 8192),
        (100, 300 * 1024),
        (2000, 4 << 20),
    ] {
        let data = random(len);
        session.write(1, lba, bs, &data).await.expect("WRITE");
        let back = session.read(1, lba, bs, vec![0; len]).await.expect("READ");
        assert!(back == data, "data at {lba}+{len} differs");
    }
    let data = random(65536);
    session
        .write16(1, 50_000, bs, &data)
        .await
        .expect("WRITE 16");
    let back = session
        .read16(1, 50_000, bs, vec![0; 65536])
        .await
        .expect("READ 16");
    assert!(back == data);
    session
        .synchronize_cache(1)
        .await
        .expect("SYNCHRONIZE CACHE");

    // Many commands in flight at once.
    let chunk = 128 * 1024;
    let blocks = (chunk / bs as usize) as u64;
    let payload = random(chunk * 64);
    let mut writes = Vec::new();
    for i in 0..64 {
        let s = session.clone();
        let part = payload[i * chunk..(i + 1) * chunk].to_vec();
        writes.push(tokio::spawn(async move {
            s.write(1, 20_000 + i as u64 * blocks, bs, &part).await
        }));
    }
    for w in writes {
        w.await.unwrap().expect("parallel WRITE");
    }
    let mut reads = Vec::new();
    for i in 0..64 {
        let s = session.clone();
        reads.push(tokio::spawn(async move {
            s.read(1, 20_000 + i as u64 * blocks, bs, vec![0; chunk])
                .await
        }));
    }
    for (i, r) in reads.into_iter().enumerate() {
        let back = r.await.unwrap().expect("parallel READ");
        assert!(
            back == payload[i * chunk..(i + 1) * chunk],
            "chunk {i} differs"
        );
    }

    // The data is really on the LUN file.
    let file = std::fs::read(tgtd.lun_file()).unwrap();
    let at = 20_000 * bs as usize;
    assert!(file[at..at + payload.len()] == payload[..]);

    session.lun_reset(1).await.expect("LUN RESET");

    // ERL 0: drop the connection; the next commands reinstate the session.
    session.drop_connections();
    let data = random(1 << 20);
    session
        .write(1, 7000, bs, &data)
        .await
        .expect("WRITE after drop");
    let back = session
        .read(1, 7000, bs, vec![0; 1 << 20])
        .await
        .expect("READ after drop");
    assert!(back == data);
    assert_eq!(session.reinstatements(), 1);

    session.logout().await.expect("logout");
    assert!(session.inquiry(1).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgtd_digests_and_initial_r2t() {
    let tgtd = Tgtd::start(TGT_NAME, 16 << 20);
    let url: IscsiUrl = tgtd.url().parse().unwrap();
    let mut config = SessionConfig::default();
    // tgtd answers None to digests by default; CRC32C is offered first.
    config.set("HeaderDigest", "CRC32C,None").unwrap();
    config.set("DataDigest", "CRC32C,None").unwrap();
    config.set("InitialR2T", "Yes").unwrap();
    config.set("ImmediateData", "No").unwrap();
    config.set("MaxBurstLength", "65536").unwrap();
    config.set("MaxRecvDataSegmentLength", "8192").unwrap();
    let session = Session::connect(&url, config).await.expect("login");
    let p = session.parameters().unwrap();
    assert!(p.initial_r2t);
    let data = random(1 << 20);
    session.write(1, 0, 512, &data).await.expect("WRITE");
    let back = session
        .read(1, 0, 512, vec![0; 1 << 20])
        .await
        .expect("READ");
    assert!(back == data);
    session.logout().await.expect("logout");
}

/// tgtd offering InitialR2T=No and a FirstBurstLength while we want
/// InitialR2T=Yes and no immediate data: we answer its FirstBurstLength
/// with Irrelevant, tgt answers that with Reject, and the login goes on
/// (the key is irrelevant either way); every byte is solicited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgtd_offering_what_we_find_irrelevant() {
    let tgtd = Tgtd::start(TGT_NAME, SIZE);
    tgtd.set("InitialR2T", "No");
    tgtd.set("FirstBurstLength", "1048576");
    tgtd.set("MaxRecvDataSegmentLength", "262144");
    let url: IscsiUrl = tgtd.url().parse().unwrap();
    let mut config = SessionConfig::default();
    for (key, value) in [
        ("InitialR2T", "Yes"),
        ("ImmediateData", "No"),
        ("MaxBurstLength", "65536"),
        ("FirstBurstLength", "65536"),
    ] {
        config.set(key, value).unwrap();
    }
    let session = Session::connect(&url, config).await.expect("login");
    // tgtd reports a unit attention (power on) to the first command.
    session.test_unit_ready(1).await.expect("TEST UNIT READY");
    let data = random(256 * 1024);
    let before = session.wire_counts();
    session.write(1, 0, 512, &data).await.expect("write");
    let counts = session.wire_counts().since(&before);
    assert_eq!(counts.solicited_bytes, data.len() as u64, "{counts:?}");
    assert_eq!(counts.r2t, 4, "{counts:?}");
    let back = session
        .read(1, 0, 512, vec![0; data.len()])
        .await
        .expect("read");
    assert!(back == data, "tgtd returned other data");
    session.logout().await.expect("logout");
}
