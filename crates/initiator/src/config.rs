//! What a session is opened with: the initiator's name and ISID, every
//! operational key it offers (RFC 7143 section 13, through
//! [`NegotiationConfig`]), CHAP (section 12.1.3), the timeouts that keep a
//! silent target from hanging a caller, the ERL 0 recovery budget
//! (section 7.1.4.1: reinstate and retry) and the number of connections
//! with their scheduling policy (MC/S, section 4.1 and 13.2).

use std::sync::Arc;
use std::time::Duration;

use iscsi_datamover::tap::WireTap;

use iscsi_proto::login::chap::{ChapAlgorithm, Credentials};
use iscsi_proto::login::initiator::InitiatorChapSettings;
use iscsi_proto::text::{Digest, NegotiationConfig, TextPair};

use crate::error::Error;
use crate::url::IscsiUrl;

/// The initiator name used when none is configured.
pub const DEFAULT_INITIATOR_NAME: &str = "iqn.2026-11.rs.iscsi:initiator";

/// How commands are spread over the connections of a session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scheduling {
    /// Each command goes to the next connection in turn.
    #[default]
    RoundRobin,
    /// Every command for a LUN goes to the same connection (LUN modulo the
    /// number of connections).
    LunAffinity,
}

/// CHAP credentials (RFC 7143 section 12.1.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChapConfig {
    /// Our CHAP name.
    pub user: String,
    /// Our secret.
    pub secret: Vec<u8>,
    /// For mutual CHAP: the name and secret the target must prove.
    pub target: Option<(String, Vec<u8>)>,
}

impl ChapConfig {
    pub(crate) fn to_settings(&self) -> InitiatorChapSettings {
        InitiatorChapSettings {
            algorithms: ChapAlgorithm::ALL.to_vec(),
            credentials: Credentials::new(self.user.clone(), self.secret.clone()),
            target: self
                .target
                .as_ref()
                .map(|(name, secret)| Credentials::new(name.clone(), secret.clone())),
        }
    }
}

/// Limits on waiting, so that a silent target yields an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect.
    pub connect: Duration,
    /// The whole login phase of one connection.
    pub login: Duration,
    /// One SCSI command, from submission (including the wait for the
    /// command window) to its status.
    pub command: Duration,
    /// A task management function, a NOP-Out ping, a text exchange or a
    /// logout.
    pub management: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            login: Duration::from_secs(15),
            command: Duration::from_secs(30),
            management: Duration::from_secs(10),
        }
    }
}

/// Everything a session is opened with.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// InitiatorName (RFC 7143 section 13.5.1).
    pub initiator_name: String,
    /// InitiatorAlias (section 13.6), if any.
    pub initiator_alias: Option<String>,
    /// The ISID bytes (section 11.12.5); random (type 0b10) when `None`.
    pub isid: Option<[u8; 6]>,
    /// Every operational key we offer.
    pub negotiation: NegotiationConfig,
    /// CHAP, if the target requires it.
    pub chap: Option<ChapConfig>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Connections to open (MC/S); at most what MaxConnections allows.
    pub connections: u16,
    /// How commands are spread over connections.
    pub scheduling: Scheduling,
    /// How many times a command interrupted by a lost connection is
    /// retried after the session is reinstated (0: never).
    pub command_retries: u32,
    /// How many logins to try when reinstating a lost session.
    pub reconnect_attempts: u32,
    /// When set, a lost session (or, at ERL 2, connection) is reinstated
    /// for up to this long instead of `reconnect_attempts` times: commands
    /// wait meanwhile and fail only when it has passed (open-iscsi's
    /// `replacement_timeout`). What a disk needs (`iscsi mount`), where a
    /// target that restarts must not be an I/O error. Setting
    /// `ReplacementTimeout` in seconds.
    pub replacement_timeout: Option<Duration>,
    /// Holding new commands back while the target is busy, so that
    /// several leave in one write.
    pub coalescing: Coalescing,
    /// TCP_NODELAY on the session's sockets: `true` (the default) sends
    /// every PDU at once; `false` lets Nagle's algorithm hold small writes
    /// until earlier data is acknowledged (a setting the parameter studies
    /// compare: setting `TcpNoDelay=No`).
    pub tcp_nodelay: bool,
    /// Over iSER: ask for the MPA CRC32C on every FPDU (`true`, the
    /// default; used if either side asks). Setting `MpaCrc=No` leaves the
    /// choice to the target.
    pub iser_crc: bool,
    /// Over iSER: the largest ULPDU (DDP segment) this side sends, when the
    /// path's segments are smaller than the local socket's MSS says (a
    /// proxy or NAT in between; RFC 5044 section 8 wants each FPDU in one
    /// segment). `MpaMaxUlpdu=1446` fits Ethernet's 1460-byte MSS. `None`:
    /// from the socket's MSS.
    pub iser_max_ulpdu: Option<usize>,
    /// The largest data segment we send (immediate data, Data-Out), below
    /// the target's MaxRecvDataSegmentLength: RFC 7143 section 13.12 lets
    /// a sender use any size up to the receiver's declaration. `None`: the
    /// target's declaration. open-iscsi calls this MaxXmitDataSegmentLength;
    /// parameter studies use it to vary Data-Outs per command while the
    /// target stays as it is (setting `MaxXmitDataSegmentLength`).
    pub max_xmit_data_segment_length: Option<u32>,
    /// Told of every PDU of the session's connections (and of discovery's),
    /// e.g. a trace writer. Each session also counts its PDUs itself
    /// ([`crate::Session::wire_counts`]).
    pub tap: Option<Arc<dyn WireTap>>,
}

