//! Applying a configuration file to a running target: ctld's reload with a
//! rollback and SCST's caution.
//!
//! 1. Parse and check the whole file (`ParsedConfig`): a file with any
//!    mistake changes nothing.
//! 2. Plan (`plan.rs`): every change against the running configuration and
//!    the sessions using it. A change that would end sessions or take a
//!    LUN in use is refused, naming them, unless the file or the command
//!    says `force`.
//! 3. Prepare everything that can fail, touching nothing running: open the
//!    new stores, bind the new portals. A failure drops what was prepared
//!    (the rollback): the target runs on as before.
//! 4. Commit, which cannot fail: LUNs removed and added in the SCSI cores
//!    (REPORTED LUNS DATA HAS CHANGED to the nexuses that know the target),
//!    the configuration snapshot and the target table replaced, portals
//!    started and stopped, sessions shut out asked to log out.
//!
//! So the running state is the old one or the new one, never a mix.

pub mod plan;
pub mod resize;
pub mod snapshot;

use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};

use serde::Serialize;
use thiserror::Error;
use tracing::{info, warn};

use crate::config::file::{ConfigError, ParsedConfig};
use crate::server::{Portal, ServerHandle, bind_all};
use crate::shared::scsi_target;
use plan::{Change, Plan, keeps, new_size};

/// What a reload did.
#[derive(Debug, Serialize)]
pub struct ReloadReport {
    /// Every change applied (none: the file matched what runs).
    pub changes: Vec<Change>,
    /// Force was given (by the command or the file).
    pub forced: bool,
}

/// Why a reload changed nothing.
#[derive(Debug, Error)]
pub enum ReloadError {
    /// The target was started without `--config`.
    #[error("no configuration file to reload: the target was started without --config")]
    NoFile,
    /// The file does not parse or check: the old configuration stays.
    #[error("the file is refused, nothing changed: {0}")]
    Config(ConfigError),
    /// Disruptive changes without force.
    #[error("refused, nothing changed: {} change(s) would disturb running sessions; say force (iscsi target reload --force, or force = true in the file) to apply them: {}", .0.disruptive().count(), .0.disruptive().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused(Plan),
    /// A step of the apply failed: what was prepared was dropped.
    #[error("applying failed, nothing changed: {error}")]
    Apply {
        /// What failed.
        error: String,
        /// What would have been applied.
        plan: Plan,
    },
    /// The target is shutting down.
    #[error("the target is shutting down")]
    ShuttingDown,
}

impl ReloadError {
    /// The plan the refusal is about, if any.
    pub fn plan(&self) -> Option<&Plan> {
        match self {
            ReloadError::Refused(plan) | ReloadError::Apply { plan, .. } => Some(plan),
            _ => None,
        }
    }
}

impl ServerHandle {
    /// Re-reads the configuration file and applies it; `force` allows
    /// changes that end sessions or remove LUNs in use.
    pub async fn reload(&self, force: bool) -> Result<ReloadReport, ReloadError> {
        let path = self.shared.config_file.get().ok_or(ReloadError::NoFile)?;
        let parsed = ParsedConfig::from_file(path).map_err(ReloadError::Config);
        let result = match parsed {
            Ok(parsed) => self.apply(parsed, force).await,
            Err(error) => Err(error),
        };
        match &result {
            Ok(report) => info!(
                file = %path.display(),
                changes = report.changes.len(),
                forced = report.forced,
                "configuration reloaded"
            ),
            Err(error) => warn!(file = %path.display(), "reload: {error}"),
        }
        self.shared.metrics.reloaded(result.is_ok());
        result
    }

    /// What applying `text` (a configuration file's contents) would change
    /// now, applying nothing (`iscsi target check FILE`).
    pub fn plan(&self, text: &str) -> Result<Plan, ConfigError> {
        let parsed = ParsedConfig::parse(text)?;
        parsed.check_libraries()?;
        Ok(plan::plan(
            &self.shared.config(),
            &parsed,
            &self.shared.sessions.usage(),
        ))
    }

