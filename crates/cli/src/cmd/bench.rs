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

/// The access pattern of `--rw`: (write, random).
pub fn parse_rw(rw: &str) -> anyhow::Result<(bool, bool)> {
    Ok(match rw {
        "read" => (false, false),
        "write" => (true, false),
        "randread" => (false, true),
        "randwrite" => (true, true),
        other => bail!("--rw must be read, write, randread or randwrite, not {other:?}"),
    })
}

/// A tokio runtime for a load: with one thread, a current-thread runtime,
/// like a poll loop (no wake-ups handed between the caller's thread and a
/// worker).
pub fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .context("starting the runtime")
}

/// One run of the load generator: what `iscsi bench` runs once and
/// `iscsi sweep` runs per cell.
#[derive(Clone, Debug)]
pub struct Load {
    /// Writes (else reads).
    pub write: bool,
    /// Random offsets (else sequential, wrapping).
    pub random: bool,
    /// Bytes per command.
    pub bs: u64,
    /// Commands in flight.
    pub qd: usize,
    /// Seconds to run.
    pub time: f64,
    /// Land each read in a pooled buffer instead of dropping the data.
    pub keep_data: bool,
}

/// The LUN's size, as the load needs it.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// Bytes per logical block.
    pub block_size: u64,
    /// Logical blocks.
    pub blocks: u64,
}

/// Reads the LUN's capacity (one READ CAPACITY).
pub async fn geometry(session: &Session, lun: u64) -> anyhow::Result<Geometry> {
    let capacity = session.read_capacity(lun).await.context("READ CAPACITY")?;
    let block_size = u64::from(capacity.block_size);
    if block_size == 0 {
        bail!("the target reports a block size of 0");
    }
    Ok(Geometry {
        block_size,
        blocks: capacity.blocks,
    })
}

/// What one load run measured.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Wall time from the first command to the last completion.
    pub seconds: f64,
    /// Every command's latency in microseconds, ascending.
    pub latencies: Vec<u32>,
}

impl Measured {
    /// Commands completed.
    pub fn commands(&self) -> u64 {
        self.latencies.len() as u64
    }

    /// The latency at percentile `p` (0-100), in microseconds.
    pub fn percentile(&self, p: f64) -> f64 {
        percentile(&self.latencies, p)
    }

    /// Throughput in MiB/s for commands of `bs` bytes.
    pub fn mib_per_s(&self, bs: u64) -> f64 {
        (self.commands() * bs) as f64 / (1 << 20) as f64 / self.seconds
    }

    /// Commands per second.
    pub fn iops(&self) -> f64 {
        self.commands() as f64 / self.seconds
    }
}

/// Checks `load` against the LUN (`--bs` a multiple of the block, the LUN
/// at least one command long), so that a sweep can refuse a cell before it
/// measures anything.
pub fn check_load(load: &Load, geometry: &Geometry) -> anyhow::Result<()> {
    let block_size = geometry.block_size;
    if !load.bs.is_multiple_of(block_size) {
        bail!("--bs must be a multiple of the {block_size}-byte block");
    }
    if geometry.blocks / (load.bs / block_size) == 0 {
        bail!("the LUN is smaller than one command");
    }
    u32::try_from(load.bs).context("--bs must be below 4 GiB")?;
    Ok(())
}

/// Runs the load on an open session: `qd` workers each keep one command in
/// flight until `time` has passed.
pub async fn run_load(
    session: &Session,
    lun: u64,
    geometry: &Geometry,
    load: &Load,
) -> anyhow::Result<Measured> {
    check_load(load, geometry)?;
    let Load {
        write,
        random,
        bs,
        qd,
        time,
        keep_data,
    } = *load;
    let transfer_length = u32::try_from(bs).context("--bs must be below 4 GiB")?;
    let blocks_per_io = bs / geometry.block_size;
    let slots = geometry.blocks / blocks_per_io;
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(time);
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..qd {
        let session: Session = session.clone();
        let next = next.clone();
        workers.spawn(async move {
            let mut latencies: Vec<u32> = Vec::with_capacity(1 << 16);
            // Writes send one buffer of their own; reads drop their data
            // or, with --keep-data, take the session's pooled buffers
            // (attached as data arrives and recycled at once).
            let data: bytes::Bytes = if write {
                (0..bs as usize).map(|i| (i + worker) as u8).collect()
            } else {
                bytes::Bytes::new()
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
                    Command::write_shared(lun, cdb, data.clone())
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
    latencies.sort_unstable();
    Ok(Measured { seconds, latencies })
}

/// Runs the benchmark.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let (write, random) = parse_rw(&args.rw)?;
    let bs = parse_size(&args.bs)?;
    if bs == 0 || args.qd == 0 || args.time <= 0.0 {
        bail!("--bs, --qd and --time must be positive");
    }
    u32::try_from(bs).context("--bs must be below 4 GiB")?;
    let url = target_url(&args.url)?;
    let load = Load {
        write,
        random,
        bs,
        qd: args.qd,
        time: args.time,
        keep_data: args.keep_data,
    };
    let report = runtime(args.threads)?.block_on(async {
        let session = connect(&url, &args.session).await?;
        let geometry = geometry(&session, url.lun).await?;
        let measured = run_load(&session, url.lun, &geometry, &load).await?;
        let connections = session.connection_count();
        let sends = session.send_statistics();
        let _ = session.logout().await;
        let latencies = &measured.latencies;
        let commands = measured.commands();
        let mean = latencies.iter().map(|&l| f64::from(l)).sum::<f64>() / commands.max(1) as f64;
        Ok::<_, anyhow::Error>(Report {
            rw: args.rw.clone(),
            bs,
            qd: args.qd,
            connections,
            seconds: measured.seconds,
            commands,
            mib_per_s: measured.mib_per_s(bs),
            iops: measured.iops(),
            mean_us: mean,
            p50_us: measured.percentile(50.0),
            p90_us: measured.percentile(90.0),
            p99_us: measured.percentile(99.0),
            p999_us: measured.percentile(99.9),
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
