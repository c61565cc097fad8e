//! A session's command window and task table together (RFC 7143 sections
//! 4.2.2.1, 4.2.3): whether a command PDU is delivered, which live task
//! owns each Initiator Task Tag, and the window slot each task holds
//! until it ends.
//!
//! The order of the checks is the RFC's: a CmdSN outside the window (or a
//! duplicate) is dropped silently before anything else is looked at; a
//! command inside it whose tag a live task still holds is refused (the
//! driver answers with a Reject); only then is its CmdSN recorded.
//!
//! The table holds the driver's tasks (`Arc<T>`, shared with whoever
//! runs them); the core asks them only their tag, LUN and whether they
//! are over.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use iscsi_proto::serial::CmdSn;

use crate::planted::{self, Bug};
use crate::window::{CommandWindow, Gaps};

/// What the table needs of a driver's task.
pub trait TaskHandle {
    /// The Initiator Task Tag.
    fn itt(&self) -> u32;
    /// The LUN field of its command.
    fn lun(&self) -> u64;
    /// Its CmdSN (an immediate command's too).
    fn cmd_sn(&self) -> CmdSn;
    /// Whether the task is over (its tag may be used again).
    fn is_done(&self) -> bool;
}

/// A command PDU the session does not deliver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Outside the window, or a duplicate: dropped without an answer.
    OutOfWindow,
    /// Its Initiator Task Tag is held by a live task: a Reject.
    TagInUse,
}

/// The command PDU the session was asked to admit.
#[derive(Clone, Copy, Debug)]
pub struct Arriving {
    /// Its CmdSN.
    pub cmd_sn: CmdSn,
    /// The I bit: immediate delivery, outside the window.
    pub immediate: bool,
    /// Its Initiator Task Tag.
    pub itt: u32,
    /// It starts a task (a SCSI Command or a task management request),
    /// rather than only consuming its CmdSN (NOP-Out, Text, Logout, an
    /// ABORT TASK's RefCmdSN).
    pub task: bool,
}

impl Arriving {
    /// Whether its task holds a slot of the window while it lives.
    pub fn windowed(&self) -> bool {
        self.task && !self.immediate
    }
}

/// Tags of commands aborted before they arrived, remembered per session
/// to drop their late data quietly: far more than can be in flight.
pub const UNSEEN_ABORTS_KEPT: usize = 1024;

/// The command window and the live tasks of one session.
#[derive(Debug)]
pub struct SessionTasks<T> {
    window: CommandWindow,
    tasks: HashMap<u32, Arc<T>>,
    /// Commands an ABORT TASK named before they arrived (the latest
    /// [`UNSEEN_ABORTS_KEPT`]): their tags.
    unseen_aborts: VecDeque<u32>,
}

impl<T: TaskHandle> SessionTasks<T> {
    /// An empty table over `window`.
    pub fn new(window: CommandWindow) -> Self {
        SessionTasks {
            window,
            tasks: HashMap::new(),
            unseen_aborts: VecDeque::new(),
        }
    }

    /// The window, for its edges and questions about CmdSNs.
    pub fn window(&self) -> &CommandWindow {
        &self.window
    }

    /// Decides whether `pdu` is delivered and, if so, records its CmdSN.
    /// Returns whether ExpCmdSN moved (whoever waits for earlier commands
    /// is to be woken). A task it starts is then [`register`](Self::register)ed.
    pub fn admit(&mut self, pdu: Arriving, gaps: Gaps) -> Result<bool, Refusal> {
        let arrival = match pdu.immediate {
            true => None,
            false => Some(
                self.window
                    .check(pdu.cmd_sn)
                    .map_err(|_| Refusal::OutOfWindow)?,
            ),
        };
        if pdu.task
            && self.tasks.get(&pdu.itt).is_some_and(|t| !t.is_done())
            && !planted::active(Bug::DuplicateTagAccepted)
        {
            return Err(Refusal::TagInUse);
        }
        Ok(arrival.is_some_and(|arrival| self.window.receive(arrival, gaps)))
    }

    /// Enters the task an admitted PDU started; it holds a window slot
    /// when `windowed` ([`Arriving::windowed`]).
    pub fn register(&mut self, task: Arc<T>, windowed: bool) {
        if windowed {
            self.window.occupy();
        }
        self.tasks.insert(task.itt(), task);
    }

    /// `task` ended (its status sent, or its abort took effect): its slot
    /// is free and its tag too, unless a later task already took the tag.
    /// Call once per task.
    pub fn finish(&mut self, task: &T, windowed: bool) {
        if windowed {
            self.window.release();
        }
        let itt = task.itt();
        if self
            .tasks
            .get(&itt)
            .is_some_and(|t| std::ptr::eq(Arc::as_ptr(t), task))
        {
            self.tasks.remove(&itt);
        }
    }

