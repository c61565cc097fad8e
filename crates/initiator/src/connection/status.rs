//! A SCSI task's end: a SCSI Response (RFC 7143 11.4) with its sense, or
//! the status of a last Data-In, checked against the data that arrived
//! (residuals, 11.4.5), and a status held back while a read's Data-In is
//! missing (ERL 1). Both the reader and the Data-In path end tasks here.

use iscsi_proto::pdu::{ScsiResponse, ServiceResponse, SnackType};
use iscsi_proto::serial::DataSn;

use super::{Connection, HeldStatus, ReadMode, TaskEntry, TaskEvent};
use crate::command::{Residual, Response};
use crate::error::Error;

impl Connection {
    pub(super) fn fail_scsi(&self, itt: u32, error: Error) {
        tracing::warn!(itt, %error, "command failed");
        self.route(itt, TaskEvent::Scsi(Err(error)), true);
    }

    /// Ends a SCSI task with its status, checking the residual against the
    /// data that arrived (RFC 7143 section 11.4.5).
    pub(super) fn complete_scsi(
        &self,
        itt: u32,
        status: u8,
        residual: Result<Residual, Error>,
        sense: Vec<u8>,
    ) {
        {
            let mut state = self.lock();
            if let Some(TaskEntry {
                read: Some(read), ..
            }) = state.tasks.get_mut(&itt)
                && !read.missing.is_empty()
            {
                tracing::info!(itt, missing = ?read.missing, "status before missing Data-In: held");
                read.held = Some(HeldStatus {
                    status,
                    residual,
                    sense,
                });
                return;
            }
        }
        let Some(task) = self.end_task(itt) else {
            tracing::debug!(itt, "status for a task no longer waiting");
            return;
        };
        let outcome = residual.and_then(|residual| {
            let mut response = Response {
                status,
                sense,
                residual,
                ..Response::default()
            };
            if let Some(read) = task.read {
                let buffer = read
                    .buffer
                    .ok_or_else(|| Error::Protocol("status while data was landing".into()))?;
                if status == crate::command::STATUS_GOOD {
                    let expected_received = match residual {
                        Residual::None | Residual::Overflow(_) => Some(read.expected),
                        Residual::Underflow(n) => read.expected.checked_sub(n),
                    };
                    if expected_received != Some(read.received) {
                        return Err(Error::Protocol(format!(
                            "residual {residual:?} does not match: {} of {} bytes received",
                            read.received, read.expected
                        )));
                    }
                }
                response.data = buffer;
                if read.mode == ReadMode::Pooled {
                    // Only as far as the data reached: the rest of a reused
                    // buffer holds an earlier read's bytes.
                    response.data.truncate(read.next_offset as usize);
                }
                response.received = read.received;
            }
            Ok(response)
        });
        let _ = task.events.send(TaskEvent::Scsi(outcome));
    }

    pub(super) fn scsi_response(&self, response: ScsiResponse, data: Vec<u8>) -> Result<(), Error> {
        self.window.update(response.exp_cmd_sn, response.max_cmd_sn);
        let itt = response.initiator_task_tag;
        // ExpDataSN past the Data-In received: the last ones were lost
        // (RFC 7143 7.9). ERL 1 asks for them (and the status waits for
        // them); ERL 0 ends the connection and retries the command.
        let tail = {
            let mut state = self.lock();
            match state.tasks.get_mut(&itt) {
                Some(TaskEntry {
                    read: Some(read), ..
                }) if self.sees_data_ins
                    && DataSn::new(read.next_data_sn).lt(response.exp_data_sn) =>
                {
                    let (first, end) = (read.next_data_sn, response.exp_data_sn.get());
                    if self.recovers_data {
                        read.missing.extend(first..end);
                        read.next_data_sn = end;
                    }
                    Some((first, end - first))
                }
                _ => None,
            }
        };
        if let Some((first, count)) = tail {
            if !self.recovers_data {
                return Err(Error::Protocol(format!(
                    "{count} Data-In from DataSN {first} lost at ERL 0"
                )));
            }
            tracing::warn!(itt, first, count, "last Data-In missing: Data SNACK");
        }
        self.status_arrived(itt, response.stat_sn);
        if let Some((first, _)) = tail {
            // Everything from `first` on is missing: RunLength 0, "all".
            self.snack(SnackType::DataR2t, itt, first, 0);
        }
        if response.response != ServiceResponse::CommandCompleted {
            self.fail_scsi(itt, Error::TargetFailure(response.response.to_u8()));
            return Ok(());
        }
        let sense = match data.len() {
            0 => Vec::new(),
            1 => {
                self.fail_scsi(itt, Error::Protocol("truncated sense length".into()));
                return Ok(());
            }
            _ => {
                let length = usize::from(u16::from_be_bytes([data[0], data[1]]));
                match data.get(2..2 + length) {
                    Some(sense) => sense.to_vec(),
                    None => {
                        self.fail_scsi(
                            itt,
                            Error::Protocol("sense longer than its segment".into()),
                        );
                        return Ok(());
                    }
                }
            }
        };
        let residual = residual(
            response.residual_overflow,
            response.residual_underflow,
            response.residual_count,
        );
        self.complete_scsi(itt, response.status, residual, sense);
        Ok(())
    }
}

pub(super) fn residual(overflow: bool, underflow: bool, count: u32) -> Result<Residual, Error> {
    match (overflow, underflow) {
        (false, false) => Ok(Residual::None),
        (true, false) => Ok(Residual::Overflow(count)),
        (false, true) => Ok(Residual::Underflow(count)),
        (true, true) => Err(Error::Protocol(
            "both residual overflow and underflow".into(),
        )),
    }
}
