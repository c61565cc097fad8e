//! Third-party copy inside the target: EXTENDED COPY (LID1, SPC-4 §6.4 /
//! SPC-3 §6.3) with block device to block device segments between LUs of
//! one target, and RECEIVE COPY RESULTS (SPC-4 §6.18 / SPC-3 §6.17):
//! OPERATING PARAMETERS and COPY STATUS.
//!
//! The safety rule (Linux's CVE-2020-28374: its copy manager looked LUs up
//! across every target on the host, so an initiator could read or write
//! any backstore): a copy reaches only the LUs of the [`ScsiTarget`] the
//! command came to, which are exactly the LUs its I_T nexus may address.
//! A CSCD descriptor's designator is looked up among that target's LUs as
//! they are when the command runs, and each LU is looked up again between
//! pieces of the copy, so one removed meanwhile ends the copy. Each LU a
//! copy reads or writes is checked as a READ or WRITE from the issuing
//! nexus would be: reservations (RESERVATION CONFLICT) and software write
//! protection (DATA PROTECT).
//!
//! The bytes move through [`Backstore::copy_from`]: the kernel's
//! `copy_file_range` between file stores, lent RAM chunks, else a bounded
//! buffer; never more than [`COPY_PIECE`] at once.

pub mod parse;

use std::sync::Arc;

use crate::backstore::{Backstore, COPY_PIECE};
use crate::cdb;
use crate::lu::LogicalUnit;
use crate::nexus::NexusKey;
use crate::pr::{self, Fail};
use crate::target::{LunTable, ScsiTarget};
use iscsi_sense::{Asc, FieldPointer, Sense, SenseKey};

use crate::xcopy_state::CopyStatus;
pub use parse::{
    Designation, ListIdUsage, MAX_CSCD_DESCRIPTORS, MAX_DESCRIPTOR_LIST_LEN,
    MAX_SEGMENT_DESCRIPTORS, ParameterList, Segment, UNREACHABLE,
};

/// EXTENDED COPY service action: LID1 (the only one implemented; LID4 is
/// INVALID FIELD IN CDB).
pub const SA_EXTENDED_COPY_LID1: u8 = 0x00;
/// RECEIVE COPY RESULTS service action: COPY STATUS.
pub const SA_COPY_STATUS: u8 = 0x00;
/// RECEIVE COPY RESULTS service action: OPERATING PARAMETERS.
pub const SA_OPERATING_PARAMETERS: u8 = 0x03;
/// MAXIMUM SEGMENT LENGTH in bytes (what Linux's target reports).
pub const MAX_SEGMENT_LEN: u32 = 256 << 20;
/// COPY ABORTED / UNREACHABLE COPY TARGET: a store failed mid-copy.
const IO_FAILED: Sense = Sense::new(SenseKey::CopyAborted, Asc::UNREACHABLE_COPY_TARGET);

/// A CSCD descriptor resolved to one of the target's LUs.
#[derive(Clone)]
struct Resolved {
    number: u16,
    lu: Arc<LogicalUnit>,
}

/// READ(16) and WRITE(16) CDBs with nothing set: what a copy's read and
/// write are checked as against reservations.
const AS_READ: [u8; 16] = {
    let mut c = [0u8; 16];
    c[0] = cdb::opcode::READ_16;
    c
};
const AS_WRITE: [u8; 16] = {
    let mut c = [0u8; 16];
    c[0] = cdb::opcode::WRITE_16;
    c
};

