//! SANITIZE (SBC-4 §5.30, sanitize operations §4.11): OVERWRITE, BLOCK
//! ERASE and EXIT FAILURE MODE, as far as each store can honour them, and
//! the LU's sanitize state that gates every other command meanwhile.
//!
//! - OVERWRITE writes the initialization pattern (repeated over each
//!   block, inverted between passes with INVERT) over the whole LU, as
//!   many passes as OVERWRITE COUNT says, then flushes: every store can.
//! - BLOCK ERASE deallocates the whole LU then flushes, only on stores for
//!   which that removes the data ([`Backstore::can_block_erase`]: RAM
//!   drops its chunks, a file has holes punched and is synced).
//! - CRYPTOGRAPHIC ERASE replaces the key of an encrypted store
//!   ([`Backstore::can_crypto_erase`]: `,encrypt`, see
//!   `iscsi_stores::EncryptedBackstore`), then flushes; on any other store it
//!   is refused (ILLEGAL REQUEST, INVALID FIELD IN CDB) and not listed as
//!   supported.
//!
//! While an operation runs, commands other than INQUIRY, REPORT LUNS,
//! REQUEST SENSE and MAINTENANCE IN end in NOT READY / SANITIZE IN
//! PROGRESS with the progress indication; REQUEST SENSE returns the same
//! sense with GOOD status (SBC-4 §4.11.3). With IMMED the operation runs
//! on a thread of its own and the command returns at once; without, the
//! command returns when it is over. A failed operation leaves the LU in
//! the sanitize failure state (§4.11.4): everything but those commands and
//! SANITIZE ends in MEDIUM ERROR / SANITIZE COMMAND FAILED until a
//! SANITIZE succeeds or, if the failed one had AUSE set, EXIT FAILURE MODE
//! is sent. Neither state survives a restart of the target: nothing of
//! the LU's state is kept on disk, so a sanitize cut off by a crash is
//! not resumed, and its LU is not marked as failed on the way back.

use std::io;
use std::sync::Arc;

use crate::backstore::Backstore;
use crate::cdb;
use crate::lu::LogicalUnit;
use iscsi_sense::{Asc, FieldPointer, Sense, SenseKey};

pub use crate::sanitize_state::FAILED;
pub(crate) use crate::sanitize_state::{IN_PROGRESS, Progress, SanitizeState};

/// Service action OVERWRITE.
pub const SA_SANITIZE_OVERWRITE: u8 = 0x01;
/// Service action BLOCK ERASE.
pub const SA_SANITIZE_BLOCK_ERASE: u8 = 0x02;
/// Service action CRYPTOGRAPHIC ERASE (on encrypted stores only).
pub const SA_SANITIZE_CRYPTO_ERASE: u8 = 0x03;
/// Service action EXIT FAILURE MODE.
pub const SA_SANITIZE_EXIT_FAILURE_MODE: u8 = 0x1F;

/// Bytes written per step of an OVERWRITE (and the progress granule).
const STEP: u64 = 1 << 20;
/// Bytes deallocated per step of a BLOCK ERASE (a step per progress
/// update; the RAM store frees chunk by chunk anyway).
const ERASE_STEP: u64 = 64 << 20;

/// One operation, checked and ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Operation {
    /// `count` passes of `block` (one logical block of the pattern),
    /// inverted on every second pass when `invert`.
    Overwrite {
        block: Vec<u8>,
        count: u8,
        invert: bool,
    },
    BlockErase,
    CryptoErase,
}

/// The OVERWRITE parameter list (SBC-4 §5.30.3): INVERT, TEST, OVERWRITE
/// COUNT, INITIALIZATION PATTERN LENGTH, the pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverwriteParams<'a> {
    /// INVERT: the pattern is inverted between passes.
    pub invert: bool,
    /// OVERWRITE COUNT: passes, 1 to 31.
    pub count: u8,
    /// The INITIALIZATION PATTERN, 1 to one block long.
    pub pattern: &'a [u8],
}

