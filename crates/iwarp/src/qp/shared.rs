//! What the queue pair's two tasks and its API share (`Shared`): the
//! stream's state under one lock, how it ends (`fail`), and what each
//! received segment means (`handle`: placement rules, Read Requests and
//! Responses, Terminate). `rx.rs` and `tx.rs` drive it; `mod.rs` makes it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::{Notify, watch};

use crate::error::{Error, Layer, TerminateReason, ddp_code, ddp_etype, rdmap_code, rdmap_etype};
use crate::fpdu::{Reassembly, Segment};
use crate::mr::{Access, ProtectionDomain, Refusal};
use crate::verbs::{
    Completion, CompletionQueue, QpCaps, RecvRequest, SendRequest, WcOpcode, WcStatus,
};
use crate::wire::ddp::Buffer;
use crate::wire::rdmap::{Opcode, ReadRequestRepr, TerminateRepr};

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
pub(super) const MAX_FPDU: usize = 65541;

/// Outbound RDMA Read in flight (its Request sent, Responses awaited).
pub(super) struct PendingRead {
    pub(super) wr_id: u64,
    pub(super) signaled: bool,
    pub(super) sink_stag: u32,
    pub(super) sink_to: u64,
    pub(super) len: usize,
    pub(super) placed: usize,
}

/// An inbound RDMA Read Request being answered.
pub(super) struct Response {
    pub(super) src_stag: u32,
    pub(super) src_offset: usize,
    pub(super) sink_stag: u32,
    pub(super) sink_to: u64,
    pub(super) len: usize,
    pub(super) done: usize,
}

pub(super) struct State {
    pub(super) sq: VecDeque<SendRequest>,
    /// Bytes of the send queue's head already written, and its MSN.
    pub(super) head_done: usize,
    pub(super) head_msn: Option<u32>,
    /// Send-queue requests posted and not yet completed.
    pub(super) sq_outstanding: usize,
    pub(super) reads_out: VecDeque<PendingRead>,
    pub(super) rq: VecDeque<RecvRequest>,
    pub(super) responses: VecDeque<Response>,
    pub(super) msn_tx: [u32; 3],
    pub(super) reasm: Reassembly,
    pub(super) error: Option<Error>,
    pub(super) terminate_out: Option<TerminateReason>,
    pub(super) closing: bool,
}

pub(crate) struct Shared {
    pub(super) pd: ProtectionDomain,
    pub(super) send_cq: CompletionQueue,
    pub(super) recv_cq: CompletionQueue,
    pub(super) state: Mutex<State>,
    pub(super) tx_wake: Notify,
    pub(super) ended: watch::Sender<bool>,
    pub(super) peer: PeerParams,
    pub(super) local_addr: SocketAddr,
    pub(super) peer_addr: SocketAddr,
    pub(super) caps: QpCaps,
    pub(super) crc: bool,
    /// Inbound Read Requests we accept outstanding.
    pub(super) ird: usize,
    /// Outbound Read Requests we issue outstanding.
    pub(super) ord: usize,
    pub(super) mulpdu: AtomicUsize,
    /// Each FPDU written on its own (set with an explicit MULPDU): so that,
    /// with Nagle off, every FPDU starts a TCP segment, as siw's own do
    /// (RFC 5044 section 8's alignment), at the cost of a system call each.
    pub(super) aligned: AtomicBool,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the stream: records why, flushes every request, wakes everyone.
    /// `terminate`: the Terminate the writer sends first, if it still can.
    pub(super) fn fail(&self, error: Error, terminate: Option<TerminateReason>) {
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
    pub(super) fn fail_terminating(&self, e: Error) {
        let term = match &e {
            Error::LocalTerminate(r) => Some(r.clone()),
            _ => None,
        };
        self.fail(e, term);
    }

    /// Checks that a Read Response of `len` bytes at `to` of `stag`
    /// continues the oldest outstanding Read (RFC 5040 §4.4: responses
    /// come in order, into the requester's sink).
    pub(super) fn check_read_response(&self, stag: u32, to: u64, len: usize) -> Result<(), Error> {
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
    pub(super) fn read_response_placed(&self, len: usize, last: bool) -> Result<(), Error> {
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
    pub(super) fn handle(&self, seg: Segment<'_>) -> Result<(), Error> {
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
    pub(super) fn receive_send(&self, seg: &Segment<'_>, ulp: u32) -> Result<(), Error> {
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
    pub(super) fn queue_read_response(&self, seg: &Segment<'_>) -> Result<(), Error> {
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
pub(super) fn remote_terminate(payload: &[u8]) -> Error {
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

pub(super) fn model_mismatch() -> Error {
    Error::LocalTerminate(TerminateReason::malformed(
        "buffer model does not match the opcode",
    ))
}

pub(super) fn tagged_refusal(
    r: Refusal,
    what: &str,
    stag: u32,
    to: u64,
    len: usize,
) -> TerminateReason {
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
