//! The window on its own, then a model of an initiator sending over
//! several connections that deliver in any interleaving.

use std::collections::VecDeque;

use iscsi_proto::serial::CmdSn;
use proptest::prelude::*;

use super::{CommandWindow, Gaps, OutOfWindow};

fn sn(n: u32) -> CmdSn {
    CmdSn::new(n)
}

/// Checks and receives `n`, then makes it a task.
fn admit(window: &mut CommandWindow, n: u32, gaps: Gaps) -> Result<bool, OutOfWindow> {
    let arrival = window.check(sn(n))?;
    let moved = window.receive(arrival, gaps);
    window.occupy();
    Ok(moved)
}

#[test]
fn a_new_window_grants_its_size() {
    let window = CommandWindow::new(sn(10), 4);
    assert_eq!(window.edges(), (sn(10), sn(13)));
    assert_eq!(CommandWindow::new(sn(10), 0).edges(), (sn(10), sn(10)));
}

#[test]
fn in_order_commands_move_exp_and_hold_slots_until_released() {
    let mut window = CommandWindow::new(sn(1), 2);
    assert_eq!(admit(&mut window, 1, Gaps::Skip), Ok(true));
    assert_eq!(admit(&mut window, 2, Gaps::Skip), Ok(true));
    // Both slots taken: the window is empty (MaxCmdSN = ExpCmdSN - 1).
    assert_eq!(window.edges(), (sn(3), sn(2)));
    assert_eq!(admit(&mut window, 3, Gaps::Skip), Err(OutOfWindow));
    window.release();
    assert_eq!(window.edges(), (sn(3), sn(3)));
    assert_eq!(admit(&mut window, 3, Gaps::Skip), Ok(true));
}

#[test]
fn duplicates_and_old_commands_are_dropped() {
    let mut window = CommandWindow::new(sn(5), 8);
    admit(&mut window, 5, Gaps::Wait).unwrap();
    assert_eq!(window.check(sn(5)), Err(OutOfWindow));
    assert_eq!(window.check(sn(4)), Err(OutOfWindow));
    admit(&mut window, 8, Gaps::Wait).unwrap();
    assert_eq!(window.check(sn(8)), Err(OutOfWindow), "received ahead");
    assert!(window.is_pending(sn(7)));
    assert!(!window.is_pending(sn(8)));
}

#[test]
fn a_gap_waits_for_its_command_then_exp_jumps_over_those_received_ahead() {
    let mut window = CommandWindow::new(sn(1), 8);
    assert_eq!(admit(&mut window, 3, Gaps::Wait), Ok(false));
    assert_eq!(admit(&mut window, 2, Gaps::Wait), Ok(false));
    assert_eq!(window.exp_cmd_sn(), sn(1));
    assert!(!window.received_before(sn(2)));
    assert_eq!(admit(&mut window, 1, Gaps::Wait), Ok(true));
    assert_eq!(window.exp_cmd_sn(), sn(4));
    assert!(window.received_before(sn(4)));
    // Three tasks outstanding, none ahead: 8 - 3 free.
    assert_eq!(window.edges(), (sn(4), sn(8)));
}

#[test]
fn max_cmd_sn_holds_while_commands_wait_ahead_of_a_gap() {
    let mut window = CommandWindow::new(sn(1), 2);
    let before = window.edges().1;
    admit(&mut window, 2, Gaps::Wait).unwrap();
    assert_eq!(window.edges(), (sn(1), before));
    // The command in the gap was granted too, and still fits.
    admit(&mut window, 1, Gaps::Wait).unwrap();
    assert_eq!(window.edges(), (sn(3), sn(2)));
}

#[test]
fn one_connection_skips_a_gap_and_forgets_what_it_skipped() {
    let mut window = CommandWindow::new(sn(1), 8);
    admit(&mut window, 4, Gaps::Wait).unwrap();
    // The second connection went away: CmdSN 6 arrives on the last one,
    // skipping 1..=3 and 5, which will never come.
    assert_eq!(admit(&mut window, 6, Gaps::Skip), Ok(true));
    assert_eq!(window.exp_cmd_sn(), sn(7));
    assert!(window.received_ahead.is_empty());
}

#[test]
fn the_window_wraps_at_two_to_the_32() {
    let mut window = CommandWindow::new(sn(u32::MAX - 1), 4);
    assert_eq!(window.edges(), (sn(u32::MAX - 1), sn(1)));
    admit(&mut window, 0, Gaps::Wait).unwrap();
    admit(&mut window, u32::MAX, Gaps::Wait).unwrap();
    admit(&mut window, u32::MAX - 1, Gaps::Wait).unwrap();
    assert_eq!(window.exp_cmd_sn(), sn(1));
    assert_eq!(window.check(sn(0)), Err(OutOfWindow));
    assert_eq!(window.check(sn(1)).map(|a| a.cmd_sn()), Ok(sn(1)));
}

#[test]
fn a_cmd_sn_consumed_without_a_task_frees_its_slot_at_once() {
    // An ABORT TASK whose RefCmdSN has not arrived consumes it (RFC 7143
    // 11.5.1); the command, when it comes, is a duplicate.
    let mut window = CommandWindow::new(sn(1), 1);
    let arrival = window.check(sn(1)).unwrap();
    window.receive(arrival, Gaps::Skip);
    assert_eq!(window.edges(), (sn(2), sn(2)));
    assert_eq!(window.check(sn(1)), Err(OutOfWindow));
}

