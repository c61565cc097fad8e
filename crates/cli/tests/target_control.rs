//! `iscsi target --config FILE` operated from outside (issue 34): the
//! control socket's status, `check` printing the difference, SIGHUP and
//! `iscsi target reload` applying a changed file, a file with a mistake
//! refused whole with its line while the target serves on unchanged, and
//! the socket refusing a user other than the target's.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::control::{Running, control};
use iscsi_test_peers::free_port;
use serde_json::Value;

const NAME: &str = "iqn.2026-11.rs.iscsi:control";

fn config(port: u16, luns: &str) -> String {
    common::control::config(NAME, port, luns)
}

fn start(test: &str) -> Running {
    start_with(test, &[])
}

/// [`start`] with more arguments for `iscsi target`.
fn start_with(test: &str, extra: &[&str]) -> Running {
    common::control::start(test, NAME, "0 = \"ram:8M\"", extra)
}

fn status(socket: &Path) -> Value {
    let out = control(&["status", "--json"], socket);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status is JSON")
}

fn lun_numbers(status: &Value) -> Vec<u64> {
    status["targets"][0]["luns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lun"].as_u64().unwrap())
        .collect()
}

/// Waits until `check` holds of the status (a SIGHUP is applied
/// asynchronously).
fn wait_for(socket: &Path, check: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let now = status(socket);
        if check(&now) {
            return now;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("status never changed: {}", status(socket));
}

#[test]
fn status_check_and_reloads_by_signal_and_command() {
    let t = start("reload");
    let first = status(&t.socket);
    assert_eq!(
        first["config_file"].as_str().map(Path::new),
        Some(t.file.as_path())
    );
    assert_eq!(
        first["portals"][0]["address"],
        format!("127.0.0.1:{}", t.port)
    );
    assert_eq!(lun_numbers(&first), [0]);
    assert_eq!(first["targets"][0]["luns"][0]["backstore"], "ram:8M");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&t.socket).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let text = String::from_utf8(control(&["status"], &t.socket).stdout).unwrap();
    assert!(
        text.contains(&format!("target {NAME}")) && text.contains("lun 0"),
        "{text}"
    );

    // check: valid, and the difference against the running target.
    let next = t.dir.join("next.toml");
    std::fs::write(&next, config(t.port, "0 = \"ram:8M\"\n4 = \"ram:2M\"")).unwrap();
    let out = control(&["check", next.to_str().unwrap()], &t.socket);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("+ target {NAME} LUN 4: ram:2M")),
        "{said}"
    );
    assert_eq!(
        lun_numbers(&status(&t.socket)),
        [0],
        "check applied nothing"
    );

    // SIGHUP applies the file.
    std::fs::copy(&next, &t.file).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &t.peer.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    wait_for(&t.socket, |s| lun_numbers(s) == [0, 4]);

    // A mistake on line 5 is refused whole, by signal and by command;
    // what runs stays.
    std::fs::write(
        &t.file,
        config(t.port, "0 = \"ram:8M\"\n4 = \"ram:2M\"\n5 = \"tape:1G\""),
    )
    .unwrap();
    let out = control(&["reload"], &t.socket);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("line 7") && said.contains("unknown backstore \"tape\""),
        "{said}"
    );
    assert!(said.contains("nothing changed"), "{said}");
    let out = control(&["check", t.file.to_str().unwrap()], &t.socket);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 7"));
    Command::new("kill")
        .args(["-HUP", &t.peer.pid().to_string()])
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(lun_numbers(&status(&t.socket)), [0, 4]);
    assert!(
        t.peer
            .log_so_far()
            .contains("the file is refused, nothing changed")
    );

    // The command applies a good file and says what changed.
    std::fs::write(&t.file, config(t.port, "4 = \"ram:2M\"")).unwrap();
    let out = control(&["reload"], &t.socket);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains(&format!("- target {NAME} LUN 0")), "{said}");
    assert_eq!(lun_numbers(&status(&t.socket)), [4]);

    // Logout of a session that does not exist is an error in words.
    let out = control(&["logout", "999"], &t.socket);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session with TSIH 999"));
}

/// The socket answers its owner only: another user is refused even when
/// the file's mode would let it connect (root only: it needs setpriv to
/// become another user).
#[test]
fn the_control_socket_refuses_anyone_but_its_owner() {
    if !rustix_is_root() || !iscsi_test_peers::have("setpriv") {
        eprintln!("skipped: needs root and setpriv to act as another user");
        return;
    }
    let t = start("owner");
    // As the file is (0600), another user cannot even connect.
    let other = |socket: &Path| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                env!("CARGO_BIN_EXE_iscsi"),
            ])
            .args(["target", "status", "--control"])
            .arg(socket)
            .output()
            .unwrap()
    };
    // The directory must be passable for the other user to reach it.
    std::fs::set_permissions(&t.dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = other(&t.socket);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
    // Opened up by mistake: the peer's uid is still checked.
    std::fs::set_permissions(
        &t.socket,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let out = other(&t.socket);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("only the target's owner"), "{said}");
    assert!(
        status(&t.socket)["targets"].is_array(),
        "the owner is still answered"
    );
}