impl<'a> OverwriteParams<'a> {
    /// Parses and checks a parameter list of exactly the PARAMETER LIST
    /// LENGTH: TEST must be 0 (no test modes), the count non-zero, the
    /// pattern's length non-zero, at most `block_size` and equal to what
    /// the list holds after the header. Never panics.
    pub fn parse(list: &'a [u8], block_size: u32) -> Result<Self, Sense> {
        let bad = |byte: u16, bit: Option<u8>| {
            Err(
                Sense::INVALID_FIELD_IN_PARAMETER_LIST.with_field_pointer(FieldPointer {
                    in_cdb: false,
                    byte,
                    bit,
                }),
            )
        };
        let (Some(&b0), Some(len)) = (list.first(), list.get(2..4)) else {
            return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
        };
        let invert = b0 & 0x80 != 0;
        let count = b0 & 0x1F;
        if b0 & 0x60 != 0 {
            return bad(0, Some(6));
        }
        if count == 0 {
            return bad(0, Some(4));
        }
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let pattern = list.get(4..).unwrap_or(&[]);
        if len == 0 || len > usize::try_from(block_size).unwrap_or(usize::MAX) {
            return bad(2, None);
        }
        if pattern.len() != len {
            return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        Ok(Self {
            invert,
            count,
            pattern,
        })
    }
}

/// SANITIZE on `lu`: checks the CDB and parameter list, moves the LU into
/// the running state, then runs the operation here or, with IMMED, on a
/// thread of its own.
pub(crate) fn sanitize(lu: &Arc<LogicalUnit>, cdb: &[u8], data_out: &[u8]) -> Result<(), Sense> {
    let b1 = cdb::byte(cdb, 1)?;
    let immed = b1 & 0x80 != 0;
    let ause = b1 & 0x20 != 0;
    let sa = b1 & 0x1F;
    if b1 & 0x40 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(1, Some(6))));
    }
    for i in 2..7u16 {
        if cdb::byte(cdb, usize::from(i))? != 0 {
            return Err(Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(i, None)));
        }
    }
    let param_len = usize::from(cdb::be16(cdb, 7)?);
    let bs = lu.backstore.block_size();
    let bad_sa = Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(1, Some(4)));
    let bad_len = Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(7, None));
    let operation = match sa {
        SA_SANITIZE_OVERWRITE => {
            // SBC-4: a header and 1 to one block of pattern.
            let max = usize::try_from(bs).unwrap_or(usize::MAX).saturating_add(4);
            if !(5..=max).contains(&param_len) {
                return Err(bad_len);
            }
            let list = data_out.get(..param_len).ok_or(bad_len)?;
            let p = OverwriteParams::parse(list, bs)?;
            Some(Operation::Overwrite {
                block: p
                    .pattern
                    .iter()
                    .copied()
                    .cycle()
                    .take(bs as usize)
                    .collect(),
                count: p.count,
                invert: p.invert,
            })
        }
        SA_SANITIZE_BLOCK_ERASE | SA_SANITIZE_CRYPTO_ERASE | SA_SANITIZE_EXIT_FAILURE_MODE
            if param_len != 0 =>
        {
            return Err(bad_len);
        }
        SA_SANITIZE_BLOCK_ERASE if lu.backstore.can_block_erase() => Some(Operation::BlockErase),
        SA_SANITIZE_CRYPTO_ERASE if lu.backstore.can_crypto_erase() => Some(Operation::CryptoErase),
        SA_SANITIZE_EXIT_FAILURE_MODE => None,
        // BLOCK ERASE or CRYPTOGRAPHIC ERASE where the store cannot,
        // reserved service actions.
        _ => return Err(bad_sa),
    };
    let mut st = lu.state();
    let Some(operation) = operation else {
        // EXIT FAILURE MODE: leaves the failure state of a sanitize sent
        // with AUSE; outside that state there is nothing to leave.
        return match st.sanitize {
            SanitizeState::Failed { ause: false } => Err(bad_sa),
            _ => {
                st.sanitize = SanitizeState::Idle;
                Ok(())
            }
        };
    };
    if let SanitizeState::Running(p) = &st.sanitize {
        return Err(IN_PROGRESS.with_progress(p.get()));
    }
    // SWP, or a read-only LU (`,readonly`), whose SWP `io_mode` sets.
    if st.mode.swp || lu.io_mode().swp {
        return Err(Sense::WRITE_PROTECTED);
    }
    let progress = Arc::new(Progress::default());
    st.sanitize = SanitizeState::Running(Arc::clone(&progress));
    drop(st);
    if immed {
        let owned = Arc::clone(lu);
        let background = std::thread::Builder::new()
            .name("sanitize".into())
            .spawn(move || finish(&owned, &operation, &progress, ause));
        return match background {
            Ok(_) => Ok(()),
            // No thread to be had: the state goes back as it was.
            Err(_) => {
                lu.state().sanitize = SanitizeState::Idle;
                Err(Sense::new(
                    SenseKey::HardwareError,
                    Asc::NO_ADDITIONAL_SENSE,
                ))
            }
        };
    }
    finish(lu, &operation, &progress, ause)
}