impl ScsiTarget {
    /// EXTENDED COPY (LID1) sent to LU `number` by `key`: parsed whole,
    /// every CSCD resolved among `table` (this target's LUs), every segment
    /// checked (ranges, lengths, reservations, write protection) before any
    /// byte moves; then the segments run in order.
    pub(crate) fn extended_copy(
        &self,
        number: u16,
        table: &LunTable,
        key: &NexusKey,
        cdb: &[u8],
        data: &[u8],
    ) -> Result<(), Fail> {
        if cdb::byte(cdb, 1)? & 0x1F != SA_EXTENDED_COPY_LID1 {
            return Err(Sense::INVALID_FIELD_IN_CDB
                .with_field_pointer(FieldPointer::cdb(1, Some(4)))
                .into());
        }
        let len = usize::try_from(cdb::be32(cdb, 10)?).unwrap_or(usize::MAX);
        let Some(data) = data.get(..len) else {
            return Err(Sense::PARAMETER_LIST_LENGTH_ERROR.into());
        };
        let Some(list) = parse::parse(data)? else {
            return Ok(());
        };
        let cscds = list
            .cscds
            .iter()
            .map(|d| resolve(table, self.identity.naa_company_id, d))
            .collect::<Result<Vec<_>, _>>()?;
        let plan = list
            .segments
            .iter()
            .map(|s| plan_segment(&cscds, s))
            .collect::<Result<Vec<_>, _>>()?;
        for step in &plan {
            check_access(&step.src.lu, key, &AS_READ)?;
            check_access(&step.dst.lu, key, &AS_WRITE)?;
            if step.dst.lu.io_mode().swp {
                return Err(Sense::WRITE_PROTECTED.into());
            }
        }
        let _running = match list.usage {
            ListIdUsage::None => None,
            _ => Some(self.start_list(key, number, list.list_id)?),
        };
        let mut status = CopyStatus {
            list_id: list.list_id,
            ok: true,
            segments: 0,
            bytes: 0,
        };
        let mut result = Ok(());
        for step in &plan {
            match self.run_segment(step, &mut status.bytes) {
                Ok(()) => status.segments += 1,
                Err(e) => {
                    status.ok = false;
                    result = Err(e.into());
                    break;
                }
            }
        }
        if list.usage == ListIdUsage::Hold {
            self.copies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .keep(key, number, status);
        }
        result
    }

    /// Marks list `id` of `key` on LU `number` running until the guard
    /// drops; OPERATION IN PROGRESS if it already is.
    fn start_list(&self, key: &NexusKey, number: u16, id: u8) -> Result<Running<'_>, Sense> {
        let entry = (key.clone(), number, id);
        let mut held = self
            .copies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !held.running.insert(entry.clone()) {
            return Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::OPERATION_IN_PROGRESS,
            ));
        }
        Ok(Running {
            target: self,
            entry,
        })
    }

    /// Whether LU `r` is still LU `r.number` of this target: a copy stops
    /// when an LU it uses is removed (or replaced) mid-copy.
    fn still_there(&self, r: &Resolved) -> bool {
        self.luns
            .load()
            .get(usize::from(r.number))
            .and_then(Option::as_ref)
            .is_some_and(|lu| Arc::ptr_eq(lu, &r.lu))
    }

    /// Copies one planned segment, [`COPY_PIECE`] at a time, backwards when
    /// the destination overlaps the source from above within one LU.
    fn run_segment(&self, step: &Step, copied: &mut u64) -> Result<(), Sense> {
        let _write = step.dst.lu.write_shared();
        let (src, dst) = (
            step.src.lu.backstore.as_ref(),
            step.dst.lu.backstore.as_ref(),
        );
        let piece = COPY_PIECE as u64;
        let pieces = step.len.div_ceil(piece);
        let backwards = Arc::ptr_eq(&step.src.lu, &step.dst.lu)
            && step.dst_offset > step.src_offset
            && step.dst_offset < step.src_offset + step.len;
        for i in 0..pieces {
            let i = if backwards { pieces - 1 - i } else { i };
            let at = i * piece;
            let n = (step.len - at).min(piece);
            if !self.still_there(&step.src) || !self.still_there(&step.dst) {
                return Err(UNREACHABLE);
            }
            let (from, to) = (step.src_offset + at, step.dst_offset + at);
            if backwards && to < from + n {
                // The piece overlaps itself: through a buffer of its own.
                copy_overlapping(src, from, to, n).map_err(|_| IO_FAILED)?;
            } else {
                dst.copy_from(src, from, to, n).map_err(|_| IO_FAILED)?;
            }
            *copied += n;
        }
        if !step.dst.lu.mode().wce {
            dst.flush().map_err(|_| IO_FAILED)?;
        }
        Ok(())
    }

    /// RECEIVE COPY RESULTS sent to LU `number` by `key`.
    pub(crate) fn receive_copy_results(
        &self,
        number: u16,
        block_size: u32,
        key: &NexusKey,
        cdb: &[u8],
        data_in: &mut Vec<u8>,
    ) -> Result<(), Sense> {
        let sa = cdb::byte(cdb, 1)? & 0x1F;
        let list_id = cdb::byte(cdb, 2)?;
        let alloc = usize::try_from(cdb::be32(cdb, 10)?).unwrap_or(usize::MAX);
        match sa {
            SA_OPERATING_PARAMETERS => operating_parameters(block_size, data_in),
            SA_COPY_STATUS => {
                let held = self
                    .copies
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .find(key, number, list_id);
                let Some(s) = held else {
                    // No copy with that list identifier from this nexus.
                    return Err(
                        Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(2, None))
                    );
                };
                copy_status(s, data_in);
            }
            _ => {
                return Err(
                    Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(1, Some(4)))
                );
            }
        }
        data_in.truncate(alloc);
        Ok(())
    }
}

