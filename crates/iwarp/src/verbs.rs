//! The verbs-shaped request and completion types (the iSER layer's side of
//! the seam), and the completion queue.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// A place in the peer's memory (from the peer's own message, e.g. the iSER header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteBuffer {
    /// The peer's STag.
    pub stag: u32,
    /// The tagged offset within it (absolute).
    pub to: u64,
}

/// A range of one of our registered regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalBuffer {
    /// Our STag.
    pub stag: u32,
    /// Byte offset from the region's start (not a tagged offset).
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// Where the bytes of a Send or RDMA Write come from.
#[derive(Clone, Debug)]
pub enum Sge {
    /// Bytes owned by the request (small control messages: iSER header + PDU).
    Bytes(bytes::Bytes),
    /// A range of a registered region (the SCSI buffer).
    Region(LocalBuffer),
}

impl Sge {
    /// Bytes this piece holds.
    pub fn len(&self) -> usize {
        match self {
            Sge::Bytes(b) => b.len(),
            Sge::Region(r) => r.len,
        }
    }
    /// Whether the piece is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One send-queue request.
#[derive(Clone, Debug)]
pub struct SendRequest {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// Whether success produces a completion (errors always do).
    pub signaled: bool,
    /// What to do.
    pub op: SendOp,
}

/// The operation of a send-queue request.
#[derive(Clone, Debug)]
pub enum SendOp {
    /// RDMAP Send (opcode 3), with Solicited Event (5), with Invalidate (4), or both (6).
    Send {
        /// A gather list (e.g. [iSER header + BHS as Bytes, payload as Region]).
        data: Vec<Sge>,
        /// Set the Solicited Event bit.
        solicited: bool,
        /// Invalidate this STag of the peer's when the Send arrives.
        invalidate: Option<u32>,
    },
    /// RDMAP RDMA Write of `data` to `remote`: one message, however many
    /// pieces (a verbs work request's gather list), so the FPDUs are cut
    /// across the pieces rather than once per piece.
    RdmaWrite {
        /// The source, in order.
        data: Vec<Sge>,
        /// The peer's sink.
        remote: RemoteBuffer,
    },
    /// RDMAP RDMA Read Request: `local.len` bytes from `remote` into `local`.
    RdmaRead {
        /// Our sink (needs LOCAL_WRITE).
        local: LocalBuffer,
        /// The peer's source.
        remote: RemoteBuffer,
    },
    /// Local invalidation of one of our STags (no wire traffic).
    LocalInvalidate {
        /// The STag.
        stag: u32,
    },
}

impl SendOp {
    /// The completion opcode of this operation.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send { .. } => WcOpcode::Send,
            SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::LocalInvalidate { .. } => WcOpcode::LocalInvalidate,
        }
    }
}

/// A receive buffer for one incoming untagged Send (ownership moves to the
/// QP until it completes); its capacity is `buffer.len()`.
#[derive(Debug)]
pub struct RecvRequest {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// The buffer; a Send longer than `buffer.len()` is fatal.
    pub buffer: Vec<u8>,
}

/// What a completion completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// A Send (any of the four kinds).
    Send,
    /// An RDMA Write.
    RdmaWrite,
    /// An RDMA Read.
    RdmaRead,
    /// A local invalidation.
    LocalInvalidate,
    /// A received Send.
    Recv,
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// The QP went to error before this request ran.
    Flushed,
    /// The request itself failed (e.g. local protection error).
    Failed(String),
}

/// One completed request.
#[derive(Debug)]
pub struct Completion {
    /// The request's id.
    pub wr_id: u64,
    /// What completed.
    pub opcode: WcOpcode,
    /// How.
    pub status: WcStatus,
    /// Recv: bytes received; RdmaRead: bytes placed; Send/Write: bytes sent.
    pub byte_len: usize,
    /// Recv of a Send with Invalidate: the STag the peer invalidated (already invalid here).
    pub invalidated: Option<u32>,
    /// Recv: the Send carried the Solicited Event bit.
    pub solicited: bool,
    /// Recv: the buffer given in post_recv, truncated to byte_len (a
    /// flushed receive gives it back as posted). None for other opcodes.
    pub buffer: Option<Vec<u8>>,
}

impl Completion {
    pub(crate) fn new(wr_id: u64, opcode: WcOpcode, status: WcStatus, byte_len: usize) -> Self {
        Completion {
            wr_id,
            opcode,
            status,
            byte_len,
            invalidated: None,
            solicited: false,
            buffer: None,
        }
    }
}

#[derive(Default)]
struct CqState {
    queue: VecDeque<Completion>,
    ended: bool,
}

#[derive(Default)]
struct CqInner {
    state: Mutex<CqState>,
    notify: Notify,
}

/// Completions of one queue (a QP has a send CQ and a receive CQ).
#[derive(Clone, Default)]
pub struct CompletionQueue {
    inner: Arc<CqInner>,
}

impl CompletionQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, CqState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, c: Completion) {
        self.lock().queue.push_back(c);
        self.inner.notify.notify_one();
    }

    /// Marks the end: once the queue is drained, `next` returns None.
    pub(crate) fn end(&self) {
        self.lock().ended = true;
        self.inner.notify.notify_waiters();
        self.inner.notify.notify_one();
    }

    /// Takes the oldest completion, if any.
    pub fn poll(&self) -> Option<Completion> {
        self.lock().queue.pop_front()
    }

    /// Waits for the next completion. After the QP has gone to error and
    /// every request has been flushed, returns None (the stream is over:
    /// see `QueuePair::error`).
    pub async fn next(&self) -> Option<Completion> {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if let Some(c) = s.queue.pop_front() {
                    return Some(c);
                }
                if s.ended {
                    // Let another waiter see the end too.
                    self.inner.notify.notify_one();
                    return None;
                }
            }
            notified.await;
        }
    }
}

/// Sizes of one QP.
#[derive(Clone, Copy, Debug)]
pub struct QpCaps {
    /// Send-queue requests posted and not yet completed, at most.
    pub max_send_wr: usize,
    /// Receive buffers posted, at most.
    pub max_recv_wr: usize,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 512,
            max_recv_wr: 512,
        }
    }
}
