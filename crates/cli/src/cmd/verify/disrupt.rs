//! `iscsi verify --disrupt`: task management, a connection cut or a logout
//! issued again and again while the load runs, each timed from the moment
//! it is issued until everything it reached has ended, so that "ABORT TASK
//! SET never hangs" is a number (the worst time) rather than a hope. The
//! data is checked as always: a command a function ended may or may not
//! have written its slot (the slot allows both), an acknowledged write
//! must still be there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iscsi_initiator::{Error, Session};
use iscsi_proto::pdu::{TaskFunction, TaskResponse};

/// What `--disrupt` issues.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// ABORT TASK of the command in flight issued last (the one most
    /// likely still at the target when the function gets there).
    AbortTask,
    /// ABORT TASK SET of the LUN.
    AbortTaskSet,
    /// LOGICAL UNIT RESET.
    LunReset,
    /// TARGET WARM RESET.
    WarmReset,
    /// Every connection dropped as by a network failure: the session is
    /// reinstated and the commands sent again.
    Cut,
    /// One connection dropped (each in turn) as by a failure of its path:
    /// at ErrorRecoveryLevel 2 it is reinstated and its commands moved
    /// there with TASK REASSIGN while the others go on; below, the session
    /// is reinstated.
    CutOne,
    /// A logout with the commands in flight, then a new session.
    Logout,
}

impl Disruption {
    /// The task management function, for those that are one.
    pub fn function(self) -> Option<TaskFunction> {
        match self {
            Disruption::AbortTask => Some(TaskFunction::AbortTask),
            Disruption::AbortTaskSet => Some(TaskFunction::AbortTaskSet),
            Disruption::LunReset => Some(TaskFunction::LogicalUnitReset),
            Disruption::WarmReset => Some(TaskFunction::TargetWarmReset),
            Disruption::Cut | Disruption::CutOne | Disruption::Logout => None,
        }
    }
}

/// What the disruptions cost.
#[derive(Debug, Default, serde::Serialize)]
pub struct DisruptionReport {
    /// What was issued.
    pub disruption: String,
    /// How many were issued (and finished).
    pub issued: u64,
    /// ... of which the target answered "task does not exist" (ABORT TASK
    /// of a command that ended first).
    pub not_found: u64,
    /// The slowest, from issue until every command it reached had ended
    /// (for a cut: until the session carried a command again) (ms).
    pub worst_ms: f64,
    /// The median (ms).
    pub median_ms: f64,
    /// Commands ended by the disruption (Error::Aborted, or cut short by
    /// the logout), rather than by an error.
    pub ended_commands: u64,
    /// Disruptions that failed (timed out, refused), and the first error.
    pub failures: u64,
    pub first_failure: Option<String>,
    /// Commands still in flight once the run was over (must be none).
    pub left_in_flight: usize,
}

/// One disruption on `session`: how long it took, and whether the target
/// found nothing to abort.
pub async fn issue(
    disruption: Disruption,
    session: &Session,
    lun: u64,
    round: u64,
) -> Result<(Duration, bool), Error> {
    let started = Instant::now();
    let result = match disruption {
        Disruption::AbortTask => match session.commands_in_flight().last() {
            Some(youngest) => session.abort_task(youngest.itt).await,
            None => Err(Error::TaskManagement(TaskResponse::TaskDoesNotExist)),
        },
        Disruption::AbortTaskSet => session.abort_task_set(lun).await,
        Disruption::LunReset => session.lun_reset(lun).await,
        Disruption::WarmReset => {
            session
                .task_management(TaskFunction::TargetWarmReset, lun)
                .await
        }
        Disruption::Cut => {
            session.drop_connections();
            // Back when a command gets through again (the next command
            // reinstates the session; a reset's unit attention is retried).
            session.test_unit_ready(lun).await
        }
        Disruption::CutOne => {
            let connections = session.connection_count().max(1) as u64;
            session.drop_connection((round % connections) as u16);
            // Back when a command gets through again.
            session.test_unit_ready(lun).await
        }
        Disruption::Logout => session.logout().await,
    };
    match result {
        Ok(()) => Ok((started.elapsed(), false)),
        Err(Error::TaskManagement(TaskResponse::TaskDoesNotExist))
            if disruption == Disruption::AbortTask =>
        {
            Ok((started.elapsed(), true))
        }
        Err(error) => Err(error),
    }
}

/// Times of finished disruptions, and their failures, as the run goes.
#[derive(Debug, Default)]
pub struct Tally {
    times: Vec<Duration>,
    not_found: u64,
    failures: u64,
    first_failure: Option<String>,
}

