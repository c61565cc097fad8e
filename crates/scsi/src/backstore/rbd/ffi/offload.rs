//! The librbd calls behind the SCSI offloads of issue 36: COMPARE AND
//! WRITE in the OSD (`rbd_compare_and_write`), WRITE SAME as one request
//! per object (`rbd_writesame`) and GET LBA STATUS from the image's
//! allocated extents (`rbd_diff_iterate2`); and a write that arrived in
//! pieces as one request (`rbd_aio_writev`, waited for).
//!
//! The invariants of `ffi/mod.rs` hold here too (1: the handles of an
//! [`Image`] are valid while it lives; 2: these calls are thread safe on
//! an open image; 3: every buffer outlives its synchronous call and every
//! length is its buffer's). One more, for the only callback this crate
//! hands to librbd:
//! 5. `rbd_diff_iterate2` calls its callback on the thread that called it,
//!    before returning: without fast-diff (which only `whole_object` uses)
//!    each object's `list_snaps` completes into an `OrderedThrottle`
//!    (ceph src/common/Throttle.cc), whose `finish_op` on a librados
//!    thread only records the result; the waiting caller then runs the
//!    completions in order from `start_op`/`wait_for_ret`
//!    (`complete_pending_ops`), and `C_DiffObject::finish`
//!    (src/librbd/api/DiffIterate.cc) is where the callback is called.
//!    So the Rust callback runs on our thread, with the `&mut` state it
//!    was given still borrowed by the call; the test
//!    `allocation_follows_what_was_written_and_discarded` checks it on the
//!    installed librbd.

use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::ptr;
use std::thread::{self, ThreadId};

use super::{Image, RbdImageT};

type RbdCompletionT = *mut c_void;

/// `struct iovec` (sys/uio.h).
#[repr(C)]
struct IoVec {
    base: *const c_void,
    len: usize,
}

/// The most pieces one vectored write takes (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;

/// librbd's answer to a COMPARE AND WRITE whose compare failed.
const EILSEQ: i32 = 84;

#[link(name = "rbd")]
unsafe extern "C" {
    fn rbd_compare_and_write(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        cmp_buf: *const c_char,
        buf: *const c_char,
        mismatch_off: *mut u64,
        op_flags: c_int,
    ) -> isize;
    fn rbd_writesame(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        buf: *const c_char,
        data_len: usize,
        op_flags: c_int,
    ) -> isize;
    fn rbd_diff_iterate2(
        image: RbdImageT,
        fromsnapname: *const c_char,
        ofs: u64,
        len: u64,
        include_parent: u8,
        whole_object: u8,
        cb: extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn rbd_aio_create_completion(
        cb_arg: *mut c_void,
        complete_cb: Option<extern "C" fn(RbdCompletionT, *mut c_void)>,
        c: *mut RbdCompletionT,
    ) -> c_int;
    fn rbd_aio_writev(
        image: RbdImageT,
        iov: *const IoVec,
        iovcnt: c_int,
        off: u64,
        c: RbdCompletionT,
    ) -> c_int;
    fn rbd_aio_wait_for_complete(c: RbdCompletionT) -> c_int;
    fn rbd_aio_get_return_value(c: RbdCompletionT) -> isize;
    fn rbd_aio_release(c: RbdCompletionT);
}

/// A completion with no callback, released once on drop (so also when
/// the submission fails).
struct Completion(RbdCompletionT);

impl Completion {
    fn new() -> io::Result<Completion> {
        let mut c: RbdCompletionT = ptr::null_mut();
        // SAFETY: `c` receives the handle; no callback and no argument are
        // registered, so nothing of ours ever runs on librbd's threads.
        let r = unsafe { rbd_aio_create_completion(ptr::null_mut(), None, &mut c) };
        if r < 0 {
            return Err(io::Error::from_raw_os_error(-r));
        }
        Ok(Completion(c))
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        // SAFETY: created by rbd_aio_create_completion, released once,
        // here; a submitted request was waited for before (`writev`).
        unsafe { rbd_aio_release(self.0) };
    }
}

/// The largest range librbd's compare-and-write takes: it refuses with
/// EINVAL any range that leaves one 512-byte sector
/// (`ImageCompareAndWriteRequest::prune_object_extents`, Ceph 16).
pub(in crate::backstore::rbd) const CAW_SECTOR: u64 = 512;

/// One run of the image that `rbd_diff_iterate2` reported: `exists` false
/// is a hole (discarded or never written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::backstore::rbd) struct Extent {
    pub offset: u64,
    pub len: u64,
    pub exists: bool,
}

