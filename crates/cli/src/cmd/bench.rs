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
use iscsi_initiator::multipath::alua::Resend;
use iscsi_initiator::scsi::{rw10_cdb, rw16_cdb};
use iscsi_initiator::{Command, Multipath, Session};

use super::initiator_args::{SessionArgs, connect, multipath, parse_size, target_url};

/// Options of `iscsi bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn/lun; more than one
    /// (a URL per portal or gateway of the same LU) runs the load through
    /// the initiator's multipath set (one session per path, I/O on the
    /// active/optimized one, moved when it fails).
    #[arg(required = true, num_args = 1..)]
    urls: Vec<String>,
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
    /// Threads. 1: everything on one current-thread runtime. More, with
    /// several sessions (--sessions, --mix): that many shards (at most one
    /// per session), each an OS thread with a current-thread runtime of its
    /// own; session i logs in, runs and logs out on shard i % N, its
    /// connections' tasks with it. More with one session: a work-stealing
    /// runtime of that many worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// With shards (--threads N, several sessions): pin shard i to the i-th
    /// CPU of the process's affinity mask (`taskset` sets it), wrapping when
    /// the mask has fewer; where pinning fails the shard runs unpinned.
    #[arg(long)]
    pin: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Separate sessions, each logged in as its own initiator (the
    /// initiator name with a `:s<i>` suffix when there are several), each
    /// with its own --qd workers; logged in 16 at a time. With more than
    /// one session (or --mix) the report has a `kinds` list: per kind of
    /// session, aggregate MiB/s, IOPS, latency percentiles and the
    /// fewest / median / most commands any one session completed.
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    /// Mixed load (ignores --rw and --bs): even sessions do 4 KiB random
    /// reads at --qd, odd sessions 1 MiB sequential reads at --mix-large-qd.
    #[arg(long)]
    mix: bool,
    /// Commands in flight per 1 MiB session of --mix.
    #[arg(long, default_value_t = 2)]
    mix_large_qd: usize,
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
    /// The negotiated ErrorRecoveryLevel.
    error_recovery_level: u8,
    /// Data SNACKs sent: Data-In lost to digest errors and recovered within
    /// the connection (ERL 1).
    snacks: u64,
    /// Recovery R2Ts answered: Data-Out lost to digest errors and sent
    /// again within the connection (ERL 1).
    recovery_r2ts: u64,
    /// Times the session was reinstated (ERL 0's answer to any error).
    reinstatements: u64,
}

/// One kind of session in a multi-session run (`--sessions`, `--mix`).
#[derive(Debug, serde::Serialize)]
struct KindReport {
    rw: String,
    bs: u64,
    qd: usize,
    /// Sessions of this kind.
    sessions: usize,
    commands: u64,
    mib_per_s: f64,
    iops: f64,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    /// Commands completed by the session that completed fewest (0 or far
    /// below the median: a starved session).
    min_session_commands: u64,
    median_session_commands: u64,
    max_session_commands: u64,
    /// Every session's completed commands, in session order.
    session_commands: Vec<u64>,
}

/// The outcome of a multi-session run.
#[derive(Debug, serde::Serialize)]
struct MultiReport {
    /// The --rw of every session, or "mix".
    rw: String,
    sessions: usize,
    /// Connections per session.
    connections: usize,
    /// Wall time from the first command to the last completion of any
    /// session.
    seconds: f64,
    /// Seconds the logins took (16 at a time).
    login_seconds: f64,
    commands: u64,
    mib_per_s: f64,
    iops: f64,
    kinds: Vec<KindReport>,
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
    let capacity = session.read_capacity(lun).await;
    let capacity = super::missing_lun::checked(session, lun, "READ CAPACITY", capacity).await?;
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

/// Where a load's commands go.
#[derive(Clone)]
pub enum Lu {
    /// LUN `.1` of one session.
    Session(Session, u64),
    /// The LU of a multipath set: each command through
    /// [`Multipath::run`], moved to another path if its own fails.
    Paths(Arc<Multipath>),
}

/// One command made by `command` (for a LUN) on `session`, sent again
/// after a unit attention (a reinstated session is a new I_T nexus) or a
/// transport CRC failure, as the library's own helpers do; its pooled
/// buffer, if any, back to the session.
async fn one_command<'a>(
    session: &Session,
    lun: u64,
    command: &impl Fn(u64) -> Command<'a>,
) -> Result<(), iscsi_initiator::Error> {
    let mut response = session.execute(command(lun)).await?;
    for _ in 0..RETRIES {
        if !response.may_retry() {
            break;
        }
        response = session.execute(command(lun)).await?;
    }
    session.recycle(response.check()?.data);
    Ok(())
}