/// Command coalescing: while at least `min_in_flight` commands are at the
/// target of a connection (sent, status not back yet), a new command may
/// wait until `commands` are ready to go and leave with them in one write
/// (one system call and one TCP segment instead of one each, on both
/// ends). Below `min_in_flight` every command leaves at once, so a lightly
/// loaded session sees no added latency, and the target never has fewer
/// than `min_in_flight` commands to work on while any are held. Only new
/// SCSI commands are held: Data-Out, task management, NOP-Out, Text and
/// Logout PDUs leave at once and take held commands with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalescing {
    /// Commands that leave together; 1 turns holding off.
    pub commands: usize,
    /// Commands at the target from which new ones may be held.
    pub min_in_flight: usize,
}

impl Default for Coalescing {
    /// Up to 4 commands together once 8 are at the target: at QD 32
    /// against tgtd (4 KiB random reads), the initiator's writes fall from
    /// about one per command to one per four.
    fn default() -> Self {
        Coalescing {
            commands: 4,
            min_in_flight: 8,
        }
    }
}

impl Default for SessionConfig {
    /// Offers tuned for throughput: 1 MiB data segments received, 16 MiB
    /// bursts, immediate and unsolicited data, 8 outstanding R2Ts; no
    /// digests.
    ///
    /// MaxRecvDataSegmentLength (RFC 7143 section 13.12) is ours to
    /// declare, up to 2^24 - 1. At libiscsi's and open-iscsi's 256 KiB, a
    /// 1 MiB read costs the target four Data-In PDUs; at 1 MiB, one. Against
    /// tgtd, 1 MiB reads at QD 16 went from about 2200 to 3100-3600 IOPS
    /// (same run, same LUN), tgtd's single event thread being the limit.
    fn default() -> Self {
        SessionConfig {
            initiator_name: DEFAULT_INITIATOR_NAME.to_owned(),
            initiator_alias: None,
            isid: None,
            negotiation: NegotiationConfig {
                header_digest: vec![Digest::None],
                data_digest: vec![Digest::None],
                max_connections: 1,
                initial_r2t: false,
                immediate_data: true,
                max_recv_data_segment_length: 1_048_576,
                max_burst_length: 16_776_192,
                first_burst_length: 262_144,
                max_outstanding_r2t: 8,
                ..NegotiationConfig::default()
            },
            chap: None,
            timeouts: Timeouts::default(),
            connections: 1,
            scheduling: Scheduling::RoundRobin,
            command_retries: 3,
            reconnect_attempts: 5,
            replacement_timeout: None,
            coalescing: Coalescing::default(),
            tcp_nodelay: true,
            iser_crc: true,
            iser_max_ulpdu: None,
            max_xmit_data_segment_length: None,
            tap: None,
        }
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool, Error> {
    match value {
        "Yes" | "yes" | "true" | "1" => Ok(true),
        "No" | "no" | "false" | "0" => Ok(false),
        _ => Err(Error::Config(format!(
            "{key}: expected Yes or No, got {value:?}"
        ))),
    }
}

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, Error> {
    value
        .parse()
        .map_err(|_| Error::Config(format!("{key}: bad number {value:?}")))
}

fn parse_digests(key: &str, value: &str) -> Result<Vec<Digest>, Error> {
    value
        .split(',')
        .map(|d| match d.trim() {
            "None" | "none" => Ok(Digest::None),
            "CRC32C" | "crc32c" => Ok(Digest::Crc32c),
            other => Err(Error::Config(format!("{key}: unknown digest {other:?}"))),
        })
        .collect()
}

impl SessionConfig {
    /// Applies the CHAP user and secret of a URL, if it has them.
    pub fn with_url_credentials(mut self, url: &IscsiUrl) -> Self {
        if let Some(user) = &url.user {
            self.chap = Some(ChapConfig {
                user: user.clone(),
                secret: url.secret.clone().unwrap_or_default().into_bytes(),
                target: self.chap.and_then(|c| c.target),
            });
        }
        self
    }

    /// Sets one key by its RFC 7143 name (`MaxBurstLength`, `HeaderDigest`,
    /// ...) or one of the initiator's own settings (`InitiatorName`,
    /// `Connections`, `Scheduling`, `CommandTimeout` and `ReplacementTimeout` in seconds,
    /// `CoalesceCommands` and `CoalesceMinInFlight` (see [`Coalescing`]),
    /// `TcpNoDelay` (Yes or No), `MaxXmitDataSegmentLength` (bytes), ...). Keys starting with `X-` or `X#` are sent as private extensions.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), Error> {
        let n = &mut self.negotiation;
        match key {
            "HeaderDigest" => n.header_digest = parse_digests(key, value)?,
            "DataDigest" => n.data_digest = parse_digests(key, value)?,
            "MaxConnections" => n.max_connections = parse_number(key, value)?,
            "InitialR2T" => n.initial_r2t = parse_bool(key, value)?,
            "ImmediateData" => n.immediate_data = parse_bool(key, value)?,
            "MaxRecvDataSegmentLength" => {
                n.max_recv_data_segment_length = parse_number(key, value)?
            }
            "MaxBurstLength" => n.max_burst_length = parse_number(key, value)?,
            "FirstBurstLength" => n.first_burst_length = parse_number(key, value)?,
            "DefaultTime2Wait" => n.default_time2wait = parse_number(key, value)?,
            "DefaultTime2Retain" => n.default_time2retain = parse_number(key, value)?,
            "MaxOutstandingR2T" => n.max_outstanding_r2t = parse_number(key, value)?,
            "DataPDUInOrder" => n.data_pdu_in_order = parse_bool(key, value)?,
            "DataSequenceInOrder" => n.data_sequence_in_order = parse_bool(key, value)?,
            "ErrorRecoveryLevel" => n.error_recovery_level = parse_number(key, value)?,
            "iSCSIProtocolLevel" => n.iscsi_protocol_level = parse_number(key, value)?,
            "TaskReporting" => n.task_reporting = value.split(',').map(str::to_owned).collect(),
            "InitiatorName" => self.initiator_name = value.to_owned(),
            "InitiatorAlias" => self.initiator_alias = Some(value.to_owned()),
            "Connections" => self.connections = parse_number(key, value)?,
            "Scheduling" => {
                self.scheduling = match value {
                    "round-robin" | "RoundRobin" => Scheduling::RoundRobin,
                    "lun-affinity" | "LunAffinity" => Scheduling::LunAffinity,
                    _ => return Err(Error::Config(format!("Scheduling: unknown {value:?}"))),
                }
            }
            "CommandTimeout" => {
                self.timeouts.command = Duration::from_secs_f64(parse_number(key, value)?)
            }
            "LoginTimeout" => {
                self.timeouts.login = Duration::from_secs_f64(parse_number(key, value)?)
            }
            "CommandRetries" => self.command_retries = parse_number(key, value)?,
            "ReplacementTimeout" => {
                self.replacement_timeout = Some(Duration::from_secs_f64(parse_number(key, value)?))
            }
            "CoalesceCommands" => {
                self.coalescing.commands = parse_number::<usize>(key, value)?.max(1)
            }
            "CoalesceMinInFlight" => self.coalescing.min_in_flight = parse_number(key, value)?,
            "TcpNoDelay" => self.tcp_nodelay = parse_bool(key, value)?,
            "MpaCrc" => self.iser_crc = parse_bool(key, value)?,
            "MpaMaxUlpdu" => {
                let ulpdu: usize = parse_number(key, value)?;
                if !(128..=65534).contains(&ulpdu) {
                    return Err(Error::Config(format!(
                        "{key}: {ulpdu} is outside 128..65534"
                    )));
                }
                self.iser_max_ulpdu = Some(ulpdu);
            }
            "MaxXmitDataSegmentLength" => {
                let length: u32 = parse_number(key, value)?;
                // The range of MaxRecvDataSegmentLength (section 13.12).
                if !(512..=16_777_215).contains(&length) {
                    return Err(Error::Config(format!(
                        "{key}: {length} is outside 512..16777215"
                    )));
                }
                self.max_xmit_data_segment_length = Some(length);
            }
            "CHAPUser" => {
                let chap = self.chap.get_or_insert_with(|| ChapConfig {
                    user: String::new(),
                    secret: Vec::new(),
                    target: None,
                });
                chap.user = value.to_owned();
            }
            "CHAPSecret" => {
                let chap = self.chap.get_or_insert_with(|| ChapConfig {
                    user: String::new(),
                    secret: Vec::new(),
                    target: None,
                });
                chap.secret = value.as_bytes().to_vec();
            }
            // Mutual CHAP (RFC 7143 12.1.3): what the target must prove.
            "TargetCHAPUser" | "TargetCHAPSecret" => {
                let chap = self.chap.get_or_insert_with(|| ChapConfig {
                    user: String::new(),
                    secret: Vec::new(),
                    target: None,
                });
                let target = chap
                    .target
                    .get_or_insert_with(|| (String::new(), Vec::new()));
                if key == "TargetCHAPUser" {
                    target.0 = value.to_owned();
                } else {
                    target.1 = value.as_bytes().to_vec();
                }
            }
            _ if key.starts_with("X-") || key.starts_with("X#") => {
                n.extensions.retain(|p| p.key != key);
                n.extensions.push(TextPair::new(key, value));
            }
            _ => return Err(Error::Config(format!("unknown key {key:?}"))),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_keys() {
        let mut config = SessionConfig::default();
        config.set("MaxBurstLength", "65536").unwrap();
        config.set("HeaderDigest", "CRC32C,None").unwrap();
        config.set("InitialR2T", "Yes").unwrap();
        config.set("Scheduling", "lun-affinity").unwrap();
        config.set("X-com.example.Key", "1").unwrap();
        config.set("TcpNoDelay", "No").unwrap();
        assert!(!config.tcp_nodelay);
        config.set("MaxXmitDataSegmentLength", "8192").unwrap();
        assert_eq!(config.max_xmit_data_segment_length, Some(8192));
        assert!(config.set("MaxXmitDataSegmentLength", "100").is_err());
        config.set("MpaCrc", "No").unwrap();
        assert!(!config.iser_crc);
        config.set("MpaMaxUlpdu", "1446").unwrap();
        assert_eq!(config.iser_max_ulpdu, Some(1446));
        assert!(config.set("MpaMaxUlpdu", "70000").is_err());
        assert_eq!(config.negotiation.max_burst_length, 65536);
        assert_eq!(
            config.negotiation.header_digest,
            vec![Digest::Crc32c, Digest::None]
        );
        assert!(config.negotiation.initial_r2t);
        assert_eq!(config.scheduling, Scheduling::LunAffinity);
        assert!(config.set("NoSuchKey", "1").is_err());
        assert!(config.set("MaxBurstLength", "lots").is_err());
        assert!(config.set("InitialR2T", "maybe").is_err());
    }
}
