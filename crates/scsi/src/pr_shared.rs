//! Persistent reservations shared by a gateway group: the LU's state lives
//! in a record outside the gateway ([`SharedPrStore`]: for an RBD image, a
//! RADOS object in its pool; the format is [`crate::pr_record`]), and each
//! gateway keeps a copy in the LU's state, which is what every command's
//! access check reads (no cluster read per command, unlike SUSE's
//! target_core_rbd).
//!
//! - **Change**: a PERSISTENT RESERVE OUT computes the new state from the
//!   cached one ([`pr::prout`], on a copy) and commits it by
//!   compare-and-set on the record's epoch. When the epoch moved (another
//!   gateway committed first) it reloads and applies the command again, at
//!   most [`MAX_TRIES`] times. Only a committed state becomes the cache.
//! - **Tell**: after the commit (and with the LU's lock let go) it notifies
//!   every watcher of the record; each gateway reloads, then acknowledges
//!   (one that cannot load the record does not: it is then fenced). The
//!   LU's state lock is held from the computation through the
//!   compare-and-set (one small RADOS write), so commands to a reserved LU
//!   on this gateway wait that long, never for the notify or the fencing.
//! - **Fence**: every gateway the record lists that did not acknowledge
//!   (stopped, partitioned, dead, or its watch lapsed) could still admit
//!   I/O on a stale copy: it is fenced (its RADOS client of this LU
//!   blocklisted, then the OSD map waited for) before the command
//!   completes. This is what PREEMPT (AND ABORT) needs: once it completes,
//!   nothing the preempted nexus sends through any gateway lands; the
//!   other service actions get the same guarantee (a RESERVE is in force
//!   on every path when it completes).
//! - **Stale**: a gateway whose watch broke or which finds itself fenced
//!   marks the LU's reservation state stale: persistent reservation
//!   commands fail (NOT READY, LOGICAL UNIT COMMUNICATION FAILURE) until a
//!   reload succeeds; its data I/O fails anyway, the client being fenced.
//! - **APTPL** (SPC-4 §5.12.5): the record survives every gateway, so the
//!   state could always persist; but with APTPL=0 an initiator expects it
//!   gone after a power loss. A gateway that joins the record and finds no
//!   other gateway answering its notify is the first one up after the whole
//!   group was down, which for the LU is a power cycle: it clears an APTPL=0
//!   state (registrations and reservation) and keeps an APTPL=1 one; either
//!   way PRgeneration restarts at 0, as after power on (SPC-4 §6.15.2); the
//!   other gateways the record lists are fenced (one merely stopped would
//!   otherwise wake up with the old state). A gateway joining a group that
//!   is up keeps the state as it is.
//!
//! - **Mode parameters** (WCE, D_SENSE, SWP: one set per LU, SPC-4 §7.5)
//!   too: MODE SELECT commits them, and a gateway that reloads a change
//!   raises MODE PARAMETERS CHANGED for its nexuses.
//! - **SPC-2 reservations and LU resets** ride on the same record
//!   (version 2, [`crate::pr_record`]): RESERVE(6)/(10), RELEASE and the
//!   loss of the holder's nexus change its SPC-2 holder by the same
//!   compare-and-set, notify and fence, so a RESERVE through one gateway
//!   conflicts on every path. A LOGICAL UNIT RESET releases it and counts
//!   one more reset in the record; a gateway that reloads a grown count
//!   resets its own copy of the LU as the reset's gateway did: mode
//!   parameters, prevention, and the reset's unit attention (BUS DEVICE
//!   RESET FUNCTION OCCURRED, or a target reset's) for every nexus it
//!   knows (SAM-5 §6.3.3: every I_T nexus of the LU). Its
//!   commands run to completion in the backstore, so it holds no task
//!   state of its own to clear; tasks in flight through its transport then
//!   finish rather than being aborted (see [`lun_reset`]).
//!
//! Unit attentions: the gateway that runs a command raises them as a
//! single target does; a gateway that reloads a change raises, for the
//! nexuses whose registrations went, REGISTRATIONS PREEMPTED, and for the
//! remaining registrants of a reservation that went or changed,
//! RESERVATIONS RELEASED (or PREEMPTED when it changed hands).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::backstore::{Backstore, PrEvent, SharedPrStore};
use crate::lu::{ClusterView, KnownNexuses, LogicalUnit, LuState, ModeParams};
use crate::nexus::{Nexus, NexusKey};
use crate::pr::{self, Fail, PrState};
use crate::pr_record::{Gateway, MAX_GATEWAYS, PrRecord};
use crate::spc::MAX_COMPARE_AND_WRITE_BLOCKS;
use crossbeam_utils::sync::ShardedLockWriteGuard;
use iscsi_sense::{Asc, Sense};

