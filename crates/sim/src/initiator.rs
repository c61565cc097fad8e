//! The simulated initiator: a workload of READ(10)/WRITE(10) at a queue
//! depth, within the target's command window, that answers R2Ts with
//! proto's `R2tTracker` (the real initiator's check) and checks every PDU
//! the target sends. It is also the nemesis: it damages data digests,
//! aborts tasks at random moments and sends commands with tags still in
//! use (`nemesis`). Each check that fails is a [`Violation`].

use std::collections::{BTreeMap, BTreeSet};

use iscsi_proto::pdu::{
    DataIn, DataOut, Pdu, ReadyToTransfer, ScsiCommand, ScsiResponse, SnackRequest, SnackType,
    TaskFunction,
};
use iscsi_proto::serial::{CmdSn, DataSn, StatSn};
use iscsi_proto::stat_sn::{Arrived, StatSns};
use iscsi_proto::transfer::{Limits, R2tTracker, UNSOLICITED_TRANSFER_TAG, data_segments};

mod nemesis;

use crate::describe::describe;
use crate::model::{Model, WriteId};
use crate::params::Params;
use crate::target::{BLOCK, CHECK_CONDITION, GOOD, READ_10, WRITE_10, cdb};
use crate::world::{Direction, Micros, Wire, World};

/// An oracle that failed: what, in words.
pub type Violation = String;

/// How long an ABORT TASK may take to be answered (simulated time).
const TMF_BOUND: Micros = 1_000_000;
/// How long without any task ending before the run counts as hung.
const STALL: Micros = 2_000_000;
/// How long a write may wait for an R2T before an R2T SNACK (ERL 1).
const R2T_SNACK_AFTER: Micros = 200_000;

/// A command in flight.
#[derive(Debug)]
struct Command {
    /// The connection it went on: its PDUs, and SNACKs and ABORT TASK for
    /// it, go there.
    conn: usize,
    /// The connection its ABORT TASK went on (any of the session's).
    abort_conn: usize,
    cmd_sn: CmdSn,
    lba: usize,
    blocks: usize,
    /// The write's number and its R2T check; `None` for a read.
    write: Option<(WriteId, R2tTracker)>,
    /// The write's payload, or the read's buffer.
    data: Vec<u8>,
    /// Data-In DataSNs received whole.
    data_sns: BTreeSet<u32>,
    /// A status held until the Data-In it follows is all in (ERL 1).
    status: Option<ScsiResponse>,
    /// Whether a digest of its data was damaged on purpose.
    damaged: bool,
    /// When an ABORT TASK for it went out.
    abort_sent: Option<Micros>,
    /// When an R2T or a Data-Out last moved it on.
    moved: Micros,
}

