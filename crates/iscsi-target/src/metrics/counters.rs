//! What the data path counts per session per LUN: commands, bytes, CHECK
//! CONDITIONs by sense key and a latency histogram, in relaxed atomics
//! that only the session's own connections write (issue 35's rule: no
//! cache line on the I/O path written by two sessions). A scrape reads
//! them ([`LunSnapshot`]) and sums them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// Finite upper bounds of the latency histogram: 50 µs doubling up to
/// about 13 s (19 bounds), then +Inf. Fixed, so that a bucket is found
/// with a shift instead of a search, and sums across sessions are exact.
pub(crate) const BUCKETS: usize = 19;

/// The smallest bound, in nanoseconds.
const FIRST_BOUND_NS: u64 = 50_000;

/// The finite upper bounds, in seconds.
pub(crate) fn bucket_bounds() -> [f64; BUCKETS] {
    let mut bounds = [0.0; BUCKETS];
    for (i, bound) in bounds.iter_mut().enumerate() {
        *bound = FIRST_BOUND_NS as f64 * 1e-9 * f64::from(1u32 << i);
    }
    bounds
}

/// The bucket of a latency (`BUCKETS` is +Inf): the smallest `i` with
/// `ns <= 50 µs * 2^i`.
pub(crate) fn bucket_of(ns: u64) -> usize {
    let units = ns.div_ceil(FIRST_BOUND_NS);
    if units <= 1 {
        return 0;
    }
    let i = (64 - (units - 1).leading_zeros()) as usize;
    i.min(BUCKETS)
}

/// What a command was, for the `op` label: by its operation code, so that
/// an INQUIRY (which reads data) is not counted as a READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read = 0,
    Write = 1,
    Other = 2,
}

impl Op {
    /// Every op, in label order.
    pub const ALL: [Op; 3] = [Op::Read, Op::Write, Op::Other];

    /// READ (6/10/12/16) is `Read`; WRITE and WRITE AND VERIFY (6/10/12/16)
    /// are `Write`; anything else `Other`.
    pub fn of(opcode: u8) -> Op {
        match opcode {
            0x08 | 0x28 | 0xA8 | 0x88 => Op::Read,
            0x0A | 0x2A | 0xAA | 0x8A | 0x2E | 0xAE | 0x8E => Op::Write,
            _ => Op::Other,
        }
    }

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Other => "other",
        }
    }
}

/// The SPC sense key names, by key (label values).
pub(crate) const SENSE_KEYS: [&str; 16] = [
    "no_sense",
    "recovered_error",
    "not_ready",
    "medium_error",
    "hardware_error",
    "illegal_request",
    "unit_attention",
    "data_protect",
    "blank_check",
    "vendor_specific",
    "copy_aborted",
    "aborted_command",
    "reserved_0c",
    "volume_overflow",
    "miscompare",
    "completed",
];

/// One command answered: what its counters take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completion {
    pub op: Op,
    /// Data-In bytes sent (its first sending; SNACK resends are not data
    /// read again).
    pub read_bytes: u64,
    /// Data-Out and immediate data bytes received and handed to the SCSI
    /// layer.
    pub written_bytes: u64,
    /// The sense key of a CHECK CONDITION.
    pub sense_key: Option<u8>,
    /// From the SCSI Command PDU's arrival to the status handed to the
    /// connection's writer.
    pub latency: Duration,
}

/// One session's counters for one LUN. Aligned to two cache lines so that
/// no other allocation (another session's counters) shares a line with
/// them (adjacent-line prefetch included).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct LunCounters {
    commands: [AtomicU64; 3],
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    /// Per op, per bucket (not cumulative; the last is +Inf).
    latency: [[AtomicU64; BUCKETS + 1]; 3],
    /// Per op, the sum of latencies in nanoseconds.
    latency_ns: [AtomicU64; 3],
    check_conditions: [AtomicU64; 16],
}

impl LunCounters {
    /// Counts one command. Relaxed: each counter is exact on its own; a
    /// scrape may see a command's count before its bytes, never a count
    /// going backwards.
    pub fn record(&self, done: &Completion) {
        let add = |c: &AtomicU64, n: u64| {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        };
        let op = done.op as usize;
        add(&self.commands[op], 1);
        add(&self.read_bytes, done.read_bytes);
        add(&self.written_bytes, done.written_bytes);
        let ns = u64::try_from(done.latency.as_nanos()).unwrap_or(u64::MAX);
        add(&self.latency[op][bucket_of(ns)], 1);
        add(&self.latency_ns[op], ns);
        if let Some(key) = done.sense_key {
            add(&self.check_conditions[usize::from(key & 0x0F)], 1);
        }
    }
}

/// A LUN's counters as plain numbers: one session's, or a sum.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LunSnapshot {
    pub commands: [u64; 3],
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub latency: [[u64; BUCKETS + 1]; 3],
    pub latency_ns: [u64; 3],
    pub check_conditions: [u64; 16],
}