/// Most compare-and-set attempts of one command: each failed one means
/// another gateway committed meanwhile, so more only under a storm of
/// reservation changes, which then gets BUSY-like failure rather than a
/// command that never ends.
pub(crate) const MAX_TRIES: usize = 16;

/// NOT READY, LOGICAL UNIT COMMUNICATION FAILURE: the shared state could
/// not be read, written or trusted.
const UNREACHABLE: Sense = Sense::LU_COMMUNICATION_FAILURE;

/// Persistent reservation commands fail while the cached state is stale.
pub(crate) fn check_fresh(lu: &LogicalUnit) -> Result<(), Fail> {
    if lu.shared.is_some() && lu.pr_stale.load(Ordering::Acquire) {
        return Err(UNREACHABLE.into());
    }
    Ok(())
}

/// The LU of `backstore`, its shared reservation state (if any) joined
/// and watched ([`attach`]).
pub(crate) fn logical_unit(
    backstore: Arc<dyn Backstore>,
    nexuses: &KnownNexuses,
) -> Arc<LogicalUnit> {
    let lu = Arc::new(LogicalUnit::new(backstore, Arc::clone(nexuses)));
    if lu.shared.is_some() {
        attach(&lu);
    }
    lu
}

/// Joins the shared record (adds this gateway to its list, applies the
/// APTPL rule when no other gateway is up), loads it and starts watching.
/// A failure is logged and leaves the state stale: the LU still serves
/// I/O, reservation commands fail until a notify or a retry loads it.
pub(crate) fn attach(lu: &Arc<LogicalUnit>) {
    let Some(store) = lu.shared.clone() else {
        return;
    };
    // A watch needs the object: the first gateway ever creates it empty
    // (losing that race to another gateway is as good).
    match store.read() {
        Ok(Some(_)) => {}
        Ok(None) => {
            if let Err(e) = store.write_if(
                None,
                1,
                &PrRecord::new(1, Vec::new(), PrState::default()).encode(),
            ) {
                eprintln!("persistent reservations: creating the shared state: {e}");
                return;
            }
        }
        Err(e) => {
            eprintln!("persistent reservations: reading the shared state: {e}");
            return;
        }
    }
    let weak: Weak<LogicalUnit> = Arc::downgrade(lu);
    let watched = store.watch(Arc::new(move |event| {
        let Some(lu) = weak.upgrade() else {
            return false;
        };
        match event {
            PrEvent::Changed => changed(&lu),
            PrEvent::Broken => {
                lu.pr_stale.store(true, Ordering::Release);
                eprintln!(
                    "persistent reservations: the watch of the shared state broke; stale until reloaded"
                );
                false
            }
            PrEvent::Rejoined => rejoin(&lu),
        }
    }));
    if let Err(e) = watched {
        eprintln!("persistent reservations: cannot watch the shared state: {e}");
        return;
    }
    // Who else is up: every watcher acknowledges, this gateway included.
    let (me_gid, _) = store.me();
    let alone = match store.notify() {
        Ok(acked) => acked.iter().all(|&g| g == me_gid),
        Err(e) => {
            eprintln!("persistent reservations: notify at start failed: {e}");
            return;
        }
    };
    // The gateways up hear of this one before it serves (`serves_alone`);
    // alone, the others listed were fenced while joining.
    if join(lu, store.as_ref(), alone) && !alone {
        announce(lu, store.as_ref());
    }
}

