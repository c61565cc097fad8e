//! Reservations: SPC-2 RESERVE/RELEASE(6/10) (SPC-2 §7.21-7.24, with the
//! SPC-3 §5.6.3 exceptions), PERSISTENT RESERVE IN/OUT (SPC-4 §5.12, §6.15,
//! §6.16) and the access rules of both (SPC-4 §5.12.1 Table 63 "SPC commands
//! that are allowed in the presence of various reservations", SBC-3 §4.17
//! Table 13 for block commands).
//!
//! State lives per LU, across sessions. On a local store it lives in
//! memory only, so APTPL (persist through power loss) is not offered there:
//! APTPL=1 is INVALID FIELD IN PARAMETER LIST and REPORT CAPABILITIES says
//! PTPL_C=0. On a store shared by a gateway group (an RBD image,
//! [`crate::backstore::SharedPrStore`]) the state lives in the cluster
//! (`crate::pr_shared`): every gateway answers from one state, and APTPL is
//! honoured (PTPL_C=1, PTPL_A reports it): the state survives every
//! gateway's restart when APTPL=1 and is dropped, as a power loss would,
//! when the first gateway to come back finds no other one running and
//! APTPL=0. SPEC_I_PT and ALL_TG_PT are not supported (SIP_C=0, ATP_C=0).
//!
//! The service actions compute a new state from the current one
//! ([`prout`]); the caller decides where it lives: in the LU's memory, or
//! committed to the cluster first (compare-and-set) and only then taken.

use crate::cdb::{self, opcode};
use crate::lu::LuState;
use crate::nexus::{Nexus, NexusKey, parse_iscsi_transport_id};
use iscsi_sense::{Asc, Sense};

pub use crate::pr_state::{MAX_REGISTRATIONS, PrType};
pub(crate) use crate::pr_state::{PrState, Registration, Reservation};

pub(crate) use crate::outcome::Fail;

/// How a command is treated in the presence of reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Allowed whatever the reservations (INQUIRY, REPORT LUNS, ...).
    Always,
    /// Reads: allowed from anyone under the Write Exclusive types.
    Read,
    /// Writes and everything else: allowed only to holders (and registrants
    /// under the Registrants Only / All Registrants types).
    Write,
}

fn access(cdb: &[u8]) -> Access {
    use opcode::*;
    let Some(&op) = cdb.first() else {
        return Access::Write;
    };
    let sa = cdb.get(1).map_or(0, |b| b & 0x1F);
    match op {
        INQUIRY
        | REPORT_LUNS
        | REQUEST_SENSE
        | TEST_UNIT_READY
        | PERSISTENT_RESERVE_IN
        | PERSISTENT_RESERVE_OUT
        | READ_CAPACITY_10
        | MAINTENANCE_IN
        | RELEASE_6
        | RELEASE_10
        | RESERVE_6
        | RESERVE_10 => Access::Always,
        SERVICE_ACTION_IN_16 if sa == cdb::SA_READ_CAPACITY_16 => Access::Always,
        // SBC-3 Table 13: START STOP UNIT with START=1 and POWER CONDITION 0
        // and PREVENT ALLOW MEDIUM REMOVAL with PREVENT 0 are allowed.
        START_STOP_UNIT if cdb.get(4).is_some_and(|b| b & 0xF1 == 0x01) => Access::Always,
        PREVENT_ALLOW_MEDIUM_REMOVAL if cdb.get(4).is_some_and(|b| b & 0x03 == 0) => Access::Always,
        READ_6 | READ_10 | READ_12 | READ_16 | VERIFY_10 | VERIFY_12 | VERIFY_16 | MODE_SENSE_6
        | MODE_SENSE_10 | SERVICE_ACTION_IN_16 | PRE_FETCH_10 | PRE_FETCH_16
        | READ_DEFECT_DATA_10 | READ_DEFECT_DATA_12 | RECEIVE_COPY_RESULTS => Access::Read,
        _ => Access::Write,
    }
}

