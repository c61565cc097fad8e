//! The librbd calls behind the SCSI offloads of issue 36: COMPARE AND
//! WRITE in the OSD (`rbd_compare_and_write`), WRITE SAME as one request
//! per object (`rbd_writesame`) and GET LBA STATUS from the image's
//! allocated extents (`rbd_diff_iterate2`). (A write that arrived in
//! pieces is one `rbd_aio_writev`, in `aio.rs`.)
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

use std::ffi::{c_int, c_void};
use std::io;
use std::ptr;
use std::thread::{self, ThreadId};

use super::Image;

/// librbd's answer to a COMPARE AND WRITE whose compare failed.
const EILSEQ: i32 = 84;

/// The largest range librbd's compare-and-write takes: it refuses with
/// EINVAL any range that leaves one 512-byte sector
/// (`ImageCompareAndWriteRequest::prune_object_extents`, Ceph 16).
pub(crate) const CAW_SECTOR: u64 = 512;

/// One run of the image that `rbd_diff_iterate2` reported: `exists` false
/// is a hole (discarded or never written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
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
    pub(crate) fn compare_and_write(
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
            self.api.rbd_compare_and_write(
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
    pub(crate) fn write_same(
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
                self.api.rbd_writesame(
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

    /// The runs of `[offset, offset + len)` that hold data, in order, as
    /// librbd reports them (holes reported too when it knows them), at
    /// most `limit` of them (> 0); the image's parent counts. Errors with
    /// `Other` if librbd called back on another thread (invariant 5
    /// broken by a different librbd).
    pub(crate) fn allocated(&self, offset: u64, len: u64, limit: usize) -> io::Result<Vec<Extent>> {
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
            self.api.rbd_diff_iterate2(
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
