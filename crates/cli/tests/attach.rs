//! `iscsi attach` and `iscsi detach` without a ublk driver: what the user
//! reads. The host this runs on has no ublk_drv (CI's kernel is built
//! without it), so this is the path every run takes there; where
//! /dev/ublk-control exists, the Linux-VM job `ublk-attach` is the real
//! test and this one checks that attach gets past the check (to the
//! login, which fails on a portal where nothing listens).

mod common;

use std::path::Path;

use common::iscsi;

/// Both commands name the missing control device and the module to load,
/// before any login (the URL's portal is never contacted), and exit 1.
#[test]
fn without_ublk_attach_and_detach_say_to_load_the_module() {
    let port = iscsi_test_peers::free_port();
    let url = format!("iscsi://127.0.0.1:{port}/iqn.2026-11.rs.iscsi:attach/0");
    for args in [
        vec!["attach", url.as_str(), "--timeout", "2"],
        vec!["detach", "/dev/ublkb0"],
    ] {
        let output = iscsi(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "iscsi {args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "iscsi {args:?} printed a device");
        let missing = "/dev/ublk-control is missing: load the ublk_drv module (Linux 6.5+)";
        if Path::new("/dev/ublk-control").exists() {
            assert!(!stderr.contains(missing), "{stderr}");
        } else {
            assert!(stderr.contains(missing), "iscsi {args:?}: {stderr}");
        }
    }
}
