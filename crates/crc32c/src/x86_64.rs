//! The x86-64 hardware paths.
//!
//! - [`update_sse42`]: one stream of SSE4.2 `crc32` instructions, 8 bytes
//!   each. `crc32` has a latency of 3 cycles and a throughput of 1 per cycle,
//!   so one dependent stream runs at a third of what the unit can do.
//! - [`update_sse42_3way`]: three independent `crc32` streams over three
//!   equal stretches of the buffer, joined with one carry-less multiply per
//!   stream (the register of stream *i* shifted over the bytes after it).
//! - [`update_pclmul`] / [`update_vpclmul`]: carry-less-multiply folding,
//!   128 and 256 bits per register: the buffer is folded 16 bytes at a time
//!   into a few accumulators, which are then folded into one 128-bit block and
//!   reduced with two `crc32` instructions.
//! - [`update_hybrid`]: both at once. `VPCLMULQDQ` folding and `crc32` run on
//!   different execution units, so one loop that folds 128 bytes with vector
//!   registers while three `crc32` streams cover 3 x 48 more keeps both busy;
//!   the four partial registers are joined by carry-less multiplication.
//! - [`update_copy_vpclmul`]: the same folding loop that also stores every
//!   block it loaded into the destination, so each byte is read from memory
//!   once, copied and folded while it is in a register (the FAST '05 study's
//!   interleaving, at the finest grain).
//! - [`update_vpclmul512`] / [`update_copy_vpclmul512`]: the folding loop
//!   with 512-bit registers (AVX-512F), 256 bytes per step. On AMD EPYC
//!   (Zen 4) a 512-bit `vpclmulqdq` costs about what a 256-bit one does, so
//!   this folds twice as many bytes per multiply: the 256-bit fused copy was
//!   bound by its multiplies (~27 GiB/s in L1, against ~95 for memcpy and
//!   ~37-57 for the hybrid CRC alone), which made it slower than copying then
//!   running the hybrid on hot buffers. The 512-bit copy runs at the plain
//!   512-bit CRC's speed (its stores fit beside the multiplies), so copy and
//!   CRC together cost what the CRC alone does.
//!
//! All functions here take and return the *raw* CRC register (no pre- or
//! post-inversion). The constants are `x^k mod P` from [`crate::gf2`],
//! computed at compile time.
//!
//! Every function is a safe `#[target_feature]` function: calling one needs
//! `unsafe` and a proof that the CPU has the features, which
//! [`crate::Algorithm::engine`] gives after run-time detection.

use core::arch::x86_64::*;

use crate::gf2::clmul_shift_constant;

/// Whether the CPU has SSE4.2 (`crc32`).
pub fn has_sse42() -> bool {
    std::arch::is_x86_feature_detected!("sse4.2")
}

/// Whether the CPU has SSE4.2 and `PCLMULQDQ`.
pub fn has_pclmul() -> bool {
    has_sse42() && std::arch::is_x86_feature_detected!("pclmulqdq")
}

/// Whether the CPU has SSE4.2, `PCLMULQDQ`, AVX2 and 256-bit `VPCLMULQDQ`.
pub fn has_vpclmul() -> bool {
    has_pclmul()
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
}

/// One `crc32` stream, 8 bytes per instruction, then byte by byte.
#[target_feature(enable = "sse4.2")]
pub fn update_sse42(state: u32, data: &[u8]) -> u32 {
    let (words, tail) = data.as_chunks::<8>();
    let mut wide = u64::from(state);
    for word in words {
        wide = _mm_crc32_u64(wide, u64::from_le_bytes(*word));
    }
    let mut state = wide as u32;
    for &byte in tail {
        state = _mm_crc32_u8(state, byte);
    }
    state
}

/// The per-stream length unit of the three-way path.
const STREAM_UNIT: usize = 64;
/// The longest stretch one stream covers before the streams are joined:
/// long enough that the join (two multiplies, ~15 cycles) is noise, short
/// enough that a 64 KiB buffer still uses all three streams throughout.
const MAX_STREAM_UNITS: usize = 128;

