//! The wire formats, one file per header (the smoltcp layout): each has a
//! `Repr` that `parse`s (validating lengths, never panicking) and `emit`s
//! into a buffer of at least `buffer_len()` bytes (emit may panic on a
//! buffer that is too small: that is a caller bug, not a peer's).
//!
//! Parsers check only what the layout needs; protocol rules (versions,
//! queue numbers, MSNs) are checked by [`crate::fpdu`], which knows which
//! Terminate each broken rule calls for.

pub mod ddp;
pub mod mpa;
pub mod rdmap;

/// A header that could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header needs.
    #[error("truncated header")]
    Truncated,
    /// The start-up frame key is neither "MPA ID Req Frame" nor "MPA ID Rep Frame".
    #[error("not an MPA start-up frame")]
    BadKey,
}

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}
