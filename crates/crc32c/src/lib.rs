//! CRC32C (Castagnoli), the iSCSI header and data digest (RFC 7143 section
//! 13.1 names it; Appendix B.4 gives the bit order and examples).
//!
//! The one-call API picks the fastest implementation for this CPU once, at
//! first use:
//!
//! ```
//! let digest = iscsi_crc32c::crc32c(b"123456789");
//! assert_eq!(digest, 0xE306_9283);
//!
//! // Incrementally, e.g. per received chunk of a data segment:
//! let first = iscsi_crc32c::crc32c(b"12345");
//! assert_eq!(iscsi_crc32c::crc32c_append(first, b"6789"), digest);
//!
//! // Copy and checksum in one pass over the bytes:
//! let mut landed = [0u8; 9];
//! assert_eq!(iscsi_crc32c::copy_with_crc32c(&mut landed, b"123456789"), digest);
//! assert_eq!(&landed, b"123456789");
//! ```
//!
//! Every algorithm is also reachable on its own through [`Algorithm`] and
//! [`Engine`], for tests and benchmarks:
//! the bitwise reference, Sarwate's table, slicing-by-8, and the hardware
//! paths ([`Algorithm::Sse42`], [`Algorithm::Sse42ThreeWay`],
//! [`Algorithm::Pclmul`], [`Algorithm::Vpclmul`], [`Algorithm::Hybrid`],
//! [`Algorithm::Vpclmul512`] on x86-64,
//! [`Algorithm::Aarch64`] on aarch64). `docs/crc32c.md` at the repository
//! root compares them with the FAST '05 study's figures.
//!
//! CRC values in this API are the finished digests (register initialised to
//! all ones, complemented at the end), exactly as they go on the wire; the
//! wire carries them little-endian (RFC 7143 Appendix B.4 lists the bytes).

mod bitwise;
mod fused;
pub mod gf2;
mod sarwate;
mod slicing8;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;

use std::fmt;
use std::sync::OnceLock;

/// A raw-register update function: advances the register over the data.
type UpdateFn = fn(u32, &[u8]) -> u32;
/// A raw-register fused copy: copies `src` into `dst` and advances the register.
type UpdateCopyFn = fn(u32, &mut [u8], &[u8]) -> u32;

/// One CRC32C algorithm. Not every variant runs on every CPU:
/// [`Algorithm::engine`] says whether this one does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The bitwise reference: the definition, one bit per step.
    Bitwise,
    /// Sarwate's byte-at-a-time algorithm with one 256-entry table.
    Sarwate,
    /// Kounavis & Berry's slicing-by-8: eight 256-entry tables, 64 bits per
    /// step. The portable fallback.
    Slicing8,
    /// x86-64 SSE4.2 `crc32`, a single stream of 8-byte instructions.
    Sse42,
    /// Three interleaved SSE4.2 `crc32` streams joined with `PCLMULQDQ`.
    Sse42ThreeWay,
    /// 128-bit `PCLMULQDQ` folding, four accumulators.
    Pclmul,
    /// 256-bit `VPCLMULQDQ` folding, four accumulators; copies and checksums
    /// in a single pass for the fused copy.
    Vpclmul,
    /// `VPCLMULQDQ` folding and three SSE4.2 `crc32` streams in one loop,
    /// keeping the vector and the integer CRC units busy together; the
    /// fused copy is [`Algorithm::Vpclmul`]'s.
    Hybrid,
    /// 512-bit `VPCLMULQDQ` folding (AVX-512), four accumulators; copies
    /// and checksums in a single pass for the fused copy.
    Vpclmul512,
    /// aarch64 `crc32c` instructions, three interleaved streams.
    Aarch64,
}

impl Algorithm {
    /// Every algorithm, slowest first.
    pub const ALL: [Algorithm; 10] = [
        Algorithm::Bitwise,
        Algorithm::Sarwate,
        Algorithm::Slicing8,
        Algorithm::Sse42,
        Algorithm::Sse42ThreeWay,
        Algorithm::Pclmul,
        Algorithm::Vpclmul,
        Algorithm::Hybrid,
        Algorithm::Vpclmul512,
        Algorithm::Aarch64,
    ];

