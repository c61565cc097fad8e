//! The proxy's I/O: one thread accepting connections, two per connection
//! (one each way) reading whole PDUs, letting the [`Plan`] decide, and
//! forwarding them. Plain threads: a PDU is read and written whole, and a
//! delay or stall is a sleep in the thread of the way it holds up.
//!
//! Memory per connection is one PDU each way (at most 16 MiB of data, the
//! 24-bit DataSegmentLength), and a stalled or slow receiver stops the
//! proxy reading from the sender, so TCP flow control still works.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use iscsi_proto::pdu::{BHS_LEN, Pdu};

use crate::framing::{Layout, LoginWatch, corrupt};
use crate::plan::Plan;
use crate::spec::{Action, Direction, Fault, PduKind};

/// The most events kept in memory; later ones are still reported to the
/// event callback.
const MAX_KEPT_EVENTS: usize = 100_000;

/// Something the proxy did: a fault it applied, or a connection it opened
/// or closed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FaultEvent {
    /// Milliseconds since the proxy started.
    pub at_ms: u64,
    /// The connection, numbered from 1 in order of arrival.
    pub connection: u64,
    /// The way the PDU was travelling, for a fault.
    pub direction: Option<Direction>,
    /// The fault's specification; `None` for a connection opening or
    /// closing.
    pub fault: Option<String>,
    /// The PDU it applied to (kind, task tag, sequence numbers, lengths).
    pub pdu: Option<String>,
    /// What was done.
    pub what: String,
}

impl fmt::Display for FaultEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>8} ms conn {}", self.at_ms, self.connection)?;
        if let Some(direction) = self.direction {
            write!(f, " {direction}")?;
        }
        if let Some(fault) = &self.fault {
            write!(f, " [{fault}]")?;
        }
        if let Some(pdu) = &self.pdu {
            write!(f, " {pdu}:")?;
        }
        write!(f, " {}", self.what)
    }
}

/// Called with every event as it happens (e.g. to print it).
pub type EventSink = Box<dyn Fn(&FaultEvent) + Send + Sync>;

/// What the proxy reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Logging {
    /// The faults it applied and the connections it opened and closed.
    #[default]
    Faults,
    /// Those, and every PDU it forwarded (with the fields that order a
    /// recovery: sequence numbers, tags, SNACK runs, the A and S bits), to
    /// see what two peers said to each other around a fault.
    EveryPdu,
}

/// A running fault-injecting proxy. Dropping it stops accepting and cuts
/// every open connection.
pub struct FaultProxy {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    upstream: SocketAddr,
    plan: Plan,
    started: Instant,
    stopping: AtomicBool,
    connections: AtomicU64,
    /// Both sockets of each open connection, to cut them at stop.
    open: Mutex<HashMap<u64, [TcpStream; 2]>>,
    events: Mutex<Vec<FaultEvent>>,
    sink: Option<EventSink>,
    logging: Logging,
}

impl Shared {
    fn record(&self, event: FaultEvent) {
        if let Some(sink) = &self.sink {
            sink(&event);
        }
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if events.len() < MAX_KEPT_EVENTS {
            events.push(event);
        }
    }

    fn event(&self, connection: u64, what: String) -> FaultEvent {
        FaultEvent {
            at_ms: self.started.elapsed().as_millis() as u64,
            connection,
            direction: None,
            fault: None,
            pdu: None,
            what,
        }
    }
}

impl FaultProxy {
    /// Listens on `listen` and relays each connection to `upstream`,
    /// applying `faults`; `sink`, if given, sees every event as it happens.
    pub fn start(
        listen: impl ToSocketAddrs,
        upstream: impl ToSocketAddrs,
        faults: Vec<Fault>,
        sink: Option<EventSink>,
    ) -> io::Result<FaultProxy> {
        Self::start_logging(listen, upstream, faults, sink, Logging::Faults)
    }

