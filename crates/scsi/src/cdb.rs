//! CDB field parsing: operation codes, big-endian field readers that never
//! index out of bounds, the LBA and block-count types, the READ/WRITE CDB
//! decoder shared by the transport's [`command_info`] and the SBC handlers.

use iscsi_sense::Sense;

/// Largest READ/WRITE transfer accepted, in bytes (reported in the Block
/// Limits VPD page; larger requests end in INVALID FIELD IN CDB).
pub const MAX_TRANSFER_BYTES: u64 = 32 << 20;

/// Operation codes this crate knows (SPC-4 / SBC-3).
pub mod opcode {
    /// TEST UNIT READY.
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// REQUEST SENSE.
    pub const REQUEST_SENSE: u8 = 0x03;
    /// READ(6).
    pub const READ_6: u8 = 0x08;
    /// WRITE(6).
    pub const WRITE_6: u8 = 0x0A;
    /// INQUIRY.
    pub const INQUIRY: u8 = 0x12;
    /// MODE SENSE(6).
    pub const MODE_SENSE_6: u8 = 0x1A;
    /// READ CAPACITY(10).
    pub const READ_CAPACITY_10: u8 = 0x25;
    /// READ(10).
    pub const READ_10: u8 = 0x28;
    /// WRITE(10).
    pub const WRITE_10: u8 = 0x2A;
    /// SYNCHRONIZE CACHE(10).
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// MODE SENSE(10).
    pub const MODE_SENSE_10: u8 = 0x5A;
    /// READ(16).
    pub const READ_16: u8 = 0x88;
    /// WRITE(16).
    pub const WRITE_16: u8 = 0x8A;
    /// SYNCHRONIZE CACHE(16).
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    /// SERVICE ACTION IN(16); service action 0x10 is READ CAPACITY(16).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    /// REPORT LUNS.
    pub const REPORT_LUNS: u8 = 0xA0;
    /// READ(12).
    pub const READ_12: u8 = 0xA8;
    /// WRITE(12).
    pub const WRITE_12: u8 = 0xAA;
    /// MODE SELECT(6).
    pub const MODE_SELECT_6: u8 = 0x15;
    /// RESERVE(6).
    pub const RESERVE_6: u8 = 0x16;
    /// RELEASE(6).
    pub const RELEASE_6: u8 = 0x17;
    /// START STOP UNIT.
    pub const START_STOP_UNIT: u8 = 0x1B;
    /// PREVENT ALLOW MEDIUM REMOVAL.
    pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1E;
    /// WRITE AND VERIFY(10).
    pub const WRITE_AND_VERIFY_10: u8 = 0x2E;
    /// VERIFY(10).
    pub const VERIFY_10: u8 = 0x2F;
    /// WRITE SAME(10).
    pub const WRITE_SAME_10: u8 = 0x41;
    /// MODE SELECT(10).
    pub const MODE_SELECT_10: u8 = 0x55;
    /// RESERVE(10).
    pub const RESERVE_10: u8 = 0x56;
    /// RELEASE(10).
    pub const RELEASE_10: u8 = 0x57;
    /// PERSISTENT RESERVE IN.
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    /// PERSISTENT RESERVE OUT.
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    /// COMPARE AND WRITE.
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    /// PRE-FETCH(10).
    pub const PRE_FETCH_10: u8 = 0x34;
    /// PRE-FETCH(16).
    pub const PRE_FETCH_16: u8 = 0x90;
    /// ORWRITE(16).
    pub const ORWRITE_16: u8 = 0x8B;
    /// READ DEFECT DATA(10).
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    /// READ DEFECT DATA(12).
    pub const READ_DEFECT_DATA_12: u8 = 0xB7;
    /// WRITE AND VERIFY(16).
    pub const WRITE_AND_VERIFY_16: u8 = 0x8E;
    /// VERIFY(16).
    pub const VERIFY_16: u8 = 0x8F;
    /// EXTENDED COPY (service action 0: LID1).
    pub const EXTENDED_COPY: u8 = 0x83;
    /// RECEIVE COPY RESULTS.
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    /// WRITE SAME(16).
    pub const WRITE_SAME_16: u8 = 0x93;
    /// MAINTENANCE IN; service actions 0x0C (REPORT SUPPORTED OPERATION
    /// CODES) and 0x0D (REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS).
    pub const MAINTENANCE_IN: u8 = 0xA3;
    /// WRITE AND VERIFY(12).
    pub const WRITE_AND_VERIFY_12: u8 = 0xAE;
    /// VERIFY(12).
    pub const VERIFY_12: u8 = 0xAF;
    /// WRITE ATOMIC(16) (SBC-4).
    pub const WRITE_ATOMIC_16: u8 = 0x9C;
    /// SANITIZE (SBC-4); service actions OVERWRITE, BLOCK ERASE,
    /// CRYPTOGRAPHIC ERASE, EXIT FAILURE MODE.
    pub const SANITIZE: u8 = 0x48;
}

