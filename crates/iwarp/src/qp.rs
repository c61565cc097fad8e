//! The queue pair: the state of one RDMA stream and its thin tokio driver,
//! one task reading and one writing (RFC 5040 §5-§6 semantics over the
//! [`crate::fpdu`] core).
//!
//! The writer gathers everything queued (Read Responses first, then the
//! send queue in order) into one scratch buffer of FPDUs, at most
//! [`BATCH_BYTES`] of payload, and writes it with one system call; the
//! reader reads [`RX_BUF`]-byte chunks and handles every whole FPDU in
//! them. Placement happens on the reading task, in stream order, which is
//! what makes a Send complete only after the Writes before it were placed.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use iscsi_crc32c::Crc32c;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, watch};

use crate::error::{Error, Layer, TerminateReason, ddp_code, ddp_etype, rdmap_code, rdmap_etype};
use crate::fpdu::{self, Encoder, Reassembly, Segment};
use crate::mr::{Access, ProtectionDomain, Refusal};
use crate::verbs::{
    Completion, CompletionQueue, LocalBuffer, QpCaps, RecvRequest, SendOp, SendRequest, Sge,
    WcOpcode, WcStatus,
};
use crate::wire::ddp::{self, Buffer, DdpRepr};
use crate::wire::rdmap::{CtrlRepr, Opcode, ReadRequestRepr, TerminateRepr};

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
    aligned: std::sync::atomic::AtomicBool,
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
            aligned: std::sync::atomic::AtomicBool::new(false),
        });
        let rx_guard = EndOnPanic(shared.clone(), "receive");
        tokio::spawn(async move {
            rx_task(rx_guard.0.clone(), rd).await;
            drop(rx_guard);
        });
        let tx_guard = EndOnPanic(shared.clone(), "send");
        tokio::spawn(async move {
            tx_task(tx_guard.0.clone(), wr).await;
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
                let mut st = self.lock();
                let p = st.reasm.accept(&seg).map_err(local)?;
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
                            format!(
                                "Send with Invalidate of STag {ulp:#x}, not a valid STag of ours"
                            ),
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
            Opcode::ReadRequest => {
                let mut st = self.lock();
                st.reasm.accept(&seg).map_err(local)?;
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
            Opcode::Terminate => {
                let t = TerminateRepr::parse(seg.payload).map_err(|_| {
                    local(TerminateReason::malformed(
                        "a Terminate without its control word",
                    ))
                })?;
                let layer = Layer::from_code(t.layer).unwrap_or(Layer::Rdmap);
                Err(Error::RemoteTerminate(TerminateReason::new(
                    layer,
                    t.etype,
                    t.code,
                    format!("Terminate from the peer (layer code {})", t.layer),
                )))
            }
        }
    }
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

/// Tagged payloads at least this long, not yet all received, are read
/// from the socket straight into their region (one copy, the kernel's,
/// instead of a second one out of the receive buffer).
const DIRECT_MIN: usize = 16 * 1024;

/// A tagged segment at the front of the receive buffer whose payload will
/// be placed straight from the socket.
struct Direct {
    opcode: Opcode,
    last: bool,
    stag: u32,
    to: u64,
    /// MPA length field and DDP tagged header, as received (for the CRC).
    header: [u8; 2 + ddp::TAGGED_LEN],
    payload: usize,
    pad: usize,
}

/// Whether `bytes` (from the start of an FPDU) begin a large RDMA Write or
/// Read Response segment that is not all there yet. Anything else, and any
/// header that does not parse, takes the ordinary path (which reports the
/// error once the FPDU is whole).
fn direct_candidate(bytes: &[u8]) -> Option<Direct> {
    let header: [u8; 2 + ddp::TAGGED_LEN] = bytes.get(..2 + ddp::TAGGED_LEN)?.try_into().ok()?;
    let ulpdu_len = usize::from(u16::from_be_bytes([header[0], header[1]]));
    if bytes.len() >= crate::wire::mpa::fpdu_len(ulpdu_len) {
        return None;
    }
    let payload = ulpdu_len.checked_sub(ddp::TAGGED_LEN)?;
    if payload < DIRECT_MIN {
        return None;
    }
    let seg = fpdu::parse_ulpdu(&header[2..]).ok()?;
    let Buffer::Tagged { stag, to } = seg.buffer else {
        return None;
    };
    if !matches!(seg.opcode, Opcode::Write | Opcode::ReadResponse) {
        return None;
    }
    Some(Direct {
        opcode: seg.opcode,
        last: seg.last,
        stag,
        to,
        header,
        payload,
        pad: crate::wire::mpa::pad_len(ulpdu_len),
    })
}

/// The FPDU length of a tagged RDMA Write or Read Response segment whose
/// header `bytes` begin with (`None` for anything else or a header that
/// does not parse).
fn tagged_fpdu_len(bytes: &[u8]) -> Option<usize> {
    let header = bytes.get(..2 + ddp::TAGGED_LEN)?;
    let ulpdu_len = usize::from(u16::from_be_bytes([header[0], header[1]]));
    let seg = fpdu::parse_ulpdu(&header[2..]).ok()?;
    (matches!(seg.buffer, Buffer::Tagged { .. })
        && matches!(seg.opcode, Opcode::Write | Opcode::ReadResponse))
    .then(|| crate::wire::mpa::fpdu_len(ulpdu_len))
}

impl Shared {
    /// Ends the stream for `e`, sending the Terminate it carries when we
    /// are the ones terminating.
    fn fail_terminating(&self, e: Error) {
        let term = match &e {
            Error::LocalTerminate(r) => Some(r.clone()),
            _ => None,
        };
        self.fail(e, term);
    }

    /// Places a large tagged segment straight from the socket: the same
    /// checks as [`Shared::handle`] first, then the payload read into the
    /// region, then the CRC over header, payload and pad (the stream is
    /// terminated on a bad one, as for any FPDU; bytes placed by then are
    /// the peer's to answer for). `buf[buffered]` holds the segment's start
    /// (its header and perhaps some payload). The payload and the trailer
    /// are read with vectored reads whose second part is `buf`: the pad and
    /// CRC, then up to a tagged header's worth of the next FPDU, so that a
    /// run of large segments costs about one system call each and none of
    /// their payload is copied out of `buf`. Returns how many bytes `buf`
    /// then holds, of which the first `pad + 4` were the trailer.
    async fn place_direct(
        &self,
        rd: &mut OwnedReadHalf,
        buf: &mut [u8],
        buffered: std::ops::Range<usize>,
        d: Direct,
    ) -> Result<(usize, usize), Error> {
        let local = |r: TerminateReason| Error::LocalTerminate(r);
        let (need, what) = match d.opcode {
            Opcode::Write => (Access::REMOTE_WRITE, "RDMA Write"),
            _ => {
                self.check_read_response(d.stag, d.to, d.payload)?;
                (Access::LOCAL_WRITE, "RDMA Read Response")
            }
        };
        let mut placement = self
            .pd
            .checkout(d.stag, d.to, d.payload, need)
            .map_err(|r| local(tagged_refusal(r, what, d.stag, d.to, d.payload)))?;
        // What came with the header: some of the payload, or all of it
        // and the start of the trailer (never all of the trailer: then the
        // FPDU would be whole and not placed here).
        let after_header = buffered.start + d.header.len()..buffered.end;
        let have = after_header.len().min(d.payload);
        let early_tail = after_header.len() - have;
        // The payload's place: one slice, or the pages of a page-list
        // region it spans.
        let mut dst = placement.destination(d.payload);
        copy_into(&mut dst, 0, &buf[after_header.start..][..have]);
        // The trailer bytes already here go where the reads below put the rest.
        buf.copy_within(after_header.end - early_tail..after_header.end, 0);
        let trailer_len = d.pad + 4;
        let room = trailer_len + DIRECT_HEADER;
        let received = async {
            let (mut filled, mut tail) = (have, early_tail);
            while tail < trailer_len {
                let n = if filled < d.payload {
                    read_into(rd, &mut dst, filled, &mut buf[..room]).await?
                } else {
                    read_into(rd, &mut [], 0, &mut buf[tail..room]).await?
                };
                if n == 0 {
                    return Err(Error::Closed);
                }
                let into_payload = n.min(d.payload - filled);
                filled += into_payload;
                tail += n - into_payload;
            }
            Ok(tail)
        }
        .await;
        let good = received.is_ok() && {
            let sent =
                u32::from_le_bytes([buf[d.pad], buf[d.pad + 1], buf[d.pad + 2], buf[d.pad + 3]]);
            if self.crc {
                let mut crc = Crc32c::new();
                crc.update(&d.header);
                for slice in &dst {
                    crc.update(slice);
                }
                crc.update(&buf[..d.pad]);
                crc.value() == sent
            } else {
                true
            }
        };
        drop(dst);
        self.pd.checkin(placement);
        let tail = received?;
        if !good {
            return Err(local(TerminateReason::llp(
                crate::error::llp_code::CRC,
                format!(
                    "FPDU CRC mismatch on a {}-byte {:?} payload placed directly at STag {:#x}, TO {:#x}",
                    d.payload, d.opcode, d.stag, d.to
                ),
            )));
        }
        if d.opcode == Opcode::ReadResponse {
            self.read_response_placed(d.payload, d.last)?;
        }
        Ok((trailer_len, tail))
    }
}

/// A tagged FPDU's MPA length and DDP header: what the reader must see to
/// decide on direct placement.
const DIRECT_HEADER: usize = 2 + ddp::TAGGED_LEN;

/// Copies `src` into the concatenation of `dst` from byte `at` of it.
fn copy_into(dst: &mut [&mut [u8]], at: usize, src: &[u8]) {
    let (mut skip, mut done) = (at, 0);
    for slice in dst.iter_mut() {
        if done == src.len() {
            break;
        }
        if skip >= slice.len() {
            skip -= slice.len();
            continue;
        }
        let n = (slice.len() - skip).min(src.len() - done);
        slice[skip..skip + n].copy_from_slice(&src[done..done + n]);
        done += n;
        skip = 0;
    }
}

/// One read into the concatenation of `first` from byte `from` of it, then
/// into `second`, with a single system call where the bytes are there
/// (tokio's read halves have no async vectored read).
async fn read_into(
    rd: &OwnedReadHalf,
    first: &mut [&mut [u8]],
    from: usize,
    second: &mut [u8],
) -> std::io::Result<usize> {
    loop {
        rd.readable().await?;
        let mut slices = Vec::with_capacity(first.len() + 1);
        let mut skip = from;
        for slice in first.iter_mut() {
            if skip >= slice.len() {
                skip -= slice.len();
                continue;
            }
            slices.push(std::io::IoSliceMut::new(&mut slice[skip..]));
            skip = 0;
        }
        slices.push(std::io::IoSliceMut::new(second));
        match rd.try_read_vectored(&mut slices) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

async fn rx_task(shared: Arc<Shared>, mut rd: OwnedReadHalf) {
    let mut ended = shared.ended.subscribe();
    let mut buf = vec![0u8; RX_BUF];
    let (mut start, mut end) = (0usize, 0usize);
    // In a run of large tagged segments: read no further than the next
    // FPDU's header, so that its payload can go straight into its region.
    let mut bulk = false;
    loop {
        loop {
            match fpdu::decode(&buf[start..end], shared.crc) {
                Ok(Some((seg, n))) => {
                    if matches!(seg.buffer, Buffer::Tagged { .. })
                        && seg.payload.len() >= DIRECT_MIN
                    {
                        bulk = true;
                    }
                    if let Err(e) = shared.handle(seg) {
                        shared.fail_terminating(e);
                        return;
                    }
                    start += n;
                }
                Ok(None) => break,
                Err(r) => {
                    shared.fail(Error::LocalTerminate(r.clone()), Some(r));
                    return;
                }
            }
        }
        if let Some(direct) = direct_candidate(&buf[start..end]) {
            // A large tagged payload that is not all here yet: the rest
            // goes from the socket straight into its region.
            match shared
                .place_direct(&mut rd, &mut buf, start..end, direct)
                .await
            {
                Ok((trailer, filled)) => {
                    start = trailer;
                    end = filled;
                    bulk = true;
                    continue;
                }
                Err(e) => {
                    shared.fail_terminating(e);
                    return;
                }
            }
        }
        // In a run, a short tagged segment (the rest of a message cut at
        // the MSS) is read whole with the next header, so that the run
        // goes on; whatever else comes next is not placed directly.
        let mut run_through = None;
        if end - start >= DIRECT_HEADER {
            match tagged_fpdu_len(&buf[start..end]) {
                Some(len) if bulk => run_through = Some(len + DIRECT_HEADER),
                _ => bulk = false,
            }
        }
        if start == end {
            start = 0;
            end = 0;
        } else if RX_BUF - end < MAX_FPDU {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        let limit = match (bulk, run_through) {
            (true, Some(len)) => (start + len).clamp(end + 1, RX_BUF),
            (true, None) => start + DIRECT_HEADER,
            (false, _) => RX_BUF,
        };
        tokio::select! {
            r = rd.read(&mut buf[end..limit]) => match r {
                Ok(0) => {
                    shared.fail(Error::Closed, None);
                    return;
                }
                Ok(n) => end += n,
                Err(e) => {
                    shared.fail(e.into(), None);
                    return;
                }
            },
            _ = ended.wait_for(|e| *e) => return,
        }
    }
}

/// Payloads at least this long are written from their `Bytes` with a
/// vectored write instead of being copied into the batch buffer.
const ZERO_COPY_MIN: usize = 2048;

/// One piece of a batch as it goes on the wire.
enum Chunk {
    /// Bytes of the batch buffer (headers, pads, CRCs, small payloads).
    Out(std::ops::Range<usize>),
    /// A payload written from where it is.
    Bytes(Bytes),
    /// The end of an FPDU that must be written on its own (aligned mode).
    End,
}

/// Writes every chunk, in order, with as few vectored writes as the
/// socket takes.
async fn write_chunks(
    wr: &mut OwnedWriteHalf,
    out: &[u8],
    chunks: &[Chunk],
) -> std::io::Result<()> {
    // Aligned mode: one vectored write per FPDU (the chunks up to each End).
    for group in chunks.split(|c| matches!(c, Chunk::End)) {
        write_group(wr, out, group).await?;
    }
    Ok(())
}

/// Writes one run of chunks with as few vectored writes as the socket
/// takes.
async fn write_group(wr: &mut OwnedWriteHalf, out: &[u8], chunks: &[Chunk]) -> std::io::Result<()> {
    let slices: Vec<&[u8]> = chunks
        .iter()
        .filter_map(|c| match c {
            Chunk::Out(range) => Some(&out[range.clone()]),
            Chunk::Bytes(b) => Some(&b[..]),
            Chunk::End => None,
        })
        .filter(|s| !s.is_empty())
        .collect();
    let mut index = 0;
    let mut offset = 0;
    while index < slices.len() {
        let end = (index + 512).min(slices.len());
        let mut io: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(end - index);
        io.push(std::io::IoSlice::new(&slices[index][offset..]));
        io.extend(
            slices[index + 1..end]
                .iter()
                .map(|s| std::io::IoSlice::new(s)),
        );
        let mut written = wr.write_vectored(&io).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 && index < slices.len() {
            let left = slices[index].len() - offset;
            if written >= left {
                written -= left;
                index += 1;
                offset = 0;
            } else {
                offset += written;
                written = 0;
            }
        }
    }
    Ok(())
}

/// Where one FPDU's body comes from (flattened so a batch allocates nothing per FPDU).
enum Src {
    Bytes(Bytes),
    Region {
        stag: u32,
        offset: usize,
        len: usize,
    },
}

struct Piece {
    hdr: DdpRepr,
    extra: [u8; ReadRequestRepr::LEN],
    extra_len: usize,
    srcs: std::ops::Range<usize>,
    body: usize,
}

#[derive(Default)]
struct Plan {
    pieces: Vec<Piece>,
    srcs: Vec<Src>,
    /// Completions to publish once the batch is written, in order.
    done: Vec<(Completion, bool)>,
}

impl Plan {
    fn clear(&mut self) {
        self.pieces.clear();
        self.srcs.clear();
        self.done.clear();
    }
    fn is_empty(&self) -> bool {
        self.pieces.is_empty() && self.done.is_empty()
    }
    fn push(&mut self, hdr: DdpRepr, extra: &[u8], srcs: impl FnOnce(&mut Vec<Src>)) {
        let first = self.srcs.len();
        srcs(&mut self.srcs);
        let body = self.srcs[first..]
            .iter()
            .map(|s| match s {
                Src::Bytes(b) => b.len(),
                Src::Region { len, .. } => *len,
            })
            .sum();
        let mut e = [0u8; ReadRequestRepr::LEN];
        e[..extra.len()].copy_from_slice(extra);
        self.pieces.push(Piece {
            hdr,
            extra: e,
            extra_len: extra.len(),
            srcs: first..self.srcs.len(),
            body,
        });
    }
}

/// Appends the sources of bytes `off..off + len` of a gather list.
fn gather(sges: &[Sge], mut off: usize, mut len: usize, out: &mut Vec<Src>) {
    for sge in sges {
        if len == 0 {
            break;
        }
        let n = sge.len();
        if off >= n {
            off -= n;
            continue;
        }
        let take = (n - off).min(len);
        out.push(match sge {
            Sge::Bytes(b) => Src::Bytes(b.slice(off..off + take)),
            Sge::Region(r) => Src::Region {
                stag: r.stag,
                offset: r.offset + off,
                len: take,
            },
        });
        len -= take;
        off = 0;
    }
}

fn untagged(opcode: Opcode, last: bool, ulp: u32, qn: u32, msn: u32, mo: u32) -> DdpRepr {
    DdpRepr {
        last,
        version: ddp::VERSION,
        ulp_ctrl: CtrlRepr::byte(opcode),
        buffer: Buffer::Untagged { ulp, qn, msn, mo },
    }
}

fn tagged(opcode: Opcode, last: bool, stag: u32, to: u64) -> DdpRepr {
    DdpRepr {
        last,
        version: ddp::VERSION,
        ulp_ctrl: CtrlRepr::byte(opcode),
        buffer: Buffer::Tagged { stag, to },
    }
}

/// Cuts bytes `*done..total` of one DDP message into segments of at most
/// `chunk` bytes, calling `each(offset, length, last)` for each, while
/// `budget` lasts (every segment costs its length, an empty one 1). An
/// empty message is one empty last segment. `*done` says where the next
/// batch goes on.
fn segment(
    total: usize,
    chunk: usize,
    done: &mut usize,
    budget: &mut usize,
    mut each: impl FnMut(usize, usize, bool),
) {
    loop {
        let n = (total - *done).min(chunk);
        let last = *done + n == total;
        each(*done, n, last);
        *done += n;
        *budget = budget.saturating_sub(n.max(1));
        if last || *budget == 0 {
            break;
        }
    }
}

impl Shared {
    /// Moves what may go now from the queues into `plan` (under the state lock).
    fn plan(&self, st: &mut State, plan: &mut Plan) {
        let mulpdu = self.mulpdu.load(Ordering::Relaxed);
        let mut budget = BATCH_BYTES;
        // Read Responses first: the peer's Reads wait on them.
        while budget > 0 {
            let Some(r) = st.responses.front_mut() else {
                break;
            };
            let (len, mut done) = (r.len, r.done);
            segment(
                len,
                mulpdu - ddp::TAGGED_LEN,
                &mut done,
                &mut budget,
                |at, n, last| {
                    let offset = r.src_offset + at;
                    let stag = r.src_stag;
                    let hdr = tagged(
                        Opcode::ReadResponse,
                        last,
                        r.sink_stag,
                        r.sink_to.wrapping_add(at as u64),
                    );
                    plan.push(hdr, &[], |s| {
                        s.push(Src::Region {
                            stag,
                            offset,
                            len: n,
                        })
                    });
                },
            );
            r.done = done;
            if r.done == r.len {
                st.responses.pop_front();
            }
        }
        while budget > 0 {
            let Some(req) = st.sq.front() else { break };
            let (wr_id, signaled) = (req.wr_id, req.signaled);
            match &req.op {
                SendOp::LocalInvalidate { stag } => {
                    let status = if self.pd.invalidate(*stag) {
                        WcStatus::Success
                    } else {
                        WcStatus::Failed(format!("STag {stag:#x} is not a valid STag of ours"))
                    };
                    plan.done.push((
                        Completion::new(wr_id, WcOpcode::LocalInvalidate, status, 0),
                        signaled,
                    ));
                    st.sq.pop_front();
                }
                SendOp::RdmaRead { local, remote } => {
                    if st.reads_out.len() >= self.ord {
                        break;
                    }
                    let LocalBuffer { stag, offset, len } = *local;
                    let Some(sink_to) = self.pd.addr_of(stag).map(|a| a + offset as u64) else {
                        let f = WcStatus::Failed(format!("local STag {stag:#x} went away"));
                        plan.done
                            .push((Completion::new(wr_id, WcOpcode::RdmaRead, f, 0), true));
                        st.sq.pop_front();
                        continue;
                    };
                    let rr = ReadRequestRepr {
                        sink_stag: stag,
                        sink_to,
                        size: len as u32,
                        src_stag: remote.stag,
                        src_to: remote.to,
                    };
                    let mut extra = [0u8; ReadRequestRepr::LEN];
                    rr.emit(&mut extra);
                    let msn = st.msn_tx[1];
                    st.msn_tx[1] = msn.wrapping_add(1);
                    plan.push(
                        untagged(Opcode::ReadRequest, true, 0, 1, msn, 0),
                        &extra,
                        |_| {},
                    );
                    st.reads_out.push_back(PendingRead {
                        wr_id,
                        signaled,
                        sink_stag: stag,
                        sink_to,
                        len,
                        placed: 0,
                    });
                    st.sq.pop_front();
                }
                SendOp::Send {
                    data,
                    solicited,
                    invalidate,
                } => {
                    let total: usize = data.iter().map(Sge::len).sum();
                    let opcode = match (*solicited, invalidate.is_some()) {
                        (false, false) => Opcode::Send,
                        (false, true) => Opcode::SendInvalidate,
                        (true, false) => Opcode::SendSe,
                        (true, true) => Opcode::SendSeInvalidate,
                    };
                    let ulp = invalidate.unwrap_or(0);
                    let msn = match st.head_msn {
                        Some(m) => m,
                        None => {
                            let m = st.msn_tx[0];
                            st.msn_tx[0] = m.wrapping_add(1);
                            st.head_msn = Some(m);
                            m
                        }
                    };
                    let mut done = st.head_done;
                    let chunk = mulpdu - ddp::UNTAGGED_LEN;
                    segment(total, chunk, &mut done, &mut budget, |at, n, last| {
                        plan.push(untagged(opcode, last, ulp, 0, msn, at as u32), &[], |s| {
                            gather(data, at, n, s)
                        });
                    });
                    if done == total {
                        plan.done.push((
                            Completion::new(wr_id, WcOpcode::Send, WcStatus::Success, total),
                            signaled,
                        ));
                        st.sq.pop_front();
                        st.head_done = 0;
                        st.head_msn = None;
                    } else {
                        st.head_done = done;
                    }
                }
                SendOp::RdmaWrite { data, remote } => {
                    let total: usize = data.iter().map(Sge::len).sum();
                    let mut done = st.head_done;
                    let chunk = mulpdu - ddp::TAGGED_LEN;
                    segment(total, chunk, &mut done, &mut budget, |at, n, last| {
                        let hdr = tagged(
                            Opcode::Write,
                            last,
                            remote.stag,
                            remote.to.wrapping_add(at as u64),
                        );
                        plan.push(hdr, &[], |s| gather(data, at, n, s));
                    });
                    if done == total {
                        plan.done.push((
                            Completion::new(wr_id, WcOpcode::RdmaWrite, WcStatus::Success, total),
                            signaled,
                        ));
                        st.sq.pop_front();
                        st.head_done = 0;
                    } else {
                        st.head_done = done;
                    }
                }
            }
        }
    }

    /// Encodes the plan: headers, pads, CRCs and region payloads into
    /// `out`; `chunks` says what goes on the wire in order, so that large
    /// `Bytes` payloads are written from where they are, without a copy.
    /// Each FPDU's CRC is computed as its pieces are laid down. False if
    /// a region went away meanwhile.
    fn encode(&self, plan: &Plan, out: &mut Vec<u8>, chunks: &mut Vec<Chunk>) -> bool {
        let enc = Encoder { crc: self.crc };
        let mut pending = out.len();
        for p in &plan.pieces {
            let start = enc.begin(out, &p.hdr, &p.extra[..p.extra_len], p.body);
            let mut crc = Crc32c::new();
            if self.crc {
                crc.update(&out[start..]);
            }
            let mut ulpdu_len = out.len() - start - 2;
            for s in &plan.srcs[p.srcs.clone()] {
                // Large payloads and frozen regions go out as they are.
                let frozen = match *s {
                    Src::Region { stag, offset, len } => self.pd.frozen(stag, offset, len),
                    Src::Bytes(_) => None,
                };
                let zero_copy = match (s, &frozen) {
                    (_, Some(b)) => Some(b),
                    (Src::Bytes(b), None) if b.len() >= ZERO_COPY_MIN => Some(b),
                    _ => None,
                };
                if let Some(b) = zero_copy {
                    if self.crc {
                        crc.update(b);
                    }
                    chunks.push(Chunk::Out(pending..out.len()));
                    chunks.push(Chunk::Bytes(b.clone()));
                    pending = out.len();
                    ulpdu_len += b.len();
                    continue;
                }
                match s {
                    Src::Bytes(b) => {
                        let at = out.len();
                        out.extend_from_slice(b);
                        if self.crc {
                            crc.update(&out[at..]);
                        }
                        ulpdu_len += b.len();
                    }
                    Src::Region { stag, offset, len } => {
                        let at = out.len();
                        out.resize(at + len, 0);
                        let placed = self.pd.with_bytes(*stag, *offset, *len, |bytes| {
                            out[at..].copy_from_slice(bytes);
                        });
                        if !placed {
                            return false;
                        }
                        // CRC over the copy while it is in cache: faster
                        // here than the fused copy+CRC (crc-bench, 64 KiB:
                        // copy then CRC 32.8 GiB/s, fused 16.3).
                        if self.crc {
                            crc.update(&out[at..]);
                        }
                        ulpdu_len += len;
                    }
                }
            }
            let pad = &[0u8; 3][..crate::wire::mpa::pad_len(ulpdu_len)];
            out.extend_from_slice(pad);
            let value = if self.crc {
                crc.update(pad);
                crc.value()
            } else {
                0
            };
            out.extend_from_slice(&value.to_le_bytes());
            if self.aligned.load(Ordering::Relaxed) {
                chunks.push(Chunk::Out(pending..out.len()));
                chunks.push(Chunk::End);
                pending = out.len();
            }
        }
        chunks.push(Chunk::Out(pending..out.len()));
        true
    }

    fn publish(&self, plan: &mut Plan) {
        let mut completed = 0;
        for (c, signaled) in plan.done.drain(..) {
            // A Read that went on the wire completes when its Responses are placed.
            if c.opcode != WcOpcode::RdmaRead || c.status != WcStatus::Success {
                completed += 1;
            }
            if signaled || c.status != WcStatus::Success {
                self.send_cq.push(c);
            }
        }
        if completed > 0 {
            let mut st = self.lock();
            st.sq_outstanding = st.sq_outstanding.saturating_sub(completed);
        }
    }

    fn terminate_fpdu(&self, reason: &TerminateReason, out: &mut Vec<u8>) {
        let msn = {
            let mut st = self.lock();
            let m = st.msn_tx[2];
            st.msn_tx[2] = m.wrapping_add(1);
            m
        };
        let t = TerminateRepr {
            layer: reason.layer as u8,
            etype: reason.etype,
            code: reason.code,
            m: false,
            d: false,
            r: false,
        };
        let mut extra = [0u8; TerminateRepr::LEN];
        t.emit(&mut extra);
        Encoder { crc: self.crc }.push(
            out,
            &untagged(Opcode::Terminate, true, 0, 2, msn, 0),
            &extra,
            &[],
        );
    }
}

enum Action {
    Wait,
    Send,
    Close,
    Stop(Option<TerminateReason>),
}

async fn tx_task(shared: Arc<Shared>, mut wr: OwnedWriteHalf) {
    let mut ended = shared.ended.subscribe();
    let mut out = Vec::with_capacity(BATCH_BYTES + 2 * MAX_FPDU);
    let mut chunks = Vec::new();
    let mut plan = Plan::default();
    // False once a write was cut short: the stream then ends mid-FPDU and no Terminate can follow.
    let mut clean = true;
    loop {
        out.clear();
        chunks.clear();
        plan.clear();
        let action = {
            let mut st = shared.lock();
            if st.error.is_some() {
                Action::Stop(st.terminate_out.take())
            } else {
                shared.plan(&mut st, &mut plan);
                if !plan.is_empty() {
                    Action::Send
                } else if st.closing && st.sq.is_empty() && st.responses.is_empty() {
                    Action::Close
                } else {
                    Action::Wait
                }
            }
        };
        match action {
            Action::Wait => shared.tx_wake.notified().await,
            Action::Stop(term) => {
                if let (Some(t), true) = (term, clean) {
                    shared.terminate_fpdu(&t, &mut out);
                    let _ = tokio::time::timeout(Duration::from_secs(1), wr.write_all(&out)).await;
                }
                let _ = wr.shutdown().await;
                return;
            }
            Action::Close => {
                let _ = wr.shutdown().await;
                shared.fail(Error::Closed, None);
                return;
            }
            Action::Send => {
                if !shared.encode(&plan, &mut out, &mut chunks) {
                    shared.fail(
                        Error::Misuse("a region was deregistered while a request used it".into()),
                        None,
                    );
                    clean = false;
                    continue;
                }
                let r = tokio::select! {
                    r = write_chunks(&mut wr, &out, &chunks) => r,
                    _ = async {
                        let _ = ended.wait_for(|e| *e).await;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    } => Err(std::io::Error::other("stream ended")),
                };
                match r {
                    Ok(()) => shared.publish(&mut plan),
                    Err(e) => {
                        clean = false;
                        shared.fail(e.into(), None);
                    }
                }
            }
        }
    }
}
