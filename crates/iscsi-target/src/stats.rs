//! Per-session statistics: counters the data path bumps with relaxed
//! atomics, logged when a session ends.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one session.
#[derive(Debug, Default)]
pub(crate) struct SessionStats {
    /// SCSI commands completed (status sent or aborted).
    pub commands: AtomicU64,
    /// Bytes sent in Data-In.
    pub read_bytes: AtomicU64,
    /// Bytes received as immediate data and Data-Out.
    pub write_bytes: AtomicU64,
    /// Commands that ended in CHECK CONDITION or another non-GOOD status.
    pub errors: AtomicU64,
    /// R2Ts sent.
    pub r2ts: AtomicU64,
    /// Tasks aborted by task management or session end.
    pub aborts: AtomicU64,
    /// PDUs answered with a Reject.
    pub rejects: AtomicU64,
    /// SNACKs answered (ERL 1).
    pub snacks: AtomicU64,
    /// PDUs sent again in answer to SNACKs.
    pub resent: AtomicU64,
    /// Data-Out ranges asked for again after a data digest error (ERL 1).
    pub recovery_r2ts: AtomicU64,
    /// Tasks moved to another connection by TASK REASSIGN (ERL 2).
    pub reassigned: AtomicU64,
}

impl SessionStats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl SessionStats {
    /// Every counter by name, in a fixed order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("commands", get(&self.commands)),
            ("read_bytes", get(&self.read_bytes)),
            ("write_bytes", get(&self.write_bytes)),
            ("errors", get(&self.errors)),
            ("r2ts", get(&self.r2ts)),
            ("aborts", get(&self.aborts)),
            ("rejects", get(&self.rejects)),
            ("snacks", get(&self.snacks)),
            ("resent", get(&self.resent)),
            ("recovery_r2ts", get(&self.recovery_r2ts)),
            ("reassigned", get(&self.reassigned)),
        ]
    }
}

impl fmt::Display for SessionStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counters: Vec<String> = self
            .snapshot()
            .into_iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        f.write_str(&counters.join(" "))
    }
}
