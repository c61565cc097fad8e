//! `iscsi target resize`: one LUN resized in place while it serves, from
//! the control socket (a reload does the same for the sizes a file
//! changes, `super::resize_all`).

use serde::{Deserialize, Serialize};
use tracing::info;

use crate::config::lun::LunSpec;
use crate::server::ServerHandle;

/// What a resize did.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResizeReport {
    /// The size in bytes before.
    pub old: u64,
    /// The size in bytes now (the same when nothing changed).
    pub new: u64,
    /// Where the LUN's specification names another size: a reload of that
    /// file would resize it back, so the file should change too.
    pub note: Option<String>,
}

impl ServerHandle {
    /// Resizes LUN `lun` of `target` to `size` bytes (`None`: what its
    /// medium holds now), one at a time with reloads. A shrink needs
    /// `force`; data beyond the new end is dropped only with `discard`.
    pub async fn resize(
        &self,
        target: &str,
        lun: u16,
        size: Option<u64>,
        force: bool,
        discard: bool,
    ) -> Result<ResizeReport, String> {
        let _one_at_a_time = self.shared.reloading.lock().await;
        let targets = self.shared.targets.load();
        let core = targets
            .get(target)
            .ok_or_else(|| format!("no target {target}"))?;
        let what = format!("target {target} LUN {lun}");
        let store = core
            .backstore(lun)
            .ok_or_else(|| format!("{what}: no such LUN"))?;
        let old = store.size_bytes();
        if let Some(size) = size
            && size < old
            && !force
        {
            return Err(format!(
                "{what}: shrinking from {old} to {size} bytes takes the blocks beyond the new \
                 end away from its initiators: say --force (and --discard to drop data written \
                 there)"
            ));
        }
        let resized = core
            .resize_lun(lun, size, discard)
            .map_err(|e| format!("{what}: {e}"))?;
        if resized.new != resized.old {
            info!(
                target,
                lun,
                old = resized.old,
                new = resized.new,
                "LUN resized: CAPACITY DATA HAS CHANGED for every nexus"
            );
        }
        let config = self.shared.config();
        let spec = config
            .targets
            .iter()
            .find(|t| t.name == target)
            .and_then(|t| t.luns.get(&lun))
            .map(|entry| entry.spec.clone());
        let note = spec.and_then(|spec| {
            let named = LunSpec::parse(&spec).ok()?.size()?;
            (named != resized.new).then(|| {
                format!(
                    "the configuration names this LUN {spec:?} ({named} bytes): a reload of \
                     that file would resize it back (a shrink only with force); change the file"
                )
            })
        });
        Ok(ResizeReport {
            old: resized.old,
            new: resized.new,
            note,
        })
    }
}