/// Adds this gateway's client to the record's list of gateways (the ones a
/// change must hear from, or fence) and installs the record; `alone`: no
/// other gateway is up, the group's power cycle (see the module's doc).
/// Whether it joined.
fn join(lu: &LogicalUnit, store: &dyn SharedPrStore, alone: bool) -> bool {
    let (me_gid, me_addr) = store.me();
    for _ in 0..MAX_TRIES {
        let (expected, mut record) = match load(store) {
            Ok(Some(r)) => (Some(r.epoch), r),
            Ok(None) => (None, PrRecord::default()),
            Err(e) => {
                eprintln!("persistent reservations: {e}");
                return false;
            }
        };
        record
            .gateways
            .retain(|g| g.gid != me_gid && g.addr != me_addr);
        while record.gateways.len() >= MAX_GATEWAYS {
            record.gateways.remove(0);
        }
        record.gateways.push(Gateway {
            gid: me_gid,
            addr: me_addr.clone(),
        });
        if alone {
            record.pr.generation = 0;
            if !record.pr.aptpl {
                record.pr = PrState::default();
            }
            // Nor do an SPC-2 reservation and changed mode parameters.
            record.spc2 = None;
            record.mode = ModeParams::DEFAULT.to_bits();
        }
        record.epoch = expected.map_or(1, |e| e + 1);
        match store.write_if(expected, record.epoch, &record.encode()) {
            Ok(true) => {
                // Alone: every other listed gateway is down or stopped. A
                // stopped one would wake up with the state from before
                // this power cycle in its memory: fence it first.
                let others: Vec<String> = record
                    .gateways
                    .iter()
                    .filter(|g| g.gid != me_gid)
                    .map(|g| g.addr.clone())
                    .collect();
                let mut st = lu.state();
                install(&mut st, record);
                drop(st);
                if alone && !others.is_empty() {
                    if let Err(e) = store.fence(&others) {
                        eprintln!("persistent reservations: fencing {others:?} at start: {e}");
                        return false;
                    }
                    forget_gateways(lu, store, &others);
                }
                lu.pr_stale.store(false, Ordering::Release);
                return true;
            }
            Ok(false) => continue,
            Err(e) => {
                eprintln!("persistent reservations: joining the shared state: {e}");
                return false;
            }
        }
    }
    eprintln!("persistent reservations: the shared state kept changing while joining");
    false
}

/// This gateway's client of the LU was fenced and the store connected a
/// new one ([`PrEvent::Rejoined`]). Commands checked against the state
/// from before the fence must not reach the new client, which the fence
/// no longer stops: every write in flight is drained (the LU's exclusive
/// write access), the record reloaded (raising the unit attentions of what
/// changed meanwhile, a preemption say) and joined again under it, and the
/// LU's I/O epoch moved on, so that a write checked before this and
/// started after it is refused ([`LogicalUnit::write_shared_at`]).
/// Whether the LU may serve again.
fn rejoin(lu: &LogicalUnit) -> bool {
    let Some(store) = &lu.shared else {
        return true;
    };
    lu.pr_stale.store(true, Ordering::Release);
    let _writes = lu.write_exclusive();
    // Not alone, whatever the notify says: this gateway was up through
    // the group's life, so no power cycle happened.
    if !reload(lu) || !join(lu, store.as_ref(), false) {
        return false;
    }
    lu.next_io_epoch();
    drop(_writes);
    // After the lock: the gateways up drain their own exclusive writes
    // before they acknowledge, and this one's watch thread is one of them.
    announce(lu, store.as_ref())
}

/// Tells every gateway up that this one joined the record (a notify):
/// each reloads it, finds this gateway listed, and drains its exclusive
/// writes before it acknowledges ([`changed`]); a listed gateway that
/// does not acknowledge is fenced and forgotten, as for a reservation
/// change. Whether that went through; if not, a gateway up may not know
/// of this one (see [`serves_alone`]).
fn announce(lu: &LogicalUnit, store: &dyn SharedPrStore) -> bool {
    let gateways = lu.state().cluster.gateways.clone();
    match tell_and_fence(lu, store, &gateways) {
        Ok(()) => true,
        Err(_) => {
            eprintln!(
                "persistent reservations: telling the other gateways that this one joined failed"
            );
            false
        }
    }
}

