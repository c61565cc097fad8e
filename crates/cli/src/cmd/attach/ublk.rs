//! Everything that talks to the kernel's ublk driver, through `libublk`:
//! the control device, the device's parameters, one thread per ublk queue
//! serving its tags, and stopping a device by id (`iscsi detach`).
//!
//! How a request travels. Each queue thread runs a single-threaded `smol`
//! executor over the queue's io_uring (libublk's model): one task per tag
//! FETCHes a request, turns its descriptor into a [`Request`], and hands it
//! to the tokio runtime the iSCSI session lives on. The tokio task runs the
//! SCSI command through [`Disk`], sends the result back on a oneshot and
//! writes the queue's eventfd. The queue thread sleeps in `io_uring_enter`,
//! so the eventfd is what wakes it: a read of it is always pending on the
//! ring, and its completion lets the executor run the tag's task, which
//! COMMITs the result (and FETCHes the next request) with the same buffer.
//!
//! Memory handed to the kernel, and why no `unsafe` block is needed here:
//! - each tag's data buffer is a libublk `IoBuf` registered with the
//!   FETCH and passed again at each COMMIT (libublk checks that it is the
//!   same buffer); the kernel copies into and out of it only while the
//!   tag's command is with the kernel, when the task does not touch it;
//! - the eventfd read's 8-byte target is a leaked `Box` ([`Wakeup`]): the
//!   read may still be pending when the queue ends (nobody reaps it), so the
//!   target must stay valid for the life of the process. Leaking 8 bytes per
//!   queue once per attach is the price of that guarantee.
//!
//! The SQE builders take raw pointers but are safe to call, and libublk's
//! `ublk_submit_sqe` does the one `unsafe` push itself; so this module has
//! no `unsafe` of its own and the invariants above are what its safety
//! rests on.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;

use anyhow::{Context, bail};
use io_uring::{opcode, types};
use iscsi_initiator::disk::errno;
use iscsi_initiator::{Disk, with_connection_affinity};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::{BufDesc, UblkError, UblkFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::request::{DeviceParams, Request};

/// The control device every ublk operation starts from.
pub const CONTROL: &str = "/dev/ublk-control";

/// The largest request we take: ublk's I/O buffer per tag (memory held per
/// tag, `depth` of them per queue), and never more than the LUN's maximum
/// transfer.
const MAX_IO_BYTES: u32 = 512 << 10;

/// Checks that ublk can be used here, saying what to do when it cannot:
/// `libublk` would only report an errno.
pub fn check_available() -> anyhow::Result<()> {
    check_control(std::path::Path::new(CONTROL))
}

/// [`check_available`] for a control device at `path` (tests).
fn check_control(path: &std::path::Path) -> anyhow::Result<()> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => bail!(
            "{} is missing: load the ublk_drv module (Linux 6.0+)",
            path.display()
        ),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => bail!(
            "{}: permission denied: attaching a device needs root (or CAP_SYS_ADMIN)",
            path.display()
        ),
        Err(e) => Err(e).with_context(|| format!("opening {}", path.display())),
    }
}

/// How the device is built.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// ublk hardware queues, one thread each.
    pub queues: u16,
    /// Requests in flight per queue.
    pub depth: u16,
}

/// What identifies the LUN served, written into the device's run file
/// (libublk's JSON in `/run/ublksrvd/`) so that a second `iscsi attach` of
/// the same LUN on this host can see it is attached already.
pub type Identity = serde_json::Value;

/// The LUN `identity` when a device on this host serves it already: its
/// block device path.
pub fn attached_already(identity: &Identity) -> Option<String> {
    let dir = std::fs::read_dir(UblkCtrl::run_dir()).ok()?;
    for entry in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        if json.get("target_data").and_then(|t| t.get("iscsi")) == Some(identity) {
            let id = json.get("dev_info").and_then(|d| d.get("dev_id"))?;
            // A run file outlives a server that was killed: believe it only
            // while the block device is there.
            let path = format!("/dev/ublkb{id}");
            if std::path::Path::new(&path).exists() {
                return Some(path);
            }
        }
    }
    None
}

