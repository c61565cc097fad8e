//! Asymmetric logical unit access (SPC-4 §5.16): implicit ALUA for an LU
//! that several target ports in different processes serve (the gateways of
//! a group in front of one RBD image), each in a target port group of its
//! own.
//!
//! The SCSI layer does not decide who owns an LU: something outside it (the
//! RBD store's lock keeper) holds an [`AluaGroup`] and sets its
//! [`AluaView`]; an LU whose store returns one from
//! [`crate::backstore::Backstore::alua`] then answers
//! - INQUIRY with TPGS 01b (implicit ALUA only: there is no SET TARGET PORT
//!   GROUPS, the owner is chosen from the cluster's state, not by a host),
//!   and VPD 83h with the relative target port and target port group of
//!   the nexus's port;
//! - REPORT TARGET PORT GROUPS from the view, byte for byte the same on
//!   every port that has the same view (no per-port status code);
//! - every command with the access rules of the state of the nexus's group
//!   ([`gate`]); and, once per change of the view, UNIT ATTENTION
//!   ASYMMETRIC ACCESS STATE CHANGED for every nexus of the LU.
//!
//! An LU without a group (every local store) keeps TPGS 0 and no RTPG:
//! nothing here runs for it.
//!
//! Each target port group holds one target port, and its id is that port's
//! relative target port identifier: a gateway is one port, and the group
//! id then says which gateway it is without a second numbering.

use std::sync::Mutex;

use arc_swap::ArcSwap;
use std::sync::{Arc, PoisonError};

use crate::cdb::{self, opcode::*};
use iscsi_sense::{Asc, Sense, SenseKey};

/// MAINTENANCE IN service action REPORT TARGET PORT GROUPS (SPC-4 §6.36).
pub const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0A;

/// IMPLICIT TRANSITION TIME of the extended header, in seconds: how long a
/// host should wait for a move between gateways (the group's failover goal
/// is under 10 s).
pub const IMPLICIT_TRANSITION_SECS: u8 = 10;

/// An asymmetric access state (SPC-4 Table 171). Never active/non-optimized:
/// a path that accepts I/O without owning the image is what makes an
/// implicit-ALUA gateway's lock move back and forth between gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessState {
    /// Active/optimized: the port of the gateway that owns the LU.
    ActiveOptimized,
    /// Standby: another gateway owns the LU; this one could take it.
    Standby,
    /// Unavailable: this gateway cannot serve the LU (fenced, or not a
    /// member of the group).
    Unavailable,
    /// Transitioning: nobody owns the LU now (a takeover under way).
    Transitioning,
}

impl AccessState {
    /// The ASYMMETRIC ACCESS STATE code.
    pub const fn code(self) -> u8 {
        match self {
            Self::ActiveOptimized => 0x0,
            Self::Standby => 0x2,
            Self::Unavailable => 0x3,
            Self::Transitioning => 0xF,
        }
    }
}

/// The support bits every group descriptor reports: T_SUP (bit 7), U_SUP
/// (bit 3), S_SUP (bit 2), AO_SUP (bit 0): the states [`AccessState`] has.
const SUPPORTED_STATES: u8 = 0x80 | 0x08 | 0x04 | 0x01;

/// One target port group: its id (= its one port's relative target port
/// identifier) and its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortGroup {
    /// TARGET PORT GROUP, and the RELATIVE TARGET PORT IDENTIFIER of its
    /// one port.
    pub id: u16,
    /// Its asymmetric access state.
    pub state: AccessState,
}

/// What every port of the LU reports: the groups, by ascending id (the
/// order REPORT TARGET PORT GROUPS lists them in, so that two gateways with
/// the same view answer with the same bytes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AluaView {
    groups: Vec<PortGroup>,
}

impl AluaView {
    /// A view of `groups`, sorted by id; of two groups with the same id the
    /// first is kept.
    pub fn new(groups: impl IntoIterator<Item = PortGroup>) -> Self {
        let mut groups: Vec<PortGroup> = groups.into_iter().collect();
        groups.sort_by_key(|g| g.id);
        groups.dedup_by_key(|g| g.id);
        Self { groups }
    }

    /// The view of a group of gateways `members` of which `owner` (if any)
    /// owns the LU: the owner active/optimized, every other member standby;
    /// with no owner, every member transitioning.
    pub fn owned_by(members: impl IntoIterator<Item = u16>, owner: Option<u16>) -> Self {
        Self::new(members.into_iter().map(|id| PortGroup {
            id,
            state: match owner {
                None => AccessState::Transitioning,
                Some(o) if o == id => AccessState::ActiveOptimized,
                Some(_) => AccessState::Standby,
            },
        }))
    }

    /// The groups, by ascending id.
    pub fn groups(&self) -> &[PortGroup] {
        &self.groups
    }

