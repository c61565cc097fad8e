//! The simulated target: the sans-I/O core of `iscsi-target-core` (the
//! command window and task table, the writes collecting their data, R2T
//! solicitation, StatSN stamping, ERL 1 retention) and proto's Data-In
//! cutting, called in the order `iscsi-target`'s connection calls them
//! (`connection.rs`, `connection/write.rs`), over a block store in memory
//! that answers after a simulated latency.
//!
//! What is not here: the SCSI layer (a READ(10)/WRITE(10) CDB is decoded
//! by hand, the store is bytes) and login; those have their own tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use iscsi_proto::pdu::{
    DataOut, Pdu, Reject, RejectReason, ScsiCommand, SnackRequest, TaskFunction,
    TaskManagementRequest, TaskManagementResponse, TaskResponse,
};
use iscsi_proto::serial::{CmdSn, StatSn};
use iscsi_proto::transfer::{DataOutProgress, Limits};
use iscsi_target_core::answer::{Answer, Outcome, Residual};
use iscsi_target_core::command::{self, DamagedImmediate, Route};
use iscsi_target_core::retention::{Resend, Retained, SentStatus, exp_stat_sn_of};
use iscsi_target_core::{
    Advance, Arriving, Collecting, Collections, CommandWindow, Due, Inserted, Placement,
    SessionTasks, Stat, StatSequence, Stray, TaskHandle, TransferTags, window::Gaps,
};

/// SCSI status GOOD.
pub const GOOD: u8 = 0x00;
/// SCSI status CHECK CONDITION.
pub const CHECK_CONDITION: u8 = 0x02;
/// Sense key ABORTED COMMAND and the two ASC/ASCQ a failed write gets:
/// PROTOCOL SERVICE CRC ERROR (47h/05h) and NOT ENOUGH UNSOLICITED DATA
/// (0Ch/0Dh), as `connection/write.rs` sends them.
const ABORTED_COMMAND: u8 = 0x0B;
const CRC_ERROR: (u8, u8) = (0x47, 0x05);
const BAD_DATA_OUT: (u8, u8) = (0x0C, 0x0D);
/// ILLEGAL REQUEST's INVALID FIELD IN CDB (a write past [`MAX_WRITE`]); the
/// simulated target answers every failure with ABORTED COMMAND's key.
const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
/// The longest write the simulated target buffers (the driver's
/// `MAX_WRITE_BUFFER` is 32 MiB; the workload stays far below either).
pub const MAX_WRITE: u32 = 32 << 20;
/// READ(10).
pub const READ_10: u8 = 0x28;
/// WRITE(10).
pub const WRITE_10: u8 = 0x2A;
/// The simulated LUN's block size.
pub const BLOCK: usize = 512;

/// A task of the simulated session, as the core's task table sees it.
#[derive(Debug)]
pub struct SimTask {
    itt: u32,
    cmd_sn: CmdSn,
    /// The connection it is allegiant to: its R2Ts, Data-In and status go
    /// there.
    conn: usize,
    windowed: bool,
    done: AtomicBool,
    aborted: AtomicBool,
    executing: AtomicBool,
}

impl TaskHandle for SimTask {
    fn itt(&self) -> u32 {
        self.itt
    }
    fn lun(&self) -> u64 {
        0
    }
    fn cmd_sn(&self) -> CmdSn {
        self.cmd_sn
    }
    fn is_done(&self) -> bool {
        self.done.load(Relaxed)
    }
}

/// What the target keeps of a write collecting its data.
#[derive(Debug)]
pub struct SimWrite {
    task: Arc<SimTask>,
    command: ScsiCommand,
    buffer: Vec<u8>,
}

/// A failed write waiting for its data to drain.
#[derive(Debug)]
pub struct SimFailed {
    task: Arc<SimTask>,
    command: ScsiCommand,
    sense: (u8, u8),
}

/// A command at the store.
#[derive(Debug)]
struct Executing {
    task: Arc<SimTask>,
    command: ScsiCommand,
    data: Vec<u8>,
}

