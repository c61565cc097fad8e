//! The WRITEs of one connection collecting their data (RFC 7143 sections
//! 11.7, 11.8, 7.8): where each Data-Out belongs before its data is read,
//! which R2Ts to send, when a write has every byte, and what a write that
//! failed on the way still waits for before its status may go out.
//!
//! ```text
//!             insert ──► Collecting ──(every byte in)──► complete: run it
//!                           │  ▲
//!   Data-Out ─► placement ──┤  └── placed / digest_failed (ERL 1: asked again)
//!                           │
//!                           ├─(breaks the rules, ERL 0 digest)─► fail ─► Draining ─► drained: answer
//!                           └─(task aborted)─► Aborted: later Data-Out dropped quietly
//! ```
//!
//! The driver reads the bytes (into the write's buffer, or to drop them)
//! and sends what this says; `W` is what it keeps of a write (the task, the
//! command, the buffer), `F` what it keeps of a failed one (the task and
//! its outcome). Nothing here does I/O or reads a clock, so a simulator can
//! drive the same code in one thread.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use iscsi_proto::pdu::{DataOut, ReadyToTransfer, RejectReason, SnackRequest, SnackType};
use iscsi_proto::transfer::{DataOutProgress, DataOutTracker, UNSOLICITED_TRANSFER_TAG};

use crate::planted::{self, Bug};
use crate::solicit::Solicitation;
use crate::tags::TransferTags;

/// Tags of aborted writes remembered per connection, to drop their late
/// Data-Out quietly: far more than the commands that can be in flight.
pub const ABORTED_WRITES_KEPT: usize = 1024;

/// A write collecting its data: what the driver keeps of it, the check of
/// its incoming Data-Out, and its R2Ts.
#[derive(Debug)]
pub struct Collecting<W> {
    /// What the driver keeps of the write.
    pub write: W,
    /// The check of its immediate data, unsolicited and solicited Data-Out.
    pub tracker: DataOutTracker,
    /// Its R2Ts: those to send, those sent and awaiting data (what an R2T
    /// SNACK gets again, RFC 7143 11.16).
    pub solicit: Solicitation,
}

/// A failed write waiting for the Data-Out the initiator still owes
/// (RFC 7143 7.8: the status waits until all of it is in).
#[derive(Debug)]
struct Draining<F> {
    failed: F,
    /// The bytes still due.
    due: Due,
}

/// Where a Data-Out belongs, decided from its header before its data is
/// read.
#[derive(Debug, PartialEq, Eq)]
pub enum Placement<W> {
    /// Read its data into the write's buffer at `range`; then say how it
    /// went ([`Collections::advance`] with `progress`, or
    /// [`Collections::lost`]).
    Place {
        /// Where in the write's buffer the data goes.
        range: Range<usize>,
        /// What the PDU completes once its data is in.
        progress: DataOutProgress,
    },
    /// The write was aborted by task management: read the data, drop it,
    /// and end the write (returned; its later Data-Out is dropped quietly).
    Aborted(W),
    /// The PDU breaks its write's rules (RFC 7143 7.8 at ERL 0: the write
    /// cannot complete): read the data, reject the PDU with `reason` (unless
    /// its digest failed: it was rejected for that), then
    /// [`Collections::fail`] the write.
    Refused(RejectReason),
    /// No write collecting data has this tag: read the data, then ask
    /// [`Collections::stray`].
    Stray,
}

/// What to do with a Data-Out for no write collecting data, once its data
/// is read.
#[derive(Debug, PartialEq, Eq)]
pub enum Stray<F> {
    /// It ended the last sequence a failed write waited for: send the
    /// failed write's status now.
    Drained(F),
    /// More is due for a failed write, or the write was aborted: nothing.
    Dropped,
    /// For no write at all: a Reject (Invalid PDU Field), unless the PDU
    /// was rejected already for its digest.
    Unknown,
}

/// The writes of one connection collecting or draining their data.
#[derive(Debug)]
pub struct Collections<W, F> {
    collecting: HashMap<u32, Collecting<W>>,
    draining: HashMap<u32, Draining<F>>,
    /// The latest [`ABORTED_WRITES_KEPT`] writes aborted while collecting.
    aborted: VecDeque<u32>,
}

