//! The subcommands of `iscsi`, one module each.

pub mod crc_bench;
