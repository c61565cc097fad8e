//! The iSCSI initiator: an async client library over the sans-I/O protocol
//! core (`iscsi-proto`) and the TCP datamover (`iscsi-datamover`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), iscsi_initiator::Error> {
//! use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
//! let url: IscsiUrl = "iscsi://127.0.0.1:3260/iqn.2026-11.rs.iscsi:target0/0".parse()?;
//! let session = Session::connect(&url, SessionConfig::default()).await?;
//! let capacity = session.read_capacity(url.lun).await?;
//! let mut block = vec![0u8; capacity.block_size as usize];
//! block = session.read(url.lun, 0, capacity.block_size, block).await?;
//! session.logout().await?;
//! # Ok(()) }
//! ```
//!
//! | module | owns |
//! |---|---|
//! | [`url`] | the libiscsi URL form `iscsi://[user[%secret]@]host[:port]/target-iqn/lun` |
//! | [`config`] | [`SessionConfig`]: names, every negotiation key, CHAP, timeouts, connections and their scheduling |
//! | [`error`] | [`Error`]: whose fault a failure was (ours, the network's, the target's protocol, SCSI status) |
//! | `login` | one connection's TCP connect and login phase (RFC 7143 section 6), driving `iscsi_proto::login::initiator` |
//! | [`disk`] | [`Disk`]: a LUN addressed in bytes as an operating system's disk is (partial blocks, maximum transfer, discard, write-zeroes), its limits, and failures as errno values: what `iscsi mount` and `iscsi attach` share |
//! | [`discovery`] | SendTargets in a discovery session (RFC 7143 section 11.10, Appendix C) |
//! | `connection` | one full feature phase connection: the reader task, the task table, Data-In placement, R2T routing, NOP-In answers |
//! | [`session`] | [`Session`]: the CmdSN window, ITT allocation, command execution with immediate/unsolicited/solicited data, task management, logout, ERL 0 reinstatement and retry, MC/S scheduling |
//! | [`command`] | [`Command`] and [`Response`]: a SCSI command and what came back (status, sense, residual) |
//! | `buffers` | the session's pool of read buffers, attached to pooled reads when their data arrives |
//! | [`multipath`] | [`Multipath`]: one LU through several sessions (a portal or gateway each), matched by VPD 83h, I/O to the active/optimized path by REPORT TARGET PORT GROUPS, commands moved off a failed path by the resend rule of `multipath::alua` |
//! | [`scsi`] | CDB builders and parsers for the helpers (INQUIRY, READ CAPACITY, READ/WRITE, SYNCHRONIZE CACHE, UNMAP, REPORT LUNS, TEST UNIT READY) |

mod buffers;
pub mod command;
pub mod config;
mod connection;
pub mod discovery;
pub mod disk;
pub mod error;
mod login;
pub mod multipath;
pub mod scsi;
mod sense;
pub mod session;
pub mod url;

pub use command::{Command, DataTransfer, Residual, Response, Sense};
pub use config::{ChapConfig, Coalescing, Scheduling, SessionConfig, Timeouts};
pub use discovery::{DiscoveredTarget, discover, discover_url};
pub use disk::{Disk, DiskLimits};
pub use error::Error;
pub use multipath::{Multipath, MultipathConfig, PathStatus};
pub use scsi::{Capacity, InquiryData};
pub use session::{InFlight, SendStatistics, Session, with_connection_affinity};
pub use url::IscsiUrl;

pub use iscsi_datamover::tap::{
    Direction, PduEvent, PduSummary, StepEvent, Tap, WireCounter, WireCounts, WireTap,
};
