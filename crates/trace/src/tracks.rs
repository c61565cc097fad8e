//! Where a connection's events go in the trace: its tracks (`tid`s) and
//! the lanes of its commands.

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
