//! Where a PDU decoder is: the [`Stage`] it reads next. Its own file
//! because decode errors name it (`crate::error`), and the decoder reports
//! those errors: here, both can take it without importing each other.

/// What the decoder is reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The 48-byte BHS.
    Bhs,
    /// TotalAHSLength * 4 bytes of AHS.
    Ahs,
    /// The 4-byte header digest.
    HeaderDigest,
    /// The data segment; deliver it with `feed`, `receive_data` or
    /// `data_received`.
    Data,
    /// 0-3 padding bytes.
    Padding,
    /// The 4-byte data digest.
    DataDigest,
    /// The PDU is whole; the next `feed` reports `End` without consuming.
    Complete,
}
