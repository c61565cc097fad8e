//! The reader task: every PDU from the target is read here and handed on
//! by its kind (Data-In, SCSI Response, R2T, NOP-In, Text, Task
//! Management, Logout, Reject, Asynchronous Message), the command window
//! updated from it, and a target's ping answered. When it ends, the
//! connection's failure is recorded (RFC 7143 8.1) and the connection
//! closed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use iscsi_datamover::{PduReceiver, Receiver};
use iscsi_proto::pdu::{AsyncEvent, Header, NopIn, NopOut, Pdu, RESERVED_TAG, RejectReason};
use iscsi_proto::state::{ConnectionEvent, ConnectionState as RfcConnectionState};

use super::{Connection, TaskEvent};
use crate::error::Error;

impl Connection {
    /// Answers a target's ping (RFC 7143 section 11.18.3).
    fn answer_ping(&self, nop: NopIn, data: Vec<u8>) {
        let header = Header::new(
            Pdu::NopOut(NopOut {
                immediate: true,
                lun: nop.lun,
                initiator_task_tag: RESERVED_TAG,
                target_transfer_tag: nop.target_transfer_tag,
                cmd_sn: self.window.current(),
                exp_stat_sn: self.exp_stat_sn(),
            }),
            data.len() as u32,
        );
        if let Err(error) = self.post(&header, &data) {
            tracing::debug!(%error, "answering a NOP-In failed");
        }
    }
}

pub(super) async fn run_reader(connection: Arc<Connection>, mut receiver: Receiver) {
    let result = tokio::select! {
        result = read_loop(&connection, &mut receiver) => result,
        () = connection.closed() => Ok(()),
    };
    if let Err(error) = result
        && !connection.finished.load(Ordering::SeqCst)
    {
        tracing::warn!(cid = connection.cid, %error, "connection lost");
    }
    if !connection.finished.load(Ordering::SeqCst) {
        // Given up (or lost), not logged out: the socket goes both ways
        // now. Dropping this half alone would leave it open while the send
        // half lives, and a target sending to it would wait for a reader
        // that never comes, holding its tasks (and a reinstatement) up.
        receiver.sever();
    }
    // Not ended by a logout, the connection failed (T15, T16, T17). ERL 0
    // keeps nothing of it for a cleanup: its tasks go back to the session,
    // which reinstates itself (M1).
    match connection.rfc_state() {
        RfcConnectionState::Free => {}
        RfcConnectionState::CleanupWait => connection.record(ConnectionEvent::CleanupTimedOut),
        _ => {
            connection.record(ConnectionEvent::TransportLost);
            connection.record(ConnectionEvent::CleanupTimedOut);
        }
    }
    connection.close();
}

