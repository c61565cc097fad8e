//! What `iscsi target status` shows: the running configuration (portals,
//! targets, LUNs with their stores) and every session with its
//! connections, negotiated keys, commands in flight and counters. Plain
//! data, serialised as JSON on the control socket.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::PoisonError;

use serde::{Deserialize, Serialize};

use crate::server::{Portal, ServerHandle};

/// The whole status.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    /// The target's process.
    pub pid: u32,
    /// `--config FILE`, if any.
    pub config_file: Option<String>,
    /// Listening portals.
    pub portals: Vec<PortalStatus>,
    /// Targets.
    pub targets: Vec<TargetStatus>,
    /// Sessions, by TSIH.
    pub sessions: Vec<SessionStatus>,
    /// The runtime shards.
    #[serde(default)]
    pub shards: Vec<ShardStatus>,
}

/// A listening portal.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PortalStatus {
    /// `tcp` or `iser`.
    pub transport: String,
    /// As bound.
    pub address: SocketAddr,
}

/// A target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetStatus {
    /// The iSCSI name.
    pub name: String,
    /// Its alias.
    pub alias: Option<String>,
    /// Initiators allowed (empty: all).
    pub allowed_initiators: Vec<String>,
    /// `none`, `one-way` or `mutual`.
    pub chap: String,
    /// Its LUNs.
    pub luns: Vec<LunStatus>,
    /// Sessions logged in to it.
    pub sessions: usize,
    /// Its QoS limits, with their rates now.
    #[serde(default)]
    pub limits: Vec<LimitStatus>,
}

/// A QoS limit and how it stands.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LimitStatus {
    /// What it applies to.
    pub applies_to: crate::qos::LimitKey,
    /// What it allows.
    pub limit: crate::qos::LimitSpec,
    /// Its rates now and what it held.
    pub now: crate::qos::LimitFigures,
}

/// A LUN.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LunStatus {
    /// The LUN number.
    pub lun: u16,
    /// The store's specification (`ram:1G`, `file:/srv/a.img`...).
    pub backstore: String,
    /// Bytes.
    pub size_bytes: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Sessions that have sent it commands.
    pub used_by: Vec<u16>,
    /// Its counters since it was added, from the same sums as the metrics
    /// endpoint (sessions that ended included).
    #[serde(default)]
    pub counters: LunCounters,
    /// Its snapshots (`iscsi target snapshot`), for a store that takes
    /// them.
    #[serde(default)]
    pub snapshots: Vec<crate::reload::snapshot::SnapshotReport>,
}

/// A LUN's counters (`iscsi_target_lun_*` in the metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LunCounters {
    /// SCSI commands answered: READs (6/10/12/16).
    pub read_commands: u64,
    /// WRITEs and WRITE AND VERIFYs.
    pub write_commands: u64,
    /// Any other command.
    pub other_commands: u64,
    /// Data-In bytes sent.
    pub read_bytes: u64,
    /// Data-Out and immediate data bytes received.
    pub written_bytes: u64,
    /// Commands answered CHECK CONDITION.
    pub check_conditions: u64,
}

/// A session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionStatus {
    /// TSIH.
    pub tsih: u16,
    /// InitiatorName.
    pub initiator: String,
    /// ISID, 12 hex digits.
    pub isid: String,
    /// TargetName (`None`: discovery).
    pub target: Option<String>,
    /// `normal` or `discovery`.
    pub session_type: String,
    /// ErrorRecoveryLevel.
    pub error_recovery_level: u8,
    /// Seconds since the Unix epoch of the leading login.
    pub logged_in_at: u64,
    /// Commands received and not yet answered.
    pub commands_in_flight: usize,
    /// LUNs it has sent commands to.
    pub luns_used: Vec<u16>,
    /// The session-wide keys negotiated by the leading login.
    pub negotiated: BTreeMap<String, String>,
    /// Its connections.
    pub connections: Vec<ConnectionStatus>,
    /// Its counters.
    pub counters: BTreeMap<String, u64>,
}

/// A connection of a session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConnectionStatus {
    /// CID.
    pub cid: u16,
    /// The initiator's address.
    pub initiator_address: SocketAddr,
    /// The portal it reached.
    pub portal: SocketAddr,
    /// `tcp` or `iser`.
    pub transport: String,
    /// HeaderDigest.
    pub header_digest: String,
    /// DataDigest.
    pub data_digest: String,
    /// The largest data segment the target sends.
    pub max_send_data_segment_length: u32,
    /// The largest data segment the target receives.
    pub max_recv_data_segment_length: u32,
    /// The runtime shard (one per core) the connection lives on.
    #[serde(default)]
    pub shard: Option<usize>,
}

