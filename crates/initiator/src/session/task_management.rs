//! Task management (RFC 7143 11.5): a function sent immediate and its
//! response awaited; the session's commands a completed function reached
//! ended at once (the target sends them no status, 11.6.2); the ABORT TASK
//! of a command that timed out.

use iscsi_proto::pdu::{Header, Lun, Pdu, TaskFunction, TaskManagementRequest, TaskResponse};
use iscsi_proto::serial::{CmdSn, DataSn};

use super::Inner;
use crate::command::encode_lun;
use crate::connection::{CommandTag, Connection};
use crate::error::Error;

impl Inner {
    /// Sends ABORT TASK for a timed-out command and waits for its answer
    /// (after which the task has no further effect, SAM-5 7.2; "task does
    /// not exist" means it had ended); drops the connection if the target
    /// does not answer that either, which ends the task with it (RFC 7143
    /// 7.1.4.1).
    pub(super) async fn abort_timed_out(
        &self,
        connection: &Connection,
        itt: u32,
        lun: u64,
        cmd_sn: u32,
    ) {
        let result = self
            .task_management(
                connection,
                TaskFunction::AbortTask,
                lun,
                itt,
                Some(CmdSn::new(cmd_sn)),
            )
            .await;
        match result {
            Ok(()) | Err(Error::TaskManagement(_)) => {}
            Err(error) => {
                tracing::warn!(%error, "ABORT TASK failed: dropping the connection");
                connection.close();
            }
        }
    }

    pub(super) async fn task_management(
        &self,
        connection: &Connection,
        function: TaskFunction,
        lun: u64,
        referenced_task_tag: u32,
        ref_cmd_sn: Option<CmdSn>,
    ) -> Result<(), Error> {
        let itt = self.itt();
        let exp_stat_sn = connection.exp_stat_sn();
        let header = |cmd_sn: CmdSn| {
            Header::new(
                Pdu::TaskManagementRequest(TaskManagementRequest {
                    immediate: true,
                    function,
                    lun: Lun(encode_lun(lun)),
                    initiator_task_tag: itt,
                    referenced_task_tag,
                    cmd_sn,
                    exp_stat_sn,
                    ref_cmd_sn: ref_cmd_sn.unwrap_or(cmd_sn),
                    exp_data_sn: DataSn::new(0),
                }),
                0,
            )
        };
        let mut sent_as = None;
        let (reply, _) = self
            .exchange_posted(connection, itt, || {
                sent_as = Some(connection.post_immediate(header)?);
                Ok(())
            })
            .await?;
        match reply.pdu {
            Pdu::TaskManagementResponse(r) if r.response == TaskResponse::FunctionComplete => {
                if let Some(tmf_cmd_sn) = sent_as {
                    self.end_aborted(function, lun, referenced_task_tag, tmf_cmd_sn);
                }
                Ok(())
            }
            Pdu::TaskManagementResponse(r) => Err(Error::TaskManagement(r.response)),
            other => Err(Error::Protocol(format!(
                "{:?} answering a task management request",
                other.opcode()
            ))),
        }
    }

    /// Ends this session's commands a completed task management function
    /// reached: the target has ended them without a status (RFC 7143
    /// 11.6.2), and every status sent before the function's response has
    /// been taken already (statuses are read in order), so a command still
    /// waiting now never gets one. A set or reset reaches the commands
    /// numbered before it (the function's CmdSN is read when it is queued
    /// behind them, [`Connection::post_immediate`]); TASK REASSIGN and
    /// the like end nothing.
    fn end_aborted(&self, function: TaskFunction, lun: u64, task: u32, tmf_cmd_sn: CmdSn) {
        let before = |tag: &CommandTag| tag.cmd_sn.is_some_and(|sn| sn.lt(tmf_cmd_sn));
        let reached = |itt: u32, tag: &CommandTag| match function {
            TaskFunction::AbortTask => itt == task,
            TaskFunction::AbortTaskSet
            | TaskFunction::ClearTaskSet
            | TaskFunction::LogicalUnitReset => tag.lun == lun && before(tag),
            TaskFunction::TargetWarmReset | TaskFunction::TargetColdReset => before(tag),
            _ => false,
        };
        let ended: usize = self
            .lock_connections()
            .iter()
            .map(|connection| connection.end_aborted(function, reached))
            .sum();
        if ended > 0 {
            tracing::info!(?function, lun, ended, "commands ended by task management");
        }
    }
}
