//! The initiator against `iscsi target` over iSER (RFC 7145) on loopback:
//! the software iWARP stack under both, MPA CRC on. Every byte written is
//! read back and compared: small writes carried whole as immediate data,
//! large ones fetched by the target's RDMA Reads, reads placed by its RDMA
//! Writes, many commands at once, discovery, a read the target cuts short
//! (residual), and a refused zero-based-addressing peer.

mod common;

use std::sync::Arc;

use iscsi_datamover::iser::CmHeader;
use iscsi_initiator::{Command, IscsiUrl, Residual, Session, SessionConfig, discover_url};
use iscsi_scsi::Backstore;
use iscsi_stores::RamBackstore;
use rand::RngCore;
use tokio::sync::oneshot;

const TARGET: &str = "iqn.2026-11.rs.iscsi:iser-tests";
const BLOCK: u32 = 512;

/// A target with one iSER portal and one TCP portal; returns both.
async fn start() -> (String, String, oneshot::Sender<()>) {
    start_with_window(64).await
}

/// The same, granting initiators a command window of `command_window`.
async fn start_with_window(command_window: u32) -> (String, String, oneshot::Sender<()>) {
    let lun: Arc<dyn Backstore> = Arc::new(RamBackstore::new(64 << 20, BLOCK, 7).unwrap());
    common::our_target(TARGET, vec![lun], command_window).await
}

/// Our target on loopback and a session logged in to it over iSER.
async fn iser_session() -> (Session, oneshot::Sender<()>) {
    let (_, iser, stop) = start().await;
    let url: IscsiUrl = format!("iser://{iser}/{TARGET}/0").parse().unwrap();
    let session = Session::connect(&url, SessionConfig::default())
        .await
        .expect("login over iSER");
    (session, stop)
}

fn random(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::rng().fill_bytes(&mut data);
    data
}

fn logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_reads_of_every_size_round_trip() {
    logging();
    let (session, _stop) = iser_session().await;
    let parameters = session.parameters().unwrap();
    assert!(parameters.rdma_extensions, "RDMAExtensions=Yes");
    assert!(
        parameters.initial_r2t,
        "the iSER target asks InitialR2T=Yes"
    );
    let inquiry = session.inquiry(0).await.expect("INQUIRY");
    assert_eq!(inquiry.vendor.trim(), "ISCSI-RS");
    // 512 B and 4 KiB: immediate data only; 64 KiB, 1 MiB and 3 MiB: the
    // rest fetched by RDMA Reads, in MaxBurstLength pieces.
    let mut lba = 0u64;
    for len in [512usize, 4096, 8192, 65536, 1 << 20, 3 << 20] {
        let data = random(len);
        session.write(0, lba, BLOCK, &data).await.expect("write");
        let back = session
            .read(0, lba, BLOCK, vec![0; len])
            .await
            .expect("read");
        assert!(back == data, "{len} bytes at LBA {lba} came back different");
        lba += (len as u64).div_ceil(u64::from(BLOCK));
    }
    session.logout().await.expect("logout");
}

