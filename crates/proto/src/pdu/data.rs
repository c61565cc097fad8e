//! SCSI Data-Out and Data-In (RFC 7143 section 11.7) and Ready To Transfer
//! (R2T, section 11.8): the PDUs that move a command's data.

use super::bhs::Lun;
use super::wire::BHS_LEN;
use super::wire::{flag, put_sn, put_u32, put_u64, sn_at, u32_at, u64_at};
use crate::serial::{CmdSn, DataSn, R2tSn, StatSn};

/// SCSI Data-Out PDU, opcode 0x05 (RFC 7143 section 11.7).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DataOut {
    /// F bit: last PDU of the sequence (section 11.7.1).
    pub final_flag: bool,
    /// LUN (or reserved, section 11.7.3).
    pub lun: Lun,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// Target Transfer Tag from the R2T, or 0xffffffff for unsolicited data
    /// (section 11.7.4).
    pub target_transfer_tag: u32,
    /// ExpStatSN.
    pub exp_stat_sn: StatSn,
    /// DataSN within the sequence (section 11.7.5).
    pub data_sn: DataSn,
    /// Buffer Offset (section 11.7.6).
    pub buffer_offset: u32,
}

impl DataOut {
    /// Decodes from a BHS with opcode 0x05.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        DataOut {
            final_flag: b[1] & 0x80 != 0,
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            target_transfer_tag: u32_at(b, 20),
            exp_stat_sn: sn_at(b, 28),
            data_sn: sn_at(b, 36),
            buffer_offset: u32_at(b, 40),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x05;
        b[1] = flag(self.final_flag, 0x80);
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.target_transfer_tag);
        put_sn(b, 28, self.exp_stat_sn);
        put_sn(b, 36, self.data_sn);
        put_u32(b, 40, self.buffer_offset);
    }
}

/// SCSI Data-In PDU, opcode 0x25 (RFC 7143 section 11.7).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DataIn {
    /// F bit: last PDU of the sequence (section 11.7.1).
    pub final_flag: bool,
    /// A bit: the target asks for a DataACK SNACK (section 11.7.2).
    pub acknowledge: bool,
    /// O bit: Residual Overflow (valid with the S bit).
    pub residual_overflow: bool,
    /// U bit: Residual Underflow (valid with the S bit).
    pub residual_underflow: bool,
    /// The S bit and the SCSI status: `Some(status)` when this PDU carries
    /// the command's status (phase collapse, section 11.7.3), else `None`
    /// and the status byte is reserved.
    pub status: Option<u8>,
    /// LUN (with the A bit) or reserved.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// Target Transfer Tag (with the A bit) or 0xffffffff (section 11.7.4).
    pub target_transfer_tag: u32,
    /// StatSN (with the S bit) or reserved.
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
    /// DataSN, counted over the whole command (section 11.7.5).
    pub data_sn: DataSn,
    /// Buffer Offset (section 11.7.6).
    pub buffer_offset: u32,
    /// Residual Count (with the S bit, section 11.7.7).
    pub residual_count: u32,
}

impl DataIn {
    /// Decodes from a BHS with opcode 0x25.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        DataIn {
            final_flag: b[1] & 0x80 != 0,
            acknowledge: b[1] & 0x40 != 0,
            residual_overflow: b[1] & 0x04 != 0,
            residual_underflow: b[1] & 0x02 != 0,
            status: (b[1] & 0x01 != 0).then_some(b[3]),
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            target_transfer_tag: u32_at(b, 20),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
            data_sn: sn_at(b, 36),
            buffer_offset: u32_at(b, 40),
            residual_count: u32_at(b, 44),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x25;
        b[1] = flag(self.final_flag, 0x80)
            | flag(self.acknowledge, 0x40)
            | flag(self.residual_overflow, 0x04)
            | flag(self.residual_underflow, 0x02)
            | flag(self.status.is_some(), 0x01);
        b[3] = self.status.unwrap_or(0);
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.target_transfer_tag);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
        put_sn(b, 36, self.data_sn);
        put_u32(b, 40, self.buffer_offset);
        put_u32(b, 44, self.residual_count);
    }
}

/// Ready To Transfer (R2T) PDU, opcode 0x31 (RFC 7143 section 11.8).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReadyToTransfer {
    /// LUN.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// Target Transfer Tag, copied into the solicited Data-Out PDUs
    /// (section 11.8.4).
    pub target_transfer_tag: u32,
    /// StatSN (the next StatSN, not advanced, section 11.8).
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
    /// R2TSN (section 11.8.2).
    pub r2t_sn: R2tSn,
    /// Buffer Offset of the requested data (section 11.8.3).
    pub buffer_offset: u32,
    /// Desired Data Transfer Length (section 11.8.3).
    pub desired_data_transfer_length: u32,
}

impl ReadyToTransfer {
    /// Decodes from a BHS with opcode 0x31.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        ReadyToTransfer {
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            target_transfer_tag: u32_at(b, 20),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
            r2t_sn: sn_at(b, 36),
            buffer_offset: u32_at(b, 40),
            desired_data_transfer_length: u32_at(b, 44),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x31;
        b[1] = 0x80;
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.target_transfer_tag);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
        put_sn(b, 36, self.r2t_sn);
        put_u32(b, 40, self.buffer_offset);
        put_u32(b, 44, self.desired_data_transfer_length);
    }
}