/// A list identifier in use while a copy runs (see [`ScsiTarget::start_list`]).
struct Running<'a> {
    target: &'a ScsiTarget,
    entry: (NexusKey, u16, u8),
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.target
            .copies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .running
            .remove(&self.entry);
    }
}

/// One segment ready to run: byte ranges on two resolved LUs.
struct Step {
    src: Resolved,
    dst: Resolved,
    src_offset: u64,
    dst_offset: u64,
    len: u64,
}

/// The LU of `table` that `d` names, by the NAA designator VPD page 83h
/// reports for it; COPY TARGET DEVICE NOT REACHABLE for any other.
fn resolve(table: &LunTable, company_id: u32, d: &Designation) -> Result<Resolved, Sense> {
    let Designation::Naa(c) = d else {
        return Err(UNREACHABLE);
    };
    let (number, lu) = (0u16..)
        .zip(table.iter())
        .find_map(|(n, lu)| {
            let lu = lu.as_ref()?;
            (crate::spc::naa_designator(company_id, lu.backstore.unique_id()) == c.naa)
                .then_some((n, lu))
        })
        .ok_or(UNREACHABLE)?;
    if c.block_length != lu.backstore.block_size() {
        // The initiator counts in blocks of another length than the LU's.
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST
            .with_field_pointer(FieldPointer::param(c.at.saturating_add(29), None)));
    }
    Ok(Resolved {
        number,
        lu: Arc::clone(lu),
    })
}

/// A segment's byte ranges, checked against both LUs' capacities and
/// [`MAX_SEGMENT_LEN`].
fn plan_segment(cscds: &[Resolved], s: &Segment) -> Result<Step, Sense> {
    let (Some(src), Some(dst)) = (cscds.get(usize::from(s.src)), cscds.get(usize::from(s.dst)))
    else {
        return Err(UNREACHABLE);
    };
    let (sbs, dbs) = (
        u64::from(src.lu.backstore.block_size()),
        u64::from(dst.lu.backstore.block_size()),
    );
    let unit = if s.dc { dbs } else { sbs };
    let len = u64::from(s.blocks) * unit;
    let blocks_field = FieldPointer::param(s.at.saturating_add(10), None);
    if len > u64::from(MAX_SEGMENT_LEN) || len % sbs != 0 || len % dbs != 0 {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.with_field_pointer(blocks_field));
    }
    let in_range = |lba: u64, bs: u64, lu: &dyn Backstore| {
        lba.checked_add(len / bs)
            .is_some_and(|end| end <= lu.block_count())
    };
    if !in_range(s.src_lba, sbs, src.lu.backstore.as_ref())
        || !in_range(s.dst_lba, dbs, dst.lu.backstore.as_ref())
    {
        // Past the end of a copy target: what libiscsi's suite and Linux's
        // target expect is COPY ABORTED, the copy target unreachable there.
        return Err(UNREACHABLE);
    }
    Ok(Step {
        src: src.clone(),
        dst: dst.clone(),
        src_offset: s.src_lba * sbs,
        dst_offset: s.dst_lba * dbs,
        len,
    })
}