/// Writes whose data the caller shares (`Command::write_shared`): the
/// target's RDMA Reads are answered from the caller's bytes, and the
/// target takes the Read's sink as its buffer where it can (one burst
/// after the immediate data), copying the immediate data into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_writes_round_trip() {
    logging();
    let (session, _stop) = iser_session().await;
    let mut lba = 0u32;
    for len in [4096usize, 65536, (1 << 20) - 8192, 1 << 20, 3 << 20] {
        let data = bytes::Bytes::from(random(len));
        let blocks = (len as u32).div_ceil(BLOCK);
        let mut cdb = [0u8; 10];
        cdb[0] = 0x2a; // WRITE (10)
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
        session
            .execute(Command::write_shared(0, &cdb, data.clone()))
            .await
            .expect("write")
            .check()
            .expect("GOOD");
        let back = session
            .read(0, u64::from(lba), BLOCK, vec![0; len])
            .await
            .expect("read");
        assert!(back == data, "{len} bytes at LBA {lba} came back different");
        lba += blocks;
    }
    session.logout().await.expect("logout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_commands_at_once() {
    logging();
    let (_, iser, _stop) = start().await;
    let url: IscsiUrl = format!("iser://{iser}/{TARGET}/0").parse().unwrap();
    let session = Arc::new(
        Session::connect(&url, SessionConfig::default())
            .await
            .unwrap(),
    );
    let chunks: Vec<(u64, Vec<u8>)> = (0..96u64)
        .map(|i| (i * 256, random(if i % 3 == 0 { 4096 } else { 128 * 1024 })))
        .collect();
    let mut writes = tokio::task::JoinSet::new();
    for (lba, data) in chunks.clone() {
        let session = Arc::clone(&session);
        writes.spawn(async move { session.write(0, lba, BLOCK, &data).await });
    }
    while let Some(done) = writes.join_next().await {
        done.unwrap().expect("write");
    }
    let mut reads = tokio::task::JoinSet::new();
    for (lba, data) in chunks {
        let session = Arc::clone(&session);
        reads.spawn(async move {
            let back = session.read(0, lba, BLOCK, vec![0; data.len()]).await;
            (lba, data, back)
        });
    }
    while let Some(done) = reads.join_next().await {
        let (lba, data, back) = done.unwrap();
        assert!(back.expect("read") == data, "LBA {lba} differs");
    }
    session.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_read_reports_its_residual() {
    logging();
    let (_, iser, _stop) = start().await;
    let url: IscsiUrl = format!("iser://{iser}/{TARGET}/0").parse().unwrap();
    let session = Session::connect(&url, SessionConfig::default())
        .await
        .unwrap();
    // INQUIRY asking for 255 bytes: the target has fewer, the RDMA Write
    // is short and the response carries the underflow.
    let cdb = [0x12, 0, 0, 0, 255, 0];
    let response = session
        .execute(Command::read(0, &cdb, vec![0; 255]))
        .await
        .expect("INQUIRY");
    assert_eq!(response.status, 0);
    let Residual::Underflow(missing) = response.residual else {
        panic!("expected an underflow, got {:?}", response.residual);
    };
    assert!(missing > 0 && missing < 255 - 36, "underflow of {missing}");
    assert_eq!(&response.data[8..16], b"ISCSI-RS");
    session.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_over_iser_lists_the_iser_portal() {
    logging();
    let (_, iser, _stop) = start().await;
    let url: IscsiUrl = format!("iser://{iser}").parse().unwrap();
    let targets = discover_url(&url, &SessionConfig::default())
        .await
        .expect("SendTargets over iSER");
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0].name, TARGET);
    assert!(
        targets[0].addresses.iter().any(|a| a.portal == iser),
        "{:?} should name {iser}",
        targets[0].addresses
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tcp_portal_answers_rdma_extensions_no() {
    logging();
    let (tcp, _, _stop) = start().await;
    // An iSER login attempt at the TCP portal: the MPA Request is not an
    // iSCSI PDU, so the target drops the connection and the initiator
    // reports a failure rather than hanging.
    let url: IscsiUrl = format!("iser://{tcp}/{TARGET}/0").parse().unwrap();
    let mut config = SessionConfig::default();
    config.timeouts.login = std::time::Duration::from_secs(5);
    assert!(Session::connect(&url, config).await.is_err());
    // And plain iSCSI there still says RDMAExtensions=No.
    let url: IscsiUrl = format!("iscsi://{tcp}/{TARGET}/0").parse().unwrap();
    let session = Session::connect(&url, SessionConfig::default())
        .await
        .unwrap();
    assert!(!session.parameters().unwrap().rdma_extensions);
    session.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_based_addressing_is_refused() {
    logging();
    let (_, iser, _stop) = start().await;
    let stream = tokio::net::TcpStream::connect(&iser).await.unwrap();
    let mut cm = CmHeader::ours(true);
    cm.zero_based = true;
    let params = iscsi_iwarp::ConnectParams {
        private_data: cm.emit().to_vec(),
        ..iscsi_iwarp::ConnectParams::default()
    };
    let refused = iscsi_iwarp::connect(stream, params, Vec::new()).await;
    assert!(refused.is_err(), "the MPA Reply must carry the Reject bit");
}

/// A target whose RDMA stream comes up but which never answers the first
/// Login Request (what tgt's iSER target over siw now and then does): the
/// initiator gives up on that connection after a few seconds and logs in
/// on a new one, within its login timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_connection_is_retried() {
    logging();
    let (_, iser, _stop) = start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // First connection: MPA accepted, then silence.
        let (stream, _) = listener.accept().await.unwrap();
        let request = iscsi_iwarp::accept_request(stream, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        let params = iscsi_iwarp::ConnectParams {
            private_data: CmHeader::ours(true).emit().to_vec(),
            ..iscsi_iwarp::ConnectParams::default()
        };
        let silent = request
            .accept(
                params,
                vec![iscsi_iwarp::RecvRequest {
                    wr_id: 0,
                    buffer: vec![0; 16384],
                }],
            )
            .await
            .unwrap();
        // The rest: relayed byte for byte to the real iSER portal.
        loop {
            let (mut from, _) = listener.accept().await.unwrap();
            let mut to = tokio::net::TcpStream::connect(&iser).await.unwrap();
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut from, &mut to).await;
            });
            let _ = &silent;
        }
    });
    let url: IscsiUrl = format!("iser://{front}/{TARGET}/0").parse().unwrap();
    let started = std::time::Instant::now();
    let session = Session::connect(&url, SessionConfig::default())
        .await
        .expect("the login succeeds on a second connection");
    assert!(started.elapsed() >= std::time::Duration::from_secs(3));
    session.inquiry(0).await.expect("INQUIRY");
    session.logout().await.unwrap();
}

