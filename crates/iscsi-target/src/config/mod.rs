//! What a target serves: its portals, targets and their LUNs, CHAP and the
//! negotiation values it offers.

pub mod file;
mod limits;
pub mod lun;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use iscsi_datamover::tap::WireTap;
use iscsi_proto::login::chap::{ChapAlgorithm, Credentials};
use iscsi_proto::login::target::ChapRequirement;
use iscsi_proto::text::{Digest, NegotiationConfig, TextPair};
use iscsi_scsi::Backstore;

/// One iSCSI target: a name and its logical units.
#[derive(Clone, Debug)]
pub struct TargetEntry {
    /// The iSCSI name (`iqn....`).
    pub name: String,
    /// An alias shown to initiators.
    pub alias: Option<String>,
    /// The logical units by LUN number.
    pub luns: BTreeMap<u16, LunEntry>,
    /// CHAP the initiator must pass (and, for mutual CHAP, the target's
    /// own credentials).
    pub chap: Option<ChapRequirement>,
    /// Initiator names allowed to log in; empty allows all.
    pub allowed_initiators: Vec<String>,
    /// QoS limits on its LUNs and initiators (`crate::qos`).
    pub limits: Vec<crate::qos::LimitEntry>,
}

/// One logical unit of a target: its store, and the specification it was
/// opened from, which a reload compares to tell a kept LUN (same
/// specification and block size: the store stays, with its data and
/// sessions) from a changed one.
#[derive(Clone, Debug)]
pub struct LunEntry {
    /// The store.
    pub store: Arc<dyn Backstore>,
    /// `ram:1G`, `file:/srv/a.img`... (`lun::LunSpec`); a store built in
    /// code has a description instead, which no file repeats.
    pub spec: String,
}

impl TargetEntry {
    /// A target with no alias, CHAP or ACL whose LUNs are `stores`,
    /// numbered from 0 in order.
    pub fn new(name: impl Into<String>, stores: Vec<Arc<dyn Backstore>>) -> Self {
        TargetEntry {
            name: name.into(),
            alias: None,
            luns: numbered(stores),
            chap: None,
            allowed_initiators: Vec::new(),
            limits: Vec::new(),
        }
    }

    /// A target with one-way CHAP for `user`/`secret` (every algorithm).
    pub fn require_chap(&mut self, user: &str, secret: &str) {
        self.chap = Some(ChapRequirement {
            algorithms: ChapAlgorithm::ALL.to_vec(),
            initiator: Credentials::new(user, secret),
            mutual: None,
        });
    }
}

/// `stores` as LUNs 0, 1, ... in order, each described as built in code.
pub fn numbered(stores: Vec<Arc<dyn Backstore>>) -> BTreeMap<u16, LunEntry> {
    (0u16..)
        .zip(stores)
        .map(|(n, store)| {
            let spec = format!("(store {n} built in code)");
            (n, LunEntry { store, spec })
        })
        .collect()
}

/// Everything `iscsi target` serves.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// Portals to listen on (iSCSI over TCP).
    pub listen: Vec<SocketAddr>,
    /// iSER portals (RFC 7145 over iWARP: MPA, DDP and RDMAP over TCP).
    /// An iWARP listener takes its TCP port, so it cannot share one with
    /// a TCP portal.
    pub iser: Vec<SocketAddr>,
    /// The targets.
    pub targets: Vec<TargetEntry>,
    /// The Target Portal Group Tag of every portal; also the relative
    /// target port identifier of this target's port (each I_T nexus's), and
    /// in a gateway group this gateway's id and its target port group.
    pub portal_group_tag: u16,
    /// The relative target port identifiers (portal group tags) of every
    /// gateway of the group this target is one of, the same list in every
    /// gateway's configuration; empty: not in a group. Its RBD LUs then
    /// answer with implicit ALUA, owned by one gateway at a time
    /// (`iscsi_scsi::alua`); every other LU is unaffected.
    pub gateway_group: Vec<u16>,
    /// What the target offers and accepts in negotiation.
    pub negotiation: NegotiationConfig,
    /// MaxCmdSN - ExpCmdSN + 1: commands an initiator may have queued.
    pub command_window: u32,
    /// After this long without a PDU from the initiator, the target sends
    /// a NOP-In ping (RFC 7143 11.19) and drops the connection if no
    /// NOP-Out answers within the same time again. `None`: no pings.
    pub nop_in_interval: Option<std::time::Duration>,
    /// Bytes of idle data buffers (write buffers and pieces, READ scratch)
    /// each connection keeps for reuse, at most; buffers beyond it are
    /// freed once their command is done. It bounds what the target holds
    /// between bursts; what commands in flight hold is bounded by the
    /// command window times MaxBurstLength. [`DEFAULT_BUFFER_POOL_BYTES`].
    pub buffer_pool_bytes: usize,
    /// The socket send buffer each TCP connection asks for (SO_SNDBUF;
    /// Linux doubles it and caps it at `net.core.wmem_max`). `None`: the
    /// kernel's autotuning. [`DEFAULT_SEND_BUFFER_BYTES`].
    pub send_buffer_bytes: Option<usize>,
    /// Runtime shards (one thread and runtime per core, `shards.rs`) the
    /// connections are spread over. `None`: one per CPU the process may
    /// run on (its affinity mask: `taskset -c 0-3 iscsi target` runs
    /// four). Read when the target starts.
    pub cores: Option<usize>,
    /// The IEEE company ID (24-bit OUI or CID) in the NAA designator of
    /// every LU (VPD page 83h): `--naa-company-id`, `naa_company_id` in the
    /// file; [`iscsi_scsi::spc::NAA_COMPANY_ID`] (LIO's) unless configured.
    /// Read when the target starts.
    pub naa_company_id: u32,
    /// Told of every PDU each connection sends and receives and of the
    /// steps between them (SCSI execution, the wait for the connection's
    /// writer): `iscsi target --trace`. `None`: connections are not tapped.
    pub tap: Option<Arc<dyn WireTap>>,
}

