//! `iscsi-sim`: runs the deterministic simulator over many seeds.
//!
//! ```text
//! iscsi-sim --seconds 60              seeds from 1 for a minute of wall time
//! iscsi-sim --count 3000              seeds 1 to 3000, however long it takes (CI)
//! iscsi-sim --seed 1234 --verbose     one seed, every event printed
//! iscsi-sim --bug write-before-all-data --seconds 60
//!                                     with a planted bug (a `planted` build):
//!                                     succeeds when a seed finds it
//! ```

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

/// The deterministic simulator of the target core.
#[derive(Parser)]
struct Args {
    /// Run only this seed.
    #[arg(long)]
    seed: Option<u64>,
    /// The first seed of a sweep.
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// Wall-clock seconds to sweep seeds for.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Sweep exactly this many seeds (from --from), however long it takes:
    /// what CI runs, so that it passes or fails the same on any machine.
    #[arg(long)]
    count: Option<u64>,
    /// Print every event (with --seed).
    #[arg(long)]
    verbose: bool,
    /// Switch on a planted bug; the run succeeds when a seed finds it.
    #[arg(long)]
    bug: Option<String>,
    /// Print the names of the planted bugs, one a line.
    #[arg(long)]
    list_bugs: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.list_bugs {
        for (_, name) in iscsi_target_core::planted::Bug::ALL {
            println!("{name}");
        }
        return ExitCode::SUCCESS;
    }
    let planted = match args.bug.as_deref() {
        None => None,
        Some(name) => match plant(name) {
            Ok(()) => Some(name.to_string()),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
    };
    let started = Instant::now();
    let seeds: Box<dyn Iterator<Item = u64>> = match (args.seed, args.count) {
        (Some(seed), _) => Box::new(std::iter::once(seed)),
        (None, Some(count)) => Box::new(args.from..args.from + count),
        (None, None) => Box::new(args.from..),
    };
    let timed = args.seed.is_none() && args.count.is_none();
    let (mut runs, mut commands, mut simulated) = (0u64, 0u64, 0u64);
    let mut faults = iscsi_sim::initiator::Stats::default();
    for seed in seeds {
        if timed && started.elapsed().as_secs() >= args.seconds {
            break;
        }
        match iscsi_sim::run(seed, args.verbose) {
            Ok(summary) => {
                runs += 1;
                commands += summary.stats.reads + summary.stats.writes;
                simulated += summary.simulated;
                faults.add(&summary.stats);
            }
            Err(failure) => {
                report(&failure, planted.as_deref());
                let found = started.elapsed().as_secs_f64();
                return match &planted {
                    Some(bug) => {
                        println!(
                            "planted bug {bug} found by seed {} after {runs} clean runs, {found:.1} s: {}",
                            failure.seed, failure.violation
                        );
                        ExitCode::SUCCESS
                    }
                    None => ExitCode::FAILURE,
                };
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{runs} runs, {commands} commands, {:.1} simulated s in {wall:.1} s: {:.0} simulated commands/s",
        simulated as f64 / 1e6,
        commands as f64 / wall.max(1e-9)
    );
    println!(
        "faults: {} digests damaged (Data-Out, immediate data), {} writes failed for them, \
         {} tasks aborted ({} before their command arrived), {} SNACKs, {} tags reused, {} malformed commands, {} ABORT TASK SETs, {} sessions lost",
        faults.damaged,
        faults.failed_writes,
        faults.aborted,
        faults.aborted_before_arrival,
        faults.snacks,
        faults.duplicates,
        faults.malformed,
        faults.abort_sets,
        faults.session_losses
    );
    match planted {
        Some(bug) => {
            println!("planted bug {bug} NOT found in {runs} runs");
            ExitCode::FAILURE
        }
        None => ExitCode::SUCCESS,
    }
}

fn report(failure: &iscsi_sim::Failure, bug: Option<&str>) {
    println!("--- the last events of seed {} ---", failure.seed);
    for line in &failure.trace {
        println!("{line}");
    }
    println!("--- seed {} failed at {} us ---", failure.seed, failure.at);
    println!("{}", failure.violation);
    println!("parameters: {:?}", failure.params);
    let planted = bug.map_or(String::new(), |bug| format!("--bug {bug} "));
    println!(
        "replay: scripts/sim {planted}--seed {} --verbose",
        failure.seed
    );
}

#[cfg(feature = "planted")]
fn plant(name: &str) -> Result<(), String> {
    use iscsi_target_core::planted::{self, Bug};
    let bug = Bug::named(name).ok_or_else(|| {
        let names: Vec<_> = Bug::ALL.iter().map(|(_, n)| *n).collect();
        format!("no planted bug {name}; there are: {}", names.join(", "))
    })?;
    planted::activate(bug);
    Ok(())
}

#[cfg(not(feature = "planted"))]
fn plant(_: &str) -> Result<(), String> {
    Err("planted bugs need a build with --features planted (scripts/sim does that)".into())
}