/// One step of the model.
#[derive(Clone, Debug)]
enum Step {
    /// The initiator numbers a command and queues it on a connection, if
    /// the window it was last told has room.
    Send(usize),
    /// A connection delivers the oldest command queued on it.
    Deliver(usize),
    /// A task finishes (which one: an index modulo the tasks running).
    Finish(usize),
    /// An ABORT TASK names a command not yet delivered (index modulo the
    /// commands queued): its CmdSN is consumed.
    AbortUnarrived(usize),
    /// The initiator resends a command already delivered (index modulo
    /// them): a duplicate.
    Resend(usize),
}

fn step(connections: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..connections).prop_map(Step::Send),
        4 => (0..connections).prop_map(Step::Deliver),
        3 => any::<usize>().prop_map(Step::Finish),
        1 => any::<usize>().prop_map(Step::AbortUnarrived),
        1 => any::<usize>().prop_map(Step::Resend),
    ]
}

/// The initiator's side of the model and what it has seen.
struct Model {
    window: CommandWindow,
    gaps: Gaps,
    queues: Vec<VecDeque<u32>>,
    next: CmdSn,
    /// The greatest MaxCmdSN any response carried.
    told_max: CmdSn,
    told_exp: CmdSn,
    running: Vec<u32>,
    delivered: Vec<u32>,
    consumed: Vec<u32>,
}

impl Model {
    fn new(first: u32, size: u32, connections: usize) -> Self {
        let window = CommandWindow::new(sn(first), size);
        let (exp, max) = window.edges();
        Model {
            window,
            gaps: if connections == 1 {
                Gaps::Skip
            } else {
                Gaps::Wait
            },
            queues: vec![VecDeque::new(); connections],
            next: sn(first),
            told_max: max,
            told_exp: exp,
            running: Vec::new(),
            delivered: Vec::new(),
            consumed: Vec::new(),
        }
    }

    /// A response goes out: the edges it carries never move backwards.
    fn respond(&mut self) -> Result<(), TestCaseError> {
        let (exp, max) = self.window.edges();
        prop_assert!(!exp.lt(self.told_exp), "ExpCmdSN moved back");
        prop_assert!(!max.lt(self.told_max), "MaxCmdSN moved back");
        self.told_exp = exp;
        self.told_max = max;
        Ok(())
    }

    fn apply(&mut self, step: Step) -> Result<(), TestCaseError> {
        match step {
            Step::Send(c) => {
                if !self.next.gt(self.told_max) {
                    self.queues[c].push_back(self.next.get());
                    self.next = self.next.next();
                }
            }
            Step::Deliver(c) => {
                if let Some(n) = self.queues[c].pop_front() {
                    self.deliver(n)?;
                }
            }
            Step::Finish(i) => {
                if !self.running.is_empty() {
                    self.running.swap_remove(i % self.running.len());
                    self.window.release();
                    self.respond()?;
                }
            }
            Step::AbortUnarrived(i) => self.abort_unarrived(i)?,
            Step::Resend(i) => {
                if !self.delivered.is_empty() {
                    let n = self.delivered[i % self.delivered.len()];
                    prop_assert_eq!(self.window.check(sn(n)), Err(OutOfWindow));
                }
            }
        }
        Ok(())
    }

    fn deliver(&mut self, n: u32) -> Result<(), TestCaseError> {
        let verdict = self.window.check(sn(n));
        if self.consumed.contains(&n) {
            prop_assert_eq!(verdict, Err(OutOfWindow), "consumed {} delivered", n);
            return Ok(());
        }
        // Sent inside a window the target advertised: never refused.
        let arrival = verdict.map_err(|_| TestCaseError::fail(format!("{n} refused")))?;
        self.window.receive(arrival, self.gaps);
        self.window.occupy();
        self.running.push(n);
        self.delivered.push(n);
        self.respond()
    }

    fn abort_unarrived(&mut self, i: usize) -> Result<(), TestCaseError> {
        let queued: Vec<u32> = self.queues.iter().flatten().copied().collect();
        if queued.is_empty() || self.gaps == Gaps::Skip {
            // Over one connection the task management request would come
            // behind the command itself.
            return Ok(());
        }
        let n = queued[i % queued.len()];
        if self.consumed.contains(&n) {
            return Ok(());
        }
        prop_assert!(self.window.is_pending(sn(n)));
        let arrival = self.window.check(sn(n)).expect("pending");
        self.window.receive(arrival, self.gaps);
        self.consumed.push(n);
        self.respond()
    }

    /// Everything queued arrives: ExpCmdSN reaches the next CmdSN and
    /// nothing is left waiting ahead.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for c in 0..self.queues.len() {
            while let Some(n) = self.queues[c].pop_front() {
                self.deliver(n)?;
            }
        }
        prop_assert_eq!(self.window.exp_cmd_sn(), self.next);
        prop_assert!(self.window.received_ahead.is_empty());
        prop_assert_eq!(self.window.outstanding() as usize, self.running.len());
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the interleaving of connections, finishes, aborts and
    /// resends: a command sent inside an advertised window is delivered
    /// exactly once, duplicates are dropped, ExpCmdSN and MaxCmdSN never
    /// move backwards, and ExpCmdSN ends at the next CmdSN.
    #[test]
    fn connections_in_any_interleaving_deliver_each_command_once(
        first in prop_oneof![any::<u32>(), Just(u32::MAX - 3)],
        size in 1u32..8,
        (connections, steps) in (1usize..4).prop_flat_map(|c| {
            (Just(c), proptest::collection::vec(step(c), 0..200))
        }),
    ) {
        let mut model = Model::new(first, size, connections);
        for s in steps {
            model.apply(s)?;
        }
        model.drain()?;
        let mut delivered = model.delivered.clone();
        delivered.sort_unstable();
        delivered.dedup();
        prop_assert_eq!(delivered.len(), model.delivered.len(), "a command delivered twice");
    }
}
