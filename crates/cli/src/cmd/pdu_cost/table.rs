//! The arithmetic from two runs of a case to a table row, and the table's
//! text, CSV and JSON forms.
//!
//! A case runs at two command counts; what differs between the two is the
//! measured loop alone (start-up, login, the fill and logout cost the same),
//! so the per-command cost is the difference divided by the difference in
//! commands. Per PDU divides that by the PDUs one command puts on the wire
//! (both ways: the command, Data-In, R2T, Data-Out, response), per byte by
//! the command's data.

use anyhow::bail;
use serde::Serialize;

use super::category::{Category, Costs};

/// One run of one side at one command count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Run {
    /// Commands in the measured loop.
    pub commands: u64,
    /// PDUs both ways during the loop.
    pub pdus: u64,
    /// The whole process's instructions by category.
    pub costs: Costs,
}

/// Time per PDU measured natively with `perf` (medians of runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Kernel {
    /// Kernel nanoseconds per PDU of this side's process.
    pub kernel_ns_per_pdu: f64,
    /// Of those, in the kernel's copy routines (`_copy_to_iter`...).
    pub kernel_copy_ns_per_pdu: f64,
    /// User-space nanoseconds per PDU, the cross-check of the instructions.
    pub user_ns_per_pdu: f64,
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// `target` or `initiator`.
    pub side: String,
    /// `read` or `write`.
    pub rw: String,
    /// Bytes per command.
    pub bs: u64,
    /// HeaderDigest and DataDigest CRC32C.
    pub digests: bool,
    /// PDUs on the wire per command.
    pub pdus_per_command: f64,
    /// Instructions per PDU by category, in [`Category::ALL`] order.
    pub per_pdu: Costs,
    /// Instructions per PDU, all categories.
    pub total_per_pdu: f64,
    /// Instructions per command.
    pub total_per_command: f64,
    /// Instructions per data byte.
    pub total_per_byte: f64,
    /// Digest instructions per data byte.
    pub digest_per_byte: f64,
    /// Copy instructions per data byte.
    pub copy_per_byte: f64,
    /// The native time measurements, where `perf` ran.
    pub kernel: Option<Kernel>,
}

/// A row from the two runs of one side of a case.
pub fn row(
    side: &str,
    rw: &str,
    bs: u64,
    digests: bool,
    low: &Run,
    high: &Run,
) -> anyhow::Result<Row> {
    if high.commands <= low.commands {
        bail!(
            "the second run must have more commands ({} <= {})",
            high.commands,
            low.commands
        );
    }
    if low.pdus * high.commands != high.pdus * low.commands {
        bail!(
            "PDUs per command differ between runs ({} / {} vs {} / {}): not the same case",
            low.pdus,
            low.commands,
            high.pdus,
            high.commands
        );
    }
    if bs == 0 || high.pdus == 0 {
        bail!("a case needs data and PDUs");
    }
    let commands = (high.commands - low.commands) as f64;
    let pdus_per_command = high.pdus as f64 / high.commands as f64;
    let mut per_pdu = [0.0; 8];
    for ((out, hi), lo) in per_pdu.iter_mut().zip(high.costs).zip(low.costs) {
        *out = (hi - lo) / commands / pdus_per_command;
    }
    let total_per_pdu: f64 = per_pdu.iter().sum();
    let total_per_command = total_per_pdu * pdus_per_command;
    let per_byte = |c: Category| per_pdu[c as usize] * pdus_per_command / bs as f64;
    Ok(Row {
        side: side.to_owned(),
        rw: rw.to_owned(),
        bs,
        digests,
        pdus_per_command,
        per_pdu,
        total_per_pdu,
        total_per_command,
        total_per_byte: total_per_command / bs as f64,
        digest_per_byte: per_byte(Category::Digest),
        copy_per_byte: per_byte(Category::Copy),
        kernel: None,
    })
}

/// A size as the table writes it: `8K`, `64K`, `1M`.
pub fn size_label(bs: u64) -> String {
    if bs >= 1 << 20 && bs.is_multiple_of(1 << 20) {
        format!("{}M", bs >> 20)
    } else if bs >= 1 << 10 && bs.is_multiple_of(1 << 10) {
        format!("{}K", bs >> 10)
    } else {
        bs.to_string()
    }
}

