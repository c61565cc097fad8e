//! SNACK Request (RFC 7143 section 11.16): the initiator asks for
//! retransmission of Data-In, R2T or status, or acknowledges data.

use super::bhs::{Lun, wire_enum};
use super::wire::BHS_LEN;
use super::wire::{put_sn, put_u32, put_u64, sn_at, u32_at, u64_at};
use crate::serial::StatSn;

wire_enum! {
    /// The Type field of a SNACK (RFC 7143 section 11.16.1, 4 bits).
    SnackType {
        /// 0: Data/R2T SNACK, requesting Data-In or R2T PDUs again.
        #[default]
        DataR2t = 0,
        /// 1: Status SNACK, requesting status PDUs again.
        Status = 1,
        /// 2: DataACK, acknowledging Data-In PDUs.
        DataAck = 2,
        /// 3: R-Data SNACK, requesting Data-In PDUs re-segmented.
        RData = 3,
    }
    /// Any other value: reserved.
    Other
}

/// SNACK Request PDU, opcode 0x10 (RFC 7143 section 11.16).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SnackRequest {
    /// Type (11.16.1).
    pub snack_type: SnackType,
    /// LUN (DataACK) or reserved.
    pub lun: Lun,
    /// Initiator Task Tag, or 0xffffffff for a Status SNACK.
    pub initiator_task_tag: u32,
    /// Target Transfer Tag (DataACK), SNACK Tag (R-Data), or 0xffffffff
    /// (11.16.2).
    pub target_transfer_tag: u32,
    /// ExpStatSN.
    pub exp_stat_sn: StatSn,
    /// BegRun: the first DataSN, R2TSN or StatSN requested (11.16.3).
    pub beg_run: u32,
    /// RunLength: how many are requested, 0 for all from BegRun on
    /// (11.16.4).
    pub run_length: u32,
}

impl SnackRequest {
    /// Decodes from a BHS with opcode 0x10.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        SnackRequest {
            snack_type: SnackType::from_u8(b[1] & 0x0f),
            lun: Lun(u64_at(b, 8)),
            initiator_task_tag: u32_at(b, 16),
            target_transfer_tag: u32_at(b, 20),
            exp_stat_sn: sn_at(b, 28),
            beg_run: u32_at(b, 40),
            run_length: u32_at(b, 44),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x10;
        b[1] = 0x80 | (self.snack_type.to_u8() & 0x0f);
        put_u64(b, 8, self.lun.0);
        put_u32(b, 16, self.initiator_task_tag);
        put_u32(b, 20, self.target_transfer_tag);
        put_sn(b, 28, self.exp_stat_sn);
        put_u32(b, 40, self.beg_run);
        put_u32(b, 44, self.run_length);
    }
}
