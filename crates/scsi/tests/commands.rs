//! Command-level tests of the SCSI target core through `ScsiTarget::execute`.

use std::sync::Arc;

use iscsi_scsi::{
    Asc, Backstore, CommandOutcome, DataDirection, Nexus, ScsiTarget, Sense, SenseKey,
    TargetIdentity, command_info, encode_lun, status,
};
use iscsi_stores::RamBackstore;

const TARGET_NAME: &str = "iqn.2026-01.rs.iscsi:disk1";

fn nexus() -> Nexus {
    Nexus::iscsi("iqn.2026-01.rs.iscsi:init1", 0x0002_3d00_0001, 1)
}

fn target(specs: &[(u64, u32)]) -> (ScsiTarget, Vec<Arc<RamBackstore>>) {
    let stores: Vec<Arc<RamBackstore>> = specs
        .iter()
        .enumerate()
        .map(|(i, &(size, bs))| Arc::new(RamBackstore::new(size, bs, 0x1000 + i as u64).unwrap()))
        .collect();
    let luns = stores
        .iter()
        .map(|s| Arc::clone(s) as Arc<dyn Backstore>)
        .collect();
    (
        ScsiTarget::new(TargetIdentity::new(TARGET_NAME), luns),
        stores,
    )
}

fn run(t: &ScsiTarget, lun: u16, cdb: &[u8], data_out: &[u8]) -> (CommandOutcome, Vec<u8>) {
    let mut data_in = vec![0xEE; 3]; // must be cleared by execute
    let o = t.execute(&nexus(), encode_lun(lun), cdb, data_out, &mut data_in);
    (o, data_in)
}

fn good(t: &ScsiTarget, lun: u16, cdb: &[u8], data_out: &[u8]) -> Vec<u8> {
    let (o, d) = run(t, lun, cdb, data_out);
    assert_eq!(o, CommandOutcome::GOOD, "cdb {cdb:02x?}");
    d
}

fn check(t: &ScsiTarget, lun: u16, cdb: &[u8], data_out: &[u8], expect: Sense) {
    let (o, d) = run(t, lun, cdb, data_out);
    assert_eq!(o.status, status::CHECK_CONDITION, "cdb {cdb:02x?}");
    assert_eq!(o.sense, Some(expect), "cdb {cdb:02x?}");
    assert!(d.is_empty());
}

fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn random_bytes(seed: &mut u64, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng(seed) as u8).collect()
}

fn read10(lba: u32, n: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&n.to_be_bytes());
    c.push(0);
    c
}

