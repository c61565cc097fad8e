//! One connection from its first Login Request to its end: the login phase
//! (driven by the protocol core's `TargetLogin`) and the full feature phase.
//!
//! Full feature phase, ErrorRecoveryLevel 0, one connection per session:
//! - SCSI Command: the CmdSN window is checked (RFC 7143 4.2.2.1). A write
//!   gathers immediate data, unsolicited Data-Out and the Data-Out of each R2T
//!   (the protocol core's `transfer` plans and checks them) into one
//!   reused buffer, then executes. A read executes, then answers with Data-In
//!   cut by MaxRecvDataSegmentLength and MaxBurstLength, with the status in
//!   the last Data-In (phase collapse) unless sense data must go in a SCSI
//!   Response. Residuals as RFC 7143 11.4.5 requires.
//! - NOP-Out is answered with NOP-In; Text Request with SendTargets or
//!   negotiation answers; Logout with Logout Response; task management with
//!   its response; anything else, and any PDU that breaks the rules, with a
//!   Reject carrying the offending header.
//!
//! PDUs that arrive while a write waits for its Data-Out (further commands,
//! pings) are queued and handled in order afterwards.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use iscsi_datamover::tcp::TcpDatamover;
use iscsi_datamover::{
    DatamoverError as ConnectionError, PduReceiver, PduSender, Received as Incoming,
};
use iscsi_proto::error::DecodeError;
use iscsi_proto::login::chap::ChallengeHistory;
use iscsi_proto::login::target::{LoginComplete, LoginOutcome, TargetLogin};
use iscsi_proto::pdu::{
    DataIn, Digests, Header, LoginRequest, LogoutReason, LogoutResponse, LogoutResponseCode, Lun,
    NopIn, Pdu, ReadyToTransfer, Reject, RejectReason, ScsiCommand, ScsiResponse, ServiceResponse,
    TaskFunction, TaskManagementResponse, TaskResponse, TextRequest, TextResponse,
};
use iscsi_proto::serial::{CmdSn, DataSn, R2tSn, StatSn};
use iscsi_proto::text::codec::{self, TextPair};
use iscsi_proto::text::{Digest, NegotiatedParameters, Negotiator, Role, SessionType, Stage};
use iscsi_proto::transfer::{DataOutProgress, DataOutTracker, Limits};
use iscsi_scsi::{CommandOutcome, ScsiTarget};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use crate::config::TargetConfig;
use crate::policy::Policy;

/// What every connection of a running target shares.
pub(crate) struct Shared {
    pub config: Arc<TargetConfig>,
    pub policy: Policy,
    /// SCSI target cores, by target name.
    pub scsi: Vec<(String, Arc<ScsiTarget>)>,
    pub challenge_history: Arc<Mutex<ChallengeHistory>>,
}

/// The reserved tag value (RFC 7143 11.2.1.8).
const RESERVED_TAG: u32 = 0xFFFF_FFFF;
/// SAM status GOOD and CHECK CONDITION.
const GOOD: u8 = 0x00;
const CHECK_CONDITION: u8 = 0x02;

/// Serves one accepted connection to its end.
pub(crate) async fn serve_connection(
    stream: TcpStream,
    shared: Arc<Shared>,
) -> Result<(), ConnectionError> {
    let mut pdus = TcpDatamover::new(stream)?;
    let Some((complete, cmd_sn)) = login(&mut pdus, &shared).await? else {
        return Ok(());
    };
    let params = complete.parameters.clone();
    let digests = Digests {
        header: params.header_digest == Digest::Crc32c,
        data: params.data_digest == Digest::Crc32c,
    };
    pdus.enable(digests, params.max_recv_data_segment_length);
    let target_name = complete.request.target_name.clone();
    let scsi = target_name
        .as_ref()
        .and_then(|name| shared.scsi.iter().find(|(n, _)| n == name))
        .map(|(_, s)| Arc::clone(s));
    info!(
        initiator = %complete.request.initiator_name,
        target = target_name.as_deref().unwrap_or("(discovery)"),
        tsih = complete.tsih,
        ?digests,
        max_send = params.max_send_data_segment_length,
        "login complete"
    );
    let window = shared.config.command_window.max(1);
    let mut session = Session {
        pdus,
        shared,
        params: params.clone(),
        limits: Limits::from(&params),
        scsi,
        target_name,
        stat_sn: complete.next_stat_sn,
        exp_cmd_sn: cmd_sn,
        window,
        next_transfer_tag: 1,
        pending: VecDeque::new(),
        data_out: Vec::new(),
        data_in: Vec::new(),
    };
    session.run().await
}