/// Service action of SERVICE ACTION IN(16) selecting GET LBA STATUS.
pub const SA_GET_LBA_STATUS: u8 = 0x12;
/// Service action of MAINTENANCE IN selecting REPORT SUPPORTED OPERATION
/// CODES.
pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
/// Service action of MAINTENANCE IN selecting REPORT SUPPORTED TASK
/// MANAGEMENT FUNCTIONS.
pub const SA_REPORT_SUPPORTED_TMFS: u8 = 0x0D;

/// Service action of SERVICE ACTION IN(16) selecting READ CAPACITY(16).
pub const SA_READ_CAPACITY_16: u8 = 0x10;

/// A logical block address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lba(pub u64);

/// A number of logical blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Blocks(pub u64);

impl Lba {
    /// The byte offset of this block (saturating; callers range-check first).
    pub fn byte_offset(self, block_size: u32) -> u64 {
        self.0.saturating_mul(u64::from(block_size))
    }
}

impl Blocks {
    /// The number of bytes these blocks hold (saturating).
    pub fn bytes(self, block_size: u32) -> u64 {
        self.0.saturating_mul(u64::from(block_size))
    }
}

/// Checks that `count` blocks from `lba` lie inside a unit of `capacity`
/// blocks (SBC-3: LBA + transfer length must not exceed the capacity).
pub fn check_range(lba: Lba, count: Blocks, capacity: Blocks) -> Result<(), Sense> {
    match lba.0.checked_add(count.0) {
        Some(end) if end <= capacity.0 => Ok(()),
        _ => Err(Sense::LBA_OUT_OF_RANGE),
    }
}

/// Byte `i` of the CDB, or INVALID FIELD IN CDB when the CDB is too short.
pub fn byte(cdb: &[u8], i: usize) -> Result<u8, Sense> {
    cdb.get(i).copied().ok_or(Sense::INVALID_FIELD_IN_CDB)
}

fn array<const N: usize>(cdb: &[u8], at: usize) -> Result<[u8; N], Sense> {
    cdb.get(at..at.saturating_add(N))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(Sense::INVALID_FIELD_IN_CDB)
}

/// Big-endian u16 at `at`.
pub fn be16(cdb: &[u8], at: usize) -> Result<u16, Sense> {
    array(cdb, at).map(u16::from_be_bytes)
}

/// Big-endian u32 at `at`.
pub fn be32(cdb: &[u8], at: usize) -> Result<u32, Sense> {
    array(cdb, at).map(u32::from_be_bytes)
}

/// Big-endian u64 at `at`.
pub fn be64(cdb: &[u8], at: usize) -> Result<u64, Sense> {
    array(cdb, at).map(u64::from_be_bytes)
}

/// The CDB length implied by the group code in the opcode's top three bits
/// (SPC-4 §4.2.5.1), `None` for the vendor-specific and reserved groups.
pub fn cdb_len(op: u8) -> Option<usize> {
    match op >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Rejects a CDB shorter than its group's length and a CONTROL byte with the
/// NACA bit set (SAM-5: NACA is not supported, so INVALID FIELD IN CDB).
pub fn check_control(cdb: &[u8]) -> Result<(), Sense> {
    let op = byte(cdb, 0)?;
    let len = cdb_len(op).ok_or(Sense::INVALID_OPCODE)?;
    let control = byte(cdb, len - 1)?;
    if control & 0x04 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    Ok(())
}

/// A decoded READ or WRITE CDB of any size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RwCdb {
    /// True for WRITE, false for READ.
    pub write: bool,
    /// First block.
    pub lba: Lba,
    /// Number of blocks (READ(6)/WRITE(6) length 0 already mapped to 256).
    pub blocks: Blocks,
    /// Force unit access: the data must be on stable storage before GOOD.
    pub fua: bool,
    /// RDPROTECT/WRPROTECT (bits 7-5 of byte 1); must be 0 without protection information.
    pub protect: u8,
}

/// Whether `cdb` is READ(6/10/12/16): the one command whose Data-In buffer
/// [`crate::target::ScsiTarget::execute`] reuses without clearing it first.
pub fn is_read(cdb: &[u8]) -> bool {
    use opcode::*;
    matches!(cdb.first(), Some(&(READ_6 | READ_10 | READ_12 | READ_16)))
}

