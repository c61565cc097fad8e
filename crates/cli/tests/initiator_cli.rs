//! Every initiator subcommand of `iscsi` against tgtd (Debian package
//! `tgt`) and against `iscsi target` (over TCP and over iSER), plus a cross-check with QEMU's
//! libiscsi client: data written with our CLI is read back by `qemu-img
//! convert` from the same iscsi:// URL and compared. A missing peer is a
//! failure that names the package (scripts/test installs them all).

use std::io::Write;
use std::process::{Command, Output};

use iscsi_test_peers::{Tgtd, free_port, have};

const TGT_NAME: &str = "iqn.2026-11.test:cli-tgt";
const OUR_NAME: &str = "iqn.2026-11.rs.iscsi:cli-test";

/// A target to run the CLI against, stopped by PID on drop.
enum Peer {
    Tgtd(Tgtd),
    Ours(iscsi_test_peers::Peer),
    /// `iscsi target` with an iSER portal: the subcommands use iser://.
    /// (The process is held to be stopped on drop.)
    OursIser {
        _target: iscsi_test_peers::Peer,
        iser: u16,
    },
}

impl Peer {
    fn tgtd(size: u64) -> Peer {
        Peer::Tgtd(Tgtd::start(TGT_NAME, size))
    }

    fn ours() -> Peer {
        Peer::Ours(Self::spawn_ours(&[]))
    }

    /// Ours with an iSER portal beside its TCP one (waited for on the TCP
    /// port: a probe connection to the iSER port would be an MPA error).
    fn ours_iser() -> Peer {
        let iser = free_port();
        Peer::OursIser {
            _target: Self::spawn_ours(&["--iser", &format!("127.0.0.1:{iser}")]),
            iser,
        }
    }

    /// `iscsi target` on a free TCP port with a 64 MiB RAM LUN and `extra`.
    fn spawn_ours(extra: &[&str]) -> iscsi_test_peers::Peer {
        let port = free_port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
        command
            .args([
                "target",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--name",
                OUR_NAME,
                "--lun",
                "ram:64M",
            ])
            .args(extra)
            .env("RUST_LOG", "warn");
        iscsi_test_peers::Peer::spawn(command, port)
    }

    /// What `iscsi discover` is given.
    fn portal(&self) -> String {
        match self {
            Peer::OursIser { iser, .. } => format!("iser://127.0.0.1:{iser}"),
            _ => format!("127.0.0.1:{}", self.port()),
        }
    }

    fn port(&self) -> u16 {
        match self {
            Peer::Tgtd(tgtd) => tgtd.port(),
            Peer::Ours(ours) => ours.port,
            Peer::OursIser { iser, .. } => *iser,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Peer::Tgtd(_) => TGT_NAME,
            Peer::Ours(_) | Peer::OursIser { .. } => OUR_NAME,
        }
    }

    fn url(&self) -> String {
        match self {
            Peer::Tgtd(tgtd) => tgtd.url(),
            Peer::Ours(ours) => format!("iscsi://127.0.0.1:{}/{OUR_NAME}/0", ours.port),
            Peer::OursIser { iser, .. } => format!("iser://127.0.0.1:{iser}/{OUR_NAME}/0"),
        }
    }
}

