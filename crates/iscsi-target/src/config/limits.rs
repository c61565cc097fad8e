//! A target's QoS limits in the file, checked whole before anything runs:
//!
//! ```toml
//! [[target.limit]]
//! lun = 0                       # or: initiator = "iqn.1993-08.org.debian:01:abc"
//! iops = 2000                   # commands a second (optional)
//! bytes_per_second = "200M"     # bytes of data a second (optional; K/M/G suffixes)
//! burst_iops = 200              # optional: commands at once after a quiet time
//! burst_bytes = "16M"           # optional
//! queue = 256                   # optional: commands waiting at once, then TASK SET FULL
//! ```

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::lun::parse_size;
use crate::qos::limit::DEFAULT_QUEUE;
use crate::qos::{LimitEntry, LimitKey, LimitSpec};

/// The most commands a second a limit may name: beyond what any target
/// serves, so a larger number is a mistake.
const MAX_IOPS: u64 = 100_000_000;
/// The most bytes a second: 1 TiB/s.
const MAX_BYTES_PER_SECOND: u64 = 1 << 40;
/// The smallest bytes a second: one 4 KiB block.
const MIN_BYTES_PER_SECOND: u64 = 4096;
/// The longest queue.
const MAX_QUEUE: u32 = 65_536;

/// A `[[target.limit]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitFile {
    #[serde(default)]
    lun: Option<u16>,
    #[serde(default)]
    initiator: Option<String>,
    #[serde(default)]
    iops: Option<u64>,
    #[serde(default)]
    bytes_per_second: Option<Size>,
    #[serde(default)]
    burst_iops: Option<u64>,
    #[serde(default)]
    burst_bytes: Option<Size>,
    #[serde(default)]
    queue: Option<u32>,
}

/// A number of bytes: `4096` or `"64M"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self) -> Result<u64, String> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(text) => parse_size(text),
        }
    }
}

/// The limits of target `name`, whose LUNs are `luns` and whose ACL is
/// `allowed`: each checked (one of `lun` and `initiator`, a LUN the target
/// has, an initiator its ACL lets in, a rate and sane numbers, no key
/// twice). The error comes with where the limit is in the file.
pub(super) fn limits<T>(
    name: &str,
    file: &[Spanned<LimitFile>],
    luns: &BTreeMap<u16, T>,
    allowed: &[String],
) -> Result<Vec<LimitEntry>, (Range<usize>, String)> {
    let mut entries: Vec<LimitEntry> = Vec::new();
    for limit in file {
        let refuse = |e: String| (limit.span(), format!("target {name}: limit: {e}"));
        let entry = one(limit.get_ref(), luns, allowed).map_err(refuse)?;
        if entries.iter().any(|e| e.key == entry.key) {
            return Err(refuse(format!("{} has a limit already", entry.key)));
        }
        entries.push(entry);
    }
    Ok(entries)
}

fn one<T>(
    limit: &LimitFile,
    luns: &BTreeMap<u16, T>,
    allowed: &[String],
) -> Result<LimitEntry, String> {
    let key = match (&limit.lun, &limit.initiator) {
        (Some(n), None) if luns.contains_key(n) => LimitKey::Lun(*n),
        (Some(n), None) => return Err(format!("the target has no LUN {n}")),
        (None, Some(name)) if name.trim().is_empty() => {
            return Err("an empty initiator name".into());
        }
        (None, Some(name)) if !allowed.is_empty() && !allowed.contains(name) => {
            return Err(format!(
                "initiator {name} is not in allowed_initiators: it could never log in"
            ));
        }
        (None, Some(name)) => LimitKey::Initiator(name.clone()),
        _ => return Err("give lun = N or initiator = \"NAME\", one of them".into()),
    };
    if limit.iops.is_none() && limit.bytes_per_second.is_none() {
        return Err("give iops, bytes_per_second or both".into());
    }
    let iops = limit
        .iops
        .map(|n| in_range("iops", n, 1, MAX_IOPS))
        .transpose()?;
    let bytes_per_second = limit
        .bytes_per_second
        .as_ref()
        .map(|s| {
            in_range(
                "bytes_per_second",
                s.bytes()?,
                MIN_BYTES_PER_SECOND,
                MAX_BYTES_PER_SECOND,
            )
        })
        .transpose()?;
    let burst_iops = match (limit.burst_iops, iops) {
        (Some(_), None) => return Err("burst_iops without iops".into()),
        (Some(b), Some(rate)) => Some(in_range("burst_iops", b, 1, rate.saturating_mul(60))?),
        (None, _) => None,
    };
    let burst_bytes = match (&limit.burst_bytes, bytes_per_second) {
        (Some(_), None) => return Err("burst_bytes without bytes_per_second".into()),
        (Some(b), Some(rate)) => Some(in_range(
            "burst_bytes",
            b.bytes()?,
            MIN_BYTES_PER_SECOND,
            rate.saturating_mul(60),
        )?),
        (None, _) => None,
    };
    let queue = in_range(
        "queue",
        u64::from(limit.queue.unwrap_or(DEFAULT_QUEUE)),
        1,
        u64::from(MAX_QUEUE),
    )?;
    Ok(LimitEntry {
        key,
        spec: LimitSpec {
            iops,
            bytes_per_second,
            burst_iops,
            burst_bytes,
            queue: u32::try_from(queue).unwrap_or(MAX_QUEUE),
        },
    })
}

