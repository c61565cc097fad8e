//! What every benchmark subcommand shares: the TSC rate for cycle counts,
//! the CPU's name, and medians.

use std::time::{Duration, Instant};

/// The median of `values` (sorted in place).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// The TSC rate, calibrated against the monotonic clock over 50 ms, where
/// the CPU declares a constant-rate TSC.
#[cfg(target_arch = "x86_64")]
pub fn tsc_hz() -> Option<f64> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let constant = cpuinfo
        .lines()
        .filter(|line| line.starts_with("flags"))
        .any(|line| line.split_whitespace().any(|flag| flag == "constant_tsc"));
    if !constant {
        return None;
    }
    let start = Instant::now();
    let ticks_start = read_tsc();
    while start.elapsed() < Duration::from_millis(50) {
        std::hint::spin_loop();
    }
    let ticks = read_tsc().wrapping_sub(ticks_start);
    Some(ticks as f64 / start.elapsed().as_secs_f64())
}

#[cfg(target_arch = "x86_64")]
pub fn read_tsc() -> u64 {
    // SAFETY: `rdtsc` reads a counter; it has no memory effects and exists on
    // every x86-64 CPU.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn tsc_hz() -> Option<f64> {
    None
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tsc_rate_is_plausible_where_it_can_be_read() {
        if let Some(hz) = tsc_hz() {
            assert!((1e8..1e11).contains(&hz), "TSC at {hz} Hz");
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
