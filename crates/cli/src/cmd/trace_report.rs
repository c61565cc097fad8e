//! `iscsi trace-report FILE`: the FKT study's analysis table from a trace
//! taken with `--trace`: per step (PDU kind, SCSI command, the target's
//! execution), the total time, the count, the average and the share of
//! the connection time (what the share means is printed with the table
//! and documented in `iscsi_trace::report`).

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use anyhow::Context;

/// Command-line options of `iscsi trace-report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A trace: the object form with "traceEvents" or a bare array of
    /// events.
    file: PathBuf,
    /// Print the table as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `iscsi trace-report`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let file =
        File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?;
    let report = iscsi_trace::report::read(BufReader::with_capacity(1 << 20, file))
        .with_context(|| format!("reading {}", args.file.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(())
}