/// Runs `operation` and leaves the LU idle, or in the failure state if it
/// failed (then `Err(FAILED)`). Writes in flight when it started are let
/// finish first, and none starts until it is over.
fn finish(
    lu: &LogicalUnit,
    operation: &Operation,
    progress: &Progress,
    ause: bool,
) -> Result<(), Sense> {
    let result = {
        let _writes = lu.write_exclusive();
        run(lu.backstore.as_ref(), operation, progress)
    };
    let mut st = lu.state();
    match result {
        Ok(()) => {
            st.sanitize = SanitizeState::Idle;
            Ok(())
        }
        Err(_) => {
            st.sanitize = SanitizeState::Failed { ause };
            Err(FAILED)
        }
    }
}

/// The operation itself, over the whole store, then a flush.
fn run(store: &dyn Backstore, operation: &Operation, progress: &Progress) -> io::Result<()> {
    let size = store
        .block_count()
        .saturating_mul(u64::from(store.block_size()));
    match operation {
        Operation::Overwrite {
            block,
            count,
            invert,
        } => {
            let blocks_per_step = (STEP / u64::from(store.block_size())).max(1);
            let step = block.repeat(usize::try_from(blocks_per_step).unwrap_or(1));
            let inverted: Vec<u8> = step.iter().map(|b| !b).collect();
            let total = size.saturating_mul(u64::from(*count));
            for pass in 0..u64::from(*count) {
                let buf = if *invert && pass % 2 == 1 {
                    &inverted
                } else {
                    &step
                };
                let mut at = 0;
                while at < size {
                    let n = (size - at).min(buf.len() as u64);
                    let piece = buf.get(..usize::try_from(n).unwrap_or(0)).unwrap_or(&[]);
                    store.write_at(at, piece)?;
                    at += n;
                    progress.set(pass * size + at, total);
                }
            }
        }
        Operation::BlockErase => {
            let mut at = 0;
            while at < size {
                let n = (size - at).min(ERASE_STEP);
                store.unmap(at, n)?;
                at += n;
                progress.set(at, size);
            }
        }
        Operation::CryptoErase => {
            store.crypto_erase()?;
            progress.set(size, size);
        }
    }
    store.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::opcode;

    #[test]
    fn overwrite_parameter_list() {
        let mut list = vec![0x01, 0, 0, 4, 1, 2, 3, 4];
        let p = OverwriteParams::parse(&list, 512).unwrap();
        assert_eq!(
            (p.invert, p.count, p.pattern),
            (false, 1, &[1u8, 2, 3, 4][..])
        );
        list[0] = 0x9F;
        let p = OverwriteParams::parse(&list, 512).unwrap();
        assert_eq!((p.invert, p.count), (true, 31));
        // TEST set, count 0, pattern length 0 or over a block.
        for (b0, len) in [(0x21u8, 4u16), (0x00, 4), (0x01, 0), (0x01, 513)] {
            let mut l = vec![b0, 0];
            l.extend_from_slice(&len.to_be_bytes());
            l.resize(4 + usize::from(len), 0);
            let e = OverwriteParams::parse(&l, 512).unwrap_err();
            assert_eq!(e.asc, Asc::INVALID_FIELD_IN_PARAMETER_LIST, "{b0:#x} {len}");
        }
        // The length says more than the list holds.
        assert_eq!(
            OverwriteParams::parse(&[1, 0, 0, 8, 1, 2], 512).unwrap_err(),
            Sense::PARAMETER_LIST_LENGTH_ERROR
        );
        assert!(OverwriteParams::parse(&[1, 0], 512).is_err());
        assert!(OverwriteParams::parse(&[], 512).is_err());
    }

    #[test]
    fn gate_lets_through_what_sbc4_allows() {
        let running = SanitizeState::Running(Arc::new(Progress::default()));
        let failed = SanitizeState::Failed { ause: true };
        for op in [opcode::INQUIRY, opcode::REPORT_LUNS, opcode::REQUEST_SENSE] {
            assert!(running.gate(&[op]).is_ok());
            assert!(failed.gate(&[op]).is_ok());
        }
        let e = running.gate(&[opcode::READ_10]).unwrap_err();
        assert_eq!(
            (e.key, e.asc),
            (SenseKey::NotReady, Asc::SANITIZE_IN_PROGRESS)
        );
        assert_eq!(e.progress, Some(0));
        assert_eq!(
            running.gate(&[opcode::SANITIZE]).unwrap_err().key,
            SenseKey::NotReady
        );
        assert_eq!(failed.gate(&[opcode::TEST_UNIT_READY]), Err(FAILED));
        assert!(failed.gate(&[opcode::SANITIZE]).is_ok());
        assert!(SanitizeState::Idle.gate(&[opcode::READ_10]).is_ok());
    }
}
