//! What the target counts for Prometheus (`iscsi target --metrics
//! ADDR:PORT`) and for `status`: the counters the data path bumps. Summing
//! and serving them at scrape time is the exporter's (`exporter/`), which stands
//! above the server; this room stands below every connection that counts.
//!
//! - `stats`: per-session statistics (commands, bytes, digest errors, task
//!   management), logged when a session ends and shown by `status`.
//! - `counters`: per session per LUN counters and the latency histogram,
//!   written by that session's connections only.
//! - [`Metrics`] (here): the sessions being counted, the totals of those
//!   that ended ("retired", so that a `_total` never goes backwards when a
//!   session leaves), logins and reloads.
//!
//! Nothing here is on the I/O path but the relaxed atomics of `counters`
//! and of `stats::SessionStats`: no lock, no hash, no label lookup per
//! command (no `Family::get_or_create`).

pub(crate) mod counters;
pub(crate) mod stats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use counters::LunSnapshot;
use stats::{SessionStats, TMF_FUNCTIONS, TMF_RESPONSES};

/// Login outcomes, the LIO / iSCSI MIB (RFC 4544 `iscsiTgtLoginStats`)
/// taxonomy that Windows' `MSiSCSI_InitiatorLoginStatistics` uses too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoginResult {
    Accept = 0,
    Redirect = 1,
    AuthorizeFail = 2,
    AuthenticateFail = 3,
    NegotiateFail = 4,
    OtherFail = 5,
}

impl LoginResult {
    /// Every result, in label order.
    pub const ALL: [LoginResult; 6] = [
        LoginResult::Accept,
        LoginResult::Redirect,
        LoginResult::AuthorizeFail,
        LoginResult::AuthenticateFail,
        LoginResult::NegotiateFail,
        LoginResult::OtherFail,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            LoginResult::Accept => "accept",
            LoginResult::Redirect => "redirect",
            LoginResult::AuthorizeFail => "authorize_fail",
            LoginResult::AuthenticateFail => "authenticate_fail",
            LoginResult::NegotiateFail => "negotiate_fail",
            LoginResult::OtherFail => "other_fail",
        }
    }

    /// The result a Login Response's Status-Class and Status-Detail (RFC
    /// 7143 11.13.5) stand for, as LIO's `iscsi_login_stats` counts them:
    /// 02/01 (authentication failure) is `authenticate_fail`, 02/02
    /// (forbidden) `authorize_fail`, 02/00 (initiator error) and, beyond
    /// LIO, the other errors about what was negotiated (02/05 unsupported
    /// version, 02/07 missing parameter, 02/0B invalid during login)
    /// `negotiate_fail`; "not found", "removed", too many connections,
    /// no such session and target errors (class 3) `other_fail`.
    pub fn of_status(class: u8, detail: u8) -> LoginResult {
        match (class, detail) {
            (0, _) => LoginResult::Accept,
            (1, _) => LoginResult::Redirect,
            (2, 0x01) => LoginResult::AuthenticateFail,
            (2, 0x02) => LoginResult::AuthorizeFail,
            (2, 0x00 | 0x05 | 0x07 | 0x0B) => LoginResult::NegotiateFail,
            _ => LoginResult::OtherFail,
        }
    }
}

/// Session-wide counters as plain numbers (one session's, or a sum).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SessionTotals {
    pub r2ts: u64,
    pub aborts: u64,
    pub snacks: u64,
    pub resent: u64,
    pub recovery_r2ts: u64,
    pub reassigned: u64,
    pub header_digest_errors: u64,
    pub rejects_by_reason: [u64; 16],
    pub task_management: [[u64; TMF_RESPONSES]; TMF_FUNCTIONS],
}

impl SessionTotals {
    /// Adds a live session's counters.
    pub fn add_live(&mut self, s: &SessionStats) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.r2ts += get(&s.r2ts);
        self.aborts += get(&s.aborts);
        self.snacks += get(&s.snacks);
        self.resent += get(&s.resent);
        self.recovery_r2ts += get(&s.recovery_r2ts);
        self.reassigned += get(&s.reassigned);
        self.header_digest_errors += get(&s.header_digest_errors);
        for (sum, c) in self.rejects_by_reason.iter_mut().zip(&s.rejects_by_reason) {
            *sum += get(c);
        }
        for (row, live) in self.task_management.iter_mut().zip(&s.task_management) {
            for (sum, c) in row.iter_mut().zip(live) {
                *sum += get(c);
            }
        }
    }
}

