//! One connection's TCP connect and login phase (RFC 7143 section 6.3 and
//! 11.12-11.13): drives `iscsi_proto::login::initiator::InitiatorLogin`
//! over a fresh datamover (TCP, or iSER over iWARP for `iser://`), follows redirections (status class 1,
//! section 11.13.5), and switches the datamover to the negotiated digests
//! and segment length on success (RFC 5047 `Enable_Datamover`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use iscsi_datamover::iser::{CmHeader, IserConfig, IserDatamover, IserRole};
use iscsi_datamover::tap::{Tap, WireTap};
use iscsi_datamover::{Datamover, PduReceiver, PduSender};
use iscsi_proto::login::chap::ChallengeHistory;
use iscsi_proto::login::initiator::{
    InitiatorLogin, InitiatorLoginComplete, InitiatorLoginConfig, InitiatorLoginError,
    InitiatorStep,
};
use iscsi_proto::pdu::login::Isid;
use iscsi_proto::pdu::{Digests, Header, Pdu, RESERVED_TAG};
use iscsi_proto::serial::CmdSn;
use iscsi_proto::state::{ConnectionEvent, ConnectionStateMachine, Role};
use iscsi_proto::text::{Digest, TextPair};
use tokio::net::TcpStream;

use crate::config::SessionConfig;
use crate::error::Error;
use crate::url::{format_portal, parse_portal};

/// How many redirections a login follows before giving up.
const MAX_REDIRECTS: usize = 4;

/// A logged-in connection.
pub(crate) struct LoggedIn {
    /// The datamover, switched to full feature phase settings.
    pub datamover: Datamover,
    /// What the login settled.
    pub complete: InitiatorLoginComplete,
    /// The connection's state machine (RFC 7143 8.1), now LOGGED_IN.
    pub state: ConnectionStateMachine,
}

/// What one login needs besides the session configuration.
pub(crate) struct LoginRequestParams<'a> {
    /// The portal, `host:port`.
    pub portal: String,
    /// The target; `None` for a discovery session.
    pub target_name: Option<&'a str>,
    /// The session's ISID.
    pub isid: Isid,
    /// 0 for a new session (or a reinstatement), else the session to join.
    pub tsih: u16,
    /// The connection ID.
    pub cid: u16,
    /// The CmdSN carried in the Login Requests.
    pub cmd_sn: CmdSn,
    /// The ITT carried in the Login Requests.
    pub initiator_task_tag: u32,
    /// Told of the connection's PDUs, from the first Login Request on.
    pub tap: Option<Arc<dyn WireTap>>,
    /// iSER (RFC 7145) over iWARP instead of iSCSI over TCP.
    pub iser: bool,
}

/// The InitiatorRecvDataSegmentLength this initiator declares over iSER:
/// what a target's Send may carry (sense data, text, NOP-In data); every
/// receive buffer holds this much.
const ISER_RECV_DATA_SEGMENT_LENGTH: u32 = 8192;

/// Receive buffers an iSER connection keeps posted: the responses of every
/// command the target's window may admit, plus NOP-In and asynchronous
/// messages. A Send with no receive posted ends the RDMA stream.
const ISER_RECEIVES: usize = 512;

/// How long an iSER login waits for each Login Response before it starts
/// the login again on a new connection. tgt 1.0.85's iSER target over
/// Linux siw now and then leaves a Login Request unanswered (its log shows
/// it delaying a login PDU that came before its connection was
/// established): the RDMA stream stays up, silent. open-iscsi's iscsid
/// retries its logins the same way. A target that answers at all answers a
/// Login Request in milliseconds.
const ISER_LOGIN_RESPONSE: std::time::Duration = std::time::Duration::from_secs(3);

/// What [`ISER_LOGIN_RESPONSE`] ran out waiting for (the retry test).
const LOGIN_RESPONSE: &str = "a Login Response over iSER";

/// RDMA Read Requests the target may have outstanding against this
/// initiator's buffers (our IRD; the target's ORD is at most this).
const ISER_IRD: u16 = 128;

