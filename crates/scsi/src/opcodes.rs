//! The table of supported commands and the MAINTENANCE IN reports built
//! from it: REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35) with CDB usage
//! data and command timeouts descriptors, and REPORT SUPPORTED TASK
//! MANAGEMENT FUNCTIONS (SPC-4 §6.36).
//!
//! The dispatcher accepts exactly the opcodes listed here, so the report
//! and the behaviour cannot drift apart.

use crate::alua::SA_REPORT_TARGET_PORT_GROUPS;
use crate::backstore::Backstore;
use crate::cdb::{self, SA_REPORT_SUPPORTED_OPCODES, SA_REPORT_SUPPORTED_TMFS, opcode::*};
use crate::sanitize::{
    SA_SANITIZE_BLOCK_ERASE, SA_SANITIZE_CRYPTO_ERASE, SA_SANITIZE_EXIT_FAILURE_MODE,
    SA_SANITIZE_OVERWRITE,
};
use iscsi_sense::{FieldPointer, Sense};

/// INVALID FIELD IN CDB pointing at REPORTING OPTIONS (byte 2, bits 2-0).
/// Initiators (libiscsi's suite among them) read MAINTENANCE IN answered
/// with INVALID FIELD IN CDB and no field pointer as "not implemented".
const BAD_REPORTING_OPTIONS: Sense =
    Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(2, Some(2)));

/// One supported command: opcode, service action (for opcodes that have
/// them) and CDB USAGE DATA (the CDB's length; byte 0 is the opcode, every
/// other byte has a 1 for each bit the device server looks at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandDescriptor {
    /// OPERATION CODE.
    pub opcode: u8,
    /// SERVICE ACTION, for opcodes that have service actions.
    pub service_action: Option<u8>,
    /// CDB USAGE DATA.
    pub usage: &'static [u8],
}

const fn cmd(opcode: u8, usage: &'static [u8]) -> CommandDescriptor {
    CommandDescriptor {
        opcode,
        service_action: None,
        usage,
    }
}

const fn cmd_sa(opcode: u8, sa: u8, usage: &'static [u8]) -> CommandDescriptor {
    CommandDescriptor {
        opcode,
        service_action: Some(sa),
        usage,
    }
}

const F: u8 = 0xFF;

