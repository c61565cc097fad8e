//! Per-session statistics: counters the data path bumps with relaxed
//! atomics, logged when a session ends, shown by `status`, and summed by
//! the metrics endpoint (`metrics`). Only the session's own connections
//! write them: per-target figures are sums taken at scrape time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::counters::LunTable;

/// Who a session is, for the labels of its series.
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionLabels {
    /// TargetName (None for discovery).
    pub target: Option<String>,
    /// InitiatorName.
    pub initiator: String,
    /// TSIH.
    pub tsih: u16,
}

/// Task management functions counted apart (index = function code 1..=8;
/// 0 = any other code).
pub(crate) const TMF_FUNCTIONS: usize = 9;
/// Task management responses counted apart (0..=6 by code; 7 = "function
/// rejected", 255, or any other code).
pub(crate) const TMF_RESPONSES: usize = 8;

/// Counters of one session.
#[derive(Default)]
pub(crate) struct SessionStats {
    /// Whose counters these are.
    pub labels: SessionLabels,
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
    /// Rejects by reason code (index = code & 0x0f; codes above 0x0f, none
    /// assigned, at 0).
    pub rejects_by_reason: [AtomicU64; 16],
    /// PDUs whose header digest failed (each ends its connection, RFC 7143
    /// 7.8). Data digest errors are the Rejects with reason 0x02.
    pub header_digest_errors: AtomicU64,
    /// Task management requests answered, by function and response.
    pub task_management: [[AtomicU64; TMF_RESPONSES]; TMF_FUNCTIONS],
    /// Commands answered, bytes, latency and CHECK CONDITIONs, per LUN.
    pub luns: LunTable,
}

impl fmt::Debug for SessionStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionStats")
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

impl SessionStats {
    /// The counters of a new session.
    pub fn new(labels: SessionLabels) -> Self {
        SessionStats {
            labels,
            ..SessionStats::default()
        }
    }

    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a Reject sent with reason `code`.
    pub fn rejected(&self, code: u8) {
        Self::add(&self.rejects, 1);
        let slot = if code > 0x0F { 0 } else { code };
        Self::add(&self.rejects_by_reason[usize::from(slot)], 1);
    }

    /// Counts a task management response.
    pub fn task_management(&self, function: u8, response: u8) {
        let f = if (1..=8).contains(&function) {
            usize::from(function)
        } else {
            0
        };
        let r = if response <= 6 {
            usize::from(response)
        } else {
            TMF_RESPONSES - 1
        };
        Self::add(&self.task_management[f][r], 1);
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