/// What the target asks the world to do.
#[derive(Debug)]
pub enum Action {
    /// Send this PDU to the initiator on this connection, with its data.
    Send(usize, Pdu, Vec<u8>),
    /// Run the command with this tag at the store.
    Execute(u32),
}

/// The LUN's bytes, shared by every session of the run.
pub type Store = std::rc::Rc<std::cell::RefCell<Vec<u8>>>;

/// A LUN of `blocks` zeroed blocks.
pub fn store(blocks: usize) -> Store {
    std::rc::Rc::new(std::cell::RefCell::new(vec![0; blocks * BLOCK]))
}

/// What the target holds.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    /// Live tasks.
    pub tasks: usize,
    /// Writes collecting data whose task lives.
    pub collecting: usize,
    /// Writes collecting data whose task was aborted, until their
    /// connection's next PDU sweeps them (`sweep_aborted_writes`).
    pub aborted_collecting: usize,
    /// Statuses kept for SNACKs.
    pub retained: usize,
}

/// What each connection of the session keeps.
struct Conn {
    writes: Collections<SimWrite, SimFailed>,
    tags: TransferTags,
    stat: StatSequence,
    retained: Option<Retained<Vec<u8>>>,
}

/// The simulated target session (one or more connections).
pub struct Target {
    tasks: SessionTasks<SimTask>,
    conns: Vec<Conn>,
    /// The connection whose PDU, or whose task, is being handled.
    cur: usize,
    /// Gaps in CmdSN are skipped on one connection, waited for across
    /// several (as `Session::admit` chooses).
    gaps: Gaps,
    limits: Limits,
    executing: BTreeMap<u32, Executing>,
    /// Aborting functions waiting for the tasks they abort to leave the
    /// store (their tags), with the connection each came on.
    aborting: Vec<(BTreeSet<u32>, usize, TaskManagementRequest)>,
    /// ABORT TASK SETs waiting for the commands numbered before them
    /// still on their way on other connections (`abort_tasks` waits for
    /// `received_before`), with the connection each came on.
    sets_waiting: Vec<(usize, TaskManagementRequest)>,
    /// The LUN's bytes, shared with the sessions before and after this one
    /// (a write of a lost session may still land).
    pub store: Store,
    /// ABORT TASKs that came before the command they abort (another
    /// connection overtook it): its CmdSN was taken as received.
    pub aborted_before_arrival: u64,
    out: Vec<Action>,
}

impl Target {
    /// A session of `connections` connections logged in with `limits`, a
    /// command window of `window` and a LUN of `blocks` zeroed blocks.
    pub fn new(limits: Limits, window: u32, store: Store, connections: usize) -> Self {
        let conn = || Conn {
            writes: Collections::default(),
            tags: TransferTags::default(),
            stat: StatSequence::new(StatSn::new(1)),
            retained: (limits.error_recovery_level >= 1).then(Retained::default),
        };
        Target {
            tasks: SessionTasks::new(CommandWindow::new(CmdSn::new(1), window)),
            conns: (0..connections).map(|_| conn()).collect(),
            cur: 0,
            gaps: if connections > 1 {
                Gaps::Wait
            } else {
                Gaps::Skip
            },
            limits,
            executing: BTreeMap::new(),
            aborting: Vec::new(),
            sets_waiting: Vec::new(),
            store,
            aborted_before_arrival: 0,
            out: Vec::new(),
        }
    }

    /// What the target holds (for the memory oracle).
    pub fn held(&self) -> Held {
        let retained = self
            .conns
            .iter()
            .map(|c| c.retained.as_ref().map_or(0, |r| r.size().0))
            .sum();
        let aborted = |w: &SimWrite| w.task.aborted.load(Relaxed);
        let collecting: usize = self.conns.iter().map(|c| c.writes.collecting()).sum();
        let aborted: usize = self.conns.iter().map(|c| c.writes.count(aborted)).sum();
        Held {
            tasks: self.tasks.len(),
            collecting: collecting - aborted,
            aborted_collecting: aborted,
            retained,
        }
    }

