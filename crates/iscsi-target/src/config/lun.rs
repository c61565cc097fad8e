//! LUN specifications, shared by the command line and the file:
//! `ram:SIZE`, `file:PATH[,size=SIZE]`, `block:PATH[,direct]`,
//! `rbd:POOL/IMAGE[,conf=PATH][,id=USER][,timeout=SECONDS]` (a Ceph RBD image, through
//! librbd, which the first one to open loads: [`LunSpec::check_libraries`]),
//! `snapshot:LUN/NAME` (snapshot NAME of another LUN of the target, read-only)
//! and `clone:LUN/NAME[,to=DEST]` (a writable copy of one: [`StoreKind::Clone`]), each
//! optionally with the options of any store: `,latency=DURATION`,
//! `,readonly`, `,removable`, `,physical-block=SIZE`, `,encrypt[=KEYFILE]`. Parsing
//! ([`LunSpec::parse`]) opens nothing, so `iscsi target check` and a reload
//! can refuse a bad file before anything is touched; [`LunSpec::open`]
//! opens the store.

use iscsi_scsi::alua::GatewayGroup;
use std::sync::Arc;
use std::time::Duration;

use iscsi_scsi::{Backstore, LuOptions};
use iscsi_stores::{
    BlockBackstore, EncryptedBackstore, FileBackstore, RamBackstore, SlowBackstore, WithOptions,
};

/// What a LUN specification names, parsed but not opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LunSpec {
    /// The store.
    pub kind: StoreKind,
    /// `latency=DURATION`: every access waits this long first.
    pub latency: Option<Duration>,
    /// `readonly`, `removable`, `physical-block=SIZE`: what the LU reports
    /// and allows, whatever the store.
    pub options: LuOptions,
    /// `encrypt` or `encrypt=KEYFILE`: the store kept encrypted, and
    /// SANITIZE CRYPTOGRAPHIC ERASE offered.
    pub encrypt: Option<Encryption>,
}

/// Where an encrypted LUN's key is kept ([`EncryptedBackstore`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encryption {
    /// `encrypt`: a new key at each start, in memory only; for RAM LUNs,
    /// whose data does not outlive the target either.
    MemoryKey,
    /// `encrypt=KEYFILE`: the key in this file (64 bytes, created when
    /// missing), so the data outlives a restart.
    KeyFile(String),
}

/// The largest `physical-block`: LOGICAL BLOCKS PER PHYSICAL BLOCK
/// EXPONENT is 4 bits, and no device has physical blocks near 1 MiB.
const MAX_PHYSICAL_BLOCK: u64 = 1 << 20;

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
    /// `rbd:POOL/IMAGE[,conf=PATH][,id=USER][,timeout=SECONDS]`: a Ceph RBD image, on a
    /// RADOS client of the LU's own (`iscsi_ceph::RbdBackstore`).
    Rbd {
        /// The pool.
        pool: String,
        /// The image.
        image: String,
        /// `conf=PATH`: the ceph.conf; librados's default search when absent.
        conf: Option<String>,
        /// `id=USER`: the cephx user without `client.`; `admin` when absent.
        id: Option<String>,
        /// `timeout=SECONDS`: how long a cluster operation may take before
        /// the command fails NOT READY; the store's default when absent.
        timeout: Option<u32>,
    },
    /// `snapshot:LUN/NAME`: snapshot NAME of the target's LUN number LUN
    /// (taken by `iscsi target snapshot`), served read-only.
    Snapshot {
        /// The LUN it was taken of, in the same target.
        of: u16,
        /// Its name.
        name: String,
    },
    /// `clone:LUN/NAME[,to=DEST]`: a writable LUN that starts as snapshot
    /// NAME of LUN number LUN and shares what it does not change with it:
    /// in memory for a RAM LUN; the file DEST (made by reflink when
    /// missing, opened as it is when there) for a file LUN; the image DEST
    /// (`IMAGE` or `POOL/IMAGE`, made by `rbd clone` when missing) for RBD.
    Clone {
        /// The LUN whose snapshot it starts from, in the same target.
        of: u16,
        /// The snapshot.
        name: String,
        /// Where the clone lives (file and RBD).
        to: Option<String>,
    },
}

