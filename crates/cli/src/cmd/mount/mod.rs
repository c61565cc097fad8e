//! `iscsi mount URL DIR`: every LUN of a target as a file under DIR
//! (`DIR/lun0`, `DIR/lun1`, ...) through FUSE, for programs that take a
//! file: dd, qemu-img, `losetup`, fio. The file system is in [`fs`]; this
//! module owns the life of a mount: log in, open the LUNs, mount, serve
//! until `fusermount3 -u DIR` (or `umount`) or a signal, then make every
//! write durable (SYNCHRONIZE CACHE) and log out.
//!
//! The first SIGINT or SIGTERM unmounts; programs that still have a file
//! open keep it until they close it (a lazy unmount, so their writes still
//! reach the target). A second signal ends the process at once: their
//! later requests fail with ENOTCONN, and nothing that was acknowledged is
//! lost, since a write is acknowledged only once the target has it.
//! If this process is killed (SIGKILL), the kernel fails every request on
//! the mount with ENOTCONN ("Transport endpoint is not connected") until
//! `fusermount3 -u DIR` or `umount DIR` removes it; nothing hangs.
//! (fusermount3's auto_unmount would remove it by itself, but it leaves a
//! mount that a signal's unmount cannot remove, so it is not used.)

mod fs;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use fuser::{Config, MountOption, SessionACL};
use iscsi_initiator::{Disk, IscsiUrl, Session};
use tokio::signal::unix::{SignalKind, signal};

use self::fs::{LunFile, LunFs};
use super::claim::{Claim, Refused};
use super::initiator_args::{SessionArgs, connect, multipath_of, target_url};

/// Options of `iscsi mount`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn[/lun]: every LUN of
    /// the target is mounted (the LUN in the URL is ignored). More than one
    /// (a URL per portal or gateway of the target) mounts each LUN through
    /// the initiator's multipath set over all of them.
    #[arg(required = true, num_args = 1..)]
    urls: Vec<String>,
    /// The directory to mount on (it must exist).
    dir: PathBuf,
    /// Refuse writes to every file (a write-protected LUN is read-only
    /// whatever this says).
    #[arg(long)]
    read_only: bool,
    /// Let other users than the one mounting use the files (FUSE's
    /// allow_other; for a user other than root, /etc/fuse.conf must have
    /// user_allow_other).
    #[arg(long)]
    allow_other: bool,
    /// Mount even if this target is mounted here already. Two mounts are
    /// two initiators on one disk with nothing between them (no shared
    /// cache, no locking): fine for reading, or for programs that
    /// coordinate, ruinous for a file system image mounted twice.
    #[arg(long)]
    shared: bool,
    #[command(flatten)]
    session: SessionArgs,
}

