//! The sequence numbers a target stamps into every PDU it sends, at the
//! moment it sends it: StatSN (RFC 7143 section 4.2.2.2, one sequence per
//! connection) and the session's ExpCmdSN and MaxCmdSN (section 4.2.2.1).
//!
//! A status (SCSI Response, Task Management Response, Logout Response,
//! Text Response, a NOP-In that answers a NOP-Out, Reject, Async Message)
//! takes the next StatSN and advances it; an R2T and an unsolicited
//! NOP-In carry the next one without advancing it; a Data-In without
//! status carries none (reserved, zero); a status sent again for a SNACK
//! carries the StatSN it first had. The connection's sender asks this
//! under the lock that orders its PDUs, so StatSNs go out in order.

use iscsi_proto::pdu::Pdu;
use iscsi_proto::serial::{CmdSn, StatSn};

use crate::planted::{self, Bug};

/// Which StatSN a PDU carries (RFC 7143 section 4.2.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// A status or response: the next StatSN, which then advances.
    Advance,
    /// The next StatSN, not advanced (R2T, unsolicited NOP-In).
    Current,
    /// None (Data-In without status): reserved, sent as zero.
    Reserved,
    /// A status sent again in answer to a SNACK: the StatSN it first had.
    Again(StatSn),
}

/// One connection's StatSN sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatSequence {
    next: StatSn,
}

impl StatSequence {
    /// A sequence whose first status carries `first` (the login's last
    /// StatSN plus one, or the ExpStatSN of a reinstated connection).
    #[inline]
    pub fn new(first: StatSn) -> Self {
        Self { next: first }
    }

    /// The StatSN the next status will carry.
    #[inline]
    pub fn next(&self) -> StatSn {
        self.next
    }

    /// The StatSN a PDU sent now carries, per `stat`; a status advances the
    /// sequence.
    #[inline]
    pub fn take(&mut self, stat: Stat) -> StatSn {
        match stat {
            Stat::Advance => {
                let sn = self.next;
                if !(planted::active(Bug::StatSnNotAdvanced) && sn.get() % 64 == 63) {
                    self.next = sn.next();
                }
                sn
            }
            Stat::Current => self.next,
            Stat::Reserved => StatSn::new(0),
            Stat::Again(sn) => sn,
        }
    }

    /// Stamps `pdu` as it leaves now: its StatSN per `stat` (advancing the
    /// sequence for a status) and the window's edges `exp` (ExpCmdSN) and
    /// `max` (MaxCmdSN).
    #[inline]
    pub fn stamp(&mut self, pdu: &mut Pdu, stat: Stat, exp: CmdSn, max: CmdSn) {
        let stat_sn = self.take(stat);
        stamp(pdu, stat_sn, exp, max);
    }
}

/// Writes the sequence numbers into a target PDU; an initiator's PDU has
/// no such fields and is left as it is.
#[inline]
fn stamp(pdu: &mut Pdu, stat_sn: StatSn, exp: CmdSn, max: CmdSn) {
    macro_rules! set {
        ($p:expr) => {{
            $p.stat_sn = stat_sn;
            $p.exp_cmd_sn = exp;
            $p.max_cmd_sn = max;
        }};
    }
    match pdu {
        Pdu::NopIn(p) => set!(p),
        Pdu::ScsiResponse(p) => set!(p),
        Pdu::TaskManagementResponse(p) => set!(p),
        Pdu::TextResponse(p) => set!(p),
        Pdu::DataIn(p) => set!(p),
        Pdu::LogoutResponse(p) => set!(p),
        Pdu::ReadyToTransfer(p) => set!(p),
        Pdu::AsyncMessage(p) => set!(p),
        Pdu::Reject(p) => set!(p),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::pdu::{DataIn, NopIn, NopOut, ReadyToTransfer, ScsiResponse};

    fn edges() -> (CmdSn, CmdSn) {
        (CmdSn::new(10), CmdSn::new(41))
    }

    #[test]
    fn a_status_advances_an_r2t_and_a_ping_do_not_data_in_carries_none() {
        let mut seq = StatSequence::new(StatSn::new(7));
        assert_eq!(seq.take(Stat::Current), StatSn::new(7));
        assert_eq!(seq.take(Stat::Advance), StatSn::new(7));
        assert_eq!(seq.take(Stat::Reserved), StatSn::new(0));
        assert_eq!(seq.next(), StatSn::new(8));
        assert_eq!(seq.take(Stat::Again(StatSn::new(3))), StatSn::new(3));
        assert_eq!(seq.take(Stat::Advance), StatSn::new(8));
        assert_eq!(seq.next(), StatSn::new(9));
    }

    #[test]
    fn statsn_wraps_at_two_to_the_32() {
        let mut seq = StatSequence::new(StatSn::new(u32::MAX));
        assert_eq!(seq.take(Stat::Advance), StatSn::new(u32::MAX));
        assert_eq!(seq.next(), StatSn::new(0));
    }

    #[test]
    fn every_target_pdu_gets_the_three_numbers() {
        let (exp, max) = edges();
        let mut seq = StatSequence::new(StatSn::new(100));
        let mut response = Pdu::ScsiResponse(ScsiResponse::default());
        seq.stamp(&mut response, Stat::Advance, exp, max);
        let Pdu::ScsiResponse(r) = &response else {
            unreachable!()
        };
        assert_eq!(
            (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn),
            (StatSn::new(100), exp, max)
        );

        let mut r2t = Pdu::ReadyToTransfer(ReadyToTransfer::default());
        seq.stamp(&mut r2t, Stat::Current, exp, max);
        let Pdu::ReadyToTransfer(r) = &r2t else {
            unreachable!()
        };
        assert_eq!(
            (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn),
            (StatSn::new(101), exp, max)
        );

        let mut data = Pdu::DataIn(DataIn::default());
        seq.stamp(&mut data, Stat::Reserved, exp, max);
        let Pdu::DataIn(d) = &data else {
            unreachable!()
        };
        assert_eq!(
            (d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn),
            (StatSn::new(0), exp, max)
        );

        let mut ping = Pdu::NopIn(NopIn::default());
        seq.stamp(&mut ping, Stat::Current, exp, max);
        let Pdu::NopIn(p) = &ping else { unreachable!() };
        assert_eq!(p.stat_sn, StatSn::new(101));
        assert_eq!(seq.next(), StatSn::new(101));
    }

    #[test]
    fn an_initiator_pdu_is_left_as_it_is() {
        let (exp, max) = edges();
        let mut seq = StatSequence::new(StatSn::new(5));
        let before = Pdu::NopOut(NopOut::default());
        let mut pdu = before.clone();
        seq.stamp(&mut pdu, Stat::Current, exp, max);
        assert_eq!(pdu, before);
    }
}
