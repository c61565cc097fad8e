//! SBC-3 commands beyond READ/WRITE: COMPARE AND WRITE, WRITE SAME, VERIFY,
//! WRITE AND VERIFY, START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL, and the
//! FUA / protection / transfer length rules of READ and WRITE.

mod common;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use common::*;
use iscsi_scsi::{
    Asc, Backstore, CommandOutcome, DataDirection, ScsiTarget, Sense, SenseKey, command_info,
    status,
};
use iscsi_stores::RamBackstore;

/// A RAM disk that counts flushes.
#[derive(Debug)]
struct Counting {
    inner: RamBackstore,
    flushes: AtomicUsize,
}

impl Backstore for Counting {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.unmap(offset, len)
    }
    fn unique_id(&self) -> u64 {
        1
    }
}

fn counting() -> (ScsiTarget, Arc<Counting>) {
    let c = Arc::new(Counting {
        inner: RamBackstore::new(1 << 20, 512, 1).unwrap(),
        flushes: AtomicUsize::new(0),
    });
    (target_over(Arc::clone(&c) as Arc<dyn Backstore>), c)
}

fn miscompare(at: u64) -> Sense {
    Sense::new(SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY).with_information(at)
}

#[test]
fn compare_and_write() {
    let (t, _) = ram_target(1 << 20, 512);
    let n = nexus(1);
    good(&t, &n, &write16(10, 2), &[b'A'; 1024]);
    // Match: the second half is written.
    let mut data = vec![b'A'; 1024];
    data.extend_from_slice(&[b'B'; 1024]);
    good(&t, &n, &caw(10, 2), &data);
    assert_eq!(good(&t, &n, &read16(10, 2), &[]), vec![b'B'; 1024]);
    // Mismatch at byte 700: MISCOMPARE with INFORMATION 700, nothing written.
    let mut data = vec![b'B'; 1024];
    data[700] = b'X';
    data.extend_from_slice(&[b'C'; 1024]);
    let (o, d) = run(&t, &n, &caw(10, 2), &data);
    assert!(d.is_empty());
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert_eq!(o.sense, Some(miscompare(700)));
    let fixed = o.sense.unwrap().to_fixed_format();
    assert_eq!(fixed[0], 0xF0, "VALID");
    assert_eq!(fixed[2], 0x0E);
    assert_eq!(&fixed[3..7], &700u32.to_be_bytes());
    assert_eq!((fixed[12], fixed[13]), (0x1D, 0x00));
    assert_eq!(good(&t, &n, &read16(10, 2), &[]), vec![b'B'; 1024]);
    // Zero blocks: nothing to do. Beyond the end, too many blocks, WRPROTECT.
    good(&t, &n, &caw(0, 0), &[]);
    check(&t, &n, &caw(2047, 2), &[0; 2048], Sense::LBA_OUT_OF_RANGE);
    check(
        &t,
        &n,
        &caw(0, 129),
        &vec![0; 129 * 1024],
        Sense::INVALID_FIELD_IN_CDB,
    );
    let mut c = caw(0, 1);
    c[1] = 0x20;
    check(&t, &n, &c, &[0; 1024], Sense::INVALID_FIELD_IN_CDB);
    // Short Data-Out.
    check(&t, &n, &caw(0, 1), &[0; 1000], Sense::INVALID_FIELD_IN_CDB);
    assert_eq!(command_info(&caw(0, 3), 512), (DataDirection::Write, 3072));
    // Block Limits advertises the limit.
    let b0 = good(&t, &n, &[0x12, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(b0[5], 128);
}

#[test]
fn compare_and_write_is_atomic_under_contention() {
    const BLOCKS: u8 = 8;
    let (t, _) = ram_target(1 << 20, 512);
    let t = Arc::new(t);
    let len = usize::from(BLOCKS) * 512;
    good(
        &t,
        &nexus(0),
        &write16(100, u32::from(BLOCKS)),
        &vec![0u8; len],
    );
    let successes = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (1..=3u64)
        .map(|id| {
            let t = Arc::clone(&t);
            let successes = Arc::clone(&successes);
            thread::spawn(move || {
                let n = nexus(id);
                let mut mine = 0;
                while mine < 200 {
                    let cur = good(&t, &n, &read16(100, u32::from(BLOCKS)), &[]);
                    // Every read sees one whole generation, never a mix.
                    assert!(cur.iter().all(|&b| b == cur[0]), "torn read");
                    let mut data = cur.clone();
                    data.extend(std::iter::repeat_n(cur[0].wrapping_add(1), len));
                    let (o, _) = run(&t, &n, &caw(100, BLOCKS), &data);
                    if o.is_good() {
                        mine += 1;
                        successes.fetch_add(1, Ordering::SeqCst);
                    } else {
                        assert_eq!(o.sense.unwrap().key, SenseKey::Miscompare);
                    }
                }
            })
        })
        .collect();
    // A plain writer elsewhere in the LU runs at the same time.
    let writer = {
        let t = Arc::clone(&t);
        thread::spawn(move || {
            for i in 0..300u32 {
                good(&t, &nexus(9), &write16(200, 8), &vec![i as u8; 4096]);
            }
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    writer.join().unwrap();
    let total = successes.load(Ordering::SeqCst);
    assert_eq!(total, 600);
    let fin = good(&t, &nexus(0), &read16(100, u32::from(BLOCKS)), &[]);
    assert!(fin.iter().all(|&b| usize::from(b) == total % 256));
}

fn ws10(b1: u8, lba: u32, n: u16) -> Vec<u8> {
    cdb10(0x41, b1, lba, n)
}

fn ws16(b1: u8, lba: u64, n: u32) -> Vec<u8> {
    cdb16(0x93, b1, lba, n)
}

#[test]
fn write_same() {
    let (t, ram) = ram_target(4 << 20, 512);
    let n = nexus(1);
    let block = pattern(5, 512);
    good(&t, &n, &ws10(0, 3, 5), &block);
    let d = good(&t, &n, &read16(2, 7), &[]);
    assert!(d[..512].iter().all(|&b| b == 0));
    for i in 1..6 {
        assert_eq!(&d[i * 512..(i + 1) * 512], &block[..]);
    }
    assert!(d[6 * 512..].iter().all(|&b| b == 0));
    // WRITE SAME(16) over more than one internal step.
    good(&t, &n, &ws16(0, 1000, 3000), &block);
    let d = good(&t, &n, &read16(3999, 1), &[]);
    assert_eq!(d, block);
    // UNMAP with a zero block deallocates.
    let before = ram.allocated_bytes();
    good(&t, &n, &ws16(0x08, 0, 8192), &[0u8; 512]);
    assert!(ram.allocated_bytes() < before);
    assert_eq!(ram.allocated_bytes(), 0);
    // UNMAP deallocates whatever the block holds: the range reads as
    // zeros (LBPRZ), as libiscsi's WriteSame10.UnmapUntilEnd expects.
    good(&t, &n, &ws16(0, 10, 2), &block);
    good(&t, &n, &ws10(0x08, 10, 2), &block);
    assert!(good(&t, &n, &read16(10, 2), &[]).iter().all(|&b| b == 0));
    // NDOB: zeros without Data-Out.
    good(&t, &n, &ws16(0x01, 10, 2), &[]);
    assert!(good(&t, &n, &read16(10, 2), &[]).iter().all(|&b| b == 0));
    assert_eq!(
        command_info(&ws16(0x01, 0, 1), 512),
        (DataDirection::None, 0)
    );
    assert_eq!(
        command_info(&ws16(0, 0, 9), 512),
        (DataDirection::Write, 512)
    );
    assert_eq!(
        command_info(&ws10(0, 0, 9), 4096),
        (DataDirection::Write, 4096)
    );
    // 0 blocks = to the end; here the LU (8192) is within MAXIMUM WRITE SAME LENGTH.
    good(&t, &n, &ws10(0, 8190, 0), &block);
    assert_eq!(good(&t, &n, &read16(8191, 1), &[]), block);
    // Errors: ANCHOR, WRPROTECT, PBDATA/LBDATA, beyond the end.
    check(
        &t,
        &n,
        &ws16(0x10, 0, 1),
        &block,
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &ws16(0x20, 0, 1),
        &block,
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &ws10(0x02, 0, 1),
        &block,
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &ws10(0x04, 0, 1),
        &block,
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(&t, &n, &ws16(0, 8192, 1), &block, Sense::LBA_OUT_OF_RANGE);
    check(&t, &n, &ws16(0, 8193, 0), &block, Sense::LBA_OUT_OF_RANGE);
    check(&t, &n, &ws16(0, 8192, 0), &block, Sense::LBA_OUT_OF_RANGE);
    check(
        &t,
        &n,
        &ws16(0, u64::MAX, 1),
        &block,
        Sense::LBA_OUT_OF_RANGE,
    );
    check(
        &t,
        &n,
        &ws16(0, 0, 1),
        &[0; 100],
        Sense::INVALID_FIELD_IN_CDB,
    );
    // Block Limits: MAXIMUM WRITE SAME LENGTH, WSNZ 0; B2: LBPU, LBPWS, LBPWS10.
    let b0 = good(&t, &n, &[0x12, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(b0[4] & 1, 0, "WSNZ");
    assert_eq!(&b0[36..44], &0x10_0000u64.to_be_bytes());
    let b2 = good(&t, &n, &[0x12, 1, 0xB2, 0, 64, 0], &[]);
    assert_eq!(b2[5], 0xE4);
    assert_eq!(b2[6] & 0x07, 2);
}

#[test]
fn write_same_longer_than_the_maximum() {
    // 2^21 blocks of 512: 1 GiB of sparse RAM, never touched.
    let (t, _) = ram_target(1 << 30, 512);
    let n = nexus(1);
    check(
        &t,
        &n,
        &ws16(0, 0, 0),
        &[0; 512],
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &ws16(0, 0, 0x10_0001),
        &[0; 512],
        Sense::INVALID_FIELD_IN_CDB,
    );
    good(&t, &n, &ws16(0x08, (1 << 21) - 0x10_0000, 0), &[0; 512]);
}

#[test]
fn verify() {
    let (t, _) = ram_target(1 << 20, 512);
    let n = nexus(1);
    let data = pattern(7, 4 * 512);
    good(&t, &n, &write16(20, 4), &data);
    // BYTCHK 0: medium check only.
    good(&t, &n, &cdb10(0x2F, 0, 20, 4), &[]);
    good(&t, &n, &cdb16(0x8F, 0, 0, 2048), &[]);
    // BYTCHK 1: compare.
    good(&t, &n, &cdb10(0x2F, 0x02, 20, 4), &data);
    good(&t, &n, &cdb12(0xAF, 0x12, 20, 4), &data);
    let mut bad = data.clone();
    bad[1500] ^= 0x55;
    check(&t, &n, &cdb16(0x8F, 0x02, 20, 4), &bad, miscompare(1500));
    // BYTCHK 3: one block against every block.
    good(&t, &n, &write16(40, 3), &[9u8; 1536]);
    good(&t, &n, &cdb10(0x2F, 0x06, 40, 3), &[9u8; 512]);
    check(
        &t,
        &n,
        &cdb10(0x2F, 0x06, 39, 3),
        &[9u8; 512],
        miscompare(0),
    );
    check(
        &t,
        &n,
        &cdb10(0x2F, 0x06, 41, 3),
        &[9u8; 512],
        miscompare(1024),
    );
    // Errors: BYTCHK 2, VRPROTECT, beyond the end; 0 blocks is fine.
    check(
        &t,
        &n,
        &cdb10(0x2F, 0x04, 0, 1),
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &cdb10(0x2F, 0x20, 0, 1),
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &cdb10(0x2F, 0, 2048, 1),
        &[],
        Sense::LBA_OUT_OF_RANGE,
    );
    check(
        &t,
        &n,
        &cdb16(0x8F, 0, u64::MAX, 1),
        &[],
        Sense::LBA_OUT_OF_RANGE,
    );
    good(&t, &n, &cdb10(0x2F, 0x02, 2048, 0), &[]);
    // Data-Out lengths.
    assert_eq!(
        command_info(&cdb10(0x2F, 0, 0, 4), 512),
        (DataDirection::None, 0)
    );
    assert_eq!(
        command_info(&cdb10(0x2F, 0x02, 0, 4), 512),
        (DataDirection::Write, 2048)
    );
    assert_eq!(
        command_info(&cdb12(0xAF, 0x06, 0, 4), 512),
        (DataDirection::Write, 512)
    );
    assert_eq!(
        command_info(&cdb16(0x8F, 0x06, 0, 0), 512),
        (DataDirection::None, 0)
    );
    // Descriptor-format sense carries INFORMATION in a descriptor.
    let s = miscompare(0x1_0000_0000).to_descriptor_format();
    assert_eq!(&s[..4], &[0x72, 0x0E, 0x1D, 0x00]);
    assert_eq!(s[7], 12);
    assert_eq!(&s[8..12], &[0x00, 0x0A, 0x80, 0x00]);
    assert_eq!(&s[12..20], &0x1_0000_0000u64.to_be_bytes());
    // Too large for the fixed format's 4-byte field: VALID stays clear.
    assert_eq!(miscompare(0x1_0000_0000).to_fixed_format()[0], 0x70);
}

#[test]
fn write_and_verify_is_durable() {
    let (t, c) = counting();
    let n = nexus(1);
    let data = pattern(1, 1024);
    good(&t, &n, &cdb10(0x2E, 0, 5, 2), &data);
    assert_eq!(c.flushes.load(Ordering::SeqCst), 1);
    good(&t, &n, &cdb12(0xAE, 0x02, 5, 2), &data);
    good(&t, &n, &cdb16(0x8E, 0x12, 5, 2), &data);
    assert_eq!(c.flushes.load(Ordering::SeqCst), 3);
    assert_eq!(good(&t, &n, &read16(5, 2), &[]), data);
    check(
        &t,
        &n,
        &cdb10(0x2E, 0x20, 5, 2),
        &data,
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &cdb10(0x2E, 0x04, 5, 2),
        &data,
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &cdb10(0x2E, 0, 2047, 2),
        &data,
        Sense::LBA_OUT_OF_RANGE,
    );
    good(&t, &n, &cdb10(0x2E, 0, 0, 0), &[]);
    assert_eq!(
        command_info(&cdb16(0x8E, 0, 0, 3), 4096),
        (DataDirection::Write, 12288)
    );
}

#[test]
fn fua_and_write_cache() {
    let (t, c) = counting();
    let n = nexus(1);
    // WCE 1 (default): a plain WRITE is cached, FUA writes through.
    good(&t, &n, &write16(0, 1), &[1; 512]);
    assert_eq!(c.flushes.load(Ordering::SeqCst), 0);
    good(&t, &n, &cdb16(0x8A, 0x08, 0, 1), &[2; 512]);
    good(&t, &n, &cdb10(0x2A, 0x18, 0, 1), &[3; 512]);
    assert_eq!(c.flushes.load(Ordering::SeqCst), 2);
    // DPO and FUA on READ are fine.
    good(&t, &n, &cdb10(0x28, 0x18, 0, 1), &[]);
    // RDPROTECT/WRPROTECT: no protection information.
    check(
        &t,
        &n,
        &cdb10(0x28, 0x20, 0, 1),
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &n,
        &cdb16(0x8A, 0x40, 0, 1),
        &[0; 512],
        Sense::INVALID_FIELD_IN_CDB,
    );
    // Beyond MAXIMUM TRANSFER LENGTH (32 MiB: 65536 blocks of 512).
    let (big, _) = ram_target(64 << 20, 512);
    check(
        &big,
        &n,
        &read16(0, 65537),
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    let b0 = good(&big, &n, &[0x12, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(&b0[8..12], &65536u32.to_be_bytes());
    // SYNCHRONIZE CACHE flushes.
    good(&t, &n, &cdb10(0x35, 0, 0, 0), &[]);
    assert_eq!(c.flushes.load(Ordering::SeqCst), 3);
}

#[test]
fn start_stop_and_prevent_allow() {
    let (t, c) = counting();
    let n = nexus(1);
    good(&t, &n, &[0x1B, 0, 0, 0, 0x01, 0], &[]);
    good(&t, &n, &[0x1B, 1, 0, 0, 0x03, 0], &[]);
    assert_eq!(c.flushes.load(Ordering::SeqCst), 0);
    // STOP synchronizes the cache unless NO_FLUSH.
    good(&t, &n, &[0x1B, 0, 0, 0, 0x00, 0], &[]);
    assert_eq!(c.flushes.load(Ordering::SeqCst), 1);
    good(&t, &n, &[0x1B, 0, 0, 0, 0x04, 0], &[]);
    assert_eq!(c.flushes.load(Ordering::SeqCst), 1);
    good(&t, &n, &[0x1B, 0, 0, 0, 0x10, 0], &[]);
    good(&t, &n, &[0x00; 6], &[]);
    // Every power condition is accepted (and changes nothing).
    good(&t, &n, &[0x1B, 0, 0, 0, 0x50, 0], &[]);
    check(
        &t,
        &n,
        &[0x1B, 0x02, 0, 0, 0x01, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    for prevent in 0..4u8 {
        good(&t, &n, &[0x1E, 0, 0, 0, prevent, 0], &[]);
    }
    check(
        &t,
        &n,
        &[0x1E, 0, 0, 0, 0x04, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
}

#[test]
fn read_capacity_16_reports_provisioning() {
    let (t, _) = ram_target(1 << 20, 512);
    let d = good(&t, &nexus(1), &cdb16(0x9E, 0x10, 0, 32), &[]);
    assert_eq!(d[14] & 0xC0, 0xC0, "LBPME, LBPRZ");
    let (o, _) = run(&t, &nexus(1), &cdb16(0x9E, 0x11, 0, 32), &[]);
    assert_eq!(o.sense, Some(Sense::INVALID_FIELD_IN_CDB));
    assert_ne!(o, CommandOutcome::GOOD);
}

#[test]
fn orwrite_ors_into_the_medium() {
    let (t, _) = ram_target(4 << 20, 512);
    let n = nexus(1);
    good(&t, &n, &write16(7, 2), &[0x0Fu8; 1024]);
    good(&t, &n, &cdb16(0x8B, 0, 7, 2), &[0x30u8; 1024]);
    assert!(good(&t, &n, &read16(7, 2), &[]).iter().all(|&b| b == 0x3F));
    // FUA and DPO are accepted; ORPROTECT is not (no protection info).
    good(&t, &n, &cdb16(0x8B, 0x18, 7, 1), &[0x40u8; 512]);
    assert!(good(&t, &n, &read16(7, 1), &[]).iter().all(|&b| b == 0x7F));
    check(
        &t,
        &n,
        &cdb16(0x8B, 0x20, 7, 1),
        &[0u8; 512],
        Sense::INVALID_FIELD_IN_CDB,
    );
    // Zero blocks: nothing; past the end: LBA OUT OF RANGE.
    good(&t, &n, &cdb16(0x8B, 0, 0, 0), &[]);
    check(
        &t,
        &n,
        &cdb16(0x8B, 0, 8192, 1),
        &[0u8; 512],
        Sense::LBA_OUT_OF_RANGE,
    );
    check(
        &t,
        &n,
        &cdb16(0x8B, 0, u64::MAX, 0),
        &[],
        Sense::LBA_OUT_OF_RANGE,
    );
    assert_eq!(
        command_info(&cdb16(0x8B, 0, 0, 3), 512),
        (DataDirection::Write, 1536)
    );
}

#[test]
fn pre_fetch_checks_the_range_and_read_defect_data_reports_none() {
    let (t, _) = ram_target(4 << 20, 512);
    let n = nexus(1);
    good(&t, &n, &cdb10(0x34, 0x02, 0, 16), &[]);
    good(&t, &n, &cdb16(0x90, 0, 8191, 1), &[]);
    check(
        &t,
        &n,
        &cdb16(0x90, 0, 8191, 2),
        &[],
        Sense::LBA_OUT_OF_RANGE,
    );
    check(
        &t,
        &n,
        &cdb10(0x34, 0x01, 0, 1),
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    // READ DEFECT DATA(10): format echoed, an empty list.
    let d = good(&t, &n, &[0x37, 0, 0x1D, 0, 0, 0, 0, 0, 32, 0], &[]);
    assert_eq!(d, [0, 0x1D, 0, 0]);
    let d = good(&t, &n, &[0xB7, 0x0D, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0], &[]);
    assert_eq!(d, [0, 0x0D, 0, 0, 0, 0, 0, 0]);
    // Allocation length 2 cuts the header.
    let d = good(&t, &n, &[0x37, 0, 0x1D, 0, 0, 0, 0, 0, 2, 0], &[]);
    assert_eq!(d.len(), 2);
}

/// A store every access to which fails with one errno (a medium behind a
/// network: timed out, fenced, gone; or a plain I/O error).
#[derive(Debug)]
struct Erring(i32);

impl Backstore for Erring {
    fn block_size(&self) -> u32 {
        512
    }
    fn block_count(&self) -> u64 {
        2048
    }
    fn read_at(&self, _: u64, _: &mut [u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(self.0))
    }
    fn write_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(self.0))
    }
    fn flush(&self) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(self.0))
    }
    fn unmap(&self, _: u64, _: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(self.0))
    }
    fn unique_id(&self) -> u64 {
        7
    }
}

/// A backstore error reaches the initiator through `Sense::for_io_error`:
/// unreachable or gone media are NOT READY (retry, or another path), only
/// a real I/O error is the command's MEDIUM ERROR.
#[test]
fn backstore_errors_answer_the_sense_their_errno_means() {
    let sync_cache16 = cdb16(0x91, 0, 0, 0);
    for (errno, read, write) in [
        (
            110, // ETIMEDOUT
            Sense::LU_COMMUNICATION_TIMEOUT,
            Sense::LU_COMMUNICATION_TIMEOUT,
        ),
        (
            108, // ESHUTDOWN: Ceph's EBLOCKLISTED
            Sense::LU_COMMUNICATION_FAILURE,
            Sense::LU_COMMUNICATION_FAILURE,
        ),
        (2, Sense::MEDIUM_NOT_PRESENT, Sense::MEDIUM_NOT_PRESENT), // ENOENT
        (5, Sense::READ_ERROR, Sense::WRITE_ERROR),                // EIO
    ] {
        let t = target_over(Arc::new(Erring(errno)));
        let a = nexus(1);
        // The first command after power on gets the unit attention.
        let _ = run(&t, &a, &[0; 6], &[]);
        check(&t, &a, &read16(0, 1), &[], read);
        check(&t, &a, &write16(0, 1), &[0; 512], write);
        check(&t, &a, &sync_cache16, &[], write);
    }
}
