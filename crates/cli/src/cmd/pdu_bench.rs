//! `iscsi pdu-bench`: the fixed per-PDU cost of receiving, beside the FAST
//! '05 study's 430-1800 cycles per PDU.
//!
//! Subjects:
//! - `bhs_decode`: the 48-byte BHS of a Data-In into its typed struct.
//! - `data_in_header_digest`: a Data-In header with its header digest
//!   through the streaming decoder (CRC32C of the BHS, checks, event).
//! - `data_in_8k_digests`: a whole 8 KiB Data-In with header and data digests,
//!   the data landed in the destination buffer by the fused copy+CRC.
//!
//! With `--iterations N --subject S` it decodes exactly N PDUs and prints
//! nothing, so that `valgrind --tool=callgrind` can count the instructions
//! (scripts/pdu-instructions does that and divides).

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use iscsi_proto::pdu::decoder::{Decoder, DecoderConfig, Event, Stage};
use iscsi_proto::pdu::{DataIn, Digests, Header, Lun, Pdu, encode_pdu_to_vec};
use iscsi_proto::serial::{CmdSn, DataSn, StatSn};
use serde::Serialize;

use super::measure::{median, tsc_hz};

/// Command-line options of `iscsi pdu-bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Timed runs per subject; the median is reported.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(3..=101))]
    runs: u32,
    /// Decode exactly this many PDUs of `--subject`, untimed (for callgrind).
    #[arg(long, requires = "subject")]
    iterations: Option<u64>,
    /// The subject for `--iterations`.
    #[arg(long)]
    subject: Option<String>,
}

const SUBJECTS: [&str; 3] = ["bhs_decode", "data_in_header_digest", "data_in_8k_digests"];

/// A Data-In PDU with `data_len` bytes of data, encoded with `digests`.
fn data_in_pdu(data_len: u32, digests: Digests) -> anyhow::Result<Vec<u8>> {
    let pdu = Pdu::DataIn(DataIn {
        final_flag: true,
        lun: Lun(1 << 48),
        initiator_task_tag: 0x1234,
        target_transfer_tag: 0xFFFF_FFFF,
        stat_sn: StatSn::new(10),
        exp_cmd_sn: CmdSn::new(20),
        max_cmd_sn: CmdSn::new(84),
        data_sn: DataSn::new(3),
        buffer_offset: 65_536,
        ..DataIn::default()
    });
    let data: Vec<u8> = (0..data_len).map(|i| (i * 7) as u8).collect();
    encode_pdu_to_vec(&Header::new(pdu, data_len), &data, digests).context("encoding the Data-In")
}

/// Decodes one whole PDU from `wire`, landing data in `landing`.
fn receive_one(decoder: &mut Decoder, wire: &[u8], landing: &mut [u8]) -> anyhow::Result<()> {
    let mut pos = 0;
    let mut landed = 0;
    loop {
        if decoder.need().stage == Stage::Data {
            let n = decoder.receive_data(&mut landing[landed..], &wire[pos..])?;
            pos += n;
            landed += n;
            continue;
        }
        let progress = decoder.feed(&wire[pos..])?;
        pos += progress.consumed;
        match progress.event {
            Some(Event::Header(header)) => {
                black_box(&header);
            }
            Some(Event::End) => return Ok(()),
            Some(Event::Data(_)) => bail!("data delivered by feed, not landed"),
            None => bail!("the PDU is incomplete"),
        }
    }
}

/// A subject ready to run: its wire bytes and what it decodes them with.
struct Subject {
    name: &'static str,
    wire: Vec<u8>,
    digests: Digests,
}

impl Subject {
    fn new(name: &str) -> anyhow::Result<Self> {
        let (name, len, digests) = match name {
            "bhs_decode" => ("bhs_decode", 0, Digests::default()),
            "data_in_header_digest" => (
                "data_in_header_digest",
                0,
                Digests {
                    header: true,
                    data: false,
                },
            ),
            "data_in_8k_digests" => (
                "data_in_8k_digests",
                8192,
                Digests {
                    header: true,
                    data: true,
                },
            ),
            other => bail!("unknown subject {other:?}; one of {SUBJECTS:?}"),
        };
        Ok(Subject {
            name,
            wire: data_in_pdu(len, digests)?,
            digests,
        })
    }

    /// Decodes `count` PDUs.
    fn run(&self, count: u64) -> anyhow::Result<()> {
        if self.name == "bhs_decode" {
            let bhs: &[u8; 48] = self.wire[..48].try_into()?;
            for _ in 0..count {
                black_box(Pdu::decode_bhs(black_box(bhs)));
            }
            return Ok(());
        }
        let mut decoder = Decoder::new(DecoderConfig {
            max_recv_data_segment_length: 262_144,
            digests: self.digests,
            ..DecoderConfig::default()
        });
        let mut landing = vec![0u8; 8192];
        for _ in 0..count {
            receive_one(&mut decoder, black_box(&self.wire), &mut landing)?;
        }
        black_box(&landing);
        Ok(())
    }

    fn data_bytes(&self) -> usize {
        if self.name == "data_in_8k_digests" {
            8192
        } else {
            0
        }
    }
}

#[derive(Serialize)]
struct Measurement {
    subject: &'static str,
    ns_per_pdu: f64,
    /// TSC cycles per PDU, where the TSC rate can be read.
    cycles_per_pdu: Option<f64>,
    data_bytes: usize,
    runs: u32,
}

/// Runs `iscsi pdu-bench`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if let Some(iterations) = args.iterations {
        let name = args.subject.as_deref().unwrap_or_default();
        return Subject::new(name)?.run(iterations);
    }
    let tsc = tsc_hz();
    let subjects: Vec<Subject> = SUBJECTS
        .iter()
        .map(|s| Subject::new(s))
        .collect::<Result<_, _>>()?;
    // Calibrate each subject to at least 20 ms per run, then interleave runs.
    let mut counts = Vec::new();
    for subject in &subjects {
        let start = Instant::now();
        subject.run(1000)?;
        let per_pdu = start.elapsed().max(Duration::from_nanos(1)).as_secs_f64() / 1000.0;
        counts.push(((0.02 / per_pdu).ceil() as u64).max(1000));
    }
    let mut samples = vec![Vec::new(); subjects.len()];
    for _ in 0..args.runs {
        for ((subject, &count), sample) in subjects.iter().zip(&counts).zip(&mut samples) {
            let start = Instant::now();
            subject.run(count)?;
            sample.push(start.elapsed().as_secs_f64() * 1e9 / count as f64);
        }
    }
    for (subject, sample) in subjects.iter().zip(&mut samples) {
        let ns = median(sample);
        let row = Measurement {
            subject: subject.name,
            ns_per_pdu: ns,
            cycles_per_pdu: tsc.map(|hz| ns * hz / 1e9),
            data_bytes: subject.data_bytes(),
            runs: args.runs,
        };
        if args.json {
            println!("{}", serde_json::to_string(&row)?);
        } else {
            let cycles = row
                .cycles_per_pdu
                .map_or_else(|| "-".to_owned(), |c| format!("{c:.0}"));
            println!(
                "{:<24} {:>10.1} ns/PDU {:>8} TSC cycles/PDU{}",
                row.subject,
                row.ns_per_pdu,
                cycles,
                if row.data_bytes > 0 {
                    format!(
                        "  ({:.2} GiB/s of data)",
                        row.data_bytes as f64 / ns / 1.073_741_824
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subject_decodes_its_pdu() {
        for name in SUBJECTS {
            Subject::new(name).unwrap().run(3).unwrap();
        }
        assert!(Subject::new("nonsense").is_err());
    }
}