/// Creates the device for `disk`, serves it until it is stopped (by
/// [`stop`] from anywhere: `iscsi detach`, a signal), and deletes it.
/// `live` is called with the block device's path and id once the kernel
/// has it. Returns once every queue has ended: no request is in flight.
pub fn serve(
    disk: Arc<Disk>,
    runtime: tokio::runtime::Handle,
    shape: Shape,
    identity: Identity,
    live: impl FnOnce(String, u32) + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let max_io = disk.limits().max_transfer.min(MAX_IO_BYTES);
    let params = DeviceParams::from_limits(disk.limits(), max_io);
    let ctrl = UblkCtrlBuilder::default()
        .name("iscsi")
        .id(-1)
        .nr_queues(shape.queues)
        .depth(shape.depth)
        .io_buf_bytes(max_io)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
        .build()
        .map_err(|e| ublk_error("creating the ublk device", e))?;
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(params.dev_sectors << 9);
        // One more entry in each queue's ring than it has tags: the
        // eventfd read of [`Wakeup`] is always pending beside the FETCHes.
        dev.tgt.extra_ios = 1;
        dev.tgt.sq_depth = shape.depth + 1;
        dev.tgt.cq_depth = shape.depth + 1;
        dev.tgt.params = device_params(&params);
        dev.set_target_json(serde_json::json!({ "iscsi": identity }));
        Ok(())
    };
    let queue = move |qid: u16, dev: &UblkDev| serve_queue(qid, dev, &disk, &runtime);
    let on_start = move |ctrl: &UblkCtrl| live(ctrl.get_bdev_path(), ctrl.dev_info().dev_id);
    let served = ctrl.run_target(tgt_init, queue, on_start);
    if served.is_err() {
        // The device did not start (its parameters refused, say): its
        // queue threads still wait for requests, and deleting the device
        // (when `ctrl` drops) would wait for them forever. Stopping it
        // cancels their FETCHes, so they end.
        let _ = ctrl.stop_dev();
    }
    served.map_err(|e| ublk_error("starting the ublk device", e))?;
    Ok(())
}

/// Stops device `id`: the kernel removes the block device (waiting for the
/// requests it holds), then ends the serving process's queues, which
/// flushes, logs out and deletes the device.
pub fn stop(id: u32) -> anyhow::Result<()> {
    let id = i32::try_from(id).context("device id")?;
    let ctrl = UblkCtrl::new_simple(id).map_err(|e| ublk_error("opening the ublk device", e))?;
    ctrl.stop_dev()
        .map_err(|e| ublk_error("stopping the ublk device", e))?;
    Ok(())
}

/// Deletes device `id` when its server is gone (an `iscsi attach` killed
/// with SIGKILL leaves the device behind, stopped by the kernel but never
/// deleted); `Ok(false)` when a live process still serves it, which
/// [`stop`] is for. Deleting a served device would wait for its server.
pub fn remove_orphan(id: u32) -> anyhow::Result<bool> {
    let id = i32::try_from(id).context("device id")?;
    let ctrl = UblkCtrl::new_simple(id).map_err(|e| ublk_error("opening the ublk device", e))?;
    let pid = ctrl.dev_info().ublksrv_pid;
    if pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Ok(false);
    }
    ctrl.del_dev()
        .map_err(|e| ublk_error("deleting the ublk device", e))?;
    Ok(true)
}

/// libublk's errors carry a negative errno or an io::Error; say which.
fn ublk_error(doing: &str, e: UblkError) -> anyhow::Error {
    match e {
        UblkError::OtherError(code) | UblkError::UringIOError(code) => {
            anyhow::anyhow!(
                "{doing}: {}",
                std::io::Error::from_raw_os_error(code.saturating_abs())
            )
        }
        other => anyhow::anyhow!("{doing}: {other}"),
    }
}

