//! The subcommands of `iscsi`, one module each, and what the initiator
//! subcommands share (`initiator_args`, `missing_lun`, and `claim`: one
//! disk per LUN on a host).

pub mod attach;
pub mod bench;
pub mod claim;
pub mod crc_bench;
pub mod discover;
pub mod fault_proxy;
pub mod initiator_args;
pub mod inspect;
pub mod measure;
pub mod missing_lun;
pub mod model;
pub mod mount;
pub mod pdu_bench;
pub mod pdu_cost;
pub mod relay;
pub mod script;
pub mod sweep;
pub mod target;
pub mod target_control;
pub mod trace_report;
pub mod transfer;
pub mod verify;