fn rw16(op: u8, lba: u64, n: u32) -> Vec<u8> {
    let mut c = vec![op, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

fn rw12(op: u8, lba: u32, n: u32) -> Vec<u8> {
    let mut c = vec![op, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

fn rw6(op: u8, lba: u32, n: u8) -> Vec<u8> {
    vec![
        op,
        (lba >> 16) as u8 & 0x1F,
        (lba >> 8) as u8,
        lba as u8,
        n,
        0,
    ]
}

fn inquiry(evpd: bool, page: u8, alloc: u16) -> Vec<u8> {
    let a = alloc.to_be_bytes();
    vec![0x12, u8::from(evpd), page, a[0], a[1], 0]
}

#[test]
fn write_then_read_every_cdb_size() {
    for bs in [512u32, 4096] {
        let blocks = 2048u64;
        let (t, _) = target(&[(blocks * u64::from(bs), bs)]);
        let mut seed = 0x9E37_79B9_7F4A_7C15 ^ u64::from(bs);
        let lbas = [0u64, 1, 7, 127, 128, 1000, blocks - 256, blocks - 1];
        for (i, &lba) in lbas.iter().enumerate() {
            let n = (1 + rng(&mut seed) % 16).min(blocks - lba) as u32;
            let data = random_bytes(&mut seed, n as usize * bs as usize);
            let (w, r) = match i % 4 {
                0 => (
                    rw6(0x0A, lba as u32, n as u8),
                    rw6(0x08, lba as u32, n as u8),
                ),
                1 => {
                    let mut w = read10(lba as u32, n as u16);
                    w[0] = 0x2A;
                    (w, read10(lba as u32, n as u16))
                }
                2 => (rw12(0xAA, lba as u32, n), rw12(0xA8, lba as u32, n)),
                _ => (rw16(0x8A, lba, n), rw16(0x88, lba, n)),
            };
            assert_eq!(
                command_info(&w, bs),
                (DataDirection::Write, data.len() as u32)
            );
            assert_eq!(
                command_info(&r, bs),
                (DataDirection::Read, data.len() as u32)
            );
            assert!(good(&t, 0, &w, &data).is_empty());
            assert_eq!(good(&t, 0, &r, &[]), data, "bs {bs} lba {lba}");
        }
        // Cross-size: what WRITE(16) wrote, READ(10) reads.
        let data = random_bytes(&mut seed, 3 * bs as usize);
        good(&t, 0, &rw16(0x8A, 40, 3), &data);
        assert_eq!(good(&t, 0, &read10(40, 3), &[]), data);
        // FUA and DPO accepted.
        let mut w = rw16(0x8A, 50, 1);
        w[1] = 0x18;
        good(&t, 0, &w, &data[..bs as usize]);
        let mut r = read10(50, 1);
        r[1] = 0x18;
        assert_eq!(good(&t, 0, &r, &[]), &data[..bs as usize]);
    }
}

#[test]
fn rw6_length_zero_is_256_blocks() {
    let (t, _) = target(&[(1024 * 512, 512)]);
    let data: Vec<u8> = (0..256 * 512).map(|i| (i % 253) as u8).collect();
    good(&t, 0, &rw6(0x0A, 10, 0), &data);
    assert_eq!(good(&t, 0, &rw6(0x08, 10, 0), &[]), data);
    check(
        &t,
        0,
        &rw6(0x08, 1024 - 255, 0),
        &[],
        Sense::LBA_OUT_OF_RANGE,
    );
}

#[test]
fn range_errors() {
    let blocks = 1000u64;
    let (t, _) = target(&[(blocks * 512, 512)]);
    let oob = Sense::LBA_OUT_OF_RANGE;
    // Reads.
    check(&t, 0, &read10(blocks as u32, 1), &[], oob);
    check(&t, 0, &read10(blocks as u32 - 1, 2), &[], oob);
    check(&t, 0, &read10(blocks as u32 + 1, 0), &[], oob);
    check(&t, 0, &read10(0x8000_0000, 0), &[], oob);
    check(&t, 0, &read10(u32::MAX, 0), &[], oob);
    good(&t, 0, &read10(0, 0), &[]);
    good(&t, 0, &read10(blocks as u32 - 1, 1), &[]);
    check(&t, 0, &rw6(0x08, blocks as u32, 1), &[], oob);
    check(&t, 0, &rw12(0xA8, blocks as u32 - 1, 2), &[], oob);
    check(&t, 0, &rw16(0x88, u64::MAX, 1), &[], oob);
    check(&t, 0, &rw16(0x88, u64::MAX, 0), &[], oob);
    check(&t, 0, &rw16(0x88, 1 << 63, 1), &[], oob);
    // Writes.
    let one = [0u8; 512];
    let two = [0u8; 1024];
    check(&t, 0, &rw6(0x0A, blocks as u32, 1), &one, oob);
    let mut w10 = read10(blocks as u32 - 1, 2);
    w10[0] = 0x2A;
    check(&t, 0, &w10, &two, oob);
    check(&t, 0, &rw12(0xAA, blocks as u32, 1), &one, oob);
    check(&t, 0, &rw16(0x8A, u64::MAX, 1), &one, oob);
    check(&t, 0, &rw16(0x8A, blocks - 1, 2), &two, oob);
    // SYNCHRONIZE CACHE(10/16).
    good(&t, 0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    good(&t, 0, &[0x35, 0, 0, 0, 0x03, 0xE7, 0, 0, 1, 0], &[]);
    check(&t, 0, &[0x35, 0, 0, 0, 0x03, 0xE8, 0, 0, 1, 0], &[], oob);
    check(&t, 0, &[0x35, 0, 0, 0, 0x03, 0xE9, 0, 0, 0, 0], &[], oob);
    let mut s16 = rw16(0x91, blocks - 1, 1);
    good(&t, 0, &s16, &[]);
    s16 = rw16(0x91, blocks, 1);
    check(&t, 0, &s16, &[], oob);
    // Over the maximum transfer length (in range): invalid field.
    let (big, _) = target(&[(1 << 30, 512)]);
    check(
        &big,
        0,
        &rw16(0x88, 0, 0x10_0000),
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    // RDPROTECT / WRPROTECT without protection information.
    let mut r = read10(0, 1);
    r[1] = 0x20;
    check(&t, 0, &r, &[], Sense::INVALID_FIELD_IN_CDB);
    // Short Data-Out.
    let mut w = read10(0, 2);
    w[0] = 0x2A;
    check(&t, 0, &w, &one, Sense::INVALID_FIELD_IN_CDB);
    // Truncated CDB.
    check(&t, 0, &[0x28, 0, 0], &[], Sense::INVALID_FIELD_IN_CDB);
}

#[test]
fn sparse_ram() {
    let (t, stores) = target(&[(64 << 20, 512)]);
    let d = good(&t, 0, &rw16(0x88, 10_000, 2048), &[]);
    assert_eq!(d.len(), 2048 * 512);
    assert!(d.iter().all(|&b| b == 0));
    assert_eq!(stores[0].allocated_bytes(), 0);
    good(&t, 0, &rw16(0x8A, 0, 1), &[1u8; 512]);
    assert_eq!(stores[0].allocated_bytes(), 64 * 1024);
}

#[test]
fn unmap_deallocates() {
    let (t, stores) = target(&[(1 << 20, 512)]);
    good(&t, 0, &rw16(0x8A, 0, 256), &[7u8; 256 * 512]);
    assert!(stores[0].allocated_bytes() > 0);
    let mut params = vec![0, 22, 0, 16, 0, 0, 0, 0];
    params.extend_from_slice(&0u64.to_be_bytes());
    params.extend_from_slice(&256u32.to_be_bytes());
    params.extend_from_slice(&[0; 4]);
    let cdb = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(command_info(&cdb, 512), (DataDirection::Write, 24));
    good(&t, 0, &cdb, &params);
    assert_eq!(stores[0].allocated_bytes(), 0);
    assert!(good(&t, 0, &read10(0, 256), &[]).iter().all(|&b| b == 0));
    // Zero-block descriptors, including at end-of-LUN, and no descriptors.
    let zero = |lba: u64| {
        let mut p = vec![0, 22, 0, 16, 0, 0, 0, 0];
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&[0; 8]);
        p
    };
    good(&t, 0, &cdb, &zero(0));
    good(&t, 0, &cdb, &zero(2048));
    check(&t, 0, &cdb, &zero(2049), Sense::LBA_OUT_OF_RANGE);
    good(
        &t,
        0,
        &[0x42, 0, 0, 0, 0, 0, 0, 0, 8, 0],
        &[0, 6, 0, 0, 0, 0, 0, 0],
    );
    good(&t, 0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    // Out of range descriptor.
    params[8..16].copy_from_slice(&2048u64.to_be_bytes());
    check(&t, 0, &cdb, &params, Sense::LBA_OUT_OF_RANGE);
    // Too-short parameter list.
    check(
        &t,
        0,
        &[0x42, 0, 0, 0, 0, 0, 0, 0, 4, 0],
        &params,
        Sense::PARAMETER_LIST_LENGTH_ERROR,
    );
    // ANCHOR unsupported.
    check(
        &t,
        0,
        &[0x42, 1, 0, 0, 0, 0, 0, 0, 24, 0],
        &params,
        Sense::INVALID_FIELD_IN_CDB,
    );
}

#[test]
fn standard_inquiry() {
    let (t, _) = target(&[(1 << 20, 512)]);
    let d = good(&t, 0, &inquiry(false, 0, 255), &[]);
    assert!(d.len() >= 36);
    assert_eq!(d[0], 0x00);
    assert_eq!(d[2], 0x06, "SPC-4");
    assert_eq!(d[3] & 0x0F, 2, "response data format");
    assert_eq!(usize::from(d[4]) + 5, d.len());
    assert_ne!(d[7] & 0x02, 0, "CmdQue");
    assert_eq!(&d[8..16], b"ISCSI-RS");
    assert_eq!(&d[16..32], b"DISK            ");
    assert_eq!(&d[32..36], b"0001");
    // Allocation length truncates, never errors.
    assert_eq!(good(&t, 0, &inquiry(false, 0, 5), &[]), &d[..5]);
    assert!(good(&t, 0, &inquiry(false, 0, 0), &[]).is_empty());
    // Page code without EVPD, CmdDt, reserved bits, unknown page.
    let invalid = Sense::INVALID_FIELD_IN_CDB;
    check(&t, 0, &inquiry(false, 0x80, 255), &[], invalid);
    check(&t, 0, &[0x12, 0x02, 0, 0, 255, 0], &[], invalid);
    check(&t, 0, &[0x12, 0x04, 0, 0, 255, 0], &[], invalid);
    check(&t, 0, &inquiry(true, 0x81, 255), &[], invalid);
    check(&t, 0, &inquiry(true, 0xB3, 255), &[], invalid);
    // NACA set in the CONTROL byte.
    check(&t, 0, &[0x12, 0, 0, 0, 255, 0x04], &[], invalid);
}

fn vpd(t: &ScsiTarget, page: u8) -> Vec<u8> {
    let d = good(t, 0, &inquiry(true, page, 1024), &[]);
    assert_eq!(d[0], 0x00);
    assert_eq!(d[1], page);
    assert_eq!(usize::from(u16::from_be_bytes([d[2], d[3]])) + 4, d.len());
    d
}

#[test]
fn vpd_pages() {
    let (t, _) = target(&[(1 << 20, 512), (1 << 20, 4096)]);
    let d = vpd(&t, 0x00);
    assert_eq!(&d[4..], &[0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2]);
    for &p in &d[4..] {
        vpd(&t, p);
    }

    let d = vpd(&t, 0x80);
    assert_eq!(&d[4..], b"0000000000001000");

    let d = vpd(&t, 0x83);
    let mut naa = None;
    let mut names = Vec::new();
    let mut rel_port = None;
    let mut i = 4;
    while i < d.len() {
        let (code_set, b1, len) = (d[i] & 0x0F, d[i + 1], usize::from(d[i + 3]));
        let body = &d[i + 4..i + 4 + len];
        match b1 & 0x0F {
            3 => {
                assert_eq!(code_set, 1);
                assert_eq!(b1 & 0x30, 0x00, "LU association");
                assert_eq!(len, 16);
                assert_eq!(body[0] >> 4, 6, "NAA 6");
                naa = Some(body.to_vec());
            }
            4 => rel_port = Some(body.to_vec()),
            8 => {
                assert_eq!(code_set, 3, "UTF-8");
                assert_eq!(len % 4, 0);
                assert_eq!(*body.last().unwrap(), 0);
                names.push((b1 & 0x30, body.to_vec()));
            }
            other => panic!("unexpected designator type {other}"),
        }
        i += 4 + len;
    }
    assert_eq!(i, d.len());
    assert_eq!(&naa.unwrap()[8..], &0x1000u64.to_be_bytes());
    assert_eq!(rel_port.unwrap(), [0, 0, 0, 1]);
    assert!(
        names
            .iter()
            .any(|(a, n)| *a == 0x20 && n.starts_with(TARGET_NAME.as_bytes()))
    );
    assert!(names.iter().any(|(a, _)| *a == 0x10));
    // A different LU has a different NAA.
    let other = good(&t, 1, &inquiry(true, 0x83, 1024), &[]);
    assert_ne!(other[8..24], d[8..24]);

    let d = vpd(&t, 0xB0);
    assert_eq!(d.len(), 64);
    let be32 = |at: usize| u32::from_be_bytes(d[at..at + 4].try_into().unwrap());
    assert_eq!(be32(8), 32 * 1024 * 1024 / 512, "max transfer length");
    assert!(be32(20) > 0 && be32(20) <= 1 << 20, "max unmap LBA count");
    assert!(be32(24) > 0 && be32(24) <= 1 << 20, "max unmap descriptors");
    let d4k = good(&t, 1, &inquiry(true, 0xB0, 1024), &[]);
    assert_eq!(u32::from_be_bytes(d4k[8..12].try_into().unwrap()), 8192);

    let d = vpd(&t, 0xB1);
    assert_eq!(d.len(), 64);
    assert_eq!(&d[4..6], &[0, 1], "non-rotating");

    let d = vpd(&t, 0xB2);
    assert_eq!(d.len(), 8);
    assert_ne!(d[5] & 0x80, 0, "LBPU");
    assert_eq!(d[6] & 0x07, 2, "thin");

    // Truncation of a VPD page.
    let t3 = good(&t, 0, &inquiry(true, 0x83, 3), &[]);
    assert_eq!(t3, &vpd(&t, 0x83)[..3]);
}

fn report_luns(alloc: u32, select: u8) -> Vec<u8> {
    let mut c = vec![0xA0, 0, select, 0, 0, 0];
    c.extend_from_slice(&alloc.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

#[test]
fn report_luns_one_and_three() {
    let (t, _) = target(&[(1 << 20, 512)]);
    let d = good(&t, 0, &report_luns(4096, 0), &[]);
    assert_eq!(d, [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);

    let (t, _) = target(&[(1 << 20, 512); 3]);
    assert_eq!(t.lun_count(), 3);
    for select in [0, 2] {
        let d = good(&t, 0, &report_luns(4096, select), &[]);
        assert_eq!(d.len(), 8 + 24);
        assert_eq!(&d[0..4], &24u32.to_be_bytes());
        for n in 0..3u8 {
            let e = &d[8 + 8 * usize::from(n)..16 + 8 * usize::from(n)];
            assert_eq!(e, [0, n, 0, 0, 0, 0, 0, 0]);
        }
    }
    // Well-known LUs only: none.
    assert_eq!(good(&t, 0, &report_luns(4096, 1), &[]), [0u8; 8]);
    // Truncation keeps the full list length.
    let d = good(&t, 0, &report_luns(16, 0), &[]);
    assert_eq!(d.len(), 16);
    assert_eq!(&d[0..4], &24u32.to_be_bytes());
    check(&t, 0, &report_luns(15, 0), &[], Sense::INVALID_FIELD_IN_CDB);
    check(
        &t,
        0,
        &report_luns(4096, 3),
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    // Also served on a LUN that does not exist.
    let mut di = Vec::new();
    let o = t.execute(&nexus(), encode_lun(9), &report_luns(4096, 0), &[], &mut di);
    assert!(o.is_good());
    assert_eq!(di.len(), 32);
}

/// A LUN added and another removed while a nexus is using the target: the
/// nexus meets REPORTED LUNS DATA HAS CHANGED once on each LU it goes on
/// using, REPORT LUNS lists the new inventory (sparse numbers included),
/// the removed LUN answers LOGICAL UNIT NOT SUPPORTED, and the data of the
/// LUs that stayed is untouched.
#[test]
fn luns_added_and_removed_while_running() {
    let (t, _) = target(&[(1 << 20, 512); 3]);
    let tur = [0u8; 6];
    let write = {
        let mut c = rw16(0x8A, 8, 1);
        c[1] = 0;
        c
    };
    let block = vec![0x5A; 512];
    good(&t, 2, &write, &block);
    good(&t, 0, &tur, &[]);

    let removed = t.remove_lun(1).expect("LUN 1 existed");
    assert_eq!(removed.block_count(), 2048);
    assert!(t.remove_lun(1).is_none(), "removed twice");
    assert_eq!(t.lun_numbers(), [0, 2]);
    let changed = Sense::unit_attention(Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
    check(&t, 0, &tur, &[], changed);
    good(&t, 0, &tur, &[]);
    check(&t, 2, &tur, &[], changed);
    check(&t, 1, &tur, &[], Sense::LUN_NOT_SUPPORTED);
    let d = good(&t, 0, &report_luns(4096, 0), &[]);
    assert_eq!(&d[0..4], &16u32.to_be_bytes());
    assert_eq!(&d[8..16], encode_lun(0).to_be_bytes());
    assert_eq!(&d[16..24], encode_lun(2).to_be_bytes());
    assert_eq!(good(&t, 2, &rw16(0x88, 8, 1), &[]), block);

    // A LUN beyond the end: the table grows; the new LU has no pending
    // attention for the nexus, the old ones have one.
    let store = Arc::new(RamBackstore::new(1 << 20, 4096, 0x2000).unwrap());
    t.add_lun(300, store).unwrap();
    assert_eq!(
        t.add_lun(300, Arc::new(RamBackstore::new(1 << 20, 512, 9).unwrap())),
        Err(iscsi_scsi::LunChangeError::Taken(300))
    );
    assert!(
        t.add_lun(
            0x4000,
            Arc::new(RamBackstore::new(1 << 20, 512, 9).unwrap())
        )
        .is_err()
    );
    good(&t, 300, &tur, &[]);
    check(&t, 0, &tur, &[], changed);
    assert_eq!(t.lun_numbers(), [0, 2, 300]);
    assert_eq!(t.lun_count(), 3);
    let d = good(&t, 0, &report_luns(4096, 0), &[]);
    assert_eq!(&d[24..32], encode_lun(300).to_be_bytes());
    // Removing the last LU shrinks the table; nothing else changes.
    t.remove_lun(300).unwrap();
    assert_eq!(t.lun_numbers(), [0, 2]);
}

#[test]
fn read_capacity() {
    for (bs, blocks) in [(512u32, 2048u64), (4096, 300)] {
        let (t, _) = target(&[(blocks * u64::from(bs), bs)]);
        let d = good(&t, 0, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
        assert_eq!(&d[0..4], &(blocks as u32 - 1).to_be_bytes());
        assert_eq!(&d[4..8], &bs.to_be_bytes());
        let mut c = [0u8; 16];
        c[0] = 0x9E;
        c[1] = 0x10;
        c[13] = 32;
        let d = good(&t, 0, &c, &[]);
        assert_eq!(d.len(), 32);
        assert_eq!(&d[0..8], &(blocks - 1).to_be_bytes());
        assert_eq!(&d[8..12], &bs.to_be_bytes());
        assert_ne!(d[14] & 0x80, 0, "LBPME");
        c[13] = 12;
        assert_eq!(good(&t, 0, &c, &[]).len(), 12);
        c[1] = 0x11;
        check(&t, 0, &c, &[], Sense::INVALID_FIELD_IN_CDB);
        // PMI 0 with an LBA.
        check(
            &t,
            0,
            &[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0],
            &[],
            Sense::INVALID_FIELD_IN_CDB,
        );
    }
    // More than 2^32 blocks: READ CAPACITY(10) says 0xFFFFFFFF.
    let (t, _) = target(&[(((1u64 << 32) + 8) * 512, 512)]);
    let d = good(&t, 0, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(&d[0..4], &[0xFF; 4]);
    let mut c = [0u8; 16];
    c[0] = 0x9E;
    c[1] = 0x10;
    c[13] = 32;
    let d = good(&t, 0, &c, &[]);
    assert_eq!(&d[0..8], &((1u64 << 32) + 7).to_be_bytes());
}

#[test]
fn mode_sense() {
    let (t, _) = target(&[(1 << 20, 512)]);
    // MODE SENSE(6), all pages, with block descriptor.
    let d = good(&t, 0, &[0x1A, 0, 0x3F, 0, 255, 0], &[]);
    assert_eq!(usize::from(d[0]) + 1, d.len());
    assert_eq!(d[3], 8);
    assert_eq!(&d[4..8], &2048u32.to_be_bytes());
    assert_eq!(&d[9..12], &[0, 2, 0]);
    let pages = &d[12..];
    assert_eq!(pages[0], 0x08);
    assert_eq!(pages[1], 0x12);
    assert_ne!(pages[2] & 0x04, 0, "WCE");
    let ctl = &pages[2 + 0x12..];
    assert_eq!(ctl[0], 0x0A);
    assert_eq!(ctl[1], 0x0A);
    // Then the informational exceptions control page.
    assert_eq!(ctl.len(), 24);
    assert_eq!(&ctl[12..14], &[0x1C, 0x0A]);
    // DBD, single page.
    let d = good(&t, 0, &[0x1A, 0x08, 0x0A, 0, 255, 0], &[]);
    assert_eq!(d[3], 0);
    assert_eq!(d.len(), 4 + 12);
    // Truncated.
    assert_eq!(good(&t, 0, &[0x1A, 0, 0x3F, 0, 2, 0], &[]).len(), 2);
    // MODE SENSE(10) with LLBAA.
    let d = good(&t, 0, &[0x5A, 0x10, 0x08, 0, 0, 0, 0, 1, 0, 0], &[]);
    assert_eq!(usize::from(u16::from_be_bytes([d[0], d[1]])) + 2, d.len());
    assert_eq!(d[4] & 1, 1);
    assert_eq!(&d[6..8], &[0, 16]);
    assert_eq!(&d[8..16], &2048u64.to_be_bytes());
    assert_eq!(&d[20..24], &512u32.to_be_bytes());
    assert_eq!(d[24], 0x08);
    // Changeable values: only WCE in the caching page.
    let d = good(&t, 0, &[0x1A, 0x08, 0x48, 0, 255, 0], &[]);
    assert_eq!(d[6], 0x04);
    assert!(d[7..].iter().all(|&b| b == 0));
    // Unsupported page, subpage, saved values.
    check(
        &t,
        0,
        &[0x1A, 0, 0x19, 0, 255, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        0,
        &[0x1A, 0, 0x08, 1, 255, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        0,
        &[0x1A, 0, 0xC8, 0, 255, 0],
        &[],
        Sense::SAVING_PARAMETERS_NOT_SUPPORTED,
    );
}

#[test]
fn unit_attention_and_request_sense() {
    let (t, _) = target(&[(1 << 20, 512)]);
    let d = good(&t, 0, &[0x03, 0, 0, 0, 252, 0], &[]);
    assert_eq!(d.len(), 18);
    assert_eq!(d[0], 0x70);
    assert_eq!(d[2], 0);
    t.raise_unit_attention(0, Sense::POWER_ON_RESET);
    // INQUIRY does not report it; TEST UNIT READY does, once.
    good(&t, 0, &inquiry(false, 0, 36), &[]);
    check(&t, 0, &[0; 6], &[], Sense::POWER_ON_RESET);
    good(&t, 0, &[0; 6], &[]);
    // REQUEST SENSE returns and clears it (descriptor format here).
    t.raise_unit_attention(0, Sense::MODE_PARAMETERS_CHANGED);
    let d = good(&t, 0, &[0x03, 1, 0, 0, 252, 0], &[]);
    assert_eq!(d, [0x72, 0x06, 0x2A, 0x01, 0, 0, 0, 0]);
    let d = good(&t, 0, &[0x03, 0, 0, 0, 252, 0], &[]);
    assert_eq!((d[2], d[12], d[13]), (0, 0, 0));
}

#[test]
fn missing_lun() {
    let (t, _) = target(&[(1 << 20, 512)]);
    let mut di = Vec::new();
    for lun in [encode_lun(1), encode_lun(300), 1, u64::MAX] {
        let o = t.execute(&nexus(), lun, &inquiry(false, 0, 96), &[], &mut di);
        assert!(o.is_good());
        assert_eq!(di[0], 0x7F);
        let o = t.execute(&nexus(), lun, &[0x03, 0, 0, 0, 18, 0], &[], &mut di);
        assert!(o.is_good());
        assert_eq!((di[2], di[12], di[13]), (0x05, 0x25, 0x00));
        for cdb in [&[0u8; 6][..], &read10(0, 1), &[0xFF, 0, 0, 0, 0, 0]] {
            let o = t.execute(&nexus(), lun, cdb, &[], &mut di);
            assert_eq!(o.sense, Some(Sense::LUN_NOT_SUPPORTED));
            assert_eq!(o.sense.unwrap().asc, Asc::new(0x25, 0x00));
            assert!(di.is_empty());
        }
    }
    // Flat addressing of an existing LUN.
    let o = t.execute(&nexus(), 0x4000 << 48, &inquiry(false, 0, 96), &[], &mut di);
    assert!(o.is_good());
    assert_eq!(di[0], 0x00);
}

#[test]
fn unknown_opcodes() {
    let (t, _) = target(&[(1 << 20, 512)]);
    for op in [0x01u8, 0x04, 0x3B, 0x49, 0x7F, 0xC0, 0xFF] {
        check(
            &t,
            0,
            &[op, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[],
            Sense::INVALID_OPCODE,
        );
        assert_eq!(
            command_info(&[op, 0, 0, 0, 0, 0], 512),
            (DataDirection::None, 0)
        );
    }
    check(&t, 0, &[], &[], Sense::INVALID_OPCODE);
    let s = Sense::INVALID_OPCODE;
    assert_eq!(
        (s.key, s.asc),
        (SenseKey::IllegalRequest, Asc::new(0x20, 0x00))
    );
}

/// `execute` takes one buffer reused from command to command (as the
/// transport does): a READ overwrites its bytes in place without zeroing,
/// and no byte of an earlier response survives into a later one.
#[test]
fn reused_data_in_buffer_never_leaks_stale_bytes() {
    let (t, _) = target(&[(64 << 20, 512)]);
    let mut buffer = vec![0xAA; 1 << 20];
    let exec = |cdb: &[u8], data_out: &[u8], buffer: &mut Vec<u8>| {
        t.execute(&nexus(), encode_lun(0), cdb, data_out, buffer)
    };
    // Unwritten blocks into a full stale buffer: zeros, exactly as long.
    assert_eq!(
        exec(&rw16(0x88, 0, 256), &[], &mut buffer),
        CommandOutcome::GOOD
    );
    assert_eq!(buffer.len(), 256 * 512);
    assert!(buffer.iter().all(|&b| b == 0));
    // Written data, into a buffer longer than the read.
    buffer.resize(1 << 20, 0xBB);
    let written = vec![0x5A; 8 * 512];
    assert_eq!(
        exec(&rw16(0x8A, 8, 8), &written, &mut buffer),
        CommandOutcome::GOOD
    );
    assert!(buffer.is_empty(), "a WRITE returns no data");
    assert!(
        buffer.capacity() >= 1 << 20,
        "a WRITE leaves the reused buffer's allocation in place"
    );
    buffer.resize(1 << 20, 0xBB);
    assert_eq!(
        exec(&rw16(0x88, 8, 8), &[], &mut buffer),
        CommandOutcome::GOOD
    );
    assert_eq!(buffer, written);
    // A zero-block READ, one out of range and one with a bad field: empty.
    for cdb in [rw16(0x88, 0, 0), rw16(0x88, (64 << 20) / 512, 1), {
        let mut c = rw16(0x88, 0, 1);
        c[1] = 0x20; // RDPROTECT without protection information
        c
    }] {
        buffer.resize(1 << 20, 0xCC);
        exec(&cdb, &[], &mut buffer);
        assert!(
            buffer.is_empty(),
            "cdb {cdb:02x?} left {} bytes",
            buffer.len()
        );
    }
    // Any other command starts from empty.
    buffer.resize(1 << 20, 0xDD);
    assert_eq!(
        exec(&inquiry(false, 0, 96), &[], &mut buffer),
        CommandOutcome::GOOD
    );
    assert!(buffer.len() <= 96);
    assert!(!buffer.contains(&0xDD));
}

/// `execute_lending`: a READ of at least `sbc::LEND_MIN` bytes from the RAM
/// store comes back as the store's own pieces (one per 64 KiB chunk) with
/// `data_in` untouched scratch; a shorter one, a failed one and `execute`
/// copy as ever.
#[test]
fn large_reads_are_lent_small_ones_copied() {
    let (t, _) = target(&[(1 << 20, 512)]);
    let mut seed = 7;
    let data = random_bytes(&mut seed, 256 * 1024);
    let write = [0x2a, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 0]; // WRITE(10) 512 blocks at 0
    good(&t, 0, &write, &data);
    let read = |blocks: u16| {
        let mut cdb = [0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        cdb
    };
    let (mut data_in, mut lent) = (vec![0xEE; 3], Vec::new());
    let cdb = read((iscsi_scsi::sbc::LEND_MIN / 512) as u16 * 2);
    let o = t.execute_lending(
        &nexus(),
        encode_lun(0),
        &cdb,
        iscsi_scsi::DataOut::NONE,
        &mut data_in,
        &mut lent,
    );
    assert_eq!(o, CommandOutcome::GOOD);
    assert_eq!(data_in, [0xEE; 3], "the scratch comes back as it went in");
    assert_eq!(lent.len(), 2, "one piece per chunk");
    let joined: Vec<u8> = lent.iter().flat_map(|b| b.bytes.iter().copied()).collect();
    assert_eq!(joined, data[..2 * iscsi_scsi::sbc::LEND_MIN]);
    let cdb = read(8);
    let o = t.execute_lending(
        &nexus(),
        encode_lun(0),
        &cdb,
        iscsi_scsi::DataOut::NONE,
        &mut data_in,
        &mut lent,
    );
    assert_eq!(o, CommandOutcome::GOOD);
    assert!(lent.is_empty(), "4 KiB is copied");
    assert_eq!(data_in, data[..4096]);
    // Beyond the end: CHECK CONDITION, nothing lent or copied.
    let mut cdb = read(256);
    cdb[2..6].copy_from_slice(&2000u32.to_be_bytes());
    let o = t.execute_lending(
        &nexus(),
        encode_lun(0),
        &cdb,
        iscsi_scsi::DataOut::NONE,
        &mut data_in,
        &mut lent,
    );
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert!(lent.is_empty() && data_in.is_empty());
}

/// Data-Out in pieces of the store's chunk size: a WRITE (with FUA too)
/// hands them to the store, which keeps the whole aligned ones; any other
/// command with data (WRITE AND VERIFY here) sees them joined; too few
/// bytes fail the command and write nothing.
#[test]
fn data_out_in_pieces() {
    let (t, _) = target(&[(1 << 20, 512)]);
    let mut seed = 11;
    let data = random_bytes(&mut seed, 192 * 1024 + 512);
    let piece = iscsi_stores::RAM_CHUNK_SIZE;
    let in_pieces = |data: &[u8]| data.chunks(piece).map(<[u8]>::to_vec).collect::<Vec<_>>();
    let exec = |cdb: &[u8], pieces: &mut Vec<Vec<u8>>, len: usize| {
        let (mut data_in, mut lent) = (Vec::new(), Vec::new());
        let data_out = iscsi_scsi::DataOut::Pieces { pieces, len };
        t.execute_lending(
            &nexus(),
            encode_lun(0),
            cdb,
            data_out,
            &mut data_in,
            &mut lent,
        )
    };
    let blocks = (data.len() / 512) as u16;
    let read_back = |lba: u32| {
        let mut cdb = [0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        good(&t, 0, &cdb, &[])
    };
    for (opcode, flags, lba) in [
        (0x2a, 0, 0u32),
        (0x2a, 0x08, 128),
        (0x2e, 0, 1),
        (0x2e, 0, 512),
    ] {
        let mut cdb = [opcode, flags, 0, 0, 0, 0, 0, 0, 0, 0];
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let mut pieces = in_pieces(&data);
        assert_eq!(exec(&cdb, &mut pieces, data.len()), CommandOutcome::GOOD);
        assert!(read_back(lba) == data, "opcode {opcode:#x} at lba {lba}");
    }
    // Fewer bytes than the CDB asks for: refused before anything is written.
    let mut cdb = [0x2a, 0, 0, 0, 0x04, 0, 0, 0, 0, 0];
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    let mut pieces = in_pieces(&data);
    let o = exec(&cdb, &mut pieces, data.len() - 512);
    assert_eq!(o.status, iscsi_scsi::status::CHECK_CONDITION);
    assert!(read_back(1024).iter().all(|&b| b == 0));
}
