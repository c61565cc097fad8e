//! The queue pair: the state of one RDMA stream and its thin tokio driver,
//! one task reading and one writing (RFC 5040 §5-§6 semantics over the
//! [`crate::fpdu`] core).
//!
//! | file | what |
//! |---|---|
//! | `qp/mod.rs` | [`QueuePair`]'s API, the stream's state, how it ends (`fail`), and what each received segment means (`handle`: placement rules, Read Requests and Responses, Terminate) |
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
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};

use crate::error::{Error, Layer, TerminateReason, ddp_code, ddp_etype, rdmap_code, rdmap_etype};
use crate::fpdu::{Reassembly, Segment};
use crate::mr::{Access, ProtectionDomain, Refusal};
use crate::verbs::{
    Completion, CompletionQueue, QpCaps, RecvRequest, SendOp, SendRequest, Sge, WcOpcode, WcStatus,
};
use crate::wire::ddp::Buffer;
use crate::wire::rdmap::{Opcode, ReadRequestRepr, TerminateRepr};

mod rx;
mod tx;

#[cfg(test)]
mod tests;

/// The peer's side of the MPA exchange, and what was agreed (made by
/// `crate::cm`, kept by the queue pair).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerParams {
    /// The peer ULP's private data (IRD/ORD words removed).
    pub private_data: Vec<u8>,
    /// The peer's IRD as it stated it (our ORD when it stated none).
    pub ird: u16,
    /// The peer's ORD as it stated it (our IRD when it stated none).
    pub ord: u16,
    /// CRC in use on this stream (in a request not yet answered: the peer's wish).
    pub crc: bool,
    /// MPA revision the peer used (1 or 2).
    pub revision: u8,
}

/// Payload bytes the writer gathers into one write.
pub const BATCH_BYTES: usize = 1 << 20;
/// The reader's buffer: many FPDUs per read, and always room for a whole one.
pub const RX_BUF: usize = 256 * 1024;
const MAX_FPDU: usize = 65541;

/// Outbound RDMA Read in flight (its Request sent, Responses awaited).
struct PendingRead {
    wr_id: u64,
    signaled: bool,
    sink_stag: u32,
    sink_to: u64,
    len: usize,
    placed: usize,
}

/// An inbound RDMA Read Request being answered.
struct Response {
    src_stag: u32,
    src_offset: usize,
    sink_stag: u32,
    sink_to: u64,
    len: usize,
    done: usize,
}

struct State {
    sq: VecDeque<SendRequest>,
    /// Bytes of the send queue's head already written, and its MSN.
    head_done: usize,
    head_msn: Option<u32>,
    /// Send-queue requests posted and not yet completed.
    sq_outstanding: usize,
    reads_out: VecDeque<PendingRead>,
    rq: VecDeque<RecvRequest>,
    responses: VecDeque<Response>,
    msn_tx: [u32; 3],
    reasm: Reassembly,
    error: Option<Error>,
    terminate_out: Option<TerminateReason>,
    closing: bool,
}

