//! Bugs planted on purpose, to prove the simulator's oracles can fail
//! (`crates/sim`, `scripts/sim --bug NAME`): each is a one-line mistake of
//! a kind that has cost storage targets data or hangs. They exist only in
//! a build with the `planted` feature (the simulator's own, never a
//! release), and then only the one a run switches on is active; without
//! the feature [`active`] is a constant `false` and every planted branch
//! compiles away.

/// A planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Bug {
    /// No bug.
    None = 0,
    /// A command whose Initiator Task Tag a live task holds is accepted
    /// (RFC 7143 says: Reject).
    DuplicateTagAccepted = 1,
    /// A failed write's status goes out when any of its outstanding
    /// sequences ends, before the last of its Data-Out is in (7.8).
    StatusBeforeLastDataOut = 2,
    /// A write runs once its last R2T is sent and one is left awaiting
    /// data: acknowledged before all of it is stored.
    WriteBeforeAllData = 3,
    /// Ranges lost to a data digest error are never asked for again: the
    /// recovery R2T is never sent.
    RecoveryR2tNeverSent = 4,
    /// ABORT TASK ends the task but leaves its write collecting data: it
    /// runs and answers after the function's response.
    AbortLeavesWriteRunning = 5,
    /// A status that should advance StatSN does not, every 64th time.
    StatSnNotAdvanced = 6,
    /// A read's status rides on its first Data-In instead of its last
    /// (phase collapse, RFC 7143 11.7.3): the task ends before its data.
    StatusBeforeLastDataIn = 7,
    /// ABORT TASK SET also ends the command numbered as the function
    /// itself: one the initiator sent after it, and waits for.
    AbortSetTakesALaterCommand = 8,
    /// A new session of an I_T nexus runs while a write of the session it
    /// replaces is still at the store.
    NewSessionBesideOldWrites = 9,
}

impl Bug {
    /// Every planted bug, by the name `scripts/sim --bug` takes.
    pub const ALL: [(Bug, &'static str); 9] = [
        (Bug::DuplicateTagAccepted, "duplicate-tag-accepted"),
        (Bug::StatusBeforeLastDataOut, "status-before-last-data-out"),
        (Bug::WriteBeforeAllData, "write-before-all-data"),
        (Bug::RecoveryR2tNeverSent, "recovery-r2t-never-sent"),
        (Bug::AbortLeavesWriteRunning, "abort-leaves-write-running"),
        (Bug::StatSnNotAdvanced, "stat-sn-not-advanced"),
        (Bug::StatusBeforeLastDataIn, "status-before-last-data-in"),
        (
            Bug::AbortSetTakesALaterCommand,
            "abort-set-takes-a-later-command",
        ),
        (
            Bug::NewSessionBesideOldWrites,
            "new-session-beside-old-writes",
        ),
    ];

    /// The bug named `name`.
    pub fn named(name: &str) -> Option<Bug> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(b, _)| *b)
    }
}

#[cfg(feature = "planted")]
static ACTIVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Switches `bug` on (and any other off). Only in a `planted` build.
#[cfg(feature = "planted")]
pub fn activate(bug: Bug) {
    ACTIVE.store(bug as u8, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `bug` is switched on.
#[inline(always)]
pub fn active(bug: Bug) -> bool {
    #[cfg(feature = "planted")]
    {
        ACTIVE.load(std::sync::atomic::Ordering::Relaxed) == bug as u8
    }
    #[cfg(not(feature = "planted"))]
    {
        let _ = bug;
        false
    }
}