async fn read_loop(connection: &Arc<Connection>, receiver: &mut Receiver) -> Result<(), Error> {
    loop {
        let Some(header) = receiver.receive_header().await? else {
            return Err(Error::ConnectionLost);
        };
        let length = header.data_segment_length;
        match header.pdu {
            Pdu::DataIn(data_in) => connection.data_in(data_in, length, receiver).await?,
            Pdu::ScsiResponse(response) => {
                let data = receiver.receive_data().await?;
                connection.scsi_response(response, data)?;
            }
            Pdu::ReadyToTransfer(r2t) => {
                if length != 0 {
                    return Err(Error::Protocol("R2T with a data segment".into()));
                }
                connection.window.update(r2t.exp_cmd_sn, r2t.max_cmd_sn);
                connection.route(r2t.initiator_task_tag, TaskEvent::R2t(r2t), false);
            }
            Pdu::NopIn(ref nop) => {
                let nop = nop.clone();
                let data = receiver.receive_data().await?;
                connection.window.update(nop.exp_cmd_sn, nop.max_cmd_sn);
                if nop.initiator_task_tag == RESERVED_TAG {
                    // Unsolicited: StatSN is not advanced (11.19.2).
                    if nop.target_transfer_tag != RESERVED_TAG {
                        connection.answer_ping(nop, data);
                    }
                } else {
                    connection.advance_stat_sn(nop.stat_sn);
                    connection.route(nop.initiator_task_tag, TaskEvent::Reply(header, data), true);
                }
            }
            Pdu::TextResponse(ref text) => {
                let (itt, stat_sn, exp, max) = (
                    text.initiator_task_tag,
                    text.stat_sn,
                    text.exp_cmd_sn,
                    text.max_cmd_sn,
                );
                let data = receiver.receive_data().await?;
                connection.advance_stat_sn(stat_sn);
                connection.window.update(exp, max);
                connection.route(itt, TaskEvent::Reply(header, data), false);
            }
            Pdu::TaskManagementResponse(ref tmf) => {
                let (itt, stat_sn, exp, max) = (
                    tmf.initiator_task_tag,
                    tmf.stat_sn,
                    tmf.exp_cmd_sn,
                    tmf.max_cmd_sn,
                );
                let data = receiver.receive_data().await?;
                connection.advance_stat_sn(stat_sn);
                connection.window.update(exp, max);
                connection.route(itt, TaskEvent::Reply(header, data), true);
            }
            Pdu::LogoutResponse(ref logout) => {
                // Only a logout of this connection or its session puts it
                // in IN_LOGOUT; one removing another connection for
                // recovery (ERL 2) leaves this one as it was.
                if connection.rfc_state() == RfcConnectionState::InLogout {
                    use iscsi_proto::pdu::LogoutResponseCode::ClosedSuccessfully;
                    if logout.response == ClosedSuccessfully {
                        // The target closes the connection next: its end
                        // of stream is expected, not a loss.
                        connection.finished.store(true, Ordering::SeqCst);
                        connection.record(ConnectionEvent::LogoutSucceeded);
                    } else {
                        connection.record(ConnectionEvent::LogoutFailed);
                    }
                }
                let (itt, stat_sn, exp, max) = (
                    logout.initiator_task_tag,
                    logout.stat_sn,
                    logout.exp_cmd_sn,
                    logout.max_cmd_sn,
                );
                let data = receiver.receive_data().await?;
                connection.advance_stat_sn(stat_sn);
                connection.window.update(exp, max);
                connection.route(itt, TaskEvent::Reply(header, data), true);
            }
            Pdu::Reject(reject) => {
                let data = receiver.receive_data().await?;
                connection.advance_stat_sn(reject.stat_sn);
                connection
                    .window
                    .update(reject.exp_cmd_sn, reject.max_cmd_sn);
                // The data segment is the rejected PDU's header (11.17.3).
                let itt = data
                    .get(16..20)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                tracing::warn!(reason = ?reject.reason, ?itt, "target rejected a PDU");
                // Data lost to a data digest error (a Data-Out, or a
                // command's immediate data) does not end its task: the
                // target processes the rest, asks for the data again with a
                // recovery R2T or ends the task with a status (RFC 7143
                // 7.8, 11.17.1 note 1), which the task waits for.
                let carries_data = matches!(data.first().map(|b| b & 0x3f), Some(0x01 | 0x05));
                let awaits_target = carries_data && reject.reason == RejectReason::DataDigestError;
                if let (Some(itt), false) = (itt, awaits_target) {
                    connection.route(itt, TaskEvent::Rejected(reject.reason), true);
                }
            }
            Pdu::AsyncMessage(message) => {
                receiver.receive_data().await?;
                connection.advance_stat_sn(message.stat_sn);
                connection
                    .window
                    .update(message.exp_cmd_sn, message.max_cmd_sn);
                match message.async_event {
                    AsyncEvent::LogoutRequest
                    | AsyncEvent::ConnectionDrop
                    | AsyncEvent::AllConnectionsDrop => {
                        if message.async_event == AsyncEvent::LogoutRequest {
                            // T11 (T12, T14 when asked again).
                            connection.record(ConnectionEvent::LogoutRequestedByTarget);
                        }
                        // ERL 0: leave, and let the session reinstate
                        // itself and retry (section 11.9.1).
                        tracing::info!(event = ?message.async_event, "target asks us to leave");
                        return Ok(());
                    }
                    event => tracing::debug!(?event, "asynchronous message"),
                }
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {:?} from the target",
                    other.opcode()
                )));
            }
        }
    }
}
