//! A raw TCP peer that breaks one rule each: our QP must end the stream
//! with the Terminate RFC 5040 §4.8 asks for and a clear error.

mod common;

use common::*;
use iscsi_iwarp::error::{Layer, ddp_code, llp_code, rdmap_code};
use iscsi_iwarp::wire::mpa::IrdOrdRepr;
use iscsi_iwarp::wire::rdmap::{Opcode, ReadRequestRepr};
use iscsi_iwarp::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `bytes` from a raw peer and checks the Terminate and our error.
async fn expect_terminate(
    server_recvs: usize,
    setup: impl FnOnce(&QueuePair) -> Vec<u8>,
    layer: u8,
    etype: u8,
    code: u8,
) {
    let pieces = |qp: &QueuePair| vec![setup(qp)];
    expect_terminate_in_pieces(server_recvs, pieces, layer, etype, code).await;
}

/// [`expect_terminate`] with the bytes written in pieces, a pause between
/// them (so that the reader sees a segment begin before its end arrives).
async fn expect_terminate_in_pieces(
    server_recvs: usize,
    setup: impl FnOnce(&QueuePair) -> Vec<Vec<u8>>,
    layer: u8,
    etype: u8,
    code: u8,
) {
    let params = ConnectParams {
        ird: 1,
        ..Default::default()
    };
    let (mut raw, qp) = raw_peer(params, recvs(server_recvs, 64)).await;
    for (i, piece) in setup(&qp).iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        raw.write_all(piece).await.unwrap();
    }
    let t = read_terminate(&mut raw).await;
    assert_eq!((t.layer, t.etype, t.code), (layer, etype, code));
    let Some(Error::LocalTerminate(r)) = qp.error() else {
        panic!("{:?}", qp.error())
    };
    assert_eq!(
        (r.layer as u8, r.etype, r.code),
        (layer, etype, code),
        "{r}"
    );
    assert!(tokio::time::timeout(T, qp.recv_cq().next()).await.is_ok());
}

fn send_fpdu(msn: u32, mo: u32, last: bool, payload: &[u8]) -> Vec<u8> {
    fpdu(&untagged(Opcode::Send, last, 0, 0, msn, mo), &[], payload)
}

#[tokio::test]
async fn bad_crc() {
    expect_terminate(
        1,
        |_| {
            let mut b = send_fpdu(1, 0, true, b"abcd");
            let n = b.len();
            b[n - 1] ^= 0xff;
            b
        },
        Layer::Llp as u8,
        0,
        llp_code::CRC,
    )
    .await;
}

/// A bad CRC on large RDMA Writes read from the socket straight into
/// their region (the first begun before its end arrived, the next ones in
/// the run that follows it).
#[tokio::test]
async fn bad_crc_in_directly_placed_writes() {
    for bad in [0usize, 2] {
        expect_terminate_in_pieces(
            1,
            |qp| {
                let mr = qp.pd().register(vec![0; 3 << 15], Access::REMOTE_WRITE);
                let mut run = Vec::new();
                for i in 0..3u64 {
                    let payload = vec![i as u8 + 1; 1 << 15];
                    let to = mr.addr() + (i << 15);
                    let mut b = fpdu(&tagged(Opcode::Write, mr.stag(), to), &[], &payload);
                    if i as usize == bad {
                        let n = b.len();
                        b[n - 1] ^= 0xff;
                    }
                    run.extend_from_slice(&b);
                }
                let rest = run.split_off(100);
                vec![run, rest]
            },
            Layer::Llp as u8,
            0,
            llp_code::CRC,
        )
        .await;
    }
}

#[tokio::test]
async fn send_without_receive() {
    expect_terminate(
        0,
        |_| send_fpdu(1, 0, true, b"abcd"),
        1,
        2,
        ddp_code::U_NO_BUFFER,
    )
    .await;
}

