//! The queue pair: the state of one RDMA stream and its thin tokio driver,
//! one task reading and one writing (RFC 5040 §5-§6 semantics over the
//! [`crate::fpdu`] core).
//!
//! | file | what |
//! |---|---|
//! | `qp/mod.rs` | [`QueuePair`]'s API: starting the stream's two tasks, posting, polling, ending |
//! | `qp/shared.rs` | the stream's state, how it ends (`fail`), and what each received segment means (`handle`: placement rules, Read Requests and Responses, Terminate) |
//! | `qp/rx.rs` | the reading task: FPDUs out of the receive buffer, and large tagged payloads read from the socket straight into their region |
//! | `qp/tx.rs` | the writing task: what is queued planned into FPDUs, encoded, and written with vectored writes |
//!
//! The writer gathers everything queued (Read Responses first, then the
//! send queue in order) into one scratch buffer of FPDUs, at most
//! [`BATCH_BYTES`] of payload, and writes it with one system call; the
//! reader reads [`RX_BUF`]-byte chunks and handles every whole FPDU in
//! them. Placement happens on the reading task, in stream order, which is
//! what makes a Send complete only after the Writes before it were placed.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};

use crate::error::Error;
use crate::fpdu::Reassembly;
use crate::mr::{Access, ProtectionDomain};
use crate::verbs::{CompletionQueue, QpCaps, RecvRequest, SendOp, SendRequest, Sge};

mod rx;
mod shared;
mod tx;

#[cfg(test)]
mod tests;
pub use shared::PeerParams;
use shared::{Shared, State};

/// One established RDMA stream (Clone: handles to the same QP). When the
/// last handle is dropped the stream is closed at once (what is still
/// queued is flushed): call [`QueuePair::disconnect`] for a graceful end.
#[derive(Clone)]
pub struct QueuePair {
    shared: Arc<Shared>,
    _owner: Arc<Owner>,
}

/// Ends the stream when the last user handle goes (the driver tasks hold
/// `Shared`, so without this a forgotten QP would keep its socket open).
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.fail(Error::Closed, None);
    }
}

/// Ends the stream with [`Error::Internal`] when a driver task unwinds:
/// tokio outlives a panicking task, and a stream whose reader or writer is
/// gone must fail its requests and tell its user, not go silent.
struct EndOnPanic(Arc<Shared>, &'static str);

impl Drop for EndOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let what = format!("the {} task of this stream panicked", self.1);
            self.0.fail(Error::Internal(what), None);
        }
    }
}

/// What the connection manager agreed, for [`QueuePair::start`].
pub(crate) struct Agreed {
    pub peer: PeerParams,
    pub caps: QpCaps,
    pub ird: u16,
    pub ord: u16,
    pub mulpdu: usize,
}