impl<W, F> Default for Collections<W, F> {
    fn default() -> Self {
        Collections {
            collecting: HashMap::new(),
            draining: HashMap::new(),
            aborted: VecDeque::new(),
        }
    }
}

impl<W, F> Collections<W, F> {
    /// Keeps a write that now collects its data (a new one, after its
    /// immediate data, or one taken back by [`Collections::take`]). Ranges
    /// its tracker discarded (a digest error, ERL 1) are asked for first.
    /// A write whose every byte came with its command is not kept: it runs
    /// now (the common small write with ImmediateData, without a trip
    /// through the table).
    pub fn insert(&mut self, itt: u32, mut write: Collecting<W>) -> Inserted<W> {
        let asked = write.solicit.ask_again_first(write.tracker.take_lost());
        if asked == 0 && write.tracker.is_complete() {
            return Inserted::Complete(write);
        }
        self.collecting.insert(itt, write);
        Inserted::Collecting {
            recovery_r2ts: asked,
        }
    }

    /// A write moved here by TASK REASSIGN (ERL 2, RFC 7143 7.2.2): the
    /// R2Ts of the old connection are void; only what never arrived is
    /// solicited again, in bursts of at most `max_burst`.
    pub fn reassigned(&mut self, itt: u32, mut write: Collecting<W>, max_burst: u32) {
        let missing = write.tracker.reassigned();
        write.solicit.restart(missing, max_burst);
        self.collecting.insert(itt, write);
    }

    /// The write `itt`, to read data into.
    pub fn get_mut(&mut self, itt: u32) -> Option<&mut Collecting<W>> {
        self.collecting.get_mut(&itt)
    }

    /// Takes the write `itt` out (the driver keeps it, or puts it back).
    pub fn take(&mut self, itt: u32) -> Option<Collecting<W>> {
        self.collecting.remove(&itt)
    }

    /// How many writes collect data.
    pub fn collecting(&self) -> usize {
        self.collecting.len()
    }

    /// How many writes collecting data `which` picks (say, those whose
    /// task was aborted and that wait to be swept).
    pub fn count(&self, which: impl Fn(&W) -> bool) -> usize {
        self.collecting.values().filter(|c| which(&c.write)).count()
    }

    /// The R2Ts write `itt` may send now: while fewer than `limit` await
    /// data (RFC 7143 11.8, 13.17).
    pub fn next_r2ts(
        &mut self,
        itt: u32,
        limit: usize,
        tags: &mut TransferTags,
    ) -> Vec<ReadyToTransfer> {
        match self.collecting.get_mut(&itt) {
            Some(write) => write.solicit.next_r2ts(&mut write.tracker, limit, tags),
            None => Vec::new(),
        }
    }

    /// Moves write `itt` on after `progress` (what the Data-Out just
    /// placed completed, or [`DataOutProgress::Continue`]): the R2Ts it
    /// may send now, and the write itself, taken out, if every byte of it
    /// is in (it runs now). One lookup on the path of every Data-Out.
    pub fn advance(
        &mut self,
        itt: u32,
        progress: DataOutProgress,
        limit: usize,
        tags: &mut TransferTags,
    ) -> Advance<W> {
        let Some(write) = self.collecting.get_mut(&itt) else {
            return Advance {
                r2ts: Vec::new(),
                complete: None,
            };
        };
        if let DataOutProgress::R2tComplete(tag) = progress {
            write.solicit.answered(tag);
        }
        let r2ts = write.solicit.next_r2ts(&mut write.tracker, limit, tags);
        let early = planted::active(Bug::WriteBeforeAllData)
            && write.solicit.all_sent()
            && write.tracker.outstanding_r2ts() == 1;
        let complete = if write.tracker.is_complete() || early {
            self.collecting.remove(&itt)
        } else {
            None
        };
        Advance { r2ts, complete }
    }