/// `STREAM_SHIFT[j]` shifts a register over `j * STREAM_UNIT` bytes.
static STREAM_SHIFT: [u64; 2 * MAX_STREAM_UNITS + 1] = stream_shift_constants();

const fn stream_shift_constants() -> [u64; 2 * MAX_STREAM_UNITS + 1] {
    let mut table = [0u64; 2 * MAX_STREAM_UNITS + 1];
    let mut units = 1;
    while units <= 2 * MAX_STREAM_UNITS {
        table[units] = clmul_shift_constant(8 * (units * STREAM_UNIT) as u64);
        units += 1;
    }
    table
}

/// `state * x^(8n) mod P` for the `n` whose constant is `shift`, by one
/// carry-less multiply and one `crc32` reduction.
#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn shift_register(state: u64, shift: u64) -> u32 {
    let product = _mm_clmulepi64_si128::<0x00>(
        _mm_cvtsi64_si128(state as i64),
        _mm_cvtsi64_si128(shift as i64),
    );
    _mm_crc32_u64(0, _mm_cvtsi128_si64(product) as u64) as u32
}

/// Three interleaved `crc32` streams joined by carry-less multiplication.
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub fn update_sse42_3way(mut state: u32, mut data: &[u8]) -> u32 {
    while data.len() >= 3 * STREAM_UNIT {
        let units = (data.len() / (3 * STREAM_UNIT)).min(MAX_STREAM_UNITS);
        let stream_len = units * STREAM_UNIT;
        let (first, rest) = data.split_at(stream_len);
        let (second, rest) = rest.split_at(stream_len);
        let (third, rest) = rest.split_at(stream_len);
        let (mut a, mut b, mut c) = (u64::from(state), 0u64, 0u64);
        let words = first
            .as_chunks::<8>()
            .0
            .iter()
            .zip(second.as_chunks::<8>().0)
            .zip(third.as_chunks::<8>().0);
        for ((x, y), z) in words {
            a = _mm_crc32_u64(a, u64::from_le_bytes(*x));
            b = _mm_crc32_u64(b, u64::from_le_bytes(*y));
            c = _mm_crc32_u64(c, u64::from_le_bytes(*z));
        }
        state = shift_register(a, STREAM_SHIFT[2 * units])
            ^ shift_register(b, STREAM_SHIFT[units])
            ^ c as u32;
        data = rest;
    }
    update_sse42(state, data)
}

/// The pair of constants that folds a 128-bit block forward by `distance`
/// bytes: the low qword multiplies the block's first 8 bytes (which sit 64
/// bits further from the end), the high qword its last 8.
const fn fold_constants(distance: usize) -> (i64, i64) {
    let bits = 8 * distance as u64;
    (
        clmul_shift_constant(bits + 64) as i64,
        clmul_shift_constant(bits) as i64,
    )
}

const FOLD_16: (i64, i64) = fold_constants(16);
const FOLD_32: (i64, i64) = fold_constants(32);
const FOLD_64: (i64, i64) = fold_constants(64);
const FOLD_128: (i64, i64) = fold_constants(128);

#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn fold_128(block: __m128i, constants: __m128i) -> __m128i {
    _mm_xor_si128(
        _mm_clmulepi64_si128::<0x00>(block, constants),
        _mm_clmulepi64_si128::<0x11>(block, constants),
    )
}

#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn constants_128((first_half, second_half): (i64, i64)) -> __m128i {
    _mm_set_epi64x(second_half, first_half)
}