/// Whether this gateway is the only one serving the LU's data, so that
/// the LU's exclusive write lock, which is this gateway's alone, makes a
/// read, compare and write atomic for the whole LU (COMPARE AND WRITE
/// beyond what the store does in one step, ORWRITE). It is without a
/// shared record, and in a gateway group, where only the LU's owner
/// serves data (ALUA); otherwise when the record lists no other gateway.
///
/// Why the cached list is enough: a gateway that joins tells every
/// gateway up before it serves ([`announce`]), and each of them installs
/// the list with the newcomer, then waits for its own exclusive writes
/// before it acknowledges ([`changed`]). The caller checks again once it
/// holds the exclusive lock: either it took the lock first, and the
/// newcomer waits for its write, or the list it reads names the newcomer.
pub(crate) fn serves_alone(lu: &LogicalUnit) -> bool {
    let Some(store) = &lu.shared else {
        return true;
    };
    if lu.alua.is_some() {
        return true;
    }
    let (me, _) = store.me();
    lu.state().cluster.gateways.iter().all(|g| g.gid == me)
}

/// The LU's exclusive write lock for a read, compare and write the store
/// does not do in one step (`what`: the command, for the log), when this
/// gateway serves the LU alone ([`serves_alone`], asked again of the
/// cluster first if not: [`alone_after_asking`]). Otherwise the command
/// is refused with `refusal`, and the log says why: this gateway's lock
/// keeps out no other gateway's writes, and silently non-atomic is what
/// it must never be.
pub(crate) fn exclusive_alone<'a>(
    lu: &'a LogicalUnit,
    epoch: u64,
    what: &str,
    refusal: Sense,
) -> Result<ShardedLockWriteGuard<'a, ()>, Fail> {
    if !serves_alone(lu) {
        alone_after_asking(lu);
    }
    let guard = lu.write_exclusive_at(epoch)?;
    if serves_alone(lu) {
        return Ok(guard);
    }
    let listed: Vec<String> = lu
        .state()
        .cluster
        .gateways
        .iter()
        .map(|g| g.addr.clone())
        .collect();
    eprintln!(
        "{what} refused: gateways {listed:?} serve this LU outside a gateway group, and a \
         compare and write that the store does not do in one step (RBD: within one 512-byte \
         sector) would not be atomic across them; a gateway group (--gateway-group) makes it atomic"
    );
    Err(refusal.into())
}

/// MAXIMUM COMPARE AND WRITE LENGTH: every length the SCSI layer takes
/// while this gateway serves the LU alone; otherwise the blocks the store
/// compares in one step (RBD: one 512-byte block, none of 4 KiB), the
/// longer ones being refused ([`exclusive_alone`]).
pub(crate) fn max_compare_blocks(lu: &LogicalUnit) -> u8 {
    if serves_alone(lu) {
        return MAX_COMPARE_AND_WRITE_BLOCKS;
    }
    let bs = u64::from(lu.backstore.block_size());
    (1..=MAX_COMPARE_AND_WRITE_BLOCKS)
        .take_while(|&n| lu.backstore.compares_in_one_step(0, u64::from(n) * bs))
        .last()
        .unwrap_or(0)
}

/// For an exclusive write that [`serves_alone`] would refuse: asks which
/// gateways are up (a notify). When none of the other listed gateways
/// answers, each is down, stopped, or an old client of this one; they are
/// fenced and forgotten as a reservation change would, and this gateway
/// is then alone (the caller asks [`serves_alone`] again, under the
/// lock). Called without the LU's exclusive lock, which the gateways that
/// answer may need first ([`changed`]).
fn alone_after_asking(lu: &LogicalUnit) {
    let Some(store) = &lu.shared else {
        return;
    };
    let (me, _) = store.me();
    let others: Vec<Gateway> = lu
        .state()
        .cluster
        .gateways
        .iter()
        .filter(|g| g.gid != me)
        .cloned()
        .collect();
    if others.is_empty() {
        return;
    }
    let Ok(acked) = store.notify() else {
        return;
    };
    if others.iter().any(|g| acked.contains(&g.gid)) {
        return;
    }
    let gone: Vec<String> = others.into_iter().map(|g| g.addr).collect();
    if let Err(e) = store.fence(&gone) {
        eprintln!("persistent reservations: fencing {gone:?}, which answer nothing: {e}");
        return;
    }
    forget_gateways(lu, store.as_ref(), &gone);
}

