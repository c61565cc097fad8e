//! A gateway's heartbeat as a peer reads it from the image header's xattr
//! (`iscsi_ceph::heartbeat_port`): written by another gateway, or by
//! anything with write access to the pool. Any bytes are either no port or
//! a port that a heartbeat naming it gives back; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(port) = iscsi_ceph::heartbeat_port(data) {
        let again = format!("1 {port}");
        assert_eq!(iscsi_ceph::heartbeat_port(again.as_bytes()), Some(port));
    }
});
