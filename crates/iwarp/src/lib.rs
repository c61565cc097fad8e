//! A user-space iWARP stack over an ordinary tokio TCP socket, with a
//! verbs-shaped API (protection domain, memory regions, queue pair,
//! completion queues) for the iSER datamover.
//!
//! | module | implements |
//! |---|---|
//! | [`wire::mpa`] | MPA start-up frames (RFC 5044 §7.1), the RFC 6581 §5 IRD/ORD words, FPDU sizes (RFC 5044 §4.1-§4.4) |
//! | [`wire::ddp`] | DDP tagged and untagged headers (RFC 5041 §4) |
//! | [`wire::rdmap`] | RDMAP control byte and opcodes (RFC 5040 §4.1-§4.3), Read Request (§4.4), Terminate (§4.8) |
//! | [`fpdu`] | sans-I/O: one FPDU decoded and checked (RFC 5044 §5 CRC32C, RFC 5041 §5 rules), untagged reassembly (MSN/MO, RFC 5041 §5.3), FPDU encoding |
//! | [`error`] | errors, and Terminate layer/type/code (RFC 5040 §4.8, RFC 5041 §7.2, RFC 5044 §8, RFC 6581 §9) |
//! | `mr` | protection domain and memory regions: STags, bounds, access rights, invalidation (RFC 5040 §5.2, §6.4) |
//! | `verbs` | requests, completions, completion queues |
//! | `cm` | the MPA exchange: [`connect`], [`accept_request`], [`ConnectRequest`] |
//! | `qp` | [`QueuePair`]: the stream's state and its tokio driver (RFC 5040 §5-§7 semantics); `qp/rx.rs` the reading task, `qp/tx.rs` the writing task |
//!
//! Design notes (why it is built this way):
//! - One reading and one writing task per QP; all placement happens on the
//!   reading task in stream order, so a Send completes at the receiver only
//!   after the Writes before it were placed (what iSER relies on for a SCSI
//!   Response after Data-In).
//! - The writer gathers up to 1 MiB of queued work into one scratch buffer
//!   of FPDUs (headers, payload, pad, CRC) and writes it with one system
//!   call. Payload from a registered region is copied into that buffer
//!   under the PD's lock, one segment at a time: regions live in a
//!   `Mutex`'d table (no `unsafe`), and a guard cannot be held across the
//!   socket write. The copy is the price of zero `unsafe`; the CRC then
//!   runs over cache-hot bytes.
//! - The reader reads 256 KiB at a time, checks each FPDU's CRC over the
//!   received bytes, and copies tagged payload straight into the region
//!   (one lock per segment).
//! - Lock order: QP state, then PD, then CQ. Do not call QP methods from
//!   inside [`ProtectionDomain::with_region`].
//!
//! Not implemented: MPA markers (refused, as Linux siw does), peer-to-peer
//! mode's RTR (never asked for; a peer that asks is answered
//! client-server), memory windows, RFC 7306 atomics. CRC32C is the same
//! digest as iSCSI's (complemented, little-endian on the wire).

pub mod error;
pub mod fpdu;
pub mod wire;

mod cm;
mod mr;
mod qp;
mod verbs;

pub use cm::{ConnectParams, ConnectRequest, accept_request, connect};
pub use error::{Error, TerminateReason};
pub use mr::{Access, MemoryRegion, ProtectionDomain};
pub use qp::{PeerParams, QueuePair};
pub use verbs::{
    Completion, CompletionQueue, LocalBuffer, QpCaps, RecvRequest, RemoteBuffer, SendOp,
    SendRequest, Sge, WcOpcode, WcStatus,
};
