//! A SCSI command from the caller to its status. `Inner::execute` owns its
//! tries: a new connection or a reinstated session when one is lost
//! (ERL 0), the same task moved to a reinstated connection (ERL 2), the
//! timeout and the ABORT TASK after it. An `Attempt` is one try on one
//! connection: the command with its immediate data, unsolicited Data-Out,
//! the answer to each R2T (checked by `R2tTracker`), R2T SNACKs at ERL 1.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use iscsi_proto::pdu::{Ahs, DataOut, Header, Lun, Pdu, RESERVED_TAG, ScsiCommand, TaskResponse};
use iscsi_proto::serial::{CmdSn, DataSn};
use iscsi_proto::transfer::{
    R2tTracker, Segment as DataSegment, TransferError, WritePlan, data_segments,
};
use tokio::sync::mpsc;

use super::{Inner, Registration};
use crate::command::{Command, DataTransfer, Response, encode_lun};
use crate::connection::{Connection, POSTED_DATA_LIMIT, ReadInto, Sending, TaskEvent};
use crate::error::Error;

/// How one try of a command ended, when it did not complete.
enum AttemptError {
    /// The connection went away; the read buffer, if it came back.
    Lost(Option<Vec<u8>>),
    /// A task moved to a recovered connection is not at the target (it
    /// ended there, or the reassignment was refused): sent again as a new
    /// command; `reinstate` if only session recovery is left.
    Gone {
        buffer: Option<Vec<u8>>,
        reinstate: bool,
    },
    /// The command failed for good.
    Failed(Error),
}

impl From<Error> for AttemptError {
    fn from(error: Error) -> Self {
        AttemptError::Failed(error)
    }
}

/// How long a write at ErrorRecoveryLevel 1 waits for an R2T it is owed
/// before asking for it with an R2T SNACK. Targets send R2Ts as soon as
/// they want data, so a second of silence means one was lost; a SNACK
/// sent too early costs only a Reject or a copy, both ignored.
const R2T_SNACK_AFTER: Duration = Duration::from_secs(1);

/// The longest wait between R2T SNACKs for one write.
const R2T_SNACK_MAX_WAIT: Duration = Duration::from_secs(8);

/// How a try of a command starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// A new task: a new ITT and the next CmdSN.
    Fresh,
    /// The task of a recovered connection, moved to this one with TASK
    /// REASSIGN (ERL 2); its CmdSN, if the target may never have had it,
    /// to send it again with.
    Reassign(CmdSn),
}

/// A sentinel for "no CmdSN taken yet".
const NO_CMD_SN: u64 = u64::MAX;

