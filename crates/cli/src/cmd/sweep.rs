//! `iscsi sweep`: the parameter study of Shastry, Klotz and Russell (§5-6)
//! against any target. Every combination of the swept keys' values, block
//! sizes and queue depths (a cell) is measured with the load generator of
//! `iscsi bench`, each cell on a session of its own (a fresh login, so a
//! cell's keys are the ones negotiated), repeats interleaved: round r of
//! every cell, then round r+1, so that drift of the machine spreads over
//! all cells instead of biasing one.
//!
//! Per cell and repeat a row records the key values, throughput, latency,
//! the initiator's CPU time per command (getrusage over the measured
//! window) and the PDUs and data bytes per command counted on the wire
//! (`Session::wire_counts` before and after the window). The rows go to
//! `DIR/results.csv`, then `iscsi model`'s fitting writes `models.json` and
//! the plots.
//!
//! Nothing is written until every key and value has been checked
//! (`SessionConfig::set` on a scratch configuration) and every distinct key
//! combination has logged in once, with the LUN's size checked against
//! every block size. Rows are streamed to `DIR/results.csv.partial` as they
//! are measured and the file is renamed to `results.csv` only when the
//! sweep has finished: a `results.csv` is always a complete sweep.

use std::path::PathBuf;

use anyhow::{Context, bail};
use iscsi_analysis::{Row, RowWriter};
use iscsi_initiator::{IscsiUrl, Session, SessionConfig, WireCounts};
use nix::sys::resource::{UsageWho, getrusage};

use super::bench::{Load, Lu, check_load, geometry, parse_rw, run_load, runtime};
use super::initiator_args::{SessionArgs, parse_size, target_url};

/// Options of `iscsi sweep`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn/lun
    url: String,
    /// read, write, randread or randwrite.
    #[arg(long, default_value = "read")]
    rw: String,
    /// A swept dimension (repeatable): a login key or initiator setting
    /// (anything `--set` takes) and its values, e.g.
    /// `--key MaxRecvDataSegmentLength=4k,8k,64k` or `--key TcpNoDelay=Yes,No`.
    /// Keys joined by commas take the same value together:
    /// `--key MaxRecvDataSegmentLength,MaxBurstLength,FirstBurstLength=8k,64k`.
    /// Sizes (4k, 1M) are accepted where the key is a number.
    #[arg(long = "key", value_name = "KEY[,KEY...]=V1,V2,...")]
    keys: Vec<String>,
    /// Bytes per command, a comma list (e.g. 4k,64k,1M).
    #[arg(long, default_value = "64k")]
    bs: String,
    /// Commands in flight, a comma list.
    #[arg(long, default_value = "8")]
    qd: String,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    time: f64,
    /// Measurements per cell, interleaved across cells.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Directory for results.csv, models.json and the plots.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    session: SessionArgs,
}

/// One swept dimension: linked keys and their values (sizes already
/// turned into numbers).
#[derive(Clone, Debug, PartialEq)]
struct KeyDimension {
    names: Vec<String>,
    values: Vec<String>,
}

/// Checks `value` for `key` on a copy of `base`; a size such as `4k` is
/// turned into its number where the key wants one. Returns the value as it
/// will be set.
fn normalise(base: &SessionConfig, key: &str, value: &str) -> anyhow::Result<String> {
    let mut scratch = base.clone();
    match scratch.set(key, value) {
        Ok(()) => Ok(value.to_owned()),
        Err(error) => {
            if let Ok(bytes) = parse_size(value) {
                let number = bytes.to_string();
                if scratch.set(key, &number).is_ok() {
                    return Ok(number);
                }
            }
            Err(anyhow::Error::new(error).context(format!("--key {key}={value}")))
        }
    }
}

