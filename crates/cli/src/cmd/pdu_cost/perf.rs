//! The kernel's share, which callgrind cannot see: `perf record -e
//! cpu-clock -a` samples of a native run of the same case, read back one
//! process at a time from `perf report --pid PID --sort dso,sym -t ';' -F
//! period,dso,sym` (`--pid` takes a process and all its threads; the `pid`
//! sort key would split the target's tokio threads apart).
//!
//! cpu-clock samples are timer interrupts, so a sample's period is
//! nanoseconds of CPU: for the process we sum those in the kernel, those in
//! the kernel's copy routines (the socket copy to and from user space), and
//! those in user space (to set beside the instruction counts).

use anyhow::Context;

/// Nanoseconds of CPU of one process, from samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessTime {
    /// In the kernel, on behalf of the process (system calls, and the
    /// softirq work of loopback TCP done in its context).
    pub kernel_ns: f64,
    /// Of `kernel_ns`, in the kernel's user-copy routines.
    pub kernel_copy_ns: f64,
    /// In user space.
    pub user_ns: f64,
}

/// Kernel symbols that copy between socket buffers and user memory.
const KERNEL_COPY: [&str; 5] = [
    "copy_to_iter",
    "copy_from_iter",
    "copy_user",
    "rep_movs",
    "copy_page_",
];

/// Sums a `perf report` of one process (in the format above).
pub fn parse_report(text: &str) -> anyhow::Result<ProcessTime> {
    let mut entry = ProcessTime::default();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(';').map(str::trim).collect();
        let [period, dso, symbol] = fields[..] else {
            anyhow::bail!("unexpected perf report line {line:?}");
        };
        let period: f64 = period
            .parse()
            .with_context(|| format!("period in {line:?}"))?;
        if dso.starts_with("[kernel") || symbol.starts_with("[k]") {
            entry.kernel_ns += period;
            if KERNEL_COPY.iter().any(|p| symbol.contains(p)) {
                entry.kernel_copy_ns += period;
            }
        } else {
            entry.user_ns += period;
        }
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_kernel_copy_and_user() {
        let report = "\
# comment
 192750000  ;[kernel.kallsyms]   ;[k] _raw_spin_unlock_irqrestore
 92000000   ;[kernel.kallsyms]   ;[k] _copy_from_iter
 1000000    ;[kernel.kallsyms]   ;[k] copy_user_enhanced_fast_string
 34500000   ;iscsi               ;[.] iscsi_crc32c::x86_64::update_hybrid
 6500000    ;libc.so.6           ;[.] epoll_wait

";
        assert_eq!(
            parse_report(report).unwrap(),
            ProcessTime {
                kernel_ns: 285_750_000.0,
                kernel_copy_ns: 93_000_000.0,
                user_ns: 41_000_000.0
            }
        );
        assert_eq!(parse_report("# nothing\n").unwrap(), ProcessTime::default());
        assert!(parse_report("12 ; x").is_err());
        assert!(parse_report("x ; [kernel.kallsyms] ; [k] f").is_err());
    }
}
