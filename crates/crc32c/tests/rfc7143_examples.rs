//! The CRC examples of RFC 7143 Appendix B.4, for every algorithm this CPU
//! runs (the bitwise reference, Sarwate and slicing-by-8 run everywhere).

use iscsi_crc32c::{Algorithm, Engine};

/// RFC 7143 B.4: an iSCSI SCSI Read (10) command PDU (48-byte BHS).
const READ_COMMAND_PDU: [u8; 48] = [
    0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
    0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// (description, message, digest bytes as RFC 7143 B.4 lists them on the wire)
fn examples() -> Vec<(&'static str, Vec<u8>, [u8; 4])> {
    vec![
        (
            "32 bytes of zeroes",
            vec![0u8; 32],
            [0xaa, 0x36, 0x91, 0x8a],
        ),
        (
            "32 bytes of ones",
            vec![0xffu8; 32],
            [0x43, 0xab, 0xa8, 0x62],
        ),
        (
            "32 bytes of incrementing 00..1f",
            (0..32u8).collect(),
            [0x4e, 0x79, 0xdd, 0x46],
        ),
        (
            "32 bytes of decrementing 1f..00",
            (0..32u8).rev().collect(),
            [0x5c, 0xdb, 0x3f, 0x11],
        ),
        (
            "an iSCSI Read command PDU",
            READ_COMMAND_PDU.to_vec(),
            [0x56, 0x3a, 0x96, 0xd9],
        ),
    ]
}

fn engines() -> Vec<Engine> {
    let engines: Vec<Engine> = Algorithm::ALL.iter().filter_map(|a| a.engine()).collect();
    assert!(engines.len() >= 3, "the portable algorithms always run");
    engines
}

#[test]
fn every_algorithm_gives_the_rfc_digests() {
    for engine in engines() {
        for (what, message, wire) in examples() {
            let digest = engine.checksum(&message);
            assert_eq!(
                digest.to_le_bytes(),
                wire,
                "{} on {what}: got {digest:#010x}",
                engine.algorithm()
            );
        }
    }
}

#[test]
fn every_fused_copy_gives_the_rfc_digests_and_the_bytes() {
    for engine in engines() {
        for (what, message, wire) in examples() {
            let mut landed = vec![0x5au8; message.len()];
            let digest = engine.copy_append(0, &mut landed, &message);
            assert_eq!(
                digest.to_le_bytes(),
                wire,
                "{} fused on {what}",
                engine.algorithm()
            );
            assert_eq!(landed, message);
        }
    }
}

#[test]
fn the_default_functions_give_the_rfc_digests() {
    for (what, message, wire) in examples() {
        assert_eq!(iscsi_crc32c::crc32c(&message).to_le_bytes(), wire, "{what}");
        let mut landed = vec![0u8; message.len()];
        assert_eq!(
            iscsi_crc32c::copy_with_crc32c(&mut landed, &message).to_le_bytes(),
            wire,
            "{what}"
        );
    }
}

#[test]
fn the_catalogue_check_value() {
    // The "123456789" check value every CRC catalogue lists for CRC-32C.
    for engine in engines() {
        assert_eq!(
            engine.checksum(b"123456789"),
            0xE306_9283,
            "{}",
            engine.algorithm()
        );
    }
}

#[test]
fn the_fastest_algorithm_runs_here() {
    let fastest = Algorithm::fastest();
    assert!(fastest.engine().is_some());
    assert_eq!(Engine::fastest().algorithm(), fastest);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        assert_ne!(
            fastest,
            Algorithm::Slicing8,
            "a CPU with crc32 must not fall back"
        );
    }
}
