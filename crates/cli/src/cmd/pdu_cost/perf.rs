//! The kernel's share, which callgrind cannot see: `perf record -e
//! cpu-clock -a` samples of a native run of the same case, read back from
//! `perf report --sort pid,dso,sym -t ';' -F period,pid,dso,sym`.
//!
//! That report's `pid` is the thread ID, so a process is the sum over its
//! threads (the workload records its own; the script lists the target's
//! from /proc before stopping it). perf 6.1's `report --pid` filter was
//! tried first and is wrong here: with `--sort dso,sym` it credited one
//! process's samples to the other.
//!
//! cpu-clock samples are timer interrupts, so a sample's period is
//! nanoseconds of CPU: we sum those in the kernel, those in the kernel's
//! copy routines (the socket copy to and from user space), and those in
//! user space (to set beside the instruction counts).

use std::collections::HashMap;

use anyhow::Context;

/// Nanoseconds of CPU of one thread or process, from samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessTime {
    /// In the kernel, on behalf of the thread (system calls, and the
    /// softirq work of loopback TCP done in its context).
    pub kernel_ns: f64,
    /// Of `kernel_ns`, in the kernel's user-copy routines.
    pub kernel_copy_ns: f64,
    /// In user space.
    pub user_ns: f64,
}

impl ProcessTime {
    fn add(&mut self, other: &ProcessTime) {
        self.kernel_ns += other.kernel_ns;
        self.kernel_copy_ns += other.kernel_copy_ns;
        self.user_ns += other.user_ns;
    }
}

/// Kernel symbols that copy between socket buffers and user memory.
const KERNEL_COPY: [&str; 5] = [
    "copy_to_iter",
    "copy_from_iter",
    "copy_user",
    "rep_movs",
    "copy_page_",
];

/// Sums a `perf report` (in the format above) by thread ID.
pub fn parse_report(text: &str) -> anyhow::Result<HashMap<u32, ProcessTime>> {
    let mut out: HashMap<u32, ProcessTime> = HashMap::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(';').map(str::trim).collect();
        let [period, tid, dso, symbol] = fields[..] else {
            anyhow::bail!("unexpected perf report line {line:?}");
        };
        let period: f64 = period
            .parse()
            .with_context(|| format!("period in {line:?}"))?;
        let tid: i64 = tid
            .split(':')
            .next()
            .unwrap_or_default()
            .trim()
            .parse()
            .with_context(|| format!("thread in {line:?}"))?;
        // perf reports samples it could not place as thread -1.
        let Ok(tid) = u32::try_from(tid) else {
            continue;
        };
        let entry = out.entry(tid).or_default();
        if dso.starts_with("[kernel") || symbol.starts_with("[k]") {
            entry.kernel_ns += period;
            if KERNEL_COPY.iter().any(|p| symbol.contains(p)) {
                entry.kernel_copy_ns += period;
            }
        } else {
            entry.user_ns += period;
        }
    }
    Ok(out)
}

/// The time of a process: the sum over its threads.
pub fn process_time(threads: &HashMap<u32, ProcessTime>, tids: &[u32]) -> ProcessTime {
    let mut total = ProcessTime::default();
    for tid in tids {
        if let Some(time) = threads.get(tid) {
            total.add(time);
        }
    }
    total
}

/// Thread IDs from a listing of `/proc/PID/task` (one number a line).
pub fn parse_tids(text: &str) -> anyhow::Result<Vec<u32>> {
    text.split_whitespace()
        .map(|t| t.parse().with_context(|| format!("thread ID {t:?}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "\
# comment
 192750000  ;  19243:tokio-rt-worker;[kernel.kallsyms]   ;[k] _raw_spin_unlock_irqrestore
 92000000   ;  19243:tokio-rt-worker;[kernel.kallsyms]   ;[k] _copy_from_iter
 34500000   ;  19243:tokio-rt-worker;iscsi               ;[.] iscsi_crc32c::x86_64::update_hybrid
 1000000    ;  19241:iscsi          ;[kernel.kallsyms]   ;[k] copy_user_enhanced_fast_string
 34500000   ;  19248:iscsi          ;[kernel.kallsyms]   ;[k] _copy_to_iter
 6500000    ;  19248:iscsi          ;libc.so.6           ;[.] epoll_wait
 1305750000 ;      0:swapper        ;[kernel.kallsyms]   ;[k] pv_native_safe_halt
 250000     ;     -1:-1             ;[kernel.kallsyms]   ;[k] bpf_inode_storage_free
";

    #[test]
    fn sums_kernel_copy_and_user_per_thread_and_process() {
        let threads = parse_report(REPORT).unwrap();
        assert_eq!(threads.len(), 4);
        assert_eq!(
            threads[&19243],
            ProcessTime {
                kernel_ns: 284_750_000.0,
                kernel_copy_ns: 92_000_000.0,
                user_ns: 34_500_000.0
            }
        );
        // A process of two threads (the target: main thread and a worker).
        assert_eq!(
            process_time(&threads, &[19241, 19243]),
            ProcessTime {
                kernel_ns: 285_750_000.0,
                kernel_copy_ns: 93_000_000.0,
                user_ns: 34_500_000.0
            }
        );
        assert_eq!(process_time(&threads, &[19248]).user_ns, 6_500_000.0);
        assert_eq!(process_time(&threads, &[7]), ProcessTime::default());
        assert!(parse_report("12 ; x").is_err());
        assert!(parse_report("x ; 1:a ; [kernel.kallsyms] ; [k] f").is_err());
    }

    #[test]
    fn thread_listings() {
        assert_eq!(parse_tids("19241\n19243\n").unwrap(), vec![19241, 19243]);
        assert!(parse_tids("19241\nabc\n").is_err());
    }
}
