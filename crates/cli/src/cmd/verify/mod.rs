//! `iscsi verify`: a load that checks every byte it reads against a log of
//! every write the target acknowledged, for fault injection (the fault
//! matrix) and for anyone who wants to know that a path loses nothing.
//!
//! The region is cut into slots of `--bs` bytes. Every block written holds
//! its slot, a generation number and bytes derived from both, so a read
//! says which write it saw. Per slot the log keeps the generations the slot
//! may hold: after an acknowledged write, exactly that one; after a write
//! that ended in an error, the one before or the new one (either may be on
//! the medium; and until a write of the slot is acknowledged, whatever it
//! held before the run). At most one command per slot is in flight, so a read is
//! never racing a write of its own slot. After the timed load every slot is
//! read back once more.
//!
//! A read that returns a generation the slot may not hold is *wrong data*;
//! one that returns an older generation than an acknowledged write is a
//! *lost write*. Either makes the command exit 1. Commands that fail (an
//! error, not wrong data) are counted and reported, not fatal: whether a
//! fault may fail a command is the matrix's business.
//!
//! With `--journal` every write is also logged as issued, acknowledged and
//! made durable (`--durability fua` or `sync`); `--check` reads a LUN back
//! against such a journal after a crash ([`journal`], [`check`]), and
//! `--check --snapshot NAME` a snapshot taken during the load against the
//! moment it was taken ([`moment`]).

mod check;
mod disrupt;
mod journal;
mod moment;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use iscsi_initiator::multipath::alua::Resend;
use iscsi_initiator::{Error, Multipath, Session};

use super::bench::{geometry, runtime};
use super::initiator_args::{SessionArgs, connect, multipath, parse_size, target_url};
use disrupt::{Current, Disruption, DisruptionReport};
use journal::{Journal, Layout};

/// When a write is on stable storage.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Never asked for: plain writes into the target's cache.
    None,
    /// Every write with FUA.
    Fua,
    /// Plain writes, and SYNCHRONIZE CACHE every --sync-interval.
    Sync,
}

/// Options of `iscsi verify`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn/lun; more than one
    /// (a URL per portal or gateway of the same LU) runs the load through
    /// the initiator's multipath set, which follows ALUA and moves
    /// commands off a failed path: an error it lets through counts as a
    /// failed command.
    #[arg(required = true, num_args = 1..)]
    urls: Vec<String>,
    /// read (a filled region read at random), write (random rewrites) or
    /// mixed (half each).
    #[arg(long, default_value = "mixed")]
    rw: String,
    /// Bytes per command (a slot).
    #[arg(long, default_value = "64k")]
    bs: String,
    /// Commands in flight.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Seconds of random load after the fill.
    #[arg(long, default_value_t = 5.0)]
    time: f64,
    /// Bytes of the LUN used, from its start (at most its capacity).
    #[arg(long, default_value = "64M")]
    region: String,
    /// One JSON object instead of a sentence.
    #[arg(long)]
    json: bool,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// How writes are made durable (what a journal can require after a
    /// crash).
    #[arg(long, value_enum, default_value = "none")]
    durability: Durability,
    /// Milliseconds between SYNCHRONIZE CACHE commands (--durability sync).
    #[arg(long, default_value_t = 20)]
    sync_interval: u64,
    /// Log every write as issued, acknowledged and made durable to FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "check")]
    journal: Option<PathBuf>,
    /// Run no load: read the LUN back against a journal written by an
    /// earlier run (killed, or its target killed) and fail if a durable
    /// write is missing or a block holds what no write put there.
    #[arg(long, value_name = "JOURNAL")]
    check: Option<PathBuf>,
    /// With --check: the LUN serves snapshot NAME, taken while the
    /// journal's load ran (its `S NAME` and `T NAME` lines), and must hold
    /// one moment of it: every write answered before, none issued after,
    /// no write without those answered before it was issued.
    #[arg(long, value_name = "NAME", requires = "check")]
    snapshot: Option<String>,
    /// Issue this during the load, every --disrupt-interval, and report
    /// how long each took to finish everything it reached (commands it
    /// ends are not failures; the data is still checked).
    #[arg(long, value_enum)]
    disrupt: Option<Disruption>,
    /// Milliseconds between disruptions.
    #[arg(long, default_value_t = 250)]
    disrupt_interval: u64,
    #[command(flatten)]
    session: SessionArgs,
}

