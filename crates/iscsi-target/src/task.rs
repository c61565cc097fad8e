//! A task (RFC 7143 4.2.3): one command the target knows of, from its
//! SCSI Command PDU to its status, and its allegiance: the connection (its
//! `Writer`) that answers it, which ERL 2's TASK REASSIGN moves
//! (`recovery.rs` keeps what failed connections leave).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use iscsi_proto::serial::CmdSn;
use iscsi_proto::transfer::Limits;
use tokio::sync::Notify;

use crate::writer::SentStatus;
use crate::writer::Writer;

/// One command the target knows of, from its SCSI Command PDU to its
/// status (RFC 7143 section 4.2.3: the task).
pub(crate) struct Task {
    /// Initiator Task Tag.
    pub itt: u32,
    /// The LUN field of its command.
    pub lun: u64,
    /// Its CmdSN (immediate commands too).
    pub cmd_sn: CmdSn,
    /// Whether it holds a slot of the command window (non-immediate).
    pub windowed: bool,
    /// Set by task management: no status may be sent for it any more.
    pub aborted: AtomicBool,
    /// Set when the task is handed to the SCSI layer: an abort must then
    /// wait for it to end.
    pub(crate) executing: AtomicBool,
    /// Set when the task is over (status sent, or abort took effect).
    pub(crate) done: AtomicBool,
    pub(crate) finished: Notify,
    /// The connection that answers it (ERL 2 moves it: `recovery`).
    pub allegiance: Allegiance,
    /// When its PDU was admitted: the start of its latency (`metrics`).
    pub arrived: std::time::Instant,
}

impl Task {
    /// Whether the task is over.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Marks the task as handed to the SCSI layer.
    pub fn start(&self) {
        self.executing.store(true, Ordering::Release);
    }

    /// Waits until the task is over.
    pub async fn wait(&self) {
        loop {
            let notified = self.finished.notified();
            if self.is_done() {
                return;
            }
            notified.await;
        }
    }
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("itt", &self.itt)
            .field("cmd_sn", &self.cmd_sn.get())
            .finish()
    }
}

/// Which connection answers a task (connection allegiance: a task is
/// answered on the connection its command came in on, until a TASK
/// REASSIGN moves it).
#[derive(Default)]
pub(crate) struct Allegiance {
    state: Mutex<AllegianceState>,
}

#[derive(Default)]
struct AllegianceState {
    /// The writer of the connection the task is allegiant to, and the limits
    /// its Data-In is cut by there.
    to: Option<(Arc<Writer>, Limits)>,
    /// The task's answer, ready while its connection was gone: sent when
    /// the task is reassigned.
    parked: Option<SentStatus>,
}

/// Why a TASK REASSIGN cannot move a task (RFC 7143 11.6.1, response 3:
/// "task still allegiant").
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct StillAllegiant;

impl Allegiance {
    fn lock(&self) -> std::sync::MutexGuard<'_, AllegianceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the task allegiant to `writer` (its command came in there).
    pub fn pledge(&self, writer: &Arc<Writer>, limits: Limits) {
        self.lock().to = Some((Arc::clone(writer), limits));
    }

    /// The writer that answers the task now.
    pub fn current(&self) -> Option<(Arc<Writer>, Limits)> {
        self.lock().to.clone()
    }

    /// Whether the task is allegiant to `writer`.
    pub fn is_to(&self, writer: &Writer) -> bool {
        self.lock()
            .to
            .as_ref()
            .is_some_and(|(w, _)| std::ptr::eq(Arc::as_ptr(w), writer))
    }

    /// Parks `answer` if the task is still allegiant to `closed` (whose
    /// connection is gone); if a reassignment moved it meanwhile, returns
    /// the answer with the writer to send it on instead.
    pub fn park(
        &self,
        closed: &Arc<Writer>,
        answer: SentStatus,
    ) -> Option<(Arc<Writer>, Limits, SentStatus)> {
        let mut state = self.lock();
        match &state.to {
            Some((writer, limits)) if !Arc::ptr_eq(writer, closed) => {
                Some((Arc::clone(writer), *limits, answer))
            }
            _ => {
                state.parked = Some(answer);
                None
            }
        }
    }

    /// Moves the task to `writer` if the connection it is allegiant to is
    /// gone (its writer closed); returns the answer parked meanwhile, to
    /// send there.
    pub fn reassign(
        &self,
        writer: &Arc<Writer>,
        limits: Limits,
    ) -> Result<Option<SentStatus>, StillAllegiant> {
        let mut state = self.lock();
        if let Some((old, _)) = &state.to
            && !old.is_closed()
        {
            return Err(StillAllegiant);
        }
        state.to = Some((Arc::clone(writer), limits));
        Ok(state.parked.take())
    }

    /// Drops a parked answer (the task is being ended): whether there was
    /// one.
    pub fn forget(&self) -> bool {
        self.lock().parked.take().is_some()
    }
}
