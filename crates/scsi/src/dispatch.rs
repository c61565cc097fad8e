//! One SCSI command on the LU it addresses, in three steps:
//!
//! 1. **Checks** every command passes first (`check`): the
//!    unit attentions a resize or an ALUA change raised, then the
//!    nexus's unit attention, CONTROL byte, sanitize in progress,
//!    reservations, medium present, and the port's ALUA state.
//! 2. **Plan or run**: a READ or WRITE on a store with asynchronous I/O is
//!    checked here and handed back for the transport to run
//!    (`ScsiTarget::plan_io`, `planned.rs`); anything else runs on this
//!    thread.
//! 3. **The opcode table**: primary commands (SPC: inquiry, sense, mode,
//!    reservations, copy) and block commands (SBC: capacity, cache,
//!    provisioning, compare, verify, sanitize, READ and WRITE).
//!
//! The entry points (`execute`, `execute_lending`, `plan_io`) find the LU
//! in `run`; a LUN with none is answered by `dispatch_missing`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use crate::backstore::{AsyncIo, Lent};
use crate::data_out::DataOut;
use crate::lu::{self, LogicalUnit};
use crate::lun::decode_lun;
use crate::nexus::{Nexus, NexusKey};
use crate::outcome::{CommandOutcome, status};
use crate::planned::{PlanSlot, Planned, PlannedIo};
use crate::pr::Fail;
use crate::target::{LunTable, ScsiTarget, lun_numbers};
use crate::{alua, atomic, cdb, medium, mode, opcodes, pr, pr_shared, sanitize, sbc, spc};
use iscsi_sense::{Asc, FieldPointer, Sense};

/// A command addressed to an LU that exists, with what every step needs.
pub(crate) struct OnLu<'a> {
    /// The LU's number.
    pub number: u16,
    pub lu: &'a Arc<LogicalUnit>,
    /// The LU table the command started with (REPORT LUNS, EXTENDED COPY).
    pub table: &'a LunTable,
    pub nexus: &'a Nexus,
    pub key: &'a NexusKey,
    pub cdb: &'a [u8],
}

/// What the checks leave for the opcode table.
#[derive(Clone, Copy)]
struct Checked {
    op: u8,
    /// The LU's I/O epoch before any check: a write started in a later one
    /// was checked against a state that may be gone
    /// (`LogicalUnit::write_shared_at`).
    epoch: u64,
    /// The port whose ALUA state INQUIRY reports (LUs in a group only).
    alua_port: Option<u16>,
}

impl ScsiTarget {
    /// Executes `cdb` on `lun` (the 64-bit LUN field as the initiator sent
    /// it, peripheral or flat addressing) for the I_T nexus `nexus`.
    ///
    /// `data_out` holds the command's Data-Out bytes; the transport
    /// guarantees it is as long as [`command_info`](crate::cdb::command_info) said, and a shorter one
    /// ends in CHECK CONDITION (INVALID FIELD IN CDB or PARAMETER LIST
    /// LENGTH ERROR). On return `data_in` holds exactly the response data;
    /// the caller truncates it to the Expected Data Transfer Length and
    /// computes residuals. What it holds on entry is scratch: a READ
    /// overwrites those bytes in place instead of zeroing a fresh buffer
    /// first (a transport reuses one buffer from command to command), and
    /// no stale byte is ever returned.
    ///
    /// An unknown LUN answers INQUIRY with peripheral qualifier 3 / device
    /// type 0x1F, serves REPORT LUNS and REQUEST SENSE, and fails everything
    /// else with ILLEGAL REQUEST / LOGICAL UNIT NOT SUPPORTED.
    pub fn execute(
        &self,
        nexus: &Nexus,
        lun: u64,
        cdb: &[u8],
        data_out: &[u8],
        data_in: &mut Vec<u8>,
    ) -> CommandOutcome {
        self.run(
            nexus,
            lun,
            cdb,
            DataOut::Flat(data_out),
            data_in,
            None,
            None,
        )
    }