/// The simulated initiator.
pub struct Initiator {
    params: Params,
    limits: Limits,
    commands: BTreeMap<u32, Command>,
    /// ABORT TASKs in flight: their tag, the tag they abort.
    aborts: BTreeMap<u32, u32>,
    /// The ABORT TASK SET in flight (one at a time, and never beside an
    /// ABORT TASK: which of the two ends a task is then the target's
    /// choice): its tag, its CmdSN, when it was sent, its connection.
    abort_set: Option<(u32, CmdSn, Micros, usize)>,
    /// Commands sent with a tag still in use, and when: each must get a
    /// Reject (Task in progress) within the bound.
    duplicates: BTreeMap<u32, Micros>,
    /// Malformed commands sent (by tag), each to be rejected (Protocol
    /// Error) and never answered.
    malformed: BTreeMap<u32, Micros>,
    /// Tags whose task ended, and how: a PDU for them now is a violation.
    ended: BTreeMap<u32, &'static str>,
    /// Tasks ended by ABORT TASK: the target's send order of the answer.
    aborted_at: BTreeMap<u32, u64>,
    /// Data-Out sent and not yet at the target, per tag.
    data_out_in_flight: BTreeMap<u32, u32>,
    /// Writes that failed and are sent again: (lba, blocks).
    retries: Vec<(usize, usize)>,
    next_itt: u32,
    cmd_sn: CmdSn,
    /// ExpStatSN as the real initiator keeps it: not past a read's status
    /// whose Data-In is still missing (the target would drop that data).
    stat_sns: Vec<StatSns>,
    /// The StatSN the next status must carry: the link loses nothing, so
    /// any other is the target's mistake.
    next_stat_sn: Vec<StatSn>,
    max_cmd_sn: CmdSn,
    issued: usize,
    next_write: WriteId,
    last_ended: Micros,
    /// Every connection was lost: waiting for the login of a new session
    /// (the target answers it once the old session's tasks are over).
    pub logging_in: bool,
    /// The tick decided to lose the session (the run carries it out).
    lose_session: bool,
    /// What each block of the LUN may hold.
    pub model: Model,
    /// What the run did.
    pub stats: Stats,
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// READs and WRITEs issued (a write sent again after it failed counts
    /// again): READs.
    pub reads: u64,
    /// WRITEs issued.
    pub writes: u64,
    /// WRITEs that ended in CHECK CONDITION for a damaged digest (ERL 0).
    pub failed_writes: u64,
    /// Tasks ended by ABORT TASK.
    pub aborted: u64,
    /// Data-Out and immediate data with a damaged digest.
    pub damaged: u64,
    /// SNACKs sent (Data-In and R2Ts asked for again).
    pub snacks: u64,
    /// Commands sent with a tag in use.
    pub duplicates: u64,
    /// Malformed commands sent (each rejected).
    pub malformed: u64,
    /// ABORT TASK SETs sent.
    pub abort_sets: u64,
    /// Sessions lost with every connection.
    pub session_losses: u64,
    /// ABORT TASKs that reached the target before their command.
    pub aborted_before_arrival: u64,
}

impl Stats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Stats) {
        self.reads += other.reads;
        self.writes += other.writes;
        self.failed_writes += other.failed_writes;
        self.aborted += other.aborted;
        self.damaged += other.damaged;
        self.snacks += other.snacks;
        self.duplicates += other.duplicates;
        self.malformed += other.malformed;
        self.abort_sets += other.abort_sets;
        self.session_losses += other.session_losses;
        self.aborted_before_arrival += other.aborted_before_arrival;
    }
}

impl Initiator {
    /// An initiator logged in with `params`' limits, nothing issued.
    pub fn new(params: Params) -> Self {
        let connections = params.connections;
        Initiator {
            limits: params.limits,
            model: Model::new(params.blocks, BLOCK),
            params,
            commands: BTreeMap::new(),
            aborts: BTreeMap::new(),
            abort_set: None,
            duplicates: BTreeMap::new(),
            malformed: BTreeMap::new(),
            ended: BTreeMap::new(),
            aborted_at: BTreeMap::new(),
            data_out_in_flight: BTreeMap::new(),
            retries: Vec::new(),
            next_itt: 1,
            cmd_sn: CmdSn::new(1),
            stat_sns: (0..connections)
                .map(|_| StatSns::new(StatSn::new(1)))
                .collect(),
            next_stat_sn: vec![StatSn::new(1); connections],
            max_cmd_sn: CmdSn::new(1),
            issued: 0,
            next_write: 1,
            last_ended: 0,
            stats: Stats::default(),
            logging_in: false,
            lose_session: false,
        }
    }

    /// Whether the workload is done and nothing is in flight.
    pub fn finished(&self) -> bool {
        self.issued >= self.params.commands
            && self.retries.is_empty()
            && self.commands.is_empty()
            && self.aborts.is_empty()
            && self.duplicates.is_empty()
            && self.malformed.is_empty()
            && self.abort_set.is_none()
            && !self.logging_in
    }

    /// A Data-Out reached the target.
    pub fn data_out_arrived(&mut self, itt: u32) {
        if let Some(n) = self.data_out_in_flight.get_mut(&itt) {
            *n -= 1;
            if *n == 0 {
                self.data_out_in_flight.remove(&itt);
            }
        }
    }

