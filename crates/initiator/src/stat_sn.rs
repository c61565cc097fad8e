//! ExpStatSN with holes (RFC 7143 4.2.2.2, 7.9): which statuses of a
//! connection have arrived, so that ExpStatSN acknowledges only those
//! before the first one missing, and a status lost in a gap (a header
//! digest error, a PDU dropped on the way) is noticed once, when a later
//! one shows the gap. At ERL 1 the initiator asks for the missing ones
//! with a Status SNACK; the target keeps every status ExpStatSN has not
//! passed, so ExpStatSN must not pass a missing one.

use std::collections::BTreeSet;

use iscsi_proto::serial::StatSn;

/// The most statuses remembered past a hole; beyond that the connection
/// has lost so much that the caller gives up on it.
const MAX_AHEAD: usize = 4096;

/// The StatSNs of one connection: the next expected and those received
/// past a hole.
#[derive(Debug)]
pub(crate) struct StatSns {
    expected: StatSn,
    /// Received after a hole, as offsets from `expected`.
    ahead: BTreeSet<u32>,
}

/// What one status's StatSN means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arrived {
    /// In order, or filling a hole, or a repeat: nothing is missing that
    /// was not already known.
    Fine,
    /// It opened a hole: `count` statuses from `first` on are missing.
    Gap {
        /// The first missing StatSN.
        first: StatSn,
        /// How many are missing.
        count: u32,
    },
    /// Too many statuses past a hole to keep track of.
    Overflow,
}

impl StatSns {
    /// A connection whose next status has StatSN `expected` (from login).
    pub fn new(expected: StatSn) -> StatSns {
        StatSns {
            expected,
            ahead: BTreeSet::new(),
        }
    }

    /// ExpStatSN: every status before it has arrived.
    pub fn expected(&self) -> StatSn {
        self.expected
    }

    /// Takes note of a status with `stat_sn`.
    pub fn arrived(&mut self, stat_sn: StatSn) -> Arrived {
        if stat_sn.lt(self.expected) {
            return Arrived::Fine;
        }
        let offset = stat_sn.get().wrapping_sub(self.expected.get());
        if offset == 0 {
            self.expected = self.expected.next();
            // Shift what was ahead down by one; the hole may close.
            let mut ahead = BTreeSet::new();
            for &later in &self.ahead {
                ahead.insert(later - 1);
            }
            while ahead.first() == Some(&0) {
                ahead.pop_first();
                self.expected = self.expected.next();
                ahead = ahead.into_iter().map(|o| o - 1).collect();
            }
            self.ahead = ahead;
            return Arrived::Fine;
        }
        let highest = self.ahead.last().copied();
        if !self.ahead.insert(offset) {
            return Arrived::Fine;
        }
        if self.ahead.len() > MAX_AHEAD {
            return Arrived::Overflow;
        }
        match highest {
            // Inside a hole already known: it fills part of it.
            Some(highest) if offset < highest => Arrived::Fine,
            // Past everything seen: the ones between are newly missing.
            _ => {
                let from = highest.map_or(0, |h| h + 1);
                if offset == from {
                    Arrived::Fine
                } else {
                    Arrived::Gap {
                        first: StatSn::new(self.expected.get().wrapping_add(from)),
                        count: offset - from,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sn(n: u32) -> StatSn {
        StatSn::new(n)
    }

    #[test]
    fn in_order_statuses_advance_expstatsn() {
        let mut sns = StatSns::new(sn(10));
        assert_eq!(sns.arrived(sn(10)), Arrived::Fine);
        assert_eq!(sns.arrived(sn(11)), Arrived::Fine);
        assert_eq!(sns.expected(), sn(12));
        assert_eq!(sns.arrived(sn(5)), Arrived::Fine, "a repeat");
        assert_eq!(sns.expected(), sn(12));
    }

    #[test]
    fn a_hole_is_reported_once_and_holds_expstatsn_until_filled() {
        let mut sns = StatSns::new(sn(10));
        assert_eq!(
            sns.arrived(sn(12)),
            Arrived::Gap {
                first: sn(10),
                count: 2
            }
        );
        assert_eq!(sns.expected(), sn(10), "not past the hole");
        assert_eq!(sns.arrived(sn(13)), Arrived::Fine, "no new hole");
        assert_eq!(
            sns.arrived(sn(16)),
            Arrived::Gap {
                first: sn(14),
                count: 2
            }
        );
        assert_eq!(sns.arrived(sn(11)), Arrived::Fine);
        assert_eq!(sns.expected(), sn(10));
        assert_eq!(sns.arrived(sn(10)), Arrived::Fine);
        assert_eq!(sns.expected(), sn(14), "10-13 all in");
        assert_eq!(sns.arrived(sn(15)), Arrived::Fine);
        assert_eq!(sns.arrived(sn(14)), Arrived::Fine);
        assert_eq!(sns.expected(), sn(17));
    }

    #[test]
    fn holes_across_the_wrap() {
        let mut sns = StatSns::new(sn(u32::MAX));
        assert_eq!(
            sns.arrived(sn(1)),
            Arrived::Gap {
                first: sn(u32::MAX),
                count: 2
            }
        );
        sns.arrived(sn(u32::MAX));
        sns.arrived(sn(0));
        assert_eq!(sns.expected(), sn(2));
    }
}