/// What a verify run saw.
#[derive(Debug, Default, serde::Serialize)]
struct Report {
    rw: String,
    bs: u64,
    qd: usize,
    slots: u64,
    seconds: f64,
    /// Commands completed (fill, load and final read-back).
    commands: u64,
    /// Commands that ended in an error (not counting those --disrupt
    /// ended).
    failed_commands: u64,
    /// Commands --disrupt ended (aborted, or cut short by a logout).
    ended_by_disruption: u64,
    /// The first such error.
    first_error: Option<String>,
    /// Reads returning a generation their slot could not hold.
    wrong_reads: u64,
    /// Reads returning a generation older than an acknowledged write.
    lost_writes: u64,
    /// The slowest command, failures included (ms).
    max_latency_ms: f64,
    error_recovery_level: u8,
    snacks: u64,
    recovery_r2ts: u64,
    reinstatements: u64,
    /// Connections recovered alone (ERL 2), and the commands moved to
    /// their replacements with TASK REASSIGN.
    connection_recoveries: u64,
    tasks_reassigned: u64,
    /// What --disrupt cost.
    disruption: Option<DisruptionReport>,
    /// With several URLs: each path at the end.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    paths: Vec<String>,
}

/// The 16-byte header of every block: a magic, the slot and generation.
const MAGIC: &[u8; 8] = b"ISCSIVFY";
const HEADER: usize = 16;

/// The bytes of `slot` at `generation`: each `block`-sized block starts
/// with the header, then bytes from a xorshift seeded by slot, generation
/// and block.
fn pattern(slot: u64, generation: u32, bs: usize, block: usize) -> Vec<u8> {
    let mut data = vec![0u8; bs];
    for (index, chunk) in data.chunks_mut(block).enumerate() {
        fill_block(chunk, slot, generation, index);
    }
    data
}

