//! Mode parameters (SPC-4 §7.5): MODE SENSE(6/10) (SPC-4 §6.11, §6.12) and
//! MODE SELECT(6/10) (SPC-4 §6.9, §6.10) over the caching page (SBC-3
//! §6.4.5, 08h), the control page (SPC-4 §7.5.8, 0Ah) and the
//! informational exceptions control page (SPC-4 §7.5.11, 1Ch).
//!
//! Changeable: WCE (caching), D_SENSE and SWP (control). Everything else is
//! fixed; a MODE SELECT that changes a fixed bit is INVALID FIELD IN
//! PARAMETER LIST. Saved parameters are not supported.

use crate::backstore::Backstore;
use crate::cdb::{self, opcode};
use crate::lu::ModeParams;
use iscsi_sense::Sense;

/// Caching mode page code.
pub const PAGE_CACHING: u8 = 0x08;
/// Control mode page code.
pub const PAGE_CONTROL: u8 = 0x0A;
/// Informational exceptions control mode page code.
pub const PAGE_IEC: u8 = 0x1C;
/// "Return all pages".
pub const PAGE_ALL: u8 = 0x3F;

/// The pages in the order MODE SENSE returns them for page 3Fh.
const PAGES: [u8; 3] = [PAGE_CACHING, PAGE_CONTROL, PAGE_IEC];

/// Page control values (CDB byte 2 bits 7-6).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PageControl {
    Current,
    Changeable,
    Default,
}

/// The bytes of one page (header included) for `pc`.
fn page(code: u8, pc: PageControl, current: ModeParams) -> Vec<u8> {
    let m = match pc {
        PageControl::Current => current,
        _ => ModeParams::DEFAULT,
    };
    let changeable = pc == PageControl::Changeable;
    match code {
        PAGE_CACHING => {
            // Byte 2: WCE (bit 2). RCD 0: reads may be cached.
            let b2 = if changeable {
                0x04
            } else {
                u8::from(m.wce) << 2
            };
            let mut v = vec![PAGE_CACHING, 0x12, b2];
            v.resize(2 + 0x12, 0);
            v
        }
        PAGE_CONTROL => {
            if changeable {
                // D_SENSE (byte 2 bit 2), SWP (byte 4 bit 3).
                vec![PAGE_CONTROL, 0x0A, 0x04, 0, 0x08, 0, 0, 0, 0, 0, 0, 0]
            } else {
                // TST 0; QUEUE ALGORITHM MODIFIER 1 (unrestricted
                // reordering); busy timeout unlimited.
                vec![
                    PAGE_CONTROL,
                    0x0A,
                    u8::from(m.d_sense) << 2,
                    0x10,
                    u8::from(m.swp) << 3,
                    0x00,
                    0,
                    0,
                    0xFF,
                    0xFF,
                    0,
                    0,
                ]
            }
        }
        _ => {
            // Informational exceptions: DEXCPT 1 (disabled), MRIE 0.
            let b2 = if changeable { 0 } else { 0x08 };
            let mut v = vec![PAGE_IEC, 0x0A, b2];
            v.resize(2 + 0x0A, 0);
            v
        }
    }
}

/// MODE SENSE(6) and MODE SENSE(10).
pub(crate) fn mode_sense(
    lu: &dyn Backstore,
    current: ModeParams,
    cdb: &[u8],
    data_in: &mut Vec<u8>,
) -> Result<(), Sense> {
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
    let code = b2 & 0x3F;
    let subpage_ok = subpage == 0 || (code == PAGE_ALL && subpage == 0xFF);
    if !subpage_ok || !(PAGES.contains(&code) || code == PAGE_ALL) {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }

    // Header: mode data length, medium type 0, device-specific parameter
    // (WP from SWP or a read-only LU, DPOFUA 1), block descriptor length.
    let bd_len: u8 = match (dbd, llbaa) {
        (true, _) => 0,
        (false, true) => 16,
        (false, false) => 8,
    };
    let wp = current.swp || lu.lu_options().read_only;
    let dsp = 0x10 | if wp { 0x80 } else { 0 };
    let v = data_in;
    if ten {
        v.extend_from_slice(&[0, 0, 0x00, dsp, u8::from(llbaa), 0, 0, bd_len]);
    } else {
        v.extend_from_slice(&[0, 0x00, dsp, bd_len]);
    }
    let blocks = lu.block_count();
    let bs = lu.block_size();
    match bd_len {
        8 => {
            // Short LBA descriptor: 0xFFFFFFFF when the count does not fit.
            v.extend_from_slice(&u32::try_from(blocks).unwrap_or(u32::MAX).to_be_bytes());
            v.extend_from_slice(&(bs & 0x00FF_FFFF).to_be_bytes());
        }
        16 => {
            v.extend_from_slice(&blocks.to_be_bytes());
            v.extend_from_slice(&0u32.to_be_bytes());
            v.extend_from_slice(&bs.to_be_bytes());
        }
        _ => {}
    }
    for p in PAGES {
        if code == PAGE_ALL || code == p {
            v.extend_from_slice(&page(p, pc, current));
        }
    }
    // MODE DATA LENGTH excludes itself.
    if ten {
        let n = u16::try_from(v.len().saturating_sub(2)).unwrap_or(u16::MAX);
        if let Some(f) = v.get_mut(0..2) {
            f.copy_from_slice(&n.to_be_bytes());
        }
    } else {
        let n = u8::try_from(v.len().saturating_sub(1)).unwrap_or(u8::MAX);
        if let Some(b) = v.first_mut() {
            *b = n;
        }
    }
    v.truncate(alloc);
    Ok(())
}

