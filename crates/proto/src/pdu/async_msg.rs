//! Asynchronous Message (RFC 7143 section 11.9): events the target reports
//! without a command, with SCSI sense data and iSCSI event data in the data
//! segment (section 11.9.4).

use super::bhs::{Lun, RESERVED_TAG, wire_enum};
use super::wire::BHS_LEN;
use super::wire::{put_sn, put_u16, put_u32, put_u64, sn_at, u16_at, u64_at};
use crate::serial::{CmdSn, StatSn};

wire_enum! {
    /// AsyncEvent (RFC 7143 section 11.9.1).
    AsyncEvent {
        /// 0: a SCSI asynchronous event, reported in the sense data.
        #[default]
        ScsiEvent = 0,
        /// 1: the target requests a Logout within Parameter3 seconds.
        LogoutRequest = 1,
        /// 2: the target will drop connection Parameter1 (Parameter2 =
        /// Time2Wait, Parameter3 = Time2Retain).
        ConnectionDrop = 2,
        /// 3: the target will drop all connections of the session.
        AllConnectionsDrop = 3,
        /// 4: the target requests parameter renegotiation (a Text exchange).
        NegotiationRequest = 4,
        /// 5: the target will soon terminate all tasks (Parameter3 seconds).
        TaskTermination = 5,
        /// 255: vendor-specific event (AsyncVCode).
        VendorSpecific = 255,
    }
    /// Any other value: reserved.
    Reserved
}

/// Asynchronous Message PDU, opcode 0x32 (RFC 7143 section 11.9). The
/// Initiator Task Tag is always 0xffffffff.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AsyncMessage {
    /// LUN (for a SCSI event) or reserved.
    pub lun: Lun,
    /// StatSN.
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
    /// AsyncEvent (11.9.1).
    pub async_event: AsyncEvent,
    /// AsyncVCode: vendor code for event 255 (11.9.2).
    pub async_vcode: u8,
    /// Parameter1 or reserved.
    pub parameter1: u16,
    /// Parameter2 or reserved.
    pub parameter2: u16,
    /// Parameter3 or reserved.
    pub parameter3: u16,
}

impl AsyncMessage {
    /// Decodes from a BHS with opcode 0x32.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        AsyncMessage {
            lun: Lun(u64_at(b, 8)),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
            async_event: AsyncEvent::from_u8(b[36]),
            async_vcode: b[37],
            parameter1: u16_at(b, 38),
            parameter2: u16_at(b, 40),
            parameter3: u16_at(b, 42),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x32;
        b[1] = 0x80;
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, RESERVED_TAG);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
        b[36] = self.async_event.to_u8();
        b[37] = self.async_vcode;
        put_u16(b, 38, self.parameter1);
        put_u16(b, 40, self.parameter2);
        put_u16(b, 42, self.parameter3);
    }
}
