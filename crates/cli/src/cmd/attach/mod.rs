//! `iscsi attach` and `iscsi detach`: a LUN as a Linux block device
//! (`/dev/ublkbN`) through ublk, served by this process in the foreground.
//!
//! The lifecycle: log in and open the LUN ([`Disk`]); refuse a LUN this
//! host has attached already; create the ublk device with the LUN's limits
//! (`ublk.rs`); print its path once the kernel has it; serve until the
//! device is stopped, by `iscsi detach` or by SIGINT/SIGTERM here; then,
//! with no request left in flight, SYNCHRONIZE CACHE and log out.
//!
//! Queues: `--queues` ublk hardware queues of `--depth` requests, one
//! thread each, whose requests run on that thread straight into one iSCSI
//! session. With one queue (the default) the session's connections share
//! that thread too: a current-thread runtime, nothing crossing threads. With `--connections N` (MC/S) queue q's commands go on
//! connection q mod N (`with_connection_affinity`): `--queues N
//! --connections N` gives each queue a connection of its own.
//!
//! A second attach of the same LUN (same portal, target and LUN) on this
//! host is refused, naming the device that has it: two block devices over
//! one LUN have two page caches that do not see each other's writes, and
//! a file system mounted through both is corrupted. Attaching from two
//! hosts is not detected (the target would need a reservation for that);
//! that is for a cluster file system to coordinate.

mod request;
mod ublk;

use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, bail};

use super::claim::{Claim, Refused};
use super::initiator_args::{SessionArgs, open_disk, target_url};

/// Options of `iscsi attach`.
#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn/lun; more than one
    /// (a URL per portal or gateway of the same LU) makes one device over
    /// all of them, I/O following ALUA to the active/optimized path and
    /// moving to another when a path fails.
    #[arg(required = true, num_args = 1..)]
    urls: Vec<String>,
    /// ublk hardware queues (one serving thread each). One session serves
    /// every queue; with --connections (MC/S) queue q uses connection q mod
    /// the connection count (the next live one while it is down).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    queues: u16,
    /// Requests in flight per queue.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=4096))]
    depth: u16,
    #[command(flatten)]
    session: SessionArgs,
}

/// Options of `iscsi detach`.
#[derive(clap::Args, Debug)]
pub struct DetachArgs {
    /// The device: /dev/ublkbN, ublkbN, or the id N.
    device: String,
}

/// Claims the LUN `url` names for this process (held until it ends), so
/// that an attach started beside this one is refused here, not after both
/// looked; refuses a LUN attached already.
fn claim(url: &iscsi_initiator::IscsiUrl, identity: &serde_json::Value) -> anyhow::Result<Claim> {
    let claim = match Claim::take("attach", &identity.to_string()) {
        Ok(claim) => claim,
        Err(Refused::Held(pid)) => {
            let holder = pid
                .map(|pid| format!(" (process {pid})"))
                .unwrap_or_default();
            match ublk::attached_already(identity) {
                Some(device) => bail!(
                    "{url} is attached already as {device} by iscsi attach{holder} \
                     (`iscsi detach {device}` first)"
                ),
                None => bail!("{url} is being attached by another iscsi attach{holder}"),
            }
        }
        Err(Refused::Failed(error)) => return Err(error),
    };
    if let Some(device) = ublk::attached_already(identity) {
        bail!("{url} is attached already as {device} (`iscsi detach {device}` first)");
    }
    Ok(claim)
}

