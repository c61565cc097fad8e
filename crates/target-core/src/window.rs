//! The command window of a session (RFC 7143 section 4.2.2.1): which
//! non-immediate commands the target delivers, which it drops, and the
//! ExpCmdSN and MaxCmdSN that every response carries.
//!
//! ```text
//!        received            window: free slots              beyond
//!   ... ─────────────┤ExpCmdSN ─── (ahead) ─── ahead ─ MaxCmdSN├─────── ...
//!                    ▲ oldest CmdSN         ▲ received out of  ▲ newest CmdSN
//!                      not yet received       order (MC/S)       the initiator
//!                                                                 may send
//! ```
//!
//! - A CmdSN below ExpCmdSN, above MaxCmdSN, or already received ahead of
//!   a gap is dropped silently (a duplicate or an initiator that overran
//!   the window; the RFC prescribes no answer).
//! - Each command received and not yet finished holds a slot, so MaxCmdSN
//!   grows as commands finish; it never moves backwards (an initiator may
//!   send up to any MaxCmdSN it was once told).
//! - Over one connection at ErrorRecoveryLevel below 2, CmdSNs the
//!   initiator skipped are taken as received: TCP keeps order, so a gap
//!   could never be filled ([`Gaps::Skip`]). Over several connections, or
//!   at ERL 2 where commands lost with a connection come again on its
//!   replacement in any order, a gap waits for its command ([`Gaps::Wait`]).
//!
//! No lock, no clock, no I/O: the driver keeps it under its own lock and
//! asks it about each command.

use std::collections::BTreeSet;

use iscsi_proto::serial::CmdSn;

/// A CmdSN the window accepts: what [`CommandWindow::check`] gives and
/// [`CommandWindow::receive`] takes, so that the driver can make its own
/// checks (is the task tag free?) between deciding and recording.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an accepted CmdSN is recorded with CommandWindow::receive"]
pub struct Arrival {
    cmd_sn: CmdSn,
}

impl Arrival {
    /// The CmdSN accepted.
    pub fn cmd_sn(&self) -> CmdSn {
        self.cmd_sn
    }
}

/// A CmdSN outside the window or already received: the command is dropped
/// without an answer (RFC 7143 section 4.2.2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfWindow;

/// Whether a CmdSN the initiator skipped may still arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gaps {
    /// One connection below ERL 2: a skipped CmdSN never comes (TCP keeps
    /// order), so ExpCmdSN moves past it.
    Skip,
    /// Several connections, or ERL 2: a skipped CmdSN may still arrive on
    /// another connection, so ExpCmdSN waits for it.
    Wait,
}

/// The CmdSN window of one session.
#[derive(Clone, Debug)]
pub struct CommandWindow {
    /// ExpCmdSN: the oldest CmdSN not yet received.
    exp_cmd_sn: CmdSn,
    /// CmdSNs past ExpCmdSN already received (wire values; several
    /// connections deliver out of order). Always inside the window.
    received_ahead: BTreeSet<u32>,
    /// Commands holding a slot: received and not yet finished.
    outstanding: u32,
    /// MaxCmdSN - ExpCmdSN + 1 with nothing outstanding.
    size: u32,
}

impl CommandWindow {
    /// A window whose next expected CmdSN is `exp_cmd_sn` (the leading
    /// login's CmdSN) and which grants `size` commands at a time (at least
    /// one: an empty window could never open again).
    pub fn new(exp_cmd_sn: CmdSn, size: u32) -> Self {
        CommandWindow {
            exp_cmd_sn,
            received_ahead: BTreeSet::new(),
            outstanding: 0,
            size: size.max(1),
        }
    }

    /// ExpCmdSN: the oldest CmdSN not yet received.
    pub fn exp_cmd_sn(&self) -> CmdSn {
        self.exp_cmd_sn
    }

    /// Commands holding a slot of the window.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// ExpCmdSN and MaxCmdSN as they stand: what a response carries.
    pub fn edges(&self) -> (CmdSn, CmdSn) {
        // Commands received ahead of a gap already hold a slot in
        // `outstanding` but were granted by an earlier MaxCmdSN, before
        // ExpCmdSN could move past them: counting them back keeps MaxCmdSN
        // from ever moving backwards.
        let ahead = u32::try_from(self.received_ahead.len()).unwrap_or(u32::MAX);
        let free = self
            .size
            .saturating_add(ahead)
            .saturating_sub(self.outstanding);
        // MaxCmdSN = ExpCmdSN - 1 + free: with no free slot the window is
        // empty (MaxCmdSN = ExpCmdSN - 1).
        let max = self.exp_cmd_sn.wrapping_add(free).wrapping_add(u32::MAX);
        (self.exp_cmd_sn, max)
    }

    /// Whether a non-immediate command numbered `cmd_sn` is to be
    /// delivered: inside the window and not received before.
    pub fn check(&self, cmd_sn: CmdSn) -> Result<Arrival, OutOfWindow> {
        if self.is_pending(cmd_sn) {
            Ok(Arrival { cmd_sn })
        } else {
            Err(OutOfWindow)
        }
    }

    /// Whether `cmd_sn` is inside the window and not yet received (an
    /// ABORT TASK may name such a command by its RefCmdSN, RFC 7143
    /// section 11.5.1).
    pub fn is_pending(&self, cmd_sn: CmdSn) -> bool {
        let (exp, max) = self.edges();
        if cmd_sn.lt(exp) || cmd_sn.gt(max) {
            return false;
        }
        cmd_sn == exp || !self.received_ahead.contains(&cmd_sn.get())
    }

    /// Records a command [`check`](Self::check) accepted (with no change
    /// to the window between the two). Returns whether ExpCmdSN moved, so
    /// that the driver can wake whoever waits for earlier commands
    /// ([`received_before`](Self::received_before)). The command holds no
    /// slot until [`occupy`](Self::occupy).
    pub fn receive(&mut self, arrival: Arrival, gaps: Gaps) -> bool {
        let cmd_sn = arrival.cmd_sn;
        let ahead = self.exp_cmd_sn.distance_to(cmd_sn);
        if ahead != 0 && gaps == Gaps::Wait {
            self.received_ahead.insert(cmd_sn.get());
            return false;
        }
        let old = self.exp_cmd_sn;
        self.exp_cmd_sn = cmd_sn.next();
        if !self.received_ahead.is_empty() {
            // Skipping a gap leaves behind whatever was received inside it.
            let moved = ahead.wrapping_add(1);
            self.received_ahead
                .retain(|&a| old.distance_to(CmdSn::new(a)) >= moved);
            // Pull ExpCmdSN over CmdSNs received out of order.
            while self.received_ahead.remove(&self.exp_cmd_sn.get()) {
                self.exp_cmd_sn = self.exp_cmd_sn.next();
            }
        }
        true
    }

    /// Whether every command numbered before `before` has been received.
    pub fn received_before(&self, before: CmdSn) -> bool {
        !self.exp_cmd_sn.lt(before)
    }

    /// A received command becomes a task: it holds a slot until
    /// [`release`](Self::release).
    pub fn occupy(&mut self) {
        self.outstanding = self.outstanding.saturating_add(1);
    }

    /// A task finished (or was aborted): its slot is free again, and the
    /// next response carries the grown MaxCmdSN.
    pub fn release(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests;
