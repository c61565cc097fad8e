//! [`Multipath`] against our target serving one RAM LU on two portals,
//! one of them reached through a relay the test cuts (connections closed,
//! new ones refused, as a dead gateway's) or hangs (connections kept, no
//! byte moving, as a stopped one's): a write-and-read-back load through a
//! [`Disk`] over both paths sees no error and no wrong byte while its path
//! goes away, and the path is used again once it returns. URLs that reach
//! different LUs are refused.
//!
//! Gateways with ALUA (one active/optimized, one standby, the owner
//! killed) are the Ceph test `crates/cli/tests/gateway_group.rs`.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iscsi_initiator::multipath::alua::{Access, Resend};
use iscsi_initiator::{Disk, Error, IscsiUrl, Multipath, MultipathConfig, SessionConfig};
use iscsi_test_peers::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const TARGET: &str = "iqn.2026-11.rs.iscsi:multipath";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Pass,
    /// Connections closed, new ones closed at once.
    Cut,
    /// Connections kept, nothing forwarded.
    Hang,
}

/// A TCP relay to `to` whose connections the test can cut or hang.
struct Relay {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, modes) = watch::channel(Mode::Pass);
        let connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let held = Arc::clone(&connections);
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if *modes.borrow() == Mode::Cut {
                    continue;
                }
                let Ok(server) = TcpStream::connect(to).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let mut held = held.lock().unwrap();
                for (from, into) in [
                    (Box::new(cr) as Box<_>, Box::new(sw) as Box<_>),
                    (Box::new(sr), Box::new(cw)),
                ] {
                    held.push(tokio::spawn(pump(from, into, modes.clone())).abort_handle());
                }
            }
        });
        Relay {
            addr,
            mode,
            connections,
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
        if mode == Mode::Cut {
            for connection in self.connections.lock().unwrap().drain(..) {
                connection.abort();
            }
        }
    }
}

type Reader = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
type Writer = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// Copies `from` into `into` while the mode is Pass; holds the bytes
/// while it is Hang.
async fn pump(mut from: Reader, mut into: Writer, mut modes: watch::Receiver<Mode>) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let Ok(n) = from.read(&mut buffer).await else {
            return;
        };
        if n == 0 {
            return;
        }
        while *modes.borrow_and_update() != Mode::Pass {
            if modes.changed().await.is_err() {
                return;
            }
        }
        if into.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Our target with LUNs 0 and 1 (RAM, 16 MiB) on two portals.
async fn target() -> (SocketAddr, SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let (one, two) = (free_port(), free_port());
    let text = format!(
        "listen = [\"127.0.0.1:{one}\", \"127.0.0.1:{two}\"]\nnop_in_interval_seconds = 0\n\
         [[target]]\nname = \"{TARGET}\"\n[target.lun]\n0 = \"ram:16M\"\n1 = \"ram:16M\"\n"
    );
    let (_, stop) = common::start_from_toml(&text).await;
    (
        format!("127.0.0.1:{one}").parse().unwrap(),
        format!("127.0.0.1:{two}").parse().unwrap(),
        stop,
    )
}

fn url(addr: SocketAddr, lun: u64) -> IscsiUrl {
    format!("iscsi://{addr}/{TARGET}/{lun}").parse().unwrap()
}

fn quick() -> MultipathConfig {
    MultipathConfig {
        no_path_timeout: Duration::from_secs(20),
        ..MultipathConfig::default()
    }
}

