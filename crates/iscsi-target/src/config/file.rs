//! The TOML configuration file of `iscsi target`: the desired state, which
//! a running target applies on a reload. [`ParsedConfig::parse`] reads and
//! checks a whole file without opening a store, naming the line of each
//! mistake; [`ParsedConfig::open`] opens the stores (reusing running ones).
//! LUN specifications are those of the command line (`lun.rs`).
//!
//! ```toml
//! # force = true                 # optional: a reload of this file may end
//! #                               # sessions and remove LUNs in use
//! listen = ["127.0.0.1:3260", "[::1]:3260"]
//! iser = ["127.0.0.1:3262"]       # optional: iSER portals (iWARP)
//! command_window = 128            # optional
//! portal_group_tag = 1            # optional; also this gateway's relative target port
//! gateway_group = [1, 2]          # optional: the portal group tags of every gateway
//!                                 # exporting the same RBD images (the same list in
//!                                 # each); its rbd: LUNs then use implicit ALUA, one
//!                                 # owner at a time; read at start
//! nop_in_interval_seconds = 30    # optional; 0 turns the pings off
//! buffer_pool_mib = 64            # optional: idle buffers kept per connection
//! send_buffer_kib = 4096          # optional: SO_SNDBUF per TCP connection; 0: autotuning
//! cores = 4                       # optional: runtime shards, one per core (default: every
//!                                 # CPU the process may use); read at start
//! naa_company_id = 0x001405       # optional: IEEE OUI/CID of the LUs' NAA designators
//!                                 # (VPD 83h); read at start
//!
//! [negotiation]                   # optional: what the target offers
//! header_digest = ["None", "CRC32C"]
//! max_recv_data_segment_length = 262144
//! max_outstanding_r2t = 8
//! initial_r2t = false
//!
//! [[target]]
//! name = "iqn.2026-11.rs.iscsi:disk1"
//! alias = "disk one"              # optional
//! block_size = 512                # optional, 512 or 4096
//! luns = ["ram:1G", "file:/srv/disk.img,size=10G", "block:/dev/loop0,direct"]
//! # or "rbd:POOL/IMAGE,conf=/etc/ceph/ceph.conf,id=USER" (needs librbd1 installed)
//! # any LUN may add ,readonly ,removable ,physical-block=4096 ,latency=5ms
//! # and ,encrypt (RAM: a key in memory) or ,encrypt=KEYFILE (any store)
//! # or, numbers that stay when a LUN before them goes (instead of luns):
//! # [target.lun]
//! # 0 = "ram:1G"
//! # 2 = "file:/srv/disk.img"
//! allowed_initiators = ["iqn.1993-08.org.debian:01:abc"]   # optional
//! chap = { user = "alice", secret = "s3cret-s3cret",      # optional;
//!          target_user = "disk1", target_secret = "other-s3cret" }  # mutual
//! [[target.limit]]                # optional, any number: QoS (`limits.rs`)
//! lun = 0                         # or initiator = "iqn..."
//! iops = 2000                     # and/or bytes_per_second = "200M"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use iscsi_proto::login::chap::{ChapAlgorithm, Credentials};
use iscsi_proto::login::target::ChapRequirement;
use iscsi_proto::text::Digest;
use iscsi_scsi::Backstore;
use serde::Deserialize;
use thiserror::Error;
use toml::Spanned;

use super::lun::{LunSpec, check_block_size};
use super::{LunEntry, TargetConfig, TargetEntry};

/// Why a configuration could not be used. Each message says its cause and
/// ends the chain (no `source()`), or `anyhow`'s `{:#}` would say it twice.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys (the message says where).
    #[error("{0}")]
    Toml(toml::de::Error),
    /// A value on a known line is not acceptable.
    #[error("line {line}: {message}")]
    At {
        /// 1-based.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A value is not acceptable.
    #[error("{0}")]
    Invalid(String),
}

