//! `iscsi target`: serve block storage over iSCSI.
//!
//! With no arguments: one 1 GiB RAM LUN as `iqn.2026-11.rs.iscsi:target0` on
//! 127.0.0.1:3260. With `--config FILE`, SIGHUP (or `iscsi target reload`)
//! re-reads the file and applies the difference live; the control socket
//! answers `iscsi target status|reload|check|logout` (`target_control`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use iscsi_scsi::alua::GatewayGroup;
use iscsi_target::{
    LunEntry, Server, ServerHandle, TargetConfig, TargetEntry, open_lun_in, parse_company_id,
};
use iscsi_trace::TraceWriter;

/// Command-line options of `iscsi target`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    /// Ask a running target instead of serving.
    #[command(subcommand)]
    action: Option<super::target_control::Action>,
    /// The control socket to answer on (`none`: no socket). Default:
    /// /run/iscsi-rs/target.sock for root, else under $XDG_RUNTIME_DIR or
    /// /tmp/iscsi-rs-UID. Mode 0600; only the target's user is answered.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// A portal to listen on (repeatable).
    #[arg(long = "listen", default_values_t = ["127.0.0.1:3260".parse::<SocketAddr>().expect("valid default")])]
    listen: Vec<SocketAddr>,
    /// An iSER portal (iSCSI Extensions for RDMA over iWARP, RFC 7145)
    /// beside the TCP portals (repeatable); it needs a port of its own.
    #[arg(long = "iser", value_name = "ADDR:PORT")]
    iser: Vec<SocketAddr>,
    /// The target's iSCSI name.
    #[arg(long, default_value = "iqn.2026-11.rs.iscsi:target0")]
    name: String,
    /// A LUN, numbered from 0 in order (repeatable): `ram:SIZE` (SIZE like
    /// 256M or 1G), `file:PATH[,size=SIZE]` (created or extended to SIZE),
    /// `block:PATH[,direct]` (a block device, optionally O_DIRECT),
    /// `rbd:POOL/IMAGE[,conf=PATH][,id=USER][,timeout=SECONDS]` (a Ceph RBD
    /// image through librbd, loaded when the first one opens: Debian's
    /// librbd1; a cluster op that takes longer than the timeout, 30 s by
    /// default, fails the command with NOT READY); any of
    /// them with `,latency=DURATION` (e.g. 20ms) waits that long on every
    /// access, as a slow device would; `,readonly` refuses writes (DATA
    /// PROTECT); `,removable` makes the medium removable (START STOP UNIT
    /// ejects and loads it, PREVENT ALLOW MEDIUM REMOVAL holds it);
    /// `,physical-block=4096` reports 4 KiB physical blocks (512e).
    #[arg(long = "lun", default_values_t = ["ram:1G".to_owned()])]
    luns: Vec<String>,
    /// A TOML configuration file (targets, portals, LUNs, CHAP, ACLs,
    /// negotiation); replaces the other options. See the `config::file`
    /// module of the iscsi-target crate for the format.
    #[arg(long, conflicts_with_all = ["listen", "iser", "name", "luns", "chap", "block_size"])]
    config: Option<std::path::PathBuf>,
    /// This target's relative target port identifier: the Target Portal
    /// Group Tag of its portals, and in a gateway group this gateway's id
    /// and target port group (the configuration file's
    /// `portal_group_tag`).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..), conflicts_with = "config")]
    target_port_id: u16,
    /// The target port ids of every gateway exporting the same RBD images,
    /// comma-separated and the same on each (this one's included), e.g.
    /// `--gateway-group 1,2`: each `rbd:` LUN then answers with implicit
    /// ALUA, owned by one gateway (active/optimized) and standby on the
    /// others, moving when its owner dies (the configuration file's
    /// `gateway_group`).
    #[arg(
        long,
        value_name = "N,N...",
        value_delimiter = ',',
        conflicts_with = "config"
    )]
    gateway_group: Vec<u16>,
    /// Require one-way CHAP with this `USER:SECRET`.
    #[arg(long)]
    chap: Option<String>,
    /// Logical block size of every LUN: 512 or 4096.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// MiB of idle data buffers each connection keeps for reuse, at most
    /// (the configuration file's `buffer_pool_mib`); 0 keeps none.
    #[arg(long, value_name = "MIB", default_value_t = iscsi_target::DEFAULT_BUFFER_POOL_BYTES >> 20,
          conflicts_with = "config")]
    buffer_pool_mib: usize,
    /// KiB of socket send buffer each TCP connection asks for (SO_SNDBUF,
    /// which Linux doubles and caps at net.core.wmem_max; the configuration
    /// file's `send_buffer_kib`); 0 leaves it to the kernel's autotuning.
    #[arg(long, value_name = "KIB", default_value_t = iscsi_target::DEFAULT_SEND_BUFFER_BYTES >> 10,
          conflicts_with = "config")]
    send_buffer_kib: usize,
    /// Runtime shards to spread connections over, one thread pinned per
    /// core (the configuration file's `cores`, which this overrides).
    /// Default: one per CPU the process may run on, so `taskset -c 0-3`
    /// gives four.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    cores: Option<u16>,
    /// The IEEE company ID (OUI or CID, hex: 0x001405 or 00-14-05) in
    /// every LU's NAA designator (VPD page 83h; the configuration file's
    /// `naa_company_id`, which this overrides). Default 00-14-05, the one
    /// Linux's LIO target uses: this project has no OUI of its own.
    #[arg(long, value_name = "OUI", value_parser = parse_company_id)]
    naa_company_id: Option<u32>,
    /// Write a trace of every PDU, command and SCSI execution to FILE
    /// (Chrome Trace Event Format: Perfetto, chrome://tracing, `iscsi
    /// trace-report`); closed when the target stops on SIGINT or SIGTERM.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Serve Prometheus metrics (OpenMetrics text) at
    /// http://ADDR:PORT/metrics: per target and LUN commands, bytes,
    /// latency histograms, errors; logins, sessions, reloads. A flag only
    /// (not in the configuration file): a reload never moves it.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    /// With --metrics: series per session too, labelled by initiator name
    /// and TSIH. Off by default: every login makes new series, which a
    /// Prometheus server keeps for its retention time.
    #[arg(long, requires = "metrics")]
    metrics_sessions: bool,
}

