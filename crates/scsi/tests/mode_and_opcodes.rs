//! MODE SELECT (WCE, D_SENSE, SWP) and the unit attention that follows,
//! descriptor-format sense, and REPORT SUPPORTED OPERATION CODES / TASK
//! MANAGEMENT FUNCTIONS.

mod common;

use common::*;
use iscsi_scsi::{
    Asc, CommandOutcome, DataDirection, FieldPointer, Nexus, ScsiTarget, Sense, SenseKey,
    command_info, opcodes::COMMANDS, status,
};

/// MODE SENSE(6) of one page, current values, no block descriptor.
fn sense_page(t: &ScsiTarget, n: &Nexus, page: u8, pc: u8) -> Vec<u8> {
    let d = good(t, n, &[0x1A, 0x08, (pc << 6) | page, 0, 255, 0], &[]);
    assert_eq!(d[3], 0);
    d[4..].to_vec()
}

/// MODE SELECT(6) with PF of `pages` after a 4-byte header.
fn select6(pages: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0, 0, 0, 0];
    p.extend_from_slice(pages);
    (vec![0x15, 0x10, 0, 0, p.len() as u8, 0], p)
}

#[test]
fn mode_select_wce_and_unit_attention() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    good(&t, &b, &[0; 6], &[]);
    let mut caching = sense_page(&t, &a, 0x08, 0);
    assert_eq!(caching[2] & 0x04, 0x04);
    caching[2] &= !0x04;
    let (c, p) = select6(&caching);
    good(&t, &a, &c, &p);
    assert_eq!(sense_page(&t, &a, 0x08, 0)[2] & 0x04, 0);
    // Default values are unchanged.
    assert_eq!(sense_page(&t, &a, 0x08, 2)[2] & 0x04, 0x04);
    // The other nexus hears MODE PARAMETERS CHANGED; the changer does not.
    check(
        &t,
        &b,
        &[0; 6],
        &[],
        Sense::new(SenseKey::UnitAttention, Asc::MODE_PARAMETERS_CHANGED),
    );
    good(&t, &b, &[0; 6], &[]);
    good(&t, &a, &[0; 6], &[]);
    // Selecting the same values again changes nothing: no UA.
    good(&t, &a, &c, &p);
    good(&t, &b, &[0; 6], &[]);
    // MODE SELECT(10) with a block descriptor restating the geometry.
    caching[2] |= 0x04;
    let mut p10 = vec![0, 0, 0, 0, 0, 0, 0, 8];
    p10.extend_from_slice(&2048u32.to_be_bytes());
    p10.extend_from_slice(&512u32.to_be_bytes());
    p10.extend_from_slice(&caching);
    let len = p10.len() as u16;
    let mut c10 = vec![0x55, 0x10, 0, 0, 0, 0, 0];
    c10.extend_from_slice(&len.to_be_bytes());
    c10.push(0);
    good(&t, &a, &c10, &p10);
    assert_eq!(sense_page(&t, &a, 0x08, 0)[2] & 0x04, 0x04);
    // A different block length is refused.
    p10[14] = 0x10;
    check(&t, &a, &c10, &p10, Sense::INVALID_FIELD_IN_PARAMETER_LIST);
}