impl Inner {
    pub(super) async fn execute(self: &Arc<Self>, command: Command<'_>) -> Result<Response, Error> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::SessionClosed);
        }
        if command.cdb.is_empty() || command.cdb.len() > 16 + 255 * 4 - 4 {
            return Err(Error::InvalidCommand("CDB length"));
        }
        let reads = matches!(
            command.data,
            DataTransfer::Read(_) | DataTransfer::PooledRead(_) | DataTransfer::DiscardedRead(_)
        );
        let discarded = matches!(command.data, DataTransfer::DiscardedRead(_));
        let pooled = matches!(command.data, DataTransfer::PooledRead(_));
        let write_owner = match &command.data {
            DataTransfer::SharedWrite(bytes) => Some(bytes.clone()),
            _ => None,
        };
        let (mut read_into, write_data, expected_length) = match command.data {
            DataTransfer::None => (None, None, 0),
            DataTransfer::Read(buffer) => {
                let length = u32::try_from(buffer.len())
                    .map_err(|_| Error::InvalidCommand("transfer over 4 GiB"))?;
                (Some(ReadInto::Buffer(buffer)), None, length)
            }
            DataTransfer::PooledRead(length) => (Some(ReadInto::Pooled(length)), None, length),
            DataTransfer::DiscardedRead(length) => {
                (Some(ReadInto::Discarded(length)), None, length)
            }
            DataTransfer::Write(data) => {
                let length = u32::try_from(data.len())
                    .map_err(|_| Error::InvalidCommand("transfer over 4 GiB"))?;
                (None, Some(data), length)
            }
            DataTransfer::SharedWrite(_) => {
                let data = write_owner.as_deref().unwrap_or_default();
                let length = u32::try_from(data.len())
                    .map_err(|_| Error::InvalidCommand("transfer over 4 GiB"))?;
                (None, Some(data), length)
            }
        };
        let timeout = self.config.timeouts.command;
        let mut deadline = tokio::time::Instant::now() + timeout;
        let mut retries = 0;
        // ERL 2: a lost connection is reinstated and its task moved there.
        let mut connection_recovery = self.recovers_connections();
        let mut resume: Option<(u32, CmdSn, Arc<Connection>)> = None;
        loop {
            let generation = self.generation.load(Ordering::SeqCst);
            let (connection, itt, start) = match resume.take() {
                Some((itt, cmd_sn, connection)) => (connection, itt, Start::Reassign(cmd_sn)),
                None => {
                    let Some(connection) = self.pick(command.lun) else {
                        let lost = self.lock_connections().first().cloned();
                        if let (true, Some(lost)) = (connection_recovery, lost) {
                            // ERL 2: no connection is usable; a reinstated
                            // one continues the session (RFC 7143 8.3 N4).
                            match Box::pin(self.recover_connection(&lost, deadline, timeout))
                                .await?
                            {
                                Some(_) => continue,
                                None => connection_recovery = false,
                            }
                        }
                        Box::pin(self.await_recovery(generation, &mut deadline, timeout)).await?;
                        continue;
                    };
                    (connection, self.itt(), Start::Fresh)
                }
            };
            let sent_cmd_sn = AtomicU64::new(match start {
                Start::Reassign(cmd_sn) => u64::from(cmd_sn.get()),
                Start::Fresh => NO_CMD_SN,
            });
            let attempt = Attempt {
                inner: self,
                start,
                connection: &connection,
                itt,
                lun: command.lun,
                cdb: command.cdb,
                attribute: command.attribute,
                expected_length,
                write_data,
                write_owner: write_owner.as_ref(),
                sent_cmd_sn: &sent_cmd_sn,
            };
            let outcome = tokio::time::timeout_at(deadline, attempt.run(read_into.take())).await;
            let (buffer, gone) = match outcome {
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(AttemptError::Failed(error))) => return Err(error),
                Ok(Err(AttemptError::Lost(buffer))) => (buffer, false),
                Ok(Err(AttemptError::Gone { buffer, reinstate })) => {
                    // Sent again as a new command: on the connection it was
                    // reassigned to, or, if `reinstate`, after session
                    // recovery.
                    tracing::info!(
                        itt,
                        reinstate,
                        "reassigned task not at the target: sending it again"
                    );
                    connection_recovery &= !reinstate;
                    (buffer, !reinstate)
                }
                Err(_) => {
                    let cmd_sn = sent_cmd_sn.load(Ordering::SeqCst);
                    if cmd_sn != NO_CMD_SN {
                        // The target may still run the command: the caller
                        // hears of the timeout once it no longer can, so a
                        // write of the same blocks sent next never races it.
                        Box::pin(self.abort_timed_out(
                            &connection,
                            itt,
                            command.lun,
                            cmd_sn as u32,
                        ))
                        .await;
                    }
                    return Err(Error::Timeout {
                        timeout,
                        waiting_for: "the command's status",
                    });
                }
            };
            if retries >= self.config.command_retries {
                return Err(Error::ConnectionLost);
            }
            retries += 1;
            read_into = match buffer {
                _ if discarded => Some(ReadInto::Discarded(expected_length)),
                _ if pooled => {
                    if let Some(buffer) = buffer {
                        self.read_buffers.give(buffer);
                    }
                    Some(ReadInto::Pooled(expected_length))
                }
                Some(buffer) => Some(ReadInto::Buffer(buffer)),
                None if reads => Some(ReadInto::Buffer(vec![0; expected_length as usize])),
                None => None,
            };
            if gone {
                continue;
            }
            if connection_recovery {
                match Box::pin(self.recover_connection(&connection, deadline, timeout)).await? {
                    Some(replacement) => {
                        let cmd_sn = sent_cmd_sn.load(Ordering::SeqCst);
                        if cmd_sn != NO_CMD_SN {
                            tracing::info!(
                                itt,
                                cid = connection.cid,
                                "command interrupted by a lost connection: reassigning it"
                            );
                            resume = Some((itt, CmdSn::new(cmd_sn as u32), replacement));
                        }
                        continue;
                    }
                    None => connection_recovery = false,
                }
            }
            tracing::info!(
                itt,
                retries,
                "command interrupted by a lost connection: retrying"
            );
            Box::pin(self.await_recovery(generation, &mut deadline, timeout)).await?;
        }
    }

    /// Waits for the session to be reinstated (by this task or another)
    /// since `generation`. Without a replacement timeout, within the
    /// command's `deadline`; with one, that bounds the wait instead, and
    /// the command's time starts again after it (open-iscsi resets its
    /// command timer while the session is being replaced).
    async fn await_recovery(
        &self,
        generation: u64,
        deadline: &mut tokio::time::Instant,
        timeout: std::time::Duration,
    ) -> Result<(), Error> {
        if self.config.replacement_timeout.is_some() {
            self.recover(generation).await?;
            *deadline = tokio::time::Instant::now() + timeout;
            return Ok(());
        }
        tokio::time::timeout_at(*deadline, self.recover(generation))
            .await
            .map_err(|_| Error::Timeout {
                timeout,
                waiting_for: "the session to be reinstated",
            })?
    }
}

