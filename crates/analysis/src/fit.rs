//! Ordinary least squares, and the seed paper's two linear models of time
//! per MiB (Shastry, Klotz, Russell, §5.1 eq. 1 for reads, §6.2 eq. 2 for
//! writes) fitted to a sweep's rows.
//!
//! The solve is nalgebra's SVD on a column-scaled design: scaling makes the
//! rank test fair to terms of very different sizes (Data-Outs per command
//! are ~10, MiB per command ~0.01), and the SVD tells a singular design
//! (a term that never varies, two terms that move together) from a
//! determined one instead of returning a meaningless solution.

use nalgebra::{DMatrix, DVector};

use crate::rows::{MIB, Row};

/// Singular values below this fraction of the largest count as zero.
const RANK_TOLERANCE: f64 = 1e-9;

/// A least-squares fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    /// The term names, one per column of the design.
    pub terms: Vec<String>,
    /// One coefficient per term.
    pub coefficients: Vec<f64>,
    /// 1 - SS_res / SS_tot (SS_tot about the mean); `None` when the
    /// observations do not vary.
    pub r2: Option<f64>,
    /// Observations used.
    pub n: usize,
    /// Root mean squared residual, in the unit of the observations.
    pub rmse: f64,
}

impl Fit {
    /// The fitted value for one row of terms.
    pub fn predict(&self, x: &[f64]) -> f64 {
        self.coefficients.iter().zip(x).map(|(c, x)| c * x).sum()
    }
}

/// Why a model could not be fitted: the data do not determine it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Undetermined {
    /// No rows of the kind the model describes.
    #[error("no {0} rows")]
    NoRows(&'static str),
    /// None of the model's terms occurs in the rows.
    #[error("no term of the model is ever nonzero")]
    NoTerms,
    /// Fewer distinct design rows than terms.
    #[error("{distinct} distinct rows for {terms} terms")]
    TooFewRows {
        /// Distinct rows of terms.
        distinct: usize,
        /// Terms to determine.
        terms: usize,
    },
    /// The terms are linearly dependent in these data.
    #[error("singular design: rank {rank} for {terms} terms ({which})")]
    Singular {
        /// Numerical rank of the design.
        rank: usize,
        /// Terms to determine.
        terms: usize,
        /// The terms, named.
        which: String,
    },
}