/// Parses one `--key KEY[,KEY...]=V1,V2,...`, checking every key and value.
fn parse_key(spec: &str, base: &SessionConfig) -> anyhow::Result<KeyDimension> {
    let Some((names, values)) = spec.split_once('=') else {
        bail!("--key wants KEY[,KEY...]=V1,V2,..., got {spec:?}");
    };
    let names: Vec<String> = names.split(',').map(|n| n.trim().to_owned()).collect();
    if names.iter().any(String::is_empty) {
        bail!("--key {spec:?}: a key name is empty");
    }
    if values.trim().is_empty() {
        bail!("--key {spec:?}: the value list is empty");
    }
    let raw: Vec<&str> = values.split(',').map(str::trim).collect();
    if raw.iter().any(|v| v.is_empty()) {
        bail!("--key {spec:?}: a value is empty");
    }
    let mut normalised = Vec::new();
    for value in raw {
        let value = normalise(base, &names[0], value)?;
        for name in &names[1..] {
            normalise(base, name, &value)?;
        }
        if normalised.contains(&value) {
            bail!("--key {spec:?}: {value} is given twice");
        }
        normalised.push(value);
    }
    Ok(KeyDimension {
        names,
        values: normalised,
    })
}

/// Parses a comma list of positive numbers (`--bs` with sizes, `--qd`).
fn parse_list(option: &str, text: &str, size: bool) -> anyhow::Result<Vec<u64>> {
    let mut values = Vec::new();
    for item in text.split(',').map(str::trim) {
        let value = if size {
            parse_size(item).with_context(|| format!("--{option} {text:?}"))?
        } else {
            item.parse()
                .with_context(|| format!("--{option} {text:?}: {item:?} is not a number"))?
        };
        if value == 0 {
            bail!("--{option} values must be positive, got {item:?}");
        }
        values.push(value);
    }
    Ok(values)
}

/// One combination of values: the key values (one per key name, in
/// column order), bs and qd.
#[derive(Clone, Debug)]
struct Cell {
    keys: Vec<String>,
    config: SessionConfig,
    bs: u64,
    qd: u64,
}

impl Cell {
    fn describe(&self, names: &[String]) -> String {
        let mut text: Vec<String> = names
            .iter()
            .zip(&self.keys)
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        text.push(format!("bs={} qd={}", self.bs, self.qd));
        text.join(" ")
    }
}

/// Everything a sweep will do, checked before any I/O.
struct Plan {
    url: IscsiUrl,
    write: bool,
    random: bool,
    key_names: Vec<String>,
    cells: Vec<Cell>,
}

fn plan(args: &Args) -> anyhow::Result<Plan> {
    let (write, random) = parse_rw(&args.rw)?;
    let url = target_url(&args.url)?;
    if args.time <= 0.0 || args.repeat == 0 {
        bail!("--time and --repeat must be positive");
    }
    let base = args.session.config()?;
    let dimensions: Vec<KeyDimension> = args
        .keys
        .iter()
        .map(|spec| parse_key(spec, &base))
        .collect::<anyhow::Result<_>>()?;
    let key_names: Vec<String> = dimensions.iter().flat_map(|d| d.names.clone()).collect();
    for (i, name) in key_names.iter().enumerate() {
        if key_names[..i].contains(name) {
            bail!("--key {name} is swept twice");
        }
    }
    let bs_values = parse_list("bs", &args.bs, true)?;
    let qd_values = parse_list("qd", &args.qd, false)?;
    // The cartesian product, the last dimension varying fastest.
    let mut combinations: Vec<(Vec<String>, SessionConfig)> = vec![(Vec::new(), base)];
    for dimension in &dimensions {
        let mut next = Vec::new();
        for (keys, config) in &combinations {
            for value in &dimension.values {
                let mut keys = keys.clone();
                let mut config = config.clone();
                for name in &dimension.names {
                    config.set(name, value)?;
                    keys.push(value.clone());
                }
                next.push((keys, config));
            }
        }
        combinations = next;
    }
    let mut cells = Vec::new();
    for (keys, config) in &combinations {
        for &bs in &bs_values {
            for &qd in &qd_values {
                cells.push(Cell {
                    keys: keys.clone(),
                    config: config.clone(),
                    bs,
                    qd,
                });
            }
        }
    }
    Ok(Plan {
        url,
        write,
        random,
        key_names,
        cells,
    })
}