/// What the diff callback fills: the extents in order, and whether any
/// call came on a thread other than the one that asked (invariant 5).
struct Collect {
    extents: Vec<Extent>,
    /// Stop once this many extents are in (returning an error from the
    /// callback makes librbd stop sending; it then returns that error).
    limit: usize,
    caller: ThreadId,
    foreign_thread: bool,
}

/// The callback's "stop": an error librbd hands back from the iteration.
const STOP: c_int = -125; // -ECANCELED

extern "C" fn collect_extent(offset: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: invariant 5 — `arg` is the `&mut Collect` that `diff` passed
    // and still borrows for the whole (synchronous) call, and librbd calls
    // back on that same thread, one call at a time.
    let state = unsafe { &mut *arg.cast::<Collect>() };
    if thread::current().id() != state.caller {
        state.foreign_thread = true;
    }
    // Objects already in flight when we said stop still report.
    if state.extents.len() >= state.limit {
        return STOP;
    }
    state.extents.push(Extent {
        offset,
        len: len as u64,
        exists: exists != 0,
    });
    if state.extents.len() >= state.limit {
        STOP
    } else {
        0
    }
}

impl Image {
    /// Compares `expect` with the image at `offset` and writes `data`
    /// there only if they are equal, in one OSD operation (atomic for
    /// every client of the image). `Ok(None)`: written; `Ok(Some(k))`: byte
    /// `k` of the range is the first that differs and nothing was written.
    ///
    /// librbd 16 reports the mismatch as the object's first byte plus `k`
    /// (`ObjectCompareAndWriteRequest::filter_write_result` maps the OSD's
    /// offset, counted from the compared range, as if it were counted from
    /// the object; seen here: a mismatch at byte 37 of a range in the
    /// second object came back as 4 MiB + 37). Objects start on 512-byte
    /// boundaries and the range lies inside one 512-byte sector, so `k` is
    /// the remainder by 512; the tests pin that on a range that does not
    /// start its sector, where another counting would give another `k`. The range must stay inside one 512-byte sector
    /// ([`CAW_SECTOR`]); `expect` and `data` have the same length.
    pub(in crate::backstore::rbd) fn compare_and_write(
        &self,
        offset: u64,
        expect: &[u8],
        data: &[u8],
        flags: c_int,
    ) -> io::Result<Option<u64>> {
        if expect.len() != data.len() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let mut mismatch = 0u64;
        // SAFETY: invariants 1 and 3 — `expect` and `data` are readable for
        // `len` bytes and `mismatch` writable for the whole synchronous call.
        let n = unsafe {
            rbd_compare_and_write(
                self.image,
                offset,
                data.len(),
                expect.as_ptr().cast(),
                data.as_ptr().cast(),
                &mut mismatch,
                flags,
            )
        };
        match n {
            n if n == -(EILSEQ as isize) => {
                let k = mismatch % CAW_SECTOR;
                if k >= data.len() as u64 {
                    return Err(io::Error::other(format!(
                        "librbd reported a miscompare at {mismatch}, outside the {} bytes at {offset}",
                        data.len()
                    )));
                }
                Ok(Some(k))
            }
            n if n < 0 => Err(io::Error::from_raw_os_error(-n as i32)),
            n if n as usize != data.len() => Err(io::ErrorKind::WriteZero.into()),
            _ => Ok(None),
        }
    }