fn in_range(what: &str, value: u64, min: u64, max: u64) -> Result<u64, String> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{what} = {value}: {min} to {max}"))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::file::ParsedConfig;
    use crate::qos::{LimitKey, LimitSpec};

    fn with(limits: &str) -> Result<ParsedConfig, String> {
        ParsedConfig::parse(&format!(
            "listen = [\"127.0.0.1:3260\"]\n[[target]]\nname = \"iqn.2026-11.rs.iscsi:t\"\nluns = [\"ram:1M\", \"ram:1M\"]\n\
             allowed_initiators = [\"iqn.a\"]\n{limits}"
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn limits_are_read_with_their_defaults() {
        let parsed = with(
            "[[target.limit]]\nlun = 1\niops = 2000\n\
             [[target.limit]]\ninitiator = \"iqn.a\"\nbytes_per_second = \"100M\"\nburst_bytes = 8388608\nqueue = 16\n",
        )
        .unwrap();
        let limits = &parsed.config.targets[0].limits;
        assert_eq!(limits[0].key, LimitKey::Lun(1));
        assert_eq!(
            limits[0].spec,
            LimitSpec {
                iops: Some(2000),
                bytes_per_second: None,
                burst_iops: None,
                burst_bytes: None,
                queue: 256
            }
        );
        assert_eq!(limits[1].key, LimitKey::Initiator("iqn.a".into()));
        assert_eq!(limits[1].spec.bytes_per_second, Some(100 << 20));
        assert_eq!(limits[1].spec.burst_bytes, Some(8 << 20));
        assert_eq!(limits[1].spec.queue, 16);
    }

    /// Every mistake is refused with its line and what is wrong.
    #[test]
    fn bad_limits_are_refused_in_words() {
        for (limit, says) in [
            ("lun = 0\niops = 0", "iops = 0: 1 to"),
            ("lun = 0\niops = 1000000000000", "iops = 1000000000000"),
            ("lun = 0\niops = -5", "invalid value"),
            ("lun = 0\niops = \"fast\"", "invalid type"),
            ("lun = 0\nbytes_per_second = \"10Q\"", "unknown size unit"),
            (
                "lun = 0\nbytes_per_second = 100",
                "bytes_per_second = 100: 4096 to",
            ),
            ("lun = 0", "give iops, bytes_per_second or both"),
            ("iops = 10", "give lun = N or initiator"),
            (
                "lun = 0\ninitiator = \"iqn.a\"\niops = 10",
                "give lun = N or initiator",
            ),
            ("lun = 7\niops = 10", "the target has no LUN 7"),
            (
                "initiator = \"iqn.b\"\niops = 10",
                "not in allowed_initiators",
            ),
            ("initiator = \"\"\niops = 10", "an empty initiator name"),
            ("lun = 0\niops = 10\nqueue = 0", "queue = 0: 1 to"),
            (
                "lun = 0\nburst_iops = 5\nbytes_per_second = \"1M\"",
                "burst_iops without iops",
            ),
            (
                "lun = 0\niops = 10\nburst_iops = 100000",
                "burst_iops = 100000",
            ),
            ("lun = 0\niops = 10\ncolour = 1", "unknown field"),
        ] {
            let error = with(&format!("[[target.limit]]\n{limit}\n")).unwrap_err();
            assert!(error.contains(says), "{limit:?}: {error}");
            assert!(
                error.contains("line") || error.contains("TOML"),
                "{limit:?}: {error}"
            );
        }
        let twice =
            with("[[target.limit]]\nlun = 0\niops = 10\n[[target.limit]]\nlun = 0\niops = 20\n")
                .unwrap_err();
        assert!(twice.contains("LUN 0 has a limit already"), "{twice}");
    }
}