/// The reservation check made before a command runs: RESERVATION CONFLICT
/// (`Err(Fail::Conflict)`) when an SPC-2 or persistent reservation held
/// through another nexus forbids it.
pub(crate) fn check_access(st: &LuState, nexus: &NexusKey, cdb: &[u8]) -> Result<(), Fail> {
    use opcode::*;
    let op = cdb.first().copied().unwrap_or(0xFF);
    // SPC-3 §5.6.3: with any registration, RESERVE and RELEASE conflict.
    if matches!(op, RESERVE_6 | RESERVE_10 | RELEASE_6 | RELEASE_10)
        && !st.pr.registrations.is_empty()
    {
        return Err(Fail::Conflict);
    }
    if let Some(holder) = &st.spc2
        && holder != nexus
    {
        // SPC-2 §5.5.1: everything but these conflicts.
        let allowed = matches!(
            op,
            INQUIRY
                | REPORT_LUNS
                | REQUEST_SENSE
                | RELEASE_6
                | RELEASE_10
                | PERSISTENT_RESERVE_IN
                | MAINTENANCE_IN
        );
        return if allowed { Ok(()) } else { Err(Fail::Conflict) };
    }
    let Some(res) = &st.pr.reservation else {
        return Ok(());
    };
    if st.pr.is_holder(nexus) {
        return Ok(());
    }
    let registered = st.pr.registration(nexus).is_some();
    match access(cdb) {
        Access::Always => Ok(()),
        _ if registered && res.kind.registrants_have_access() => Ok(()),
        Access::Read if !res.kind.exclusive_access() => Ok(()),
        _ => Err(Fail::Conflict),
    }
}

/// RESERVE(6)/(10) (SPC-2 §7.21, §7.22): a logical unit reservation for
/// the nexus. Third-party and extent reservations are not supported.
/// `spc2` is the holder (changed here), `pr` the persistent reservation
/// state it must not overlap.
pub(crate) fn reserve(
    spc2: &mut Option<NexusKey>,
    pr: &PrState,
    nexus: &NexusKey,
    cdb: &[u8],
) -> Result<(), Fail> {
    let b1 = cdb::byte(cdb, 1)?;
    let bad = if cdb.first() == Some(&opcode::RESERVE_10) {
        // 3RDPTY (bit 4), LONGID (bit 1).
        b1 & 0x12 != 0
    } else {
        // Obsolete 3rdPty/extent bits.
        b1 & 0x1F != 0
    };
    if bad {
        return Err(Sense::INVALID_FIELD_IN_CDB.into());
    }
    match spc2 {
        Some(h) if h != nexus => Err(Fail::Conflict),
        _ if pr.reservation.is_some() => Err(Fail::Conflict),
        _ => {
            *spc2 = Some(nexus.clone());
            Ok(())
        }
    }
}

/// RELEASE(6)/(10) (SPC-2 §7.19, §7.20): releases the nexus's reservation;
/// from any other nexus it is a no-op with GOOD status.
pub(crate) fn release(
    spc2: &mut Option<NexusKey>,
    nexus: &NexusKey,
    cdb: &[u8],
) -> Result<(), Fail> {
    let b1 = cdb::byte(cdb, 1)?;
    let bad = if cdb.first() == Some(&opcode::RELEASE_10) {
        b1 & 0x12 != 0
    } else {
        b1 & 0x1F != 0
    };
    if bad {
        return Err(Sense::INVALID_FIELD_IN_CDB.into());
    }
    if spc2.as_ref() == Some(nexus) {
        *spc2 = None;
    }
    Ok(())
}

/// PERSISTENT RESERVE IN service actions.
const PRIN_READ_KEYS: u8 = 0x00;
const PRIN_READ_RESERVATION: u8 = 0x01;
const PRIN_REPORT_CAPABILITIES: u8 = 0x02;
const PRIN_READ_FULL_STATUS: u8 = 0x03;

