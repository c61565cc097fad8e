//! The rows of a sweep (`results.csv`): one per cell and repeat, the swept
//! keys' values first (one column per key name), then the fixed measurement
//! columns. The CSV is the interface between `iscsi sweep`, which measures,
//! and `iscsi model`, which re-fits: everything the models and plots need
//! is in it, so a sweep can be re-analysed (or its file edited) later.
//!
//! Units: throughput in MiB/s, and the seed paper's "time per MB" is
//! `ms_per_mb` = 1000 / `mib_per_s`, i.e. milliseconds per MiB (2^20
//! bytes); byte columns are bytes per command. MiB is used throughout.

use std::io::{Read, Write};

/// The fixed columns, in order, after the key columns.
pub const FIXED_COLUMNS: [&str; 16] = [
    "rw",
    "bs",
    "qd",
    "repeat",
    "mib_per_s",
    "iops",
    "p50_us",
    "p99_us",
    "cpu_us_per_io",
    "data_in_per_cmd",
    "r2t_per_cmd",
    "data_out_per_cmd",
    "immediate_bytes",
    "unsolicited_bytes",
    "solicited_bytes",
    "ms_per_mb",
];

/// Bytes in a MiB, the unit of every "per MB" quantity here.
pub const MIB: f64 = 1_048_576.0;

/// One measured cell and repeat.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The swept keys' values, in the order of [`Results::key_names`].
    pub keys: Vec<String>,
    /// read, write, randread or randwrite.
    pub rw: String,
    /// Bytes per command.
    pub bs: u64,
    /// Commands in flight.
    pub qd: u64,
    /// Which round of the sweep (0-based): repeats are interleaved.
    pub repeat: u32,
    /// Throughput in MiB/s.
    pub mib_per_s: f64,
    /// Commands per second.
    pub iops: f64,
    /// Median command latency in microseconds.
    pub p50_us: f64,
    /// 99th percentile latency in microseconds.
    pub p99_us: f64,
    /// The initiator process's user+system CPU time per command, in
    /// microseconds.
    pub cpu_us_per_io: f64,
    /// Data-In PDUs per command, as counted on the wire.
    pub data_in_per_cmd: f64,
    /// R2T PDUs per command.
    pub r2t_per_cmd: f64,
    /// Data-Out PDUs per command (solicited and unsolicited).
    pub data_out_per_cmd: f64,
    /// Immediate data bytes per command.
    pub immediate_bytes: f64,
    /// Unsolicited Data-Out bytes per command.
    pub unsolicited_bytes: f64,
    /// Solicited (R2T-answering) Data-Out bytes per command.
    pub solicited_bytes: f64,
    /// Milliseconds per MiB moved: 1000 / `mib_per_s`.
    pub ms_per_mb: f64,
}

impl Row {
    /// Whether the row measured writes (the data moved by Data-Out).
    pub fn is_write(&self) -> bool {
        self.rw.ends_with("write")
    }

    /// The value of the named column (key or fixed) as text.
    pub fn column(&self, results: &Results, name: &str) -> Option<String> {
        if let Some(index) = results.key_names.iter().position(|key| key == name) {
            return self.keys.get(index).cloned();
        }
        let fixed = self.fixed_fields();
        let index = FIXED_COLUMNS.iter().position(|column| *column == name)?;
        Some(fixed[index].clone())
    }

    fn fixed_fields(&self) -> [String; 16] {
        [
            self.rw.clone(),
            self.bs.to_string(),
            self.qd.to_string(),
            self.repeat.to_string(),
            self.mib_per_s.to_string(),
            self.iops.to_string(),
            self.p50_us.to_string(),
            self.p99_us.to_string(),
            self.cpu_us_per_io.to_string(),
            self.data_in_per_cmd.to_string(),
            self.r2t_per_cmd.to_string(),
            self.data_out_per_cmd.to_string(),
            self.immediate_bytes.to_string(),
            self.unsolicited_bytes.to_string(),
            self.solicited_bytes.to_string(),
            self.ms_per_mb.to_string(),
        ]
    }
}

