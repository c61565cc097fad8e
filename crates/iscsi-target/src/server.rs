//! Listening on the portals and running one task per connection.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use iscsi_proto::login::chap::ChallengeHistory;
use iscsi_scsi::{ScsiTarget, TargetIdentity, encode_lun};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use iscsi_datamover::{Datamover, DatamoverError};

use crate::config::TargetConfig;
use crate::policy::Policy;
use crate::session::{Registry, Shared, serve_connection};

/// A target bound to its portals, ready to serve.
pub struct Server {
    listeners: Vec<TcpListener>,
    iser_listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
}

impl Server {
    /// Binds every portal of `config`.
    pub async fn bind(config: TargetConfig) -> std::io::Result<Server> {
        let mut listeners = Vec::new();
        for address in &config.listen {
            listeners.push(TcpListener::bind(address).await?);
        }
        let mut iser_listeners = Vec::new();
        for address in &config.iser {
            iser_listeners.push(TcpListener::bind(address).await?);
        }
        let scsi: Vec<(String, Arc<ScsiTarget>)> = config
            .targets
            .iter()
            .map(|target| {
                let identity = TargetIdentity {
                    target_name: target.name.clone(),
                    vendor: "ISCSI-RS".to_owned(),
                    product: "VIRTUAL DISK".to_owned(),
                    revision: "0001".to_owned(),
                };
                (
                    target.name.clone(),
                    Arc::new(ScsiTarget::new(identity, target.luns.clone())),
                )
            })
            .collect();
        let config = Arc::new(config);
        let sessions = Arc::new(Registry::default());
        for (name, target) in &scsi {
            // PERSISTENT RESERVE OUT / PREEMPT AND ABORT (SPC-4 5.12.11.2.6):
            // the preempted nexuses' tasks on that LUN are aborted. Weak:
            // the registry holds sessions, which hold the SCSI target.
            let registry = Arc::downgrade(&sessions);
            let name = name.clone();
            target.set_abort_handler(move |lun, nexuses| {
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                for session in registry.of_target(&name) {
                    if nexuses.contains(&session.nexus.key()) {
                        session.abort_lun(encode_lun(lun));
                    }
                }
            });
        }
        let (shutdown, shutdown_seen) = watch::channel(false);
        let shared = Arc::new(Shared {
            policy: Policy::new(Arc::clone(&config), Arc::clone(&sessions)),
            config,
            scsi,
            challenge_history: Arc::new(Mutex::new(ChallengeHistory::default())),
            sessions,
            shutdown: shutdown_seen,
        });
        Ok(Server {
            listeners,
            iser_listeners,
            shared,
            shutdown,
        })
    }

    /// The addresses the iSER portals are bound to (port 0 becomes a
    /// real port).
    pub fn iser_addrs(&self) -> Vec<SocketAddr> {
        self.iser_listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The addresses the TCP portals are bound to (port 0 becomes a real
    /// port).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serves until `shutdown` completes. Then it stops accepting, asks
    /// every logged-in initiator to log out (Asynchronous Message, RFC 7143
    /// 11.9.1), lets in-flight commands finish, and returns when every
    /// connection has ended (initiators that do not log out are dropped
    /// after a grace period).
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        let mut accepts = JoinSet::new();
        for listener in self.listeners {
            let shared = Arc::clone(&self.shared);
            accepts.spawn(accept_loop(listener, shared, Portal::Tcp));
        }
        for listener in self.iser_listeners {
            let shared = Arc::clone(&self.shared);
            accepts.spawn(accept_loop(listener, shared, Portal::Iser));
        }
        shutdown.await;
        info!("shutting down: asking initiators to log out");
        self.shutdown.send_replace(true);
        while accepts.join_next().await.is_some() {}
        Ok(())
    }
}

/// What a portal speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Portal {
    /// iSCSI over TCP (RFC 7143).
    Tcp,
    /// iSER over iWARP (RFC 7145).
    Iser,
}

/// A TCP connection's datamover, with the configured send buffer.
fn tcp_datamover(stream: TcpStream, shared: &Shared) -> Result<Datamover, DatamoverError> {
    let mut datamover = Datamover::tcp(stream)?;
    if let Some(bytes) = shared.config.send_buffer_bytes {
        datamover.set_send_buffer(bytes)?;
    }
    Ok(datamover)
}

/// Accepts connections on one portal, a task each.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, portal: Portal) {
    let mut connections = JoinSet::new();
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|&down| down) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let shared = Arc::clone(&shared);
                    connections.spawn(async move {
                        let transport = match portal {
                            Portal::Tcp => tcp_datamover(stream, &shared),
                            Portal::Iser => crate::iser::accept(stream, &shared).await,
                        };
                        let served = match transport {
                            Ok(transport) => serve_connection(transport, shared).await,
                            Err(error) => Err(error),
                        };
                        if let Err(error) = served {
                            warn!(%peer, %error, "connection ended");
                        }
                    });
                }
                Err(error) => warn!(%error, "accept failed"),
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    // Connections end by themselves: logout, or the grace period.
    let grace = Duration::from_secs(10);
    if tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        warn!("connections still open after the shutdown grace period: closing them");
        connections.shutdown().await;
    }
}

/// Binds `config` and serves until `shutdown` completes.
pub async fn serve(
    config: TargetConfig,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    Server::bind(config).await?.run_until(shutdown).await
}
