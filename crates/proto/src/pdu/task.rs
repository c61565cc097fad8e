//! Task Management Function Request and Response (RFC 7143 sections 11.5
//! and 11.6).

use super::bhs::{Lun, wire_enum};
use super::wire::BHS_LEN;
use super::wire::{immediate, opcode_byte, put_sn, put_u32, put_u64, sn_at, u32_at, u64_at};
use crate::serial::{CmdSn, DataSn, StatSn};

wire_enum! {
    /// The Function field of a TMF request (RFC 7143 section 11.5.1, 7 bits).
    TaskFunction {
        /// 1: ABORT TASK, the task named by Referenced Task Tag.
        #[default]
        AbortTask = 1,
        /// 2: ABORT TASK SET, every task of this session on the LU.
        AbortTaskSet = 2,
        /// 3: CLEAR ACA.
        ClearAca = 3,
        /// 4: CLEAR TASK SET.
        ClearTaskSet = 4,
        /// 5: LOGICAL UNIT RESET.
        LogicalUnitReset = 5,
        /// 6: TARGET WARM RESET.
        TargetWarmReset = 6,
        /// 7: TARGET COLD RESET.
        TargetColdReset = 7,
        /// 8: TASK REASSIGN, move a task's allegiance to this connection.
        TaskReassign = 8,
    }
    /// Any other value (0, 9-127): not defined by RFC 7143.
    Other
}

wire_enum! {
    /// The Response field of a TMF response (RFC 7143 section 11.6.1).
    TaskResponse {
        /// 0: Function complete.
        #[default]
        FunctionComplete = 0,
        /// 1: Task does not exist.
        TaskDoesNotExist = 1,
        /// 2: LUN does not exist.
        LunDoesNotExist = 2,
        /// 3: Task still allegiant.
        TaskStillAllegiant = 3,
        /// 4: Task allegiance reassignment not supported.
        TaskReassignmentNotSupported = 4,
        /// 5: Task management function not supported.
        FunctionNotSupported = 5,
        /// 6: Function authorization failed.
        AuthorizationFailed = 6,
        /// 255: Function rejected.
        FunctionRejected = 255,
    }
    /// Any other value: reserved.
    Other
}

/// Task Management Function Request, opcode 0x02 (RFC 7143 section 11.5).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskManagementRequest {
    /// I bit: immediate delivery.
    pub immediate: bool,
    /// Function (section 11.5.1).
    pub function: TaskFunction,
    /// LUN, or reserved for target-wide functions.
    pub lun: Lun,
    /// Initiator Task Tag of this request.
    pub initiator_task_tag: u32,
    /// Referenced Task Tag (ABORT TASK, TASK REASSIGN) or 0xffffffff
    /// (section 11.5.2).
    pub referenced_task_tag: u32,
    /// CmdSN.
    pub cmd_sn: CmdSn,
    /// ExpStatSN.
    pub exp_stat_sn: StatSn,
    /// RefCmdSN: the CmdSN of the task to abort (ABORT TASK), else reserved
    /// (section 11.5.3).
    pub ref_cmd_sn: CmdSn,
    /// ExpDataSN for TASK REASSIGN, else reserved (section 11.5.4).
    pub exp_data_sn: DataSn,
}

impl TaskManagementRequest {
    /// Decodes from a BHS with opcode 0x02.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        TaskManagementRequest {
            immediate: immediate(b),
            function: TaskFunction::from_u8(b[1] & 0x7f),
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            referenced_task_tag: u32_at(b, 20),
            cmd_sn: sn_at(b, 24),
            exp_stat_sn: sn_at(b, 28),
            ref_cmd_sn: sn_at(b, 32),
            exp_data_sn: sn_at(b, 36),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = opcode_byte(0x02, self.immediate);
        b[1] = 0x80 | (self.function.to_u8() & 0x7f);
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.referenced_task_tag);
        put_sn(b, 24, self.cmd_sn);
        put_sn(b, 28, self.exp_stat_sn);
        put_sn(b, 32, self.ref_cmd_sn);
        put_sn(b, 36, self.exp_data_sn);
    }
}

/// Task Management Function Response, opcode 0x22 (RFC 7143 section 11.6).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskManagementResponse {
    /// Response (section 11.6.1).
    pub response: TaskResponse,
    /// Initiator Task Tag of the request.
    pub initiator_task_tag: u32,
    /// StatSN.
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
}

impl TaskManagementResponse {
    /// Decodes from a BHS with opcode 0x22.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        TaskManagementResponse {
            response: TaskResponse::from_u8(b[2]),
            initiator_task_tag: u32_at(b, 16),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x22;
        b[1] = 0x80;
        b[2] = self.response.to_u8();
        put_u32(b, 16, self.initiator_task_tag);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
    }
}
