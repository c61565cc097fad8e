//! The aarch64 hardware path: the ARMv8 `crc32c{b,d}` instructions, three
//! independent streams joined in software (GF(2) multiplication by the
//! precomputed `x^(8n) mod P`), mirroring the x86-64 three-way path.
//!
//! Takes and returns the raw CRC register, like every path in this crate.

use core::arch::aarch64::{__crc32cb, __crc32cd};

use crate::gf2::{multiply_mod_p, x_pow_mod_p};

/// Whether the CPU has the CRC32 instructions.
pub fn has_crc() -> bool {
    std::arch::is_aarch64_feature_detected!("crc")
}

/// Bytes per stream per round of the three-way loop.
const STREAM_LEN: usize = 4096;
/// `x^(8 * STREAM_LEN) mod P` and `x^(16 * STREAM_LEN) mod P`: advance a
/// register over one and two stream lengths of bytes.
const SHIFT_ONE: u32 = x_pow_mod_p(8 * STREAM_LEN as u64);
const SHIFT_TWO: u32 = x_pow_mod_p(16 * STREAM_LEN as u64);

/// One stream of 8-byte `crc32cd` instructions, then bytes.
#[target_feature(enable = "crc")]
pub fn update_1way(mut state: u32, data: &[u8]) -> u32 {
    let (words, tail) = data.as_chunks::<8>();
    for word in words {
        state = __crc32cd(state, u64::from_le_bytes(*word));
    }
    for &byte in tail {
        state = __crc32cb(state, byte);
    }
    state
}

/// Three interleaved streams of `STREAM_LEN` bytes, joined in software.
#[target_feature(enable = "crc")]
pub fn update_3way(mut state: u32, mut data: &[u8]) -> u32 {
    while data.len() >= 3 * STREAM_LEN {
        let (first, rest) = data.split_at(STREAM_LEN);
        let (second, rest) = rest.split_at(STREAM_LEN);
        let (third, rest) = rest.split_at(STREAM_LEN);
        let (mut a, mut b, mut c) = (state, 0u32, 0u32);
        let words = first
            .as_chunks::<8>()
            .0
            .iter()
            .zip(second.as_chunks::<8>().0)
            .zip(third.as_chunks::<8>().0);
        for ((x, y), z) in words {
            a = __crc32cd(a, u64::from_le_bytes(*x));
            b = __crc32cd(b, u64::from_le_bytes(*y));
            c = __crc32cd(c, u64::from_le_bytes(*z));
        }
        state = multiply_mod_p(SHIFT_TWO, a) ^ multiply_mod_p(SHIFT_ONE, b) ^ c;
        data = rest;
    }
    update_1way(state, data)
}
