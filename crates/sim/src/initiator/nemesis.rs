//! The nemesis side of the simulated initiator: task management at
//! random moments (ABORT TASK, ABORT TASK SET) and its answers, commands
//! the target must refuse (a live tag reused, a READ with data), the
//! Rejects it earned, and the session lost with every connection.

use iscsi_proto::pdu::{
    Pdu, Reject, RejectReason, ScsiCommand, TaskFunction, TaskManagementRequest,
    TaskManagementResponse, TaskResponse,
};
use iscsi_proto::serial::{CmdSn, StatSn};
use iscsi_proto::stat_sn::StatSns;
use std::collections::BTreeSet;

use super::{Initiator, Violation, is_status, task_of};
use crate::target::{BLOCK, READ_10, cdb};
use crate::world::World;

impl Initiator {
    pub(super) fn abort_some(&mut self, world: &mut World) {
        if self.abort_set.is_none()
            && self.aborts.is_empty()
            && self.duplicates.is_empty()
            && !self.commands.is_empty()
            && world.chance(self.params.p_abort_set)
        {
            self.send_abort_set(world);
        }
        let candidates: Vec<u32> = self
            .commands
            .iter()
            .filter(|(_, c)| c.abort_sent.is_none() && c.status.is_none())
            .map(|(&itt, _)| itt)
            .collect();
        for itt in candidates {
            if world.chance(self.params.p_abort) {
                self.send_abort(world, itt);
            }
        }
    }

    /// ABORT TASK for task `itt`, on any of the session's connections: on
    /// another one than the task's it may overtake the command itself.
    pub(super) fn send_abort(&mut self, world: &mut World, itt: u32) {
        if self.abort_set.is_some() {
            return;
        }
        if self.duplicates.contains_key(&itt) {
            // Not while a command reusing its tag is on the way: a target
            // that never saw the task (the abort overtook it) would take
            // that command as a new one, rightly.
            return;
        }
        let tmf_itt = self.take_itt();
        let abort_conn = world.rng_range(0, self.params.connections);
        let now = world.now();
        let Some(command) = self.commands.get_mut(&itt) else {
            return;
        };
        command.abort_sent = Some(now);
        command.abort_conn = abort_conn;
        let request = TaskManagementRequest {
            immediate: true,
            function: TaskFunction::AbortTask,
            initiator_task_tag: tmf_itt,
            referenced_task_tag: itt,
            cmd_sn: self.cmd_sn,
            ref_cmd_sn: command.cmd_sn,
            ..TaskManagementRequest::default()
        };
        self.aborts.insert(tmf_itt, itt);
        self.send(
            world,
            Pdu::TaskManagementRequest(request),
            Vec::new(),
            false,
        );
    }

    /// ABORT TASK SET on LUN 0, immediate, on any connection: it ends every
    /// task numbered before it that the target has not answered (RFC 7143
    /// 11.6.2); those sent after it (it takes no CmdSN of its own) go on.
    /// Not while a command reusing a live tag is on the way (as for ABORT
    /// TASK: the target could take it for a new command, rightly).
    pub(super) fn send_abort_set(&mut self, world: &mut World) {
        let tmf_itt = self.take_itt();
        let conn = world.rng_range(0, self.params.connections);
        self.abort_set = Some((tmf_itt, self.cmd_sn, world.now(), conn));
        self.stats.abort_sets += 1;
        let request = TaskManagementRequest {
            immediate: true,
            function: TaskFunction::AbortTaskSet,
            initiator_task_tag: tmf_itt,
            referenced_task_tag: iscsi_proto::pdu::RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            ..TaskManagementRequest::default()
        };
        self.send(
            world,
            Pdu::TaskManagementRequest(request),
            Vec::new(),
            false,
        );
    }

