//! EXTENDED COPY and RECEIVE COPY RESULTS through [`ScsiTarget::execute`]:
//! good copies, and each refusal.

use super::parse::HEADER_LEN;
use super::*;
use crate::nexus::Nexus;
use crate::outcome::{CommandOutcome, status};
use crate::spc::TargetIdentity;
use crate::test_store::TestStore;

fn nexus(isid: u64) -> Nexus {
    Nexus::iscsi("iqn.2024-01.test:init", isid, 1)
}

/// A unique id per store made here, as the target gives each LU its own.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x1000);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn ram(mib: u64) -> Arc<dyn Backstore> {
    Arc::new(TestStore::new(mib << 20, 512, next_id()))
}

fn naa(store: &Arc<dyn Backstore>) -> [u8; 16] {
    crate::spc::naa_designator(crate::spc::NAA_COMPANY_ID, store.unique_id())
}

/// A parameter list (list identifier 7): identification CSCDs for `ids`,
/// then b2b segments (src index, dst index, blocks, src LBA, dst LBA).
fn list(ids: &[[u8; 16]], segs: &[(u16, u16, u16, u64, u64)]) -> Vec<u8> {
    super::parse::encode_list(7, ids, segs)
}

fn xcopy_cdb(len: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = cdb::opcode::EXTENDED_COPY;
    c[10..14].copy_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
    c
}

fn xcopy(t: &ScsiTarget, n: &Nexus, lun: u16, data: &[u8]) -> CommandOutcome {
    let mut din = Vec::new();
    t.execute(
        n,
        crate::lun::encode_lun(lun),
        &xcopy_cdb(data.len()),
        data,
        &mut din,
    )
}

