//! Primary commands (SPC-4): INQUIRY with its standard data and VPD pages
//! (0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2), REPORT LUNS, REQUEST SENSE and
//! MODE SENSE(6/10) with the caching and control pages. (TEST UNIT READY has
//! no body: the dispatcher answers GOOD.)
//!
//! Every response is built whole into the caller's buffer and then cut to the
//! CDB's allocation length, which is never an error.

use crate::backstore::{Backstore, RAM_CHUNK_SIZE};
use crate::cdb::{self, opcode};
use crate::sense::Sense;
use crate::{TargetIdentity, encode_lun};

/// Peripheral device type of a direct-access block device.
const PDT_DISK: u8 = 0x00;
/// Peripheral qualifier 3 / device type 0x1F: no logical unit here.
const PQ_NO_LUN: u8 = 0x7F;

/// The IEEE company ID placed in NAA 6 designators. Zero is a placeholder
/// until the project registers an OUI; uniqueness comes from the backstore's
/// unique id in the vendor-specific extension.
pub const NAA_COMPANY_ID: u32 = 0x00_0000;

/// Largest READ/WRITE transfer accepted, in bytes (reported in the Block
/// Limits VPD page; larger requests end in INVALID FIELD IN CDB).
pub const MAX_TRANSFER_BYTES: u64 = 8 * 1024 * 1024;
/// Largest number of blocks one UNMAP block descriptor may deallocate
/// (libiscsi calls limits above 2^20 insane unless unlimited).
pub const MAX_UNMAP_LBA_COUNT: u32 = 0x0010_0000;
/// Largest number of UNMAP block descriptors per command.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// VPD pages supported, in ascending order.
pub const SUPPORTED_VPD_PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2];

/// SPC-4 version descriptors: SAM-5, SPC-4, SBC-3, iSCSI.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0460, 0x04C0, 0x0960];

fn truncate(data_in: &mut Vec<u8>, alloc: usize) {
    data_in.truncate(alloc);
}

fn put_be16(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_be_bytes());
}

fn put_be32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_be_bytes());
}

/// Appends `s` as an ASCII field of exactly `len` bytes, space-padded;
/// non-printable characters become spaces.
fn put_ascii(v: &mut Vec<u8>, s: &str, len: usize) {
    let bytes = s
        .bytes()
        .map(|b| if (0x20..0x7F).contains(&b) { b } else { b' ' })
        .chain(std::iter::repeat(b' '))
        .take(len);
    v.extend(bytes);
}

/// Writes the length of what follows byte `header` into the 2-byte field at
/// `at` (page length / additional length fields).
fn fix_len16(v: &mut [u8], at: usize, header: usize) {
    let n = u16::try_from(v.len().saturating_sub(header)).unwrap_or(u16::MAX);
    if let Some(f) = v.get_mut(at..at + 2) {
        f.copy_from_slice(&n.to_be_bytes());
    }
}

/// The serial number reported in VPD page 0x80.
pub fn unit_serial(unique_id: u64) -> String {
    format!("{unique_id:016X}")
}