/// The login phase: returns the completed login and the CmdSN the session
/// starts from, or `None` if the login failed (the response was sent) or
/// the initiator went away.
async fn login(
    pdus: &mut TcpDatamover,
    shared: &Shared,
) -> Result<Option<(Box<LoginComplete>, CmdSn)>, ConnectionError> {
    let challenge: Vec<u8> = (0..32).map(|_| rand::random::<u8>()).collect();
    let mut login = TargetLogin::new(
        StatSn::new(rand::random()),
        rand::random(),
        challenge,
        Arc::clone(&shared.challenge_history),
    );
    loop {
        let Some(incoming) = pdus.receiver.receive().await? else {
            return Ok(None);
        };
        let (step, cmd_sn) = match &incoming.header.pdu {
            Pdu::LoginRequest(request) => (
                login.receive(&shared.policy, request, &incoming.data),
                request.cmd_sn,
            ),
            _ => (
                login.invalid_request(&LoginRequest::default()),
                CmdSn::new(0),
            ),
        };
        let data_len = step.data.len() as u32;
        pdus.sender
            .send_control(
                &Header::new(Pdu::LoginResponse(step.response.clone()), data_len),
                &step.data,
            )
            .await?;
        match step.outcome {
            LoginOutcome::Continue => {}
            LoginOutcome::Failed(status) => {
                info!(
                    class = status.class,
                    detail = status.detail,
                    "login refused"
                );
                return Ok(None);
            }
            LoginOutcome::Complete(done) => return Ok(Some((done, cmd_sn))),
        }
    }
}

/// The full feature phase of one connection.
struct Session {
    pdus: TcpDatamover,
    shared: Arc<Shared>,
    params: NegotiatedParameters,
    limits: Limits,
    scsi: Option<Arc<ScsiTarget>>,
    target_name: Option<String>,
    stat_sn: StatSn,
    exp_cmd_sn: CmdSn,
    window: u32,
    next_transfer_tag: u32,
    pending: VecDeque<Incoming>,
    /// Reused for every write's data and every read's data.
    data_out: Vec<u8>,
    data_in: Vec<u8>,
}