    /// The connection a PDU goes on: its task's.
    fn conn_of(&self, pdu: &Pdu) -> usize {
        let itt = match pdu {
            Pdu::ScsiCommand(c) => c.initiator_task_tag,
            Pdu::DataOut(d) => d.initiator_task_tag,
            Pdu::SnackRequest(s) => s.initiator_task_tag,
            Pdu::TaskManagementRequest(t) if t.function == TaskFunction::AbortTaskSet => {
                return self.abort_set.map_or(0, |(_, _, _, conn)| conn);
            }
            Pdu::TaskManagementRequest(t) => {
                return self
                    .commands
                    .get(&t.referenced_task_tag)
                    .map_or(0, |c| c.abort_conn);
            }
            _ => return 0,
        };
        self.commands.get(&itt).map_or(0, |c| c.conn)
    }

    /// Sends `pdu` on its task's connection, with that connection's
    /// ExpStatSN.
    fn send(&mut self, world: &mut World, mut pdu: Pdu, data: Vec<u8>, damage: bool) {
        let conn = self.conn_of(&pdu);
        let exp = self.stat_sns[conn].expected();
        match &mut pdu {
            Pdu::ScsiCommand(c) => c.exp_stat_sn = exp,
            Pdu::DataOut(d) => d.exp_stat_sn = exp,
            Pdu::SnackRequest(s) => s.exp_stat_sn = exp,
            Pdu::TaskManagementRequest(t) => t.exp_stat_sn = exp,
            _ => {}
        }
        if let Pdu::DataOut(d) = &pdu {
            *self
                .data_out_in_flight
                .entry(d.initiator_task_tag)
                .or_default() += 1;
        }
        world.note(|| {
            format!(
                "I> {}{}",
                describe(&pdu),
                if damage { " (digest damaged)" } else { "" }
            )
        });
        world.send(
            Direction::ToTarget,
            Wire {
                conn,
                pdu,
                data,
                digest_error: damage,
                sent: 0,
            },
        );
    }

    fn take_itt(&mut self) -> u32 {
        let itt = self.next_itt;
        self.next_itt = self.next_itt.wrapping_add(1).max(1);
        itt
    }

    /// The initiator's clock: issue what the queue depth and the window
    /// allow, abort at random, ask again for R2Ts long awaited, and check
    /// the bounds.
    pub fn tick(&mut self, world: &mut World) -> Result<(), Violation> {
        let now = world.now();
        if let Some((itt, sent)) = self
            .commands
            .iter()
            .filter_map(|(&itt, c)| c.abort_sent.map(|at| (itt, at)))
            .find(|&(_, at)| now - at > TMF_BOUND)
        {
            return Err(format!(
                "ABORT TASK for {itt} sent at {sent} not answered in {TMF_BOUND} us"
            ));
        }
        if let Some((itt, sent)) = self
            .duplicates
            .iter()
            .find(|&(_, &at)| now - at > TMF_BOUND)
        {
            return Err(format!(
                "a command sent at {sent} with the tag {itt} of a task in flight was not rejected"
            ));
        }
        if let Some((itt, _, sent, _)) =
            self.abort_set.filter(|&(_, _, at, _)| now - at > TMF_BOUND)
        {
            return Err(format!(
                "ABORT TASK SET (tag {itt}) sent at {sent} not answered in {TMF_BOUND} us"
            ));
        }
        if let Some((itt, sent)) = self.malformed.iter().find(|&(_, &at)| now - at > TMF_BOUND) {
            return Err(format!(
                "a malformed command (tag {itt}) sent at {sent} was not rejected"
            ));
        }
        if !self.commands.is_empty() && now - self.last_ended > STALL {
            let tags: Vec<u32> = self.commands.keys().copied().collect();
            return Err(format!(
                "hung: no task ended for {STALL} us; tasks {tags:?} never answered"
            ));
        }
        if self.logging_in {
            return Ok(());
        }
        if !self.commands.is_empty() && world.chance(self.params.p_session_loss) {
            self.lose_session = true;
            return Ok(());
        }
        self.ask_again(world);
        self.abort_some(world);
        while self.commands.len() < self.params.queue_depth
            && self.cmd_sn.le(self.max_cmd_sn)
            && (self.issued < self.params.commands || !self.retries.is_empty())
        {
            if !self.issue(world) {
                break;
            }
        }
        Ok(())
    }