    /// The state of relative target port `port`: its group's, or
    /// unavailable for a port in no group (a gateway the group does not
    /// list must not serve the LU).
    pub fn state_of(&self, port: u16) -> AccessState {
        self.groups
            .iter()
            .find(|g| g.id == port)
            .map_or(AccessState::Unavailable, |g| g.state)
    }
}

/// Where this process stands in a group of gateways: its own relative
/// target port (the target's portal group tag, which is also its target
/// port group) and every member's, the same list in every gateway's
/// configuration, so that REPORT TARGET PORT GROUPS lists the same groups
/// everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayGroup {
    /// This gateway's relative target port identifier.
    pub port: u16,
    /// Every member's, this one's included, ascending.
    pub members: Vec<u16>,
    /// The address the peers reach this gateway at (its first TCP portal
    /// bound to one address), where it answers their liveness probes so
    /// that a killed gateway is told from a slow one at once; `None`
    /// (portals on the unspecified address only): its death is seen by
    /// its heartbeat alone.
    pub address: Option<std::net::IpAddr>,
}

impl GatewayGroup {
    /// A group of `members` seen from `port`; `port` is added to the
    /// members if they leave it out.
    pub fn new(port: u16, members: impl IntoIterator<Item = u16>) -> Self {
        let mut members: Vec<u16> = members.into_iter().chain([port]).collect();
        members.sort_unstable();
        members.dedup();
        Self {
            port,
            members,
            address: None,
        }
    }

    /// The group with its [`GatewayGroup::address`] taken from the
    /// gateway's TCP portals: the first one bound to one address.
    pub fn reached_at(self, portals: &[std::net::SocketAddr]) -> Self {
        let address = portals
            .iter()
            .map(std::net::SocketAddr::ip)
            .find(|ip| !ip.is_unspecified());
        Self { address, ..self }
    }
}

/// The shared, changing [`AluaView`] of one LU: set by its owner-keeper,
/// read by every command to the LU without a lock.
#[derive(Debug, Default)]
pub struct AluaGroup {
    /// The view and the number of changes it has seen; swapped whole.
    current: ArcSwap<(u64, AluaView)>,
    /// Serialises [`AluaGroup::set`], so that two changes at once cannot
    /// share a generation.
    writer: Mutex<()>,
}

impl AluaGroup {
    /// A group whose view starts as `view` (generation 0: no unit
    /// attention for the view an LU starts with).
    pub fn new(view: AluaView) -> Self {
        Self {
            current: ArcSwap::from_pointee((0, view)),
            writer: Mutex::new(()),
        }
    }

    /// Replaces the view. A view equal to the current one changes nothing;
    /// any other one is a new generation, which every LU of the group
    /// reports to each of its nexuses once as ASYMMETRIC ACCESS STATE
    /// CHANGED.
    pub fn set(&self, view: AluaView) {
        let _w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let cur = self.current.load();
        if cur.1 != view {
            self.current.store(Arc::new((cur.0 + 1, view)));
        }
    }

    /// The current view.
    pub fn view(&self) -> AluaView {
        self.current.load().1.clone()
    }

    /// The number of changes of the view so far.
    pub fn generation(&self) -> u64 {
        self.current.load().0
    }

    /// The state of relative target port `port` now.
    pub fn state_of(&self, port: u16) -> AccessState {
        self.current.load().1.state_of(port)
    }
}

/// NOT READY / LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE
/// TRANSITION (04h/0Ah).
pub const NOT_ACCESSIBLE_TRANSITION: Sense =
    Sense::new(SenseKey::NotReady, Asc::ALUA_STATE_TRANSITION);
/// NOT READY / LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE
/// (04h/0Bh).
pub const NOT_ACCESSIBLE_STANDBY: Sense = Sense::new(SenseKey::NotReady, Asc::ALUA_STANDBY);
/// NOT READY / LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE
/// STATE (04h/0Ch).
pub const NOT_ACCESSIBLE_UNAVAILABLE: Sense = Sense::new(SenseKey::NotReady, Asc::ALUA_UNAVAILABLE);
/// UNIT ATTENTION / ASYMMETRIC ACCESS STATE CHANGED (2Ah/06h).
pub const STATE_CHANGED: Sense = Sense::unit_attention(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);

/// Whether `cdb` is REPORT TARGET PORT GROUPS.
pub fn is_rtpg(cdb: &[u8]) -> bool {
    cdb.first() == Some(&MAINTENANCE_IN)
        && cdb
            .get(1)
            .is_some_and(|b| b & 0x1F == SA_REPORT_TARGET_PORT_GROUPS)
}

