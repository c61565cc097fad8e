//! SCSI target core: a target's logical units, SPC-4/SBC-3 disk emulation
//! over [`Backstore`]s, and sense data.
//!
//! The transport (the iSCSI target driver) asks [`command_info`] how much data
//! a CDB moves, collects any Data-Out, then calls [`ScsiTarget::execute`],
//! which writes Data-In into a buffer the caller reuses from command to
//! command. Nothing here does network I/O, and nothing panics on any CDB,
//! LUN or data the network can send.
//!
//! | module | owns |
//! |---|---|
//! | `lib.rs` | [`ScsiTarget`], LUN addressing, unit attentions, dispatch by opcode |
//! | [`cdb`] | opcodes, bounds-checked field readers, [`cdb::Lba`]/[`cdb::Blocks`], READ/WRITE decoding, [`command_info`] |
//! | [`sense`] | sense keys, named ASC/ASCQ constants, fixed and descriptor formats |
//! | [`spc`] | primary commands: INQUIRY and VPD pages, REPORT LUNS, TEST UNIT READY, REQUEST SENSE, MODE SENSE |
//! | [`sbc`] | block commands: READ/WRITE(6/10/12/16), READ CAPACITY(10/16), SYNCHRONIZE CACHE(10/16), UNMAP |
//! | [`backstore`] | the [`Backstore`] trait and the sparse [`RamBackstore`] |

pub mod backstore;
pub mod cdb;
pub mod sbc;
pub mod sense;
pub mod spc;

use std::sync::{Arc, Mutex, PoisonError};

pub use backstore::{Backstore, RamBackstore, RamBackstoreError};
pub use cdb::{DataDirection, command_info};
pub use sense::{Asc, Sense, SenseKey};

/// SAM-5 status codes.
pub mod status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION: sense data describes the error.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
}

/// The outcome of one command. Data-In has been written to the caller's
/// buffer; on CHECK CONDITION that buffer is empty and `sense` is `Some`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandOutcome {
    /// SAM status: [`status::GOOD`], [`status::CHECK_CONDITION`] or
    /// [`status::RESERVATION_CONFLICT`].
    pub status: u8,
    /// Sense data, present exactly when the status is CHECK CONDITION.
    pub sense: Option<Sense>,
}

impl CommandOutcome {
    /// GOOD status, no sense.
    pub const GOOD: Self = Self {
        status: status::GOOD,
        sense: None,
    };

    /// CHECK CONDITION with `sense`.
    pub const fn check_condition(sense: Sense) -> Self {
        Self {
            status: status::CHECK_CONDITION,
            sense: Some(sense),
        }
    }

    /// Whether the status is GOOD.
    pub const fn is_good(&self) -> bool {
        self.status == status::GOOD
    }
}

/// The identity strings a target reports in INQUIRY data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetIdentity {
    /// The iSCSI target name (reported as a SCSI name string designator).
    pub target_name: String,
    /// T10 vendor identification (8 ASCII characters, space-padded).
    pub vendor: String,
    /// Product identification (16 ASCII characters, space-padded).
    pub product: String,
    /// Product revision level (4 ASCII characters, space-padded).
    pub revision: String,
}

impl TargetIdentity {
    /// The default identity (vendor "ISCSI-RS", product "DISK", revision
    /// "0001") for a target named `target_name`.
    pub fn new(target_name: impl Into<String>) -> Self {
        Self {
            target_name: target_name.into(),
            vendor: "ISCSI-RS".into(),
            product: "DISK".into(),
            revision: "0001".into(),
        }
    }
}

/// One logical unit: its backstore and the unit attention waiting for it.
#[derive(Debug)]
pub(crate) struct LogicalUnit {
    pub(crate) backstore: Arc<dyn Backstore>,
    pending: Mutex<Option<Sense>>,
}

impl LogicalUnit {
    fn take_pending(&self) -> Option<Sense> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Encodes LUN `n` as the 64-bit LUN field: peripheral device addressing for
/// `n < 256`, flat space addressing up to 16383 (SAM-5 §4.7).
pub fn encode_lun(n: u16) -> u64 {
    if n < 256 {
        u64::from(n) << 48
    } else {
        (u64::from(0x4000 | (n & 0x3FFF))) << 48
    }
}

/// Decodes a 64-bit LUN field in peripheral (bus 0) or flat space addressing
/// into a LUN number; `None` for any other form.
pub fn decode_lun(lun: u64) -> Option<u16> {
    let b = lun.to_be_bytes();
    if lun & 0x0000_FFFF_FFFF_FFFF != 0 {
        return None;
    }
    match b[0] >> 6 {
        0b00 if b[0] == 0 => Some(u16::from(b[1])),
        0b01 => Some((u16::from(b[0] & 0x3F) << 8) | u16::from(b[1])),
        _ => None,
    }
}

/// A SCSI target's set of logical units.
#[derive(Debug)]
pub struct ScsiTarget {
    identity: TargetIdentity,
    luns: Vec<LogicalUnit>,
}

impl ScsiTarget {
    /// A target whose LUN numbers are 0.. in the order of `luns` (at most
    /// 16384 are addressable; the rest are ignored).
    pub fn new(identity: TargetIdentity, luns: Vec<Arc<dyn Backstore>>) -> Self {
        let luns = luns
            .into_iter()
            .take(0x4000)
            .map(|backstore| LogicalUnit {
                backstore,
                pending: Mutex::new(None),
            })
            .collect();
        Self { identity, luns }
    }

    /// The number of logical units.
    pub fn lun_count(&self) -> usize {
        self.luns.len()
    }

    /// The identity this target reports.
    pub fn identity(&self) -> &TargetIdentity {
        &self.identity
    }

