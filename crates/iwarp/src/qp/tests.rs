//! Queue-pair tests that need the crate's insides (the loopback tests in
//! `tests/` see only the public API).

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use super::{EndOnPanic, QueuePair};
use crate::{ConnectParams, Error, RecvRequest, WcOpcode, WcStatus, accept_request, connect};

const T: Duration = Duration::from_secs(10);

/// A connected pair over 127.0.0.1: (active side, passive side).
async fn pair() -> (QueuePair, QueuePair) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let req = accept_request(s, T).await.unwrap();
        req.accept(ConnectParams::default(), Vec::new())
            .await
            .unwrap()
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let c = connect(s, ConnectParams::default(), Vec::new())
        .await
        .unwrap();
    (c, accept.await.unwrap())
}

/// A driver task that unwinds takes the stream down with it: the QP reports
/// `Error::Internal` naming the task, and what was posted is flushed, so
/// that its user is not left waiting on a stream nobody reads or writes.
#[tokio::test]
async fn a_panicking_driver_task_ends_the_stream() {
    let (qp, _peer) = pair().await;
    qp.post_recv(RecvRequest {
        wr_id: 7,
        buffer: vec![0; 64],
    })
    .unwrap();
    assert!(qp.error().is_none(), "the stream is up before the panic");

    let guard = EndOnPanic(qp.shared.clone(), "test");
    let task = tokio::spawn(async move {
        let _guard = guard;
        panic!("a bug in a driver task");
    });
    assert!(task.await.unwrap_err().is_panic());

    match qp.error() {
        Some(Error::Internal(what)) => assert!(what.contains("test task"), "{what}"),
        other => panic!("expected Error::Internal, got {other:?}"),
    }
    let c = tokio::time::timeout(T, qp.recv_cq().next())
        .await
        .expect("the flushed receive in time")
        .expect("a completion before the queue's end");
    assert_eq!(c.wr_id, 7);
    assert_eq!(c.opcode, WcOpcode::Recv);
    assert_eq!(c.status, WcStatus::Flushed);
    tokio::time::timeout(T, qp.closed())
        .await
        .expect("the stream ended");
}
