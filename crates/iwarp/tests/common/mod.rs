//! Helpers shared by the loopback tests: a QP pair over 127.0.0.1, and a
//! raw TCP peer that speaks MPA by hand and then sends whatever bytes a
//! test wants (the bad peer).
#![allow(dead_code, missing_docs)]

use std::time::Duration;

use iscsi_iwarp::fpdu::{self, Encoder};
use iscsi_iwarp::wire::ddp::{Buffer, DdpRepr};
use iscsi_iwarp::wire::mpa::{IrdOrdRepr, StartFrameRepr};
use iscsi_iwarp::wire::rdmap::{CtrlRepr, Opcode, TerminateRepr};
use iscsi_iwarp::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const T: Duration = Duration::from_secs(10);

pub fn recvs(n: usize, size: usize) -> Vec<RecvRequest> {
    (0..n)
        .map(|i| RecvRequest {
            wr_id: 1000 + i as u64,
            buffer: vec![0; size],
        })
        .collect()
}

/// A connected pair: (active side, passive side).
pub async fn pair_with(
    client: ConnectParams,
    server: ConnectParams,
    client_recvs: Vec<RecvRequest>,
    server_recvs: Vec<RecvRequest>,
) -> (QueuePair, QueuePair) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let req = accept_request(s, T).await.unwrap();
        req.accept(server, server_recvs).await.unwrap()
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let c = connect(s, client, client_recvs).await.unwrap();
    (c, accept.await.unwrap())
}

pub async fn pair(client_recvs: usize, server_recvs: usize) -> (QueuePair, QueuePair) {
    pair_with(
        ConnectParams::default(),
        ConnectParams::default(),
        recvs(client_recvs, 65536),
        recvs(server_recvs, 65536),
    )
    .await
}

pub async fn next(cq: &CompletionQueue) -> Completion {
    tokio::time::timeout(T, cq.next())
        .await
        .expect("completion in time")
        .expect("a completion")
}

pub fn send(wr_id: u64, data: Vec<Sge>) -> SendRequest {
    SendRequest {
        wr_id,
        signaled: true,
        op: SendOp::Send {
            data,
            solicited: false,
            invalidate: None,
        },
    }
}

pub fn bytes(b: &[u8]) -> Sge {
    Sge::Bytes(bytes::Bytes::copy_from_slice(b))
}

/// A start-up frame by hand.
pub fn frame(
    reply: bool,
    flags_crc: bool,
    markers: bool,
    words: Option<IrdOrdRepr>,
    pd: &[u8],
) -> Vec<u8> {
    let pd_len = pd.len() + if words.is_some() { 4 } else { 0 };
    let hdr = StartFrameRepr {
        reply,
        markers,
        crc: flags_crc,
        reject: false,
        enhanced: words.is_some(),
        revision: 2,
        pd_len: pd_len as u16,
    };
    let mut b = vec![0u8; 20 + pd_len];
    hdr.emit(&mut b);
    if let Some(w) = words {
        w.emit(&mut b[20..]);
    }
    b[20 + pd_len - pd.len()..].copy_from_slice(pd);
    b
}

/// Reads one start-up frame and its private data.
pub async fn read_frame(s: &mut TcpStream) -> (StartFrameRepr, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).await.unwrap();
    let hdr = StartFrameRepr::parse(&h).unwrap();
    let mut pd = vec![0u8; hdr.pd_len as usize];
    s.read_exact(&mut pd).await.unwrap();
    (hdr, pd)
}

/// A raw initiator connected to one of our QPs (the passive side), with CRC as `crc`.
pub async fn raw_peer(
    server: ConnectParams,
    server_recvs: Vec<RecvRequest>,
) -> (TcpStream, QueuePair) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let req = accept_request(s, T).await.unwrap();
        req.accept(server, server_recvs).await.unwrap()
    });
    let mut raw = TcpStream::connect(addr).await.unwrap();
    let words = IrdOrdRepr {
        ird: 4,
        ord: 4,
        ..Default::default()
    };
    raw.write_all(&frame(false, true, false, Some(words), &[]))
        .await
        .unwrap();
    let (hdr, _) = read_frame(&mut raw).await;
    assert!(hdr.reply && hdr.crc && !hdr.reject);
    (raw, accept.await.unwrap())
}

pub fn untagged(op: Opcode, last: bool, ulp: u32, qn: u32, msn: u32, mo: u32) -> DdpRepr {
    DdpRepr {
        last,
        version: 1,
        ulp_ctrl: CtrlRepr::byte(op),
        buffer: Buffer::Untagged { ulp, qn, msn, mo },
    }
}

pub fn tagged(op: Opcode, stag: u32, to: u64) -> DdpRepr {
    DdpRepr {
        last: true,
        version: 1,
        ulp_ctrl: CtrlRepr::byte(op),
        buffer: Buffer::Tagged { stag, to },
    }
}

pub fn fpdu(hdr: &DdpRepr, extra: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder { crc: true }.push(&mut out, hdr, extra, &[payload]);
    out
}

/// Reads from the raw peer until EOF and returns the Terminate it got.
pub async fn read_terminate(raw: &mut TcpStream) -> TerminateRepr {
    let mut all = Vec::new();
    tokio::time::timeout(T, raw.read_to_end(&mut all))
        .await
        .expect("EOF in time")
        .unwrap();
    let mut at = 0;
    while let Some((seg, n)) = fpdu::decode(&all[at..], true).expect("our FPDUs are valid") {
        if seg.opcode == Opcode::Terminate {
            return TerminateRepr::parse(seg.payload).unwrap();
        }
        at += n;
    }
    panic!("no Terminate in {} bytes", all.len());
}