#[tokio::test]
async fn send_longer_than_the_buffer() {
    expect_terminate(
        1,
        |_| send_fpdu(1, 0, true, &[0; 65]),
        1,
        2,
        ddp_code::U_TOO_LONG,
    )
    .await;
}

#[tokio::test]
async fn bad_msn() {
    expect_terminate(
        1,
        |_| send_fpdu(2, 0, true, b"x"),
        1,
        2,
        ddp_code::U_MSN_RANGE,
    )
    .await;
}

#[tokio::test]
async fn bad_mo() {
    expect_terminate(
        1,
        |_| {
            let mut b = send_fpdu(1, 0, false, b"abcd");
            b.extend(send_fpdu(1, 5, true, b"x"));
            b
        },
        1,
        2,
        ddp_code::U_INVALID_MO,
    )
    .await;
}

#[tokio::test]
async fn bad_qn() {
    expect_terminate(
        1,
        |_| fpdu(&untagged(Opcode::Send, true, 0, 9, 1, 0), &[], b"x"),
        1,
        2,
        ddp_code::U_INVALID_QN,
    )
    .await;
}

#[tokio::test]
async fn bad_ddp_version() {
    expect_terminate(
        1,
        |_| {
            let mut h = untagged(Opcode::Send, true, 0, 0, 1, 0);
            h.version = 2;
            fpdu(&h, &[], b"x")
        },
        1,
        2,
        ddp_code::U_VERSION,
    )
    .await;
}

#[tokio::test]
async fn bad_rdmap_version() {
    expect_terminate(
        1,
        |_| {
            let mut h = untagged(Opcode::Send, true, 0, 0, 1, 0);
            h.ulp_ctrl = 0x83;
            fpdu(&h, &[], b"x")
        },
        0,
        2,
        rdmap_code::VERSION,
    )
    .await;
}

#[tokio::test]
async fn impossible_fpdu_length() {
    // ULPDU_Length 1: no room even for the DDP control word (with a right CRC).
    let mut b = vec![0, 1, 0x41, 0];
    b.extend_from_slice(&iscsi_crc32c::crc32c(&b).to_le_bytes());
    expect_terminate(1, move |_| b, 0, 2, rdmap_code::CATASTROPHIC_STREAM).await;
}

#[tokio::test]
async fn write_to_unknown_stag() {
    expect_terminate(
        1,
        |_| fpdu(&tagged(Opcode::Write, 0x1234_5601, 0), &[], b"x"),
        1,
        1,
        ddp_code::T_INVALID_STAG,
    )
    .await;
}

#[tokio::test]
async fn write_out_of_bounds() {
    expect_terminate(
        1,
        |qp| {
            let mr = qp.pd().register(vec![0; 16], Access::REMOTE_WRITE);
            fpdu(
                &tagged(Opcode::Write, mr.stag(), mr.addr() + 10),
                &[],
                &[0; 7],
            )
        },
        1,
        1,
        ddp_code::T_BASE_BOUNDS,
    )
    .await;
}

#[tokio::test]
async fn write_without_access() {
    expect_terminate(
        1,
        |qp| {
            let mr = qp.pd().register(vec![0; 16], Access::REMOTE_READ);
            fpdu(&tagged(Opcode::Write, mr.stag(), mr.addr()), &[], &[0; 4])
        },
        0,
        1,
        rdmap_code::ACCESS_RIGHTS,
    )
    .await;
}

fn read_request(msn: u32, src_stag: u32, src_to: u64, size: u32) -> Vec<u8> {
    let rr = ReadRequestRepr {
        sink_stag: 0x100,
        sink_to: 0,
        size,
        src_stag,
        src_to,
    };
    let mut extra = [0u8; 28];
    rr.emit(&mut extra);
    fpdu(
        &untagged(Opcode::ReadRequest, true, 0, 1, msn, 0),
        &extra,
        &[],
    )
}