/// Writes and reads back 64 KiB at a time through `disk` until stopped,
/// failing on any error or wrong byte; counts the round trips.
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
                let offset = (round % 128) * 65536;
                let data = common::pattern((round % 251) as u8);
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

    /// Waits until `more` further round trips are done (within 30 s).
    async fn advance(&self, more: u64) {
        let until = self.rounds.load(Ordering::Relaxed) + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.rounds.load(Ordering::Relaxed) < until {
            assert!(!self.task.is_finished(), "the load ended early");
            assert!(Instant::now() < deadline, "the load stalled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap().expect("the load saw no error");
        self.rounds.load(Ordering::Relaxed)
    }
}

/// Waits (10 s at most) until `check` holds of the paths.
async fn until_paths(
    paths: &Multipath,
    what: &str,
    check: impl Fn(&[iscsi_initiator::PathStatus]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = paths.paths();
        if check(&now) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// LU 0 through the relay (in `mode` at the login) and directly, with
/// `config`: the relay, the set, a disk over it, the target's stop.
async fn over_relay_and_direct(
    mode: Mode,
    config: MultipathConfig,
) -> (
    Relay,
    Arc<Multipath>,
    Arc<Disk>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (one, two, stop) = target().await;
    let relay = Relay::start(one).await;
    relay.set(mode);
    let urls = [url(relay.addr, 0), url(two, 0)];
    let connected = Multipath::connect(&urls, SessionConfig::default(), config).await;
    let paths = Arc::new(connected.unwrap());
    let disk = Arc::new(Disk::over(Arc::clone(&paths)).await.unwrap());
    (relay, paths, disk, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_path_moves_io_to_the_other_and_is_used_again_when_it_returns() {
    let (relay, paths, disk, _stop) = over_relay_and_direct(Mode::Pass, quick()).await;
    // Without ALUA every path is active; I/O keeps to the first.
    let status = paths.paths();
    assert!(
        status[0].current && status.iter().all(|p| p.access == Access::Active),
        "{status:?}"
    );
    let load = Load::start(Arc::clone(&disk));
    load.advance(20).await;
    relay.set(Mode::Cut);
    load.advance(50).await;
    let status = paths.paths();
    assert!(
        status[0].failed.is_some() && status[1].current,
        "{status:?}"
    );
    relay.set(Mode::Pass);
    until_paths(&paths, "the cut path returns", |p| p[0].failed.is_none()).await;
    load.advance(20).await;
    // Cut the other one: I/O goes back to the first.
    paths.sessions()[1].drop_connections();
    load.advance(50).await;
    let rounds = load.stop().await;
    assert!(rounds >= 140);
    paths.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_path_is_failed_by_its_ping_and_its_commands_move() {
    let (relay, paths, disk, _stop) = over_relay_and_direct(Mode::Pass, quick()).await;
    let load = Load::start(Arc::clone(&disk));
    load.advance(20).await;
    let hung = Instant::now();
    relay.set(Mode::Hang);
    load.advance(50).await;
    let moved = hung.elapsed();
    // The checker pings every second and waits 2 s for its NOP-In.
    assert!(
        moved < Duration::from_secs(8),
        "the load moved after {moved:?}"
    );
    let status = paths.paths();
    assert!(
        status[0].failed.is_some() && status[1].current,
        "{status:?}"
    );
    relay.set(Mode::Cut);
    relay.set(Mode::Pass);
    until_paths(&paths, "the hung path returns", |p| p[0].failed.is_none()).await;
    load.stop().await;
    eprintln!("a hung path's commands moved {moved:?} after it hung");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_down_at_the_start_joins_once_it_is_up() {
    let (relay, paths, disk, _stop) = over_relay_and_direct(Mode::Cut, quick()).await;
    assert!(paths.paths()[1].current);
    let load = Load::start(disk);
    load.advance(10).await;
    relay.set(Mode::Pass);
    until_paths(&paths, "the late path joins", |p| p[0].failed.is_none()).await;
    assert_eq!(paths.sessions().len(), 2);
    load.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_that_reach_different_lus_are_refused() {
    let (one, two, _stop) = target().await;
    let refused = Multipath::connect(
        &[url(one, 0), url(two, 1)],
        SessionConfig::default(),
        quick(),
    )
    .await
    .err()
    .expect("LUNs 0 and 1 are not one LU");
    assert!(
        matches!(&refused, Error::Config(why) if why.contains("another LU")),
        "{refused}"
    );
    // The same LU through both portals is one.
    let same = Multipath::connect(
        &[url(one, 1), url(two, 1)],
        SessionConfig::default(),
        quick(),
    )
    .await
    .unwrap();
    assert_eq!(same.sessions().len(), 2);
    same.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_path_gone_commands_fail_after_the_no_path_timeout() {
    let config = MultipathConfig {
        no_path_timeout: Duration::from_secs(2),
        ..MultipathConfig::default()
    };
    // Both paths through relays: the target's own stop ends its listeners,
    // not (at once) the connections it serves.
    let (one, two, _stop) = target().await;
    let relays = [Relay::start(one).await, Relay::start(two).await];
    let urls = [url(relays[0].addr, 0), url(relays[1].addr, 0)];
    let connected = Multipath::connect(&urls, SessionConfig::default(), config).await;
    let disk = Disk::over(Arc::new(connected.unwrap())).await.unwrap();
    for relay in &relays {
        relay.set(Mode::Cut);
    }
    let started = Instant::now();
    let error = disk.read(0, 4096).await.expect_err("no path is left");
    let waited = started.elapsed();
    assert!(matches!(error, Error::NoPath { .. }), "{error}");
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
}

/// A fake target whose every port reports active/optimized in REPORT
/// TARGET PORT GROUPS (TPGS 1, one group) and refuses every READ as
/// standby (NOT READY, 04h/0Bh): it contradicts itself.
async fn contradicting_target(listener: TcpListener) {
    use iscsi_datamover::tcp::TcpDatamover;
    use iscsi_datamover::{PduReceiver, PduSender};
    use iscsi_proto::pdu::{DataIn, Header, Pdu, ScsiResponse};
    use iscsi_proto::serial::{DataSn, StatSn};
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut dm = TcpDatamover::new(stream).unwrap();
            let mut stat_sn = StatSn::new(1);
            while let Ok(Some(received)) = dm.receiver.receive().await {
                let command = match received.header.pdu {
                    Pdu::LoginRequest(request) => {
                        let data = &received.data;
                        common::answer_login(&mut dm, &request, data, &mut stat_sn, 32, &[])
                            .await
                            .unwrap();
                        continue;
                    }
                    Pdu::ScsiCommand(command) => command,
                    _ => continue,
                };
                let data: Vec<u8> = match command.cdb {
                    [0x12, 0, ..] => {
                        let mut inquiry = vec![0u8; 36];
                        (inquiry[2], inquiry[4], inquiry[5]) = (6, 31, 0x10);
                        inquiry
                    }
                    [0x12, 1, 0x83, ..] => vec![
                        0, 0x83, 0, 28, 0x01, 0x03, 0, 8, 0x60, 1, 2, 3, 4, 5, 6, 7, 0x51, 0x94, 0,
                        4, 0, 0, 0, 1, 0x51, 0x95, 0, 4, 0, 0, 0, 1,
                    ],
                    [0xA3, ..] => vec![
                        0, 0, 0, 16, 0x10, 10, 0, 0, 0x00, 0x8D, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1,
                    ],
                    _ => Vec::new(),
                };
                let (header, segment) = if command.cdb[0] == 0x28 {
                    let mut sense = vec![0, 18, 0x70, 0, 0x02, 0, 0, 0, 0, 10];
                    sense.extend_from_slice(&[0, 0, 0, 0, 0x04, 0x0B, 0, 0, 0, 0]);
                    let response = ScsiResponse {
                        status: 0x02,
                        initiator_task_tag: command.initiator_task_tag,
                        stat_sn,
                        exp_cmd_sn: command.cmd_sn.next(),
                        max_cmd_sn: command.cmd_sn.wrapping_add(32),
                        ..ScsiResponse::default()
                    };
                    (
                        Header::new(Pdu::ScsiResponse(response), sense.len() as u32),
                        sense,
                    )
                } else {
                    let sent = data
                        .len()
                        .min(command.expected_data_transfer_length as usize);
                    let short = command.expected_data_transfer_length - sent as u32;
                    let data_in = DataIn {
                        final_flag: true,
                        status: Some(0),
                        initiator_task_tag: command.initiator_task_tag,
                        target_transfer_tag: 0xffff_ffff,
                        stat_sn,
                        exp_cmd_sn: command.cmd_sn.next(),
                        max_cmd_sn: command.cmd_sn.wrapping_add(32),
                        data_sn: DataSn::new(0),
                        residual_underflow: short > 0,
                        residual_count: short,
                        ..DataIn::default()
                    };
                    (
                        Header::new(Pdu::DataIn(data_in), sent as u32),
                        data[..sent].to_vec(),
                    )
                };
                stat_sn = stat_sn.next();
                if dm.sender.send_control(&header, &segment).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_whose_states_contradict_its_answers_fails_the_command_in_bounded_time() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(contradicting_target(listener));
    let urls: Vec<IscsiUrl> = (0..2)
        .map(|_| {
            format!("iscsi://{addr}/iqn.2026-11.test:contradicting/0")
                .parse()
                .unwrap()
        })
        .collect();
    let config = MultipathConfig {
        no_path_timeout: Duration::from_secs(2),
        ..MultipathConfig::default()
    };
    let paths = Multipath::connect(&urls, SessionConfig::default(), config)
        .await
        .unwrap();
    let started = Instant::now();
    let read = paths.run(Resend::Idempotent, |s, lun| async move {
        s.read(lun, 0, 512, vec![0; 512]).await
    });
    let error = tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the command must not go from path to path for ever")
        .expect_err("every READ is refused");
    let waited = started.elapsed();
    // Either the last refusal or the wait for a path ends it, whichever
    // finds the bound passed first; both name standby.
    let standby = matches!(&error, Error::Status { sense: Some(s), .. } if (s.key, s.asc, s.ascq) == (2, 4, 0x0B));
    let no_path = matches!(&error, Error::NoPath { paths, .. } if paths.contains("Standby"));
    assert!(standby || no_path, "{error}");
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
}
