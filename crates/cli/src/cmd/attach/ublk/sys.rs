//! Every `unsafe` of the ublk driver, in one place: pushing commands onto
//! io_uring submission queues, and the queue's descriptor array mapped from
//! the character device. The rest of the driver (`control.rs`, `queue.rs`)
//! is safe code over what this module offers.
//!
//! The invariants these rest on:
//! - **I/O commands carry no buffer.** Devices are created with
//!   `UBLK_F_USER_COPY`, so FETCH and COMMIT_AND_FETCH have `addr` 0 and
//!   the driver reads only the SQE itself, which io_uring copies when it is
//!   submitted. [`push_io`] builds the command itself, so no caller can put
//!   an address in it. Request data moves by pread/pwrite on the character
//!   device instead, which are ordinary safe syscalls.
//! - **A control command's buffer outlives the command.** [`control`] owns
//!   the buffer (a `Box`) for the whole round trip: it submits, waits for
//!   the command's completion and only then hands the buffer back. If the
//!   ring fails while the command may still be with the kernel, the buffer
//!   is leaked rather than freed, so a late write by the driver lands in
//!   memory nobody else uses.
//! - **The ring's fd stays the ring's.** [`watch`] hands the ring itself
//!   to the reactor's `AsyncFd`, which owns it; the ring closes its fd only
//!   when it drops, after the reactor let go of it.
//! - **The descriptor array is read-only shared memory the driver writes.**
//!   It is mapped `PROT_READ`, at the offset and length the driver checks
//!   (`ublk_ch_mmap`), and read with volatile reads only for a tag whose
//!   FETCH has completed (the driver filled it before posting the
//!   completion, and io_uring's completion ring orders the two). The
//!   mapping lives until [`Descriptors`] drops, and nothing else points into it.

use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;

use io_uring::{IoUring, opcode, squeue, types};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::uapi::{self, CtrlCmd, IO_DESC_LEN, IoDesc};

/// The ring control commands go through: 128-byte SQEs, whose 80-byte
/// command area holds `struct ublksrv_ctrl_cmd` (the driver refuses control
/// commands on a ring without them).
pub type ControlRing = IoUring<squeue::Entry128>;

/// Sends one control command on `ring` to the control device `fd` and waits
/// for its result: the CQE's `res` (negative errno on failure) and the
/// buffer, which the driver may have written. `cmd.len` is set from the
/// buffer.
pub fn control(
    ring: &mut ControlRing,
    fd: RawFd,
    cmd_op: u32,
    mut cmd: CtrlCmd,
    mut buffer: Option<Box<[u8]>>,
) -> io::Result<(i32, Option<Box<[u8]>>)> {
    let addr = match buffer.as_mut() {
        Some(b) => {
            cmd.len = u16::try_from(b.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
            b.as_mut_ptr() as u64
        }
        None => 0,
    };
    let entry = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
        .cmd(cmd.emit(addr))
        .build()
        .user_data(u64::from(cmd_op));
    // SAFETY: the command's only memory besides the SQE is `buffer`, which
    // this function owns until the completion is reaped below, or leaks if
    // the command might still be in flight (see the module doc).
    let pushed = unsafe { ring.submission().push(&entry) };
    if pushed.is_err() {
        // Nothing was queued: the ring is ours alone and empties on every
        // call, so a full one means a bug, not a busy kernel.
        return Err(io::Error::other("the control ring is full"));
    }
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => {
                if let Some(b) = buffer {
                    Box::leak(b);
                }
                return Err(e);
            }
        }
        if let Some(cqe) = ring.completion().next() {
            return Ok((cqe.result(), buffer));
        }
    }
}

/// Pushes I/O command `cmd_op` (FETCH or COMMIT_AND_FETCH) for `(q_id,
/// tag)` on the queue's ring, answering `result` (COMMIT only), with no
/// buffer address: the device uses user copy. `user_data` comes back in the
/// completion. `false` when the submission queue is full.
pub fn push_io(
    ring: &mut IoUring,
    cdev: RawFd,
    cmd_op: u32,
    (q_id, tag): (u16, u16),
    result: i32,
    user_data: u64,
) -> bool {
    let entry = opcode::UringCmd16::new(types::Fd(cdev), cmd_op)
        .cmd(uapi::io_cmd(q_id, tag, result))
        .build()
        .user_data(user_data);
    // SAFETY: the command's `addr` is 0 (`uapi::io_cmd` writes none): the
    // driver reads nothing but the SQE, which io_uring copies at submission.
    unsafe { ring.submission().push(&entry) }.is_ok()
}

