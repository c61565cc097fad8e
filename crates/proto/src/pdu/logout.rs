//! Logout Request and Logout Response (RFC 7143 sections 11.14 and 11.15).

use super::bhs::wire_enum;
use super::wire::BHS_LEN;
use super::wire::{immediate, opcode_byte, put_sn, put_u16, put_u32, sn_at, u16_at, u32_at};
use crate::serial::{CmdSn, StatSn};

wire_enum! {
    /// The Reason Code of a Logout Request (RFC 7143 section 11.14.1, 7
    /// bits).
    LogoutReason {
        /// 0: close the session (all connections).
        #[default]
        CloseSession = 0,
        /// 1: close the connection.
        CloseConnection = 1,
        /// 2: remove the connection for recovery.
        RemoveConnectionForRecovery = 2,
    }
    /// Any other value: reserved.
    Other
}

wire_enum! {
    /// The Response field of a Logout Response (RFC 7143 section 11.15.1).
    LogoutResponseCode {
        /// 0: connection or session closed successfully.
        #[default]
        ClosedSuccessfully = 0,
        /// 1: CID not found.
        CidNotFound = 1,
        /// 2: connection recovery is not supported.
        RecoveryNotSupported = 2,
        /// 3: cleanup failed for various reasons.
        CleanupFailed = 3,
    }
    /// Any other value: reserved.
    Other
}

/// Logout Request PDU, opcode 0x06 (RFC 7143 section 11.14).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LogoutRequest {
    /// I bit: immediate delivery.
    pub immediate: bool,
    /// Reason Code (11.14.1).
    pub reason: LogoutReason,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// CID of the connection to close, or reserved when closing the session
    /// (11.14.2).
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: CmdSn,
    /// ExpStatSN.
    pub exp_stat_sn: StatSn,
}

impl LogoutRequest {
    /// Decodes from a BHS with opcode 0x06.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        LogoutRequest {
            immediate: immediate(b),
            reason: LogoutReason::from_u8(b[1] & 0x7f),
            initiator_task_tag: u32_at(b, 16),
            cid: u16_at(b, 20),
            cmd_sn: sn_at(b, 24),
            exp_stat_sn: sn_at(b, 28),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = opcode_byte(0x06, self.immediate);
        b[1] = 0x80 | (self.reason.to_u8() & 0x7f);
        put_u32(b, 16, self.initiator_task_tag);
        put_u16(b, 20, self.cid);
        put_sn(b, 24, self.cmd_sn);
        put_sn(b, 28, self.exp_stat_sn);
    }
}

/// Logout Response PDU, opcode 0x26 (RFC 7143 section 11.15).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LogoutResponse {
    /// Response (11.15.1).
    pub response: LogoutResponseCode,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// StatSN.
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
    /// Time2Wait in seconds before reconnecting for recovery (11.15.2).
    pub time2wait: u16,
    /// Time2Retain in seconds the target keeps state for recovery (11.15.3).
    pub time2retain: u16,
}

impl LogoutResponse {
    /// Decodes from a BHS with opcode 0x26.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        LogoutResponse {
            response: LogoutResponseCode::from_u8(b[2]),
            initiator_task_tag: u32_at(b, 16),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
            time2wait: u16_at(b, 40),
            time2retain: u16_at(b, 42),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x26;
        b[1] = 0x80;
        b[2] = self.response.to_u8();
        put_u32(b, 16, self.initiator_task_tag);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
        put_u16(b, 40, self.time2wait);
        put_u16(b, 42, self.time2retain);
    }
}
