//! One ublk queue, served on the thread that drives it: its io_uring is
//! watched by the tokio reactor of that thread (the ring's fd is readable
//! while completions wait), and each request runs as a future polled by
//! the queue itself, on that same thread, straight into the iSCSI session.
//! No second executor, no channel, no eventfd between the two.
//!
//! The driver requires every command of a queue to come from one thread
//! (`ubq_daemon`), so the queue's future must stay on the thread that
//! first polls it: [`Queue::serve`] is run with `block_on` on a thread of
//! its own, never spawned onto a multi-threaded runtime.
//!
//! A tag's life: FETCH; its completion brings a request (the tag's
//! descriptor says which); the request runs; COMMIT_AND_FETCH answers it
//! and waits for the tag's next request. Data moves by user copy: a WRITE's
//! data is read from the character device at the tag's offset straight
//! into the buffer the session sends, a READ's data is written there from
//! the buffer the session received into. Stopping the device completes
//! every tag's command with ABORT; the queue ends when every tag has seen
//! it and no request is running.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use io_uring::IoUring;
use iscsi_initiator::disk::errno;
use iscsi_initiator::{Disk, with_connection_affinity};

use super::super::request::Request;
use super::sys::{self, Descriptors};
use super::uapi::{self, Encoding, IO_RES_ABORT, IO_RES_OK, IoOp};

/// One queue of a device, set up and not yet serving.
pub struct Queue {
    qid: u16,
    depth: u16,
    /// Largest request we take (the device's `max_io_buf_bytes`).
    max_io: usize,
    encoding: Encoding,
    ring: IoUring,
    descriptors: Descriptors,
}

impl Queue {
    /// Sets up queue `qid` of `depth` tags of the device whose character
    /// device is `cdev`.
    pub fn new(
        cdev: &File,
        qid: u16,
        depth: u16,
        max_io: usize,
        encoding: Encoding,
    ) -> io::Result<Queue> {
        use std::os::fd::AsFd;
        let descriptors = Descriptors::map(cdev.as_fd(), qid, depth)?;
        // One command per tag is ever in flight; the completion ring is
        // twice that by default, so it cannot overflow.
        let ring = IoUring::builder().build(u32::from(depth))?;
        Ok(Queue {
            qid,
            depth,
            max_io,
            encoding,
            ring,
            descriptors,
        })
    }

    /// Serves the queue until the device stops. Run on the thread that will
    /// poll it to the end (see the module doc), inside a tokio runtime.
    /// `fetched` is called once every tag's FETCH is with the driver (what
    /// START_DEV waits for); a message on `abandon` ends the queue before
    /// the device stops (it never started): its commands are cancelled when
    /// the ring closes.
    pub async fn serve(
        self,
        cdev: &File,
        disk: &Disk,
        fetched: impl FnOnce(),
        mut abandon: tokio::sync::oneshot::Receiver<()>,
    ) -> io::Result<()> {
        let Queue {
            qid,
            depth,
            max_io,
            encoding,
            ring,
            descriptors,
        } = self;
        let mut ring = sys::watch(ring)?;
        let fd = cdev.as_raw_fd();
        let fetch = encoding.io(IoOp::Fetch);
        let commit = encoding.io(IoOp::CommitAndFetch);
        for tag in 0..depth {
            // The ring has room for one command per tag.
            sys::push_io(ring.get_mut(), fd, fetch, (qid, tag), 0, u64::from(tag));
        }
        submit(ring.get_ref())?;
        fetched();
        let mut requests = 0usize;
        let mut live = usize::from(depth);
        let mut running = FuturesUnordered::new();
        // Each tag's data buffer, kept from one request to the next: no
        // allocation, no zeroing, no fresh page per request.
        let mut buffers: Vec<Vec<u8>> = vec![Vec::new(); usize::from(depth)];
        let mut may_abandon = true;
        loop {
            submit(ring.get_ref())?;
            for cqe in ring.get_mut().completion() {
                let tag = cqe.user_data() as u16;
                match cqe.result() {
                    IO_RES_OK => {
                        requests += 1;
                        let request = descriptors.get(tag);
                        let buffer = std::mem::take(&mut buffers[usize::from(tag)]);
                        running.push(with_connection_affinity(
                            usize::from(qid),
                            serve_request(cdev, (qid, tag), request, max_io, disk, buffer),
                        ));
                    }
                    IO_RES_ABORT => live -= 1,
                    e => {
                        // Not a request and not the end: the driver refused
                        // the command, so this tag serves nothing more.
                        tracing::error!(
                            "ublk queue {qid} tag {tag}: {}",
                            io::Error::from_raw_os_error(-e)
                        );
                        live -= 1;
                    }
                }
            }
            if live == 0 && running.is_empty() {
                tracing::debug!("ublk queue {qid}: ended after {requests} requests");
                return Ok(());
            }
            tokio::select! {
                Some((tag, result, buffer)) = running.next(), if !running.is_empty() => {
                    buffers[usize::from(tag)] = buffer;
                    sys::push_io(ring.get_mut(), fd, commit, (qid, tag), result, u64::from(tag));
                    // Every other answer ready now goes in the same submit.
                    while let Some(Some((tag, result, buffer))) = running.next().now_or_never() {
                        buffers[usize::from(tag)] = buffer;
                        sys::push_io(ring.get_mut(), fd, commit, (qid, tag), result, u64::from(tag));
                    }
                }
                abandoned = &mut abandon, if may_abandon => {
                    if abandoned.is_ok() {
                        return Err(io::Error::other("abandoned before the device started"));
                    }
                    // The sender is gone without a word: the device started.
                    may_abandon = false;
                }
                guard = ring.readable() => {
                    // Cleared before the completions are read (at the top of
                    // the loop): one that arrives after makes it ready again.
                    guard?.clear_ready();
                }
            }
        }
    }
}

