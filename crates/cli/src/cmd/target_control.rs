//! `iscsi target status|reload|check|resize|snapshot|logout`: a running target's control
//! socket from the command line (`iscsi_target::control` is the server).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use iscsi_target::ParsedConfig;
use iscsi_target::reload::plan::Change;
use iscsi_target::reload::resize::ResizeReport;
use iscsi_target::reload::snapshot::SnapshotReport;
use iscsi_target::status::Status;
use serde_json::{Value, json};

/// What to ask a running target.
#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Show portals, targets, LUNs and sessions with their counters.
    Status {
        /// Print the JSON the control socket answers (for jq).
        #[arg(long)]
        json: bool,
        /// The control socket (default: the one `iscsi target` uses).
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
    },
    /// Re-read the configuration file and apply the difference live (what
    /// SIGHUP does).
    Reload {
        /// Apply changes that end sessions or remove LUNs in use.
        #[arg(long)]
        force: bool,
        /// The control socket.
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
    },
    /// Check a configuration file without serving it; with a target
    /// running, print what reloading it would change.
    Check {
        /// The file.
        file: PathBuf,
        /// The control socket.
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
    },
    /// Resize a LUN while it serves (growing needs no force).
    ///
    /// Every initiator hears CAPACITY DATA HAS CHANGED and reads the new
    /// size: a RAM or file LUN to SIZE; a block or file LUN without SIZE
    /// to what its device or file holds now. Shrinking needs --force, and
    /// refuses where data lies beyond the new end unless --discard.
    Resize {
        /// The target's name.
        target: String,
        /// The LUN.
        lun: u16,
        /// The new size (512, 64M, 2G, 1T...).
        size: Option<String>,
        /// Allow a shrink.
        #[arg(long)]
        force: bool,
        /// Drop data written beyond a shrink's new end.
        #[arg(long, requires = "force")]
        discard: bool,
        /// The control socket.
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
    },
    /// Take, list or delete a LUN's snapshots while it serves.
    ///
    /// With NAME, takes snapshot NAME: a crash-consistent point-in-time
    /// copy (every write answered before is in it, none issued after). RAM
    /// LUNs keep theirs in memory, file LUNs beside the file (reflink: XFS
    /// or btrfs), rbd LUNs as rbd snapshots. Without NAME, lists them. To
    /// serve one, add a LUN `snapshot:LUN/NAME` (read-only) or
    /// `clone:LUN/NAME[,to=DEST]` (writable) to the file and reload.
    Snapshot {
        /// The target's name.
        target: String,
        /// The LUN.
        lun: u16,
        /// The snapshot's name (letters, digits, '.', '_', '-').
        name: Option<String>,
        /// Delete snapshot NAME instead.
        #[arg(long, requires = "name")]
        delete: bool,
        /// The control socket.
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
    },
    /// Ask one session to log out (its TSIH, from `status`).
    Logout {
        /// The session's TSIH.
        tsih: u16,
        /// The control socket.
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
    },
}