    /// The backstore of LUN number `lun`, if it exists.
    pub fn backstore(&self, lun: u16) -> Option<&Arc<dyn Backstore>> {
        self.luns.get(usize::from(lun)).map(|lu| &lu.backstore)
    }

    /// Queues a unit attention on LUN number `lun` (e.g.
    /// [`Sense::POWER_ON_RESET`] after a LOGICAL UNIT RESET). The next
    /// command other than INQUIRY, REPORT LUNS and REQUEST SENSE ends in
    /// CHECK CONDITION with it; REQUEST SENSE returns and clears it. This
    /// core keeps one condition per LU, not one per I_T nexus.
    pub fn raise_unit_attention(&self, lun: u16, sense: Sense) {
        if let Some(lu) = self.luns.get(usize::from(lun)) {
            *lu.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(sense);
        }
    }

    /// Executes `cdb` on `lun`, the 64-bit LUN field as the initiator sent
    /// it (peripheral or flat addressing).
    ///
    /// `data_out` holds the Data-Out bytes of a WRITE or UNMAP; the transport
    /// guarantees it is as long as [`command_info`] said, and a shorter one
    /// ends in CHECK CONDITION INVALID FIELD IN CDB. `data_in` is cleared and
    /// filled with the response data; the caller truncates it to the Expected
    /// Data Transfer Length and computes residuals.
    ///
    /// An unknown LUN answers INQUIRY with peripheral qualifier 3 / device
    /// type 0x1F, serves REPORT LUNS and REQUEST SENSE, and fails everything
    /// else with ILLEGAL REQUEST / LOGICAL UNIT NOT SUPPORTED.
    pub fn execute(
        &self,
        lun: u64,
        cdb: &[u8],
        data_out: &[u8],
        data_in: &mut Vec<u8>,
    ) -> CommandOutcome {
        data_in.clear();
        let lu = decode_lun(lun).and_then(|n| self.luns.get(usize::from(n)));
        let result = match lu {
            Some(lu) => self.dispatch(lu, cdb, data_out, data_in),
            None => self.dispatch_missing(cdb, data_in),
        };
        match result {
            Ok(()) => CommandOutcome::GOOD,
            Err(sense) => {
                data_in.clear();
                CommandOutcome::check_condition(sense)
            }
        }
    }

    fn dispatch(
        &self,
        lu: &LogicalUnit,
        cdb: &[u8],
        data_out: &[u8],
        data_in: &mut Vec<u8>,
    ) -> Result<(), Sense> {
        use cdb::opcode::*;
        let op = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
        let known = matches!(
            op,
            TEST_UNIT_READY
                | REQUEST_SENSE
                | INQUIRY
                | REPORT_LUNS
                | MODE_SENSE_6
                | MODE_SENSE_10
                | READ_CAPACITY_10
                | SERVICE_ACTION_IN_16
                | READ_6
                | READ_10
                | READ_12
                | READ_16
                | WRITE_6
                | WRITE_10
                | WRITE_12
                | WRITE_16
                | SYNCHRONIZE_CACHE_10
                | SYNCHRONIZE_CACHE_16
                | UNMAP
        );
        if !known {
            return Err(Sense::INVALID_OPCODE);
        }
        if !matches!(op, INQUIRY | REPORT_LUNS | REQUEST_SENSE)
            && let Some(ua) = lu.take_pending()
        {
            return Err(ua);
        }
        cdb::check_control(cdb)?;
        let bs = lu.backstore.as_ref();
        match op {
            TEST_UNIT_READY => Ok(()),
            REQUEST_SENSE => spc::request_sense(cdb, lu.take_pending(), data_in),
            INQUIRY => spc::inquiry(&self.identity, Some(bs), cdb, data_in),
            REPORT_LUNS => spc::report_luns(self.luns.len(), cdb, data_in),
            MODE_SENSE_6 | MODE_SENSE_10 => spc::mode_sense(bs, cdb, data_in),
            READ_CAPACITY_10 => sbc::read_capacity_10(bs, cdb, data_in),
            SERVICE_ACTION_IN_16 => sbc::service_action_in_16(bs, cdb, data_in),
            SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => sbc::synchronize_cache(bs, cdb),
            UNMAP => sbc::unmap(bs, cdb, data_out),
            _ => sbc::read_write(bs, cdb, data_out, data_in),
        }
    }

    fn dispatch_missing(&self, cdb: &[u8], data_in: &mut Vec<u8>) -> Result<(), Sense> {
        use cdb::opcode::*;
        let op = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
        match op {
            INQUIRY => {
                cdb::check_control(cdb)?;
                spc::inquiry(&self.identity, None, cdb, data_in)
            }
            REPORT_LUNS => {
                cdb::check_control(cdb)?;
                spc::report_luns(self.luns.len(), cdb, data_in)
            }
            REQUEST_SENSE => {
                cdb::check_control(cdb)?;
                spc::request_sense(cdb, Some(Sense::LUN_NOT_SUPPORTED), data_in)
            }
            _ => Err(Sense::LUN_NOT_SUPPORTED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_encodings() {
        assert_eq!(decode_lun(0), Some(0));
        assert_eq!(decode_lun(5 << 48), Some(5));
        assert_eq!(decode_lun(encode_lun(300)), Some(300));
        assert_eq!(decode_lun(0x4001 << 48), Some(1));
        assert_eq!(decode_lun(1), None);
        assert_eq!(decode_lun(0x0105 << 48), None); // bus 1
        assert_eq!(decode_lun(0x8000 << 48), None);
        for n in [0u16, 1, 255, 256, 16383] {
            assert_eq!(decode_lun(encode_lun(n)), Some(n));
        }
    }
}