    /// Every connection of the session is gone (below ERL 2 the session
    /// ends with them): every task is aborted, as `end_session` does; those
    /// at the store end when it lets go of them, and nothing more is sent.
    pub fn lose(&mut self) {
        for task in self.tasks.select(None) {
            task.aborted.store(true, Relaxed);
            if !task.executing.load(Relaxed) {
                self.finish(&task);
            }
        }
        for conn in &mut self.conns {
            conn.writes.take_all();
            conn.writes.take_draining();
        }
        self.aborting.clear();
        self.sets_waiting.clear();
    }

    /// Whether every task of the session is over: a new session of its
    /// nexus may run (`quiesce_nexus`, the core's `SessionTasks::quiesced`).
    pub fn quiesced(&self) -> bool {
        self.tasks.quiesced()
    }

    /// How many commands of the session are at the store.
    pub fn at_store(&self) -> usize {
        self.executing.len()
    }

    /// Whether the command with this tag is at the store.
    pub fn executing(&self, itt: u32) -> bool {
        self.executing.contains_key(&itt)
    }

    /// Sweeps every connection's aborted writes, as each connection's next
    /// PDU (or its end) would: after the run, what is left is a leak.
    pub fn sweep_all(&mut self) {
        for conn in 0..self.conns.len() {
            self.cur = conn;
            self.sweep_aborted_writes();
        }
    }

    /// A PDU arrived on connection `conn` (its data digest failed where
    /// `digest_error`).
    pub fn receive(
        &mut self,
        conn: usize,
        pdu: Pdu,
        data: Vec<u8>,
        digest_error: bool,
    ) -> Vec<Action> {
        self.cur = conn;
        if let (Some(retained), Some(exp)) = (&mut self.conns[conn].retained, exp_stat_sn_of(&pdu))
        {
            retained.acknowledge(exp);
        }
        self.sweep_aborted_writes();
        match pdu {
            Pdu::ScsiCommand(command) => self.command(command, data, digest_error),
            Pdu::DataOut(data_out) => self.data_out(data_out, data, digest_error),
            Pdu::SnackRequest(snack) => self.snack(&Pdu::SnackRequest(snack.clone()), &snack),
            Pdu::TaskManagementRequest(request) => self.task_management(request),
            other => self.reject(&other, RejectReason::CommandNotSupported),
        }
        self.start_sets_received_before();
        std::mem::take(&mut self.out)
    }

    /// The store finished command `itt`.
    pub fn store_done(&mut self, itt: u32) -> Vec<Action> {
        if let Some(run) = self.executing.remove(&itt) {
            self.cur = run.task.conn;
            run.task.executing.store(false, Relaxed);
            self.complete(run);
            for (tags, _, _) in &mut self.aborting {
                tags.remove(&itt);
            }
            let (done, waiting): (Vec<_>, Vec<_>) = self
                .aborting
                .drain(..)
                .partition(|(tags, _, _)| tags.is_empty());
            self.aborting = waiting;
            for (_, conn, request) in done {
                self.cur = conn;
                self.tmf_response(&request, TaskResponse::FunctionComplete);
            }
        }
        std::mem::take(&mut self.out)
    }

    fn send(&mut self, mut pdu: Pdu, data: Vec<u8>, stat: Stat) -> StatSn {
        let (exp, max) = self.tasks.window().edges();
        let stat_sn = match stat {
            Stat::Again(sn) => sn,
            _ => self.conns[self.cur].stat.next(),
        };
        self.conns[self.cur].stat.stamp(&mut pdu, stat, exp, max);
        self.out.push(Action::Send(self.cur, pdu, data));
        stat_sn
    }

    fn reject(&mut self, pdu: &Pdu, reason: RejectReason) {
        let mut bhs = [0u8; 48];
        pdu.encode_bhs(Default::default(), &mut bhs);
        let reject = Reject {
            reason,
            ..Reject::default()
        };
        self.send(Pdu::Reject(reject), bhs.to_vec(), Stat::Advance);
    }

