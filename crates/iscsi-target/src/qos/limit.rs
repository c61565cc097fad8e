//! A limit as the target keeps it while it serves: the schedules of its
//! commands and bytes (`bucket.rs`), the commands waiting on it, and what
//! `status` and the metrics report of it. One lock per limit, taken only
//! by commands the limit applies to: a LUN without a limit, from an
//! initiator without one, never reaches here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::bucket::{Rate, Schedule};

/// The longest a command waits for its turn: past it, TASK SET FULL (the
/// initiator lowers its queue depth and sends it again) rather than a wait
/// that would run into its timeout and an abort.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// What a limit allows, as the file gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitSpec {
    /// Commands a second.
    pub iops: Option<u64>,
    /// Bytes of data a second.
    pub bytes_per_second: Option<u64>,
    /// Commands that may go at once after a quiet time (default a tenth
    /// of a second's worth, at least 1).
    pub burst_iops: Option<u64>,
    /// Bytes that may go at once (default a tenth of a second's worth, at
    /// least 1 MiB).
    pub burst_bytes: Option<u64>,
    /// Commands that may wait at once; past it TASK SET FULL.
    pub queue: u32,
}

/// The queue when the file gives none: more than any initiator's queue
/// depth (Linux's default is 32 a LUN, 128 at most for iSCSI).
pub const DEFAULT_QUEUE: u32 = 256;

impl LimitSpec {
    fn iops_rate(&self) -> Option<Rate> {
        self.iops.map(|per_second| Rate {
            per_second,
            burst: self.burst_iops.unwrap_or((per_second / 10).max(1)),
        })
    }

    fn bytes_rate(&self) -> Option<Rate> {
        self.bytes_per_second.map(|per_second| Rate {
            per_second,
            burst: self.burst_bytes.unwrap_or((per_second / 10).max(1 << 20)),
        })
    }
}

impl std::fmt::Display for LimitSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(rate) = self.iops_rate() {
            parts.push(format!("{} IOPS (burst {})", rate.per_second, rate.burst));
        }
        if let Some(rate) = self.bytes_rate() {
            parts.push(format!("{} B/s (burst {} B)", rate.per_second, rate.burst));
        }
        parts.push(format!("queue {}", self.queue));
        write!(f, "{}", parts.join(", "))
    }
}

/// What a command learned from its limits.
#[derive(Debug)]
pub enum Admission {
    /// It runs now.
    Go,
    /// It runs at `until`; it counts as waiting on its limits while the
    /// guard lives.
    Wait {
        /// When.
        until: Instant,
        /// Its place in the limits' queues.
        guard: Waiting,
    },
    /// Its limits' queues are full (or its wait would pass [`MAX_WAIT`]):
    /// TASK SET FULL.
    Full,
}

/// A command's place in its limits' queues: given up when dropped.
#[derive(Debug)]
pub struct Waiting(Vec<Arc<Limit>>);

