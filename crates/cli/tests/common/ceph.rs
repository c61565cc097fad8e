//! The one-node Ceph cluster the RBD tests run against (`scripts/ceph-dev
//! start`; its conf at /run/iscsi-rs-ceph/ceph.conf, or `ISCSI_CEPH_CONF`),
//! the `rbd` CLI on it, and images made for one test.

use std::process::{Command, Output};

use iscsi_test_peers::Peer;

/// The cluster's conf.
pub fn conf() -> String {
    std::env::var("ISCSI_CEPH_CONF").unwrap_or_else(|_| "/run/iscsi-rs-ceph/ceph.conf".into())
}

/// `rbd -c CONF ARGS...` to completion.
pub fn rbd(args: &[&str]) -> Output {
    Command::new("rbd")
        .arg("-c")
        .arg(conf())
        .args(args)
        .output()
        .expect("the rbd CLI runs (scripts/ceph-dev installs it)")
}

/// An image for one test, `rbd/cli-TAG-PID`, removed on drop; derefs to
/// its `POOL/IMAGE` name.
pub struct Image(String);

impl Image {
    /// Makes it (one left by an earlier run of this process id goes first).
    pub fn new(tag: &str, size: &str) -> Image {
        let name = format!("rbd/cli-{tag}-{}", std::process::id());
        let _ = rbd(&["rm", &name]);
        let out = rbd(&["create", &name, "--size", size]);
        assert!(
            out.status.success(),
            "rbd create (is scripts/ceph-dev running?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Image(name)
    }
}

impl std::ops::Deref for Image {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = rbd(&["rm", &self.0]);
    }
}

/// `iscsi target` as gateway `id` of the group {1, 2} serving `image` as
/// LUN 0 of target `name` on 127.0.0.1:`port`.
pub fn group_gateway(image: &str, name: &str, id: u16, port: u16) -> Peer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command
        .args(["target", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--name", name, "--control", "none"])
        .args([
            "--target-port-id",
            &id.to_string(),
            "--gateway-group",
            "1,2",
        ])
        .arg("--lun")
        .arg(format!("rbd:{image},conf={}", conf()))
        .env("RUST_LOG", "warn");
    Peer::spawn(command, port)
}
