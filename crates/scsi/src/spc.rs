//! Primary commands (SPC-4): INQUIRY with its standard data and VPD pages
//! (0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2), REPORT LUNS and REQUEST SENSE.
//! (TEST UNIT READY has no body: the dispatcher answers GOOD. Mode pages
//! live in [`crate::mode`], reservations in [`crate::pr`].)
//!
//! Every response is built whole into the caller's buffer and then cut to the
//! CDB's allocation length, which is never an error.

use crate::backstore::Backstore;
use crate::cdb;
use crate::lun::encode_lun;
use iscsi_sense::Sense;

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
    /// The IEEE company ID (24-bit OUI or CID) of the LUs' NAA designators
    /// (VPD page 83h); [`NAA_COMPANY_ID`] unless configured.
    pub naa_company_id: u32,
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
            naa_company_id: NAA_COMPANY_ID,
        }
    }
}

/// Peripheral device type of a direct-access block device.
const PDT_DISK: u8 = 0x00;
/// Peripheral qualifier 3 / device type 0x1F: no logical unit here.
const PQ_NO_LUN: u8 = 0x7F;

/// The IEEE company ID (OUI) placed in NAA 6 designators unless the target
/// is configured with its own ([`TargetIdentity::naa_company_id`]):
/// 00-14-05, the one Linux's LIO target puts in its NAA 6 designators
/// ("OpenFabrics IEEE Company ID" in target_core_spc.c). The project has no
/// OUI of its own; this one makes our designators look like those of the
/// most widely deployed software target, which every initiator already
/// meets, instead of 00-00-00 (an OUI assigned to somebody else). A site
/// that owns an OUI or CID should configure it.
pub const NAA_COMPANY_ID: u32 = 0x00_1405;

/// The 16-byte NAA IEEE Registered Extended designator (NAA 6, SPC-4
/// §7.8.6.6.5) of the LU whose store has `unique_id`: the company id, 36
/// bits of vendor-specific identifier (zero) and the unique id as the
/// 64-bit extension. Stable as long as the unique id is (the target
/// derives it from the target name, LUN number and store).
pub fn naa_designator(company_id: u32, unique_id: u64) -> [u8; 16] {
    let high = (6u64 << 60) | (u64::from(company_id & 0xFF_FFFF) << 36);
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&high.to_be_bytes());
    d[8..].copy_from_slice(&unique_id.to_be_bytes());
    d
}

/// Largest READ/WRITE transfer accepted (`cdb`, where requests are
/// checked), reported in the Block Limits VPD page.
pub use crate::cdb::MAX_TRANSFER_BYTES;
/// Largest number of blocks one UNMAP block descriptor may deallocate
/// (libiscsi calls limits above 2^20 insane unless unlimited).
pub const MAX_UNMAP_LBA_COUNT: u32 = 0x0010_0000;
/// Largest number of UNMAP block descriptors per command.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// MAXIMUM COMPARE AND WRITE LENGTH in blocks (Block Limits VPD page).
pub const MAX_COMPARE_AND_WRITE_BLOCKS: u8 = 128;
/// MAXIMUM WRITE SAME LENGTH in blocks (Block Limits VPD page); also the
/// bound on WRITE SAME with NUMBER OF LOGICAL BLOCKS 0 ("to the end").
pub const MAX_WRITE_SAME_BLOCKS: u32 = MAX_UNMAP_LBA_COUNT;

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

/// The LU an INQUIRY asks about, as the answer needs it.
#[derive(Clone, Copy)]
pub struct InquiredLu<'a> {
    /// Its store.
    pub store: &'a dyn Backstore,
    /// For an LU with implicit ALUA ([`crate::alua`]), the relative target
    /// port the command came through (TPGS 01b, and that port and its
    /// group in VPD 83h).
    pub alua_port: Option<u16>,
    /// MAXIMUM COMPARE AND WRITE LENGTH (Block Limits): the most blocks
    /// the LU compares and writes atomically now, which for an LU several
    /// gateways serve is what its store does in one step.
    pub max_compare_blocks: u8,
}

