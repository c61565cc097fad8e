//! `iscsi target --config FILE --control SOCKET` in a folder of its own,
//! and its control socket driven through `iscsi target ...`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use iscsi_test_peers::{Peer, free_port};

/// A target serving a configuration file, stopped and its folder removed
/// on drop.
pub struct Running {
    pub peer: Peer,
    pub dir: PathBuf,
    /// The configuration file.
    pub file: PathBuf,
    pub socket: PathBuf,
    pub port: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.peer.terminate(Duration::from_secs(15));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A file with one portal on `port` and one target `name` with `luns`
/// (`N = "SPEC"` lines).
pub fn config(name: &str, port: u16, luns: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\n[[target]]\nname = \"{name}\"\n[target.lun]\n{luns}\n"
    )
}

/// Starts target `name` serving `luns` (see [`config`]) in a folder named
/// after `test`, with `extra` arguments for `iscsi target`.
pub fn start(test: &str, name: &str, luns: &str, extra: &[&str]) -> Running {
    start_file(test, |port| config(name, port, luns), extra)
}

/// [`start`] with the whole file `file_for(port)`.
pub fn start_file(test: &str, file_for: impl Fn(u16) -> String, extra: &[&str]) -> Running {
    let dir = std::env::temp_dir().join(format!("iscsi-rs-control-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let file = dir.join("target.toml");
    std::fs::write(&file, file_for(port)).unwrap();
    let socket = dir.join("control.sock");
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["target", "--config"])
        .arg(&file)
        .arg("--control")
        .arg(&socket)
        .args(extra)
        .env("RUST_LOG", "info");
    let peer = Peer::spawn(command, port);
    Running {
        peer,
        dir,
        file,
        socket,
        port,
    }
}

/// `iscsi target ARGS... --control SOCKET` to completion.
pub fn control(args: &[&str], socket: &Path) -> Output {
    let mut all = vec!["target"];
    all.extend_from_slice(args);
    all.push("--control");
    all.push(socket.to_str().unwrap());
    super::iscsi(&all)
}