#[inline]
#[target_feature(enable = "sse4.2")]
fn load_128(bytes: &[u8; 16]) -> __m128i {
    // SAFETY: `bytes` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "sse4.2")]
fn store_128(bytes: &mut [u8; 16], value: __m128i) {
    // SAFETY: `bytes` is 16 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm_storeu_si128(bytes.as_mut_ptr().cast(), value) }
}

/// Finishes a folded 128-bit block (the CRC register already xored into it)
/// and the bytes after it: the block is reduced by feeding its two halves to
/// `crc32` from a zero register, then the tail is processed normally.
#[inline]
#[target_feature(enable = "sse4.2")]
fn finish_128(block: __m128i, tail: &[u8]) -> u32 {
    let low = _mm_cvtsi128_si64(block) as u64;
    let high = _mm_extract_epi64::<1>(block) as u64;
    let state = _mm_crc32_u64(_mm_crc32_u64(0, low), high) as u32;
    update_sse42(state, tail)
}

/// Folds the remaining whole 16-byte blocks of `data` into `accumulator` and
/// finishes; with `COPY`, each block is also stored to `dst` (same length as
/// `data`) and so is the tail.
#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq")]
fn fold_rest_128<const COPY: bool>(mut accumulator: __m128i, data: &[u8], dst: &mut [u8]) -> u32 {
    let k16 = constants_128(FOLD_16);
    let (blocks, tail) = data.as_chunks::<16>();
    if COPY {
        let (dst_blocks, dst_tail) = dst.as_chunks_mut::<16>();
        for (block, out) in blocks.iter().zip(dst_blocks) {
            let value = load_128(block);
            store_128(out, value);
            accumulator = _mm_xor_si128(fold_128(accumulator, k16), value);
        }
        if !tail.is_empty() {
            dst_tail.copy_from_slice(tail);
        }
    } else {
        for block in blocks {
            accumulator = _mm_xor_si128(fold_128(accumulator, k16), load_128(block));
        }
    }
    finish_128(accumulator, tail)
}

/// The shortest buffer [`update_pclmul`] folds; shorter ones go to
/// [`update_sse42`].
pub const PCLMUL_MIN_LEN: usize = 64;

/// Carry-less-multiply folding with four 128-bit accumulators (64 bytes per
/// step).
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub fn update_pclmul(state: u32, data: &[u8]) -> u32 {
    if data.len() < PCLMUL_MIN_LEN {
        return update_sse42(state, data);
    }
    let (steps, rest) = data.as_chunks::<64>();
    let [first, steps @ ..] = steps else {
        return update_sse42(state, data);
    };
    let lanes = |step: &[u8; 64]| {
        let (blocks, _) = step.as_chunks::<16>();
        [
            load_128(&blocks[0]),
            load_128(&blocks[1]),
            load_128(&blocks[2]),
            load_128(&blocks[3]),
        ]
    };
    let mut acc = lanes(first);
    acc[0] = _mm_xor_si128(acc[0], _mm_cvtsi32_si128(state as i32));
    let k64 = constants_128(FOLD_64);
    for step in steps {
        let next = lanes(step);
        for (a, n) in acc.iter_mut().zip(next) {
            *a = _mm_xor_si128(fold_128(*a, k64), n);
        }
    }
    let k16 = constants_128(FOLD_16);
    let mut joined = acc[0];
    for &a in &acc[1..] {
        joined = _mm_xor_si128(fold_128(joined, k16), a);
    }
    fold_rest_128::<false>(joined, rest, &mut [])
}

/// The shortest buffer [`update_vpclmul`] folds; shorter ones go to
/// [`update_sse42_3way`] and below.
pub const VPCLMUL_MIN_LEN: usize = 256;

#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold_256(block: __m256i, constants: __m256i) -> __m256i {
    _mm256_xor_si256(
        _mm256_clmulepi64_epi128::<0x00>(block, constants),
        _mm256_clmulepi64_epi128::<0x11>(block, constants),
    )
}

#[inline]
#[target_feature(enable = "avx2")]
fn constants_256((first_half, second_half): (i64, i64)) -> __m256i {
    _mm256_set_epi64x(second_half, first_half, second_half, first_half)
}

