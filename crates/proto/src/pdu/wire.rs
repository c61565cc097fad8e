//! Big-endian field access at fixed offsets of a 48-byte BHS (RFC 7143
//! section 11.2.1: all multi-byte integers are in network byte order).
//!
//! Offsets are constants of the PDU formats, never peer data, so the fixed
//! array indexing here cannot fail at run time for any input bytes.

use crate::serial::Serial;

/// Length of the Basic Header Segment (RFC 7143 section 11.2.1).
pub const BHS_LEN: usize = 48;

/// The `u16` at `at`.
pub(crate) fn u16_at(b: &[u8; BHS_LEN], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The 24-bit value at `at`.
pub(crate) fn u24_at(b: &[u8; BHS_LEN], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

/// The `u32` at `at`.
pub(crate) fn u32_at(b: &[u8; BHS_LEN], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The `u64` at `at`.
pub(crate) fn u64_at(b: &[u8; BHS_LEN], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

/// The serial number at `at`.
pub(crate) fn sn_at<K>(b: &[u8; BHS_LEN], at: usize) -> Serial<K> {
    Serial::new(u32_at(b, at))
}

/// Writes `v` at `at`.
pub(crate) fn put_u16(b: &mut [u8; BHS_LEN], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes the low 24 bits of `v` at `at`.
pub(crate) fn put_u24(b: &mut [u8; BHS_LEN], at: usize, v: u32) {
    let [_, x, y, z] = v.to_be_bytes();
    b[at] = x;
    b[at + 1] = y;
    b[at + 2] = z;
}

/// Writes `v` at `at`.
pub(crate) fn put_u32(b: &mut [u8; BHS_LEN], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Writes `v` at `at`.
pub(crate) fn put_u64(b: &mut [u8; BHS_LEN], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Writes serial number `sn` at `at`.
pub(crate) fn put_sn<K>(b: &mut [u8; BHS_LEN], at: usize, sn: Serial<K>) {
    put_u32(b, at, sn.get());
}

/// Byte 0 with the opcode and, for `immediate`, the I bit (0x40, RFC 7143
/// section 11.2.1.1).
pub(crate) fn opcode_byte(opcode: u8, immediate: bool) -> u8 {
    opcode | if immediate { 0x40 } else { 0 }
}

/// Whether the I bit is set in byte 0.
pub(crate) fn immediate(b: &[u8; BHS_LEN]) -> bool {
    b[0] & 0x40 != 0
}

/// `bit` when `on`, else 0.
pub(crate) const fn flag(on: bool, bit: u8) -> u8 {
    if on { bit } else { 0 }
}