    /// ERL 1: R2T SNACKs for writes whose next R2T is long awaited, and
    /// Data SNACKs again for Data-In asked for and lost again.
    fn ask_again(&mut self, world: &mut World) {
        if self.limits.error_recovery_level == 0 {
            return;
        }
        let now = world.now();
        let mut snacks = Vec::new();
        for (&itt, command) in &mut self.commands {
            if let Some((_, r2ts)) = &command.write
                && r2ts.awaits_r2t()
                && command.abort_sent.is_none()
                && now - command.moved > R2T_SNACK_AFTER
            {
                command.moved = now;
                snacks.push(SnackRequest {
                    snack_type: SnackType::DataR2t,
                    initiator_task_tag: itt,
                    beg_run: r2ts.next_r2t_sn(),
                    ..SnackRequest::default()
                });
            }
        }
        for snack in snacks {
            self.stats.snacks += 1;
            self.send(world, Pdu::SnackRequest(snack), Vec::new(), false);
        }
        // Data-In asked for again and lost again: asked for once more.
        let again: Vec<u32> = self
            .commands
            .iter()
            .filter(|(_, c)| c.status.is_some() && now - c.moved > R2T_SNACK_AFTER)
            .map(|(&itt, _)| itt)
            .collect();
        for itt in again {
            let Some(command) = self.commands.get(&itt) else {
                continue;
            };
            let missing = self.missing_data(command);
            if let Some(command) = self.commands.get_mut(&itt) {
                command.moved = now;
            }
            self.ask_for_lost_data(world, itt, missing);
        }
    }

    /// Data SNACKs for the Data-In of read `itt` that did not arrive whole.
    fn ask_for_lost_data(&mut self, world: &mut World, itt: u32, missing: Vec<u32>) {
        for sn in missing {
            let snack = SnackRequest {
                snack_type: SnackType::DataR2t,
                initiator_task_tag: itt,
                beg_run: sn,
                run_length: 1,
                ..SnackRequest::default()
            };
            self.stats.snacks += 1;
            self.send(world, Pdu::SnackRequest(snack), Vec::new(), false);
        }
    }

    /// The DataSNs of read `command` not yet in whole.
    fn missing_data(&self, command: &Command) -> Vec<u32> {
        let expected = self
            .limits
            .data_in_segments(command.data.len() as u32)
            .len() as u32;
        (0..expected)
            .filter(|sn| !command.data_sns.contains(sn))
            .collect()
    }

