//! `iscsi delay-relay`: every byte arrives, in order, both ways; nothing
//! arrives before its delay; and an iSCSI session runs through it.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use iscsi_test_peers::{Peer, free_port};
use rand::RngCore;

fn relay(to: &str, delay: &str) -> Peer {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command.args([
        "delay-relay",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--to",
        to,
        "--delay",
        delay,
    ]);
    Peer::spawn(command, port)
}

/// An echo server on a loopback port: every connection gets its bytes back.
fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            thread::spawn(move || {
                let mut buffer = vec![0u8; 65536];
                loop {
                    match stream.read(&mut buffer) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if stream.write_all(&buffer[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    port
}

#[test]
fn bytes_arrive_whole_in_order_and_no_sooner_than_the_delay() {
    let echo = echo_server();
    let relay = relay(&format!("127.0.0.1:{echo}"), "20ms");
    let mut stream = TcpStream::connect(("127.0.0.1", relay.port)).unwrap();
    stream.set_nodelay(true).unwrap();

    // One byte there and back crosses the relay twice.
    let sent = Instant::now();
    stream.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    stream.read_exact(&mut one).unwrap();
    let round_trip = sent.elapsed();
    assert_eq!(&one, b"x");
    assert!(
        round_trip >= Duration::from_millis(40),
        "a round trip through a 20 ms relay took {round_trip:?}"
    );

    // 8 MiB of random data, written and read concurrently, comes back whole.
    let mut data = vec![0u8; 8 << 20];
    rand::rng().fill_bytes(&mut data);
    let mut writer = stream.try_clone().unwrap();
    let expected = data.clone();
    let sender = thread::spawn(move || writer.write_all(&data).unwrap());
    let mut back = vec![0u8; expected.len()];
    stream.read_exact(&mut back).unwrap();
    sender.join().unwrap();
    assert!(back == expected, "the relay changed the data");
}

#[test]
fn an_iscsi_session_runs_through_the_relay() {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_iscsi"));
    command.args([
        "target",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--lun",
        "ram:64M",
    ]);
    let _target = Peer::spawn(command, port);
    let relay = relay(&format!("127.0.0.1:{port}"), "200us");
    let url = format!(
        "iscsi://127.0.0.1:{}/iqn.2026-11.rs.iscsi:target0/0",
        relay.port
    );
    let output = common::succeeds(&[
        "bench", &url, "--rw", "randread", "--bs", "4k", "--qd", "1", "--time", "0.5", "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&output).unwrap();
    // Each command crosses the relay twice: at least 400 us at QD 1.
    let p50 = report["p50_us"].as_f64().unwrap();
    assert!(
        p50 >= 400.0,
        "median latency {p50} us through a 200 us relay"
    );
    assert!(report["commands"].as_u64().unwrap() > 0);
}

#[test]
fn a_bad_delay_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_iscsi"))
        .args([
            "delay-relay",
            "--listen",
            "127.0.0.1:0",
            "--to",
            "127.0.0.1:1",
            "--delay",
            "5 parsecs",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("bad delay"));
}