/// The record, parsed; `None` when none is stored yet.
fn load(store: &dyn SharedPrStore) -> Result<Option<PrRecord>, String> {
    let Some(bytes) = store
        .read()
        .map_err(|e| format!("reading the shared state: {e}"))?
    else {
        return Ok(None);
    };
    PrRecord::decode(&bytes)
        .map(Some)
        .map_err(|e| format!("refusing the shared state: {e}"))
}

/// Makes `record` the cached state.
fn install(st: &mut LuState, record: PrRecord) {
    st.pr = record.pr;
    st.spc2 = record.spc2;
    st.mode = ModeParams::from_bits(record.mode);
    st.cluster = ClusterView {
        epoch: record.epoch,
        gateways: record.gateways,
        resets: record.resets,
        reset_ascq: record.reset_ascq,
    };
}

/// The cached state as a record (the epoch it is the state of).
fn cached(st: &LuState) -> PrRecord {
    let mut record = PrRecord::new(st.cluster.epoch, st.cluster.gateways.clone(), st.pr.clone());
    record.spc2 = st.spc2.clone();
    record.resets = st.cluster.resets;
    record.reset_ascq = st.cluster.reset_ascq;
    record.mode = st.mode.to_bits();
    record
}

/// Reloads the record (a notify, or a lost compare-and-set) and takes it
/// when it is newer than the cache, raising the unit attentions a change
/// made elsewhere means here. A record that does not load leaves the
/// state stale. Whether the cache is the stored state now (what a notify's
/// acknowledgement promises).
pub(crate) fn reload(lu: &LogicalUnit) -> bool {
    reload_seeing(lu).is_some()
}

/// A change another gateway notified: [`reload`], and when the record
/// lists a gateway it did not, the exclusive writes in flight here end
/// before the acknowledgement lets the newcomer serve ([`serves_alone`]).
fn changed(lu: &LogicalUnit) -> bool {
    match reload_seeing(lu) {
        Some(true) => {
            drop(lu.write_exclusive());
            true
        }
        Some(false) => true,
        None => false,
    }
}

/// [`reload`]; `Some(true)` when the record lists a gateway the cache did
/// not.
fn reload_seeing(lu: &LogicalUnit) -> Option<bool> {
    let Some(store) = &lu.shared else {
        return None;
    };
    match load(store.as_ref()) {
        Ok(Some(record)) => {
            let mut st = lu.state();
            let mut newcomer = false;
            if record.epoch > st.cluster.epoch {
                newcomer = record
                    .gateways
                    .iter()
                    .any(|g| !st.cluster.gateways.iter().any(|o| o.gid == g.gid));
                let old = std::mem::take(&mut st.pr);
                let uas = remote_change_uas(&old, &record.pr);
                // A reset through another gateway (a state installed
                // before: the count at joining is history).
                let joined = st.cluster.epoch != 0;
                let reset = joined && record.resets > st.cluster.resets;
                let ua = Sense::unit_attention(Asc::new(0x29, record.reset_ascq));
                let mode_changed = joined && record.mode != st.mode.to_bits();
                install(&mut st, record);
                let nexuses = lu.nexuses.load();
                if reset {
                    st.reset(nexuses.iter(), ua);
                } else if mode_changed {
                    // MODE SELECT through another gateway (SPC-4 §6.9).
                    st.raise_for_all(nexuses.iter(), None, Sense::MODE_PARAMETERS_CHANGED);
                }
                for (k, s) in uas {
                    st.raise_for(&k, s);
                }
            }
            drop(st);
            lu.pr_stale.store(false, Ordering::Release);
            Some(newcomer)
        }
        // Not joined yet (the first gateway's own notify at start).
        Ok(None) if lu.state().cluster.epoch == 0 => Some(false),
        Ok(None) => {
            lu.pr_stale.store(true, Ordering::Release);
            eprintln!("persistent reservations: the shared state is gone; stale");
            None
        }
        Err(e) => {
            lu.pr_stale.store(true, Ordering::Release);
            eprintln!("persistent reservations: {e}; stale");
            None
        }
    }
}

