//! Reject (RFC 7143 section 11.17): the answer to a PDU that cannot be
//! processed. The data segment carries the complete header (BHS) of the
//! rejected PDU.

use super::bhs::{RESERVED_TAG, wire_enum};
use super::wire::BHS_LEN;
use super::wire::{put_sn, put_u32, sn_at, u32_at};
use crate::serial::{CmdSn, StatSn};

wire_enum! {
    /// The Reason field of a Reject (RFC 7143 section 11.17.1; IANA "iSCSI
    /// Reject Reason Codes"). RFC 7143 has no reason for a header digest
    /// error: such a PDU is discarded and, without a sync layer, the
    /// connection dropped (section 7.8).
    RejectReason {
        /// 0x01: reserved (never sent).
        Reserved = 0x01,
        /// 0x02: data (payload) digest error; the PDU is discarded and may be
        /// resent (section 7.8).
        DataDigestError = 0x02,
        /// 0x03: SNACK Reject (the SNACK cannot be honoured).
        SnackReject = 0x03,
        /// 0x04: protocol error (e.g. a SNACK for a status already
        /// acknowledged); the connection may be closed.
        #[default]
        ProtocolError = 0x04,
        /// 0x05: command not supported.
        CommandNotSupported = 0x05,
        /// 0x06: immediate command rejected, too many immediate commands.
        ImmediateCommandReject = 0x06,
        /// 0x07: task in progress.
        TaskInProgress = 0x07,
        /// 0x08: invalid data ack.
        InvalidDataAck = 0x08,
        /// 0x09: invalid PDU field (e.g. a bad ITT or TTT).
        InvalidPduField = 0x09,
        /// 0x0a: long operation reject, out of resources to generate a TTT.
        LongOpReject = 0x0a,
        /// 0x0b: deprecated (was "negotiation reset"), must not be sent.
        Deprecated = 0x0b,
        /// 0x0c: waiting for logout (after an Async logout request).
        WaitingForLogout = 0x0c,
    }
    /// Any other value: unassigned.
    Other
}

/// Reject PDU, opcode 0x3f (RFC 7143 section 11.17). The Initiator Task Tag
/// is always 0xffffffff.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reject {
    /// Reason (11.17.1).
    pub reason: RejectReason,
    /// StatSN.
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
    /// DataSN or R2TSN of a rejected SNACK-related PDU, else reserved
    /// (11.17.2).
    pub data_sn_or_r2t_sn: u32,
}

impl Reject {
    /// Decodes from a BHS with opcode 0x3f.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        Reject {
            reason: RejectReason::from_u8(b[2]),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
            data_sn_or_r2t_sn: u32_at(b, 36),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x3f;
        b[1] = 0x80;
        b[2] = self.reason.to_u8();
        put_u32(b, 16, RESERVED_TAG);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
        put_u32(b, 36, self.data_sn_or_r2t_sn);
    }
}
