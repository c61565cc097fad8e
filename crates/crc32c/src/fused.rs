//! Copy-and-checksum for algorithms without a single-pass copy: the copy and
//! the CRC are interleaved in chunks small enough that the CRC reads the
//! bytes the copy has just put in L1 cache, instead of copying the whole
//! buffer first and reading it back from memory (FAST '05, section on
//! computing the digest while the data is hot in cache).

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
