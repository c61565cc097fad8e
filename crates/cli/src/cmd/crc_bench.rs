//! `iscsi crc-bench`: throughput of every CRC32C algorithm, of memcpy, of
//! copy-then-CRC and of the fused copy+CRC, over buffer sizes from 512 B (in
//! L1) to 64 MiB (out of cache), as the median of several runs.
//!
//! Runs are interleaved (run 1 of every subject, then run 2, ...) so that a
//! burst of noise on a shared machine spreads over all subjects instead of
//! skewing one; each run repeats the operation for at least `--min-run-ms`.
//! The maintained crates `crc32c` and `crc-fast` run beside ours so the
//! ratios come from one process on one machine.

use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use iscsi_crc32c::{Algorithm, Engine};
use serde::Serialize;

use super::measure::{cpu_model, median, tsc_hz};

/// Command-line options of `iscsi crc-bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object per line instead of tables.
    #[arg(long)]
    json: bool,
    /// Runs per measurement; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(5..=101))]
    runs: u32,
    /// The shortest time one run repeats the operation for, in milliseconds.
    #[arg(long, default_value_t = 20)]
    min_run_ms: u64,
    /// Buffer sizes in bytes (default: 512 4096 8192 65536 1048576 67108864).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Where the destination starts within its 4 KiB page relative to the
    /// source. glibc's `rep movsb` memcpy slows down several times on AMD Zen
    /// when this is small (4K aliasing); 2048 keeps the comparison fair.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u16).range(0..4096))]
    dst_page_offset: u16,
}

const DEFAULT_SIZES: [usize; 6] = [512, 4096, 8192, 65536, 1 << 20, 64 << 20];

/// Computes something over the source buffer.
type ChecksumFn = Box<dyn Fn(&[u8]) -> u32>;
/// Copies the source buffer into the destination (and may checksum it).
type CopyFn = Box<dyn Fn(&mut [u8], &[u8]) -> u32>;

/// What one subject does to the source buffer (and, for copies, the
/// destination). Each returns a value the optimiser must not discard.
enum Operation {
    Checksum(ChecksumFn),
    Copy(CopyFn),
}

struct Subject {
    name: String,
    implementation: String,
    operation: Operation,
}

impl Subject {
    fn checksum(name: &str, implementation: &str, f: impl Fn(&[u8]) -> u32 + 'static) -> Self {
        Subject {
            name: name.to_owned(),
            implementation: implementation.to_owned(),
            operation: Operation::Checksum(Box::new(f)),
        }
    }

    fn copy(
        name: &str,
        implementation: &str,
        f: impl Fn(&mut [u8], &[u8]) -> u32 + 'static,
    ) -> Self {
        Subject {
            name: name.to_owned(),
            implementation: implementation.to_owned(),
            operation: Operation::Copy(Box::new(f)),
        }
    }

    /// Runs the operation `iterations` times and returns the elapsed time.
    fn time(&self, iterations: u64, src: &[u8], dst: &mut [u8]) -> Duration {
        let start = Instant::now();
        match &self.operation {
            Operation::Checksum(f) => {
                for _ in 0..iterations {
                    black_box(f(black_box(src)));
                }
            }
            Operation::Copy(f) => {
                for _ in 0..iterations {
                    black_box(f(black_box(&mut *dst), black_box(src)));
                }
            }
        }
        start.elapsed()
    }
}

