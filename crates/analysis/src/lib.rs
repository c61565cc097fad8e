//! The pure half of `iscsi sweep` and `iscsi model`: a sweep's rows and
//! their CSV form ([`rows`]), the seed paper's linear models of time per
//! MiB fitted by least squares ([`fit`]), its MaxOutstandingR2T rule
//! ([`eq3`]), and the plots ([`plot`]). Nothing here touches the network:
//! the CLI measures, this crate turns rows into `models.json` and PNGs, so
//! every part can be tested on known data.
//!
//! The seed is Shastry, Klotz, Russell, "Evaluation of iSCSI parameters"
//! (§5-6): eq. 1 t = A·x + B for reads, eq. 2 for writes, eq. 3 n·m = 64.
//! t is milliseconds per MiB here (the paper says MB; see [`rows`]).

pub mod eq3;
pub mod fit;
pub mod plot;
pub mod rows;

use std::collections::BTreeSet;

pub use rows::{Results, Row, RowWriter};

/// One fitted model, as it appears in `models.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Model {
    /// "eq1", "eq2" or "eq3".
    pub model: String,
    /// The equation in words.
    pub equation: String,
    /// The term names, in the order of `coefficients`.
    pub terms: Vec<String>,
    /// One per term.
    pub coefficients: Vec<f64>,
    /// Coefficient of determination (about the mean); null where not a
    /// regression (eq. 3) or the observations do not vary.
    pub r2: Option<f64>,
    /// Rows used.
    pub n: usize,
    /// Root mean squared residual in ms per MiB (regressions only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rmse: Option<f64>,
    /// For eq. 3: what the rows share (rw, bs, qd, other keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// For eq. 3: the chosen n for each m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<Vec<eq3::Choice>>,
    /// Terms dropped and other remarks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A model the data could not determine, and why (printed, not an error).
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    /// "eq1", "eq2" or "eq3".
    pub model: &'static str,
    /// Why.
    pub reason: String,
}

/// Everything fitted from one sweep's rows.
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    /// The models that were determined, in the order eq1, eq2, eq3.
    pub models: Vec<Model>,
    /// The models that were not.
    pub skipped: Vec<Skipped>,
    /// Eq. 1's fit, kept for its plot.
    pub eq1: Option<fit::Fit>,
    /// Eq. 2's fit, kept for its plot.
    pub eq2: Option<fit::Eq2Fit>,
    /// Eq. 3's searches, kept for the heat maps.
    pub eq3: Vec<eq3::Eq3Search>,
}

impl Analysis {
    /// `models.json`: a JSON list of the fitted models.
    pub fn models_json(&self) -> String {
        serde_json::to_string_pretty(&self.models).expect("models serialise")
    }
}

/// Fits every model the rows determine.
pub fn analyze(results: &Results) -> Analysis {
    let mut analysis = Analysis::default();
    match fit::fit_eq1(&results.rows) {
        Ok(fit) => {
            analysis.models.push(Model {
                model: "eq1".into(),
                equation: "ms per MiB = A * data_in_per_cmd + B".into(),
                terms: fit.terms.clone(),
                coefficients: fit.coefficients.clone(),
                r2: fit.r2,
                n: fit.n,
                rmse: Some(fit.rmse),
                group: None,
                table: None,
                notes: Vec::new(),
            });
            analysis.eq1 = Some(fit);
        }
        Err(why) => analysis.skipped.push(Skipped {
            model: "eq1",
            reason: why.to_string(),
        }),
    }
    match fit::fit_eq2(&results.rows) {
        Ok(eq2) => {
            analysis.models.push(Model {
                model: "eq2".into(),
                equation: "ms per MiB = A*r2t_per_cmd + B*data_out_per_cmd + C*immediate_MiB \
                           + D*unsolicited_MiB + E*solicited_MiB (+ F)"
                    .into(),
                terms: eq2.fit.terms.clone(),
                coefficients: eq2.fit.coefficients.clone(),
                r2: eq2.fit.r2,
                n: eq2.fit.n,
                rmse: Some(eq2.fit.rmse),
                group: None,
                table: None,
                notes: eq2.notes.clone(),
            });
            analysis.eq2 = Some(eq2);
        }
        Err(why) => analysis.skipped.push(Skipped {
            model: "eq2",
            reason: why.to_string(),
        }),
    }
    match eq3::eq3_searches(results, eq3::DEFAULT_TOLERANCE) {
        Ok(searches) => {
            for search in &searches {
                let mut notes = vec![format!(
                    "n: the smallest {} within {:.0}% of the best throughput at each m ({} if swept, else {})",
                    eq3::MAX_OUTSTANDING_R2T,
                    eq3::DEFAULT_TOLERANCE * 100.0,
                    eq3::MAX_XMIT,
                    eq3::MRDSL
                )];
                let (terms, coefficients) = match search.constant {
                    Some(c) => (vec!["n_times_m_kib".to_owned()], vec![c]),
                    None => {
                        notes.push(
                            "no constant: every choice is at the edge of the n tried".to_owned(),
                        );
                        (Vec::new(), Vec::new())
                    }
                };
                analysis.models.push(Model {
                    model: "eq3".into(),
                    equation: "n * m = c (m = the Data-Out size in KiB, c = geometric mean of \
                               n*m over choices not at the edge of the n tried)"
                        .into(),
                    terms,
                    coefficients,
                    r2: None,
                    n: search.rows,
                    rmse: None,
                    group: Some(search.group.clone()),
                    table: Some(search.choices.clone()),
                    notes,
                });
            }
            analysis.eq3 = searches;
        }
        Err(reason) => analysis.skipped.push(Skipped {
            model: "eq3",
            reason,
        }),
    }
    analysis
}

