//! The running sessions: the one table that logins, status, `logout`, a
//! reload and PREEMPT AND ABORT all ask.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::session::Session;

/// A session, as a reload plan and `status` name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRef {
    /// TSIH.
    pub tsih: u16,
    /// InitiatorName.
    pub initiator: String,
    /// ISID, 12 hex digits.
    pub isid: String,
}

impl fmt::Display for SessionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "session {} ({}, ISID {})",
            self.tsih, self.initiator, self.isid
        )
    }
}

/// A running session and what it uses: what a reload plan asks of the
/// registry.
#[derive(Clone, Debug)]
pub struct SessionUse {
    /// The session.
    pub session: SessionRef,
    /// The target it is logged in to (`None`: discovery).
    pub target: Option<String>,
    /// The LUNs it has sent commands to.
    pub luns: Vec<u16>,
}

/// The running sessions, by TSIH.
#[derive(Default)]
pub(crate) struct Registry {
    sessions: Mutex<HashMap<u16, Arc<Session>>>,
    /// Sessions that ended while some of their tasks were still at the
    /// store (a write on the blocking pool cannot be called back): kept
    /// until those are over, so that a new login of the same I_T nexus
    /// waits for them ([`Registry::of_nexus`]).
    draining: Mutex<Vec<Arc<Session>>>,
}

impl Registry {
    /// Keeps an ended `session` while any of its tasks is still running;
    /// whether it did. The caller forgets it once they are over
    /// ([`Registry::prune`]).
    pub fn drain(&self, session: &Arc<Session>) -> bool {
        let mut draining = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        draining.retain(|s| s.has_live_tasks());
        let kept = session.has_live_tasks();
        if kept && !draining.iter().any(|s| Arc::ptr_eq(s, session)) {
            draining.push(Arc::clone(session));
        }
        kept
    }

    /// Forgets the ended sessions whose tasks are all over: nothing else
    /// would until the next login, and a session kept holds its buffers
    /// and its metrics series.
    pub fn prune(&self) {
        let mut draining = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        draining.retain(|s| s.has_live_tasks());
    }

    /// The sessions of the I_T nexus of `initiator`, `isid` and `target`:
    /// the running one a new leading login reinstates, and any that ended
    /// with tasks still running. Their writes must be over before the new
    /// session's run, or one of them could land after a write the new
    /// session had acknowledged.
    pub fn of_nexus(
        &self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
    ) -> Vec<Arc<Session>> {
        let same = |s: &Arc<Session>| {
            s.initiator_name == initiator && s.isid == isid && s.target_name.as_deref() == target
        };
        let mut found: Vec<Arc<Session>> =
            self.lock().values().filter(|s| same(s)).cloned().collect();
        let mut draining = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        draining.retain(|s| s.has_live_tasks());
        found.extend(draining.iter().filter(|s| same(s)).cloned());
        found
    }

    /// The session with this TSIH.
    pub fn get(&self, tsih: u16) -> Option<Arc<Session>> {
        self.lock().get(&tsih).cloned()
    }

    /// Whether a TSIH is in use.
    pub fn contains(&self, tsih: u16) -> bool {
        self.lock().contains_key(&tsih)
    }

    /// Every session logged in to `target_name`.
    pub fn of_target(&self, target_name: &str) -> Vec<Arc<Session>> {
        self.lock()
            .values()
            .filter(|s| s.target_name.as_deref() == Some(target_name))
            .cloned()
            .collect()
    }

    /// Every session, by TSIH.
    pub fn all(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<Arc<Session>> = self.lock().values().cloned().collect();
        all.sort_by_key(|s| s.tsih);
        all
    }

    /// What each session uses, for a reload's plan.
    pub fn usage(&self) -> Vec<SessionUse> {
        self.all()
            .iter()
            .map(|s| SessionUse {
                session: s.about(),
                target: s.target_name.clone(),
                luns: s.luns_used.numbers(),
            })
            .collect()
    }

    /// Adds a session whose leading login completed; returns the sessions
    /// it reinstates.
    pub fn insert(&self, session: Arc<Session>) -> Vec<Arc<Session>> {
        let mut sessions = self.lock();
        // Session reinstatement (RFC 7143 6.3.5): a new session with the
        // same initiator name, ISID and target replaces the old one.
        let replaced: Vec<u16> = sessions
            .values()
            .filter(|s| {
                s.initiator_name == session.initiator_name
                    && s.isid == session.isid
                    && s.target_name == session.target_name
            })
            .map(|s| s.tsih)
            .collect();
        let old = replaced
            .iter()
            .filter_map(|tsih| sessions.remove(tsih))
            .collect();
        sessions.insert(session.tsih, session);
        old
    }

    /// Removes `session`, unless a later session has its TSIH.
    pub fn remove(&self, session: &Session) {
        let mut sessions = self.lock();
        if sessions
            .get(&session.tsih)
            .is_some_and(|s| std::ptr::eq(Arc::as_ptr(s), session))
        {
            sessions.remove(&session.tsih);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Session {
    /// The session as a plan or a log line names it.
    pub fn about(&self) -> SessionRef {
        SessionRef {
            tsih: self.tsih,
            initiator: self.initiator_name.clone(),
            isid: self.isid.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}