#[tokio::test]
async fn read_request_beyond_ird() {
    // IRD is 1, raised to the raw peer's ORD of 4 by the reply rule; send 5 that cannot all be answered
    // before the fifth is parsed (they arrive in one segment).
    expect_terminate(
        1,
        |qp| {
            let mr = qp.pd().register(vec![0; 1 << 20], Access::REMOTE_READ);
            (1..=5)
                .flat_map(|m| read_request(m, mr.stag(), mr.addr(), 1 << 20))
                .collect()
        },
        1,
        2,
        ddp_code::U_NO_BUFFER,
    )
    .await;
}

#[tokio::test]
async fn read_request_without_remote_read() {
    expect_terminate(
        1,
        |qp| {
            let mr = qp.pd().register(vec![0; 64], Access::REMOTE_WRITE);
            read_request(1, mr.stag(), mr.addr(), 64)
        },
        0,
        1,
        rdmap_code::ACCESS_RIGHTS,
    )
    .await;
}

#[tokio::test]
async fn invalidate_unknown_stag() {
    expect_terminate(
        1,
        |_| {
            fpdu(
                &untagged(Opcode::SendInvalidate, true, 0x77_7701, 0, 1, 0),
                &[],
                b"x",
            )
        },
        0,
        2,
        rdmap_code::CANNOT_INVALIDATE,
    )
    .await;
}

#[tokio::test]
async fn read_response_with_no_read() {
    expect_terminate(
        1,
        |qp| {
            let mr = qp.pd().register(vec![0; 64], Access::LOCAL_WRITE);
            fpdu(
                &tagged(Opcode::ReadResponse, mr.stag(), mr.addr()),
                &[],
                b"x",
            )
        },
        0,
        2,
        rdmap_code::OPCODE,
    )
    .await;
}

#[tokio::test]
async fn peer_terminate_is_reported() {
    let (mut raw, qp) = raw_peer(ConnectParams::default(), recvs(1, 64)).await;
    let t = iscsi_iwarp::wire::rdmap::TerminateRepr {
        layer: 1,
        etype: 2,
        code: 2,
        m: false,
        d: false,
        r: false,
    };
    let mut extra = [0u8; 4];
    t.emit(&mut extra);
    raw.write_all(&fpdu(
        &untagged(Opcode::Terminate, true, 0, 2, 1, 0),
        &extra,
        &[],
    ))
    .await
    .unwrap();
    tokio::time::timeout(T, qp.closed()).await.unwrap();
    let Some(Error::RemoteTerminate(r)) = qp.error() else {
        panic!("{:?}", qp.error())
    };
    assert_eq!((r.layer, r.etype, r.code), (Layer::Ddp, 2, 2));
    let f = next(qp.recv_cq()).await;
    assert_eq!(f.status, WcStatus::Flushed);
    assert!(qp.recv_cq().next().await.is_none());
}

#[tokio::test]
async fn markers_are_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        accept_request(s, T).await.err()
    });
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw.write_all(&frame(false, false, true, Some(IrdOrdRepr::default()), &[]))
        .await
        .unwrap();
    let (reply, _) = read_frame(&mut raw).await;
    assert!(reply.reply && reply.reject);
    assert!(matches!(server.await.unwrap(), Some(Error::Mpa(_))));
}

#[tokio::test]
async fn reply_with_markers_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let raw = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        read_frame(&mut s).await;
        s.write_all(&frame(true, false, true, Some(IrdOrdRepr::default()), &[]))
            .await
            .unwrap();
        s
    });
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let e = connect(s, ConnectParams::default(), vec![]).await.err();
    assert!(matches!(e, Some(Error::Mpa(_))), "{e:?}");
    drop(raw.await);
}

