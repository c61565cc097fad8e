//! The sans-I/O core of an iSCSI target session: the protocol decisions a
//! session makes, as plain state machines with no sockets, no async
//! runtime and no clock. Time comes in as an argument; what to do goes out
//! as a value. `iscsi-target` is the driver (sockets, shards, timers, the
//! blocking pool); tests and a simulator can drive the same core in one
//! thread, deterministically.
//!
//! - [`answer`]: a finished command's Data-In, residual and status: in
//!   its last Data-In (phase collapse) or a SCSI Response of its own.
//! - [`command`]: where an admitted SCSI Command goes: a Reject, run at
//!   once, refused once its data is in, or a write collecting its data.
//! - [`window`]: the CmdSN window of a session (RFC 7143 section 4.2.2.1):
//!   which commands to deliver, which to drop as duplicates or out of
//!   window, and the ExpCmdSN/MaxCmdSN every response carries.
//! - [`tasks`]: the window and the task table together: which command PDUs
//!   are delivered, which live task holds each Initiator Task Tag.
//! - [`tags`]: the Target Transfer Tags of a connection.
//! - [`collect`]: the WRITEs of a connection collecting their data: where
//!   each Data-Out belongs, when a write is complete, what a failed one
//!   still waits for.
//! - [`solicit`]: the R2Ts of one WRITE: bursts asked for while the
//!   outstanding limit allows, kept for SNACKs, recovery R2Ts first.
//! - [`text`]: Text Requests in full feature phase: SendTargets,
//!   negotiation, long answers in parts.
//! - [`logout`]: what a Logout Request closes and what it answers.
//! - [`keepalive`]: NOP-In pings of an idle connection, and when to drop
//!   one that does not answer.
//! - [`stamp`]: StatSN, ExpCmdSN and MaxCmdSN stamped into every PDU sent.
//! - [`retention`]: ERL 1: the statuses and Data-In kept until
//!   acknowledged, and what answers a SNACK.
//! - [`planted`]: bugs planted for the simulator to find, only in its
//!   own build.
//! - [`orphans`]: ERL 2: what a failed connection leaves for a TASK
//!   REASSIGN, bounded, expiring with the connection's Time2Retain.

pub mod answer;
pub mod collect;
pub mod command;
pub mod keepalive;
pub mod logout;
pub mod orphans;
pub mod planted;
pub mod retention;
pub mod solicit;
pub mod stamp;
pub mod tags;
pub mod tasks;
pub mod text;
pub mod window;

pub use answer::{Answer, Collapsed, CollapsedPdu, Outcome, Residual};
pub use collect::{Advance, Collecting, Collections, Due, Inserted, Placement, Stray};
pub use keepalive::{Keepalive, KeepaliveAction};
pub use logout::{LogoutContext, LogoutPlan};
pub use solicit::Solicitation;
pub use stamp::{Stat, StatSequence};
pub use tags::TransferTags;
pub use tasks::{Arriving, Refusal, SessionTasks, TaskHandle};
pub use text::{TextAsk, TextExchange, TextReply};
pub use window::{Arrival, CommandWindow, Gaps, OutOfWindow};
