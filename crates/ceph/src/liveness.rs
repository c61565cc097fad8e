//! Whether a peer gateway is alive: its heartbeat, and, once the heartbeat
//! is late, a probe of the peer's liveness port.
//!
//! A heartbeat alone tells a dead gateway from a slow one only after
//! [`DEAD_AFTER`]. A killed process is told sooner: the kernel closes its
//! sockets as it dies, and from then on a TCP connection to a port it
//! listened on is refused. So each gateway process listens on a port of
//! its own ([`liveness_port`]: bound to the gateway's address, the port
//! chosen by the kernel, every connection accepted and closed unread) and
//! writes `address:port` into its heartbeat beside the counter; a peer
//! whose heartbeat has not moved for [`LATE`] is probed, and a refusal
//! makes it dead at once. What keeps this from taking a live gateway's LU:
//!
//! - only a refusal counts. A probe that connects (a stopped process: its
//!   kernel still answers), times out or finds no route (a partition)
//!   says nothing, and the peer is dead only after [`DEAD_AFTER`];
//! - only from a port this observer has connected to before, so that a
//!   firewall rejecting the port, or an address that does not reach the
//!   peer from here, never counts;
//! - only while the heartbeat is late: a peer whose counter moves is alive
//!   whatever a probe said;
//! - the port lives exactly as long as the process: not the iSCSI portal,
//!   which a configuration reload may move while the process goes on.
//!
//! A restarted gateway writes a new port, which counts once this observer
//! has connected to it.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// A gateway whose heartbeat has not moved for this long is dead, whatever
/// a probe says (a stopped process, a gateway cut from the cluster).
pub const DEAD_AFTER: Duration = Duration::from_secs(3);
/// A heartbeat that has not moved for this long is late: its gateway's
/// liveness port is probed. Above the beat (`gateway::BEAT`), so that a
/// live peer's beat seen a look late seldom costs a probe; a probe that
/// connects costs one TCP handshake and nothing else.
pub const LATE: Duration = Duration::from_millis(500);
/// How long a probe waits for the peer's answer; no answer says nothing.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// How often a port not yet reached is tried again.
const RETRY_UNREACHED: Duration = Duration::from_secs(10);

/// What a probe of a liveness port found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// The connection was made: the peer's kernel, at least, is there.
    Connected,
    /// The connection was refused: nothing listens on the port any more.
    Refused,
    /// No answer, no route, or another error: nothing learnt.
    Unknown,
}

/// Connects to `port` and closes the connection at once.
pub(super) fn probe(port: SocketAddr) -> Probe {
    match TcpStream::connect_timeout(&port, PROBE_TIMEOUT) {
        Ok(_) => Probe::Connected,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Probe::Refused,
        Err(_) => Probe::Unknown,
    }
}

/// This process's liveness port on `address`: bound the first time it is
/// asked for, then kept for the life of the process by a thread that
/// accepts every connection and closes it (so that probes never fill the
/// listen queue).
pub(super) fn liveness_port(address: IpAddr) -> io::Result<SocketAddr> {
    static PORTS: OnceLock<Mutex<HashMap<IpAddr, SocketAddr>>> = OnceLock::new();
    let mut ports = PORTS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(&port) = ports.get(&address) {
        return Ok(port);
    }
    let listener = TcpListener::bind(SocketAddr::new(address, 0))?;
    let port = listener.local_addr()?;
    std::thread::Builder::new()
        .name("gateway-liveness".into())
        .spawn(move || {
            for connection in listener.incoming() {
                drop(connection);
            }
        })?;
    ports.insert(address, port);
    Ok(port)
}

/// The heartbeat a gateway writes: its counter, then its liveness port if
/// it has one (`17 192.0.2.1:40123`).
pub(super) fn heartbeat(counter: u64, port: Option<SocketAddr>) -> String {
    match port {
        Some(port) => format!("{counter} {port}"),
        None => counter.to_string(),
    }
}

/// The liveness port a peer's heartbeat names, if any (a gateway without
/// an address writes the counter alone). Any bytes a peer, or anything with
/// write access to the pool, left in the xattr are either a port or
/// nothing (the fuzz target `gateway_heartbeat`).
pub fn heartbeat_port(beat: &[u8]) -> Option<SocketAddr> {
    std::str::from_utf8(beat)
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// One peer as last seen.
#[derive(Debug)]
struct Seen {
    beat: Vec<u8>,
    /// When the heartbeat last changed (this process's clock).
    at: Instant,
    /// The liveness port its heartbeat names.
    port: Option<SocketAddr>,
    /// Whether a probe from here has connected to that port.
    reached: bool,
    /// When a probe last failed to connect to a port not yet reached.
    tried: Option<Instant>,
    /// The port refused a probe while the heartbeat was late: dead until
    /// the heartbeat moves.
    refused: bool,
}

/// The heartbeats seen, with when each last changed, and what probes of
/// the peers' liveness ports found.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    seen: HashMap<u16, Seen>,
}