/// The configuration the command-line flags describe.
fn config_from_flags(args: &Args) -> anyhow::Result<TargetConfig> {
    if args.block_size != 512 && args.block_size != 4096 {
        bail!("--block-size must be 512 or 4096");
    }
    let gateway_group = if args.gateway_group.is_empty() {
        Vec::new()
    } else {
        iscsi_target::check_gateway_group(args.target_port_id, &args.gateway_group)
            .map_err(|e| anyhow::anyhow!("--gateway-group: {e}"))?
    };
    let group = (!gateway_group.is_empty()).then(|| {
        GatewayGroup::new(args.target_port_id, gateway_group.iter().copied())
            .reached_at(&args.listen)
    });
    let mut luns = std::collections::BTreeMap::new();
    for (n, spec) in (0u16..).zip(&args.luns) {
        let store = open_lun_in(spec, args.block_size, &args.name, n, group.as_ref())
            .map_err(anyhow::Error::msg)?;
        luns.insert(
            n,
            LunEntry {
                store,
                spec: spec.clone(),
            },
        );
    }
    let mut target = TargetEntry {
        name: args.name.clone(),
        alias: Some("iscsi-rs".to_owned()),
        luns,
        chap: None,
        allowed_initiators: Vec::new(),
        limits: Vec::new(),
    };
    if let Some(chap) = &args.chap {
        let (user, secret) = chap.split_once(':').context("--chap wants USER:SECRET")?;
        target.require_chap(user, secret);
    }
    if let Some(both) = args.listen.iter().find(|a| args.iser.contains(a)) {
        bail!(
            "{both} is both a TCP (--listen) and an iSER (--iser) portal: iWARP needs a port of its own"
        );
    }
    Ok(TargetConfig {
        listen: args.listen.clone(),
        iser: args.iser.clone(),
        targets: vec![target],
        portal_group_tag: args.target_port_id,
        gateway_group,
        negotiation: TargetConfig::default_negotiation(),
        command_window: 128,
        nop_in_interval: Some(iscsi_target::DEFAULT_NOP_IN_INTERVAL),
        buffer_pool_bytes: args.buffer_pool_mib.saturating_mul(1 << 20),
        send_buffer_bytes: iscsi_target::send_buffer_from_kib(args.send_buffer_kib),
        cores: None,
        naa_company_id: iscsi_scsi::spc::NAA_COMPANY_ID,
        tap: None,
    })
}