/// Decodes READ(6/10/12/16) and WRITE(6/10/12/16); `None` for other opcodes.
pub fn parse_rw(cdb: &[u8]) -> Option<Result<RwCdb, Sense>> {
    use opcode::*;
    let op = *cdb.first()?;
    let write = matches!(op, WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16);
    let parsed = match op {
        READ_6 | WRITE_6 => (|| {
            let b1 = byte(cdb, 1)?;
            let lba = (u64::from(b1 & 0x1F) << 16) | u64::from(be16(cdb, 2)?);
            let len = byte(cdb, 4)?;
            let blocks = if len == 0 { 256 } else { u64::from(len) };
            Ok(RwCdb {
                write,
                lba: Lba(lba),
                blocks: Blocks(blocks),
                fua: false,
                protect: 0,
            })
        })(),
        READ_10 | WRITE_10 | READ_12 | WRITE_12 | READ_16 | WRITE_16 => (|| {
            let b1 = byte(cdb, 1)?;
            let (lba, blocks) = match op {
                READ_10 | WRITE_10 => (u64::from(be32(cdb, 2)?), u64::from(be16(cdb, 7)?)),
                READ_12 | WRITE_12 => (u64::from(be32(cdb, 2)?), u64::from(be32(cdb, 6)?)),
                _ => (be64(cdb, 2)?, u64::from(be32(cdb, 10)?)),
            };
            Ok(RwCdb {
                write,
                lba: Lba(lba),
                blocks: Blocks(blocks),
                fua: b1 & 0x08 != 0,
                protect: b1 >> 5,
            })
        })(),
        _ => return None,
    };
    Some(parsed)
}

/// Where a command's data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    /// No data transfer.
    None,
    /// Data-In: target to initiator.
    Read,
    /// Data-Out: initiator to target.
    Write,
}

/// What the transport needs to know from a CDB before executing it: the
/// direction and the number of bytes the CDB says it transfers (for commands
/// with Data-Out, how much to collect: WRITE, WRITE AND VERIFY and VERIFY
/// with BYTCHK their blocks, COMPARE AND WRITE twice its blocks, WRITE SAME
/// one block unless NDOB, UNMAP, MODE SELECT and PERSISTENT RESERVE OUT
/// their parameter list length; for commands with an allocation length,
/// that length). Unknown opcodes and malformed CDBs: direction `None`, length 0.
/// Lengths that do not fit in `u32` saturate.
pub fn command_info(cdb: &[u8], block_size: u32) -> (DataDirection, u32) {
    use opcode::*;
    let none = (DataDirection::None, 0);
    if let Some(rw) = parse_rw(cdb) {
        return match rw {
            Ok(rw) => {
                let bytes = u32::try_from(rw.blocks.bytes(block_size)).unwrap_or(u32::MAX);
                let dir = if rw.write {
                    DataDirection::Write
                } else {
                    DataDirection::Read
                };
                if bytes == 0 { none } else { (dir, bytes) }
            }
            Err(_) => none,
        };
    }
    let Some(&op) = cdb.first() else {
        return none;
    };
    let write = |n: Result<u64, Sense>| match n {
        Ok(0) | Err(_) => none,
        Ok(n) => (DataDirection::Write, u32::try_from(n).unwrap_or(u32::MAX)),
    };
    let bs = u64::from(block_size);
    let b1 = byte(cdb, 1).unwrap_or(0);
    let len: Result<u32, Sense> = match op {
        REQUEST_SENSE | MODE_SENSE_6 => byte(cdb, 4).map(u32::from),
        INQUIRY => be16(cdb, 3).map(u32::from),
        MODE_SENSE_10 | PERSISTENT_RESERVE_IN => be16(cdb, 7).map(u32::from),
        READ_CAPACITY_10 => Ok(8),
        SERVICE_ACTION_IN_16 if matches!(b1 & 0x1F, SA_READ_CAPACITY_16 | SA_GET_LBA_STATUS) => {
            be32(cdb, 10)
        }
        REPORT_LUNS | MAINTENANCE_IN => be32(cdb, 6),
        UNMAP | MODE_SELECT_10 => return write(be16(cdb, 7).map(u64::from)),
        MODE_SELECT_6 => return write(byte(cdb, 4).map(u64::from)),
        PERSISTENT_RESERVE_OUT => return write(be32(cdb, 5).map(u64::from)),
        // One block, or none with NDOB (WRITE SAME(16) byte 1 bit 0).
        WRITE_SAME_10 => return write(Ok(bs)),
        WRITE_SAME_16 if b1 & 0x01 == 0 => return write(Ok(bs)),
        // The blocks to compare, then the blocks to write.
        COMPARE_AND_WRITE => {
            return write(byte(cdb, 13).map(|n| u64::from(n) * 2 * bs));
        }
        WRITE_AND_VERIFY_10 => return write(be16(cdb, 7).map(|n| u64::from(n) * bs)),
        WRITE_AND_VERIFY_12 => return write(be32(cdb, 6).map(|n| u64::from(n) * bs)),
        WRITE_AND_VERIFY_16 | ORWRITE_16 => {
            return write(be32(cdb, 10).map(|n| u64::from(n) * bs));
        }
        // TRANSFER LENGTH is bytes 12-13 (bytes 10-11 are ATOMIC BOUNDARY).
        WRITE_ATOMIC_16 => return write(be16(cdb, 12).map(|n| u64::from(n) * bs)),
        SANITIZE => return write(be16(cdb, 7).map(u64::from)),
        READ_DEFECT_DATA_10 => be16(cdb, 7).map(u32::from),
        EXTENDED_COPY => return write(be32(cdb, 10).map(u64::from)),
        RECEIVE_COPY_RESULTS => be32(cdb, 10),
        READ_DEFECT_DATA_12 => be32(cdb, 6),
        VERIFY_10 | VERIFY_12 | VERIFY_16 => {
            return write(verify_data_len(cdb, block_size));
        }
        _ => return none,
    };
    match len {
        Ok(0) | Err(_) => none,
        Ok(n) => (DataDirection::Read, n),
    }
}