#[inline]
#[target_feature(enable = "avx2")]
fn load_256(bytes: &[u8; 32]) -> __m256i {
    // SAFETY: `bytes` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn store_256(bytes: &mut [u8; 32], value: __m256i) {
    // SAFETY: `bytes` is 32 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), value) }
}

/// One 128-byte step as four 256-bit registers.
#[inline]
#[target_feature(enable = "avx2")]
fn load_step(step: &[u8; 128]) -> [__m256i; 4] {
    let (quarters, _) = step.as_chunks::<32>();
    [
        load_256(&quarters[0]),
        load_256(&quarters[1]),
        load_256(&quarters[2]),
        load_256(&quarters[3]),
    ]
}

#[inline]
#[target_feature(enable = "avx2")]
fn store_step(step: &mut [u8; 128], values: &[__m256i; 4]) {
    let (quarters, _) = step.as_chunks_mut::<32>();
    for (quarter, value) in quarters.iter_mut().zip(values) {
        store_256(quarter, *value);
    }
}

/// The 256-bit folding loop shared by the plain and the copying variant.
/// `COPY` selects, at compile time, whether each loaded step is also stored
/// into `dst` (which then has `src`'s length).
#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq")]
fn fold_vpclmul<const COPY: bool>(state: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    let (steps, rest) = src.as_chunks::<128>();
    let (dst_steps, dst_rest) = dst.as_chunks_mut::<128>();
    let mut dst_steps = dst_steps.iter_mut();
    let [first, steps @ ..] = steps else {
        // Callers guarantee at least VPCLMUL_MIN_LEN bytes.
        return update_sse42_3way(state, src);
    };
    let mut acc = load_step(first);
    if COPY && let Some(out) = dst_steps.next() {
        store_step(out, &acc);
    }
    acc[0] = _mm256_xor_si256(acc[0], _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, state as i32));
    let k128 = constants_256(FOLD_128);
    for step in steps {
        let next = load_step(step);
        if COPY && let Some(out) = dst_steps.next() {
            store_step(out, &next);
        }
        for (a, n) in acc.iter_mut().zip(next) {
            *a = _mm256_xor_si256(fold_256(*a, k128), n);
        }
    }
    fold_rest_128::<COPY>(join_accumulators(acc), rest, dst_rest)
}

/// Joins four 256-bit accumulators covering consecutive 32-byte blocks
/// (eight 16-byte lanes) into one 128-bit block standing for the last 16
/// bytes: each accumulator is folded 32 bytes forward into the next, then
/// the last one's low lane 16 bytes forward into its high lane.
#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq")]
fn join_accumulators(acc: [__m256i; 4]) -> __m128i {
    let k32 = constants_256(FOLD_32);
    let mut joined = acc[0];
    for &a in &acc[1..] {
        joined = _mm256_xor_si256(fold_256(joined, k32), a);
    }
    _mm_xor_si128(
        fold_128(_mm256_castsi256_si128(joined), constants_128(FOLD_16)),
        _mm256_extracti128_si256::<1>(joined),
    )
}

/// Carry-less-multiply folding with four 256-bit accumulators (128 bytes per
/// step); buffers shorter than [`VPCLMUL_MIN_LEN`] take the three-way path.
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq")]
pub fn update_vpclmul(state: u32, data: &[u8]) -> u32 {
    if data.len() < VPCLMUL_MIN_LEN {
        return update_sse42_3way(state, data);
    }
    fold_vpclmul::<false>(state, data, &mut [])
}

/// Copies `src` into `dst` (equal lengths, checked by the caller) and
/// returns the register advanced over the bytes, in one pass: every 128-byte
/// step is loaded once, stored, and folded from the same registers.
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq")]
pub fn update_copy_vpclmul(state: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    if src.len() < VPCLMUL_MIN_LEN {
        dst.copy_from_slice(src);
        return update_sse42_3way(state, dst);
    }
    fold_vpclmul::<true>(state, src, dst)
}

