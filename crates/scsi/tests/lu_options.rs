//! LU options ([`LuOptions`]): a read-only LU refuses every write with DATA
//! PROTECT, a removable one ejects, loads and honours PREVENT per I_T
//! nexus, a 512e one reports its physical blocks.

mod common;

use std::sync::Arc;

use common::*;
use iscsi_scsi::{Backstore, LuOptions, ScsiTarget, Sense, TargetIdentity, TargetReset};
use iscsi_stores::{RamBackstore, WithOptions};

fn target_with(options: LuOptions) -> ScsiTarget {
    let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20, 512, 0x77).unwrap());
    ScsiTarget::new(
        TargetIdentity::new("iqn.2026-01.rs.iscsi:t"),
        vec![Arc::new(WithOptions::new(ram, options).unwrap())],
    )
}

const READ_ONLY: LuOptions = LuOptions {
    read_only: true,
    ..LuOptions::DEFAULT
};

const REMOVABLE: LuOptions = LuOptions {
    removable: true,
    ..LuOptions::DEFAULT
};

#[test]
fn a_read_only_lu_refuses_every_write_and_says_wp() {
    let t = target_with(READ_ONLY);
    let n = nexus(1);
    let block = [0x5Au8; 512];
    let writes: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (cdb10(0x2A, 0, 0, 1), block.to_vec()),      // WRITE(10)
        (write16(0, 1), block.to_vec()),             // WRITE(16)
        (cdb16(0x93, 0, 0, 1), block.to_vec()),      // WRITE SAME(16)
        (cdb10(0x41, 0, 0, 1), block.to_vec()),      // WRITE SAME(10)
        (cdb10(0x2E, 0, 0, 1), block.to_vec()),      // WRITE AND VERIFY(10)
        (cdb16(0x8B, 0, 0, 1), block.to_vec()),      // ORWRITE(16)
        (vec![0x0A, 0, 0, 0, 1, 0], block.to_vec()), // WRITE(6)
        (
            cdb16(0x89, 0, 0, 0)
                .into_iter()
                .enumerate()
                .map(|(i, b)| if i == 13 { 1 } else { b })
                .collect(),
            [block, block].concat(),
        ), // COMPARE AND WRITE
    ];
    for (cdb, out) in &writes {
        check(&t, &n, cdb, out, Sense::WRITE_PROTECTED);
    }
    // UNMAP (the RAM store is thin: UNMAP exists).
    let mut list = vec![0, 22, 0, 16, 0, 0, 0, 0];
    list.extend_from_slice(&0u64.to_be_bytes());
    list.extend_from_slice(&1u32.to_be_bytes());
    list.extend_from_slice(&[0; 4]);
    check(
        &t,
        &n,
        &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
        &list,
        Sense::WRITE_PROTECTED,
    );
    // Reads and SYNCHRONIZE CACHE work; the medium is as it was.
    assert_eq!(good(&t, &n, &read16(0, 1), &[]), vec![0; 512]);
    good(&t, &n, &cdb10(0x35, 0, 0, 0), &[]);
    // MODE SENSE(6) and (10): WP in the device-specific parameter, while
    // the control page's SWP (which MODE SELECT may change) stays 0.
    let m6 = good(&t, &n, &[0x1A, 0, 0x0A, 0, 255, 0], &[]);
    assert_eq!(m6[2] & 0x80, 0x80, "WP");
    let control = &m6[4 + usize::from(m6[3])..];
    assert_eq!(control[4] & 0x08, 0, "SWP");
    let m10 = good(&t, &n, &[0x5A, 0, 0x3F, 0, 0, 0, 0, 0x01, 0, 0], &[]);
    assert_eq!(m10[3] & 0x80, 0x80, "WP");
    // A writable LU says WP 0.
    let (w, _) = ram_target(1 << 20, 512);
    assert_eq!(good(&w, &n, &[0x1A, 0, 0x3F, 0, 255, 0], &[])[2] & 0x80, 0);
}