/// Runs `iscsi attach`.
pub fn run_attach(args: &AttachArgs) -> anyhow::Result<()> {
    // Before logging in: without ublk there is nothing to attach to.
    ublk::check_available()?;
    // Each URL's LUN is claimed (the claims held until this process ends),
    // so that no other attach takes it through any of the paths; the
    // device is known by the first URL's.
    let mut claims = Vec::with_capacity(args.urls.len());
    let mut identity = None;
    for text in &args.urls {
        let url = target_url(text)?;
        let this = serde_json::json!({
            "portal": url.portal(),
            "target": url.target_name()?,
            "lun": url.lun,
        });
        claims.push(claim(&url, &this)?);
        identity.get_or_insert(this);
    }
    let identity = identity.context("no URL")?;
    // One queue: one thread for everything, the queue's ring and the
    // session's sockets on one reactor, no request crossing threads. More
    // queues: each on a thread of its own, the session's connections on
    // the runtime's workers.
    let runtime = if args.queues == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()
    .context("starting the runtime")?;
    let disk = runtime.block_on(open_disk(&args.urls, &args.session.for_disk()))?;
    let disk = Arc::new(disk);

    // The id reaches the signal watcher once the device is live; a signal
    // before that has nothing to stop yet and waits for it.
    let (live_tx, live_rx) = tokio::sync::oneshot::channel::<u32>();
    let watcher = runtime.spawn(stop_on_signal(live_rx));
    let live = move |path: String, id: u32| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{path}");
        let _ = out.flush();
        let _ = live_tx.send(id);
    };
    let shape = ublk::Shape {
        queues: args.queues,
        depth: args.depth,
    };
    let served = ublk::serve(Arc::clone(&disk), &runtime, shape, identity, live);
    watcher.abort();
    // One line per path's session: `per_connection=[(CID, count), ...]`,
    // the form the ublk-attach VM job reads for one path.
    for session in disk.paths().sessions() {
        tracing::info!(
            portal = %session.url(disk.lun()).portal(),
            per_connection = ?session.commands_per_connection(),
            "SCSI commands carried, by connection (CID, count)"
        );
    }
    // Every queue has ended: nothing is in flight. Make what was written
    // durable and leave the session cleanly, whatever ended the device.
    let finished = runtime.block_on(async {
        let flushed = if disk.limits().write_cache && !disk.limits().read_only {
            disk.flush().await.context("SYNCHRONIZE CACHE")
        } else {
            Ok(())
        };
        let logged_out = disk.paths().logout().await.context("logging out");
        flushed.and(logged_out)
    });
    served?;
    finished
}

/// Waits for SIGINT or SIGTERM, then stops the device (once it is live):
/// the same clean end as `iscsi detach`.
async fn stop_on_signal(live: tokio::sync::oneshot::Receiver<u32>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    let Ok(id) = live.await else {
        return Ok(());
    };
    tracing::info!("stopping /dev/ublkb{id}");
    tokio::task::spawn_blocking(move || ublk::stop(id)).await??;
    Ok(())
}

/// Runs `iscsi detach`.
pub fn run_detach(args: &DetachArgs) -> anyhow::Result<()> {
    ublk::check_available()?;
    let id = device_id(&args.device)?;
    if ublk::remove_orphan(id).with_context(|| format!("detaching /dev/ublkb{id}"))? {
        eprintln!("detach: /dev/ublkb{id} had no server (killed?): deleted");
        return Ok(());
    }
    ublk::stop(id).with_context(|| format!("detaching /dev/ublkb{id}"))?;
    // The serving process now flushes, logs out and deletes the device;
    // its character device goes last. Wait a little for it, so that a
    // script's next `iscsi attach` finds the LUN free.
    let cdev = format!("/dev/ublkc{id}");
    for _ in 0..300 {
        if !std::path::Path::new(&cdev).exists() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    eprintln!("detach: /dev/ublkb{id} is stopped; its server has not ended yet");
    Ok(())
}

/// The ublk device id in `/dev/ublkbN`, `ublkbN` or `N`.
fn device_id(text: &str) -> anyhow::Result<u32> {
    let name = text.strip_prefix("/dev/").unwrap_or(text);
    let digits = name.strip_prefix("ublkb").unwrap_or(name);
    digits
        .parse()
        .with_context(|| format!("{text:?} is not a ublk device (/dev/ublkbN or N)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids() {
        assert_eq!(device_id("/dev/ublkb0").unwrap(), 0);
        assert_eq!(device_id("ublkb12").unwrap(), 12);
        assert_eq!(device_id("3").unwrap(), 3);
        assert!(device_id("/dev/sda").is_err());
    }
}