/// The sessions being counted and what ended sessions left.
#[derive(Default)]
struct Tally {
    next_id: u64,
    /// Sessions whose counters are live, by enrollment number.
    live: HashMap<u64, Arc<SessionStats>>,
    /// Totals of the sessions that ended, by target.
    retired_targets: HashMap<String, SessionTotals>,
    /// Totals of the sessions that ended, by target and LUN.
    retired_luns: HashMap<(String, u16), LunSnapshot>,
}

/// What one scrape (or `status`) sees: every counter summed, by target
/// and by target and LUN, and each live session's own figures.
#[derive(Default)]
pub(crate) struct Sums {
    pub targets: HashMap<String, SessionTotals>,
    pub luns: HashMap<(String, u16), LunSnapshot>,
    /// Live sessions of a target, with their per-LUN sums (for the opt-in
    /// per-session series).
    pub sessions: Vec<(Arc<SessionStats>, LunSnapshot)>,
}

/// The target's metrics: shared by every connection (`Shared::metrics`).
#[derive(Default)]
pub(crate) struct Metrics {
    tally: Mutex<Tally>,
    /// Logins by [`LoginResult`]: written once per login, not per command.
    logins: [AtomicU64; 6],
    /// Reloads that succeeded and that failed.
    reloads: [AtomicU64; 2],
    /// When the last reload succeeded (seconds since the epoch), 0 if none.
    last_reload_ok: AtomicU64,
    /// Whether the last reload succeeded (1 until one fails).
    last_reload_failed: AtomicBool,
    /// `--metrics-sessions`: series per session too.
    pub per_session: AtomicBool,
}