/// INQUIRY. `lu` is `None` for a LUN that does not exist.
pub fn inquiry(
    id: &TargetIdentity,
    lu: Option<&dyn Backstore>,
    cdb: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    let flags = cdb::byte(cdb, 1)?;
    let page = cdb::byte(cdb, 2)?;
    let alloc = usize::from(cdb::be16(cdb, 3)?);
    // Bit 1 is the obsolete CmdDt, bits 7-2 are reserved.
    if flags & 0xFE != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let evpd = flags & 0x01 != 0;
    let pdt = if lu.is_some() { PDT_DISK } else { PQ_NO_LUN };
    if !evpd {
        if page != 0 {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        standard_inquiry(id, pdt, data_in);
    } else {
        match (page, lu) {
            (0x00, Some(_)) => vpd_page(data_in, pdt, 0x00, |v| {
                v.extend_from_slice(&SUPPORTED_VPD_PAGES)
            }),
            (0x00, None) => vpd_page(data_in, pdt, 0x00, |v| v.push(0x00)),
            (0x80, Some(lu)) => vpd_page(data_in, pdt, 0x80, |v| {
                v.extend_from_slice(unit_serial(lu.unique_id()).as_bytes())
            }),
            (0x83, Some(lu)) => vpd_page(data_in, pdt, 0x83, |v| device_identification(id, lu, v)),
            (0xB0, Some(lu)) => vpd_page(data_in, pdt, 0xB0, |v| block_limits(lu, v)),
            (0xB1, Some(_)) => vpd_page(data_in, pdt, 0xB1, |v| {
                // MEDIUM ROTATION RATE 1: non-rotating medium.
                put_be16(v, 0x0001);
                v.resize(v.len() + 0x3C - 2, 0);
            }),
            (0xB2, Some(_)) => vpd_page(data_in, pdt, 0xB2, |v| {
                // Threshold exponent 0; LBPU (UNMAP supported) and LBPRZ
                // (unmapped blocks read as zeros); provisioning type 2, thin.
                v.extend_from_slice(&[0x00, 0x80 | 0x04, 0x02, 0x00]);
            }),
            _ => return Err(Sense::INVALID_FIELD_IN_CDB),
        }
    }
    truncate(data_in, alloc);
    Ok(())
}

fn standard_inquiry(id: &TargetIdentity, pdt: u8, v: &mut Vec<u8>) {
    // Byte 1 RMB 0; version 0x06 (SPC-4); HiSup + response data format 2;
    // additional length filled below; byte 5 no TPGS/3PC/PROTECT; byte 6 0;
    // byte 7 CmdQue.
    v.extend_from_slice(&[pdt, 0x00, 0x06, 0x12, 0, 0x00, 0x00, 0x02]);
    put_ascii(v, &id.vendor, 8);
    put_ascii(v, &id.product, 16);
    put_ascii(v, &id.revision, 4);
    // Bytes 36-57: vendor specific, clocking, reserved.
    v.resize(58, 0);
    for d in VERSION_DESCRIPTORS {
        put_be16(v, d);
    }
    // Pad the version descriptor list to its 8 slots (bytes 58-73).
    v.resize(74, 0);
    let additional = u8::try_from(v.len().saturating_sub(5)).unwrap_or(u8::MAX);
    if let Some(b) = v.get_mut(4) {
        *b = additional;
    }
}

/// A VPD page: header (PDT, page code, 2-byte page length) then `body`.
fn vpd_page(v: &mut Vec<u8>, pdt: u8, page: u8, body: impl FnOnce(&mut Vec<u8>)) {
    v.extend_from_slice(&[pdt, page, 0, 0]);
    body(v);
    fix_len16(v, 2, 4);
}

/// Device Identification (0x83) designation descriptors.
fn device_identification(id: &TargetIdentity, lu: &dyn Backstore, v: &mut Vec<u8>) {
    // NAA 6 (IEEE Registered Extended), logical unit association, binary.
    v.extend_from_slice(&[0x01, 0x03, 0x00, 16]);
    let high = (6u64 << 60) | (u64::from(NAA_COMPANY_ID & 0xFF_FFFF) << 36);
    v.extend_from_slice(&high.to_be_bytes());
    v.extend_from_slice(&lu.unique_id().to_be_bytes());
    // Relative target port identifier 1: iSCSI, PIV, target port association.
    v.extend_from_slice(&[0x51, 0x94, 0x00, 4, 0, 0, 0, 1]);
    // SCSI name strings: the target device, then the target port.
    scsi_name_string(v, 0xA8, &id.target_name);
    scsi_name_string(v, 0x98, &format!("{},t,0x0001", id.target_name));
}

/// A SCSI name string designator (type 8, UTF-8, iSCSI, PIV set) with
/// association byte `assoc_type`; null-terminated and padded to a multiple of 4.
fn scsi_name_string(v: &mut Vec<u8>, assoc_type: u8, name: &str) {
    let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(251).collect();
    bytes.push(0);
    while !bytes.len().is_multiple_of(4) {
        bytes.push(0);
    }
    let len = u8::try_from(bytes.len()).unwrap_or(252);
    v.extend_from_slice(&[0x53, assoc_type, 0x00, len]);
    v.extend_from_slice(&bytes);
}

/// Block Limits (0xB0), page length 0x3C.
fn block_limits(lu: &dyn Backstore, v: &mut Vec<u8>) {
    let bs = u64::from(lu.block_size().max(1));
    let max_blocks = u32::try_from(MAX_TRANSFER_BYTES / bs).unwrap_or(u32::MAX);
    let granularity = u16::try_from((4096 / bs).max(1)).unwrap_or(1);
    let unmap_granularity = u32::try_from(RAM_CHUNK_SIZE as u64 / bs).unwrap_or(1);
    v.push(0); // WSNZ 0
    v.push(0); // MAXIMUM COMPARE AND WRITE LENGTH: not supported
    put_be16(v, granularity); // OPTIMAL TRANSFER LENGTH GRANULARITY
    put_be32(v, max_blocks); // MAXIMUM TRANSFER LENGTH
    put_be32(v, max_blocks); // OPTIMAL TRANSFER LENGTH
    put_be32(v, 0); // MAXIMUM PREFETCH LENGTH
    put_be32(v, MAX_UNMAP_LBA_COUNT);
    put_be32(v, MAX_UNMAP_DESCRIPTORS);
    put_be32(v, unmap_granularity); // OPTIMAL UNMAP GRANULARITY
    put_be32(v, 0x8000_0000); // UGAVALID, alignment 0
    v.extend_from_slice(&0u64.to_be_bytes()); // MAXIMUM WRITE SAME LENGTH
    v.resize(4 + 0x3C, 0);
}

/// REPORT LUNS: every LUN 0..count in peripheral (< 256) or flat addressing.
pub fn report_luns(count: usize, cdb: &[u8], data_in: &mut Vec<u8>) -> Result<(), Sense> {
    let select = cdb::byte(cdb, 2)?;
    let alloc = cdb::be32(cdb, 6)?;
    if alloc < 16 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let listed = match select {
        // 0: all LUs except well-known; 2: all. We have no well-known LUs.
        0x00 | 0x02 => count.min(0x4000),
        // 1: well-known LUs only.
        0x01 => 0,
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    };
    let list_len = u32::try_from(listed * 8).unwrap_or(u32::MAX);
    put_be32(data_in, list_len);
    put_be32(data_in, 0);
    for n in 0..listed {
        let n = u16::try_from(n).unwrap_or(u16::MAX);
        data_in.extend_from_slice(&encode_lun(n).to_be_bytes());
    }
    truncate(data_in, usize::try_from(alloc).unwrap_or(usize::MAX));
    Ok(())
}

/// REQUEST SENSE: returns `pending` (already taken from the LU) or NO SENSE,
/// in fixed or (DESC bit) descriptor format.
pub fn request_sense(
    cdb: &[u8],
    pending: Option<Sense>,
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    let flags = cdb::byte(cdb, 1)?;
    let alloc = usize::from(cdb::byte(cdb, 4)?);
    if flags & 0xFE != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let sense = pending.unwrap_or(Sense::NO_SENSE);
    if flags & 0x01 != 0 {
        data_in.extend_from_slice(&sense.to_descriptor_format());
    } else {
        data_in.extend_from_slice(&sense.to_fixed_format());
    }
    truncate(data_in, alloc);
    Ok(())
}

/// Mode page codes.
const PAGE_CACHING: u8 = 0x08;
const PAGE_CONTROL: u8 = 0x0A;
const PAGE_ALL: u8 = 0x3F;

/// Page control values (CDB byte 2 bits 7-6).
#[derive(Clone, Copy, PartialEq, Eq)]
enum PageControl {
    Current,
    Changeable,
    Default,
}

/// Caching mode page (0x08): WCE set (writes may be cached until
/// SYNCHRONIZE CACHE or FUA); nothing is changeable.
fn caching_page(pc: PageControl, v: &mut Vec<u8>) {
    let wce = if pc == PageControl::Changeable {
        0
    } else {
        0x04
    };
    v.extend_from_slice(&[PAGE_CACHING, 0x12, wce]);
    v.resize(v.len() + 0x12 - 1, 0);
}

/// Control mode page (0x0A): TST 0, D_SENSE 0, QUEUE ALGORITHM MODIFIER 1
/// (unrestricted reordering); nothing is changeable.
fn control_page(pc: PageControl, v: &mut Vec<u8>) {
    if pc == PageControl::Changeable {
        v.extend_from_slice(&[PAGE_CONTROL, 0x0A]);
        v.resize(v.len() + 0x0A, 0);
    } else {
        v.extend_from_slice(&[
            PAGE_CONTROL,
            0x0A,
            0x00,
            0x10,
            0x00,
            0x00,
            0,
            0,
            0xFF,
            0xFF,
            0,
            0,
        ]);
    }
}

/// MODE SENSE(6) and MODE SENSE(10).
pub fn mode_sense(lu: &dyn Backstore, cdb: &[u8], data_in: &mut Vec<u8>) -> Result<(), Sense> {
    let ten = cdb.first() == Some(&opcode::MODE_SENSE_10);
    let flags = cdb::byte(cdb, 1)?;
    let b2 = cdb::byte(cdb, 2)?;
    let subpage = cdb::byte(cdb, 3)?;
    let alloc = if ten {
        usize::from(cdb::be16(cdb, 7)?)
    } else {
        usize::from(cdb::byte(cdb, 4)?)
    };
    let dbd = flags & 0x08 != 0;
    let llbaa = ten && flags & 0x10 != 0;
    let allowed = if ten { 0x18 } else { 0x08 };
    if flags & !allowed != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let pc = match b2 >> 6 {
        0 => PageControl::Current,
        1 => PageControl::Changeable,
        2 => PageControl::Default,
        _ => return Err(Sense::SAVING_PARAMETERS_NOT_SUPPORTED),
    };
    let page = b2 & 0x3F;
    let subpage_ok = subpage == 0 || (page == PAGE_ALL && subpage == 0xFF);
    if !subpage_ok || !matches!(page, PAGE_CACHING | PAGE_CONTROL | PAGE_ALL) {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }

    // Header: mode data length, medium type 0, device-specific parameter
    // (WP 0, DPOFUA 1), block descriptor length.
    let bd_len: u8 = match (dbd, llbaa) {
        (true, _) => 0,
        (false, true) => 16,
        (false, false) => 8,
    };
    let v = data_in;
    if ten {
        v.extend_from_slice(&[0, 0, 0x00, 0x10, u8::from(llbaa), 0, 0, bd_len]);
    } else {
        v.extend_from_slice(&[0, 0x00, 0x10, bd_len]);
    }
    let blocks = lu.block_count();
    let bs = lu.block_size();
    match bd_len {
        8 => {
            put_be32(v, u32::try_from(blocks).unwrap_or(u32::MAX));
            put_be32(v, bs & 0x00FF_FFFF);
        }
        16 => {
            v.extend_from_slice(&blocks.to_be_bytes());
            put_be32(v, 0);
            put_be32(v, bs);
        }
        _ => {}
    }
    if matches!(page, PAGE_CACHING | PAGE_ALL) {
        caching_page(pc, v);
    }
    if matches!(page, PAGE_CONTROL | PAGE_ALL) {
        control_page(pc, v);
    }
    // MODE DATA LENGTH excludes itself.
    if ten {
        fix_len16(v, 0, 2);
    } else {
        let n = u8::try_from(v.len().saturating_sub(1)).unwrap_or(u8::MAX);
        if let Some(b) = v.first_mut() {
            *b = n;
        }
    }
    truncate(v, alloc);
    Ok(())
}