/// Runs one action.
pub fn run(action: &Action) -> anyhow::Result<()> {
    match action {
        Action::Status { json, control } => {
            let answer = ask(control, &json!({"command": "status"}))?;
            let status = ok(&answer)?.get("status").cloned().unwrap_or(Value::Null);
            if *json {
                println!("{status}");
            } else {
                let status: Status =
                    serde_json::from_value(status).context("the target's status")?;
                print!("{}", show(&status));
            }
            Ok(())
        }
        Action::Reload { force, control } => {
            let answer = ask(control, &json!({"command": "reload", "force": force}))?;
            print_changes(&answer);
            ok(&answer)?;
            println!("reloaded");
            Ok(())
        }
        Action::Check { file, control } => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let parsed =
                ParsedConfig::parse(&text).with_context(|| format!("{}", file.display()))?;
            // What the file needs of this machine (librbd for rbd: LUNs).
            parsed
                .check_libraries()
                .with_context(|| format!("{}", file.display()))?;
            println!("{}: valid", file.display());
            let path = socket(control);
            if !path.exists() {
                println!(
                    "(no target running at {}: nothing to compare)",
                    path.display()
                );
                return Ok(());
            }
            let answer = ask(control, &json!({"command": "plan", "config": text}))?;
            ok(&answer)?;
            println!("against the running target:");
            print_changes(&answer);
            if answer["changes"].as_array().is_none_or(Vec::is_empty) {
                println!("  no changes");
            }
            Ok(())
        }
        Action::Resize {
            target,
            lun,
            size,
            force,
            discard,
            control,
        } => {
            let size = size
                .as_deref()
                .map(iscsi_target::config::lun::parse_size)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let request = json!({"command": "resize", "target": target, "lun": lun,
                "size": size, "force": force, "discard": discard});
            let answer = ask(control, &request)?;
            let report: ResizeReport = serde_json::from_value(ok(&answer)?["resized"].clone())
                .context("the target's answer")?;
            if report.old == report.new {
                println!("target {target} LUN {lun}: {} bytes already", report.new);
            } else {
                println!(
                    "target {target} LUN {lun}: {} -> {} bytes; every initiator hears CAPACITY DATA HAS CHANGED",
                    report.old, report.new
                );
            }
            if let Some(note) = report.note {
                println!("note: {note}");
            }
            Ok(())
        }
        Action::Snapshot {
            target,
            lun,
            name,
            delete,
            control,
        } => snapshot(target, *lun, name.as_deref(), *delete, control),
        Action::Logout { tsih, control } => {
            let answer = ask(control, &json!({"command": "logout", "tsih": tsih}))?;
            ok(&answer)?;
            println!(
                "session {tsih} ({}) asked to log out",
                answer["initiator"].as_str().unwrap_or("?")
            );
            Ok(())
        }
    }
}

/// `iscsi target snapshot`: take, delete or list.
fn snapshot(
    target: &str,
    lun: u16,
    name: Option<&str>,
    delete: bool,
    control: &Option<PathBuf>,
) -> anyhow::Result<()> {
    let what = format!("target {target} LUN {lun}");
    match name {
        Some(name) if delete => {
            let request =
                json!({"command": "delete_snapshot", "target": target, "lun": lun, "name": name});
            ok(&ask(control, &request)?)?;
            println!("{what}: snapshot {name} deleted");
        }
        Some(name) => {
            let request =
                json!({"command": "snapshot", "target": target, "lun": lun, "name": name});
            let answer = ask(control, &request)?;
            let report: SnapshotReport = serde_json::from_value(ok(&answer)?["snapshot"].clone())
                .context("the target's answer")?;
            println!(
                "{what}: snapshot {} taken ({} bytes)",
                report.name, report.size_bytes
            );
        }
        None => {
            let request = json!({"command": "snapshots", "target": target, "lun": lun});
            let answer = ask(control, &request)?;
            let list: Vec<SnapshotReport> =
                serde_json::from_value(ok(&answer)?["snapshots"].clone())
                    .context("the target's answer")?;
            if list.is_empty() {
                println!("{what}: no snapshots");
            }
            for report in &list {
                println!("{}", show_snapshot(report));
            }
        }
    }
    Ok(())
}

/// One snapshot on one line.
fn show_snapshot(report: &SnapshotReport) -> String {
    let taken = report
        .taken_unix
        .and_then(|t| {
            let at = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(t))?;
            Some(humantime::format_rfc3339_seconds(at).to_string())
        })
        .unwrap_or_else(|| "?".into());
    let held = report
        .held_bytes
        .map(|b| format!(", {b} bytes only it holds (freed by deleting it)"))
        .unwrap_or_default();
    let served = if report.served_as.is_empty() {
        String::new()
    } else {
        format!(", served as LUN {:?}", report.served_as)
    };
    format!(
        "{:<24} {} bytes, taken {taken}{held}{served}",
        report.name, report.size_bytes
    )
}

fn socket(control: &Option<PathBuf>) -> PathBuf {
    control
        .clone()
        .unwrap_or_else(iscsi_target::control::default_path)
}

/// Sends one request and reads its answer.
fn ask(control: &Option<PathBuf>, request: &Value) -> anyhow::Result<Value> {
    let path = socket(control);
    let stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "connecting to the target's control socket {} (is `iscsi target` running? --control PATH names another)",
            path.display()
        )
    })?;
    exchange(stream, &path, request)
}

