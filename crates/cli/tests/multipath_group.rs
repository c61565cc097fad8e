//! Our initiator's [`Multipath`] across a gateway group of two `iscsi
//! target` processes in front of one RBD image (implicit ALUA, one
//! active/optimized port, one standby), on the one-node cluster of
//! `scripts/ceph-dev`: I/O goes to the owner whatever the order of the
//! URLs, and a verified write-and-read-back load through a [`Disk`] over
//! both paths sees no error and no wrong byte while
//! - the owner is killed (SIGKILL): the survivor takes the LU over and the
//!   load follows it;
//! - the killed gateway is started again: its path returns, standby;
//! - the new owner is stopped (SIGSTOP): its unanswered NOP-Out fails the
//!   path, the other gateway fences it and takes over, the load follows;
//!   resumed, the stopped gateway rejoins standby and its path returns.
//!
//! Prints the time from each fault to the load's next completed round.
//! Built only with the cargo feature `ceph-tests`.
#![cfg(feature = "ceph-tests")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::ceph::{Image, group_gateway};
use iscsi_initiator::multipath::alua::Access;
use iscsi_initiator::{
    Disk, Error, IscsiUrl, Multipath, MultipathConfig, PathStatus, SessionConfig,
};
use iscsi_test_peers::{free_port, signal_process, stop_process};

const NAME: &str = "iqn.2026-11.rs.iscsi:multipath-group";

fn url(port: u16) -> IscsiUrl {
    format!("iscsi://127.0.0.1:{port}/{NAME}/0")
        .parse()
        .unwrap()
}

/// Writes and reads back 64 KiB at a time through `disk` until stopped,
/// failing on any error or wrong byte.
struct Load {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Load {
    fn start(disk: Arc<Disk>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let (flag, count) = (Arc::clone(&stop), Arc::clone(&rounds));
        let task = tokio::spawn(async move {
            let mut round = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let offset = (round % 256) * 65536;
                let data: Vec<u8> = (0..65536u32)
                    .map(|i| (i as u8).wrapping_mul(31) ^ (round % 251) as u8)
                    .collect();
                disk.write(offset, &data, false).await?;
                let back = disk.read(offset, data.len()).await?;
                assert!(back == data, "wrong data at {offset} in round {round}");
                round += 1;
                count.store(round, Ordering::Relaxed);
            }
            Ok(())
        });
        Load { stop, rounds, task }
    }

    /// How long until `more` further rounds are done (60 s at most).
    async fn advance(&self, more: u64) -> Duration {
        let started = Instant::now();
        let until = self.rounds.load(Ordering::Relaxed) + more;
        while self.rounds.load(Ordering::Relaxed) < until {
            assert!(!self.task.is_finished(), "the load ended early");
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the load stalled"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        started.elapsed()
    }

    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap().expect("the load saw no error");
        self.rounds.load(Ordering::Relaxed)
    }
}

/// Waits (30 s at most) until `check` holds of the paths.
async fn until_paths(paths: &Multipath, what: &str, check: impl Fn(&[PathStatus]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = paths.paths();
        if check(&now) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn serves(status: &PathStatus) -> bool {
    status.current && status.access == Access::Optimized && status.failed.is_none()
}

fn standby(status: &PathStatus) -> bool {
    status.access == Access::Standby && status.failed.is_none()
}

#[test]
fn our_multipath_initiator_follows_the_lu_across_gateways() {
    let image = Image::new("mp", "64M");
    let (port_one, port_two) = (free_port(), free_port());
    // Gateway 1 first, so that it owns the LU (the lowest live one).
    let mut one = group_gateway(&image, NAME, 1, port_one);
    let two = group_gateway(&image, NAME, 2, port_two);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // The standby's URL first: the owner is chosen by its state.
        let paths = Arc::new(
            Multipath::connect(
                &[url(port_two), url(port_one)],
                SessionConfig::default(),
                MultipathConfig::default(),
            )
            .await
            .unwrap(),
        );
        let disk = Arc::new(Disk::over(Arc::clone(&paths)).await.unwrap());
        until_paths(&paths, "gateway 1 serves, 2 is standby", |p| {
            serves(&p[1]) && standby(&p[0])
        })
        .await;
        let load = Load::start(Arc::clone(&disk));
        load.advance(20).await;

        // The owner is killed: the survivor takes over.
        let killed = Instant::now();
        signal_process(one.pid(), "-KILL");
        let _ = one.terminate(Duration::from_secs(5));
        load.advance(1).await;
        let after_kill = killed.elapsed();
        load.advance(20).await;
        let now = paths.paths();
        assert!(serves(&now[0]) && now[1].failed.is_some(), "{now:?}");

        // Gateway 1 again, on its port: its path returns, standby.
        one = group_gateway(&image, NAME, 1, port_one);
        until_paths(&paths, "gateway 1's path returns standby", |p| {
            serves(&p[0]) && standby(&p[1])
        })
        .await;
        load.advance(20).await;

        // The new owner stops (its TCP connections stay up): the ping
        // fails its path, gateway 1 fences it and takes over.
        let stopped = Instant::now();
        stop_process(two.pid());
        load.advance(1).await;
        let after_stop = stopped.elapsed();
        load.advance(20).await;
        let now = paths.paths();
        assert!(serves(&now[1]) && now[0].failed.is_some(), "{now:?}");
        signal_process(two.pid(), "-CONT");
        until_paths(&paths, "gateway 2 rejoins standby", |p| {
            serves(&p[1]) && standby(&p[0])
        })
        .await;
        load.advance(20).await;
        let rounds = load.stop().await;
        println!(
            "our multipath over a gateway group: {rounds} verified rounds; from SIGKILL of the \
             owner to the next completed round {after_kill:?}; from SIGSTOP {after_stop:?}"
        );
        assert!(after_kill < Duration::from_secs(10) && after_stop < Duration::from_secs(15));
        paths.logout().await.unwrap();
    });
    let log = two.log_so_far();
    assert!(log.contains("rejoined with a new client"), "{log}");
    drop(one);
}
