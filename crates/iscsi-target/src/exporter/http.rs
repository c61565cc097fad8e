//! The metrics endpoint: `GET /metrics` over HTTP/1.x, answered in the
//! OpenMetrics text format, then the connection closes.
//!
//! Hand-rolled rather than hyper: one route, no keep-alive, no body, so a
//! request is a bounded head (at most [`MAX_HEAD`] bytes, within
//! [`READ_TIMEOUT`]) of which only the request line is looked at: a
//! method and a path split on spaces. Nothing is parsed beyond that, so
//! there is nothing to fuzz; anything else gets a 4xx and the connection
//! closes. At most [`MAX_SCRAPES`] are answered at once (others are
//! closed unanswered), and none ever takes a lock the data path takes:
//! the scrape reads relaxed atomics and the session registry.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::server::ServerHandle;

/// The most a request head may take.
pub const MAX_HEAD: usize = 8 * 1024;
/// How long a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Scrapes answered at once.
pub const MAX_SCRAPES: usize = 4;
/// What the body is (the format `prometheus_client::encoding::text` writes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A running metrics endpoint.
pub struct MetricsEndpoint {
    /// The address bound (port 0 becomes a real port).
    pub local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsEndpoint {
    /// Stops answering.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl ServerHandle {
    /// Serves the target's metrics on `address` until stopped; `per_session`
    /// adds series labelled by initiator and TSIH (`--metrics-sessions`).
    pub async fn serve_metrics(
        &self,
        address: SocketAddr,
        per_session: bool,
    ) -> std::io::Result<MetricsEndpoint> {
        let listener = TcpListener::bind(address).await.map_err(|error| {
            std::io::Error::new(error.kind(), format!("binding {address}: {error}"))
        })?;
        let local = listener.local_addr()?;
        self.shared
            .metrics
            .per_session
            .store(per_session, Ordering::Relaxed);
        let registry = Arc::new(super::collect::registry(Arc::clone(&self.shared)));
        info!(%local, "metrics endpoint listening");
        let task = tokio::spawn(accept(listener, registry));
        Ok(MetricsEndpoint { local, task })
    }

    /// The metrics as the endpoint serves them (OpenMetrics text).
    pub fn metrics_text(&self) -> String {
        encode(&super::collect::registry(Arc::clone(&self.shared)))
    }
}

fn encode(registry: &prometheus_client::registry::Registry) -> String {
    let mut body = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut body, registry) {
        warn!(%error, "metrics encoding failed");
    }
    body
}

async fn accept(listener: TcpListener, registry: Arc<prometheus_client::registry::Registry>) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            debug!(%peer, "metrics: too many scrapes at once, connection closed");
            continue;
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(error) = answer(stream, &registry).await {
                debug!(%peer, %error, "metrics: scrape failed");
            }
        });
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics { head_only: bool },
    NotFound,
    WrongMethod,
    Bad,
}

/// Reads the request line of `head` (the bytes before the first CR or
/// LF): `GET /metrics` (or HEAD; a query string is ignored).
fn asked(head: &[u8]) -> Asked {
    let line = head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Asked::Bad;
    };
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Asked::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Asked::Bad;
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Asked::WrongMethod,
    };
    match target.split('?').next() {
        Some("/metrics") => Asked::Metrics { head_only },
        _ => Asked::NotFound,
    }
}

/// Whether `head` holds a whole request head (an empty line ends it).
fn complete(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

async fn answer(
    mut stream: TcpStream,
    registry: &prometheus_client::registry::Registry,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        while !complete(&head) {
            if head.len() >= MAX_HEAD {
                return Ok(false);
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&chunk[..n.min(MAX_HEAD - head.len())]);
        }
        Ok::<_, std::io::Error>(true)
    })
    .await;
    let (status, body, head_only) = match read {
        Err(_elapsed) => return Ok(()),
        Ok(Err(error)) => return Err(error),
        Ok(Ok(false)) => ("431 Request Header Fields Too Large", String::new(), false),
        Ok(Ok(true)) => match asked(&head) {
            Asked::Metrics { head_only } => ("200 OK", encode(registry), head_only),
            Asked::NotFound => (
                "404 Not Found",
                "not found: try /metrics\n".to_owned(),
                false,
            ),
            Asked::WrongMethod => ("405 Method Not Allowed", String::new(), false),
            Asked::Bad => ("400 Bad Request", String::new(), false),
        },
    };
    let content_type = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics_is_served() {
        assert_eq!(
            asked(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Asked::Metrics { head_only: false }
        );
        assert_eq!(
            asked(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Asked::Metrics { head_only: true }
        );
        assert_eq!(asked(b"GET / HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(asked(b"POST /metrics HTTP/1.1\r\n\r\n"), Asked::WrongMethod);
        assert_eq!(asked(b"GET /metrics\r\n\r\n"), Asked::Bad);
        assert_eq!(asked(b"GET  /metrics HTTP/1.1\r\n\r\n"), Asked::Bad);
        assert_eq!(asked(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n"), Asked::Bad);
        assert!(complete(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(!complete(b"GET / HTTP/1.1\r\n"));
    }
}
