//! The TOML configuration file of `iscsi target` and the LUN specifications
//! shared with the command line (`ram:SIZE`, `file:PATH[,size=SIZE]`,
//! `block:PATH[,direct]`, each optionally `,latency=DURATION`).
//!
//! ```toml
//! listen = ["127.0.0.1:3260", "[::1]:3260"]
//! iser = ["127.0.0.1:3262"]       # optional: iSER portals (iWARP)
//! command_window = 128            # optional
//! portal_group_tag = 1            # optional
//! nop_in_interval_seconds = 30    # optional; 0 turns the pings off
//! buffer_pool_mib = 64            # optional: idle buffers kept per connection
//! send_buffer_kib = 4096          # optional: SO_SNDBUF per TCP connection; 0: autotuning
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
//! allowed_initiators = ["iqn.1993-08.org.debian:01:abc"]   # optional
//! chap = { user = "alice", secret = "s3cret-s3cret",      # optional;
//!          target_user = "disk1", target_secret = "other-s3cret" }  # mutual
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use iscsi_proto::login::chap::{ChapAlgorithm, Credentials};
use iscsi_proto::login::target::ChapRequirement;
use iscsi_proto::text::Digest;
use iscsi_scsi::{Backstore, BlockBackstore, FileBackstore, RamBackstore, SlowBackstore};
use serde::Deserialize;
use thiserror::Error;

use super::{TargetConfig, TargetEntry};

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
    /// The TOML is malformed or has unknown keys.
    #[error("{0}")]
    Toml(toml::de::Error),
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
    listen: Vec<String>,
    #[serde(default)]
    iser: Vec<String>,
    #[serde(default)]
    command_window: Option<u32>,
    #[serde(default)]
    portal_group_tag: Option<u16>,
    #[serde(default)]
    nop_in_interval_seconds: Option<u64>,
    #[serde(default)]
    buffer_pool_mib: Option<usize>,
    #[serde(default)]
    send_buffer_kib: Option<usize>,
    #[serde(default)]
    negotiation: Option<NegotiationFile>,
    #[serde(rename = "target")]
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
    name: String,
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    block_size: Option<u32>,
    luns: Vec<String>,
    #[serde(default)]
    allowed_initiators: Vec<String>,
    #[serde(default)]
    chap: Option<ChapFile>,
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

impl TargetConfig {
    /// Reads a TOML configuration file.
    pub fn from_file(path: &Path) -> Result<TargetConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Self::from_toml(&text)
    }

    /// Parses a TOML configuration and opens every backstore it names.
    pub fn from_toml(text: &str) -> Result<TargetConfig, ConfigError> {
        let file: FileConfig = toml::from_str(text)?;
        let mut listen = Vec::new();
        for address in &file.listen {
            listen.push(
                address
                    .parse::<SocketAddr>()
                    .map_err(|e| invalid(format!("listen address {address:?}: {e}")))?,
            );
        }
        let mut iser = Vec::new();
        for address in &file.iser {
            iser.push(
                address
                    .parse::<SocketAddr>()
                    .map_err(|e| invalid(format!("iser address {address:?}: {e}")))?,
            );
        }
        if listen.is_empty() && iser.is_empty() {
            return Err(invalid("listen, iser: at least one portal is needed"));
        }
        if let Some(both) = listen.iter().find(|a| iser.contains(a)) {
            return Err(invalid(format!(
                "{both} is both a TCP and an iSER portal: iWARP needs a TCP port of its own"
            )));
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
        let mut targets = Vec::new();
        let mut unique = 0u64;
        for target in file.targets {
            let block_size = target.block_size.unwrap_or(512);
            let mut luns = Vec::new();
            for spec in &target.luns {
                unique += 1;
                luns.push(
                    open_lun(spec, block_size, unique_id(unique))
                        .map_err(|e| invalid(format!("target {}: {e}", target.name)))?,
                );
            }
            if luns.is_empty() {
                return Err(invalid(format!("target {}: no LUNs", target.name)));
            }
            let chap = match target.chap {
                None => None,
                Some(c) => Some(chap_requirement(&c)?),
            };
            if targets.iter().any(|t: &TargetEntry| t.name == target.name) {
                return Err(invalid(format!("target {} named twice", target.name)));
            }
            targets.push(TargetEntry {
                name: target.name,
                alias: target.alias,
                luns,
                chap,
                allowed_initiators: target.allowed_initiators,
            });
        }
        if targets.is_empty() {
            return Err(invalid("no [[target]]"));
        }
        Ok(TargetConfig {
            listen,
            iser,
            targets,
            portal_group_tag: file.portal_group_tag.unwrap_or(1),
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
            tap: None,
        })
    }
}

/// Seconds of silence before the target pings an initiator, by default.
pub const DEFAULT_NOP_IN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// A unique LU identifier: random high bits (so two targets on one
/// network do not collide), the LU's ordinal in the low bits.
pub fn unique_id(ordinal: u64) -> u64 {
    (u64::from(rand::random::<u32>()) << 16) | (ordinal & 0xFFFF)
}

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