/// The checks a READ or WRITE (`as_cdb`) from `key` to `lu` would meet:
/// a sanitize running or failed there (NOT READY / MEDIUM ERROR, as the
/// command itself would get), then reservations.
fn check_access(lu: &LogicalUnit, key: &NexusKey, as_cdb: &[u8]) -> Result<(), Fail> {
    if lu.is_quiet() {
        return Ok(());
    }
    let state = lu.state();
    state.sanitize.gate(as_cdb)?;
    pr::check_access(&state, key, as_cdb)
}

/// Copies `n` bytes within one store from `from` to `to` when the two
/// ranges overlap: read whole, then written (`n` is at most one piece).
fn copy_overlapping(store: &dyn Backstore, from: u64, to: u64, n: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
    store.read_at(from, &mut buf)?;
    store.write_at(to, &buf)
}

/// The OPERATING PARAMETERS data (SPC-3 Table 120, SPC-4 §6.18.4).
fn operating_parameters(block_size: u32, v: &mut Vec<u8>) {
    let granularity = u8::try_from(block_size.max(1).trailing_zeros()).unwrap_or(9);
    let implemented = [parse::SEGMENT_BLOCK_TO_BLOCK, parse::CSCD_IDENTIFICATION];
    v.extend_from_slice(&[0; 4]); // AVAILABLE DATA, below
    v.push(0x01); // SNLID: LIST ID USAGE 11b accepted
    v.extend_from_slice(&[0; 3]);
    v.extend_from_slice(&MAX_CSCD_DESCRIPTORS.to_be_bytes());
    v.extend_from_slice(&MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    v.extend_from_slice(&MAX_DESCRIPTOR_LIST_LEN.to_be_bytes());
    v.extend_from_slice(&MAX_SEGMENT_LEN.to_be_bytes());
    v.extend_from_slice(&0u32.to_be_bytes()); // MAXIMUM INLINE DATA LENGTH
    v.extend_from_slice(&0u32.to_be_bytes()); // HELD DATA LIMIT
    v.extend_from_slice(&0u32.to_be_bytes()); // MAXIMUM STREAM DEVICE TRANSFER SIZE
    v.extend_from_slice(&[0; 2]);
    v.extend_from_slice(&1u16.to_be_bytes()); // TOTAL CONCURRENT COPIES
    v.push(1); // MAXIMUM CONCURRENT COPIES
    v.push(granularity); // DATA SEGMENT GRANULARITY (log2)
    v.push(0); // INLINE DATA GRANULARITY
    v.push(0); // HELD DATA GRANULARITY
    v.extend_from_slice(&[0; 3]);
    v.push(implemented.len() as u8);
    v.extend_from_slice(&implemented);
    let available = u32::try_from(v.len() - 4).unwrap_or(0);
    v[..4].copy_from_slice(&available.to_be_bytes());
}

/// The COPY STATUS data (SPC-3 Table 118).
fn copy_status(s: CopyStatus, v: &mut Vec<u8>) {
    // TRANSFER COUNT UNITS: bytes while they fit 32 bits, else KiB, MiB...
    let (mut units, mut count) = (0u8, s.bytes);
    while count > u64::from(u32::MAX) {
        units += 1;
        count >>= 10;
    }
    v.extend_from_slice(&8u32.to_be_bytes());
    // HDD 0; COPY MANAGER STATUS 1: completed without errors, 2: with.
    v.push(if s.ok { 0x01 } else { 0x02 });
    v.extend_from_slice(&s.segments.to_be_bytes());
    v.push(units);
    v.extend_from_slice(&u32::try_from(count).unwrap_or(u32::MAX).to_be_bytes());
}

#[cfg(test)]
mod tests;
