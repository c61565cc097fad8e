//! `iscsi`: the one binary of iscsi-rs, one subcommand per job. Each
//! subcommand lives in its own module under `cmd/`; this file only parses
//! the command line and reports errors. `notify` is the target's side of
//! systemd's sd_notify protocol (packaging/iscsi-target.service).

mod cmd;
mod notify;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// iscsi-rs: an iSCSI target, initiator and the tools to measure them.
#[derive(Parser)]
#[command(name = "iscsi", version, about, propagate_version = true)]
struct Cli {
    /// How log lines on standard error look: `text` for people, `json` for
    /// log collectors (one JSON object a line, each event's fields as JSON
    /// fields under "fields"). RUST_LOG chooses which lines (default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The format of the log on standard error.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    /// One line of text per event.
    Text,
    /// One JSON object per event and line.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve block storage over iSCSI (default: a 1 GiB RAM LUN as
    /// iqn.2026-11.rs.iscsi:target0 on 127.0.0.1:3260).
    Target(cmd::target::Args),
    /// Measure every CRC32C algorithm, memcpy, copy-then-CRC and the fused
    /// copy+CRC over buffer sizes from 512 B to 64 MiB.
    CrcBench(cmd::crc_bench::Args),
    /// Measure the per-PDU cost of receiving a Data-In: header decode and
    /// digest, and a whole 8 KiB PDU landed with both digests.
    PduBench(cmd::pdu_bench::Args),
    /// Split the instructions per PDU of our target and initiator into
    /// header, digest, copy, syscall, SCSI, backstore and other (see
    /// scripts/pdu-cost).
    PduCost(cmd::pdu_cost::Args),
    /// List the targets a portal serves (SendTargets discovery).
    Discover(cmd::discover::DiscoverArgs),
    /// List a target's LUNs with size, type, vendor and product.
    Ls(cmd::discover::LsArgs),
    /// Show a LUN's INQUIRY data.
    Inquiry(cmd::inspect::Args),
    /// Show a LUN's capacity (READ CAPACITY).
    Capacity(cmd::inspect::Args),
    /// Read bytes from a LUN to a file or stdout.
    Read(cmd::transfer::ReadArgs),
    /// Write a file (or stdin) to a LUN.
    Write(cmd::transfer::WriteArgs),
    /// Copy between files and iSCSI URLs in any combination.
    Copy(cmd::transfer::CopyArgs),
    /// Show every LUN of a target as a file DIR/lun0, DIR/lun1, ... (FUSE)
    /// until unmounted (fusermount3 -u DIR) or interrupted.
    Mount(cmd::mount::Args),
    /// Present a LUN as a Linux block device (/dev/ublkbN, through ublk)
    /// and serve it in the foreground until `iscsi detach` or a signal.
    Attach(cmd::attach::AttachArgs),
    /// Remove a device `iscsi attach` made (/dev/ublkbN or its id).
    Detach(cmd::attach::DetachArgs),
    /// Measure a LUN: throughput, IOPS and latency percentiles.
    Bench(cmd::bench::Args),
    /// Write, read and check a LUN against a log of acknowledged writes
    /// (wrong data and lost writes are errors).
    Verify(cmd::verify::Args),
    /// Run an initiator script (login, read, write, repeat, set, ...).
    Script(cmd::script::Args),
    /// Relay TCP connections with a fixed delay each way (a link with a
    /// real round-trip time, for parameter studies).
    DelayRelay(cmd::relay::Args),
    /// Relay iSCSI connections and inject faults into chosen PDUs
    /// (corrupt, drop, delay, stall, cut), logging what was done.
    FaultProxy(cmd::fault_proxy::Args),
    /// Measure every combination of key values, block sizes and queue
    /// depths (one login per run); write results.csv, models.json, plots.
    Sweep(cmd::sweep::Args),
    /// Fit the throughput models to a sweep's results.csv again; rewrite
    /// models.json and the plots.
    Model(cmd::model::Args),
    /// Sum a trace (from --trace) per step: total time, count, average and
    /// share of the connection time.
    TraceReport(cmd::trace_report::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        // fuser (iscsi mount) says "[Not Implemented]" at warn for
        // every request a file system leaves to the kernel's defaults:
        // noise for an operator: its errors are kept.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,fuser=error")),
        )
        .with_writer(std::io::stderr)
        // Colours for a person at a terminal only: a log file or journal
        // gets plain text, which grep and the reader of the file can use.
        .with_ansi(std::io::stderr().is_terminal());
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let result = match cli.command {
        Command::Target(args) => cmd::target::run(&args),
        Command::CrcBench(args) => cmd::crc_bench::run(&args),
        Command::PduBench(args) => cmd::pdu_bench::run(&args),
        Command::PduCost(args) => cmd::pdu_cost::run(&args),
        Command::Discover(args) => cmd::discover::run_discover(&args),
        Command::Ls(args) => cmd::discover::run_ls(&args),
        Command::Inquiry(args) => cmd::inspect::run_inquiry(&args),
        Command::Capacity(args) => cmd::inspect::run_capacity(&args),
        Command::Read(args) => cmd::transfer::run_read(&args),
        Command::Write(args) => cmd::transfer::run_write(&args),
        Command::Copy(args) => cmd::transfer::run_copy(&args),
        Command::Mount(args) => cmd::mount::run(&args),
        Command::Attach(args) => cmd::attach::run_attach(&args),
        Command::Detach(args) => cmd::attach::run_detach(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Verify(args) => cmd::verify::run(&args),
        Command::Script(args) => cmd::script::run(&args),
        Command::DelayRelay(args) => cmd::relay::run(&args),
        Command::FaultProxy(args) => cmd::fault_proxy::run(&args),
        Command::Sweep(args) => cmd::sweep::run(&args),
        Command::Model(args) => cmd::model::run(&args),
        Command::TraceReport(args) => cmd::trace_report::run(&args),
    };
    // An initiator subcommand's --trace is closed however it ended.
    let result = match (result, cmd::initiator_args::finish_trace()) {
        (Err(error), _) => Err(error),
        (Ok(()), finished) => finished,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("iscsi: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, LogFormat};

    /// clap's own checks of the whole command tree: the global
    /// `--log-format` must clash with no subcommand's options.
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// `--log-format` is global: before or after the subcommand.
    #[test]
    fn the_log_format_goes_before_or_after_the_subcommand() {
        for args in [
            &["iscsi", "--log-format", "json", "target"][..],
            &["iscsi", "target", "--log-format", "json"][..],
        ] {
            let cli = Cli::try_parse_from(args).expect("parses");
            assert_eq!(cli.log_format, LogFormat::Json, "{args:?}");
        }
        let cli = Cli::try_parse_from(["iscsi", "target"]).expect("parses");
        assert_eq!(cli.log_format, LogFormat::Text);
        assert!(Cli::try_parse_from(["iscsi", "--log-format", "xml", "target"]).is_err());
    }
}