impl Liveness {
    /// Records `member`'s heartbeat as read at `now` (`None`: not there),
    /// probing its liveness port (with `probe`) when it is not reached yet
    /// or the heartbeat is late. Whether this look found the port refused
    /// (the member is dead as of now).
    pub fn observe(
        &mut self,
        member: u16,
        beat: Option<Vec<u8>>,
        now: Instant,
        probe: &mut dyn FnMut(SocketAddr) -> Probe,
    ) -> bool {
        let Some(beat) = beat else {
            self.seen.remove(&member);
            return false;
        };
        let seen = match self.seen.get_mut(&member) {
            Some(seen) if seen.beat == beat => seen,
            old => {
                let port = heartbeat_port(&beat);
                let reached = old.is_some_and(|o| o.reached && o.port == port);
                let seen = Seen {
                    beat,
                    at: now,
                    port,
                    reached,
                    tried: None,
                    refused: false,
                };
                self.seen.entry(member).insert_entry(seen).into_mut()
            }
        };
        let Some(port) = seen.port else {
            return false;
        };
        if !seen.reached {
            if seen
                .tried
                .is_some_and(|t| now.saturating_duration_since(t) < RETRY_UNREACHED)
            {
                return false;
            }
            match probe(port) {
                Probe::Connected => seen.reached = true,
                Probe::Refused | Probe::Unknown => seen.tried = Some(now),
            }
            return false;
        }
        let late = now.saturating_duration_since(seen.at) >= LATE;
        if late && !seen.refused && probe(port) == Probe::Refused {
            seen.refused = true;
            return true;
        }
        false
    }

    /// Whether `member` is alive at `now`: its heartbeat moved within
    /// [`DEAD_AFTER`] (a heartbeat first seen counts as moved then: a
    /// gateway that starts gives its peers the benefit of the doubt for
    /// one period), and its liveness port has not refused a probe since.
    pub fn alive(&self, member: u16, now: Instant) -> bool {
        self.seen.get(&member).is_some_and(|seen| {
            !seen.refused && now.saturating_duration_since(seen.at) < DEAD_AFTER
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT: &str = "192.0.2.1:40123";

    fn beat(n: u64) -> Option<Vec<u8>> {
        Some(heartbeat(n, Some(PORT.parse().unwrap())).into_bytes())
    }

    /// A probe that answers `answer` and counts its calls.
    fn answering(answer: Probe, calls: &mut u32) -> impl FnMut(SocketAddr) -> Probe + '_ {
        move |port| {
            assert_eq!(port, PORT.parse().unwrap());
            *calls += 1;
            answer
        }
    }

    fn never(_: SocketAddr) -> Probe {
        panic!("probed")
    }

    #[test]
    fn a_heartbeat_that_stops_moving_dies() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        assert!(!l.alive(2, t0));
        l.observe(2, Some(b"1".to_vec()), t0, &mut never);
        assert!(l.alive(2, t0 + Duration::from_secs(1)));
        l.observe(
            2,
            Some(b"1".to_vec()),
            t0 + Duration::from_secs(2),
            &mut never,
        );
        assert!(!l.alive(2, t0 + DEAD_AFTER));
        l.observe(2, Some(b"2".to_vec()), t0 + DEAD_AFTER, &mut never);
        assert!(l.alive(2, t0 + DEAD_AFTER + Duration::from_secs(1)));
        l.observe(2, None, t0 + DEAD_AFTER, &mut never);
        assert!(!l.alive(2, t0 + DEAD_AFTER));
    }

    #[test]
    fn a_late_heartbeat_whose_port_refuses_is_dead_at_once() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let mut calls = 0;
        // First seen: the port is reached once, then not probed while the
        // heartbeat moves.
        assert!(!l.observe(2, beat(1), t0, &mut answering(Probe::Connected, &mut calls)));
        assert_eq!(calls, 1);
        assert!(!l.observe(2, beat(2), t0 + LATE / 2, &mut never));
        // Late: probed; it connects (a stopped process), so still alive.
        let late = t0 + LATE / 2 + LATE;
        let mut calls = 0;
        assert!(!l.observe(
            2,
            beat(2),
            late,
            &mut answering(Probe::Connected, &mut calls)
        ));
        assert_eq!(calls, 1);
        assert!(l.alive(2, late));
        // Refused now: dead at once, well before DEAD_AFTER, and not
        // probed again.
        assert!(l.observe(2, beat(2), late, &mut answering(Probe::Refused, &mut 0)));
        assert!(!l.alive(2, late));
        assert!(!l.observe(2, beat(2), late, &mut never));
        // A heartbeat that moves again is alive again.
        assert!(!l.observe(2, beat(3), late, &mut never));
        assert!(l.alive(2, late));
    }