    /// ABORT TASK for a command not yet arrived (on another connection, it
    /// may come later): if its CmdSN `ref_cmd_sn` is in the window and not
    /// yet received, and before the abort's own `cmd_sn`, the CmdSN is
    /// taken as received, so the command is dropped when it comes, and its
    /// tag `itt` remembered, so its data is too (RFC 7143 11.5.1). Returns
    /// whether it was (the abort then answers Function complete).
    pub fn abort_unseen(&mut self, itt: u32, ref_cmd_sn: CmdSn, cmd_sn: CmdSn, gaps: Gaps) -> bool {
        if !ref_cmd_sn.lt(cmd_sn) {
            return false;
        }
        let Ok(arrival) = self.window.check(ref_cmd_sn) else {
            return false;
        };
        self.window.receive(arrival, gaps);
        if self.unseen_aborts.len() == UNSEEN_ABORTS_KEPT {
            self.unseen_aborts.pop_front();
        }
        self.unseen_aborts.push_back(itt);
        true
    }

    /// Whether `itt` names a command aborted before it arrived: what comes
    /// for it is dropped without a Reject.
    pub fn aborted_unseen(&self, itt: u32) -> bool {
        !self.tasks.contains_key(&itt) && self.unseen_aborts.contains(&itt)
    }

    /// The live task with this tag.
    pub fn get(&self, itt: u32) -> Option<&Arc<T>> {
        self.tasks.get(&itt)
    }

    /// How many tasks the table holds.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the table holds no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Whether every task is over: for a session that ended (or is being
    /// reinstated, RFC 7143 6.3.5), whether a new session of its I_T
    /// nexus may run. One of its writes still at the store would land
    /// after the initiator wrote the same blocks again through the new
    /// session (it retries what the old one never answered): old data
    /// over acknowledged new data.
    pub fn quiesced(&self) -> bool {
        planted::active(Bug::NewSessionBesideOldWrites) || self.tasks.values().all(|t| t.is_done())
    }

    /// The tasks in the table, optionally only those addressed to `lun`,
    /// in tag order (so that a simulator's run replays exactly).
    pub fn select(&self, lun: Option<u64>) -> Vec<Arc<T>> {
        let mut selected: Vec<Arc<T>> = self
            .tasks
            .values()
            .filter(|t| lun.is_none_or(|l| t.lun() == l))
            .cloned()
            .collect();
        selected.sort_by_key(|t| t.itt());
        selected
    }

