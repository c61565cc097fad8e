//! [`Multipath`]: one LU reached through several sessions (one per portal
//! or gateway), as Linux's dm-multipath with the ALUA device handler
//! reaches it over open-iscsi, in the library.
//!
//! - **One LU.** Every path must reach the same LU: the LU designator of
//!   its Device Identification page (NAA, [`alua::PathIdentity`]) must be
//!   the first path's. A URL that reaches another LU is refused; a path
//!   that logs in later (its gateway was down at the start) joins only if
//!   it matches.
//! - **Which path.** Where the LU reports asymmetric access (TPGS),
//!   REPORT TARGET PORT GROUPS is read through each path at the start and
//!   again whenever a path refuses a command as standby, unavailable or
//!   transitioning (NOT READY 04h/0Bh, 0Ch, 0Ah), reports ASYMMETRIC ACCESS
//!   STATE CHANGED (2Ah/06h) or fails. I/O goes to an active/optimized
//!   path (else an active/non-optimized one), the same one while it lasts,
//!   so that writes keep their order at one port. An LU without ALUA has
//!   every path active and I/O stays on the first that works.
//! - **When none will do** (every path failed, or all standby while a
//!   gateway takes the LU over) commands wait, reading the states again
//!   every [`MultipathConfig::poll_interval`] and trying failed paths'
//!   logins, for up to [`MultipathConfig::no_path_timeout`]; then they
//!   fail with [`Error::NoPath`].
//! - **A lost path** (its connection dropped, a command unanswered, its
//!   NOP-Out ping unanswered for [`MultipathConfig::ping_timeout`]) is
//!   failed: its commands end at once and go again on the next path by the
//!   rule of [`alua::Resend`] (reads and writes yes, COMPARE AND WRITE and
//!   reservations no). A checker task pings every live path (and reads
//!   its state again) and tries a login on every failed one each
//!   [`MultipathConfig::check_interval`], so a gateway that returns is
//!   used again, and I/O goes back to an active/optimized path that
//!   appears while it is on a worse one.
//!
//! A set of one path ([`Multipath::single`]) is a plain session: no
//! checker, the session's own recovery and timeouts, and only the waiting
//! out of an ALUA transition added.

pub mod alua;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::SessionConfig;
use crate::error::Error;
use crate::session::Session;
use crate::url::IscsiUrl;
use alua::{Access, Failure, PathIdentity, Resend};

/// How a multipath set waits and checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultipathConfig {
    /// How long a command waits for a path that takes it before it fails:
    /// what dm-multipath's `no_path_retry` queueing is for a disk. Longer
    /// than a gateway group's takeover (about 3.5 s) with a wide margin.
    pub no_path_timeout: Duration,
    /// How often the checker pings live paths and tries failed ones.
    pub check_interval: Duration,
    /// A live path whose NOP-In takes longer than this is failed (a hung
    /// or stopped gateway keeps its TCP connection up).
    pub ping_timeout: Duration,
    /// Between two readings of the states while no path takes I/O.
    pub poll_interval: Duration,
}

impl Default for MultipathConfig {
    fn default() -> Self {
        MultipathConfig {
            no_path_timeout: Duration::from_secs(30),
            check_interval: Duration::from_secs(1),
            ping_timeout: Duration::from_secs(2),
            poll_interval: Duration::from_millis(100),
        }
    }
}

/// One path as [`Multipath::paths`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathStatus {
    /// The path's URL.
    pub url: String,
    /// Its asymmetric access state as last read.
    pub access: Access,
    /// Why it is failed, if it is.
    pub failed: Option<String>,
    /// Whether I/O goes to it now.
    pub current: bool,
}

/// "URL: Optimized, current", "URL: failed (connection lost)".
impl std::fmt::Display for PathStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", self.url)?;
        match &self.failed {
            Some(why) => write!(f, "failed ({why})")?,
            None => write!(f, "{:?}", self.access)?,
        }
        if self.current {
            write!(f, ", current")?;
        }
        Ok(())
    }
}

/// A path: a URL, its session once logged in, and what is known of it.
struct Path {
    url: IscsiUrl,
    state: Mutex<PathState>,
    /// The checker is at work on it.
    checking: AtomicBool,
}

struct PathState {
    session: Option<Arc<Session>>,
    identity: PathIdentity,
    access: Access,
    /// Why the path is failed; `None` while it works.
    failed: Option<String>,
    /// The session's [`Session::access_changes`] when last seen.
    access_changes: u64,
}