impl Plan {
    fn load(&self, cell: &Cell, time: f64) -> Load {
        Load {
            write: self.write,
            random: self.random,
            bs: cell.bs,
            qd: cell.qd as usize,
            time,
            keep_data: false,
        }
    }

    /// Logs in once with every distinct key combination and checks every
    /// cell's load against the LUN: a key the target refuses, or a block
    /// size the LUN cannot take, fails here, before anything is written.
    async fn probe(&self, time: f64) -> anyhow::Result<()> {
        let mut probed: Vec<&Vec<String>> = Vec::new();
        for cell in &self.cells {
            if probed.contains(&&cell.keys) {
                continue;
            }
            probed.push(&cell.keys);
            let session = Session::connect(&self.url, cell.config.clone())
                .await
                .with_context(|| {
                    format!(
                        "logging in to {} with {}",
                        self.url,
                        describe_keys(&self.key_names, &cell.keys)
                    )
                })?;
            let checked = async {
                let geometry = geometry(&session, self.url.lun).await?;
                for other in self.cells.iter().filter(|c| c.keys == cell.keys) {
                    check_load(&self.load(other, time), &geometry)?;
                }
                anyhow::Ok(())
            }
            .await;
            let _ = session.logout().await;
            checked?;
        }
        Ok(())
    }

    /// Measures one cell on a fresh session.
    async fn measure(&self, cell: &Cell, time: f64, rw: &str, repeat: u32) -> anyhow::Result<Row> {
        let session = Session::connect(&self.url, cell.config.clone())
            .await
            .with_context(|| format!("logging in to {}", self.url))?;
        let geometry = geometry(&session, self.url.lun).await?;
        let load = self.load(cell, time);
        let wire_before = session.wire_counts();
        let cpu_before = cpu_seconds()?;
        let lu = Lu::Session(session.clone(), self.url.lun);
        let measured = run_load(&lu, &geometry, &load).await;
        let cpu = cpu_seconds()? - cpu_before;
        let wire = session.wire_counts().since(&wire_before);
        let _ = session.logout().await;
        let measured = measured?;
        let commands = measured.commands();
        if commands == 0 || wire.scsi_commands == 0 {
            bail!("no command completed in {time} s");
        }
        let mib_per_s = measured.mib_per_s(cell.bs);
        Ok(row(cell, rw, repeat, &measured, mib_per_s, cpu, &wire))
    }
}