/// Runs the load on an open session or multipath set: `qd` workers each
/// keep one command in flight until `time` has passed.
pub async fn run_load(lu: &Lu, geometry: &Geometry, load: &Load) -> anyhow::Result<Measured> {
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
        let lu = lu.clone();
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
                let command = |lun| {
                    if write {
                        Command::write_shared(lun, cdb, data.clone())
                    } else if keep_data {
                        Command::read_pooled(lun, cdb, transfer_length)
                    } else {
                        Command::read_discarded(lun, cdb, transfer_length)
                    }
                };
                match &lu {
                    Lu::Session(session, lun) => one_command(session, *lun, &command).await?,
                    Lu::Paths(paths) => {
                        let command = &command;
                        paths
                            .run(Resend::Idempotent, |s, lun| async move {
                                one_command(&s, lun, command).await
                            })
                            .await?
                    }
                }
                let elapsed = issued.elapsed();
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
    let url = target_url(&args.urls[0])?;
    if args.sessions == 0 || args.mix_large_qd == 0 {
        bail!("--sessions and --mix-large-qd must be positive");
    }
    if args.urls.len() > 1 && (args.sessions > 1 || args.mix) {
        bail!("--sessions and --mix take one URL");
    }
    if args.sessions > 1 || args.mix {
        return run_sessions(args, &url, write, random, bs);
    }
    let load = Load {
        write,
        random,
        bs,
        qd: args.qd,
        time: args.time,
        keep_data: args.keep_data,
    };
    let report = runtime(args.threads)?.block_on(async {
        let (session, lu) = match args.urls.len() {
            1 => {
                let session = connect(&url, &args.session).await?;
                let lu = Lu::Session(session.clone(), url.lun);
                (session, lu)
            }
            _ => {
                let paths = Arc::new(multipath(&args.urls, &args.session).await?);
                let session = paths.session().context("no path logged in")?;
                (Session::clone(&session), Lu::Paths(paths))
            }
        };
        let geometry = geometry(&session, url.lun).await?;
        let measured = run_load(&lu, &geometry, &load).await?;
        if let Lu::Paths(paths) = &lu {
            for path in paths.paths() {
                eprintln!("iscsi bench: path {path}");
            }
            let _ = paths.logout().await;
        }
        let connections = session.connection_count();
        let sends = session.send_statistics();
        let error_recovery_level = session.parameters().map_or(0, |p| p.error_recovery_level);
        let (snacks, reinstatements) = (session.snacks_sent(), session.reinstatements());
        let recovery_r2ts = session.recovery_r2ts_answered();
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
            error_recovery_level,
            snacks,
            recovery_r2ts,
            reinstatements,
        })
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} bs={} qd={} connections={}: {:.1} MiB/s, {:.0} IOPS, latency mean {:.0} us, p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us ({} commands in {:.1} s, {:.2} PDUs per write; ERL {}, {} SNACKs, {} recovery R2Ts, {} reinstatements)",
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
            report.pdus_per_write,
            report.error_recovery_level,
            report.snacks,
            report.recovery_r2ts,
            report.reinstatements
        );
    }
    Ok(())
}

/// The load of session `index` of a multi-session run.
fn session_load(args: &Args, index: usize, write: bool, random: bool, bs: u64) -> Load {
    let (write, random, bs, qd) = if !args.mix {
        (write, random, bs, args.qd)
    } else if index.is_multiple_of(2) {
        (false, true, 4096, args.qd)
    } else {
        (false, false, 1 << 20, args.mix_large_qd)
    };
    Load {
        write,
        random,
        bs,
        qd,
        time: args.time,
        keep_data: args.keep_data,
    }
}