/// Parses sizes like `4096`, `64K`, `256M`, `1G`, `2T` (binary units).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("size {text:?}: a number with an optional K/M/G/T"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("size {text:?} too large"))
}

/// Opens the backstore a LUN specification names: `ram:SIZE`,
/// `file:PATH[,size=SIZE]` (created or extended to SIZE when given) or
/// `block:PATH[,direct]` (a block device; `direct` opens it O_DIRECT); any
/// of them with `,latency=DURATION` (e.g. `20ms`) behind that latency
/// ([`SlowBackstore`]: a slow device, for tests of aborts and timeouts).
pub fn open_lun(spec: &str, block_size: u32, id: u64) -> Result<Arc<dyn Backstore>, String> {
    let mut latency = None;
    let plain: Vec<&str> = spec
        .split(',')
        .filter(|option| match option.strip_prefix("latency=") {
            Some(value) => {
                latency = Some(value);
                false
            }
            None => true,
        })
        .collect();
    let store = open_store(spec, &plain.join(","), block_size, id)?;
    match latency {
        None => Ok(store),
        Some(value) => {
            let latency = humantime::parse_duration(value)
                .map_err(|e| format!("LUN {spec:?}: latency {value:?}: {e}"))?;
            Ok(Arc::new(SlowBackstore::new(store, latency)))
        }
    }
}

/// [`open_lun`] without the latency option (`spec` is what the user
/// wrote, for errors; `plain` the rest).
fn open_store(
    spec: &str,
    plain: &str,
    block_size: u32,
    id: u64,
) -> Result<Arc<dyn Backstore>, String> {
    if block_size != 512 && block_size != 4096 {
        return Err(format!("block size {block_size}: 512 or 4096"));
    }
    let (kind, rest) = plain
        .split_once(':')
        .ok_or_else(|| format!("LUN {spec:?}: ram:SIZE, file:PATH[,size=SIZE] or block:PATH"))?;
    match kind {
        "ram" => {
            let size = parse_size(rest)?;
            RamBackstore::new(size, block_size, id)
                .map(|b| Arc::new(b) as Arc<dyn Backstore>)
                .map_err(|e| format!("LUN {spec:?}: {e}"))
        }
        "file" => {
            let mut parts = rest.split(',');
            let path = parts
                .next()
                .filter(|p| !p.is_empty())
                .ok_or("file: needs a path")?;
            let mut size = None;
            for option in parts {
                match option.split_once('=') {
                    Some(("size", value)) => size = Some(parse_size(value)?),
                    _ => return Err(format!("LUN {spec:?}: unknown option {option:?}")),
                }
            }
            FileBackstore::open(path, size, block_size, id)
                .map(|b| Arc::new(b) as Arc<dyn Backstore>)
                .map_err(|e| format!("LUN {spec:?}: {e}"))
        }
        "block" => {
            let mut parts = rest.split(',');
            let path = parts
                .next()
                .filter(|p| !p.is_empty())
                .ok_or("block: needs a path")?;
            let mut direct = false;
            for option in parts {
                match option {
                    "direct" => direct = true,
                    _ => return Err(format!("LUN {spec:?}: unknown option {option:?}")),
                }
            }
            BlockBackstore::open(path, direct, id)
                .map(|b| Arc::new(b) as Arc<dyn Backstore>)
                .map_err(|e| format!("LUN {spec:?}: {e}"))
        }
        other => Err(format!(
            "LUN {spec:?}: unknown backstore {other:?} (ram, file or block)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn lun_specs() {
        assert!(open_lun("ram:1M", 512, 1).is_ok());
        assert!(open_lun("ram:1M", 1024, 1).is_err());
        assert!(open_lun("nvme:1M", 512, 1).is_err());
        assert!(open_lun("ram", 512, 1).is_err());
        let dir = std::env::temp_dir().join(format!("iscsi-rs-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lun.img");
        let spec = format!("file:{},size=1M", path.display());
        let lun = open_lun(&spec, 4096, 2).unwrap();
        assert_eq!(lun.block_count(), 256);
        // Reopened without a size: the file's own length.
        let again = open_lun(&format!("file:{}", path.display()), 512, 2).unwrap();
        assert_eq!(again.block_count(), 2048);
        assert!(open_lun(&format!("file:{},colour=red", path.display()), 512, 2).is_err());
        // Behind a latency: the store is the same, every access slower,
        // and its commands leave the runtime's threads (may_block).
        let slow = open_lun(&format!("file:{},latency=5ms", path.display()), 512, 2).unwrap();
        assert!(slow.may_block() && slow.block_count() == 2048);
        let ram = open_lun("ram:1M,latency=1ms", 512, 3).unwrap();
        assert!(ram.may_block() && ram.block_count() == 2048);
        let started = std::time::Instant::now();
        ram.flush().unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_millis(1));
        let bad = open_lun("ram:1M,latency=soon", 512, 3).unwrap_err();
        assert!(bad.contains("latency \"soon\""), "{bad}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
        assert_eq!(config.targets[1].luns[0].block_size(), 4096);
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
