//! All algorithms agree with the bitwise reference on every length 0..=4096
//! at every start alignment 0..=63; appending over any split point equals the
//! one-shot CRC; the fused copy copies exactly and returns the same CRC.

use iscsi_crc32c::{Algorithm, Engine, crc32c, crc32c_append, crc32c_combine};
use proptest::prelude::*;

const MAX_LEN: usize = 4096;
const ALIGNMENTS: usize = 64;

/// Deterministic pseudo-random bytes (xorshift64*), so a failure reproduces.
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            (seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

fn engines() -> Vec<Engine> {
    Algorithm::ALL.iter().filter_map(|a| a.engine()).collect()
}

#[test]
fn every_algorithm_agrees_at_every_length_and_alignment() {
    let reference = Algorithm::Bitwise
        .engine()
        .expect("bitwise runs everywhere");
    let engines = engines();
    // One buffer with room for the largest message at the largest offset.
    let backing = random_bytes(MAX_LEN + ALIGNMENTS, 0x1CE5_C5A1);
    for len in 0..=MAX_LEN {
        // The same bytes at every alignment, so the reference runs once per
        // length; the message content changes with the length.
        let message = &backing[len % ALIGNMENTS..len % ALIGNMENTS + len];
        let expected = reference.checksum(message);
        let mut shifted = vec![0u8; MAX_LEN + ALIGNMENTS];
        for alignment in 0..ALIGNMENTS {
            shifted[alignment..alignment + len].copy_from_slice(message);
            let placed = &shifted[alignment..alignment + len];
            for engine in &engines {
                assert_eq!(
                    engine.checksum(placed),
                    expected,
                    "{} at length {len}, alignment {alignment}",
                    engine.algorithm()
                );
            }
        }
    }
}

#[test]
fn every_fused_copy_agrees_at_every_length_and_alignment() {
    let engines = engines();
    let source = random_bytes(MAX_LEN + ALIGNMENTS, 0xF00D);
    let mut destination = vec![0u8; MAX_LEN + ALIGNMENTS];
    // Lengths with a step keep this affordable; every length below 600
    // covers every tail and every short-buffer path.
    let lengths = (0..600).chain((600..=MAX_LEN).step_by(7)).chain([MAX_LEN]);
    for len in lengths {
        for alignment in 0..ALIGNMENTS {
            let src_alignment = (alignment * 7) % ALIGNMENTS;
            let src = &source[src_alignment..src_alignment + len];
            let expected = crc32c(src);
            for engine in &engines {
                destination.fill(0xEE);
                let dst = &mut destination[alignment..alignment + len];
                let got = engine.copy_append(0, dst, src);
                assert_eq!(
                    got,
                    expected,
                    "{} len {len} align {alignment}",
                    engine.algorithm()
                );
                assert_eq!(dst, src, "{} copied wrongly", engine.algorithm());
                // Nothing outside the destination was touched.
                assert!(destination[..alignment].iter().all(|&b| b == 0xEE));
                assert!(destination[alignment + len..].iter().all(|&b| b == 0xEE));
            }
        }
    }
}

/// Both paths of the fused copy, the one `copy_append` chooses by length
/// (copy then CRC below the single-pass threshold, single pass above) and the
/// single pass forced at every length, copy exactly and give the reference
/// CRC at every length 0..=4096 (across the threshold and every 64/256-byte
/// step and tail of the 512-bit loop), with source and destination at
/// unaligned offsets, and continuing a non-zero CRC.
#[test]
fn chosen_and_single_pass_copies_agree_at_every_length_and_offset() {
    let reference = Algorithm::Slicing8
        .engine()
        .expect("slicing-by-8 runs everywhere");
    let engines = engines();
    let source = random_bytes(MAX_LEN + ALIGNMENTS, 0x5EED);
    let mut destination = vec![0u8; MAX_LEN + ALIGNMENTS];
    let offsets = [(0, 0), (1, 0), (0, 3), (17, 33), (63, 62)];
    for len in 0..=MAX_LEN {
        for (i, &(src_offset, dst_offset)) in offsets.iter().enumerate() {
            let src = &source[src_offset..src_offset + len];
            let prior = if i % 2 == 0 { 0 } else { 0xDEAD_BEEF };
            let expected = reference.append(prior, src);
            for engine in &engines {
                for (path, single_pass) in [("chosen", false), ("single pass", true)] {
                    destination.fill(0xEE);
                    let dst = &mut destination[dst_offset..dst_offset + len];
                    let got = if single_pass {
                        engine.copy_append_single_pass(prior, dst, src)
                    } else {
                        engine.copy_append(prior, dst, src)
                    };
                    let what = format!(
                        "{} {path} len {len} offsets {src_offset}/{dst_offset}",
                        engine.algorithm()
                    );
                    assert_eq!(got, expected, "{what}");
                    assert_eq!(dst, src, "{what}: copied wrongly");
                    assert!(
                        destination[..dst_offset].iter().all(|&b| b == 0xEE),
                        "{what}"
                    );
                    assert!(
                        destination[dst_offset + len..].iter().all(|&b| b == 0xEE),
                        "{what}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_single_pass_threshold_is_a_fixed_size() {
    for engine in engines() {
        assert_eq!(
            engine.single_pass_min_len().is_some(),
            engine.has_single_pass_copy(),
            "{}",
            engine.algorithm()
        );
        assert_eq!(
            engine.single_pass_min_len(),
            engine.algorithm().engine().unwrap().single_pass_min_len()
        );
    }
}

#[test]
fn large_buffers_agree_across_the_three_way_and_folding_block_sizes() {
    // Lengths around the stream and fold unit boundaries, well beyond 4 KiB.
    let data = random_bytes(3 * 8192 * 3 + 1000, 7);
    let reference = Algorithm::Slicing8.engine().unwrap();
    for len in [
        24_575, 24_576, 24_577, 49_151, 49_152, 49_153, 65_536, 73_000, 74_728,
    ] {
        let mut landed = vec![0u8; len];
        let expected = reference.checksum(&data[..len]);
        for engine in engines() {
            assert_eq!(
                engine.checksum(&data[..len]),
                expected,
                "{} {len}",
                engine.algorithm()
            );
            landed.fill(0);
            assert_eq!(
                engine.copy_append(0, &mut landed, &data[..len]),
                expected,
                "{} copy {len}",
                engine.algorithm()
            );
            assert_eq!(landed, &data[..len]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn appending_over_any_split_equals_one_shot(
        data in proptest::collection::vec(any::<u8>(), 0..=MAX_LEN),
        split in any::<prop::sample::Index>(),
    ) {
        let split = split.index(data.len() + 1);
        let (head, tail) = data.split_at(split);
        let whole = crc32c(&data);
        for engine in engines() {
            prop_assert_eq!(engine.append(engine.checksum(head), tail), whole);
        }
        prop_assert_eq!(crc32c_append(crc32c(head), tail), whole);
        prop_assert_eq!(crc32c_combine(crc32c(head), crc32c(tail), tail.len() as u64), whole);
    }

    #[test]
    fn fused_copy_in_pieces_copies_exactly_and_matches(
        data in proptest::collection::vec(any::<u8>(), 0..=MAX_LEN),
        split in any::<prop::sample::Index>(),
    ) {
        let split = split.index(data.len() + 1);
        for engine in engines() {
            let mut landed = vec![0u8; data.len()];
            let (dst_head, dst_tail) = landed.split_at_mut(split);
            let crc = engine.copy_append(0, dst_head, &data[..split]);
            let crc = engine.copy_append(crc, dst_tail, &data[split..]);
            prop_assert_eq!(crc, crc32c(&data));
            prop_assert_eq!(&landed, &data);
        }
    }
}

#[test]
#[should_panic(expected = "lengths differ")]
fn fused_copy_refuses_mismatched_lengths() {
    let mut dst = [0u8; 3];
    iscsi_crc32c::copy_with_crc32c(&mut dst, &[1, 2, 3, 4]);
}
