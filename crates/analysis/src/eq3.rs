//! The seed paper's eq. 3 (§6.3, Table 1): for each MaxRecvDataSegmentLength
//! m (KiB), the number n of outstanding R2Ts needed for full write
//! throughput, which the paper found to follow n·m = 64.
//!
//! "Needed" is made precise here as: the smallest MaxOutstandingR2T whose
//! mean throughput is within a tolerance (5 % by default) of the best
//! throughput measured at that m. A choice at the smallest or largest n
//! tried is censored (the true n may lie beyond what was tried, e.g. at
//! m = 128 KiB, n = 64/m would be ½), so the constant n·m is estimated as
//! the geometric mean of n·m over the uncensored choices only.

use std::collections::BTreeMap;

use crate::rows::Results;

/// The key whose values are m (bytes in the CSV) when the sweep names it.
pub const MRDSL: &str = "MaxRecvDataSegmentLength";
/// The initiator's cap on the data segments it sends. The seed's m for
/// writes is the *target's* MaxRecvDataSegmentLength, the size of every
/// Data-Out; seen from the initiator that is this cap (RFC 7143 13.12 lets
/// a sender send less than the receiver declares), so a sweep that varies
/// it varies the seed's m against any target. Preferred over [`MRDSL`]
/// when both are swept: the initiator's own MRDSL bounds only Data-In.
pub const MAX_XMIT: &str = "MaxXmitDataSegmentLength";
/// The keys that give m, in order of preference.
pub const M_KEYS: [&str; 2] = [MAX_XMIT, MRDSL];
/// The key whose values are n.
pub const MAX_OUTSTANDING_R2T: &str = "MaxOutstandingR2T";
/// How far below the best throughput a choice may be.
pub const DEFAULT_TOLERANCE: f64 = 0.05;

/// Mean throughput by MRDSL (rows) and MaxOutstandingR2T (columns).
#[derive(Clone, Debug, PartialEq)]
pub struct R2tTable {
    /// MaxRecvDataSegmentLength values in bytes, ascending.
    pub mrdsl: Vec<u64>,
    /// MaxOutstandingR2T values, ascending.
    pub n: Vec<u64>,
    /// `mib_per_s[i][j]`: mean MiB/s at `mrdsl[i]`, `n[j]`, if measured.
    pub mib_per_s: Vec<Vec<Option<f64>>>,
}

/// The n chosen for one m.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Choice {
    /// m in bytes.
    pub mrdsl: u64,
    /// m in KiB, the paper's unit.
    pub mrdsl_kb: f64,
    /// The chosen MaxOutstandingR2T.
    pub n: u64,
    /// n·m with m in KiB (the paper's 64).
    pub n_times_m: f64,
    /// The best mean throughput at this m.
    pub best_mib_per_s: f64,
    /// The mean throughput at the chosen n.
    pub chosen_mib_per_s: f64,
    /// Whether n is the smallest or largest tried at this m, so that the
    /// true n may lie beyond the sweep.
    pub censored: bool,
}

/// For each m, the smallest n within `tolerance` of that m's best.
pub fn search(table: &R2tTable, tolerance: f64) -> Vec<Choice> {
    let mut choices = Vec::new();
    for (i, &mrdsl) in table.mrdsl.iter().enumerate() {
        let measured: Vec<(u64, f64)> = table
            .n
            .iter()
            .zip(&table.mib_per_s[i])
            .filter_map(|(&n, value)| value.map(|v| (n, v)))
            .collect();
        let Some(best) = measured.iter().map(|&(_, v)| v).reduce(f64::max) else {
            continue;
        };
        let (n, chosen) = *measured
            .iter()
            .find(|&&(_, v)| v >= (1.0 - tolerance) * best)
            .expect("the best itself qualifies");
        let smallest = measured.first().map(|&(n, _)| n);
        let largest = measured.last().map(|&(n, _)| n);
        let mrdsl_kb = mrdsl as f64 / 1024.0;
        choices.push(Choice {
            mrdsl,
            mrdsl_kb,
            n,
            n_times_m: n as f64 * mrdsl_kb,
            best_mib_per_s: best,
            chosen_mib_per_s: chosen,
            censored: measured.len() < 2 || Some(n) == smallest || Some(n) == largest,
        });
    }
    choices
}

