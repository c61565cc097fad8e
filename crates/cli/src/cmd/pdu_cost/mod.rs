//! `iscsi pdu-cost`: where the instructions of a PDU go, on our target and
//! our initiator, for reads and writes with and without digests: header
//! handling, digest, copy, system-call entry, SCSI, backstore and the rest,
//! beside the FAST '05 study's per-PDU breakdown (docs/pdu-cost.md).
//!
//! `scripts/pdu-cost` drives it: for each case it runs `iscsi target` and
//! `iscsi pdu-cost workload` (the initiator), each under callgrind, at two
//! command counts; then natively under `perf record` for the kernel's
//! share; then `iscsi pdu-cost analyze` reads every file back, splits each
//! profile into categories (`category.rs`), takes the differences
//! (`table.rs`) and writes the table, CSV, JSON and chart (`chart.rs`).

pub mod callgrind;
pub mod category;
pub mod chart;
pub mod perf;
pub mod table;
pub mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use category::Category;
use table::{Kernel, Row, Run};
use workload::Record;

/// Options of `iscsi pdu-cost`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Mode,
}

#[derive(clap::Subcommand, Debug)]
enum Mode {
    /// The initiator side of one case: a fixed number of sequential
    /// commands; prints a JSON record of the PDUs they took.
    Workload(workload::Args),
    /// Read a directory of runs (as scripts/pdu-cost leaves it) and print
    /// the table; optionally write CSV, JSON and a PNG chart.
    Analyze(AnalyzeArgs),
    /// The functions that carry most of each category in one callgrind
    /// profile: how to check what the rules in `category.rs` decided.
    Explain(ExplainArgs),
}

/// Options of `iscsi pdu-cost explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// A callgrind output file.
    profile: PathBuf,
    /// Functions listed per category.
    #[arg(long, default_value_t = 8)]
    top: usize,
}

/// Options of `iscsi pdu-cost analyze`.
#[derive(clap::Args, Debug)]
pub struct AnalyzeArgs {
    /// The directory of runs.
    dir: PathBuf,
    /// Write the table as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write the rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the stacked bar chart into this PNG.
    #[arg(long)]
    chart: Option<PathBuf>,
}

/// Runs `iscsi pdu-cost`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        Mode::Workload(args) => workload::run(args),
        Mode::Analyze(args) => analyze(args),
        Mode::Explain(args) => explain(args),
    }
}

fn explain(args: &ExplainArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.profile)
        .with_context(|| format!("reading {}", args.profile.display()))?;
    let profile = callgrind::parse(&text)?;
    let parts = category::attribute_functions(&profile);
    for (c, category) in Category::ALL.iter().enumerate() {
        let total: f64 = parts.iter().map(|p| p[c]).sum();
        println!(
            "{} {:.0} ({:.1}%)",
            category.name(),
            total,
            100.0 * total / profile.total.max(1) as f64
        );
        let mut order: Vec<usize> = (0..parts.len()).filter(|&f| parts[f][c] > 0.0).collect();
        order.sort_by(|&a, &b| parts[b][c].total_cmp(&parts[a][c]));
        for &f in order.iter().take(args.top) {
            let function = &profile.functions[f];
            println!(
                "  {:>12.0}  {}  [{}]",
                parts[f][c], function.name, function.file
            );
        }
    }
    Ok(())
}

/// A case: direction, size, digests.
type CaseKey = (String, u64, bool);

/// The runs of one case found in the directory.
#[derive(Default)]
struct CaseRuns {
    /// Callgrind runs: the record and the path stem of its profiles.
    callgrind: Vec<(Record, PathBuf)>,
    /// Native runs under perf: the record and the stem of its report.
    perf: Vec<(Record, PathBuf)>,
}

/// The path `stem` with `suffix` appended to its file name.
fn with_suffix(stem: &Path, suffix: &str) -> PathBuf {
    let mut name = stem.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn collect_cases(dir: &Path) -> anyhow::Result<BTreeMap<CaseKey, CaseRuns>> {
    let mut cases: BTreeMap<CaseKey, CaseRuns> = BTreeMap::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".record.json") else {
            continue;
        };
        let record = workload::read_record(&path)?;
        let stem = dir.join(stem);
        let runs = cases
            .entry((record.rw.clone(), record.bs, record.digests))
            .or_default();
        if with_suffix(&stem, ".perf.txt").exists() {
            runs.perf.push((record, stem));
        } else {
            runs.callgrind.push((record, stem));
        }
    }
    if cases.is_empty() {
        bail!("no *.record.json in {}: did the runs fail?", dir.display());
    }
    Ok(cases)
}