/// A peer that opens with an iSER Hello (RFC 7145 9.3, the RFC 5046 style)
/// gets a HelloReply (9.4) naming version 10, and can then log in over the
/// same stream; a Hello that offers no version 10 is refused with REJ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_is_answered_with_hello_reply() {
    use iscsi_datamover::iser::IserHeader;
    use iscsi_iwarp::{RecvRequest, SendOp, SendRequest, Sge};
    logging();
    let (_, iser, _stop) = start().await;
    for (version, reject) in [(0xAA, false), (0x22, true)] {
        let stream = tokio::net::TcpStream::connect(&iser).await.unwrap();
        let params = iscsi_iwarp::ConnectParams {
            private_data: CmHeader::ours(true).emit().to_vec(),
            ..iscsi_iwarp::ConnectParams::default()
        };
        let receive = RecvRequest {
            wr_id: 1,
            buffer: vec![0; 16384],
        };
        let qp = iscsi_iwarp::connect(stream, params, vec![receive])
            .await
            .unwrap();
        let hello = IserHeader::Hello { version, ird: 4 }.emit();
        qp.post_send(SendRequest {
            wr_id: 7,
            signaled: false,
            op: SendOp::Send {
                data: vec![Sge::Bytes(bytes::Bytes::copy_from_slice(&hello))],
                solicited: false,
                invalidate: None,
            },
        })
        .unwrap();
        let reply = tokio::time::timeout(std::time::Duration::from_secs(5), qp.recv_cq().next())
            .await
            .expect("a HelloReply in time")
            .expect("a completion");
        let buffer = reply.buffer.expect("the receive buffer");
        match IserHeader::parse(&buffer[..reply.byte_len]).unwrap() {
            IserHeader::HelloReply {
                reject: rejected,
                version,
                ..
            } => {
                assert_eq!(rejected, reject, "Hello {version:#x}");
                assert_eq!(version, 0xAA);
            }
            other => panic!("expected a HelloReply, got {other:?}"),
        }
    }
}

/// A target that grants a command window far above the initiator's
/// receive buffers (1024 against 512): 700 reads at once all complete, the
/// initiator holding its commands in flight below its receives (so that no
/// response can find none posted, which would end the RDMA stream). On
/// loopback the reader keeps up even without that bound, so this checks
/// that the bound lets a wide window run, not the overrun itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_wider_than_the_receives_does_not_overrun_them() {
    logging();
    let (_, iser, _stop) = start_with_window(1024).await;
    let url: IscsiUrl = format!("iser://{iser}/{TARGET}/0").parse().unwrap();
    let session = Arc::new(
        Session::connect(&url, SessionConfig::default())
            .await
            .unwrap(),
    );
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..700u64 {
        let session = Arc::clone(&session);
        reads.spawn(async move { session.read(0, i % 1024, BLOCK, vec![0; 4096]).await });
    }
    while let Some(done) = reads.join_next().await {
        done.unwrap().expect("read");
    }
    session.logout().await.unwrap();
}