#[tokio::test]
async fn not_a_start_frame_and_early_bytes() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let e1 = accept_request(s, T).await.err();
        let (s, _) = listener.accept().await.unwrap();
        let req = accept_request(s, T).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let e2 = req.accept(ConnectParams::default(), vec![]).await.err();
        let (s, _) = listener.accept().await.unwrap();
        let e3 = accept_request(s, std::time::Duration::from_millis(100))
            .await
            .err();
        (e1, e2, e3)
    });
    let mut a = tokio::net::TcpStream::connect(addr).await.unwrap();
    a.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut b = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = frame(false, false, false, None, &[]);
    req.extend_from_slice(b"early");
    b.write_all(&req).await.unwrap();
    let _c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (e1, e2, e3) = server.await.unwrap();
    assert!(matches!(e1, Some(Error::Mpa(_))), "{e1:?}");
    assert!(matches!(e2, Some(Error::Mpa(_))), "{e2:?}");
    assert_eq!(e3, Some(Error::Timeout));
    let mut rest = Vec::new();
    let _ = a.read_to_end(&mut rest).await;
}

#[tokio::test]
async fn revision_1_and_peer_to_peer_requests() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut qps = Vec::new();
        for _ in 0..2 {
            let (s, _) = listener.accept().await.unwrap();
            let req = accept_request(s, T).await.unwrap();
            let p2p = req.peer_to_peer();
            let peer = req.peer().clone();
            let qp = req
                .accept(
                    ConnectParams {
                        private_data: b"ok".to_vec(),
                        crc: false,
                        ..Default::default()
                    },
                    vec![],
                )
                .await
                .unwrap();
            qps.push((peer, p2p, qp));
        }
        qps
    });
    // Revision 1: no IRD/ORD words either way.
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = frame(false, false, false, None, b"abc");
    req[17] = 1;
    raw.write_all(&req).await.unwrap();
    let (reply, pd) = read_frame(&mut raw).await;
    assert_eq!(
        (reply.revision, reply.enhanced, reply.crc),
        (1, false, false)
    );
    assert_eq!(pd, b"ok");
    // Peer-to-peer asked: accepted in client-server mode (P clear in the reply).
    let mut raw2 = tokio::net::TcpStream::connect(addr).await.unwrap();
    let words = IrdOrdRepr {
        p2p: true,
        send_rtr: true,
        ird: 8,
        ord: 8,
        ..Default::default()
    };
    raw2.write_all(&frame(false, false, false, Some(words), b"xyz"))
        .await
        .unwrap();
    let (reply, pd) = read_frame(&mut raw2).await;
    assert!(reply.enhanced);
    let w = IrdOrdRepr::parse(&pd).unwrap();
    assert!(!w.p2p && !w.send_rtr);
    assert_eq!(&pd[4..], b"ok");
    let qps = server.await.unwrap();
    assert_eq!(
        (
            qps[0].0.revision,
            qps[0].0.private_data.as_slice(),
            qps[0].1
        ),
        (1, &b"abc"[..], false)
    );
    assert_eq!(
        (
            qps[1].0.revision,
            qps[1].0.private_data.as_slice(),
            qps[1].1
        ),
        (2, &b"xyz"[..], true)
    );
}

#[tokio::test]
async fn dropping_the_last_handle_closes_the_stream() {
    let (mut raw, qp) = raw_peer(ConnectParams::default(), vec![]).await;
    drop(qp);
    let mut rest = Vec::new();
    tokio::time::timeout(T, raw.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn reply_with_ord_above_our_ird_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let raw = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        read_frame(&mut s).await;
        let words = IrdOrdRepr {
            ird: 1,
            ord: 64,
            ..Default::default()
        };
        s.write_all(&frame(true, true, false, Some(words), &[]))
            .await
            .unwrap();
        read_terminate(&mut s).await
    });
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let e = connect(
        s,
        ConnectParams {
            ird: 4,
            ..Default::default()
        },
        vec![],
    )
    .await
    .err();
    assert!(matches!(e, Some(Error::Mpa(_))), "{e:?}");
    let t = raw.await.unwrap();
    assert_eq!(
        (t.layer, t.etype, t.code),
        (2, 0, llp_code::INSUFFICIENT_IRD)
    );
}