/// INQUIRY. `lu` is `None` for a LUN that does not exist.
pub fn inquiry(
    id: &TargetIdentity,
    lu: Option<InquiredLu<'_>>,
    cdb: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
    let alua_port = lu.and_then(|lu| lu.alua_port);
    let max_compare = lu.map_or(MAX_COMPARE_AND_WRITE_BLOCKS, |lu| lu.max_compare_blocks);
    let lu = lu.map(|lu| lu.store);
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
        let removable = lu.is_some_and(|lu| lu.lu_options().removable);
        standard_inquiry(id, pdt, removable, alua_port.is_some(), data_in);
    } else {
        match (page, lu) {
            (0x00, Some(_)) => vpd_page(data_in, pdt, 0x00, |v| {
                v.extend_from_slice(&SUPPORTED_VPD_PAGES)
            }),
            (0x00, None) => vpd_page(data_in, pdt, 0x00, |v| v.push(0x00)),
            (0x80, Some(lu)) => vpd_page(data_in, pdt, 0x80, |v| {
                v.extend_from_slice(unit_serial(lu.unique_id()).as_bytes())
            }),
            (0x83, Some(lu)) => vpd_page(data_in, pdt, 0x83, |v| {
                device_identification(id, lu, alua_port, v)
            }),
            (0xB0, Some(lu)) => vpd_page(data_in, pdt, 0xB0, |v| block_limits(lu, max_compare, v)),
            (0xB1, Some(lu)) => vpd_page(data_in, pdt, 0xB1, |v| {
                // MEDIUM ROTATION RATE 1: non-rotating medium.
                put_be16(v, 0x0001);
                // Byte 6 PRODUCT TYPE 0; byte 7 WABEREQ (bits 7-6) 01b
                // where SANITIZE BLOCK ERASE exists: a block not written
                // since the erase reads with GOOD status (as zeros,
                // LBPRZ); WACEREQ (bits 5-4) 01b where CRYPTOGRAPHIC ERASE
                // exists: such a block reads with GOOD status, its data
                // indeterminate (SBC-4 §6.6.2).
                let wabereq = if lu.can_block_erase() { 0x40 } else { 0x00 };
                let wacereq = if lu.can_crypto_erase() { 0x10 } else { 0x00 };
                v.extend_from_slice(&[0x00, wabereq | wacereq]);
                v.resize(v.len() + 0x3C - 4, 0);
            }),
            (0xB2, Some(lu)) => vpd_page(data_in, pdt, 0xB2, |v| {
                // Logical Block Provisioning (SBC-3 §6.5.4): threshold
                // exponent 0; thin stores set LBPU (UNMAP), LBPWS (WRITE
                // SAME(16) with UNMAP), LBPWS10 and provisioning type 2
                // (thin); LBPRZ always (unmapped blocks read as zeros).
                if lu.is_thin() {
                    v.extend_from_slice(&[0x00, 0x80 | 0x40 | 0x20 | 0x04, 0x02, 0x00]);
                } else {
                    v.extend_from_slice(&[0x00, 0x04, 0x00, 0x00]);
                }
            }),
            _ => return Err(Sense::INVALID_FIELD_IN_CDB),
        }
    }
    truncate(data_in, alloc);
    Ok(())
}

