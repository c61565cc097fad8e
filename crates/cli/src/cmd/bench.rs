//! `iscsi bench`: a load generator against any iSCSI LUN. N workers (the
//! queue depth) each keep one command in flight for the run's duration;
//! throughput, IOPS and latency percentiles are computed from every
//! command's completion time. Reads are received in full (digests, DataSN,
//! offsets and residuals checked) and their data dropped, as libiscsi's
//! iscsi-perf does by landing every read in one shared buffer;
//! `--keep-data` lands each in a buffer of its own from the session's pool,
//! as an application using the data would.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use iscsi_initiator::scsi::{rw10_cdb, rw16_cdb};
use iscsi_initiator::{Command, Session};

use super::initiator_args::{SessionArgs, connect, parse_size, target_url};

/// Options of `iscsi bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn/lun
    url: String,
    /// read, write, randread or randwrite.
    #[arg(long, default_value = "read")]
    rw: String,
    /// Bytes per command (a multiple of the block size).
    #[arg(long, default_value = "4k")]
    bs: String,
    /// Commands in flight.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    time: f64,
    /// Land each read's data in a buffer of its own (from the session's
    /// pool) instead of dropping it once checked.
    #[arg(long)]
    keep_data: bool,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    session: SessionArgs,
}

/// The measured outcome.
#[derive(Debug, serde::Serialize)]
struct Report {
    rw: String,
    bs: u64,
    qd: usize,
    connections: usize,
    seconds: f64,
    commands: u64,
    mib_per_s: f64,
    iops: f64,
    mean_us: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    /// PDUs sent per write: how many commands left together.
    pdus_per_write: f64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    f64::from(sorted[rank.min(sorted.len() - 1)])
}

/// Runs the benchmark.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let (write, random) = match args.rw.as_str() {
        "read" => (false, false),
        "write" => (true, false),
        "randread" => (false, true),
        "randwrite" => (true, true),
        other => bail!("--rw must be read, write, randread or randwrite, not {other:?}"),
    };
    let bs = parse_size(&args.bs)?;
    if bs == 0 || args.qd == 0 || args.time <= 0.0 {
        bail!("--bs, --qd and --time must be positive");
    }
    let transfer_length = u32::try_from(bs).context("--bs must be below 4 GiB")?;
    let url = target_url(&args.url)?;
    // One thread: a current-thread runtime, like a poll loop (no wake-ups
    // handed between the caller's thread and a worker).
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    }
    .context("starting the runtime")?;
    let report = runtime.block_on(async {
        let session = connect(&url, &args.session).await?;
        let capacity = session
            .read_capacity(url.lun)
            .await
            .context("READ CAPACITY")?;
        let block_size = u64::from(capacity.block_size);
        if block_size == 0 {
            bail!("the target reports a block size of 0");
        }
        if bs % block_size != 0 {
            bail!("--bs must be a multiple of the {block_size}-byte block");
        }
        let blocks_per_io = bs / block_size;
        let slots = capacity.blocks / blocks_per_io;
        if slots == 0 {
            bail!("the LUN is smaller than one command");
        }
        let next = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs_f64(args.time);
        let start = Instant::now();
        let mut workers = tokio::task::JoinSet::new();
        for worker in 0..args.qd {
            let session: Session = session.clone();
            let next = next.clone();
            let lun = url.lun;
            let keep_data = args.keep_data;
            workers.spawn(async move {
                let mut latencies: Vec<u32> = Vec::with_capacity(1 << 16);
                // Writes send one buffer of their own; reads drop their data
                // or, with --keep-data, take the session's pooled buffers
                // (attached as data arrives and recycled at once).
                let data: Vec<u8> = if write {
                    (0..bs as usize).map(|i| (i + worker) as u8).collect()
                } else {
                    Vec::new()
                };
                while Instant::now() < deadline {
                    let slot = if random {
                        rand::random_range(0..slots)
                    } else {
                        next.fetch_add(1, Ordering::Relaxed) % slots
                    };
                    let lba = slot * blocks_per_io;
                    let cdb10;
                    let cdb16;
                    let cdb: &[u8] = match (u32::try_from(lba), u16::try_from(blocks_per_io)) {
                        (Ok(lba), Ok(blocks))
                            if u64::from(lba) + u64::from(blocks) <= u64::from(u32::MAX) =>
                        {
                            cdb10 = rw10_cdb(write, lba, blocks);
                            &cdb10
                        }
                        _ => {
                            cdb16 = rw16_cdb(write, lba, blocks_per_io as u32);
                            &cdb16
                        }
                    };
                    let issued = Instant::now();
                    let command = if write {
                        Command::write(lun, cdb, &data)
                    } else if keep_data {
                        Command::read_pooled(lun, cdb, transfer_length)
                    } else {
                        Command::read_discarded(lun, cdb, transfer_length)
                    };
                    let response = session.execute(command).await?;
                    let elapsed = issued.elapsed();
                    session.recycle(response.check()?.data);
                    latencies.push(u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX));
                }
                Ok::<_, iscsi_initiator::Error>(latencies)
            });
        }
        let mut latencies = Vec::new();
        while let Some(done) = workers.join_next().await {
            latencies.extend(done.context("worker")?.context("command failed")?);
        }
        let seconds = start.elapsed().as_secs_f64();
        let connections = session.connection_count();
        let sends = session.send_statistics();
        let _ = session.logout().await;
        latencies.sort_unstable();
        let commands = latencies.len() as u64;
        let mean = latencies.iter().map(|&l| f64::from(l)).sum::<f64>() / commands.max(1) as f64;
        Ok(Report {
            rw: args.rw.clone(),
            bs,
            qd: args.qd,
            connections,
            seconds,
            commands,
            mib_per_s: (commands * bs) as f64 / (1 << 20) as f64 / seconds,
            iops: commands as f64 / seconds,
            mean_us: mean,
            p50_us: percentile(&latencies, 50.0),
            p90_us: percentile(&latencies, 90.0),
            p99_us: percentile(&latencies, 99.0),
            p999_us: percentile(&latencies, 99.9),
            max_us: latencies.last().copied().map(f64::from).unwrap_or(0.0),
            pdus_per_write: sends.pdus as f64 / sends.writes.max(1) as f64,
        })
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} bs={} qd={} connections={}: {:.1} MiB/s, {:.0} IOPS, latency mean {:.0} us, p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us ({} commands in {:.1} s, {:.2} PDUs per write)",
            report.rw,
            report.bs,
            report.qd,
            report.connections,
            report.mib_per_s,
            report.iops,
            report.mean_us,
            report.p50_us,
            report.p99_us,
            report.p999_us,
            report.max_us,
            report.commands,
            report.seconds,
            report.pdus_per_write
        );
    }
    Ok(())
}