    /// Ends a task once (the driver's `Session::finish`).
    fn finish(&mut self, task: &SimTask) {
        if !task.done.swap(true, Relaxed) {
            self.tasks.finish(task, task.windowed);
        }
    }

    fn command(&mut self, command: ScsiCommand, data: Vec<u8>, digest_error: bool) {
        let itt = command.initiator_task_tag;
        let arriving = Arriving {
            cmd_sn: command.cmd_sn,
            immediate: command.immediate,
            itt,
            task: true,
        };
        let pdu = Pdu::ScsiCommand(command.clone());
        match self.tasks.admit(arriving, self.gaps) {
            Ok(_) => {}
            Err(iscsi_target_core::Refusal::OutOfWindow) => return,
            Err(iscsi_target_core::Refusal::TagInUse) => {
                let reason = match digest_error {
                    true => RejectReason::DataDigestError,
                    false => RejectReason::TaskInProgress,
                };
                return self.reject(&pdu, reason);
            }
        }
        let task = Arc::new(SimTask {
            itt,
            cmd_sn: command.cmd_sn,
            conn: self.cur,
            windowed: arriving.windowed(),
            done: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            executing: AtomicBool::new(false),
        });
        self.tasks.register(Arc::clone(&task), arriving.windowed());
        let immediate = data.len() as u32;
        let route = command::route(&command, immediate, &self.limits, true, MAX_WRITE);
        let mut tracker = match route {
            Route::Reject(reason) => {
                self.finish(&task);
                let reason = match digest_error {
                    true => RejectReason::DataDigestError,
                    false => reason,
                };
                return self.reject(&pdu, reason);
            }
            Route::Run => return self.execute(task, command, Vec::new()),
            Route::TooLong(due) => {
                if digest_error {
                    self.reject(&pdu, RejectReason::DataDigestError);
                }
                return self.answer_when_drained(task, command, INVALID_FIELD_IN_CDB, due);
            }
            Route::Collect(tracker) => tracker,
        };
        let mut buffer = vec![0u8; command.expected_data_transfer_length as usize];
        if digest_error {
            self.reject(&pdu, RejectReason::DataDigestError);
            let damaged =
                command::damaged_immediate(&command, immediate, &mut tracker, &self.limits);
            if let DamagedImmediate::Fail(due) = damaged {
                return self.answer_when_drained(task, command, CRC_ERROR, due);
            }
        } else {
            buffer[..data.len()].copy_from_slice(&data);
        }
        let collecting = Collecting {
            solicit: command::solicitation(&command, &tracker, &self.limits),
            write: SimWrite {
                task,
                command,
                buffer,
            },
            tracker,
        };
        match self.conns[self.cur].writes.insert(itt, collecting) {
            Inserted::Complete(done) => self.start_write(done),
            Inserted::Collecting { .. } => self.solicit_and_keep(itt, DataOutProgress::Continue),
        }
    }

    fn data_out(&mut self, data_out: DataOut, data: Vec<u8>, digest_error: bool) {
        let itt = data_out.initiator_task_tag;
        let length = data.len() as u32;
        let pdu = Pdu::DataOut(data_out.clone());
        let aborted = |w: &SimWrite| w.task.aborted.load(Relaxed);
        match self.conns[self.cur]
            .writes
            .placement(&data_out, length, aborted)
        {
            Placement::Place { range, progress } => {
                if digest_error {
                    self.reject(&pdu, RejectReason::DataDigestError);
                    if self.limits.error_recovery_level > 0 {
                        self.conns[self.cur].writes.lost(&data_out, length);
                        return self.solicit_and_keep(itt, DataOutProgress::Continue);
                    }
                    return self.fail_write(itt, CRC_ERROR, None);
                }
                if let Some(write) = self.conns[self.cur].writes.get_mut(itt) {
                    write.write.buffer[range].copy_from_slice(&data);
                }
                self.solicit_and_keep(itt, progress);
            }
            Placement::Aborted(write) => self.finish(&write.task),
            Placement::Refused(reason) => {
                self.reject(
                    &pdu,
                    if digest_error {
                        RejectReason::DataDigestError
                    } else {
                        reason
                    },
                );
                self.fail_write(itt, BAD_DATA_OUT, Some((&data_out, length)));
            }
            Placement::Stray => {
                if digest_error {
                    self.reject(&pdu, RejectReason::DataDigestError);
                }
                match self.conns[self.cur].writes.stray(&data_out, length) {
                    Stray::Drained(failed) => self.answer_failed(failed),
                    Stray::Dropped => {}
                    Stray::Unknown if self.tasks.aborted_unseen(itt) => {}
                    Stray::Unknown if digest_error => {}
                    Stray::Unknown => self.reject(&pdu, RejectReason::InvalidPduField),
                }
            }
        }
    }