impl QueuePair {
    /// Starts the driver tasks on an established stream.
    pub(crate) fn start(
        stream: TcpStream,
        agreed: Agreed,
        recvs: Vec<RecvRequest>,
    ) -> Result<Self, Error> {
        let local_addr = stream.local_addr()?;
        let peer_addr = stream.peer_addr()?;
        let (rd, wr) = stream.into_split();
        let (ended, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            pd: ProtectionDomain::new(),
            send_cq: CompletionQueue::default(),
            recv_cq: CompletionQueue::default(),
            state: Mutex::new(State {
                sq: VecDeque::new(),
                head_done: 0,
                head_msn: None,
                sq_outstanding: 0,
                reads_out: VecDeque::new(),
                rq: recvs.into_iter().collect(),
                responses: VecDeque::new(),
                msn_tx: [1; 3],
                reasm: Reassembly::default(),
                error: None,
                terminate_out: None,
                closing: false,
            }),
            tx_wake: Notify::new(),
            ended,
            crc: agreed.peer.crc,
            peer: agreed.peer,
            local_addr,
            peer_addr,
            caps: agreed.caps,
            ird: usize::from(agreed.ird),
            ord: usize::from(agreed.ord),
            mulpdu: AtomicUsize::new(agreed.mulpdu),
            aligned: AtomicBool::new(false),
        });
        let rx_guard = EndOnPanic(shared.clone(), "receive");
        tokio::spawn(async move {
            rx::rx_task(rx_guard.0.clone(), rd).await;
            drop(rx_guard);
        });
        let tx_guard = EndOnPanic(shared.clone(), "send");
        tokio::spawn(async move {
            tx::tx_task(tx_guard.0.clone(), wr).await;
            drop(tx_guard);
        });
        Ok(QueuePair {
            _owner: Arc::new(Owner(shared.clone())),
            shared,
        })
    }

    /// Posts a send-queue request. `Err(Error::QueueFull)` when
    /// `max_send_wr` requests are not yet completed; the stream's error
    /// after it ended. Requests go on the wire in the order posted; RDMA
    /// Read Requests beyond the agreed ORD wait in order (and what follows
    /// them waits too, as on an RNIC's send queue). Completion: Send/Write
    /// = handed to the socket; Read = all bytes placed. Local buffers are
    /// checked now: a bad one is `Error::Misuse`.
    pub fn post_send(&self, request: SendRequest) -> Result<(), Error> {
        let s = &self.shared;
        match &request.op {
            SendOp::Send { data, .. } => {
                for sge in data {
                    check_sge(&s.pd, sge)?;
                }
                let len: usize = data.iter().map(Sge::len).sum();
                if len > u32::MAX as usize {
                    return Err(Error::Misuse("a Send beyond 4 GiB".into()));
                }
            }
            SendOp::RdmaWrite { data, .. } => {
                for sge in data {
                    check_sge(&s.pd, sge)?;
                }
            }
            SendOp::RdmaRead { local, .. } => {
                s.pd.check_local(local.stag, local.offset, local.len, Access::LOCAL_WRITE)
                    .map_err(Error::Misuse)?;
                if local.len > u32::MAX as usize {
                    return Err(Error::Misuse("an RDMA Read beyond 4 GiB".into()));
                }
                if s.ord == 0 {
                    return Err(Error::Misuse("RDMA Read with an agreed ORD of 0".into()));
                }
            }
            SendOp::LocalInvalidate { .. } => {}
        }
        let mut st = s.lock();
        if let Some(e) = &st.error {
            return Err(e.clone());
        }
        if st.closing {
            return Err(Error::Closed);
        }
        if st.sq_outstanding >= s.caps.max_send_wr {
            return Err(Error::QueueFull);
        }
        st.sq_outstanding += 1;
        st.sq.push_back(request);
        drop(st);
        s.tx_wake.notify_one();
        Ok(())
    }

    /// Posts a receive buffer. A peer Send that finds no posted buffer, or
    /// is longer than the buffer, is fatal: Terminate (DDP untagged error)
    /// to the peer, QP to error.
    pub fn post_recv(&self, request: RecvRequest) -> Result<(), Error> {
        let mut st = self.shared.lock();
        if let Some(e) = &st.error {
            return Err(e.clone());
        }
        if st.rq.len() >= self.shared.caps.max_recv_wr {
            return Err(Error::QueueFull);
        }
        st.rq.push_back(request);
        Ok(())
    }

    /// The send queue's completions.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.shared.send_cq
    }
    /// The receive queue's completions.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.shared.recv_cq
    }
    /// The QP's protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.shared.pd
    }
    /// What the peer said in the MPA exchange and what was agreed.
    pub fn peer(&self) -> &PeerParams {
        &self.shared.peer
    }
    /// Our address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }
    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.shared.peer_addr
    }
    /// Inbound RDMA Read Requests accepted outstanding (the IRD we stated).
    pub fn ird(&self) -> u16 {
        self.shared.ird as u16
    }
    /// Outbound RDMA Read Requests issued outstanding (min of our ORD and the peer's IRD).
    pub fn ord(&self) -> u16 {
        self.shared.ord as u16
    }
    /// The largest ULPDU this side sends (from the MSS).
    pub fn max_ulpdu(&self) -> usize {
        self.shared.mulpdu.load(Ordering::Relaxed)
    }
    /// Sets the largest ULPDU this side sends (clamped to 64..=65534, made
    /// 4-aligned): for a path whose MSS the local socket does not see (a
    /// NAT or proxy in between: RFC 5044 8 wants FPDUs that fit the path's
    /// segments), and for tests that force many small segments.
    pub fn set_max_ulpdu(&self, n: usize) {
        let n = n.clamp(64, crate::wire::mpa::MAX_ULPDU);
        self.shared
            .mulpdu
            .store(((n + 2) & !3) - 2, Ordering::Relaxed);
        self.shared.aligned.store(true, Ordering::Relaxed);
    }
    /// Why the stream ended, once it has.
    pub fn error(&self) -> Option<Error> {
        self.shared.lock().error.clone()
    }
    /// Graceful close: what is posted is written, then the TCP stream is
    /// shut down; outstanding reads and receives are flushed.
    pub async fn disconnect(&self) {
        {
            let mut st = self.shared.lock();
            st.closing = true;
        }
        self.shared.tx_wake.notify_one();
        self.closed().await;
    }
    /// Waits until the stream has ended for any reason.
    pub async fn closed(&self) {
        let mut rx = self.shared.ended.subscribe();
        let _ = rx.wait_for(|e| *e).await;
    }
}

fn check_sge(pd: &ProtectionDomain, sge: &Sge) -> Result<(), Error> {
    match sge {
        Sge::Bytes(_) => Ok(()),
        Sge::Region(r) => pd
            .check_local(r.stag, r.offset, r.len, Access::NONE)
            .map_err(Error::Misuse),
    }
}