/// `struct ublk_params` for `p`: basic limits always, discard only where
/// the LUN offers UNMAP (the kernel then sends DISCARD and WRITE_ZEROES).
fn device_params(p: &DeviceParams) -> libublk::sys::ublk_params {
    use libublk::sys;
    let mut attrs = 0;
    if p.write_cache {
        attrs |= sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    }
    if p.read_only {
        attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    let mut params = sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC,
        basic: sys::ublk_param_basic {
            attrs,
            logical_bs_shift: p.logical_bs_shift,
            physical_bs_shift: p.physical_bs_shift,
            io_opt_shift: p.io_opt_shift,
            io_min_shift: p.physical_bs_shift,
            max_sectors: p.max_sectors,
            dev_sectors: p.dev_sectors,
            ..Default::default()
        },
        ..Default::default()
    };
    if let Some(d) = p.discard {
        params.types |= sys::UBLK_PARAM_TYPE_DISCARD;
        params.discard = sys::ublk_param_discard {
            discard_alignment: d.alignment,
            discard_granularity: d.granularity,
            max_discard_sectors: d.max_sectors,
            max_write_zeroes_sectors: p.max_write_zeroes_sectors,
            max_discard_segments: d.max_segments,
            ..Default::default()
        };
    }
    params
}

/// The wake-up of a queue thread by the tokio tasks that finish its
/// requests: an eventfd with a read always pending on the queue's ring.
struct Wakeup {
    fd: Arc<EventFd>,
    /// The pending read's target. Leaked (see the module doc): a read
    /// still pending when the queue ends writes here later.
    target: *mut u64,
}

impl Wakeup {
    fn new() -> anyhow::Result<Wakeup> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
            .context("creating the queue's eventfd")?;
        Ok(Wakeup {
            fd: Arc::new(fd),
            target: Box::into_raw(Box::new(0u64)),
        })
    }

    /// Reads the eventfd on the ring, again and again, until the ring
    /// refuses (the queue is ending); each completion wakes the thread.
    async fn drain(&self, q: &UblkQueue<'_>) {
        loop {
            let sqe =
                opcode::Read::new(types::Fd(self.fd.as_raw_fd()), self.target.cast(), 8).build();
            let res = q.ublk_submit_sqe(sqe).await;
            tracing::trace!("queue {} woken: {res}", q.get_qid());
            if res < 0 && res != -libc::EINTR && res != -libc::EAGAIN {
                return;
            }
        }
    }
}

/// One queue's thread: a task per tag and the eventfd's reader on a local
/// executor, driven by the queue's ring until every tag's task has seen the
/// queue go down.
fn serve_queue(qid: u16, dev: &UblkDev, disk: &Arc<Disk>, runtime: &tokio::runtime::Handle) {
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => q,
        Err(e) => {
            tracing::error!("ublk queue {qid}: {}", ublk_error("setting up", e));
            return;
        }
    };
    let wakeup = match Wakeup::new() {
        Ok(w) => Rc::new(w),
        Err(e) => {
            tracing::error!("ublk queue {qid}: {e:#}");
            return;
        }
    };
    let exec = smol::LocalExecutor::new();
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let (q, disk, runtime, wakeup) = (&q, Arc::clone(disk), runtime.clone(), &wakeup);
        tasks.push(exec.spawn(async move {
            match serve_tag(q, qid, tag, &disk, &runtime, wakeup).await {
                Ok(()) | Err(UblkError::QueueIsDown) => {}
                Err(e) => tracing::error!("ublk queue {qid} tag {tag}: {}", ublk_error("", e)),
            }
        }));
    }
    let reader = {
        let (q, wakeup) = (&q, &wakeup);
        exec.spawn(async move { wakeup.drain(q).await })
    };
    smol::block_on(exec.run(async {
        let run_ops = || while exec.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        if let Err(e) = libublk::wait_and_handle_io_events(&q, None, run_ops, done).await {
            tracing::error!("ublk queue {qid}: {}", ublk_error("waiting", e));
        }
    }));
    drop(reader);
}