fn iscsi(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("iscsi runs");
    assert!(
        output.status.success(),
        "iscsi {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn random_file(dir: &std::path::Path, name: &str, len: usize) -> (String, Vec<u8>) {
    let data: Vec<u8> = (0..len).map(|_| rand::random()).collect();
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    (path.to_string_lossy().into_owned(), data)
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("iscsi-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every subcommand against one peer.
fn every_subcommand(peer: &Peer, tag: &str) {
    let dir = temp_dir(tag);
    let url = peer.url();
    let portal = peer.portal();

    let out = iscsi(&["discover", &portal]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(peer.name()));

    let out = iscsi(&["ls", &url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("disk"), "{text}");

    let out = iscsi(&["inquiry", &url, "--json"]);
    let inquiry: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inquiry["device_type"], 0);

    let out = iscsi(&["capacity", &url, "--json"]);
    let capacity: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(capacity["bytes"], 64 << 20);

    // write + read at an unaligned offset, through files and stdout.
    let (input, data) = random_file(&dir, "in.bin", 3 << 20 | 123);
    iscsi(&["write", &url, "--input", &input, "--offset", "1000"]);
    let output = dir.join("out.bin").to_string_lossy().into_owned();
    let length = data.len().to_string();
    iscsi(&[
        "read", &url, "--offset", "1000", "--length", &length, "--output", &output,
    ]);
    assert!(
        std::fs::read(&output).unwrap() == data,
        "read differs from write"
    );
    let out = iscsi(&["read", &url, "--offset", "1000", "--length", "4096"]);
    assert!(out.stdout == data[..4096]);
    // Smaller commands (--chunk), the same bytes.
    let out = iscsi(&[
        "read", &url, "--offset", "1000", "--length", "300000", "--chunk", "64k",
    ]);
    assert!(out.stdout == data[..300_000]);

    // copy file -> LUN -> file.
    let (source, data) = random_file(&dir, "copy-src.bin", 5 << 20);
    iscsi(&["copy", "--quiet", &source, &url]);
    let back = dir.join("copy-back.bin").to_string_lossy().into_owned();
    iscsi(&["copy", "--quiet", &url, &back]);
    let copied = std::fs::read(&back).unwrap();
    assert_eq!(copied.len(), 64 << 20);
    assert!(copied[..data.len()] == data[..], "copy differs");

    // bench, every mode.
    for rw in ["read", "write", "randread", "randwrite"] {
        let out = iscsi(&[
            "bench", &url, "--rw", rw, "--bs", "64k", "--qd", "4", "--time", "0.5", "--json",
        ]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in ["mib_per_s", "iops", "p50_us", "p99_us"] {
            assert!(
                report[key].as_f64().is_some_and(|v| v > 0.0),
                "{rw}: {key} in {report}"
            );
        }
    }

    // script with set, repeat and verification.
    let script = dir.join("test.script");
    std::fs::write(
        &script,
        format!(
            "set MaxBurstLength=65536\nlogin {url}\nwrite 0 16 0x5a\nrepeat 3\n  read 0 16 0x5a\nend\ninquiry\ncapacity\ntur\nsync\nping\nlogout\n"
        ),
    )
    .unwrap();
    let log = dir.join("script.log");
    iscsi(&[
        "script",
        &script.to_string_lossy(),
        "--log",
        &log.to_string_lossy(),
    ]);
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        log.lines().filter(|l| l.starts_with("run ")).count(),
        3,
        "{log}"
    );

    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_against_tgtd() {
    let peer = Peer::tgtd(64 << 20);
    every_subcommand(&peer, "tgtd");
}

#[test]
fn cli_against_our_target() {
    let peer = Peer::ours();
    every_subcommand(&peer, "ours");
}

/// Every subcommand over iSER (iser:// URLs, discovery over iSER).
#[test]
fn cli_against_our_target_over_iser() {
    let peer = Peer::ours_iser();
    every_subcommand(&peer, "ours-iser");
}

/// Written with our CLI, read with QEMU's libiscsi client.
#[test]
fn cross_check_with_qemu_img() {
    assert!(
        have("qemu-img"),
        "qemu-img missing (qemu-utils + qemu-block-extra): run scripts/test, which installs them"
    );
    let peer = Peer::tgtd(16 << 20);
    let dir = temp_dir("qemu");
    let (input, data) = random_file(&dir, "in.bin", 16 << 20);
    iscsi(&["write", &peer.url(), "--input", &input]);
    let out = dir.join("qemu.raw");
    let status = Command::new("qemu-img")
        .args([
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &peer.url(),
            &out.to_string_lossy(),
        ])
        .status()
        .expect("qemu-img runs");
    assert!(status.success());
    assert!(
        std::fs::read(&out).unwrap() == data,
        "qemu-img reads other data"
    );
    // And the reverse: qemu-img writes, we read.
    let (source, data) = random_file(&dir, "q-in.bin", 16 << 20);
    let status = Command::new("qemu-img")
        .args([
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            &source,
            &peer.url(),
        ])
        .status()
        .expect("qemu-img runs");
    assert!(status.success());
    let back = dir.join("back.bin").to_string_lossy().into_owned();
    iscsi(&["read", &peer.url(), "--output", &back]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "we read other data than qemu-img wrote"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