/// One try of a SCSI command on one connection.
struct Attempt<'a> {
    inner: &'a Inner,
    start: Start,
    connection: &'a Connection,
    itt: u32,
    lun: u64,
    cdb: &'a [u8],
    attribute: iscsi_proto::pdu::TaskAttribute,
    expected_length: u32,
    write_data: Option<&'a [u8]>,
    /// The shared buffer `write_data` lies in, when the caller gave one.
    write_owner: Option<&'a bytes::Bytes>,
    sent_cmd_sn: &'a AtomicU64,
}

impl Attempt<'_> {
    async fn run(self, read: Option<ReadInto>) -> Result<Response, AttemptError> {
        let connection = self.connection;
        let reads = read.is_some();
        // Over iSER, a slot among the receives that will take responses
        // (held until this attempt ends).
        // The semaphore is never closed, so acquiring cannot fail.
        let _slot = match &connection.response_slots {
            Some(slots) => Arc::clone(slots).acquire_owned().await.ok(),
            None => None,
        };
        let mut events = connection
            .register(self.itt, read, Some(self.lun))
            .map_err(|(_, buffer)| AttemptError::Lost(buffer))?;
        let _registration = Registration {
            connection,
            itt: self.itt,
        };
        let limits = connection.limits;
        let plan = match self.write_data {
            Some(_) => limits.write_plan(self.expected_length),
            None => WritePlan {
                immediate: 0,
                unsolicited: 0,
            },
        };
        let mut tracker = self.write_data.map(|_| {
            R2tTracker::new(limits, self.expected_length)
                .after_unsolicited(plan.immediate + plan.unsolicited)
        });
        let numbered = match self.start {
            Start::Fresh => None,
            Start::Reassign(cmd_sn) => {
                let reassigned =
                    Box::pin(self.inner.reassign(connection, self.itt, self.lun, cmd_sn)).await;
                let (response, exp_cmd_sn) = match reassigned {
                    Ok(answer) => answer,
                    Err(error) => return Err(self.lost_or(error, &mut events)),
                };
                match response {
                    TaskResponse::FunctionComplete => {
                        // It goes on here: a read's Data-In and status, a
                        // write's R2Ts for what the target lacks.
                        self.inner.tasks_reassigned.fetch_add(1, Ordering::Relaxed);
                        if let Some(tracker) = tracker.as_mut() {
                            tracker.reassigned();
                        }
                        None
                    }
                    // The target never had it (ExpCmdSN has not passed it):
                    // the same task again, with its CmdSN (RFC 7143 7.2.1).
                    TaskResponse::TaskDoesNotExist if !cmd_sn.lt(exp_cmd_sn) => Some(cmd_sn),
                    other => {
                        tracing::warn!(
                            itt = self.itt,
                            cmd_sn = cmd_sn.get(),
                            exp_cmd_sn = exp_cmd_sn.get(),
                            ?other,
                            "TASK REASSIGN refused"
                        );
                        let buffer = self.connection.unregister(self.itt);
                        return Err(AttemptError::Gone {
                            buffer,
                            reinstate: other != TaskResponse::TaskDoesNotExist,
                        });
                    }
                }
            }
        };
        let send = match (self.start, numbered) {
            (Start::Fresh, _) => self.send_command(reads, &plan, None).await,
            (Start::Reassign(_), Some(cmd_sn)) => {
                self.send_command(reads, &plan, Some(cmd_sn)).await
            }
            (Start::Reassign(_), None) => Ok(()),
        };
        if let Err(error) = send {
            return Err(self.lost_or(error, &mut events));
        }
        // At ERL 1 an R2T lost on the way is asked for again (RFC 7143
        // 11.16): a write that waits for an R2T this long sends an R2T
        // SNACK, then again at twice the wait, up to a limit.
        let recovers = connection.recovers_data();
        let mut r2t_wait = R2T_SNACK_AFTER;
        let mut snacked = false;
        loop {
            let awaits_r2t = recovers && tracker.as_ref().is_some_and(R2tTracker::awaits_r2t);
            let event = if awaits_r2t {
                match tokio::time::timeout(r2t_wait, events.recv()).await {
                    Ok(event) => event,
                    Err(_) => {
                        let next = tracker.as_ref().map_or(0, R2tTracker::next_r2t_sn);
                        tracing::warn!(
                            itt = self.itt,
                            r2t_sn = next,
                            "no R2T for {r2t_wait:?}: R2T SNACK"
                        );
                        connection.r2t_snack(self.itt, next, 0);
                        snacked = true;
                        r2t_wait = (r2t_wait * 2).min(R2T_SNACK_MAX_WAIT);
                        continue;
                    }
                }
            } else {
                events.recv().await
            };
            let Some(event) = event else { break };
            match event {
                TaskEvent::Scsi(result) => return result.map_err(AttemptError::Failed),
                TaskEvent::Lost(buffer) => return Err(AttemptError::Lost(buffer)),
                TaskEvent::Rejected(reason) if snacked => {
                    // The SNACK asked for an R2T the target had not sent
                    // yet: it comes when the target is ready.
                    tracing::debug!(itt = self.itt, ?reason, "R2T SNACK refused");
                    snacked = false;
                }
                TaskEvent::Rejected(reason) => {
                    return Err(AttemptError::Failed(Error::Rejected(reason)));
                }
                TaskEvent::R2t(r2t) => {
                    r2t_wait = R2T_SNACK_AFTER;
                    let (Some(tracker), Some(data)) = (tracker.as_mut(), self.write_data) else {
                        connection.close();
                        return Err(AttemptError::Failed(Error::Protocol(
                            "R2T for a command that writes nothing".into(),
                        )));
                    };
                    let recoveries = tracker.recoveries();
                    let segments = match tracker.r2t(
                        r2t.r2t_sn.get(),
                        r2t.target_transfer_tag,
                        r2t.buffer_offset,
                        r2t.desired_data_transfer_length,
                    ) {
                        Ok(segments) => segments,
                        Err(TransferError::R2tSnOutOfOrder { got, expected }) if recovers => {
                            if got.wrapping_sub(expected) < 0x8000_0000 {
                                // R2Ts before this one were lost: ask for
                                // them all again, this one included.
                                connection.r2t_snack(self.itt, expected, 0);
                                snacked = true;
                            }
                            // Else a copy of one already answered (a
                            // SNACK's answer crossing the original).
                            continue;
                        }
                        Err(error) => {
                            // ERL 0: the task cannot go on; the connection
                            // is in an unknown state.
                            connection.close();
                            return Err(AttemptError::Failed(Error::Protocol(format!(
                                "bad R2T: {error}"
                            ))));
                        }
                    };
                    if tracker.recoveries() > recoveries {
                        tracing::info!(
                            itt = self.itt,
                            offset = r2t.buffer_offset,
                            length = r2t.desired_data_transfer_length,
                            "recovery R2T: sending the data again"
                        );
                        connection.recovery_r2t_answered();
                    }
                    let sent = self
                        .send_data_out(
                            data,
                            r2t.target_transfer_tag,
                            r2t.desired_data_transfer_length,
                            segments,
                        )
                        .await;
                    if let Err(error) = sent {
                        return Err(self.lost_or(error, &mut events));
                    }
                    tracker.answered(r2t.target_transfer_tag);
                }
                TaskEvent::Reply(header, _) => {
                    tracing::debug!(opcode = ?header.pdu.opcode(), "ignoring a reply for a SCSI task");
                }
            }
        }
        Err(AttemptError::Lost(None))
    }

    /// A send failed: the connection is closed, so the task's buffer comes
    /// back through its channel as `Lost`.
    fn lost_or(
        &self,
        error: Error,
        events: &mut mpsc::UnboundedReceiver<TaskEvent>,
    ) -> AttemptError {
        if let Some(buffer) = self.connection.unregister(self.itt) {
            return AttemptError::Lost(Some(buffer));
        }
        while let Ok(event) = events.try_recv() {
            if let TaskEvent::Lost(buffer) = event {
                return AttemptError::Lost(buffer);
            }
        }
        match error {
            Error::ConnectionLost | Error::Datamover(_) => AttemptError::Lost(None),
            other => AttemptError::Failed(other),
        }
    }

    /// Sends the SCSI Command with its immediate data, then the
    /// unsolicited Data-Out. A command whose data is small is posted (it
    /// leaves in a batch with others); a larger one is sent directly from
    /// the caller's buffer. Either way its CmdSN is taken in the same hold
    /// of the outbox's lock that queues or writes it, so the CmdSN order on
    /// the wire is the order taken.
    async fn send_command(
        &self,
        reads: bool,
        plan: &WritePlan,
        numbered: Option<CmdSn>,
    ) -> Result<(), Error> {
        let connection = self.connection;
        let window = connection.window();
        let data = self.write_data.unwrap_or_default();
        let immediate = &data[..plan.immediate as usize];
        let header = |cmd_sn: CmdSn| self.command_header(reads, plan, cmd_sn);
        let unsolicited = (plan.immediate + plan.unsolicited) as usize;
        if self.write_data.is_some()
            && unsolicited < self.expected_length as usize
            && connection.descriptors.wanted()
        {
            // The target will fetch the rest itself (iSER: RDMA Read).
            connection
                .descriptors
                .data_out(self.itt, data, self.write_owner, unsolicited);
        }
        if let Some(cmd_sn) = numbered {
            connection.post_command_numbered(self.itt, immediate, cmd_sn, header)?;
            return self
                .send_data_out(data, RESERVED_TAG, plan.unsolicited, self.unsolicited(plan))
                .await;
        }
        if unsolicited <= POSTED_DATA_LIMIT {
            while connection
                .post_command(self.itt, immediate, header)?
                .is_none()
            {
                window.wait_open().await;
            }
            return self
                .send_data_out(data, RESERVED_TAG, plan.unsolicited, self.unsolicited(plan))
                .await;
        }
        Box::pin(self.send_command_directly(immediate, header, data, plan)).await
    }

    /// [`Attempt::send_command`] for a command whose data is too large to
    /// post: the command and its unsolicited Data-Out written directly from
    /// the caller's buffer under the write lock. Boxed by its caller, like
    /// every path a small command never takes: an async fn's state is as
    /// large as its largest path, and every command's future is moved (so
    /// copied) as it is built.
    async fn send_command_directly(
        &self,
        immediate: &[u8],
        header: impl Fn(CmdSn) -> Header,
        data: &[u8],
        plan: &WritePlan,
    ) -> Result<(), Error> {
        let connection = self.connection;
        let mut sending = loop {
            let mut sending = connection.sending().await;
            if sending
                .send_command(self.itt, immediate, &header)
                .await?
                .is_some()
            {
                break sending;
            }
            drop(sending);
            connection.window().wait_open().await;
        };
        self.write_data_out(&mut sending, data, RESERVED_TAG, self.unsolicited(plan))
            .await
    }

    /// The SCSI Command PDU (RFC 7143 section 11.3) numbered `cmd_sn`.
    fn command_header(&self, reads: bool, plan: &WritePlan, cmd_sn: CmdSn) -> Header {
        self.sent_cmd_sn
            .store(u64::from(cmd_sn.get()), Ordering::SeqCst);
        let mut cdb = [0u8; 16];
        let head = self.cdb.len().min(16);
        cdb[..head].copy_from_slice(&self.cdb[..head]);
        let mut header = Header::new(
            Pdu::ScsiCommand(ScsiCommand {
                immediate: false,
                final_flag: plan.unsolicited == 0,
                read: reads,
                write: self.write_data.is_some(),
                attr: self.attribute,
                lun: Lun(encode_lun(self.lun)),
                initiator_task_tag: self.itt,
                expected_data_transfer_length: self.expected_length,
                cmd_sn,
                exp_stat_sn: self.connection.exp_stat_sn(),
                cdb,
            }),
            plan.immediate,
        );
        if self.cdb.len() > 16 {
            header.ahs.push(Ahs::ExtendedCdb(self.cdb[16..].to_vec()));
        }
        header
    }

    /// The unsolicited Data-Out PDUs of `plan` (RFC 7143 section 13.10).
    fn unsolicited(&self, plan: &WritePlan) -> Vec<DataSegment> {
        data_segments(
            plan.immediate,
            plan.unsolicited,
            self.connection.limits.max_send_segment,
        )
    }

    /// Sends one Data-Out sequence (unsolicited, or the answer to an R2T
    /// with `target_transfer_tag`) of `length` bytes: posted when small,
    /// sent directly from the caller's buffer otherwise.
    async fn send_data_out(
        &self,
        data: &[u8],
        target_transfer_tag: u32,
        length: u32,
        segments: impl IntoIterator<Item = DataSegment>,
    ) -> Result<(), Error> {
        let connection = self.connection;
        if length as usize <= POSTED_DATA_LIMIT {
            for segment in segments {
                let (header, range) = self.data_out(target_transfer_tag, &segment);
                connection.post(&header, &data[range])?;
            }
            return Ok(());
        }
        // Boxed: see `send_command_directly`.
        Box::pin(async move {
            let mut sending = connection.sending().await;
            self.write_data_out(&mut sending, data, target_transfer_tag, segments)
                .await
        })
        .await
    }

    /// Writes the Data-Out PDUs of `segments` directly from `data`, under
    /// the write lock `sending` holds.
    async fn write_data_out(
        &self,
        sending: &mut Sending<'_>,
        data: &[u8],
        target_transfer_tag: u32,
        segments: impl IntoIterator<Item = DataSegment>,
    ) -> Result<(), Error> {
        for segment in segments {
            let (header, range) = self.data_out(target_transfer_tag, &segment);
            sending.send(&header, &data[range]).await?;
        }
        Ok(())
    }

    /// The Data-Out PDU (RFC 7143 section 11.7) of `segment`, and where
    /// its data lies in the command's buffer.
    fn data_out(
        &self,
        target_transfer_tag: u32,
        segment: &DataSegment,
    ) -> (Header, std::ops::Range<usize>) {
        let start = segment.offset as usize;
        let header = Header::new(
            Pdu::DataOut(DataOut {
                final_flag: segment.last_in_sequence,
                lun: Lun(encode_lun(self.lun)),
                initiator_task_tag: self.itt,
                target_transfer_tag,
                exp_stat_sn: self.connection.exp_stat_sn(),
                data_sn: DataSn::new(segment.data_sn),
                buffer_offset: segment.offset,
            }),
            segment.length,
        );
        (header, start..start + segment.length as usize)
    }
}