/// Mounts, serves until unmounted or signalled, then flushes and logs out.
pub fn run(args: &Args) -> anyhow::Result<()> {
    check_mount_point(&args.dir)?;
    let source = source_name(&target_url(&args.urls[0])?);
    let _claim = if args.shared {
        None
    } else {
        Some(claim(&source)?)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let (session, files) = runtime.block_on(open(args))?;
    let disks: Vec<Arc<Disk>> = files.iter().map(|f| Arc::clone(&f.disk)).collect();
    let listing: Vec<String> = files
        .iter()
        .map(|file| {
            format!(
                "{}\t{} bytes{}",
                args.dir.join(&file.name).display(),
                file.disk.limits().bytes(),
                if file.read_only { "\tread-only" } else { "" }
            )
        })
        .collect();
    let filesystem = LunFs::new(files, runtime.handle().clone());
    let mounted = match fuser::spawn_mount(filesystem, &args.dir, &config(args, &source)) {
        Ok(mounted) => mounted,
        Err(error) => {
            let _ = runtime.block_on(log_out(session.as_deref(), &disks));
            return Err(mount_error(&args.dir, error));
        }
    };
    // What is mounted, once it is: a script may wait for this line.
    for line in listing {
        println!("{line}");
    }
    tracing::info!(dir = %args.dir.display(), "mounted");
    let outcome = runtime.block_on(serve(mounted, &args.dir));
    let ended = runtime.block_on(finish(session.as_deref(), &disks));
    // After a second signal the unmount still waits for open files on a
    // blocking task, which dropping the runtime would wait for too.
    runtime.shutdown_timeout(Duration::from_secs(1));
    outcome.and(ended)
}

/// What /proc/mounts shows as the source of a mount of `url`'s target:
/// its portal and name, never the CHAP user or secret (every user can
/// read /proc/mounts).
fn source_name(url: &IscsiUrl) -> String {
    let scheme = if url.iser { "iser" } else { "iscsi" };
    let target = url.target.as_deref().unwrap_or_default();
    format!("{scheme}://{}/{target}", url.portal())
}

/// Claims `source` for this process (see `cmd::claim`), refusing a second
/// mount of it. A mount of it that is still there while the claim was free
/// was left by an `iscsi mount` that died (SIGKILL): its directory answers
/// ENOTCONN, it serves nothing, and it is removed (with a warning) rather
/// than blocking this mount until someone runs `fusermount3 -u`.
fn claim(source: &str) -> anyhow::Result<Claim> {
    let refusal = |dir: &str| {
        anyhow::anyhow!(
            "{source} is already mounted at {dir} by iscsi mount: a second mount is a second \
             initiator writing the same LUNs with nothing between the two; --shared mounts it \
             anyway"
        )
    };
    let claim = match Claim::take("mount", source) {
        Ok(claim) => claim,
        Err(Refused::Held(pid)) => {
            let holder = pid
                .map(|pid| format!(" (process {pid})"))
                .unwrap_or_default();
            return Err(match mounted_at(source) {
                Some(dir) => refusal(&dir).context(format!("held by iscsi mount{holder}")),
                None => anyhow::anyhow!("{source} is being mounted by another iscsi mount{holder}"),
            });
        }
        Err(Refused::Failed(error)) => return Err(error),
    };
    while let Some(dir) = mounted_at(source) {
        // statfs, not stat: the kernel answers stat from its attribute
        // cache, while statfs always asks the server.
        let dead = matches!(
            nix::sys::statfs::statfs(dir.as_str()),
            Err(nix::errno::Errno::ENOTCONN)
        );
        if !dead {
            // A live --shared mount holds no claim.
            return Err(refusal(&dir));
        }
        tracing::warn!(
            %dir,
            "removing a dead mount of this target left by an iscsi mount that was killed"
        );
        detach(Path::new(&dir)).with_context(|| format!("removing the dead mount at {dir}"))?;
    }
    Ok(claim)
}

/// Where `source` is mounted by `iscsi mount` already, if anywhere.
fn mounted_at(source: &str) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split(' ');
        let (from, dir, kind) = (fields.next()?, fields.next()?, fields.next()?);
        // "fuse" when mounted by root directly, "fuse.iscsi" through
        // fusermount3 (which applies the subtype).
        (from == source && (kind == "fuse" || kind == "fuse.iscsi")).then(|| dir.to_owned())
    })
}

/// The mount point exists and is a directory: said before logging in.
fn check_mount_point(dir: &Path) -> anyhow::Result<()> {
    let metadata =
        std::fs::metadata(dir).with_context(|| format!("mount point {}", dir.display()))?;
    if !metadata.is_dir() {
        bail!("mount point {} is not a directory", dir.display());
    }
    Ok(())
}

/// Logs in and opens every LUN the target reports: through the first
/// URL's session, or, with several URLs, through a multipath set per LUN
/// (the session that asked REPORT LUNS is logged out then).
async fn open(args: &Args) -> anyhow::Result<(Option<Arc<Session>>, Vec<LunFile>)> {
    let urls = args
        .urls
        .iter()
        .map(|url| target_url(url))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let url = &urls[0];
    let session_args = args.session.for_disk();
    let session = Arc::new(connect(url, &session_args).await?);
    let luns = session.report_luns().await.context("REPORT LUNS")?;
    if luns.is_empty() {
        bail!("the target {url} has no LUNs");
    }
    let several = urls.len() > 1;
    let mut files = Vec::with_capacity(luns.len());
    for lun in luns {
        let disk = if several {
            let paths: Vec<IscsiUrl> = urls.iter().map(|u| IscsiUrl { lun, ..u.clone() }).collect();
            let paths = multipath_of(&paths, &session_args).await?;
            Disk::over(Arc::new(paths)).await
        } else {
            Disk::open(Arc::clone(&session), lun).await
        };
        let disk = disk.with_context(|| format!("opening LUN {lun}"))?;
        let read_only = args.read_only || disk.limits().read_only;
        files.push(LunFile {
            name: format!("lun{lun}"),
            disk: Arc::new(disk),
            read_only,
        });
    }
    if several {
        let _ = session.logout().await;
        return Ok((None, files));
    }
    Ok((Some(session), files))
}

/// The FUSE mount options: named after the target, permissions checked by
/// the kernel.
fn config(args: &Args, source: &str) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(source.to_owned()),
        MountOption::Subtype("iscsi".to_owned()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if args.read_only {
        config.mount_options.push(MountOption::RO);
    }
    if args.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(1);
    config
}

