//! An `rbd:` LUN on a machine without librbd: every binary has the RBD
//! backstore and loads librbd.so.1 when the first `rbd:` LUN opens, so
//! where it is missing `iscsi target` at start, `iscsi target check` and a
//! live reload each refuse in words ("librbd.so.1 not found: install
//! librbd1") with status 1, no panic, and a running target serves on.
//! No Ceph needed: `ISCSI_LIBRBD` points the loader at a file that does not
//! exist, which the loader treats as a missing librbd (the same words as
//! with the real soname missing).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use iscsi_test_peers::{Peer, free_port};

const NAME: &str = "iqn.2026-11.rs.iscsi:no-librbd";

/// What the loader is pointed at: absent on every machine.
const ABSENT: &str = "/nonexistent/iscsi-rs/librbd.so.1";

/// The refusal's words.
const REFUSAL: &str = "librbd.so.1 not found: install librbd1";

/// `iscsi ARGS...` with librbd made absent; killed if it runs past 60 s
/// (a target that served the LUN after all).
fn without_librbd(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("ISCSI_LIBRBD", ABSENT)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iscsi runs");
    let started = Instant::now();
    while child.try_wait().expect("waiting for iscsi").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("iscsi {args:?} still runs after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("iscsi's output")
}

/// Asserts that `out` is a refusal in words: status 1, the sentence on
/// standard error, no panic.
fn refused(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(stderr.contains(REFUSAL), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    stderr
}

fn config(port: u16, luns: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\n[[target]]\nname = \"{NAME}\"\n[target.lun]\n{luns}\n"
    )
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(test: &str) -> Dir {
    let dir =
        std::env::temp_dir().join(format!("iscsi-rs-no-librbd-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Dir(dir)
}

#[test]
fn target_start_refuses_an_rbd_lun_in_words() {
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let out = without_librbd(&[
        "target",
        "--listen",
        &listen,
        "--name",
        NAME,
        "--control",
        "none",
        "--lun",
        "rbd:rbd/img,conf=/nonexistent/ceph.conf",
    ]);
    let stderr = refused(&out, "iscsi target --lun rbd:");
    assert!(stderr.contains("rbd:rbd/img"), "{stderr}");
}

#[test]
fn check_and_reload_refuse_an_rbd_lun_in_words() {
    let dir = dir("reload");
    let port = free_port();
    let file = dir.0.join("target.toml");
    let socket = dir.0.join("control.sock");
    let with_rbd = config(port, "0 = \"ram:8M\"\n1 = \"rbd:rbd/img\"");

    // check, with no target running: the file parses, librbd does not load.
    let next = dir.0.join("next.toml");
    std::fs::write(&next, &with_rbd).unwrap();
    let absent_socket = dir.0.join("absent.sock");
    let out = without_librbd(&[
        "target",
        "check",
        next.to_str().unwrap(),
        "--control",
        absent_socket.to_str().unwrap(),
    ]);
    let stderr = refused(&out, "iscsi target check");
    assert!(
        stderr.contains("line 6") && stderr.contains("LUN 1 \"rbd:rbd/img\""),
        "{stderr}"
    );

    // A target serving a RAM LUN, its process without librbd too.
    std::fs::write(&file, config(port, "0 = \"ram:8M\"")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["target", "--config"])
        .arg(&file)
        .arg("--control")
        .arg(&socket)
        .env("RUST_LOG", "info")
        .env("ISCSI_LIBRBD", ABSENT);
    let mut target = Peer::spawn(command, port);

    // check against it, and the reload the file then asks for: refused,
    // nothing changed, the target serves on.
    let out = without_librbd(&[
        "target",
        "check",
        next.to_str().unwrap(),
        "--control",
        socket.to_str().unwrap(),
    ]);
    refused(&out, "iscsi target check, a target running");
    std::fs::write(&file, &with_rbd).unwrap();
    let out = without_librbd(&["target", "reload", "--control", socket.to_str().unwrap()]);
    let stderr = refused(&out, "iscsi target reload");
    assert!(stderr.contains("nothing changed"), "{stderr}");
    let status = luns(&socket);
    assert_eq!(status, [0], "the reload changed nothing");
    let log = target.log_so_far();
    assert!(!log.contains("panicked"), "{log}");
    target.terminate(Duration::from_secs(15));
}

/// The LUN numbers the target at `socket` serves.
fn luns(socket: &Path) -> Vec<u64> {
    let out = common::iscsi(&[
        "target",
        "status",
        "--json",
        "--control",
        socket.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status is JSON");
    status["targets"][0]["luns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lun"].as_u64().unwrap())
        .collect()
}
