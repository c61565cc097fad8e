//! Copy-and-checksum for algorithms without a single-pass copy: the copy and
//! the CRC are interleaved in chunks small enough that the CRC reads the
//! bytes the copy has just put in L1 cache, instead of copying the whole
//! buffer first and reading it back from memory (FAST '05, section on
//! computing the digest while the data is hot in cache).
//!
//! Also where the single-pass copy stops paying: [`SINGLE_PASS_MIN_LEN`].

/// Bytes per copy-then-CRC round: source and destination chunks together
/// (8 KiB) stay well inside a 32 KiB L1 data cache.
pub(crate) const CHUNK: usize = 4096;

/// Copies `src` into `dst` chunk by chunk, advancing the raw register with
/// `update` over each chunk right after copying it.
pub(crate) fn copy_in_chunks(
    update: fn(u32, &[u8]) -> u32,
    mut state: u32,
    dst: &mut [u8],
    src: &[u8],
) -> u32 {
    for (out, chunk) in dst.chunks_mut(CHUNK).zip(src.chunks(CHUNK)) {
        out.copy_from_slice(chunk);
        state = update(state, out);
    }
    state
}

/// The shortest buffer [`crate::Engine::copy_append`] hands to an engine's
/// single-pass copy; shorter ones are copied, then checksummed.
///
/// Why: on a hot buffer the single pass saves no memory traffic, only the
/// second read, while its stores sit beside the folding loop and its fixed
/// cost (joining and reducing the accumulators) is the same as the plain
/// CRC's. Below about 1 KiB that fixed cost dominates, and copying first
/// (memcpy is ~90 GiB/s in L1) then running the plain CRC is as fast or a few
/// percent faster; from 1152 bytes up the single pass wins, by 1.45x at 8 KiB
/// with 512-bit folding (AMD EPYC, AVX-512 + VPCLMULQDQ; `iscsi crc-bench`).
/// A fixed size, not a start-up timing, so the choice never flips between
/// runs.
pub(crate) const SINGLE_PASS_MIN_LEN: usize = 1152;
