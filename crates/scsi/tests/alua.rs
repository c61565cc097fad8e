//! Implicit ALUA (SPC-4 §5.16) as two gateways of a group answer it: each
//! gateway is a `ScsiTarget` of its own over one shared store, with an
//! `AluaGroup` of its own set to the same view (as each gateway's lock
//! keeper sets it from the cluster), and nexuses through its own relative
//! target port.

mod common;

use std::io;
use std::sync::Arc;

use common::*;
use iscsi_scsi::alua::{self, AccessState, AluaGroup, AluaView};
use iscsi_scsi::cdb::opcode::*;
use iscsi_scsi::{Backstore, Nexus, ScsiTarget, Sense, TargetIdentity};
use iscsi_stores::RamBackstore;

/// One gateway's view of the shared image.
#[derive(Debug)]
struct Gateway {
    image: Arc<RamBackstore>,
    group: Arc<AluaGroup>,
}

impl Backstore for Gateway {
    fn block_size(&self) -> u32 {
        self.image.block_size()
    }
    fn block_count(&self) -> u64 {
        self.image.block_count()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.image.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.image.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.image.flush()
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.image.unmap(offset, len)
    }
    fn unique_id(&self) -> u64 {
        0x1234
    }
    fn alua(&self) -> Option<Arc<AluaGroup>> {
        Some(Arc::clone(&self.group))
    }
}

struct Pair {
    a: ScsiTarget,
    b: ScsiTarget,
    group_a: Arc<AluaGroup>,
    group_b: Arc<AluaGroup>,
    /// A host's nexus through gateway A (port 1) and through B (port 2).
    via_a: Nexus,
    via_b: Nexus,
}

impl Pair {
    fn new(owner: u16) -> Self {
        let image = Arc::new(RamBackstore::new(1 << 20, 512, 9).unwrap());
        let view = AluaView::owned_by([1, 2], Some(owner));
        let gateway = |group: &Arc<AluaGroup>| {
            let store = Gateway {
                image: Arc::clone(&image),
                group: Arc::clone(group),
            };
            ScsiTarget::new(
                TargetIdentity::new("iqn.2026-01.rs.iscsi:gw"),
                vec![Arc::new(store) as Arc<dyn Backstore>],
            )
        };
        let group_a = Arc::new(AluaGroup::new(view.clone()));
        let group_b = Arc::new(AluaGroup::new(view));
        Self {
            a: gateway(&group_a),
            b: gateway(&group_b),
            group_a,
            group_b,
            via_a: Nexus::iscsi("iqn.2026-01.rs.iscsi:host", 1, 1),
            via_b: Nexus::iscsi("iqn.2026-01.rs.iscsi:host", 2, 2),
        }
    }

    /// Both gateways learn that `owner` owns the LU now.
    fn move_to(&self, owner: Option<u16>) {
        let view = AluaView::owned_by([1, 2], owner);
        self.group_a.set(view.clone());
        self.group_b.set(view);
    }
}

fn rtpg(format: u8) -> [u8; 12] {
    [
        MAINTENANCE_IN,
        (format << 5) | alua::SA_REPORT_TARGET_PORT_GROUPS,
        0,
        0,
        0,
        0,
        0,
        0,
        0x10,
        0,
        0,
        0,
    ]
}

const INQUIRY_STD: [u8; 6] = [INQUIRY, 0, 0, 0, 96, 0];
const INQUIRY_83: [u8; 6] = [INQUIRY, 1, 0x83, 0, 255, 0];
const TUR: [u8; 6] = [TEST_UNIT_READY, 0, 0, 0, 0, 0];

/// The designators of a VPD 83h page: (association/type byte, value).
fn designators(page: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 4;
    while at + 4 <= page.len() {
        let len = usize::from(page[at + 3]);
        out.push((page[at + 1], page[at + 4..at + 4 + len].to_vec()));
        at += 4 + len;
    }
    out
}

#[test]
fn inquiry_says_implicit_alua_and_names_the_port_and_its_group() {
    let p = Pair::new(1);
    let std = good(&p.b, &p.via_b, &INQUIRY_STD, &[]);
    assert_eq!(std[5] & 0x30, 0x10, "TPGS 01b");
    let vpd = good(&p.b, &p.via_b, &INQUIRY_83, &[]);
    let d = designators(&vpd);
    assert!(d.contains(&(0x94, vec![0, 0, 0, 2])), "{d:02x?}");
    assert!(d.contains(&(0x95, vec![0, 0, 0, 2])), "{d:02x?}");
    let a = designators(&good(&p.a, &p.via_a, &INQUIRY_83, &[]));
    assert!(a.contains(&(0x95, vec![0, 0, 0, 1])), "{a:02x?}");
    // The LU's own designator (NAA) is the same through both.
    assert_eq!(a[0], d[0]);

    // A local LU keeps TPGS 0, port 1, no group designator and no RTPG.
    let (t, _) = ram_target(1 << 20, 512);
    let n = nexus(1);
    assert_eq!(good(&t, &n, &INQUIRY_STD, &[])[5] & 0x30, 0);
    let local = designators(&good(&t, &n, &INQUIRY_83, &[]));
    assert!(local.contains(&(0x94, vec![0, 0, 0, 1])));
    assert!(!local.iter().any(|(t, _)| *t == 0x95));
    check(&t, &n, &rtpg(0), &[], Sense::INVALID_FIELD_IN_CDB);
}

