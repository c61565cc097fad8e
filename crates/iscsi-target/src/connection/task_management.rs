//! Task management (RFC 7143 11.5, 11.6): the functions that abort, run
//! beside the connection's reading; TASK REASSIGN and the logout that
//! removes a connection for recovery (ERL 2, 7.2.2), on the connection.

use super::*;

impl Connection {
    /// The Logout Response for a connection removed for recovery: this
    /// connection stays; Time2Wait 0 (reassign at once) and Time2Retain as
    /// negotiated (RFC 7143 11.15.2, 11.15.3).
    pub(super) async fn recovery_logout_answer(
        &mut self,
        request: LogoutRequest,
    ) -> Result<Flow, DatamoverError> {
        let reply = LogoutResponse {
            response: LogoutResponseCode::ClosedSuccessfully,
            initiator_task_tag: request.initiator_task_tag,
            time2wait: 0,
            time2retain: self.session.params.default_time2retain,
            ..LogoutResponse::default()
        };
        self.writer
            .send(Pdu::LogoutResponse(reply), &[], Stat::Advance)
            .await?;
        Ok(Flow::Continue)
    }

    /// TASK REASSIGN (RFC 7143 11.5.1, 7.2.2; ErrorRecoveryLevel 2): moves
    /// a task whose connection was logged out (by a login with its CID, or
    /// a logout for recovery) to this one. The response goes first (the new
    /// allegiance takes effect after it, 11.5.1); then a read's Data-In
    /// from the ExpDataSN asked for and its status, a write's R2Ts for all
    /// the data it lacks, or, for a task still executing, nothing until it
    /// ends here.
    pub(super) async fn task_reassign(
        &mut self,
        request: TaskManagementRequest,
    ) -> Result<(), DatamoverError> {
        if !request.immediate {
            self.session.consume_cmd_sn(request.cmd_sn);
        }
        let itt = request.referenced_task_tag;
        enum Then {
            Nothing,
            Answer(SentStatus, Option<Arc<Task>>),
            Write(Box<PendingWrite>),
        }
        let (response, then) = if !self.session.recovers_connections() {
            (TaskResponse::TaskReassignmentNotSupported, Then::Nothing)
        } else if let Some(orphan) = self.session.orphans.take(itt) {
            match orphan {
                Orphan::Answered(answer) => {
                    (TaskResponse::FunctionComplete, Then::Answer(answer, None))
                }
                Orphan::Collecting(pending) => {
                    pending
                        .write
                        .task
                        .allegiance
                        .pledge(&self.writer, self.data_in_limits);
                    (TaskResponse::FunctionComplete, Then::Write(pending))
                }
            }
        } else if let Some(task) = self.session.task(itt) {
            match task.allegiance.reassign(&self.writer, self.data_in_limits) {
                Err(StillAllegiant) => (TaskResponse::TaskStillAllegiant, Then::Nothing),
                Ok(Some(parked)) => (
                    TaskResponse::FunctionComplete,
                    Then::Answer(parked, Some(task)),
                ),
                Ok(None) => (TaskResponse::FunctionComplete, Then::Nothing),
            }
        } else {
            (TaskResponse::TaskDoesNotExist, Then::Nothing)
        };
        info!(
            itt,
            ?response,
            ref_cmd_sn = request.ref_cmd_sn.get(),
            exp_cmd_sn = self.session.window_edges().0.get(),
            "TASK REASSIGN"
        );
        if response == TaskResponse::FunctionComplete {
            SessionStats::add(&self.session.stats.reassigned, 1);
        }
        self.session
            .stats
            .task_management(request.function.to_u8(), response.to_u8());
        let reply = TaskManagementResponse {
            response,
            initiator_task_tag: request.initiator_task_tag,
            ..TaskManagementResponse::default()
        };
        self.writer
            .send(Pdu::TaskManagementResponse(reply), &[], Stat::Advance)
            .await?;
        match then {
            Then::Nothing => Ok(()),
            Then::Answer(mut answer, task) => {
                // Cut by this connection's limits; from the DataSN asked
                // for only if the cut is the same (else all of it: the
                // initiator takes any Data-In it has not acknowledged).
                let from = if answer.limits.max_send_segment == self.data_in_limits.max_send_segment
                    && answer.limits.max_burst_length == self.data_in_limits.max_burst_length
                {
                    request.exp_data_sn.get()
                } else {
                    0
                };
                answer.limits = self.data_in_limits;
                let mut out = self.writer.lock().await;
                send_answer(
                    &mut out,
                    &self.session,
                    &self.writer,
                    task.as_deref(),
                    &answer,
                    from,
                )
                .await
            }
            Then::Write(pending) => {
                self.writes
                    .reassigned(itt, *pending, self.limits.max_burst_length);
                self.solicit_and_keep(itt, DataOutProgress::Continue).await
            }
        }
    }
}

