//! LUN addressing: the 64-bit LUN field of a command (SAM-5 §4.7).

/// The highest LUN number plus one: REPORT LUNS and `encode_lun` address
/// 16384 LUNs (single-level flat addressing, SAM-5 §4.7.7).
pub const MAX_LUNS: usize = 0x4000;

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