    /// Applies a parsed configuration (see the module's steps).
    pub async fn apply(
        &self,
        parsed: ParsedConfig,
        force: bool,
    ) -> Result<ReloadReport, ReloadError> {
        let shared = &self.shared;
        let _one_at_a_time = shared.reloading.lock().await;
        if self
            .portals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed
        {
            return Err(ReloadError::ShuttingDown);
        }
        let old = shared.config();
        let plan = plan::plan(&old, &parsed, &shared.sessions.usage());
        let forced = force || parsed.force;
        if !forced && plan.disruptive().next().is_some() {
            return Err(ReloadError::Refused(plan));
        }
        if plan.changes.is_empty() {
            return Ok(ReloadReport {
                changes: Vec::new(),
                forced,
            });
        }
        // Prepare: stores (running ones kept where the LUN is unchanged).
        let reuse = |target: &str, n: u16, lun: &config_file::PlannedLun| {
            old.targets
                .iter()
                .find(|t| t.name == target)?
                .luns
                .get(&n)
                .filter(|running| keeps(running, lun))
                .map(|running| crate::config::LunEntry {
                    store: Arc::clone(&running.store),
                    spec: lun.spec.clone(),
                })
        };
        let resizes = resizes(&old, &parsed);
        // A `file:PATH,size=…` LUN creates its file when opened: the
        // files this reload would create, removed again if it fails.
        let created = files_to_create(&parsed, &reuse);
        let mut new = match parsed.open(&reuse) {
            Ok(new) => new,
            Err(error) => {
                remove_created(&created);
                return Err(ReloadError::Apply {
                    error: error.to_string(),
                    plan,
                });
            }
        };
        new.tap = old.tap.clone();
        // Prepare: portals.
        // The addresses of `these` that `those` lacks (new portals; with
        // the arguments the other way round, removed ones).
        let fresh = |these: &[SocketAddr], those: &[SocketAddr]| -> Vec<SocketAddr> {
            these
                .iter()
                .filter(|a| !those.contains(a))
                .copied()
                .collect()
        };
        let new_tcp = fresh(&new.listen, &old.listen);
        let new_iser = fresh(&new.iser, &old.iser);
        let bound = match bind_all(&new_tcp).await {
            Ok(tcp) => bind_all(&new_iser).await.map(|iser| (tcp, iser)),
            Err(error) => Err(error),
        };
        let (tcp, iser) = match bound {
            Ok(bound) => bound,
            Err(error) => {
                drop(new);
                remove_created(&created);
                return Err(ReloadError::Apply {
                    error: error.to_string(),
                    plan,
                });
            }
        };
        // Prepare: resizes, the last step that can fail (a file that cannot
        // grow, data beyond a shrink's end), undone if one does.
        if let Err(error) = resize_all(shared, &resizes) {
            drop((new, tcp, iser));
            remove_created(&created);
            return Err(ReloadError::Apply { error, plan });
        }
        // Commit: nothing below fails.
        let mut targets = crate::shared::Targets::clone(&shared.targets.load());
        for target in &old.targets {
            let Some(wanted) = new.targets.iter().find(|t| t.name == target.name) else {
                targets.remove(&target.name);
                continue;
            };
            let Some(core) = targets.get(&target.name) else {
                continue;
            };
            for (&n, lun) in &target.luns {
                let kept = wanted
                    .luns
                    .get(&n)
                    .is_some_and(|w| Arc::ptr_eq(&w.store, &lun.store));
                if !kept {
                    core.remove_lun(n);
                }
            }
            for (&n, lun) in &wanted.luns {
                let kept = target
                    .luns
                    .get(&n)
                    .is_some_and(|l| Arc::ptr_eq(&l.store, &lun.store));
                if !kept && let Err(error) = core.add_lun(n, Arc::clone(&lun.store)) {
                    warn!(target = %target.name, %error, "reload: LUN not added");
                }
            }
        }
        for target in &new.targets {
            if !old.targets.iter().any(|t| t.name == target.name) {
                // The company ID is read at start: a target added now
                // names its LUs as the running ones do.
                let core = scsi_target(target, old.naa_company_id, &shared.sessions);
                targets.insert(target.name.clone(), core);
            }
        }
        let removed_portals: Vec<(Portal, SocketAddr)> = fresh(&old.listen, &new.listen)
            .into_iter()
            .map(|a| (Portal::Tcp, a))
            .chain(
                fresh(&old.iser, &new.iser)
                    .into_iter()
                    .map(|a| (Portal::Iser, a)),
            )
            .collect();
        shared.targets.store(Arc::new(targets));
        shared.qos.store(Arc::new(shared.qos_for(&new)));
        shared.config.store(Arc::new(new));
        {
            let mut portals = self.portals.lock().unwrap_or_else(PoisonError::into_inner);
            for (kind, address) in removed_portals {
                portals.remove(kind, address);
            }
            let added = tcp
                .into_iter()
                .zip(new_tcp)
                .map(|(l, a)| (l, Portal::Tcp, a))
                .chain(
                    iser.into_iter()
                        .zip(new_iser)
                        .map(|(l, a)| (l, Portal::Iser, a)),
                );
            for (listener, kind, address) in added {
                if let Err(error) = portals.add(shared, listener, kind, address) {
                    warn!(%address, %error, "reload: portal not started");
                }
            }
        }
        for tsih in plan.ended_sessions() {
            if let Some(session) = shared.sessions.get(tsih) {
                info!(tsih, initiator = %session.initiator_name, "reload: session shut out, asking it to log out");
                session.ask_logout();
            }
        }
        for change in &plan.changes {
            info!("reload: {change}");
        }
        Ok(ReloadReport {
            changes: plan.changes,
            forced,
        })
    }
}