fn exchange(mut stream: UnixStream, path: &Path, request: &Value) -> anyhow::Result<Value> {
    // A target that refuses this user answers at once and closes: the
    // write may fail, and the answer still says why.
    let written = writeln!(stream, "{request}");
    let mut line = String::new();
    let read = BufReader::new(stream).read_line(&mut line);
    if line.trim().is_empty() {
        written.with_context(|| format!("writing to {}", path.display()))?;
        read.with_context(|| format!("reading from {}", path.display()))?;
        bail!(
            "{}: the target closed the control connection without an answer",
            path.display()
        );
    }
    serde_json::from_str(&line).with_context(|| format!("the answer from {}", path.display()))
}

/// The answer if it says ok, else its error.
fn ok(answer: &Value) -> anyhow::Result<&Value> {
    if answer["ok"].as_bool() == Some(true) {
        return Ok(answer);
    }
    bail!(
        "{}",
        answer["error"]
            .as_str()
            .unwrap_or("the target refused without a reason")
    )
}

fn print_changes(answer: &Value) {
    let changes: Vec<Change> =
        serde_json::from_value(answer["changes"].clone()).unwrap_or_default();
    for change in changes {
        println!("  {change}");
    }
}

/// The status in words, for a terminal.
fn show(status: &Status) -> String {
    let mut out = String::new();
    let config = status
        .config_file
        .as_deref()
        .unwrap_or("(command-line flags)");
    out.push_str(&format!("target process {} serving {config}\n", status.pid));
    for portal in &status.portals {
        out.push_str(&format!("portal {} {}\n", portal.transport, portal.address));
    }
    if !status.shards.is_empty() {
        let shards: Vec<String> = status
            .shards
            .iter()
            .map(|s| match s.cpu {
                Some(cpu) => format!("{} on cpu {cpu}: {}", s.shard, s.connections),
                None => format!("{}: {}", s.shard, s.connections),
            })
            .collect();
        out.push_str(&format!("shards (connections) {}\n", shards.join(", ")));
    }
    for target in &status.targets {
        out.push_str(&format!(
            "target {}{}  chap {}  acl {}  {} session(s)\n",
            target.name,
            target
                .alias
                .as_ref()
                .map(|a| format!(" ({a})"))
                .unwrap_or_default(),
            target.chap,
            if target.allowed_initiators.is_empty() {
                "any".to_owned()
            } else {
                target.allowed_initiators.join(",")
            },
            target.sessions
        ));
        for lun in &target.luns {
            let c = &lun.counters;
            out.push_str(&format!(
                "  lun {:<3} {:<40} {} bytes, {} B blocks, used by {:?}\n",
                lun.lun, lun.backstore, lun.size_bytes, lun.block_size, lun.used_by
            ));
            out.push_str(&format!(
                "          commands read {} write {} other {}; bytes read {} written {}; {} CHECK CONDITION(s)\n",
                c.read_commands,
                c.write_commands,
                c.other_commands,
                c.read_bytes,
                c.written_bytes,
                c.check_conditions
            ));
            for snapshot in &lun.snapshots {
                out.push_str(&format!("          snapshot {}\n", show_snapshot(snapshot)));
            }
        }
        for limit in &target.limits {
            let n = &limit.now;
            out.push_str(&format!(
                "  limit on {}: {}\n          now {} IOPS, {} B/s; waiting {}, delayed {}, TASK SET FULL {}, held {:.1} s in all\n",
                limit.applies_to,
                limit.limit,
                n.iops_now,
                n.bytes_per_second_now,
                n.waiting,
                n.delayed,
                n.refused,
                n.held_seconds
            ));
        }
    }
    for s in &status.sessions {
        out.push_str(&format!(
            "session {} {} isid {} -> {} ({}, ERL {}), {} command(s) in flight, LUNs {:?}\n",
            s.tsih,
            s.initiator,
            s.isid,
            s.target.as_deref().unwrap_or("(discovery)"),
            s.session_type,
            s.error_recovery_level,
            s.commands_in_flight,
            s.luns_used
        ));
        for c in &s.connections {
            out.push_str(&format!(
                "  cid {} {} -> {} {} digests {}/{} segments {}/{}{}\n",
                c.cid,
                c.initiator_address,
                c.portal,
                c.transport,
                c.header_digest,
                c.data_digest,
                c.max_send_data_segment_length,
                c.max_recv_data_segment_length,
                c.shard.map(|s| format!(" shard {s}")).unwrap_or_default()
            ));
        }
        let counters: Vec<String> = s.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&format!("  {}\n", counters.join(" ")));
    }
    out
}