    /// The ABORT TASK SET's answer (sent `sent`-th by the target): every
    /// task numbered before it is over. Those whose status the target sent
    /// before the answer (on the way on another connection, or held at
    /// ERL 1 for lost Data-In) end by it; the rest were aborted, and no PDU
    /// of theirs may follow but what the target sent before the answer.
    pub(super) fn abort_set_answered(
        &mut self,
        world: &mut World,
        response: &TaskManagementResponse,
        sent: u64,
    ) -> Result<(), Violation> {
        let Some((_, before, _, _)) = self.abort_set.take() else {
            return Ok(());
        };
        if response.response != TaskResponse::FunctionComplete {
            return Err(format!("ABORT TASK SET answered {:?}", response.response));
        }
        let answered: BTreeSet<u32> = world
            .to_initiator()
            .filter(|w| is_status(&w.pdu) && w.sent < sent)
            .filter_map(|w| task_of(&w.pdu))
            .collect();
        let aborted: Vec<u32> = self
            .commands
            .iter()
            .filter(|(itt, c)| c.cmd_sn.lt(before) && c.status.is_none() && !answered.contains(itt))
            .map(|(&itt, _)| itt)
            .collect();
        for itt in aborted {
            self.end_aborted(world, itt, "aborted by ABORT TASK SET", sent);
        }
        Ok(())
    }

    /// Task `itt` ended by a task management function the target answered
    /// `sent`-th: gone, its write may or may not have landed, and no PDU of
    /// it may follow but what the target sent before that answer. False
    /// when it had already ended.
    fn end_aborted(&mut self, world: &World, itt: u32, how: &'static str, sent: u64) -> bool {
        let Some(command) = self.commands.remove(&itt) else {
            return false;
        };
        self.last_ended = world.now();
        self.stats.aborted += 1;
        self.ended.insert(itt, how);
        self.aborted_at.insert(itt, sent);
        if let Some((id, _)) = command.write {
            self.model.aborted(id, command.lba, command.blocks);
        }
        true
    }

    /// Whether this tick decided that every connection is lost now.
    pub fn take_session_loss(&mut self) -> bool {
        std::mem::take(&mut self.lose_session)
    }

    /// Every connection is gone (the PDUs on them too): the session is
    /// over below ERL 2. Every task in flight ends unanswered: a write may
    /// or may not have landed, and is sent again (a new write of the same
    /// blocks, as a SCSI layer retries one) once a new session is logged
    /// in; a read is dropped.
    pub fn session_lost(&mut self, world: &mut World) {
        world.note(|| "-- every connection lost: the session is over".to_string());
        self.stats.session_losses += 1;
        for (itt, command) in std::mem::take(&mut self.commands) {
            self.ended.insert(itt, "lost with its session");
            if let Some((id, _)) = command.write {
                self.model.aborted(id, command.lba, command.blocks);
                self.retries.push((command.lba, command.blocks));
            }
        }
        self.aborts.clear();
        self.abort_set = None;
        self.duplicates.clear();
        self.malformed.clear();
        self.data_out_in_flight.clear();
        self.logging_in = true;
        self.last_ended = world.now();
    }

    /// A new session of the same nexus is logged in: sequence numbers start
    /// again, its window opens as the first one's did.
    pub fn logged_in(&mut self, world: &mut World) {
        world.note(|| "-- a new session logged in".to_string());
        let connections = self.params.connections;
        self.cmd_sn = CmdSn::new(1);
        self.max_cmd_sn = CmdSn::new(1);
        self.stat_sns = (0..connections)
            .map(|_| StatSns::new(StatSn::new(1)))
            .collect();
        self.next_stat_sn = vec![StatSn::new(1); connections];
        self.logging_in = false;
        self.last_ended = world.now();
    }

    /// Now and then an ABORT TASK right behind its command: on another
    /// connection it can reach the target first (RFC 7143 11.5.1: the
    /// CmdSN is then taken as received, the command dropped when it comes).
    pub(super) fn maybe_abort_at_once(&mut self, world: &mut World, itt: u32) {
        if world.chance(self.params.p_abort * 20.0) {
            self.send_abort(world, itt);
        }
    }

