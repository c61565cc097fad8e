//! `iscsi target` as a systemd service (packaging/, README "Run it as a
//! service"): the sd_notify messages the `Type=notify-reload` unit relies
//! on, and the example configuration the package installs as
//! /etc/iscsi-rs/target.toml, which must stay valid as the format changes.
//! The service itself, installed from the .deb and run by systemd, is the
//! Linux VM job `service` (tests/linux-vm/jobs/service.sh).

use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use iscsi_target::TargetConfig;
use iscsi_test_peers::free_port;

/// The example configuration of the package.
fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/target.toml")
}

#[test]
fn the_example_configuration_is_valid_and_listens_on_loopback_only() {
    let config = TargetConfig::from_file(&example()).expect("packaging/target.toml parses");
    assert!(!config.listen.is_empty(), "the example names a portal");
    for portal in config.listen.iter().chain(&config.iser) {
        assert!(
            portal.ip().is_loopback(),
            "the example must be safe as installed: {portal} is not a loopback address"
        );
    }
    assert!(!config.targets.is_empty());
    for target in &config.targets {
        assert!(!target.luns.is_empty(), "{} has a LUN", target.name);
    }
}

/// The next notification, as its lines.
fn receive(socket: &UnixDatagram) -> Vec<String> {
    let mut buffer = [0u8; 4096];
    let n = socket
        .recv(&mut buffer)
        .expect("a notification within the timeout");
    String::from_utf8_lossy(&buffer[..n])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A child killed when dropped (a failed assertion must not leave it).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_target_notifies_ready_once_it_listens_and_stopping_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("iscsi-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();

    let port = free_port();
    let mut target = Child(
        Command::new(env!("CARGO_BIN_EXE_iscsi"))
            .args(["target", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--lun", "ram:16M"])
            .env("NOTIFY_SOCKET", &path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("iscsi target starts"),
    );
    // Nothing waited for the port: READY=1 must mean it listens already.
    let ready = receive(&socket);
    assert_eq!(ready[0], "READY=1", "{ready:?}");
    assert!(
        ready.contains(&format!("STATUS=serving 1 target on 127.0.0.1:{port}")),
        "{ready:?}"
    );
    TcpStream::connect(("127.0.0.1", port)).expect("listening when READY=1 was sent");

    let killed = Command::new("kill")
        .args(["-TERM", &target.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let stopping = receive(&socket);
    assert_eq!(stopping[0], "STOPPING=1", "{stopping:?}");
    let status = target.0.wait().unwrap();
    assert!(
        status.success(),
        "the target's exit after SIGTERM: {status}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
