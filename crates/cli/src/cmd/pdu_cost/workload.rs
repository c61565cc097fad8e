//! The initiator side of one measured case: log in, fill the span the case
//! will touch (so reads read written data, not a sparse store's zeros, and
//! writes overwrite chunks that exist), then run exactly `--commands`
//! sequential commands one at a time and print what went over the wire.
//!
//! Everything before the measured loop (start-up, login, the fill) costs
//! the same at any command count, so `scripts/pdu-cost` runs each case at
//! two counts and divides the difference; the span is fixed by `--span`,
//! not by the count, for that reason.

use anyhow::{Context, bail};
use iscsi_initiator::Command;
use iscsi_initiator::scsi::rw16_cdb;
use serde::{Deserialize, Serialize};

use super::super::initiator_args::{SessionArgs, connect, parse_size, target_url};

/// Options of `iscsi pdu-cost workload`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// iscsi://host[:port]/target-iqn/lun
    url: String,
    /// read or write.
    #[arg(long)]
    rw: String,
    /// Bytes per command.
    #[arg(long)]
    bs: String,
    /// Commands in the measured loop.
    #[arg(long)]
    commands: u64,
    /// Bytes of the LUN the loop cycles over (filled first).
    #[arg(long, default_value = "16M")]
    span: String,
    /// Where to write the JSON record (stdout if absent).
    #[arg(long)]
    output: Option<std::path::PathBuf>,
    /// A `perf record --control fifo:CTL,ACK` pair (`CTL,ACK`): sampling is
    /// enabled for the measured loop only, so the kernel time of the
    /// login and the fill stays out of the native figures.
    #[arg(long, value_name = "CTL,ACK")]
    perf_control: Option<String>,
    #[command(flatten)]
    session: SessionArgs,
}

/// What one workload run did, as `analyze` reads it back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// `read` or `write`.
    pub rw: String,
    /// Bytes per command.
    pub bs: u64,
    /// Whether HeaderDigest and DataDigest were CRC32C.
    pub digests: bool,
    /// Commands in the measured loop.
    pub commands: u64,
    /// PDUs both ways during the loop.
    pub pdus: u64,
    /// Data-In, R2T and Data-Out PDUs during the loop.
    pub data_in: u64,
    /// R2T PDUs during the loop.
    pub r2t: u64,
    /// Data-Out PDUs during the loop.
    pub data_out: u64,
    /// Wall-clock seconds of the loop.
    pub seconds: f64,
    /// This process's ID.
    pub pid: u32,
    /// Its threads at the end of the loop (a `perf` report is by thread).
    #[serde(default)]
    pub tids: Vec<u32>,
}

/// Runs `iscsi pdu-cost workload`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let write = match args.rw.as_str() {
        "read" => false,
        "write" => true,
        other => bail!("--rw must be read or write, not {other:?}"),
    };
    let bs = parse_size(&args.bs)?;
    let span = parse_size(&args.span)?;
    if bs == 0 || span < bs || args.commands == 0 {
        bail!("--bs and --commands must be positive and --span at least --bs");
    }
    let length = u32::try_from(bs).context("--bs must be below 4 GiB")?;
    let url = target_url(&args.url)?;
    let digests = args.session.digest.as_deref() == Some("crc32c");
    // One thread, like `iscsi bench`: no wake-ups handed between threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let record = runtime.block_on(async {
        let session = connect(&url, &args.session).await?;
        let capacity = session
            .read_capacity(url.lun)
            .await
            .context("READ CAPACITY")?;
        let block = u64::from(capacity.block_size);
        if block == 0 || bs % block != 0 {
            bail!("--bs must be a multiple of the {block}-byte block");
        }
        let slots = (span / bs).min(capacity.blocks * block / bs);
        if slots == 0 {
            bail!("the LUN is smaller than one command");
        }
        let blocks = u32::try_from(bs / block).context("too many blocks per command")?;
        let data: Vec<u8> = (0..bs).map(|i| (i % 251) as u8).collect();
        for slot in 0..slots {
            let cdb = rw16_cdb(true, slot * u64::from(blocks), blocks);
            session
                .execute(Command::write(url.lun, &cdb, &data))
                .await?
                .check()
                .context("filling the span")?;
        }
        perf_command(args.perf_control.as_deref(), "enable")?;
        let before = session.wire_counts();
        let start = std::time::Instant::now();
        for i in 0..args.commands {
            let cdb = rw16_cdb(write, (i % slots) * u64::from(blocks), blocks);
            let command = if write {
                Command::write(url.lun, &cdb, &data)
            } else {
                Command::read_pooled(url.lun, &cdb, length)
            };
            let response = session.execute(command).await?.check()?;
            session.recycle(response.data);
        }
        let seconds = start.elapsed().as_secs_f64();
        let wire = session.wire_counts().since(&before);
        perf_command(args.perf_control.as_deref(), "disable")?;
        let _ = session.logout().await;
        Ok(Record {
            rw: args.rw.clone(),
            bs,
            digests,
            commands: args.commands,
            pdus: wire.pdus,
            data_in: wire.data_in,
            r2t: wire.r2t,
            data_out: wire.data_out,
            seconds,
            pid: std::process::id(),
            tids: own_threads(),
        })
    })?;
    let text = serde_json::to_string(&record)?;
    match &args.output {
        Some(path) => std::fs::write(path, text + "\n")
            .with_context(|| format!("writing {}", path.display()))?,
        None => println!("{text}"),
    }
    Ok(())
}

/// This process's thread IDs (`/proc/self/task`); just the main thread
/// where /proc cannot be read.
fn own_threads() -> Vec<u32> {
    let mut tids: Vec<u32> = std::fs::read_dir("/proc/self/task")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if tids.is_empty() {
        tids.push(std::process::id());
    }
    tids.sort_unstable();
    tids
}

/// Sends `command` to perf's control FIFO and waits for its `ack`, so
/// that sampling has started (or stopped) before the caller goes on.
fn perf_command(control: Option<&str>, command: &str) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let Some(control) = control else {
        return Ok(());
    };
    let (ctl, ack) = control
        .split_once(',')
        .context("--perf-control wants CTL,ACK (two FIFOs)")?;
    let mut ctl = std::fs::OpenOptions::new()
        .write(true)
        .open(ctl)
        .with_context(|| format!("opening perf's control FIFO {ctl}"))?;
    writeln!(ctl, "{command}").context("writing to perf's control FIFO")?;
    let mut answer = String::new();
    std::io::BufReader::new(
        std::fs::File::open(ack).with_context(|| format!("opening perf's ack FIFO {ack}"))?,
    )
    .read_line(&mut answer)
    .context("reading perf's ack")?;
    if answer.trim() != "ack" {
        bail!("perf answered {answer:?} to {command:?}");
    }
    Ok(())
}

/// Reads the record a workload run wrote.
pub fn read_record(path: &std::path::Path) -> anyhow::Result<Record> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}