/// Whether a port in `state` runs `cdb`; the sense it fails with if not.
///
/// Standby runs what SPC-4 §5.16.2.4.5 requires of it that this target
/// has: INQUIRY, MODE SENSE/SELECT, REPORT LUNS, REQUEST SENSE, PERSISTENT
/// RESERVE IN/OUT (reservations are the LU's, not the path's), and the
/// MAINTENANCE IN reports (REPORT TARGET PORT GROUPS; the two REPORT
/// SUPPORTED reports only describe the device server); and READ CAPACITY
/// (10) and (16), which the list leaves to the device server: Linux's sd
/// reads the capacity once, when it finds the disk, and does not read it
/// again when the path becomes active, so a standby path that refused it
/// stays a disk of 0 blocks, and every write dm-multipath moves to it
/// after a failover ends "access beyond end of device" (the
/// multipath-failover VM job; LIO answers READ CAPACITY(16) in standby for
/// the same reason). Unavailable and
/// transitioning run only INQUIRY, REPORT LUNS, REQUEST SENSE and REPORT
/// TARGET PORT GROUPS (§5.16.2.4.6, §5.16.2.4.8). TEST UNIT READY is in
/// neither list: a standby path answers it NOT READY, which is how a
/// multipath path checker learns the path is a standby one.
pub fn gate(state: AccessState, cdb: &[u8]) -> Result<(), Sense> {
    let op = cdb.first().copied().unwrap_or(0);
    let always = matches!(op, INQUIRY | REPORT_LUNS | REQUEST_SENSE) || is_rtpg(cdb);
    match state {
        AccessState::ActiveOptimized => Ok(()),
        _ if always => Ok(()),
        AccessState::Standby => match op {
            MODE_SENSE_6
            | MODE_SENSE_10
            | MODE_SELECT_6
            | MODE_SELECT_10
            | PERSISTENT_RESERVE_IN
            | PERSISTENT_RESERVE_OUT
            | MAINTENANCE_IN
            | READ_CAPACITY_10 => Ok(()),
            SERVICE_ACTION_IN_16
                if cdb
                    .get(1)
                    .is_some_and(|b| b & 0x1F == cdb::SA_READ_CAPACITY_16) =>
            {
                Ok(())
            }
            _ => Err(NOT_ACCESSIBLE_STANDBY),
        },
        AccessState::Unavailable => Err(NOT_ACCESSIBLE_UNAVAILABLE),
        AccessState::Transitioning => Err(NOT_ACCESSIBLE_TRANSITION),
    }
}