/// Instructions by category of one side's profile.
fn profile_costs(path: &Path) -> anyhow::Result<category::Costs> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let profile = callgrind::parse(&text).with_context(|| format!("parsing {}", path.display()))?;
    if profile.self_total() != profile.total {
        bail!(
            "{}: functions sum to {} instructions, the file says {}",
            path.display(),
            profile.self_total(),
            profile.total
        );
    }
    Ok(category::attribute(&profile))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The kernel and user time per PDU of `side` from the perf runs (medians).
fn kernel_times(side: &str, runs: &[(Record, PathBuf)]) -> anyhow::Result<Option<Kernel>> {
    if runs.is_empty() {
        return Ok(None);
    }
    let (mut kernel, mut copy, mut user) = (Vec::new(), Vec::new(), Vec::new());
    for (record, stem) in runs {
        let report_path = with_suffix(stem, ".perf.txt");
        let report = std::fs::read_to_string(&report_path)
            .with_context(|| format!("reading {}", report_path.display()))?;
        let threads = perf::parse_report(&report)?;
        let tids = if side == "initiator" {
            record.tids.clone()
        } else {
            let path = with_suffix(stem, ".target.tids");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            perf::parse_tids(&text)?
        };
        let time = perf::process_time(&threads, &tids);
        if time.kernel_ns + time.user_ns == 0.0 {
            bail!("no samples of the {side} in {}", report_path.display());
        }
        let pdus = record.pdus.max(1) as f64;
        kernel.push(time.kernel_ns / pdus);
        copy.push(time.kernel_copy_ns / pdus);
        user.push(time.user_ns / pdus);
    }
    Ok(Some(Kernel {
        kernel_ns_per_pdu: median(&mut kernel),
        kernel_copy_ns_per_pdu: median(&mut copy),
        user_ns_per_pdu: median(&mut user),
    }))
}

/// The rows of every case, initiator rows first, then the target's.
fn rows(cases: &BTreeMap<CaseKey, CaseRuns>) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for side in ["initiator", "target"] {
        for ((rw, bs, digests), runs) in cases {
            let mut callgrind: Vec<&(Record, PathBuf)> = runs.callgrind.iter().collect();
            callgrind.sort_by_key(|(record, _)| record.commands);
            let (Some(low), Some(high)) = (callgrind.first(), callgrind.last()) else {
                bail!("{rw} {bs} digests={digests}: no callgrind runs");
            };
            if low.0.commands == high.0.commands {
                bail!("{rw} {bs} digests={digests}: needs runs at two command counts");
            }
            let run = |(record, stem): &(Record, PathBuf)| -> anyhow::Result<Run> {
                Ok(Run {
                    commands: record.commands,
                    pdus: record.pdus,
                    costs: profile_costs(&with_suffix(stem, &format!(".{side}.cg")))?,
                })
            };
            let mut row = table::row(side, rw, *bs, *digests, &run(low)?, &run(high)?)?;
            row.kernel = kernel_times(side, &runs.perf)?;
            rows.push(row);
        }
    }
    Ok(rows)
}

fn analyze(args: &AnalyzeArgs) -> anyhow::Result<()> {
    let cases = collect_cases(&args.dir)?;
    let rows = rows(&cases)?;
    print!("{}", table::markdown(&rows));
    println!(
        "\ncolumns: PDUs per command (both ways); instructions per PDU by category ({}); \
         per command; per byte; kernel/user ns per PDU from perf (native runs)",
        Category::ALL.map(Category::name).join(", ")
    );
    if let Some(path) = &args.csv {
        std::fs::write(path, table::csv(&rows))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.chart {
        let title = "Where a PDU's instructions go: iscsi-rs target and initiator (callgrind)";
        if !chart::draw(&rows, path, title)? {
            eprintln!("iscsi pdu-cost: no TrueType font found; the chart has no text");
        }
    }
    Ok(())
}