impl Session {
    async fn run(&mut self) -> Result<(), ConnectionError> {
        loop {
            let Some(incoming) = self.next().await? else {
                return Ok(());
            };
            let Incoming { header, data } = incoming;
            match header.pdu.clone() {
                Pdu::ScsiCommand(command) => self.scsi_command(&header, command, data).await?,
                Pdu::NopOut(nop) => {
                    if !nop.immediate {
                        self.accept_cmd_sn(nop.cmd_sn);
                    }
                    if nop.initiator_task_tag != RESERVED_TAG {
                        // A ping: answer with the same data (RFC 7143 11.19).
                        let reply = NopIn {
                            lun: nop.lun,
                            initiator_task_tag: nop.initiator_task_tag,
                            target_transfer_tag: RESERVED_TAG,
                            stat_sn: self.take_stat_sn(),
                            exp_cmd_sn: self.exp_cmd_sn,
                            max_cmd_sn: self.max_cmd_sn(),
                        };
                        self.send(Pdu::NopIn(reply), &data).await?;
                    }
                }
                Pdu::TextRequest(request) => self.text(request, &data).await?,
                Pdu::LogoutRequest(request) => {
                    let response = match request.reason {
                        LogoutReason::CloseSession | LogoutReason::CloseConnection => {
                            LogoutResponseCode::ClosedSuccessfully
                        }
                        _ => LogoutResponseCode::RecoveryNotSupported,
                    };
                    let reply = LogoutResponse {
                        response,
                        initiator_task_tag: request.initiator_task_tag,
                        stat_sn: self.take_stat_sn(),
                        exp_cmd_sn: self.exp_cmd_sn,
                        max_cmd_sn: self.max_cmd_sn(),
                        time2wait: 0,
                        time2retain: 0,
                    };
                    self.send(Pdu::LogoutResponse(reply), &[]).await?;
                    info!("logout");
                    return Ok(());
                }
                Pdu::TaskManagementRequest(request) => {
                    if !request.immediate {
                        self.accept_cmd_sn(request.cmd_sn);
                    }
                    // Commands run to completion one at a time on this
                    // connection, so none is in progress to abort or reset
                    // (RFC 7143 11.6.1: a task that no longer exists has its
                    // abort reported as complete).
                    let response = match request.function {
                        TaskFunction::TaskReassign => TaskResponse::TaskReassignmentNotSupported,
                        TaskFunction::AbortTask
                        | TaskFunction::AbortTaskSet
                        | TaskFunction::ClearAca
                        | TaskFunction::ClearTaskSet
                        | TaskFunction::LogicalUnitReset
                        | TaskFunction::TargetWarmReset
                        | TaskFunction::TargetColdReset => TaskResponse::FunctionComplete,
                        _ => TaskResponse::FunctionNotSupported,
                    };
                    let reply = TaskManagementResponse {
                        response,
                        initiator_task_tag: request.initiator_task_tag,
                        stat_sn: self.take_stat_sn(),
                        exp_cmd_sn: self.exp_cmd_sn,
                        max_cmd_sn: self.max_cmd_sn(),
                    };
                    self.send(Pdu::TaskManagementResponse(reply), &[]).await?;
                }
                Pdu::DataOut(_) => {
                    // Data-Out for no write in progress.
                    self.reject(&header, RejectReason::InvalidPduField).await?;
                }
                _ => {
                    self.reject(&header, RejectReason::CommandNotSupported)
                        .await?
                }
            }
        }
    }

    /// The next PDU: queued ones first, then the socket. A data digest
    /// error is answered with a Reject and the PDU dropped (RFC 7143 7.8);
    /// any other decode error ends the connection.
    async fn next(&mut self) -> Result<Option<Incoming>, ConnectionError> {
        if let Some(incoming) = self.pending.pop_front() {
            return Ok(Some(incoming));
        }
        self.read_socket().await
    }

    async fn read_socket(&mut self) -> Result<Option<Incoming>, ConnectionError> {
        loop {
            match self.pdus.receiver.receive().await {
                Err(ConnectionError::Decode(DecodeError::DataDigestMismatch {
                    rejected_bhs,
                    ..
                })) => {
                    warn!("data digest error: PDU rejected");
                    self.reject_bhs(&rejected_bhs, RejectReason::DataDigestError)
                        .await?;
                }
                other => return other,
            }
        }
    }

    fn max_cmd_sn(&self) -> CmdSn {
        self.exp_cmd_sn.wrapping_add(self.window - 1)
    }

    fn take_stat_sn(&mut self) -> StatSn {
        let sn = self.stat_sn;
        self.stat_sn = sn.next();
        sn
    }

    /// Advances ExpCmdSN past `cmd_sn` if it is the one expected (one
    /// connection: commands arrive in order). Returns whether the command is
    /// inside the window; outside it, a non-immediate command is ignored
    /// (RFC 7143 4.2.2.1).
    fn accept_cmd_sn(&mut self, cmd_sn: CmdSn) -> bool {
        let max = self.max_cmd_sn();
        if cmd_sn.lt(self.exp_cmd_sn) || cmd_sn.gt(max) {
            warn!(
                cmd_sn = cmd_sn.get(),
                exp = self.exp_cmd_sn.get(),
                "CmdSN outside the window: ignored"
            );
            return false;
        }
        self.exp_cmd_sn = cmd_sn.next();
        true
    }

    async fn send(&mut self, pdu: Pdu, data: &[u8]) -> Result<(), ConnectionError> {
        let header = Header::new(pdu, data.len() as u32);
        self.pdus.sender.send_control(&header, data).await
    }