fn standard_inquiry(id: &TargetIdentity, pdt: u8, removable: bool, alua: bool, v: &mut Vec<u8>) {
    // Byte 1 RMB (a removable LU); version 0x06 (SPC-4); HiSup + response
    // data format 2; additional length filled below; byte 5 3PC (EXTENDED
    // COPY and RECEIVE COPY RESULTS, `crate::xcopy`), TPGS 01b (implicit
    // ALUA) for an LU with an ALUA group, else 00b, no PROTECT; byte 6 0;
    // byte 7 CmdQue.
    let rmb = if removable { 0x80 } else { 0x00 };
    let tpgs = if alua { 0x10 } else { 0x00 };
    v.extend_from_slice(&[pdt, rmb, 0x06, 0x12, 0, 0x08 | tpgs, 0x00, 0x02]);
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
///
/// Without ALUA the target port is always reported as 1 (what this page
/// said before ALUA: one process, one port as far as the LU knows). With
/// ALUA (`alua_port`) it is the port the command came through, and a
/// target port group designator (type 5) follows: a host matches it with
/// REPORT TARGET PORT GROUPS to learn which group its path is in.
fn device_identification(
    id: &TargetIdentity,
    lu: &dyn Backstore,
    alua_port: Option<u16>,
    v: &mut Vec<u8>,
) {
    // NAA 6 (IEEE Registered Extended), logical unit association, binary.
    v.extend_from_slice(&[0x01, 0x03, 0x00, 16]);
    v.extend_from_slice(&naa_designator(id.naa_company_id, lu.unique_id()));
    // Relative target port identifier (type 4): iSCSI, PIV, target port
    // association.
    let [hi, lo] = alua_port.unwrap_or(1).to_be_bytes();
    v.extend_from_slice(&[0x51, 0x94, 0x00, 4, 0, 0, hi, lo]);
    if alua_port.is_some() {
        // Target port group (type 5): the group id is the port's id.
        v.extend_from_slice(&[0x51, 0x95, 0x00, 4, 0, 0, hi, lo]);
    }
    // SCSI name strings: the target device, then the target port.
    scsi_name_string(v, 0xA8, &id.target_name);
    let port = u16::from_be_bytes([hi, lo]);
    scsi_name_string(v, 0x98, &format!("{},t,0x{port:04x}", id.target_name));
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

/// Block Limits (0xB0, SBC-3 §6.5.3), page length 0x3C.
fn block_limits(lu: &dyn Backstore, max_compare: u8, v: &mut Vec<u8>) {
    let bs = u64::from(lu.block_size().max(1));
    let max_blocks = u32::try_from(MAX_TRANSFER_BYTES / bs).unwrap_or(u32::MAX);
    // OPTIMAL TRANSFER LENGTH GRANULARITY: a physical block (512e: 8), and
    // never below 4 KiB, the page size initiators' I/O comes in anyway.
    let physical = u64::from(lu.lu_options().physical_block_size.unwrap_or(0));
    let granularity = u16::try_from((physical.max(4096) / bs).max(1)).unwrap_or(1);
    let unmap_granularity = u32::try_from((lu.unmap_granularity() / bs).max(1)).unwrap_or(1);
    let thin = lu.is_thin();
    v.push(0); // WSNZ 0: WRITE SAME with 0 blocks means "to the end"
    v.push(max_compare);
    put_be16(v, granularity); // OPTIMAL TRANSFER LENGTH GRANULARITY
    put_be32(v, max_blocks); // MAXIMUM TRANSFER LENGTH
    put_be32(v, max_blocks); // OPTIMAL TRANSFER LENGTH
    put_be32(v, 0); // MAXIMUM PREFETCH LENGTH
    put_be32(v, if thin { MAX_UNMAP_LBA_COUNT } else { 0 });
    put_be32(v, if thin { MAX_UNMAP_DESCRIPTORS } else { 0 });
    put_be32(v, unmap_granularity); // OPTIMAL UNMAP GRANULARITY
    put_be32(v, 0x8000_0000); // UGAVALID, alignment 0
    v.extend_from_slice(&u64::from(MAX_WRITE_SAME_BLOCKS).to_be_bytes());
    // Bytes 44-63 (SBC-4): the atomic write limits, what the store can
    // promise (see `crate::atomic`); all zero where it promises nothing.
    v.extend_from_slice(&crate::atomic::AtomicLimits::of(lu).vpd_bytes());
    v.resize(4 + 0x3C, 0);
}

/// REPORT LUNS: every LUN in `numbers` (ascending), in peripheral (< 256)
/// or flat addressing.
pub fn report_luns(numbers: &[u16], cdb: &[u8], data_in: &mut Vec<u8>) -> Result<(), Sense> {
    let select = cdb::byte(cdb, 2)?;
    let alloc = cdb::be32(cdb, 6)?;
    if alloc < 16 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let listed: &[u16] = match select {
        // 0: all LUs except well-known; 2: all. We have no well-known LUs.
        0x00 | 0x02 => numbers,
        // 1: well-known LUs only.
        0x01 => &[],
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    };
    let list_len = u32::try_from(listed.len() * 8).unwrap_or(u32::MAX);
    put_be32(data_in, list_len);
    put_be32(data_in, 0);
    for &n in listed {
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
