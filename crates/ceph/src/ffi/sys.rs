//! librbd and librados, loaded when the first `rbd:` LUN opens rather than
//! linked at build time: the default `iscsi` binary serves Ceph, builds
//! without librbd-dev or librados-dev, and runs on a machine without Ceph
//! for every other kind of LUN. Where librbd is missing, opening an `rbd:`
//! LUN says in words what to install ("librbd.so.1 not found: install
//! librbd1").
//!
//! How: `librbd.so.1` (or the file `$ISCSI_LIBRBD` names: for tests, and for
//! an operator whose librbd lives outside the loader's search path) is
//! opened with `dlopen(RTLD_NOW | RTLD_LOCAL)` through `libloading`, which
//! loads `librados.so.2` with it (librbd is linked against it). Every
//! function, `rados_*` ones included, is looked up through librbd's handle:
//! `dlsym` on a handle searches the library and then its dependencies
//! (dlsym(3), POSIX "dependency ordering"), so the librados this crate
//! calls is the very one librbd runs on, never a second copy. `RTLD_NOW`
//! resolves every symbol of both at load, so a damaged install fails there,
//! in words, rather than at some later call. A failure is not remembered:
//! the next `rbd:` LUN (a reload after `apt install librbd1`) tries again.
//! A success is, once per process, in [`LOADED`].
//!
//! Each function is declared once, in the `api!` invocation below, which
//! makes of the list a struct of function pointers ([`Api`]), its loader
//! and one method per function that calls through the pointer, so that the
//! call sites read like calls of the C functions (`api.rbd_close(image)`).
//!
//! Invariants of loading, which every `unsafe` block of this file relies on
//! and which make [`Api`]'s methods exactly as safe to call as the C
//! functions they stand for (the invariants of `ffi/mod.rs` and its
//! siblings then apply to each call unchanged):
//! - L1. A loaded library is never unloaded: the [`Library`] goes into
//!   [`LOADED`] (a static, never dropped) beside the pointers taken from it,
//!   and an [`Api`] is only ever handed out as `&'static Api` from there, so
//!   every function pointer stays valid for the life of the process.
//! - L2. The Rust type of each symbol is the C prototype of the function of
//!   that name: checked by hand, argument by argument, against Debian 12's
//!   librbd-dev and librados-dev 16.2.15 (`/usr/include/rbd/librbd.h` and
//!   `/usr/include/rados/librados.h`, Ceph v16.2.15's
//!   `src/include/rbd/librbd.h` and `src/include/rados/librados.h`; the line
//!   of each prototype beside it below). Handles (`rados_t`,
//!   `rados_ioctx_t`, `rbd_image_t`, `rbd_completion_t`, `rados_write_op_t`,
//!   `rbd_image_options_t`) are `void *`; `size_t`/`ssize_t` are
//!   `usize`/`isize`; `time_t` and `long` are `i64` (64-bit Linux); the
//!   enums `rbd_lock_mode_t` and `rbd_image_event_t` are `int`; `uint8_t`
//!   is `u8`; C99 `bool` is Rust's `bool` (one byte, 0 or 1); the structs
//!   (`struct iovec`, `rbd_snap_info_t`, `rbd_linked_image_spec_t`,
//!   `struct timespec`) are `#[repr(C)]` with the C fields in their order
//!   and types. These symbols are in librbd.so.1 and
//!   librados.so.2 since Ceph 14 at the latest and keep their prototypes
//!   under the libraries' sonames.
//! - L3. Running the libraries' initialisers (C++ static constructors) at
//!   `dlopen` is what linking them did at the start of every process: they
//!   set up globals and start no thread; their finalisers run at exit,
//!   never at an unload (L1).

use std::ffi::{OsStr, OsString, c_char, c_int, c_void};
use std::io;
use std::sync::{Mutex, OnceLock, PoisonError};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// `rados_t`.
pub(crate) type RadosT = *mut c_void;
/// `rados_ioctx_t`.
pub(crate) type RadosIoctxT = *mut c_void;
/// `rados_write_op_t`.
pub(crate) type RadosWriteOpT = *mut c_void;
/// `rbd_image_t`.
pub(crate) type RbdImageT = *mut c_void;
/// `rbd_completion_t`.
pub(crate) type RbdCompletionT = *mut c_void;
/// `rbd_callback_t` (librbd.h:73), nullable.
pub(crate) type RbdCallback = Option<extern "C" fn(RbdCompletionT, *mut c_void)>;
/// The callback of `rbd_diff_iterate2` (librbd.h:1137).
pub(crate) type DiffCb = extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;
/// `rados_watchcb2_t` (librados.h:2386).
pub(crate) type WatchCb =
    extern "C" fn(arg: *mut c_void, notify_id: u64, handle: u64, notifier: u64, *mut c_void, usize);
