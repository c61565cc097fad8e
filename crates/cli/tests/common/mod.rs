//! What the `iscsi` binary's integration tests share: running the binary,
//! and `iscsi target` on a free loopback port, stopped by PID on drop.
//! (Each test file compiles this module on its own and uses part of it.)
#![allow(dead_code)]

#[cfg(feature = "ceph-tests")]
pub mod ceph;
pub mod control;
#[cfg(feature = "ceph-tests")]
pub mod libiscsi;

use std::process::{Command, Output};

use iscsi_test_peers::{Peer, free_port};

/// Runs `iscsi ARGS...` to completion (RUST_LOG=warn).
pub fn iscsi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("iscsi runs")
}

/// Runs `iscsi ARGS...`, which must succeed; its standard output.
pub fn succeeds(args: &[&str]) -> String {
    let output = iscsi(args);
    assert!(
        output.status.success(),
        "iscsi {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// `iscsi target --listen 127.0.0.1:PORT --name NAME --lun ram:64M EXTRA...`
/// on a free port, known to listen; the URL of its LUN 0.
pub fn our_target(name: &str, extra: &[&str]) -> (Peer, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args([
            "target", "--listen", &listen, "--name", name, "--lun", "ram:64M",
        ])
        .args(extra)
        .env("RUST_LOG", "warn");
    let peer = Peer::spawn(command, port);
    (peer, format!("iscsi://127.0.0.1:{port}/{name}/0"))
}