/// Task management (RFC 7143 11.5, 11.6; SAM-5 7): aborts wait until the
/// tasks concerned are over, so that after the response no PDU of theirs
/// follows.
pub(super) async fn task_management(
    shared: &Shared,
    session: &Session,
    writer: &Writer,
    request: TaskManagementRequest,
) -> Result<(), DatamoverError> {
    if !request.immediate {
        session.consume_cmd_sn(request.cmd_sn);
    }
    let lun = request.lun.0;
    let lun_exists = session.scsi.as_ref().is_some_and(|scsi| {
        iscsi_scsi::decode_lun(lun).is_some_and(|n| scsi.with_backstore(n, |_| ()).is_some())
    });
    let same_target = || match &session.target_name {
        Some(name) => shared.sessions.of_target(name),
        None => Vec::new(),
    };
    let response = match request.function {
        TaskFunction::AbortTask => {
            match session.task(request.referenced_task_tag) {
                Some(task) if session.abort(&task) => {
                    SessionStats::add(&session.stats.aborts, 1);
                    task.wait().await;
                    TaskResponse::FunctionComplete
                }
                Some(_) => TaskResponse::TaskDoesNotExist,
                // A command not yet arrived whose CmdSN is in the window
                // is taken as received and aborted, its late data dropped
                // (11.5.1).
                None if session.abort_unseen(
                    request.referenced_task_tag,
                    request.ref_cmd_sn,
                    request.cmd_sn,
                ) =>
                {
                    TaskResponse::FunctionComplete
                }
                None => TaskResponse::TaskDoesNotExist,
            }
        }
        TaskFunction::AbortTaskSet
        | TaskFunction::ClearTaskSet
        | TaskFunction::LogicalUnitReset => {
            if !lun_exists {
                TaskResponse::LunDoesNotExist
            } else {
                let sessions = if request.function == TaskFunction::AbortTaskSet {
                    Vec::new()
                } else {
                    same_target()
                };
                abort_tasks(session, request.cmd_sn, &sessions, Some(lun)).await;
                if request.function == TaskFunction::LogicalUnitReset
                    && let (Some(scsi), Some(n)) = (&session.scsi, iscsi_scsi::decode_lun(lun))
                {
                    // On an LU a gateway group shares, the reset waits for
                    // the other gateways to take it: off the runtime.
                    let scsi = Arc::clone(scsi);
                    if tokio::task::spawn_blocking(move || scsi.lun_reset(n))
                        .await
                        .is_err()
                    {
                        warn!("LOGICAL UNIT RESET: the reset panicked");
                    }
                }
                TaskResponse::FunctionComplete
            }
        }
        TaskFunction::ClearAca => TaskResponse::FunctionComplete,
        TaskFunction::TargetWarmReset | TaskFunction::TargetColdReset => {
            let sessions = same_target();
            abort_tasks(session, request.cmd_sn, &sessions, None).await;
            if let Some(scsi) = &session.scsi {
                let kind = if request.function == TaskFunction::TargetColdReset {
                    TargetReset::Cold
                } else {
                    TargetReset::Warm
                };
                // As LOGICAL UNIT RESET: off the runtime.
                let scsi = Arc::clone(scsi);
                if tokio::task::spawn_blocking(move || scsi.target_reset(kind))
                    .await
                    .is_err()
                {
                    warn!("target reset: the reset panicked");
                }
            }
            TaskResponse::FunctionComplete
        }
        TaskFunction::TaskReassign => TaskResponse::TaskReassignmentNotSupported,
        _ => TaskResponse::FunctionNotSupported,
    };
    info!(
        function = ?request.function,
        referenced_task_tag = request.referenced_task_tag,
        ?response,
        "task management"
    );
    session
        .stats
        .task_management(request.function.to_u8(), response.to_u8());
    let reply = TaskManagementResponse {
        response,
        initiator_task_tag: request.initiator_task_tag,
        ..TaskManagementResponse::default()
    };
    writer
        .send(Pdu::TaskManagementResponse(reply), &[], Stat::Advance)
        .await?;
    if request.function == TaskFunction::TargetColdReset
        && response == TaskResponse::FunctionComplete
    {
        // A cold reset ends every session of the target (RFC 7143 11.5.1).
        for other in same_target() {
            other.close();
        }
        session.close();
    }
    Ok(())
}

/// How long a task management function waits for commands numbered
/// before it that are still on their way on other connections.
pub(super) const CMD_SN_GAP_WAIT: Duration = Duration::from_secs(2);

/// Aborts the tasks of `session` numbered before `before` (the function's
/// CmdSN; it first waits, a bounded time, for those still on their way)
/// and every task of `others` (on `lun`, or all) and waits until each is
/// over. The function is carried out beside the connection's
/// reading, so commands that came after it may be in the table already:
/// they are not its to abort (the initiator counts them as sent after it,
/// RFC 7143 11.6.2, and waits for their status). Other sessions number
/// their commands in CmdSN spaces of their own: all of theirs there now.
pub(super) async fn abort_tasks(
    session: &Session,
    before: CmdSn,
    others: &[Arc<Session>],
    lun: Option<u64>,
) {
    if !session.received_before(before, CMD_SN_GAP_WAIT).await {
        warn!(
            before = before.get(),
            "task management: commands numbered before it never arrived; going on without them"
        );
    }
    let mut waiting = Vec::new();
    let own = session
        .tasks_before(lun, before)
        .into_iter()
        .map(|task| (session, task));
    let theirs = others
        .iter()
        .filter(|s| !std::ptr::eq(s.as_ref(), session))
        .flat_map(|s| s.tasks(lun).into_iter().map(move |task| (s.as_ref(), task)));
    for (s, task) in own.chain(theirs) {
        if s.abort(&task) {
            SessionStats::add(&s.stats.aborts, 1);
            waiting.push(task);
        }
    }
    for task in waiting {
        task.wait().await;
    }
}