/// `rados_watcherrcb_t` (librados.h:2405).
pub(crate) type WatchErrCb = extern "C" fn(arg: *mut c_void, cookie: u64, err: c_int);

/// `struct iovec` (sys/uio.h), for `rbd_aio_writev`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IoVec {
    pub base: *const c_void,
    pub len: usize,
}

/// `rbd_image_options_t` (librbd.h:69).
pub(crate) type RbdImageOptionsT = *mut c_void;

/// `rbd_snap_info_t` (librbd.h:106), an entry of `rbd_snap_list`'s array;
/// `name` is librbd's (`rbd_snap_list_end` frees it), null in the entry
/// after the last.
#[repr(C)]
pub(crate) struct RbdSnapInfo {
    pub id: u64,
    pub size: u64,
    pub name: *const c_char,
}

/// `rbd_linked_image_spec_t` (librbd.h:91), an entry of
/// `rbd_list_children3`'s array; the strings are librbd's
/// (`rbd_linked_image_spec_list_cleanup` frees them).
#[repr(C)]
pub(crate) struct RbdLinkedImageSpec {
    pub pool_id: i64,
    pub pool_name: *mut c_char,
    pub pool_namespace: *mut c_char,
    pub image_id: *mut c_char,
    pub image_name: *mut c_char,
    pub trash: bool,
}

/// `struct timespec` (time.h, 64-bit Linux), for `rbd_snap_get_timestamp`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Timespec {
    pub tv_sec: i64,
    pub tv_nsec: i64,
}

/// The soname loaded by default, and the Debian package that ships it.
const LIBRBD: (&str, &str) = ("librbd.so.1", "librbd1");
/// What librbd.so.1 needs that a broken install may lack, and its package.
const LIBRADOS: (&str, &str) = ("librados.so.2", "librados2");
/// The variable that names another file to load instead of `librbd.so.1`.
pub(super) const LIBRBD_VAR: &str = "ISCSI_LIBRBD";