/// `ring` watched by the current tokio runtime's reactor: readable while
/// completions wait. Call inside the runtime.
pub fn watch(ring: IoUring) -> io::Result<AsyncFd<IoUring>> {
    // SAFETY: the ring owns its fd, keeps it open for its whole life and
    // answers the same fd from every `as_raw_fd`; the AsyncFd owns the ring.
    unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// One queue's array of I/O descriptors, mapped from the device's
/// character device.
pub struct Descriptors {
    base: NonNull<libc::c_void>,
    len: usize,
    depth: u16,
}

// SAFETY: the mapping is plain shared memory owned by this value alone;
// moving it to another thread changes nothing about who may read it.
unsafe impl Send for Descriptors {}

impl Descriptors {
    /// Maps the descriptors of queue `qid` (`depth` tags) of the device
    /// whose character device is `cdev`.
    pub fn map(cdev: BorrowedFd<'_>, qid: u16, depth: u16) -> io::Result<Descriptors> {
        let page = page_size();
        let len = uapi::descriptors_len(depth, page);
        let offset = libc::off_t::try_from(uapi::descriptors_offset(qid, page))
            .map_err(|_| io::ErrorKind::InvalidInput)?;
        let length = NonZeroUsize::new(len).ok_or(io::ErrorKind::InvalidInput)?;
        // SAFETY: a new mapping at an address the kernel picks, so it
        // aliases nothing; read-only, of the length and offset the driver
        // accepts for this queue. Unmapped only by Drop.
        let base = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                cdev,
                offset,
            )
        }?;
        Ok(Descriptors { base, len, depth })
    }

    /// Tag `tag`'s descriptor, as the driver last wrote it. Read it only
    /// after the tag's FETCH completed with a request.
    pub fn get(&self, tag: u16) -> IoDesc {
        assert!(tag < self.depth, "tag {tag} of a queue of {}", self.depth);
        let at = usize::from(tag) * IO_DESC_LEN;
        // SAFETY: `at + IO_DESC_LEN <= depth * IO_DESC_LEN <= len`: inside
        // the mapping, which lives as long as `self`. Volatile because the
        // driver writes this memory; any bytes are a valid [u8; N].
        let raw = unsafe {
            std::ptr::read_volatile(
                self.base
                    .as_ptr()
                    .cast::<u8>()
                    .add(at)
                    .cast::<[u8; IO_DESC_LEN]>(),
            )
        };
        IoDesc::parse(&raw)
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping made in `map`, unmapped
        // once, here; no reference into it outlives `self` (`get` copies).
        if let Err(e) = unsafe { munmap(self.base, self.len) } {
            tracing::warn!("unmapping ublk descriptors: {e}");
        }
    }
}

/// The system's page size.
fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::{AsFd, AsRawFd};

    /// A new empty file of this test process's own, read and written.
    fn scratch_file(name: &str) -> (std::fs::File, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("ublk-{name}-{}", std::process::id()));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        (file, path)
    }

    /// The mapping and volatile reads, over an ordinary file standing in
    /// for the character device (the same `mmap` call; the driver's array
    /// is laid out the same way).
    #[test]
    fn descriptors_are_read_from_the_mapping_at_their_tag() {
        let (mut file, path) = scratch_file("descs");
        let mut bytes = vec![0u8; 4096];
        for tag in 0..3u32 {
            let at = tag as usize * IO_DESC_LEN;
            bytes[at..at + 4].copy_from_slice(&(tag + 1).to_ne_bytes());
            bytes[at + 4..at + 8].copy_from_slice(&(8 * tag).to_ne_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&(1000 + u64::from(tag)).to_ne_bytes());
        }
        file.write_all(&bytes).unwrap();
        let d = Descriptors::map(file.as_fd(), 0, 3).unwrap();
        assert_eq!(d.get(2).op_flags, 3);
        assert_eq!(d.get(2).nr_sectors, 16);
        assert_eq!(d.get(2).start_sector, 1002);
        assert_eq!(d.get(0).start_sector, 1000);
        // A write after the mapping is seen: the memory is shared.
        use std::os::unix::fs::FileExt;
        file.write_at(&7u32.to_ne_bytes(), 0).unwrap();
        assert_eq!(d.get(0).op_flags, 7);
        drop(d);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    #[should_panic(expected = "tag 3 of a queue of 3")]
    fn a_tag_beyond_the_queue_is_refused() {
        let (file, path) = scratch_file("descs-beyond");
        file.set_len(4096).unwrap();
        let d = Descriptors::map(file.as_fd(), 0, 3).unwrap();
        std::fs::remove_file(&path).unwrap();
        d.get(3);
    }

    /// A control command's round trip through a real ring: a URING_CMD on
    /// a regular file, which takes none, fails with its errno, and the
    /// buffer comes back to the caller. (Not /dev/null: Linux 6.x answers
    /// every URING_CMD there with success.)
    #[test]
    fn a_refused_control_command_returns_its_errno_and_the_buffer() {
        let Ok(mut ring) = ControlRing::builder().build(4) else {
            eprintln!("io_uring is not available here: nothing to check");
            return;
        };
        let path = std::env::temp_dir().join(format!("ublk-ctrl-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let buffer = vec![7u8; 64].into_boxed_slice();
        let (res, back) = control(
            &mut ring,
            file.as_raw_fd(),
            uapi::Encoding::Ioctl.ctrl(uapi::CtrlOp::GetFeatures),
            CtrlCmd::for_device(u32::MAX),
            Some(buffer),
        )
        .unwrap();
        assert!(res < 0, "a regular file took a ublk command: {res}");
        assert_eq!(back.unwrap().len(), 64);
    }
}