#[test]
fn mode_select_errors() {
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    let caching = sense_page(&t, &a, 0x08, 0);
    let (c, p) = select6(&caching);
    // PF 0, SP 1.
    let mut c0 = c.clone();
    c0[1] = 0;
    check(&t, &a, &c0, &p, Sense::INVALID_FIELD_IN_CDB);
    let mut c1 = c.clone();
    c1[1] = 0x11;
    check(&t, &a, &c1, &p, Sense::INVALID_FIELD_IN_CDB);
    // A change to a field that is not changeable (RCD).
    let mut bad = caching.clone();
    bad[2] |= 0x01;
    let (cb, pb) = select6(&bad);
    check(&t, &a, &cb, &pb, Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    // Wrong page length, unknown page, subpage format, truncated page.
    let mut bad = caching.clone();
    bad[1] = 0x11;
    bad.pop();
    let (cb, pb) = select6(&bad);
    check(&t, &a, &cb, &pb, Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    let (cb, pb) = select6(&[0x19, 2, 0, 0]);
    check(&t, &a, &cb, &pb, Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    let (cb, pb) = select6(&[0x48, 2, 0, 0]);
    check(&t, &a, &cb, &pb, Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    let (cb, pb) = select6(&caching[..10]);
    check(&t, &a, &cb, &pb, Sense::PARAMETER_LIST_LENGTH_ERROR);
    // Header shorter than 4 bytes.
    check(
        &t,
        &a,
        &[0x15, 0x10, 0, 0, 2, 0],
        &[0, 0],
        Sense::PARAMETER_LIST_LENGTH_ERROR,
    );
    // Nothing changed on any failure; empty list is a no-op.
    good(&t, &a, &[0x15, 0x10, 0, 0, 0, 0], &[]);
    assert_eq!(sense_page(&t, &a, 0x08, 0), caching);
    assert_eq!(
        command_info(&c, 512),
        (DataDirection::Write, p.len() as u32)
    );
    assert_eq!(
        command_info(&[0x55, 0x10, 0, 0, 0, 0, 0, 1, 4, 0], 512),
        (DataDirection::Write, 260)
    );
}

#[test]
fn d_sense_switches_sense_format() {
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    let (o, _) = run(&t, &a, &read16(u64::MAX, 1), &[]);
    assert!(!o.descriptor_sense);
    assert_eq!(o.sense_bytes()[0], 0x70);
    assert_eq!(o.sense_bytes().len(), 18);
    // Changeable: D_SENSE (and SWP).
    let ch = sense_page(&t, &a, 0x0A, 1);
    assert_eq!((ch[2], ch[4]), (0x04, 0x08));
    let mut ctl = sense_page(&t, &a, 0x0A, 0);
    ctl[2] |= 0x04;
    let (c, p) = select6(&ctl);
    good(&t, &a, &c, &p);
    let (o, _) = run(&t, &a, &read16(u64::MAX, 1), &[]);
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert!(o.descriptor_sense);
    assert_eq!(o.sense_bytes(), vec![0x72, 0x05, 0x21, 0x00, 0, 0, 0, 0]);
    assert_eq!(CommandOutcome::GOOD.sense_bytes(), Vec::<u8>::new());
    // LOGICAL UNIT RESET restores the defaults.
    t.lun_reset(0);
    let (o, _) = run(&t, &a, &[0; 6], &[]);
    assert_eq!(o.sense.unwrap().asc, Asc::BUS_DEVICE_RESET);
    assert!(!o.descriptor_sense);
}

#[test]
fn swp_write_protects() {
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    let mut ctl = sense_page(&t, &a, 0x0A, 0);
    ctl[4] |= 0x08;
    let (c, p) = select6(&ctl);
    good(&t, &a, &c, &p);
    let d = good(&t, &a, &[0x1A, 0x08, 0x0A, 0, 255, 0], &[]);
    assert_eq!(d[2] & 0x80, 0x80, "WP");
    good(&t, &a, &read16(0, 1), &[]);
    let wp = Sense::new(SenseKey::DataProtect, Asc::WRITE_PROTECTED);
    check(&t, &a, &write16(0, 1), &[0; 512], wp);
    check(&t, &a, &cdb16(0x93, 0, 0, 1), &[0; 512], wp);
    check(&t, &a, &caw(0, 1), &[0; 1024], wp);
    ctl[4] &= !0x08;
    let (c, p) = select6(&ctl);
    good(&t, &a, &c, &p);
    good(&t, &a, &write16(0, 1), &[0; 512]);
}

fn rsoc(options: u8, rctd: bool, op: u8, sa: u16, alloc: u32) -> Vec<u8> {
    let mut c = vec![0xA3, 0x0C, options | if rctd { 0x80 } else { 0 }, op];
    c.extend_from_slice(&sa.to_be_bytes());
    c.extend_from_slice(&alloc.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

#[test]
fn report_supported_opcodes_all() {
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    for rctd in [false, true] {
        let d = good(&t, &a, &rsoc(0, rctd, 0, 0, 65536), &[]);
        let len = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
        assert_eq!(len + 4, d.len());
        let step = if rctd { 20 } else { 8 };
        // Every command but SANITIZE CRYPTOGRAPHIC ERASE (the RAM store is
        // not encrypted) and REPORT TARGET PORT GROUPS (a local LU has no
        // ALUA).
        assert_eq!(len, (COMMANDS.len() - 2) * step);
        let mut seen = Vec::new();
        for desc in d[4..].chunks_exact(step) {
            let (op, sa) = (desc[0], u16::from_be_bytes([desc[2], desc[3]]));
            let servactv = desc[5] & 1 != 0;
            assert_eq!(desc[5] & 2 != 0, rctd, "CTDP");
            let cdb_len = u16::from_be_bytes([desc[6], desc[7]]);
            assert_eq!(usize::from(cdb_len), iscsi_scsi::cdb::cdb_len(op).unwrap());
            if rctd {
                assert_eq!(&desc[8..10], &[0, 0x0A]);
            }
            seen.push((op, servactv.then_some(sa)));
        }
        assert!(
            !seen.contains(&(0x48, Some(0x03))),
            "no CRYPTOGRAPHIC ERASE"
        );
        assert!(
            !seen.contains(&(0xA3, Some(0x0A))),
            "no REPORT TARGET PORT GROUPS"
        );
        // Every listed command is accepted (not INVALID COMMAND OPERATION CODE).
        for (op, sa) in seen {
            let mut cdb = vec![0u8; iscsi_scsi::cdb::cdb_len(op).unwrap()];
            cdb[0] = op;
            if let Some(sa) = sa {
                cdb[1] = sa as u8;
            }
            let (o, _) = run(&t, &a, &cdb, &[]);
            assert_ne!(o.sense, Some(Sense::INVALID_OPCODE), "{op:#x}");
        }
    }
    // Truncated to the allocation length.
    assert_eq!(good(&t, &a, &rsoc(0, false, 0, 0, 10), &[]).len(), 10);
}

#[test]
fn report_supported_opcodes_one() {
    // A bad REPORTING OPTIONS names its field (byte 2, bits 2-0).
    let reporting_options =
        Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(2, Some(2)));
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    // READ(10), option 1.
    let d = good(&t, &a, &rsoc(1, false, 0x28, 0, 512), &[]);
    assert_eq!(d[1] & 0x07, 0x03, "supported");
    assert_eq!(&d[2..4], &[0, 10]);
    assert_eq!(d[4], 0x28);
    assert_eq!(d.len(), 14);
    // With the timeouts descriptor.
    let d = good(&t, &a, &rsoc(1, true, 0x28, 0, 512), &[]);
    assert_eq!(d[1] & 0x80, 0x80, "CTDP");
    assert_eq!(d.len(), 14 + 12);
    assert_eq!(&d[14..16], &[0, 0x0A]);
    // Not supported.
    let d = good(&t, &a, &rsoc(1, false, 0x3B, 0, 512), &[]);
    assert_eq!(d, vec![0, 1, 0, 0]);
    // Opcode with service actions needs option 2.
    check(
        &t,
        &a,
        &rsoc(1, false, 0x9E, 0, 512),
        &[],
        reporting_options,
    );
    let d = good(&t, &a, &rsoc(2, false, 0x9E, 0x10, 512), &[]);
    assert_eq!(d[1] & 0x07, 3);
    assert_eq!(&d[2..4], &[0, 16]);
    let d = good(&t, &a, &rsoc(2, false, 0x9E, 0x12, 512), &[]);
    assert_eq!(d[1] & 0x07, 3);
    let d = good(&t, &a, &rsoc(2, false, 0x9E, 0x13, 512), &[]);
    assert_eq!(d[1] & 0x07, 1);
    check(
        &t,
        &a,
        &rsoc(2, false, 0x28, 0, 512),
        &[],
        reporting_options,
    );
    // Option 3 takes either; reserved options are invalid.
    let d = good(&t, &a, &rsoc(3, false, 0x28, 0, 512), &[]);
    assert_eq!(d[1] & 0x07, 3);
    let d = good(&t, &a, &rsoc(3, false, 0x5F, 7, 512), &[]);
    assert_eq!(d[1] & 0x07, 3);
    check(&t, &a, &rsoc(4, false, 0, 0, 512), &[], reporting_options);
    assert_eq!(
        command_info(&rsoc(0, false, 0, 0, 777), 512),
        (DataDirection::Read, 777)
    );
}

#[test]
fn report_supported_tmfs() {
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    let d = good(&t, &a, &[0xA3, 0x0D, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], &[]);
    assert_eq!(d, vec![0xDA, 0, 0, 0]);
    let d = good(&t, &a, &[0xA3, 0x0D, 0x80, 0, 0, 0, 0, 0, 0, 16, 0, 0], &[]);
    assert_eq!(d.len(), 16);
    assert_eq!(d[3], 0x0C);
    check(
        &t,
        &a,
        &[0xA3, 0x0D, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &a,
        &[0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
}

/// A fully provisioned LU (a block store) has no UNMAP, and its REPORT
/// SUPPORTED OPERATION CODES says so; a thin one lists it.
#[test]
fn unmap_is_reported_only_where_it_is_offered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("block.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let block = iscsi_stores::BlockBackstore::open(&path, false, 9).unwrap();
    let full = target_over(std::sync::Arc::new(block));
    let (thin, _) = ram_target(1 << 20, 512);
    let n = nexus(1);
    let all = [0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0];
    let lists_unmap = |d: &[u8]| d[4..].chunks(8).any(|c| c[0] == 0x42);
    assert!(!lists_unmap(&good(&full, &n, &all, &[])));
    assert!(lists_unmap(&good(&thin, &n, &all, &[])));
    // One-command form: SUPPORT 001b (not supported) on the block LU,
    // 011b (supported as in the standard) on the thin one.
    let one = [0xA3, 0x0C, 0x01, 0x42, 0, 0, 0, 0, 0x10, 0, 0, 0];
    assert_eq!(good(&full, &n, &one, &[])[1] & 0x07, 0x01);
    assert_eq!(good(&thin, &n, &one, &[])[1] & 0x07, 0x03);
    check(
        &full,
        &n,
        &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
        &[0; 24],
        iscsi_scsi::Sense::INVALID_OPCODE,
    );
}
