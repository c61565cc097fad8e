//! `iscsi delay-relay`: a TCP relay that holds every byte for a fixed time
//! in each direction, so that a loopback or veth link gets the round-trip
//! time of a real network.
//!
//! Why: the parameter studies (Shastry, Klotz and Russell's eq. 3, the
//! MaxOutstandingR2T needed for full throughput) are about the
//! bandwidth-delay product, which loopback does not have; and the host
//! kernel here has no `sch_netem` to add delay. A veth pair with `tc tbf`
//! gives the rate (scripts/shaped-link), this relay the delay.
//!
//! Each direction of each connection is a reader thread that stamps every
//! chunk it reads with its release time and a writer thread that sleeps
//! until then and writes it: data keeps its order, spacing and size, and
//! the relay adds the delay once, not once per chunk. Memory is bounded by
//! `MAX_QUEUED_CHUNKS` reads per direction: a receiver that stops reading
//! stops the relay reading from the sender, so TCP's flow control still
//! reaches the sender. Plain threads and sleeps rather than tokio, whose
//! timers have millisecond granularity; with the timer slack set to 1 ns
//! (Linux lets a sleep end up to 50 us late by default), a sleep here
//! wakes within a few tens of microseconds of its time.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Reads queued per direction before the reader waits for the writer.
const MAX_QUEUED_CHUNKS: usize = 256;

/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

/// Options of `iscsi delay-relay`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to accept connections on, e.g. 127.0.0.1:3261.
    #[arg(long)]
    listen: String,
    /// Address to relay each connection to.
    #[arg(long)]
    to: String,
    /// Delay added in each direction (the round trip grows by twice
    /// this): e.g. 250us, 0.5ms, 1s; a bare number is microseconds.
    #[arg(long, default_value = "0us")]
    delay: String,
}

/// Parses `250us`, `0.5ms`, `1s` or a bare number of microseconds.
pub fn parse_delay(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => text.split_at(at),
        None => (text, "us"),
    };
    let value: f64 = number
        .trim()
        .parse()
        .with_context(|| format!("bad delay {text:?}: want e.g. 250us, 0.5ms or 1s"))?;
    let seconds = match unit {
        "us" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        other => bail!("bad delay unit {other:?} in {text:?}: use us, ms or s"),
    };
    if !(0.0..=60.0).contains(&seconds) {
        bail!("delay {text:?} must be between 0 and 60 s");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Runs the relay until the process is stopped.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let delay = parse_delay(&args.delay)?;
    // Inherited by every thread spawned from here on.
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_timerslack(1).context("setting the timer slack")?;
    let upstream: SocketAddr = args
        .to
        .to_socket_addrs()
        .with_context(|| format!("resolving {}", args.to))?
        .next()
        .with_context(|| format!("{} resolves to no address", args.to))?;
    let listener =
        TcpListener::bind(&args.listen).with_context(|| format!("listening on {}", args.listen))?;
    eprintln!(
        "delay-relay: {} -> {upstream}, {} us each way",
        listener.local_addr()?,
        delay.as_micros()
    );
    for accepted in listener.incoming() {
        let client = match accepted {
            Ok(client) => client,
            Err(error) => {
                eprintln!("delay-relay: accept: {error}");
                continue;
            }
        };
        thread::spawn(move || {
            if let Err(error) = relay(client, upstream, delay) {
                eprintln!("delay-relay: {error:#}");
            }
        });
    }
    Ok(())
}

/// Relays one connection both ways until both directions end.
fn relay(client: TcpStream, upstream: SocketAddr, delay: Duration) -> anyhow::Result<()> {
    let peer = client.peer_addr()?;
    let server =
        TcpStream::connect(upstream).with_context(|| format!("connecting to {upstream}"))?;
    for stream in [&client, &server] {
        stream.set_nodelay(true)?;
    }
    let directions = [
        (client.try_clone()?, server.try_clone()?),
        (server.try_clone()?, client.try_clone()?),
    ];
    let handles: Vec<_> = directions
        .into_iter()
        .map(|(from, to)| thread::spawn(move || one_way(from, to, delay)))
        .collect();
    for handle in handles {
        let _ = handle.join();
    }
    eprintln!("delay-relay: connection from {peer} closed");
    Ok(())
}

/// Copies `from` to `to`, each chunk released `delay` after it was read.
/// At end of stream (or an error) on either side, both sockets are shut
/// down in this direction, and the whole connection on an error.
fn one_way(from: TcpStream, to: TcpStream, delay: Duration) {
    let (queue, queued) = sync_channel::<(Instant, Vec<u8>)>(MAX_QUEUED_CHUNKS);
    let writer = {
        let to = to.try_clone();
        thread::spawn(move || match to {
            Ok(to) => write_released(queued, to),
            Err(_) => false,
        })
    };
    let read_ok = read_stamped(&from, queue, delay);
    let write_ok = writer.join().unwrap_or(false);
    if read_ok && write_ok {
        let _ = to.shutdown(Shutdown::Write);
    } else {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    }
}

/// Reads chunks and queues each with its release time. True at a clean
/// end of stream.
fn read_stamped(
    mut from: &TcpStream,
    queue: SyncSender<(Instant, Vec<u8>)>,
    delay: Duration,
) -> bool {
    loop {
        let mut chunk = vec![0u8; CHUNK];
        match from.read(&mut chunk) {
            Ok(0) => return true,
            Ok(n) => {
                chunk.truncate(n);
                if queue.send((Instant::now() + delay, chunk)).is_err() {
                    return false;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Writes each queued chunk once its release time has come. True when the
/// queue ended with everything written.
fn write_released(queued: Receiver<(Instant, Vec<u8>)>, mut to: TcpStream) -> bool {
    for (release, chunk) in queued {
        let now = Instant::now();
        if release > now {
            thread::sleep(release - now);
        }
        if to.write_all(&chunk).is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_parse_in_every_unit() {
        assert_eq!(parse_delay("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_delay("0.5ms").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_delay("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_delay("100").unwrap(), Duration::from_micros(100));
        assert!(parse_delay("5 parsecs").is_err());
        assert!(parse_delay("-1ms").is_err());
        assert!(parse_delay("ms").is_err());
    }
}