fn rustix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// READ CAPACITY (16) of LUN `lun` as libiscsi's `iscsi-readcapacity16`
/// prints it.
fn libiscsi_capacity(port: u16, lun: u32) -> String {
    let out = Command::new("iscsi-readcapacity16")
        .arg(format!("iscsi://127.0.0.1:{port}/{NAME}/{lun}"))
        .output()
        .expect("iscsi-readcapacity16 (libiscsi-bin, which scripts/test installs)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 49: a LUN grown from the command line and a file LUN grown by
/// editing the file and reloading, as another initiator (libiscsi) reads
/// them; a shrink refused without force, a check that shows what the file
/// would do to a LUN resized by hand.
#[test]
fn luns_grow_by_command_and_by_reload_as_libiscsi_sees() {
    let t = start("resize");
    assert!(libiscsi_capacity(t.port, 0).contains("8388608"));
    let out = control(&["resize", NAME, "0", "64M"], &t.socket);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("8388608 -> 67108864 bytes"), "{said}");
    assert!(
        said.contains("note: the configuration names this LUN"),
        "{said}"
    );
    assert!(libiscsi_capacity(t.port, 0).contains("67108864"));
    assert_eq!(
        status(&t.socket)["targets"][0]["luns"][0]["size_bytes"],
        67108864
    );

    // Shrinking needs force; the file (8M) would shrink it, and check says
    // so before anything is applied.
    let out = control(&["resize", NAME, "0", "32M"], &t.socket);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    let out = control(&["check", t.file.to_str().unwrap()], &t.socket);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("shrinks from 67108864 to 8388608 bytes in place [shrinks]"),
        "{said}"
    );

    // A file LUN added, then grown in the file and reloaded.
    let image = t.dir.join("lun1.img");
    let with_file = |size: &str| {
        config(
            t.port,
            &format!(
                "0 = \"ram:64M\"\n1 = \"file:{},size={size}\"",
                image.display()
            ),
        )
    };
    std::fs::write(&t.file, with_file("4M")).unwrap();
    assert!(control(&["reload"], &t.socket).status.success());
    assert!(libiscsi_capacity(t.port, 1).contains("4194304"));
    std::fs::write(&t.file, with_file("12M")).unwrap();
    let out = control(&["reload"], &t.socket);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("grows from 4194304 to 12582912 bytes in place"),
        "{said}"
    );
    assert!(libiscsi_capacity(t.port, 1).contains("12582912"));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 12582912);
}

/// Issue 49: a LUN limit set by reload holds libiscsi's `iscsi-perf` at
/// QD 64 to it (the whole run's average: the bucket lets at most its
/// burst through beyond the rate, so the average cannot pass 2000 + 200 /
/// 4 s), with nothing refused; `status` shows the limit at work.
#[test]
fn a_lun_limit_holds_libiscsi_to_it() {
    let metrics = free_port();
    let t = start_with("qos", &["--metrics", &format!("127.0.0.1:{metrics}")]);
    std::fs::write(
        &t.file,
        config(
            t.port,
            "0 = \"ram:64M\"\n[[target.limit]]\nlun = 0\niops = 2000",
        ),
    )
    .unwrap();
    let out = control(&["reload"], &t.socket);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("+ target") && said.contains("limit on LUN 0: 2000 IOPS"),
        "{said}"
    );
    let out = Command::new("iscsi-perf")
        .args(["-b", "8", "-m", "64", "-t", "4"])
        .arg(format!("iscsi://127.0.0.1:{}/{NAME}/0", t.port))
        .output()
        .expect("iscsi-perf (libiscsi-bin, which scripts/test installs)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let average: u64 = text
        .rsplit("iops average ")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no average in {text}"));
    assert!(
        (1600..=2060).contains(&average),
        "iscsi-perf averaged {average} IOPS: {text}"
    );
    let limit = &status(&t.socket)["targets"][0]["limits"][0];
    assert_eq!(limit["applies_to"]["lun"], 0);
    assert!(limit["now"]["delayed"].as_u64().unwrap() > 0, "{limit}");
    assert_eq!(limit["now"]["refused"], 0, "{limit}");
    let text = String::from_utf8(control(&["status"], &t.socket).stdout).unwrap();
    assert!(
        text.contains("limit on LUN 0: 2000 IOPS (burst 200), queue 256"),
        "{text}"
    );
    let scrape = scrape(metrics);
    let series = format!("{{target=\"{NAME}\",limit=\"lun:0\"}}");
    for family in [
        "iscsi_target_qos_waiting_commands",
        "iscsi_target_qos_delayed_commands_total",
        "iscsi_target_qos_task_set_full_total",
        "iscsi_target_qos_held_seconds_total",
    ] {
        assert!(
            scrape.contains(&format!("{family}{series} ")),
            "{family}: {scrape}"
        );
    }
    assert!(scrape.contains(&format!("iscsi_target_qos_task_set_full_total{series} 0\n")));
}

/// `GET /metrics` from the target's endpoint on `port`: the body.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the metrics port");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}