/// A mount failure in terms of what to do about it.
fn mount_error(dir: &Path, error: std::io::Error) -> anyhow::Error {
    let hint = match error.kind() {
        std::io::ErrorKind::PermissionDenied => {
            "no permission to mount: run as root, or install fuse3 (its setuid fusermount3 \
             mounts for users) and check /dev/fuse is readable and writable"
        }
        std::io::ErrorKind::NotFound => {
            "/dev/fuse or fusermount3 is missing: load the fuse module (modprobe fuse) and \
             install fuse3"
        }
        _ => "FUSE mount failed",
    };
    anyhow::Error::new(error).context(format!("mounting on {}: {hint}", dir.display()))
}

/// Serves until the mount goes away (fusermount3 -u, umount) or a signal:
/// the first unmounts and waits for open files to close, the second stops
/// waiting.
async fn serve(mounted: fuser::BackgroundSession, dir: &Path) -> anyhow::Result<()> {
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut poll = tokio::time::interval(Duration::from_millis(100));
    // Until a signal, the session runs on fuser's thread; after one, the
    // unmount and the wait for that thread run on a blocking task.
    let mut unmounting = None;
    let mut mounted = Some(mounted);
    loop {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
            _ = poll.tick() => {
                if let Some(ended) = mounted.take_if(|m| m.guard.is_finished()) {
                    tracing::info!(dir = %dir.display(), "unmounted");
                    return finished(ended.join());
                }
                if let Some(done) = unmounting.take_if(|u: &mut tokio::task::JoinHandle<_>| u.is_finished()) {
                    tracing::info!(dir = %dir.display(), "unmounted");
                    return finished(done.await.context("the unmount task")?);
                }
                continue;
            }
        }
        match mounted.take() {
            Some(session) => {
                tracing::info!(
                    dir = %dir.display(),
                    "unmounting; open files keep working until closed (a second signal stops waiting)"
                );
                let dir = dir.to_owned();
                unmounting = Some(tokio::task::spawn_blocking(move || {
                    detach(&dir)?;
                    session.join()
                }));
            }
            None => {
                tracing::warn!(dir = %dir.display(), "stopping with files still open: their next requests fail");
                return Ok(());
            }
        }
    }
}

/// A lazy unmount of `dir` (MNT_DETACH): gone from the namespace at once,
/// served until its last open file is closed. Users other than root
/// cannot unmount, so for them fusermount3 does it (`-u -z`).
fn detach(dir: &Path) -> std::io::Result<()> {
    match nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => {
            let status = std::process::Command::new("fusermount3")
                .args(["-u", "-z", "--"])
                .arg(dir)
                .status()?;
            if status.success() {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "fusermount3 -u -z: {status}"
                )))
            }
        }
        Err(errno) => Err(errno.into()),
    }
}

/// The end of fuser's session thread, as this command's outcome.
///
/// ECONNABORTED is the end of an unmount, not a failure: when the last
/// user of a (lazily) unmounted mount goes, the kernel tears the
/// connection down, and a read of /dev/fuse that had already taken a
/// request off the queue (a RELEASE, a FORGET) gets ECONNABORTED rather
/// than the usual ENODEV (fs/fuse/dev.c, "must not put request on fpq->io
/// queue after having been shut down"). The other way to it, an abort
/// through /sys/fs/fuse/connections, reads ENODEV too, since fuser does
/// not ask for FUSE_ABORT_ERROR; either way every request this process
/// answered stands, and `finish` still flushes and logs out.
fn finished(result: std::io::Result<()>) -> anyhow::Result<()> {
    match result {
        Err(error) if error.raw_os_error() == Some(libc::ECONNABORTED) => {
            tracing::debug!("the kernel ended the FUSE connection during a read: {error}");
            Ok(())
        }
        result => result.context("the FUSE session"),
    }
}

/// Makes every acknowledged write durable and logs out.
async fn finish(session: Option<&Session>, disks: &[Arc<Disk>]) -> anyhow::Result<()> {
    for disk in disks {
        disk.flush()
            .await
            .with_context(|| format!("SYNCHRONIZE CACHE of LUN {}", disk.lun()))?;
    }
    log_out(session, disks).await
}

/// Logs out the one session, or every LUN's paths.
async fn log_out(session: Option<&Session>, disks: &[Arc<Disk>]) -> anyhow::Result<()> {
    match session {
        Some(session) => session.logout().await.context("logout"),
        None => {
            for disk in disks {
                disk.paths().logout().await.context("logout")?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_torn_down_under_a_read_ends_the_session_cleanly() {
        let aborted = std::io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert!(finished(Err(aborted)).is_ok());
        assert!(finished(Ok(())).is_ok());
        let other = std::io::Error::from_raw_os_error(libc::EIO);
        let error = finished(Err(other)).unwrap_err();
        assert!(
            format!("{error:#}").contains("the FUSE session"),
            "{error:#}"
        );
    }
}