    /// Issues one command; false when no range free of conflicts was found.
    fn issue(&mut self, world: &mut World) -> bool {
        let retry = self.retries.pop();
        let (write, lba, blocks) = match retry {
            Some((lba, blocks)) => (true, lba, blocks),
            None if self.issued >= self.params.commands => return false,
            None => {
                let blocks = world.rng_range(1, self.params.max_blocks + 1);
                let lba = world.rng_range(0, self.params.blocks - blocks + 1);
                (world.chance(0.5), lba, blocks)
            }
        };
        // No two commands in flight touch a block one of them writes: what
        // a read must show is then exactly known.
        let busy = self.commands.values().any(|c| {
            let overlap = c.lba < lba + blocks && lba < c.lba + c.blocks;
            overlap && (write || c.write.is_some())
        });
        if busy {
            // Tried again at the next tick (a new command: another range).
            if let Some(retry) = retry {
                self.retries.push(retry);
            }
            return false;
        }
        if retry.is_none() {
            self.issued += 1;
        }
        let itt = self.take_itt();
        let length = (blocks * BLOCK) as u32;
        let mut command = ScsiCommand {
            final_flag: true,
            read: !write,
            write,
            initiator_task_tag: itt,
            expected_data_transfer_length: length,
            cmd_sn: self.cmd_sn,
            cdb: cdb(if write { WRITE_10 } else { READ_10 }, lba, blocks),
            ..ScsiCommand::default()
        };
        self.cmd_sn = self.cmd_sn.next();
        let mut entry = Command {
            conn: world.rng_range(0, self.params.connections),
            abort_conn: 0,
            cmd_sn: command.cmd_sn,
            lba,
            blocks,
            write: None,
            data: vec![0; length as usize],
            data_sns: BTreeSet::new(),
            status: None,
            damaged: false,
            abort_sent: None,
            moved: world.now(),
        };
        if !write {
            if world.chance(self.params.p_malformed) {
                self.send_malformed(world);
            }
            self.stats.reads += 1;
            self.commands.insert(itt, entry);
            self.send(world, Pdu::ScsiCommand(command), Vec::new(), false);
            self.maybe_abort_at_once(world, itt);
            return true;
        }
        self.stats.writes += 1;
        let id = self.next_write;
        self.next_write += 1;
        entry.data = self.model.payload(id, lba, blocks);
        let plan = self.limits.write_plan(length);
        let tracker =
            R2tTracker::new(self.limits, length).after_unsolicited(plan.unsolicited_total());
        entry.write = Some((id, tracker));
        let immediate = entry.data[..plan.immediate as usize].to_vec();
        let damage = !immediate.is_empty() && world.chance(self.params.p_damage_data_out);
        entry.damaged |= damage;
        self.stats.damaged += u64::from(damage);
        command.final_flag = plan.unsolicited == 0;
        let mut unsolicited = data_segments(
            plan.immediate,
            plan.unsolicited,
            self.limits.max_send_segment,
        );
        let payload = entry.data.clone();
        self.commands.insert(itt, entry);
        self.send(world, Pdu::ScsiCommand(command), immediate, damage);
        // (Not behind damaged immediate data: at ERL 0 the write may end
        // at once, freeing its tag.)
        if plan.immediate < length && !damage && world.chance(self.params.p_duplicate) {
            self.send_duplicate(world, itt);
        }
        self.order(world, &mut unsolicited);
        for segment in unsolicited {
            self.send_data_out(world, itt, UNSOLICITED_TRANSFER_TAG, &segment, &payload);
        }
        self.maybe_abort_at_once(world, itt);
        true
    }

    /// With DataPDUInOrder=No (RFC 7143 13.18) the PDUs of a sequence go
    /// out in any order: shuffled.
    fn order(&self, world: &mut World, segments: &mut [iscsi_proto::transfer::Segment]) {
        if !self.limits.data_pdu_in_order {
            world.shuffle(segments);
        }
    }

    fn send_data_out(
        &mut self,
        world: &mut World,
        itt: u32,
        ttt: u32,
        segment: &iscsi_proto::transfer::Segment,
        payload: &[u8],
    ) {
        let start = segment.offset as usize;
        let data = payload[start..start + segment.length as usize].to_vec();
        let damage = world.chance(self.params.p_damage_data_out);
        if damage {
            self.stats.damaged += 1;
            if let Some(c) = self.commands.get_mut(&itt) {
                c.damaged = true;
            }
        }
        let data_out = DataOut {
            final_flag: segment.last_in_sequence,
            initiator_task_tag: itt,
            target_transfer_tag: ttt,
            data_sn: DataSn::new(segment.data_sn),
            buffer_offset: segment.offset,
            ..DataOut::default()
        };
        self.send(world, Pdu::DataOut(data_out), data, damage);
    }