/// Submits what the queue pushed, without waiting.
fn submit(ring: &IoUring) -> io::Result<()> {
    loop {
        match ring.submit() {
            Ok(_) => return Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) =>
            {
                std::thread::yield_now();
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs the request in tag `(qid, tag)` with the tag's `buffer`; the tag,
/// the answer ublk wants (bytes moved, or a negative errno) and the buffer
/// to keep for the tag's next request (empty after a failed read).
async fn serve_request(
    cdev: &File,
    (qid, tag): (u16, u16),
    desc: uapi::IoDesc,
    max_io: usize,
    disk: &Disk,
    mut buffer: Vec<u8>,
) -> (u16, i32, Vec<u8>) {
    let Some(request) = Request::from_descriptor(desc.op_flags, desc.start_sector, desc.nr_sectors)
    else {
        return (tag, -libc::EOPNOTSUPP, buffer);
    };
    if request.data_len() > max_io {
        return (tag, -libc::EINVAL, buffer);
    }
    tracing::trace!("queue {qid} tag {tag}: {request:?}");
    let at = uapi::user_copy_offset(qid, tag);
    let result = match request {
        Request::Read { offset, len } => match disk.read_with(offset, len, buffer).await {
            Ok(data) => {
                let copied = copy_out(cdev, &data, at);
                buffer = data;
                copied
            }
            Err(e) => {
                buffer = Vec::new();
                Err(errno(&e))
            }
        },
        Request::Write { offset, len, fua } => {
            // Zeroed only where the buffer grows (a tag's first request
            // this large); the bytes are overwritten by the copy anyway.
            if buffer.len() < len {
                buffer.resize(len, 0);
            }
            let data = &mut buffer[..len];
            match copy_in(cdev, data, at) {
                Ok(()) => disk.write(offset, data, fua).await.map_err(|e| errno(&e)),
                Err(code) => Err(code),
            }
        }
        Request::Flush => disk.flush().await.map_err(|e| errno(&e)),
        Request::Discard { offset, len } => disk.discard(offset, len).await.map_err(|e| errno(&e)),
        Request::WriteZeroes {
            offset,
            len,
            may_unmap,
        } => disk
            .write_zeroes(offset, len, may_unmap)
            .await
            .map_err(|e| errno(&e)),
    };
    match result {
        Ok(()) => {
            let done = i32::try_from(request.data_len()).unwrap_or(i32::MAX);
            (tag, done, buffer)
        }
        Err(code) => {
            tracing::warn!("{request:?}: {}", io::Error::from_raw_os_error(code));
            (tag, -code, buffer)
        }
    }
}

/// A WRITE's data, from the request (user copy: pread on the character
/// device at the tag's offset).
fn copy_in(cdev: &File, data: &mut [u8], at: u64) -> Result<(), i32> {
    let mut done = 0;
    while done < data.len() {
        let offset = libc::off_t::try_from(at + done as u64).map_err(|_| libc::EINVAL)?;
        match nix::sys::uio::pread(cdev, &mut data[done..], offset) {
            Ok(0) => return Err(libc::EIO),
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e as i32),
        }
    }
    Ok(())
}

/// A READ's data, into the request (user copy: pwrite on the character
/// device at the tag's offset).
fn copy_out(cdev: &File, data: &[u8], at: u64) -> Result<(), i32> {
    let mut done = 0;
    while done < data.len() {
        let offset = libc::off_t::try_from(at + done as u64).map_err(|_| libc::EINVAL)?;
        match nix::sys::uio::pwrite(cdev, &data[done..], offset) {
            Ok(0) => return Err(libc::EIO),
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e as i32),
        }
    }
    Ok(())
}