    /// A READ with the tag of write `itt`, sent right behind it: the link
    /// keeps order and the write cannot end before its Data-Out, so the tag
    /// is in use when the READ arrives, and the target must Reject it
    /// (Task in progress) and leave the write alone.
    pub(super) fn send_duplicate(&mut self, world: &mut World, itt: u32) {
        self.stats.duplicates += 1;
        self.duplicates.insert(itt, world.now());
        let command = self.probe_read(itt);
        self.send(world, Pdu::ScsiCommand(command), Vec::new(), false);
    }

    /// An immediate READ of block 0 with tag `itt`, outside the workload:
    /// a command the target must refuse.
    pub(super) fn probe_read(&self, itt: u32) -> ScsiCommand {
        ScsiCommand {
            immediate: true,
            final_flag: true,
            read: true,
            initiator_task_tag: itt,
            expected_data_transfer_length: BLOCK as u32,
            cmd_sn: self.cmd_sn,
            cdb: cdb(READ_10, 0, 1),
            ..ScsiCommand::default()
        }
    }

    /// An immediate READ with a block of immediate data (RFC 7143 11.3.4:
    /// only a write may carry data): the target must Reject it (Protocol
    /// Error), answer nothing else for it and go on with the session.
    pub(super) fn send_malformed(&mut self, world: &mut World) {
        self.stats.malformed += 1;
        let itt = self.take_itt();
        let command = self.probe_read(itt);
        self.malformed.insert(itt, world.now());
        self.send(world, Pdu::ScsiCommand(command), vec![0xA5; BLOCK], false);
    }

    pub(super) fn tmf_response(
        &mut self,
        world: &mut World,
        response: TaskManagementResponse,
        sent: u64,
    ) -> Result<(), Violation> {
        if self
            .abort_set
            .is_some_and(|(tag, ..)| tag == response.initiator_task_tag)
        {
            return self.abort_set_answered(world, &response, sent);
        }
        let Some(itt) = self.aborts.remove(&response.initiator_task_tag) else {
            return Err(format!(
                "TMF response for {}, never sent",
                response.initiator_task_tag
            ));
        };
        match response.response {
            TaskResponse::FunctionComplete => {
                if !self.end_aborted(world, itt, "aborted", sent) {
                    return Err(format!(
                        "ABORT TASK of {itt} complete, but the task had ended"
                    ));
                }
                // A status held for lost Data-In is void now.
                Ok(())
            }
            // It ended first: its status is in (held, at ERL 1, while
            // lost Data-In is asked for again), or on its way on the task's
            // connection while this answer came on another.
            TaskResponse::TaskDoesNotExist
                if self
                    .commands
                    .get(&itt)
                    .is_none_or(|c| c.status.is_some() || c.abort_conn != c.conn) =>
            {
                if let Some(command) = self.commands.get_mut(&itt) {
                    command.abort_sent = None;
                }
                Ok(())
            }
            other => Err(format!(
                "ABORT TASK of {itt} answered {other:?} while the task was in flight"
            )),
        }
    }

    pub(super) fn reject(&mut self, reject: &Reject, header: &[u8]) -> Result<(), Violation> {
        let opcode = header.first().map_or(0xFF, |b| b & 0x3F);
        let itt = header
            .get(16..20)
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        match (reject.reason, opcode) {
            (RejectReason::TaskInProgress, 0x01) if self.duplicates.remove(&itt).is_some() => {
                Ok(())
            }
            (RejectReason::ProtocolError, 0x01) if self.malformed.remove(&itt).is_some() => Ok(()),
            (RejectReason::DataDigestError, 0x01 | 0x05)
                if self.commands.get(&itt).is_some_and(|c| c.damaged)
                    || self.ended.contains_key(&itt) =>
            {
                Ok(())
            }
            (reason, opcode) => Err(format!(
                "Reject {reason:?} of a PDU (opcode {opcode:#x}) for task {itt}"
            )),
        }
    }
}