/// `--rw` of a load.
fn rw_name(load: &Load) -> &'static str {
    match (load.write, load.random) {
        (false, false) => "read",
        (true, false) => "write",
        (false, true) => "randread",
        (true, true) => "randwrite",
    }
}

/// Logins of a multi-session run in flight at once.
const LOGIN_CONCURRENCY: usize = 16;

/// How often one I/O is sent again while its status says it may be
/// (`Response::may_retry`).
const RETRIES: usize = 4;

/// `--sessions N` / `--mix`: N sessions, each its own initiator, logged in
/// 16 at a time, then all loads started together, on `--threads` shards
/// (`run_sharded`; one shard is one current-thread runtime).
fn run_sessions(
    args: &Args,
    url: &iscsi_initiator::IscsiUrl,
    write: bool,
    random: bool,
    bs: u64,
) -> anyhow::Result<()> {
    let base = args.session.config()?;
    let loads: Vec<Load> = (0..args.sessions)
        .map(|i| session_load(args, i, write, random, bs))
        .collect();
    let report = run_sharded(args, url, &base, &loads)?;
    print_multi(args, &report)
}

/// The configuration of session `i` of `sessions`: its own initiator name
/// (`NAME:s<i>`) when there are several.
fn session_config(
    base: &iscsi_initiator::SessionConfig,
    sessions: usize,
    i: usize,
) -> iscsi_initiator::SessionConfig {
    let mut config = base.clone();
    if sessions > 1 {
        config.initiator_name = format!("{}:s{i}", base.initiator_name);
    }
    config
}

/// Logs session `i` in and reads the LUN's geometry on it.
async fn login(
    url: &iscsi_initiator::IscsiUrl,
    config: iscsi_initiator::SessionConfig,
    i: usize,
) -> anyhow::Result<(Session, Geometry)> {
    let session = Session::connect(url, config)
        .await
        .with_context(|| format!("logging in session {i} to {url}"))?;
    // A new I_T nexus may hold a unit attention (tgtd reports POWER ON to
    // each): READ CAPACITY takes it before the load's first command would.
    let geometry = geometry(&session, url.lun)
        .await
        .with_context(|| format!("session {i}"))?;
    Ok((session, geometry))
}

/// The sessions each of `shards` shards runs, round-robin: session `i` on
/// shard `i % shards`, so that no two shards differ by more than one
/// session (and, with `--mix`, each shard gets both kinds when it has two
/// sessions or more).
pub fn shard_sessions(sessions: usize, shards: usize) -> Vec<Vec<usize>> {
    let shards = shards.max(1);
    let mut out = vec![Vec::new(); shards];
    for i in 0..sessions {
        out[i % shards].push(i);
    }
    out
}

/// Pins the calling thread to `cpu`; a failure (a CPU taken away since,
/// a kernel without affinity) leaves it where it is, said at debug level.
fn pin_to(cpu: usize) {
    if let Err(error) = iscsi_target::shards::pin_current_thread(cpu) {
        tracing::debug!(cpu, %error, "sched_setaffinity failed: shard left unpinned");
    }
}