/// Block `index` of `slot` at `generation`.
fn fill_block(chunk: &mut [u8], slot: u64, generation: u32, index: usize) {
    chunk[..8].copy_from_slice(MAGIC);
    chunk[8..12].copy_from_slice(&(slot as u32).to_le_bytes());
    chunk[12..16].copy_from_slice(&generation.to_le_bytes());
    let mut x = (slot << 32 ^ u64::from(generation) << 8 ^ index as u64) | 1;
    for word in chunk[HEADER..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
}

/// The generation whose block `index` of `slot` `chunk` is, if it is one
/// whole (a crash may leave a write in flight there in part).
fn block_generation(chunk: &[u8], slot: u64, index: usize) -> Option<u32> {
    if chunk.len() < HEADER || &chunk[..8] != MAGIC {
        return None;
    }
    let generation = u32::from_le_bytes(chunk[12..16].try_into().ok()?);
    let mut expected = vec![0; chunk.len()];
    fill_block(&mut expected, slot, generation, index);
    (chunk == expected).then_some(generation)
}

/// The generation whose pattern `data` is, if it is one whole.
fn generation_of(data: &[u8], slot: u64, bs: usize, block: usize) -> Option<u32> {
    if data.len() < HEADER || &data[..8] != MAGIC {
        return None;
    }
    let generation = u32::from_le_bytes(data[12..16].try_into().ok()?);
    (data == pattern(slot, generation, bs, block)).then_some(generation)
}

/// What each block of a slot read holds, in runs: "blocks 0-31: 17,
/// blocks 32-63: none" (none: not a whole block of any write of the slot).
fn blocks_found(data: &[u8], slot: u64, block: usize) -> String {
    let mut runs: Vec<(usize, usize, Option<u32>)> = Vec::new();
    for (index, chunk) in data.chunks(block).enumerate() {
        let generation = block_generation(chunk, slot, index);
        match runs.last_mut() {
            Some((_, end, g)) if *g == generation => *end = index,
            _ => runs.push((index, index, generation)),
        }
    }
    runs.iter()
        .map(|(first, last, g)| {
            let what = g.map_or("none".to_owned(), |g| g.to_string());
            format!("blocks {first}-{last}: {what}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Per slot: in flight, and the generations it may hold.
#[derive(Clone, Debug, Default)]
struct Slot {
    busy: bool,
    /// The generations the slot may hold; the last acknowledged write's is
    /// the highest.
    allowed: Vec<u32>,
    /// The highest acknowledged generation (0: none yet; generations
    /// start at 1).
    acknowledged: u32,
}

struct Shared {
    current: Arc<Current>,
    /// The multipath set, when the load runs over several URLs.
    paths: Option<Arc<Multipath>>,
    disruption: Option<Disruption>,
    lun: u64,
    durability: Durability,
    journal: Option<Journal>,
    /// The first error writing the journal: the run cannot be trusted.
    journal_error: Mutex<Option<String>>,
    bs: usize,
    block: usize,
    blocks_per_slot: u64,
    slots: Mutex<Vec<Slot>>,
    generation: AtomicU64,
    report: Mutex<Report>,
}

impl Shared {
    fn lock_report(&self) -> std::sync::MutexGuard<'_, Report> {
        self.report.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session now (a --disrupt logout replaces it).
    fn session(&self) -> Session {
        self.current.get()
    }

    /// Runs `op` on the LU: through the multipath set if there is one
    /// (every command verify sends may run twice), else on the session
    /// now.
    async fn on_lu<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: Fn(Arc<Session>, u64) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        match &self.paths {
            Some(paths) => paths.run(Resend::Idempotent, op).await,
            None => op(Arc::new(self.session()), self.lun).await,
        }
    }

    /// Counts a command `what` begun at `started` that ended with `error`
    /// or without.
    fn finished(&self, started: Instant, what: &str, error: Option<&iscsi_initiator::Error>) {
        let mut report = self.lock_report();
        report.commands += 1;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        report.max_latency_ms = report.max_latency_ms.max(ms);
        match error {
            None => {}
            Some(error) if disrupt::ended_by(self.disruption, error) => {
                report.ended_by_disruption += 1;
            }
            Some(error) => {
                report.failed_commands += 1;
                report
                    .first_error
                    .get_or_insert_with(|| format!("{what}: {error}"));
            }
        }
    }

    /// Runs `log` on the journal, if any, keeping its first error.
    fn log(&self, log: impl FnOnce(&Journal) -> std::io::Result<()>) {
        if let Some(Err(error)) = self.journal.as_ref().map(log) {
            let mut first = self
                .journal_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            first.get_or_insert_with(|| format!("writing the journal: {error}"));
        }
    }

    async fn write(&self, slot: u64) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) as u32;
        let data = pattern(slot, generation, self.bs, self.block);
        let started = Instant::now();
        self.log(|j| j.issued(slot, generation));
        let lba = slot * self.blocks_per_slot;
        let fua = self.durability == Durability::Fua;
        let (block, data) = (self.block as u32, &data[..]);
        let result = self
            .on_lu(|s, lun| async move {
                match fua {
                    true => s.write_fua(lun, lba, block, data).await,
                    false => s.write(lun, lba, block, data).await,
                }
            })
            .await;
        if result.is_ok() {
            self.log(|j| j.acknowledged(slot, generation, fua));
        }
        let mut slots = self.lock_slots();
        let state = &mut slots[slot as usize];
        match &result {
            Ok(()) => {
                state.allowed = vec![generation];
                state.acknowledged = generation;
            }
            // Not acknowledged: the old or the new data may be there.
            Err(_) => state.allowed.push(generation),
        }
        state.busy = false;
        drop(slots);
        self.finished(started, "write", result.as_ref().err());
    }

    async fn read(&self, slot: u64) {
        let started = Instant::now();
        let (lba, block, bs) = (slot * self.blocks_per_slot, self.block as u32, self.bs);
        let result = self
            .on_lu(|s, lun| async move { s.read(lun, lba, block, vec![0; bs]).await })
            .await;
        let mut slots = self.lock_slots();
        let state = &mut slots[slot as usize];
        let verdict = result.as_ref().ok().map(|data| {
            match generation_of(data, slot, self.bs, self.block) {
                Some(generation) if state.allowed.contains(&generation) => {
                    // What was read is on the medium now.
                    state.allowed = vec![generation];
                    Ok(())
                }
                Some(generation) if generation < state.acknowledged => {
                    Err((true, state.allowed.clone()))
                }
                // Never acknowledged (every write of the slot failed): it
                // may still hold what it held before the run.
                _ if state.acknowledged == 0 => Ok(()),
                _ => Err((false, state.allowed.clone())),
            }
        });
        state.busy = false;
        drop(slots);
        if let Some(Err((lost, allowed))) = verdict {
            let mut report = self.lock_report();
            if lost {
                report.lost_writes += 1;
            } else {
                report.wrong_reads += 1;
            }
            let found = result
                .as_ref()
                .map(|data| blocks_found(data, slot, self.block))
                .unwrap_or_default();
            eprintln!(
                "verify: slot {slot}: a read returned {} (may hold generations {allowed:?}; found {found})",
                if lost {
                    "an older write than one acknowledged"
                } else {
                    "data no write of the slot made"
                }
            );
        }
        self.finished(started, "read", result.as_ref().err());
    }

    /// A free slot (random), marked busy; `None` if all are busy.
    fn take_slot(&self) -> Option<u64> {
        let mut slots = self.lock_slots();
        let count = slots.len() as u64;
        let start = rand::random_range(0..count);
        (0..count)
            .map(|i| (start + i) % count)
            .find(|&s| !slots[s as usize].busy)
            .inspect(|&s| slots[s as usize].busy = true)
    }
}

/// Runs `visit` on slots `0..count` in order, `qd` at a time.
async fn each_slot<F, Fut>(count: u64, qd: usize, visit: F)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..qd.max(1) {
        let (next, visit) = (next.clone(), visit.clone());
        workers.spawn(async move {
            loop {
                let slot = next.fetch_add(1, Ordering::Relaxed);
                if slot >= count {
                    return;
                }
                visit(slot).await;
            }
        });
    }
    while workers.join_next().await.is_some() {}
}

/// Writes (or reads) every slot in order, `qd` at a time.
async fn sweep(shared: &Arc<Shared>, qd: usize, write: bool) {
    let count = shared.lock_slots().len() as u64;
    let shared = shared.clone();
    each_slot(count, qd, move |slot| {
        let shared = shared.clone();
        async move {
            if write {
                shared.write(slot).await;
            } else {
                shared.read(slot).await;
            }
        }
    })
    .await;
}

/// SYNCHRONIZE CACHE every `interval` while `flushing`, and once after:
/// each one that completes makes every write acknowledged before it was
/// sent durable (the journal's `F`/`D` lines).
async fn flush(shared: Arc<Shared>, flushing: Arc<AtomicBool>, interval: Duration) {
    let mut number = 0;
    loop {
        let last = !flushing.load(Ordering::Acquire);
        number += 1;
        shared.log(|j| j.flush_started(number));
        let started = Instant::now();
        let result = shared
            .on_lu(|s, lun| async move { s.synchronize_cache(lun).await })
            .await;
        if result.is_ok() {
            shared.log(|j| j.flush_done(number));
        }
        shared.finished(started, "sync", result.as_ref().err());
        if last {
            return;
        }
        tokio::time::sleep(interval).await;
    }
}

/// Runs the verification.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let (reads, writes) = match args.rw.as_str() {
        "read" => (true, false),
        "write" => (false, true),
        "mixed" => (true, true),
        other => bail!("--rw must be read, write or mixed, not {other:?}"),
    };
    let bs = parse_size(&args.bs)?;
    let region = parse_size(&args.region)?;
    if bs == 0 || args.qd == 0 || args.time < 0.0 {
        bail!("--bs and --qd must be positive, --time not negative");
    }
    let url = target_url(&args.urls[0])?;
    let several = args.urls.len() > 1;
    if several && (args.check.is_some() || args.disrupt.is_some()) {
        bail!("--check and --disrupt take one URL");
    }
    if let Some(journal) = &args.check {
        return match &args.snapshot {
            Some(name) => moment::run(&url, journal, name, args),
            None => check::run(&url, journal, args),
        };
    }
    let report = runtime(args.threads)?.block_on(async {
        let (session, paths) = match several {
            true => {
                let paths = Arc::new(multipath(&args.urls, &args.session).await?);
                let session = paths.session().context("no path logged in")?;
                (Session::clone(&session), Some(paths))
            }
            false => (connect(&url, &args.session).await?, None),
        };
        let geometry = geometry(&session, url.lun).await?;
        if bs % geometry.block_size != 0 {
            bail!(
                "--bs must be a multiple of the LUN's {}-byte blocks",
                geometry.block_size
            );
        }
        let slots = region.min(geometry.blocks * geometry.block_size) / bs;
        if slots < args.qd as u64 {
            bail!("the region holds {slots} slots of {bs} bytes: fewer than --qd");
        }
        let journal = match &args.journal {
            Some(path) => Some(Journal::create(
                path,
                Layout {
                    bs,
                    block: geometry.block_size,
                    slots,
                },
            )?),
            None => None,
        };
        let shared = Arc::new(Shared {
            current: Current::new(session),
            paths: paths.clone(),
            disruption: args.disrupt,
            lun: url.lun,
            durability: args.durability,
            journal,
            journal_error: Mutex::new(None),
            bs: bs as usize,
            block: geometry.block_size as usize,
            blocks_per_slot: bs / geometry.block_size,
            slots: Mutex::new(vec![Slot::default(); slots as usize]),
            generation: AtomicU64::new(1),
            report: Mutex::new(Report {
                rw: args.rw.clone(),
                bs,
                qd: args.qd,
                slots,
                ..Report::default()
            }),
        });
        let started = Instant::now();
        let flushing = Arc::new(AtomicBool::new(true));
        let flusher = (args.durability == Durability::Sync).then(|| {
            let interval = Duration::from_millis(args.sync_interval.max(1));
            tokio::spawn(flush(shared.clone(), flushing.clone(), interval))
        });
        sweep(&shared, args.qd, true).await;
        let deadline = Instant::now() + Duration::from_secs_f64(args.time);
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..args.qd {
            let shared = shared.clone();
            workers.spawn(async move {
                while Instant::now() < deadline {
                    let Some(slot) = shared.take_slot() else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    let write = writes && (!reads || rand::random::<bool>());
                    let generation = shared.current.generation();
                    let session = shared.session();
                    if write {
                        shared.write(slot).await;
                    } else {
                        shared.read(slot).await;
                    }
                    if session.is_closed() {
                        // Logged out by --disrupt: wait for the new one.
                        let limit = Duration::from_secs(5);
                        shared.current.replaced_since(generation, limit).await;
                    }
                }
            });
        }
        let disrupter = args.disrupt.map(|disruption| {
            let interval = Duration::from_millis(args.disrupt_interval.max(1));
            let (current, lun) = (shared.current.clone(), url.lun);
            let (url, session_args) = (url.clone(), args.session.clone());
            tokio::spawn(async move {
                let reconnect = || {
                    let (current, url, session_args) =
                        (current.clone(), url.clone(), session_args.clone());
                    async move {
                        current.replace(connect(&url, &session_args).await?);
                        Ok(())
                    }
                };
                let get = || current.get();
                disrupt::run(disruption, interval, deadline, lun, get, reconnect).await
            })
        });
        while workers.join_next().await.is_some() {}
        if let (Some(disruption), Some(disrupter)) = (args.disrupt, disrupter) {
            let tally = disrupter.await.context("the disrupting task")?;
            let ended = shared.lock_report().ended_by_disruption;
            let left = shared.session().commands_in_flight().len();
            shared.lock_report().disruption = Some(tally.report(disruption, ended, left));
        }
        flushing.store(false, Ordering::Release);
        if let Some(flusher) = flusher {
            flusher.await.context("the flushing task")?;
        }
        if let Some(error) = shared
            .journal_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            bail!(error);
        }
        sweep(&shared, args.qd, false).await;
        let session = &shared.session();
        let mut report = std::mem::take(&mut *shared.lock_report());
        report.seconds = started.elapsed().as_secs_f64();
        report.error_recovery_level = session.parameters().map_or(0, |p| p.error_recovery_level);
        report.snacks = session.snacks_sent();
        report.recovery_r2ts = session.recovery_r2ts_answered();
        report.reinstatements = session.reinstatements();
        report.connection_recoveries = session.connection_recoveries();
        report.tasks_reassigned = session.tasks_reassigned();
        match &paths {
            Some(paths) => {
                report.paths = paths.paths().iter().map(ToString::to_string).collect();
                let _ = paths.logout().await;
            }
            None => {
                let _ = session.logout().await;
            }
        }
        Ok::<_, anyhow::Error>(report)
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report).context("the report")?);
    } else {
        println!(
            "verify {} bs={} qd={} slots={}: {} commands in {:.1} s, {} failed{}, {} wrong reads, {} lost writes, slowest {:.0} ms; ERL {}, {} SNACKs, {} recovery R2Ts, {} reinstatements, {} connection recoveries, {} tasks reassigned",
            report.rw,
            report.bs,
            report.qd,
            report.slots,
            report.commands,
            report.seconds,
            report.failed_commands,
            report
                .first_error
                .as_deref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default(),
            report.wrong_reads,
            report.lost_writes,
            report.max_latency_ms,
            report.error_recovery_level,
            report.snacks,
            report.recovery_r2ts,
            report.reinstatements,
            report.connection_recoveries,
            report.tasks_reassigned,
        );
        for path in &report.paths {
            println!("path {path}");
        }
        if let Some(d) = &report.disruption {
            println!(
                "{}: {} issued ({} found nothing to abort), worst {:.0} ms, median {:.0} ms, {} commands ended by it, {} failed{}, {} left in flight",
                d.disruption,
                d.issued,
                d.not_found,
                d.worst_ms,
                d.median_ms,
                d.ended_commands,
                d.failures,
                d.first_failure
                    .as_deref()
                    .map(|e| format!(" (first: {e})"))
                    .unwrap_or_default(),
                d.left_in_flight,
            );
        }
    }
    if report.wrong_reads + report.lost_writes > 0 {
        bail!(
            "{} wrong reads and {} lost writes",
            report.wrong_reads,
            report.lost_writes
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_read_is_described_block_by_block() {
        let mut data = pattern(5, 9, 4096, 512);
        data[2048..].copy_from_slice(&pattern(5, 10, 4096, 512)[2048..]);
        data[3584..].fill(0);
        assert_eq!(
            blocks_found(&data, 5, 512),
            "blocks 0-3: 9, blocks 4-6: 10, blocks 7-7: none"
        );
    }

    #[test]
    fn a_pattern_names_its_generation_and_nothing_else_does() {
        let data = pattern(5, 9, 8192, 512);
        assert_eq!(generation_of(&data, 5, 8192, 512), Some(9));
        assert_eq!(generation_of(&data, 6, 8192, 512), None, "another slot's");
        let mut torn = data.clone();
        torn[4096..].copy_from_slice(&pattern(5, 10, 8192, 512)[4096..]);
        assert_eq!(
            generation_of(&torn, 5, 8192, 512),
            None,
            "half of two writes"
        );
        let mut flipped = data;
        flipped[1000] ^= 1;
        assert_eq!(generation_of(&flipped, 5, 8192, 512), None);
        assert_eq!(generation_of(&[0; 8192], 5, 8192, 512), None);
    }
}
