//! The mistakes a new user makes first, and what `iscsi` says to them: a
//! URL naming a LUN that `iscsi target` does not serve (it serves LUN 0),
//! and a portal where nothing listens. Each message must say what is wrong
//! in words, once, and exit with status 1.

mod common;

use common::{iscsi, our_target};

const NAME: &str = "iqn.2026-11.rs.iscsi:first-mistakes";

/// Standard error of a run that must fail.
fn fails(args: &[&str]) -> (String, String) {
    let output = iscsi(args);
    assert_eq!(output.status.code(), Some(1), "iscsi {args:?} did not fail");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// LUN 7 of a target with LUN 0 only: every command says so in words.
/// INQUIRY is answered with peripheral qualifier 3 (no status to show),
/// READ CAPACITY with CHECK CONDITION 25h/00h, and `ls` of a URL that
/// names LUN 7 used to list LUN 0 and succeed.
#[test]
fn a_missing_lun_is_named() {
    let (_target, url0) = our_target(NAME, &[]);
    let url7 = format!("{}/7", url0.strip_suffix("/0").expect("a LUN 0 URL"));
    let headline = "LUN 7: logical unit not supported (the target has LUN 0)";

    let (_, stderr) = fails(&["read", &url7, "--length", "512"]);
    assert!(stderr.contains(headline), "{stderr}");
    assert!(
        stderr.contains("Illegal Request: Logical unit not supported (ASC 0x25, ASCQ 0x00)"),
        "{stderr}"
    );

    let (stdout, stderr) = fails(&["ls", &url7]);
    assert!(stderr.contains(headline), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");

    for json in [&[][..], &["--json"][..]] {
        let mut args = vec!["inquiry", url7.as_str()];
        args.extend_from_slice(json);
        let (stdout, stderr) = fails(&args);
        assert!(stderr.contains(headline), "{stderr}");
        assert!(stderr.contains("peripheral qualifier 3"), "{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
    }

    // LUN 0 is listed alone when named, and the same without a LUN.
    let listed = common::succeeds(&["ls", &url0]);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(listed.contains("disk"), "{listed}");
    let all = common::succeeds(&["ls", url0.trim_end_matches("/0")]);
    assert_eq!(all, listed);
}

/// A refused connection names the OS error once (it was printed twice: the
/// message held its source, and `{:#}` printed the source again).
#[test]
fn a_refused_connection_says_why_once() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let url = format!("iscsi://127.0.0.1:{port}/{NAME}/0");
    let (_, stderr) = fails(&["read", &url, "--length", "512"]);
    assert!(
        stderr.contains(&format!("connecting to 127.0.0.1:{port}")),
        "{stderr}"
    );
    assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
    let (_, stderr) = fails(&["discover", &format!("127.0.0.1:{port}")]);
    assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
}

/// A configuration file that is not there, or not TOML, is said once (the
/// I/O and TOML errors were the message's text and its source both).
#[test]
fn a_bad_configuration_file_says_why_once() {
    let dir = std::env::temp_dir().join(format!("first-mistakes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let missing = dir.join("missing.toml");
    let (_, stderr) = fails(&["target", "--config", missing.to_str().expect("path")]);
    assert!(stderr.contains("No such file or directory"), "{stderr}");
    assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "listen = [\n").expect("write");
    let (_, stderr) = fails(&["target", "--config", broken.to_str().expect("path")]);
    let first_line = stderr
        .lines()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("");
    assert!(first_line.contains("broken.toml"), "{stderr}");
    let said_twice = stderr
        .lines()
        .filter(|line| line.contains("TOML parse error"))
        .count();
    assert!(said_twice <= 1, "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}