/// Runs `shard(i)` for each of `shards` shards, each on an OS thread of its
/// own with a current-thread runtime (`enable_all`): every task the future
/// spawns with `tokio::spawn` (the initiator's connection tasks among them)
/// runs on that thread. With `pin`, shard i is pinned to the i-th CPU of
/// the process's affinity mask (wrapping when the mask has fewer CPUs than
/// there are shards). Returns each shard's result, in shard order.
pub fn on_shards<F, Fut, R>(shards: usize, pin: bool, shard: F) -> anyhow::Result<Vec<R>>
where
    F: Fn(usize) -> Fut + Sync,
    Fut: std::future::Future<Output = anyhow::Result<R>>,
    R: Send,
{
    // The CPUs of the calling thread's affinity mask, in order (none when
    // it cannot be read: the shards are left unpinned).
    let cpus = if pin {
        iscsi_target::shards::allowed_cpus().unwrap_or_default()
    } else {
        Vec::new()
    };
    // Every runtime is made before any shard starts: a shard that failed
    // to start its runtime would never reach the barrier the others wait
    // at.
    let runtimes = (0..shards)
        .map(|_| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting a shard's runtime")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    std::thread::scope(|scope| {
        let handles: Vec<_> = runtimes
            .into_iter()
            .enumerate()
            .map(|(i, runtime)| {
                let shard = &shard;
                let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
                std::thread::Builder::new()
                    .name(format!("bench-shard-{i}"))
                    .spawn_scoped(scope, move || {
                        if let Some(cpu) = cpu {
                            pin_to(cpu);
                        }
                        runtime.block_on(shard(i))
                    })
                    .context("starting a shard's thread")
            })
            .collect();
        let mut results = Vec::with_capacity(shards);
        for (i, handle) in handles.into_iter().enumerate() {
            let result = handle?
                .join()
                .map_err(|_| anyhow::anyhow!("shard {i} panicked"))?;
            results.push(result.with_context(|| format!("shard {i}"))?);
        }
        Ok(results)
    })
}

/// What one shard of a sharded run measured: its sessions' loads and the
/// instant its last load completed.
struct ShardOutcome {
    measured: Vec<(usize, Measured)>,
    end: Instant,
    /// The connections of its first session.
    connections: usize,
}

/// `--threads N` with several sessions: N shards (`on_shards`, at
/// most one per session), session i on shard i % N, each session's login,
/// load and logout on its shard. Logins are 16 at a time over all shards;
/// the loads start together once every shard has logged in (an async
/// barrier, which every shard reaches even when a login failed, so that
/// a failure ends the run instead of hanging it).
fn run_sharded(
    args: &Args,
    url: &iscsi_initiator::IscsiUrl,
    base: &iscsi_initiator::SessionConfig,
    loads: &[Load],
) -> anyhow::Result<MultiReport> {
    let shards = args.threads.clamp(1, args.sessions.max(1));
    let assignment = shard_sessions(args.sessions, shards);
    let logins = Arc::new(tokio::sync::Semaphore::new(LOGIN_CONCURRENCY));
    let barrier = tokio::sync::Barrier::new(shards);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let start = std::sync::OnceLock::new();
    let login_start = Instant::now();
    let outcomes = on_shards(shards, args.pin, |shard| {
        let (assignment, logins, barrier, failed, start) =
            (&assignment, &logins, &barrier, &failed, &start);
        async move {
            let mine = &assignment[shard];
            let mut tasks = tokio::task::JoinSet::new();
            for &i in mine {
                let config = session_config(base, args.sessions, i);
                let url = url.clone();
                let logins = logins.clone();
                tasks.spawn(async move {
                    let _permit = logins.acquire().await;
                    (i, login(&url, config, i).await)
                });
            }
            let mut sessions: Vec<(usize, Session, Geometry)> = Vec::with_capacity(mine.len());
            let mut error = None;
            while let Some(done) = tasks.join_next().await {
                match done.context("login task") {
                    Ok((i, Ok((session, geometry)))) => sessions.push((i, session, geometry)),
                    Ok((_, Err(e))) | Err(e) => error = error.or(Some(e)),
                }
            }
            sessions.sort_by_key(|(i, _, _)| *i);
            if error.is_none() {
                for (i, _, geometry) in &sessions {
                    if let Err(e) = check_load(&loads[*i], geometry) {
                        error = Some(e);
                        break;
                    }
                }
            }
            if error.is_some() {
                failed.store(true, Ordering::SeqCst);
            }
            barrier.wait().await;
            start.get_or_init(Instant::now);
            if failed.load(Ordering::SeqCst) {
                for (_, session, _) in sessions {
                    let _ = session.logout().await;
                }
                // The shard that failed reports why; the others step
                // aside (Ok(None)) so as not to hide it.
                return error.map_or(Ok(None), Err);
            }
            let mut runs = tokio::task::JoinSet::new();
            for (i, session, geometry) in &sessions {
                let (i, session, geometry) = (*i, session.clone(), *geometry);
                let load = loads[i].clone();
                let lun = url.lun;
                let lu = Lu::Session(session, lun);
                runs.spawn(async move { (i, run_load(&lu, &geometry, &load).await) });
            }
            let mut measured = Vec::with_capacity(sessions.len());
            let mut error = None;
            while let Some(done) = runs.join_next().await {
                match done.context("session task") {
                    Ok((i, Ok(m))) => measured.push((i, m)),
                    Ok((i, Err(e))) => {
                        error = error.or(Some(e.context(format!("session {i}"))));
                    }
                    Err(e) => error = error.or(Some(e)),
                }
            }
            let end = Instant::now();
            let connections = sessions.first().map_or(0, |(_, s, _)| s.connection_count());
            let mut logouts = tokio::task::JoinSet::new();
            for (_, session, _) in sessions {
                logouts.spawn(async move {
                    let _ = session.logout().await;
                });
            }
            while logouts.join_next().await.is_some() {}
            match error {
                Some(e) => Err(e),
                None => Ok(Some(ShardOutcome {
                    measured,
                    end,
                    connections,
                })),
            }
        }
    })?;
    // Ok(None) only where another shard failed, and on_shards returned
    // that shard's error.
    let outcomes: Vec<ShardOutcome> = outcomes
        .into_iter()
        .collect::<Option<_>>()
        .context("a shard stopped without saying why")?;
    let start = *start.get().context("no shard started its load")?;
    let login_seconds = start.duration_since(login_start).as_secs_f64();
    let end = outcomes.iter().map(|o| o.end).max().unwrap_or(start);
    let seconds = end.duration_since(start).as_secs_f64();
    let connections = outcomes[0].connections;
    let mut measured: Vec<Option<Measured>> = vec![None; args.sessions];
    for outcome in outcomes {
        for (i, m) in outcome.measured {
            measured[i] = Some(m);
        }
    }
    let measured: Vec<Measured> = measured.into_iter().flatten().collect();
    Ok(multi_report(
        args,
        loads,
        &measured,
        seconds,
        login_seconds,
        connections,
    ))
}