    async fn reject(
        &mut self,
        header: &Header,
        reason: RejectReason,
    ) -> Result<(), ConnectionError> {
        let mut bhs = [0u8; 48];
        header.pdu.encode_bhs(
            iscsi_proto::pdu::SegmentLengths {
                total_ahs_words: 0,
                data_segment_length: header.data_segment_length,
            },
            &mut bhs,
        );
        self.reject_bhs(&bhs, reason).await
    }

    /// A Reject with the offending header as its data (RFC 7143 11.17).
    async fn reject_bhs(
        &mut self,
        bhs: &[u8; 48],
        reason: RejectReason,
    ) -> Result<(), ConnectionError> {
        let reject = Reject {
            reason,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
            data_sn_or_r2t_sn: 0,
        };
        self.send(Pdu::Reject(reject), bhs).await
    }

    /// Text Request: SendTargets (RFC 7143 13.3, Appendix C) and full
    /// feature phase negotiation.
    async fn text(&mut self, request: TextRequest, data: &[u8]) -> Result<(), ConnectionError> {
        if !request.immediate {
            self.accept_cmd_sn(request.cmd_sn);
        }
        let pairs = match codec::parse(data) {
            Ok(pairs) => pairs,
            Err(_) => {
                return self
                    .reject(
                        &Header::new(Pdu::TextRequest(request), data.len() as u32),
                        RejectReason::ProtocolError,
                    )
                    .await;
            }
        };
        let mut answers = Vec::new();
        let mut rest = Vec::new();
        for pair in pairs {
            if pair.key == "SendTargets" {
                answers.extend(self.send_targets(&pair.value));
            } else {
                rest.push(pair);
            }
        }
        if !rest.is_empty() {
            let mut negotiator =
                Negotiator::new(Role::Target, self.shared.config.negotiation.clone(), true);
            match negotiator.receive(&rest, Stage::FullFeature) {
                Ok(more) => answers.extend(more),
                Err(_) => {
                    return self
                        .reject(
                            &Header::new(Pdu::TextRequest(request), data.len() as u32),
                            RejectReason::ProtocolError,
                        )
                        .await;
                }
            }
        }
        let mut text = Vec::new();
        codec::encode(&answers, &mut text);
        // Answers longer than the initiator accepts in one PDU are cut
        // there; a SendTargets list of that size needs the C-bit exchange,
        // which this target does not produce yet.
        text.truncate(self.params.max_send_data_segment_length as usize);
        let reply = TextResponse {
            final_flag: true,
            continue_flag: false,
            lun: Lun(0),
            initiator_task_tag: request.initiator_task_tag,
            target_transfer_tag: RESERVED_TAG,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
        };
        self.send(Pdu::TextResponse(reply), &text).await
    }

    /// The SendTargets answer: every target (discovery session) or this
    /// session's target, each with the address this connection reached.
    fn send_targets(&self, value: &str) -> Vec<TextPair> {
        let local = Some(self.pdus.local_addr());
        let address = local.map(|a| match a {
            std::net::SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
            std::net::SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        });
        let tag = self.shared.config.portal_group_tag;
        let discovery = self.params.session_type == SessionType::Discovery;
        let mut answers = Vec::new();
        for target in &self.shared.config.targets {
            let wanted = match value {
                "All" => discovery,
                "" => !discovery && self.target_name.as_deref() == Some(target.name.as_str()),
                name => name == target.name,
            };
            if !wanted {
                continue;
            }
            answers.push(TextPair::new("TargetName", target.name.clone()));
            if let Some(address) = &address {
                answers.push(TextPair::new("TargetAddress", format!("{address},{tag}")));
            }
        }
        answers
    }

