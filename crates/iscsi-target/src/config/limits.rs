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
