//! EXTENDED COPY over the real stores, where each takes its own path:
//! `copy_file_range` between file stores, lent chunks from RAM, a buffer
//! between the two. (The copy manager's rules and refusals are the unit
//! tests of `src/xcopy/tests.rs`, over the crate's test store.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use iscsi_scsi::cdb::opcode::EXTENDED_COPY;
use iscsi_scsi::spc::{NAA_COMPANY_ID, naa_designator};
use iscsi_scsi::xcopy::parse::encode_list;
use iscsi_scsi::{Backstore, CommandOutcome, Nexus, ScsiTarget, TargetIdentity, encode_lun};
use iscsi_stores::{FileBackstore, RamBackstore};

/// A unique id per store made here, as the target gives each LU its own.
fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x1000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn naa(store: &Arc<dyn Backstore>) -> [u8; 16] {
    naa_designator(NAA_COMPANY_ID, store.unique_id())
}

fn xcopy(
    t: &ScsiTarget,
    lun: u16,
    ids: &[[u8; 16]],
    segs: &[(u16, u16, u16, u64, u64)],
) -> CommandOutcome {
    let data = encode_list(7, ids, segs);
    let mut cdb = [0u8; 16];
    cdb[0] = EXTENDED_COPY;
    cdb[10..14].copy_from_slice(&u32::try_from(data.len()).unwrap().to_be_bytes());
    let n = Nexus::iscsi("iqn.2024-01.test:init", 1, 1);
    t.execute(&n, encode_lun(lun), &cdb, &data, &mut Vec::new())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn ram(mib: u64) -> Arc<dyn Backstore> {
    Arc::new(RamBackstore::new(mib << 20, 512, next_id()).unwrap())
}

#[test]
fn copies_between_file_luns_and_through_memory_to_ram() {
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| -> Arc<dyn Backstore> {
        Arc::new(FileBackstore::open(dir.path().join(name), Some(8 << 20), 512, next_id()).unwrap())
    };
    let (a, b) = (open("a"), open("b"));
    let data = pattern(6 << 20, 5);
    a.write_at(512, &data).unwrap();
    let t = ScsiTarget::new(
        TargetIdentity::new("t"),
        vec![Arc::clone(&a), Arc::clone(&b)],
    );
    let blocks = u16::try_from(data.len() / 512).unwrap();
    let ids = [naa(&a), naa(&b)];
    assert_eq!(
        xcopy(&t, 1, &ids, &[(0, 1, blocks, 1, 3)]),
        CommandOutcome::GOOD
    );
    let mut back = vec![0u8; data.len()];
    b.read_at(3 * 512, &mut back).unwrap();
    assert!(back == data);
    // File to RAM goes through a buffer.
    let r = ram(8);
    t.add_lun(2, Arc::clone(&r)).unwrap();
    let ids = [naa(&b), naa(&r)];
    // The first command after the LUN was added reports the change.
    let _ = xcopy(&t, 0, &ids, &[(0, 1, blocks, 3, 0)]);
    assert_eq!(
        xcopy(&t, 0, &ids, &[(0, 1, blocks, 3, 0)]),
        CommandOutcome::GOOD
    );
    r.read_at(0, &mut back).unwrap();
    assert!(back == data);
}

/// RAM lends its chunks to the copy: 9 MiB is three pieces of the copy,
/// each a run of lent chunks, overlapping upwards and downwards.
#[test]
fn copies_lent_ram_chunks_larger_than_a_piece_and_overlapping() {
    let a = ram(16);
    let t = ScsiTarget::new(TargetIdentity::new("t"), vec![Arc::clone(&a)]);
    let blocks = 9 * 2048u16;
    let data = pattern(usize::from(blocks) * 512, 9);
    a.write_at(0, &data).unwrap();
    assert!(a.lend(0, 4096).is_some(), "RAM lends");
    let ids = [naa(&a)];
    assert_eq!(
        xcopy(&t, 0, &ids, &[(0, 0, blocks, 0, 1000)]),
        CommandOutcome::GOOD
    );
    let mut back = vec![0u8; data.len()];
    a.read_at(1000 * 512, &mut back).unwrap();
    assert!(back == data, "overlapping copy upwards");
    assert_eq!(
        xcopy(&t, 0, &ids, &[(0, 0, blocks, 1000, 10)]),
        CommandOutcome::GOOD
    );
    a.read_at(10 * 512, &mut back).unwrap();
    assert!(back == data, "overlapping copy downwards");
}
