//! Data-In (RFC 7143 11.7): each PDU checked against its command (DataSN,
//! offset, length, 11.7.4-11.7.5) and its data landed straight in the
//! read's buffer (the caller's, one of the session's pool, or a scratch
//! buffer for a discarded read); gaps and digest errors noted for a SNACK
//! at ERL 1. The hot path of a read, kept apart from the other PDUs.

use iscsi_datamover::{DatamoverError, PduReceiver, Receiver};
use iscsi_proto::error::DecodeError;
use iscsi_proto::pdu::{DataIn, SnackType};
use iscsi_proto::serial::DataSn;

use super::status::residual;
use super::{Connection, ReadMode, ReadProgress, TaskEntry};
use crate::error::Error;

impl Connection {
    /// A Data-In PDU: check it against the command, land its data in the
    /// command's buffer, complete the command if it carries status.
    pub(super) async fn data_in(
        &self,
        data_in: DataIn,
        length: u32,
        receiver: &mut Receiver,
    ) -> Result<(), Error> {
        self.window.update(data_in.exp_cmd_sn, data_in.max_cmd_sn);
        let itt = data_in.initiator_task_tag;
        enum Plan {
            /// Into this buffer at this offset; for a pooled read still
            /// without its buffer, the length of the one to attach.
            Land(Vec<u8>, usize, Option<usize>),
            /// A discarded read's data at this offset: through a scratch
            /// buffer of the pool (the read's own empty one is kept).
            Scratch(Vec<u8>, usize),
            Discard,
            Fail(Error),
            /// Lost PDUs that ERL 0 cannot ask for again: the connection
            /// ends and its commands are retried.
            Drop(Error),
        }
        let data_sn = data_in.data_sn.get();
        let mut again = false;
        let mut gap = None;
        let plan = {
            let mut state = self.lock();
            match state.tasks.get_mut(&itt) {
                None => Plan::Discard,
                Some(TaskEntry { read: None, .. }) => Plan::Fail(Error::Protocol(
                    "Data-In for a command that reads nothing".to_owned(),
                )),
                Some(TaskEntry {
                    read: Some(read), ..
                }) => check_data_in(
                    read,
                    &data_in,
                    length,
                    self.limits.data_pdu_in_order,
                    self.recovers_data,
                )
                .map_or_else(Plan::Fail, |(start, arrival)| {
                    if arrival == Arrival::Duplicate {
                        return Plan::Discard;
                    }
                    again = arrival == Arrival::Again;
                    if let Arrival::AfterGap(first) = arrival {
                        if !self.recovers_data {
                            return Plan::Drop(Error::Protocol(format!(
                                "Data-In DataSN {first} to {} lost at ERL 0",
                                data_sn.wrapping_sub(1)
                            )));
                        }
                        read.missing.extend(first..data_sn);
                        gap = Some((first, data_sn - first));
                    }
                    match read.buffer.take() {
                        Some(buffer) => {
                            let expected = read.expected as usize;
                            match read.mode {
                                ReadMode::Discarded => Plan::Scratch(buffer, start),
                                ReadMode::Pooled if buffer.len() != expected => {
                                    Plan::Land(buffer, start, Some(expected))
                                }
                                ReadMode::Own | ReadMode::Pooled => Plan::Land(buffer, start, None),
                            }
                        }
                        None => Plan::Discard,
                    }
                }),
            }
        };
        let landing = Landing {
            itt,
            data_sn,
            length,
            again,
        };
        match plan {
            Plan::Land(mut buffer, start, attach) => {
                if let Some(expected) = attach {
                    buffer = self.buffers.take(expected, !self.limits.data_pdu_in_order);
                }
                let end = start + length as usize;
                let landed = receiver.receive_data_into(&mut buffer[start..end]).await;
                self.landed(landing, buffer, end, landed)?;
            }
            Plan::Scratch(own, start) => {
                let mut scratch = self.buffers.take(length as usize, false);
                let landed = receiver.discard_data(&mut scratch).await;
                self.buffers.give(scratch);
                self.landed(landing, own, start + length as usize, landed)?;
            }
            Plan::Discard => {
                match receiver.receive_data().await {
                    // Data nobody waits for (a duplicate, a task gone):
                    // at ERL 1 its digest error costs nothing.
                    Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. }))
                        if self.recovers_data => {}
                    other => {
                        other?;
                    }
                }
                if !self.lock().tasks.contains_key(&itt) {
                    tracing::debug!(itt, "Data-In for a task no longer waiting");
                }
            }
            Plan::Fail(error) => {
                receiver.receive_data().await?;
                self.fail_scsi(itt, error);
                return Ok(());
            }
            Plan::Drop(error) => {
                receiver.receive_data().await?;
                tracing::warn!(itt, %error, "closing the connection");
                return Err(error);
            }
        }
        if let Some((first, count)) = gap {
            tracing::warn!(itt, first, count, "Data-In missing: Data SNACK");
            self.snack(SnackType::DataR2t, itt, first, count);
        }
        if data_in.acknowledge && self.recovers_data {
            self.acknowledge_data(itt, &data_in);
        }
        if let Some(status) = data_in.status {
            self.status_arrived(itt, data_in.stat_sn);
            if !data_in.final_flag {
                self.fail_scsi(
                    itt,
                    Error::Protocol("Data-In with status but no F bit".into()),
                );
                return Ok(());
            }
            let residual = residual(
                data_in.residual_overflow,
                data_in.residual_underflow,
                data_in.residual_count,
            );
            self.complete_scsi(itt, status, residual, Vec::new());
        }
        Ok(())
    }

    /// Gives a read its buffer back once a Data-In's data has been taken
    /// off the stream (`end` is where it ends in the buffer), and notes how
    /// that went. At ERL 1 a data digest error only loses that PDU's data:
    /// a Data SNACK asks for it again (RFC 7143 7.3, 11.16), and a task
    /// whose status came meanwhile ends when the last missing PDU is in.
    fn landed(
        &self,
        landing: Landing,
        buffer: Vec<u8>,
        end: usize,
        outcome: Result<(), DatamoverError>,
    ) -> Result<(), Error> {
        let Landing {
            itt,
            data_sn,
            length,
            again,
        } = landing;
        let lost = match &outcome {
            Ok(()) => false,
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. }))
                if self.recovers_data =>
            {
                true
            }
            Err(_) => false,
        };
        let mut complete = None;
        let mut ask_again = None;
        {
            let mut state = self.lock();
            if let Some(TaskEntry {
                read: Some(read), ..
            }) = state.tasks.get_mut(&itt)
            {
                read.buffer = Some(buffer);
                if !again {
                    read.next_data_sn = data_sn.wrapping_add(1);
                    read.next_offset = read.next_offset.max(end as u32);
                }
                if lost {
                    if !read.missing.contains(&data_sn) {
                        read.missing.push(data_sn);
                    }
                    // The last PDU of the read is asked for as "all from
                    // BegRun" (RunLength 0): LIO refuses a RunLength that
                    // reaches its last DataSN (Linux 6.1,
                    // iscsit_handle_recovery_datain counts one short).
                    let last = end as u32 >= read.expected;
                    ask_again = Some(if last { 0 } else { 1 });
                } else if outcome.is_ok() {
                    read.received += length;
                    read.missing.retain(|&sn| sn != data_sn);
                    if read.missing.is_empty() {
                        complete = read.held.take();
                        if let Some(stat_sn) = read.held_stat_sn.take() {
                            state.stat_sns.release(stat_sn);
                        }
                    }
                }
            }
        }
        if let Some(run_length) = ask_again {
            tracing::warn!(
                itt,
                data_sn,
                "Data-In data digest error: asking for it again"
            );
            self.snack(SnackType::DataR2t, itt, data_sn, run_length);
            return Ok(());
        }
        if let Some(held) = complete {
            tracing::info!(
                itt,
                "missing Data-In arrived: the held status completes the task"
            );
            self.complete_scsi(itt, held.status, held.residual, held.sense);
        }
        outcome.map_err(Error::from)
    }
}