/// From a list of C prototypes: [`Api`] (a pointer per function), its
/// loader [`Api::resolve`] and a method per function calling through the
/// pointer, `unsafe` with the C function's own contract.
macro_rules! api {
    ($($(#[$attr:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        /// Every function of librbd and librados this crate calls, as
        /// pointers into the loaded libraries (invariants L1 and L2).
        pub(in crate) struct Api {
            $($(#[$attr])* $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        impl Api {
            /// Looks every function up in `library` (and its dependencies);
            /// the error names the first one missing.
            fn resolve(library: &Library) -> Result<Api, (&'static str, libloading::Error)> {
                Ok(Api {
                    $($(#[$attr])* $name: {
                        // SAFETY: L2 — the type is the C prototype of the
                        // function of this name; L1 — the pointer copied out
                        // of the symbol is only used while `library` stays
                        // loaded, which is for good once the `Api` is kept.
                        let symbol = unsafe {
                            library.get::<unsafe extern "C" fn($($ty),*) $(-> $ret)?>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        };
                        *symbol.map_err(|e| (stringify!($name), e))?
                    },)*
                })
            }

            $(
                $(#[$attr])*
                #[allow(clippy::too_many_arguments)]
                /// The C function of this name (see librbd.h / librados.h).
                pub(in crate) unsafe fn $name(&self, $($arg: $ty),*) $(-> $ret)? {
                    // SAFETY: the pointer is the C function (L1, L2); the
                    // caller upholds that function's contract.
                    unsafe { (self.$name)($($arg),*) }
                }
            )*
        }
    };
}

api! {
    // librados: the client and the pool (`ffi/mod.rs`).
    fn rados_create(cluster: *mut RadosT, id: *const c_char) -> c_int; // librados.h:435
    fn rados_conf_read_file(cluster: RadosT, path: *const c_char) -> c_int; // librados.h:551
    fn rados_conf_set(
        cluster: RadosT,
        option: *const c_char,
        value: *const c_char,
    ) -> c_int; // librados.h:618
    fn rados_conf_get(
        cluster: RadosT,
        option: *const c_char,
        buf: *mut c_char,
        len: usize,
    ) -> c_int; // librados.h:632
    fn rados_connect(cluster: RadosT) -> c_int; // librados.h:493
    fn rados_shutdown(cluster: RadosT); // librados.h:513
    fn rados_cluster_fsid(cluster: RadosT, buf: *mut c_char, len: usize) -> c_int; // librados.h:663
    fn rados_ioctx_create(
        cluster: RadosT,
        pool: *const c_char,
        ioctx: *mut RadosIoctxT,
    ) -> c_int; // librados.h:779
    fn rados_ioctx_destroy(ioctx: RadosIoctxT); // librados.h:804

    // librados: extended attributes and objects (`ffi/lock.rs`, `ffi/rados.rs`).
    fn rados_setxattr(
        io: RadosIoctxT,
        o: *const c_char,
        name: *const c_char,
        buf: *const c_char,
        len: usize,
    ) -> c_int; // librados.h:1692
    fn rados_getxattr(
        io: RadosIoctxT,
        o: *const c_char,
        name: *const c_char,
        buf: *mut c_char,
        len: usize,
    ) -> c_int; // librados.h:1679
    fn rados_stat(
        io: RadosIoctxT,
        oid: *const c_char,
        psize: *mut u64,
        pmtime: *mut i64,
    ) -> c_int; // librados.h:1826
    fn rados_read(
        io: RadosIoctxT,
        oid: *const c_char,
        buf: *mut c_char,
        len: usize,
        off: u64,
    ) -> c_int; // librados.h:1580
    #[cfg(all(test, feature = "ceph-tests"))]
    fn rados_remove(io: RadosIoctxT, oid: *const c_char) -> c_int; // librados.h:1628
    fn rados_create_write_op() -> RadosWriteOpT; // librados.h:2842
    fn rados_release_write_op(op: RadosWriteOpT); // librados.h:2848
    fn rados_write_op_create(
        op: RadosWriteOpT,
        exclusive: c_int,
        category: *const c_char,
    ); // librados.h:2983
    fn rados_write_op_cmpxattr(
        op: RadosWriteOpT,
        name: *const c_char,
        comparison: u8,
        value: *const c_char,
        value_len: usize,
    ); // librados.h:2907
    fn rados_write_op_setxattr(
        op: RadosWriteOpT,
        name: *const c_char,
        value: *const c_char,
        value_len: usize,
    ); // librados.h:2962
    fn rados_write_op_write_full(
        op: RadosWriteOpT,
        buf: *const c_char,
        len: usize,
    ); // librados.h:3005
    fn rados_write_op_operate(
        op: RadosWriteOpT,
        io: RadosIoctxT,
        oid: *const c_char,
        mtime: *mut i64,
        flags: c_int,
    ) -> c_int; // librados.h:3186

    // librados: watch/notify and fencing (`ffi/rados.rs`).
    fn rados_watch2(
        io: RadosIoctxT,
        oid: *const c_char,
        cookie: *mut u64,
        cb: WatchCb,
        errcb: WatchErrCb,
        arg: *mut c_void,
    ) -> c_int; // librados.h:2457
    fn rados_unwatch2(io: RadosIoctxT, cookie: u64) -> c_int; // librados.h:2581
    fn rados_watch_flush(cluster: RadosT) -> c_int; // librados.h:2730
    fn rados_notify2(
        io: RadosIoctxT,
        oid: *const c_char,
        buf: *const c_char,
        buf_len: c_int,
        timeout_ms: u64,
        reply: *mut *mut c_char,
        reply_len: *mut usize,
    ) -> c_int; // librados.h:2668
    fn rados_notify_ack(
        io: RadosIoctxT,
        oid: *const c_char,
        notify_id: u64,
        cookie: u64,
        buf: *const c_char,
        buf_len: c_int,
    ) -> c_int; // librados.h:2714
    fn rados_buffer_free(buf: *mut c_char); // librados.h:3984
    fn rados_get_instance_id(cluster: RadosT) -> u64; // librados.h:741
    fn rados_getaddrs(cluster: RadosT, addrs: *mut *mut c_char) -> c_int; // librados.h:3747
    fn rados_blocklist_add(
        cluster: RadosT,
        addr: *mut c_char,
        expire_seconds: u32,
    ) -> c_int; // librados.h:3732
    fn rados_wait_for_latest_osdmap(cluster: RadosT) -> c_int; // librados.h:671

    // librbd: the image and synchronous I/O (`ffi/mod.rs`).
    fn rbd_open(
        io: RadosIoctxT,
        name: *const c_char,
        image: *mut RbdImageT,
        snap_name: *const c_char,
    ) -> c_int; // librbd.h:662
    fn rbd_close(image: RbdImageT) -> c_int; // librbd.h:706
    fn rbd_get_size(image: RbdImageT, size: *mut u64) -> c_int; // librbd.h:716
    fn rbd_get_id(image: RbdImageT, id: *mut c_char, id_len: usize) -> c_int; // librbd.h:734
    fn rbd_read2(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        buf: *mut c_char,
        op_flags: c_int,
    ) -> isize; // librbd.h:1087
    fn rbd_write2(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        buf: *const c_char,
        op_flags: c_int,
    ) -> isize; // librbd.h:1148
    fn rbd_discard(image: RbdImageT, ofs: u64, len: u64) -> c_int; // librbd.h:1150
    fn rbd_flush(image: RbdImageT) -> c_int; // librbd.h:1207

    // librbd: asynchronous I/O (`ffi/aio.rs`).
    fn rbd_set_image_notification(
        image: RbdImageT,
        fd: c_int,
        kind: c_int,
    ) -> c_int; // librbd.h:764
    fn rbd_poll_io_events(
        image: RbdImageT,
        comps: *mut RbdCompletionT,
        numcomp: c_int,
    ) -> c_int; // librbd.h:1226
    fn rbd_aio_create_completion(
        cb_arg: *mut c_void,
        complete_cb: RbdCallback,
        c: *mut RbdCompletionT,
    ) -> c_int; // librbd.h:1199
    fn rbd_aio_get_arg(c: RbdCompletionT) -> *mut c_void; // librbd.h:1205
    fn rbd_aio_get_return_value(c: RbdCompletionT) -> isize; // librbd.h:1204
    fn rbd_aio_release(c: RbdCompletionT); // librbd.h:1206
    fn rbd_aio_read2(
        image: RbdImageT,
        off: u64,
        len: usize,
        buf: *mut c_char,
        c: RbdCompletionT,
        op_flags: c_int,
    ) -> c_int; // librbd.h:1179
    fn rbd_aio_write2(
        image: RbdImageT,
        off: u64,
        len: usize,
        buf: *const c_char,
        c: RbdCompletionT,
        op_flags: c_int,
    ) -> c_int; // librbd.h:1169
    fn rbd_aio_writev(
        image: RbdImageT,
        iov: *const IoVec,
        iovcnt: c_int,
        off: u64,
        c: RbdCompletionT,
    ) -> c_int; // librbd.h:1172

    // librbd: the offloads (`ffi/offload.rs`).
    fn rbd_compare_and_write(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        cmp_buf: *const c_char,
        buf: *const c_char,
        mismatch_off: *mut u64,
        op_flags: c_int,
    ) -> isize; // librbd.h:1157
    fn rbd_writesame(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        buf: *const c_char,
        data_len: usize,
        op_flags: c_int,
    ) -> isize; // librbd.h:1151
    fn rbd_diff_iterate2(
        image: RbdImageT,
        fromsnapname: *const c_char,
        ofs: u64,
        len: u64,
        include_parent: u8,
        whole_object: u8,
        cb: DiffCb,
        arg: *mut c_void,
    ) -> c_int; // librbd.h:1137

    // librbd: the exclusive lock and metadata (`ffi/lock.rs`).
    fn rbd_is_exclusive_lock_owner(image: RbdImageT, is_owner: *mut c_int) -> c_int; // librbd.h:767
    fn rbd_lock_acquire(image: RbdImageT, lock_mode: c_int) -> c_int; // librbd.h:768
    fn rbd_lock_release(image: RbdImageT) -> c_int; // librbd.h:769
    fn rbd_lock_get_owners(
        image: RbdImageT,
        lock_mode: *mut c_int,
        lock_owners: *mut *mut c_char,
        max_lock_owners: *mut usize,
    ) -> c_int; // librbd.h:770
    fn rbd_lock_get_owners_cleanup(
        lock_owners: *mut *mut c_char,
        lock_owner_count: usize,
    ); // librbd.h:774
    fn rbd_lock_break(
        image: RbdImageT,
        lock_mode: c_int,
        lock_owner: *const c_char,
    ) -> c_int; // librbd.h:776
    fn rbd_metadata_get(
        image: RbdImageT,
        key: *const c_char,
        value: *mut c_char,
        val_len: *mut usize,
    ) -> c_int; // librbd.h:1228

    // librbd: snapshots and clones (`ffi/snap.rs`).
    fn rbd_open_read_only(
        io: RadosIoctxT,
        name: *const c_char,
        image: *mut RbdImageT,
        snap_name: *const c_char,
    ) -> c_int; // librbd.h:693
    fn rbd_snap_list(
        image: RbdImageT,
        snaps: *mut RbdSnapInfo,
        max_snaps: *mut c_int,
    ) -> c_int; // librbd.h:830
    fn rbd_snap_list_end(snaps: *mut RbdSnapInfo); // librbd.h:832
    fn rbd_snap_exists(image: RbdImageT, snapname: *const c_char, exists: *mut bool) -> c_int; // librbd.h:833
    fn rbd_snap_create(image: RbdImageT, snapname: *const c_char) -> c_int; // librbd.h:834
    fn rbd_snap_remove(image: RbdImageT, snapname: *const c_char) -> c_int; // librbd.h:838
    fn rbd_snap_protect(image: RbdImageT, snap_name: *const c_char) -> c_int; // librbd.h:857
    fn rbd_snap_unprotect(image: RbdImageT, snap_name: *const c_char) -> c_int; // librbd.h:865
    fn rbd_snap_is_protected(
        image: RbdImageT,
        snap_name: *const c_char,
        is_protected: *mut c_int,
    ) -> c_int; // librbd.h:873
    fn rbd_snap_get_timestamp(
        image: RbdImageT,
        snap_id: u64,
        timestamp: *mut Timespec,
    ) -> c_int; // librbd.h:899
    fn rbd_list_children3(
        image: RbdImageT,
        images: *mut RbdLinkedImageSpec,
        max_images: *mut usize,
    ) -> c_int; // librbd.h:973
    fn rbd_linked_image_spec_list_cleanup(
        images: *mut RbdLinkedImageSpec,
        num_images: usize,
    ); // librbd.h:422
    fn rbd_image_options_create(opts: *mut RbdImageOptionsT); // librbd.h:400
    fn rbd_image_options_destroy(opts: RbdImageOptionsT); // librbd.h:401
    fn rbd_image_options_set_uint64(
        opts: RbdImageOptionsT,
        optname: c_int,
        optval: u64,
    ) -> c_int; // librbd.h:404
    fn rbd_clone3(
        p_ioctx: RadosIoctxT,
        p_name: *const c_char,
        p_snapname: *const c_char,
        c_ioctx: RadosIoctxT,
        c_name: *const c_char,
        c_opts: RbdImageOptionsT,
    ) -> c_int; // librbd.h:465
    fn rbd_metadata_set(
        image: RbdImageT,
        key: *const c_char,
        value: *const c_char,
    ) -> c_int; // librbd.h:1229
    fn rbd_metadata_remove(image: RbdImageT, key: *const c_char) -> c_int; // librbd.h:1230
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").finish_non_exhaustive()
    }
}

/// The loaded library and its functions, for the life of the process
/// (invariant L1).
struct Loaded {
    api: Api,
    /// Held so that it is never closed: statics are not dropped.
    _library: Library,
}

/// librbd once loaded (invariant L1).
static LOADED: OnceLock<Loaded> = OnceLock::new();

/// One load at a time, so that two LUNs opening at once load once.
static LOADING: Mutex<()> = Mutex::new(());

/// librbd's and librados's functions, loading the libraries on the first
/// call. The error says what to install (`NotFound`) or what is wrong with
/// what is installed.
pub(crate) fn api() -> io::Result<&'static Api> {
    if let Some(loaded) = LOADED.get() {
        return Ok(&loaded.api);
    }
    let _one = LOADING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(loaded) = LOADED.get() {
        return Ok(&loaded.api);
    }
    let file = std::env::var_os(LIBRBD_VAR)
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| OsString::from(LIBRBD.0));
    let library = open(&file, LIBRBD.1)?;
    let api = Api::resolve(&library).map_err(|(name, e)| {
        io::Error::other(format!(
            "{} has no function {name} ({e}): install librbd1 of Ceph 16 (Pacific) or later",
            file.to_string_lossy()
        ))
    })?;
    Ok(&LOADED
        .get_or_init(|| Loaded {
            api,
            _library: library,
        })
        .api)
}

/// Opens the shared library `file` (a soname, searched for as the dynamic
/// loader does, or a path) with every symbol bound now; `package` is the
/// Debian package that ships it, named when the file is not there.
fn open(file: &OsStr, package: &str) -> io::Result<Library> {
    // SAFETY: L3 — the library's initialisers are those a link at build
    // time ran at start; L1 holds for what the caller keeps.
    unsafe { Library::open(Some(file), RTLD_NOW | RTLD_LOCAL) }
        .map_err(|e| refusal(&file.to_string_lossy(), package, &e.to_string()))
}

/// The refusal in words for the loader's message `said` on opening `file`
/// of `package`: "FILE not found: install PACKAGE" when the file is not
/// there, the same for librados.so.2 when librbd's dependency is what is
/// missing; otherwise the loader's own words and the package to reinstall.
fn refusal(file: &str, package: &str, said: &str) -> io::Error {
    // glibc's dlerror() for a file that no directory of the search holds,
    // the top-level one or a dependency: "NAME: cannot open shared object
    // file: No such file or directory".
    let missing = said.strip_suffix(": cannot open shared object file: No such file or directory");
    let text = match missing {
        Some(name) if name == file => format!("{file} not found: install {package}"),
        Some(name) if name == LIBRADOS.0 => {
            format!("{} not found: install {}", LIBRADOS.0, LIBRADOS.1)
        }
        Some(name) => format!("{name} not found, which {file} needs: reinstall {package}"),
        None => format!("{file} does not load: {said} (reinstall {package})"),
    };
    let kind = if missing.is_some() {
        io::ErrorKind::NotFound
    } else {
        io::ErrorKind::InvalidData
    };
    io::Error::new(kind, text)
}

/// `Ok(value)` for a non-negative return, the errno otherwise.
pub(in crate::ffi) fn check(ret: c_int) -> io::Result<c_int> {
    if ret < 0 {
        Err(io::Error::from_raw_os_error(-ret))
    } else {
        Ok(ret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_named_with_its_package() {
        let e = open(OsStr::new("libiscsi-rs-absent.so.1"), "iscsi-rs-absent").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            e.to_string(),
            "libiscsi-rs-absent.so.1 not found: install iscsi-rs-absent"
        );
        let e = open(OsStr::new("/nonexistent/librbd.so.1"), "librbd1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/nonexistent/librbd.so.1 not found: install librbd1"
        );
    }

    #[test]
    fn a_present_library_loads_and_its_functions_run() {
        let libc = open(OsStr::new("libc.so.6"), "libc6").unwrap();
        // SAFETY: L2 — `size_t strlen(const char *)` (string.h); the
        // pointer is only used while `libc` lives.
        let strlen =
            *unsafe { libc.get::<unsafe extern "C" fn(*const c_char) -> usize>(b"strlen\0") }
                .unwrap();
        // SAFETY: a NUL-terminated string that lives across the call.
        assert_eq!(unsafe { strlen(c"librbd".as_ptr()) }, 6);
        // A library without librbd's functions is refused, naming the first.
        match Api::resolve(&libc) {
            Err((name, _)) => assert_eq!(name, "rados_create"),
            Ok(_) => panic!("libc has no rados_create"),
        }
    }

    #[test]
    fn the_loaders_words_become_refusals() {
        let not_there = ": cannot open shared object file: No such file or directory";
        let e = refusal("librbd.so.1", "librbd1", &format!("librbd.so.1{not_there}"));
        assert_eq!(e.to_string(), "librbd.so.1 not found: install librbd1");
        let e = refusal(
            "librbd.so.1",
            "librbd1",
            &format!("librados.so.2{not_there}"),
        );
        assert_eq!(e.to_string(), "librados.so.2 not found: install librados2");
        let e = refusal(
            "librbd.so.1",
            "librbd1",
            &format!("libceph-common.so.2{not_there}"),
        );
        assert_eq!(
            e.to_string(),
            "libceph-common.so.2 not found, which librbd.so.1 needs: reinstall librbd1"
        );
        let e = refusal("librbd.so.1", "librbd1", "/x/librbd.so.1: file too short");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            e.to_string(),
            "librbd.so.1 does not load: /x/librbd.so.1: file too short (reinstall librbd1)"
        );
    }
}