/// Every command this crate implements, by opcode then service action.
pub const COMMANDS: &[CommandDescriptor] = &[
    cmd(TEST_UNIT_READY, &[TEST_UNIT_READY, 0, 0, 0, 0, 0]),
    cmd(REQUEST_SENSE, &[REQUEST_SENSE, 0x01, 0, 0, F, 0]),
    cmd(READ_6, &[READ_6, 0x1F, F, F, F, 0]),
    cmd(WRITE_6, &[WRITE_6, 0x1F, F, F, F, 0]),
    cmd(INQUIRY, &[INQUIRY, 0x01, F, F, F, 0]),
    cmd(MODE_SELECT_6, &[MODE_SELECT_6, 0x11, 0, 0, F, 0]),
    cmd(RESERVE_6, &[RESERVE_6, 0, 0, 0, 0, 0]),
    cmd(RELEASE_6, &[RELEASE_6, 0, 0, 0, 0, 0]),
    cmd(MODE_SENSE_6, &[MODE_SENSE_6, 0x08, F, F, F, 0]),
    cmd(START_STOP_UNIT, &[START_STOP_UNIT, 0x01, 0, 0x0F, 0xF7, 0]),
    cmd(
        PREVENT_ALLOW_MEDIUM_REMOVAL,
        &[PREVENT_ALLOW_MEDIUM_REMOVAL, 0, 0, 0, 0x03, 0],
    ),
    cmd(
        READ_CAPACITY_10,
        &[READ_CAPACITY_10, 0, F, F, F, F, 0, 0, 0x01, 0],
    ),
    cmd(READ_10, &[READ_10, 0x18, F, F, F, F, 0, F, F, 0]),
    cmd(WRITE_10, &[WRITE_10, 0x18, F, F, F, F, 0, F, F, 0]),
    cmd(
        WRITE_AND_VERIFY_10,
        &[WRITE_AND_VERIFY_10, 0x12, F, F, F, F, 0, F, F, 0],
    ),
    cmd(VERIFY_10, &[VERIFY_10, 0x16, F, F, F, F, 0, F, F, 0]),
    cmd(
        SYNCHRONIZE_CACHE_10,
        &[SYNCHRONIZE_CACHE_10, 0x02, F, F, F, F, 0, F, F, 0],
    ),
    cmd(
        WRITE_SAME_10,
        &[WRITE_SAME_10, 0x08, F, F, F, F, 0, F, F, 0],
    ),
    cmd(UNMAP, &[UNMAP, 0, 0, 0, 0, 0, 0, F, F, 0]),
    cmd(
        PRE_FETCH_10,
        &[PRE_FETCH_10, 0x02, F, F, F, F, 0x3F, F, F, 0],
    ),
    cmd(
        READ_DEFECT_DATA_10,
        &[READ_DEFECT_DATA_10, 0, 0x1F, 0, 0, 0, 0, F, F, 0],
    ),
    cmd(
        PRE_FETCH_16,
        &[
            PRE_FETCH_16,
            0x02,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            0x3F,
            0,
        ],
    ),
    cmd(
        ORWRITE_16,
        &[
            ORWRITE_16, 0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0,
        ],
    ),
    cmd(
        READ_DEFECT_DATA_12,
        &[READ_DEFECT_DATA_12, 0x1F, 0, 0, 0, 0, F, F, F, F, 0, 0],
    ),
    cmd(
        MODE_SELECT_10,
        &[MODE_SELECT_10, 0x11, 0, 0, 0, 0, 0, F, F, 0],
    ),
    cmd(RESERVE_10, &[RESERVE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    cmd(RELEASE_10, &[RELEASE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    cmd(
        MODE_SENSE_10,
        &[MODE_SENSE_10, 0x18, F, F, 0, 0, 0, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_IN,
        0x00,
        &[PERSISTENT_RESERVE_IN, 0x1F, 0, 0, 0, 0, 0, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_IN,
        0x01,
        &[PERSISTENT_RESERVE_IN, 0x1F, 0, 0, 0, 0, 0, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_IN,
        0x02,
        &[PERSISTENT_RESERVE_IN, 0x1F, 0, 0, 0, 0, 0, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_IN,
        0x03,
        &[PERSISTENT_RESERVE_IN, 0x1F, 0, 0, 0, 0, 0, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_OUT,
        0x00,
        &[PERSISTENT_RESERVE_OUT, 0x1F, 0xFF, 0, 0, F, F, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_OUT,
        0x01,
        &[PERSISTENT_RESERVE_OUT, 0x1F, 0xFF, 0, 0, F, F, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_OUT,
        0x02,
        &[PERSISTENT_RESERVE_OUT, 0x1F, 0xFF, 0, 0, F, F, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_OUT,
        0x03,
        &[PERSISTENT_RESERVE_OUT, 0x1F, 0xFF, 0, 0, F, F, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_OUT,
        0x04,
        &[PERSISTENT_RESERVE_OUT, 0x1F, 0xFF, 0, 0, F, F, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_OUT,
        0x05,
        &[PERSISTENT_RESERVE_OUT, 0x1F, 0xFF, 0, 0, F, F, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_OUT,
        0x06,
        &[PERSISTENT_RESERVE_OUT, 0x1F, 0xFF, 0, 0, F, F, F, F, 0],
    ),
    cmd_sa(
        PERSISTENT_RESERVE_OUT,
        0x07,
        &[PERSISTENT_RESERVE_OUT, 0x1F, 0xFF, 0, 0, F, F, F, F, 0],
    ),
    cmd(
        READ_16,
        &[READ_16, 0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    cmd(
        COMPARE_AND_WRITE,
        &[
            COMPARE_AND_WRITE,
            0x18,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            0,
            0,
            0,
            F,
            0,
            0,
        ],
    ),
    cmd(
        WRITE_16,
        &[WRITE_16, 0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    cmd(
        WRITE_AND_VERIFY_16,
        &[
            WRITE_AND_VERIFY_16,
            0x12,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
    cmd(
        VERIFY_16,
        &[VERIFY_16, 0x16, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0],
    ),
    cmd(
        SYNCHRONIZE_CACHE_16,
        &[
            SYNCHRONIZE_CACHE_16,
            0x02,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
    cmd(
        WRITE_SAME_16,
        &[
            WRITE_SAME_16,
            0x09,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
    cmd_sa(
        SERVICE_ACTION_IN_16,
        cdb::SA_READ_CAPACITY_16,
        &[
            SERVICE_ACTION_IN_16,
            0x1F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
    cmd_sa(
        SERVICE_ACTION_IN_16,
        cdb::SA_GET_LBA_STATUS,
        &[
            SERVICE_ACTION_IN_16,
            0x1F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
    cmd(REPORT_LUNS, &[REPORT_LUNS, 0, F, 0, 0, 0, F, F, F, F, 0, 0]),
    // REPORT TARGET PORT GROUPS: PARAMETER DATA FORMAT and service action;
    // ALLOCATION LENGTH. Only an LU with an ALUA group offers it.
    cmd_sa(
        MAINTENANCE_IN,
        SA_REPORT_TARGET_PORT_GROUPS,
        &[MAINTENANCE_IN, 0xFF, 0, 0, 0, 0, F, F, F, F, 0, 0],
    ),
    cmd_sa(
        MAINTENANCE_IN,
        SA_REPORT_SUPPORTED_OPCODES,
        &[MAINTENANCE_IN, 0x1F, 0x87, F, F, F, F, F, F, F, 0, 0],
    ),
    cmd_sa(
        MAINTENANCE_IN,
        SA_REPORT_SUPPORTED_TMFS,
        &[MAINTENANCE_IN, 0x1F, 0x80, 0, 0, 0, F, F, F, F, 0, 0],
    ),
    cmd_sa(
        EXTENDED_COPY,
        crate::xcopy::SA_EXTENDED_COPY_LID1,
        &[
            EXTENDED_COPY,
            0x1F,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
    cmd_sa(
        RECEIVE_COPY_RESULTS,
        crate::xcopy::SA_COPY_STATUS,
        &[
            RECEIVE_COPY_RESULTS,
            0x1F,
            F,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
    cmd_sa(
        RECEIVE_COPY_RESULTS,
        crate::xcopy::SA_OPERATING_PARAMETERS,
        &[
            RECEIVE_COPY_RESULTS,
            0x1F,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
    cmd(READ_12, &[READ_12, 0x18, F, F, F, F, F, F, F, F, 0, 0]),
    cmd(WRITE_12, &[WRITE_12, 0x18, F, F, F, F, F, F, F, F, 0, 0]),
    cmd(
        WRITE_AND_VERIFY_12,
        &[WRITE_AND_VERIFY_12, 0x12, F, F, F, F, F, F, F, F, 0, 0],
    ),
    cmd(VERIFY_12, &[VERIFY_12, 0x16, F, F, F, F, F, F, F, F, 0, 0]),
    // SANITIZE: IMMED (bit 7), AUSE (bit 5), SERVICE ACTION; PARAMETER
    // LIST LENGTH.
    cmd_sa(
        SANITIZE,
        SA_SANITIZE_OVERWRITE,
        &[SANITIZE, 0xBF, 0, 0, 0, 0, 0, F, F, 0],
    ),
    cmd_sa(
        SANITIZE,
        SA_SANITIZE_BLOCK_ERASE,
        &[SANITIZE, 0xBF, 0, 0, 0, 0, 0, F, F, 0],
    ),
    cmd_sa(
        SANITIZE,
        SA_SANITIZE_CRYPTO_ERASE,
        &[SANITIZE, 0xBF, 0, 0, 0, 0, 0, F, F, 0],
    ),
    cmd_sa(
        SANITIZE,
        SA_SANITIZE_EXIT_FAILURE_MODE,
        &[SANITIZE, 0xBF, 0, 0, 0, 0, 0, F, F, 0],
    ),
    // WRITE ATOMIC(16): DPO, FUA; LBA; ATOMIC BOUNDARY; TRANSFER LENGTH.
    cmd(
        WRITE_ATOMIC_16,
        &[
            WRITE_ATOMIC_16,
            0x18,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            F,
            0,
            0,
        ],
    ),
];

/// What one LU offers of the commands that depend on its store: the
/// dispatcher refuses the rest as unsupported, and REPORT SUPPORTED
/// OPERATION CODES leaves them out, from this one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    /// Logical block provisioning (UNMAP).
    pub thin: bool,
    /// WRITE ATOMIC(16): the store promises atomic writes.
    pub atomic: bool,
    /// SANITIZE BLOCK ERASE.
    pub block_erase: bool,
    /// SANITIZE CRYPTOGRAPHIC ERASE.
    pub crypto_erase: bool,
    /// REPORT TARGET PORT GROUPS: the LU has an ALUA group.
    pub alua: bool,
    /// ORWRITE: a read, modify and write under the LU's lock is atomic,
    /// which it is not while other gateways serve the LU outside a group
    /// (`pr_shared::serves_alone`; the store alone cannot tell).
    pub exclusive: bool,
}

impl Offered {
    /// What `lu`'s store offers.
    pub fn of(lu: &dyn Backstore) -> Self {
        Self {
            thin: lu.is_thin(),
            atomic: crate::atomic::AtomicLimits::of(lu).supported(),
            block_erase: lu.can_block_erase(),
            crypto_erase: lu.can_crypto_erase(),
            alua: lu.alua().is_some(),
            exclusive: true,
        }
    }

    /// Whether the LU offers command `c`.
    pub fn offers(&self, c: &CommandDescriptor) -> bool {
        match (c.opcode, c.service_action) {
            (UNMAP, _) => self.thin,
            (WRITE_ATOMIC_16, _) => self.atomic,
            (SANITIZE, Some(SA_SANITIZE_BLOCK_ERASE)) => self.block_erase,
            (SANITIZE, Some(SA_SANITIZE_CRYPTO_ERASE)) => self.crypto_erase,
            (MAINTENANCE_IN, Some(SA_REPORT_TARGET_PORT_GROUPS)) => self.alua,
            (ORWRITE_16, _) => self.exclusive,
            _ => true,
        }
    }
}

/// Nominal and recommended command timeouts reported in command timeouts
/// descriptors, in seconds.
const NOMINAL_TIMEOUT: u32 = 1;
const RECOMMENDED_TIMEOUT: u32 = 30;

/// Whether `op` has service actions (then every table entry for it has one).
fn has_service_actions(op: u8) -> bool {
    COMMANDS
        .iter()
        .any(|c| c.opcode == op && c.service_action.is_some())
}

/// Whether the CDB's opcode is one this crate implements (an unsupported
/// service action of a supported opcode is left to the handler: INVALID
/// FIELD IN CDB).
pub fn is_supported(cdb: &[u8]) -> bool {
    cdb.first()
        .is_some_and(|&op| COMMANDS.iter().any(|c| c.opcode == op))
}

/// The command timeouts descriptor (SPC-4 §6.35.4).
fn timeouts(v: &mut Vec<u8>) {
    v.extend_from_slice(&[0x00, 0x0A, 0x00, 0x00]);
    v.extend_from_slice(&NOMINAL_TIMEOUT.to_be_bytes());
    v.extend_from_slice(&RECOMMENDED_TIMEOUT.to_be_bytes());
}

/// MAINTENANCE IN: REPORT SUPPORTED OPERATION CODES or REPORT SUPPORTED
/// TASK MANAGEMENT FUNCTIONS.
pub fn maintenance_in(cdb: &[u8], offered: Offered, data_in: &mut Vec<u8>) -> Result<(), Sense> {
    match cdb::byte(cdb, 1)? & 0x1F {
        SA_REPORT_SUPPORTED_OPCODES => report_supported_opcodes(cdb, offered, data_in),
        SA_REPORT_SUPPORTED_TMFS => report_supported_tmfs(cdb, data_in),
        _ => Err(Sense::INVALID_FIELD_IN_CDB),
    }
}

/// REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35): REPORTING OPTIONS 000b
/// (all commands), 001b (one opcode without service actions), 010b (one
/// opcode and service action) and 011b (one opcode, with its service action
/// if it has them); RCTD adds command timeouts descriptors.
///
/// `offered` says which of the commands that depend on the store this LU
/// has (UNMAP, WRITE ATOMIC(16), SANITIZE BLOCK ERASE): they are listed
/// exactly when the dispatcher accepts them.
pub fn report_supported_opcodes(
    cdb: &[u8],
    offered: Offered,
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    let offered = |c: &&CommandDescriptor| offered.offers(c);
    let b2 = cdb::byte(cdb, 2)?;
    let rctd = b2 & 0x80 != 0;
    let options = b2 & 0x07;
    let op = cdb::byte(cdb, 3)?;
    let sa = cdb::be16(cdb, 4)?;
    let alloc = usize::try_from(cdb::be32(cdb, 6)?).unwrap_or(usize::MAX);
    if b2 & 0x78 != 0 {
        // Reserved bits 6-3.
        return Err(Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(2, Some(6))));
    }
    let v = data_in;
    match options {
        0 => {
            v.extend_from_slice(&[0; 4]);
            for c in COMMANDS.iter().filter(offered) {
                v.push(c.opcode);
                v.push(0);
                v.extend_from_slice(&u16::from(c.service_action.unwrap_or(0)).to_be_bytes());
                v.push(0);
                // CTDP (bit 1), SERVACTV (bit 0).
                v.push((u8::from(rctd) << 1) | u8::from(c.service_action.is_some()));
                let len = u16::try_from(c.usage.len()).unwrap_or(0);
                v.extend_from_slice(&len.to_be_bytes());
                if rctd {
                    timeouts(v);
                }
            }
            let len = u32::try_from(v.len().saturating_sub(4)).unwrap_or(u32::MAX);
            if let Some(f) = v.get_mut(0..4) {
                f.copy_from_slice(&len.to_be_bytes());
            }
        }
        1..=3 => {
            let with_sa = has_service_actions(op);
            let wanted_sa = match (options, with_sa) {
                (1, true) | (2, false) => return Err(BAD_REPORTING_OPTIONS),
                (1, false) | (3, false) => None,
                _ => Some(sa),
            };
            let found = COMMANDS
                .iter()
                .filter(offered)
                .find(|c| c.opcode == op && c.service_action.map(u16::from) == wanted_sa);
            match found {
                Some(c) => {
                    // CTDP (bit 7); SUPPORT 011b: supported as in the standard.
                    v.push(0);
                    v.push((u8::from(rctd) << 7) | 0x03);
                    let len = u16::try_from(c.usage.len()).unwrap_or(0);
                    v.extend_from_slice(&len.to_be_bytes());
                    v.extend_from_slice(c.usage);
                    if rctd {
                        timeouts(v);
                    }
                }
                // SUPPORT 001b: not supported; no usage data.
                None => v.extend_from_slice(&[0, 0x01, 0, 0]),
            }
        }
        _ => return Err(BAD_REPORTING_OPTIONS),
    }
    v.truncate(alloc);
    Ok(())
}

/// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (SPC-4 §6.36): ABORT TASK,
/// ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET and TARGET RESET
/// (iSCSI's warm/cold target resets). With REPD, the 16-byte extended
/// format.
pub fn report_supported_tmfs(cdb: &[u8], data_in: &mut Vec<u8>) -> Result<(), Sense> {
    let repd = cdb::byte(cdb, 2)? & 0x80 != 0;
    let alloc = usize::try_from(cdb::be32(cdb, 6)?).unwrap_or(usize::MAX);
    if alloc < 4 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    // ATS, ATSS, CTSS, LURS, TRS.
    let mut v = vec![0x80 | 0x40 | 0x10 | 0x08 | 0x02, 0x00, 0x00, 0x00];
    if repd {
        // REPORT SUPPORTED TMF ADDITIONAL DATA LENGTH 0Ch, then reserved.
        v[3] = 0x0C;
        v.resize(16, 0);
    }
    v.truncate(alloc);
    data_in.extend_from_slice(&v);
    Ok(())
}