impl From<toml::de::Error> for ConfigError {
    fn from(error: toml::de::Error) -> Self {
        ConfigError::Toml(error)
    }
}

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    force: bool,
    #[serde(default)]
    listen: Vec<Spanned<String>>,
    #[serde(default)]
    iser: Vec<Spanned<String>>,
    #[serde(default)]
    command_window: Option<u32>,
    #[serde(default)]
    portal_group_tag: Option<u16>,
    #[serde(default)]
    gateway_group: Option<Spanned<Vec<u16>>>,
    #[serde(default)]
    nop_in_interval_seconds: Option<u64>,
    #[serde(default)]
    buffer_pool_mib: Option<usize>,
    #[serde(default)]
    send_buffer_kib: Option<usize>,
    #[serde(default)]
    cores: Option<Spanned<usize>>,
    #[serde(default)]
    naa_company_id: Option<Spanned<u32>>,
    #[serde(default)]
    negotiation: Option<NegotiationFile>,
    #[serde(rename = "target", default)]
    targets: Vec<TargetFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NegotiationFile {
    header_digest: Option<Vec<String>>,
    data_digest: Option<Vec<String>>,
    max_connections: Option<u16>,
    initial_r2t: Option<bool>,
    immediate_data: Option<bool>,
    max_recv_data_segment_length: Option<u32>,
    max_burst_length: Option<u32>,
    first_burst_length: Option<u32>,
    default_time2wait: Option<u16>,
    default_time2retain: Option<u16>,
    max_outstanding_r2t: Option<u16>,
    data_pdu_in_order: Option<bool>,
    data_sequence_in_order: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetFile {
    name: Spanned<String>,
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    block_size: Option<Spanned<u32>>,
    /// LUNs numbered 0.. in order.
    #[serde(default)]
    luns: Option<Vec<Spanned<String>>>,
    /// LUNs by number.
    #[serde(default)]
    lun: Option<BTreeMap<Spanned<String>, Spanned<String>>>,
    #[serde(default)]
    allowed_initiators: Vec<String>,
    #[serde(default)]
    chap: Option<Spanned<ChapFile>>,
    /// QoS limits (`limits.rs`).
    #[serde(default)]
    limit: Vec<Spanned<super::limits::LimitFile>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChapFile {
    user: String,
    secret: String,
    #[serde(default)]
    target_user: Option<String>,
    #[serde(default)]
    target_secret: Option<String>,
}

/// A LUN as the file gives it: parsed, not opened.
#[derive(Clone, Debug)]
pub struct PlannedLun {
    /// The specification as written (what a reload compares).
    pub spec: String,
    /// The specification parsed.
    pub parsed: LunSpec,
    /// The target's logical block size.
    pub block_size: u32,
    /// The line it is on.
    pub line: usize,
}

/// A configuration file read and checked whole, its stores not opened:
/// what `iscsi target check` validates and what a reload compares with the
/// running state before it opens or changes anything.
#[derive(Clone, Debug)]
pub struct ParsedConfig {
    /// Everything but the stores: each target's `luns` is empty.
    pub config: TargetConfig,
    /// The LUNs of each target of `config.targets`, in the same order.
    pub luns: Vec<BTreeMap<u16, PlannedLun>>,
    /// `force = true`: a reload of this file may end sessions and remove
    /// LUNs in use.
    pub force: bool,
}

/// The 1-based line of byte `offset` of `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |before| before.matches('\n').count() + 1)
}

impl ParsedConfig {
    /// Reads and checks a configuration file.
    pub fn from_file(path: &Path) -> Result<ParsedConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Self::parse(&text)
    }

    /// Parses and checks a TOML configuration, opening nothing.
    pub fn parse(text: &str) -> Result<ParsedConfig, ConfigError> {
        let file: FileConfig = toml::from_str(text)?;
        let at = |span: std::ops::Range<usize>, message: String| ConfigError::At {
            line: line_of(text, span.start),
            message,
        };
        let mut listen: Vec<SocketAddr> = Vec::new();
        let mut iser: Vec<SocketAddr> = Vec::new();
        for (list, key, addresses) in [
            (&mut listen, "listen", &file.listen),
            (&mut iser, "iser", &file.iser),
        ] {
            for address in addresses {
                let parsed = address.get_ref().parse::<SocketAddr>().map_err(|e| {
                    at(
                        address.span(),
                        format!("{key} address {:?}: {e}", address.get_ref()),
                    )
                })?;
                if list.contains(&parsed) {
                    return Err(at(
                        address.span(),
                        format!("{key}: portal {parsed} repeated"),
                    ));
                }
                list.push(parsed);
            }
        }
        if listen.is_empty() && iser.is_empty() {
            return Err(invalid("listen, iser: at least one portal is needed"));
        }
        if let Some(both) = file.iser.iter().find(|a| {
            a.get_ref()
                .parse::<SocketAddr>()
                .is_ok_and(|a| listen.contains(&a))
        }) {
            return Err(at(
                both.span(),
                format!(
                    "{} is both a TCP and an iSER portal: iWARP needs a TCP port of its own",
                    both.get_ref()
                ),
            ));
        }
        let mut negotiation = TargetConfig::default_negotiation();
        if let Some(n) = file.negotiation {
            if let Some(d) = n.header_digest {
                negotiation.header_digest = digests(&d)?;
            }
            if let Some(d) = n.data_digest {
                negotiation.data_digest = digests(&d)?;
            }
            macro_rules! take {
                ($($field:ident),*) => {$(
                    if let Some(v) = n.$field {
                        negotiation.$field = v;
                    }
                )*};
            }
            take!(
                max_connections,
                initial_r2t,
                immediate_data,
                max_recv_data_segment_length,
                max_burst_length,
                first_burst_length,
                default_time2wait,
                default_time2retain,
                max_outstanding_r2t,
                data_pdu_in_order,
                data_sequence_in_order
            );
        }
        check_ranges(&negotiation)?;
        let mut targets: Vec<TargetEntry> = Vec::new();
        let mut all_luns = Vec::new();
        for target in file.targets {
            let name = target.name.get_ref().clone();
            let name_at = target.name.span();
            if name.is_empty() {
                return Err(at(name_at, "target: an empty name".into()));
            }
            if targets.iter().any(|t| t.name == name) {
                return Err(at(name_at, format!("target {name} named twice")));
            }
            let block_size = match &target.block_size {
                Some(b) => {
                    check_block_size(*b.get_ref())
                        .map_err(|e| at(b.span(), format!("target {name}: {e}")))?;
                    *b.get_ref()
                }
                None => 512,
            };
            let numbered: Vec<(u16, &Spanned<String>)> = match (&target.luns, &target.lun) {
                (Some(_), Some(_)) => {
                    return Err(at(
                        name_at,
                        format!(
                            "target {name}: luns (a list) or [target.lun] (by number), not both"
                        ),
                    ));
                }
                (Some(list), None) => {
                    if list.len() > iscsi_scsi::MAX_LUNS {
                        return Err(at(
                            name_at,
                            format!("target {name}: more than {} LUNs", iscsi_scsi::MAX_LUNS),
                        ));
                    }
                    (0u16..).zip(list.iter()).collect()
                }
                (None, Some(map)) => {
                    let mut numbered = Vec::new();
                    for (number, spec) in map {
                        let n = number
                            .get_ref()
                            .parse::<u16>()
                            .ok()
                            .filter(|&n| usize::from(n) < iscsi_scsi::MAX_LUNS)
                            .ok_or_else(|| {
                                at(
                                    number.span(),
                                    format!(
                                        "target {name}: LUN number {:?}: 0..={}",
                                        number.get_ref(),
                                        iscsi_scsi::MAX_LUNS - 1
                                    ),
                                )
                            })?;
                        if numbered.iter().any(|&(m, _)| m == n) {
                            return Err(at(
                                number.span(),
                                format!("target {name}: LUN {n} given twice"),
                            ));
                        }
                        numbered.push((n, spec));
                    }
                    numbered
                }
                (None, None) => Vec::new(),
            };
            if numbered.is_empty() {
                return Err(at(name_at, format!("target {name}: no LUNs")));
            }
            let mut luns = BTreeMap::new();
            for (n, spec) in numbered {
                let parsed = LunSpec::parse(spec.get_ref())
                    .map_err(|e| at(spec.span(), format!("target {name}: {e}")))?;
                luns.insert(
                    n,
                    PlannedLun {
                        spec: spec.get_ref().clone(),
                        parsed,
                        block_size,
                        line: line_of(text, spec.span().start),
                    },
                );
            }
            check_origins(&luns).map_err(|(n, message)| {
                let line = luns.get(&n).map_or(0, |lun| lun.line);
                ConfigError::At {
                    line,
                    message: format!("target {name} LUN {n}: {message}"),
                }
            })?;
            let chap = match &target.chap {
                None => None,
                Some(c) => Some(
                    chap_requirement(c.get_ref())
                        .map_err(|e| at(c.span(), format!("target {name}: {e}")))?,
                ),
            };
            let limits =
                super::limits::limits(&name, &target.limit, &luns, &target.allowed_initiators)
                    .map_err(|(span, message)| at(span, message))?;
            all_luns.push(luns);
            targets.push(TargetEntry {
                name,
                alias: target.alias,
                luns: BTreeMap::new(),
                chap,
                allowed_initiators: target.allowed_initiators,
                limits,
            });
        }
        if targets.is_empty() {
            return Err(invalid("no [[target]]"));
        }
        let cores = match &file.cores {
            Some(c) if !(1..=4096).contains(c.get_ref()) => {
                return Err(at(c.span(), "cores: 1 to 4096".into()));
            }
            c => c.as_ref().map(|c| *c.get_ref()),
        };
        let naa_company_id = match &file.naa_company_id {
            Some(id) => super::check_company_id(*id.get_ref())
                .map_err(|e| at(id.span(), format!("naa_company_id: {e}")))?,
            None => iscsi_scsi::spc::NAA_COMPANY_ID,
        };
        let portal_group_tag = file.portal_group_tag.unwrap_or(1);
        let gateway_group = match &file.gateway_group {
            None => Vec::new(),
            Some(g) => super::check_gateway_group(portal_group_tag, g.get_ref())
                .map_err(|e| at(g.span(), format!("gateway_group: {e}")))?,
        };
        let config = TargetConfig {
            listen,
            iser,
            targets,
            portal_group_tag,
            gateway_group,
            negotiation,
            command_window: file.command_window.unwrap_or(128).clamp(1, 1 << 20),
            nop_in_interval: match file.nop_in_interval_seconds {
                Some(0) => None,
                Some(seconds) => Some(std::time::Duration::from_secs(seconds)),
                None => Some(DEFAULT_NOP_IN_INTERVAL),
            },
            buffer_pool_bytes: file
                .buffer_pool_mib
                .map_or(super::DEFAULT_BUFFER_POOL_BYTES, |mib| {
                    mib.saturating_mul(1 << 20)
                }),
            send_buffer_bytes: file.send_buffer_kib.map_or(
                Some(super::DEFAULT_SEND_BUFFER_BYTES),
                super::send_buffer_from_kib,
            ),
            cores,
            naa_company_id,
            tap: None,
        };
        Ok(ParsedConfig {
            config,
            luns: all_luns,
            force: file.force,
        })
    }

    /// Checks that this machine has what the LUNs need beyond their
    /// specifications (librbd for `rbd:` ones: [`LunSpec::check_libraries`]);
    /// the error names the target, the LUN and its line.
    pub fn check_libraries(&self) -> Result<(), ConfigError> {
        for (target, planned) in self.config.targets.iter().zip(&self.luns) {
            for (n, lun) in planned {
                lun.parsed.check_libraries().map_err(|e| ConfigError::At {
                    line: lun.line,
                    message: format!("target {} LUN {n} {:?}: {e}", target.name, lun.spec),
                })?;
            }
        }
        Ok(())
    }

    /// Opens every store and returns the configuration to serve.
    /// `reuse(target, number, lun)` may hand back a running store for a LUN
    /// that a reload keeps; every other store is opened. On an error the
    /// stores opened so far are dropped (closed), and the error names the
    /// target, the LUN and its line.
    pub fn open(
        self,
        reuse: &dyn Fn(&str, u16, &PlannedLun) -> Option<LunEntry>,
    ) -> Result<TargetConfig, ConfigError> {
        let ParsedConfig {
            mut config, luns, ..
        } = self;
        let gateway = config.gateway();
        for (target, planned) in config.targets.iter_mut().zip(luns) {
            // The LUNs a `snapshot:` or `clone:` one opens from first
            // (check_origins saw that every chain ends).
            let depths = origin_depths(&planned);
            let specs: BTreeMap<u16, crate::config::lun::LunSpec> = planned
                .iter()
                .map(|(&n, lun)| (n, lun.parsed.clone()))
                .collect();
            let mut order: Vec<(u16, PlannedLun)> = planned.into_iter().collect();
            order.sort_by_key(|(n, _)| (depths.get(n).copied().unwrap_or(0), *n));
            for (n, lun) in order {
                let entry = match reuse(&target.name, n, &lun) {
                    Some(entry) => entry,
                    None => {
                        let id = lun.parsed.unique_id(&target.name, n);
                        let opened = match lun.parsed.origin() {
                            None => lun.parsed.open_in(lun.block_size, id, gateway.as_ref()),
                            Some(of) => match (target.luns.get(&of), specs.get(&of)) {
                                (Some(origin), Some(spec)) => lun.parsed.open_from_in(
                                    &*origin.store,
                                    gateway.as_ref().map(|group| (spec, group)),
                                    id,
                                ),
                                _ => Err(format!("LUN {of} is not opened")),
                            },
                        };
                        let store: std::sync::Arc<dyn Backstore> =
                            opened.map_err(|e| ConfigError::At {
                                line: lun.line,
                                message: format!(
                                    "target {} LUN {n} {:?}: {e}",
                                    target.name, lun.spec
                                ),
                            })?;
                        LunEntry {
                            store,
                            spec: lun.spec,
                        }
                    }
                };
                target.luns.insert(n, entry);
            }
        }
        Ok(config)
    }
}

