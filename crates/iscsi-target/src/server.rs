//! Listening on the portals and running one task per connection; the
//! handle through which a running target is reloaded, inspected and told to
//! end sessions.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use iscsi_proto::login::chap::ChallengeHistory;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use iscsi_datamover::{Datamover, DatamoverError};

use crate::config::TargetConfig;
use crate::policy::Policy;
use crate::registry::Registry;
use crate::serve::serve_connection;
use crate::shards::Shards;
use crate::shared::{Shared, Targets, scsi_target};

/// A target bound to its portals, ready to serve.
pub struct Server {
    shared: Arc<Shared>,
    portals: Arc<Mutex<Portals>>,
    shutdown: watch::Sender<bool>,
}

/// What a portal speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Portal {
    /// iSCSI over TCP (RFC 7143).
    Tcp,
    /// iSER over iWARP (RFC 7145).
    Iser,
}

/// A portal that listens.
pub(crate) struct RunningPortal {
    pub kind: Portal,
    /// As configured (a reload compares these).
    pub configured: SocketAddr,
    /// As bound (port 0 becomes a real port).
    pub local: SocketAddr,
    /// `true` stops its accepting; its connections go on.
    stop: watch::Sender<bool>,
}

/// The portals of a running target: bound, not yet accepting (before
/// [`Server::run_until`]), then each with its accept loop.
#[derive(Default)]
pub(crate) struct Portals {
    pub running: Vec<RunningPortal>,
    /// Bound before the server runs; started by `run_until`.
    waiting: Vec<(TcpListener, Portal, watch::Receiver<bool>)>,
    /// The accept loops (each waits for its connections).
    tasks: JoinSet<()>,
    /// Serving has started: new portals start accepting at once.
    started: bool,
    /// Shutdown has begun: no portal may be added.
    pub closed: bool,
}

impl Portals {
    /// Adds a bound portal: accepting at once if the server runs.
    pub fn add(
        &mut self,
        shared: &Arc<Shared>,
        listener: TcpListener,
        kind: Portal,
        configured: SocketAddr,
    ) -> std::io::Result<()> {
        let local = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        self.running.push(RunningPortal {
            kind,
            configured,
            local,
            stop,
        });
        if self.started {
            self.tasks
                .spawn(accept_loop(listener, Arc::clone(shared), kind, stopped));
        } else {
            self.waiting.push((listener, kind, stopped));
        }
        Ok(())
    }

    /// Stops accepting on the portal configured as `configured`.
    pub fn remove(&mut self, kind: Portal, configured: SocketAddr) {
        self.running.retain(|p| {
            let gone = p.kind == kind && p.configured == configured;
            if gone {
                p.stop.send_replace(true);
            }
            !gone
        });
    }
}

/// Binds `addresses`, all or none.
pub(crate) async fn bind_all(addresses: &[SocketAddr]) -> std::io::Result<Vec<TcpListener>> {
    let mut listeners = Vec::new();
    for address in addresses {
        let listener = TcpListener::bind(address).await.map_err(|error| {
            std::io::Error::new(error.kind(), format!("binding {address}: {error}"))
        })?;
        listeners.push(listener);
    }
    Ok(listeners)
}

impl Server {
    /// Binds every portal of `config`.
    pub async fn bind(config: TargetConfig) -> std::io::Result<Server> {
        let tcp = bind_all(&config.listen).await?;
        let iser = bind_all(&config.iser).await?;
        let sessions = Arc::new(Registry::default());
        let targets: Targets = config
            .targets
            .iter()
            .map(|target| {
                let core = scsi_target(target, config.naa_company_id, &sessions);
                (target.name.clone(), core)
            })
            .collect();
        let portals: Vec<(TcpListener, Portal, SocketAddr)> = tcp
            .into_iter()
            .zip(&config.listen)
            .map(|(l, &a)| (l, Portal::Tcp, a))
            .chain(
                iser.into_iter()
                    .zip(&config.iser)
                    .map(|(l, &a)| (l, Portal::Iser, a)),
            )
            .collect();
        let shards = Shards::start(config.cores.unwrap_or_else(crate::shards::default_count))?;
        info!(shards = shards.len(), cpus = ?shards.cpus(), "connections spread over runtime shards");
        let qos = crate::shared::qos_table(&config, &crate::qos::QosTable::default());
        let config = Arc::new(ArcSwap::from_pointee(config));
        let (shutdown, shutdown_seen) = watch::channel(false);
        let shared = Arc::new(Shared {
            policy: Policy::new(Arc::clone(&config), Arc::clone(&sessions)),
            config,
            targets: ArcSwap::from_pointee(targets),
            challenge_history: Arc::new(Mutex::new(ChallengeHistory::default())),
            sessions,
            shutdown: shutdown_seen,
            reloading: tokio::sync::Mutex::new(()),
            config_file: std::sync::OnceLock::new(),
            metrics: Arc::default(),
            shards,
            qos: ArcSwap::from_pointee(qos),
        });
        let mut running = Portals::default();
        for (listener, kind, configured) in portals {
            running.add(&shared, listener, kind, configured)?;
        }
        Ok(Server {
            shared,
            portals: Arc::new(Mutex::new(running)),
            shutdown,
        })
    }