/// Bytes the vector half of the hybrid loop folds per iteration.
const HYBRID_VECTOR_STEP: usize = 128;
/// Bytes each of the three `crc32` streams covers per iteration.
const HYBRID_STREAM_STEP: usize = 48;
/// Bytes per hybrid iteration.
const HYBRID_STEP: usize = HYBRID_VECTOR_STEP + 3 * HYBRID_STREAM_STEP;
/// Iterations per round at most: each round is joined with constants for
/// its length, so rounds come in a fixed set of sizes.
const HYBRID_MAX_ITERATIONS: usize = 64;
/// The fewest iterations worth a round; shorter buffers take the plain
/// folding path.
const HYBRID_MIN_ITERATIONS: usize = 4;

/// `HYBRID_SHIFT[n][k]` shifts a register over `(k + 1) * 48 * n` bytes: the
/// stretches that follow the second stream, the first stream and the vector
/// part of an `n`-iteration round.
static HYBRID_SHIFT: [[u64; 3]; HYBRID_MAX_ITERATIONS + 1] = hybrid_shift_constants();

const fn hybrid_shift_constants() -> [[u64; 3]; HYBRID_MAX_ITERATIONS + 1] {
    let mut table = [[0u64; 3]; HYBRID_MAX_ITERATIONS + 1];
    let mut n = 1;
    while n <= HYBRID_MAX_ITERATIONS {
        let mut k = 0;
        while k < 3 {
            let bytes = (k + 1) * HYBRID_STREAM_STEP * n;
            table[n][k] = clmul_shift_constant(8 * bytes as u64);
            k += 1;
        }
        n += 1;
    }
    table
}

/// The shortest buffer [`update_hybrid`] runs its combined loop on.
pub const HYBRID_MIN_LEN: usize = HYBRID_STEP * HYBRID_MIN_ITERATIONS;

/// `VPCLMULQDQ` folding and three `crc32` streams in the same loop. Each
/// round of `n` iterations splits its `272 n` bytes into a vector part
/// (`128 n`) followed by three stream parts (`48 n` each); the vector part's
/// register is reduced, and all four are shifted over what follows them and
/// xored.
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq")]
pub fn update_hybrid(mut state: u32, mut data: &[u8]) -> u32 {
    while data.len() >= HYBRID_MIN_LEN {
        let iterations = (data.len() / HYBRID_STEP).min(HYBRID_MAX_ITERATIONS);
        let stream_len = HYBRID_STREAM_STEP * iterations;
        let (vector, rest) = data.split_at(HYBRID_VECTOR_STEP * iterations);
        let (first, rest) = rest.split_at(stream_len);
        let (second, rest) = rest.split_at(stream_len);
        let (third, rest) = rest.split_at(stream_len);
        let (vector_steps, _) = vector.as_chunks::<HYBRID_VECTOR_STEP>();
        let streams = first
            .as_chunks::<HYBRID_STREAM_STEP>()
            .0
            .iter()
            .zip(second.as_chunks::<HYBRID_STREAM_STEP>().0)
            .zip(third.as_chunks::<HYBRID_STREAM_STEP>().0);
        let [first_step, vector_steps @ ..] = vector_steps else {
            break; // unreachable: iterations >= HYBRID_MIN_ITERATIONS
        };
        let mut acc = load_step(first_step);
        acc[0] = _mm256_xor_si256(acc[0], _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, state as i32));
        let k128 = constants_256(FOLD_128);
        let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
        let mut vector_steps = vector_steps.iter();
        for ((x, y), z) in streams {
            // The vector fold of the next step, if any, beside this step's
            // 18 `crc32` instructions: independent work for two units.
            if let Some(step) = vector_steps.next() {
                let next = load_step(step);
                for (accumulator, n) in acc.iter_mut().zip(next) {
                    *accumulator = _mm256_xor_si256(fold_256(*accumulator, k128), n);
                }
            }
            for ((wx, wy), wz) in x
                .as_chunks::<8>()
                .0
                .iter()
                .zip(y.as_chunks::<8>().0)
                .zip(z.as_chunks::<8>().0)
            {
                a = _mm_crc32_u64(a, u64::from_le_bytes(*wx));
                b = _mm_crc32_u64(b, u64::from_le_bytes(*wy));
                c = _mm_crc32_u64(c, u64::from_le_bytes(*wz));
            }
        }
        let vector_state = finish_128(join_accumulators(acc), &[]);
        let shifts = &HYBRID_SHIFT[iterations];
        state = shift_register(u64::from(vector_state), shifts[2])
            ^ shift_register(a, shifts[1])
            ^ shift_register(b, shifts[0])
            ^ c as u32;
        data = rest;
    }
    update_vpclmul(state, data)
}

