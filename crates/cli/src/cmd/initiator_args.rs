//! What the initiator subcommands share: session options on the command
//! line (`--set KEY=VALUE` for any negotiation key, digests, connections,
//! timeouts, `--trace`), sizes like `64K`, and a tokio runtime to run them
//! on.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use iscsi_initiator::{Disk, IscsiUrl, Multipath, MultipathConfig, Session, SessionConfig};
use iscsi_trace::TraceWriter;

/// Session options common to the initiator subcommands.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SessionArgs {
    /// Set a login key or initiator setting (repeatable), e.g.
    /// `--set MaxBurstLength=1048576 --set InitialR2T=Yes`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Header and data digests to offer: none or crc32c.
    #[arg(long, value_name = "none|crc32c")]
    pub digest: Option<String>,
    /// Connections in the session (MC/S, if the target allows).
    #[arg(long, default_value_t = 1)]
    pub connections: u16,
    /// Seconds a command may take before it fails.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Seconds to keep reinstating a lost session before its commands
    /// fail (open-iscsi's replacement_timeout); meanwhile they wait, and
    /// their --timeout starts again once it is back. Once it has run out,
    /// commands fail at once until a login (tried every 2 s) succeeds.
    /// Default: 5 logins over about 2.5 s (`iscsi mount` and `iscsi
    /// attach`: 120 s, open-iscsi's default).
    #[arg(long, value_name = "SECONDS")]
    pub replacement_timeout: Option<f64>,
    /// The initiator name.
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// Write a trace of every PDU and SCSI command to FILE (Chrome Trace
    /// Event Format: Perfetto, chrome://tracing, `iscsi trace-report`).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

/// The replacement timeout of a session behind a disk (`iscsi mount`,
/// `iscsi attach`): a target restarting or a path failing over is waited
/// out, as open-iscsi does, instead of failing a file system's I/O.
const DISK_REPLACEMENT_TIMEOUT: f64 = 120.0;

impl SessionArgs {
    /// These options for a session behind a disk: the replacement timeout
    /// is [`DISK_REPLACEMENT_TIMEOUT`] unless given.
    pub fn for_disk(&self) -> SessionArgs {
        let mut args = self.clone();
        args.replacement_timeout = args.replacement_timeout.or(Some(DISK_REPLACEMENT_TIMEOUT));
        args
    }

    /// The session configuration these options describe.
    pub fn config(&self) -> anyhow::Result<SessionConfig> {
        let mut config = SessionConfig::default();
        if let Some(name) = &self.initiator_name {
            config.initiator_name = name.clone();
        }
        match self.digest.as_deref() {
            None | Some("none") => {}
            Some("crc32c") => {
                config.set("HeaderDigest", "CRC32C")?;
                config.set("DataDigest", "CRC32C")?;
            }
            Some(other) => bail!("--digest must be none or crc32c, not {other:?}"),
        }
        config.connections = self.connections.max(1);
        if self.connections > 1 {
            config.negotiation.max_connections = self.connections;
        }
        config.timeouts.command = Duration::from_secs_f64(self.timeout.max(0.001));
        if let Some(seconds) = self.replacement_timeout {
            config.replacement_timeout = Some(Duration::from_secs_f64(seconds.max(0.0)));
        }
        if let Some(path) = &self.trace {
            config.tap = Some(open_trace(path)?);
        }
        for pair in &self.set {
            let (key, value) = pair
                .split_once('=')
                .with_context(|| format!("--set wants KEY=VALUE, got {pair:?}"))?;
            config.set(key, value)?;
        }
        Ok(config)
    }
}

/// The trace `--trace` asked for. A subcommand may open several sessions
/// (`copy` two, `script` one per login) and all go to one file, so it is
/// opened by the first and closed by [`finish_trace`] when the subcommand
/// returns, whichever way it returns.
static TRACE: Mutex<Option<(PathBuf, Arc<TraceWriter>)>> = Mutex::new(None);