impl Drop for Waiting {
    fn drop(&mut self) {
        for limit in &self.0 {
            limit.counters.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What a limit counts, for `status` and the metrics.
#[derive(Debug, Default)]
struct Counters {
    /// Commands waiting now.
    waiting: AtomicU64,
    /// Commands that waited.
    delayed: AtomicU64,
    /// Commands answered TASK SET FULL.
    refused: AtomicU64,
    /// Nanoseconds commands were held, in all.
    held_nanos: AtomicU64,
}

#[derive(Debug)]
struct State {
    spec: LimitSpec,
    iops: Option<Schedule>,
    bytes: Option<Schedule>,
    /// Commands and bytes let through in the second `second` and the one
    /// before it (the rate `status` shows).
    second: u64,
    this: (u64, u64),
    last: (u64, u64),
}

/// One limit while the target serves: a LUN's, or an initiator's on one
/// target.
#[derive(Debug)]
pub struct Limit {
    epoch: Instant,
    state: Mutex<State>,
    counters: Counters,
}

/// A limit's figures now.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LimitFigures {
    /// Commands let through in the last whole second.
    pub iops_now: u64,
    /// Bytes let through in the last whole second.
    pub bytes_per_second_now: u64,
    /// Commands waiting now.
    pub waiting: u64,
    /// Commands that waited, since the limit was set.
    pub delayed: u64,
    /// Commands answered TASK SET FULL.
    pub refused: u64,
    /// Seconds commands were held, in all.
    pub held_seconds: f64,
}

impl Limit {
    /// A limit with full buckets.
    pub fn new(spec: LimitSpec) -> Self {
        Self {
            epoch: Instant::now(),
            state: Mutex::new(State {
                spec,
                iops: spec.iops_rate().map(Schedule::new),
                bytes: spec.bytes_rate().map(Schedule::new),
                second: 0,
                this: (0, 0),
                last: (0, 0),
            }),
            counters: Counters::default(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What it allows now.
    pub fn spec(&self) -> LimitSpec {
        self.state().spec
    }

    /// Changes what it allows, in place (a reload): commands waiting keep
    /// their turn, the debt is paid at the new rate.
    pub fn set(&self, spec: LimitSpec) {
        let now = self.now();
        let mut state = self.state();
        state.iops = retimed(state.iops.take(), spec.iops_rate(), now);
        state.bytes = retimed(state.bytes.take(), spec.bytes_rate(), now);
        state.spec = spec;
    }

    /// Its figures now.
    pub fn figures(&self) -> LimitFigures {
        let second = self.now() / 1_000_000_000;
        let state = self.state();
        let (ops, bytes) = if second == state.second + 1 {
            state.this
        } else if second == state.second {
            state.last
        } else {
            (0, 0)
        };
        let c = &self.counters;
        LimitFigures {
            iops_now: ops,
            bytes_per_second_now: bytes,
            waiting: c.waiting.load(Ordering::Relaxed),
            delayed: c.delayed.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            held_seconds: c.held_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// One dimension of a limit given `rate` at `now`: a running schedule keeps
/// its debt at the new rate; a new one starts full; none without a rate.
fn retimed(schedule: Option<Schedule>, rate: Option<Rate>, now: u64) -> Option<Schedule> {
    match (schedule, rate) {
        (Some(mut s), Some(rate)) => {
            s.set_rate(now, rate);
            Some(s)
        }
        (_, rate) => rate.map(Schedule::new),
    }
}

/// A command of `bytes` under every limit of `limits` (a LUN's, its
/// initiator's): it goes when all of them allow, and takes its share of
/// each only if none refuses it. The locks are taken in the order given
/// (the caller's is always LUN, then initiator), so two commands never
/// wait on each other's.
pub fn admit(limits: &[&Arc<Limit>], bytes: u64) -> Admission {
    let mut states: Vec<_> = limits.iter().map(|l| (l, l.now(), l.state())).collect();
    let mut wait = 0u64;
    for (limit, now, state) in &states {
        let full = limit.counters.waiting.load(Ordering::Relaxed) >= u64::from(state.spec.queue);
        let ops = state.iops.as_ref().map_or(0, |s| s.wait(*now, 1));
        let data = state.bytes.as_ref().map_or(0, |s| s.wait(*now, bytes));
        wait = wait.max(ops).max(data);
        if full || wait > MAX_WAIT.as_nanos() as u64 {
            limit.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Admission::Full;
        }
    }
    for (limit, now, state) in &mut states {
        if let Some(s) = state.iops.as_mut() {
            s.take(*now, 1);
        }
        if let Some(s) = state.bytes.as_mut() {
            s.take(*now, bytes);
        }
        let second = *now / 1_000_000_000;
        if second != state.second {
            state.last = if second == state.second + 1 {
                state.this
            } else {
                (0, 0)
            };
            state.this = (0, 0);
            state.second = second;
        }
        state.this.0 += 1;
        state.this.1 += bytes;
        if wait > 0 {
            let c = &limit.counters;
            c.waiting.fetch_add(1, Ordering::Relaxed);
            c.delayed.fetch_add(1, Ordering::Relaxed);
            c.held_nanos.fetch_add(wait, Ordering::Relaxed);
        }
    }
    drop(states);
    if wait == 0 {
        return Admission::Go;
    }
    Admission::Wait {
        until: Instant::now() + Duration::from_nanos(wait),
        guard: Waiting(limits.iter().map(|l| Arc::clone(l)).collect()),
    }
}