    /// [`FaultProxy::start`], reporting what `logging` says.
    pub fn start_logging(
        listen: impl ToSocketAddrs,
        upstream: impl ToSocketAddrs,
        faults: Vec<Fault>,
        sink: Option<EventSink>,
        logging: Logging,
    ) -> io::Result<FaultProxy> {
        let upstream = upstream.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "upstream resolves to nothing")
        })?;
        let listener = TcpListener::bind(listen)?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            plan: Plan::new(faults),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            events: Mutex::new(Vec::new()),
            sink,
            logging,
        });
        let acceptor = {
            let shared = shared.clone();
            thread::Builder::new()
                .name("fault-proxy-accept".into())
                .spawn(move || accept_loop(listener, shared))?
        };
        Ok(FaultProxy {
            local_addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address the proxy listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Every event so far (up to the first 100 000).
    pub fn events(&self) -> Vec<FaultEvent> {
        self.shared
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many times each fault has fired, in the order given.
    pub fn fired(&self) -> Vec<u64> {
        self.shared.plan.fired()
    }

    /// How many connections the proxy has accepted.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Blocks until the proxy is stopped from elsewhere (the CLI's use).
    pub fn wait(mut self) {
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the acceptor, blocked in accept().
        let _ = TcpStream::connect(self.local_addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let open = self
            .shared
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for sockets in open.values() {
            for socket in sockets {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for accepted in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let client = match accepted {
            Ok(client) => client,
            Err(error) => {
                shared.record(shared.event(0, format!("accept failed: {error}")));
                continue;
            }
        };
        let id = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
        let shared = shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("fault-proxy-{id}"))
            .spawn(move || serve(client, id, shared));
        if let Err(error) = spawned {
            eprintln!("fault-proxy: no thread for connection {id}: {error}");
        }
    }
}

/// One connection's state, shared by its two ways.
struct Connection {
    id: u64,
    client: TcpStream,
    server: TcpStream,
    login: Mutex<LoginWatch>,
    stalled_until: Mutex<Option<Instant>>,
}

impl Connection {
    fn cut(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

fn serve(client: TcpStream, id: u64, shared: Arc<Shared>) {
    let peer = client
        .peer_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let server = match TcpStream::connect(shared.upstream) {
        Ok(server) => server,
        Err(error) => {
            shared.record(shared.event(
                id,
                format!("from {peer}: cannot reach {}: {error}", shared.upstream),
            ));
            return;
        }
    };
    let clones = (|| Ok::<_, io::Error>([client.try_clone()?, server.try_clone()?]))();
    let Ok(clones) = clones else {
        return;
    };
    for socket in [&client, &server] {
        let _ = socket.set_nodelay(true);
    }
    shared
        .open
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, clones);
    shared.record(shared.event(id, format!("opened from {peer} to {}", shared.upstream)));
    let connection = Arc::new(Connection {
        id,
        client,
        server,
        login: Mutex::new(LoginWatch::default()),
        stalled_until: Mutex::new(None),
    });
    let ways = [Direction::ToTarget, Direction::ToInitiator].map(|direction| {
        let shared = shared.clone();
        let connection = connection.clone();
        thread::spawn(move || {
            let outcome = pump(&shared, &connection, direction);
            match outcome {
                Ok(()) => {
                    let to = match direction {
                        Direction::ToTarget => &connection.server,
                        Direction::ToInitiator => &connection.client,
                    };
                    let _ = to.shutdown(Shutdown::Write);
                }
                Err(_) => connection.cut(),
            }
            outcome
        })
    });
    let mut reasons = Vec::new();
    for (way, handle) in ways.into_iter().enumerate() {
        if let Ok(Err(end)) = handle.join() {
            let direction = [Direction::ToTarget, Direction::ToInitiator][way];
            reasons.push(format!("{direction}: {end}"));
        }
    }
    shared
        .open
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id);
    let why = if reasons.is_empty() {
        "both ends closed".to_owned()
    } else {
        reasons.join("; ")
    };
    shared.record(shared.event(id, format!("closed ({why})")));
}

/// Why one way of a connection ended other than by a clean end of stream
/// at a PDU boundary.
#[derive(Debug, thiserror::Error)]
enum End {
    #[error("cut by a fault")]
    Cut,
    #[error("stream ended inside a PDU")]
    Truncated,
    /// The message is the cause itself (and so no `source()` repeating it).
    #[error("{0}")]
    Io(io::Error),
}

impl From<io::Error> for End {
    fn from(error: io::Error) -> Self {
        End::Io(error)
    }
}

/// Reads `buf` whole; `Ok(false)` at end of stream before its first byte.
fn read_whole(from: &mut impl Read, buf: &mut [u8]) -> Result<bool, End> {
    let mut filled = 0;
    while filled < buf.len() {
        match from.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(End::Truncated),
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(true)
}

/// Forwards PDUs one way until the stream ends or a fault cuts it.
fn pump(shared: &Shared, connection: &Connection, direction: Direction) -> Result<(), End> {
    let (mut from, mut to) = match direction {
        Direction::ToTarget => (&connection.client, &connection.server),
        Direction::ToInitiator => (&connection.server, &connection.client),
    };
    let mut forwarded: u64 = 0;
    loop {
        let mut bhs = [0u8; BHS_LEN];
        if !read_whole(&mut from, &mut bhs)? {
            return Ok(());
        }
        let digests = connection
            .login
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .digests();
        let layout = Layout::of(&bhs, digests);
        let mut wire = vec![0u8; layout.wire_len()];
        wire[..BHS_LEN].copy_from_slice(&bhs);
        if !read_whole(&mut from, &mut wire[BHS_LEN..])? && wire.len() > BHS_LEN {
            return Err(End::Truncated);
        }
        let (pdu, _) = Pdu::decode_bhs(&bhs);
        let data = layout.header_len..layout.header_len + layout.data_len;
        if direction == Direction::ToInitiator {
            // Before forwarding the final Login Response: the initiator's
            // first full-feature PDU cannot come before it.
            connection
                .login
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .observe_from_target(&pdu, &wire[data.clone()]);
        }
        let mut forward = true;
        let mut cut = false;
        for firing in shared.plan.on_pdu(direction, pdu.opcode(), layout.data_len) {
            let what = match firing.action {
                Action::Drop => {
                    forward = false;
                    format!("dropped ({} bytes)", wire.len())
                }
                Action::Delay(hold) => format!("holding it {} us", hold.as_micros()),
                Action::Stall(hold) => {
                    let mut until = connection
                        .stalled_until
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    *until = Some(Instant::now() + hold);
                    format!("stalling both ways {} us", hold.as_micros())
                }
                Action::Cut => {
                    cut = true;
                    "cut the connection instead of forwarding it".to_owned()
                }
                corrupting => corrupt(&mut wire, layout, corrupting)
                    .unwrap_or_else(|| "nothing to corrupt".to_owned()),
            };
            shared.record(FaultEvent {
                direction: Some(direction),
                fault: Some(shared.plan.faults()[firing.fault].text.clone()),
                pdu: Some(describe(&pdu, layout.data_len)),
                ..shared.event(connection.id, what)
            });
            if let Action::Delay(hold) = firing.action {
                thread::sleep(hold);
            }
        }
        let stall = *connection
            .stalled_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(until) = stall {
            let now = Instant::now();
            if until > now {
                thread::sleep(until - now);
            }
        }
        if cut {
            connection.cut();
            return Err(End::Cut);
        }
        if !forward {
            continue;
        }
        let len = wire.len() as u64;
        for (index, limit) in shared.plan.byte_cuts(direction) {
            if forwarded + len >= limit && shared.plan.claim(index) {
                let part = (limit - forwarded) as usize;
                to.write_all(&wire[..part])?;
                shared.record(FaultEvent {
                    direction: Some(direction),
                    fault: Some(shared.plan.faults()[index].text.clone()),
                    pdu: Some(describe(&pdu, layout.data_len)),
                    ..shared.event(
                        connection.id,
                        format!(
                            "forwarded {limit} bytes ({part} of this PDU's {len}), then cut the connection"
                        ),
                    )
                });
                connection.cut();
                return Err(End::Cut);
            }
        }
        to.write_all(&wire)?;
        forwarded += len;
        if shared.logging == Logging::EveryPdu {
            shared.record(FaultEvent {
                direction: Some(direction),
                pdu: Some(describe(&pdu, layout.data_len)),
                ..shared.event(connection.id, "forwarded".to_owned())
            });
        }
    }
}

/// A PDU in a log line: its kind, task tag and what places it in its task.
fn describe(pdu: &Pdu, data_len: usize) -> String {
    let kind = PduKind::name_of(pdu.opcode());
    let itt = pdu.initiator_task_tag();
    let place = match pdu {
        Pdu::ScsiCommand(command) => format!(
            " CmdSN {} CDB {:#04x} length {} ExpStatSN {}",
            command.cmd_sn,
            command.cdb[0],
            command.expected_data_transfer_length,
            command.exp_stat_sn
        ),
        Pdu::DataIn(data) => format!(
            " DataSN {} offset {}{}{}",
            data.data_sn,
            data.buffer_offset,
            if data.acknowledge {
                format!(" A TTT {:#010x}", data.target_transfer_tag)
            } else {
                String::new()
            },
            match data.status {
                Some(status) => format!(" S status {status:#04x} StatSN {}", data.stat_sn),
                None => String::new(),
            }
        ),
        Pdu::SnackRequest(snack) => format!(
            " {:?} TTT {:#010x} BegRun {} RunLength {} ExpStatSN {}",
            snack.snack_type,
            snack.target_transfer_tag,
            snack.beg_run,
            snack.run_length,
            snack.exp_stat_sn
        ),
        Pdu::DataOut(data) => format!(" DataSN {} offset {}", data.data_sn, data.buffer_offset),
        Pdu::ReadyToTransfer(r2t) => format!(
            " R2TSN {} offset {} length {}",
            r2t.r2t_sn, r2t.buffer_offset, r2t.desired_data_transfer_length
        ),
        Pdu::ScsiResponse(response) => format!(" StatSN {}", response.stat_sn),
        _ => String::new(),
    };
    format!("{kind} ITT {itt:#010x}{place} data {data_len}")
}

#[cfg(test)]
mod tests {
    use super::describe;
    use iscsi_proto::pdu::{DataIn, Pdu, SnackRequest, SnackType};
    use iscsi_proto::serial::{DataSn, StatSn};

    #[test]
    fn a_pdu_line_holds_what_orders_a_recovery() {
        let data_in = Pdu::DataIn(DataIn {
            final_flag: true,
            acknowledge: true,
            status: Some(0),
            initiator_task_tag: 7,
            target_transfer_tag: 0x2e,
            stat_sn: StatSn::new(41),
            data_sn: DataSn::new(3),
            buffer_offset: 49152,
            ..DataIn::default()
        });
        assert_eq!(
            describe(&data_in, 16384),
            "data-in ITT 0x00000007 DataSN 3 offset 49152 A TTT 0x0000002e S status 0x00 StatSN 41 data 16384"
        );
        let ack = Pdu::SnackRequest(SnackRequest {
            snack_type: SnackType::DataAck,
            initiator_task_tag: 0xffff_ffff,
            target_transfer_tag: 0x2e,
            exp_stat_sn: StatSn::new(41),
            beg_run: 4,
            run_length: 0,
            ..SnackRequest::default()
        });
        assert_eq!(
            describe(&ack, 0),
            "snack ITT 0xffffffff DataAck TTT 0x0000002e BegRun 4 RunLength 0 ExpStatSN 41 data 0"
        );
    }
}
