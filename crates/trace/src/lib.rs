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
mod tracks;
mod writer;

pub use writer::TraceWriter;

pub use tracks::{
    COMMAND_LANES, FIRST_LANE_TRACK, RECEIVE_TRACK, SEND_TRACK, STEP_TRACK, TRACKS_PER_CONNECTION,
};

#[cfg(test)]
mod tests;