/// Makes the RDMA stream of an iSER connection (RFC 7145 with the Linux
/// ordering: MPA first, its private data carrying the iSER CM header; the
/// login then runs over RDMA Sends).
async fn iser_connect(stream: TcpStream, config: &SessionConfig) -> Result<Datamover, Error> {
    let iser = IserConfig {
        recv_data_segment_length: ISER_RECV_DATA_SEGMENT_LENGTH,
        receives: ISER_RECEIVES,
        send_with_invalidate: true,
        send_queue: 1024,
    };
    let params = iscsi_iwarp::ConnectParams {
        private_data: CmHeader::ours(true).emit().to_vec(),
        ird: ISER_IRD,
        // The initiator never issues RDMA Reads, but siw (and so tgt over it)
        // answers nothing at all on a stream whose requester said ORD 0.
        ord: 1,
        crc: config.iser_crc,
        caps: iscsi_iwarp::QpCaps {
            max_send_wr: iser.send_queue,
            max_recv_wr: iser.receives,
        },
        timeout: config.timeouts.login,
    };
    let qp = iscsi_iwarp::connect(stream, params, iser.initial_receives())
        .await
        .map_err(|e| Error::Datamover(iscsi_datamover::DatamoverError::Transport(e.to_string())))?;
    if let Some(ulpdu) = config.iser_max_ulpdu {
        qp.set_max_ulpdu(ulpdu);
    }
    Ok(Datamover::iser(IserDatamover::new(
        qp,
        IserRole::Initiator,
        iser,
    )))
}

/// Numbers connections for taps: unique within the process, so a trace of
/// many sessions keeps each connection apart.
fn next_connection_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A fresh random ISID of type "random" (RFC 7143 section 11.12.5, T = 0b10).
pub(crate) fn random_isid() -> [u8; 6] {
    let mut bytes: [u8; 6] = rand::random();
    bytes[0] = 0x80 | (bytes[0] & 0x3f);
    bytes
}

/// Connects to `params.portal` and logs in, following redirections.
pub(crate) async fn login(
    config: &SessionConfig,
    params: LoginRequestParams<'_>,
) -> Result<LoggedIn, Error> {
    let mut portal = params.portal.clone();
    let deadline = tokio::time::Instant::now() + config.timeouts.login;
    let mut redirects = 0;
    loop {
        let attempt = tokio::time::timeout_at(deadline, login_once(config, &params, &portal))
            .await
            .map_err(|_| Error::Timeout {
                timeout: config.timeouts.login,
                waiting_for: "the login to complete",
            })?;
        match attempt {
            Err(Error::Timeout { waiting_for, .. })
                if waiting_for == LOGIN_RESPONSE
                    && tokio::time::Instant::now() + ISER_LOGIN_RESPONSE < deadline =>
            {
                tracing::info!(%portal, "no answer to an iSER Login Request: logging in again on a new connection");
            }
            Err(Error::Login(InitiatorLoginError::Redirected {
                target_address: Some(_),
                ..
            })) if redirects == MAX_REDIRECTS => {
                return Err(Error::Protocol("too many login redirections".to_owned()));
            }
            Err(Error::Login(InitiatorLoginError::Redirected {
                target_address: Some(address),
                ..
            })) => {
                // TargetAddress is `domainname[:port][,portal-group-tag]`.
                let address = address.split(',').next().unwrap_or_default();
                let (host, port) = parse_portal(address)
                    .ok_or_else(|| Error::Protocol(format!("bad redirection {address:?}")))?;
                tracing::debug!(from = %portal, to = %address, "login redirected");
                portal = format_portal(&host, port);
                redirects += 1;
            }
            other => return other,
        }
    }
}

async fn connect(config: &SessionConfig, portal: &str) -> Result<TcpStream, Error> {
    let connect_error = |error| Error::Connect {
        address: portal.to_owned(),
        error,
    };
    tokio::time::timeout(config.timeouts.connect, TcpStream::connect(portal))
        .await
        .map_err(|_| Error::Timeout {
            timeout: config.timeouts.connect,
            waiting_for: "the TCP connection",
        })?
        .map_err(connect_error)
}

/// One connect and login, followed through the connection state machine:
/// T1 (connect requested), T4 (connected), then T5 (logged in), or T2/T7
/// on a failure (RFC 7143 8.1.3).
async fn login_once(
    config: &SessionConfig,
    params: &LoginRequestParams<'_>,
    portal: &str,
) -> Result<LoggedIn, Error> {
    let mut state = ConnectionStateMachine::new(Role::Initiator);
    let failed = |state: &mut ConnectionStateMachine, error: Error| {
        let event = match error {
            Error::Login(_) => ConnectionEvent::LoginFailed,
            Error::Timeout { .. } => ConnectionEvent::LoginTimedOut,
            _ => ConnectionEvent::TransportLost,
        };
        crate::connection::record_transition(state, event, Some(params.cid));
        error
    };
    crate::connection::record_transition(
        &mut state,
        ConnectionEvent::ConnectRequested,
        Some(params.cid),
    );
    let stream = connect(config, portal)
        .await
        .map_err(|e| failed(&mut state, e))?;
    crate::connection::record_transition(&mut state, ConnectionEvent::Connected, Some(params.cid));
    match negotiate(config, params, portal, stream).await {
        Ok((datamover, complete)) => {
            crate::connection::record_transition(
                &mut state,
                ConnectionEvent::LoginSucceeded,
                Some(params.cid),
            );
            Ok(LoggedIn {
                datamover,
                complete,
                state,
            })
        }
        Err(error) => Err(failed(&mut state, error)),
    }
}