    /// A PDU from the target.
    pub fn receive(&mut self, world: &mut World, wire: Wire) -> Result<(), Violation> {
        world.note(|| {
            format!(
                "<T {}{}",
                describe(&wire.pdu),
                if wire.digest_error {
                    " (digest damaged)"
                } else {
                    ""
                }
            )
        });
        let hold = self.holds(&wire.pdu);
        self.check_stat_sn(wire.conn, &wire.pdu, hold)?;
        self.check_allegiance(wire.conn, &wire.pdu)?;
        if self.sent_before_its_abort(&wire) {
            return Ok(());
        }
        let sent = wire.sent;
        match wire.pdu {
            Pdu::ReadyToTransfer(r2t) => self.r2t(world, r2t)?,
            Pdu::DataIn(data_in) => {
                self.data_in(&data_in, &wire.data, wire.digest_error)?;
                if let Some(response) = collapsed_status(&data_in) {
                    self.response(world, response)?;
                }
            }
            Pdu::ScsiResponse(response) => self.response(world, response)?,
            Pdu::TaskManagementResponse(response) => self.tmf_response(world, response, sent)?,
            Pdu::Reject(reject) => self.reject(&reject, &wire.data)?,
            other => {
                return Err(format!(
                    "unexpected PDU from the target: {}",
                    describe(&other)
                ));
            }
        }
        self.settle(world)
    }

    /// StatSN: a status carries the next one, every other PDU the next
    /// one too (not advanced) or none; the window's edges only move on.
    fn check_stat_sn(&mut self, conn: usize, pdu: &Pdu, hold: bool) -> Result<(), Violation> {
        let (stat_sn, exp, max, advances) = match pdu {
            Pdu::ScsiResponse(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn, true),
            Pdu::TaskManagementResponse(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn, true),
            Pdu::Reject(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn, true),
            Pdu::ReadyToTransfer(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn, false),
            Pdu::DataIn(d) if d.status.is_some() => {
                (Some(d.stat_sn), d.exp_cmd_sn, d.max_cmd_sn, true)
            }
            Pdu::DataIn(d) => (None, d.exp_cmd_sn, d.max_cmd_sn, false),
            _ => return Ok(()),
        };
        if let Some(sn) = stat_sn
            && sn != self.next_stat_sn[conn]
        {
            return Err(format!(
                "StatSN {} where {} was next ({})",
                sn.get(),
                self.next_stat_sn[conn].get(),
                describe(pdu)
            ));
        }
        if let (true, Some(sn)) = (advances, stat_sn) {
            self.next_stat_sn[conn] = sn.next();
            if let Arrived::Gap { first, count } = self.stat_sns[conn].arrived(sn, hold) {
                return Err(format!("{count} statuses from {} lost", first.get()));
            }
        }
        if max.gt(self.max_cmd_sn) {
            self.max_cmd_sn = max;
        }
        if exp.gt(self.cmd_sn) {
            return Err(format!(
                "ExpCmdSN {} past the next CmdSN {}",
                exp.get(),
                self.cmd_sn.get()
            ));
        }
        Ok(())
    }

    /// A task's PDUs come on the connection it went on (allegiance, RFC
    /// 7143 4.2.3.1; ABORT TASK is sent on its task's connection here).
    fn check_allegiance(&self, conn: usize, pdu: &Pdu) -> Result<(), Violation> {
        let (itt, expected) = match pdu {
            Pdu::TaskManagementResponse(t) => match self.aborts.get(&t.initiator_task_tag) {
                Some(&itt) => (itt, self.commands.get(&itt).map(|c| c.abort_conn)),
                None => return Ok(()),
            },
            _ => match task_of(pdu) {
                Some(itt) => (itt, self.commands.get(&itt).map(|c| c.conn)),
                None => return Ok(()),
            },
        };
        match expected {
            Some(expected) if expected != conn => Err(format!(
                "{} for task {itt} on connection {conn}, not {expected}",
                describe(pdu)
            )),
            _ => Ok(()),
        }
    }

    /// Whether `wire` is an R2T or Data-In the target sent for a task before
    /// it answered that task's ABORT TASK, arriving after the answer on
    /// another connection: allowed, and dropped. A status never is: a task
    /// is either answered or aborted (`Session::complete`).
    fn sent_before_its_abort(&self, wire: &Wire) -> bool {
        let Some(itt) = task_of(&wire.pdu) else {
            return false;
        };
        !is_status(&wire.pdu)
            && !self.commands.contains_key(&itt)
            && self.aborted_at.get(&itt).is_some_and(|&at| wire.sent < at)
    }

