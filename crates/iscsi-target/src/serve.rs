//! One accepted connection from its first PDU to its end: the login
//! phase (driven by the protocol core's `TargetLogin` with the `Policy`'s
//! decisions), starting a session or joining one (MC/S, reinstatement,
//! ERL 2 continuation), running the connection's full feature phase, and
//! ending the session with its last connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use iscsi_datamover::tap::Tap;
use iscsi_datamover::{Datamover, DatamoverError, PduReceiver, PduSender};
use iscsi_proto::login::target::{LoginComplete, LoginOutcome, SessionRequest, TargetLogin};
use iscsi_proto::pdu::{Digests, Header, LoginRequest, LoginResponse, Pdu};
use iscsi_proto::serial::{CmdSn, StatSn};
use iscsi_proto::state::{
    ConnectionEvent, ConnectionState, ConnectionStateMachine, Role, SessionEvent,
    SessionStateMachine,
};
use iscsi_proto::text::{Digest, SessionType};
use iscsi_proto::transfer::Limits;
use tracing::{info, warn};

use crate::connection::Connection;
use crate::metrics::LoginResult;
use crate::recovery::Orphan;
use crate::session::{ConnectionAbout, Session, record};
use crate::shared::Shared;

/// How long a connection may take from accept to the end of its login.
const LOGIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Numbers connections for the tap: unique within the process, so a
/// trace tells apart connections that came and went.
fn next_connection_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Serves one accepted connection to its end.
pub(crate) async fn serve_connection(
    mut transport: Datamover,
    shared: Arc<Shared>,
) -> Result<(), DatamoverError> {
    // Tapped from the first login PDU on, like the initiator's connections.
    let tap = shared
        .config()
        .tap
        .as_ref()
        .map(|tap| Tap::new(Arc::clone(tap), next_connection_number()));
    transport.set_tap(tap.clone());
    let mut state = ConnectionStateMachine::new(Role::Target);
    record(&mut state, ConnectionEvent::Accepted, "login");
    // The session a leading login creates is ACTIVE while that login runs.
    let mut leading: Option<SessionStateMachine> = None;
    // A login that stalls (a silent peer, a half-sent PDU) must not hold
    // the connection forever.
    let outcome = tokio::time::timeout(
        LOGIN_TIMEOUT,
        login(&mut transport, &shared, &mut state, &mut leading),
    )
    .await;
    // `Err(None)`: the login failed and was answered (or the peer left),
    // as `login` recorded; `Err(Some(_))`: the transport failed.
    let logged_in = match outcome {
        Ok(Ok(Some(done))) => Ok(done),
        Ok(Ok(None)) => Err(None),
        Ok(Err(error)) => {
            if state.state() != ConnectionState::Free {
                record(&mut state, ConnectionEvent::TransportLost, "login");
            }
            Err(Some(error))
        }
        Err(_elapsed) => {
            crate::login_log::timed_out(
                transport.peer_addr(),
                transport.local_addr(),
                LOGIN_TIMEOUT,
            );
            shared.metrics.login(LoginResult::OtherFail);
            record(&mut state, ConnectionEvent::LoginTimedOut, "login");
            Err(None)
        }
    };
    let (complete, cmd_sn, last) = match logged_in {
        Ok(done) => done,
        Err(error) => {
            if let Some(mut leading) = leading {
                record(
                    &mut leading,
                    SessionEvent::LeadingLoginFailed,
                    "leading login",
                );
            }
            return error.map_or(Ok(()), Err);
        }
    };
    let params = complete.parameters.clone();
    if transport.rdma_capable() && !params.rdma_extensions {
        // RFC 7145 5.1: an iSER connection is iSER-assisted or nothing.
        info!(peer = %transport.peer_addr(), "RDMAExtensions=No on an iSER portal: connection closed");
        return Ok(());
    }
    let digests = Digests {
        header: params.header_digest == Digest::Crc32c,
        data: params.data_digest == Digest::Crc32c,
    };
    if complete.leading && !quiesce_nexus(&shared, &complete.request).await {
        if let Some(mut leading) = leading {
            record(
                &mut leading,
                SessionEvent::LeadingLoginFailed,
                "leading login",
            );
        }
        return Ok(());
    }
    let config = shared.config();
    let session = if complete.leading {
        let scsi = complete
            .request
            .target_name
            .as_ref()
            .filter(|_| params.session_type == SessionType::Normal)
            .and_then(|name| shared.scsi_target(name));
        let mut lifecycle = leading.unwrap_or_else(|| SessionStateMachine::new(Role::Target));
        record(
            &mut lifecycle,
            SessionEvent::ConnectionLoggedIn,
            "leading login",
        );
        let session = Arc::new(Session::new(
            &shared.metrics,
            &complete,
            scsi,
            config.portal_group_tag,
            config.command_window,
            cmd_sn,
            lifecycle,
        ));
        for old in shared.sessions.insert(Arc::clone(&session)) {
            // Session reinstatement (6.3.5): the old instance's
            // connections close (T8) and its tasks end; the session itself
            // is cleared when its last connection is gone (N5, N6).
            info!(tsih = old.tsih, "session reinstated: closing the old one");
            old.abort_all();
            old.close();
        }
        session
    } else {
        match shared.sessions.get(complete.tsih) {
            Some(session) => {
                if session.lifecycle_state() == iscsi_proto::state::SessionState::Failed {
                    // Session continuation (ERL 2): a connection logs in to
                    // a session whose last connection failed (N7, N10).
                    info!(tsih = session.tsih, "session continued by a new connection");
                    session.record(SessionEvent::ContinuationStarted);
                }
                session.record(SessionEvent::ConnectionLoggedIn);
                session
            }
            // The session ended between the policy's check and now: the
            // connection closes before the initiator was told it joined.
            None => return Ok(()),
        }
    };
    // A joining connection negotiated only its own keys: the leading-only
    // ones (ErrorRecoveryLevel, the burst lengths...) are the session's.
    let params = if complete.leading {
        params
    } else {
        session.params.joined_by(&params)
    };
    session.connections.fetch_add(1, Ordering::AcqRel);
    info!(
        initiator = %complete.request.initiator_name,
        target = session.target_name.as_deref().unwrap_or("(discovery)"),
        tsih = complete.tsih,
        cid = complete.request.cid,
        leading = complete.leading,
        ?digests,
        max_send = params.max_send_data_segment_length,
        "login complete"
    );
    let mut limits = Limits::from(&params);
    if transport.rdma_capable() {
        // Over iSER the solicited data is placed by RDMA Reads of up to
        // MaxBurstLength, not received in buffers of the declared
        // TargetRecvDataSegmentLength (RFC 7145 7.3.2): the datamover hands
        // each burst up as one Data-Out.
        limits.max_recv_segment = limits.max_recv_segment.max(params.max_burst_length);
    }
    let local = transport.local_addr();
    let placed_data = transport.rdma_capable();
    let about = ConnectionAbout {
        cid: complete.request.cid,
        peer: transport.peer_addr(),
        local,
        iser: placed_data,
        digests,
        max_send_segment: params.max_send_data_segment_length,
        max_recv_segment: limits.max_recv_segment,
        shard: crate::shards::current(),
    };
    // The session is registered and an old connection with this CID has
    // ended (its implicit logout, RFC 7143 6.3.4): only now is the
    // initiator told it is logged in, so that status, a connection joining
    // with this TSIH and a reinstatement all find this connection.
    let (number, replaced, ended) = session.take_cid(about).await;
    let sent = send_login_response(&mut transport, &last.response, &last.data).await;
    let (result, ended_by_logout, left) = match sent {
        Ok(()) => {
            // From the first PDU after the final Login Response (RFC 7143
            // 13.1).
            transport.enable(digests, params.max_recv_data_segment_length);
            let (receiver, sender) = transport.split();
            let connection = Connection::new(
                Arc::clone(&shared),
                Arc::clone(&session),
                complete.request.cid,
                limits,
                local,
                complete.next_stat_sn,
                sender,
                state,
                tap,
                placed_data,
                params.error_recovery_level,
                number,
            );
            connection.run(receiver, replaced).await
        }
        Err(error) => {
            record(&mut state, ConnectionEvent::TransportLost, "login");
            (Err(error), false, None)
        }
    };
    session.release_cid(complete.request.cid, number);
    // What it left is in place: a login or logout waiting for its end may
    // go on.
    drop(ended);
    let by_logout = ended_by_logout || session.closed_by_logout.load(Ordering::Acquire);
    if session.connections.fetch_sub(1, Ordering::AcqRel) == 1 {
        // The last connection is gone. Closed by a logout, that is session
        // closure (N3); otherwise the session failed (N5). Below ERL 2 (no
        // continuation, Time2Retain 0) it is cleared at once (N6), as it
        // is when a reinstatement replaced it; at 2 it waits for a new
        // connection until Time2Retain is over.
        if by_logout {
            session.record(SessionEvent::Closed);
            end_session(&shared, &session);
        } else {
            session.record(SessionEvent::Failed);
            if left.is_none() || *session.close.borrow() {
                session.record(SessionEvent::TimedOutOrReinstated);
                end_session(&shared, &session);
            }
        }
    }
    if let Some(writer) = left {
        // ERL 2: the connection failed with tasks to reassign.
        let session = Arc::clone(&session);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            tokio::time::sleep(session.time2retain()).await;
            let ended = session.expire_connection(&writer, number);
            if ended > 0 {
                info!(
                    tsih = session.tsih,
                    cid = complete.request.cid,
                    ended,
                    "Time2Retain over: tasks nobody reassigned ended"
                );
            }
            if session.connections.load(Ordering::Acquire) == 0
                && session.lifecycle_state() == iscsi_proto::state::SessionState::Failed
            {
                session.record(SessionEvent::TimedOutOrReinstated);
                end_session(&shared, &session);
            }
        });
    }
    result
}

