//! The simulated world: one clock, one queue of events in time order, and
//! the link between initiator and target, all driven by one seeded random
//! source. Nothing here reads the real clock or touches a socket, so a
//! seed replays exactly.
//!
//! Each connection of the session is a TCP connection: each direction
//! delivers in order, a PDU taking a random latency plus its size at the
//! link's rate, never overtaking the one before it on that connection
//! (PDUs on different connections overtake each other freely: MC/S).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use iscsi_proto::pdu::Pdu;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Simulated time, in microseconds.
pub type Micros = u64;

/// A PDU on the simulated wire: the typed PDU, its data segment, and
/// whether the receiver's data digest check fails (the data was damaged
/// on the way).
#[derive(Clone, Debug)]
pub struct Wire {
    /// The connection it travels on.
    pub conn: usize,
    /// The PDU, as typed by proto.
    pub pdu: Pdu,
    /// Its data segment.
    pub data: Vec<u8>,
    /// Whether its data digest fails at the receiver.
    pub digest_error: bool,
    /// The target's order of sending (0 for the initiator's PDUs): PDUs
    /// on different connections arrive in any order, but the target's
    /// promises are about what it sent before what.
    pub sent: u64,
}

/// What happens at a moment of simulated time.
#[derive(Debug)]
pub enum Event {
    /// A PDU reaches the target.
    ToTarget(Wire),
    /// A PDU reaches the initiator.
    ToInitiator(Wire),
    /// The store finished the command with this Initiator Task Tag.
    StoreDone(u32),
    /// The initiator's clock: issue commands, check timeouts.
    Tick,
}

/// Which way a PDU goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Initiator to target.
    ToTarget,
    /// Target to initiator.
    ToInitiator,
}

/// Lines of the event trace kept for a failure report.
const TRACE_KEPT: usize = 400;

/// The clock, the queue and the random source.
pub struct World {
    now: Micros,
    seq: u64,
    queue: BinaryHeap<Reverse<(Micros, u64)>>,
    events: std::collections::BTreeMap<u64, Event>,
    /// When each direction of each connection is next free to deliver.
    free_at: Vec<[Micros; 2]>,
    /// The run's one random source.
    pub rng: StdRng,
    trace: VecDeque<String>,
    /// FNV-1a over every trace line.
    trace_hash: u64,
    /// Print every trace line as it happens.
    pub verbose: bool,
    /// Events taken off the queue.
    pub events_run: u64,
    /// PDUs the target has sent.
    target_sent: u64,
}

impl World {
    /// A world at time 0 whose random source is seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        World {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: std::collections::BTreeMap::new(),
            free_at: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            trace: VecDeque::new(),
            trace_hash: 0xcbf2_9ce4_8422_2325,
            verbose: false,
            events_run: 0,
            target_sent: 0,
        }
    }

    /// Simulated time now.
    pub fn now(&self) -> Micros {
        self.now
    }

    /// Schedules `event` `after` microseconds from now.
    pub fn at(&mut self, after: Micros, event: Event) {
        let seq = self.seq;
        self.seq += 1;
        self.queue.push(Reverse((self.now + after, seq)));
        self.events.insert(seq, event);
    }

    /// Sends `wire` over its connection: delivered in order, after a
    /// random latency (5-60 us) and its length at 10 Gbit/s.
    pub fn send(&mut self, direction: Direction, mut wire: Wire) {
        if direction == Direction::ToInitiator {
            self.target_sent += 1;
            wire.sent = self.target_sent;
        }
        let latency = self.rng.random_range(5..60);
        let on_wire = (48 + wire.data.len() as u64) / 1250;
        if self.free_at.len() <= wire.conn {
            self.free_at.resize(wire.conn + 1, [0; 2]);
        }
        let slot = &mut self.free_at[wire.conn][direction as usize];
        let at = (self.now + latency).max(*slot) + on_wire;
        *slot = at;
        let event = match direction {
            Direction::ToTarget => Event::ToTarget(wire),
            Direction::ToInitiator => Event::ToInitiator(wire),
        };
        let after = at - self.now;
        self.at(after, event);
    }

    /// The PDUs on their way to the initiator (an oracle may ask what the
    /// target had sent before something it did).
    pub fn to_initiator(&self) -> impl Iterator<Item = &Wire> {
        self.events.values().filter_map(|event| match event {
            Event::ToInitiator(wire) => Some(wire),
            _ => None,
        })
    }

    /// The next event, the clock moved to its time.
    pub fn pop(&mut self) -> Option<Event> {
        loop {
            let Reverse((time, seq)) = self.queue.pop()?;
            // (Events on a link that was cut are gone.)
            if let Some(event) = self.events.remove(&seq) {
                self.now = time;
                self.events_run += 1;
                return Some(event);
            }
        }
    }

    /// Every connection is cut: the PDUs on their way either way are lost
    /// (the store's work goes on).
    pub fn cut_links(&mut self) {
        self.events
            .retain(|_, event| !matches!(event, Event::ToTarget(_) | Event::ToInitiator(_)));
    }

    /// Whether nothing is scheduled.
    pub fn idle(&self) -> bool {
        self.events.is_empty()
    }

    /// Notes a line of the trace.
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        let line = format!("{:>10} {}", self.now, line());
        for byte in line.bytes() {
            self.trace_hash = (self.trace_hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
        if self.verbose {
            println!("{line}");
        }
        if self.trace.len() == TRACE_KEPT {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    /// A hash of every line of the trace so far.
    pub fn trace_hash(&self) -> u64 {
        self.trace_hash
    }

    /// The last lines of the trace.
    pub fn trace(&self) -> impl Iterator<Item = &String> {
        self.trace.iter()
    }

    /// A number in `lo..hi`.
    pub fn rng_range(&mut self, lo: usize, hi: usize) -> usize {
        self.rng.random_range(lo..hi)
    }

    /// `items` in a random order.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        use rand::seq::SliceRandom;
        items.shuffle(&mut self.rng);
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p)
    }
}