use crate::config::file as config_file;

/// The files that opening `parsed` would create: `file:` LUNs with a size
/// whose file does not exist yet, and which no running LUN keeps.
fn files_to_create(
    parsed: &ParsedConfig,
    reuse: &dyn Fn(&str, u16, &config_file::PlannedLun) -> Option<crate::config::LunEntry>,
) -> Vec<std::path::PathBuf> {
    let mut created = Vec::new();
    for (target, luns) in parsed.config.targets.iter().zip(&parsed.luns) {
        for (&n, lun) in luns {
            if let crate::config::lun::StoreKind::File {
                path,
                size: Some(_),
            } = &lun.parsed.kind
                && reuse(&target.name, n, lun).is_none()
                && !std::path::Path::new(path).exists()
            {
                created.push(std::path::PathBuf::from(path));
            }
        }
    }
    created
}

/// A LUN a reload resizes in place: its target, number, and sizes in
/// bytes before and after.
struct Resize {
    target: String,
    lun: u16,
    old: u64,
    new: u64,
}

/// The LUNs `parsed` keeps with another size.
fn resizes(old: &crate::config::TargetConfig, parsed: &ParsedConfig) -> Vec<Resize> {
    let mut list = Vec::new();
    for (target, planned) in parsed.config.targets.iter().zip(&parsed.luns) {
        let Some(running) = old.targets.iter().find(|t| t.name == target.name) else {
            continue;
        };
        for (&lun, p) in planned {
            if let Some(entry) = running.luns.get(&lun)
                && let Some(new) = new_size(entry, p)
            {
                list.push(Resize {
                    target: target.name.clone(),
                    lun,
                    old: entry.store.size_bytes(),
                    new,
                });
            }
        }
    }
    list
}

/// Resizes every LUN of `list` through its target's SCSI core (which tells
/// the initiators); on a failure the ones done are put back, as far as
/// they can be (a growth an initiator has written into stays), and the
/// error names the LUN.
fn resize_all(shared: &crate::shared::Shared, list: &[Resize]) -> Result<(), String> {
    let targets = shared.targets.load();
    for (i, resize) in list.iter().enumerate() {
        let Some(core) = targets.get(&resize.target) else {
            continue;
        };
        if let Err(error) = core.resize_lun(resize.lun, Some(resize.new), false) {
            for done in &list[..i] {
                if let Some(core) = targets.get(&done.target)
                    && let Err(undo) = core.resize_lun(done.lun, Some(done.old), false)
                {
                    warn!(target = %done.target, lun = done.lun, %undo, "reload failed: a LUN it resized stays resized");
                }
            }
            return Err(format!(
                "target {} LUN {}: resizing from {} to {} bytes: {error}",
                resize.target, resize.lun, resize.old, resize.new
            ));
        }
    }
    Ok(())
}

/// Removes what a failed reload created (its stores are closed by then).
fn remove_created(created: &[std::path::PathBuf]) {
    for path in created {
        match std::fs::remove_file(path) {
            Ok(()) => info!(file = %path.display(), "reload failed: removed the file it created"),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                warn!(file = %path.display(), %error, "reload failed: could not remove the file it created")
            }
        }
    }
}