impl Metrics {
    fn lock(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts counting a session: its counters are summed while the
    /// returned guard lives, and folded into the retired totals when it is
    /// dropped (with the session).
    pub fn enroll(self: &Arc<Self>, stats: SessionStats) -> Enrolled {
        let stats = Arc::new(stats);
        let mut tally = self.lock();
        let id = tally.next_id;
        tally.next_id += 1;
        tally.live.insert(id, Arc::clone(&stats));
        Enrolled {
            hub: Arc::clone(self),
            id,
            stats,
        }
    }

    /// Counts a login's outcome.
    pub fn login(&self, result: LoginResult) {
        self.logins[result as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Logins by result.
    pub fn logins(&self) -> [u64; 6] {
        std::array::from_fn(|i| self.logins[i].load(Ordering::Relaxed))
    }

    /// Counts a reload's outcome.
    pub fn reloaded(&self, ok: bool) {
        self.reloads[usize::from(!ok)].fetch_add(1, Ordering::Relaxed);
        self.last_reload_failed.store(!ok, Ordering::Relaxed);
        if ok {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            self.last_reload_ok.store(now, Ordering::Relaxed);
        }
    }

    /// Reloads that succeeded, that failed; when the last success was
    /// (seconds since the epoch, 0: never); whether the last one succeeded.
    pub fn reloads(&self) -> (u64, u64, u64, bool) {
        (
            self.reloads[0].load(Ordering::Relaxed),
            self.reloads[1].load(Ordering::Relaxed),
            self.last_reload_ok.load(Ordering::Relaxed),
            !self.last_reload_failed.load(Ordering::Relaxed),
        )
    }

    /// Every counter summed now, for the targets and LUNs `config` serves.
    pub fn sums_for(&self, config: &crate::config::TargetConfig) -> Sums {
        self.sums(|target, lun| {
            config
                .targets
                .iter()
                .any(|t| t.name == target && lun.is_none_or(|lun| t.luns.contains_key(&lun)))
        })
    }

    /// Every counter summed now. `keep(target, lun)` says which targets
    /// and LUNs still exist (`lun` None: the target itself): the retired
    /// totals of the others are forgotten, so that their series
    /// disappear. Under the tally's lock, so that a session ending
    /// meanwhile is counted once, live or retired.
    pub fn sums(&self, keep: impl Fn(&str, Option<u16>) -> bool) -> Sums {
        let mut tally = self.lock();
        tally.retired_targets.retain(|t, _| keep(t, None));
        tally.retired_luns.retain(|(t, l), _| keep(t, Some(*l)));
        let mut sums = Sums {
            targets: tally.retired_targets.clone(),
            luns: tally.retired_luns.clone(),
            sessions: Vec::new(),
        };
        for stats in tally.live.values() {
            let Some(target) = &stats.labels.target else {
                continue;
            };
            sums.targets
                .entry(target.clone())
                .or_default()
                .add_live(stats);
            let mut own = LunSnapshot::default();
            stats.luns.each(|lun, counters| {
                let mut one = LunSnapshot::default();
                one.add_live(counters);
                own.add(&one);
                sums.luns
                    .entry((target.clone(), lun))
                    .or_default()
                    .add(&one);
            });
            sums.sessions.push((Arc::clone(stats), own));
        }
        sums.sessions.sort_by_key(|(s, _)| s.labels.tsih);
        sums
    }
}

/// A session's counters, enrolled in [`Metrics`]: reads as the
/// [`SessionStats`] it holds; dropped with the session, it folds them
/// into the retired totals.
pub(crate) struct Enrolled {
    hub: Arc<Metrics>,
    id: u64,
    stats: Arc<SessionStats>,
}

impl std::ops::Deref for Enrolled {
    type Target = SessionStats;

    fn deref(&self) -> &SessionStats {
        &self.stats
    }
}

impl Drop for Enrolled {
    fn drop(&mut self) {
        let mut tally = self.hub.lock();
        tally.live.remove(&self.id);
        let Some(target) = self.stats.labels.target.clone() else {
            return;
        };
        tally
            .retired_targets
            .entry(target.clone())
            .or_default()
            .add_live(&self.stats);
        self.stats.luns.each(|lun, counters| {
            tally
                .retired_luns
                .entry((target.clone(), lun))
                .or_default()
                .add_live(counters);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::counters::{Completion, Op};
    use crate::metrics::stats::SessionLabels;

    fn session(hub: &Arc<Metrics>, target: &str, tsih: u16) -> Enrolled {
        hub.enroll(SessionStats::new(SessionLabels {
            target: Some(target.to_owned()),
            initiator: "iqn.i".to_owned(),
            tsih,
        }))
    }

    fn read(bytes: u64) -> Completion {
        Completion {
            op: Op::Read,
            read_bytes: bytes,
            written_bytes: 0,
            sense_key: None,
            latency: std::time::Duration::from_micros(10),
        }
    }

    #[test]
    fn an_ended_session_leaves_its_counts_behind() {
        let hub = Arc::new(Metrics::default());
        let a = session(&hub, "t", 1);
        let b = session(&hub, "t", 2);
        a.luns.record(0, &read(512));
        b.luns.record(0, &read(1024));
        a.rejected(2);
        let all = |_: &str, _: Option<u16>| true;
        let before = hub.sums(all).luns[&("t".to_owned(), 0)].clone();
        assert_eq!(before.read_bytes, 1536);
        drop(a);
        let after = hub.sums(all);
        assert_eq!(after.luns[&("t".to_owned(), 0)], before);
        assert_eq!(after.targets["t"].rejects_by_reason[2], 1);
        assert_eq!(after.sessions.len(), 1);
        // A LUN that is gone takes its retired totals with it; a live
        // session's counts for it are still summed (and not shown).
        drop(b);
        let gone = hub.sums(|_, lun| lun.is_none());
        assert!(gone.luns.is_empty());
        assert_eq!(gone.targets["t"].rejects_by_reason[2], 1);
    }

    #[test]
    fn login_results_follow_the_mib() {
        assert_eq!(LoginResult::of_status(0, 0), LoginResult::Accept);
        assert_eq!(LoginResult::of_status(2, 1), LoginResult::AuthenticateFail);
        assert_eq!(LoginResult::of_status(2, 2), LoginResult::AuthorizeFail);
        assert_eq!(LoginResult::of_status(2, 3), LoginResult::OtherFail);
        assert_eq!(LoginResult::of_status(2, 7), LoginResult::NegotiateFail);
        assert_eq!(LoginResult::of_status(3, 1), LoginResult::OtherFail);
    }
}