/// PERSISTENT RESERVE IN (SPC-4 §6.15).
pub(crate) fn persistent_reserve_in(
    st: &LuState,
    cdb: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Fail> {
    let sa = cdb::byte(cdb, 1)? & 0x1F;
    let alloc = usize::from(cdb::be16(cdb, 7)?);
    let pr = &st.pr;
    let v = data_in;
    match sa {
        PRIN_READ_KEYS => {
            v.extend_from_slice(&pr.generation.to_be_bytes());
            let len = u32::try_from(pr.registrations.len() * 8).unwrap_or(u32::MAX);
            v.extend_from_slice(&len.to_be_bytes());
            for r in &pr.registrations {
                v.extend_from_slice(&r.res_key.to_be_bytes());
            }
        }
        PRIN_READ_RESERVATION => {
            v.extend_from_slice(&pr.generation.to_be_bytes());
            match &pr.reservation {
                None => v.extend_from_slice(&0u32.to_be_bytes()),
                Some(res) => {
                    v.extend_from_slice(&16u32.to_be_bytes());
                    // SPC-4 §6.15.3.3: an All Registrants reservation
                    // reports key 0.
                    let key = if res.kind.all_registrants() {
                        0
                    } else {
                        pr.registration(&res.holder).map_or(0, |r| r.res_key)
                    };
                    v.extend_from_slice(&key.to_be_bytes());
                    v.extend_from_slice(&[0, 0, 0, 0, 0, res.kind.code(), 0, 0]);
                }
            }
        }
        PRIN_REPORT_CAPABILITIES => {
            // Length 8; CRH 1 (SPC-3 §5.6.3 exceptions), SIP_C/ATP_C 0,
            // PTPL_C where the state lives in a cluster; TMV 1 with ALLOW
            // COMMANDS 0 and PTPL_A; every type in the mask.
            let ptpl_c = u8::from(st.ptpl_capable);
            let ptpl_a = u8::from(st.ptpl_capable && pr.aptpl);
            v.extend_from_slice(&[
                0x00,
                0x08,
                0x10 | ptpl_c,
                0x80 | ptpl_a,
                0xEA,
                0x01,
                0x00,
                0x00,
            ]);
        }
        PRIN_READ_FULL_STATUS => {
            v.extend_from_slice(&pr.generation.to_be_bytes());
            v.extend_from_slice(&[0, 0, 0, 0]);
            for r in &pr.registrations {
                let holder = pr.is_holder(&r.key);
                v.extend_from_slice(&r.res_key.to_be_bytes());
                v.extend_from_slice(&[0, 0, 0, 0]);
                v.push(u8::from(holder)); // ALL_TG_PT 0, R_HOLDER
                let scope_type = match (&pr.reservation, holder) {
                    (Some(res), true) => res.kind.code(),
                    _ => 0,
                };
                v.push(scope_type);
                v.extend_from_slice(&[0, 0, 0, 0]);
                v.extend_from_slice(&r.nexus.target_port.to_be_bytes());
                let tid = &r.nexus.transport_id;
                let tid_len = u32::try_from(tid.len()).unwrap_or(u32::MAX);
                v.extend_from_slice(&tid_len.to_be_bytes());
                v.extend_from_slice(tid);
            }
            let len = u32::try_from(v.len().saturating_sub(8)).unwrap_or(u32::MAX);
            if let Some(f) = v.get_mut(4..8) {
                f.copy_from_slice(&len.to_be_bytes());
            }
        }
        _ => return Err(Sense::INVALID_FIELD_IN_CDB.into()),
    }
    v.truncate(alloc);
    Ok(())
}

/// PERSISTENT RESERVE OUT service actions (SPC-4 Table 169).
const PROUT_REGISTER: u8 = 0x00;
const PROUT_RESERVE: u8 = 0x01;
const PROUT_RELEASE: u8 = 0x02;
const PROUT_CLEAR: u8 = 0x03;
const PROUT_PREEMPT: u8 = 0x04;
const PROUT_PREEMPT_AND_ABORT: u8 = 0x05;
const PROUT_REGISTER_AND_IGNORE: u8 = 0x06;
const PROUT_REGISTER_AND_MOVE: u8 = 0x07;

/// The PARAMETER LIST LENGTH of a PERSISTENT RESERVE OUT CDB.
pub fn prout_param_len(cdb: &[u8]) -> Result<u32, Sense> {
    cdb::be32(cdb, 5)
}

/// PERSISTENT RESERVE OUT (SPC-4 §6.16) on state kept in the LU's memory.
/// Returns the nexuses whose tasks PREEMPT AND ABORT asks the transport to
/// abort (empty otherwise).
pub(crate) fn persistent_reserve_out(
    st: &mut LuState,
    nexus: &Nexus,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<Vec<NexusKey>, Fail> {
    let out = prout(&mut st.pr, st.ptpl_capable, nexus, cdb, data_out)?;
    for (k, s) in out.uas {
        st.raise_for(&k, s);
    }
    Ok(out.aborted)
}

/// What a PERSISTENT RESERVE OUT did besides changing the state.
#[derive(Debug, Default)]
pub(crate) struct ProutOutcome {
    /// The nexuses whose tasks PREEMPT AND ABORT aborts.
    pub aborted: Vec<NexusKey>,
    /// Unit attentions to raise, per nexus.
    pub uas: Vec<(NexusKey, Sense)>,
}

/// PERSISTENT RESERVE OUT (SPC-4 §6.16) as a change of `pr`: on an error
/// `pr` may be half changed, so callers work on a copy (the cluster path)
/// or rely on the checks coming before any change (they do: every error
/// below is returned before the state is touched). `ptpl_capable`: APTPL
/// may be set (PTPL_C=1).
pub(crate) fn prout(
    pr: &mut PrState,
    ptpl_capable: bool,
    nexus: &Nexus,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<ProutOutcome, Fail> {
    let sa = cdb::byte(cdb, 1)? & 0x1F;
    let b2 = cdb::byte(cdb, 2)?;
    let (scope, type_code) = (b2 >> 4, b2 & 0x0F);
    let param_len = usize::try_from(prout_param_len(cdb)?).unwrap_or(usize::MAX);
    if sa > PROUT_REGISTER_AND_MOVE {
        return Err(Sense::INVALID_FIELD_IN_CDB.into());
    }
    // SPC-4 §6.16.3: 24 bytes, except REGISTER AND MOVE (and SPEC_I_PT,
    // which is not supported).
    let len_ok = if sa == PROUT_REGISTER_AND_MOVE {
        param_len >= 24
    } else {
        param_len == 24
    };
    if !len_ok {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR.into());
    }
    let params = data_out
        .get(..param_len)
        .ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?;
    let be64 = |at: usize| cdb::be64(params, at).map_err(|_| Sense::PARAMETER_LIST_LENGTH_ERROR);
    let res_key = be64(0)?;
    let sa_key = be64(8)?;
    // SPEC_I_PT/ALL_TG_PT/APTPL in byte 20; REGISTER AND MOVE has
    // UNREG/APTPL in byte 17 (SPC-4 Table 176).
    let flag_byte = if sa == PROUT_REGISTER_AND_MOVE {
        17
    } else {
        20
    };
    let flags = params.get(flag_byte).copied().unwrap_or(0);
    let me = nexus.key().clone();
    let registers = matches!(sa, PROUT_REGISTER | PROUT_REGISTER_AND_IGNORE);
    // SPC-4 §6.16.3: APTPL counts only for the REGISTER service actions
    // and REGISTER AND MOVE and is ignored by the others; where it cannot
    // be honoured, APTPL=1 is refused.
    let aptpl = flags & 0x01 != 0;
    if aptpl && !ptpl_capable && (registers || sa == PROUT_REGISTER_AND_MOVE) {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.into());
    }
    if sa != PROUT_REGISTER_AND_MOVE {
        // SPEC_I_PT (bit 3), ALL_TG_PT (bit 2); APTPL (bit 0) where it
        // cannot be honoured (kept from before APTPL existed here).
        let refused = if ptpl_capable { 0x0C } else { 0x0D };
        if flags & refused != 0 {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.into());
        }
    }
    let needs_type = matches!(
        sa,
        PROUT_RESERVE | PROUT_RELEASE | PROUT_PREEMPT | PROUT_PREEMPT_AND_ABORT
    ) || sa == PROUT_REGISTER_AND_MOVE;
    let kind = if needs_type {
        if scope != 0 {
            return Err(Sense::INVALID_FIELD_IN_CDB.into());
        }
        PrType::from_code(type_code)
    } else {
        None
    };
    let mut aborted = Vec::new();
    let mut uas: Vec<(NexusKey, Sense)> = Vec::new();
    match sa {
        PROUT_REGISTER | PROUT_REGISTER_AND_IGNORE => {
            let ignore = sa == PROUT_REGISTER_AND_IGNORE;
            match pr.registrations.iter().position(|r| r.key == me) {
                None => {
                    if !ignore && res_key != 0 {
                        return Err(Fail::Conflict);
                    }
                    if sa_key != 0 {
                        if pr.registrations.len() >= MAX_REGISTRATIONS {
                            return Err(Sense::new(
                                iscsi_sense::SenseKey::IllegalRequest,
                                Asc::INSUFFICIENT_REGISTRATION_RESOURCES,
                            )
                            .into());
                        }
                        pr.registrations.push(Registration {
                            nexus: nexus.clone(),
                            key: me.clone(),
                            res_key: sa_key,
                        });
                        pr.aptpl = aptpl;
                        pr.bump();
                    }
                }
                Some(i) => {
                    let current = pr.registrations.get(i).map_or(0, |r| r.res_key);
                    if !ignore && res_key != current {
                        return Err(Fail::Conflict);
                    }
                    if sa_key == 0 {
                        unregister(pr, &me, &mut uas);
                    } else if let Some(r) = pr.registrations.get_mut(i) {
                        r.res_key = sa_key;
                    }
                    pr.aptpl = aptpl;
                    pr.bump();
                }
            }
        }
        PROUT_RESERVE => {
            check_key(pr, &me, res_key)?;
            let kind = kind.ok_or(Sense::INVALID_FIELD_IN_CDB)?;
            match &pr.reservation {
                Some(r) if pr.is_holder(&me) && r.kind == kind => {}
                Some(_) => return Err(Fail::Conflict),
                None => {
                    pr.reservation = Some(Reservation {
                        holder: me.clone(),
                        kind,
                    })
                }
            }
        }
        PROUT_RELEASE => {
            check_key(pr, &me, res_key)?;
            if let Some(r) = pr.reservation.clone()
                && pr.is_holder(&me)
            {
                if Some(r.kind) != kind {
                    return Err(Sense::new(
                        iscsi_sense::SenseKey::IllegalRequest,
                        Asc::INVALID_RELEASE_OF_PR,
                    )
                    .into());
                }
                pr.reservation = None;
                if r.kind.registrants_have_access() {
                    for k in pr.registered_keys() {
                        if k != me {
                            uas.push((k, Sense::unit_attention(Asc::RESERVATIONS_RELEASED)));
                        }
                    }
                }
            }
        }
        PROUT_CLEAR => {
            check_key(pr, &me, res_key)?;
            for k in pr.registered_keys() {
                if k != me {
                    uas.push((k, Sense::unit_attention(Asc::RESERVATIONS_PREEMPTED)));
                }
            }
            pr.registrations.clear();
            pr.reservation = None;
            pr.bump();
        }
        PROUT_PREEMPT | PROUT_PREEMPT_AND_ABORT => {
            check_key(pr, &me, res_key)?;
            let removed = preempt(pr, &me, sa_key, kind, &mut uas)?;
            if sa == PROUT_PREEMPT_AND_ABORT {
                aborted = removed;
            }
            pr.bump();
        }
        _ => {
            // REGISTER AND MOVE (SPC-4 §5.12.8).
            check_key(pr, &me, res_key)?;
            let unreg = flags & 0x02 != 0;
            let Some(res) = pr.reservation.clone() else {
                return Err(Fail::Conflict);
            };
            if res.kind.all_registrants() || res.holder != me {
                return Err(Fail::Conflict);
            }
            let kind = kind.ok_or(Sense::INVALID_FIELD_IN_CDB)?;
            if sa_key == 0 {
                return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.into());
            }
            let rtp = cdb::be16(params, 18).map_err(|_| Sense::PARAMETER_LIST_LENGTH_ERROR)?;
            let tid_len = usize::try_from(
                cdb::be32(params, 20).map_err(|_| Sense::PARAMETER_LIST_LENGTH_ERROR)?,
            )
            .unwrap_or(usize::MAX);
            let tid = params
                .get(24..)
                .and_then(|p| p.get(..tid_len))
                .ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?;
            let (port, used) = parse_iscsi_transport_id(tid)?;
            let tid = tid.get(..used).unwrap_or_default().to_vec();
            let dest = Nexus::new(port, rtp, tid);
            let dest_key = dest.key().clone();
            if dest_key == me {
                return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.into());
            }
            match pr.registrations.iter_mut().find(|r| r.key == dest_key) {
                Some(r) => r.res_key = sa_key,
                None => {
                    if pr.registrations.len() >= MAX_REGISTRATIONS {
                        return Err(Sense::new(
                            iscsi_sense::SenseKey::IllegalRequest,
                            Asc::INSUFFICIENT_REGISTRATION_RESOURCES,
                        )
                        .into());
                    }
                    pr.registrations.push(Registration {
                        nexus: dest,
                        key: dest_key.clone(),
                        res_key: sa_key,
                    });
                }
            }
            pr.reservation = Some(Reservation {
                holder: dest_key,
                kind,
            });
            if unreg {
                pr.registrations.retain(|r| r.key != me);
            }
            pr.aptpl = aptpl;
            pr.bump();
        }
    }
    Ok(ProutOutcome { aborted, uas })
}