/// One tag: FETCH, then serve and COMMIT until the queue goes down.
async fn serve_tag(
    q: &UblkQueue<'_>,
    qid: u16,
    tag: u16,
    disk: &Arc<Disk>,
    runtime: &tokio::runtime::Handle,
    wakeup: &Wakeup,
) -> Result<(), UblkError> {
    let mut buf = IoBuf::<u8>::new(q.dev.dev_info.max_io_buf_bytes as usize);
    q.submit_io_prep_cmd(tag, BufDesc::Slice(buf.as_slice()), 0, Some(&buf))
        .await?;
    loop {
        let iod = q.get_iod(tag);
        let res = match Request::from_descriptor(iod.op_flags, iod.start_sector, iod.nr_sectors) {
            Some(request) if request.data_len() <= buf.len() => {
                execute(request, qid, buf.as_mut_slice(), disk, runtime, wakeup).await
            }
            Some(_) => -libc::EINVAL,
            None => -libc::EOPNOTSUPP,
        };
        q.submit_io_commit_cmd(tag, BufDesc::Slice(buf.as_slice()), res)
            .await?;
    }
}

/// Runs `request` on the session's runtime, waiting on this queue's
/// executor; the answer ublk wants: bytes moved, or a negative errno.
async fn execute(
    request: Request,
    qid: u16,
    buf: &mut [u8],
    disk: &Arc<Disk>,
    runtime: &tokio::runtime::Handle,
    wakeup: &Wakeup,
) -> i32 {
    let data = match request {
        Request::Write { len, .. } => buf[..len].to_vec(),
        _ => Vec::new(),
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (disk, fd) = (Arc::clone(disk), Arc::clone(&wakeup.fd));
    tracing::debug!("{request:?}");
    runtime.spawn(async move {
        // Queue N's commands go on connection N (modulo the session's
        // connections): with MC/S each queue has a connection of its own.
        let result = with_connection_affinity(usize::from(qid), run(&disk, request, data)).await;
        tracing::debug!("{request:?} done: {:?}", result.as_ref().map(Vec::len));
        let _ = tx.send(result);
        // After the send: when the thread wakes, the task is ready to run.
        let _ = fd.write(1);
    });
    match rx.await {
        Ok(Ok(read)) => {
            buf[..read.len()].copy_from_slice(&read);
            i32::try_from(request.data_len()).unwrap_or(i32::MAX)
        }
        Ok(Err(code)) => -code,
        Err(_) => -libc::EIO,
    }
}

/// The SCSI side of one request; a READ's data, or the errno of a failure.
async fn run(disk: &Disk, request: Request, data: Vec<u8>) -> Result<Vec<u8>, i32> {
    let result = match request {
        Request::Read { offset, len } => {
            return disk.read(offset, len).await.map_err(|e| errno(&e));
        }
        Request::Write { offset, fua, .. } => disk.write(offset, &data, fua).await,
        Request::Flush => disk.flush().await,
        Request::Discard { offset, len } => disk.discard(offset, len).await,
        Request::WriteZeroes {
            offset,
            len,
            may_unmap,
        } => disk.write_zeroes(offset, len, may_unmap).await,
    };
    result.map(|()| Vec::new()).map_err(|e| {
        tracing::warn!("{request:?}: {e}");
        errno(&e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_control_device_says_to_load_the_module() {
        let e = check_control(std::path::Path::new("/nonexistent/ublk-control")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/nonexistent/ublk-control is missing: load the ublk_drv module (Linux 6.0+)"
        );
    }

    #[test]
    fn params_carry_cache_and_discard() {
        let p = DeviceParams {
            logical_bs_shift: 9,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            max_sectors: 1024,
            dev_sectors: 2048,
            write_cache: true,
            read_only: true,
            discard: Some(super::super::request::DiscardParams {
                alignment: 0,
                granularity: 4096,
                max_sectors: 8192,
                max_segments: 1,
            }),
            max_write_zeroes_sectors: 4096,
        };
        let u = device_params(&p);
        assert_eq!(
            u.types,
            libublk::sys::UBLK_PARAM_TYPE_BASIC | libublk::sys::UBLK_PARAM_TYPE_DISCARD
        );
        assert_ne!(u.basic.attrs & libublk::sys::UBLK_ATTR_VOLATILE_CACHE, 0);
        assert_ne!(u.basic.attrs & libublk::sys::UBLK_ATTR_FUA, 0);
        assert_ne!(u.basic.attrs & libublk::sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!(u.discard.max_discard_sectors, 8192);
        assert_eq!(u.basic.dev_sectors, 2048);
    }
}