impl Tally {
    /// Adds one disruption's outcome.
    pub fn add(&mut self, outcome: Result<(Duration, bool), Error>) {
        match outcome {
            Ok((took, not_found)) => {
                self.times.push(took);
                self.not_found += u64::from(not_found);
            }
            Err(error) => {
                self.failures += 1;
                self.first_failure.get_or_insert(error.to_string());
            }
        }
    }

    /// The report, with the commands the disruptions ended and those left.
    pub fn report(
        mut self,
        disruption: Disruption,
        ended_commands: u64,
        left_in_flight: usize,
    ) -> DisruptionReport {
        self.times.sort();
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        DisruptionReport {
            disruption: format!("{disruption:?}"),
            issued: self.times.len() as u64 + self.failures,
            not_found: self.not_found,
            worst_ms: self.times.last().map_or(0.0, ms),
            median_ms: self.times.get(self.times.len() / 2).map_or(0.0, ms),
            ended_commands,
            failures: self.failures,
            first_failure: self.first_failure,
            left_in_flight,
        }
    }
}

/// Whether a command's error is one `disruption` causes by design (the
/// command was ended by it), not a failure.
pub fn ended_by(disruption: Option<Disruption>, error: &Error) -> bool {
    match (disruption, error) {
        (Some(d), Error::Aborted(function)) => d.function() == Some(*function),
        (Some(Disruption::Logout), Error::SessionClosed | Error::ConnectionLost) => true,
        _ => false,
    }
}

/// Issues `disruption` every `interval` until `deadline`, on whatever
/// session `current` gives (a logout replaces it: `reconnect`).
pub async fn run<S, R, F>(
    disruption: Disruption,
    interval: Duration,
    deadline: Instant,
    lun: u64,
    current: S,
    reconnect: R,
) -> Tally
where
    S: Fn() -> Session,
    R: Fn() -> F,
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut tally = Tally::default();
    let mut round = 0;
    loop {
        tokio::time::sleep(interval).await;
        if Instant::now() >= deadline {
            return tally;
        }
        let session = current();
        tally.add(issue(disruption, &session, lun, round).await);
        round += 1;
        if disruption == Disruption::Logout
            && let Err(error) = reconnect().await
        {
            tally.failures += 1;
            tally
                .first_failure
                .get_or_insert(format!("logging in again: {error:#}"));
            return tally;
        }
    }
}

/// A session that a logout can replace under the load.
#[derive(Debug)]
pub struct Current {
    session: std::sync::RwLock<Session>,
    /// Bumped by each replacement, for those waiting for one.
    replaced: tokio::sync::watch::Sender<u64>,
}

impl Current {
    pub fn new(session: Session) -> Arc<Self> {
        Arc::new(Current {
            session: std::sync::RwLock::new(session),
            replaced: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The session now.
    pub fn get(&self) -> Session {
        self.session
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts `session` in the old one's place.
    pub fn replace(&self, session: Session) {
        *self
            .session
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = session;
        self.replaced.send_modify(|n| *n += 1);
    }

    /// How many times the session was replaced.
    pub fn generation(&self) -> u64 {
        *self.replaced.borrow()
    }

    /// Waits (at most `limit`) until the session has been replaced since
    /// `generation`, so that workers do not spin on a session a logout
    /// closed.
    pub async fn replaced_since(&self, generation: u64, limit: Duration) {
        let mut replaced = self.replaced.subscribe();
        let _ = tokio::time::timeout(limit, replaced.wait_for(|now| *now > generation)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_reports_worst_and_median_and_counts_failures() {
        let mut tally = Tally::default();
        for ms in [30, 10, 20] {
            tally.add(Ok((Duration::from_millis(ms), ms == 10)));
        }
        tally.add(Err(Error::ConnectionLost));
        let report = tally.report(Disruption::AbortTask, 4, 0);
        assert_eq!(
            (report.issued, report.not_found, report.failures),
            (4, 1, 1)
        );
        assert_eq!((report.worst_ms, report.median_ms), (30.0, 20.0));
        assert_eq!(report.first_failure.as_deref(), Some("connection lost"));
    }

    #[test]
    fn only_the_disruptions_own_endings_are_not_failures() {
        let aborted = Error::Aborted(TaskFunction::AbortTaskSet);
        assert!(ended_by(Some(Disruption::AbortTaskSet), &aborted));
        assert!(!ended_by(Some(Disruption::LunReset), &aborted));
        assert!(!ended_by(None, &aborted));
        assert!(ended_by(Some(Disruption::Logout), &Error::SessionClosed));
        assert!(!ended_by(Some(Disruption::Cut), &Error::ConnectionLost));
    }
}
