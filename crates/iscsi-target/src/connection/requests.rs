//! The requests of full feature phase that are not SCSI commands or task
//! management: NOP-Out (RFC 7143 11.18), SNACK (11.16), Logout (11.14)
//! and Text (11.10). What each decides is the sans-I/O core's
//! (`iscsi_target_core::{logout, text}`); this file does it: waits,
//! sends, closes.

use iscsi_target_core::logout::{self, LogoutContext, LogoutPlan};
use iscsi_target_core::text::{self as text_core, Asker, TextAsk};

use super::*;

impl Connection {
    pub(super) async fn nop_out(&mut self, nop: NopOut, data: &[u8]) -> Result<(), DatamoverError> {
        if !nop.immediate {
            self.session.consume_cmd_sn(nop.cmd_sn);
        }
        if nop.initiator_task_tag == RESERVED_TAG {
            // An answer to our NOP-In, or a bare ExpStatSN update.
            return Ok(());
        }
        // A ping: answer with the same data (RFC 7143 11.19).
        let reply = NopIn {
            lun: nop.lun,
            initiator_task_tag: nop.initiator_task_tag,
            target_transfer_tag: RESERVED_TAG,
            ..NopIn::default()
        };
        self.writer
            .send(Pdu::NopIn(reply), data, Stat::Advance)
            .await
    }

