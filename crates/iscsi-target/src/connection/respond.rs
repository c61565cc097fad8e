//! Answering a command: its Data-In and status on the connection its
//! task is allegiant to (phase collapse at ERL 0; at ERL 1 and above a
//! SCSI Response of its own, kept for SNACKs; at ERL 2 parked or kept
//! for TASK REASSIGN when that connection is gone). What the answer is
//! made of is decided in the core (`iscsi_target_core::answer`); this
//! sends it.

use super::*;
use iscsi_target_core::answer::{Answer, Collapsed, CollapsedPdu, Outcome, Residual};

/// Everything needed to answer one command.
pub(super) struct Response<'a> {
    pub(super) command: &'a ScsiCommand,
    pub(super) outcome: CommandOutcome,
    pub(super) data_in: Gather,
    pub(super) residual: Residual,
    pub(super) r2ts: u32,
    /// The bytes of Data-Out and immediate data the command was executed
    /// with (its written bytes, for the metrics).
    pub(super) written: u64,
    /// Told how long the response waited for the connection's writer.
    pub(super) tap: Option<&'a Tap>,
    /// Short PDUs of the answer are held back by the datamover, to leave
    /// with the next write or when the connection's reader flushes before
    /// it waits for more (`Sender::hold`): set for the commands the reader
    /// answers itself.
    pub(super) hold: bool,
}

/// Sends a command's Data-In (cut by MaxRecvDataSegmentLength and
/// MaxBurstLength) and its status, on the connection the task is allegiant
/// to: in the last Data-In when the command succeeded at ERL 0 (phase
/// collapse, RFC 7143 11.7.3), else in a SCSI Response carrying the sense
/// data (11.4.7). A task aborted meanwhile gets no status (11.5.1). At ERL
/// 2 an answer whose connection is gone is kept for a TASK REASSIGN
/// (`recovery`).
///
/// Counts the command in its session's counters for its LUN once the
/// status is out (or kept for a TASK REASSIGN), unless it was aborted.
pub(super) async fn respond(
    session: &Session,
    task: &Task,
    response: Response<'_>,
) -> Result<(), DatamoverError> {
    let command = response.command;
    let lun = iscsi_scsi::decode_lun(command.lun.0);
    let done = crate::metrics::counters::Completion {
        op: crate::metrics::counters::Op::of(command.cdb[0]),
        read_bytes: if command.read {
            response
                .data_in
                .len()
                .min(command.expected_data_transfer_length as usize) as u64
        } else {
            0
        },
        written_bytes: response.written,
        sense_key: response.outcome.sense.as_ref().map(|s| s.key as u8),
        latency: std::time::Duration::ZERO,
    };
    let result = send_response(session, task, response).await;
    if let (Ok(()), Some(lun)) = (&result, lun)
        && !task.aborted.load(Ordering::Acquire)
    {
        let done = crate::metrics::counters::Completion {
            latency: task.arrived.elapsed(),
            ..done
        };
        session.stats.luns.record(lun, &done);
    }
    result
}