/// Every subject, in the order the tables list them.
fn subjects() -> Vec<Subject> {
    let mut subjects = Vec::new();
    for (name, algorithm) in [
        ("bitwise", Algorithm::Bitwise),
        ("sarwate", Algorithm::Sarwate),
        ("slicing8", Algorithm::Slicing8),
    ] {
        if let Some(engine) = algorithm.engine() {
            subjects.push(Subject::checksum(name, name, move |d| engine.checksum(d)));
        }
    }
    let fastest = *Engine::fastest();
    let fastest_name = fastest.algorithm().name();
    subjects.push(Subject::checksum("hardware", fastest_name, move |d| {
        fastest.checksum(d)
    }));
    // The individual hardware paths, to show what each technique brings.
    for algorithm in Algorithm::available() {
        if matches!(
            algorithm,
            Algorithm::Bitwise | Algorithm::Sarwate | Algorithm::Slicing8
        ) {
            continue;
        }
        let engine = algorithm.engine().expect("listed as available");
        subjects.push(Subject::checksum(
            algorithm.name(),
            algorithm.name(),
            move |d| engine.checksum(d),
        ));
    }
    subjects.push(Subject::checksum(
        "crate_crc32c",
        "crc32c 0.6",
        crc32c::crc32c,
    ));
    subjects.push(Subject::checksum("crate_crc_fast", "crc-fast 1.10", |d| {
        crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, d) as u32
    }));
    subjects.push(Subject::copy("memcpy", "copy_from_slice", |dst, src| {
        dst.copy_from_slice(src);
        u32::from(dst.first().copied().unwrap_or(0))
    }));
    subjects.push(Subject::copy(
        "copy_then_crc",
        fastest_name,
        move |dst, src| {
            dst.copy_from_slice(src);
            fastest.checksum(dst)
        },
    ));
    let fused = match fastest.single_pass_min_len() {
        Some(min) => format!("single pass from {min} B, copy then CRC below"),
        None => "4 KiB chunks".to_owned(),
    };
    subjects.push(Subject::copy("fused_copy_crc", &fused, move |dst, src| {
        fastest.copy_append(0, dst, src)
    }));
    if fastest.has_single_pass_copy() {
        subjects.push(Subject::copy(
            "fused_copy_crc_1pass",
            "single pass at every size",
            move |dst, src| fastest.copy_append_single_pass(0, dst, src),
        ));
    }
    subjects.push(Subject::copy(
        "fused_copy_crc_chunked",
        "4 KiB chunks",
        move |dst, src| fastest.copy_append_chunked(0, dst, src),
    ));
    subjects
}

/// One line of `--json` output and one cell of the tables.
#[derive(Serialize, Clone)]
struct Measurement {
    algorithm: String,
    bytes: usize,
    gib_per_s: f64,
    /// TSC cycles per byte (the TSC runs at the nominal frequency, not the
    /// boosted one); absent where the TSC rate cannot be read.
    cycles_per_byte: Option<f64>,
    runs: u32,
    implementation: String,
}

/// Deterministic, incompressible-looking bytes.
fn fill_pseudo_random(buffer: &mut [u8]) {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for chunk in buffer.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let bytes = state.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Measures every subject at one buffer size.
fn measure_size(
    subjects: &[Subject],
    size: usize,
    args: &Args,
    tsc_hz: Option<f64>,
) -> Vec<Measurement> {
    // Source and destination in one allocation, both cache-line aligned, the
    // destination `dst_page_offset` bytes further into its page.
    let page = 4096;
    let mut backing = vec![0xA5u8; 2 * size + 3 * page]; // written: no first-touch faults timed
    let src_start = backing.as_ptr().align_offset(page);
    let dst_start = src_start + size.next_multiple_of(page) + usize::from(args.dst_page_offset);
    let (head, tail) = backing.split_at_mut(dst_start);
    let src = &mut head[src_start..src_start + size];
    let dst = &mut tail[..size];
    fill_pseudo_random(src);
    let src = &*src;
    let min_run = Duration::from_millis(args.min_run_ms);

    // Calibrate: one warm-up call each, then enough repetitions per run.
    let iterations: Vec<u64> = subjects
        .iter()
        .map(|subject| {
            let once = subject.time(1, src, dst).max(Duration::from_nanos(20));
            (min_run.as_secs_f64() / once.as_secs_f64()).ceil().max(1.0) as u64
        })
        .collect();

    let mut rates = vec![Vec::with_capacity(args.runs as usize); subjects.len()];
    for _ in 0..args.runs {
        for ((subject, &count), rate) in subjects.iter().zip(&iterations).zip(&mut rates) {
            let elapsed = subject.time(count, src, dst);
            let bytes = size as f64 * count as f64;
            rate.push(bytes / elapsed.as_secs_f64() / f64::from(1u32 << 30));
        }
    }
    subjects
        .iter()
        .zip(&mut rates)
        .map(|(subject, rate)| {
            let gib_per_s = median(rate);
            Measurement {
                algorithm: subject.name.clone(),
                bytes: size,
                gib_per_s,
                cycles_per_byte: tsc_hz.map(|hz| hz / (gib_per_s * f64::from(1u32 << 30))),
                runs: args.runs,
                implementation: subject.implementation.clone(),
            }
        })
        .collect()
}

/// Runs `iscsi crc-bench`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let sizes = if args.sizes.is_empty() {
        DEFAULT_SIZES.to_vec()
    } else {
        args.sizes.clone()
    };
    ensure!(
        sizes.iter().all(|&s| s > 0),
        "buffer sizes must be positive"
    );
    let subjects = subjects();
    let tsc_hz = tsc_hz();
    let started = Instant::now();
    let mut stdout = std::io::stdout().lock();
    let mut all = Vec::new();
    for &size in &sizes {
        let rows = measure_size(&subjects, size, args, tsc_hz);
        if args.json {
            for row in &rows {
                serde_json::to_writer(&mut stdout, row)?;
                writeln!(stdout)?;
            }
            stdout.flush()?;
        }
        all.extend(rows);
    }
    if !args.json {
        print_tables(
            &mut stdout,
            &subjects,
            &sizes,
            &all,
            tsc_hz,
            started.elapsed(),
        )
        .context("writing the tables")?;
    }
    Ok(())
}