    /// [`ScsiTarget::execute`], except that a READ from a store that lends
    /// its memory ([`Backstore::lend`](crate::backstore::Backstore::lend)) returns its data as shared pieces
    /// in `lent`, in order: the transport sends them with no copy. Anything
    /// else fills `data_in` as `execute` does and leaves `lent` empty.
    ///
    /// `data_out` may come in pieces: a WRITE then hands them to
    /// [`Backstore::write_pieces`](crate::backstore::Backstore::write_pieces), which may keep whole pieces as its own
    /// memory (no copy) and leave other buffers in their place.
    ///
    /// When `lent` is not empty, `data_in` comes back as it went in:
    /// scratch whose bytes are NOT the data (old contents of a pooled
    /// buffer), returned whole so that its pool can hand it to a write
    /// without zeroing it again. Look at `lent` first.
    pub fn execute_lending(
        &self,
        nexus: &Nexus,
        lun: u64,
        cdb: &[u8],
        data_out: DataOut<'_>,
        data_in: &mut Vec<u8>,
        lent: &mut Vec<Lent>,
    ) -> CommandOutcome {
        lent.clear();
        let outcome = self.run(nexus, lun, cdb, data_out, data_in, Some(&mut *lent), None);
        if outcome.status != status::GOOD {
            lent.clear();
        }
        outcome
    }