    /// Whether `pdu` is the status of a read whose Data-In is not all in:
    /// ExpStatSN may not pass it until the data asked for again is.
    fn holds(&self, pdu: &Pdu) -> bool {
        let Pdu::ScsiResponse(response) = pdu else {
            return false;
        };
        self.commands
            .get(&response.initiator_task_tag)
            .is_some_and(|c| c.write.is_none() && !self.all_data_in(c))
    }

    fn all_data_in(&self, command: &Command) -> bool {
        let expected = self
            .limits
            .data_in_segments(command.data.len() as u32)
            .len();
        command.data_sns.len() >= expected
    }

    fn ended_or_unknown(&self, itt: u32, what: &str) -> Violation {
        if self.malformed.contains_key(&itt) {
            return format!("{what} for malformed command {itt}, which the target had to reject");
        }
        match self.ended.get(&itt) {
            Some(how) => format!("{what} for task {itt}, which had ended ({how})"),
            None => format!("{what} for task {itt}, which was never sent"),
        }
    }

    fn r2t(&mut self, world: &mut World, r2t: ReadyToTransfer) -> Result<(), Violation> {
        let itt = r2t.initiator_task_tag;
        let Some(command) = self.commands.get_mut(&itt) else {
            return Err(self.ended_or_unknown(itt, "R2T"));
        };
        let Some((_, tracker)) = &mut command.write else {
            return Err(format!("R2T for task {itt}, a read"));
        };
        let segments = tracker
            .r2t(
                r2t.r2t_sn.get(),
                r2t.target_transfer_tag,
                r2t.buffer_offset,
                r2t.desired_data_transfer_length,
            )
            .map_err(|e| format!("bad R2T for task {itt}: {e}"))?;
        tracker.answered(r2t.target_transfer_tag);
        command.moved = world.now();
        let payload = command.data.clone();
        let mut segments = segments;
        self.order(world, &mut segments);
        for segment in segments {
            self.send_data_out(world, itt, r2t.target_transfer_tag, &segment, &payload);
        }
        Ok(())
    }

    fn data_in(&mut self, data_in: &DataIn, data: &[u8], damaged: bool) -> Result<(), Violation> {
        let itt = data_in.initiator_task_tag;
        let Some(command) = self.commands.get_mut(&itt) else {
            return Err(self.ended_or_unknown(itt, "Data-In"));
        };
        if command.write.is_some() {
            return Err(format!("Data-In for task {itt}, a write"));
        }
        let start = data_in.buffer_offset as usize;
        let Some(place) = command.data.get_mut(start..start + data.len()) else {
            return Err(format!("Data-In for task {itt} past its length"));
        };
        if !damaged {
            place.copy_from_slice(data);
            command.data_sns.insert(data_in.data_sn.get());
        }
        Ok(())
    }

    fn response(&mut self, world: &mut World, response: ScsiResponse) -> Result<(), Violation> {
        let itt = response.initiator_task_tag;
        let Some(command) = self.commands.get(&itt) else {
            return Err(self.ended_or_unknown(itt, "SCSI Response"));
        };
        if self.data_out_in_flight.get(&itt).is_some_and(|&n| n > 0) {
            return Err(format!(
                "status of task {itt} while {} of its Data-Out had not reached the target (RFC 7143 7.8)",
                self.data_out_in_flight[&itt]
            ));
        }
        if response.status == GOOD
            && (response.residual_count != 0
                || response.residual_overflow
                || response.residual_underflow)
        {
            // Every command moves exactly its EDTL (RFC 7143 11.4.5).
            return Err(format!(
                "task {itt} answered with a residual of {} bytes",
                response.residual_count
            ));
        }
        if command.write.is_none() && response.status == GOOD {
            let missing = self.missing_data(command);
            if !missing.is_empty() {
                if self.limits.error_recovery_level == 0 {
                    return Err(format!(
                        "status of read {itt} before its Data-In {missing:?}"
                    ));
                }
                let Some(command) = self.commands.get_mut(&itt) else {
                    return Ok(());
                };
                // ERL 1: ask for what was lost, and hold the status.
                command.status = Some(response);
                command.moved = world.now();
                self.ask_for_lost_data(world, itt, missing);
                return Ok(());
            }
        }
        self.end(world, itt, response)
    }