impl LunSpec {
    /// The size the specification names, if it names one (`ram:SIZE`,
    /// `file:PATH,size=SIZE`): what a reload resizes a running LUN to.
    pub fn size(&self) -> Option<u64> {
        match &self.kind {
            StoreKind::Ram { size } => Some(*size),
            StoreKind::File { size, .. } => *size,
            _ => None,
        }
    }

    /// The same store whatever its size: two specifications that differ
    /// only in the size name one store, which a reload resizes in place.
    pub fn same_store(&self, other: &LunSpec) -> bool {
        let sizeless = |spec: &LunSpec| {
            let mut spec = spec.clone();
            match &mut spec.kind {
                StoreKind::Ram { size } => *size = 0,
                StoreKind::File { size, .. } => *size = None,
                _ => {}
            }
            spec
        };
        sizeless(self) == sizeless(other)
    }

    /// The LUN of the same target that a `snapshot:` or `clone:` LUN opens
    /// from ([`LunSpec::open_from`]).
    pub fn origin(&self) -> Option<u16> {
        match &self.kind {
            StoreKind::Snapshot { of, .. } | StoreKind::Clone { of, .. } => Some(*of),
            _ => None,
        }
    }

    /// Parses a specification. The error names the specification and
    /// what is wrong with it.
    pub fn parse(spec: &str) -> Result<LunSpec, String> {
        let mut latency = None;
        let mut encrypt = None;
        let mut lu_options = LuOptions::DEFAULT;
        let mut plain = Vec::new();
        // The options every store takes; what is left is the store's own.
        for (i, option) in spec.split(',').enumerate() {
            match option.split_once('=') {
                _ if i == 0 => plain.push(option),
                Some(("latency", value)) => {
                    latency = Some(
                        humantime::parse_duration(value)
                            .map_err(|e| format!("LUN {spec:?}: latency {value:?}: {e}"))?,
                    );
                }
                Some(("physical-block", value)) => {
                    let size = parse_size(value)
                        .ok()
                        .filter(|&s| (512..=MAX_PHYSICAL_BLOCK).contains(&s) && s.is_power_of_two())
                        .ok_or_else(|| {
                            format!(
                                "LUN {spec:?}: physical-block {value:?}: a power of two \
                                 from 512 to 1M (a power-of-two multiple of the logical block size)"
                            )
                        })?;
                    lu_options.physical_block_size = u32::try_from(size).ok();
                }
                Some(("encrypt", "")) => {
                    return Err(format!("LUN {spec:?}: encrypt=KEYFILE needs a path"));
                }
                Some(("encrypt", path)) => encrypt = Some(Encryption::KeyFile(path.to_owned())),
                None if option == "encrypt" => encrypt = Some(Encryption::MemoryKey),
                None if option == "readonly" => lu_options.read_only = true,
                None if option == "removable" => lu_options.removable = true,
                _ => plain.push(option),
            }
        }
        let (kind, rest) = plain
            .first()
            .and_then(|first| first.split_once(':'))
            .ok_or_else(|| {
                format!(
                    "LUN {spec:?}: ram:SIZE, file:PATH[,size=SIZE], block:PATH, rbd:POOL/IMAGE, \
                     snapshot:LUN/NAME or clone:LUN/NAME"
                )
            })?;
        let own = &plain[1..];
        let unknown = |option: &str| format!("LUN {spec:?}: unknown option {option:?}");
        let kind = match kind {
            "ram" => {
                if let Some(option) = own.first() {
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
                for option in own {
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
                for option in own {
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
            "rbd" => {
                let (pool, image) = rest
                    .split_once('/')
                    .filter(|(pool, image)| !pool.is_empty() && !image.is_empty())
                    .ok_or_else(|| format!("LUN {spec:?}: rbd: needs POOL/IMAGE"))?;
                let (mut conf, mut id, mut timeout) = (None, None, None);
                for option in own {
                    match option.split_once('=') {
                        Some(("conf", path)) if !path.is_empty() => conf = Some(path.to_owned()),
                        Some(("id", user)) if !user.is_empty() => id = Some(user.to_owned()),
                        Some(("timeout", secs)) => {
                            timeout = Some(secs.parse().ok().filter(|&s: &u32| s > 0).ok_or_else(
                                || {
                                    format!(
                                        "LUN {spec:?}: timeout {secs:?}: a whole number of \
                                         seconds, at least 1"
                                    )
                                },
                            )?);
                        }
                        _ => return Err(unknown(option)),
                    }
                }
                StoreKind::Rbd {
                    pool: pool.to_owned(),
                    image: image.to_owned(),
                    conf,
                    id,
                    timeout,
                }
            }
            "snapshot" | "clone" => {
                let (of, name) = snapshot_of(rest).map_err(|e| format!("LUN {spec:?}: {e}"))?;
                let mut to = None;
                for option in own {
                    match option.split_once('=') {
                        Some(("to", dest)) if kind == "clone" && !dest.is_empty() => {
                            to = Some(dest.to_owned());
                        }
                        _ => return Err(unknown(option)),
                    }
                }
                if kind == "snapshot" {
                    // A snapshot never changes: the LU says so.
                    lu_options.read_only = true;
                    StoreKind::Snapshot { of, name }
                } else {
                    StoreKind::Clone { of, name, to }
                }
            }
            other => {
                return Err(format!(
                    "LUN {spec:?}: unknown backstore {other:?} (ram, file, block, rbd, snapshot \
                     or clone)"
                ));
            }
        };
        if encrypt.is_some() && matches!(kind, StoreKind::Snapshot { .. } | StoreKind::Clone { .. })
        {
            return Err(format!(
                "LUN {spec:?}: a snapshot or clone keeps what its origin holds: encrypt the origin \
                 instead"
            ));
        }
        if encrypt == Some(Encryption::MemoryKey) && !matches!(kind, StoreKind::Ram { .. }) {
            return Err(format!(
                "LUN {spec:?}: a file, block or rbd LUN needs encrypt=KEYFILE: with a key kept in \
                 memory its data would be unreadable after a restart"
            ));
        }
        Ok(LunSpec {
            kind,
            latency,
            options: lu_options,
            encrypt,
        })
    }

    /// Opens the store with logical blocks of `block_size` bytes (512 or
    /// 4096; a block device keeps its own) and the LU identifier `id`.
    pub fn open(&self, block_size: u32, id: u64) -> Result<Arc<dyn Backstore>, String> {
        self.open_in(block_size, id, None)
    }

    /// [`LunSpec::open`] in a gateway of `group`: an `rbd:` LUN joins the
    /// group (implicit ALUA, one owner at a time); the other kinds are
    /// served by this process alone and ignore it.
    pub fn open_in(
        &self,
        block_size: u32,
        id: u64,
        group: Option<&GatewayGroup>,
    ) -> Result<Arc<dyn Backstore>, String> {
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
            StoreKind::Rbd { .. } => open_rbd(&self.kind, block_size, group)?,
            StoreKind::Snapshot { of, .. } | StoreKind::Clone { of, .. } => {
                return Err(format!(
                    "opens from LUN {of} of its target, which only a configuration file's \
                     target gives"
                ));
            }
        };
        self.wrap(store)
    }

    /// A `snapshot:` or `clone:` LUN opened from `origin`, the store of the
    /// LUN it names ([`LunSpec::origin`]), with LU identifier `id`.
    pub fn open_from(&self, origin: &dyn Backstore, id: u64) -> Result<Arc<dyn Backstore>, String> {
        self.open_from_in(origin, None, id)
    }

    /// [`LunSpec::open_from`] in a gateway of `group`, `origin` given with
    /// its specification: an rbd clone joins the group (one owner at a
    /// time, implicit ALUA) as every `rbd:` LUN of a gateway does, rather
    /// than be written by every gateway at once.
    pub fn open_from_in(
        &self,
        origin: &dyn Backstore,
        in_group: Option<(&LunSpec, &GatewayGroup)>,
        id: u64,
    ) -> Result<Arc<dyn Backstore>, String> {
        let store = self.open_from_alone(origin, id)?;
        let Some((origin_spec, group)) = in_group else {
            return Ok(store);
        };
        let (
            StoreKind::Clone { to: Some(to), .. },
            StoreKind::Rbd {
                pool,
                conf,
                id: user,
                timeout,
                ..
            },
        ) = (&self.kind, &origin_spec.kind)
        else {
            return Ok(store);
        };
        // Made (or found) above; opened again, in the group.
        drop(store);
        let (pool, image) = to.split_once('/').unwrap_or((pool, to));
        let clone = StoreKind::Rbd {
            pool: pool.to_owned(),
            image: image.to_owned(),
            conf: conf.clone(),
            id: user.clone(),
            timeout: *timeout,
        };
        self.wrap(open_rbd(&clone, origin.block_size(), Some(group))?)
    }

    /// [`LunSpec::open_from`] outside any gateway group.
    fn open_from_alone(
        &self,
        origin: &dyn Backstore,
        id: u64,
    ) -> Result<Arc<dyn Backstore>, String> {
        let (of, name) = match &self.kind {
            StoreKind::Snapshot { of, name } | StoreKind::Clone { of, name, .. } => (of, name),
            _ => return Err("not a snapshot: or clone: LUN".into()),
        };
        let snapshots = origin
            .snapshots()
            .ok_or_else(|| format!("LUN {of} takes no snapshots"))?;
        let store = match &self.kind {
            StoreKind::Clone { to, .. } => snapshots.clone_into(name, to.as_deref(), id),
            _ => snapshots.open(name, id),
        }
        .map_err(|e| format!("LUN {of}: {e}"))?;
        self.wrap(store)
    }

    /// `store` with what the specification asks of any store: encryption,
    /// latency, LU options.
    fn wrap(&self, store: Arc<dyn Backstore>) -> Result<Arc<dyn Backstore>, String> {
        let store: Arc<dyn Backstore> = match &self.encrypt {
            None => store,
            Some(Encryption::MemoryKey) => {
                Arc::new(EncryptedBackstore::with_memory_key(store).map_err(|e| e.to_string())?)
            }
            Some(Encryption::KeyFile(path)) => Arc::new(
                EncryptedBackstore::with_key_file(store, std::path::Path::new(path))
                    .map_err(|e| format!("encrypt={path}: {e}"))?,
            ),
        };
        let store: Arc<dyn Backstore> = match self.latency {
            None => store,
            Some(latency) => Arc::new(SlowBackstore::new(store, latency)),
        };
        if self.options == LuOptions::DEFAULT {
            return Ok(store);
        }
        Ok(Arc::new(WithOptions::new(store, self.options)?))
    }

    /// Checks what opening needs of this machine beyond the specification:
    /// for an `rbd:` LUN, that librbd loads (loading it, once per process).
    /// The error says what to install ("librbd.so.1 not found: install
    /// librbd1"). What `iscsi target check` runs, so that a file is refused
    /// on a gateway without Ceph's libraries before a reload opens anything.
    pub fn check_libraries(&self) -> Result<(), String> {
        match self.kind {
            StoreKind::Rbd { .. } => {
                iscsi_ceph::RbdBackstore::load_library().map_err(|e| e.to_string())
            }
            StoreKind::Ram { .. }
            | StoreKind::File { .. }
            | StoreKind::Block { .. }
            | StoreKind::Snapshot { .. }
            | StoreKind::Clone { .. } => Ok(()),
        }
    }

    /// What identifies the medium: the kind of store and its path (a RAM
    /// store has none), without sizes or options, so that a LUN keeps its
    /// identifiers when it is made read-only or grown.
    fn medium(&self) -> String {
        match &self.kind {
            StoreKind::Ram { .. } => "ram".to_owned(),
            StoreKind::File { path, .. } => format!("file:{path}"),
            StoreKind::Block { path, .. } => format!("block:{path}"),
            StoreKind::Rbd { pool, image, .. } => format!("rbd:{pool}/{image}"),
            StoreKind::Snapshot { of, name } => format!("snapshot:{of}/{name}"),
            StoreKind::Clone { of, name, to } => match to {
                Some(to) => format!("clone:{to}"),
                None => format!("clone:{of}/{name}"),
            },
        }
    }

    /// The LU identifier of this LUN numbered `lun` of target `target`
    /// (see [`unique_id`]).
    pub fn unique_id(&self, target: &str, lun: u16) -> u64 {
        unique_id(target, lun, &self.medium())
    }
}

/// `LUN/NAME` of `snapshot:LUN/NAME` and `clone:LUN/NAME`.
fn snapshot_of(text: &str) -> Result<(u16, String), String> {
    let (of, name) = text.split_once('/').ok_or_else(|| {
        format!("{text:?}: LUN/NAME (the LUN a snapshot was taken of, and its name)")
    })?;
    let of = of
        .parse::<u16>()
        .ok()
        .filter(|&n| usize::from(n) < iscsi_scsi::MAX_LUNS)
        .ok_or_else(|| format!("{of:?}: a LUN number, 0..={}", iscsi_scsi::MAX_LUNS - 1))?;
    iscsi_scsi::backstore::check_snapshot_name(name).map_err(|e| e.to_string())?;
    Ok((of, name.to_owned()))
}

/// Opens an [`StoreKind::Rbd`] (its LU identifier comes from the cluster
/// and the image, the same in every gateway: see `RbdBackstore::open`).
fn open_rbd(
    kind: &StoreKind,
    block_size: u32,
    group: Option<&GatewayGroup>,
) -> Result<Arc<dyn Backstore>, String> {
    let StoreKind::Rbd {
        pool,
        image,
        conf,
        id,
        timeout,
    } = kind
    else {
        unreachable!("open_rbd is called for rbd LUNs only")
    };
    let spec = iscsi_ceph::RbdSpec {
        pool: pool.clone(),
        image: image.clone(),
        conf: conf.clone(),
        id: id.clone(),
        timeout_s: *timeout,
    };
    Ok(Arc::new(
        iscsi_ceph::RbdBackstore::open_in_group(&spec, block_size, group)
            .map_err(|e| e.to_string())?,
    ))
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
/// ([`SlowBackstore`]: a slow device, for tests of aborts and timeouts),
/// with `,readonly`, `,removable` or `,physical-block=SIZE`
/// ([`LuOptions`]), and with `,encrypt[=KEYFILE]` kept encrypted under a
/// key of its own ([`EncryptedBackstore`]: SANITIZE CRYPTOGRAPHIC ERASE).
///
/// The store's LU identifier comes from `target` and `lun`
/// ([`LunSpec::unique_id`]).
pub fn open_lun(
    spec: &str,
    block_size: u32,
    target: &str,
    lun: u16,
) -> Result<Arc<dyn Backstore>, String> {
    open_lun_in(spec, block_size, target, lun, None)
}

/// [`open_lun`] in a gateway of `group` (see [`LunSpec::open_in`]).
pub fn open_lun_in(
    spec: &str,
    block_size: u32,
    target: &str,
    lun: u16,
    group: Option<&GatewayGroup>,
) -> Result<Arc<dyn Backstore>, String> {
    check_block_size(block_size)?;
    let parsed = LunSpec::parse(spec)?;
    parsed
        .open_in(block_size, parsed.unique_id(target, lun), group)
        .map_err(|e| format!("LUN {spec:?}: {e}"))
}

/// The identifier of the LU numbered `lun` of target `target` whose medium
/// is `medium` (`ram`, `file:PATH`, `block:PATH`): the extension of its NAA
/// designator and its unit serial number (VPD 83h, 80h). A hash (64-bit
/// FNV-1a, fixed by its definition, unlike std's hasher) of the three, so
/// it is the same at every start of the target (multipath and udev name
/// devices by it) and differs between LUs, targets (iSCSI names are
/// unique on a network) and media.
pub fn unique_id(target: &str, lun: u16, medium: &str) -> u64 {
    let mut hash: u64 = 0xCBF2_9CE4_8422_2325;
    let lun = lun.to_be_bytes();
    for part in [target.as_bytes(), &[0], &lun, &[0], medium.as_bytes()] {
        for &byte in part {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01B3);
        }
    }
    hash
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
                options: LuOptions::DEFAULT,
                encrypt: None,
            }
        );
        assert_eq!(
            LunSpec::parse("ram:1M,encrypt").unwrap().encrypt,
            Some(Encryption::MemoryKey)
        );
        assert_eq!(
            LunSpec::parse("file:/x.img,encrypt=/keys/x.key")
                .unwrap()
                .encrypt,
            Some(Encryption::KeyFile("/keys/x.key".into()))
        );
        assert_eq!(
            LunSpec::parse("ram:64M,readonly,removable,physical-block=4K")
                .unwrap()
                .options,
            LuOptions {
                read_only: true,
                removable: true,
                physical_block_size: Some(4096),
            }
        );
        let block = LunSpec::parse("block:/dev/x,direct,readonly").unwrap();
        assert!(
            block.options.read_only
                && block.kind
                    == StoreKind::Block {
                        path: "/dev/x".into(),
                        direct: true
                    }
        );
        assert_eq!(
            LunSpec::parse("rbd:rbd/img,conf=/etc/ceph/x.conf,id=gw,timeout=5,readonly")
                .unwrap()
                .kind,
            StoreKind::Rbd {
                pool: "rbd".into(),
                image: "img".into(),
                conf: Some("/etc/ceph/x.conf".into()),
                id: Some("gw".into()),
                timeout: Some(5),
            }
        );
        assert_eq!(
            LunSpec::parse("rbd:p/i").unwrap().kind,
            StoreKind::Rbd {
                pool: "p".into(),
                image: "i".into(),
                conf: None,
                id: None,
                timeout: None,
            }
        );
        for bad in [
            "rbd:p/i,timeout=0",
            "rbd:p/i,timeout=",
            "rbd:p/i,timeout=1.5",
            "rbd:img",
            "rbd:/img",
            "rbd:pool/",
            "rbd:p/i,conf=",
            "rbd:p/i,id=",
            "rbd:p/i,direct",
            "rbd:p/i,encrypt",
            "ram",
            "ram:1M,direct",
            "file:",
            "block:/dev/x,fast",
            "nvme:1M",
            "ram:1Q",
            "ram:1M,physical-block=3000",
            "ram:1M,physical-block=256",
            "ram:1M,read-only",
            "file:/x,removable=yes",
            "file:/x.img,encrypt",
            "block:/dev/x,encrypt",
            "ram:1M,encrypt=",
            "snapshot:0",
            "snapshot:x/name",
            "snapshot:16384/name",
            "snapshot:0/",
            "snapshot:0/../up",
            "snapshot:0/a b",
            "snapshot:0/n,to=/x",
            "clone:0/n,to=",
            "clone:0/n,size=1G",
            "clone:0/n,encrypt=/k",
            "snapshot:0/n,encrypt",
        ] {
            let error = LunSpec::parse(bad).unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn snapshots_and_clones_name_their_origin() {
        let snapshot = LunSpec::parse("snapshot:3/nightly,latency=1ms").unwrap();
        assert_eq!(
            snapshot.kind,
            StoreKind::Snapshot {
                of: 3,
                name: "nightly".into()
            }
        );
        assert!(snapshot.options.read_only, "a snapshot is served read-only");
        assert_eq!(snapshot.origin(), Some(3));
        let clone = LunSpec::parse("clone:0/nightly,to=/srv/vm.img").unwrap();
        assert_eq!(
            clone.kind,
            StoreKind::Clone {
                of: 0,
                name: "nightly".into(),
                to: Some("/srv/vm.img".into())
            }
        );
        assert!(!clone.options.read_only);
        assert_eq!(LunSpec::parse("ram:1M").unwrap().origin(), None);
        assert_ne!(snapshot.unique_id("t", 1), clone.unique_id("t", 1));
        // Alone (the command line's --lun), there is no origin to open from.
        let alone = open_lun("snapshot:0/nightly", 512, "t", 1).unwrap_err();
        assert!(alone.contains("configuration file"), "{alone}");
        // From a store that takes none, and a snapshot not there.
        let plain = open_lun("block:/dev/null", 512, "t", 0);
        if let Ok(plain) = plain {
            let none = snapshot.open_from(&*plain, 1).unwrap_err();
            assert!(none.contains("takes no snapshots"), "{none}");
        }
        let ram = open_lun("ram:1M", 512, "t", 0).unwrap();
        let missing = snapshot.open_from(&*ram, 1).unwrap_err();
        assert!(
            missing.contains("no snapshot named \"nightly\""),
            "{missing}"
        );
    }

    #[test]
    fn lun_specs() {
        assert!(open_lun("ram:1M", 512, "t", 1).is_ok());
        let encrypted = open_lun("ram:1M,encrypt,latency=1ms,readonly", 512, "t", 1).unwrap();
        assert!(encrypted.can_crypto_erase() && encrypted.lend(0, 512).is_none());
        assert!(!open_lun("ram:1M", 512, "t", 1).unwrap().can_crypto_erase());
        let missing = open_lun("ram:1M,encrypt=/nonexistent/dir/k", 512, "t", 1).unwrap_err();
        assert!(missing.contains("encrypt=/nonexistent/dir/k"), "{missing}");
        assert!(open_lun("ram:1M", 1024, "t", 1).is_err());
        assert!(open_lun("nvme:1M", 512, "t", 1).is_err());
        assert!(open_lun("ram", 512, "t", 1).is_err());
        // The options reach the LU whatever the store, and a physical
        // block must be a power-of-two multiple of the logical one.
        let ro = open_lun("ram:1M,readonly,physical-block=4096", 512, "t", 1).unwrap();
        assert!(ro.lu_options().read_only);
        assert_eq!(ro.lu_options().lbppbe(512), 3);
        let small = open_lun("ram:1M,physical-block=512", 4096, "t", 1).unwrap_err();
        assert!(small.contains("power-of-two multiple"), "{small}");
        let dir = std::env::temp_dir().join(format!("iscsi-rs-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lun.img");
        let spec = format!("file:{},size=1M", path.display());
        let lun = open_lun(&spec, 4096, "t", 2).unwrap();
        assert_eq!(lun.block_count(), 256);
        // Reopened without a size: the file's own length.
        let again = open_lun(&format!("file:{}", path.display()), 512, "t", 2).unwrap();
        assert_eq!(again.block_count(), 2048);
        // The same LU at the next start: the same identifier.
        assert_eq!(again.unique_id(), lun.unique_id());
        let removable = format!("file:{},removable,size=1M", path.display());
        assert!(
            open_lun(&removable, 512, "t", 2)
                .unwrap()
                .lu_options()
                .removable
        );
        assert!(open_lun(&format!("file:{},colour=red", path.display()), 512, "t", 2).is_err());
        // Behind a latency: the store is the same, every access slower,
        // and its commands leave the runtime's threads (may_block).
        let slow = open_lun(&format!("file:{},latency=5ms", path.display()), 512, "t", 2).unwrap();
        assert!(slow.may_block() && slow.block_count() == 2048);
        let ram = open_lun("ram:1M,latency=1ms", 512, "t", 3).unwrap();
        assert!(ram.may_block() && ram.block_count() == 2048);
        let started = std::time::Instant::now();
        ram.flush().unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_millis(1));
        let bad = open_lun("ram:1M,latency=soon", 512, "t", 3).unwrap_err();
        assert!(bad.contains("latency \"soon\""), "{bad}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unique_ids_are_stable_and_tell_lus_apart() {
        let id = unique_id("iqn.a", 0, "ram");
        assert_eq!(id, unique_id("iqn.a", 0, "ram"));
        assert_ne!(id, unique_id("iqn.a", 1, "ram"));
        assert_ne!(id, unique_id("iqn.b", 0, "ram"));
        assert_ne!(id, unique_id("iqn.a", 0, "file:/x"));
        // Pinned: a change here renames every LU of every user.
        assert_eq!(id, 0x3d9d_1c0e_f550_5d9a);
        let a = LunSpec::parse("ram:1G,readonly").unwrap();
        let b = LunSpec::parse("ram:2G").unwrap();
        assert_eq!(a.unique_id("t", 4), b.unique_id("t", 4));
    }
}
