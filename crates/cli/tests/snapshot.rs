//! Snapshots taken while a load writes (issue 49): `iscsi verify` writes
//! at QD 32 with a journal while `iscsi target snapshot` takes a snapshot
//! every second; each snapshot, served as a LUN by a reload, is then read
//! back by `iscsi verify --check --snapshot` against the moment the
//! journal says it was taken (every write answered before it, none issued
//! after it was answered, none without the writes answered before it was
//! issued). For a RAM LUN always; a file LUN on XFS (feature
//! `reflink-tests`, `ISCSI_REFLINK_DIR`); an RBD image (feature
//! `ceph-tests`). QEMU's iSCSI driver reads a snapshot and a clone of it
//! and finds them identical, and cannot write the snapshot.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::control::Running;
use common::iscsi;
use serde_json::Value;

const NAME: &str = "iqn.2026-11.rs.iscsi:snapshots";

fn config(port: u16, luns: &str) -> String {
    common::control::config(NAME, port, luns)
}

/// `iscsi target --config` serving `lun0` as LUN 0, with a control socket.
fn start(test: &str, lun0: &str) -> Running {
    common::control::start(
        &format!("snap-{test}"),
        NAME,
        &format!("0 = \"{lun0}\""),
        &[],
    )
}

fn control(running: &Running, args: &[&str]) -> std::process::Output {
    common::control::control(args, &running.socket)
}

fn url(running: &Running, lun: u16) -> String {
    format!("iscsi://127.0.0.1:{}/{NAME}/{lun}", running.port)
}