impl TargetConfig {
    /// Reads a TOML configuration file and opens its stores.
    pub fn from_file(path: &Path) -> Result<TargetConfig, ConfigError> {
        ParsedConfig::from_file(path)?.open(&|_, _, _| None)
    }

    /// Parses a TOML configuration and opens every backstore it names.
    pub fn from_toml(text: &str) -> Result<TargetConfig, ConfigError> {
        ParsedConfig::parse(text)?.open(&|_, _, _| None)
    }
}

/// How many `snapshot:`/`clone:` steps separate each LUN from a LUN with
/// a store of its own (0 for those): the order they open in. A chain that
/// does not end (refused by [`check_origins`]) counts as long as the map.
fn origin_depths(luns: &BTreeMap<u16, PlannedLun>) -> BTreeMap<u16, usize> {
    luns.iter()
        .map(|(&n, lun)| {
            let mut depth = 0;
            let mut origin = lun.parsed.origin();
            while let Some(of) = origin
                && depth < luns.len()
            {
                depth += 1;
                origin = luns.get(&of).and_then(|l| l.parsed.origin());
            }
            (n, depth)
        })
        .collect()
}

/// Every `snapshot:` and `clone:` LUN names another LUN of its target, and
/// following them ends at a LUN with a store of its own; else the LUN and
/// what is wrong.
fn check_origins(luns: &BTreeMap<u16, PlannedLun>) -> Result<(), (u16, String)> {
    for (&n, lun) in luns {
        let Some(of) = lun.parsed.origin() else {
            continue;
        };
        if !luns.contains_key(&of) {
            return Err((
                n,
                format!(
                    "{:?} names LUN {of}, which this target does not have: a snapshot or \
                     clone opens from a LUN of its own target",
                    lun.spec
                ),
            ));
        }
    }
    let depths = origin_depths(luns);
    match depths.iter().find(|&(_, &d)| d >= luns.len()) {
        Some((&n, _)) => Err((
            n,
            format!(
                "{:?}: its snapshots and clones name each other in a circle: one of them must \
                 be a LUN with a store of its own",
                luns[&n].spec
            ),
        )),
        None => Ok(()),
    }
}

