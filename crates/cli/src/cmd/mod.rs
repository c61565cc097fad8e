//! The subcommands of `iscsi`, one module each.

pub mod crc_bench;
pub mod measure;
pub mod pdu_bench;
pub mod target;