    /// The tasks an ABORT TASK SET, CLEAR TASK SET or LOGICAL UNIT RESET
    /// numbered `before` ends in its own session (RFC 7143 11.6.2): those
    /// on `lun` (or all) whose commands were numbered before it. Those
    /// that came after it are not its to abort: the initiator counts them
    /// as sent after the function and waits for their status. (The driver
    /// first waits, bounded, for [`CommandWindow::received_before`]: a
    /// command numbered before it may still be on another connection.)
    pub fn before(&self, lun: Option<u64>, before: CmdSn) -> Vec<Arc<T>> {
        let mut selected = self.select(lun);
        let later_too = planted::active(Bug::AbortSetTakesALaterCommand);
        selected.retain(|t| t.cmd_sn().lt(before) || (later_too && t.cmd_sn() == before));
        selected
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A task as a driver's would be: a tag, a LUN, a done flag.
    #[derive(Debug)]
    struct Handle(u32, u64, AtomicBool, CmdSn);

    impl Handle {
        fn new(itt: u32, lun: u64) -> Arc<Self> {
            Self::numbered(itt, lun, itt)
        }

        fn numbered(itt: u32, lun: u64, cmd_sn: u32) -> Arc<Self> {
            Arc::new(Handle(itt, lun, AtomicBool::new(false), CmdSn::new(cmd_sn)))
        }
    }

    impl TaskHandle for Handle {
        fn itt(&self) -> u32 {
            self.0
        }
        fn lun(&self) -> u64 {
            self.1
        }
        fn cmd_sn(&self) -> CmdSn {
            self.3
        }
        fn is_done(&self) -> bool {
            self.2.load(Ordering::Relaxed)
        }
    }

    fn command(cmd_sn: u32, itt: u32) -> Arriving {
        Arriving {
            cmd_sn: CmdSn::new(cmd_sn),
            immediate: false,
            itt,
            task: true,
        }
    }

    fn table() -> SessionTasks<Handle> {
        SessionTasks::new(CommandWindow::new(CmdSn::new(1), 4))
    }

    #[test]
    fn an_abort_before_its_command_takes_the_cmd_sn_and_remembers_the_tag() {
        let mut tasks = table();
        // Across connections: CmdSN 1 not yet here, the abort (CmdSN 2,
        // immediate) names it.
        assert!(tasks.abort_unseen(9, CmdSn::new(1), CmdSn::new(2), Gaps::Wait));
        assert!(tasks.aborted_unseen(9));
        assert_eq!(
            tasks.admit(command(1, 9), Gaps::Wait),
            Err(Refusal::OutOfWindow),
            "the command, when it comes, is dropped"
        );
        // Not for a CmdSN received, outside the window, or not before the
        // abort's own.
        assert!(!tasks.abort_unseen(9, CmdSn::new(1), CmdSn::new(2), Gaps::Wait));
        assert!(!tasks.abort_unseen(8, CmdSn::new(9), CmdSn::new(2), Gaps::Wait));
        assert!(!tasks.abort_unseen(8, CmdSn::new(2), CmdSn::new(2), Gaps::Wait));
        assert!(!tasks.aborted_unseen(8));
        // A live task with the tag later is not "aborted unseen".
        assert_eq!(tasks.admit(command(2, 9), Gaps::Wait), Ok(true));
        tasks.register(Handle::new(9, 0), true);
        assert!(!tasks.aborted_unseen(9));
    }

    #[test]
    fn a_live_tag_is_refused_and_frees_when_its_task_ends() {
        let mut tasks = table();
        assert_eq!(tasks.admit(command(1, 7), Gaps::Skip), Ok(true));
        let first = Handle::new(7, 0);
        tasks.register(first.clone(), true);
        assert_eq!(
            tasks.admit(command(2, 7), Gaps::Skip),
            Err(Refusal::TagInUse)
        );
        // The refused command did not consume its CmdSN.
        assert_eq!(tasks.window().exp_cmd_sn(), CmdSn::new(2));
        first.2.store(true, Ordering::Relaxed);
        tasks.finish(&first, true);
        assert!(tasks.get(7).is_none());
        assert_eq!(tasks.admit(command(2, 7), Gaps::Skip), Ok(true));
    }

    #[test]
    fn out_of_window_comes_before_tag_in_use() {
        let mut tasks = table();
        tasks.admit(command(1, 7), Gaps::Skip).unwrap();
        tasks.register(Handle::new(7, 0), true);
        // A duplicate of the command itself: dropped, not rejected.
        assert_eq!(
            tasks.admit(command(1, 7), Gaps::Skip),
            Err(Refusal::OutOfWindow)
        );
        let immediate = Arriving {
            immediate: true,
            ..command(1, 7)
        };
        assert_eq!(tasks.admit(immediate, Gaps::Skip), Err(Refusal::TagInUse));
    }

    #[test]
    fn a_finished_task_does_not_remove_a_later_one_with_its_tag() {
        let mut tasks = table();
        let old = Handle::new(7, 0);
        tasks.admit(command(1, 7), Gaps::Skip).unwrap();
        tasks.register(old.clone(), true);
        old.2.store(true, Ordering::Relaxed);
        // The tag is free once the old task is over, even before the
        // driver reports it finished.
        tasks.admit(command(2, 7), Gaps::Skip).unwrap();
        let new = Handle::new(7, 1);
        tasks.register(new.clone(), true);
        tasks.finish(&old, true);
        assert!(tasks.get(7).is_some_and(|t| Arc::ptr_eq(t, &new)));
    }

    #[test]
    fn tasks_hold_slots_and_are_selected_by_lun() {
        let mut tasks = table();
        for (sn, itt, lun) in [(1, 1, 0), (2, 2, 1), (3, 3, 1)] {
            tasks.admit(command(sn, itt), Gaps::Skip).unwrap();
            tasks.register(Handle::new(itt, lun), true);
        }
        assert_eq!(tasks.window().outstanding(), 3);
        let on_one: Vec<u32> = tasks.select(Some(1)).iter().map(|t| t.itt()).collect();
        assert_eq!(on_one, [2, 3]);
        // ABORT TASK SET numbered 3 on LUN 1 ends the task numbered 2
        // only; one numbered 4 ends both.
        let ended = |before| -> Vec<u32> {
            tasks
                .before(Some(1), CmdSn::new(before))
                .iter()
                .map(|t| t.itt())
                .collect()
        };
        assert_eq!(ended(3), [2]);
        assert_eq!(ended(4), [2, 3]);
        assert_eq!(tasks.select(None).len(), 3);
        // A NOP-Out consumes its CmdSN and holds nothing.
        let nop = Arriving {
            task: false,
            ..command(4, 9)
        };
        assert!(!nop.windowed());
        assert_eq!(tasks.admit(nop, Gaps::Skip), Ok(true));
        assert_eq!(tasks.window().outstanding(), 3);
    }
}
