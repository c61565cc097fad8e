//! Time-stamped traces of iSCSI connections, and the table made from them.
//!
//! The FKT study of Chadda, Palekar and Russell (section 4) traced every
//! step of their initiator with probes and turned the trace into a table
//! of cycles, count, average and share per routine. This crate does the
//! same for iscsi-rs, with the [`WireTap`](iscsi_datamover::tap::WireTap)
//! as the probe:
//!
//! - [`TraceWriter`] writes the Chrome Trace Event Format (a JSON object
//!   with `traceEvents`, opened by Perfetto and `chrome://tracing`): one
//!   complete event (`"ph":"X"`) per PDU sent or received, one per SCSI
//!   command from its command PDU to its status, and one per step a driver
//!   reports between them (the target's SCSI execution). Times are in
//!   microseconds since the trace began.
//! - [`report`] reads such a trace back (or any Chrome trace) and sums it
//!   per step: total time, count, average, share of the connections' time.
//!
//! Tracks: `pid` is the process (named by a `process_name` metadata
//! event), and each connection has several `tid`s, `connection *`
//! [`TRACKS_PER_CONNECTION`] `+ track`: received PDUs, sent PDUs, then one
//! lane per command in flight. A timeline draws only nested slices on one
//! track, and a connection's commands overlap each other and its two
//! directions overlap too, so one track per connection would not draw.

pub mod names;
pub mod report;
mod writer;

pub use writer::TraceWriter;

/// `tid`s per connection: connection `n` has `n * 1000` to `n * 1000 + 999`.
pub const TRACKS_PER_CONNECTION: u64 = 1000;
/// The track of the PDUs a connection received.
pub const RECEIVE_TRACK: u32 = 0;
/// The track of the PDUs a connection sent.
pub const SEND_TRACK: u32 = 1;
/// The first command lane.
pub const FIRST_LANE_TRACK: u32 = 2;
/// The track of steps whose command is not in flight (a step reported
/// after its status, or for a command the trace never saw).
pub const STEP_TRACK: u32 = 999;
/// Command lanes per connection; commands beyond share the last.
pub const COMMAND_LANES: u32 = STEP_TRACK - FIRST_LANE_TRACK;

#[cfg(test)]
mod tests;
