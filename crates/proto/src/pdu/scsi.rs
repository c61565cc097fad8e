//! SCSI Command (RFC 7143 section 11.3) and SCSI Response (section 11.4).
//!
//! The CDB beyond 16 bytes and the bidirectional Expected Read-Data Length
//! travel in AHSs ([`super::Ahs`]); [`super::Header::full_cdb`] joins them.

use super::bhs::{Lun, wire_enum};
use super::wire::BHS_LEN;
use super::wire::{flag, immediate, opcode_byte, put_sn, put_u32, put_u64, sn_at, u32_at, u64_at};
use crate::serial::{CmdSn, DataSn, StatSn};

wire_enum! {
    /// The ATTR field of a SCSI Command: the SAM task attribute (RFC 7143
    /// section 11.3.1, 3 bits).
    TaskAttribute {
        /// 0: Untagged.
        Untagged = 0,
        /// 1: Simple.
        #[default]
        Simple = 1,
        /// 2: Ordered.
        Ordered = 2,
        /// 3: Head of queue.
        HeadOfQueue = 3,
        /// 4: ACA.
        Aca = 4,
    }
    /// 5-7: reserved.
    Reserved
}

/// SCSI Command PDU, opcode 0x01 (RFC 7143 section 11.3).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScsiCommand {
    /// I bit: immediate delivery (section 11.2.1.1).
    pub immediate: bool,
    /// F bit: no unsolicited Data-Out PDUs follow (section 11.3.1).
    pub final_flag: bool,
    /// R bit: data is expected from the target (a read).
    pub read: bool,
    /// W bit: data is expected from the initiator (a write).
    pub write: bool,
    /// ATTR: task attribute.
    pub attr: TaskAttribute,
    /// LUN.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// Expected Data Transfer Length (section 11.3.4).
    pub expected_data_transfer_length: u32,
    /// CmdSN.
    pub cmd_sn: CmdSn,
    /// ExpStatSN.
    pub exp_stat_sn: StatSn,
    /// The first 16 bytes of the CDB, zero-padded (section 11.3.5).
    pub cdb: [u8; 16],
}

impl ScsiCommand {
    /// Decodes from a BHS with opcode 0x01.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&b[32..48]);
        ScsiCommand {
            immediate: immediate(b),
            final_flag: b[1] & 0x80 != 0,
            read: b[1] & 0x40 != 0,
            write: b[1] & 0x20 != 0,
            attr: TaskAttribute::from_u8(b[1] & 0x07),
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            expected_data_transfer_length: u32_at(b, 20),
            cmd_sn: sn_at(b, 24),
            exp_stat_sn: sn_at(b, 28),
            cdb,
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = opcode_byte(0x01, self.immediate);
        b[1] = flag(self.final_flag, 0x80)
            | flag(self.read, 0x40)
            | flag(self.write, 0x20)
            | (self.attr.to_u8() & 0x07);
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.expected_data_transfer_length);
        put_sn(b, 24, self.cmd_sn);
        put_sn(b, 28, self.exp_stat_sn);
        b[32..48].copy_from_slice(&self.cdb);
    }
}

wire_enum! {
    /// The Response field of a SCSI Response (RFC 7143 section 11.4.3).
    ServiceResponse {
        /// 0x00: Command Completed at Target (status is valid).
        #[default]
        CommandCompleted = 0x00,
        /// 0x01: Target Failure.
        TargetFailure = 0x01,
    }
    /// 0x80-0xff vendor-specific, others reserved.
    Other
}

/// SCSI Response PDU, opcode 0x21 (RFC 7143 section 11.4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScsiResponse {
    /// o bit: Bidirectional Read Residual Overflow (section 11.4.1).
    pub bidi_read_residual_overflow: bool,
    /// u bit: Bidirectional Read Residual Underflow.
    pub bidi_read_residual_underflow: bool,
    /// O bit: Residual Overflow.
    pub residual_overflow: bool,
    /// U bit: Residual Underflow.
    pub residual_underflow: bool,
    /// Response (section 11.4.3).
    pub response: ServiceResponse,
    /// SCSI status, valid when `response` is CommandCompleted (section
    /// 11.4.2).
    pub status: u8,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// SNACK Tag, or 0 (section 11.4.6).
    pub snack_tag: u32,
    /// StatSN.
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
    /// ExpDataSN: the number of Data-In PDUs sent for the command (section
    /// 11.4.8), or 0.
    pub exp_data_sn: DataSn,
    /// Bidirectional Read Residual Count (section 11.4.5).
    pub bidi_read_residual_count: u32,
    /// Residual Count (section 11.4.5).
    pub residual_count: u32,
}

impl ScsiResponse {
    /// Decodes from a BHS with opcode 0x21.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        ScsiResponse {
            bidi_read_residual_overflow: b[1] & 0x10 != 0,
            bidi_read_residual_underflow: b[1] & 0x08 != 0,
            residual_overflow: b[1] & 0x04 != 0,
            residual_underflow: b[1] & 0x02 != 0,
            response: ServiceResponse::from_u8(b[2]),
            status: b[3],
            initiator_task_tag: u32_at(b, 16),
            snack_tag: u32_at(b, 20),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
            exp_data_sn: sn_at(b, 36),
            bidi_read_residual_count: u32_at(b, 40),
            residual_count: u32_at(b, 44),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x21;
        b[1] = 0x80
            | flag(self.bidi_read_residual_overflow, 0x10)
            | flag(self.bidi_read_residual_underflow, 0x08)
            | flag(self.residual_overflow, 0x04)
            | flag(self.residual_underflow, 0x02);
        b[2] = self.response.to_u8();
        b[3] = self.status;
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.snack_tag);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
        put_sn(b, 36, self.exp_data_sn);
        put_u32(b, 40, self.bidi_read_residual_count);
        put_u32(b, 44, self.residual_count);
    }
}