/// The LBA and block count of a VERIFY or WRITE AND VERIFY CDB of any size.
pub(crate) fn verify_lba_and_len(cdb: &[u8]) -> Result<(Lba, Blocks), Sense> {
    use opcode::*;
    let op = byte(cdb, 0)?;
    let (lba, n) = match op {
        VERIFY_10 | WRITE_AND_VERIFY_10 => (u64::from(be32(cdb, 2)?), u64::from(be16(cdb, 7)?)),
        VERIFY_12 | WRITE_AND_VERIFY_12 => (u64::from(be32(cdb, 2)?), u64::from(be32(cdb, 6)?)),
        _ => (be64(cdb, 2)?, u64::from(be32(cdb, 10)?)),
    };
    Ok((Lba(lba), Blocks(n)))
}

/// The Data-Out length of a VERIFY CDB: BYTCHK 01b sends the blocks to
/// compare, 11b one block; 00b nothing.
pub fn verify_data_len(cdb: &[u8], block_size: u32) -> Result<u64, Sense> {
    let (_, n) = verify_lba_and_len(cdb)?;
    Ok(match (byte(cdb, 1)? >> 1) & 0x03 {
        0x01 => n.bytes(block_size),
        0x03 if n.0 > 0 => u64::from(block_size),
        _ => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rw6_zero_means_256() {
        let rw = parse_rw(&[0x08, 0x1F, 0xFF, 0xFF, 0, 0]).unwrap().unwrap();
        assert_eq!(rw.lba, Lba(0x1F_FFFF));
        assert_eq!(rw.blocks, Blocks(256));
        assert_eq!(
            command_info(&[0x0A, 0, 0, 0, 0, 0], 512),
            (DataDirection::Write, 256 * 512)
        );
    }

    #[test]
    fn info_for_each_family() {
        let mut r16 = [0u8; 16];
        r16[0] = 0x88;
        r16[13] = 8;
        assert_eq!(command_info(&r16, 4096), (DataDirection::Read, 32768));
        r16[10] = 0xFF;
        assert_eq!(command_info(&r16, 4096), (DataDirection::Read, u32::MAX));
        assert_eq!(
            command_info(&[0x12, 0, 0, 0, 96, 0], 512),
            (DataDirection::Read, 96)
        );
        assert_eq!(command_info(&[0x00; 6], 512), (DataDirection::None, 0));
        assert_eq!(command_info(&[0xFF; 6], 512), (DataDirection::None, 0));
        assert_eq!(command_info(&[], 512), (DataDirection::None, 0));
        assert_eq!(command_info(&[0x28, 0], 512), (DataDirection::None, 0));
        assert_eq!(
            command_info(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], 512),
            (DataDirection::Write, 24)
        );
    }

    #[test]
    fn range() {
        assert!(check_range(Lba(0), Blocks(10), Blocks(10)).is_ok());
        assert!(check_range(Lba(10), Blocks(0), Blocks(10)).is_ok());
        assert!(check_range(Lba(11), Blocks(0), Blocks(10)).is_err());
        assert!(check_range(Lba(u64::MAX), Blocks(2), Blocks(10)).is_err());
    }
}
