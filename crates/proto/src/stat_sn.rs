//! The initiator's ExpStatSN with holes (RFC 7143 4.2.2.2, 7.9): which statuses of a
//! connection have arrived, so that ExpStatSN acknowledges only those
//! before the first one missing, and a status lost in a gap (a header
//! digest error, a PDU dropped on the way) is noticed once, when a later
//! one shows the gap. At ERL 1 the initiator asks for the missing ones
//! with a Status SNACK; the target keeps every status ExpStatSN has not
//! passed, so ExpStatSN must not pass a missing one. Nor may it pass the
//! status of a read whose Data-In is still missing: the target would drop
//! that data, and the Data SNACK asking for it would be refused. Such a
//! status is *held*: seen (no gap), not acknowledged until released.

use std::collections::{BTreeSet, HashSet};

use crate::serial::StatSn;

/// The most statuses remembered past a hole; beyond that the connection
/// has lost so much that the caller gives up on it.
const MAX_AHEAD: usize = 4096;

/// The StatSNs of one connection: the next expected and those received
/// past a hole.
#[derive(Debug)]
pub struct StatSns {
    expected: StatSn,
    /// Received after a hole (or held), as offsets from `expected`.
    ahead: BTreeSet<u32>,
    /// Received but not to be acknowledged yet.
    held: HashSet<u32>,
}

/// What one status's StatSN means.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrived {
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
            held: HashSet::new(),
        }
    }

    /// ExpStatSN: every status before it has arrived.
    pub fn expected(&self) -> StatSn {
        self.expected
    }

    /// Takes note of a status with `stat_sn`; `hold` keeps ExpStatSN from
    /// passing it until [`StatSns::release`].
    pub fn arrived(&mut self, stat_sn: StatSn, hold: bool) -> Arrived {
        if stat_sn.lt(self.expected) {
            return Arrived::Fine;
        }
        if hold {
            self.held.insert(stat_sn.get());
        }
        let offset = stat_sn.get().wrapping_sub(self.expected.get());
        let highest = self.ahead.last().copied();
        if !self.ahead.insert(offset) {
            return Arrived::Fine;
        }
        if self.ahead.len() > MAX_AHEAD {
            return Arrived::Overflow;
        }
        let arrived = match highest {
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
        };
        self.advance();
        arrived
    }

    /// Lets ExpStatSN pass a status held by [`StatSns::arrived`].
    pub fn release(&mut self, stat_sn: StatSn) {
        if self.held.remove(&stat_sn.get()) {
            self.advance();
        }
    }

    /// Moves ExpStatSN past every status received in order and not held.
    fn advance(&mut self) {
        let mut passed = 0;
        while self.ahead.first() == Some(&passed) && !self.held.contains(&self.expected.get()) {
            self.ahead.pop_first();
            self.expected = self.expected.next();
            passed += 1;
        }
        if passed > 0 {
            self.ahead = self.ahead.iter().map(|offset| offset - passed).collect();
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
        assert_eq!(sns.arrived(sn(10), false), Arrived::Fine);
        assert_eq!(sns.arrived(sn(11), false), Arrived::Fine);
        assert_eq!(sns.expected(), sn(12));
        assert_eq!(sns.arrived(sn(5), false), Arrived::Fine, "a repeat");
        assert_eq!(sns.expected(), sn(12));
    }

    #[test]
    fn a_hole_is_reported_once_and_holds_expstatsn_until_filled() {
        let mut sns = StatSns::new(sn(10));
        assert_eq!(
            sns.arrived(sn(12), false),
            Arrived::Gap {
                first: sn(10),
                count: 2
            }
        );
        assert_eq!(sns.expected(), sn(10), "not past the hole");
        assert_eq!(sns.arrived(sn(13), false), Arrived::Fine, "no new hole");
        assert_eq!(
            sns.arrived(sn(16), false),
            Arrived::Gap {
                first: sn(14),
                count: 2
            }
        );
        assert_eq!(sns.arrived(sn(11), false), Arrived::Fine);
        assert_eq!(sns.expected(), sn(10));
        assert_eq!(sns.arrived(sn(10), false), Arrived::Fine);
        assert_eq!(sns.expected(), sn(14), "10-13 all in");
        assert_eq!(sns.arrived(sn(15), false), Arrived::Fine);
        assert_eq!(sns.arrived(sn(14), false), Arrived::Fine);
        assert_eq!(sns.expected(), sn(17));
    }

    #[test]
    fn a_held_status_is_seen_but_not_acknowledged_until_released() {
        let mut sns = StatSns::new(sn(10));
        assert_eq!(sns.arrived(sn(10), true), Arrived::Fine);
        assert_eq!(sns.expected(), sn(10), "held");
        assert_eq!(
            sns.arrived(sn(11), false),
            Arrived::Fine,
            "no gap: 10 was seen"
        );
        assert_eq!(sns.expected(), sn(10));
        sns.release(sn(10));
        assert_eq!(sns.expected(), sn(12));
        sns.release(sn(10));
        assert_eq!(sns.expected(), sn(12), "releasing twice changes nothing");
    }

    #[test]
    fn holes_across_the_wrap() {
        let mut sns = StatSns::new(sn(u32::MAX));
        assert_eq!(
            sns.arrived(sn(1), false),
            Arrived::Gap {
                first: sn(u32::MAX),
                count: 2
            }
        );
        sns.arrived(sn(u32::MAX), false);
        sns.arrived(sn(0), false);
        assert_eq!(sns.expected(), sn(2));
    }
}
