//! Which category an instruction belongs to: a rule per function (by its
//! name, file and object), and the attribution of every function's self
//! cost along the call graph, so that the categories add up to the run's
//! total exactly.
//!
//! Why not a rule per function alone: much of the cost sits in generic
//! helpers with no category of their own (a `HashMap` lookup inside the
//! task table, `Vec` growth inside the decoder). Such a function inherits
//! the categories of its callers, in proportion to the instructions each
//! call arc carried (callgrind's inclusive cost per arc). The innermost
//! function with a rule wins (`memcpy` called by the decoder is copy, not
//! header handling), except below the backstore, which *encloses*: the RAM
//! store's `memcpy` is the store's work (a file store would `pread` there),
//! not a copy made by the iSCSI layers. Runtime and allocator functions
//! (`tokio::`, `malloc`) have the rule "other", so they do not inherit the
//! category of the protocol code that calls them.

use serde::Serialize;

use super::callgrind::{Function, Profile};

/// Where an instruction's cost is booked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// BHS encode/decode, PDU routing, task lookup, sequence checks: our
    /// protocol crates, datamover and both drivers.
    Header,
    /// CRC32C (`iscsi_crc32c`).
    Digest,
    /// User-space `memcpy`/`memmove` of data (outside the backstore).
    Copy,
    /// User-space `memset` outside the backstore: a data buffer zeroed
    /// before data lands in it. Not one of the categories, but a
    /// per-byte pass as large as a copy that would otherwise hide in the
    /// header handling of the code that asked for the buffer.
    Zero,
    /// The user-space side of socket system calls (libc wrappers, mio,
    /// tokio's `PollEvented` reads and writes). The kernel's own work is
    /// not in a callgrind profile at all; see `perf.rs`.
    Syscall,
    /// CDB decode and dispatch (`iscsi_scsi` outside the backstore; the
    /// initiator's CDB builders).
    Scsi,
    /// The backstore's reads and writes, everything below them included.
    Backstore,
    /// The rest: tokio's runtime, allocation, start-up, the CLI.
    Other,
}

impl Category {
    /// Every category, in the order of table columns and chart stacks.
    pub const ALL: [Category; 8] = [
        Category::Header,
        Category::Digest,
        Category::Copy,
        Category::Zero,
        Category::Syscall,
        Category::Scsi,
        Category::Backstore,
        Category::Other,
    ];