    /// Ends the writes of this connection whose task was aborted (on any
    /// connection): `Connection::sweep_aborted_writes`.
    fn sweep_aborted_writes(&mut self) {
        for write in self.conns[self.cur]
            .writes
            .sweep_aborted(|w| w.task.aborted.load(Relaxed))
        {
            self.finish(&write.task);
        }
    }

    fn solicit_and_keep(&mut self, itt: u32, progress: DataOutProgress) {
        let limit = self.limits.r2t_limit();
        let conn = &mut self.conns[self.cur];
        let Advance { r2ts, complete } = conn.writes.advance(itt, progress, limit, &mut conn.tags);
        for r2t in r2ts {
            self.send(Pdu::ReadyToTransfer(r2t), Vec::new(), Stat::Current);
        }
        if let Some(done) = complete {
            self.start_write(done);
        }
    }

    fn start_write(&mut self, done: Collecting<SimWrite>) {
        let SimWrite {
            task,
            command,
            buffer,
        } = done.write;
        self.execute(task, command, buffer);
    }

    fn fail_write(&mut self, itt: u32, sense: (u8, u8), refused: Option<(&DataOut, u32)>) {
        if let Some((write, due)) = self.conns[self.cur].writes.fail(itt, refused) {
            self.answer_when_drained(write.task, write.command, sense, due);
        }
    }

    fn answer_when_drained(
        &mut self,
        task: Arc<SimTask>,
        command: ScsiCommand,
        sense: (u8, u8),
        due: Due,
    ) {
        let itt = command.initiator_task_tag;
        let failed = SimFailed {
            task,
            command,
            sense,
        };
        if let Some(failed) = self.conns[self.cur]
            .writes
            .answer_when_drained(itt, failed, due)
        {
            self.answer_failed(failed);
        }
    }

    fn answer_failed(&mut self, failed: SimFailed) {
        if failed.task.aborted.load(Relaxed) || failed.task.done.load(Relaxed) {
            return;
        }
        let mut sense = vec![0u8; 18];
        sense[0] = 0x70;
        sense[2] = ABORTED_COMMAND;
        sense[7] = 10;
        sense[12] = failed.sense.0;
        sense[13] = failed.sense.1;
        let outcome = Outcome {
            status: CHECK_CONDITION,
            sense: Some(&sense),
        };
        self.status(&failed.task, &failed.command, outcome, Vec::new());
    }

    fn execute(&mut self, task: Arc<SimTask>, command: ScsiCommand, data: Vec<u8>) {
        let itt = command.initiator_task_tag;
        task.executing.store(true, Relaxed);
        self.executing.insert(
            itt,
            Executing {
                task,
                command,
                data,
            },
        );
        self.out.push(Action::Execute(itt));
    }