/// The report of a multi-session run from every session's measurements
/// (in session order).
fn multi_report(
    args: &Args,
    loads: &[Load],
    measured: &[Measured],
    seconds: f64,
    login_seconds: f64,
    connections: usize,
) -> MultiReport {
    // Group the sessions by kind (rw and bs), in order of first use.
    let mut kinds: Vec<KindReport> = Vec::new();
    let mut kind_latencies: Vec<Vec<u32>> = Vec::new();
    for (load, measured) in loads.iter().zip(measured) {
        let rw = rw_name(load);
        let at = match kinds.iter().position(|k| k.rw == rw && k.bs == load.bs) {
            Some(at) => at,
            None => {
                kinds.push(KindReport {
                    rw: rw.to_owned(),
                    bs: load.bs,
                    qd: load.qd,
                    sessions: 0,
                    commands: 0,
                    mib_per_s: 0.0,
                    iops: 0.0,
                    mean_us: 0.0,
                    p50_us: 0.0,
                    p99_us: 0.0,
                    p999_us: 0.0,
                    max_us: 0.0,
                    min_session_commands: 0,
                    median_session_commands: 0,
                    max_session_commands: 0,
                    session_commands: Vec::new(),
                });
                kind_latencies.push(Vec::new());
                kinds.len() - 1
            }
        };
        kinds[at].sessions += 1;
        kinds[at].session_commands.push(measured.commands());
        kind_latencies[at].extend_from_slice(&measured.latencies);
    }
    for (kind, mut latencies) in kinds.iter_mut().zip(kind_latencies) {
        latencies.sort_unstable();
        let commands = latencies.len() as u64;
        kind.commands = commands;
        kind.mib_per_s = (commands * kind.bs) as f64 / (1 << 20) as f64 / seconds;
        kind.iops = commands as f64 / seconds;
        kind.mean_us =
            latencies.iter().map(|&l| f64::from(l)).sum::<f64>() / commands.max(1) as f64;
        kind.p50_us = percentile(&latencies, 50.0);
        kind.p99_us = percentile(&latencies, 99.0);
        kind.p999_us = percentile(&latencies, 99.9);
        kind.max_us = latencies.last().copied().map(f64::from).unwrap_or(0.0);
        let mut counts = kind.session_commands.clone();
        counts.sort_unstable();
        kind.min_session_commands = counts.first().copied().unwrap_or(0);
        kind.median_session_commands = counts[counts.len() / 2];
        kind.max_session_commands = counts.last().copied().unwrap_or(0);
    }
    let commands = kinds.iter().map(|k| k.commands).sum::<u64>();
    MultiReport {
        rw: if args.mix {
            "mix".to_owned()
        } else {
            args.rw.clone()
        },
        sessions: args.sessions,
        connections,
        seconds,
        login_seconds,
        commands,
        mib_per_s: kinds.iter().map(|k| k.mib_per_s).sum(),
        iops: commands as f64 / seconds,
        kinds,
    }
}