    /// Where `data_out` (with `length` bytes of data) belongs. `aborted`
    /// says whether task management ended a write's task.
    pub fn placement(
        &mut self,
        data_out: &DataOut,
        length: u32,
        aborted: impl Fn(&W) -> bool,
    ) -> Placement<W> {
        let itt = data_out.initiator_task_tag;
        let Some(write) = self.collecting.get_mut(&itt) else {
            return Placement::Stray;
        };
        if aborted(&write.write) {
            return match self.abort(itt) {
                Some(write) => Placement::Aborted(write),
                None => Placement::Stray,
            };
        }
        let progress = write.tracker.data_out(
            data_out.target_transfer_tag,
            data_out.data_sn.get(),
            data_out.buffer_offset,
            length,
            data_out.final_flag,
        );
        match progress {
            Ok(progress) => {
                let start = data_out.buffer_offset as usize;
                Placement::Place {
                    range: start..start + length as usize,
                    progress,
                }
            }
            Err(e) => Placement::Refused(e.reject_reason()),
        }
    }

    /// The data of a [`Placement::Place`] did not arrive whole: it failed
    /// its digest (ERL 1, RFC 7143 7.8: asked for again with a recovery R2T
    /// once its sequence ends) or the connection failed under it (at ERL 2
    /// the write goes on elsewhere and asks for it there). Returns how many
    /// recovery R2Ts that adds.
    pub fn lost(&mut self, data_out: &DataOut, length: u32) -> usize {
        let Some(write) = self.collecting.get_mut(&data_out.initiator_task_tag) else {
            return 0;
        };
        let progress =
            write
                .tracker
                .discard(data_out.target_transfer_tag, data_out.buffer_offset, length);
        if let DataOutProgress::R2tComplete(tag) = progress {
            write.solicit.answered(tag);
        }
        write.solicit.ask_again_first(write.tracker.take_lost())
    }

    /// Ends write `itt`, which cannot complete: returns what the driver
    /// keeps of it, to answer with [`Collections::answer_when_drained`]
    /// once the Data-Out still due is in. `refused` is the Data-Out that
    /// ended it if the write's check refused it ([`Placement::Refused`]):
    /// its bytes came, though the check did not count them.
    pub fn fail(&mut self, itt: u32, refused: Option<(&DataOut, u32)>) -> Option<(W, Due)> {
        let write = self.collecting.remove(&itt)?;
        let (r2ts, unsolicited) = write.tracker.still_due();
        let mut due = Due { r2ts, unsolicited };
        if let Some((data_out, length)) = refused {
            due.arrived(data_out.target_transfer_tag, length);
        }
        Some((write.write, due))
    }

    /// Keeps `failed`, the answer of write `itt`, until the Data-Out in
    /// `due` is in (RFC 7143 7.8: the target "MUST wait to receive all the
    /// data ... before sending the SCSI Response PDU"), or returns it when
    /// nothing is due.
    pub fn answer_when_drained(&mut self, itt: u32, failed: F, due: Due) -> Option<F> {
        if due.is_nothing() {
            return Some(failed);
        }
        self.draining.insert(itt, Draining { failed, due });
        None
    }

    /// What a Data-Out (of `length` bytes) for no write collecting data
    /// means, its data read (and dropped).
    pub fn stray(&mut self, data_out: &DataOut, length: u32) -> Stray<F> {
        let itt = data_out.initiator_task_tag;
        if let Some(draining) = self.draining.get_mut(&itt) {
            draining.due.arrived(data_out.target_transfer_tag, length);
            if (draining.due.is_nothing() || planted::active(Bug::StatusBeforeLastDataOut))
                && let Some(draining) = self.draining.remove(&itt)
            {
                return Stray::Drained(draining.failed);
            }
            return Stray::Dropped;
        }
        if self.aborted.contains(&itt) {
            return Stray::Dropped;
        }
        Stray::Unknown
    }

    /// Ends write `itt`, aborted: the initiator goes on answering its R2Ts
    /// until it has the function's response (RFC 7143 11.5.1), and that
    /// Data-Out is dropped quietly.
    pub fn abort(&mut self, itt: u32) -> Option<W> {
        if planted::active(Bug::AbortLeavesWriteRunning) {
            return None;
        }
        let write = self.collecting.remove(&itt)?;
        if self.aborted.len() == ABORTED_WRITES_KEPT {
            self.aborted.pop_front();
        }
        self.aborted.push_back(itt);
        Some(write.write)
    }