    /// One SCSI command, to its status.
    async fn scsi_command(
        &mut self,
        header: &Header,
        command: ScsiCommand,
        immediate_data: Vec<u8>,
    ) -> Result<(), ConnectionError> {
        if !command.immediate && !self.accept_cmd_sn(command.cmd_sn) {
            return Ok(());
        }
        let Some(scsi) = self.scsi.clone() else {
            // SCSI commands in a discovery session.
            return self.reject(header, RejectReason::CommandNotSupported).await;
        };
        let cdb = header.full_cdb().unwrap_or_else(|| command.cdb.to_vec());
        let expected = command.expected_data_transfer_length;
        let mut data_out = std::mem::take(&mut self.data_out);
        data_out.clear();
        let mut exp_data_sn = 0u32;
        if command.write {
            match self
                .gather_write(&command, immediate_data, &mut data_out)
                .await
            {
                Ok(r2ts) => exp_data_sn = r2ts,
                Err(Gather::Connection(e)) => return Err(e),
                Err(Gather::Protocol(reason)) => {
                    self.data_out = data_out;
                    return self.reject(header, reason).await;
                }
            }
        } else if !immediate_data.is_empty() {
            return self.reject(header, RejectReason::ProtocolError).await;
        }
        let mut data_in = std::mem::take(&mut self.data_in);
        let outcome = scsi.execute(command.lun.0, &cdb, &data_out, &mut data_in);
        self.data_out = data_out;
        let result = self
            .respond(&command, outcome, &data_in, expected, exp_data_sn)
            .await;
        self.data_in = data_in;
        result
    }

    /// Collects a write's data: immediate data, unsolicited Data-Out, then
    /// one R2T at a time for the rest. Returns the number of R2Ts sent.
    async fn gather_write(
        &mut self,
        command: &ScsiCommand,
        immediate: Vec<u8>,
        data_out: &mut Vec<u8>,
    ) -> Result<u32, Gather> {
        let expected = command.expected_data_transfer_length;
        // `limits.max_recv_segment` is our declared MaxRecvDataSegmentLength,
        // the bound on each Data-Out we receive.
        let mut tracker = DataOutTracker::new(self.limits, expected, immediate.len() as u32)
            .map_err(|e| Gather::Protocol(reject_reason(e.reject_reason())))?;
        data_out.resize(expected as usize, 0);
        data_out[..immediate.len()].copy_from_slice(&immediate);
        let itt = command.initiator_task_tag;
        // Unsolicited Data-Out up to FirstBurstLength (InitialR2T=No).
        let window = tracker.solicited_from();
        let mut unsolicited_done = window <= immediate.len() as u32;
        while !unsolicited_done {
            let (offset, data, progress) = self.data_out_pdu(itt, &mut tracker).await?;
            data_out[offset..offset + data.len()].copy_from_slice(&data);
            unsolicited_done = progress == DataOutProgress::UnsolicitedComplete;
        }
        let bursts = self.limits.r2t_bursts(expected, window);
        for (r2t_sn, &(offset, length)) in bursts.iter().enumerate() {
            let tag = self.next_transfer_tag;
            self.next_transfer_tag = self.next_transfer_tag.wrapping_add(1) & 0x7FFF_FFFF;
            tracker.r2t_sent(tag, offset, length);
            let r2t = ReadyToTransfer {
                lun: command.lun,
                initiator_task_tag: itt,
                target_transfer_tag: tag,
                stat_sn: self.stat_sn,
                exp_cmd_sn: self.exp_cmd_sn,
                max_cmd_sn: self.max_cmd_sn(),
                r2t_sn: R2tSn::new(r2t_sn as u32),
                buffer_offset: offset,
                desired_data_transfer_length: length,
            };
            self.send(Pdu::ReadyToTransfer(r2t), &[])
                .await
                .map_err(Gather::Connection)?;
            loop {
                let (at, data, progress) = self.data_out_pdu(itt, &mut tracker).await?;
                data_out[at..at + data.len()].copy_from_slice(&data);
                if progress == DataOutProgress::R2tComplete(tag) {
                    break;
                }
            }
        }
        Ok(bursts.len() as u32)
    }

    /// The next Data-Out of task `itt`, checked; other PDUs meanwhile are
    /// queued.
    async fn data_out_pdu(
        &mut self,
        itt: u32,
        tracker: &mut DataOutTracker,
    ) -> Result<(usize, Vec<u8>, DataOutProgress), Gather> {
        loop {
            let incoming = self
                .read_socket()
                .await
                .map_err(Gather::Connection)?
                .ok_or(Gather::Connection(ConnectionError::Truncated))?;
            let Pdu::DataOut(data_out) = &incoming.header.pdu else {
                self.pending.push_back(incoming);
                continue;
            };
            if data_out.initiator_task_tag != itt {
                self.pending.push_back(incoming);
                continue;
            }
            let progress = tracker
                .data_out(
                    data_out.target_transfer_tag,
                    data_out.data_sn.get(),
                    data_out.buffer_offset,
                    incoming.data.len() as u32,
                    data_out.final_flag,
                )
                .map_err(|e| {
                    debug!(error = %e, "bad Data-Out");
                    Gather::Protocol(reject_reason(e.reject_reason()))
                })?;
            return Ok((data_out.buffer_offset as usize, incoming.data, progress));
        }
    }