pub(crate) struct Shared {
    pd: ProtectionDomain,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    state: Mutex<State>,
    tx_wake: Notify,
    ended: watch::Sender<bool>,
    peer: PeerParams,
    local_addr: SocketAddr,
    peer_addr: SocketAddr,
    caps: QpCaps,
    crc: bool,
    /// Inbound Read Requests we accept outstanding.
    ird: usize,
    /// Outbound Read Requests we issue outstanding.
    ord: usize,
    mulpdu: AtomicUsize,
    /// Each FPDU written on its own (set with an explicit MULPDU): so that,
    /// with Nagle off, every FPDU starts a TCP segment, as siw's own do
    /// (RFC 5044 section 8's alignment), at the cost of a system call each.
    aligned: AtomicBool,
}

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

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the stream: records why, flushes every request, wakes everyone.
    /// `terminate`: the Terminate the writer sends first, if it still can.
    fn fail(&self, error: Error, terminate: Option<TerminateReason>) {
        let mut st = self.lock();
        if st.error.is_some() {
            return;
        }
        match &error {
            Error::Closed => tracing::debug!("iWARP stream {} closed", self.peer_addr),
            e => tracing::warn!("iWARP stream {} ended: {e}", self.peer_addr),
        }
        st.error = Some(error);
        st.terminate_out = terminate;
        let flushed = |wr_id, opcode| Completion::new(wr_id, opcode, WcStatus::Flushed, 0);
        for r in st.sq.drain(..) {
            self.send_cq.push(flushed(r.wr_id, r.op.wc_opcode()));
        }
        for r in st.reads_out.drain(..) {
            self.send_cq.push(flushed(r.wr_id, WcOpcode::RdmaRead));
        }
        for r in st.rq.drain(..) {
            let mut c = flushed(r.wr_id, WcOpcode::Recv);
            c.buffer = Some(r.buffer);
            self.recv_cq.push(c);
        }
        st.responses.clear();
        st.sq_outstanding = 0;
        drop(st);
        self.send_cq.end();
        self.recv_cq.end();
        self.tx_wake.notify_one();
        self.ended.send_replace(true);
    }

    /// Ends the stream for `e`, sending the Terminate it carries when we
    /// are the ones terminating.
    fn fail_terminating(&self, e: Error) {
        let term = match &e {
            Error::LocalTerminate(r) => Some(r.clone()),
            _ => None,
        };
        self.fail(e, term);
    }

    /// Checks that a Read Response of `len` bytes at `to` of `stag`
    /// continues the oldest outstanding Read (RFC 5040 §4.4: responses
    /// come in order, into the requester's sink).
    fn check_read_response(&self, stag: u32, to: u64, len: usize) -> Result<(), Error> {
        let local = |r: TerminateReason| Error::LocalTerminate(r);
        {
            let st = self.lock();
            let Some(front) = st.reads_out.front() else {
                return Err(local(TerminateReason::rdmap(
                    rdmap_etype::REMOTE_OPERATION,
                    rdmap_code::OPCODE,
                    "RDMA Read Response with no Read Request outstanding",
                )));
            };
            if front.sink_stag != stag {
                return Err(local(TerminateReason::rdmap(
                    rdmap_etype::REMOTE_PROTECTION,
                    rdmap_code::STAG_NOT_ASSOCIATED,
                    format!(
                        "Read Response to STag {stag:#x}, the oldest Read's sink is {:#x}",
                        front.sink_stag
                    ),
                )));
            }
            let off = to.wrapping_sub(front.sink_to);
            if to < front.sink_to || off as usize != front.placed || front.placed + len > front.len
            {
                return Err(local(TerminateReason::rdmap(
                    rdmap_etype::REMOTE_PROTECTION,
                    rdmap_code::BASE_BOUNDS,
                    format!(
                        "Read Response of {len} bytes at TO {to:#x}: the Read has {} of {} bytes from {:#x}",
                        front.placed, front.len, front.sink_to
                    ),
                )));
            }
        }
        Ok(())
    }

    /// Accounts `len` bytes placed for the oldest Read; its last segment
    /// completes it.
    fn read_response_placed(&self, len: usize, last: bool) -> Result<(), Error> {
        let local = |r: TerminateReason| Error::LocalTerminate(r);
        let mut st = self.lock();
        let Some(front) = st.reads_out.front_mut() else {
            return Ok(());
        };
        front.placed += len;
        if last {
            if front.placed != front.len {
                let m = format!(
                    "Read Response ended after {} of {} bytes",
                    front.placed, front.len
                );
                return Err(local(TerminateReason::rdmap(
                    rdmap_etype::REMOTE_OPERATION,
                    rdmap_code::UNSPECIFIED,
                    m,
                )));
            }
            let r = st.reads_out.pop_front().expect("front exists");
            st.sq_outstanding = st.sq_outstanding.saturating_sub(1);
            drop(st);
            if r.signaled {
                self.send_cq.push(Completion::new(
                    r.wr_id,
                    WcOpcode::RdmaRead,
                    WcStatus::Success,
                    r.placed,
                ));
            }
            self.tx_wake.notify_one();
        }
        Ok(())
    }

    /// Handles one received segment, in stream order.
    fn handle(&self, seg: Segment<'_>) -> Result<(), Error> {
        let local = |r: TerminateReason| Error::LocalTerminate(r);
        match seg.opcode {
            Opcode::Write => {
                let Buffer::Tagged { stag, to } = seg.buffer else {
                    return Err(model_mismatch());
                };
                self.pd
                    .place(stag, to, seg.payload, Access::REMOTE_WRITE)
                    .map_err(|r| {
                        local(tagged_refusal(r, "RDMA Write", stag, to, seg.payload.len()))
                    })
            }
            Opcode::ReadResponse => {
                let Buffer::Tagged { stag, to } = seg.buffer else {
                    return Err(model_mismatch());
                };
                let len = seg.payload.len();
                self.check_read_response(stag, to, len)?;
                self.pd
                    .place(stag, to, seg.payload, Access::LOCAL_WRITE)
                    .map_err(|r| local(tagged_refusal(r, "RDMA Read Response", stag, to, len)))?;
                self.read_response_placed(len, seg.last)
            }
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                let Buffer::Untagged { ulp, .. } = seg.buffer else {
                    return Err(model_mismatch());
                };
                self.receive_send(&seg, ulp)
            }
            Opcode::ReadRequest => self.queue_read_response(&seg),
            Opcode::Terminate => Err(remote_terminate(seg.payload)),
        }
    }

    /// A Send's segment: copied into the oldest posted receive buffer at
    /// its message offset; the last one completes the receive (after the
    /// STag a Send with Invalidate names is invalidated).
    fn receive_send(&self, seg: &Segment<'_>, ulp: u32) -> Result<(), Error> {
        let local = |r: TerminateReason| Error::LocalTerminate(r);
        let mut st = self.lock();
        let p = st.reasm.accept(seg).map_err(local)?;
        let Some(recv) = st.rq.front_mut() else {
            return Err(local(TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_NO_BUFFER,
                "a Send found no posted receive buffer",
            )));
        };
        let end = p.mo + seg.payload.len();
        if end > recv.buffer.len() {
            return Err(local(TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_TOO_LONG,
                format!(
                    "a Send of at least {end} bytes for a {}-byte receive buffer",
                    recv.buffer.len()
                ),
            )));
        }
        recv.buffer[p.mo..end].copy_from_slice(seg.payload);
        if !p.last {
            return Ok(());
        }
        let invalidated = if seg.opcode.invalidates() {
            if !self.pd.invalidate(ulp) {
                return Err(local(TerminateReason::rdmap(
                    rdmap_etype::REMOTE_OPERATION,
                    rdmap_code::CANNOT_INVALIDATE,
                    format!("Send with Invalidate of STag {ulp:#x}, not a valid STag of ours"),
                )));
            }
            Some(ulp)
        } else {
            None
        };
        let mut recv = st.rq.pop_front().expect("front exists");
        drop(st);
        recv.buffer.truncate(end);
        let mut c = Completion::new(recv.wr_id, WcOpcode::Recv, WcStatus::Success, end);
        c.invalidated = invalidated;
        c.solicited = seg.opcode.solicited();
        c.buffer = Some(recv.buffer);
        self.recv_cq.push(c);
        Ok(())
    }

    /// An RDMA Read Request: checked against the IRD and the source
    /// region's bounds and rights now (a bad one terminates the stream at
    /// once), then queued for the writer, which sends Read Responses first.
    fn queue_read_response(&self, seg: &Segment<'_>) -> Result<(), Error> {
        let local = |r: TerminateReason| Error::LocalTerminate(r);
        let mut st = self.lock();
        st.reasm.accept(seg).map_err(local)?;
        let rr = ReadRequestRepr::parse(seg.payload).map_err(|_| {
            local(TerminateReason::malformed(format!(
                "an RDMA Read Request with {} header bytes",
                seg.payload.len()
            )))
        })?;
        let queued = st.responses.len();
        if queued >= self.ird {
            return Err(local(TerminateReason::ddp(
                ddp_etype::UNTAGGED,
                ddp_code::U_NO_BUFFER,
                format!("RDMA Read Request beyond the IRD of {}", self.ird),
            )));
        }
        let len = rr.size as usize;
        let src_offset = self
            .pd
            .check_remote_read(rr.src_stag, rr.src_to, len)
            .map_err(|r| {
                let code = match r {
                    Refusal::InvalidStag => rdmap_code::INVALID_STAG,
                    Refusal::Bounds => rdmap_code::BASE_BOUNDS,
                    Refusal::Access => rdmap_code::ACCESS_RIGHTS,
                };
                local(TerminateReason::rdmap(
                    rdmap_etype::REMOTE_PROTECTION,
                    code,
                    format!(
                        "RDMA Read of {len} bytes at STag {:#x} TO {:#x}: {r:?}",
                        rr.src_stag, rr.src_to
                    ),
                ))
            })?;
        st.responses.push_back(Response {
            src_stag: rr.src_stag,
            src_offset,
            sink_stag: rr.sink_stag,
            sink_to: rr.sink_to,
            len,
            done: 0,
        });
        drop(st);
        self.tx_wake.notify_one();
        Ok(())
    }
}