/// What varies across a sweep's rows: a key (with the keys that take the
/// same value in every row, as linked keys do), bs, qd or rw.
#[derive(Clone, Debug, PartialEq)]
pub struct Dimension {
    /// The column names, joined by ',' for linked keys.
    pub name: String,
    /// Where the value comes from.
    pub source: Source,
    /// The distinct values: numerically ascending if all are numbers, else
    /// in order of appearance.
    pub values: Vec<String>,
}

/// Where a [`Dimension`]'s value is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A key column (the first of a linked set).
    Key(usize),
    /// The `bs` column.
    Bs,
    /// The `qd` column.
    Qd,
    /// The `rw` column.
    Rw,
}

impl Dimension {
    /// This dimension's value in a row.
    pub fn value(&self, row: &Row) -> String {
        match self.source {
            Source::Key(column) => row.keys[column].clone(),
            Source::Bs => row.bs.to_string(),
            Source::Qd => row.qd.to_string(),
            Source::Rw => row.rw.clone(),
        }
    }
}

/// The dimensions along which the rows take more than one value.
pub fn dimensions(results: &Results) -> Vec<Dimension> {
    let rows = &results.rows;
    let mut dimensions = Vec::new();
    let mut taken = BTreeSet::new();
    for first in 0..results.key_names.len() {
        if !taken.insert(first) {
            continue;
        }
        let mut names = vec![results.key_names[first].clone()];
        for other in first + 1..results.key_names.len() {
            if !taken.contains(&other) && rows.iter().all(|row| row.keys[first] == row.keys[other])
            {
                taken.insert(other);
                names.push(results.key_names[other].clone());
            }
        }
        dimensions.push(Dimension {
            name: names.join(","),
            source: Source::Key(first),
            values: Vec::new(),
        });
    }
    for (name, source) in [("bs", Source::Bs), ("qd", Source::Qd), ("rw", Source::Rw)] {
        dimensions.push(Dimension {
            name: name.to_owned(),
            source,
            values: Vec::new(),
        });
    }
    for dimension in &mut dimensions {
        let mut values: Vec<String> = Vec::new();
        for row in rows {
            let value = dimension.value(row);
            if !values.contains(&value) {
                values.push(value);
            }
        }
        if values.iter().all(|v| v.parse::<f64>().is_ok()) {
            values.sort_by(|a, b| {
                let (a, b): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
                a.total_cmp(&b)
            });
        }
        dimension.values = values;
    }
    dimensions.retain(|dimension| dimension.values.len() > 1);
    dimensions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::tests::row;

    fn sweep_rows() -> Results {
        // MRDSL linked with MaxBurstLength; InitialR2T on its own; two qd.
        let mut rows = Vec::new();
        for (mrdsl, rate) in [("8192", 300.0), ("65536", 400.0), ("1024", 100.0)] {
            for initial in ["Yes", "No"] {
                for qd in [1, 4] {
                    let mut r = row(&[mrdsl, initial, mrdsl], "read", rate + qd as f64);
                    r.qd = qd;
                    rows.push(r);
                }
            }
        }
        Results {
            key_names: vec![
                "MaxRecvDataSegmentLength".into(),
                "InitialR2T".into(),
                "MaxBurstLength".into(),
            ],
            rows,
        }
    }

    #[test]
    fn linked_keys_form_one_dimension_and_constant_columns_none() {
        let dims = dimensions(&sweep_rows());
        let names: Vec<&str> = dims.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "MaxRecvDataSegmentLength,MaxBurstLength",
                "InitialR2T",
                "qd"
            ]
        );
        assert_eq!(dims[0].values, ["1024", "8192", "65536"]);
        assert_eq!(dims[1].values, ["Yes", "No"]);
    }

    #[test]
    fn analysis_skips_what_the_rows_cannot_determine_and_json_parses() {
        let results = sweep_rows();
        let analysis = analyze(&results);
        // Every read row has 8 Data-Ins per command: eq. 1 has one distinct
        // x, no write rows for eq. 2, no MaxOutstandingR2T for eq. 3.
        let skipped: Vec<&str> = analysis.skipped.iter().map(|s| s.model).collect();
        assert_eq!(skipped, ["eq1", "eq2", "eq3"]);
        assert!(analysis.skipped[0].reason.contains("distinct rows"));
        let parsed: Vec<Model> = serde_json::from_str(&analysis.models_json()).unwrap();
        assert!(parsed.is_empty());
    }

    #[test]
    fn eq3_searches_group_rows_and_fold_linked_keys() {
        let mut rows = Vec::new();
        // Throughput saturates once n·m reaches 32 KiB.
        for m in [1024u64, 4096, 16384] {
            for n in [1u64, 2, 4, 8, 16, 32] {
                for repeat in 0..2 {
                    let rate = 100.0 * ((n * m) as f64 / 32768.0).min(1.0) + repeat as f64;
                    let mut r = row(
                        &[&m.to_string(), &n.to_string(), &m.to_string()],
                        "write",
                        rate,
                    );
                    r.repeat = repeat;
                    rows.push(r);
                }
            }
        }
        let results = Results {
            key_names: vec![
                "MaxRecvDataSegmentLength".into(),
                "MaxOutstandingR2T".into(),
                "MaxBurstLength".into(),
            ],
            rows,
        };
        let analysis = analyze(&results);
        assert_eq!(analysis.eq3.len(), 1, "MaxBurstLength moves with MRDSL");
        let search = &analysis.eq3[0];
        assert_eq!(search.group, "rw=write bs=65536 qd=4");
        let chosen: Vec<u64> = search.choices.iter().map(|c| c.n).collect();
        assert_eq!(chosen, [32, 8, 2]);
        assert_eq!(search.table.mib_per_s[0][0], Some(100.0 / 32.0 + 0.5));
        let model = analysis.models.iter().find(|m| m.model == "eq3").unwrap();
        // 32 at m = 1 KiB is the largest n tried: censored.
        assert_eq!(model.coefficients.len(), 1);
        assert!((model.coefficients[0] - 32.0).abs() < 1e-9);
        assert_eq!(model.n, 36);
        let json: serde_json::Value = serde_json::from_str(&analysis.models_json()).unwrap();
        assert_eq!(json[0]["table"][1]["n_times_m"], 32.0);
    }

    #[test]
    fn eq3_takes_m_from_the_initiators_data_out_cap_before_its_mrdsl() {
        // The initiator's MaxRecvDataSegmentLength stays at 1 MiB (it bounds
        // Data-In only); MaxXmitDataSegmentLength sizes the Data-Outs.
        let mut rows = Vec::new();
        for m in [1024u64, 4096, 16384] {
            for n in [1u64, 2, 4, 8, 16, 32] {
                let rate = 100.0 * ((n * m) as f64 / 32768.0).min(1.0);
                rows.push(row(
                    &["1048576", &m.to_string(), &n.to_string()],
                    "write",
                    rate,
                ));
            }
        }
        let results = Results {
            key_names: vec![
                "MaxRecvDataSegmentLength".into(),
                "MaxXmitDataSegmentLength".into(),
                "MaxOutstandingR2T".into(),
            ],
            rows,
        };
        let analysis = analyze(&results);
        assert_eq!(analysis.eq3.len(), 1);
        let search = &analysis.eq3[0];
        assert_eq!(search.table.mrdsl, [1024, 4096, 16384]);
        let chosen: Vec<u64> = search.choices.iter().map(|c| c.n).collect();
        assert_eq!(chosen, [32, 8, 2]);
    }
}