fn lookup<'a>(all: &'a [Measurement], algorithm: &str, bytes: usize) -> Option<&'a Measurement> {
    all.iter()
        .find(|m| m.algorithm == algorithm && m.bytes == bytes)
}

fn human_size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn print_tables(
    out: &mut impl Write,
    subjects: &[Subject],
    sizes: &[usize],
    all: &[Measurement],
    tsc_hz: Option<f64>,
    elapsed: Duration,
) -> std::io::Result<()> {
    writeln!(out, "CPU: {}", cpu_model())?;
    if let Some(hz) = tsc_hz {
        writeln!(
            out,
            "TSC: {:.3} GHz (cycles below are TSC cycles)",
            hz / 1e9
        )?;
    }
    writeln!(
        out,
        "hardware = {}; medians of {} runs\n",
        Engine::fastest().algorithm(),
        all.first().map_or(0, |m| m.runs)
    )?;
    let mut table = |title: &str, cell: &dyn Fn(&Measurement) -> Option<f64>| {
        writeln!(out, "{title}")?;
        write!(out, "{:<24}", "algorithm")?;
        for &size in sizes {
            write!(out, "{:>10}", human_size(size))?;
        }
        writeln!(out)?;
        for subject in subjects {
            write!(out, "{:<24}", subject.name)?;
            for &size in sizes {
                match lookup(all, &subject.name, size).and_then(cell) {
                    Some(v) => write!(out, "{v:>10.2}")?,
                    None => write!(out, "{:>10}", "-")?,
                }
            }
            writeln!(out)?;
        }
        writeln!(out)
    };
    table("GiB/s", &|m| Some(m.gib_per_s))?;
    if tsc_hz.is_some() {
        table("cycles/byte", &|m| m.cycles_per_byte)?;
    }
    let ratio = |a: &str, b: &str, bytes: usize| {
        Some(lookup(all, a, bytes)?.gib_per_s / lookup(all, b, bytes)?.gib_per_s)
    };
    for (a, b, bytes) in [
        ("slicing8", "sarwate", 8192),
        ("hardware", "sarwate", 8192),
        ("hardware", "crate_crc32c", 8192),
        ("hardware", "crate_crc_fast", 8192),
        ("fused_copy_crc", "copy_then_crc", 8192),
        ("fused_copy_crc", "copy_then_crc", 64 << 20),
    ] {
        if let Some(r) = ratio(a, b, bytes) {
            writeln!(out, "{a} / {b} at {}: {r:.2}x", human_size(bytes))?;
        }
    }
    writeln!(out, "\n(run took {:.1} s)", elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_reports_every_subject_at_every_size() {
        let args = Args {
            json: true,
            runs: 5,
            min_run_ms: 1,
            sizes: vec![512, 4100],
            dst_page_offset: 2048,
        };
        let subjects = subjects();
        for &size in &args.sizes {
            let rows = measure_size(&subjects, size, &args, None);
            assert_eq!(rows.len(), subjects.len());
            for row in rows {
                assert!(
                    row.gib_per_s.is_finite() && row.gib_per_s > 0.0,
                    "{}",
                    row.algorithm
                );
            }
        }
        for required in [
            "bitwise",
            "sarwate",
            "slicing8",
            "hardware",
            "memcpy",
            "copy_then_crc",
            "fused_copy_crc",
        ] {
            assert!(subjects.iter().any(|s| s.name == required), "{required}");
        }
    }
}