    /// A command leaves the store: the write's data is stored (aborted or
    /// not), the read's read, and the status goes out unless it was
    /// aborted.
    fn complete(&mut self, run: Executing) {
        let (lba, blocks) = lba_blocks(&run.command.cdb);
        let range = lba * BLOCK..(lba + blocks) * BLOCK;
        let mut store = self.store.borrow_mut();
        if range.end > store.len() {
            drop(store);
            return self.answer_failed(SimFailed {
                task: run.task,
                command: run.command,
                sense: (0x21, 0x00),
            });
        }
        let data_in = if run.command.write {
            let len = run.data.len().min(range.len());
            store[range.start..range.start + len].copy_from_slice(&run.data[..len]);
            Vec::new()
        } else {
            store[range].to_vec()
        };
        drop(store);
        if run.task.aborted.load(Relaxed) {
            // The store did its work (a write landed: nothing calls it
            // back); the task ends unanswered.
            return self.finish(&run.task);
        }
        let good = Outcome {
            status: GOOD,
            sense: None,
        };
        self.status(&run.task, &run.command, good, data_in);
    }

    /// Sends a command's answer as the core's `Answer` decides it (the
    /// driver's `connection/respond.rs`): its Data-In, and its status in
    /// the last of them (ERL 0) or in a SCSI Response kept for SNACKs; the
    /// task ends just before its status, one aborted meanwhile sends none.
    fn status(
        &mut self,
        task: &SimTask,
        command: &ScsiCommand,
        outcome: Outcome<'_>,
        data_in: Vec<u8>,
    ) {
        let residual = if command.write {
            // What the CDB asks for against the EDTL (`write_residual`).
            let wanted = lba_blocks(&command.cdb).1 * BLOCK;
            Residual::of(wanted as u64, command.expected_data_transfer_length)
        } else {
            Residual::of_data_in(command, data_in.len())
        };
        let retains = self.conns[self.cur].retained.is_some();
        let answer = Answer::new(command, outcome, data_in, residual, 0, retains, self.limits);
        let sent = match answer {
            Answer::Collapsed(collapsed) => {
                for piece in collapsed.pdus() {
                    if piece.with_status && !self.complete_task(task) {
                        return;
                    }
                    let stat = match piece.with_status {
                        true => Stat::Advance,
                        false => Stat::Reserved,
                    };
                    self.send(Pdu::DataIn(piece.pdu), piece.data, stat);
                }
                return;
            }
            Answer::Separate(sent) => sent,
        };
        let segments = self.limits.data_in_segments(sent.data_in.len() as u32);
        for segment in &segments {
            let (pdu, data) = sent.data_in(segment);
            self.send(Pdu::DataIn(pdu), data, Stat::Reserved);
        }
        if !self.complete_task(task) {
            return;
        }
        let response = sent.response_after(segments.len());
        let stat_sn = self.send(
            Pdu::ScsiResponse(response.clone()),
            sent.sense_data.clone(),
            Stat::Advance,
        );
        if let Some(retained) = &mut self.conns[self.cur].retained {
            retained.keep(SentStatus {
                stat_sn,
                response,
                ..sent
            });
        }
    }

    /// Ends a task that is about to send its status, so that the status
    /// carries the grown MaxCmdSN (`Session::complete`); whether it is
    /// still to send one (not aborted meanwhile).
    fn complete_task(&mut self, task: &SimTask) -> bool {
        self.finish(task);
        !task.aborted.load(Relaxed)
    }

    fn snack(&mut self, header: &Pdu, snack: &SnackRequest) {
        let Some(retained) = &self.conns[self.cur].retained else {
            return self.reject(header, RejectReason::SnackReject);
        };
        let answer = match self.conns[self.cur].writes.r2t_replicas(snack) {
            Some(r2ts) => r2ts
                .map(|r2ts| r2ts.into_iter().map(Resend::R2t).collect())
                .map_err(|why| (RejectReason::ProtocolError, why)),
            None => retained.answer(snack),
        };
        match answer {
            Ok(resends) => {
                for resend in resends {
                    match resend {
                        Resend::DataIn(pdu, data) => {
                            self.send(Pdu::DataIn(pdu), data, Stat::Reserved);
                        }
                        Resend::Response(response, sense, stat_sn) => {
                            self.send(Pdu::ScsiResponse(response), sense, Stat::Again(stat_sn));
                        }
                        Resend::R2t(r2t) => {
                            self.send(Pdu::ReadyToTransfer(r2t), Vec::new(), Stat::Current);
                        }
                    }
                }
            }
            Err((reason, _)) => self.reject(header, reason),
        }
    }

