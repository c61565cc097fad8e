//! The iSCSI target driver: the thin async layer between TCP and the
//! sans-I/O protocol core (`iscsi-proto`) and SCSI target core
//! (`iscsi-scsi`).
//!
//! - [`config`]: targets, LUNs, portals, CHAP, negotiation defaults.
//! - [`server`]: listeners (TCP and iSER portals), one task per connection, shutdown.
//! - `iser`: the RDMA stream of an iSER portal's connection (MPA with the
//!   iSER CM header) and what login negotiates on it (RFC 7145 section 6).
//! - `policy`: the login decisions the protocol core asks for (which target,
//!   which session).
//! - `login_log`: the one WARN line of each refused or timed-out login:
//!   initiator, address, portal, target, status and the reason in words.
//! - [`metrics`]: Prometheus counters per target and LUN, summed at
//!   scrape time, and the `GET /metrics` endpoint.
//! - `session`: the full feature phase of one connection: SCSI commands,
//!   Data-In with phase collapse, R2T and Data-Out, NOP, Text (SendTargets),
//!   Logout, task management, Reject.
//!
//! Threads or async: tokio, one task per connection. A connection's PDUs are
//! processed in order by its task, so a command's data flow needs no locks;
//! sessions and backstores are shared behind `Arc`.

pub mod config;
mod connection;
pub mod control;
pub mod exporter;
mod iser;
mod login_log;
pub mod metrics;
mod pending;
mod policy;
pub mod qos;
mod recovery;
mod registry;
pub mod reload;
mod serve;
pub mod server;
mod session;
pub mod shards;
mod shared;
pub mod status;
mod task;
mod writer;

pub use config::file::{ConfigError, DEFAULT_NOP_IN_INTERVAL, ParsedConfig};
pub use config::lun::{LunSpec, open_lun, open_lun_in, parse_size, unique_id};
pub use config::{
    DEFAULT_BUFFER_POOL_BYTES, DEFAULT_SEND_BUFFER_BYTES, LunEntry, TargetConfig, TargetEntry,
    check_gateway_group, numbered, parse_company_id, send_buffer_from_kib,
};
pub use server::{Server, ServerHandle, serve};