    /// Answers a SNACK (RFC 7143 11.16): at ErrorRecoveryLevel 0 with a
    /// Reject, at 1 with the Data-In or statuses asked for, sent again from
    /// what the connection kept (`iscsi_target_core::retention`), or a Reject saying why not.
    pub(super) async fn snack(
        &mut self,
        header: &Header,
        snack: &SnackRequest,
    ) -> Result<(), DatamoverError> {
        let Some(retained) = &self.writer.retained else {
            return self.reject(header, RejectReason::SnackReject).await;
        };
        // A command's Data-In and status go out under the writer's lock,
        // and the status is kept before the lock is let go; a Data SNACK
        // can come while the command's last Data-In and status are still
        // going out, so the lock is taken before looking (was: "no
        // unacknowledged data", a Reject, and the task lost).
        let mut out = self.writer.lock().await;
        let answer = self.r2t_replicas(snack).unwrap_or_else(|| {
            retained
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .answer(snack)
        });
        let resends = match answer {
            Ok(resends) => resends,
            Err((reason, why)) => {
                drop(out);
                warn!(
                    itt = snack.initiator_task_tag,
                    beg_run = snack.beg_run,
                    run_length = snack.run_length,
                    "SNACK refused: {why}"
                );
                return self.reject(header, reason).await;
            }
        };
        SessionStats::add(&self.session.stats.snacks, 1);
        SessionStats::add(&self.session.stats.resent, resends.len() as u64);
        info!(
            itt = snack.initiator_task_tag,
            kind = ?snack.snack_type,
            beg_run = snack.beg_run,
            pdus = resends.len(),
            "SNACK: sending again"
        );
        for resend in resends {
            match resend {
                Resend::DataIn(pdu, data) => {
                    out.send_data_in(&self.session, Pdu::DataIn(pdu), data, Stat::Reserved)
                        .await?;
                }
                Resend::Response(pdu, sense, stat_sn) => {
                    out.send(
                        &self.session,
                        Pdu::ScsiResponse(pdu),
                        &sense,
                        Stat::Again(stat_sn),
                    )
                    .await?;
                }
                Resend::R2t(pdu) => {
                    out.send(&self.session, Pdu::ReadyToTransfer(pdu), &[], Stat::Current)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Logout (RFC 7143 11.14): writes still collecting data are dropped,
    /// commands being executed finish, then the response goes out and the
    /// connection (or the whole session) closes.
    pub(super) async fn logout(&mut self, request: LogoutRequest) -> Result<Flow, DatamoverError> {
        if !request.immediate {
            self.session.consume_cmd_sn(request.cmd_sn);
        }
        let context = LogoutContext {
            cid: self.cid,
            recovers_connections: self.session.recovers_connections(),
        };
        let (response, close_session) = match logout::decide(request.reason, request.cid, context) {
            LogoutPlan::Close { close_session } => {
                (LogoutResponseCode::ClosedSuccessfully, close_session)
            }
            LogoutPlan::RemoveForRecovery(cid) => {
                // ERL 2: the connection with that CID (failed, or about to
                // be given up) is closed, its tasks left for TASK REASSIGN;
                // the response goes out once they are in place.
                if self.session.close_cid(cid).await {
                    info!(cid, "connection removed for recovery");
                    return self.recovery_logout_answer(request).await;
                }
                (LogoutResponseCode::CidNotFound, false)
            }
            LogoutPlan::Refuse(code) => (code, false),
        };
        if response == LogoutResponseCode::ClosedSuccessfully {
            self.record(ConnectionEvent::LogoutStarted);
            self.abandon_pending_writes();
            self.in_flight.wait_idle().await;
            let connections = self.session.connections.load(Ordering::Acquire);
            if logout::ends_session(close_session, connections) {
                self.release_nexus().await;
            }
        }
        let reply = LogoutResponse {
            response,
            initiator_task_tag: request.initiator_task_tag,
            time2wait: 0,
            time2retain: 0,
            ..LogoutResponse::default()
        };
        self.writer
            .send(Pdu::LogoutResponse(reply), &[], Stat::Advance)
            .await?;
        if response != LogoutResponseCode::ClosedSuccessfully {
            return Ok(Flow::Continue);
        }
        info!(cid = self.cid, reason = ?request.reason, "logout");
        self.record(ConnectionEvent::LogoutSucceeded);
        if close_session {
            self.session.close_by_logout();
        }
        Ok(Flow::Stop)
    }

    /// The session ends with this logout: its nexus is lost (SPC-2
    /// reservation released) before the initiator hears so, as it may at
    /// once ask for that reservation through another nexus, another
    /// gateway of a group included (libiscsi's Reserve6.Logout). The
    /// session's end says it again, harmlessly.
    async fn release_nexus(&self) {
        let Some(scsi) = &self.session.scsi else {
            return;
        };
        let (scsi, nexus) = (Arc::clone(scsi), self.session.nexus.clone());
        if tokio::task::spawn_blocking(move || scsi.nexus_lost(&nexus))
            .await
            .is_err()
        {
            warn!("logout: releasing the nexus panicked");
        }
    }

    /// Text Request: SendTargets (RFC 7143 13.3, Appendix C) and full
    /// feature phase negotiation.
    pub(super) async fn text(
        &mut self,
        header: &Header,
        request: TextRequest,
        data: &[u8],
    ) -> Result<(), DatamoverError> {
        if !request.immediate {
            self.session.consume_cmd_sn(request.cmd_sn);
        }
        let itt = request.initiator_task_tag;
        let text = match self.text.receive(itt, request.target_transfer_tag, data) {
            Ok(TextAsk::Rest(rest)) => rest,
            Ok(TextAsk::New(pairs)) => {
                let config = self.shared.config();
                let asker = Asker {
                    discovery: self.session.params.session_type == SessionType::Discovery,
                    target: self.session.target_name.as_deref(),
                    portal: self.local,
                    portal_group_tag: config.portal_group_tag,
                };
                let names = || config.targets.iter().map(|t| t.name.as_str());
                let send_targets = |value: &str| text_core::send_targets(value, asker, names());
                match text_core::answer(pairs, send_targets, &config.negotiation) {
                    Ok(text) => text,
                    Err(reason) => return self.reject(header, reason).await,
                }
            }
            Err(reason) => return self.reject(header, reason).await,
        };
        let limit = self.limits.max_send_segment;
        let reply = self.text.reply(itt, text, limit, &mut self.transfer_tags);
        self.writer
            .send(
                Pdu::TextResponse(reply.response),
                &reply.data,
                Stat::Advance,
            )
            .await
    }
}
