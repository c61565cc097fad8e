//! Real bytes (testdata/captures, recorded by its record.sh): sessions
//! between libiscsi and tgt, and between the Linux kernel's initiator
//! (open-iscsi) and tgt with header and data digests, each direction of each
//! connection as the raw TCP stream.
//!
//! Every PDU must decode with the streaming decoder, agree with what
//! tshark's dissector and the recorder's own parser saw (offset, opcode,
//! tag, lengths, digests, CDB opcode, transfer length, buffer offset), and
//! re-encode to exactly the bytes on the wire.

use std::path::{Path, PathBuf};

use iscsi_proto::pdu::decoder::{Decoder, DecoderConfig, Event};
use iscsi_proto::pdu::login::{LoginStage, LoginStatus};
use iscsi_proto::pdu::{Digests, Header, Pdu, encode_pdu_to_vec};
use serde_json::Value;

fn captures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/captures")
}

fn hex(value: &Value) -> Option<u64> {
    value
        .as_str()
        .and_then(|s| s.strip_prefix("0x"))
        .and_then(|s| u64::from_str_radix(s, 16).ok())
}

/// Whether this PDU ends the login: digests start with the next PDU in this
/// direction (RFC 7143 13.1: "every PDU in the Full Feature Phase").
fn ends_login(pdu: &Pdu) -> bool {
    match pdu {
        Pdu::LoginRequest(r) => r.transit && r.next_stage == LoginStage::FullFeaturePhase,
        Pdu::LoginResponse(r) => {
            r.transit
                && r.next_stage == LoginStage::FullFeaturePhase
                && r.status == LoginStatus::SUCCESS
        }
        _ => false,
    }
}

struct Decoded {
    header: Header,
    data: Vec<u8>,
    offset: usize,
    length: usize,
    digests: Digests,
}

/// Decodes a whole stream, feeding it in `chunk`-byte pieces.
fn decode_stream(stream: &[u8], full_feature_digests: Digests, chunk: usize) -> Vec<Decoded> {
    let login = DecoderConfig {
        max_recv_data_segment_length: (1 << 24) - 1,
        ..DecoderConfig::default()
    };
    let mut decoder = Decoder::new(login);
    let mut out = Vec::new();
    let mut pos = 0;
    let mut start = 0;
    let mut current: Option<(Header, Vec<u8>)> = None;
    while pos < stream.len() || current.is_some() {
        let end = (pos + chunk).min(stream.len());
        let progress = decoder
            .feed(&stream[pos..end])
            .unwrap_or_else(|e| panic!("decode error at byte {pos}: {e}"));
        pos += progress.consumed;
        match progress.event {
            Some(Event::Header(header)) => current = Some((header, Vec::new())),
            Some(Event::Data(bytes)) => current
                .as_mut()
                .expect("data after a header")
                .1
                .extend_from_slice(bytes),
            Some(Event::End) => {
                let (header, data) = current.take().expect("end after a header");
                let digests = decoder.config().digests;
                let switch = ends_login(&header.pdu);
                out.push(Decoded {
                    header,
                    data,
                    offset: start,
                    length: pos - start,
                    digests,
                });
                start = pos;
                if switch {
                    decoder.set_config(DecoderConfig {
                        digests: full_feature_digests,
                        ..decoder.config()
                    });
                }
            }
            None if progress.consumed == 0 && end == stream.len() => {
                panic!("stream ends inside a PDU at byte {pos} of {}", stream.len())
            }
            None => {}
        }
    }
    out
}

