//! WRITE ATOMIC(16) and SANITIZE: what each store advertises, every check
//! condition, reservations, write protection, a reader never seeing a torn
//! atomic write, progress while a sanitize runs, and the failure state.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use iscsi_scsi::{
    Asc, Backstore, CommandOutcome, DataOut, Nexus, ScsiTarget, SenseKey, encode_lun, status,
};
use iscsi_stores::{
    BlockBackstore, EncryptedBackstore, FileBackstore, RamBackstore, SlowBackstore,
};

/// WRITE ATOMIC(16): byte 1 flags, LBA, ATOMIC BOUNDARY, TRANSFER LENGTH.
fn wa16(b1: u8, lba: u64, boundary: u16, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x9C, b1];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&boundary.to_be_bytes());
    c.extend_from_slice(&blocks.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

/// SANITIZE: byte 1 (IMMED, AUSE, service action), PARAMETER LIST LENGTH.
fn sanitize(b1: u8, len: u16) -> Vec<u8> {
    let mut c = vec![0x48, b1, 0, 0, 0, 0, 0];
    c.extend_from_slice(&len.to_be_bytes());
    c.push(0);
    c
}

/// An OVERWRITE parameter list.
fn overwrite_list(b0: u8, pattern: &[u8]) -> Vec<u8> {
    let mut p = vec![b0, 0];
    p.extend_from_slice(&(pattern.len() as u16).to_be_bytes());
    p.extend_from_slice(pattern);
    p
}

/// Asserts CHECK CONDITION with `key` and `asc` (field pointers and
/// progress are looked at where they matter).
#[track_caller]
fn check_asc(t: &ScsiTarget, n: &Nexus, cdb: &[u8], out: &[u8], key: SenseKey, asc: Asc) {
    let (o, _) = run(t, n, cdb, out);
    assert_eq!(o.status, status::CHECK_CONDITION, "cdb {cdb:02x?}");
    let s = o.sense.unwrap();
    assert_eq!((s.key, s.asc), (key, asc), "cdb {cdb:02x?}");
}

#[track_caller]
fn invalid_field(t: &ScsiTarget, n: &Nexus, cdb: &[u8], out: &[u8]) {
    let (o, _) = run(t, n, cdb, out);
    let s = o.sense.expect("check condition");
    assert_eq!(s.key, SenseKey::IllegalRequest, "cdb {cdb:02x?}");
    assert!(
        s.asc == Asc::INVALID_FIELD_IN_CDB || s.asc == Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        "cdb {cdb:02x?}: {s}"
    );
}

/// Block Limits bytes 44-63: the five atomic fields.
fn atomic_fields(t: &ScsiTarget) -> [u32; 5] {
    let d = good(t, &nexus(1), &[0x12, 0x01, 0xB0, 0, 255, 0], &[]);
    assert_eq!(d.len(), 64);
    std::array::from_fn(|i| u32::from_be_bytes(d[44 + 4 * i..48 + 4 * i].try_into().unwrap()))
}

/// REPORT SUPPORTED OPERATION CODES, one command: its SUPPORT field.
fn support(t: &ScsiTarget, op: u8, sa: Option<u16>) -> u8 {
    let options = if sa.is_some() { 2 } else { 1 };
    let mut c = vec![0xA3, 0x0C, options, op];
    c.extend_from_slice(&sa.unwrap_or(0).to_be_bytes());
    c.extend_from_slice(&1024u32.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    good(t, &nexus(1), &c, &[])[1] & 0x07
}

fn set_swp(t: &ScsiTarget, n: &Nexus, on: bool) {
    let d = good(t, n, &[0x1A, 0x08, 0x0A, 0, 255, 0], &[]);
    let mut p = vec![0, 0, 0, 0];
    p.extend_from_slice(&d[4..]);
    if on {
        p[4 + 4] |= 0x08;
    } else {
        p[4 + 4] &= !0x08;
    }
    good(t, n, &[0x15, 0x10, 0, 0, p.len() as u8, 0], &p);
    // The other nexuses' unit attention is theirs to take.
}

fn file_store(dir: &tempfile::TempDir, size: u64) -> Arc<FileBackstore> {
    Arc::new(FileBackstore::open(dir.path().join("lu.img"), Some(size), 512, 3).unwrap())
}

#[test]
fn atomic_limits_are_what_each_store_promises() {
    // RAM: any write is atomic; bounded by the 16-bit TRANSFER LENGTH
    // (MAXIMUM TRANSFER LENGTH is 65536 blocks of 512).
    let (t, _) = ram_target(64 << 20, 512);
    assert_eq!(atomic_fields(&t), [0xFFFF, 0, 0, 0xFFFF, 0xFFFF]);
    assert_eq!(support(&t, 0x9C, None), 3);
    // 4096-byte blocks: MAXIMUM TRANSFER LENGTH (32 MiB) is the bound.
    let (t4, _) = ram_target(64 << 20, 4096);
    assert_eq!(atomic_fields(&t4)[0], 8192);
    // Behind a latency, the same store promises the same.
    let slow = SlowBackstore::new(
        Arc::new(RamBackstore::new(1 << 20, 512, 1).unwrap()),
        Duration::ZERO,
    );
    assert_eq!(atomic_fields(&target_over(Arc::new(slow)))[0], 0xFFFF);
    // A file promises nothing: no fields, no command.
    let dir = tempfile::tempdir().unwrap();
    let t = target_over(file_store(&dir, 1 << 20));
    assert_eq!(atomic_fields(&t), [0; 5]);
    assert_eq!(support(&t, 0x9C, None), 1);
    check(
        &t,
        &nexus(1),
        &wa16(0, 0, 0, 1),
        &[0; 512],
        iscsi_scsi::Sense::INVALID_OPCODE,
    );
    let blk = dir.path().join("blk.img");
    std::fs::write(&blk, vec![0u8; 1 << 20]).unwrap();
    let t = target_over(Arc::new(BlockBackstore::open(&blk, false, 4).unwrap()));
    assert_eq!(atomic_fields(&t), [0; 5]);
    assert_eq!(support(&t, 0x9C, None), 1);
}

#[test]
fn write_atomic_writes_and_checks_every_field() {
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    let cap = 2048u64;
    let data = pattern(5, 8 * 512);
    good(&t, &a, &wa16(0, 8, 0, 8), &data);
    assert_eq!(good(&t, &a, &read16(8, 8), &[]), data);
    // DPO and FUA (written through), an ATOMIC BOUNDARY within limits.
    for b1 in [0x10, 0x08, 0x18] {
        good(&t, &a, &wa16(b1, 0, 0, 8), &data);
    }
    good(&t, &a, &wa16(0, 0, 4, 8), &data);
    // 0 blocks: nothing, at any LBA up to the capacity.
    good(&t, &a, &wa16(0, cap, 0, 0), &[]);
    let oob = iscsi_scsi::Sense::LBA_OUT_OF_RANGE;
    check(&t, &a, &wa16(0, cap + 1, 0, 0), &[], oob);
    check(&t, &a, &wa16(0, cap - 1, 0, 2), &[0; 1024], oob);
    check(&t, &a, &wa16(0, 1 << 63, 0, 1), &[0; 512], oob);
    check(&t, &a, &wa16(0, u64::MAX, 0, 1), &[0; 512], oob);
    // WRPROTECT (no protection information), reserved bits.
    for b1 in [0x20, 0x40, 0xE0, 0x01, 0x04] {
        invalid_field(&t, &a, &wa16(b1, 0, 0, 1), &[0; 512]);
    }
    // Longer than the limits (on a LU big enough to be in range).
    let (big, _) = ram_target(64 << 20, 4096);
    invalid_field(&big, &a, &wa16(0, 0, 0, 8193), &vec![0; 8193 * 4096]);
    invalid_field(&big, &a, &wa16(0, 0, 8193, 8), &vec![0; 8 * 4096]);
    // Short data: refused, nothing written.
    invalid_field(&t, &a, &wa16(0, 100, 0, 2), &[7; 512]);
    assert!(good(&t, &a, &read16(100, 1), &[]).iter().all(|&b| b == 0));
    // Software write protect.
    set_swp(&t, &a, true);
    check_asc(
        &t,
        &a,
        &wa16(0, 0, 0, 1),
        &[0; 512],
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );
    set_swp(&t, &a, false);
    good(&t, &a, &wa16(0, 0, 0, 1), &[0; 512]);
}

#[test]
fn write_atomic_conflicts_as_write_16_does() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    good(&t, &b, &[0x16, 0, 0, 0, 0, 0], &[]); // RESERVE(6)
    conflict(&t, &a, &wa16(0, 0, 0, 1), &[0; 512]);
    good(&t, &b, &wa16(0, 0, 0, 1), &[0; 512]);
}

/// Writers send WRITE ATOMIC of whole-range patterns across chunk
/// boundaries (one in one buffer, one in chunk-sized pieces as the
/// transport receives them); readers never see two patterns in one READ.
#[test]
fn a_reader_never_sees_a_torn_atomic_write() {
    let (t, _) = ram_target(16 << 20, 512);
    let t = Arc::new(t);
    // 3 chunks and a bit, starting inside a chunk.
    let (lba, blocks) = (100u64, 400u16);
    let len = usize::from(blocks) * 512;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u8)
        .map(|w| {
            let (t, stop) = (Arc::clone(&t), Arc::clone(&stop));
            std::thread::spawn(move || {
                let n = nexus(10 + u64::from(w));
                let mut i = 0u8;
                let (mut data_in, mut lent) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    i = i.wrapping_add(1);
                    let fill = (i << 1) | w | 1;
                    if w == 0 {
                        good(&t, &n, &wa16(0, lba, 0, blocks), &vec![fill; len]);
                    } else {
                        // In pieces of a chunk, as the transport hands a
                        // large write over (`Backstore::write_pieces`).
                        let mut pieces: Vec<Vec<u8>> = vec![fill; len]
                            .chunks(iscsi_stores::RAM_CHUNK_SIZE)
                            .map(<[u8]>::to_vec)
                            .collect();
                        let data = DataOut::Pieces {
                            pieces: &mut pieces,
                            len,
                        };
                        let cdb = wa16(0, lba, 0, blocks);
                        let o = t.execute_lending(
                            &n,
                            encode_lun(0),
                            &cdb,
                            data,
                            &mut data_in,
                            &mut lent,
                        );
                        assert_eq!(o, CommandOutcome::GOOD);
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                let n = nexus(20 + r);
                for _ in 0..2000 {
                    let d = good(&t, &n, &read16(lba, u32::from(blocks)), &[]);
                    assert!(d.iter().all(|&b| b == d[0]), "torn: {} and others", d[0]);
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
}

#[test]
fn sanitize_overwrite_on_ram_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [Arc<dyn Backstore>; 2] = [
        Arc::new(RamBackstore::new(4 << 20, 512, 1).unwrap()),
        file_store(&dir, 4 << 20),
    ];
    for store in stores {
        let t = target_over(store);
        let a = nexus(1);
        good(&t, &a, &write16(0, 8), &pattern(1, 8 * 512));
        // A 4-byte pattern, repeated over every block.
        let list = overwrite_list(0x01, &[1, 2, 3, 4]);
        good(&t, &a, &sanitize(0x01, list.len() as u16), &list);
        let want: Vec<u8> = [1u8, 2, 3, 4].repeat(128);
        assert_eq!(good(&t, &a, &read16(0, 1), &[]), want);
        assert_eq!(good(&t, &a, &read16(8191, 1), &[]), want);
        // INVERT with two passes: the last pass wrote the inverse.
        let list = overwrite_list(0x82, &[0xAA; 512]);
        good(&t, &a, &sanitize(0x01, list.len() as u16), &list);
        assert_eq!(good(&t, &a, &read16(4000, 1), &[]), vec![0x55; 512]);
        // Three passes end on the pattern itself.
        let list = overwrite_list(0x83, &[0xAA; 512]);
        good(&t, &a, &sanitize(0x01, list.len() as u16), &list);
        assert_eq!(good(&t, &a, &read16(4000, 1), &[]), vec![0xAA; 512]);
    }
}

#[test]
fn sanitize_overwrite_parameter_checks() {
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    let full = overwrite_list(0x01, &[0xAA; 512]);
    // PARAMETER LIST LENGTH 0 to 4, and over a block plus the header.
    for len in 0..5u16 {
        invalid_field(&t, &a, &sanitize(0x01, len), &full[..usize::from(len)]);
    }
    invalid_field(&t, &a, &sanitize(0x01, 517), &[0; 517]);
    // OVERWRITE COUNT 0, TEST set, pattern length 0 or over a block.
    let mut bad = full.clone();
    bad[0] = 0;
    invalid_field(&t, &a, &sanitize(0x01, 516), &bad);
    bad[0] = 0x21;
    invalid_field(&t, &a, &sanitize(0x01, 516), &bad);
    let mut bad = full.clone();
    bad[2..4].copy_from_slice(&[0, 0]);
    invalid_field(&t, &a, &sanitize(0x01, 516), &bad);
    bad[2..4].copy_from_slice(&516u16.to_be_bytes());
    invalid_field(&t, &a, &sanitize(0x01, 516), &bad);
    // Reserved bit and bytes of the CDB.
    let mut c = sanitize(0x41, 516);
    invalid_field(&t, &a, &c, &full);
    for i in 2..7 {
        c = sanitize(0x01, 516);
        c[i] = 1;
        invalid_field(&t, &a, &c, &full);
    }
    // The LU is untouched by all of these.
    assert!(good(&t, &a, &read16(0, 1), &[]).iter().all(|&b| b == 0));
}

#[test]
fn sanitize_block_erase_where_the_store_can() {
    let (t, ram) = ram_target(4 << 20, 512);
    let a = nexus(1);
    good(&t, &a, &write16(0, 256), &vec![b'a'; 256 * 512]);
    good(&t, &a, &write16(8192 - 256, 256), &vec![b'a'; 256 * 512]);
    assert!(ram.allocated_bytes() > 0);
    // Parameter list length must be 0.
    invalid_field(&t, &a, &sanitize(0x02, 8), &[0; 8]);
    good(&t, &a, &sanitize(0x02, 0), &[]);
    assert_eq!(ram.allocated_bytes(), 0, "the chunks are gone");
    assert!(good(&t, &a, &read16(0, 256), &[]).iter().all(|&b| b == 0));
    let d = good(&t, &a, &get_lba_status(0, 1024), &[]);
    assert_eq!(lba_status(&d), vec![(0, 8192, 1)], "all deallocated");
    // WABEREQ 01b: reads after the erase succeed.
    let b1 = good(&t, &a, &[0x12, 0x01, 0xB1, 0, 255, 0], &[]);
    assert_eq!(b1[7] >> 6, 1);
    assert_eq!(support(&t, 0x48, Some(2)), 3);

    // A file: holes punched and synced, nothing left in the file.
    let dir = tempfile::tempdir().unwrap();
    let file = file_store(&dir, 4 << 20);
    let t = target_over(Arc::clone(&file) as Arc<dyn Backstore>);
    good(&t, &a, &write16(0, 256), &vec![b'a'; 256 * 512]);
    good(&t, &a, &sanitize(0x02, 0), &[]);
    assert!(good(&t, &a, &read16(0, 256), &[]).iter().all(|&b| b == 0));
    let on_disk = std::fs::read(dir.path().join("lu.img")).unwrap();
    assert!(on_disk.iter().all(|&b| b == 0));

    // A block device is not thin: no BLOCK ERASE, and B1 says so.
    let blk = dir.path().join("blk.img");
    std::fs::write(&blk, vec![7u8; 1 << 20]).unwrap();
    let t = target_over(Arc::new(BlockBackstore::open(&blk, false, 4).unwrap()));
    invalid_field(&t, &a, &sanitize(0x02, 0), &[]);
    assert_eq!(support(&t, 0x48, Some(2)), 1);
    assert_eq!(support(&t, 0x48, Some(1)), 3);
    let b1 = good(&t, &a, &[0x12, 0x01, 0xB1, 0, 255, 0], &[]);
    assert_eq!(b1[7] >> 6, 0);
    assert_eq!(std::fs::read(&blk).unwrap()[0], 7);
}

#[test]
fn sanitize_refuses_crypto_erase_and_unknown_service_actions() {
    let (t, _) = ram_target(1 << 20, 512);
    let a = nexus(1);
    good(&t, &a, &write16(0, 1), &[9; 512]);
    for sa in (0..0x20u8).filter(|sa| ![1, 2, 0x1F].contains(sa)) {
        invalid_field(&t, &a, &sanitize(sa, 0), &[]);
    }
    assert_eq!(
        support(&t, 0x48, Some(3)),
        1,
        "CRYPTOGRAPHIC ERASE not listed"
    );
    let b1 = good(&t, &a, &[0x12, 0x01, 0xB1, 0, 255, 0], &[]);
    assert_eq!((b1[7] >> 4) & 0x03, 0, "WACEREQ 0");
    assert_eq!(good(&t, &a, &read16(0, 1), &[]), vec![9; 512]);
    // EXIT FAILURE MODE outside the failure state: nothing to do.
    good(&t, &a, &sanitize(0x1F, 0), &[]);
    invalid_field(&t, &a, &sanitize(0x1F, 8), &[0; 8]);
}

/// CRYPTOGRAPHIC ERASE on an encrypted store: listed, WACEREQ 01b, the
/// old data unreadable afterwards (and nowhere in the store in the clear
/// before), new writes readable; on a file store under a key file too.
#[test]
fn sanitize_crypto_erase_on_an_encrypted_store() {
    let ram = Arc::new(RamBackstore::new(4 << 20, 512, 3).unwrap());
    let store =
        EncryptedBackstore::with_memory_key(Arc::clone(&ram) as Arc<dyn Backstore>).unwrap();
    let t = target_over(Arc::new(store));
    let a = nexus(1);
    assert_eq!(support(&t, 0x48, Some(3)), 3, "CRYPTOGRAPHIC ERASE listed");
    let b1 = good(&t, &a, &[0x12, 0x01, 0xB1, 0, 255, 0], &[]);
    assert_eq!((b1[7] >> 4) & 0x03, 1, "WACEREQ 01b");
    let a_blocks = vec![b'a'; 256 * 512];
    good(&t, &a, &write16(0, 256), &a_blocks);
    good(&t, &a, &write16(8192 - 256, 256), &a_blocks);
    let mut raw = vec![0u8; 256 * 512];
    ram.read_at(0, &mut raw).unwrap();
    assert!(
        raw.chunks(512).all(|unit| unit != &a_blocks[..512]),
        "stored encrypted"
    );
    // Parameter list length must be 0.
    invalid_field(&t, &a, &sanitize(0x03, 8), &[0; 8]);
    assert_eq!(
        good(&t, &a, &read16(0, 256), &[]),
        a_blocks,
        "nothing erased yet"
    );
    good(&t, &a, &sanitize(0x03, 0), &[]);
    for lba in [0, 8192 - 256] {
        let after = good(&t, &a, &read16(lba, 256), &[]);
        assert!(
            after.chunks(512).all(|unit| unit != &a_blocks[..512]),
            "LBA {lba} wiped"
        );
    }
    good(&t, &a, &write16(0, 1), &[b'n'; 512]);
    assert_eq!(good(&t, &a, &read16(0, 1), &[]), vec![b'n'; 512]);

    // A file LU under a key file: the erase replaces the key on disk.
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("lu.key");
    let file = file_store(&dir, 4 << 20) as Arc<dyn Backstore>;
    let t = target_over(Arc::new(
        EncryptedBackstore::with_key_file(file, &key).unwrap(),
    ));
    good(&t, &a, &write16(0, 256), &a_blocks);
    let before = std::fs::read(&key).unwrap();
    good(&t, &a, &sanitize(0x83, 0), &[]); // with IMMED
    let deadline = Instant::now() + Duration::from_secs(10);
    while run(&t, &a, &read16(0, 1), &[]).0.status != status::GOOD {
        assert!(Instant::now() < deadline, "the sanitize never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_ne!(std::fs::read(&key).unwrap(), before);
    let after = good(&t, &a, &read16(0, 256), &[]);
    assert!(after.chunks(512).all(|unit| unit != &a_blocks[..512]));
}

#[test]
fn sanitize_conflicts_and_respects_write_protect() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    let list = overwrite_list(0x01, &[0xAA; 512]);
    good(&t, &b, &[0x16, 0, 0, 0, 0, 0], &[]); // RESERVE(6)
    conflict(&t, &a, &sanitize(0x01, 516), &list);
    conflict(&t, &a, &sanitize(0x02, 0), &[]);
    conflict(&t, &a, &sanitize(0x03, 0), &[]);
    good(&t, &b, &[0x17, 0, 0, 0, 0, 0], &[]); // RELEASE(6)
    set_swp(&t, &b, true);
    let _ = run(&t, &a, &[0; 6], &[]); // the MODE PARAMETERS CHANGED
    let wp = (SenseKey::DataProtect, Asc::WRITE_PROTECTED);
    check_asc(&t, &a, &sanitize(0x01, 516), &list, wp.0, wp.1);
    check_asc(&t, &a, &sanitize(0x02, 0), &[], wp.0, wp.1);
}

/// With IMMED the sanitize runs behind the command: meanwhile media
/// commands get NOT READY / SANITIZE IN PROGRESS with a progress
/// indication, REQUEST SENSE reports it with GOOD, INQUIRY still works.
#[test]
fn immediate_sanitize_reports_progress_until_done() {
    let inner = Arc::new(RamBackstore::new(8 << 20, 512, 1).unwrap());
    let slow = SlowBackstore::new(inner, Duration::from_millis(30));
    let t = target_over(Arc::new(slow));
    let a = nexus(1);
    let list = overwrite_list(0x01, &[0x5A; 512]);
    let started = Instant::now();
    good(&t, &a, &sanitize(0x81, 516), &list);
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "returned at once"
    );
    let (o, _) = run(&t, &a, &[0; 6], &[]);
    let s = o.sense.unwrap();
    assert_eq!(
        (s.key, s.asc),
        (SenseKey::NotReady, Asc::SANITIZE_IN_PROGRESS)
    );
    assert!(s.progress.is_some());
    let fixed = o.sense_bytes();
    assert_eq!(fixed[15] & 0x80, 0x80, "SKSV with the progress indication");
    check_asc(
        &t,
        &a,
        &read16(0, 1),
        &[],
        SenseKey::NotReady,
        Asc::SANITIZE_IN_PROGRESS,
    );
    check_asc(
        &t,
        &a,
        &sanitize(0x02, 0),
        &[],
        SenseKey::NotReady,
        Asc::SANITIZE_IN_PROGRESS,
    );
    good(&t, &a, &[0x12, 0, 0, 0, 96, 0], &[]);
    let rs = good(&t, &a, &[0x03, 0, 0, 0, 18, 0], &[]);
    assert_eq!((rs[2], rs[12], rs[13]), (0x02, 0x04, 0x1B));
    let mut last = 0u16;
    loop {
        let (o, _) = run(&t, &a, &[0; 6], &[]);
        match o.sense {
            None => break,
            Some(s) => {
                let p = s.progress.unwrap();
                assert!(p >= last, "progress only grows");
                last = p;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "sanitize never ended"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(good(&t, &a, &read16(16383, 1), &[]), vec![0x5A; 512]);
}

#[test]
fn a_failed_sanitize_leaves_the_failure_state() {
    let t = target_over(Arc::new(Failing(
        RamBackstore::new(1 << 20, 512, 1).unwrap(),
    )));
    let a = nexus(1);
    let failed = (SenseKey::MediumError, Asc::SANITIZE_COMMAND_FAILED);
    // AUSE 0: only another SANITIZE gets out.
    check_asc(&t, &a, &sanitize(0x02, 0), &[], failed.0, failed.1);
    check_asc(&t, &a, &[0; 6], &[], failed.0, failed.1);
    check_asc(&t, &a, &read16(0, 1), &[], failed.0, failed.1);
    good(&t, &a, &[0x12, 0, 0, 0, 96, 0], &[]);
    let rs = good(&t, &a, &[0x03, 0, 0, 0, 18, 0], &[]);
    assert_eq!((rs[2], rs[12], rs[13]), (0x03, 0x31, 0x03));
    invalid_field(&t, &a, &sanitize(0x1F, 0), &[]);
    check_asc(&t, &a, &[0; 6], &[], failed.0, failed.1);
    // AUSE 1: EXIT FAILURE MODE is allowed and gets out.
    check_asc(&t, &a, &sanitize(0x22, 0), &[], failed.0, failed.1);
    good(&t, &a, &sanitize(0x1F, 0), &[]);
    assert_eq!(run(&t, &a, &[0; 6], &[]).0, CommandOutcome::GOOD);
    // Failing from IMMED too: the command said GOOD, the state says more.
    good(&t, &a, &sanitize(0xA2, 0), &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = run(&t, &a, &[0; 6], &[]).0.sense.unwrap();
        if s.asc == Asc::SANITIZE_COMMAND_FAILED {
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    good(&t, &a, &sanitize(0x1F, 0), &[]);
}