/// The process's trace, opened at `path` if it is not open yet.
fn open_trace(path: &Path) -> anyhow::Result<Arc<TraceWriter>> {
    let mut slot = TRACE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, trace)) = slot.as_ref() {
        return Ok(Arc::clone(trace));
    }
    // Named after the subcommand: "iscsi bench", "iscsi copy".
    let process = match std::env::args().nth(1) {
        Some(subcommand) => format!("iscsi {subcommand}"),
        None => "iscsi".to_owned(),
    };
    let trace = Arc::new(
        TraceWriter::create(path, &process)
            .with_context(|| format!("--trace {}", path.display()))?,
    );
    *slot = Some((path.to_owned(), Arc::clone(&trace)));
    Ok(trace)
}

/// Closes the JSON of the trace `--trace` opened, if any: once the
/// subcommand has returned (its sessions logged out or dropped with its
/// runtime), nothing more is traced.
pub fn finish_trace() -> anyhow::Result<()> {
    let taken = TRACE.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some((path, trace)) = taken {
        trace
            .finish()
            .with_context(|| format!("--trace {}", path.display()))?;
        eprintln!("iscsi: trace written to {}", path.display());
    }
    Ok(())
}

/// Parses an `iscsi://` URL that names a target.
pub fn target_url(text: &str) -> anyhow::Result<IscsiUrl> {
    let url: IscsiUrl = text.parse()?;
    url.target_name()?;
    Ok(url)
}

/// Logs in to the URL's target.
pub async fn connect(url: &IscsiUrl, args: &SessionArgs) -> anyhow::Result<Session> {
    Session::connect(url, args.config()?)
        .await
        .with_context(|| format!("logging in to {url}"))
}

/// Opens the LU that `urls` name as a [`Disk`]: through one session for
/// one URL; for several (one per portal or gateway, `iscsi attach URL1
/// URL2`), through a [`Multipath`] set that checks they reach one LU and
/// follows ALUA across them, waiting out a path-less moment as long as a
/// session would wait out its replacement timeout.
pub async fn open_disk(urls: &[String], args: &SessionArgs) -> anyhow::Result<Disk> {
    let parsed = urls
        .iter()
        .map(|url| target_url(url))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let [url] = parsed.as_slice() else {
        return Disk::over(Arc::new(multipath(urls, args).await?))
            .await
            .context("opening the LU through its paths");
    };
    let session = Arc::new(connect(url, args).await?);
    let disk = Disk::open(Arc::clone(&session), url.lun).await;
    super::missing_lun::checked(&session, url.lun, "READ CAPACITY", disk).await
}

/// A multipath set over `urls` (one per portal or gateway of one LU):
/// commands wait for a path as long as `--replacement-timeout` says (30 s
/// by default, 120 s behind a disk).
pub async fn multipath(urls: &[String], args: &SessionArgs) -> anyhow::Result<Multipath> {
    let parsed = urls
        .iter()
        .map(|url| target_url(url))
        .collect::<anyhow::Result<Vec<_>>>()?;
    multipath_of(&parsed, args).await
}

/// [`multipath`] over URLs already parsed.
pub async fn multipath_of(urls: &[IscsiUrl], args: &SessionArgs) -> anyhow::Result<Multipath> {
    let mut config = MultipathConfig::default();
    if let Some(seconds) = args.replacement_timeout {
        config.no_path_timeout = Duration::from_secs_f64(seconds.max(0.0));
    }
    let names: Vec<String> = urls.iter().map(ToString::to_string).collect();
    Multipath::connect(urls, args.config()?, config)
        .await
        .with_context(|| format!("logging in to {}", names.join(" and ")))
}

/// Runs `future` on a multi-threaded runtime.
pub fn block_on<T>(future: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(future)
}

/// Parses sizes like `4096`, `4k`, `1M`, `2G` (powers of 1024): the same
/// rules as `iscsi target --lun ram:SIZE`.
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    iscsi_target::parse_size(text).map_err(anyhow::Error::msg)
}