    /// Sends a command's data and status: Data-In with the status in the
    /// last one when possible, else Data-In and a SCSI Response.
    async fn respond(
        &mut self,
        command: &ScsiCommand,
        outcome: CommandOutcome,
        data_in: &[u8],
        expected: u32,
        r2ts: u32,
    ) -> Result<(), ConnectionError> {
        let produced = if command.read {
            data_in.len() as u64
        } else {
            0
        };
        let sent = produced.min(u64::from(expected)) as u32;
        // Residuals (RFC 7143 11.4.5): what the command produced against
        // what the initiator expected.
        let (overflow, underflow, residual) = if command.read {
            match produced.cmp(&u64::from(expected)) {
                std::cmp::Ordering::Greater => {
                    (true, false, (produced - u64::from(expected)) as u32)
                }
                std::cmp::Ordering::Less => (false, true, expected - sent),
                std::cmp::Ordering::Equal => (false, false, 0),
            }
        } else {
            (false, false, 0)
        };
        let collapse = outcome.status == GOOD && outcome.sense.is_none() && sent > 0;
        let segments = self.limits.data_in_segments(sent);
        let count = segments.len();
        for (i, segment) in segments.iter().enumerate() {
            let last = i + 1 == count;
            let with_status = last && collapse;
            let pdu = DataIn {
                final_flag: segment.last_in_sequence,
                acknowledge: false,
                residual_overflow: with_status && overflow,
                residual_underflow: with_status && underflow,
                status: with_status.then_some(outcome.status),
                lun: command.lun,
                initiator_task_tag: command.initiator_task_tag,
                target_transfer_tag: RESERVED_TAG,
                stat_sn: if with_status {
                    self.take_stat_sn()
                } else {
                    StatSn::new(0)
                },
                exp_cmd_sn: self.exp_cmd_sn,
                max_cmd_sn: self.max_cmd_sn(),
                data_sn: DataSn::new(segment.data_sn),
                buffer_offset: segment.offset,
                residual_count: if with_status { residual } else { 0 },
            };
            let start = segment.offset as usize;
            let end = start + segment.length as usize;
            self.send(Pdu::DataIn(pdu), &data_in[start..end]).await?;
        }
        if collapse {
            return Ok(());
        }
        // Sense data travels in the SCSI Response's data segment: a 2-byte
        // length, then the sense bytes (RFC 7143 11.4.7).
        let sense_data = match &outcome.sense {
            Some(sense) => {
                let bytes = sense.to_fixed_format();
                let mut data = Vec::with_capacity(2 + bytes.len());
                data.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
                data.extend_from_slice(&bytes);
                data
            }
            None => Vec::new(),
        };
        if outcome.status == CHECK_CONDITION && outcome.sense.is_none() {
            debug!("check condition without sense data");
        }
        let response = ScsiResponse {
            bidi_read_residual_overflow: false,
            bidi_read_residual_underflow: false,
            residual_overflow: overflow,
            residual_underflow: underflow,
            response: ServiceResponse::CommandCompleted,
            status: outcome.status,
            initiator_task_tag: command.initiator_task_tag,
            snack_tag: 0,
            stat_sn: self.take_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
            exp_data_sn: DataSn::new(if command.read { count as u32 } else { r2ts }),
            bidi_read_residual_count: 0,
            residual_count: residual,
        };
        self.send(Pdu::ScsiResponse(response), &sense_data).await
    }
}

/// Why gathering a write's data stopped.
enum Gather {
    Connection(ConnectionError),
    Protocol(RejectReason),
}

fn reject_reason(code: u8) -> RejectReason {
    RejectReason::from_u8(code)
}