/// The login phase over a connected stream.
async fn negotiate(
    config: &SessionConfig,
    params: &LoginRequestParams<'_>,
    portal: &str,
    stream: TcpStream,
) -> Result<(Datamover, InitiatorLoginComplete), Error> {
    let connect_error = |error| Error::Connect {
        address: portal.to_owned(),
        error,
    };
    let mut datamover = if params.iser {
        iser_connect(stream, config).await?
    } else {
        Datamover::tcp(stream).map_err(connect_error)?
    };
    datamover
        .set_nodelay(config.tcp_nodelay)
        .map_err(connect_error)?;
    datamover.set_tap(
        params
            .tap
            .clone()
            .map(|tap| Tap::new(tap, next_connection_number())),
    );
    let mut negotiation = config.negotiation.clone();
    if params.iser {
        // RFC 7145 section 6: iSER-assisted mode, no digests (the MPA CRC
        // covers every FPDU), and the receive buffers' size declared.
        negotiation.rdma_extensions = true;
        negotiation.header_digest = vec![Digest::None];
        negotiation.data_digest = vec![Digest::None];
        negotiation.max_recv_data_segment_length = ISER_RECV_DATA_SEGMENT_LENGTH;
        negotiation.declarations.push(TextPair::new(
            "InitiatorRecvDataSegmentLength",
            ISER_RECV_DATA_SEGMENT_LENGTH.to_string(),
        ));
    }
    if let Some(alias) = &config.initiator_alias {
        negotiation
            .declarations
            .push(TextPair::new("InitiatorAlias", alias.clone()));
    }
    let login_config = InitiatorLoginConfig {
        initiator_name: config.initiator_name.clone(),
        target_name: params.target_name.map(str::to_owned),
        isid: params.isid,
        tsih: params.tsih,
        cid: params.cid,
        negotiation,
        chap: config.chap.as_ref().map(|c| c.to_settings()),
    };
    let mutual_challenge = (rand::random::<u8>(), rand::random::<[u8; 32]>().to_vec());
    let history = Arc::new(Mutex::new(ChallengeHistory::default()));
    let mut machine = InitiatorLogin::new(
        login_config,
        params.initiator_task_tag,
        params.cmd_sn,
        mutual_challenge,
        history,
    )?;
    let mut step = machine.start();
    loop {
        match step {
            InitiatorStep::Send { request, data } => {
                let header = Header::new(Pdu::LoginRequest(request), data.len() as u32);
                datamover.sender.send_control(&header, &data).await?;
                let received = loop {
                    let receive = datamover.receiver.receive();
                    let received = if params.iser {
                        tokio::time::timeout(ISER_LOGIN_RESPONSE, receive)
                            .await
                            .map_err(|_| Error::Timeout {
                                timeout: ISER_LOGIN_RESPONSE,
                                waiting_for: LOGIN_RESPONSE,
                            })??
                    } else {
                        receive.await?
                    }
                    .ok_or(Error::ConnectionLost)?;
                    match &received.header.pdu {
                        // tgt's iSER target now and then sends its
                        // post-login NOP-In (ITT reserved: no answer wanted)
                        // before the Login Response it belongs after. Nothing
                        // in it concerns the login: skipped; a login the
                        // target really ended shows as a missing response.
                        Pdu::NopIn(nop) if nop.initiator_task_tag == RESERVED_TAG => {
                            tracing::debug!("NOP-In during login: skipped");
                        }
                        _ => break received,
                    }
                };
                let Pdu::LoginResponse(response) = &received.header.pdu else {
                    return Err(Error::Protocol(format!(
                        "{:?} during login",
                        received.header.pdu.opcode()
                    )));
                };
                step = machine.receive(response, &received.data)?;
            }
            InitiatorStep::Complete(complete) => {
                let p = &complete.parameters;
                // A discovery session needs no RDMA data movement: a target may
                // answer RDMAExtensions=No there (tgt's iSER target does) and the
                // session still runs over iSER Sends.
                if params.iser
                    && !p.rdma_extensions
                    && p.session_type != iscsi_proto::text::SessionType::Discovery
                {
                    return Err(Error::Protocol(
                        "the target answered RDMAExtensions=No on an iSER connection".into(),
                    ));
                }
                let digests = Digests {
                    header: p.header_digest == Digest::Crc32c,
                    data: p.data_digest == Digest::Crc32c,
                };
                datamover.enable(digests, p.max_recv_data_segment_length);
                return Ok((datamover, *complete));
            }
        }
    }
}