/// Fits `y ≈ X·b` by least squares. `x` holds one row of terms per
/// observation (include a column of ones for an intercept).
pub fn least_squares(terms: &[&str], x: &[Vec<f64>], y: &[f64]) -> Result<Fit, Undetermined> {
    let p = terms.len();
    let n = x.len();
    assert_eq!(n, y.len(), "one observation per row");
    assert!(x.iter().all(|row| row.len() == p), "one value per term");
    let mut distinct: Vec<&Vec<f64>> = x.iter().collect();
    distinct.sort_by(|a, b| {
        a.iter()
            .zip(b.iter())
            .map(|(a, b)| a.total_cmp(b))
            .find(|order| order.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    distinct.dedup();
    if distinct.len() < p {
        return Err(Undetermined::TooFewRows {
            distinct: distinct.len(),
            terms: p,
        });
    }
    let design = DMatrix::from_fn(n, p, |i, j| x[i][j]);
    // Column scaling: each column to unit norm (a zero column stays zero
    // and shows up as a lost rank).
    let scales: Vec<f64> = (0..p)
        .map(|j| {
            let norm = design.column(j).norm();
            if norm > 0.0 { norm } else { 1.0 }
        })
        .collect();
    let mut scaled = design.clone();
    for (j, scale) in scales.iter().enumerate() {
        scaled.column_mut(j).scale_mut(1.0 / scale);
    }
    let svd = scaled.svd(true, true);
    let largest = svd.singular_values.max();
    let rank = svd.rank(largest * RANK_TOLERANCE);
    if rank < p {
        return Err(Undetermined::Singular {
            rank,
            terms: p,
            which: terms.join(", "),
        });
    }
    let observations = DVector::from_column_slice(y);
    let solution = svd
        .solve(&observations, largest * RANK_TOLERANCE)
        .expect("the SVD was computed with U and V");
    let coefficients: Vec<f64> = solution
        .iter()
        .zip(&scales)
        .map(|(b, scale)| b / scale)
        .collect();
    let fitted = &design * DVector::from_column_slice(&coefficients);
    let ss_res: f64 = (observations.clone() - fitted).norm_squared();
    let mean = observations.mean();
    let ss_tot: f64 = observations.iter().map(|v| (v - mean).powi(2)).sum();
    let r2 = if ss_tot > 0.0 {
        Some(1.0 - ss_res / ss_tot)
    } else {
        None
    };
    Ok(Fit {
        terms: terms.iter().map(|t| (*t).to_owned()).collect(),
        coefficients,
        r2,
        n,
        rmse: (ss_res / n as f64).sqrt(),
    })
}

/// The terms of eq. 1 (reads): t = A·x + B.
pub const EQ1_TERMS: [&str; 2] = ["data_in_per_cmd", "intercept"];

/// The terms of eq. 2 (writes), before any are dropped.
pub const EQ2_TERMS: [&str; 6] = [
    "r2t_per_cmd",
    "data_out_per_cmd",
    "immediate_mib_per_cmd",
    "unsolicited_mib_per_cmd",
    "solicited_mib_per_cmd",
    "intercept",
];

/// Whether a row measured reads (eq. 1 describes these).
pub fn is_read(row: &Row) -> bool {
    !row.is_write()
}

/// Eq. 1's design row: Data-Ins per command, 1.
pub fn eq1_terms(row: &Row) -> [f64; 2] {
    [row.data_in_per_cmd, 1.0]
}

/// Eq. 2's design row: x1..x5 (MiB for the data terms) and 1.
pub fn eq2_terms(row: &Row) -> [f64; 6] {
    [
        row.r2t_per_cmd,
        row.data_out_per_cmd,
        row.immediate_bytes / MIB,
        row.unsolicited_bytes / MIB,
        row.solicited_bytes / MIB,
        1.0,
    ]
}

/// Fits eq. 1, t (ms per MiB) = A·(Data-Ins per command) + B, to the read
/// rows.
pub fn fit_eq1(rows: &[Row]) -> Result<Fit, Undetermined> {
    let reads: Vec<&Row> = rows.iter().filter(|row| is_read(row)).collect();
    if reads.is_empty() {
        return Err(Undetermined::NoRows("read"));
    }
    let x: Vec<Vec<f64>> = reads.iter().map(|row| eq1_terms(row).to_vec()).collect();
    let y: Vec<f64> = reads.iter().map(|row| row.ms_per_mb).collect();
    least_squares(&EQ1_TERMS, &x, &y)
}

/// Eq. 2 fitted, with the terms it kept and why others went.
#[derive(Clone, Debug, PartialEq)]
pub struct Eq2Fit {
    /// The fit over the kept terms.
    pub fit: Fit,
    /// Indexes into [`EQ2_TERMS`] of the kept terms.
    pub kept: Vec<usize>,
    /// What was dropped and why.
    pub notes: Vec<String>,
}

impl Eq2Fit {
    /// The fitted time per MiB for a row.
    pub fn predict(&self, row: &Row) -> f64 {
        let all = eq2_terms(row);
        let x: Vec<f64> = self.kept.iter().map(|&i| all[i]).collect();
        self.fit.predict(&x)
    }
}

/// Fits eq. 2, t = A·x1 + B·x2 + C·x3 + D·x4 + E·x5 + F, to the write rows.
///
/// Terms that are zero in every row (no immediate data in the sweep, say)
/// are dropped: such data say nothing about them. The intercept F goes
/// when it is collinear with the others, as it is whenever every command
/// has one size (x3 + x4 + x5 is then the constant command size); the
/// seed's own fit has F = 0. What remains must be determined, or the model
/// is skipped.
pub fn fit_eq2(rows: &[Row]) -> Result<Eq2Fit, Undetermined> {
    let writes: Vec<&Row> = rows.iter().filter(|row| row.is_write()).collect();
    if writes.is_empty() {
        return Err(Undetermined::NoRows("write"));
    }
    let all: Vec<[f64; 6]> = writes.iter().map(|row| eq2_terms(row)).collect();
    let y: Vec<f64> = writes.iter().map(|row| row.ms_per_mb).collect();
    let mut notes = Vec::new();
    let mut kept: Vec<usize> = (0..6)
        .filter(|&j| {
            let present = all.iter().any(|x| x[j] != 0.0);
            if !present {
                notes.push(format!("{} dropped: zero in every row", EQ2_TERMS[j]));
            }
            present
        })
        .collect();
    if kept == [5] {
        return Err(Undetermined::NoTerms);
    }
    let attempt = |kept: &[usize]| {
        let names: Vec<&str> = kept.iter().map(|&j| EQ2_TERMS[j]).collect();
        let x: Vec<Vec<f64>> = all
            .iter()
            .map(|row| kept.iter().map(|&j| row[j]).collect())
            .collect();
        least_squares(&names, &x, &y)
    };
    match attempt(&kept) {
        Ok(fit) => Ok(Eq2Fit { fit, kept, notes }),
        Err(with_intercept) => {
            kept.retain(|&j| j != 5);
            match attempt(&kept) {
                Ok(fit) => {
                    notes.push(
                        "intercept dropped: collinear with the other terms (as when every \
                         command has one size); the seed's F = 0"
                            .to_owned(),
                    );
                    Ok(Eq2Fit { fit, kept, notes })
                }
                Err(Undetermined::TooFewRows { .. }) => Err(with_intercept),
                Err(error) => Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::tests::row;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs().max(1.0)
    }

    #[test]
    fn exact_data_give_the_coefficients_and_r2_of_one() {
        // y = 2·a - 3·b + 5 at points that determine it.
        let x: Vec<Vec<f64>> = [(0.0, 1.0), (1.0, 0.0), (2.0, 5.0), (7.0, 3.0), (4.0, 4.0)]
            .iter()
            .map(|&(a, b)| vec![a, b, 1.0])
            .collect();
        let y: Vec<f64> = x.iter().map(|r| 2.0 * r[0] - 3.0 * r[1] + 5.0).collect();
        let fit = least_squares(&["a", "b", "one"], &x, &y).unwrap();
        for (got, want) in fit.coefficients.iter().zip([2.0, -3.0, 5.0]) {
            assert!(close(*got, want, 1e-9), "{:?}", fit.coefficients);
        }
        assert!(close(fit.r2.unwrap(), 1.0, 1e-12));
        assert!(fit.rmse < 1e-9);
        assert_eq!(fit.n, 5);
    }

    #[test]
    fn noisy_data_give_the_textbook_r2() {
        // x = 1..5, y = 2, 4, 5, 4, 5: the classic example with slope 0.6,
        // intercept 2.2, SS_res = 2.4, SS_tot = 6, so R² = 0.6.
        let x: Vec<Vec<f64>> = (1..=5).map(|v| vec![f64::from(v), 1.0]).collect();
        let y = [2.0, 4.0, 5.0, 4.0, 5.0];
        let fit = least_squares(&["x", "one"], &x, &y).unwrap();
        assert!(close(fit.coefficients[0], 0.6, 1e-12));
        assert!(close(fit.coefficients[1], 2.2, 1e-12));
        assert!(close(fit.r2.unwrap(), 0.6, 1e-12));
    }

    #[test]
    fn singular_and_underdetermined_designs_are_refused() {
        // b = 2·a in every row.
        let x: Vec<Vec<f64>> = (0..6)
            .map(|v| vec![f64::from(v), 2.0 * f64::from(v), 1.0])
            .collect();
        let y: Vec<f64> = (0..6).map(f64::from).collect();
        let error = least_squares(&["a", "b", "one"], &x, &y).unwrap_err();
        assert!(
            matches!(error, Undetermined::Singular { rank: 2, .. }),
            "{error}"
        );
        // A constant term beside an intercept.
        let x: Vec<Vec<f64>> = (0..4).map(|v| vec![f64::from(v), 3.0, 1.0]).collect();
        let y = [1.0, 2.0, 3.0, 4.0];
        assert!(matches!(
            least_squares(&["a", "c", "one"], &x, &y),
            Err(Undetermined::Singular { rank: 2, .. })
        ));
        // Repeats of one point cannot fix a line.
        let x = vec![vec![8.0, 1.0]; 3];
        assert_eq!(
            least_squares(&["x", "one"], &x, &[1.0, 1.1, 0.9]),
            Err(Undetermined::TooFewRows {
                distinct: 1,
                terms: 2
            })
        );
    }

    #[test]
    fn eq1_recovers_the_seeds_coefficients() {
        // The seed's A and B, with Data-Ins per command from MRDSL 512 B to
        // 128 KiB for 1 MiB commands.
        let (a, b) = (0.014169577, 15.24598802);
        let rows: Vec<Row> = [2048.0, 1024.0, 512.0, 128.0, 64.0, 8.0]
            .iter()
            .map(|&x| {
                let mut r = row(&[], "read", 1000.0 / (a * x + b));
                r.data_in_per_cmd = x;
                r
            })
            .chain([row(&[], "write", 1.0)])
            .collect();
        let fit = fit_eq1(&rows).unwrap();
        assert!(close(fit.coefficients[0], a, 1e-9));
        assert!(close(fit.coefficients[1], b, 1e-9));
        assert_eq!(fit.n, 6, "the write row is not used");
        assert_eq!(fit_eq1(&[]), Err(Undetermined::NoRows("read")));
    }

    /// A write row of `bs` bytes: `immediate`, `unsolicited` bytes, the rest
    /// solicited in bursts of `burst` bytes, PDUs of `mrdsl` bytes.
    fn write_row(bs: f64, immediate: f64, unsolicited: f64, burst: f64, mrdsl: f64) -> Row {
        let mut r = row(&[], "write", 1.0);
        let solicited = bs - immediate - unsolicited;
        r.bs = bs as u64;
        r.immediate_bytes = immediate;
        r.unsolicited_bytes = unsolicited;
        r.solicited_bytes = solicited;
        r.r2t_per_cmd = (solicited / burst).ceil();
        r.data_out_per_cmd = (unsolicited / mrdsl).ceil() + (solicited / mrdsl).ceil();
        r.data_in_per_cmd = 0.0;
        r
    }

    #[test]
    fn eq2_recovers_the_seeds_coefficients_and_drops_the_intercept() {
        let (a, b, c, d, e) = (1.82, 0.011, 115.29, 120.79, 87.72);
        let mib = MIB;
        let mut rows = Vec::new();
        for mrdsl in [1024.0, 8192.0, 65536.0] {
            for burst in [16384.0, 65536.0, 262144.0] {
                for (immediate, unsolicited) in [(0.0, 0.0), (8192.0, 0.0), (8192.0, 57344.0)] {
                    let mut r = write_row(mib, immediate, unsolicited, burst, mrdsl);
                    let t = a * r.r2t_per_cmd
                        + b * r.data_out_per_cmd
                        + c * r.immediate_bytes / mib
                        + d * r.unsolicited_bytes / mib
                        + e * r.solicited_bytes / mib;
                    r.ms_per_mb = t;
                    r.mib_per_s = 1000.0 / t;
                    rows.push(r);
                }
            }
        }
        let eq2 = fit_eq2(&rows).unwrap();
        assert_eq!(eq2.kept, vec![0, 1, 2, 3, 4]);
        assert!(eq2.notes.iter().any(|n| n.contains("intercept dropped")));
        for (got, want) in eq2.fit.coefficients.iter().zip([a, b, c, d, e]) {
            assert!(close(*got, want, 1e-6), "{:?}", eq2.fit.coefficients);
        }
        assert!(close(eq2.fit.r2.unwrap(), 1.0, 1e-9));
        assert!(close(eq2.predict(&rows[4]), rows[4].ms_per_mb, 1e-9));
    }

    #[test]
    fn eq2_drops_absent_terms_and_skips_what_is_left_undetermined() {
        // Only solicited data, one size: x1, x2, x5 constant per MRDSL, no
        // immediate or unsolicited data. With one burst length, R2Ts and
        // solicited MiB never change as MRDSL does: singular.
        let rows: Vec<Row> = [1024.0, 2048.0, 4096.0, 8192.0]
            .iter()
            .flat_map(|&mrdsl| {
                let r = write_row(65536.0, 0.0, 0.0, 8192.0, mrdsl);
                [r.clone(), r]
            })
            .collect();
        let error = fit_eq2(&rows).unwrap_err();
        assert!(matches!(error, Undetermined::Singular { .. }), "{error}");
        assert_eq!(
            fit_eq2(&[row(&[], "write", 1.0), row(&[], "write", 2.0)]),
            Err(Undetermined::NoTerms)
        );
        assert!(matches!(
            fit_eq2(&[row(&[], "read", 1.0)]),
            Err(Undetermined::NoRows("write"))
        ));
    }
}