impl Path {
    fn new(
        url: IscsiUrl,
        session: Option<Arc<Session>>,
        access: Access,
        failed: Option<String>,
        access_changes: u64,
    ) -> Path {
        Path {
            url,
            checking: AtomicBool::new(false),
            state: Mutex::new(PathState {
                session,
                identity: PathIdentity::default(),
                access,
                failed,
                access_changes,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PathState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its session, if it may take I/O now.
    fn usable(&self) -> Option<Arc<Session>> {
        let state = self.lock();
        match (&state.session, &state.failed) {
            (Some(session), None) if state.access.preference() > 0 => Some(Arc::clone(session)),
            _ => None,
        }
    }

    fn fail(&self, why: String) -> bool {
        let mut state = self.lock();
        let newly = state.failed.is_none();
        if newly {
            tracing::warn!(url = %self.url, %why, "path failed");
        }
        state.failed = Some(why);
        newly
    }
}

/// No path chosen.
const NONE: usize = usize::MAX;

struct Shared {
    paths: Vec<Path>,
    /// The LU's designator, from the first path that logged in.
    lu: Mutex<Option<(u8, Vec<u8>)>>,
    /// The LU reports asymmetric access (TPGS in standard INQUIRY).
    alua: AtomicBool,
    config: MultipathConfig,
    /// Each path's session configuration.
    session_config: SessionConfig,
    /// The index of the path I/O goes to, or [`NONE`].
    current: AtomicUsize,
    /// Held while the paths' states are read again, so that the commands
    /// that found the current path gone read them once, not each; it holds
    /// when they were last read.
    choosing: tokio::sync::Mutex<Option<Instant>>,
}

/// An LU through several paths. See the module doc.
pub struct Multipath {
    shared: Arc<Shared>,
    checker: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Multipath {
    fn drop(&mut self) {
        if let Some(checker) = self.checker.take() {
            checker.abort();
        }
    }
}

impl Multipath {
    /// A set of one path over a session already logged in.
    pub fn single(session: Arc<Session>, lun: u64) -> Multipath {
        let url = session.url(lun);
        let session_config = session.config().clone();
        let access_changes = session.access_changes();
        let path = Path::new(url, Some(session), Access::Active, None, access_changes);
        Multipath {
            shared: Shared::new(vec![path], MultipathConfig::default(), session_config, 0),
            checker: None,
        }
    }

    /// Logs in to every URL (each names the LU through one portal) and
    /// checks that they reach one LU. At least one must log in; the others
    /// are failed paths the checker keeps trying. Each path's session
    /// fails a command at once when its connection is lost (no retries,
    /// one login attempt, logins bounded to 5 s): moving it to another
    /// path is this set's business.
    pub async fn connect(
        urls: &[IscsiUrl],
        config: SessionConfig,
        multipath: MultipathConfig,
    ) -> Result<Multipath, Error> {
        if urls.is_empty() {
            return Err(Error::Config("multipath: no URL".into()));
        }
        let mut session_config = config;
        if urls.len() > 1 {
            session_config.command_retries = 0;
            session_config.reconnect_attempts = 1;
            session_config.replacement_timeout = None;
            let bound = Duration::from_secs(5);
            session_config.timeouts.connect = session_config.timeouts.connect.min(bound);
            session_config.timeouts.login = session_config.timeouts.login.min(bound);
        }
        let paths = urls
            .iter()
            .map(|url| {
                let why = Some("not logged in yet".to_owned());
                Path::new(url.clone(), None, Access::Unavailable, why, 0)
            })
            .collect();
        let shared = Shared::new(paths, multipath, session_config, NONE);
        let mut first_error = None;
        for index in 0..shared.paths.len() {
            if let Err(error) = shared.probe(index).await {
                if matches!(error, Error::Config(_)) {
                    return Err(error);
                }
                first_error.get_or_insert(error);
            }
        }
        if shared.lu_known().is_none() {
            return Err(first_error.unwrap_or(Error::ConnectionLost));
        }
        let checker =
            (shared.paths.len() > 1).then(|| tokio::spawn(check_paths(Arc::downgrade(&shared))));
        Ok(Multipath { shared, checker })
    }

    /// Runs `op` on the session and LUN of a path that takes I/O, and again
    /// on another (or the same, once it takes I/O again) when the path
    /// refused it by its access state or, for [`Resend::Idempotent`]
    /// commands, broke under it. Every other failure is the LU's answer and
    /// returned as it is.
    pub async fn run<T, F, Fut>(&self, resend: Resend, op: F) -> Result<T, Error>
    where
        F: Fn(Arc<Session>, u64) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let shared = &self.shared;
        let mut waiting: Option<Instant> = None;
        loop {
            let (index, session) = shared.usable(&mut waiting).await?;
            let path = &shared.paths[index];
            let result = op(Arc::clone(&session), path.url.lun).await;
            shared.note_access_changes(index, &session);
            let error = match result {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            match alua::classify(&error) {
                Failure::Answer => return Err(error),
                Failure::NotHere(access) => {
                    tracing::debug!(url = %path.url, ?access, "path refused a command by its state");
                    path.lock().access = access;
                    shared.forget(index);
                }
                Failure::PathLost if shared.paths.len() == 1 => return Err(error),
                Failure::PathLost => {
                    path.fail(error.to_string());
                    shared.forget(index);
                    if resend == Resend::Once {
                        return Err(error);
                    }
                }
            }
            // Moved from path to path for as long as a command may wait for
            // one, then failed: a target whose RTPG says active/optimized
            // where its commands say standby must not hold it forever.
            let since = *waiting.get_or_insert_with(Instant::now);
            if since.elapsed() >= shared.config.no_path_timeout {
                return Err(error);
            }
        }
    }

    /// The LUN number through the first path (each path's URL names its
    /// own; they are the same LU, usually the same number).
    pub fn lun(&self) -> u64 {
        self.shared.paths[0].url.lun
    }

    /// The paths and what is known of each.
    pub fn paths(&self) -> Vec<PathStatus> {
        self.shared.statuses()
    }

    /// The sessions of the paths logged in now.
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        self.shared
            .paths
            .iter()
            .filter_map(|path| path.lock().session.clone())
            .collect()
    }

    /// The session I/O goes to now (the first logged in, if none is
    /// chosen).
    pub fn session(&self) -> Option<Arc<Session>> {
        let current = self.shared.current.load(Ordering::Acquire);
        self.shared
            .paths
            .get(current)
            .and_then(|path| path.lock().session.clone())
            .or_else(|| self.sessions().into_iter().next())
    }

    /// Logs every path's session out. A failed path's session is closed
    /// with no more than a try (its portal may be gone for good); the first
    /// failure of a working path's logout is returned once all have been
    /// tried.
    pub async fn logout(&self) -> Result<(), Error> {
        if let Some(checker) = &self.checker {
            checker.abort();
        }
        let mut result = Ok(());
        for path in &self.shared.paths {
            let (session, failed) = {
                let state = path.lock();
                (state.session.clone(), state.failed.is_some())
            };
            let Some(session) = session else { continue };
            match session.logout().await {
                Err(error) if failed => {
                    tracing::debug!(url = %path.url, %error, "logout of a failed path");
                }
                Err(error) if result.is_ok() => result = Err(error),
                _ => {}
            }
        }
        result
    }
}

impl Shared {
    fn new(
        paths: Vec<Path>,
        config: MultipathConfig,
        session_config: SessionConfig,
        current: usize,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            paths,
            lu: Mutex::new(None),
            alua: AtomicBool::new(false),
            config,
            session_config,
            current: AtomicUsize::new(current),
            choosing: tokio::sync::Mutex::new(None),
        })
    }

    /// Each path and what is known of it.
    fn statuses(&self) -> Vec<PathStatus> {
        let current = self.current.load(Ordering::Acquire);
        self.paths
            .iter()
            .enumerate()
            .map(|(index, path)| {
                let state = path.lock();
                PathStatus {
                    url: path.url.to_string(),
                    access: state.access,
                    failed: state.failed.clone(),
                    current: index == current,
                }
            })
            .collect()
    }

    fn lu_known(&self) -> Option<(u8, Vec<u8>)> {
        self.lu
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops sending I/O to path `index` until a path is chosen again.
    fn forget(&self, index: usize) {
        let _ = self
            .current
            .compare_exchange(index, NONE, Ordering::AcqRel, Ordering::Acquire);
    }

    /// After a command on path `index`: if its session saw ASYMMETRIC
    /// ACCESS STATE CHANGED since last time, the states are read again
    /// before the next command.
    fn note_access_changes(&self, index: usize, session: &Session) {
        let changes = session.access_changes();
        let mut state = self.paths[index].lock();
        if state.access_changes != changes {
            state.access_changes = changes;
            drop(state);
            tracing::info!(url = %self.paths[index].url, "asymmetric access state changed");
            self.current.store(NONE, Ordering::Release);
        }
    }

    /// A path that takes I/O, choosing one again when there is none; waits
    /// while no path does, up to the no-path timeout counted from
    /// `waiting`.
    async fn usable(&self, waiting: &mut Option<Instant>) -> Result<(usize, Arc<Session>), Error> {
        loop {
            let index = self.current.load(Ordering::Acquire);
            if let Some(session) = self.paths.get(index).and_then(Path::usable) {
                return Ok((index, session));
            }
            if self.choose().await {
                continue;
            }
            let since = *waiting.get_or_insert_with(Instant::now);
            if since.elapsed() >= self.config.no_path_timeout {
                return Err(Error::NoPath {
                    waited: self.config.no_path_timeout,
                    paths: self.describe(),
                });
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    /// What each path is, for an error.
    fn describe(&self) -> String {
        let each: Vec<String> = self.statuses().iter().map(ToString::to_string).collect();
        each.join("; ")
    }

    /// Reads the states again (failed paths: a login is tried) and makes
    /// the best path current. Returns whether one takes I/O.
    async fn choose(&self) -> bool {
        let mut read_at = self.choosing.lock().await;
        let index = self.current.load(Ordering::Acquire);
        if self.paths.get(index).and_then(Path::usable).is_some() {
            return true;
        }
        // Another command read them a moment ago: what it found stands.
        let fresh = read_at.is_some_and(|at| at.elapsed() < self.config.poll_interval / 2);
        if !fresh {
            // Failed paths are the checker's (a login to a stopped gateway
            // can take seconds, which nobody should wait for here), except
            // the one path of a set without a checker.
            let lone = self.paths.len() == 1;
            for (index, path) in self.paths.iter().enumerate() {
                if lone || path.lock().failed.is_none() {
                    // Errors are the path's state now; nothing more to do.
                    let _ = self.probe(index).await;
                }
            }
            *read_at = Some(Instant::now());
        }
        let best = self
            .paths
            .iter()
            .enumerate()
            .filter(|(_, path)| path.usable().is_some())
            .max_by_key(|(index, path)| (path.lock().access.preference(), usize::MAX - index));
        match best {
            Some((index, path)) => {
                tracing::info!(url = %path.url, access = ?path.lock().access, "I/O goes to this path");
                self.current.store(index, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Brings path `index` up to date: a login if it has no session (its
    /// LU checked against the set's), else its state through REPORT TARGET
    /// PORT GROUPS (or TEST UNIT READY for an LU without ALUA), which also
    /// logs a failed session in again. Bounded by the ping timeout beyond
    /// the session's own login bound.
    async fn probe(&self, index: usize) -> Result<(), Error> {
        let path = &self.paths[index];
        let session = path.lock().session.clone();
        let session = match session {
            Some(session) => session,
            None => {
                let session = Arc::new(
                    Session::connect(&path.url, self.session_config.clone())
                        .await
                        .inspect_err(|error| {
                            path.fail(error.to_string());
                        })?,
                );
                if let Err(error) = self.join(index, &session).await {
                    path.fail(error.to_string());
                    let _ = session.logout().await;
                    return Err(error);
                }
                path.lock().session = Some(Arc::clone(&session));
                session
            }
        };
        let bound = self.config.ping_timeout + self.session_config.timeouts.login;
        let read = tokio::time::timeout(bound, self.read_access(index, &session))
            .await
            .unwrap_or(Err(Error::Timeout {
                timeout: bound,
                waiting_for: "the path's state",
            }));
        match read {
            Ok(access) => {
                let mut state = path.lock();
                if state.failed.take().is_some() {
                    tracing::info!(url = %path.url, ?access, "path works again");
                }
                state.access = access;
                Ok(())
            }
            Err(error) => {
                let failure = alua::classify(&error);
                if failure == Failure::PathLost {
                    path.fail(error.to_string());
                } else {
                    // The port answered, so the path works: in the state
                    // it refused the command by, or (any other answer is
                    // the LU's, not the path's) as a path like the others.
                    let mut state = path.lock();
                    state.failed = None;
                    state.access = match failure {
                        Failure::NotHere(access) => access,
                        _ => Access::Active,
                    };
                }
                Err(error)
            }
        }
    }

    /// A new path's session: its LU must be the set's (the first path's
    /// becomes the set's), and its port and group are kept.
    async fn join(&self, index: usize, session: &Session) -> Result<(), Error> {
        let url = &self.paths[index].url;
        let inquiry = session.inquiry(url.lun).await?;
        let page = session.inquiry_vpd(url.lun, 0x83).await?;
        let identity = alua::parse_device_identification(&page);
        {
            let mut lu = self.lu.lock().unwrap_or_else(PoisonError::into_inner);
            match (&*lu, &identity.lu) {
                (_, None) if self.paths.len() > 1 => {
                    return Err(Error::Config(format!(
                        "{url}: the LU has no designator in VPD page 83h to tell its paths by"
                    )));
                }
                (Some(set), Some(this)) if set != this => {
                    return Err(Error::Config(format!(
                        "{url} reaches another LU than the set's first path (VPD 83h designators differ)"
                    )));
                }
                (None, this) => {
                    *lu = this.clone();
                    if lu.is_none() {
                        *lu = Some((0, Vec::new()));
                    }
                    self.alua.store(inquiry.tpgs != 0, Ordering::Release);
                }
                _ => {}
            }
        }
        let mut state = self.paths[index].lock();
        state.access_changes = session.access_changes();
        state.identity = identity;
        Ok(())
    }

    /// The state of path `index` as its port reports it.
    async fn read_access(&self, index: usize, session: &Session) -> Result<Access, Error> {
        let path = &self.paths[index];
        if !self.alua.load(Ordering::Acquire) {
            session.test_unit_ready(path.url.lun).await?;
            return Ok(Access::Active);
        }
        let data = session.report_target_port_groups(path.url.lun).await?;
        let groups = alua::parse_port_groups(&data)?;
        let identity = path.lock().identity.clone();
        Ok(alua::state_of(
            &groups,
            identity.port_group,
            identity.relative_port,
        ))
    }
}

impl Shared {
    /// Reads live path `index`'s state (where the LU has ALUA) and, when
    /// it is now better than the current path's, has the next command
    /// choose again (failback: I/O back on an active/optimized path).
    async fn refresh(&self, index: usize) {
        if !self.alua.load(Ordering::Acquire) {
            return;
        }
        // The outcome is the path's state.
        let _ = self.probe(index).await;
        let current = self.current.load(Ordering::Acquire);
        let preference = |i: usize| {
            self.paths
                .get(i)
                .map_or(0, |p| p.lock().access.preference())
        };
        if current != index
            && self.paths[index].usable().is_some()
            && preference(index) > preference(current)
        {
            tracing::info!(url = %self.paths[index].url, "a better path: choosing again");
            self.forget(current);
        }
    }
}

/// The checker: every check interval, checks each path on a task of its
/// own (a stopped gateway's login takes its bound, and the other paths
/// should not wait for it), one check per path at a time. Ends with the
/// set.
async fn check_paths(shared: Weak<Shared>) {
    loop {
        let Some(interval) = shared.upgrade().map(|s| s.config.check_interval) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(strong) = shared.upgrade() else {
            return;
        };
        for index in 0..strong.paths.len() {
            if strong.paths[index].checking.swap(true, Ordering::AcqRel) {
                continue;
            }
            let shared = Arc::clone(&strong);
            tokio::spawn(async move {
                shared.check(index).await;
                shared.paths[index].checking.store(false, Ordering::Release);
            });
        }
    }
}

impl Shared {
    /// One check of path `index`: a live path is pinged, and failed when
    /// its NOP-In does not come in time (its connections dropped, so that
    /// the commands it holds end and move); a failed one is probed.
    async fn check(&self, index: usize) {
        let path = &self.paths[index];
        let (session, failed) = {
            let state = path.lock();
            (state.session.clone(), state.failed.is_some())
        };
        match session {
            Some(session) if !failed => {
                let ping = tokio::time::timeout(self.config.ping_timeout, session.ping()).await;
                let why = match ping {
                    Ok(Ok(_)) => {
                        // Alive: its state read again too, as dm-multipath's
                        // checker does, so that a path I/O is not on (a
                        // standby, a gateway that rejoined) is never known
                        // by a stale state.
                        self.refresh(index).await;
                        return;
                    }
                    Ok(Err(error)) => format!("NOP-Out ping: {error}"),
                    Err(_) => format!("no NOP-In within {:?}", self.config.ping_timeout),
                };
                path.fail(why);
                self.forget(index);
                session.drop_connections();
            }
            _ => {
                // The outcome is the path's state.
                let _ = self.probe(index).await;
            }
        }
    }
}
