//! Test peers: tgtd on a free loopback port with a /dev/shm file LUN, and
//! our own target in-process. Everything started here is stopped by PID
//! (or dropped) when the guard goes away.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The tgtd target name.
pub const TGT_NAME: &str = "iqn.2026-11.test:initiator-tgt";

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Whether `program` is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A running tgtd, killed (SIGKILL, by PID) and its LUN file removed on drop.
pub struct Tgtd {
    child: Child,
    /// The portal port.
    pub port: u16,
    lun_file: String,
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.lun_file);
    }
}

impl Tgtd {
    /// Starts tgtd with one file LUN (LUN 1) of `size` bytes; panics if
    /// tgtd is not installed (scripts/test installs it).
    pub fn start(size: u64) -> Tgtd {
        assert!(
            have("tgtd") && have("tgtadm"),
            "tgtd/tgtadm are missing (Debian package tgt): run scripts/test, which installs it"
        );
        let port = free_port();
        let control = port % 10_000 + 20_000;
        let lun_file = format!("/dev/shm/iscsi-initiator-test-{port}.img");
        let file = std::fs::File::create(&lun_file).expect("LUN file");
        file.set_len(size).expect("LUN size");
        let child = Command::new("tgtd")
            .args([
                "-f",
                "--iscsi",
                &format!("portal=127.0.0.1:{port}"),
                "-C",
                &control.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tgtd starts");
        let tgtd = Tgtd {
            child,
            port,
            lun_file,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tgtd did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        let c = control.to_string();
        let admin = |args: &[&str]| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let status = Command::new("tgtadm")
                    .args(["-C", &c, "--lld", "iscsi"])
                    .args(args)
                    .status()
                    .expect("tgtadm runs");
                if status.success() {
                    return;
                }
                assert!(Instant::now() < deadline, "tgtadm {args:?} failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        admin(&[
            "--op", "new", "--mode", "target", "--tid", "1", "-T", TGT_NAME,
        ]);
        admin(&[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            &tgtd.lun_file,
        ]);
        admin(&[
            "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ]);
        tgtd
    }

    /// The URL of the disk (LUN 1).
    pub fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{TGT_NAME}/1", self.port)
    }

    /// The LUN file's path.
    pub fn lun_file(&self) -> &str {
        &self.lun_file
    }
}
