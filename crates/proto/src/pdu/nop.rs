//! NOP-Out and NOP-In (RFC 7143 sections 11.18 and 11.19): pings, and the
//! target's way to advance the command window without other traffic.

use super::bhs::Lun;
use super::wire::BHS_LEN;
use super::wire::{immediate, opcode_byte, put_sn, put_u32, put_u64, sn_at, u32_at, u64_at};
use crate::serial::{CmdSn, StatSn};

/// NOP-Out PDU, opcode 0x00 (RFC 7143 section 11.18). Ping data, if any, is
/// the data segment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NopOut {
    /// I bit: immediate delivery.
    pub immediate: bool,
    /// LUN (echoed when answering a NOP-In).
    pub lun: Lun,
    /// Initiator Task Tag; 0xffffffff when no NOP-In answer is wanted
    /// (11.18.1).
    pub initiator_task_tag: u32,
    /// Target Transfer Tag of the NOP-In being answered, else 0xffffffff
    /// (11.18.2).
    pub target_transfer_tag: u32,
    /// CmdSN.
    pub cmd_sn: CmdSn,
    /// ExpStatSN.
    pub exp_stat_sn: StatSn,
}

impl NopOut {
    /// Decodes from a BHS with opcode 0x00.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        NopOut {
            immediate: immediate(b),
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            target_transfer_tag: u32_at(b, 20),
            cmd_sn: sn_at(b, 24),
            exp_stat_sn: sn_at(b, 28),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = opcode_byte(0x00, self.immediate);
        b[1] = 0x80;
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.target_transfer_tag);
        put_sn(b, 24, self.cmd_sn);
        put_sn(b, 28, self.exp_stat_sn);
    }
}

/// NOP-In PDU, opcode 0x20 (RFC 7143 section 11.19).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NopIn {
    /// LUN.
    pub lun: Lun,
    /// Initiator Task Tag of the NOP-Out answered, or 0xffffffff for a
    /// target-initiated ping (section 11.19).
    pub initiator_task_tag: u32,
    /// Target Transfer Tag: not 0xffffffff when the target wants a NOP-Out
    /// answer (11.19.1).
    pub target_transfer_tag: u32,
    /// StatSN (11.19.2).
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
}

impl NopIn {
    /// Decodes from a BHS with opcode 0x20.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        NopIn {
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            target_transfer_tag: u32_at(b, 20),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x20;
        b[1] = 0x80;
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.target_transfer_tag);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
    }
}
