//! SPC-2 RESERVE/RELEASE and persistent reservations across nexuses.

mod common;

use common::*;
use iscsi_scsi::{Asc, Nexus, ScsiTarget, Sense, SenseKey, TargetReset};

const TUR: [u8; 6] = [0; 6];
const RESERVE6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];
const RELEASE6: [u8; 6] = [0x17, 0, 0, 0, 0, 0];
const RESERVE10: [u8; 10] = [0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const RELEASE10: [u8; 10] = [0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const MODE_SENSE6: [u8; 6] = [0x1A, 0, 0x3F, 0, 255, 0];
const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 96, 0];

fn ua(asc: Asc) -> Sense {
    Sense::new(SenseKey::UnitAttention, asc)
}

fn prout(sa: u8, kind: u8, key: u64, sa_key: u64, flags: u8) -> (Vec<u8>, Vec<u8>) {
    let cdb = vec![0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut p = Vec::new();
    p.extend_from_slice(&key.to_be_bytes());
    p.extend_from_slice(&sa_key.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, flags, 0, 0, 0]);
    (cdb, p)
}

fn pr_out(t: &ScsiTarget, n: &Nexus, sa: u8, kind: u8, key: u64, sa_key: u64) {
    let (c, p) = prout(sa, kind, key, sa_key, 0);
    good(t, n, &c, &p);
}

fn pr_out_conflict(t: &ScsiTarget, n: &Nexus, sa: u8, kind: u8, key: u64, sa_key: u64) {
    let (c, p) = prout(sa, kind, key, sa_key, 0);
    conflict(t, n, &c, &p);
}

fn register(t: &ScsiTarget, n: &Nexus, key: u64) {
    pr_out(t, n, 0x06, 0, 0, key);
}

fn prin(t: &ScsiTarget, n: &Nexus, sa: u8) -> Vec<u8> {
    good(t, n, &[0x5E, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[])
}

/// (generation, keys).
fn read_keys(t: &ScsiTarget, n: &Nexus) -> (u32, Vec<u64>) {
    let d = prin(t, n, 0);
    let generation = u32::from_be_bytes(d[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(len + 8, d.len());
    let keys = d[8..]
        .chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect();
    (generation, keys)
}

/// (key, type) of the reservation, if any.
fn read_reservation(t: &ScsiTarget, n: &Nexus) -> Option<(u64, u8)> {
    let d = prin(t, n, 1);
    match u32::from_be_bytes(d[4..8].try_into().unwrap()) {
        0 => {
            assert_eq!(d.len(), 8);
            None
        }
        16 => Some((
            u64::from_be_bytes(d[8..16].try_into().unwrap()),
            d[21] & 0x0F,
        )),
        other => panic!("additional length {other}"),
    }
}

fn can_read(t: &ScsiTarget, n: &Nexus) -> bool {
    let (o, _) = run(t, n, &read16(0, 1), &[]);
    o.is_good()
}

fn can_write(t: &ScsiTarget, n: &Nexus) -> bool {
    let (o, _) = run(t, n, &write16(0, 1), &[0u8; 512]);
    o.is_good()
}

#[test]
fn spc2_reserve_release_across_nexuses() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    good(&t, &a, &RESERVE6, &[]);
    good(&t, &a, &RESERVE6, &[]);
    conflict(&t, &b, &RESERVE6, &[]);
    conflict(&t, &b, &RESERVE10, &[]);
    // RELEASE from a non-holder is a no-op.
    good(&t, &b, &RELEASE6, &[]);
    good(&t, &a, &MODE_SENSE6, &[]);
    conflict(&t, &b, &MODE_SENSE6, &[]);
    conflict(&t, &b, &TUR, &[]);
    assert!(!can_read(&t, &b));
    good(&t, &b, &INQUIRY, &[]);
    good(&t, &b, &[0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0], &[]);
    good(&t, &b, &[0x03, 0, 0, 0, 18, 0], &[]);
    conflict(&t, &b, &prout(0, 0, 0, 1, 0).0, &prout(0, 0, 0, 1, 0).1);
    assert!(can_write(&t, &a));
    good(&t, &a, &RELEASE6, &[]);
    good(&t, &b, &RESERVE10, &[]);
    conflict(&t, &a, &TUR, &[]);
    good(&t, &b, &RELEASE10, &[]);
    good(&t, &a, &TUR, &[]);
    // Third-party and extent reservations are not supported.
    check(
        &t,
        &a,
        &[0x56, 0x10, 0, 0, 0, 0, 0, 0, 0, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    check(
        &t,
        &a,
        &[0x16, 0x01, 0, 0, 0, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
}

#[test]
fn spc2_reservation_released_by_nexus_loss_and_resets() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    good(&t, &b, &TUR, &[]);
    good(&t, &a, &RESERVE6, &[]);
    conflict(&t, &b, &TUR, &[]);
    t.nexus_lost(&a);
    good(&t, &b, &RESERVE6, &[]);
    conflict(&t, &a, &TUR, &[]);
    // LOGICAL UNIT RESET releases it and raises 29h/03h for everyone.
    t.lun_reset(0);
    check(&t, &a, &TUR, &[], ua(Asc::BUS_DEVICE_RESET));
    check(&t, &b, &TUR, &[], ua(Asc::BUS_DEVICE_RESET));
    good(&t, &a, &RESERVE6, &[]);
    t.target_reset(TargetReset::Warm);
    check(&t, &a, &TUR, &[], ua(Asc::POWER_ON_RESET));
    check(&t, &b, &TUR, &[], ua(Asc::POWER_ON_RESET));
    good(&t, &b, &TUR, &[]);
    t.target_reset(TargetReset::Cold);
    // REQUEST SENSE reports and clears it.
    let d = good(&t, &b, &[0x03, 0, 0, 0, 18, 0], &[]);
    assert_eq!((d[2], d[12], d[13]), (0x06, 0x29, 0x01));
    good(&t, &b, &TUR, &[]);
}

#[test]
fn register_reserve_conflict_preempt() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    let (k1, k2) = (0x1111_0000_0000_0001, 0x2222_0000_0000_0002);
    assert_eq!(read_keys(&t, &a), (0, vec![]));
    register(&t, &a, k1);
    register(&t, &b, k2);
    let (generation, keys) = read_keys(&t, &a);
    assert_eq!(generation, 2);
    assert_eq!(keys, vec![k1, k2]);
    // RESERVE needs the registered key.
    pr_out_conflict(&t, &a, 1, 1, k2, 0);
    pr_out(&t, &a, 1, 1, k1, 0);
    assert_eq!(read_reservation(&t, &b), Some((k1, 1)));
    // Reserving again with the same type is fine; another type conflicts.
    pr_out(&t, &a, 1, 1, k1, 0);
    pr_out_conflict(&t, &a, 1, 3, k1, 0);
    pr_out_conflict(&t, &b, 1, 1, k2, 0);
    // Write Exclusive: B reads, cannot write; A can do both.
    assert!(can_read(&t, &b));
    assert!(!can_write(&t, &b));
    assert!(can_write(&t, &a));
    // SPC-2 RESERVE conflicts while registrations exist.
    conflict(&t, &a, &RESERVE6, &[]);
    conflict(&t, &b, &RELEASE6, &[]);
    // B preempts A's reservation and takes it as Exclusive Access.
    pr_out(&t, &b, 4, 3, k2, k1);
    let (gen2, keys) = read_keys(&t, &b);
    assert_eq!(gen2, generation + 1);
    assert_eq!(keys, vec![k2]);
    assert_eq!(read_reservation(&t, &b), Some((k2, 3)));
    // A learns it through a unit attention, once.
    check(&t, &a, &TUR, &[], ua(Asc::REGISTRATIONS_PREEMPTED));
    good(&t, &a, &TUR, &[]);
    // Exclusive Access: A (unregistered) can neither read nor write.
    assert!(!can_read(&t, &a));
    assert!(!can_write(&t, &a));
    conflict(&t, &a, &MODE_SENSE6, &[]);
    good(&t, &a, &INQUIRY, &[]);
    // Preempting a key nobody holds conflicts.
    pr_out_conflict(&t, &b, 4, 3, k2, 0x9999);
    // READ FULL STATUS: one descriptor, B, holder, type 3, port 1, B's TransportID.
    let d = prin(&t, &a, 3);
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), gen2);
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(len + 8, d.len());
    let desc = &d[8..];
    assert_eq!(&desc[0..8], &k2.to_be_bytes());
    assert_eq!(desc[12], 0x01, "R_HOLDER");
    assert_eq!(desc[13], 0x03);
    assert_eq!(&desc[18..20], &[0, 1]);
    let tid_len = u32::from_be_bytes(desc[20..24].try_into().unwrap()) as usize;
    assert_eq!(&desc[24..24 + tid_len], b.transport_id());
    assert_eq!(desc.len(), 24 + tid_len);
    assert_eq!(desc[24], 0x45);
    // Release with the wrong type is an error; with the right one, GOOD.
    let (c, p) = prout(2, 1, k2, 0, 0);
    check(
        &t,
        &b,
        &c,
        &p,
        Sense::new(SenseKey::IllegalRequest, Asc::INVALID_RELEASE_OF_PR),
    );
    pr_out(&t, &b, 2, 3, k2, 0);
    assert_eq!(read_reservation(&t, &a), None);
    assert!(can_write(&t, &a));
}

#[test]
fn access_for_every_type() {
    // (type, registered B reads, registered B writes, unregistered B reads,
    // unregistered B writes), as libiscsi's prout_reserve_access tests.
    let cases = [
        (1u8, true, false, true, false),
        (3, false, false, false, false),
        (5, true, true, true, false),
        (6, true, true, false, false),
        (7, true, true, true, false),
        (8, true, true, false, false),
    ];
    for (kind, reg_r, reg_w, unreg_r, unreg_w) in cases {
        let (t, _) = ram_target(1 << 20, 512);
        let (a, b) = (nexus(1), nexus(2));
        register(&t, &a, 10);
        register(&t, &b, 20);
        pr_out(&t, &a, 1, kind, 10, 0);
        let expect_key = if kind >= 7 { 0 } else { 10 };
        assert_eq!(read_reservation(&t, &a), Some((expect_key, kind)));
        assert!(can_read(&t, &a) && can_write(&t, &a));
        assert_eq!(can_read(&t, &b), reg_r, "type {kind}");
        assert_eq!(can_write(&t, &b), reg_w, "type {kind}");
        pr_out(&t, &b, 0, 0, 20, 0);
        assert_eq!(can_read(&t, &b), unreg_r, "type {kind}");
        assert_eq!(can_write(&t, &b), unreg_w, "type {kind}");
        // Always allowed.
        good(&t, &b, &INQUIRY, &[]);
        good(&t, &b, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
        good(&t, &b, &TUR, &[]);
        pr_out(&t, &a, 2, kind, 10, 0);
        assert!(can_write(&t, &b));
    }
}

#[test]
fn register_rules_and_errors() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    // REGISTER while unregistered with a nonzero key: conflict.
    pr_out_conflict(&t, &a, 0, 0, 5, 6);
    // Unregistering while unregistered: GOOD, no generation change.
    pr_out(&t, &a, 0, 0, 0, 0);
    assert_eq!(read_keys(&t, &a).0, 0);
    pr_out(&t, &a, 0, 0, 0, 5);
    // Re-registering with the wrong key conflicts; the right one changes it.
    pr_out_conflict(&t, &a, 0, 0, 4, 7);
    pr_out(&t, &a, 0, 0, 5, 7);
    assert_eq!(read_keys(&t, &a), (2, vec![7]));
    // REGISTER AND IGNORE EXISTING KEY ignores it.
    pr_out(&t, &a, 6, 0, 0xdead, 8);
    assert_eq!(read_keys(&t, &a), (3, vec![8]));
    // APTPL, SPEC_I_PT and ALL_TG_PT are not supported.
    for flags in [0x01u8, 0x04, 0x08] {
        let (c, p) = prout(6, 0, 0, 9, flags);
        check(&t, &b, &c, &p, Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    }
    // The parameter list is exactly 24 bytes.
    let (mut c, p) = prout(6, 0, 0, 9, 0);
    c[8] = 23;
    check(&t, &b, &c, &p, Sense::PARAMETER_LIST_LENGTH_ERROR);
    // Unknown service action, bad scope, bad type.
    let (c, p) = prout(0x08, 0, 0, 9, 0);
    check(&t, &b, &c, &p, Sense::INVALID_FIELD_IN_CDB);
    let (c, p) = prout(1, 0x11, 8, 0, 0);
    check(&t, &a, &c, &p, Sense::INVALID_FIELD_IN_CDB);
    let (c, p) = prout(1, 0x02, 8, 0, 0);
    check(&t, &a, &c, &p, Sense::INVALID_FIELD_IN_CDB);
    check(
        &t,
        &a,
        &[0x5E, 4, 0, 0, 0, 0, 0, 0x10, 0, 0],
        &[],
        Sense::INVALID_FIELD_IN_CDB,
    );
    // READ KEYS truncated to the allocation length.
    assert_eq!(
        good(&t, &a, &[0x5E, 0, 0, 0, 0, 0, 0, 0, 6, 0], &[]).len(),
        6
    );
}

#[test]
fn report_capabilities() {
    let (t, _) = ram_target(1 << 20, 512);
    let d = prin(&t, &nexus(1), 2);
    assert_eq!(d.len(), 8);
    assert_eq!(&d[0..2], &[0, 8]);
    assert_eq!(d[2] & 0x0D, 0, "SIP_C, ATP_C, PTPL_C");
    assert_eq!(d[3] & 0x01, 0, "PTPL_A");
    assert_eq!(&d[4..6], &[0xEA, 0x01]);
}

#[test]
fn clear_and_unregister_holder() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    register(&t, &a, 1);
    register(&t, &b, 2);
    register(&t, &c, 3);
    // Registrants Only: the holder unregistering releases it, and the other
    // registrants hear RESERVATIONS RELEASED.
    pr_out(&t, &a, 1, 5, 1, 0);
    pr_out(&t, &a, 0, 0, 1, 0);
    check(&t, &b, &TUR, &[], ua(Asc::RESERVATIONS_RELEASED));
    check(&t, &c, &TUR, &[], ua(Asc::RESERVATIONS_RELEASED));
    assert_eq!(read_reservation(&t, &b), None);
    good(&t, &a, &TUR, &[]);
    // All Registrants survives until the last registrant leaves.
    pr_out(&t, &b, 1, 7, 2, 0);
    pr_out(&t, &b, 0, 0, 2, 0);
    assert_eq!(read_reservation(&t, &c), Some((0, 7)));
    // CLEAR: everything goes, the others hear RESERVATIONS PREEMPTED.
    register(&t, &a, 1);
    pr_out_conflict(&t, &c, 3, 0, 99, 0);
    pr_out(&t, &c, 3, 0, 3, 0);
    check(&t, &a, &TUR, &[], ua(Asc::RESERVATIONS_PREEMPTED));
    assert_eq!(read_keys(&t, &a).1, Vec::<u64>::new());
    assert_eq!(read_reservation(&t, &a), None);
    good(&t, &c, &TUR, &[]);
}

#[test]
fn preempt_all_registrants_and_preempt_and_abort() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    register(&t, &a, 1);
    register(&t, &b, 2);
    register(&t, &c, 3);
    pr_out(&t, &a, 1, 8, 1, 0);
    // PREEMPT AND ABORT with key 0 under All Registrants: everyone else goes.
    pr_out(&t, &b, 5, 1, 2, 0);
    assert_eq!(read_keys(&t, &b).1, vec![2]);
    assert_eq!(read_reservation(&t, &b), Some((2, 1)));
    check(&t, &a, &TUR, &[], ua(Asc::REGISTRATIONS_PREEMPTED));
    check(&t, &c, &TUR, &[], ua(Asc::REGISTRATIONS_PREEMPTED));
    // Preempting registrations only (no reservation match): key 0 is invalid.
    let (cdb, p) = prout(4, 1, 2, 0, 0);
    register(&t, &a, 1);
    pr_out(&t, &b, 2, 1, 2, 0);
    check(&t, &b, &cdb, &p, Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    pr_out(&t, &b, 4, 1, 2, 1);
    assert_eq!(read_keys(&t, &b).1, vec![2]);
    assert_eq!(read_reservation(&t, &b), None);
}

#[test]
fn register_and_move() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    register(&t, &a, 1);
    pr_out(&t, &a, 1, 1, 1, 0);
    let tid = b.transport_id();
    let mut p = Vec::new();
    p.extend_from_slice(&1u64.to_be_bytes());
    p.extend_from_slice(&0x55u64.to_be_bytes());
    p.extend_from_slice(&[0, 0x02, 0, 1]); // UNREG, relative target port 1
    p.extend_from_slice(&(tid.len() as u32).to_be_bytes());
    p.extend_from_slice(tid);
    let len = p.len() as u32;
    let mut cdb = vec![0x5F, 7, 1, 0, 0];
    cdb.extend_from_slice(&len.to_be_bytes());
    cdb.push(0);
    good(&t, &a, &cdb, &p);
    assert_eq!(read_reservation(&t, &b), Some((0x55, 1)));
    assert_eq!(read_keys(&t, &b).1, vec![0x55]);
    assert!(can_write(&t, &b));
    assert!(!can_write(&t, &a));
    // A is no longer registered, so moving again conflicts.
    conflict(&t, &a, &cdb, &p);
    // A malformed TransportID is refused.
    let mut bad = p.clone();
    bad[24] = 0x01;
    let mut cdb_b = cdb.clone();
    cdb_b[2] = 1;
    register(&t, &a, 1);
    pr_out(&t, &b, 2, 1, 0x55, 0);
    pr_out(&t, &a, 1, 1, 1, 0);
    check(&t, &a, &cdb_b, &bad, Sense::INVALID_FIELD_IN_PARAMETER_LIST);
}

#[test]
fn reservations_survive_lun_reset_and_nexus_loss() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    register(&t, &a, 1);
    pr_out(&t, &a, 1, 3, 1, 0);
    t.nexus_lost(&a);
    assert_eq!(read_reservation(&t, &a), Some((1, 3)));
    t.lun_reset(0);
    check(&t, &a, &TUR, &[], ua(Asc::BUS_DEVICE_RESET));
    assert!(!can_read(&t, &b));
    assert!(can_read(&t, &a));
}

#[test]
fn preempt_and_abort_reports_the_preempted_nexuses() {
    use std::sync::{Arc, Mutex};
    let (t, _) = ram_target(1 << 20, 512);
    type Seen = Vec<(u16, Vec<String>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let s = Arc::clone(&seen);
    t.set_abort_handler(move |lun, nexuses| {
        let ports = nexuses
            .iter()
            .map(|k| k.initiator_port().to_string())
            .collect();
        s.lock().unwrap().push((lun, ports));
    });
    let (a, b) = (nexus(1), nexus(2));
    register(&t, &a, 1);
    register(&t, &b, 2);
    pr_out(&t, &a, 1, 1, 1, 0);
    // Plain PREEMPT aborts nothing.
    pr_out(&t, &b, 4, 1, 2, 1);
    assert!(seen.lock().unwrap().is_empty());
    check(&t, &a, &TUR, &[], ua(Asc::REGISTRATIONS_PREEMPTED));
    register(&t, &a, 1);
    pr_out(&t, &b, 5, 3, 2, 1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(0, vec![a.initiator_port().to_string()])]
    );
    // B already held the reservation; preempting another key leaves it be.
    assert_eq!(read_reservation(&t, &b), Some((2, 1)));
}

#[test]
fn power_on_unit_attention_per_new_nexus() {
    let (t, _) = ram_target(1 << 20, 512);
    let (a, b) = (nexus(1), nexus(2));
    good(&t, &a, &TUR, &[]);
    t.set_power_on_unit_attention(true);
    // A was already known; B is new and sees it once, after INQUIRY.
    good(&t, &a, &TUR, &[]);
    good(&t, &b, &INQUIRY, &[]);
    check(&t, &b, &TUR, &[], ua(Asc::POWER_ON_RESET));
    good(&t, &b, &TUR, &[]);
    // After the nexus is lost and comes back, again.
    t.nexus_lost(&b);
    check(&t, &b, &TUR, &[], ua(Asc::POWER_ON_RESET));
    good(&t, &b, &TUR, &[]);
}