/// How long a leading login waits for the tasks of an earlier session of
/// its I_T nexus to leave the store (`quiesce_nexus`).
const QUIESCE_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// Before a leading login's session runs: every task of an earlier session
/// of the same I_T nexus (the one it reinstates, RFC 7143 6.3.5, or one
/// that failed a moment ago) is aborted and over. A write of the old
/// session still at the store would otherwise land after the initiator
/// had written the same blocks again through the new one (it retries what
/// the old session never answered), and put old data over new. False when
/// they are not over within [`QUIESCE_BOUND`] (a store that hangs): the
/// connection then closes unanswered and the initiator tries again later,
/// rather than write beside them.
async fn quiesce_nexus(shared: &Shared, request: &SessionRequest) -> bool {
    let earlier = shared.sessions.of_nexus(
        &request.initiator_name,
        request.isid,
        request.target_name.as_deref(),
    );
    let deadline = tokio::time::Instant::now() + QUIESCE_BOUND;
    for old in &earlier {
        // Its connections close first (6.3.5, T8), as they would once this
        // session replaced it: one of its tasks may be waiting to send to
        // an initiator that no longer reads that connection, and ends only
        // when it closes.
        old.close();
        if !old.abort_all_and_wait(deadline).await {
            warn!(
                tsih = old.tsih,
                initiator = %request.initiator_name,
                "a login waits for the tasks of an earlier session at the store: \
                 still running after {QUIESCE_BOUND:?}; connection closed"
            );
            return false;
        }
    }
    true
}