/// Runs `iscsi target`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if let Some(action) = &args.action {
        return super::target_control::run(action);
    }
    let mut config = match &args.config {
        Some(path) => TargetConfig::from_file(path)
            .with_context(|| format!("configuration {}", path.display()))?,
        None => config_from_flags(args)?,
    };
    let names: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
    let trace = match &args.trace {
        Some(path) => {
            let writer = TraceWriter::create(path, "iscsi target")
                .with_context(|| format!("--trace {}", path.display()))?;
            Some(Arc::new(writer))
        }
        None => None,
    };
    if let Some(cores) = args.cores {
        config.cores = Some(usize::from(cores));
    }
    if let Some(id) = args.naa_company_id {
        config.naa_company_id = id;
    }
    config.tap = trace.clone().map(|t| t as _);
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let served = runtime.block_on(async {
        let server = Server::bind(config).await.context("binding the portals")?;
        if let Some(path) = &args.config {
            server.set_config_file(std::path::absolute(path).unwrap_or_else(|_| path.clone()));
        }
        let handle = server.handle();
        let control = start_control(args.control.as_deref(), handle.clone()).await?;
        let metrics = match args.metrics {
            Some(address) => {
                let endpoint = handle
                    .serve_metrics(address, args.metrics_sessions)
                    .await
                    .context("--metrics")?;
                println!("iscsi target: metrics on http://{}/metrics", endpoint.local);
                Some(endpoint)
            }
            None => None,
        };
        // Caught before READY=1: a `systemctl reload` right after the start
        // must not meet SIGHUP's default action (the end of the process).
        let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        let reloads = tokio::spawn(reload_on_sighup(handle.clone(), hangups));
        for address in server.local_addrs() {
            for target in &names {
                println!("iscsi target: serving {target} on {address}");
                println!("  discover: iscsi-ls iscsi://{address}");
                println!("  inquiry:  iscsi-inq iscsi://{address}/{target}/0");
            }
        }
        for address in server.iser_addrs() {
            for target in &names {
                println!("iscsi target: serving {target} over iSER on {address}");
                println!("  inquiry:  iscsi inquiry iser://{address}/{target}/0");
            }
        }
        let shutdown = shutdown_requested();
        crate::notify::serving(&handle);
        let served = server
            .run_until(async {
                shutdown.await;
                crate::notify::stopping();
            })
            .await
            .context("serving");
        reloads.abort();
        if let Some(endpoint) = metrics {
            endpoint.stop();
        }
        if let Some((task, path)) = control {
            task.abort();
            let _ = std::fs::remove_file(path);
        }
        served
    });
    // Every connection has ended (or been dropped after the grace
    // period): nothing more will be traced, so the JSON can be closed.
    drop(runtime);
    if let (Some(trace), Some(path)) = (trace, &args.trace) {
        trace
            .finish()
            .with_context(|| format!("--trace {}", path.display()))?;
        eprintln!("iscsi target: trace written to {}", path.display());
    }
    served
}

/// Answers on the control socket (`--control`, or the default path) until
/// the target stops. With the default path already answered by another
/// target, this one runs without a socket and says so.
async fn start_control(
    wanted: Option<&std::path::Path>,
    handle: ServerHandle,
) -> anyhow::Result<Option<(tokio::task::JoinHandle<()>, PathBuf)>> {
    let path = match wanted {
        Some(path) if path.as_os_str() == "none" => return Ok(None),
        Some(path) => path.to_path_buf(),
        None => iscsi_target::control::default_path(),
    };
    let listener = match iscsi_target::control::bind(&path).await {
        Ok(listener) => listener,
        Err(error) if wanted.is_none() => {
            tracing::warn!(%error, "no control socket: status and reload are not available (give --control PATH)");
            return Ok(None);
        }
        Err(error) => {
            return Err(error).with_context(|| format!("--control {}", path.display()));
        }
    };
    println!("iscsi target: control socket {}", path.display());
    let task = tokio::spawn(iscsi_target::control::serve(listener, handle));
    Ok(Some((task, path)))
}

/// Reloads the configuration file on each SIGHUP (what `systemctl reload`
/// sends): ctld's reload, with the rollback and refusals of
/// `ServerHandle::reload`, which logs the outcome. systemd hears of it
/// (RELOADING=1, then READY=1 applied or refused: `notify`).
async fn reload_on_sighup(
    handle: ServerHandle,
    hangups: std::io::Result<tokio::signal::unix::Signal>,
) {
    let Ok(mut hangups) = hangups else {
        tracing::warn!("SIGHUP cannot be caught: reload through `iscsi target reload`");
        return;
    };
    while hangups.recv().await.is_some() {
        tracing::info!("SIGHUP: reloading the configuration");
        crate::notify::reloading();
        // The outcome is logged by reload itself.
        let outcome = handle.reload(false).await;
        crate::notify::reloaded(&handle, outcome.as_ref());
    }
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM, what service managers send:
/// either way the target asks its initiators to log out and waits for them
/// (the graceful shutdown of `Server::run_until`). Both are caught from
/// the call on, not from the first poll: READY=1 follows it, and a stop
/// right after the start must not meet SIGTERM's default action.
fn shutdown_requested() -> impl Future<Output = ()> {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    async fn received(signal: Option<Signal>) {
        match signal {
            Some(mut signal) => {
                signal.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    let terminate = received(signal(SignalKind::terminate()).ok());
    let interrupt = received(signal(SignalKind::interrupt()).ok());
    async move {
        tokio::select! {
            _ = interrupt => {}
            _ = terminate => {}
        }
    }
}