    /// The column name.
    pub fn name(self) -> &'static str {
        match self {
            Category::Header => "header",
            Category::Digest => "digest",
            Category::Copy => "copy",
            Category::Zero => "zero",
            Category::Syscall => "syscall",
            Category::Scsi => "scsi",
            Category::Backstore => "backstore",
            Category::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Instructions by category, indexed like [`Category::ALL`].
pub type Costs = [f64; 8];

/// libc's socket system-call wrappers.
const SYSCALL_WRAPPERS: [&str; 24] = [
    "read",
    "__read",
    "__libc_read",
    "readv",
    "__readv",
    "recv",
    "__recv",
    "__libc_recv",
    "recvfrom",
    "__libc_recvfrom",
    "recvmsg",
    "__libc_recvmsg",
    "write",
    "__write",
    "__libc_write",
    "writev",
    "__writev",
    "send",
    "__send",
    "__libc_send",
    "sendto",
    "__libc_sendto",
    "sendmsg",
    "__libc_sendmsg",
];

/// Rust-side wrappers whose only job is a socket read or write.
const SYSCALL_RUST: [&str; 4] = [
    "poll_evented::PollEvented",
    "mio::net::tcp::stream",
    "mio::io_source",
    "std::sys::net::",
];

/// libc functions of the runtime's machinery rather than the data path.
const OTHER_LIBC: [&str; 12] = [
    "malloc",
    "free",
    "calloc",
    "realloc",
    "_int_",
    "tcache",
    "unlink_chunk",
    "epoll_",
    "syscall",
    "pthread_",
    "clock_gettime",
    "__lll_",
];

/// Name fragments of runtime, allocator and application code.
const OTHER_RUST: [&str; 12] = [
    "tokio::",
    "mio::",
    "std::thread",
    "std::sync",
    "std::sys::sync",
    "parking_lot",
    "tracing",
    "__rust_alloc",
    "__rust_dealloc",
    "__rust_realloc",
    "alloc::alloc::",
    "iscsi::",
];

/// Our crates whose code is header handling, by source directory and
/// by crate name.
const HEADER_DIRS: [&str; 4] = [
    "crates/proto/src/",
    "crates/datamover/src/",
    "crates/iscsi-target/src/",
    "crates/initiator/src/",
];
const HEADER_CRATES: [&str; 4] = [
    "iscsi_proto::",
    "iscsi_datamover::",
    "iscsi_target::",
    "iscsi_initiator::",
];

/// libc's exported name without its symbol version (`memcpy@@GLIBC_2.14`).
fn base_name(name: &str) -> &str {
    name.split('@').next().unwrap_or(name)
}

/// The category a function's own rule gives, or `None` to inherit.
/// The storage engines' crates (and the `Backstore` trait's module) by
/// symbol path and by source folder.
const STORE_CRATES: [&str; 3] = ["iscsi_scsi::backstore::", "iscsi_stores::", "iscsi_ceph::"];
const STORE_DIRS: [&str; 3] = [
    "crates/scsi/src/backstore/",
    "crates/stores/src/",
    "crates/ceph/src/",
];

pub fn classify(function: &Function) -> Option<Category> {
    let name = function.name.as_str();
    let file = function.file.as_str();
    let in_libc = function.object.contains("libc.so");
    let any = |patterns: &[&str], text: &str| patterns.iter().any(|p| text.contains(p));
    if name.contains("iscsi_crc32c::") || file.contains("crates/crc32c/src/") {
        return Some(Category::Digest);
    }
    if in_libc && any(&["memcpy", "memmove", "mempcpy"], name) {
        return Some(Category::Copy);
    }
    if in_libc && name.contains("memset") {
        return Some(Category::Zero);
    }
    if (in_libc && SYSCALL_WRAPPERS.contains(&base_name(name))) || any(&SYSCALL_RUST, name) {
        return Some(Category::Syscall);
    }
    if any(&STORE_CRATES, name) || STORE_DIRS.iter().any(|d| file.contains(d)) {
        return Some(Category::Backstore);
    }
    if name.contains("iscsi_scsi::")
        || file.contains("crates/scsi/src/")
        || name.contains("iscsi_initiator::scsi::")
        || file.contains("crates/initiator/src/scsi.rs")
    {
        return Some(Category::Scsi);
    }
    if any(&HEADER_DIRS, file) || any(&HEADER_CRATES, name) {
        return Some(Category::Header);
    }
    if (in_libc && any(&OTHER_LIBC, name))
        || any(&OTHER_RUST, name)
        || function.object.contains("ld-linux")
        || function.object.contains("vdso")
        || name == "(below main)"
        || name.starts_with("start_thread")
        || name == "clone3"
    {
        return Some(Category::Other);
    }
    None
}

fn one_hot(category: Category) -> Costs {
    let mut costs = [0.0; 8];
    costs[category.index()] = 1.0;
    costs
}

/// How a function with `rule` passes on the categories its callers bring:
/// an enclosing backstore keeps its share, the function's own rule takes
/// the rest; no rule passes everything on.
fn apply_rule(rule: Option<Category>, inherited: Costs) -> Costs {
    let enclosed = Category::Backstore.index();
    match rule {
        None => inherited,
        Some(Category::Backstore) => one_hot(Category::Backstore),
        Some(category) => {
            let mut out = [0.0; 8];
            out[enclosed] = inherited[enclosed];
            out[category.index()] += 1.0 - inherited[enclosed];
            out
        }
    }
}

/// Splits the whole profile's instructions into categories. The result
/// sums to [`Profile::self_total`] (up to floating-point rounding).
pub fn attribute(profile: &Profile) -> Costs {
    let mut costs = [0.0; 8];
    for function in attribute_functions(profile) {
        for (sum, part) in costs.iter_mut().zip(function) {
            *sum += part;
        }
    }
    costs
}

/// Each function's self cost split into categories, indexed like
/// `profile.functions` (what `iscsi pdu-cost explain` lists).
pub fn attribute_functions(profile: &Profile) -> Vec<Costs> {
    let n = profile.functions.len();
    let rules: Vec<Option<Category>> = profile.functions.iter().map(classify).collect();
    let mut incoming: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
    for call in &profile.calls {
        if call.caller != call.callee && call.inclusive > 0 {
            incoming[call.callee].push((call.caller, call.inclusive as f64));
        }
    }
    // A function nobody called (a thread's entry) starts a context: its own
    // rule, or "other".
    let mut shares: Vec<Costs> = rules
        .iter()
        .map(|rule| one_hot(rule.unwrap_or(Category::Other)))
        .collect();
    // Each pass moves the callers' categories one call deeper; the graph's
    // depth bounds what is needed, and recursion converges geometrically.
    for _ in 0..1000 {
        let mut change: f64 = 0.0;
        for f in 0..n {
            if incoming[f].is_empty() {
                continue;
            }
            let weight: f64 = incoming[f].iter().map(|&(_, w)| w).sum();
            let mut inherited = [0.0; 8];
            for &(caller, w) in &incoming[f] {
                for (sum, share) in inherited.iter_mut().zip(shares[caller]) {
                    *sum += share * w / weight;
                }
            }
            let next = apply_rule(rules[f], inherited);
            for (old, new) in shares[f].iter().zip(next) {
                change = change.max((old - new).abs());
            }
            shares[f] = next;
        }
        if change < 1e-12 {
            break;
        }
    }
    profile
        .functions
        .iter()
        .zip(&shares)
        .map(|(function, share)| share.map(|part| function.self_cost as f64 * part))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::callgrind::Call;
    use super::*;

    fn function(object: &str, file: &str, name: &str, self_cost: u64) -> Function {
        Function {
            object: object.to_owned(),
            file: file.to_owned(),
            name: name.to_owned(),
            self_cost,
        }
    }

    const BIN: &str = "/work/target/release/iscsi";
    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

    #[test]
    fn rules_by_name_file_and_object() {
        let cases = [
            (
                BIN,
                "x86_64.rs",
                "iscsi_crc32c::x86_64::update_sse42_3way",
                Some(Category::Digest),
            ),
            (
                LIBC,
                "memmove.S",
                "__memcpy_avx_unaligned_erms",
                Some(Category::Copy),
            ),
            (
                LIBC,
                "memmove.S",
                "memcpy@@GLIBC_2.14",
                Some(Category::Copy),
            ),
            (LIBC, "writev.c", "writev", Some(Category::Syscall)),
            (LIBC, "recv.c", "__libc_recv", Some(Category::Syscall)),
            (
                BIN,
                "x.rs",
                "<&mio::net::tcp::stream::TcpStream as std::io::Read>::read",
                Some(Category::Syscall),
            ),
            (
                BIN,
                "/w/crates/scsi/src/backstore/ram.rs",
                "<T as F>::call",
                Some(Category::Backstore),
            ),
            (
                BIN,
                "lib.rs",
                "iscsi_scsi::backstore::ram::RamStore::read",
                Some(Category::Backstore),
            ),
            (BIN, "sbc.rs", "iscsi_scsi::sbc::read", Some(Category::Scsi)),
            (
                BIN,
                "/w/crates/initiator/src/scsi.rs",
                "rw10",
                Some(Category::Scsi),
            ),
            (
                BIN,
                "/w/crates/proto/src/pdu/decoder.rs",
                "iscsi_proto::pdu::decoder::Decoder::feed",
                Some(Category::Header),
            ),
            (
                BIN,
                "/w/crates/initiator/src/connection/tasks.rs",
                "<core::future::poll_fn::PollFn<F> as Future>::poll",
                Some(Category::Header),
            ),
            (
                BIN,
                "/r/tokio/src/runtime/task.rs",
                "<core::future::poll_fn::PollFn<F> as Future>::poll",
                None,
            ),
            (
                BIN,
                "/r/tokio/notify.rs",
                "tokio::sync::notify::Notify::notify_waiters",
                Some(Category::Other),
            ),
            (LIBC, "malloc.c", "_int_malloc", Some(Category::Other)),
            (
                LIBC,
                "memset.S",
                "__memset_avx2_unaligned_erms",
                Some(Category::Zero),
            ),
            (
                BIN,
                "map.rs",
                "hashbrown::map::HashMap<K,V,S,A>::remove",
                None,
            ),
            (
                BIN,
                "bench.rs",
                "iscsi::cmd::pdu_cost::workload::run",
                Some(Category::Other),
            ),
        ];
        for (object, file, name, want) in cases {
            assert_eq!(
                classify(&function(object, file, name, 0)),
                want,
                "{name} in {file}"
            );
        }
    }

    /// main (other) -> connection (header) -> hashmap (no rule) -> memcpy
    /// and main -> backstore -> memcpy; hashmap is also reached from tokio.
    #[test]
    fn attribution_inherits_encloses_and_adds_up() {
        let functions = vec![
            function(BIN, "main.rs", "(below main)", 10), // 0
            function(
                BIN,
                "/crates/initiator/src/connection/tasks.rs",
                "route",
                20,
            ), // 1
            function(BIN, "map.rs", "hashbrown::HashMap::get", 40), // 2
            function(LIBC, "memmove.S", "memcpy", 300),   // 3
            function(BIN, "lib.rs", "iscsi_scsi::backstore::ram::Ram::read", 5), // 4
            function(BIN, "t.rs", "tokio::runtime::Core::poll", 30), // 5
        ];
        let calls = vec![
            Call {
                caller: 0,
                callee: 1,
                inclusive: 220,
            },
            Call {
                caller: 1,
                callee: 2,
                inclusive: 200,
            },
            Call {
                caller: 2,
                callee: 3,
                inclusive: 120,
            },
            Call {
                caller: 0,
                callee: 4,
                inclusive: 185,
            },
            Call {
                caller: 4,
                callee: 3,
                inclusive: 180,
            },
            Call {
                caller: 0,
                callee: 5,
                inclusive: 30 + 40,
            },
            Call {
                caller: 5,
                callee: 2,
                inclusive: 40,
            },
        ];
        let profile = Profile {
            functions,
            calls,
            total: 405,
        };
        let costs = attribute(&profile);
        let get = |c: Category| costs[c.index()];
        // hashmap: 200 of its 240 incoming from header, 40 from tokio (other):
        // its 40 instructions are 5/6 header, 1/6 other.
        // memcpy: 120 from hashmap (copy), 180 from the backstore (enclosed):
        // 120 copy, 180 backstore.
        let want_header = 20.0 + 40.0 * 5.0 / 6.0;
        let want_other = 10.0 + 30.0 + 40.0 / 6.0;
        assert!(
            (get(Category::Header) - want_header).abs() < 1e-6,
            "{costs:?}"
        );
        assert!(
            (get(Category::Other) - want_other).abs() < 1e-6,
            "{costs:?}"
        );
        assert!((get(Category::Copy) - 120.0).abs() < 1e-6, "{costs:?}");
        assert!((get(Category::Backstore) - 185.0).abs() < 1e-6, "{costs:?}");
        assert_eq!(get(Category::Digest), 0.0);
        let sum: f64 = costs.iter().sum();
        assert!((sum - profile.self_total() as f64).abs() < 1e-6);
    }

    #[test]
    fn recursion_converges_and_still_adds_up() {
        let functions = vec![
            function(BIN, "/crates/proto/src/a.rs", "iscsi_proto::walk", 10),
            function(BIN, "x.rs", "core::helper", 50),
        ];
        let calls = vec![
            Call {
                caller: 0,
                callee: 1,
                inclusive: 60,
            },
            Call {
                caller: 1,
                callee: 1,
                inclusive: 30,
            },
            Call {
                caller: 1,
                callee: 0,
                inclusive: 5,
            },
        ];
        let profile = Profile {
            functions,
            calls,
            total: 60,
        };
        let costs = attribute(&profile);
        assert!(
            (costs[Category::Header.index()] - 60.0).abs() < 1e-6,
            "{costs:?}"
        );
    }
}