/// Whether the CPU also has AVX-512F, so `VPCLMULQDQ` folds 512 bits per
/// instruction.
pub fn has_vpclmul512() -> bool {
    has_vpclmul() && std::arch::is_x86_feature_detected!("avx512f")
}

const FOLD_192: (i64, i64) = fold_constants(192);
const FOLD_256: (i64, i64) = fold_constants(256);

/// The shortest buffer [`update_vpclmul512`] folds; shorter ones go to
/// [`update_sse42`], which is as fast at 64 bytes and faster at 96 (the
/// folding path's fixed cost, reducing 64 bytes to 4, is not yet repaid).
pub const VPCLMUL512_MIN_LEN: usize = 128;

#[inline]
#[target_feature(enable = "avx512f")]
fn constants_512((first_half, second_half): (i64, i64)) -> __m512i {
    _mm512_set_epi64(
        second_half,
        first_half,
        second_half,
        first_half,
        second_half,
        first_half,
        second_half,
        first_half,
    )
}

/// Folds `block` forward by the distance of `constants` and xors `next` in,
/// the three-way xor as one `vpternlogq`.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold_512_xor(block: __m512i, constants: __m512i, next: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64::<0x96>(
        _mm512_clmulepi64_epi128::<0x00>(block, constants),
        _mm512_clmulepi64_epi128::<0x11>(block, constants),
        next,
    )
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load_512(bytes: &[u8; 64]) -> __m512i {
    // SAFETY: `bytes` is 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn store_512(bytes: &mut [u8; 64], value: __m512i) {
    // SAFETY: `bytes` is 64 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm512_storeu_si512(bytes.as_mut_ptr().cast(), value) }
}

/// One 256-byte step as four 512-bit registers.
#[inline]
#[target_feature(enable = "avx512f")]
fn load_step_512(step: &[u8; 256]) -> [__m512i; 4] {
    let (quarters, _) = step.as_chunks::<64>();
    [
        load_512(&quarters[0]),
        load_512(&quarters[1]),
        load_512(&quarters[2]),
        load_512(&quarters[3]),
    ]
}

#[inline]
#[target_feature(enable = "avx512f")]
fn store_step_512(step: &mut [u8; 256], values: &[__m512i; 4]) {
    let (quarters, _) = step.as_chunks_mut::<64>();
    for (quarter, value) in quarters.iter_mut().zip(values) {
        store_512(quarter, *value);
    }
}

/// Reduces a 512-bit accumulator (four 16-byte lanes over consecutive
/// blocks) to one 128-bit block standing for the last 16 bytes.
#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq,avx512f")]
fn reduce_512(acc: __m512i) -> __m128i {
    let low = _mm512_castsi512_si256(acc);
    let high = _mm512_extracti64x4_epi64::<1>(acc);
    let joined = _mm256_xor_si256(fold_256(low, constants_256(FOLD_32)), high);
    _mm_xor_si128(
        fold_128(_mm256_castsi256_si128(joined), constants_128(FOLD_16)),
        _mm256_extracti128_si256::<1>(joined),
    )
}

