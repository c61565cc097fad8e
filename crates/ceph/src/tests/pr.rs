//! The shared reservation store against a running cluster: each unsafe
//! path of `ffi::rados` (object read, compare-and-set, stat, remove, watch
//! with its callbacks and unwatch, notify and its reply, ack, instance id,
//! addresses, blocklist, wait for the OSD map), then the protocol of
//! `crate::pr_shared` through two targets over one image, as two gateways
//! would have it: the state seen through both, a lost compare-and-set
//! applied again, a damaged record refused, APTPL across restarts, and
//! the SPC-2 reservation, mode parameters and resets seen by both.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::*;
use iscsi_scsi::backstore::PrEvent;
use iscsi_scsi::pr_record::PrRecord;
use iscsi_scsi::{CommandOutcome, Nexus, ScsiTarget, TargetIdentity, encode_lun, status};

fn store(image: &TestImage) -> RbdBackstore {
    RbdBackstore::open(&image.spec(), 512).unwrap()
}

#[test]
fn objects_compare_and_set_stat_and_remove() {
    let image = TestImage::new("pr-obj", "8M");
    let s = store(&image);
    let oid = format!("{}.test", s.shared.pr.oid());
    let img = &s.shared.image();
    img.object_remove(&oid).unwrap();
    assert_eq!(img.object_read(&oid, 64).unwrap(), None);
    assert_eq!(img.object_stat(&oid).unwrap(), None);
    // A watch needs the object: refused, and its callback argument freed.
    assert_eq!(
        img.watch(&oid).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    // Create only if absent.
    assert!(img.object_cas(&oid, "epoch", None, b"1", b"first").unwrap());
    assert!(!img.object_cas(&oid, "epoch", None, b"1", b"again").unwrap());
    // Replace only from the expected epoch.
    assert!(
        !img.object_cas(&oid, "epoch", Some(b"7"), b"8", b"wrong")
            .unwrap()
    );
    assert!(
        img.object_cas(&oid, "epoch", Some(b"1"), b"2", b"second!")
            .unwrap()
    );
    assert!(
        !img.object_cas(&oid, "epoch", Some(b"1"), b"2", b"stale")
            .unwrap()
    );
    assert_eq!(img.object_read(&oid, 64).unwrap().unwrap(), b"second!");
    assert_eq!(img.object_stat(&oid).unwrap().unwrap().0, 7);
    // Longer than the caller allows: refused, not cut.
    assert!(img.object_read(&oid, 3).is_err());
    img.object_remove(&oid).unwrap();
    assert_eq!(img.object_read(&oid, 64).unwrap(), None);
}

#[test]
fn a_notify_reaches_a_second_client_which_handles_it_before_acking() {
    let image = TestImage::new("pr-notify", "8M");
    let (a, b) = (store(&image), store(&image));
    assert!(a.shared.pr.write_if(None, 1, b"x").unwrap());
    let handled = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&handled);
    b.shared
        .pr
        .watch(Arc::new(move |event| {
            assert_eq!(event, PrEvent::Changed);
            // Slow on purpose: the notifier must still see this done.
            std::thread::sleep(Duration::from_millis(200));
            seen.fetch_add(1, Ordering::SeqCst);
            true
        }))
        .unwrap();
    let (a_gid, a_addr) = a.shared.pr.me();
    let (b_gid, _) = b.shared.pr.me();
    assert_ne!(a_gid, b_gid);
    assert!(a_addr.contains('/'), "{a_addr}");
    let acked = a.shared.pr.notify().unwrap();
    assert_eq!(acked, vec![b_gid]);
    assert_eq!(handled.load(Ordering::SeqCst), 1);
    // Dropping the watcher unwatches: nobody is left to ack.
    drop(b);
    assert!(a.shared.pr.notify().unwrap().is_empty());
}