fn header_names() -> Vec<String> {
    let mut names: Vec<String> = ["side", "rw", "bs", "digests", "pdus_per_cmd"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    names.extend(
        Category::ALL
            .iter()
            .map(|c| format!("{}_per_pdu", c.name())),
    );
    names.extend(
        [
            "total_per_pdu",
            "total_per_cmd",
            "total_per_byte",
            "digest_per_byte",
            "copy_per_byte",
            "kernel_ns_per_pdu",
            "kernel_copy_ns_per_pdu",
            "user_ns_per_pdu",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    names
}

fn cells(row: &Row, integer: fn(f64) -> String, fraction: fn(f64) -> String) -> Vec<String> {
    let mut cells = vec![
        row.side.clone(),
        row.rw.clone(),
        size_label(row.bs),
        if row.digests { "crc32c" } else { "none" }.to_owned(),
        format!("{:.2}", row.pdus_per_command),
    ];
    cells.extend(row.per_pdu.iter().map(|&v| integer(v)));
    cells.push(integer(row.total_per_pdu));
    cells.push(integer(row.total_per_command));
    for v in [row.total_per_byte, row.digest_per_byte, row.copy_per_byte] {
        cells.push(fraction(v));
    }
    match &row.kernel {
        Some(k) => {
            for v in [
                k.kernel_ns_per_pdu,
                k.kernel_copy_ns_per_pdu,
                k.user_ns_per_pdu,
            ] {
                cells.push(format!("{v:.0}"));
            }
        }
        None => cells.extend(["", "", ""].iter().map(|s| s.to_string())),
    }
    cells
}

/// The rows as CSV, one header line, full precision.
pub fn csv(rows: &[Row]) -> String {
    let mut out = header_names().join(",") + "\n";
    for row in rows {
        out += &cells(row, |v| format!("{v:.1}"), |v| format!("{v:.4}")).join(",");
        out += "\n";
    }
    out
}

/// The rows as a Markdown table (instructions rounded to whole numbers).
pub fn markdown(rows: &[Row]) -> String {
    let names = header_names();
    let mut out = format!("| {} |\n", names.join(" | "));
    out += &format!("|{}\n", "---|".repeat(names.len()));
    for row in rows {
        let cells = cells(row, |v| format!("{v:.0}"), |v| format!("{v:.3}"));
        out += &format!("| {} |\n", cells.join(" | "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(values: [f64; 8]) -> Costs {
        values
    }

    /// 10 and 30 commands of 8 KiB, 2 PDUs each: the 20 extra commands cost
    /// the difference, 40 PDUs.
    #[test]
    fn row_from_two_runs() {
        let low = Run {
            commands: 10,
            pdus: 20,
            costs: costs([1000.0, 2000.0, 500.0, 300.0, 100.0, 50.0, 70.0, 9000.0]),
        };
        let high = Run {
            commands: 30,
            pdus: 60,
            costs: costs([1800.0, 6000.0, 2100.0, 300.0, 180.0, 90.0, 110.0, 9800.0]),
        };
        let row = row("initiator", "read", 8192, true, &low, &high).unwrap();
        assert_eq!(row.pdus_per_command, 2.0);
        assert_eq!(row.per_pdu, [20.0, 100.0, 40.0, 0.0, 2.0, 1.0, 1.0, 20.0]);
        assert_eq!(row.total_per_pdu, 184.0);
        assert_eq!(row.total_per_command, 368.0);
        assert_eq!(row.total_per_byte, 368.0 / 8192.0);
        assert_eq!(row.digest_per_byte, 200.0 / 8192.0);
        assert_eq!(row.copy_per_byte, 80.0 / 8192.0);
    }

    #[test]
    fn refuses_runs_that_are_not_one_case() {
        let run = |commands, pdus| Run {
            commands,
            pdus,
            costs: [0.0; 8],
        };
        assert!(row("t", "read", 8192, false, &run(10, 20), &run(10, 20)).is_err());
        assert!(row("t", "read", 8192, false, &run(10, 20), &run(30, 61)).is_err());
        assert!(row("t", "read", 0, false, &run(10, 20), &run(30, 60)).is_err());
    }

    #[test]
    fn csv_and_markdown_columns() {
        let mut row = row(
            "target",
            "write",
            65536,
            false,
            &Run {
                commands: 1,
                pdus: 3,
                costs: [0.0; 8],
            },
            &Run {
                commands: 2,
                pdus: 6,
                costs: [3.0, 0.0, 6.0, 0.0, 0.0, 0.0, 3.0, 0.0],
            },
        )
        .unwrap();
        row.kernel = Some(Kernel {
            kernel_ns_per_pdu: 1500.4,
            kernel_copy_ns_per_pdu: 200.0,
            user_ns_per_pdu: 99.6,
        });
        let csv = csv(&[row.clone()]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert_eq!(
            lines[1],
            "target,write,64K,none,3.00,1.0,0.0,2.0,0.0,0.0,0.0,1.0,0.0,4.0,12.0,0.0002,0.0000,0.0001,1500,200,100"
        );
        let md = markdown(&[row]);
        assert!(
            md.contains(
                "| target | write | 64K | none | 3.00 | 1 | 0 | 2 | 0 | 0 | 0 | 1 | 0 | 4 | 12 |"
            ),
            "{md}"
        );
    }

    #[test]
    fn size_labels() {
        assert_eq!(size_label(8192), "8K");
        assert_eq!(size_label(1 << 20), "1M");
        assert_eq!(size_label(1000), "1000");
    }
}