/// [`TargetConfig::buffer_pool_bytes`] unless configured: 64 MiB per
/// connection, room for what 16 writes of 1 MiB in flight and their reads
/// use without allocating again.
pub const DEFAULT_BUFFER_POOL_BYTES: usize = 64 << 20;

/// [`TargetConfig::send_buffer_bytes`] unless configured: 4 MiB asked,
/// so 8 MiB where `net.core.wmem_max` allows 4 MiB (Debian's default), the
/// most autotuning would reach being `tcp_wmem`'s 4 MiB. Measured
/// (docs/performance.md): 1 MiB reads at QD 16 under libiscsi's iscsi-perf
/// 7-12% faster and 9-12% less target CPU per read; our initiator, which
/// drains its socket at once, and 4 KiB reads unchanged.
pub const DEFAULT_SEND_BUFFER_BYTES: usize = 4 << 20;

/// [`TargetConfig::send_buffer_bytes`] as configured in KiB (`iscsi target
/// --send-buffer-kib`, `send_buffer_kib` in the file): 0 leaves the buffer
/// to the kernel's autotuning.
pub fn send_buffer_from_kib(kib: usize) -> Option<usize> {
    (kib > 0).then(|| kib.saturating_mul(1 << 10))
}

/// `id` if it fits the 24 bits of an IEEE company ID.
pub fn check_company_id(id: u32) -> Result<u32, String> {
    if id > 0xFF_FFFF {
        return Err(format!(
            "{id:#x} is not a 24-bit IEEE company ID (OUI or CID)"
        ));
    }
    Ok(id)
}

/// Checks a gateway group (`gateway_group`, `--gateway-group`) as seen by
/// the gateway whose portal group tag is `port`: every gateway lists the
/// same members, itself among them, so a list without `port` is a
/// mistake, as are two of the same and a group of one (which would be
/// ALUA with nothing to fail over to). Returns the members ascending.
pub fn check_gateway_group(port: u16, members: &[u16]) -> Result<Vec<u16>, String> {
    let mut sorted = members.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != members.len() {
        return Err(format!("{members:?} names a gateway twice"));
    }
    if !sorted.contains(&port) {
        return Err(format!(
            "{members:?} does not hold this gateway's portal group tag {port}"
        ));
    }
    if sorted.len() < 2 {
        return Err(format!("{members:?}: a group needs two gateways or more"));
    }
    Ok(sorted)
}

/// Parses an IEEE company ID as `--naa-company-id` takes it: hex, as
/// `0x001405`, `001405` or `00-14-05` (`:` also separates).
pub fn parse_company_id(text: &str) -> Result<u32, String> {
    let digits: String = text
        .trim()
        .trim_start_matches("0x")
        .trim_start_matches("0X")
        .chars()
        .filter(|&c| c != '-' && c != ':')
        .collect();
    if digits.is_empty() || digits.len() > 6 {
        return Err(format!("{text:?}: 6 hex digits (0x001405, 00-14-05)"));
    }
    let id = u32::from_str_radix(&digits, 16)
        .map_err(|_| format!("{text:?}: 6 hex digits (0x001405, 00-14-05)"))?;
    check_company_id(id)
}

impl TargetConfig {
    /// This gateway's place in its group, if it is in one.
    pub fn gateway(&self) -> Option<iscsi_scsi::alua::GatewayGroup> {
        (!self.gateway_group.is_empty()).then(|| {
            iscsi_scsi::alua::GatewayGroup::new(
                self.portal_group_tag,
                self.gateway_group.iter().copied(),
            )
            .reached_at(&self.listen)
        })
    }

    /// The negotiation values a target built for throughput offers: big
    /// PDUs and bursts, immediate and unsolicited data, several R2Ts,
    /// digests if the initiator wants them (RFC 7143 section 13).
    pub fn default_negotiation() -> NegotiationConfig {
        NegotiationConfig {
            header_digest: vec![Digest::None, Digest::Crc32c],
            data_digest: vec![Digest::None, Digest::Crc32c],
            max_connections: 8,
            initial_r2t: false,
            immediate_data: true,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 262_144,
            max_outstanding_r2t: 8,
            // ERL 2: SNACKs for Data-In and statuses (1), and connection
            // recovery with TASK REASSIGN (2); the lower of this and the
            // initiator's offer is used (RFC 7143 13.20).
            error_recovery_level: 2,
            ..NegotiationConfig::default()
        }
    }

    /// The declarations a target makes in its first login response.
    pub(crate) fn declarations(&self, target: Option<&TargetEntry>) -> Vec<TextPair> {
        let mut declarations = vec![TextPair::new(
            "TargetPortalGroupTag",
            self.portal_group_tag.to_string(),
        )];
        if let Some(alias) = target.and_then(|t| t.alias.clone()) {
            declarations.push(TextPair::new("TargetAlias", alias));
        }
        declarations
    }
}
