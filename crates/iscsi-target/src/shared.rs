//! What every connection of a running target shares, and what a reload
//! replaces: the configuration snapshot, the SCSI cores by target name, the
//! session registry. (The portals are the server's: `server.rs`.)

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use iscsi_proto::login::chap::ChallengeHistory;
use iscsi_scsi::{ScsiTarget, TargetIdentity, encode_lun};
use tokio::sync::watch;

use crate::config::{TargetConfig, TargetEntry};
use crate::policy::Policy;
use crate::registry::Registry;

/// SCSI target cores by target name.
pub(crate) type Targets = HashMap<String, Arc<ScsiTarget>>;

/// What every connection of a running target shares.
pub(crate) struct Shared {
    /// The configuration served: a reload replaces it whole. Logins and
    /// new connections read it; running ones keep what they started with.
    pub config: Arc<ArcSwap<TargetConfig>>,
    pub policy: Policy,
    /// SCSI target cores, by target name.
    pub targets: ArcSwap<Targets>,
    pub challenge_history: Arc<Mutex<ChallengeHistory>>,
    /// Running sessions.
    pub sessions: Arc<Registry>,
    /// Becomes `true` when the target shuts down: every connection asks its
    /// initiator to log out (Asynchronous Message, RFC 7143 11.9.1).
    pub shutdown: watch::Receiver<bool>,
    /// Held by the reload in progress: one at a time.
    pub reloading: tokio::sync::Mutex<()>,
    /// The file a reload re-reads (`iscsi target --config FILE`).
    pub config_file: OnceLock<PathBuf>,
    /// What the metrics endpoint and `status` sum.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The runtimes, one per core, that connections live on.
    pub shards: crate::shards::Shards,
    /// The QoS limits of every target, which each command looks its own
    /// up in (`crate::qos`); a reload replaces the table, keeping the
    /// limits that stay.
    pub qos: ArcSwap<crate::qos::QosTable>,
}

impl Shared {
    /// The configuration served now.
    pub fn config(&self) -> Arc<TargetConfig> {
        self.config.load_full()
    }

    /// The QoS table for `config`, keeping the running limits that stay.
    pub fn qos_for(&self, config: &TargetConfig) -> crate::qos::QosTable {
        qos_table(config, &self.qos.load())
    }

    /// The SCSI core of target `name`.
    pub fn scsi_target(&self, name: &str) -> Option<Arc<ScsiTarget>> {
        self.targets.load().get(name).cloned()
    }
}

/// The SCSI core of `target`, with the PERSISTENT RESERVE OUT / PREEMPT AND
/// ABORT hook (SPC-4 5.12.11.2.6): the preempted nexuses' tasks on that LUN
/// are aborted. Weak: the registry holds sessions, which hold the core.
/// `naa_company_id` is the IEEE company ID of its LUs' NAA designators.
pub(crate) fn scsi_target(
    target: &TargetEntry,
    naa_company_id: u32,
    sessions: &Arc<Registry>,
) -> Arc<ScsiTarget> {
    let identity = TargetIdentity {
        target_name: target.name.clone(),
        vendor: "ISCSI-RS".to_owned(),
        product: "VIRTUAL DISK".to_owned(),
        revision: "0001".to_owned(),
        naa_company_id,
    };
    let luns = target
        .luns
        .iter()
        .map(|(&n, lun)| (n, Arc::clone(&lun.store)));
    let core = Arc::new(ScsiTarget::with_luns(identity, luns));
    let registry = Arc::downgrade(sessions);
    let name = target.name.clone();
    core.set_abort_handler(move |lun, nexuses| {
        let Some(registry) = registry.upgrade() else {
            return;
        };
        for session in registry.of_target(&name) {
            if nexuses.contains(session.nexus.key()) {
                session.abort_lun(encode_lun(lun));
            }
        }
    });
    core
}

/// The QoS table of `config`'s targets, keeping `old`'s limits whose key
/// stays.
pub(crate) fn qos_table(config: &TargetConfig, old: &crate::qos::QosTable) -> crate::qos::QosTable {
    crate::qos::QosTable::build(
        config
            .targets
            .iter()
            .map(|t| (t.name.as_str(), t.limits.as_slice())),
        old,
    )
}