/// Ends a session whose last connection is gone: its tasks and what failed
/// connections left end, it leaves the registry, and the SCSI layer
/// forgets its nexus (unless a reinstatement already replaced it there).
fn end_session(shared: &Shared, session: &Arc<Session>) {
    session.abort_all();
    for orphan in session.orphans.drain() {
        if let Orphan::Collecting(pending) = orphan {
            session.abort(&pending.write.task);
        }
    }
    let registered = shared
        .sessions
        .get(session.tsih)
        .is_some_and(|s| Arc::ptr_eq(&s, session));
    shared.sessions.remove(session);
    if shared.sessions.drain(session) {
        // Forgotten once its tasks are over, not at the next login.
        let (sessions, session) = (Arc::clone(&shared.sessions), Arc::clone(session));
        tokio::spawn(async move {
            while session.has_live_tasks() {
                for task in session.tasks(None) {
                    task.wait().await;
                }
            }
            sessions.prune();
        });
    }
    if let (true, Some(scsi)) = (registered, &session.scsi) {
        scsi.nexus_lost(&session.nexus);
    }
    info!(tsih = session.tsih, stats = %*session.stats, "session ended");
}

/// The login phase: returns the completed login and the CmdSN the session
/// starts from, or `None` if the login failed (the response was sent) or
/// the initiator went away.
async fn login(
    transport: &mut Datamover,
    shared: &Shared,
    state: &mut ConnectionStateMachine,
    leading: &mut Option<SessionStateMachine>,
) -> Result<Option<(Box<LoginComplete>, CmdSn, FinalResponse)>, DatamoverError> {
    let policy = crate::iser::ConnectionPolicy {
        inner: &shared.policy,
        iser: transport.rdma_capable(),
    };
    let challenge: Vec<u8> = (0..32).map(|_| rand::random::<u8>()).collect();
    let mut login = TargetLogin::new(
        StatSn::new(rand::random()),
        rand::random(),
        challenge,
        Arc::clone(&shared.challenge_history),
    );
    loop {
        let Some(incoming) = transport.receiver.receive().await? else {
            record(state, ConnectionEvent::TransportLost, "login");
            return Ok(None);
        };
        if state.state() == ConnectionState::XptUp {
            record(state, ConnectionEvent::LoginRequestReceived, "login");
            if let Pdu::LoginRequest(request) = &incoming.header.pdu
                && request.tsih == 0
            {
                let mut session = SessionStateMachine::new(Role::Target);
                record(
                    &mut session,
                    SessionEvent::LeadingLoginStarted,
                    "leading login",
                );
                *leading = Some(session);
            }
        }
        let (step, cmd_sn) = match &incoming.header.pdu {
            Pdu::LoginRequest(request) => (
                login.receive(&policy, request, &incoming.data),
                request.cmd_sn,
            ),
            other => (
                login.invalid_request(&LoginRequest::default(), other.opcode()),
                CmdSn::new(0),
            ),
        };
        match step.outcome {
            LoginOutcome::Continue => {
                send_login_response(transport, &step.response, &step.data).await?;
            }
            LoginOutcome::Failed(refusal) => {
                send_login_response(transport, &step.response, &step.data).await?;
                crate::login_log::refused(
                    transport.peer_addr(),
                    transport.local_addr(),
                    login.sent_names(),
                    &refusal,
                );
                // The MIB's result from the status sent (LIO's
                // iscsi_login_stats); the reason in words is the log's.
                shared.metrics.login(LoginResult::of_status(
                    refusal.status.class,
                    refusal.status.detail,
                ));
                record(state, ConnectionEvent::LoginFailed, "login");
                return Ok(None);
            }
            LoginOutcome::Complete(done) => {
                // Not sent yet: the session must be findable (by status,
                // by a connection joining with this TSIH) before the
                // initiator learns it is logged in.
                record(state, ConnectionEvent::LoginSucceeded, "login");
                shared.metrics.login(LoginResult::Accept);
                let last = FinalResponse {
                    response: step.response,
                    data: step.data,
                };
                return Ok(Some((done, cmd_sn, last)));
            }
        }
    }
}

/// The Login Response that ends a successful login, held back until the
/// session it names is registered.
struct FinalResponse {
    response: LoginResponse,
    data: Vec<u8>,
}

async fn send_login_response(
    transport: &mut Datamover,
    response: &LoginResponse,
    data: &[u8],
) -> Result<(), DatamoverError> {
    transport
        .sender
        .send_control(
            &Header::new(Pdu::LoginResponse(response.clone()), data.len() as u32),
            data,
        )
        .await
}