/// The PARAMETER LIST LENGTH of a MODE SELECT(6)/(10) CDB.
pub fn mode_select_param_len(cdb: &[u8]) -> Result<u16, Sense> {
    if cdb.first() == Some(&opcode::MODE_SELECT_10) {
        cdb::be16(cdb, 7)
    } else {
        cdb::byte(cdb, 4).map(u16::from)
    }
}

/// MODE SELECT(6) and MODE SELECT(10): validates the whole parameter list
/// (header, block descriptor, every page) before changing anything. Returns
/// whether a parameter changed (the caller then raises MODE PARAMETERS
/// CHANGED for the other nexuses, SPC-4 §6.9).
pub(crate) fn mode_select(
    lu: &dyn Backstore,
    params: &mut ModeParams,
    cdb: &[u8],
    data_out: &[u8],
) -> Result<bool, Sense> {
    let ten = cdb.first() == Some(&opcode::MODE_SELECT_10);
    let flags = cdb::byte(cdb, 1)?;
    // PF (bit 4) must be set: we only speak the SPC page format. SP (bit 0)
    // asks to save, which is not supported. Bits 7-5 and 3-1 are reserved.
    if flags & 0x10 == 0 || flags & 0xEF != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let len = usize::from(mode_select_param_len(cdb)?);
    if len == 0 {
        return Ok(false);
    }
    let list = data_out
        .get(..len)
        .ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?;
    let bad = Sense::INVALID_FIELD_IN_PARAMETER_LIST;
    let (header_len, bd_len, long_lba) = if ten {
        let h = list.get(..8).ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?;
        (
            8usize,
            usize::from(u16::from_be_bytes([h[6], h[7]])),
            h[4] & 0x01 != 0,
        )
    } else {
        let h = list.get(..4).ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?;
        (4usize, usize::from(h[3]), false)
    };
    let bd_end = header_len
        .checked_add(bd_len)
        .ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?;
    let bds = list
        .get(header_len..bd_end)
        .ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?;
    // Block descriptors may restate the geometry but not change it.
    let bs = lu.block_size();
    if long_lba {
        if bd_len % 16 != 0 {
            return Err(bad);
        }
        for d in bds.chunks_exact(16) {
            let block_len = cdb::be32(d, 12).map_err(|_| bad)?;
            if block_len != bs {
                return Err(bad);
            }
        }
    } else {
        if bd_len % 8 != 0 {
            return Err(bad);
        }
        for d in bds.chunks_exact(8) {
            let block_len = cdb::be32(d, 4).map_err(|_| bad)? & 0x00FF_FFFF;
            if block_len != bs {
                return Err(bad);
            }
        }
    }
    let mut new = *params;
    let mut rest = list.get(bd_end..).unwrap_or_default();
    while !rest.is_empty() {
        let code = rest.first().copied().unwrap_or(0);
        // SPF (subpage format) pages are not supported; PS is reserved.
        if code & 0x40 != 0 {
            return Err(bad);
        }
        let code = code & 0x3F;
        if !PAGES.contains(&code) {
            return Err(bad);
        }
        let page_len = usize::from(*rest.get(1).ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?);
        let sent = rest
            .get(..2 + page_len)
            .ok_or(Sense::PARAMETER_LIST_LENGTH_ERROR)?;
        let current = page(code, PageControl::Current, *params);
        let mask = page(code, PageControl::Changeable, *params);
        if sent.len() != current.len() {
            return Err(bad);
        }
        // Byte 0 (PS/SPF/code) and byte 1 (length) were checked above.
        let fixed_changed = sent
            .iter()
            .zip(&current)
            .zip(&mask)
            .skip(2)
            .any(|((s, c), m)| (s ^ c) & !m != 0);
        if fixed_changed {
            return Err(bad);
        }
        match code {
            PAGE_CACHING => new.wce = sent.get(2).is_some_and(|b| b & 0x04 != 0),
            PAGE_CONTROL => {
                new.d_sense = sent.get(2).is_some_and(|b| b & 0x04 != 0);
                new.swp = sent.get(4).is_some_and(|b| b & 0x08 != 0);
            }
            _ => {}
        }
        rest = rest.get(2 + page_len..).unwrap_or_default();
    }
    let changed = new != *params;
    *params = new;
    Ok(changed)
}
