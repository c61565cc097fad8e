//! A LUN resized while it serves: every nexus hears CAPACITY DATA HAS
//! CHANGED once, then READ CAPACITY answers the new size; a resize that
//! changes nothing says nothing; one during a SANITIZE is refused.

mod common;

use std::sync::Arc;

use common::*;
use iscsi_scsi::backstore::ResizeError;
use iscsi_scsi::{Asc, Resized, Sense, SenseKey};
use iscsi_stores::RamBackstore;

const MIB: u64 = 1 << 20;
const READ_CAPACITY_10: [u8; 10] = [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const TEST_UNIT_READY: [u8; 6] = [0; 6];
const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 96, 0];

/// The last LBA READ CAPACITY (10) answers.
fn last_lba(t: &iscsi_scsi::ScsiTarget, n: &iscsi_scsi::Nexus) -> u32 {
    let d = good(t, n, &READ_CAPACITY_10, &[]);
    u32::from_be_bytes(d[..4].try_into().unwrap())
}

#[test]
fn every_nexus_hears_of_a_growth_once_then_reads_the_new_capacity() {
    let (t, _store) = ram_target(MIB, 512);
    let (a, b) = (nexus(1), nexus(2));
    assert_eq!(last_lba(&t, &a), 2047);
    good(&t, &b, &TEST_UNIT_READY, &[]);
    let resized = t.resize_lun(0, Some(4 * MIB), false).unwrap();
    assert_eq!(
        resized,
        Resized {
            old: MIB,
            new: 4 * MIB
        }
    );
    let changed = Sense::unit_attention(Asc::CAPACITY_DATA_HAS_CHANGED);
    for n in [&a, &b] {
        // INQUIRY does not take the unit attention; the next command does.
        good(&t, n, &INQUIRY, &[]);
        check(&t, n, &READ_CAPACITY_10, &[], changed);
        assert_eq!(last_lba(&t, n), 8191);
    }
    // A block past the old end is there, and reads zeros.
    good(&t, &a, &write16(8191, 1), &[9; 512]);
    assert_eq!(good(&t, &b, &read16(8191, 1), &[]), vec![9; 512]);
    assert_eq!(good(&t, &b, &read16(2048, 1), &[]), vec![0; 512]);
    // The same size again: nothing to hear.
    assert_eq!(t.resize_lun(0, Some(4 * MIB), false).unwrap().new, 4 * MIB);
    good(&t, &a, &TEST_UNIT_READY, &[]);
}

#[test]
fn a_refused_shrink_changes_nothing_and_raises_nothing() {
    let (t, _store) = ram_target(4 * MIB, 512);
    let a = nexus(1);
    good(&t, &a, &write16(8000, 1), &[1; 512]);
    assert!(matches!(
        t.resize_lun(0, Some(MIB), false),
        Err(ResizeError::DataBeyond { .. })
    ));
    good(&t, &a, &TEST_UNIT_READY, &[]);
    assert_eq!(last_lba(&t, &a), 8191);
    assert!(matches!(
        t.resize_lun(3, Some(MIB), false),
        Err(ResizeError::NoLun(3))
    ));
    // Told: the LU shrinks, and a command past the new end is out of range.
    assert_eq!(t.resize_lun(0, Some(MIB), true).unwrap().new, MIB);
    check(
        &t,
        &a,
        &TEST_UNIT_READY,
        &[],
        Sense::unit_attention(Asc::CAPACITY_DATA_HAS_CHANGED),
    );
    check(&t, &a, &read16(2048, 1), &[], Sense::LBA_OUT_OF_RANGE);
}

#[test]
fn no_resize_while_a_sanitize_failed_or_runs() {
    let t = target_over(Arc::new(Failing(RamBackstore::new(MIB, 512, 1).unwrap())));
    let a = nexus(1);
    assert_eq!(t.resize_lun(0, Some(2 * MIB), false).unwrap().new, 2 * MIB);
    good(&t, &a, &INQUIRY, &[]);
    // SANITIZE BLOCK ERASE: the store's unmaps fail.
    let cdb = [0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0];
    let (outcome, _) = run(&t, &a, &cdb, &[]);
    assert_eq!(
        outcome.sense.map(|s| (s.key, s.asc)),
        Some((SenseKey::MediumError, Asc::SANITIZE_COMMAND_FAILED))
    );
    assert!(matches!(
        t.resize_lun(0, Some(4 * MIB), false),
        Err(ResizeError::Sanitizing)
    ));
    assert_eq!(
        last_lba_after_ua(&t, &a),
        None,
        "still failed, and not resized"
    );
}

/// READ CAPACITY's last LBA, or `None` when the LU refuses it.
fn last_lba_after_ua(t: &iscsi_scsi::ScsiTarget, n: &iscsi_scsi::Nexus) -> Option<u32> {
    let (o, d) = run(t, n, &READ_CAPACITY_10, &[]);
    (o.sense.is_none()).then(|| u32::from_be_bytes(d[..4].try_into().unwrap()))
}