    /// A task's status is in (and its data): check it against the model.
    fn end(
        &mut self,
        world: &mut World,
        itt: u32,
        response: ScsiResponse,
    ) -> Result<(), Violation> {
        let Some(command) = self.commands.remove(&itt) else {
            return Ok(());
        };
        self.last_ended = world.now();
        match (&command.write, response.status) {
            (None, GOOD) => {
                self.ended.insert(itt, "read answered");
                self.model
                    .read(command.lba, &command.data)
                    .map_err(|e| format!("read {itt}: {e}"))
            }
            (Some((id, _)), GOOD) => {
                self.ended.insert(itt, "write answered");
                self.model.acknowledged(*id, command.lba, command.blocks);
                Ok(())
            }
            (Some(_), CHECK_CONDITION) if command.damaged => {
                self.ended.insert(itt, "write failed");
                self.stats.failed_writes += 1;
                self.retries.push((command.lba, command.blocks));
                Ok(())
            }
            (_, status) => Err(format!(
                "task {itt} ({}) ended with status {status:#x} without a fault to explain it",
                if command.write.is_some() {
                    "write"
                } else {
                    "read"
                }
            )),
        }
    }

    /// A status held for lost Data-In ends its task once that is back.
    fn settle(&mut self, world: &mut World) -> Result<(), Violation> {
        let ready: Vec<u32> = self
            .commands
            .iter()
            .filter(|(_, c)| c.status.is_some() && self.all_data_in(c))
            .map(|(&itt, _)| itt)
            .collect();
        for itt in ready {
            let status = self.commands.get_mut(&itt).and_then(|c| c.status.take());
            if let Some(status) = status {
                let conn = self.commands.get(&itt).map_or(0, |c| c.conn);
                self.stat_sns[conn].release(status.stat_sn);
                self.end(world, itt, status)?;
            }
        }
        Ok(())
    }

    /// Tags still in flight, for the end-of-run report.
    pub fn in_flight(&self) -> Vec<u32> {
        self.commands.keys().copied().collect()
    }
}

/// The task a PDU from the target is about.
fn task_of(pdu: &Pdu) -> Option<u32> {
    match pdu {
        Pdu::ReadyToTransfer(r) => Some(r.initiator_task_tag),
        Pdu::DataIn(d) => Some(d.initiator_task_tag),
        Pdu::ScsiResponse(r) => Some(r.initiator_task_tag),
        _ => None,
    }
}

/// Whether `pdu` carries a task's status: a SCSI Response, or a Data-In
/// with the S bit (phase collapse).
fn is_status(pdu: &Pdu) -> bool {
    match pdu {
        Pdu::ScsiResponse(_) => true,
        Pdu::DataIn(d) => d.status.is_some(),
        _ => false,
    }
}

/// The status a Data-In carries (phase collapse, RFC 7143 11.7.3), as the
/// SCSI Response it stands for.
fn collapsed_status(data_in: &DataIn) -> Option<ScsiResponse> {
    Some(ScsiResponse {
        status: data_in.status?,
        residual_overflow: data_in.residual_overflow,
        residual_underflow: data_in.residual_underflow,
        residual_count: data_in.residual_count,
        initiator_task_tag: data_in.initiator_task_tag,
        stat_sn: data_in.stat_sn,
        exp_cmd_sn: data_in.exp_cmd_sn,
        max_cmd_sn: data_in.max_cmd_sn,
        ..ScsiResponse::default()
    })
}