fn rcr(t: &ScsiTarget, n: &Nexus, sa: u8, list_id: u8) -> (CommandOutcome, Vec<u8>) {
    let mut c = [0u8; 16];
    c[0] = cdb::opcode::RECEIVE_COPY_RESULTS;
    c[1] = sa;
    c[2] = list_id;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    let mut din = Vec::new();
    let o = t.execute(n, crate::lun::encode_lun(0), &c, &[], &mut din);
    (o, din)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sense_of(o: CommandOutcome) -> (SenseKey, Asc) {
    let s = o.sense.expect("sense");
    (s.key, s.asc)
}

fn two_luns() -> (ScsiTarget, Arc<dyn Backstore>, Arc<dyn Backstore>) {
    let (a, b) = (ram(4), ram(4));
    let t = ScsiTarget::new(
        TargetIdentity::new("iqn.2024-01.test:tgt"),
        vec![Arc::clone(&a), Arc::clone(&b)],
    );
    (t, a, b)
}

#[test]
fn copies_between_two_luns_and_reports_the_status() {
    let (t, a, b) = two_luns();
    let data = pattern(64 * 512, 3);
    a.write_at(10 * 512, &data).unwrap();
    let n = nexus(1);
    let p = list(&[naa(&a), naa(&b)], &[(0, 1, 64, 10, 200)]);
    assert_eq!(xcopy(&t, &n, 0, &p), CommandOutcome::GOOD);
    let mut back = vec![0u8; data.len()];
    b.read_at(200 * 512, &mut back).unwrap();
    assert_eq!(back, data);
    let (o, din) = rcr(&t, &n, SA_COPY_STATUS, 7);
    assert!(o.is_good());
    assert_eq!(din, [0, 0, 0, 8, 1, 0, 1, 0, 0, 0, 0x80, 0]);
    // Another nexus sees no status for that list.
    let (o, _) = rcr(&t, &nexus(2), SA_COPY_STATUS, 7);
    assert_eq!(sense_of(o).1, Asc::INVALID_FIELD_IN_CDB);
    // A lost nexus's statuses go with it.
    t.nexus_lost(&n);
    let (o, _) = rcr(&t, &n, SA_COPY_STATUS, 7);
    assert_eq!(sense_of(o).1, Asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn copies_larger_than_a_piece_and_overlapping_within_one_lu() {
    let a = ram(16);
    let t = ScsiTarget::new(TargetIdentity::new("t"), vec![Arc::clone(&a)]);
    // 9 MiB: three pieces; destination overlaps the source from above.
    let blocks = 9 * 2048u16;
    let data = pattern(usize::from(blocks) * 512, 9);
    a.write_at(0, &data).unwrap();
    let p = list(&[naa(&a)], &[(0, 0, blocks, 0, 1000)]);
    assert_eq!(xcopy(&t, &nexus(1), 0, &p), CommandOutcome::GOOD);
    let mut back = vec![0u8; data.len()];
    a.read_at(1000 * 512, &mut back).unwrap();
    assert!(back == data, "overlapping copy upwards");
    // And downwards.
    let p = list(&[naa(&a)], &[(0, 0, blocks, 1000, 10)]);
    assert_eq!(xcopy(&t, &nexus(1), 0, &p), CommandOutcome::GOOD);
    a.read_at(10 * 512, &mut back).unwrap();
    assert!(back == data, "overlapping copy downwards");
}

#[test]
fn a_designator_of_another_target_is_unreachable() {
    let (t, a, _b) = two_luns();
    let (other, c, _) = two_luns();
    let p = list(&[naa(&a), naa(&c)], &[(1, 0, 8, 0, 0)]);
    let o = xcopy(&t, &nexus(1), 0, &p);
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert_eq!(
        sense_of(o),
        (SenseKey::CopyAborted, Asc::COPY_TARGET_DEVICE_NOT_REACHABLE)
    );
    // Nor the other way round, nor in its own target with ours named.
    let o = xcopy(&other, &nexus(1), 0, &p);
    assert_eq!(sense_of(o).0, SenseKey::CopyAborted);
    // An unknown designator, and one that is not NAA, are refused alike.
    let o = xcopy(&t, &nexus(1), 0, &list(&[[0x60; 16]], &[(0, 0, 1, 0, 1)]));
    assert_eq!(sense_of(o).1, Asc::COPY_TARGET_DEVICE_NOT_REACHABLE);
}

#[test]
fn a_removed_lun_is_unreachable() {
    let (t, a, b) = two_luns();
    let n = nexus(1);
    let p = list(&[naa(&a), naa(&b)], &[(0, 1, 8, 0, 0)]);
    assert!(xcopy(&t, &n, 0, &p).is_good());
    t.remove_lun(1).unwrap();
    let _ = xcopy(&t, &n, 0, &p); // REPORTED LUNS DATA HAS CHANGED
    let o = xcopy(&t, &n, 0, &p);
    assert_eq!(sense_of(o).1, Asc::COPY_TARGET_DEVICE_NOT_REACHABLE);
    // The same store put back under the number is reachable again (it is
    // the same LU as far as its designator goes).
    t.add_lun(1, b).unwrap();
    let _ = xcopy(&t, &n, 0, &p); // REPORTED LUNS DATA HAS CHANGED
    assert!(xcopy(&t, &n, 0, &p).is_good());
}

#[test]
fn a_lun_removed_mid_copy_ends_the_copy() {
    let (t, a, b) = two_luns();
    let resolved = |n: u16| Resolved {
        number: n,
        lu: Arc::clone(t.luns.load()[usize::from(n)].as_ref().unwrap()),
    };
    let step = Step {
        src: resolved(0),
        dst: resolved(1),
        src_offset: 0,
        dst_offset: 0,
        len: 2 * COPY_PIECE as u64,
    };
    let mut copied = 0;
    t.remove_lun(1).unwrap();
    assert_eq!(t.run_segment(&step, &mut copied), Err(UNREACHABLE));
    assert_eq!(copied, 0);
    // Replaced by another LU under the same number: still not the one the
    // copy resolved.
    t.add_lun(1, ram(4)).unwrap();
    assert_eq!(t.run_segment(&step, &mut copied), Err(UNREACHABLE));
    drop((a, b));
}

#[test]
fn reservations_of_another_nexus_conflict() {
    let (t, a, b) = two_luns();
    let (me, other) = (nexus(1), nexus(2));
    let mut din = Vec::new();
    // The other nexus reserves LU 1 (RESERVE(6)).
    let o = t.execute(
        &other,
        crate::lun::encode_lun(1),
        &[0x16, 0, 0, 0, 0, 0],
        &[],
        &mut din,
    );
    assert!(o.is_good());
    let into_1 = list(&[naa(&a), naa(&b)], &[(0, 1, 8, 0, 0)]);
    let from_1 = list(&[naa(&a), naa(&b)], &[(1, 0, 8, 0, 0)]);
    for p in [&into_1, &from_1] {
        let o = xcopy(&t, &me, 0, p);
        assert_eq!(o.status, status::RESERVATION_CONFLICT);
    }
    // The holder itself may copy.
    assert!(xcopy(&t, &other, 0, &into_1).is_good());
}

#[test]
fn write_protected_destination_is_data_protect() {
    let (t, a, b) = two_luns();
    t.luns.load()[1].as_ref().unwrap().state().mode.swp = true;
    let p = list(&[naa(&a), naa(&b)], &[(0, 1, 8, 0, 0)]);
    let o = xcopy(&t, &nexus(1), 0, &p);
    assert_eq!(sense_of(o), (SenseKey::DataProtect, Asc::WRITE_PROTECTED));
    // Reading from it is fine.
    let p = list(&[naa(&a), naa(&b)], &[(1, 0, 8, 0, 0)]);
    assert!(xcopy(&t, &nexus(1), 0, &p).is_good());
}

#[test]
fn a_sanitize_failed_on_either_lu_refuses_the_copy() {
    let (t, a, b) = two_luns();
    a.write_at(0, &[0xAA; 4096]).unwrap();
    let n = nexus(1);
    let p = list(&[naa(&a), naa(&b)], &[(0, 1, 8, 0, 0)]);
    // Addressed to LUN 0, writing to LUN 1 whose sanitize failed.
    t.luns.load()[1].as_ref().unwrap().state().sanitize =
        crate::sanitize::SanitizeState::Failed { ause: false };
    assert_eq!(
        sense_of(xcopy(&t, &n, 0, &p)),
        (SenseKey::MediumError, Asc::SANITIZE_COMMAND_FAILED)
    );
    let mut copied = [0u8; 4096];
    b.read_at(0, &mut copied).unwrap();
    assert_eq!(copied, [0; 4096], "nothing reached the sanitized LU");
    // Reading from it is refused as well.
    let back = list(&[naa(&a), naa(&b)], &[(1, 0, 8, 0, 0)]);
    assert_eq!(sense_of(xcopy(&t, &n, 0, &back)).0, SenseKey::MediumError);
    // Once it is idle again, the copy goes through.
    t.luns.load()[1].as_ref().unwrap().state().sanitize = crate::sanitize::SanitizeState::Idle;
    assert!(xcopy(&t, &n, 0, &p).is_good());
}

#[test]
fn ranges_and_lengths_are_checked_before_anything_moves() {
    let (t, a, b) = two_luns();
    let blocks = b.block_count();
    let n = nexus(1);
    a.write_at(0, &[0xAA; 512]).unwrap();
    // Second segment past the end: the first must not have run.
    let p = list(
        &[naa(&a), naa(&b)],
        &[(0, 1, 1, 0, 0), (0, 1, 8, 0, blocks - 1)],
    );
    let o = xcopy(&t, &n, 0, &p);
    assert_eq!(
        sense_of(o),
        (SenseKey::CopyAborted, Asc::COPY_TARGET_DEVICE_NOT_REACHABLE)
    );
    let mut first = [0u8; 512];
    b.read_at(0, &mut first).unwrap();
    assert_eq!(first, [0; 512]);
    // An LBA that overflows.
    let p = list(&[naa(&a), naa(&b)], &[(0, 1, 8, u64::MAX - 2, 0)]);
    assert_eq!(sense_of(xcopy(&t, &n, 0, &p)).0, SenseKey::CopyAborted);
    // A block length that is not the LU's.
    let mut p = list(&[naa(&a), naa(&b)], &[(0, 1, 8, 0, 0)]);
    p[HEADER_LEN + 30] = 0x10; // 4096
    let o = xcopy(&t, &n, 0, &p);
    assert_eq!(sense_of(o).1, Asc::INVALID_FIELD_IN_PARAMETER_LIST);
}

#[test]
fn malformed_lists_and_cdbs() {
    let (t, a, b) = two_luns();
    let n = nexus(1);
    // Empty parameter list: nothing to do.
    assert!(xcopy(&t, &n, 0, &[]).is_good());
    // Less data than the CDB says.
    let p = list(&[naa(&a), naa(&b)], &[(0, 1, 8, 0, 0)]);
    let mut din = Vec::new();
    let o = t.execute(&n, 0, &xcopy_cdb(p.len() + 1), &p, &mut din);
    assert_eq!(sense_of(o).1, Asc::PARAMETER_LIST_LENGTH_ERROR);
    // LID4 (service action 1) is not implemented.
    let mut c = xcopy_cdb(p.len());
    c[1] = 0x01;
    let o = t.execute(&n, 0, &c, &p, &mut din);
    assert_eq!(sense_of(o).1, Asc::INVALID_FIELD_IN_CDB);
    // A parser refusal comes through as is.
    let o = xcopy(&t, &n, 0, &p[..HEADER_LEN + 3]);
    assert_eq!(sense_of(o).1, Asc::PARAMETER_LIST_LENGTH_ERROR);
}

#[test]
fn operating_parameters_and_unknown_service_actions() {
    let (t, _a, _b) = two_luns();
    let (o, din) = rcr(&t, &nexus(1), SA_OPERATING_PARAMETERS, 0);
    assert!(o.is_good());
    assert_eq!(din.len(), 46);
    assert_eq!(u32::from_be_bytes(din[0..4].try_into().unwrap()), 42);
    assert_eq!(u16::from_be_bytes([din[8], din[9]]), MAX_CSCD_DESCRIPTORS);
    assert_eq!(
        u16::from_be_bytes([din[10], din[11]]),
        MAX_SEGMENT_DESCRIPTORS
    );
    assert_eq!(din[37], 9);
    assert_eq!(&din[43..], &[2, 0x02, 0xE4]);
    let (o, _) = rcr(&t, &nexus(1), 0x01, 0);
    assert_eq!(sense_of(o).1, Asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn inquiry_sets_3pc_and_the_opcodes_are_reported() {
    let (t, _a, _b) = two_luns();
    let mut din = Vec::new();
    assert!(
        t.execute(&nexus(1), 0, &[0x12, 0, 0, 0, 96, 0], &[], &mut din)
            .is_good()
    );
    assert_eq!(din[5] & 0x08, 0x08);
    for (op, sa) in [(0x83u8, 0u16), (0x84, 0), (0x84, 3)] {
        let c = [
            0xA3,
            0x0C,
            0x02,
            op,
            (sa >> 8) as u8,
            sa as u8,
            0,
            0,
            1,
            0,
            0,
            0,
        ];
        assert!(t.execute(&nexus(1), 0, &c, &[], &mut din).is_good());
        assert_eq!(din[1] & 0x07, 0x03, "{op:#x}/{sa}");
    }
}

#[test]
fn the_fuzz_seeds_copy() {
    // The seeds name the LUs of unique ids 1 and 2, as the fuzz target
    // makes them: both must run whole, so the fuzzer starts from copies
    // that reach the data path.
    let luns: Vec<Arc<dyn Backstore>> = (1..=2)
        .map(|id| Arc::new(TestStore::new(1 << 20, 512, id)) as Arc<dyn Backstore>)
        .collect();
    let t = ScsiTarget::new(TargetIdentity::new("t"), luns);
    for seed in [
        &include_bytes!("../../../../fuzz/seeds/xcopy_parameters/lun0-to-lun1")[..],
        &include_bytes!("../../../../fuzz/seeds/xcopy_parameters/two-segments-within-lun1")[..],
    ] {
        assert_eq!(xcopy(&t, &nexus(1), 0, seed), CommandOutcome::GOOD);
    }
}

#[test]
fn a_list_identifier_in_use_is_operation_in_progress() {
    let (t, a, b) = two_luns();
    let n = nexus(1);
    let running = t.start_list(n.key(), 0, 7).unwrap();
    let p = list(&[naa(&a), naa(&b)], &[(0, 1, 8, 0, 0)]);
    let o = xcopy(&t, &n, 0, &p);
    assert_eq!(
        sense_of(o),
        (SenseKey::IllegalRequest, Asc::OPERATION_IN_PROGRESS)
    );
    // Another nexus, or no list identifier (usage 11b), is not in the way.
    assert!(xcopy(&t, &nexus(2), 0, &p).is_good());
    let mut none = p.clone();
    none[0] = 0;
    none[1] = 0x18;
    assert!(xcopy(&t, &n, 0, &none).is_good());
    drop(running);
    assert!(xcopy(&t, &n, 0, &p).is_good());
}
