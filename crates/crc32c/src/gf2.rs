//! Polynomial arithmetic modulo the CRC32C generator, in the bit-reflected
//! representation every CRC32C implementation here works in.
//!
//! RFC 7143 section 13.1 names the generator `0x11EDC6F41` (Castagnoli). Its
//! bits are fed least-significant first (RFC 7143 Appendix B.4: "bit 0 of
//! byte 0" is the highest-degree coefficient), so a 32-bit value `v` stands
//! for the polynomial whose coefficient of `x^(31 - i)` is bit `i` of `v`.
//! In that representation multiplying by `x` is a right shift, and the
//! generator without its `x^32` term is [`POLY_REFLECTED`].
//!
//! Everything here is `const fn`: the Sarwate and slicing-by-8 tables and the
//! folding/combining constants of the hardware paths are computed by the
//! compiler from these few functions, never pasted.

/// The CRC32C generator `0x1EDC6F41` (without `x^32`), bit-reflected.
pub const POLY_REFLECTED: u32 = 0x82F6_3B78;

/// The polynomial `1` (`x^0`) in the reflected representation.
const ONE: u32 = 0x8000_0000;

/// `a(x) * b(x) mod P(x)`, both operands and the result reflected.
pub const fn multiply_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0u32;
    let mut bit = ONE;
    // Walk a's coefficients from x^0 upwards while b walks through b * x^k.
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        b = multiply_by_x(b);
        bit >>= 1;
    }
    product
}

/// `a(x) * x mod P(x)`, reflected.
pub const fn multiply_by_x(a: u32) -> u32 {
    if a & 1 != 0 {
        (a >> 1) ^ POLY_REFLECTED
    } else {
        a >> 1
    }
}

/// `x^n mod P(x)`, reflected, by square-and-multiply.
pub const fn x_pow_mod_p(mut n: u64) -> u32 {
    let mut result = ONE;
    let mut square = ONE >> 1; // x^1
    while n != 0 {
        if n & 1 != 0 {
            result = multiply_mod_p(result, square);
        }
        square = multiply_mod_p(square, square);
        n >>= 1;
    }
    result
}

/// Advances a raw CRC register over `len` zero bytes: `state * x^(8 len) mod P`.
///
/// This is what makes CRCs of separate pieces combinable: the register of
/// `A || B` is `shift(register(A), len(B)) ^ register_from_zero(B)`.
///
/// `x^(8 len)` is the product of [`ZERO_BYTES_POWERS`] entries for the bits
/// set in `len`: one multiplication per set bit, so shifting by a
/// power-of-two length (a 64 KiB chunk's CRC combined into a data digest)
/// costs two multiplications instead of square-and-multiply's forty.
pub const fn shift_by_zero_bytes(state: u32, len: u64) -> u32 {
    let mut result = state;
    let mut bit = 0;
    while bit < 64 {
        if len & (1 << bit) != 0 {
            result = multiply_mod_p(ZERO_BYTES_POWERS[bit], result);
        }
        bit += 1;
    }
    result
}

/// `x^(8 * 2^k) mod P(x)` for k = 0..64: the shift over `2^k` zero bytes.
const ZERO_BYTES_POWERS: [u32; 64] = {
    let mut table = [0u32; 64];
    let mut power = x_pow_mod_p(8);
    let mut k = 0;
    while k < 64 {
        table[k] = power;
        power = multiply_mod_p(power, power);
        k += 1;
    }
    table
};

/// The constant that carry-less multiplication needs to shift a 32-bit CRC
/// register (or a 64-bit half of a 128-bit block) forward by `bits` bit
/// positions: `x^(bits - 33) mod P`.
///
/// Multiplying a reflected operand by a reflected 32-bit constant with
/// `PCLMULQDQ` yields the product times `x^33` when the result is read as a
/// reflected 128-bit (or, after `crc32` reduction, 64-bit) value; the `- 33`
/// cancels that. Requires `bits >= 33`.
pub const fn clmul_shift_constant(bits: u64) -> u64 {
    x_pow_mod_p(bits - 33) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_the_multiplicative_identity() {
        for v in [0u32, 1, 0xDEAD_BEEF, POLY_REFLECTED, u32::MAX] {
            assert_eq!(multiply_mod_p(ONE, v), v);
            assert_eq!(multiply_mod_p(v, ONE), v);
        }
    }

    #[test]
    fn powers_of_x_agree_with_repeated_multiplication() {
        let mut expected = ONE;
        for n in 0..200u64 {
            assert_eq!(x_pow_mod_p(n), expected, "x^{n}");
            expected = multiply_by_x(expected);
        }
    }

    #[test]
    fn shifting_by_zero_bytes_is_multiplying_by_x_to_8_len() {
        for len in [
            0u64,
            1,
            3,
            4096,
            65536,
            65535,
            1 << 20,
            (1 << 20) + 8191,
            u64::MAX >> 4,
        ] {
            for state in [0u32, 1, 0xDEAD_BEEF, u32::MAX] {
                let expected = multiply_mod_p(x_pow_mod_p(8 * len), state);
                assert_eq!(shift_by_zero_bytes(state, len), expected, "len {len}");
            }
        }
    }

    #[test]
    fn multiplication_commutes_and_distributes() {
        let values = [0x1234_5678u32, 0x8765_4321, 0xFFFF_0000, 0x0F0F_0F0F];
        for &a in &values {
            for &b in &values {
                assert_eq!(multiply_mod_p(a, b), multiply_mod_p(b, a));
                for &c in &values {
                    assert_eq!(
                        multiply_mod_p(a, b ^ c),
                        multiply_mod_p(a, b) ^ multiply_mod_p(a, c)
                    );
                }
            }
        }
    }
}