/// A fenced client fails its writes and hears its watch break; the store
/// then connects a new client, rejoins through it (its handler told so,
/// before any I/O goes through it) and serves again, with a new address
/// and a watch that hears notifies.
#[test]
fn a_fenced_client_fails_its_writes_and_the_store_rejoins_with_a_new_one() {
    let image = TestImage::new("pr-fence", "8M");
    let (a, b) = (store(&image), store(&image));
    assert!(a.shared.pr.write_if(None, 1, b"x").unwrap());
    let broke = Arc::new(AtomicUsize::new(0));
    let rejoined = Arc::new(AtomicUsize::new(0));
    let changed = Arc::new(AtomicUsize::new(0));
    let (seen_broke, seen_rejoined, seen_changed) = (
        Arc::clone(&broke),
        Arc::clone(&rejoined),
        Arc::clone(&changed),
    );
    b.shared
        .pr
        .watch(Arc::new(move |event| {
            match event {
                PrEvent::Broken => &seen_broke,
                PrEvent::Rejoined => &seen_rejoined,
                PrEvent::Changed => &seen_changed,
            }
            .fetch_add(1, Ordering::SeqCst);
            true
        }))
        .unwrap();
    b.write_at(0, &[1u8; 512]).unwrap();
    let (b_gid, b_addr) = b.shared.pr.me();
    a.shared.pr.fence(std::slice::from_ref(&b_addr)).unwrap();
    // The record's client is the LU's: reaching the record tells it too.
    let err = b.shared.pr.read().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(108), "{err}");
    assert!(b.shared.fence.tripped());
    // Refused while it rejoins: "again soon" (EAGAIN, BUSY to the host).
    let err = b.write_at(0, &[2u8; 512]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(11), "{err}");
    // Planned on the fenced client: refused by the fence even after the
    // new client serves.
    let stale = b.async_io().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.write_at(0, &[3u8; 512]).is_err() {
        assert!(Instant::now() < deadline, "the store never rejoined");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(broke.load(Ordering::SeqCst), 1);
    assert_eq!(rejoined.load(Ordering::SeqCst), 1);
    let (new_gid, new_addr) = b.shared.pr.me();
    assert!(
        new_gid != b_gid && new_addr != b_addr,
        "{new_addr} {b_addr}"
    );
    let mut back = [0u8; 512];
    a.read_at(0, &mut back).unwrap();
    assert_eq!(back, [3u8; 512]);
    // The new client watches: a notify reaches it and it acknowledges.
    let before = changed.load(Ordering::SeqCst);
    assert_eq!(a.shared.pr.notify().unwrap(), vec![new_gid]);
    assert_eq!(changed.load(Ordering::SeqCst), before + 1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let data: Box<dyn iscsi_scsi::backstore::WriteData> = Box::new(vec![4u8; 512]);
    let err = rt.block_on(stale.write(0, data, 512, false)).unwrap_err();
    // Sent again, it would be checked again and go through the new client.
    assert_eq!(err.raw_os_error(), Some(11), "{err}");
    a.read_at(0, &mut back).unwrap();
    assert_eq!(
        back, [3u8; 512],
        "a write planned on the fenced client landed"
    );
}

fn target(image: &TestImage) -> ScsiTarget {
    let s: Arc<dyn Backstore> = Arc::new(store(image));
    ScsiTarget::new(TargetIdentity::new("iqn.2026-11.rs.iscsi:pr"), vec![s])
}

fn run(t: &ScsiTarget, n: &Nexus, cdb: &[u8], out: &[u8]) -> (CommandOutcome, Vec<u8>) {
    let mut d = Vec::new();
    let o = t.execute(n, encode_lun(0), cdb, out, &mut d);
    (o, d)
}

fn prout(
    t: &ScsiTarget,
    n: &Nexus,
    sa: u8,
    kind: u8,
    key: u64,
    sa_key: u64,
    flags: u8,
) -> CommandOutcome {
    let cdb = [0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut p = Vec::new();
    p.extend_from_slice(&key.to_be_bytes());
    p.extend_from_slice(&sa_key.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, flags, 0, 0, 0]);
    run(t, n, &cdb, &p).0
}

fn prin(t: &ScsiTarget, n: &Nexus, sa: u8) -> Vec<u8> {
    let (o, d) = run(t, n, &[0x5E, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    assert_eq!(o, CommandOutcome::GOOD);
    d
}

/// (generation, keys).
fn keys(t: &ScsiTarget, n: &Nexus) -> (u32, Vec<u64>) {
    let d = prin(t, n, 0);
    let generation = u32::from_be_bytes(d[0..4].try_into().unwrap());
    let keys = d[8..]
        .chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect();
    (generation, keys)
}

fn write10(t: &ScsiTarget, n: &Nexus) -> CommandOutcome {
    run(t, n, &[0x2A, 0, 0, 0, 0, 1, 0, 0, 1, 0], &[0x5A; 512]).0
}

#[test]
fn two_gateways_share_one_state() {
    let image = TestImage::new("pr-share", "8M");
    let (g1, g2) = (target(&image), target(&image));
    let a = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    let b = Nexus::iscsi("iqn.2026-11.rs.iscsi:b", 1, 2);
    let b_via_1 = Nexus::iscsi("iqn.2026-11.rs.iscsi:b", 1, 1);
    // REPORT CAPABILITIES: PTPL_C on a shared state.
    assert_eq!(prin(&g1, &a, 2)[2] & 1, 1);
    assert_eq!(prout(&g1, &a, 0x06, 0, 0, 0xA1, 0), CommandOutcome::GOOD);
    assert_eq!(keys(&g2, &b), (1, vec![0xA1]));
    assert_eq!(prout(&g1, &a, 0x01, 5, 0xA1, 0, 0), CommandOutcome::GOOD);
    assert_eq!(write10(&g2, &b).status, status::RESERVATION_CONFLICT);
    assert_eq!(write10(&g1, &b_via_1).status, status::RESERVATION_CONFLICT);
    assert_eq!(write10(&g1, &a), CommandOutcome::GOOD);
    for sa in 0..4 {
        assert_eq!(prin(&g1, &a, sa), prin(&g2, &b, sa), "service action {sa}");
    }
    // B registers through gateway 2 and preempts A: A's writes through
    // gateway 1 conflict as soon as the command completed.
    assert_eq!(prout(&g2, &b, 0x06, 0, 0, 0xB2, 0), CommandOutcome::GOOD);
    assert_eq!(prout(&g2, &b, 0x05, 5, 0xB2, 0xA1, 0), CommandOutcome::GOOD);
    // Gateway 1 tells A why, once (a change made elsewhere).
    let (o, _) = run(&g1, &a, &[0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(
        o.sense,
        Some(iscsi_scsi::Sense::unit_attention(
            iscsi_scsi::Asc::REGISTRATIONS_PREEMPTED
        ))
    );
    assert_eq!(keys(&g1, &a), (3, vec![0xB2]));
    assert_eq!(write10(&g1, &a).status, status::RESERVATION_CONFLICT);
    assert_eq!(write10(&g2, &b), CommandOutcome::GOOD);
}

/// Reads the record, lets `change` alter it and writes it back as the next
/// epoch without telling anybody (a gateway whose notify is still on the
/// way); the new epoch.
fn change_behind(s: &RbdBackstore, change: impl FnOnce(&mut PrRecord) -> Vec<u8>) -> u64 {
    let bytes = s.shared.pr.read().unwrap().unwrap();
    let mut rec = PrRecord::decode(&bytes).unwrap();
    let old = rec.epoch;
    rec.epoch += 1;
    let bytes = change(&mut rec);
    assert!(s.shared.pr.write_if(Some(old), old + 1, &bytes).unwrap());
    old + 1
}

#[test]
fn a_lost_compare_and_set_is_applied_again_on_the_new_state() {
    let image = TestImage::new("pr-cas", "8M");
    let g1 = target(&image);
    let side = store(&image);
    let a = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    let b = Nexus::iscsi("iqn.2026-11.rs.iscsi:b", 1, 2);
    assert_eq!(prout(&g1, &a, 0x06, 0, 0, 0xA1, 0), CommandOutcome::GOOD);
    // Another gateway registers B; gateway 1 has not heard of it.
    change_behind(&side, |rec| {
        rec.register(&b, 0xB2);
        rec.encode()
    });
    assert_eq!(keys(&g1, &a), (1, vec![0xA1]));
    // Gateway 1's next change loses the race, reloads and applies again:
    // both registrations survive.
    assert_eq!(prout(&g1, &a, 0x01, 1, 0xA1, 0, 0), CommandOutcome::GOOD);
    assert_eq!(keys(&g1, &a), (2, vec![0xA1, 0xB2]));
    let rec = PrRecord::decode(&side.shared.pr.read().unwrap().unwrap()).unwrap();
    assert_eq!(rec.registration_count(), 2);
    assert!(rec.is_reserved());
}

#[test]
fn a_damaged_record_is_refused_and_the_state_stays_stale_until_a_good_one() {
    let image = TestImage::new("pr-bad", "8M");
    let g1 = target(&image);
    let side = store(&image);
    let a = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    assert_eq!(prout(&g1, &a, 0x06, 0, 0, 0xA1, 0), CommandOutcome::GOOD);
    let good = side.shared.pr.read().unwrap().unwrap();
    let epoch = change_behind(&side, |_| b"IRPR\x01\x00garbage".to_vec());
    // Gateway 1 cannot load it: it does not acknowledge (a notifier that
    // lists it would fence it).
    let g1_gid = PrRecord::decode(&good).unwrap().gateways[0].gid;
    assert!(!side.shared.pr.notify().unwrap().contains(&g1_gid));
    let unreachable = iscsi_scsi::Sense::new(
        iscsi_scsi::SenseKey::NotReady,
        iscsi_scsi::Asc::new(0x08, 0x00),
    );
    let (o, _) = run(&g1, &a, &[0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    assert_eq!(o.sense, Some(unreachable));
    assert_eq!(
        prout(&g1, &a, 0x06, 0, 0xA1, 0xA2, 0).sense,
        Some(unreachable)
    );
    // A good record again (the old one at the next epoch).
    let mut rec = PrRecord::decode(&good).unwrap();
    rec.epoch = epoch + 1;
    assert!(
        side.shared
            .pr
            .write_if(Some(epoch), epoch + 1, &rec.encode())
            .unwrap()
    );
    assert!(side.shared.pr.notify().unwrap().contains(&g1_gid));
    assert_eq!(keys(&g1, &a), (1, vec![0xA1]));
}

#[test]
fn aptpl_decides_what_survives_the_whole_group_restarting() {
    let image = TestImage::new("pr-aptpl", "8M");
    let a = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    let g1 = target(&image);
    assert_eq!(prout(&g1, &a, 0x06, 0, 0, 0xA1, 1), CommandOutcome::GOOD);
    assert_eq!(prin(&g1, &a, 2)[3] & 1, 1, "PTPL_A");
    assert_eq!(prout(&g1, &a, 0x01, 5, 0xA1, 0, 0), CommandOutcome::GOOD);
    drop(g1);
    // The first gateway back: APTPL=1 kept it, PRgeneration restarts.
    let g2 = target(&image);
    assert_eq!(keys(&g2, &a), (0, vec![0xA1]));
    // A gateway joining a running group changes nothing.
    let g3 = target(&image);
    assert_eq!(keys(&g3, &a), (0, vec![0xA1]));
    // APTPL=0 from now on (REGISTER with APTPL 0).
    assert_eq!(prout(&g3, &a, 0x06, 0, 0xA1, 0xA3, 0), CommandOutcome::GOOD);
    assert_eq!(prin(&g2, &a, 2)[3] & 1, 0);
    drop((g2, g3));
    let g4 = target(&image);
    assert_eq!(keys(&g4, &a), (0, vec![]));
    let d = prin(&g4, &a, 1);
    assert_eq!(&d[4..8], &[0, 0, 0, 0]);
}

#[test]
fn a_gateway_that_does_not_acknowledge_is_fenced_before_the_command_completes() {
    let image = TestImage::new("pr-late", "8M");
    let g1 = target(&image);
    let late = store(&image);
    let a = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    // A gateway that joined the record and watches, but answers no notify
    // in time (stopped, partitioned).
    let (gid, addr) = late.shared.pr.me();
    change_behind(&late, |rec| {
        rec.gateways.push(iscsi_scsi::pr_record::Gateway {
            gid,
            addr: addr.clone(),
        });
        rec.encode()
    });
    late.shared
        .pr
        .watch(std::sync::Arc::new(|_| {
            std::thread::sleep(Duration::from_secs(8));
            true
        }))
        .unwrap();
    late.write_at(0, &[7u8; 512]).unwrap();
    let start = Instant::now();
    assert_eq!(prout(&g1, &a, 0x06, 0, 0, 0xA1, 0), CommandOutcome::GOOD);
    assert!(
        start.elapsed() >= Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    // Fenced by then: its writes fail (EAGAIN while it rejoins), and the
    // record forgot it.
    let err = late.write_at(0, &[8u8; 512]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(11), "{err}");
    let rec = PrRecord::decode(&late_free_read(&image)).unwrap();
    assert!(
        rec.gateways.iter().all(|g| g.gid != gid),
        "{:?}",
        rec.gateways
    );
    assert_eq!(rec.registration_count(), 1);
}

/// The record as a fresh client reads it.
fn late_free_read(image: &TestImage) -> Vec<u8> {
    store(image).shared.pr.read().unwrap().unwrap()
}

/// SPC-2 RESERVE(6) is one reservation for the whole group: through one
/// gateway it conflicts on the other; a LOGICAL UNIT RESET through the
/// other gateway releases it and raises BUS DEVICE RESET FUNCTION
/// OCCURRED for the nexuses of both; the holder's nexus lost on its
/// gateway releases it for both.
#[test]
fn spc2_reservations_and_lu_resets_span_the_group() {
    let image = TestImage::new("pr-spc2", "8M");
    let (g1, g2) = (target(&image), target(&image));
    let a = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    let b = Nexus::iscsi("iqn.2026-11.rs.iscsi:b", 1, 2);
    const TUR: [u8; 6] = [0; 6];
    const RESERVE6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];
    const RELEASE6: [u8; 6] = [0x17, 0, 0, 0, 0, 0];
    assert_eq!(run(&g1, &a, &TUR, &[]).0, CommandOutcome::GOOD);
    assert_eq!(run(&g2, &b, &TUR, &[]).0, CommandOutcome::GOOD);
    assert_eq!(run(&g1, &a, &RESERVE6, &[]).0, CommandOutcome::GOOD);
    let conflict = status::RESERVATION_CONFLICT;
    assert_eq!(write10(&g2, &b).status, conflict);
    assert_eq!(run(&g2, &b, &TUR, &[]).0.status, conflict);
    assert_eq!(run(&g2, &b, &RESERVE6, &[]).0.status, conflict);
    // RELEASE from a nexus that does not hold it: GOOD, and nothing goes.
    assert_eq!(run(&g2, &b, &RELEASE6, &[]).0, CommandOutcome::GOOD);
    assert_eq!(write10(&g2, &b).status, conflict);
    assert_eq!(write10(&g1, &a), CommandOutcome::GOOD);
    let record =
        |s: &RbdBackstore| PrRecord::decode(&s.shared.pr.read().unwrap().unwrap()).unwrap();
    let side = store(&image);
    assert!(record(&side).is_spc2_reserved());

    // A LOGICAL UNIT RESET through gateway 2: the reservation goes, and
    // every nexus of the LU hears of the reset, through either gateway.
    g2.lun_reset(0);
    let reset = Some(iscsi_scsi::Sense::unit_attention(
        iscsi_scsi::Asc::BUS_DEVICE_RESET,
    ));
    assert_eq!(run(&g1, &a, &TUR, &[]).0.sense, reset);
    assert_eq!(run(&g2, &b, &TUR, &[]).0.sense, reset);
    assert_eq!(run(&g1, &a, &TUR, &[]).0, CommandOutcome::GOOD);
    assert_eq!(write10(&g2, &b), CommandOutcome::GOOD);
    let rec = record(&side);
    assert!(!rec.is_spc2_reserved());
    assert_eq!(rec.resets, 1);

    // Reserved again through gateway 1; its nexus is lost there: released
    // for gateway 2 too.
    assert_eq!(run(&g1, &a, &RESERVE6, &[]).0, CommandOutcome::GOOD);
    assert_eq!(write10(&g2, &b).status, conflict);
    g1.nexus_lost(&a);
    assert_eq!(write10(&g2, &b), CommandOutcome::GOOD);
    assert!(!record(&side).is_spc2_reserved());

    // One set of mode parameters: SWP set through gateway 2 protects
    // writes through gateway 1, whose nexus hears MODE PARAMETERS CHANGED.
    assert_eq!(run(&g1, &a, &TUR, &[]).0, CommandOutcome::GOOD);
    let (o, d) = run(&g2, &b, &[0x1A, 0x08, 0x0A, 0, 255, 0], &[]);
    assert_eq!(o, CommandOutcome::GOOD);
    let mut p = vec![0, 0, 0, 0];
    p.extend_from_slice(&d[4..]);
    p[4 + 4] |= 0x08;
    let select = [0x15, 0x10, 0, 0, p.len() as u8, 0];
    assert_eq!(run(&g2, &b, &select, &p).0, CommandOutcome::GOOD);
    assert_eq!(
        run(&g1, &a, &TUR, &[]).0.sense,
        Some(iscsi_scsi::Sense::MODE_PARAMETERS_CHANGED)
    );
    let protected = write10(&g1, &a).sense.map(|s| s.key);
    assert_eq!(protected, Some(iscsi_scsi::SenseKey::DataProtect));
    // A target reset through gateway 1 puts them back for both, with its
    // own unit attention on gateway 2 (29h, as raised there).
    g1.target_reset(iscsi_scsi::TargetReset::Warm);
    let (o, _) = run(&g2, &b, &TUR, &[]);
    assert_eq!(o.sense.map(|s| s.asc.asc), Some(0x29));
    assert_eq!(write10(&g2, &b), CommandOutcome::GOOD);
    assert_eq!(record(&side).resets, 2);
}

/// A gateway fenced as the reservation changes (as one that missed a
/// notify is) rejoins with a new client and the state it missed: its
/// nexus preempted meanwhile gets RESERVATION CONFLICT through it, the
/// record lists its new client, and later changes reach it again.
#[test]
fn a_fenced_gateway_rejoins_with_the_reservation_state_it_missed() {
    let image = TestImage::new("pr-rejoin", "8M");
    let s1 = Arc::new(store(&image));
    let g1 = ScsiTarget::new(
        TargetIdentity::new("iqn.2026-11.rs.iscsi:pr"),
        vec![Arc::clone(&s1) as Arc<dyn Backstore>],
    );
    let g2 = target(&image);
    let a = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    let b = Nexus::iscsi("iqn.2026-11.rs.iscsi:b", 1, 2);
    assert_eq!(prout(&g1, &a, 0x00, 0, 0, 0xA, 0), CommandOutcome::GOOD);
    assert_eq!(write10(&g1, &a), CommandOutcome::GOOD);
    let (_, old_addr) = s1.shared.pr.me();
    store(&image)
        .shared
        .pr
        .fence(std::slice::from_ref(&old_addr))
        .unwrap();
    let fenced = run(&g1, &a, &[0x2A, 0, 0, 0, 0, 1, 0, 0, 1, 0], &[0x5A; 512]).0;
    assert_ne!(fenced, CommandOutcome::GOOD, "a fenced gateway wrote");
    // Through the other gateway, while the first is fenced: B registers,
    // reserves Write Exclusive and preempts A.
    assert_eq!(prout(&g2, &b, 0x00, 0, 0, 0xB, 0), CommandOutcome::GOOD);
    assert_eq!(prout(&g2, &b, 0x01, 1, 0xB, 0, 0), CommandOutcome::GOOD);
    assert_eq!(prout(&g2, &b, 0x04, 1, 0xB, 0xA, 0), CommandOutcome::GOOD);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let w = write10(&g1, &a);
        if w == CommandOutcome::RESERVATION_CONFLICT {
            break;
        }
        // Fenced (NOT READY, LOGICAL UNIT COMMUNICATION FAILURE), or the
        // preemption's unit attention once back: never GOOD.
        assert_ne!(w, CommandOutcome::GOOD, "a preempted nexus wrote");
        assert!(Instant::now() < deadline, "the gateway never rejoined");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(keys(&g1, &a).1, vec![0xB]);
    let (_, new_addr) = s1.shared.pr.me();
    assert_ne!(new_addr, old_addr);
    let rec = PrRecord::decode(&late_free_read(&image)).unwrap();
    assert!(
        rec.gateways.iter().any(|g| g.addr == new_addr),
        "{:?}",
        rec.gateways
    );
    // A change through the other gateway reaches the rejoined one before
    // it completes: with the reservation released, A writes again.
    assert_eq!(prout(&g2, &b, 0x02, 1, 0xB, 0, 0), CommandOutcome::GOOD);
    assert_eq!(write10(&g1, &a), CommandOutcome::GOOD);
}

/// COMPARE AND WRITE across two gateways outside a group (issue 48 item
/// 6). Within one 512-byte sector librbd does it in the OSD, atomic for
/// every writer, so both gateways run it. Beyond that (one 4 KiB block)
/// only the LU's lock could, which holds on one gateway: both refuse it
/// while both are up (ILLEGAL REQUEST, INVALID FIELD IN CDB, at NUMBER OF
/// LOGICAL BLOCKS), and the survivor runs it once the other is gone: it
/// answers no notify, so it is fenced and forgotten.
#[test]
fn compare_and_write_beyond_a_sector_runs_only_on_a_gateway_alone() {
    let a = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    for (block, refused) in [(512usize, false), (4096, true)] {
        let image = TestImage::new(&format!("caw-{block}"), "8M");
        let gateway = || {
            let s: Arc<dyn Backstore> =
                Arc::new(RbdBackstore::open(&image.spec(), block as u32).unwrap());
            ScsiTarget::new(TargetIdentity::new("iqn.2026-11.rs.iscsi:caw"), vec![s])
        };
        let (g1, g2) = (gateway(), gateway());
        // One block at LBA 1: compare with what is there, write `to`.
        let caw = |t: &ScsiTarget, from: u8, to: u8| {
            let cdb = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0];
            let mut data = vec![from; block];
            data.extend(vec![to; block]);
            run(t, &a, &cdb, &data).0
        };
        let refusal = iscsi_scsi::Sense::INVALID_FIELD_IN_CDB
            .with_field_pointer(iscsi_scsi::FieldPointer::cdb(13, None));
        let mut on_medium = 0u8;
        for (t, to) in [(&g1, 1u8), (&g2, 2)] {
            let o = caw(t, on_medium, to);
            if refused {
                assert_eq!(o.sense, Some(refusal), "{block}-byte blocks");
            } else {
                assert_eq!(o, CommandOutcome::GOOD, "{block}-byte blocks");
                on_medium = to;
            }
        }
        drop(g2);
        assert_eq!(
            caw(&g1, on_medium, 3),
            CommandOutcome::GOOD,
            "{block}-byte blocks"
        );
        let (o, back) = run(&g1, &a, &[0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0], &[]);
        assert_eq!(o, CommandOutcome::GOOD);
        assert!(back.iter().all(|&b| b == 3));
    }
}