/// Seconds of silence before the target pings an initiator, by default.
pub const DEFAULT_NOP_IN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

fn digests(names: &[String]) -> Result<Vec<Digest>, ConfigError> {
    names
        .iter()
        .map(|name| match name.to_ascii_uppercase().as_str() {
            "NONE" => Ok(Digest::None),
            "CRC32C" => Ok(Digest::Crc32c),
            _ => Err(invalid(format!("digest {name:?}: None or CRC32C"))),
        })
        .collect()
}

/// The legal ranges of RFC 7143 section 13 for what a target may offer.
fn check_ranges(n: &iscsi_proto::text::NegotiationConfig) -> Result<(), ConfigError> {
    let in_range = |name: &str, value: u64, low: u64, high: u64| {
        if (low..=high).contains(&value) {
            Ok(())
        } else {
            Err(invalid(format!("{name} = {value}: must be {low}..={high}")))
        }
    };
    in_range("max_connections", n.max_connections.into(), 1, 65535)?;
    in_range(
        "max_recv_data_segment_length",
        n.max_recv_data_segment_length.into(),
        512,
        (1 << 24) - 1,
    )?;
    in_range(
        "max_burst_length",
        n.max_burst_length.into(),
        512,
        (1 << 24) - 1,
    )?;
    in_range(
        "first_burst_length",
        n.first_burst_length.into(),
        512,
        (1 << 24) - 1,
    )?;
    in_range(
        "max_outstanding_r2t",
        n.max_outstanding_r2t.into(),
        1,
        65535,
    )?;
    in_range("default_time2wait", n.default_time2wait.into(), 0, 3600)?;
    in_range("default_time2retain", n.default_time2retain.into(), 0, 3600)?;
    if n.header_digest.is_empty() || n.data_digest.is_empty() {
        return Err(invalid("digest lists must not be empty"));
    }
    Ok(())
}