/// Appends one line to the journal (opened O_APPEND by the load too).
fn mark(journal: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(journal)
        .unwrap();
    file.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// The load, snapshots every second while it runs, each then served and
/// checked. Returns the reports of the checks.
fn snapshots_under_load(running: &Running, lun0: &str) -> Vec<Value> {
    let journal = running.dir.join("journal");
    let mut load = Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args(["verify", &url(running, 0), "--rw", "write", "--qd", "32"])
        .args(["--bs", "64k", "--region", "32M", "--time", "6", "--json"])
        .arg("--journal")
        .arg(&journal)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut names = Vec::new();
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if load.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the load ran on"
        );
        if !journal.exists() {
            continue;
        }
        let name = format!("s{}", names.len());
        mark(&journal, &format!("S {name}"));
        let out = control(running, &["snapshot", NAME, "0", &name]);
        assert!(
            out.status.success(),
            "snapshot {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        mark(&journal, &format!("T {name}"));
        names.push(name);
    }
    let out = load.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the load: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let load: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(load["commands"].as_u64().unwrap() > 500, "{load}");
    assert_eq!(load["failed_commands"].as_u64(), Some(0), "{load}");
    assert!(names.len() >= 3, "{names:?} taken during the load");

    // Served: one LUN each, by a reload.
    let mut luns = format!("0 = \"{lun0}\"\n");
    for (i, name) in names.iter().enumerate() {
        luns += &format!("{} = \"snapshot:0/{name}\"\n", i + 1);
    }
    std::fs::write(&running.file, config(running.port, &luns)).unwrap();
    let out = control(running, &["reload"]);
    assert!(
        out.status.success(),
        "reload: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let listed = control(running, &["snapshot", NAME, "0"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    for (i, name) in names.iter().enumerate() {
        assert!(
            listed.contains(&format!("served as LUN [{}]", i + 1)),
            "{name}: {listed}"
        );
    }
    (1u16..)
        .zip(&names)
        .map(|(lun, name)| {
            let out = iscsi(&[
                "verify",
                &url(running, lun),
                "--check",
                journal.to_str().unwrap(),
                "--snapshot",
                name,
                "--json",
            ]);
            assert!(
                out.status.success(),
                "snapshot {name} (LUN {lun}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice::<Value>(&out.stdout).unwrap()
        })
        .collect()
}

/// What the checks say together: every snapshot whole, and at least one
/// taken while writes were in flight (else the test proved little).
fn assert_moments(reports: &[Value]) {
    for report in reports {
        assert_eq!(report["slots"].as_u64(), Some(512), "{report}");
        assert_eq!(report["torn_slots"].as_u64(), Some(0), "{report}");
    }
    assert!(
        reports
            .iter()
            .any(|r| r["slots_in_between"].as_u64() > Some(0)),
        "no snapshot caught a write in flight: {reports:?}"
    );
    eprintln!("snapshot checks: {reports:?}");
}

#[test]
fn ram_snapshots_under_load_each_hold_one_moment() {
    let running = start("ram", "ram:64M");
    let reports = snapshots_under_load(&running, "ram:64M");
    assert_moments(&reports);

    // QEMU reads a snapshot and a clone of it through its own driver.
    let luns = "0 = \"ram:64M\"\n1 = \"snapshot:0/s0\"\n2 = \"clone:0/s0\"\n";
    std::fs::write(&running.file, config(running.port, luns)).unwrap();
    let out = control(&running, &["reload", "--force"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let compare = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .args([url(&running, 1), url(&running, 2)])
        .output()
        .expect("qemu-img (scripts/test installs qemu-utils)");
    assert!(
        compare.status.success(),
        "qemu-img compare: {}{}",
        String::from_utf8_lossy(&compare.stdout),
        String::from_utf8_lossy(&compare.stderr)
    );
    let write = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write 0 4k"])
        .arg(url(&running, 1))
        .output()
        .expect("qemu-io");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&write.stdout),
        String::from_utf8_lossy(&write.stderr)
    );
    // QEMU reads the write protection in MODE SENSE and will not open it
    // for writing.
    assert!(
        !write.status.success() && said.contains("write protected"),
        "QEMU wrote to a snapshot: {said}"
    );

    // Refusals in words, nothing changed.
    let twice = control(&running, &["snapshot", NAME, "0", "s0"]);
    assert!(!twice.status.success());
    assert!(String::from_utf8_lossy(&twice.stderr).contains("exists already"));
    let served = control(&running, &["snapshot", NAME, "0", "s0", "--delete"]);
    assert!(String::from_utf8_lossy(&served.stderr).contains("served as LUN 1"));
    let deleted = control(&running, &["snapshot", NAME, "0", "s1", "--delete"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
}

#[cfg(feature = "reflink-tests")]
#[test]
fn file_snapshots_on_xfs_under_load_each_hold_one_moment() {
    let base = std::env::var("ISCSI_REFLINK_DIR")
        .expect("ISCSI_REFLINK_DIR: a folder on XFS or btrfs (scripts/reflink-dir)");
    let dir = std::path::PathBuf::from(base).join(format!("cli-snap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lun0 = format!("file:{}/lun.img,size=64M", dir.display());
    let running = start("file", &lun0);
    let reports = snapshots_under_load(&running, &lun0);
    assert_moments(&reports);
    drop(running);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(feature = "ceph-tests")]
#[test]
fn rbd_snapshots_under_load_each_hold_one_moment() {
    use common::ceph::{Image, conf, rbd};
    let image = Image::new("snap", "64M");
    let lun0 = format!("rbd:{},conf={}", &*image, conf());
    let running = start("rbd", &lun0);
    let reports = snapshots_under_load(&running, &lun0);
    assert_moments(&reports);
    drop(running);

    // A clone served by a gateway of a group joins the group as any rbd:
    // LUN does: REPORT TARGET PORT GROUPS names this gateway's group.
    let clone = format!("{}-clone", &*image);
    let in_group = common::control::start_file(
        "snap-gw",
        |port| {
            format!(
                "listen = [\"127.0.0.1:{port}\"]\nportal_group_tag = 1\ngateway_group = [1, 2]\n\
                 [[target]]\nname = \"{NAME}\"\n[target.lun]\n0 = \"{lun0}\"\n\
                 1 = \"clone:0/s0,to={clone}\"\n"
            )
        },
        &[],
    );
    let groups = report_target_port_groups(&url(&in_group, 1));
    assert!(groups.contains(&(1, 0)), "the clone's groups: {groups:?}");
    drop(in_group);
    let removed = rbd(&["rm", &clone]);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let purge = rbd(&["snap", "purge", &image]);
    assert!(
        purge.status.success(),
        "{}",
        String::from_utf8_lossy(&purge.stderr)
    );
}

/// The (group, state) pairs REPORT TARGET PORT GROUPS answers for the LUN
/// at `url` (asked until the gateway has taken its place in the group).
#[cfg(feature = "ceph-tests")]
fn report_target_port_groups(url: &str) -> Vec<(u16, u8)> {
    use iscsi_initiator::{Command as Scsi, Session, SessionConfig};
    let url: iscsi_initiator::IscsiUrl = url.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let session = Session::connect(&url, SessionConfig::default())
            .await
            .unwrap();
        let rtpg = [0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let r = session
                .execute(Scsi::read(url.lun, &rtpg, vec![0; 1024]))
                .await
                .unwrap();
            let data = &r.data[..r.received as usize];
            let groups: Vec<(u16, u8)> = data
                .get(4..)
                .unwrap_or_default()
                .chunks_exact(12)
                .map(|d| (u16::from_be_bytes([d[2], d[3]]), d[0] & 0x0F))
                .collect();
            if r.status == 0 && groups.contains(&(1, 0)) || Instant::now() > until {
                return groups;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}