/// Prints a multi-session report (JSON with `--json`).
fn print_multi(args: &Args, report: &MultiReport) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} sessions ({}), {} connection(s) each: {:.1} MiB/s, {:.0} IOPS ({} commands in {:.1} s; logins took {:.2} s)",
            report.sessions,
            report.rw,
            report.connections,
            report.mib_per_s,
            report.iops,
            report.commands,
            report.seconds,
            report.login_seconds
        );
        for kind in &report.kinds {
            println!(
                "  {} bs={} qd={} x {} sessions: {:.1} MiB/s, {:.0} IOPS, latency mean {:.0} us, p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us; commands per session min {} median {} max {}",
                kind.rw,
                kind.bs,
                kind.qd,
                kind.sessions,
                kind.mib_per_s,
                kind.iops,
                kind.mean_us,
                kind.p50_us,
                kind.p99_us,
                kind.p999_us,
                kind.max_us,
                kind.min_session_commands,
                kind.median_session_commands,
                kind.max_session_commands
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_spread_round_robin_and_evenly() {
        assert_eq!(shard_sessions(5, 2), vec![vec![0, 2, 4], vec![1, 3]]);
        for sessions in 0..40 {
            for shards in 1..9 {
                let assignment = shard_sessions(sessions, shards);
                assert_eq!(assignment.len(), shards);
                let sizes: Vec<usize> = assignment.iter().map(Vec::len).collect();
                let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(max - min <= 1, "{sessions} over {shards}: {sizes:?}");
                let mut all: Vec<usize> = assignment.iter().flatten().copied().collect();
                all.sort_unstable();
                assert_eq!(all, (0..sessions).collect::<Vec<_>>());
                for (shard, mine) in assignment.iter().enumerate() {
                    assert!(mine.iter().all(|i| i % shards == shard));
                }
            }
        }
    }

    #[test]
    fn a_shards_tasks_run_on_its_own_thread() {
        let caller = std::thread::current().id();
        let shards = on_shards(3, true, |shard| async move {
            let me = std::thread::current().id();
            // What the initiator does for its connections: tokio::spawn,
            // with timers.
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..8 {
                tasks.spawn(async {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    tokio::task::yield_now().await;
                    std::thread::current().id()
                });
            }
            let mut ran_on = vec![tokio::spawn(async { std::thread::current().id() }).await?];
            while let Some(id) = tasks.join_next().await {
                ran_on.push(id?);
            }
            assert!(ran_on.iter().all(|&id| id == me), "shard {shard}");
            Ok((shard, me))
        })
        .unwrap();
        assert_eq!(shards.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2]);
        let threads: std::collections::HashSet<_> = shards.iter().map(|s| s.1).collect();
        assert!(!threads.contains(&caller));
        assert_eq!(threads.len(), 3, "one thread per shard");
    }

    #[test]
    fn a_failing_shard_fails_the_run() {
        let result = on_shards(2, false, |shard| async move {
            if shard == 1 {
                bail!("refused");
            }
            Ok(())
        });
        let error = format!("{:#}", result.unwrap_err());
        assert!(
            error.contains("shard 1") && error.contains("refused"),
            "{error}"
        );
    }
}