    /// Ends every write whose task was aborted ([`Collections::abort`]),
    /// in tag order.
    pub fn sweep_aborted(&mut self, aborted: impl Fn(&W) -> bool) -> Vec<W> {
        let mut tags: Vec<u32> = self
            .collecting
            .iter()
            .filter(|(_, write)| aborted(&write.write))
            .map(|(&itt, _)| itt)
            .collect();
        tags.sort_unstable();
        tags.into_iter().filter_map(|itt| self.abort(itt)).collect()
    }

    /// Every write still collecting data, in tag order: the connection
    /// ends (they die, or at ERL 2 wait for TASK REASSIGN).
    pub fn take_all(&mut self) -> Vec<(u32, Collecting<W>)> {
        let mut all: Vec<_> = self.collecting.drain().collect();
        all.sort_unstable_by_key(|&(itt, _)| itt);
        all
    }

    /// Every failed write still draining, in tag order: the connection
    /// ends and their statuses never go out.
    pub fn take_draining(&mut self) -> Vec<F> {
        let mut all: Vec<_> = self.draining.drain().collect();
        all.sort_unstable_by_key(|&(itt, _)| itt);
        all.into_iter().map(|(_, d)| d.failed).collect()
    }

    /// The answer to an R2T SNACK for a write still collecting its data
    /// (`None` for any other SNACK): the R2Ts it asks for that still await
    /// data, as they were sent (RFC 7143 11.16), or why not.
    pub fn r2t_replicas(
        &self,
        snack: &SnackRequest,
    ) -> Option<Result<Vec<ReadyToTransfer>, &'static str>> {
        if snack.snack_type != SnackType::DataR2t {
            return None;
        }
        let write = self.collecting.get(&snack.initiator_task_tag)?;
        Some(write.solicit.replicas(snack.beg_run, snack.run_length))
    }
}

/// What a write collecting data does next ([`Collections::advance`]).
#[derive(Debug)]
pub struct Advance<W> {
    /// R2Ts to send, in order.
    pub r2ts: Vec<ReadyToTransfer>,
    /// The write, every byte of it in: run it.
    pub complete: Option<Collecting<W>>,
}

/// What became of a write handed to [`Collections::insert`].
#[derive(Debug)]
pub enum Inserted<W> {
    /// Every byte is in already: run it.
    Complete(Collecting<W>),
    /// Kept to collect its data: send its R2Ts
    /// ([`Collections::next_r2ts`]); `recovery_r2ts` of them ask again for
    /// data lost to a digest error.
    Collecting {
        /// Ranges asked for again first.
        recovery_r2ts: usize,
    },
}

/// The Data-Out a failed write still waits for, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// The R2Ts whose data has not all come: tag, bytes still due.
    pub r2ts: Vec<(u32, u32)>,
    /// Unsolicited bytes still due.
    pub unsolicited: u32,
}

impl Due {
    /// The unsolicited Data-Out that follows a WRITE of `expected` bytes
    /// with `immediate` bytes in its command PDU, under `limits`
    /// (InitialR2T=No: up to FirstBurstLength in all, RFC 7143 13.10-13.11).
    pub fn unsolicited_after(
        limits: &iscsi_proto::transfer::Limits,
        expected: u32,
        immediate: u32,
    ) -> Self {
        let unsolicited = if limits.initial_r2t {
            0
        } else {
            limits
                .first_burst_length
                .min(expected)
                .saturating_sub(immediate)
        };
        Due {
            r2ts: Vec::new(),
            unsolicited,
        }
    }

    /// Counts `length` bytes of the sequence with `transfer_tag` in.
    pub fn arrived(&mut self, transfer_tag: u32, length: u32) {
        let due = if transfer_tag == UNSOLICITED_TRANSFER_TAG {
            &mut self.unsolicited
        } else if let Some((_, bytes)) = self.r2ts.iter_mut().find(|(tag, _)| *tag == transfer_tag)
        {
            bytes
        } else {
            return;
        };
        *due = due.saturating_sub(length);
    }

    /// Whether nothing more is due.
    pub fn is_nothing(&self) -> bool {
        self.unsolicited == 0 && self.r2ts.iter().all(|&(_, bytes)| bytes == 0)
    }
}

#[cfg(test)]
#[path = "collect_tests.rs"]
mod tests;