/// How a Data-In's DataSN stands to what came before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrival {
    /// The next one.
    Next,
    /// One missing before, sent again for a SNACK.
    Again,
    /// Past a gap: the DataSNs from this one up to it were lost (RFC 7143
    /// 7.9: a header digest error, or a PDU dropped on the way).
    AfterGap(u32),
    /// At ERL 1, one received already (a SNACK's answer can repeat some).
    Duplicate,
}

/// Checks one Data-In against its command; returns where its data goes,
/// and how its DataSN stands.
fn check_data_in(
    read: &ReadProgress,
    data_in: &DataIn,
    length: u32,
    in_order: bool,
    recovering: bool,
) -> Result<(usize, Arrival), Error> {
    let data_sn = data_in.data_sn.get();
    let arrival = if data_sn == read.next_data_sn {
        Arrival::Next
    } else if read.missing.contains(&data_sn) {
        Arrival::Again
    } else if DataSn::new(data_sn).gt(DataSn::new(read.next_data_sn)) {
        Arrival::AfterGap(read.next_data_sn)
    } else if recovering {
        // Already here: sent again for a SNACK that asked for more than
        // was missing.
        Arrival::Duplicate
    } else {
        return Err(Error::Protocol(format!(
            "Data-In DataSN {data_sn} where {} was expected",
            read.next_data_sn
        )));
    };
    data_in
        .buffer_offset
        .checked_add(length)
        .filter(|&end| end <= read.expected)
        .ok_or_else(|| {
            Error::Protocol(format!(
                "Data-In at {}+{length} beyond the {}-byte buffer",
                data_in.buffer_offset, read.expected
            ))
        })?;
    if in_order && arrival == Arrival::Next && data_in.buffer_offset != read.next_offset {
        return Err(Error::Protocol(format!(
            "Data-In at offset {} where {} was expected",
            data_in.buffer_offset, read.next_offset
        )));
    }
    Ok((data_in.buffer_offset as usize, arrival))
}

/// One Data-In's data being taken off the stream.
struct Landing {
    itt: u32,
    data_sn: u32,
    length: u32,
    /// Sent again for a SNACK.
    again: bool,
}
