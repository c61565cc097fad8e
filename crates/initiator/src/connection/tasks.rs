//! The connection's task table: a task registered under its ITT (with
//! where a read's data lands), the commands at the target that task
//! management reaches, a PDU routed to its task, and a task ended when
//! it completes elsewhere, is aborted or is abandoned. What reads and what
//! sends both come here to find a task.

use iscsi_proto::pdu::TaskFunction;
use tokio::sync::mpsc;

use super::{CommandTag, Connection, ReadInto, ReadMode, ReadProgress, TaskEntry, TaskEvent};
use crate::error::Error;

impl Connection {
    /// Registers a task under `itt`; `read` says where a read's data lands,
    /// `lun` is a SCSI command's.
    pub(crate) fn register(
        &self,
        itt: u32,
        read: Option<ReadInto>,
        lun: Option<u64>,
    ) -> Result<mpsc::UnboundedReceiver<TaskEvent>, (Error, Option<Vec<u8>>)> {
        let (events, receiver) = mpsc::unbounded_channel();
        if lun.is_some() {
            self.commands_registered
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut state = self.lock();
        if !state.alive {
            let buffer = match read {
                Some(ReadInto::Buffer(buffer)) => Some(buffer),
                _ => None,
            };
            return Err((Error::ConnectionLost, buffer));
        }
        let read = read.map(|read| {
            let (buffer, expected, mode) = match read {
                ReadInto::Buffer(buffer) => {
                    let expected = buffer.len() as u32;
                    (buffer, expected, ReadMode::Own)
                }
                ReadInto::Pooled(expected) => (Vec::new(), expected, ReadMode::Pooled),
                ReadInto::Discarded(expected) => (Vec::new(), expected, ReadMode::Discarded),
            };
            ReadProgress {
                buffer: Some(buffer),
                mode,
                expected,
                received: 0,
                next_data_sn: 0,
                next_offset: 0,
                missing: Vec::new(),
                held: None,
                held_stat_sn: None,
            }
        });
        state.tasks.insert(
            itt,
            TaskEntry {
                events,
                read,
                sent: false,
                command: lun.map(|lun| CommandTag {
                    lun,
                    cmd_sn: None,
                    registered: std::time::Instant::now(),
                }),
            },
        );
        Ok(receiver)
    }

    /// The SCSI commands at the target (sent, not ended), by ITT.
    pub(crate) fn commands(&self) -> Vec<(u32, CommandTag)> {
        self.lock()
            .tasks
            .iter()
            .filter_map(|(&itt, task)| Some((itt, task.command?)))
            .filter(|(_, command)| command.cmd_sn.is_some())
            .collect()
    }

    /// Ends the SCSI commands `aborted` picks with [`Error::Aborted`]: a
    /// task management function the target completed ended them there,
    /// and no status of theirs will come (RFC 7143 11.6.2). Returns how
    /// many.
    pub(crate) fn end_aborted(
        &self,
        function: TaskFunction,
        aborted: impl Fn(u32, &CommandTag) -> bool,
    ) -> usize {
        let ended: Vec<(u32, TaskEntry)> = {
            let mut state = self.lock();
            let itts: Vec<u32> = state
                .tasks
                .iter()
                .filter(|(itt, task)| task.command.is_some_and(|c| aborted(**itt, &c)))
                .map(|(&itt, _)| itt)
                .collect();
            itts.into_iter()
                .filter_map(|itt| Some((itt, state.remove_task(itt)?)))
                .collect()
        };
        let count = ended.len();
        for (itt, task) in ended {
            self.descriptors.forget(itt);
            let _ = task
                .events
                .send(TaskEvent::Scsi(Err(Error::Aborted(function))));
        }
        if count > 0 && !self.lock_outbox().batch.is_empty() {
            self.posted.notify_one();
        }
        count
    }

    /// Forgets a task (completed elsewhere, timed out or abandoned); its
    /// read buffer, if the reader is not landing data in it right now.
    pub(crate) fn unregister(&self, itt: u32) -> Option<Vec<u8>> {
        self.descriptors.forget(itt);
        self.end_task(itt)
            .and_then(|t| t.read.and_then(|r| r.buffer))
    }

    /// Removes the task `itt` from the table. Fewer commands may then be
    /// at the target, so commands held back may have to leave now: the
    /// writer is woken if any are posted.
    pub(super) fn end_task(&self, itt: u32) -> Option<TaskEntry> {
        let task = self.lock().remove_task(itt);
        if !self.lock_outbox().batch.is_empty() {
            self.posted.notify_one();
        }
        task
    }

    /// Sends `event` to the task `itt`; `remove` when it ends the task.
    pub(super) fn route(&self, itt: u32, event: TaskEvent, remove: bool) {
        let sender = if remove {
            self.end_task(itt).map(|t| t.events)
        } else {
            self.lock().tasks.get(&itt).map(|t| t.events.clone())
        };
        match sender {
            Some(events) => {
                let _ = events.send(event);
            }
            None => tracing::debug!(itt, "reply for a task no longer waiting"),
        }
    }
}
