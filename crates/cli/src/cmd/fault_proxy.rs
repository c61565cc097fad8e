//! `iscsi fault-proxy`: a TCP proxy between an initiator and a target that
//! injects the faults it is given (see `iscsi_fault::spec` for the
//! syntax) and prints one line for everything it does; `--log` also
//! writes each as a JSON line, for scripts that check what happened.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::Mutex;

use anyhow::Context;
use iscsi_fault::{EventSink, Fault, FaultProxy, Logging};

/// Options of `iscsi fault-proxy`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to accept initiators on, e.g. 127.0.0.1:3270.
    #[arg(long)]
    listen: String,
    /// The target's portal to relay each connection to.
    #[arg(long)]
    to: String,
    /// A fault, ACTION[=ARG]@WHERE[#N|%N] (repeatable). ACTION:
    /// corrupt-header[=BYTE], corrupt-data[=BYTE], drop, delay=DURATION,
    /// stall=DURATION, cut, cut-after=BYTES. WHERE: a PDU kind (data-in,
    /// data-out, scsi-command, scsi-response, r2t, nop-out, nop-in,
    /// task-request, task-response, login-request, login-response,
    /// text-request, text-response, logout-request, logout-response,
    /// snack, async, reject), to-target, to-initiator or any. #N fires at
    /// the Nth match (default #1), %N at every Nth; matches are counted
    /// across connections. cut-after=BYTES@to-target (or to-initiator)
    /// cuts a connection after exactly that many bytes one way. Examples:
    /// corrupt-data@data-in#3, drop@scsi-response#10, stall=2s@r2t#1.
    #[arg(long = "fault", value_name = "SPEC")]
    faults: Vec<String>,
    /// Also write every event as a JSON line to this file.
    #[arg(long)]
    log: Option<std::path::PathBuf>,
    /// Report every PDU forwarded too (sequence numbers, tags, SNACK runs,
    /// the A and S bits), not only the faults: what the two peers said to
    /// each other around a fault.
    #[arg(long)]
    log_pdus: bool,
}

/// Runs the proxy until the process is stopped.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let faults = args
        .faults
        .iter()
        .map(|spec| spec.parse::<Fault>())
        .collect::<Result<Vec<_>, _>>()?;
    let log = match &args.log {
        Some(path) => Some(Mutex::new(BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        ))),
        None => None,
    };
    let sink: EventSink = Box::new(move |event| {
        eprintln!("fault-proxy: {event}");
        if let Some(log) = &log {
            let mut log = log
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // A line per event, flushed, so a reader sees it at once.
            if let Ok(line) = serde_json::to_string(event) {
                let _ = writeln!(log, "{line}");
                let _ = log.flush();
            }
        }
    });
    let logging = if args.log_pdus {
        Logging::EveryPdu
    } else {
        Logging::Faults
    };
    let proxy = FaultProxy::start_logging(
        args.listen.as_str(),
        args.to.as_str(),
        faults.clone(),
        Some(sink),
        logging,
    )
    .with_context(|| format!("starting the proxy on {} to {}", args.listen, args.to))?;
    eprintln!(
        "fault-proxy: {} -> {}, faults: {}",
        proxy.local_addr(),
        args.to,
        if faults.is_empty() {
            "none".to_owned()
        } else {
            faults
                .iter()
                .map(|f| f.text.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    proxy.wait();
    Ok(())
}