/// A runtime shard: a thread and runtime per core that connections live on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardStatus {
    /// Its index.
    pub shard: usize,
    /// The CPU it is pinned to (`None`: not pinned).
    pub cpu: Option<usize>,
    /// The connections living on it.
    pub connections: usize,
}

fn digest(on: bool) -> String {
    if on { "CRC32C" } else { "None" }.to_owned()
}

impl ServerHandle {
    /// The status now.
    pub fn status(&self) -> Status {
        let shared = &self.shared;
        let config = shared.config();
        let sums = shared.metrics.sums_for(&config);
        let sessions = shared.sessions.all();
        let portals = self
            .portals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
            .iter()
            .map(|p| PortalStatus {
                transport: if p.kind == Portal::Iser {
                    "iser"
                } else {
                    "tcp"
                }
                .to_owned(),
                address: p.local,
            })
            .collect();
        let qos = self.shared.qos.load();
        let targets = config
            .targets
            .iter()
            .map(|target| {
                // Each session's LUNs read once, not once per LUN.
                let of_target: Vec<_> = sessions
                    .iter()
                    .filter(|s| s.target_name.as_deref() == Some(target.name.as_str()))
                    .map(|s| (s, s.luns_used.numbers()))
                    .collect();
                TargetStatus {
                    name: target.name.clone(),
                    alias: target.alias.clone(),
                    allowed_initiators: target.allowed_initiators.clone(),
                    chap: match &target.chap {
                        None => "none",
                        Some(c) if c.mutual.is_some() => "mutual",
                        Some(_) => "one-way",
                    }
                    .to_owned(),
                    luns: target
                        .luns
                        .iter()
                        .map(|(&n, lun)| LunStatus {
                            lun: n,
                            backstore: lun.spec.clone(),
                            size_bytes: lun.store.size_bytes(),
                            block_size: lun.store.block_size(),
                            used_by: of_target
                                .iter()
                                .filter(|(_, used)| used.contains(&n))
                                .map(|(s, _)| s.tsih)
                                .collect(),
                            counters: sums
                                .luns
                                .get(&(target.name.clone(), n))
                                .map(|s| LunCounters {
                                    read_commands: s.commands[0],
                                    write_commands: s.commands[1],
                                    other_commands: s.commands[2],
                                    read_bytes: s.read_bytes,
                                    written_bytes: s.written_bytes,
                                    check_conditions: s.check_conditions.iter().sum(),
                                })
                                .unwrap_or_default(),
                            snapshots: lun
                                .store
                                .snapshots()
                                .and_then(|store| {
                                    let specs =
                                        target.luns.iter().map(|(&m, l)| (m, l.spec.as_str()));
                                    crate::reload::snapshot::reports(store, n, specs).ok()
                                })
                                .unwrap_or_default(),
                        })
                        .collect(),
                    sessions: of_target.len(),
                    limits: qos
                        .target(&target.name)
                        .map(|limits| {
                            limits
                                .all()
                                .into_iter()
                                .map(|(key, limit)| LimitStatus {
                                    applies_to: key,
                                    limit: limit.spec(),
                                    now: limit.figures(),
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                }
            })
            .collect();
        let sessions = sessions
            .iter()
            .map(|s| {
                let p = &s.params;
                let negotiated = crate::reload::plan::negotiation_words_of(p);
                SessionStatus {
                    tsih: s.tsih,
                    initiator: s.initiator_name.clone(),
                    isid: s.about().isid,
                    target: s.target_name.clone(),
                    session_type: format!("{:?}", p.session_type).to_lowercase(),
                    error_recovery_level: p.error_recovery_level,
                    logged_in_at: s
                        .since
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                    commands_in_flight: s.commands_in_flight(),
                    luns_used: s.luns_used.numbers(),
                    negotiated,
                    connections: s
                        .connections_about()
                        .into_iter()
                        .map(|c| ConnectionStatus {
                            cid: c.cid,
                            initiator_address: c.peer,
                            portal: c.local,
                            transport: if c.iser { "iser" } else { "tcp" }.to_owned(),
                            header_digest: digest(c.digests.header),
                            data_digest: digest(c.digests.data),
                            max_send_data_segment_length: c.max_send_segment,
                            max_recv_data_segment_length: c.max_recv_segment,
                            shard: c.shard,
                        })
                        .collect(),
                    counters: s
                        .stats
                        .snapshot()
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                }
            })
            .collect();
        Status {
            pid: std::process::id(),
            config_file: shared.config_file.get().map(|p| p.display().to_string()),
            portals,
            targets,
            sessions,
            shards: shared
                .shards
                .cpus()
                .into_iter()
                .zip(shared.shards.loads())
                .enumerate()
                .map(|(shard, (cpu, connections))| ShardStatus {
                    shard,
                    cpu,
                    connections,
                })
                .collect(),
        }
    }
}
