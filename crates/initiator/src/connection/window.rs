//! The session's command window (RFC 7143 section 4.2.2.1): the CmdSN the
//! next command takes, and ExpCmdSN/MaxCmdSN as the target's PDUs move
//! them. One per session, shared by its connections, which update it from
//! what they read and take CmdSNs from it as they send; it knows nothing
//! of a connection, so it stands apart.

use std::sync::{Mutex, MutexGuard, PoisonError};

use iscsi_proto::serial::CmdSn;
use tokio::sync::Notify;

/// The session's command window (RFC 7143 section 4.2.2.1), shared by its
/// connections.
#[derive(Debug)]
pub(crate) struct CommandWindow {
    state: Mutex<WindowState>,
    /// Woken when MaxCmdSN moves.
    opened: Notify,
}

#[derive(Clone, Copy, Debug)]
struct WindowState {
    /// The CmdSN the next non-immediate command takes.
    next: CmdSn,
    exp: CmdSn,
    max: CmdSn,
}

impl CommandWindow {
    /// A window as a login left it.
    pub(crate) fn new(exp: CmdSn, max: CmdSn) -> Self {
        CommandWindow {
            state: Mutex::new(WindowState {
                next: exp,
                exp,
                max,
            }),
            opened: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, WindowState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Restarts the window after a session reinstatement.
    pub(crate) fn reset(&self, exp: CmdSn, max: CmdSn) {
        *self.lock() = WindowState {
            next: exp,
            exp,
            max,
        };
        self.opened.notify_waiters();
    }

    /// Takes in ExpCmdSN and MaxCmdSN from a target PDU; ignored if
    /// MaxCmdSN < ExpCmdSN - 1 or if older than what we have (4.2.2.1).
    pub(crate) fn update(&self, exp: CmdSn, max: CmdSn) {
        if max.next().lt(exp) {
            return;
        }
        let mut state = self.lock();
        let mut moved = false;
        if exp.gt(state.exp) {
            state.exp = exp;
        }
        if max.gt(state.max) {
            state.max = max;
            moved = true;
        }
        drop(state);
        if moved {
            self.opened.notify_waiters();
        }
    }

    /// Whether a non-immediate command may be sent now.
    pub(crate) fn is_open(&self) -> bool {
        let state = self.lock();
        state.next.le(state.max)
    }

    /// Takes the next CmdSN if the window has room.
    pub(crate) fn take(&self) -> Option<CmdSn> {
        let mut state = self.lock();
        if state.next.le(state.max) {
            let sn = state.next;
            state.next = sn.next();
            Some(sn)
        } else {
            None
        }
    }

    /// The CmdSN an immediate PDU carries (not advanced, section 3.2.2.1).
    pub(crate) fn current(&self) -> CmdSn {
        self.lock().next
    }

    /// Waits until the window may have room (re-check with [`Self::take`]).
    pub(crate) async fn wait_open(&self) {
        loop {
            let notified = self.opened.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_open() {
                return;
            }
            notified.await;
        }
    }
}