    /// Checks a READ or WRITE(6/10/12/16) as [`ScsiTarget::execute`] would
    /// and, when it passes and its LU's store offers asynchronous I/O
    /// ([`Backstore::async_io`](crate::backstore::Backstore::async_io)), hands back the transfer for the caller to
    /// run ([`PlannedIo`]) instead of running it on this thread. Any other
    /// command, or a store without asynchronous I/O, is run here as
    /// `execute` runs it, with no data in: call this only for READ and
    /// WRITE on such a store.
    pub fn plan_io(&self, nexus: &Nexus, lun: u64, cdb: &[u8], data_out: DataOut<'_>) -> Planned {
        let mut plan = PlanSlot::Empty;
        let mut data_in = Vec::new();
        let outcome = self.run(
            nexus,
            lun,
            cdb,
            data_out,
            &mut data_in,
            None,
            Some(&mut plan),
        );
        match plan {
            _ if outcome.status != status::GOOD => Planned::Done(outcome),
            PlanSlot::Io(plan) => Planned::Io(plan),
            PlanSlot::Synchronous => Planned::Synchronous,
            PlanSlot::Empty => Planned::Done(outcome),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        nexus: &Nexus,
        lun: u64,
        cdb: &[u8],
        data_out: DataOut<'_>,
        data_in: &mut Vec<u8>,
        lent: Option<&mut Vec<Lent>>,
        plan: Option<&mut PlanSlot>,
    ) -> CommandOutcome {
        // A READ takes the buffer whole (sbc::read_write); every other
        // command builds its response from empty.
        if !cdb::is_read(cdb) {
            data_in.clear();
        }
        let key = nexus.key();
        let new_nexus = !self.nexuses.load().contains(key) && self.change_nexuses(key, true);
        // One load per command: the LU a command starts on is the one it
        // ends on, whatever a reload does meanwhile.
        let table = self.luns.load();
        if new_nexus && self.power_on_ua.load(Ordering::Relaxed) {
            for lu in table.iter().flatten() {
                lu.state().raise_for(key, Sense::POWER_ON_RESET);
            }
        }
        let number = decode_lun(lun);
        let lu = number.and_then(|n| Some((n, table.get(usize::from(n))?.as_ref()?)));
        let (result, descriptor) = match lu {
            Some((number, lu)) => {
                let command = OnLu {
                    number,
                    lu,
                    table: &table,
                    nexus,
                    key,
                    cdb,
                };
                let r = self.dispatch(&command, data_out, data_in, lent, plan);
                (r, lu.mode().d_sense)
            }
            None => (
                self.dispatch_missing(&table, cdb, data_in)
                    .map_err(Fail::Check),
                false,
            ),
        };
        match result {
            Ok(()) => CommandOutcome::GOOD,
            Err(Fail::Check(sense)) => {
                data_in.clear();
                CommandOutcome {
                    descriptor_sense: descriptor,
                    ..CommandOutcome::check_condition(sense)
                }
            }
            Err(Fail::Conflict) => {
                data_in.clear();
                CommandOutcome::RESERVATION_CONFLICT
            }
            Err(Fail::Busy) => {
                data_in.clear();
                CommandOutcome::BUSY
            }
        }
    }

    /// Runs `command`: checks, then plans (when `plan` is given and the
    /// store has asynchronous I/O) or runs it.
    pub(crate) fn dispatch(
        &self,
        command: &OnLu<'_>,
        data_out: DataOut<'_>,
        data_in: &mut Vec<u8>,
        lent: Option<&mut Vec<Lent>>,
        plan: Option<&mut PlanSlot>,
    ) -> Result<(), Fail> {
        let checked = self.check(command)?;
        if let Some(plan) = plan
            && let Some(io) = command.lu.backstore.async_io()
            && cdb::parse_rw(command.cdb).is_some()
        {
            // Checked here, run by the caller (`ScsiTarget::plan_io`).
            return plan_read_write(command, checked, io, data_out.len(), plan);
        }
        self.primary(command, checked, data_out, data_in, lent)
    }

    /// The checks before any opcode runs.
    fn check(&self, command: &OnLu<'_>) -> Result<Checked, Fail> {
        use cdb::opcode::*;
        let OnLu {
            lu,
            nexus,
            key,
            cdb,
            ..
        } = *command;
        let op = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
        if !opcodes::is_supported(cdb) {
            return Err(Sense::INVALID_OPCODE.into());
        }
        // Before any check (see `Checked::epoch`).
        let epoch = lu.io_epoch();
        if lu.backstore.take_capacity_change() {
            // The medium was resized under the LU (`rbd resize`): every
            // nexus hears of it, this command's first (SBC-4 §4.14).
            let nexuses = self.known_nexuses();
            lu.state().raise_for_all(
                &nexuses,
                None,
                Sense::unit_attention(Asc::CAPACITY_DATA_HAS_CHANGED),
            );
        }
        if lu.alua_changed() {
            // The owner moved (or the group changed): every nexus of the
            // LU hears it once (SPC-4 §5.16.2.6), this one included.
            let nexuses = self.known_nexuses();
            lu.state()
                .raise_for_all(&nexuses, None, alua::STATE_CHANGED);
        }
        if lu.is_quiet() && !matches!(op, RESERVE_6 | RESERVE_10 | RELEASE_6 | RELEASE_10) {
            // Nothing pending and nothing reserved: the state would say
            // yes, so it is not locked (a unit attention raised meanwhile
            // is for the commands after this one).
            cdb::check_control(cdb)?;
        } else {
            let mut st = lu.state();
            if !matches!(op, INQUIRY | REPORT_LUNS | REQUEST_SENSE)
                && let Some(ua) = st.take_ua(key)
            {
                return Err(ua.into());
            }
            cdb::check_control(cdb)?;
            st.sanitize.gate(cdb)?;
            pr::check_access(&st, key, cdb)?;
            if st.medium.ejected && !medium::runs_without_medium(op) {
                return Err(Sense::MEDIUM_NOT_PRESENT.into());
            }
        }
        // The access state of this nexus's port, after the unit attention
        // (which tells the host why the state it knew is gone).
        let alua_port = lu.alua.as_ref().map(|_| nexus.target_port);
        if let (Some(group), Some(port)) = (&lu.alua, alua_port) {
            alua::gate(group.state_of(port), cdb)?;
        }
        Ok(Checked {
            op,
            epoch,
            alua_port,
        })
    }

    /// Primary commands (SPC-4); any other opcode is a block command.
    fn primary(
        &self,
        command: &OnLu<'_>,
        checked: Checked,
        data_out: DataOut<'_>,
        data_in: &mut Vec<u8>,
        lent: Option<&mut Vec<Lent>>,
    ) -> Result<(), Fail> {
        use cdb::opcode::*;
        let OnLu {
            number,
            lu,
            table,
            key,
            cdb,
            ..
        } = *command;
        let bs = lu.backstore.as_ref();
        match checked.op {
            TEST_UNIT_READY => Ok(()),
            REQUEST_SENSE => {
                // A sanitize's progress (or failure) first: the unit
                // attention waits for when the LU is usable. Then, with
                // nothing pending, the LU's state, which without a medium
                // is NOT READY / MEDIUM NOT PRESENT (SPC-4 §6.39).
                let mut st = lu.state();
                let pending = st
                    .sanitize
                    .sense()
                    .or_else(|| st.take_ua(key))
                    .or_else(|| st.medium.ejected.then_some(Sense::MEDIUM_NOT_PRESENT));
                drop(st);
                Ok(spc::request_sense(cdb, pending, data_in)?)
            }
            INQUIRY => Ok(spc::inquiry(
                &self.identity,
                Some(spc::InquiredLu {
                    store: bs,
                    alua_port: checked.alua_port,
                    max_compare_blocks: pr_shared::max_compare_blocks(lu),
                }),
                cdb,
                data_in,
            )?),
            REPORT_LUNS => Ok(spc::report_luns(&lun_numbers(table), cdb, data_in)?),
            MODE_SENSE_6 | MODE_SENSE_10 => Ok(mode::mode_sense(bs, lu.mode(), cdb, data_in)?),
            MODE_SELECT_6 | MODE_SELECT_10 => self.mode_select(command, &data_out.flat()),
            RESERVE_6 | RESERVE_10 | RELEASE_6 | RELEASE_10 => {
                let reserve = matches!(checked.op, RESERVE_6 | RESERVE_10);
                match &lu.shared {
                    Some(store) => {
                        pr_shared::reserve_or_release(lu, store.as_ref(), key, cdb, reserve)
                    }
                    None => {
                        let st = &mut *lu.state();
                        if reserve {
                            pr::reserve(&mut st.spc2, &st.pr, key, cdb)
                        } else {
                            pr::release(&mut st.spc2, key, cdb)
                        }
                    }
                }
            }
            PERSISTENT_RESERVE_IN => {
                pr_shared::check_fresh(lu)?;
                pr::persistent_reserve_in(&lu.state(), cdb, data_in)
            }
            PERSISTENT_RESERVE_OUT => self.persistent_reserve_out(command, &data_out.flat()),
            MAINTENANCE_IN if alua::is_rtpg(cdb) && lu.alua.is_some() => {
                let view = lu.alua.as_ref().map(|g| g.view()).unwrap_or_default();
                Ok(alua::report_target_port_groups(&view, cdb, data_in)?)
            }
            MAINTENANCE_IN => Ok(opcodes::maintenance_in(
                cdb,
                opcodes::Offered {
                    exclusive: pr_shared::serves_alone(lu),
                    ..opcodes::Offered::of(bs)
                },
                data_in,
            )?),
            EXTENDED_COPY => self.extended_copy(number, table, key, cdb, &data_out.flat()),
            RECEIVE_COPY_RESULTS => {
                Ok(self.receive_copy_results(number, bs.block_size(), key, cdb, data_in)?)
            }
            _ => self.block(command, checked, data_out, data_in, lent),
        }
    }

    /// MODE SELECT: the new parameters, and MODE PARAMETERS CHANGED for
    /// every other nexus when they changed.
    fn mode_select(&self, command: &OnLu<'_>, data: &[u8]) -> Result<(), Fail> {
        let OnLu { lu, key, cdb, .. } = *command;
        let bs = lu.backstore.as_ref();
        let nexuses = self.known_nexuses();
        let select = |mode: &mut lu::ModeParams| Ok(mode::mode_select(bs, mode, cdb, data)?);
        let done = |st: &mut lu::LuState, changed: &bool| {
            if *changed {
                st.raise_for_all(
                    &nexuses,
                    Some(key),
                    Sense::unit_attention(Asc::MODE_PARAMETERS_CHANGED),
                );
            }
        };
        match &lu.shared {
            Some(store) => pr_shared::mode_select(lu, store.as_ref(), select, done),
            None => {
                let mut st = lu.state();
                let mut mode = st.mode;
                let changed = select(&mut mode)?;
                st.mode = mode;
                done(&mut st, &changed);
                Ok(())
            }
        }
    }

    /// PERSISTENT RESERVE OUT, and the tasks a PREEMPT AND ABORT ended
    /// handed to the transport's abort handler.
    fn persistent_reserve_out(&self, command: &OnLu<'_>, data: &[u8]) -> Result<(), Fail> {
        let OnLu {
            number,
            lu,
            nexus,
            cdb,
            ..
        } = *command;
        let aborted = match &lu.shared {
            Some(store) => pr_shared::persistent_reserve_out(lu, store.as_ref(), nexus, cdb, data)?,
            None => pr::persistent_reserve_out(&mut lu.state(), nexus, cdb, data)?,
        };
        if !aborted.is_empty() {
            let handler = self
                .abort_handler
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(h) = handler {
                h(number, &aborted);
            }
        }
        Ok(())
    }

    /// A command to an LUN with no LU: INQUIRY (peripheral qualifier 3),
    /// REPORT LUNS and REQUEST SENSE answer; everything else is LOGICAL
    /// UNIT NOT SUPPORTED.
    pub(crate) fn dispatch_missing(
        &self,
        table: &LunTable,
        cdb: &[u8],
        data_in: &mut Vec<u8>,
    ) -> Result<(), Sense> {
        use cdb::opcode::*;
        let op = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
        match op {
            INQUIRY => {
                cdb::check_control(cdb)?;
                spc::inquiry(&self.identity, None, cdb, data_in)
            }
            REPORT_LUNS => {
                cdb::check_control(cdb)?;
                spc::report_luns(&lun_numbers(table), cdb, data_in)
            }
            REQUEST_SENSE => {
                cdb::check_control(cdb)?;
                spc::request_sense(cdb, Some(Sense::LUN_NOT_SUPPORTED), data_in)
            }
            _ => Err(Sense::LUN_NOT_SUPPORTED),
        }
    }
}

/// A READ or WRITE on a store with asynchronous I/O, checked and handed
/// back in `plan`; a write that finds COMPARE AND WRITE's exclusive lock
/// held goes the synchronous way rather than wait on the async runtime.
fn plan_read_write(
    command: &OnLu<'_>,
    checked: Checked,
    io: Arc<dyn AsyncIo>,
    data_out_len: usize,
    plan: &mut PlanSlot,
) -> Result<(), Fail> {
    let lu = command.lu;
    let bs = lu.backstore.as_ref();
    let Some(transfer) = sbc::plan_read_write(bs, lu.io_mode(), command.cdb, data_out_len)? else {
        return Ok(());
    };
    let permit = match transfer.write {
        false => None,
        true => match lu.write_async() {
            // Checked in this epoch, started in it too. One checked before
            // a rejoin moved the epoch is asked for again (BUSY): its
            // retry is checked against the state the rejoin brought.
            Some(permit) if lu.io_epoch() == checked.epoch => Some(permit),
            Some(_) => return Err(Fail::Busy),
            None => {
                *plan = PlanSlot::Synchronous;
                return Ok(());
            }
        },
    };
    *plan = PlanSlot::Io(PlannedIo::new(transfer, io, permit, lu.mode().d_sense));
    Ok(())
}

impl ScsiTarget {
    /// Block commands (SBC-4), READ and WRITE among them.
    fn block(
        &self,
        command: &OnLu<'_>,
        checked: Checked,
        data_out: DataOut<'_>,
        data_in: &mut Vec<u8>,
        lent: Option<&mut Vec<Lent>>,
    ) -> Result<(), Fail> {
        use cdb::opcode::*;
        let OnLu { lu, key, cdb, .. } = *command;
        let bs = lu.backstore.as_ref();
        let epoch = checked.epoch;
        // What the commands that write see: SWP set for a read-only LU, so
        // that each refuses its write where it checks SWP.
        let mode = lu.io_mode();
        match checked.op {
            READ_CAPACITY_10 => Ok(sbc::read_capacity_10(bs, cdb, data_in)?),
            SERVICE_ACTION_IN_16 => Ok(sbc::service_action_in_16(bs, cdb, data_in)?),
            SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => Ok(sbc::synchronize_cache(bs, cdb)?),
            START_STOP_UNIT => {
                // LOEJ loads and ejects only a removable medium; a fixed
                // one ignores it.
                let action = sbc::start_stop_unit(bs, cdb)?;
                if let Some(action) = action.filter(|_| lu.options.removable) {
                    let nexuses = self.known_nexuses();
                    let mut st = lu.state();
                    // A medium loaded: NOT READY TO READY CHANGE for every
                    // other nexus (the medium may have changed); the one that loaded it
                    // knows, as with MODE SELECT's unit attention.
                    if st.medium.load_eject(action)? {
                        st.raise_for_all(&nexuses, Some(key), Sense::MEDIUM_MAY_HAVE_CHANGED);
                    }
                }
                Ok(())
            }
            PREVENT_ALLOW_MEDIUM_REMOVAL => {
                let prevent = sbc::prevent_allow(cdb)?;
                if lu.options.removable {
                    lu.state().medium.prevent(key, prevent);
                }
                Ok(())
            }
            // Logical block provisioning (SBC-3 4.7) is only offered by
            // thin stores (LBPME=1): on a fully provisioned one UNMAP does
            // not exist, as VPD B2 says.
            UNMAP if !bs.is_thin() => Err(Sense::INVALID_OPCODE.into()),
            UNMAP => {
                let _w = lu.write_shared_at(epoch)?;
                Ok(sbc::unmap(bs, mode, cdb, &data_out.flat())?)
            }
            WRITE_SAME_10 | WRITE_SAME_16 => {
                let _w = lu.write_shared_at(epoch)?;
                Ok(sbc::write_same(bs, mode, cdb, &data_out.flat())?)
            }
            COMPARE_AND_WRITE => {
                // Atomic against every other write: in the store when it
                // compares in one step, else under the LU's lock, which
                // holds across gateways only when no other serves the LU.
                let _w = match sbc::compares_in_one_step(bs, cdb) {
                    true => lu.write_exclusive_at(epoch)?,
                    // Beyond Block Limits' MAXIMUM COMPARE AND WRITE LENGTH.
                    false => pr_shared::exclusive_alone(
                        lu,
                        epoch,
                        "COMPARE AND WRITE",
                        Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(13, None)),
                    )?,
                };
                Ok(sbc::compare_and_write(bs, mode, cdb, &data_out.flat())?)
            }
            ORWRITE_16 => {
                // Read-modify-write: atomic against every other write.
                // Not offered while other gateways serve the LU (see
                // `opcodes::Offered::exclusive`).
                let _w = pr_shared::exclusive_alone(lu, epoch, "ORWRITE", Sense::INVALID_OPCODE)?;
                Ok(sbc::orwrite(bs, mode, cdb, &data_out.flat())?)
            }
            PRE_FETCH_10 | PRE_FETCH_16 => Ok(sbc::pre_fetch(bs, cdb)?),
            READ_DEFECT_DATA_10 | READ_DEFECT_DATA_12 => Ok(sbc::read_defect_data(cdb, data_in)?),
            VERIFY_10 | VERIFY_12 | VERIFY_16 => Ok(sbc::verify(bs, cdb, &data_out.flat())?),
            WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12 | WRITE_AND_VERIFY_16 => {
                let _w = lu.write_shared_at(epoch)?;
                Ok(sbc::write_and_verify(bs, mode, cdb, &data_out.flat())?)
            }
            WRITE_ATOMIC_16 => {
                let _w = lu.write_shared_at(epoch)?;
                Ok(atomic::write_atomic_16(bs, mode, cdb, data_out)?)
            }
            SANITIZE => Ok(sanitize::sanitize(lu, cdb, &data_out.flat())?),
            WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 => {
                let _w = lu.write_shared_at(epoch)?;
                Ok(sbc::read_write(bs, mode, cdb, data_out, data_in, None)?)
            }
            _ => Ok(sbc::read_write(bs, mode, cdb, data_out, data_in, lent)?),
        }
    }
}
