//! The bitwise reference: one shift-and-conditional-xor per message bit.
//!
//! Slow (tens of cycles per byte) and obviously correct: it is the
//! definition of RFC 7143 Appendix B.4 written out, and every faster
//! algorithm is tested against it.

use crate::gf2::POLY_REFLECTED;

/// Advances a raw CRC register over `data`, one bit at a time.
pub fn update(mut state: u32, data: &[u8]) -> u32 {
    for &byte in data {
        state ^= u32::from(byte);
        for _ in 0..8 {
            let feedback = if state & 1 != 0 { POLY_REFLECTED } else { 0 };
            state = (state >> 1) ^ feedback;
        }
    }
    state
}