fn check_direction(scenario: &str, direction: &Value, digests: Digests) -> usize {
    let file = direction["file"].as_str().expect("file");
    let stream = std::fs::read(captures().join(file)).expect("capture stream");
    assert_eq!(
        stream.len() as u64,
        direction["bytes"].as_u64().unwrap(),
        "{file}"
    );
    let expected = direction["pdus"].as_array().expect("pdus");
    for chunk in [stream.len().max(1), 1500, 7] {
        let decoded = decode_stream(&stream, digests, chunk);
        assert_eq!(
            decoded.len(),
            expected.len(),
            "{file}: PDU count (chunk {chunk})"
        );
        for (i, (pdu, seen)) in decoded.iter().zip(expected).enumerate() {
            let what = format!("{scenario} {file} PDU {i}");
            assert_eq!(
                pdu.offset as u64,
                seen["offset"].as_u64().unwrap(),
                "{what}: offset"
            );
            assert_eq!(
                pdu.length as u64,
                seen["length"].as_u64().unwrap(),
                "{what}: length"
            );
            assert_eq!(
                u64::from(pdu.header.pdu.opcode().to_bits()),
                hex(&seen["opcode"]).unwrap(),
                "{what}: opcode"
            );
            assert_eq!(
                u64::from(pdu.header.pdu.initiator_task_tag()),
                hex(&seen["itt"]).unwrap(),
                "{what}: ITT"
            );
            assert_eq!(
                u64::from(pdu.header.data_segment_length),
                seen["data_segment_length"].as_u64().unwrap(),
                "{what}: DataSegmentLength"
            );
            match &pdu.header.pdu {
                Pdu::ScsiCommand(command) => {
                    if let Some(cdb) = hex(&seen["cdb_opcode"]) {
                        assert_eq!(u64::from(command.cdb[0]), cdb, "{what}: CDB");
                    }
                    if let Some(length) = seen["expected_data_transfer_length"].as_u64() {
                        assert_eq!(
                            u64::from(command.expected_data_transfer_length),
                            length,
                            "{what}"
                        );
                    }
                }
                Pdu::DataOut(data) => {
                    assert_eq!(
                        u64::from(data.buffer_offset),
                        seen["buffer_offset"].as_u64().unwrap(),
                        "{what}"
                    );
                }
                Pdu::DataIn(data) => {
                    if let Some(offset) = seen["buffer_offset"].as_u64() {
                        assert_eq!(u64::from(data.buffer_offset), offset, "{what}");
                    }
                }
                _ => {}
            }
            // Digests were present exactly where the recorder found them.
            assert_eq!(
                pdu.digests.header,
                seen.get("header_digest").is_some(),
                "{what}: header digest"
            );
            // Re-encoding gives the bytes on the wire, digests included.
            let encoded = encode_pdu_to_vec(&pdu.header, &pdu.data, pdu.digests).expect("encodes");
            assert!(
                encoded == stream[pdu.offset..pdu.offset + pdu.length],
                "{what}: re-encoding differs from the wire bytes"
            );
        }
    }
    expected.len()
}

#[test]
fn every_captured_pdu_decodes_and_reencodes_byte_identically() {
    let mut scenarios = 0;
    let mut pdus = 0;
    let mut digest_kinds = (false, false);
    let mut entries: Vec<_> = std::fs::read_dir(captures())
        .expect("testdata/captures")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    entries.sort();
    for manifest in entries {
        let json: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        let scenario = json["scenario"].as_str().unwrap().to_owned();
        for connection in json["connections"].as_array().unwrap() {
            let digests = Digests {
                header: connection["header_digest"] == "CRC32C",
                data: connection["data_digest"] == "CRC32C",
            };
            digest_kinds.0 |= digests.header;
            digest_kinds.1 |= digests.data;
            for side in ["initiator", "target"] {
                pdus += check_direction(&scenario, &connection[side], digests);
            }
        }
        scenarios += 1;
    }
    assert!(scenarios >= 6, "only {scenarios} capture scenarios");
    assert!(pdus > 200, "only {pdus} PDUs checked");
    assert_eq!(
        digest_kinds,
        (true, true),
        "captures with header and data digests"
    );
}

#[test]
fn a_flipped_bit_in_a_captured_digest_is_caught() {
    let json: Value = serde_json::from_slice(
        &std::fs::read(captures().join("datadigest-openiscsi.json")).unwrap(),
    )
    .unwrap();
    let connection = &json["connections"][0];
    let direction = &connection["initiator"];
    let mut stream = std::fs::read(captures().join(direction["file"].as_str().unwrap())).unwrap();
    // The first PDU with a data digest: flip a bit of its data.
    let pdu = direction["pdus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p.get("data_digest").is_some())
        .expect("a PDU with a data digest");
    let at = pdu["offset"].as_u64().unwrap() as usize + 52 + 100;
    stream[at] ^= 0x10;
    let mut decoder = Decoder::new(DecoderConfig {
        max_recv_data_segment_length: (1 << 24) - 1,
        ..DecoderConfig::default()
    });
    let mut pos = 0;
    let error = loop {
        match decoder.feed(&stream[pos..]) {
            Ok(progress) => {
                pos += progress.consumed;
                if let Some(Event::End) = progress.event
                    && decoder.config().digests == Digests::default()
                {
                    decoder.set_config(DecoderConfig {
                        digests: Digests {
                            header: true,
                            data: true,
                        },
                        ..decoder.config()
                    });
                }
                assert!(pos < stream.len(), "the corruption went unnoticed");
            }
            Err(error) => break error,
        }
    };
    assert!(
        !error.requires_connection_drop(),
        "a data digest error is answered with a Reject"
    );
    assert_eq!(error.reject_reason().map(|r| r.to_u8()), Some(0x02));
}
