//! Changing a store's size while it serves ([`super::Backstore::resize`]):
//! what a resize may do, and why one was refused.
//!
//! Growing never needs force: the new blocks read as zeros (RAM, a file
//! extended) or as what the device holds there (a block device its owner
//! grew), and every nexus hears CAPACITY DATA HAS CHANGED before its next
//! command runs. Shrinking drops whatever lies beyond the new end, so a
//! store that can tell data lies there refuses unless told to discard it.

use std::io;

/// Why a store kept its size: nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// The store cannot change its size here; the words say what can.
    #[error("{0}")]
    Unsupported(String),
    /// Zero, or not a multiple of the block size.
    #[error("{size} bytes is zero or not a multiple of the block size {block_size}")]
    InvalidSize {
        /// The size asked for.
        size: u64,
        /// The store's block size.
        block_size: u32,
    },
    /// Past what the store can hold.
    #[error("{size} bytes is more than this store can grow to ({max} bytes){why}")]
    TooLarge {
        /// The size asked for.
        size: u64,
        /// The largest it can be.
        max: u64,
        /// What limits it, if worth saying (", the device's size").
        why: String,
    },
    /// Written data lies beyond the new end, and discarding it was not
    /// asked for.
    #[error(
        "data is written beyond the new end (at byte {at}; the new end is {size}): a shrink \
         would drop it, which only `iscsi target resize --force --discard` does"
    )]
    DataBeyond {
        /// The first byte of data found beyond the new end.
        at: u64,
        /// The size asked for.
        size: u64,
    },
    /// A SANITIZE is running on (or failed on) the LU: its medium is not
    /// resized under it.
    #[error("a SANITIZE runs on this LU (or failed and was not exited): resize it afterwards")]
    Sanitizing,
    /// The target has no LUN of that number.
    #[error("no LUN {0}")]
    NoLun(u16),
    /// The store failed (extending a file, reading a device's size).
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// The checks every store makes of a size asked for: a non-zero multiple
/// of the block size.
pub fn check_size(size: u64, block_size: u32) -> Result<(), ResizeError> {
    if size == 0 || !size.is_multiple_of(u64::from(block_size)) {
        return Err(ResizeError::InvalidSize { size, block_size });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_against_the_block_size() {
        assert!(check_size(4096, 512).is_ok());
        assert!(matches!(
            check_size(0, 512),
            Err(ResizeError::InvalidSize { size: 0, .. })
        ));
        assert!(check_size(1000, 512).is_err());
        assert!(check_size(1 << 20, 4096).is_ok());
        assert!(check_size(4096 + 512, 4096).is_err());
    }
}