#[test]
fn rtpg_is_the_same_through_every_port() {
    let p = Pair::new(1);
    for format in [0, 1] {
        let via_a = good(&p.a, &p.via_a, &rtpg(format), &[]);
        let via_b = good(&p.b, &p.via_b, &rtpg(format), &[]);
        assert_eq!(via_a, via_b);
    }
    let r = good(&p.b, &p.via_b, &rtpg(0), &[]);
    assert_eq!(&r[..4], &[0, 0, 0, 24]);
    // Group 1 active/optimized, group 2 standby, each one port.
    assert_eq!((r[4] & 0x0F, &r[6..8], r[11]), (0x0, &[0u8, 1][..], 1));
    assert_eq!((r[16] & 0x0F, &r[18..20], r[23]), (0x2, &[0u8, 2][..], 1));
    assert_eq!(&r[26..28], &[0, 2]);
}

#[test]
fn standby_refuses_io_and_the_owner_serves_it() {
    let p = Pair::new(1);
    let block = vec![0x5A; 512];
    let write = cdb10(WRITE_10, 0, 3, 1);
    let read = cdb10(READ_10, 0, 3, 1);
    check(&p.b, &p.via_b, &write, &block, alua::NOT_ACCESSIBLE_STANDBY);
    check(&p.b, &p.via_b, &read, &[], alua::NOT_ACCESSIBLE_STANDBY);
    check(&p.b, &p.via_b, &TUR, &[], alua::NOT_ACCESSIBLE_STANDBY);
    // What standby runs.
    good(&p.b, &p.via_b, &[MODE_SENSE_6, 0, 0x3F, 0, 0xFF, 0], &[]);
    good(
        &p.b,
        &p.via_b,
        &[PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0, 8, 0],
        &[],
    );
    // READ CAPACITY, the owner's answer: Linux's sd reads it once, when it
    // finds the disk, standby or not.
    let capacity = [READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let via_standby = good(&p.b, &p.via_b, &capacity, &[]);
    assert_eq!(via_standby, good(&p.a, &p.via_a, &capacity, &[]));
    assert_eq!(via_standby.len(), 8);
    good(&p.a, &p.via_a, &write, &block);
    assert_eq!(good(&p.a, &p.via_a, &read, &[]), block);
}

#[test]
fn a_move_is_one_unit_attention_per_nexus_then_the_new_states() {
    let p = Pair::new(1);
    let other_host = Nexus::iscsi("iqn.2026-01.rs.iscsi:other", 7, 2);
    good(&p.a, &p.via_a, &INQUIRY_STD, &[]);
    good(&p.b, &p.via_b, &INQUIRY_STD, &[]);
    good(&p.b, &other_host, &INQUIRY_STD, &[]);

    // A takeover in two steps: nobody owns it, then B does.
    p.move_to(None);
    let ua = alua::STATE_CHANGED;
    check(&p.a, &p.via_a, &TUR, &[], ua);
    check(&p.a, &p.via_a, &TUR, &[], alua::NOT_ACCESSIBLE_TRANSITION);
    p.move_to(Some(2));
    // B's nexuses saw one change (the generation B's LU last looked at):
    // one unit attention each, then the state.
    check(&p.b, &p.via_b, &TUR, &[], ua);
    good(&p.b, &p.via_b, &TUR, &[]);
    check(&p.b, &other_host, &TUR, &[], ua);
    good(&p.b, &other_host, &TUR, &[]);
    // A saw a second change.
    check(&p.a, &p.via_a, &TUR, &[], ua);
    check(&p.a, &p.via_a, &TUR, &[], alua::NOT_ACCESSIBLE_STANDBY);
    assert_eq!(p.group_b.state_of(2), AccessState::ActiveOptimized);

    // INQUIRY leaves the unit attention pending; REPORT TARGET PORT
    // GROUPS is not exempt from it (only INQUIRY, REPORT LUNS and REQUEST
    // SENSE are), so it reports it first, then the new states.
    p.move_to(Some(1));
    good(&p.b, &p.via_b, &INQUIRY_STD, &[]);
    check(&p.b, &p.via_b, &rtpg(0), &[], ua);
    let r = good(&p.b, &p.via_b, &rtpg(0), &[]);
    assert_eq!((r[4] & 0x0F, r[16] & 0x0F), (0x0, 0x2));
    // The same view set again is no change.
    p.move_to(Some(1));
    check(&p.b, &p.via_b, &TUR, &[], alua::NOT_ACCESSIBLE_STANDBY);
}

#[test]
fn report_supported_opcodes_lists_rtpg_only_where_it_runs() {
    let one = |sa: u8| {
        [
            MAINTENANCE_IN,
            0x0C,
            0x02,
            MAINTENANCE_IN,
            0,
            sa,
            0,
            0,
            1,
            0,
            0,
            0,
        ]
    };
    let p = Pair::new(1);
    let r = good(
        &p.a,
        &p.via_a,
        &one(alua::SA_REPORT_TARGET_PORT_GROUPS),
        &[],
    );
    assert_eq!(r[1] & 0x07, 0x03, "supported, as the standard says");
    let (t, _) = ram_target(1 << 20, 512);
    let r = good(&t, &nexus(1), &one(alua::SA_REPORT_TARGET_PORT_GROUPS), &[]);
    assert_eq!(r[1] & 0x07, 0x01, "not supported on a local LU");
}
