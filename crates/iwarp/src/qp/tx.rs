//! The writing task: gathers what is queued (Read Responses first, then
//! the send queue in order) into a [`Plan`] of FPDUs, at most
//! [`BATCH_BYTES`] of payload, encodes it into one scratch buffer (large
//! payloads stay where they are), writes it with vectored writes, and then
//! publishes the completions. On the stream's end it sends the Terminate
//! due, if any, and shuts the socket down.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use iscsi_crc32c::Crc32c;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

use super::shared::{BATCH_BYTES, MAX_FPDU, PendingRead, Shared, State};
use crate::error::{Error, TerminateReason};
use crate::fpdu::Encoder;
use crate::verbs::{Completion, LocalBuffer, RemoteBuffer, SendOp, Sge, WcOpcode, WcStatus};
use crate::wire::ddp::{self, Buffer, DdpRepr};
use crate::wire::rdmap::{CtrlRepr, Opcode, ReadRequestRepr, TerminateRepr};

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

/// The RDMAP opcode of a Send with or without Solicited Event and Invalidate.
fn send_opcode(solicited: bool, invalidate: bool) -> Opcode {
    match (solicited, invalidate) {
        (false, false) => Opcode::Send,
        (false, true) => Opcode::SendInvalidate,
        (true, false) => Opcode::SendSe,
        (true, true) => Opcode::SendSeInvalidate,
    }
}

/// Plans Read Responses for the peer's queued Read Requests, oldest first,
/// while `budget` lasts; a Response all planned leaves the queue.
fn plan_responses(st: &mut State, mulpdu: usize, budget: &mut usize, plan: &mut Plan) {
    while *budget > 0 {
        let Some(r) = st.responses.front_mut() else {
            break;
        };
        let (len, mut done) = (r.len, r.done);
        segment(
            len,
            mulpdu - ddp::TAGGED_LEN,
            &mut done,
            budget,
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
}

impl Shared {
    /// Moves what may go now from the queues into `plan` (under the state lock).
    fn plan(&self, st: &mut State, plan: &mut Plan) {
        let mulpdu = self.mulpdu.load(Ordering::Relaxed);
        let mut budget = BATCH_BYTES;
        // Read Responses first: the peer's Reads wait on them.
        plan_responses(st, mulpdu, &mut budget, plan);
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
                    let (local, remote) = (*local, *remote);
                    self.plan_read_request(st, local, remote, plan);
                }
                SendOp::Send {
                    data,
                    solicited,
                    invalidate,
                } => {
                    let total: usize = data.iter().map(Sge::len).sum();
                    let opcode = send_opcode(*solicited, invalidate.is_some());
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

    /// Plans the Read Request at the head of the send queue and takes it
    /// off: it then waits in `reads_out` for its Responses, which complete
    /// it. A sink region that went away since it was posted fails it here.
    fn plan_read_request(
        &self,
        st: &mut State,
        local: LocalBuffer,
        remote: RemoteBuffer,
        plan: &mut Plan,
    ) {
        let req = st.sq.pop_front().expect("the head is this Read");
        let (wr_id, signaled) = (req.wr_id, req.signaled);
        let LocalBuffer { stag, offset, len } = local;
        let Some(sink_to) = self.pd.addr_of(stag).map(|a| a + offset as u64) else {
            let f = WcStatus::Failed(format!("local STag {stag:#x} went away"));
            plan.done
                .push((Completion::new(wr_id, WcOpcode::RdmaRead, f, 0), true));
            return;
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

/// Writes what is queued until the stream ends or is closed.
pub(super) async fn tx_task(shared: Arc<Shared>, mut wr: OwnedWriteHalf) {
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
