//! A gateway group whose cluster stalls: the only OSD of `scripts/ceph-dev`
//! stopped (SIGSTOP) for 4 s, longer than a gateway's heartbeat may be
//! silent (3 s), then resumed. Every gateway's beats stalled alike, and
//! none is taken for dead: a keeper reads the others' beats only after its
//! own write went through, and the owner's stalled beat, queued at the
//! header object's OSD before that write, lands first. So the owner keeps
//! the LU (no lock broken, nobody blocklisted), and a verified load through
//! our multipath set over both gateways goes on without an error once the
//! OSD is back. (The nemesis stops the OSD too; this pins the reason.)
//! Alone in its file: stopping the cluster's OSD would stall any test
//! beside it. Built only with the cargo feature `ceph-tests`.
#![cfg(feature = "ceph-tests")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::ceph::{Image, conf, group_gateway};
use iscsi_initiator::{Disk, IscsiUrl, Multipath, MultipathConfig, SessionConfig};
use iscsi_test_peers::{free_port, signal_process, stop_process};

const NAME: &str = "iqn.2026-11.rs.iscsi:osd-stall";

fn osd_pid() -> u32 {
    let run = std::path::Path::new(&conf())
        .parent()
        .unwrap()
        .join("run/osd.0.pid");
    std::fs::read_to_string(run)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn an_osd_stall_longer_than_a_heartbeat_moves_no_lu() {
    let image = Image::new("stall", "64M");
    let one = group_gateway(&image, NAME, 1, free_port());
    let two = group_gateway(&image, NAME, 2, free_port());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let url = |port: u16| -> IscsiUrl {
            format!("iscsi://127.0.0.1:{port}/{NAME}/0")
                .parse()
                .unwrap()
        };
        let urls = [url(one.port), url(two.port)];
        let config = MultipathConfig::default();
        let paths = Multipath::connect(&urls, SessionConfig::default(), config).await;
        let paths = Arc::new(paths.unwrap());
        let disk = Disk::over(Arc::clone(&paths)).await.unwrap();
        // Gateway 1 owns the LU before the stall.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !paths.paths()[0].current {
            disk.write(0, &[1u8; 4096], false).await.unwrap();
            assert!(Instant::now() < deadline, "{:?}", paths.paths());
        }
        let osd = osd_pid();
        stop_process(osd);
        tokio::time::sleep(Duration::from_secs(4)).await;
        signal_process(osd, "-CONT");
        // Writes through the stall's end and for two heartbeat periods
        // after it: were a gateway to take the LU, it would be then.
        let until = Instant::now() + Duration::from_secs(7);
        let mut round = 0u8;
        while Instant::now() < until {
            let data = vec![round; 65536];
            let offset = u64::from(round) * 65536;
            disk.write(offset, &data, false).await.unwrap();
            assert!(disk.read(offset, data.len()).await.unwrap() == data);
            round = round.wrapping_add(1);
        }
        let now = paths.paths();
        assert!(now[0].current && now[0].failed.is_none(), "{now:?}");
        paths.logout().await.unwrap();
    });
    let (first, second) = (one.log_so_far(), two.log_so_far());
    for log in [&first, &second] {
        assert!(
            !log.contains("breaking its lock"),
            "a lock was broken:\n{first}\n{second}"
        );
        assert!(!log.contains("was blocklisted"), "{first}\n{second}");
    }
}
