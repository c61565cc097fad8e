//! `iscsi target` against real initiators from Debian packages (installed
//! by scripts/test): libiscsi's iscsi-ls, iscsi-inq, iscsi-readcapacity16
//! and iscsi-perf, and qemu-img writing and reading back random data. The
//! target runs on a free loopback port and is stopped by PID.

use std::process::{Command, Output};

use iscsi_test_peers::{Peer, free_port};

const NAME: &str = "iqn.2026-11.rs.iscsi:peer-test";

/// The target process, killed by PID when dropped.
struct Target {
    peer: Peer,
}

impl Target {
    /// `iscsi target --listen 127.0.0.1:PORT --name NAME EXTRA...`.
    fn start(extra: &[&str]) -> Target {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["--listen", &listen, "--name", NAME];
        args.extend_from_slice(extra);
        Target::spawn(&args, ("127.0.0.1", port))
    }

    /// `iscsi target ARGS...`, waiting until `probe` accepts connections.
    fn spawn(args: &[&str], probe: (&str, u16)) -> Target {
        let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
        command.arg("target").args(args).env("RUST_LOG", "warn");
        Target {
            peer: Peer::spawn_at(command, probe.0, probe.1),
        }
    }

    fn url(&self, lun: u32) -> String {
        format!("iscsi://127.0.0.1:{}/{NAME}/{lun}", self.peer.port)
    }

    /// The target's log so far (it is stopped first).
    fn log(mut self) -> String {
        self.peer.log()
    }
}

fn tool(program: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{program} is missing: run scripts/test, which installs libiscsi-bin, qemu-utils and qemu-block-extra"
    );
    Command::new(program)
}