/// The error a Terminate from the peer ends the stream with (a payload
/// too short for its control word is ours to terminate).
fn remote_terminate(payload: &[u8]) -> Error {
    let Ok(t) = TerminateRepr::parse(payload) else {
        return Error::LocalTerminate(TerminateReason::malformed(
            "a Terminate without its control word",
        ));
    };
    let layer = Layer::from_code(t.layer).unwrap_or(Layer::Rdmap);
    Error::RemoteTerminate(TerminateReason::new(
        layer,
        t.etype,
        t.code,
        format!("Terminate from the peer (layer code {})", t.layer),
    ))
}

fn model_mismatch() -> Error {
    Error::LocalTerminate(TerminateReason::malformed(
        "buffer model does not match the opcode",
    ))
}

fn tagged_refusal(r: Refusal, what: &str, stag: u32, to: u64, len: usize) -> TerminateReason {
    let m = format!("{what} of {len} bytes to STag {stag:#x} TO {to:#x}: {r:?}");
    match r {
        Refusal::InvalidStag => {
            TerminateReason::ddp(ddp_etype::TAGGED, ddp_code::T_INVALID_STAG, m)
        }
        Refusal::Bounds => TerminateReason::ddp(ddp_etype::TAGGED, ddp_code::T_BASE_BOUNDS, m),
        Refusal::Access => {
            TerminateReason::rdmap(rdmap_etype::REMOTE_PROTECTION, rdmap_code::ACCESS_RIGHTS, m)
        }
    }
}