/// Joins four 512-bit accumulators over consecutive 64-byte blocks into one
/// standing for the last: the first three are folded 192, 128 and 64 bytes
/// forward side by side (independent multiplies), then all four xored, so
/// the join costs one multiply's latency rather than three in a chain.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn join_512([a0, a1, a2, a3]: [__m512i; 4]) -> __m512i {
    let f0 = fold_512_xor(a0, constants_512(FOLD_192), a3);
    let f1 = fold_512_xor(a1, constants_512(FOLD_128), f0);
    fold_512_xor(a2, constants_512(FOLD_64), f1)
}

/// The 512-bit folding loop, plain or copying (`COPY`: every loaded block is
/// also stored into `dst`, which then has `src`'s length). Four accumulators
/// fold 256 bytes per step; they are joined into one, which folds the
/// remaining 64-byte blocks, and the last 0..=63 bytes go 16 at a time.
/// `src` holds at least [`VPCLMUL512_MIN_LEN`] bytes.
#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq,avx512f")]
fn fold_vpclmul512<const COPY: bool>(state: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    let seed = _mm512_zextsi128_si512(_mm_cvtsi32_si128(state as i32));
    let (steps, _) = src.as_chunks::<256>();
    let mut dst_steps = dst.as_chunks_mut::<256>().0.iter_mut();
    let (mut acc, mut done) = if let [first, steps @ ..] = steps {
        let mut acc = load_step_512(first);
        if COPY && let Some(out) = dst_steps.next() {
            store_step_512(out, &acc);
        }
        acc[0] = _mm512_xor_si512(acc[0], seed);
        let k256 = constants_512(FOLD_256);
        for step in steps {
            let next = load_step_512(step);
            if COPY && let Some(out) = dst_steps.next() {
                store_step_512(out, &next);
            }
            for (a, n) in acc.iter_mut().zip(next) {
                *a = fold_512_xor(*a, k256, n);
            }
        }
        (join_512(acc), 256 * (steps.len() + 1))
    } else {
        let Some(first) = src.first_chunk::<64>() else {
            // Callers guarantee at least VPCLMUL512_MIN_LEN bytes.
            return update_sse42_3way(state, src);
        };
        let block = load_512(first);
        if COPY && let Some(out) = dst.first_chunk_mut::<64>() {
            store_512(out, block);
        }
        (_mm512_xor_si512(block, seed), 64)
    };
    let k64 = constants_512(FOLD_64);
    let (blocks, _) = src[done..].as_chunks::<64>();
    let dst_rest: &mut [u8] = if COPY { &mut dst[done..] } else { &mut [] };
    let mut dst_blocks = dst_rest.as_chunks_mut::<64>().0.iter_mut();
    for block in blocks {
        let next = load_512(block);
        if COPY && let Some(out) = dst_blocks.next() {
            store_512(out, next);
        }
        acc = fold_512_xor(acc, k64, next);
    }
    done += 64 * blocks.len();
    let dst_rest: &mut [u8] = if COPY { &mut dst[done..] } else { &mut [] };
    fold_rest_128::<COPY>(reduce_512(acc), &src[done..], dst_rest)
}

/// Carry-less-multiply folding with four 512-bit accumulators (256 bytes per
/// step); buffers shorter than [`VPCLMUL512_MIN_LEN`] take one `crc32`
/// stream.
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq,avx512f")]
pub fn update_vpclmul512(state: u32, data: &[u8]) -> u32 {
    if data.len() < VPCLMUL512_MIN_LEN {
        return update_sse42(state, data);
    }
    fold_vpclmul512::<false>(state, data, &mut [])
}

/// [`update_vpclmul512`] that also copies `src` into `dst` (equal lengths,
/// checked by the caller) in the same pass: each 64-byte block is loaded
/// once, stored, and folded from the same register.
#[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq,avx512f")]
pub fn update_copy_vpclmul512(state: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    if src.len() < VPCLMUL512_MIN_LEN {
        dst.copy_from_slice(src);
        return update_sse42(state, dst);
    }
    fold_vpclmul512::<true>(state, src, dst)
}