/// The constant c of n·m = c: the geometric mean of n·m over the
/// uncensored choices, or `None` if every choice is censored.
pub fn constant(choices: &[Choice]) -> Option<f64> {
    let logs: Vec<f64> = choices
        .iter()
        .filter(|choice| !choice.censored)
        .map(|choice| choice.n_times_m.ln())
        .collect();
    if logs.is_empty() {
        return None;
    }
    Some((logs.iter().sum::<f64>() / logs.len() as f64).exp())
}

/// One eq. 3 search: the rows that share everything but m and n.
#[derive(Clone, Debug, PartialEq)]
pub struct Eq3Search {
    /// What the rows share (rw, bs, qd, other keys), as `name=value` pairs.
    pub group: String,
    /// Mean throughput by m and n.
    pub table: R2tTable,
    /// The chosen n per m.
    pub choices: Vec<Choice>,
    /// The constant of n·m = c, if any choice is uncensored.
    pub constant: Option<f64>,
    /// Rows used.
    pub rows: usize,
}

/// Why eq. 3 cannot be searched in these results.
pub fn eq3_searches(results: &Results, tolerance: f64) -> Result<Vec<Eq3Search>, String> {
    let position = |name: &str| results.key_names.iter().position(|key| key == name);
    let m_at = M_KEYS.iter().find_map(|&key| position(key));
    let (Some(m_at), Some(n_at)) = (m_at, position(MAX_OUTSTANDING_R2T)) else {
        return Err(format!(
            "{MAX_XMIT} (or {MRDSL}) and {MAX_OUTSTANDING_R2T} are not both swept"
        ));
    };
    let writes: Vec<_> = results.rows.iter().filter(|row| row.is_write()).collect();
    if writes.is_empty() {
        return Err("no write rows".to_owned());
    }
    // Columns that move with m or n in every row (the seed keeps the burst
    // lengths equal to MRDSL) belong to those dimensions, not to the group.
    let linked = |column: usize| {
        writes
            .iter()
            .all(|row| row.keys[column] == row.keys[m_at] || row.keys[column] == row.keys[n_at])
    };
    let group_columns: Vec<usize> = (0..results.key_names.len())
        .filter(|&c| c != m_at && c != n_at && !linked(c))
        .collect();
    // group -> (m, n) -> throughputs
    type Cells = BTreeMap<(u64, u64), Vec<f64>>;
    let mut groups: BTreeMap<String, Cells> = BTreeMap::new();
    for row in &writes {
        let parse = |column: usize| {
            row.keys[column].parse::<u64>().map_err(|_| {
                format!(
                    "{} value {:?} is not a number",
                    results.key_names[column], row.keys[column]
                )
            })
        };
        let (m, n) = (parse(m_at)?, parse(n_at)?);
        let mut group = format!("rw={} bs={} qd={}", row.rw, row.bs, row.qd);
        for &c in &group_columns {
            group.push_str(&format!(" {}={}", results.key_names[c], row.keys[c]));
        }
        groups
            .entry(group)
            .or_default()
            .entry((m, n))
            .or_default()
            .push(row.mib_per_s);
    }
    let mut searches = Vec::new();
    for (group, cells) in groups {
        let mut mrdsl: Vec<u64> = cells.keys().map(|&(m, _)| m).collect();
        mrdsl.dedup();
        let mut n: Vec<u64> = cells.keys().map(|&(_, n)| n).collect();
        n.sort_unstable();
        n.dedup();
        if n.len() < 2 {
            return Err(format!("{MAX_OUTSTANDING_R2T} takes one value ({group})"));
        }
        let mib_per_s = mrdsl
            .iter()
            .map(|&m| {
                n.iter()
                    .map(|&n| {
                        cells
                            .get(&(m, n))
                            .map(|values| values.iter().sum::<f64>() / values.len() as f64)
                    })
                    .collect()
            })
            .collect();
        let table = R2tTable {
            mrdsl,
            n,
            mib_per_s,
        };
        let choices = search(&table, tolerance);
        searches.push(Eq3Search {
            group,
            constant: constant(&choices),
            rows: cells.values().map(Vec::len).sum(),
            table,
            choices,
        });
    }
    Ok(searches)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The seed's Table 1: MiB/s... (the paper's MB/s) by m in KB (rows)
    /// and MaxOutstandingR2T 1..256 (columns); m = 64 KB was measured at
    /// n = 1 and 2 only.
    pub fn seed_table_1() -> R2tTable {
        let rows: [(f64, &[f64]); 9] = [
            (
                0.5,
                &[
                    1.6704, 4.584, 8.1593, 12.0708, 20.1188, 28.8984, 38.6971, 42.983, 43.9762,
                ],
            ),
            (
                1.0,
                &[
                    3.6478, 7.8801, 14.3268, 23.925, 35.3707, 48.3184, 50.2325, 51.8072, 51.8749,
                ],
            ),
            (
                2.0,
                &[
                    7.655, 15.2414, 26.0099, 40.0818, 53.5416, 54.7762, 53.6337, 53.4511, 53.831,
                ],
            ),
            (
                4.0,
                &[
                    16.1368, 28.6268, 43.8112, 55.484, 57.3806, 57.4192, 57.6824, 56.2435, 56.975,
                ],
            ),
            (
                8.0,
                &[
                    29.9684, 48.6475, 58.4606, 59.3547, 59.5094, 58.2166, 58.3667, 58.9518, 58.1555,
                ],
            ),
            (
                16.0,
                &[
                    52.671, 59.292, 60.682, 60.852, 60.682, 60.746, 60.276, 60.746, 60.746,
                ],
            ),
            (
                32.0,
                &[
                    59.4938, 60.5457, 60.8546, 61.4921, 60.8346, 60.924, 61.4221, 60.131, 50.0875,
                ],
            ),
            (64.0, &[60.345, 61.321]),
            (
                128.0,
                &[
                    60.9504, 61.7321, 60.418, 60.481, 60.9442, 61.6494, 62.4659, 61.6528, 61.4988,
                ],
            ),
        ];
        R2tTable {
            mrdsl: rows.iter().map(|(m, _)| (m * 1024.0) as u64).collect(),
            n: (0..9).map(|i| 1u64 << i).collect(),
            mib_per_s: rows
                .iter()
                .map(|(_, values)| (0..9).map(|j| values.get(j).copied()).collect())
                .collect(),
        }
    }

    #[test]
    fn the_seeds_table_1_under_the_five_percent_rule() {
        let choices = search(&seed_table_1(), DEFAULT_TOLERANCE);
        let chosen: Vec<u64> = choices.iter().map(|c| c.n).collect();
        // By hand: at m = 2 KB the best is 54.78 (n = 32), and n = 16 gives
        // 53.54 > 0.95 · 54.78 = 52.04, while n = 8 gives 40.08.
        assert_eq!(chosen, [128, 64, 16, 8, 4, 2, 1, 1, 1]);
        let products: Vec<f64> = choices.iter().map(|c| c.n_times_m).collect();
        assert_eq!(
            products,
            [64.0, 64.0, 32.0, 32.0, 32.0, 32.0, 32.0, 64.0, 128.0]
        );
        let censored: Vec<bool> = choices.iter().map(|c| c.censored).collect();
        assert_eq!(
            censored,
            [false, false, false, false, false, false, true, true, true]
        );
        // The seed's highlighted n = 64/m holds to within a factor of two
        // wherever the choice is not at the edge of what was tried.
        for choice in choices.iter().filter(|c| !c.censored) {
            let seed_n = 64.0 / choice.mrdsl_kb;
            assert!(
                (seed_n / 2.0..=seed_n).contains(&(choice.n as f64)),
                "{choice:?}"
            );
        }
        // Geometric mean of 64, 64, 32, 32, 32, 32 = 2^(32/6).
        let c = constant(&choices).unwrap();
        assert!((c - 2f64.powf(32.0 / 6.0)).abs() < 1e-9, "{c}");
        assert_eq!(choices[0].best_mib_per_s, 43.9762);
        assert_eq!(choices[0].chosen_mib_per_s, 42.983);
    }

    #[test]
    fn a_tighter_tolerance_moves_the_choice_up_to_the_seeds_n() {
        // Within 1 %: at m = 2 KB n = 32, at m = 4 KB n = 16, as the paper
        // highlighted (n·m = 64).
        let choices = search(&seed_table_1(), 0.01);
        assert_eq!(choices[2].n, 32);
        assert_eq!(choices[3].n, 16);
        assert_eq!(constant(&[]), None);
    }
}