/// The unit attentions a change from `old` to `new` made by another
/// gateway means (see the module's note).
fn remote_change_uas(old: &PrState, new: &PrState) -> Vec<(NexusKey, Sense)> {
    let mut uas = Vec::new();
    for r in &old.registrations {
        if new.registration(&r.key).is_none() {
            uas.push((
                r.key.clone(),
                Sense::unit_attention(Asc::REGISTRATIONS_PREEMPTED),
            ));
        }
    }
    if let Some(was) = &old.reservation
        && new.reservation.as_ref() != Some(was)
    {
        let asc = if new.reservation.is_some() {
            Asc::RESERVATIONS_PREEMPTED
        } else {
            Asc::RESERVATIONS_RELEASED
        };
        for k in new.registered_keys() {
            if !new.is_holder(&k) {
                uas.push((k, Sense::unit_attention(asc)));
            }
        }
    }
    uas
}

/// Changes the shared state: `step` computes the next record from the
/// cached one (a copy; its epoch and gateways are the cache's), which is
/// committed by compare-and-set (retried on a lost race), then becomes the
/// cache; `done` runs on the state, still locked, once the change (or no
/// change) is the cache; then the change is notified and late gateways
/// fenced (see the module's doc).
fn commit<T>(
    lu: &LogicalUnit,
    store: &dyn SharedPrStore,
    mut step: impl FnMut(&mut PrRecord) -> Result<T, Fail>,
    done: impl FnOnce(&mut LuState, &T),
) -> Result<T, Fail> {
    check_fresh(lu)?;
    for _ in 0..MAX_TRIES {
        let mut st = lu.state();
        let current = cached(&st);
        let mut next = current.clone();
        let out = step(&mut next)?;
        if next == current {
            done(&mut st, &out);
            return Ok(out);
        }
        next.epoch = current.epoch + 1;
        match store.write_if(Some(current.epoch), next.epoch, &next.encode()) {
            Ok(true) => {
                let gateways = next.gateways.clone();
                install(&mut st, next);
                done(&mut st, &out);
                drop(st);
                tell_and_fence(lu, store, &gateways)?;
                return Ok(out);
            }
            Ok(false) => {
                drop(st);
                if !reload(lu) {
                    return Err(UNREACHABLE.into());
                }
            }
            Err(e) => {
                drop(st);
                stale_on_fence(lu, &e);
                eprintln!("persistent reservations: committing a change: {e}");
                return Err(UNREACHABLE.into());
            }
        }
    }
    Err(UNREACHABLE.into())
}