    /// A short stable name, as benchmarks print it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Bitwise => "bitwise",
            Algorithm::Sarwate => "sarwate",
            Algorithm::Slicing8 => "slicing8",
            Algorithm::Sse42 => "sse42_1way",
            Algorithm::Sse42ThreeWay => "sse42_3way",
            Algorithm::Pclmul => "pclmul_fold",
            Algorithm::Vpclmul => "vpclmul_fold",
            Algorithm::Hybrid => "hybrid_fold_crc32",
            Algorithm::Vpclmul512 => "vpclmul512_fold",
            Algorithm::Aarch64 => "aarch64_crc",
        }
    }

    /// The algorithms this CPU runs.
    pub fn available() -> Vec<Algorithm> {
        Self::ALL
            .into_iter()
            .filter(|a| a.engine().is_some())
            .collect()
    }

    /// The fastest algorithm this CPU runs: 512-bit carry-less folding
    /// where AVX-512 exists (1.4x the hybrid at 8 KiB on AMD EPYC with
    /// AVX-512, and its single-pass copy keeps up with it), else carry-less
    /// folding and `crc32` streams together, else `crc32` streams, else
    /// slicing-by-8 (measured by `iscsi crc-bench`; see docs/crc32c.md).
    pub fn fastest() -> Algorithm {
        [
            Algorithm::Vpclmul512,
            Algorithm::Hybrid,
            Algorithm::Sse42ThreeWay,
            Algorithm::Aarch64,
        ]
        .into_iter()
        .find(|a| a.engine().is_some())
        .unwrap_or(Algorithm::Slicing8)
    }

    /// An engine running this algorithm, or `None` where the CPU lacks the
    /// instructions it needs (detected at run time).
    pub fn engine(self) -> Option<Engine> {
        let (update, update_copy): (UpdateFn, Option<UpdateCopyFn>) = match self {
            Algorithm::Bitwise => (bitwise::update, None),
            Algorithm::Sarwate => (sarwate::update, None),
            Algorithm::Slicing8 => (slicing8::update, None),
            #[cfg(target_arch = "x86_64")]
            Algorithm::Sse42 if x86_64::has_sse42() => (hardware::sse42, None),
            #[cfg(target_arch = "x86_64")]
            Algorithm::Sse42ThreeWay if x86_64::has_pclmul() => (hardware::sse42_3way, None),
            #[cfg(target_arch = "x86_64")]
            Algorithm::Pclmul if x86_64::has_pclmul() => (hardware::pclmul, None),
            #[cfg(target_arch = "x86_64")]
            Algorithm::Vpclmul if x86_64::has_vpclmul() => {
                (hardware::vpclmul, Some(hardware::vpclmul_copy))
            }
            #[cfg(target_arch = "x86_64")]
            Algorithm::Hybrid if x86_64::has_vpclmul() => {
                (hardware::hybrid, Some(hardware::vpclmul_copy))
            }
            #[cfg(target_arch = "x86_64")]
            Algorithm::Vpclmul512 if x86_64::has_vpclmul512() => {
                (hardware::vpclmul512, Some(hardware::vpclmul512_copy))
            }
            #[cfg(target_arch = "aarch64")]
            Algorithm::Aarch64 if aarch64::has_crc() => (hardware::aarch64_3way, None),
            _ => return None,
        };
        Some(Engine {
            algorithm: self,
            update,
            update_copy,
        })
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Safe entry points to the `#[target_feature]` functions. Each is placed in
/// an [`Engine`] only by [`Algorithm::engine`], after the run-time check for
/// the features it needs has passed; nothing else calls them.
mod hardware {
    #[cfg(target_arch = "aarch64")]
    pub(crate) fn aarch64_3way(state: u32, data: &[u8]) -> u32 {
        // SAFETY: installed only when `aarch64::has_crc()` returned true.
        unsafe { crate::aarch64::update_3way(state, data) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn sse42(state: u32, data: &[u8]) -> u32 {
        // SAFETY: installed only when `x86_64::has_sse42()` returned true.
        unsafe { crate::x86_64::update_sse42(state, data) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn sse42_3way(state: u32, data: &[u8]) -> u32 {
        // SAFETY: installed only when `x86_64::has_pclmul()` returned true.
        unsafe { crate::x86_64::update_sse42_3way(state, data) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn pclmul(state: u32, data: &[u8]) -> u32 {
        // SAFETY: installed only when `x86_64::has_pclmul()` returned true.
        unsafe { crate::x86_64::update_pclmul(state, data) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn vpclmul(state: u32, data: &[u8]) -> u32 {
        // SAFETY: installed only when `x86_64::has_vpclmul()` returned true.
        unsafe { crate::x86_64::update_vpclmul(state, data) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn hybrid(state: u32, data: &[u8]) -> u32 {
        // SAFETY: installed only when `x86_64::has_vpclmul()` returned true.
        unsafe { crate::x86_64::update_hybrid(state, data) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn vpclmul_copy(state: u32, dst: &mut [u8], src: &[u8]) -> u32 {
        // SAFETY: installed only when `x86_64::has_vpclmul()` returned true.
        unsafe { crate::x86_64::update_copy_vpclmul(state, dst, src) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn vpclmul512(state: u32, data: &[u8]) -> u32 {
        // SAFETY: installed only when `x86_64::has_vpclmul512()` returned true.
        unsafe { crate::x86_64::update_vpclmul512(state, data) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn vpclmul512_copy(state: u32, dst: &mut [u8], src: &[u8]) -> u32 {
        // SAFETY: installed only when `x86_64::has_vpclmul512()` returned true.
        unsafe { crate::x86_64::update_copy_vpclmul512(state, dst, src) }
    }
}

/// A CRC32C implementation this CPU can run, obtained from
/// [`Algorithm::engine`] (or [`Engine::fastest`]).
#[derive(Clone, Copy)]
pub struct Engine {
    algorithm: Algorithm,
    update: UpdateFn,
    update_copy: Option<UpdateCopyFn>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("algorithm", &self.algorithm)
            .field("fused_copy", &self.update_copy.is_some())
            .finish()
    }
}

impl Engine {
    /// The engine behind the crate's free functions: [`Algorithm::fastest`],
    /// chosen once per process.
    pub fn fastest() -> &'static Engine {
        static FASTEST: OnceLock<Engine> = OnceLock::new();
        FASTEST.get_or_init(|| {
            Algorithm::fastest()
                .engine()
                .or_else(|| Algorithm::Slicing8.engine())
                .expect("slicing-by-8 runs everywhere")
        })
    }

    /// The algorithm this engine runs.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Whether [`Engine::copy_append`] copies and checksums in a single pass
    /// over registers for buffers of [`Engine::single_pass_min_len`] bytes
    /// and more (otherwise it interleaves a copy and a checksum per
    /// cache-sized chunk).
    pub fn has_single_pass_copy(&self) -> bool {
        self.update_copy.is_some()
    }

    /// The shortest buffer [`Engine::copy_append`] copies and checksums in
    /// a single pass, where the engine has one; shorter buffers are copied,
    /// then checksummed, which is faster there. A constant, so the path a
    /// size takes never changes between runs.
    pub fn single_pass_min_len(&self) -> Option<usize> {
        self.update_copy.map(|_| fused::SINGLE_PASS_MIN_LEN)
    }

    /// [`Engine::copy_append`] always through the single-pass copy where the
    /// engine has one, whatever the length (for tests and for measuring
    /// where it wins); otherwise the same as [`Engine::copy_append`].
    ///
    /// # Panics
    /// If `dst` and `src` differ in length.
    pub fn copy_append_single_pass(&self, crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
        assert_same_length(dst, src);
        let state = !crc;
        !match self.update_copy {
            Some(update_copy) => update_copy(state, dst, src),
            None => fused::copy_in_chunks(self.update, state, dst, src),
        }
    }

    /// The CRC32C of `data`.
    pub fn checksum(&self, data: &[u8]) -> u32 {
        self.append(0, data)
    }

    /// Continues `crc` (the CRC32C of earlier bytes, or 0 for none) over `data`.
    pub fn append(&self, crc: u32, data: &[u8]) -> u32 {
        !(self.update)(!crc, data)
    }

    /// Copies `src` into `dst` and continues `crc` over the copied bytes,
    /// touching each byte once while it is in cache (see [`copy_with_crc32c`]):
    /// in a single pass from [`Engine::single_pass_min_len`] bytes up, else
    /// copy then CRC (where that is faster); engines without a single pass
    /// interleave a copy and a CRC per 4 KiB chunk.
    ///
    /// # Panics
    /// If `dst` and `src` differ in length, like [`slice::copy_from_slice`].
    pub fn copy_append(&self, crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
        assert_same_length(dst, src);
        let state = !crc;
        !match self.update_copy {
            Some(update_copy) if src.len() >= fused::SINGLE_PASS_MIN_LEN => {
                update_copy(state, dst, src)
            }
            // Short buffers: copy, then CRC the bytes while they are in L1
            // (faster than the single pass there; see SINGLE_PASS_MIN_LEN).
            Some(_) => {
                dst.copy_from_slice(src);
                (self.update)(state, dst)
            }
            None => fused::copy_in_chunks(self.update, state, dst, src),
        }
    }

    /// [`Engine::copy_append`] by cache-sized chunks (copy 4 KiB, then CRC
    /// it while it is in L1) even where a single-pass copy exists: the
    /// coarser interleaving, kept callable to compare the two.
    ///
    /// # Panics
    /// If `dst` and `src` differ in length.
    pub fn copy_append_chunked(&self, crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
        assert_same_length(dst, src);
        !fused::copy_in_chunks(self.update, !crc, dst, src)
    }
}

fn assert_same_length(dst: &[u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy_with_crc32c: destination and source lengths differ"
    );
}

/// The CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    Engine::fastest().checksum(data)
}

/// Continues `crc`, the CRC32C of earlier bytes (0 for none), over `data`:
/// `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    Engine::fastest().append(crc, data)
}

/// Copies `src` into `dst` and returns the CRC32C of the bytes, computing the
/// CRC while the data is in registers or L1 cache rather than copying first
/// and reading the destination again. Never slower than a copy followed by
/// [`crc32c`] on the CPUs measured: short buffers (under about 1 KiB, where
/// the single pass does not pay) are copied, then checksummed.
///
/// # Panics
/// If `dst` and `src` differ in length, like [`slice::copy_from_slice`].
pub fn copy_with_crc32c(dst: &mut [u8], src: &[u8]) -> u32 {
    Engine::fastest().copy_append(0, dst, src)
}

/// [`copy_with_crc32c`] continuing `crc`, the CRC32C of earlier bytes.
///
/// # Panics
/// If `dst` and `src` differ in length.
pub fn copy_with_crc32c_append(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    Engine::fastest().copy_append(crc, dst, src)
}

/// The CRC32C of `a ++ b` from `crc32c(a)`, `crc32c(b)` and `b`'s length,
/// without the bytes (for digests computed over pieces in parallel).
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    gf2::shift_by_zero_bytes(crc_a, len_b) ^ crc_b
}

/// Bytes that never change and know their CRC32C, computing it at most once
/// (a RAM store's chunk, lent to READs until a write replaces it).
///
/// Why: once a target sends READ data straight from its store, no copy
/// touches the bytes, so the FAST '05 trick of digesting during the copy
/// has nothing to hide in; a data digest over such bytes is instead
/// combined from the remembered CRC ([`crc32c_combine`]) and costs two
/// GF(2) multiplications rather than a pass over the data.
pub trait KnownCrc32c: Send + Sync + std::fmt::Debug {
    /// The CRC32C of all the bytes (computed on first call, then remembered).
    fn crc32c(&self) -> u32;
}

/// An incremental CRC32C, for data that arrives in pieces (a data segment
/// received chunk by chunk).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Crc32c {
    crc: u32,
}

impl Crc32c {
    /// A CRC over no bytes yet.
    pub const fn new() -> Self {
        Crc32c { crc: 0 }
    }

    /// Adds `data`.
    pub fn update(&mut self, data: &[u8]) {
        self.crc = crc32c_append(self.crc, data);
    }

    /// Copies `src` into `dst` and adds the bytes, in one pass.
    ///
    /// # Panics
    /// If `dst` and `src` differ in length.
    pub fn update_copy(&mut self, dst: &mut [u8], src: &[u8]) {
        self.crc = copy_with_crc32c_append(self.crc, dst, src);
    }

    /// The CRC32C of everything added so far.
    pub const fn value(&self) -> u32 {
        self.crc
    }
}