    /// Writes `pattern` over and over to the `len` bytes from `offset`
    /// (`len` a multiple of the pattern's length): librbd sends each object
    /// one `writesame` op carrying the pattern once.
    pub(in crate::backstore::rbd) fn write_same(
        &self,
        offset: u64,
        len: u64,
        pattern: &[u8],
        flags: c_int,
    ) -> io::Result<()> {
        if pattern.is_empty() || !len.is_multiple_of(pattern.len() as u64) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // librbd's length is a size_t, its return an ssize_t: a step of at
        // most 1 GiB (a whole number of patterns) keeps both in range.
        let step = (1u64 << 30) / pattern.len() as u64 * pattern.len() as u64;
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(step);
            // SAFETY: invariants 1 and 3 — `pattern` is readable for its
            // length for the whole synchronous call; librbd reads only it.
            let r = unsafe {
                rbd_writesame(
                    self.image,
                    offset + done,
                    n as usize,
                    pattern.as_ptr().cast(),
                    pattern.len(),
                    flags,
                )
            };
            if r < 0 {
                return Err(io::Error::from_raw_os_error(-r as i32));
            }
            done += n;
        }
        Ok(())
    }

    /// Writes the concatenation of `pieces` at `offset` as one librbd
    /// request (a 1 MiB SCSI write arrives in 64 KiB pieces; one write
    /// each cost a round trip each, in series), and waits for it. No op
    /// flags (the AIO writev takes none): with the client's cache off
    /// (`CLIENT_OPTIONS`) a completed write is on the OSDs, FUA or not.
    pub(in crate::backstore::rbd) fn writev(
        &self,
        offset: u64,
        pieces: &[&[u8]],
    ) -> io::Result<()> {
        let mut at = offset;
        for group in pieces.chunks(IOV_MAX) {
            let iov: Vec<IoVec> = group
                .iter()
                .map(|p| IoVec {
                    base: p.as_ptr().cast(),
                    len: p.len(),
                })
                .collect();
            let len: usize = group.iter().map(|p| p.len()).sum();
            let done = Completion::new()?;
            // SAFETY: invariants 1 and 3 — `iov` and every piece it points
            // to are borrowed until this function returns, and it returns
            // only after librbd completed the request (the wait below), so
            // the memory outlives every use librbd makes of it; `iovcnt`
            // is `iov`'s length (at most IOV_MAX).
            let r =
                unsafe { rbd_aio_writev(self.image, iov.as_ptr(), iov.len() as c_int, at, done.0) };
            if r < 0 {
                return Err(io::Error::from_raw_os_error(-r));
            }
            // SAFETY: a submitted completion, waited for once; then its
            // return value is read before `done` releases it.
            let n = unsafe {
                rbd_aio_wait_for_complete(done.0);
                rbd_aio_get_return_value(done.0)
            };
            // A write's completion holds 0 or an error (not a byte count).
            if n < 0 {
                return Err(io::Error::from_raw_os_error(-n as i32));
            }
            at += len as u64;
        }
        Ok(())
    }

    /// The runs of `[offset, offset + len)` that hold data, in order, as
    /// librbd reports them (holes reported too when it knows them), at
    /// most `limit` of them (> 0); the image's parent counts. Errors with
    /// `Other` if librbd called back on another thread (invariant 5
    /// broken by a different librbd).
    pub(in crate::backstore::rbd) fn allocated(
        &self,
        offset: u64,
        len: u64,
        limit: usize,
    ) -> io::Result<Vec<Extent>> {
        let mut state = Collect {
            extents: Vec::new(),
            limit: limit.max(1),
            caller: thread::current().id(),
            foreign_thread: false,
        };
        // SAFETY: invariants 1 and 5 — `state` outlives the call, which
        // calls `collect_extent` on this thread only, before it returns; a
        // null snapshot name diffs the head against nothing (every
        // allocated extent).
        let r = unsafe {
            rbd_diff_iterate2(
                self.image,
                ptr::null(),
                offset,
                len,
                1,
                0,
                collect_extent,
                (&raw mut state).cast(),
            )
        };
        if state.foreign_thread {
            return Err(io::Error::other(
                "librbd called the diff callback on a thread of its own",
            ));
        }
        if r < 0 && r != STOP {
            return Err(io::Error::from_raw_os_error(-r));
        }
        Ok(state.extents)
    }
}
