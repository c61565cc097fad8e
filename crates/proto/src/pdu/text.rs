//! Text Request and Text Response (RFC 7143 sections 11.10 and 11.11). The
//! data segment is opaque here; the `text` module parses its key=value pairs.

use super::bhs::Lun;
use super::wire::BHS_LEN;
use super::wire::{flag, immediate, opcode_byte, put_sn, put_u32, put_u64, sn_at, u32_at, u64_at};
use crate::serial::{CmdSn, StatSn};

/// Text Request PDU, opcode 0x04 (RFC 7143 section 11.10).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TextRequest {
    /// I bit: immediate delivery.
    pub immediate: bool,
    /// F bit: the initiator's last text of the exchange (11.10.1).
    pub final_flag: bool,
    /// C bit: the text continues in the next PDU (11.10.2).
    pub continue_flag: bool,
    /// LUN or reserved.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// Target Transfer Tag from the previous response, or 0xffffffff to
    /// start a new exchange (11.10.4).
    pub target_transfer_tag: u32,
    /// CmdSN.
    pub cmd_sn: CmdSn,
    /// ExpStatSN.
    pub exp_stat_sn: StatSn,
}

impl TextRequest {
    /// Decodes from a BHS with opcode 0x04.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        TextRequest {
            immediate: immediate(b),
            final_flag: b[1] & 0x80 != 0,
            continue_flag: b[1] & 0x40 != 0,
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            target_transfer_tag: u32_at(b, 20),
            cmd_sn: sn_at(b, 24),
            exp_stat_sn: sn_at(b, 28),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = opcode_byte(0x04, self.immediate);
        b[1] = flag(self.final_flag, 0x80) | flag(self.continue_flag, 0x40);
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.target_transfer_tag);
        put_sn(b, 24, self.cmd_sn);
        put_sn(b, 28, self.exp_stat_sn);
    }
}

/// Text Response PDU, opcode 0x24 (RFC 7143 section 11.11).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TextResponse {
    /// F bit: the target's last response of the exchange (11.11.1).
    pub final_flag: bool,
    /// C bit: the text continues in the next PDU (11.11.2).
    pub continue_flag: bool,
    /// LUN or reserved.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// Target Transfer Tag: not 0xffffffff when more responses follow
    /// (11.11.4).
    pub target_transfer_tag: u32,
    /// StatSN.
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
}

impl TextResponse {
    /// Decodes from a BHS with opcode 0x24.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        TextResponse {
            final_flag: b[1] & 0x80 != 0,
            continue_flag: b[1] & 0x40 != 0,
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
        b[0] = 0x24;
        b[1] = flag(self.final_flag, 0x80) | flag(self.continue_flag, 0x40);
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.target_transfer_tag);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
    }
}
