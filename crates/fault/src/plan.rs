//! Which faults fire on which PDU: counters shared by every connection of
//! a proxy, so that `#N` means the Nth matching PDU the proxy has seen.

use std::sync::{Mutex, PoisonError};

use iscsi_proto::pdu::Opcode;

use crate::spec::{Action, Direction, Fault, Matcher};

/// A fault firing on one PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Firing {
    /// Index of the fault in the plan.
    pub fault: usize,
    /// What to do.
    pub action: Action,
}

/// The faults of one proxy and how often each has matched and fired.
#[derive(Debug)]
pub struct Plan {
    faults: Vec<Fault>,
    counts: Mutex<Vec<Counts>>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    matched: u64,
    fired: u64,
}

impl Plan {
    /// A plan of `faults`, none matched yet.
    pub fn new(faults: Vec<Fault>) -> Plan {
        let counts = Mutex::new(vec![Counts::default(); faults.len()]);
        Plan { faults, counts }
    }

    /// The faults, in the order given.
    pub fn faults(&self) -> &[Fault] {
        &self.faults
    }

    /// How many times each fault has fired.
    pub fn fired(&self) -> Vec<u64> {
        self.lock().iter().map(|counts| counts.fired).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Counts>> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a PDU against every per-PDU fault and returns those that fire
    /// on it, in the plan's order. A `corrupt-data` fault counts only PDUs
    /// that have data to corrupt.
    pub fn on_pdu(&self, direction: Direction, opcode: Opcode, data_len: usize) -> Vec<Firing> {
        let mut counts = self.lock();
        let mut firings = Vec::new();
        for (index, fault) in self.faults.iter().enumerate() {
            let counted = match fault.action {
                Action::CutAfterBytes(_) => false,
                Action::CorruptData { .. } => data_len > 0,
                _ => true,
            };
            if !counted || !fault.matcher.matches(direction, opcode) {
                continue;
            }
            let count = &mut counts[index];
            count.matched += 1;
            if fault.occurrence.fires_at(count.matched) {
                count.fired += 1;
                firings.push(Firing {
                    fault: index,
                    action: fault.action,
                });
            }
        }
        firings
    }

    /// The `cut-after` faults for `direction` that have not fired: (index,
    /// byte limit).
    pub fn byte_cuts(&self, direction: Direction) -> Vec<(usize, u64)> {
        let counts = self.lock();
        self.faults
            .iter()
            .enumerate()
            .filter_map(|(index, fault)| match (fault.action, fault.matcher) {
                (Action::CutAfterBytes(limit), Matcher::Direction(way))
                    if way == direction && counts[index].fired == 0 =>
                {
                    Some((index, limit))
                }
                _ => None,
            })
            .collect()
    }

    /// Claims a `cut-after` fault for one connection; false if another
    /// connection claimed it first.
    pub fn claim(&self, index: usize) -> bool {
        let mut counts = self.lock();
        if counts[index].fired > 0 {
            return false;
        }
        counts[index].fired = 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(specs: &[&str]) -> Plan {
        Plan::new(specs.iter().map(|spec| spec.parse().unwrap()).collect())
    }

    #[test]
    fn nth_fires_once_and_every_fires_again() {
        let plan = plan(&["drop@data-in#2", "cut@to-initiator%3"]);
        let fired: Vec<Vec<usize>> = (0..6)
            .map(|_| {
                plan.on_pdu(Direction::ToInitiator, Opcode::ScsiDataIn, 10)
                    .iter()
                    .map(|firing| firing.fault)
                    .collect()
            })
            .collect();
        assert_eq!(fired, [vec![], vec![0], vec![1], vec![], vec![], vec![1]]);
        assert_eq!(plan.fired(), [1, 2]);
    }

    #[test]
    fn corrupt_data_skips_pdus_without_data() {
        let plan = plan(&["corrupt-data@data-in#2"]);
        assert!(
            plan.on_pdu(Direction::ToInitiator, Opcode::ScsiDataIn, 8)
                .is_empty()
        );
        assert!(
            plan.on_pdu(Direction::ToInitiator, Opcode::ScsiDataIn, 0)
                .is_empty()
        );
        assert_eq!(
            plan.on_pdu(Direction::ToInitiator, Opcode::ScsiDataIn, 8)
                .len(),
            1
        );
    }

    #[test]
    fn a_byte_cut_is_claimed_once() {
        let plan = plan(&["cut-after=100@to-target"]);
        assert!(plan.byte_cuts(Direction::ToInitiator).is_empty());
        assert_eq!(plan.byte_cuts(Direction::ToTarget), [(0, 100)]);
        assert!(plan.claim(0));
        assert!(!plan.claim(0));
        assert!(plan.byte_cuts(Direction::ToTarget).is_empty());
    }
}