/// A whole sweep's rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Results {
    /// The swept key names, one CSV column each, in column order.
    pub key_names: Vec<String>,
    /// Every row, in the order measured.
    pub rows: Vec<Row>,
}

/// Why a results file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CsvError {
    /// The csv crate's error (I/O or malformed CSV).
    #[error(transparent)]
    Csv(#[from] csv::Error),
    /// A fixed column is missing from the header.
    #[error("results.csv has no {0:?} column")]
    MissingColumn(&'static str),
    /// A key name collides with a fixed column.
    #[error("key name {0:?} is also a fixed column")]
    KeyNameClash(String),
    /// A field does not parse.
    #[error("row {row}: column {column:?}: {value:?} is not a number")]
    BadNumber {
        /// 1-based data row.
        row: usize,
        /// The column.
        column: &'static str,
        /// What was there.
        value: String,
    },
}

/// Writes rows one at a time (a sweep streams them as they are measured),
/// the header first.
pub struct RowWriter<W: Write> {
    writer: csv::Writer<W>,
    keys: usize,
}

impl<W: Write> RowWriter<W> {
    /// Writes the header: the key names, then [`FIXED_COLUMNS`].
    pub fn new(out: W, key_names: &[String]) -> Result<Self, CsvError> {
        if let Some(clash) = key_names
            .iter()
            .find(|name| FIXED_COLUMNS.contains(&name.as_str()))
        {
            return Err(CsvError::KeyNameClash(clash.clone()));
        }
        let mut writer = csv::Writer::from_writer(out);
        let header: Vec<&str> = key_names
            .iter()
            .map(String::as_str)
            .chain(FIXED_COLUMNS)
            .collect();
        writer.write_record(&header)?;
        Ok(RowWriter {
            writer,
            keys: key_names.len(),
        })
    }

    /// Writes one row and flushes it, so that what was measured is on disk
    /// even if the sweep is stopped.
    pub fn write(&mut self, row: &Row) -> Result<(), CsvError> {
        assert_eq!(row.keys.len(), self.keys, "a value for every key column");
        let fixed = row.fixed_fields();
        let record: Vec<&str> = row
            .keys
            .iter()
            .map(String::as_str)
            .chain(fixed.iter().map(String::as_str))
            .collect();
        self.writer.write_record(&record)?;
        self.writer.flush().map_err(csv::Error::from)?;
        Ok(())
    }

    /// Flushes and hands back the output.
    pub fn finish(self) -> Result<W, CsvError> {
        self.writer
            .into_inner()
            .map_err(|error| CsvError::Csv(csv::Error::from(error.into_error())))
    }
}

impl Results {
    /// The whole CSV text of these rows.
    pub fn write_csv<W: Write>(&self, out: W) -> Result<W, CsvError> {
        let mut writer = RowWriter::new(out, &self.key_names)?;
        for row in &self.rows {
            writer.write(row)?;
        }
        writer.finish()
    }

    /// Reads a results CSV: every column that is not a fixed one is a key.
    pub fn read_csv<R: Read>(input: R) -> Result<Results, CsvError> {
        let mut reader = csv::Reader::from_reader(input);
        let header = reader.headers()?.clone();
        let mut fixed_at = [0usize; 16];
        for (slot, column) in fixed_at.iter_mut().zip(FIXED_COLUMNS) {
            *slot = header
                .iter()
                .position(|name| name == column)
                .ok_or(CsvError::MissingColumn(column))?;
        }
        let key_at: Vec<usize> = (0..header.len())
            .filter(|index| !fixed_at.contains(index))
            .collect();
        let key_names = key_at.iter().map(|&i| header[i].to_owned()).collect();
        let mut rows = Vec::new();
        for (number, record) in reader.records().enumerate() {
            let record = record?;
            let field = |column: usize| record.get(fixed_at[column]).unwrap_or("");
            let number_at = |column: usize| -> Result<f64, CsvError> {
                let text = field(column);
                text.trim().parse().map_err(|_| CsvError::BadNumber {
                    row: number + 1,
                    column: FIXED_COLUMNS[column],
                    value: text.to_owned(),
                })
            };
            let integer_at = |column: usize| -> Result<u64, CsvError> {
                let text = field(column);
                text.trim().parse().map_err(|_| CsvError::BadNumber {
                    row: number + 1,
                    column: FIXED_COLUMNS[column],
                    value: text.to_owned(),
                })
            };
            rows.push(Row {
                keys: key_at
                    .iter()
                    .map(|&i| record.get(i).unwrap_or("").to_owned())
                    .collect(),
                rw: field(0).to_owned(),
                bs: integer_at(1)?,
                qd: integer_at(2)?,
                repeat: u32::try_from(integer_at(3)?).map_err(|_| CsvError::BadNumber {
                    row: number + 1,
                    column: "repeat",
                    value: field(3).to_owned(),
                })?,
                mib_per_s: number_at(4)?,
                iops: number_at(5)?,
                p50_us: number_at(6)?,
                p99_us: number_at(7)?,
                cpu_us_per_io: number_at(8)?,
                data_in_per_cmd: number_at(9)?,
                r2t_per_cmd: number_at(10)?,
                data_out_per_cmd: number_at(11)?,
                immediate_bytes: number_at(12)?,
                unsolicited_bytes: number_at(13)?,
                solicited_bytes: number_at(14)?,
                ms_per_mb: number_at(15)?,
            });
        }
        Ok(Results { key_names, rows })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A row with the given keys and throughput; other fields derived.
    pub fn row(keys: &[&str], rw: &str, mib_per_s: f64) -> Row {
        Row {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            rw: rw.to_owned(),
            bs: 65536,
            qd: 4,
            repeat: 0,
            mib_per_s,
            iops: mib_per_s * 16.0,
            p50_us: 100.5,
            p99_us: 250.0,
            cpu_us_per_io: 7.25,
            data_in_per_cmd: 8.0,
            r2t_per_cmd: 0.0,
            data_out_per_cmd: 0.0,
            immediate_bytes: 0.0,
            unsolicited_bytes: 0.0,
            solicited_bytes: 0.0,
            ms_per_mb: 1000.0 / mib_per_s,
        }
    }

    #[test]
    fn csv_round_trip_keeps_every_field_and_key_column() {
        let mut second = row(&["16384", "Yes"], "write", 333.3);
        second.repeat = 1;
        second.r2t_per_cmd = 0.1 + 0.2; // a float that does not print short
        second.immediate_bytes = 8192.0;
        let results = Results {
            key_names: vec!["MaxRecvDataSegmentLength".into(), "InitialR2T".into()],
            rows: vec![row(&["8192", "No"], "read", 512.0), second],
        };
        let text = results.write_csv(Vec::new()).unwrap();
        let header = String::from_utf8(text.clone()).unwrap();
        assert!(header.starts_with(
            "MaxRecvDataSegmentLength,InitialR2T,rw,bs,qd,repeat,mib_per_s,iops,p50_us,p99_us,\
             cpu_us_per_io,data_in_per_cmd,r2t_per_cmd,data_out_per_cmd,immediate_bytes,\
             unsolicited_bytes,solicited_bytes,ms_per_mb\n"
        ));
        let back = Results::read_csv(text.as_slice()).unwrap();
        assert_eq!(back, results);
        assert_eq!(
            back.rows[1].column(&back, "InitialR2T").as_deref(),
            Some("Yes")
        );
        assert_eq!(back.rows[1].column(&back, "repeat").as_deref(), Some("1"));
    }

    #[test]
    fn a_missing_column_or_bad_number_is_named() {
        let error = Results::read_csv("rw,bs\nread,4096\n".as_bytes()).unwrap_err();
        assert!(error.to_string().contains("\"qd\""), "{error}");
        let results = Results {
            key_names: vec![],
            rows: vec![row(&[], "read", 100.0)],
        };
        let text = String::from_utf8(results.write_csv(Vec::new()).unwrap()).unwrap();
        let broken = text.replace(",100,", ",fast,");
        let error = Results::read_csv(broken.as_bytes()).unwrap_err();
        assert!(error.to_string().contains("mib_per_s"), "{error}");
        let error = RowWriter::new(Vec::new(), &["qd".to_owned()])
            .err()
            .unwrap();
        assert!(matches!(error, CsvError::KeyNameClash(_)));
    }
}
