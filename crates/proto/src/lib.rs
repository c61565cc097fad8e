//! The iSCSI protocol (RFC 7143) as pure state machines over bytes, in the
//! style of quinn-proto and rustls: no sockets, no async, no clocks, no
//! randomness. The target and initiator drivers feed it bytes and events and
//! do what it says; later the iSER datamover (RFC 7145) drives the same
//! logic over RDMA.
//!
//! Modules, each owning one concern:
//!
//! - [`pdu`]: the wire format of every PDU (RFC 7143 section 11), encoding
//!   into caller buffers for vectored writes, and the streaming receive
//!   decoder with digests (section 11.1, Appendix B.4) and length limits.
//! - [`serial`]: RFC 1982 serial number arithmetic for CmdSN, StatSN,
//!   DataSN and R2TSN, and the command window (section 4.2.2.1).
//! - [`error`]: the codec's errors, each naming whose fault it is and the
//!   RFC's answer (a Reject reason, or dropping the connection).
//! - [`text`]: `key=value` text, its continuation over PDUs, the table of
//!   every key (RFC 7143 section 13, RFC 7145 section 6) and the negotiation
//!   engine (section 6).
//! - [`login`]: the login's authentication exchange (CHAP, section 12.1.3).
//! - [`transfer`]: how a command's data is cut into immediate data,
//!   unsolicited Data-Out, R2T bursts and Data-In sequences, and the
//!   receiver's checks of each (sections 4.2.5, 11.7, 11.8, 13.10-13.19).
//! - [`stat_sn`]: the initiator's ExpStatSN over holes and statuses held
//!   for missing Data-In (sections 4.2.2.2, 7.9).
//!
//! Nothing here panics on peer input: every error is a typed value that
//! names the RFC's answer (a Reject reason, a login status, a dropped
//! connection).

// Wire format and arithmetic.
/// The codec's errors (`pdu/error.rs`: they name the PDU stages and
/// Reject reasons of `pdu`, so they live in its folder).
pub use pdu::error;
pub mod pdu;
pub mod serial;
pub mod state;

// Protocol logic built on them (more to come: session, datamover).
pub mod login;
pub mod stat_sn;
pub mod text;
pub mod transfer;