    /// ABORT TASK and ABORT TASK SET (the functions the simulated
    /// initiator sends): as `connection/task_management.rs` does them, the
    /// response waits for a task at the store to leave it.
    fn task_management(&mut self, request: TaskManagementRequest) {
        if request.function == TaskFunction::AbortTaskSet {
            self.sets_waiting.push((self.cur, request));
            return;
        }
        if request.function != TaskFunction::AbortTask {
            return self.tmf_response(&request, TaskResponse::FunctionNotSupported);
        }
        let Some(task) = self.tasks.get(request.referenced_task_tag).cloned() else {
            // A command not yet arrived (it may come on another connection)
            // whose CmdSN is in the window is taken as received and aborted
            // (RFC 7143 11.5.1), as `connection/task_management.rs` does.
            let (itt, gaps) = (request.referenced_task_tag, self.gaps);
            if self
                .tasks
                .abort_unseen(itt, request.ref_cmd_sn, request.cmd_sn, gaps)
            {
                self.aborted_before_arrival += 1;
                return self.tmf_response(&request, TaskResponse::FunctionComplete);
            }
            return self.tmf_response(&request, TaskResponse::TaskDoesNotExist);
        };
        if task.done.load(Relaxed) {
            return self.tmf_response(&request, TaskResponse::TaskDoesNotExist);
        }
        self.abort_tasks(vec![task], request);
    }

    /// Starts each ABORT TASK SET whose commands numbered before it have
    /// all arrived (`Session::received_before`; in the simulation none is
    /// lost, so the driver's bounded wait never runs out).
    fn start_sets_received_before(&mut self) {
        while let Some(at) = self
            .sets_waiting
            .iter()
            .position(|(_, r)| self.tasks.window().received_before(r.cmd_sn))
        {
            let (conn, request) = self.sets_waiting.remove(at);
            self.cur = conn;
            let lun = Some(request.lun.0);
            let tasks = self.tasks.before(lun, request.cmd_sn);
            self.abort_tasks(tasks, request);
        }
    }

    /// Aborts `tasks` for `request` (`abort_tasks`): each ends without a
    /// status; the function is answered once those at the store have left
    /// it.
    fn abort_tasks(&mut self, tasks: Vec<Arc<SimTask>>, request: TaskManagementRequest) {
        let mut executing = BTreeSet::new();
        for task in tasks.into_iter().filter(|t| !t.done.load(Relaxed)) {
            task.aborted.store(true, Relaxed);
            if task.executing.load(Relaxed) {
                executing.insert(task.itt);
            } else {
                self.finish(&task);
            }
        }
        if executing.is_empty() {
            return self.tmf_response(&request, TaskResponse::FunctionComplete);
        }
        self.aborting.push((executing, self.cur, request));
    }

    fn tmf_response(&mut self, request: &TaskManagementRequest, response: TaskResponse) {
        let reply = TaskManagementResponse {
            response,
            initiator_task_tag: request.initiator_task_tag,
            ..TaskManagementResponse::default()
        };
        self.send(
            Pdu::TaskManagementResponse(reply),
            Vec::new(),
            Stat::Advance,
        );
    }
}

/// The LBA and block count of a READ(10) or WRITE(10) CDB.
pub fn lba_blocks(cdb: &[u8; 16]) -> (usize, usize) {
    let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]) as usize;
    let blocks = u16::from_be_bytes([cdb[7], cdb[8]]) as usize;
    (lba, blocks)
}

/// A READ(10) or WRITE(10) CDB.
pub fn cdb(opcode: u8, lba: usize, blocks: usize) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = opcode;
    cdb[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
    cdb[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
    cdb
}