fn chap_requirement(c: &ChapFile) -> Result<ChapRequirement, ConfigError> {
    let mutual = match (&c.target_user, &c.target_secret) {
        (Some(user), Some(secret)) => Some(Credentials::new(user.clone(), secret.as_bytes())),
        (None, None) => None,
        _ => return Err(invalid("chap: target_user and target_secret go together")),
    };
    Ok(ChapRequirement {
        algorithms: ChapAlgorithm::ALL.to_vec(),
        initiator: Credentials::new(c.user.clone(), c.secret.as_bytes()),
        mutual,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_parses() {
        let config = TargetConfig::from_toml(
            r#"
            listen = ["127.0.0.1:3260", "[::1]:3261"]
            command_window = 64
            buffer_pool_mib = 8
            send_buffer_kib = 512
            [negotiation]
            header_digest = ["CRC32C", "None"]
            max_outstanding_r2t = 4
            initial_r2t = true
            [[target]]
            name = "iqn.2026-11.rs.iscsi:a"
            luns = ["ram:1M", "ram:2M"]
            chap = { user = "u", secret = "0123456789ab", target_user = "t", target_secret = "ba9876543210" }
            [[target]]
            name = "iqn.2026-11.rs.iscsi:b"
            block_size = 4096
            luns = ["ram:4M"]
            allowed_initiators = ["iqn.x:y"]
            "#,
        )
        .unwrap();
        assert_eq!(config.listen.len(), 2);
        assert!(config.listen[1].is_ipv6());
        assert_eq!(config.command_window, 64);
        assert_eq!(config.buffer_pool_bytes, 8 << 20);
        assert_eq!(config.send_buffer_bytes, Some(512 << 10));
        assert_eq!(config.negotiation.max_outstanding_r2t, 4);
        assert!(config.negotiation.initial_r2t);
        assert_eq!(config.negotiation.header_digest[0], Digest::Crc32c);
        assert_eq!(config.targets.len(), 2);
        assert_eq!(config.targets[0].luns.len(), 2);
        assert!(config.targets[0].chap.as_ref().unwrap().mutual.is_some());
        assert_eq!(config.targets[1].luns[&0].store.block_size(), 4096);
        assert_eq!(config.targets[1].allowed_initiators, ["iqn.x:y"]);
    }

    #[test]
    fn the_send_buffer_defaults_and_turns_off() {
        let minimal = "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]\n";
        let config = TargetConfig::from_toml(minimal).unwrap();
        assert_eq!(
            config.send_buffer_bytes,
            Some(crate::DEFAULT_SEND_BUFFER_BYTES)
        );
        let off = TargetConfig::from_toml(&format!("send_buffer_kib = 0\n{minimal}")).unwrap();
        assert_eq!(off.send_buffer_bytes, None);
    }

    #[test]
    fn cores_are_one_to_4096_or_one_per_cpu() {
        let minimal = "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]\n";
        assert_eq!(TargetConfig::from_toml(minimal).unwrap().cores, None);
        let four = TargetConfig::from_toml(&format!("cores = 4\n{minimal}")).unwrap();
        assert_eq!(four.cores, Some(4));
        for bad in ["cores = 0", "cores = 5000", "cores = -1"] {
            let error = ParsedConfig::parse(&format!("{bad}\n{minimal}"))
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("line 1") && error.contains("cores"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn lun_options_parse_for_every_store_with_line_numbered_errors() {
        let config = TargetConfig::from_toml(
            "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\n\
             luns = [\"ram:1M,readonly\", \"ram:1M,removable,physical-block=4096\"]\n",
        )
        .unwrap();
        let luns = &config.targets[0].luns;
        assert!(luns[&0].store.lu_options().read_only);
        let second = luns[&1].store.lu_options();
        assert!(second.removable && second.lbppbe(512) == 3);
        // Refused while parsing (nothing opened), with the line.
        let error = ParsedConfig::parse(
            "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\n[target.lun]\n\
             0 = \"ram:1M\"\n3 = \"file:/x.img,physical-block=1000\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("line 6") && error.contains("physical-block"),
            "{error}"
        );
        // A physical block smaller than the target's logical block: found
        // when the store opens, still with its line.
        let error = TargetConfig::from_toml(
            "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nblock_size = 4096\n\
             luns = [\"ram:1M\",\n  \"ram:1M,physical-block=2048\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("line 6") && error.contains("power-of-two multiple"),
            "{error}"
        );
    }

    #[test]
    fn snapshot_and_clone_luns_name_a_lun_of_their_target() {
        let file = |luns: &str| {
            format!("listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\n[target.lun]\n{luns}")
        };
        for (luns, words) in [
            ("0 = \"ram:1M\"\n1 = \"snapshot:2/s\"\n", "names LUN 2"),
            ("0 = \"ram:1M\"\n1 = \"clone:1/s\"\n", "in a circle"),
            (
                "0 = \"ram:1M\"\n1 = \"clone:2/s\"\n2 = \"clone:1/s\"\n",
                "in a circle",
            ),
        ] {
            let error = ParsedConfig::parse(&file(luns)).unwrap_err().to_string();
            assert!(
                error.contains("line 6") && error.contains(words),
                "{luns}: {error}"
            );
        }
        // Opened after their origins, whatever their numbers: a clone at
        // LUN 0 of the RAM LUN 5's snapshot (none taken: refused, naming it).
        let error = TargetConfig::from_toml(&file("0 = \"clone:5/s\"\n5 = \"ram:1M\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("LUN 0") && error.contains("no snapshot named \"s\""),
            "{error}"
        );
    }

    #[test]
    fn the_naa_company_id_is_24_bits_and_defaults_to_lios() {
        let minimal = "[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]\n";
        let listen = "listen = [\"127.0.0.1:1\"]\n";
        let default = TargetConfig::from_toml(&format!("{listen}{minimal}")).unwrap();
        assert_eq!(default.naa_company_id, 0x00_1405);
        let own = TargetConfig::from_toml(&format!("{listen}naa_company_id = 0xACDE48\n{minimal}"))
            .unwrap();
        assert_eq!(own.naa_company_id, 0xAC_DE48);
        let error = ParsedConfig::parse(&format!("{listen}naa_company_id = 0x1000000\n{minimal}"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("line 2") && error.contains("24-bit"),
            "{error}"
        );
        assert_eq!(crate::parse_company_id("00-14-05"), Ok(0x00_1405));
        assert_eq!(crate::parse_company_id("0xACDE48"), Ok(0xAC_DE48));
        assert!(crate::parse_company_id("0x1234567").is_err());
        assert!(crate::parse_company_id("xyz").is_err());
    }

    #[test]
    fn mistakes_are_reported() {
        let bad = [
            "listen = []\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]",
            "listen = [\"nowhere\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]",
            "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nluns = []",
            "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]\ncolour = 1",
            "listen = [\"127.0.0.1:1\"]\n[negotiation]\nmax_outstanding_r2t = 0\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]",
            "listen = [\"127.0.0.1:1\"]\n[negotiation]\ndata_digest = [\"MD5\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]",
            "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]",
            "listen = [\"127.0.0.1:1\"]\n[[target]]\nname = \"a\"\nluns = [\"ram:1M\"]\nchap = { user = \"u\", secret = \"s\", target_user = \"t\" }",
        ];
        for text in bad {
            assert!(TargetConfig::from_toml(text).is_err(), "accepted: {text}");
        }
    }
}