    #[test]
    fn a_port_never_reached_from_here_never_counts() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let mut calls = 0;
        // Refused from the start (a firewall rejecting it, an address that
        // is not the peer's from here): tried now and again, never trusted.
        l.observe(2, beat(1), t0, &mut answering(Probe::Refused, &mut calls));
        let late = t0 + LATE * 2;
        l.observe(2, beat(1), late, &mut never);
        assert!(l.alive(2, late), "a refusal from a port never reached");
        l.observe(
            2,
            beat(1),
            t0 + RETRY_UNREACHED,
            &mut answering(Probe::Refused, &mut calls),
        );
        assert_eq!(calls, 2);
        assert!(l.alive(2, t0 + DEAD_AFTER / 2));
        // A timeout is no verdict either.
        let mut l = Liveness::default();
        l.observe(2, beat(1), t0, &mut answering(Probe::Connected, &mut 0));
        l.observe(2, beat(1), late, &mut answering(Probe::Unknown, &mut 0));
        assert!(l.alive(2, late));
    }

    #[test]
    fn a_moving_heartbeat_is_alive_whatever_a_probe_says_and_a_new_port_is_reached_first() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        l.observe(2, beat(1), t0, &mut answering(Probe::Connected, &mut 0));
        // Moving: never probed, alive.
        for n in 2..10u32 {
            let now = t0 + LATE / 2 * n;
            l.observe(2, beat(u64::from(n)), now, &mut never);
            assert!(l.alive(2, now));
        }
        // Restarted on a new port: that port must be reached before a
        // refusal from it counts.
        let other: SocketAddr = "192.0.2.1:40124".parse().unwrap();
        let now = t0 + Duration::from_secs(10);
        let restarted = Some(heartbeat(1, Some(other)).into_bytes());
        l.observe(2, restarted.clone(), now, &mut |_| Probe::Refused);
        l.observe(2, restarted, now + LATE, &mut |_| Probe::Refused);
        assert!(l.alive(2, now + LATE));
    }

    #[test]
    fn a_heartbeat_names_its_port_or_nothing() {
        assert_eq!(heartbeat_port(heartbeat(7, None).as_bytes()), None);
        assert_eq!(heartbeat_port(b"7"), None);
        assert_eq!(heartbeat_port(b"7 not-a-port"), None);
        assert_eq!(
            heartbeat_port(heartbeat(7, Some(PORT.parse().unwrap())).as_bytes()),
            Some(PORT.parse().unwrap())
        );
        assert_eq!(heartbeat_port(b"\xff\xfe"), None);
    }

    #[test]
    fn a_liveness_port_accepts_while_the_process_lives_and_a_closed_one_refuses() {
        let port = liveness_port(IpAddr::from([127, 0, 0, 1])).unwrap();
        assert_eq!(liveness_port(IpAddr::from([127, 0, 0, 1])).unwrap(), port);
        assert_eq!(probe(port), Probe::Connected);
        // More probes than a listen queue holds: each is accepted and
        // closed, so the port still answers after them (a probe may find
        // the queue full for a moment while the accepting thread waits
        // for a CPU: no verdict, never a refusal).
        for _ in 0..300 {
            assert_ne!(probe(port), Probe::Refused);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while probe(port) != Probe::Connected {
            assert!(
                Instant::now() < deadline,
                "the liveness port stopped answering"
            );
        }
        // A port nothing listens on (what a killed gateway's kernel
        // leaves): refused. Held bound, not listening, so that nothing
        // else takes it meanwhile.
        let held = tokio::net::TcpSocket::new_v4().unwrap();
        held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(probe(held.local_addr().unwrap()), Probe::Refused);
    }
}