impl LunSnapshot {
    /// Adds live counters.
    pub fn add_live(&mut self, live: &LunCounters) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for op in 0..3 {
            self.commands[op] += get(&live.commands[op]);
            self.latency_ns[op] += get(&live.latency_ns[op]);
            for (sum, c) in self.latency[op].iter_mut().zip(&live.latency[op]) {
                *sum += get(c);
            }
        }
        self.read_bytes += get(&live.read_bytes);
        self.written_bytes += get(&live.written_bytes);
        for (sum, c) in self.check_conditions.iter_mut().zip(&live.check_conditions) {
            *sum += get(c);
        }
    }

    /// Adds another snapshot.
    pub fn add(&mut self, other: &LunSnapshot) {
        for op in 0..3 {
            self.commands[op] += other.commands[op];
            self.latency_ns[op] += other.latency_ns[op];
            for (sum, c) in self.latency[op].iter_mut().zip(&other.latency[op]) {
                *sum += c;
            }
        }
        self.read_bytes += other.read_bytes;
        self.written_bytes += other.written_bytes;
        for (sum, c) in self
            .check_conditions
            .iter_mut()
            .zip(&other.check_conditions)
        {
            *sum += c;
        }
    }

    /// Commands of every op.
    pub fn all_commands(&self) -> u64 {
        self.commands.iter().sum()
    }
}

/// LUN numbers below this have a slot of their own (found with no lock);
/// the others, rare, share a map behind a mutex of the session's.
const DIRECT: usize = 256;

/// One session's counters per LUN, created at the first command to a LUN.
pub(crate) struct LunTable {
    direct: Box<[OnceLock<Box<LunCounters>>]>,
    far: Mutex<BTreeMap<u16, Arc<LunCounters>>>,
}

impl Default for LunTable {
    fn default() -> Self {
        LunTable {
            direct: (0..DIRECT).map(|_| OnceLock::new()).collect(),
            far: Mutex::default(),
        }
    }
}

impl LunTable {
    /// Counts a command to LUN `lun`.
    pub fn record(&self, lun: u16, done: &Completion) {
        match self.direct.get(usize::from(lun)) {
            Some(slot) => slot.get_or_init(Box::default).record(done),
            None => {
                let counters = Arc::clone(
                    self.far
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .entry(lun)
                        .or_default(),
                );
                counters.record(done);
            }
        }
    }

    /// Calls `f` with each LUN's counters, ascending.
    pub fn each(&self, mut f: impl FnMut(u16, &LunCounters)) {
        for (lun, slot) in (0u16..).zip(self.direct.iter()) {
            if let Some(counters) = slot.get() {
                f(lun, counters);
            }
        }
        let far: Vec<(u16, Arc<LunCounters>)> = self
            .far
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(&n, c)| (n, Arc::clone(c)))
            .collect();
        for (lun, counters) in far {
            f(lun, &counters);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_the_smallest_bound_at_or_above() {
        let bounds = bucket_bounds();
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(50_000), 0);
        assert_eq!(bucket_of(50_001), 1);
        assert_eq!(bucket_of(100_000), 1);
        assert_eq!(bucket_of(100_001), 2);
        for ns in [
            1u64,
            49_999,
            75_000,
            1_000_000,
            3_276_800_000,
            13_107_200_000,
        ] {
            let i = bucket_of(ns);
            let s = ns as f64 * 1e-9;
            assert!(s <= bounds[i] * (1.0 + 1e-12), "{ns} in bucket {i}");
            if i > 0 {
                assert!(s > bounds[i - 1], "{ns} in bucket {i}");
            }
        }
        assert_eq!(bucket_of(13_107_200_001), BUCKETS);
        assert_eq!(bucket_of(u64::MAX), BUCKETS);
    }

    #[test]
    fn a_table_sums_what_it_recorded() {
        let table = LunTable::default();
        let done = |op, read, written, key| Completion {
            op,
            read_bytes: read,
            written_bytes: written,
            sense_key: key,
            latency: Duration::from_micros(70),
        };
        table.record(1, &done(Op::Read, 4096, 0, None));
        table.record(1, &done(Op::Write, 0, 8192, None));
        table.record(1, &done(Op::Read, 0, 0, Some(5)));
        table.record(300, &done(Op::Other, 36, 0, None));
        let mut seen = Vec::new();
        table.each(|lun, c| {
            let mut s = LunSnapshot::default();
            s.add_live(c);
            seen.push((lun, s));
        });
        assert_eq!(seen.len(), 2);
        let (lun, one) = &seen[0];
        assert_eq!(*lun, 1);
        assert_eq!(one.commands, [2, 1, 0]);
        assert_eq!((one.read_bytes, one.written_bytes), (4096, 8192));
        assert_eq!(one.check_conditions[5], 1);
        assert_eq!(one.latency[0][1], 2);
        assert_eq!(one.latency_ns[0], 140_000);
        assert_eq!(seen[1].0, 300);
        assert_eq!(seen[1].1.commands, [0, 0, 1]);
    }
}