fn run(mut command: Command) -> Output {
    let output = command.output().expect("tool runs");
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn libiscsi_discovers_inquires_and_reads_capacity() {
    let target = Target::start(&["--lun", "ram:64M", "--lun", "ram:16M"]);
    let mut ls = tool("iscsi-ls");
    ls.args(["-s", &format!("iscsi://127.0.0.1:{}", target.peer.port)]);
    let listing = stdout(&run(ls));
    assert!(listing.contains(NAME), "iscsi-ls: {listing}");
    assert!(listing.contains("Lun:0"), "iscsi-ls: {listing}");
    assert!(listing.contains("Lun:1"), "iscsi-ls: {listing}");

    let mut inq = tool("iscsi-inq");
    inq.arg(target.url(0));
    let inquiry = stdout(&run(inq));
    assert!(inquiry.contains("ISCSI-RS"), "iscsi-inq: {inquiry}");

    let mut capacity = tool("iscsi-readcapacity16");
    capacity.arg(target.url(1));
    let capacity = stdout(&run(capacity));
    assert!(
        capacity.contains("16777216"),
        "iscsi-readcapacity16: {capacity}"
    );
}

#[test]
fn qemu_img_writes_and_reads_back_the_same_bytes() {
    let target = Target::start(&["--lun", "ram:32M"]);
    let dir = std::env::temp_dir().join(format!("iscsi-rs-peer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("source.raw");
    let back = dir.join("back.raw");
    // 8 MiB of pseudo-random data, not block-aligned in content.
    let data = noise(8 << 20, 0x2545_F491_4F6C_DD1D);
    std::fs::write(&source, &data).unwrap();
    let mut write = tool("qemu-img");
    write
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&source)
        .arg(target.url(0));
    run(write);
    let mut read = tool("qemu-img");
    read.args(["convert", "-f", "raw", "-O", "raw"])
        .arg(target.url(0))
        .arg(&back);
    run(read);
    let read_back = std::fs::read(&back).unwrap();
    assert_eq!(read_back.len(), 32 << 20, "the whole LUN comes back");
    assert!(
        read_back[..data.len()] == data[..],
        "the written bytes read back identically"
    );
    assert!(
        read_back[data.len()..].iter().all(|&b| b == 0),
        "the rest is unwritten"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let log = target.log();
    assert!(!log.contains("panicked"), "target log: {log}");
}

#[test]
fn iscsi_perf_reads_under_load_and_the_data_survives() {
    let target = Target::start(&["--lun", "ram:64M"]);
    let mut perf = tool("iscsi-perf");
    perf.args(["-b", "64", "-m", "16", "-t", "2"])
        .arg(target.url(0));
    let output = stdout(&run(perf));
    assert!(output.contains("iops"), "iscsi-perf: {output}");
    // The connection is still usable afterwards.
    let mut inq = tool("iscsi-inq");
    inq.arg(target.url(0));
    run(inq);
}

/// Pseudo-random bytes (xorshift), the same for the same seed.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[test]
fn a_file_lun_over_ipv6_keeps_its_data_across_a_restart() {
    let dir = std::env::temp_dir().join(format!("iscsi-rs-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("lun.img");
    let source = dir.join("source.raw");
    let back = dir.join("back.raw");
    let data = noise(4 << 20, 42);
    std::fs::write(&source, &data).unwrap();
    let port = free_port();
    let listen = format!("[::1]:{port}");
    let lun = format!("file:{},size=16M", image.display());
    let url = format!("iscsi://[::1]:{port}/{NAME}/0");
    let args = ["--listen", &listen, "--name", NAME, "--lun", &lun];
    let target = Target::spawn(&args, ("::1", port));
    let mut write = tool("qemu-img");
    write
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&source)
        .arg(&url);
    run(write);
    let log = target.log();
    assert!(!log.contains("panicked"), "target log: {log}");
    // The file holds the data at once (what a restart will serve).
    let on_disk = std::fs::read(&image).unwrap();
    assert_eq!(on_disk.len(), 16 << 20);
    assert!(
        on_disk[..data.len()] == data[..],
        "the file holds the write"
    );
    // Restarted on the same file: the data is served again.
    let target = Target::spawn(&args, ("::1", port));
    let mut read = tool("qemu-img");
    read.args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&url)
        .arg(&back);
    run(read);
    let read_back = std::fs::read(&back).unwrap();
    assert!(
        read_back[..data.len()] == data[..],
        "read back after restart"
    );
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_config_file_serves_several_targets_with_chap() {
    let dir = std::env::temp_dir().join(format!("iscsi-rs-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        format!(
            r#"
listen = ["127.0.0.1:{port}"]
[[target]]
name = "iqn.2026-11.rs.iscsi:one"
luns = ["ram:8M", "ram:4M"]
[[target]]
name = "iqn.2026-11.rs.iscsi:two"
block_size = 4096
luns = ["file:{},size=8M"]
chap = {{ user = "alice", secret = "secret-of-alice" }}
"#,
            dir.join("two.img").display()
        ),
    )
    .unwrap();
    let config_arg = config.display().to_string();
    let target = Target::spawn(&["--config", &config_arg], ("127.0.0.1", port));
    let mut ls = tool("iscsi-ls");
    ls.arg(format!("iscsi://127.0.0.1:{port}"));
    let listing = stdout(&run(ls));
    assert!(listing.contains("iqn.2026-11.rs.iscsi:one"), "{listing}");
    assert!(listing.contains("iqn.2026-11.rs.iscsi:two"), "{listing}");
    // The second target wants CHAP: without it the login fails, with it
    // the 4096-byte blocks show.
    let mut refused = tool("iscsi-readcapacity16");
    refused.arg(format!(
        "iscsi://127.0.0.1:{port}/iqn.2026-11.rs.iscsi:two/0"
    ));
    assert!(!refused.output().unwrap().status.success());
    let mut capacity = tool("iscsi-readcapacity16");
    capacity.arg(format!(
        "iscsi://alice%secret-of-alice@127.0.0.1:{port}/iqn.2026-11.rs.iscsi:two/0"
    ));
    let capacity = stdout(&run(capacity));
    assert!(capacity.contains("4096"), "{capacity}");
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 3000 targets: the SendTargets answer (about 390 KB) is longer than one
/// PDU even at a 256 KiB MaxRecvDataSegmentLength, so it goes out in parts
/// with the C bit, each fetched with the Target Transfer Tag (RFC 7143
/// 11.10.2, 11.11.1). libiscsi cannot take such an answer ("unsupported
/// flags in text reply"), so our own `iscsi discover` is the client.
#[test]
fn a_long_send_targets_answer_is_continued() {
    let dir = std::env::temp_dir().join(format!("iscsi-rs-many-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let mut config = format!("listen = [\"127.0.0.1:{port}\"]\n");
    for i in 0..3000 {
        config.push_str(&format!(
            "[[target]]\nname = \"iqn.2026-11.rs.iscsi:a-rather-long-target-name-to-fill-pdus-{i:04}\"\nluns = [\"ram:1M\"]\n"
        ));
    }
    let path = dir.join("many.toml");
    std::fs::write(&path, config).unwrap();
    let path_arg = path.display().to_string();
    let target = Target::spawn(&["--config", &path_arg], ("127.0.0.1", port));
    let mut discover = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    discover.args(["discover", &format!("127.0.0.1:{port}")]);
    let listing = stdout(&run(discover));
    for i in [0, 1, 1500, 2998, 2999] {
        let name = format!("a-rather-long-target-name-to-fill-pdus-{i:04}");
        assert!(listing.contains(&name), "{name} missing from:\n{listing}");
    }
    assert_eq!(listing.matches("a-rather-long-target-name").count(), 3000);
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM, what systemd and other service managers send, shuts the
/// target down gracefully (its initiators are asked to log out first) and
/// the process exits with success.
#[test]
fn sigterm_stops_the_target_cleanly() {
    let mut target = Target::start(&["--lun", "ram:8M"]);
    let mut inq = tool("iscsi-inq");
    inq.arg(target.url(0));
    run(inq);
    let status = target
        .peer
        .terminate(std::time::Duration::from_secs(20))
        .expect("the target exits after SIGTERM");
    assert!(status.success(), "exit status {status}");
}