/// RESERVATION CONFLICT unless `me` is registered with `res_key`.
fn check_key(pr: &PrState, me: &NexusKey, res_key: u64) -> Result<(), Fail> {
    match pr.registration(me) {
        Some(r) if r.res_key == res_key => Ok(()),
        _ => Err(Fail::Conflict),
    }
}

/// Removes `me`'s registration (REGISTER with key 0, SPC-4 §5.12.11.2.3):
/// a reservation it held alone is released, and under the Registrants
/// Only types the other registrants get RESERVATIONS RELEASED.
fn unregister(pr: &mut PrState, me: &NexusKey, uas: &mut Vec<(NexusKey, Sense)>) {
    let was_holder = pr.is_holder(me);
    pr.registrations.retain(|r| &r.key != me);
    let Some(res) = pr.reservation.clone() else {
        return;
    };
    let release = if res.kind.all_registrants() {
        pr.registrations.is_empty()
    } else {
        was_holder
    };
    if release {
        pr.reservation = None;
        if matches!(
            res.kind,
            PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
        ) {
            for k in pr.registered_keys() {
                uas.push((k, Sense::unit_attention(Asc::RESERVATIONS_RELEASED)));
            }
        }
    }
}

/// PREEMPT (SPC-4 §5.12.11.4): removes the registrations with `sa_key` and,
/// when they held the reservation, takes it over with `kind`. Returns the
/// nexuses whose registrations were removed.
fn preempt(
    pr: &mut PrState,
    me: &NexusKey,
    sa_key: u64,
    kind: Option<PrType>,
    uas: &mut Vec<(NexusKey, Sense)>,
) -> Result<Vec<NexusKey>, Fail> {
    let preempted_ua = Sense::unit_attention(Asc::REGISTRATIONS_PREEMPTED);
    let res = pr.reservation.clone();
    let takes_reservation = match &res {
        None => false,
        Some(r) if r.kind.all_registrants() => sa_key == 0,
        Some(r) => pr.registration(&r.holder).map(|h| h.res_key) == Some(sa_key),
    };
    if !takes_reservation {
        // Only registrations go (§5.12.11.4.3); key 0 is invalid here.
        if sa_key == 0 {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.into());
        }
        let removed: Vec<NexusKey> = pr
            .registrations
            .iter()
            .filter(|r| r.res_key == sa_key)
            .map(|r| r.key.clone())
            .collect();
        if removed.is_empty() {
            return Err(Fail::Conflict);
        }
        for k in &removed {
            if k != me {
                uas.push((k.clone(), preempted_ua));
            }
        }
        let holder_removed = res
            .as_ref()
            .is_some_and(|r| !r.kind.all_registrants() && removed.contains(&r.holder));
        pr.registrations
            .retain(|r| r.res_key != sa_key || &r.key == me);
        if holder_removed {
            pr.reservation = None;
        }
        return Ok(removed.into_iter().filter(|k| k != me).collect());
    }
    let kind = kind.ok_or(Sense::INVALID_FIELD_IN_CDB)?;
    let all = res.as_ref().is_some_and(|r| r.kind.all_registrants());
    // All Registrants with key 0: every other registration goes; otherwise
    // those with the holder's key (never our own).
    let removed: Vec<NexusKey> = pr
        .registrations
        .iter()
        .filter(|r| &r.key != me && (all || r.res_key == sa_key))
        .map(|r| r.key.clone())
        .collect();
    pr.registrations
        .retain(|r| &r.key == me || !removed.contains(&r.key));
    for k in &removed {
        uas.push((k.clone(), preempted_ua));
    }
    let changed = res
        .as_ref()
        .is_some_and(|r| r.kind != kind || r.holder != *me);
    if changed {
        for k in pr.registered_keys() {
            if &k != me {
                uas.push((k, Sense::unit_attention(Asc::RESERVATIONS_RELEASED)));
            }
        }
    }
    pr.reservation = Some(Reservation {
        holder: me.clone(),
        kind,
    });
    Ok(removed)
}
