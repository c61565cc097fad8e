//! `iscsi target snapshot`: point-in-time copies of a LUN taken, listed
//! and deleted while it serves, from the control socket. A snapshot is
//! served as a LUN, or cloned into a writable one, by naming it in the
//! configuration file (`snapshot:LUN/NAME`, `clone:LUN/NAME`) and
//! reloading: the file stays the one place that says what is served.

use serde::{Deserialize, Serialize};
use tracing::info;

use crate::config::lun::{LunSpec, StoreKind};
use crate::server::ServerHandle;
use iscsi_scsi::backstore::{Backstore, SnapshotError, SnapshotInfo, Snapshots};

/// One snapshot, as `iscsi target snapshot` and `status` show it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotReport {
    /// Its name.
    pub name: String,
    /// The LUN's size when it was taken, in bytes.
    pub size_bytes: u64,
    /// When it was taken (seconds since the Unix epoch), where known.
    pub taken_unix: Option<u64>,
    /// Bytes only it still holds (what deleting it frees), where the store
    /// can tell.
    pub held_bytes: Option<u64>,
    /// The LUNs of the target that serve it (`snapshot:LUN/NAME`).
    #[serde(default)]
    pub served_as: Vec<u16>,
}

impl SnapshotReport {
    fn new(info: SnapshotInfo, served_as: Vec<u16>) -> Self {
        SnapshotReport {
            name: info.name,
            size_bytes: info.size_bytes,
            taken_unix: info.taken_unix,
            held_bytes: info.held_bytes,
            served_as,
        }
    }
}

/// The snapshots of `store`, with the LUNs of `specs` (the target's LUNs
/// and their specifications) that serve each; `lun` is the store's LUN.
pub(crate) fn reports<'a>(
    store: &dyn Snapshots,
    lun: u16,
    specs: impl Iterator<Item = (u16, &'a str)> + Clone,
) -> Result<Vec<SnapshotReport>, SnapshotError> {
    Ok(store
        .list()?
        .into_iter()
        .map(|info| {
            let served_as = serving(lun, &info.name, specs.clone());
            SnapshotReport::new(info, served_as)
        })
        .collect())
}

/// The LUNs among `specs` that serve snapshot `name` of LUN `lun`.
fn serving<'a>(lun: u16, name: &str, specs: impl Iterator<Item = (u16, &'a str)>) -> Vec<u16> {
    specs
        .filter(|(_, spec)| {
            LunSpec::parse(spec).is_ok_and(|spec| {
                matches!(&spec.kind, StoreKind::Snapshot { of, name: n } if *of == lun && n == name)
            })
        })
        .map(|(n, _)| n)
        .collect()
}

/// What a LUN that takes no snapshots is, in words.
fn no_snapshots(spec: &str) -> String {
    let kind = LunSpec::parse(spec).ok();
    let why = match kind.as_ref().map(|k| (&k.kind, k.encrypt.is_some())) {
        Some((_, true)) => "an encrypted LUN takes no snapshots yet",
        Some((StoreKind::Block { .. }, _)) => {
            "a block device is snapshotted where it is made (LVM, the array), not here"
        }
        _ => "its store takes no snapshots (RAM, file on XFS or btrfs, and rbd LUNs do)",
    };
    format!("{spec:?}: {why}")
}

/// Runs `job` on the snapshots of `origin`'s store, on a blocking thread
/// (a snapshot may wait for a file system's write-back or a cluster); a
/// store that takes none is refused in words. Errors start with `what`.
async fn on_snapshots<T: Send + 'static>(
    what: &str,
    origin: Origin,
    job: impl FnOnce(&dyn Snapshots, &Origin) -> Result<T, SnapshotError> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(move || match origin.store.snapshots() {
        Some(snapshots) => job(snapshots, &origin).map_err(|e| e.to_string()),
        None => Err(no_snapshots(&origin.spec)),
    })
    .await
    .map_err(|e| format!("{what}: {e}"))?
    .map_err(|e| format!("{what}: {e}"))
}

/// A LUN whose snapshots are asked for: its store and specification, and
/// every LUN of its target with its specification.
struct Origin {
    store: std::sync::Arc<dyn Backstore>,
    spec: String,
    specs: Vec<(u16, String)>,
}

impl ServerHandle {
    /// LUN `lun` of `target`, as [`Origin`].
    fn snapshot_store(&self, target: &str, lun: u16) -> Result<Origin, String> {
        let config = self.shared.config();
        let entry = config
            .targets
            .iter()
            .find(|t| t.name == target)
            .ok_or_else(|| format!("no target {target}"))?;
        let lun_entry = entry
            .luns
            .get(&lun)
            .ok_or_else(|| format!("target {target}: no LUN {lun}"))?;
        let specs = entry
            .luns
            .iter()
            .map(|(&n, l)| (n, l.spec.clone()))
            .collect();
        Ok(Origin {
            store: std::sync::Arc::clone(&lun_entry.store),
            spec: lun_entry.spec.clone(),
            specs,
        })
    }

    /// Takes snapshot `name` of LUN `lun` of `target` while it serves, one
    /// at a time with reloads (so the LUN is not removed under it).
    pub async fn snapshot(
        &self,
        target: &str,
        lun: u16,
        name: &str,
    ) -> Result<SnapshotReport, String> {
        let _one_at_a_time = self.shared.reloading.lock().await;
        let origin = self.snapshot_store(target, lun)?;
        let what = format!("target {target} LUN {lun}");
        let started = std::time::Instant::now();
        let owned = name.to_owned();
        let info = on_snapshots(&what, origin, move |snapshots, _| snapshots.take(&owned)).await?;
        info!(
            target,
            lun,
            name,
            took_ms = started.elapsed().as_millis() as u64,
            "snapshot taken"
        );
        Ok(SnapshotReport::new(info, Vec::new()))
    }

    /// The snapshots of LUN `lun` of `target`.
    pub async fn snapshots(&self, target: &str, lun: u16) -> Result<Vec<SnapshotReport>, String> {
        let origin = self.snapshot_store(target, lun)?;
        let what = format!("target {target} LUN {lun}");
        on_snapshots(&what, origin, move |snapshots, origin| {
            let specs = origin.specs.iter().map(|(n, s)| (*n, s.as_str()));
            reports(snapshots, lun, specs)
        })
        .await
    }

    /// Deletes snapshot `name` of LUN `lun` of `target`; refused while a
    /// LUN serves it (the file names it: a restart could not open it).
    pub async fn delete_snapshot(&self, target: &str, lun: u16, name: &str) -> Result<(), String> {
        let _one_at_a_time = self.shared.reloading.lock().await;
        let origin = self.snapshot_store(target, lun)?;
        let what = format!("target {target} LUN {lun}");
        let specs = origin.specs.iter().map(|(n, s)| (*n, s.as_str()));
        let served = serving(lun, name, specs);
        if let Some(n) = served.first() {
            return Err(format!(
                "{what}: snapshot {name:?} is served as LUN {n}: take that LUN out of the \
                 configuration and reload first"
            ));
        }
        let owned = name.to_owned();
        on_snapshots(&what, origin, move |snapshots, _| snapshots.delete(&owned)).await?;
        info!(target, lun, name, "snapshot deleted");
        Ok(())
    }
}
