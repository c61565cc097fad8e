//! LUN specifications, shared by the command line and the file:
//! `ram:SIZE`, `file:PATH[,size=SIZE]`, `block:PATH[,direct]`, each
//! optionally `,latency=DURATION`. Parsing ([`LunSpec::parse`]) opens
//! nothing, so `iscsi target check` and a reload can refuse a bad file
//! before anything is touched; [`LunSpec::open`] opens the store.

use std::sync::Arc;
use std::time::Duration;

use iscsi_scsi::{Backstore, BlockBackstore, FileBackstore, RamBackstore, SlowBackstore};

/// What a LUN specification names, parsed but not opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LunSpec {
    /// The store.
    pub kind: StoreKind,
    /// `latency=DURATION`: every access waits this long first.
    pub latency: Option<Duration>,
}

/// The kinds of backstore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// `ram:SIZE`: sparse memory, lost when the target stops.
    Ram {
        /// Bytes.
        size: u64,
    },
    /// `file:PATH[,size=SIZE]`: a regular file, created or extended to
    /// SIZE when given.
    File {
        /// The file.
        path: String,
        /// Bytes, if given.
        size: Option<u64>,
    },
    /// `block:PATH[,direct]`: a block device, O_DIRECT with `direct`.
    Block {
        /// The device.
        path: String,
        /// O_DIRECT.
        direct: bool,
    },
}

impl LunSpec {
    /// Parses a specification. The error names the specification and
    /// what is wrong with it.
    pub fn parse(spec: &str) -> Result<LunSpec, String> {
        let mut latency = None;
        let mut plain = Vec::new();
        for option in spec.split(',') {
            match option.strip_prefix("latency=") {
                Some(value) => {
                    latency = Some(
                        humantime::parse_duration(value)
                            .map_err(|e| format!("LUN {spec:?}: latency {value:?}: {e}"))?,
                    );
                }
                None => plain.push(option),
            }
        }
        let (kind, rest) = plain
            .first()
            .and_then(|first| first.split_once(':'))
            .ok_or_else(|| {
                format!("LUN {spec:?}: ram:SIZE, file:PATH[,size=SIZE] or block:PATH")
            })?;
        let options = &plain[1..];
        let unknown = |option: &str| format!("LUN {spec:?}: unknown option {option:?}");
        let kind = match kind {
            "ram" => {
                if let Some(option) = options.first() {
                    return Err(unknown(option));
                }
                StoreKind::Ram {
                    size: parse_size(rest).map_err(|e| format!("LUN {spec:?}: {e}"))?,
                }
            }
            "file" => {
                if rest.is_empty() {
                    return Err(format!("LUN {spec:?}: file: needs a path"));
                }
                let mut size = None;
                for option in options {
                    match option.split_once('=') {
                        Some(("size", value)) => {
                            size =
                                Some(parse_size(value).map_err(|e| format!("LUN {spec:?}: {e}"))?)
                        }
                        _ => return Err(unknown(option)),
                    }
                }
                StoreKind::File {
                    path: rest.to_owned(),
                    size,
                }
            }
            "block" => {
                if rest.is_empty() {
                    return Err(format!("LUN {spec:?}: block: needs a path"));
                }
                let mut direct = false;
                for option in options {
                    match *option {
                        "direct" => direct = true,
                        _ => return Err(unknown(option)),
                    }
                }
                StoreKind::Block {
                    path: rest.to_owned(),
                    direct,
                }
            }
            other => {
                return Err(format!(
                    "LUN {spec:?}: unknown backstore {other:?} (ram, file or block)"
                ));
            }
        };
        Ok(LunSpec { kind, latency })
    }

    /// Opens the store with logical blocks of `block_size` bytes (512 or
    /// 4096; a block device keeps its own) and the LU identifier `id`.
    pub fn open(&self, block_size: u32, id: u64) -> Result<Arc<dyn Backstore>, String> {
        check_block_size(block_size)?;
        let store: Arc<dyn Backstore> = match &self.kind {
            StoreKind::Ram { size } => {
                Arc::new(RamBackstore::new(*size, block_size, id).map_err(|e| e.to_string())?)
            }
            StoreKind::File { path, size } => Arc::new(
                FileBackstore::open(path, *size, block_size, id).map_err(|e| e.to_string())?,
            ),
            StoreKind::Block { path, direct } => {
                Arc::new(BlockBackstore::open(path, *direct, id).map_err(|e| e.to_string())?)
            }
        };
        Ok(match self.latency {
            None => store,
            Some(latency) => Arc::new(SlowBackstore::new(store, latency)),
        })
    }
}

/// 512 or 4096: the logical block sizes every store supports.
pub(crate) fn check_block_size(block_size: u32) -> Result<(), String> {
    match block_size {
        512 | 4096 => Ok(()),
        _ => Err(format!("block size {block_size}: 512 or 4096")),
    }
}

/// Opens the backstore a LUN specification names: `ram:SIZE`,
/// `file:PATH[,size=SIZE]` (created or extended to SIZE when given) or
/// `block:PATH[,direct]` (a block device; `direct` opens it O_DIRECT); any
/// of them with `,latency=DURATION` (e.g. `20ms`) behind that latency
/// ([`SlowBackstore`]: a slow device, for tests of aborts and timeouts).
pub fn open_lun(spec: &str, block_size: u32, id: u64) -> Result<Arc<dyn Backstore>, String> {
    check_block_size(block_size)?;
    LunSpec::parse(spec)?
        .open(block_size, id)
        .map_err(|e| format!("LUN {spec:?}: {e}"))
}

/// A unique LU identifier: random high bits (so two targets on one
/// network do not collide), the LU's ordinal in the low bits.
pub fn unique_id(ordinal: u64) -> u64 {
    (u64::from(rand::random::<u32>()) << 16) | (ordinal & 0xFFFF)
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
    fn specs_parse_without_opening() {
        assert_eq!(
            LunSpec::parse("file:/nowhere/x.img,size=1G,latency=2ms").unwrap(),
            LunSpec {
                kind: StoreKind::File {
                    path: "/nowhere/x.img".into(),
                    size: Some(1 << 30)
                },
                latency: Some(Duration::from_millis(2)),
            }
        );
        for bad in [
            "ram",
            "ram:1M,direct",
            "file:",
            "block:/dev/x,fast",
            "nvme:1M",
            "ram:1Q",
        ] {
            let error = LunSpec::parse(bad).unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
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
}
