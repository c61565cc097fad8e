//! A fault injector for iSCSI: a TCP proxy that understands PDU framing
//! well enough to corrupt a byte of a chosen PDU's header or data segment,
//! drop or delay a PDU, stall a connection, or cut it at a chosen PDU or
//! after a number of bytes, and logs exactly what it did.
//!
//! It serves the error-recovery work (RFC 7143 section 7): tests put it
//! between an initiator and a target to make the faults a real network
//! makes (a flipped bit that only a digest sees, a lost PDU, a reset
//! connection) happen at a chosen place, and check that nothing
//! acknowledged is lost. `iscsi fault-proxy` is the same proxy for users.
//!
//! - [`spec`]: what a fault is and its text form, e.g.
//!   `corrupt-data@data-in#3`;
//! - [`framing`]: where a PDU ends and when digests start (no I/O);
//! - [`plan`]: which faults fire on which PDU (no I/O);
//! - [`proxy`]: the threads that move the bytes.

pub mod framing;
pub mod plan;
pub mod proxy;
pub mod spec;

pub use proxy::{EventSink, FaultEvent, FaultProxy, Logging};
pub use spec::{Action, Direction, Fault, Matcher, Occurrence, SpecError};