    /// The file a reload re-reads: `iscsi target --config FILE`. Without
    /// one, a reload is refused ("no configuration file").
    pub fn set_config_file(&self, path: PathBuf) {
        let _ = self.shared.config_file.set(path);
    }

    /// A handle for reloading, status and logouts while the server runs.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            shared: Arc::clone(&self.shared),
            portals: Arc::clone(&self.portals),
        }
    }

    /// The addresses the iSER portals are bound to (port 0 becomes a
    /// real port).
    pub fn iser_addrs(&self) -> Vec<SocketAddr> {
        self.handle().portal_addrs(Portal::Iser)
    }

    /// The addresses the TCP portals are bound to (port 0 becomes a real
    /// port).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.handle().portal_addrs(Portal::Tcp)
    }

    /// Serves until `shutdown` completes. Then it stops accepting, asks
    /// every logged-in initiator to log out (Asynchronous Message, RFC 7143
    /// 11.9.1), lets in-flight commands finish, and returns when every
    /// connection has ended (initiators that do not log out are dropped
    /// after a grace period).
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        {
            let mut portals = self.portals.lock().unwrap_or_else(PoisonError::into_inner);
            portals.started = true;
            for (listener, kind, stopped) in std::mem::take(&mut portals.waiting) {
                portals.tasks.spawn(accept_loop(
                    listener,
                    Arc::clone(&self.shared),
                    kind,
                    stopped,
                ));
            }
        }
        shutdown.await;
        info!("shutting down: asking initiators to log out");
        // A reload running now finishes first; none starts after.
        let _no_reload = self.shared.reloading.lock().await;
        let mut accepts = {
            let mut portals = self.portals.lock().unwrap_or_else(PoisonError::into_inner);
            portals.closed = true;
            std::mem::take(&mut portals.tasks)
        };
        self.shutdown.send_replace(true);
        while accepts.join_next().await.is_some() {}
        // Every connection has ended: what is left on the shards (an ERL 2
        // session's Time2Retain wait) ends with them.
        self.shared.shards.stop();
        Ok(())
    }
}

/// A running target's controls: reload, status, ending sessions. Cloned
/// freely (the control socket and the SIGHUP handler each hold one).
#[derive(Clone)]
pub struct ServerHandle {
    pub(crate) shared: Arc<Shared>,
    /// The listening portals and their accept loops.
    pub(crate) portals: Arc<Mutex<Portals>>,
}

impl ServerHandle {
    /// The bound addresses of the portals of one kind.
    pub(crate) fn portal_addrs(&self, kind: Portal) -> Vec<SocketAddr> {
        self.portals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.local)
            .collect()
    }

    /// Asks session `tsih` to log out (as at shutdown: an Asynchronous
    /// Message, then the connection is dropped after the grace period if
    /// the initiator does not). Returns the session's initiator name.
    pub fn logout(&self, tsih: u16) -> Option<String> {
        let session = self.shared.sessions.get(tsih)?;
        info!(tsih, initiator = %session.initiator_name, "logout asked by the operator");
        session.ask_logout();
        Some(session.initiator_name.clone())
    }
}

/// A TCP connection's datamover, with the configured send buffer.
fn tcp_datamover(stream: TcpStream, shared: &Shared) -> Result<Datamover, DatamoverError> {
    let mut datamover = Datamover::tcp(stream)?;
    if let Some(bytes) = shared.config().send_buffer_bytes {
        datamover.set_send_buffer(bytes)?;
    }
    Ok(datamover)
}

/// Accepts connections on one portal, a task each, until the target shuts
/// down or a reload removes the portal (`stop`); either way it returns
/// when its connections have ended (at shutdown, after a grace period).
async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    portal: Portal,
    mut stop: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    let mut shutdown = shared.shutdown.clone();
    let mut listener = Some(listener);
    loop {
        if listener.is_none() && connections.is_empty() {
            return;
        }
        tokio::select! {
            _ = shutdown.wait_for(|&down| down) => break,
            _ = stop.wait_for(|&stop| stop), if listener.is_some() => {
                if let Some(l) = listener.take() {
                    info!(portal = ?l.local_addr().ok(), "portal removed: no new connections");
                }
            }
            accepted = async {
                match listener.as_ref() {
                    Some(l) => l.accept().await,
                    None => std::future::pending().await,
                }
            }, if listener.is_some() => match accepted {
                Ok((stream, peer)) => {
                    // The socket moves to the connection's shard: it is
                    // registered with that runtime's driver there.
                    let stream = match stream.into_std() {
                        Ok(stream) => stream,
                        Err(error) => {
                            warn!(%peer, %error, "accepted connection lost");
                            continue;
                        }
                    };
                    let task_shared = Arc::clone(&shared);
                    shared.shards.spawn(&mut connections, async move {
                        let shared = task_shared;
                        let stream = match TcpStream::from_std(stream) {
                            Ok(stream) => stream,
                            Err(error) => {
                                warn!(%peer, %error, "connection ended");
                                return;
                            }
                        };
                        let transport = match portal {
                            Portal::Tcp => tcp_datamover(stream, &shared),
                            Portal::Iser => crate::iser::accept(stream, shared.config().command_window).await,
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