#[test]
fn a_removable_lu_ejects_and_loads_with_its_data() {
    let t = target_with(REMOVABLE);
    let (a, b) = (nexus(1), nexus(2));
    let inquiry = good(&t, &a, &[0x12, 0, 0, 0, 96, 0], &[]);
    assert_eq!(inquiry[1] & 0x80, 0x80, "RMB");
    good(&t, &a, &write16(3, 1), &[0x11; 512]);
    good(&t, &b, &[0; 6], &[]);
    // Eject: LOEJ 1, START 0.
    good(&t, &a, &[0x1B, 0, 0, 0, 0x02, 0], &[]);
    for n in [&a, &b] {
        check(&t, n, &[0; 6], &[], Sense::MEDIUM_NOT_PRESENT);
        check(&t, n, &read16(3, 1), &[], Sense::MEDIUM_NOT_PRESENT);
        check(
            &t,
            n,
            &cdb16(0x9E, 0x10, 0, 32),
            &[],
            Sense::MEDIUM_NOT_PRESENT,
        );
        // What describes the LU still answers; REQUEST SENSE says why
        // the medium cannot be reached.
        good(&t, n, &[0x12, 0, 0, 0, 96, 0], &[]);
        let sense = good(&t, n, &[0x03, 0, 0, 0, 18, 0], &[]);
        assert_eq!((sense[2] & 0x0F, sense[12], sense[13]), (0x02, 0x3A, 0x00));
        good(&t, n, &[0x1A, 0, 0x3F, 0, 255, 0], &[]);
    }
    // Load: LOEJ 1, START 1. The loader goes on; the other nexus hears
    // that the medium may have changed, once.
    good(&t, &a, &[0x1B, 0, 0, 0, 0x03, 0], &[]);
    good(&t, &a, &[0; 6], &[]);
    check(&t, &b, &[0; 6], &[], Sense::MEDIUM_MAY_HAVE_CHANGED);
    good(&t, &b, &[0; 6], &[]);
    assert_eq!(good(&t, &b, &read16(3, 1), &[]), vec![0x11; 512]);
}

#[test]
fn prevent_holds_the_medium_per_nexus_until_allowed_lost_or_reset() {
    let t = target_with(REMOVABLE);
    let (a, b) = (nexus(1), nexus(2));
    let prevent = |n, on: bool| good(&t, n, &[0x1E, 0, 0, 0, u8::from(on), 0], &[]);
    let eject = [0x1B, 0, 0, 0, 0x02, 0];
    let load = [0x1B, 0, 0, 0, 0x03, 0];
    prevent(&a, true);
    prevent(&b, true);
    check(&t, &a, &eject, &[], Sense::MEDIUM_REMOVAL_PREVENTED);
    prevent(&a, false);
    check(&t, &b, &eject, &[], Sense::MEDIUM_REMOVAL_PREVENTED);
    // The nexus that prevents is lost: its prevention goes with it.
    t.nexus_lost(&b);
    good(&t, &a, &eject, &[]);
    // Neither load nor eject while prevented.
    prevent(&a, true);
    check(&t, &a, &load, &[], Sense::MEDIUM_REMOVAL_PREVENTED);
    // A LOGICAL UNIT RESET ends every prevention; the medium stays out.
    t.lun_reset(0);
    check(
        &t,
        &a,
        &[0; 6],
        &[],
        Sense::unit_attention(iscsi_scsi::Asc::BUS_DEVICE_RESET),
    );
    check(&t, &a, &[0; 6], &[], Sense::MEDIUM_NOT_PRESENT);
    good(&t, &a, &load, &[]);
    good(&t, &a, &[0; 6], &[]);
    prevent(&a, true);
    t.target_reset(TargetReset::Warm);
    let _ = run(&t, &a, &[0; 6], &[]);
    good(&t, &a, &eject, &[]);
    // A fixed LU accepts PREVENT and LOEJ and ignores both.
    let (fixed, _) = ram_target(1 << 20, 512);
    good(&fixed, &a, &[0x1E, 0, 0, 0, 1, 0], &[]);
    good(&fixed, &a, &eject, &[]);
    good(&fixed, &a, &[0; 6], &[]);
    assert_eq!(good(&fixed, &a, &[0x12, 0, 0, 0, 96, 0], &[])[1] & 0x80, 0);
}

#[test]
fn a_512e_lu_reports_its_physical_blocks() {
    let t = target_with(LuOptions {
        physical_block_size: Some(4096),
        ..LuOptions::DEFAULT
    });
    let n = nexus(1);
    let rc16 = good(&t, &n, &cdb16(0x9E, 0x10, 0, 32), &[]);
    assert_eq!(&rc16[8..12], &512u32.to_be_bytes());
    assert_eq!(
        rc16[13] & 0x0F,
        3,
        "LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT"
    );
    assert_eq!(rc16[14] & 0x3F, 0, "LOWEST ALIGNED LBA");
    assert_eq!(rc16[15], 0);
    let b0 = good(&t, &n, &[0x12, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(
        &b0[6..8],
        &8u16.to_be_bytes(),
        "OPTIMAL TRANSFER LENGTH GRANULARITY"
    );
    let (plain, _) = ram_target(1 << 20, 512);
    assert_eq!(good(&plain, &n, &cdb16(0x9E, 0x10, 0, 32), &[])[13], 0);
    let wide = target_with(LuOptions {
        physical_block_size: Some(16384),
        ..LuOptions::DEFAULT
    });
    assert_eq!(good(&wide, &n, &cdb16(0x9E, 0x10, 0, 32), &[])[13], 5);
    let b0 = good(&wide, &n, &[0x12, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(&b0[6..8], &32u16.to_be_bytes());
}
