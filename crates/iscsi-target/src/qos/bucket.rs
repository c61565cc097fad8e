//! One limit's token bucket, as a virtual schedule (GCRA): the time at
//! which the bucket would be full again (`full_at`) is all it keeps. A
//! command costing `c` moves it `c / rate` later; the command may start
//! once the bucket, after paying, holds no debt: at `full_at - burst /
//! rate`. So a command never waits when the bucket had room, waits exactly
//! as long as the rate asks when it did not, and the waits of commands
//! queued behind each other add up in arrival order. Pure: the caller
//! passes the time (nanoseconds since the bucket's epoch).

/// A rate and a burst, in units (commands, or bytes) per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Units per second (at least 1).
    pub per_second: u64,
    /// Units the bucket holds: what may go at once after a quiet time.
    pub burst: u64,
}

const NANOS: u128 = 1_000_000_000;

impl Rate {
    /// Nanoseconds `units` take at this rate.
    fn nanos(&self, units: u64) -> u64 {
        let n = u128::from(units) * NANOS / u128::from(self.per_second.max(1));
        u64::try_from(n).unwrap_or(u64::MAX)
    }
}

/// One dimension of a limit (commands, or bytes) on its virtual schedule.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    rate: Rate,
    /// When the bucket is full again, in nanoseconds since the epoch.
    full_at: u64,
}

impl Schedule {
    /// A full bucket.
    pub fn new(rate: Rate) -> Self {
        Self { rate, full_at: 0 }
    }

    /// The rate now.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// How long a command costing `units` arriving at `now` would wait,
    /// in nanoseconds, without taking anything.
    pub fn wait(&self, now: u64, units: u64) -> u64 {
        self.paid(now, units)
            .saturating_sub(now.saturating_add(self.rate.nanos(self.rate.burst)))
    }

    /// Takes `units` at `now`: the command's wait in nanoseconds.
    pub fn take(&mut self, now: u64, units: u64) -> u64 {
        let wait = self.wait(now, units);
        self.full_at = self.paid(now, units);
        wait
    }

    fn paid(&self, now: u64, units: u64) -> u64 {
        self.full_at.max(now).saturating_add(self.rate.nanos(units))
    }

    /// A new rate from `now` on: the debt owed at the old rate is owed in
    /// units, so a raised limit lets the queue go faster at once and a
    /// lowered one slows it.
    pub fn set_rate(&mut self, now: u64, rate: Rate) {
        let owed = self.full_at.saturating_sub(now);
        let units = u128::from(owed) * u128::from(self.rate.per_second.max(1)) / NANOS;
        self.rate = rate;
        if owed > 0 {
            self.full_at = now.saturating_add(rate.nanos(u64::try_from(units).unwrap_or(u64::MAX)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_burst_goes_at_once_then_the_rate_spaces_commands() {
        // 1000 commands a second, 10 at once.
        let mut s = Schedule::new(Rate {
            per_second: 1000,
            burst: 10,
        });
        for _ in 0..10 {
            assert_eq!(s.take(0, 1), 0);
        }
        // The 11th waits one interval, the 12th two.
        assert_eq!(s.take(0, 1), MS);
        assert_eq!(s.take(0, 1), 2 * MS);
        // A quiet second fills the bucket again.
        assert_eq!(s.wait(2000 * MS, 10), 0);
        assert_eq!(s.wait(2000 * MS, 11), MS);
    }

    /// Over a long run at any queue depth the commands start at the rate:
    /// the n-th of a flood starts at (n - burst) / rate.
    #[test]
    fn a_flood_is_held_to_the_rate() {
        let mut s = Schedule::new(Rate {
            per_second: 2000,
            burst: 200,
        });
        let mut last = 0;
        for n in 0..10_000u64 {
            let now = n * 100_000 / 8; // 8 times the rate arrives
            let starts = now + s.take(now, 1);
            assert!(starts >= last);
            last = starts;
        }
        // 10 000 commands, 200 of them free: 9 800 at 0.5 ms.
        assert_eq!(last, 9_800 * 500_000);
    }

    #[test]
    fn bytes_cost_their_length() {
        let mut s = Schedule::new(Rate {
            per_second: 1 << 20,
            burst: 1 << 20,
        });
        assert_eq!(s.take(0, 1 << 20), 0);
        // Another MiB at once waits a second.
        assert_eq!(s.take(0, 1 << 20), 1_000_000_000);
        // A command larger than the bucket waits for what it lacks.
        let mut small = Schedule::new(Rate {
            per_second: 1 << 20,
            burst: 1 << 16,
        });
        assert_eq!(small.take(0, 1 << 20), 1_000_000_000 - 62_500_000);
    }

    #[test]
    fn a_raised_rate_pays_the_debt_faster() {
        let mut s = Schedule::new(Rate {
            per_second: 100,
            burst: 1,
        });
        for _ in 0..101 {
            s.take(0, 1);
        }
        // 100 commands owed at 10 ms: a second.
        assert_eq!(s.wait(0, 1), 1_010 * MS);
        s.set_rate(
            0,
            Rate {
                per_second: 1000,
                burst: 1,
            },
        );
        // The same 100 at 1 ms.
        assert_eq!(s.wait(0, 1), 101 * MS);
        assert_eq!(s.rate().per_second, 1000);
    }
}