/// [`respond`] without the counting.
async fn send_response(
    session: &Session,
    task: &Task,
    response: Response<'_>,
) -> Result<(), DatamoverError> {
    let Some((mut writer, mut limits)) = task.allegiance.current() else {
        // Every SCSI task is pledged to its connection when admitted.
        session.finish(task);
        return Ok(());
    };
    let Response {
        command,
        outcome,
        data_in,
        residual,
        r2ts,
        written: _,
        tap,
        hold,
    } = response;
    let sense = outcome.sense.is_some().then(|| outcome.sense_bytes());
    let decided = Answer::new(
        command,
        Outcome {
            status: outcome.status,
            sense: sense.as_deref(),
        },
        data_in,
        residual,
        r2ts,
        writer.retained.is_some(),
        limits,
    );
    let mut answer = match decided {
        Answer::Collapsed(collapsed) => {
            let result = respond_collapsed(&writer, session, task, &collapsed, tap, hold).await;
            if result.is_err() {
                // The connection failed under the Data-In: the task ends
                // (without this its window slot stayed taken for good).
                session.finish(task);
            }
            return result;
        }
        Answer::Separate(answer) => answer,
    };
    loop {
        let waiting = tap.map(|_| std::time::Instant::now());
        let mut out = writer.lock().await;
        out.hold(hold);
        if let (Some(tap), Some(waiting)) = (tap, waiting) {
            // Other commands' Data-In and statuses go first: at a deep
            // queue this is where a response spends its time.
            let itt = command.initiator_task_tag;
            tap.step("wait for writer", itt, waiting, std::time::Instant::now());
        }
        if writer.is_closed() {
            // The connection is gone.
            drop(out);
            if task.aborted.load(Ordering::Acquire) || !session.recovers_connections() {
                // Below ERL 2 the answer dies with its connection (as the
                // task does: nothing will ask for it).
                session.finish(task);
                return Ok(());
            }
            match task.allegiance.park(&writer, answer) {
                None => return Ok(()),
                Some((moved_to, moved_limits, back)) => {
                    (writer, limits, answer) = (moved_to, moved_limits, back);
                    answer.limits = limits;
                    continue;
                }
            }
        }
        let result = send_answer(&mut out, session, &writer, Some(task), &answer, 0).await;
        if result.is_err()
            && (!session.recovers_connections() || task.aborted.load(Ordering::Acquire))
        {
            // The task ends with its connection.
            session.finish(task);
        } else if result.is_err() {
            // The connection failed under the answer: kept for a TASK
            // REASSIGN, like the statuses it had sent (under the writer's
            // lock, so before the connection's end hands those over).
            session.finish(task);
            session.orphans.adopt(
                command.initiator_task_tag,
                Orphan::Answered(answer),
                writer.number,
            );
        }
        return result;
    }
}

/// ERL 0's answer to a read that succeeded: the status in the last
/// Data-In (phase collapse, RFC 7143 11.7.3).
async fn respond_collapsed(
    writer: &Writer,
    session: &Session,
    task: &Task,
    answer: &Collapsed<Gather>,
    tap: Option<&Tap>,
    hold: bool,
) -> Result<(), DatamoverError> {
    let waiting = tap.map(|_| std::time::Instant::now());
    let mut out = writer.lock().await;
    out.hold(hold);
    if let (Some(tap), Some(waiting)) = (tap, waiting) {
        let itt = task.itt;
        tap.step("wait for writer", itt, waiting, std::time::Instant::now());
    }
    for CollapsedPdu {
        pdu,
        data,
        with_status,
    } in answer.pdus()
    {
        if with_status && !session.complete(task) {
            return Ok(());
        }
        let stat = if with_status {
            Stat::Advance
        } else {
            Stat::Reserved
        };
        let length = data.len() as u64;
        out.send_data_in(session, Pdu::DataIn(pdu), data, stat)
            .await?;
        SessionStats::add(&session.stats.read_bytes, length);
    }
    Ok(())
}

/// Sends a task's Data-In from DataSN `from_data_sn` on (cut by the
/// connection's limits) and then its SCSI Response with the next StatSN,
/// unless `task` was aborted meanwhile; keeps the status for SNACKs at ERL
/// 1 and above. The first answer to a command, and its answer again after
/// a TASK REASSIGN (RFC 7143 7.2.2: "sending the remaining data and
/// sending (or resending) the status").
pub(super) async fn send_answer(
    out: &mut WriterState,
    session: &Session,
    writer: &Writer,
    task: Option<&Task>,
    answer: &SentStatus,
    from_data_sn: u32,
) -> Result<(), DatamoverError> {
    let limits = answer.limits;
    let segments = limits.data_in_segments(answer.data_in.len() as u32);
    for segment in segments.iter().filter(|s| s.data_sn >= from_data_sn) {
        let (pdu, data) = answer.data_in(segment);
        out.send_data_in(session, Pdu::DataIn(pdu), data, Stat::Reserved)
            .await?;
        SessionStats::add(&session.stats.read_bytes, u64::from(segment.length));
    }
    if let Some(task) = task
        && !session.complete(task)
    {
        return Ok(());
    }
    let response = answer.response_after(segments.len());
    let stat_sn = out.next_stat_sn();
    let kept = writer.retained.as_ref().map(|_| response.clone());
    out.send(
        session,
        Pdu::ScsiResponse(response),
        &answer.sense_data,
        Stat::Advance,
    )
    .await?;
    if let (Some(retained), Some(response)) = (&writer.retained, kept) {
        retained
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keep(SentStatus {
                stat_sn,
                response,
                sense_data: answer.sense_data.clone(),
                data_in: answer.data_in.clone(),
                lun: answer.lun,
                limits,
            });
    }
    Ok(())
}