/// REPORT TARGET PORT GROUPS (SPC-4 §6.36): every group of `view`, in the
/// length-only header format (PARAMETER DATA FORMAT 000b) or the extended
/// one (001b, with the implicit transition time); another format is
/// INVALID FIELD IN CDB. Cut to the allocation length, never an error.
pub fn report_target_port_groups(
    view: &AluaView,
    cdb: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    let format = cdb::byte(cdb, 1)? >> 5;
    let alloc = usize::try_from(cdb::be32(cdb, 6)?).unwrap_or(usize::MAX);
    let v = data_in;
    v.extend_from_slice(&[0; 4]);
    match format {
        0 => {}
        // FORMAT TYPE 001b in bits 6-4 of byte 4; byte 5 IMPLICIT
        // TRANSITION TIME; bytes 6-7 reserved.
        1 => v.extend_from_slice(&[0x10, IMPLICIT_TRANSITION_SECS, 0, 0]),
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    }
    for g in view.groups() {
        // PREF 0 and the state; the support bits; the group; reserved;
        // STATUS CODE 0 (no status: a code saying "altered by implicit
        // behaviour" would differ between the gateways that saw the move
        // and one that started after it); vendor specific; one port.
        v.extend_from_slice(&[g.state.code(), SUPPORTED_STATES]);
        v.extend_from_slice(&g.id.to_be_bytes());
        v.extend_from_slice(&[0, 0, 0, 1]);
        // The target port descriptor: obsolete, then the relative port.
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&g.id.to_be_bytes());
    }
    let len = u32::try_from(v.len() - 4).unwrap_or(u32::MAX);
    v[..4].copy_from_slice(&len.to_be_bytes());
    v.truncate(alloc);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rtpg(format: u8, alloc: u32) -> [u8; 12] {
        let a = alloc.to_be_bytes();
        [
            MAINTENANCE_IN,
            (format << 5) | SA_REPORT_TARGET_PORT_GROUPS,
            0,
            0,
            0,
            0,
            a[0],
            a[1],
            a[2],
            a[3],
            0,
            0,
        ]
    }

    #[test]
    fn owner_is_active_optimized_and_the_others_standby() {
        let v = AluaView::owned_by([3, 1, 2], Some(2));
        let ids: Vec<u16> = v.groups().iter().map(|g| g.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(v.state_of(2), AccessState::ActiveOptimized);
        assert_eq!(v.state_of(1), AccessState::Standby);
        assert_eq!(v.state_of(3), AccessState::Standby);
        assert_eq!(v.state_of(9), AccessState::Unavailable);
        let none = AluaView::owned_by([1, 2], None);
        assert_eq!(none.state_of(1), AccessState::Transitioning);
    }

    #[test]
    fn rtpg_length_format() {
        let v = AluaView::owned_by([1, 2], Some(1));
        let mut out = Vec::new();
        report_target_port_groups(&v, &rtpg(0, 4096), &mut out).unwrap();
        #[rustfmt::skip]
        let want = [
            0, 0, 0, 24,
            0x00, 0x8D, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1,
            0x02, 0x8D, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2,
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn rtpg_extended_format_and_allocation_length() {
        let v = AluaView::owned_by([7], None);
        let mut out = Vec::new();
        report_target_port_groups(&v, &rtpg(1, 4096), &mut out).unwrap();
        #[rustfmt::skip]
        let want = [
            0, 0, 0, 16, 0x10, IMPLICIT_TRANSITION_SECS, 0, 0,
            0x0F, 0x8D, 0, 7, 0, 0, 0, 1, 0, 0, 0, 7,
        ];
        assert_eq!(out, want);
        out.clear();
        report_target_port_groups(&v, &rtpg(1, 6), &mut out).unwrap();
        assert_eq!(out, want[..6]);
        out.clear();
        assert_eq!(
            report_target_port_groups(&v, &rtpg(2, 4096), &mut out),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
        assert_eq!(
            report_target_port_groups(&v, &rtpg(0, 4096)[..8], &mut out),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
    }

    /// SERVICE ACTION IN(16) with service action `sa`.
    fn sai16(sa: u8) -> [u8; 16] {
        let mut cdb = [0; 16];
        cdb[0] = SERVICE_ACTION_IN_16;
        cdb[1] = sa;
        cdb[13] = 32;
        cdb
    }

    #[test]
    fn standby_runs_only_what_spc_lists() {
        let s = AccessState::Standby;
        for ok in [
            &[INQUIRY, 0, 0, 0, 36, 0][..],
            &[REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0],
            &[REQUEST_SENSE, 0, 0, 0, 18, 0],
            &[MODE_SENSE_6, 0, 0x3F, 0, 0xFF, 0],
            &[PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0, 8, 0],
            &rtpg(0, 100),
            &[READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &sai16(0x10),
        ] {
            assert_eq!(gate(s, ok), Ok(()), "{ok:02x?}");
        }
        for refused in [
            &[TEST_UNIT_READY, 0, 0, 0, 0, 0][..],
            &[WRITE_10, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            &[READ_10, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            // GET LBA STATUS, the other SERVICE ACTION IN(16).
            &sai16(0x12),
            &[SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert_eq!(gate(s, refused), Err(NOT_ACCESSIBLE_STANDBY));
        }
        let write = [WRITE_10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        assert_eq!(gate(AccessState::ActiveOptimized, &write), Ok(()));
        assert_eq!(
            gate(AccessState::Transitioning, &write),
            Err(NOT_ACCESSIBLE_TRANSITION)
        );
        let mode = [MODE_SENSE_6, 0, 0x3F, 0, 0xFF, 0];
        assert_eq!(
            gate(AccessState::Unavailable, &mode),
            Err(NOT_ACCESSIBLE_UNAVAILABLE)
        );
        assert_eq!(gate(AccessState::Unavailable, &rtpg(0, 100)), Ok(()));
        assert_eq!(gate(AccessState::Standby, &[]), Err(NOT_ACCESSIBLE_STANDBY));
    }

    #[test]
    fn a_new_view_is_a_new_generation_the_same_one_is_not() {
        let g = AluaGroup::new(AluaView::owned_by([1, 2], Some(1)));
        assert_eq!(g.generation(), 0);
        g.set(AluaView::owned_by([2, 1], Some(1)));
        assert_eq!(g.generation(), 0);
        g.set(AluaView::owned_by([1, 2], Some(2)));
        assert_eq!(g.generation(), 1);
        assert_eq!(g.state_of(2), AccessState::ActiveOptimized);
        assert_eq!(g.state_of(1), AccessState::Standby);
    }

    #[test]
    fn sense_codes_are_the_spc_ones() {
        let b = NOT_ACCESSIBLE_STANDBY.to_fixed_format();
        assert_eq!((b[2], b[12], b[13]), (0x02, 0x04, 0x0B));
        let b = NOT_ACCESSIBLE_TRANSITION.to_fixed_format();
        assert_eq!((b[2], b[12], b[13]), (0x02, 0x04, 0x0A));
        let b = STATE_CHANGED.to_fixed_format();
        assert_eq!((b[2], b[12], b[13]), (0x06, 0x2A, 0x06));
    }
}