/// PERSISTENT RESERVE OUT on a shared state ([`commit`]). Returns the
/// nexuses whose tasks PREEMPT AND ABORT aborts.
pub(crate) fn persistent_reserve_out(
    lu: &LogicalUnit,
    store: &dyn SharedPrStore,
    nexus: &Nexus,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<Vec<NexusKey>, Fail> {
    let out = commit(
        lu,
        store,
        |next| pr::prout(&mut next.pr, true, nexus, cdb, data_out),
        |st, out| {
            for (k, s) in &out.uas {
                st.raise_for(k, *s);
            }
        },
    )?;
    Ok(out.aborted)
}

/// RESERVE(6)/(10) (`reserve`) or RELEASE(6)/(10) on a shared state: the
/// SPC-2 holder is one for the whole group ([`commit`]).
pub(crate) fn reserve_or_release(
    lu: &LogicalUnit,
    store: &dyn SharedPrStore,
    nexus: &NexusKey,
    cdb: &[u8],
    reserve: bool,
) -> Result<(), Fail> {
    commit(
        lu,
        store,
        |next| {
            if reserve {
                pr::reserve(&mut next.spc2, &next.pr, nexus, cdb)
            } else {
                pr::release(&mut next.spc2, nexus, cdb)
            }
        },
        |_, _| {},
    )
}

/// The transport lost `nexus`: the SPC-2 reservation it held, if any, is
/// released for the whole group. A failure is logged: the holder then
/// stays until a RELEASE or a reset through another nexus.
pub(crate) fn nexus_lost(lu: &LogicalUnit, store: &dyn SharedPrStore, nexus: &NexusKey) {
    if lu.state().spc2.as_ref() != Some(nexus) {
        return;
    }
    let released = commit(
        lu,
        store,
        |next| {
            if next.spc2.as_ref() == Some(nexus) {
                next.spc2 = None;
            }
            Ok(())
        },
        |_, _| {},
    );
    if released.is_err() {
        eprintln!("persistent reservations: releasing a lost nexus's SPC-2 reservation failed");
    }
}

/// MODE SELECT on a shared state: one set of mode parameters for the
/// group ([`commit`]); `select` changes them (`mode::mode_select`) and
/// says whether anything changed; `done` then runs on the locked state.
pub(crate) fn mode_select(
    lu: &LogicalUnit,
    store: &dyn SharedPrStore,
    mut select: impl FnMut(&mut ModeParams) -> Result<bool, Fail>,
    done: impl FnOnce(&mut LuState, &bool),
) -> Result<(), Fail> {
    commit(
        lu,
        store,
        |next| {
            let mut mode = ModeParams::from_bits(next.mode);
            let changed = select(&mut mode)?;
            next.mode = mode.to_bits();
            Ok(changed)
        },
        done,
    )
    .map(|_| ())
}

/// A LOGICAL UNIT RESET (or a target reset, which resets every LU)
/// received here, raising ASC 29h with `ascq`, the local state already
/// reset: the record's SPC-2 holder goes, its mode parameters return to
/// their defaults and its reset count grows, which every other gateway's
/// reload turns into the same reset of its copy (the unit attention for
/// each of its nexuses). Tasks in flight through another
/// gateway are not aborted: that gateway's commands run to completion in
/// the backstore, and the initiator that sent the reset owns none of them
/// there. A failure is logged: the other gateways then miss the reset,
/// the reservation may stay.
pub(crate) fn lun_reset(lu: &LogicalUnit, store: &dyn SharedPrStore, ascq: u8) {
    let told = commit(
        lu,
        store,
        |next| {
            next.spc2 = None;
            next.mode = ModeParams::DEFAULT.to_bits();
            // Never 0 after a reset: 0 means "no reset yet".
            next.resets = next.resets.checked_add(1).unwrap_or(1);
            next.reset_ascq = ascq;
            Ok(())
        },
        |_, _| {},
    );
    if told.is_err() {
        eprintln!(
            "persistent reservations: telling the other gateways of a LOGICAL UNIT RESET failed"
        );
    }
}

/// Notifies the change; fences every listed gateway that did not
/// acknowledge it.
fn tell_and_fence(
    lu: &LogicalUnit,
    store: &dyn SharedPrStore,
    gateways: &[Gateway],
) -> Result<(), Fail> {
    let (me, _) = store.me();
    let acked = store.notify().map_err(|e| {
        stale_on_fence(lu, &e);
        eprintln!("persistent reservations: notifying a change: {e}");
        Fail::from(UNREACHABLE)
    })?;
    let late: Vec<String> = gateways
        .iter()
        .filter(|g| g.gid != me && !acked.contains(&g.gid))
        .map(|g| g.addr.clone())
        .collect();
    if late.is_empty() {
        return Ok(());
    }
    store.fence(&late).map_err(|e| {
        stale_on_fence(lu, &e);
        eprintln!("persistent reservations: fencing {late:?}: {e}");
        Fail::from(UNREACHABLE)
    })?;
    forget_gateways(lu, store, &late);
    Ok(())
}

/// Drops fenced gateways from the record (one attempt: a lost race only
/// means a later change fences them again, which costs a monitor round
/// trip and harms nothing, their clients being blocklisted already). A
/// fenced gateway comes back with a new client, which joins anew.
fn forget_gateways(lu: &LogicalUnit, store: &dyn SharedPrStore, fenced: &[String]) {
    let mut st = lu.state();
    let expected = st.cluster.epoch;
    let mut gateways = st.cluster.gateways.clone();
    gateways.retain(|g| !fenced.contains(&g.addr));
    let mut record = cached(&st);
    record.epoch = expected + 1;
    record.gateways = gateways;
    if let Ok(true) = store.write_if(Some(expected), record.epoch, &record.encode()) {
        install(&mut st, record);
    }
}

/// A cluster error that says this gateway's client is fenced
/// (EBLOCKLISTED, which Ceph spells ESHUTDOWN) makes the state stale.
fn stale_on_fence(lu: &LogicalUnit, e: &std::io::Error) {
    if e.raw_os_error() == Some(108) {
        lu.pr_stale.store(true, Ordering::Release);
    }
}

#[cfg(test)]
#[path = "pr_shared_tests.rs"]
mod tests;
