//! A RAM store's chunk: its bytes and the CRC32C a READ's data digest
//! asked for once, kept until a write changes the bytes.

use std::sync::{Arc, OnceLock};

use iscsi_crc32c::KnownCrc32c;

/// Allocation granule of [`RamBackstore`](super::RamBackstore).
pub const RAM_CHUNK_SIZE: usize = 64 * 1024;

/// One allocated chunk, shared with the reads that lent it.
pub(super) type Chunk = Arc<ChunkData>;

/// A chunk's bytes and, once a READ's data digest asked for it, their
/// CRC32C. Every change goes through [`ChunkData::bytes_mut`], which
/// forgets the CRC, so a remembered CRC is always that of the bytes.
#[derive(Debug, Clone)]
pub(super) struct ChunkData {
    pub(super) bytes: Vec<u8>,
    crc: OnceLock<u32>,
}

impl ChunkData {
    pub(super) fn zeroed() -> Self {
        ChunkData {
            bytes: vec![0u8; RAM_CHUNK_SIZE],
            crc: OnceLock::new(),
        }
    }

    /// A chunk of `bytes` (exactly one chunk long).
    pub(super) fn from_bytes(bytes: Vec<u8>) -> Self {
        debug_assert_eq!(bytes.len(), RAM_CHUNK_SIZE);
        ChunkData {
            bytes,
            crc: OnceLock::new(),
        }
    }

    /// The bytes, to change or to exchange for another buffer of the same
    /// length: the remembered CRC is dropped first.
    pub(super) fn bytes_mut(&mut self) -> &mut Vec<u8> {
        self.crc.take();
        &mut self.bytes
    }
}

impl KnownCrc32c for ChunkData {
    fn crc32c(&self) -> u32 {
        *self.crc.get_or_init(|| iscsi_crc32c::crc32c(&self.bytes))
    }
}