fn describe_keys(names: &[String], values: &[String]) -> String {
    if names.is_empty() {
        return "the --set keys".to_owned();
    }
    names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// This process's user+system CPU time so far, in seconds.
fn cpu_seconds() -> anyhow::Result<f64> {
    let usage = getrusage(UsageWho::RUSAGE_SELF).context("getrusage")?;
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
    Ok(seconds(usage.user_time()) + seconds(usage.system_time()))
}

/// A row from one measurement. PDU counts are divided by the SCSI Command
/// PDUs seen on the wire in the window, CPU time by the commands completed
/// (the two are equal: every worker waits for its last command).
fn row(
    cell: &Cell,
    rw: &str,
    repeat: u32,
    measured: &super::bench::Measured,
    mib_per_s: f64,
    cpu_seconds: f64,
    wire: &WireCounts,
) -> Row {
    let per_command = |count: u64| count as f64 / wire.scsi_commands as f64;
    Row {
        keys: cell.keys.clone(),
        rw: rw.to_owned(),
        bs: cell.bs,
        qd: cell.qd,
        repeat,
        mib_per_s,
        iops: measured.iops(),
        p50_us: measured.percentile(50.0),
        p99_us: measured.percentile(99.0),
        cpu_us_per_io: cpu_seconds * 1e6 / measured.commands() as f64,
        data_in_per_cmd: per_command(wire.data_in),
        r2t_per_cmd: per_command(wire.r2t),
        data_out_per_cmd: per_command(wire.data_out),
        immediate_bytes: per_command(wire.immediate_bytes),
        unsolicited_bytes: per_command(wire.unsolicited_bytes),
        solicited_bytes: per_command(wire.solicited_bytes),
        ms_per_mb: 1000.0 / mib_per_s,
    }
}

/// Runs the sweep.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let plan = plan(args)?;
    let runtime = runtime(1)?;
    runtime.block_on(plan.probe(args.time))?;
    let dir = &args.out;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let complete = dir.join("results.csv");
    let partial = dir.join("results.csv.partial");
    // A new sweep replaces what an earlier one left in DIR.
    for stale in [&complete, &dir.join("models.json")] {
        match std::fs::remove_file(stale) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(error).with_context(|| format!("removing {}", stale.display()));
            }
            _ => {}
        }
    }
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut writer = RowWriter::new(file, &plan.key_names)?;
    let total = plan.cells.len() as u64 * u64::from(args.repeat);
    let progress = indicatif::ProgressBar::new(total);
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} cells (eta {eta}) {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let measured = runtime.block_on(async {
        for repeat in 0..args.repeat {
            for cell in &plan.cells {
                progress.set_message(format!(
                    "round {} {}",
                    repeat + 1,
                    cell.describe(&plan.key_names)
                ));
                let row = plan
                    .measure(cell, args.time, &args.rw, repeat)
                    .await
                    .with_context(|| {
                        format!(
                            "measuring {} (round {})",
                            cell.describe(&plan.key_names),
                            repeat + 1
                        )
                    })?;
                writer.write(&row)?;
                progress.inc(1);
            }
        }
        anyhow::Ok(())
    });
    progress.finish_and_clear();
    if let Err(error) = measured {
        return Err(error.context(format!(
            "the sweep stopped; the rows measured so far are in {} (incomplete)",
            partial.display()
        )));
    }
    writer.finish()?;
    std::fs::rename(&partial, &complete)
        .with_context(|| format!("renaming {} to results.csv", partial.display()))?;
    println!("{total} rows in {}", complete.display());
    super::model::refit(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_linked_and_sizes_become_numbers() {
        let base = SessionConfig::default();
        let dim = parse_key(
            "MaxRecvDataSegmentLength,MaxBurstLength,FirstBurstLength=4k,8192,1M",
            &base,
        )
        .unwrap();
        assert_eq!(dim.names.len(), 3);
        assert_eq!(dim.values, ["4096", "8192", "1048576"]);
        let dim = parse_key("TcpNoDelay=Yes,No", &base).unwrap();
        assert_eq!(dim.values, ["Yes", "No"]);
        for (spec, says) in [
            ("NoSuchKey=1,2", "unknown key"),
            ("MaxBurstLength=", "value list is empty"),
            ("MaxBurstLength=1,,2", "a value is empty"),
            ("MaxBurstLength", "KEY[,KEY...]=V1"),
            (",MaxBurstLength=1", "key name is empty"),
            ("InitialR2T=Yes,4k", "InitialR2T=4k"),
            ("MaxBurstLength=8k,8192", "given twice"),
        ] {
            let error = format!("{:#}", parse_key(spec, &base).unwrap_err());
            assert!(error.contains(says), "{spec}: {error}");
        }
    }

    #[test]
    fn lists_take_sizes_and_refuse_zero() {
        assert_eq!(parse_list("bs", "4k, 64k", true).unwrap(), [4096, 65536]);
        assert_eq!(parse_list("qd", "1,8", false).unwrap(), [1, 8]);
        assert!(parse_list("qd", "1,x", false).is_err());
        assert!(parse_list("bs", "0", true).is_err());
    }
}
