//! The PNGs of a sweep: throughput against each dimension that varies (one
//! line per combination of the others, every repeat drawn as a dot), the
//! fitted models against what was observed (the seed's Figures 4, 5 and 9),
//! and the eq. 3 table as a heat map (the seed's Table 1).
//!
//! Text needs a font: plotters' `ab_glyph` backend draws only fonts
//! registered from bytes, so [`load_font`] reads a TrueType file from the
//! system (DejaVu Sans, Debian package `fonts-dejavu-core`, or Liberation
//! Sans), or from `$ISCSI_PLOT_FONT`. This avoids fontconfig and freetype
//! at build time; without a font the plots are not drawn, and the caller
//! says so (the CSV and models do not depend on them).

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::colors::colormaps::ViridisRGB;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::eq3::Eq3Search;
use crate::fit::{Eq2Fit, Fit, eq2_terms, is_read};
use crate::rows::Results;
use crate::{Analysis, Dimension, dimensions};

/// The family name the font is registered under.
const FAMILY: &str = "sans-serif";

/// Where a font is looked for, in order (Debian, Fedora, Arch layouts).
const FONT_PATHS: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Why plots were not drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No usable font.
    #[error(
        "no font for the plots: install fonts-dejavu-core (Debian) or set ISCSI_PLOT_FONT to a .ttf file"
    )]
    NoFont,
    /// plotters failed to draw or write a file.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The PNG.
        path: PathBuf,
        /// plotters' error.
        message: String,
    },
}

/// Registers a system font with plotters, once per process.
pub fn load_font() -> Result<(), PlotError> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let loaded = *LOADED.get_or_init(|| {
        let candidates = std::env::var("ISCSI_PLOT_FONT")
            .ok()
            .into_iter()
            .chain(FONT_PATHS.iter().map(|p| (*p).to_owned()));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                // plotters keeps the font for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    });
    if loaded {
        Ok(())
    } else {
        Err(PlotError::NoFont)
    }
}

type DrawResult = Result<(), Box<dyn Error>>;

fn finish(path: &Path, result: DrawResult) -> Result<PathBuf, PlotError> {
    result.map_err(|error| PlotError::Draw {
        path: path.to_owned(),
        message: error.to_string(),
    })?;
    Ok(path.to_owned())
}

/// Draws every plot the analysis allows into `dir`; returns their paths.
pub fn write_plots(
    results: &Results,
    analysis: &Analysis,
    dir: &Path,
) -> Result<Vec<PathBuf>, PlotError> {
    load_font()?;
    let mut written = Vec::new();
    let dims = dimensions(results);
    for (index, dim) in dims.iter().enumerate() {
        let name = dim.name.replace(',', "+");
        let path = dir.join(format!("throughput_vs_{name}.png"));
        let others: Vec<&Dimension> = dims
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != index)
            .map(|(_, d)| d)
            .collect();
        written.push(finish(&path, throughput(results, dim, &others, &path))?);
    }
    if let Some(fit) = &analysis.eq1 {
        let path = dir.join("eq1_time_per_mib.png");
        written.push(finish(&path, eq1(results, fit, &path))?);
    }
    if let Some(fit) = &analysis.eq2 {
        let path = dir.join("eq2_time_per_mib.png");
        written.push(finish(&path, eq2(results, fit, &path))?);
    }
    for (index, search) in analysis.eq3.iter().enumerate() {
        let path = if analysis.eq3.len() == 1 {
            dir.join("eq3_heatmap.png")
        } else {
            dir.join(format!("eq3_heatmap_{index}.png"))
        };
        written.push(finish(&path, heatmap(search, &path))?);
    }
    Ok(written)
}

/// Sizes as people write them (8K, 1M) for length-like dimensions.
fn label(dim_name: &str, value: &str) -> String {
    let sized = dim_name == "bs" || dim_name.contains("Length");
    match value.parse::<u64>() {
        Ok(bytes) if sized => human_bytes(bytes),
        _ => value.to_owned(),
    }
}

/// A linked dimension's name for a legend: its first key and how many
/// more move with it.
fn short(name: &str) -> String {
    let mut keys = name.split(',');
    let first = keys.next().unwrap_or_default();
    match keys.count() {
        0 => first.to_owned(),
        more => format!("{first}(+{more})"),
    }
}

fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

fn upper(values: impl Iterator<Item = f64>) -> f64 {
    let max = values.fold(0.0, f64::max);
    if max > 0.0 { max * 1.1 } else { 1.0 }
}

/// Throughput against one dimension, a line per combination of the others.
fn throughput(
    results: &Results,
    dim: &Dimension,
    others: &[&Dimension],
    path: &Path,
) -> DrawResult {
    let mut series: Vec<(String, Vec<Vec<f64>>)> = Vec::new();
    for row in &results.rows {
        let name = others
            .iter()
            .map(|o| format!("{}={}", short(&o.name), label(&o.name, &o.value(row))))
            .collect::<Vec<_>>()
            .join(" ");
        let at = dim
            .values
            .iter()
            .position(|v| *v == dim.value(row))
            .expect("every row's value is among the dimension's");
        let index = match series.iter().position(|(n, _)| *n == name) {
            Some(index) => index,
            None => {
                series.push((name, vec![Vec::new(); dim.values.len()]));
                series.len() - 1
            }
        };
        series[index].1[at].push(row.mib_per_s);
    }
    // Headroom above the highest point for the legend, a line per series.
    let headroom = 1.0 + 0.05 * series.len().min(12) as f64;
    let top = upper(results.rows.iter().map(|r| r.mib_per_s)) * headroom;
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let count = dim.values.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("Throughput by {}", dim.name), (FAMILY, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((0..count - 1).into_segmented(), 0.0..top)?;
    let values = dim.values.clone();
    let name = dim.name.clone();
    chart
        .configure_mesh()
        .x_desc(dim.name.as_str())
        .y_desc("MiB/s")
        .x_labels(values.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => values
                .get(*i as usize)
                .map(|v| label(&name, v))
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    for (index, (name, cells)) in series.iter().enumerate() {
        let colour = Palette99::pick(index).to_rgba();
        let means: Vec<(SegmentValue<i32>, f64)> = cells
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
            .map(|(i, v)| {
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                (SegmentValue::CenterOf(i as i32), mean)
            })
            .collect();
        let label = if name.is_empty() {
            "all rows"
        } else {
            name.as_str()
        };
        chart
            .draw_series(LineSeries::new(means, colour.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart.draw_series(cells.iter().enumerate().flat_map(|(i, v)| {
            v.iter().map(move |&y| {
                Circle::new((SegmentValue::CenterOf(i as i32), y), 3, colour.filled())
            })
        }))?;
    }
    if series.len() > 1 || !series[0].0.is_empty() {
        chart
            .configure_series_labels()
            .label_font((FAMILY, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Eq. 1: observed time per MiB against Data-Ins per command, and the line.
fn eq1(results: &Results, fit: &Fit, path: &Path) -> DrawResult {
    let points: Vec<(f64, f64)> = results
        .rows
        .iter()
        .filter(|r| is_read(r))
        .map(|r| (r.data_in_per_cmd, r.ms_per_mb))
        .collect();
    let right = upper(points.iter().map(|p| p.0));
    let top = upper(
        points
            .iter()
            .map(|p| p.1)
            .chain([fit.predict(&[right, 1.0])]),
    );
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "eq. 1: t = {:.4} x + {:.3}   (R² {}, n {})",
        fit.coefficients[0],
        fit.coefficients[1],
        fit.r2.map_or("-".to_owned(), |r| format!("{r:.4}")),
        fit.n
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, (FAMILY, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..right, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("x = Data-In PDUs per command")
        .y_desc("t = ms per MiB")
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))?
        .label("observed")
        .legend(|(x, y)| Circle::new((x + 10, y), 4, BLUE.filled()));
    let line: Vec<(f64, f64)> = [0.0, right]
        .iter()
        .map(|&x| (x, fit.predict(&[x, 1.0])))
        .collect();
    chart
        .draw_series(LineSeries::new(line, RED.stroke_width(2)))?
        .label("calculated")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Eq. 2: observed and calculated time per MiB against each term (the
/// seed's Figure 9), and observed against calculated.
fn eq2(results: &Results, fit: &Eq2Fit, path: &Path) -> DrawResult {
    let writes: Vec<_> = results.rows.iter().filter(|r| r.is_write()).collect();
    let root = BitMapBackend::new(path, (1500, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    // The seed's letters for the coefficients: A for x1 ... E for x5, F.
    let coefficients = fit
        .kept
        .iter()
        .zip(&fit.fit.coefficients)
        .map(|(&term, c)| format!("{}={c:.4}", ["A", "B", "C", "D", "E", "F"][term]))
        .collect::<Vec<_>>()
        .join("  ");
    title.titled(
        &format!(
            "eq. 2: t = A·x1 + B·x2 + C·x3 + D·x4 + E·x5{}:  {coefficients}   (R² {}, n {})",
            if fit.kept.contains(&5) { " + F" } else { "" },
            fit.fit.r2.map_or("-".to_owned(), |r| format!("{r:.4}")),
            fit.fit.n
        ),
        (FAMILY, 18),
    )?;
    let panels = body.split_evenly((2, 3));
    let observed_top = upper(writes.iter().flat_map(|r| [r.ms_per_mb, fit.predict(r)]));
    let x_names = [
        "x1 = R2Ts per command",
        "x2 = Data-Outs per command",
        "x3 = immediate MiB per command",
        "x4 = unsolicited MiB per command",
        "x5 = solicited MiB per command",
    ];
    for (term, panel) in panels.iter().take(5).enumerate() {
        let xs: Vec<f64> = writes.iter().map(|r| eq2_terms(r)[term]).collect();
        let right = upper(xs.iter().copied());
        let caption = if fit.kept.contains(&term) {
            x_names[term].to_owned()
        } else {
            format!("{} (not in the fit)", x_names[term])
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, (FAMILY, 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..right, 0.0..observed_top)?;
        chart
            .configure_mesh()
            .y_desc("ms per MiB")
            .label_style((FAMILY, 12))
            .axis_desc_style((FAMILY, 13))
            .draw()?;
        chart.draw_series(
            writes
                .iter()
                .zip(&xs)
                .map(|(r, &x)| Circle::new((x, r.ms_per_mb), 4, BLUE.filled())),
        )?;
        chart.draw_series(
            writes
                .iter()
                .zip(&xs)
                .map(|(r, &x)| Cross::new((x, fit.predict(r)), 4, RED.stroke_width(2))),
        )?;
    }
    let mut chart = ChartBuilder::on(&panels[5])
        .caption("observed (blue) against calculated (red)", (FAMILY, 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..observed_top, 0.0..observed_top)?;
    chart
        .configure_mesh()
        .x_desc("calculated ms per MiB")
        .y_desc("observed ms per MiB")
        .label_style((FAMILY, 12))
        .axis_desc_style((FAMILY, 13))
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(0.0, 0.0), (observed_top, observed_top)],
        BLACK.mix(0.4),
    ))?;
    chart.draw_series(
        writes
            .iter()
            .map(|r| Circle::new((fit.predict(r), r.ms_per_mb), 4, BLUE.filled())),
    )?;
    root.present()?;
    Ok(())
}

/// Eq. 3's table: m (the Data-Out size) by MaxOutstandingR2T, colour = mean MiB/s, the
/// chosen n outlined.
fn heatmap(search: &Eq3Search, path: &Path) -> DrawResult {
    let table = &search.table;
    let (columns, rows) = (table.n.len() as i32, table.mrdsl.len() as i32);
    let values = table.mib_per_s.iter().flatten().flatten().copied();
    let (low, high) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let root = BitMapBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "eq. 3: write MiB/s by m (Data-Out size) and MaxOutstandingR2T; outlined: chosen n{}",
        search
            .constant
            .map_or(String::new(), |c| format!(" (n·m ≈ {c:.1} KiB)"))
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, (FAMILY, 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (0..columns - 1).into_segmented(),
            (0..rows - 1).into_segmented(),
        )?;
    let n_values = table.n.clone();
    let m_values = table.mrdsl.clone();
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("MaxOutstandingR2T")
        .y_desc("m: Data-Out size")
        .x_labels(n_values.len())
        .y_labels(m_values.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => n_values
                .get(*i as usize)
                .map(u64::to_string)
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => m_values
                .get(*i as usize)
                .map(|m| human_bytes(*m))
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    let edge = |i: i32, count: i32| {
        if i >= count {
            SegmentValue::Last
        } else {
            SegmentValue::Exact(i)
        }
    };
    for (i, line) in table.mib_per_s.iter().enumerate() {
        for (j, value) in line.iter().enumerate() {
            let (x, y) = (j as i32, i as i32);
            let corners = [
                (edge(x, columns), edge(y, rows)),
                (edge(x + 1, columns), edge(y + 1, rows)),
            ];
            let (fill, text) = match value {
                Some(v) => {
                    let share = if high > low {
                        (v - low) / (high - low)
                    } else {
                        1.0
                    };
                    (
                        ViridisRGB::get_color(share as f32).to_rgba(),
                        format!("{v:.1}"),
                    )
                }
                None => (RGBAColor(230, 230, 230, 1.0), "-".to_owned()),
            };
            chart.draw_series([Rectangle::new(corners.clone(), fill.filled())])?;
            let ink = match value {
                Some(v) if high > low && (v - low) / (high - low) > 0.6 => BLACK,
                _ => WHITE,
            };
            let ink = if value.is_none() { BLACK } else { ink };
            chart.draw_series([Text::new(
                text,
                (SegmentValue::CenterOf(x), SegmentValue::CenterOf(y)),
                (FAMILY, 15)
                    .into_font()
                    .color(&ink)
                    .pos(Pos::new(HPos::Center, VPos::Center)),
            )])?;
        }
    }
    for choice in &search.choices {
        let (Some(i), Some(j)) = (
            table.mrdsl.iter().position(|&m| m == choice.mrdsl),
            table.n.iter().position(|&n| n == choice.n),
        ) else {
            continue;
        };
        let (x, y) = (j as i32, i as i32);
        chart.draw_series([Rectangle::new(
            [
                (edge(x, columns), edge(y, rows)),
                (edge(x + 1, columns), edge(y + 1, rows)),
            ],
            RED.stroke_width(4),
        )])?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eq3::tests::seed_table_1;
    use crate::eq3::{DEFAULT_TOLERANCE, constant, search};

    fn out_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("iscsi-analysis-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A PNG file that decodes to the size drawn and is not one colour.
    fn assert_picture(path: &Path, width: u32, height: u32) {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
        let width_at = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let height_at = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
        assert_eq!((width_at, height_at), (width, height));
        assert!(bytes.len() > 5000, "{} is nearly empty", path.display());
    }

    #[test]
    fn the_seeds_table_1_draws_as_a_heat_map() {
        load_font().expect("fonts-dejavu-core is installed by scripts/test");
        let table = seed_table_1();
        let choices = search(&table, DEFAULT_TOLERANCE);
        let eq3 = Eq3Search {
            group: "seed".into(),
            constant: constant(&choices),
            rows: 74,
            table,
            choices,
        };
        let path = out_dir("heatmap").join("eq3.png");
        finish(&path, heatmap(&eq3, &path)).unwrap();
        assert_picture(&path, 1000, 700);
    }

    #[test]
    fn sizes_print_as_people_write_them() {
        assert_eq!(label("MaxBurstLength", "65536"), "64K");
        assert_eq!(label("bs", "1048576"), "1M");
        assert_eq!(label("bs", "1000"), "1000");
        assert_eq!(label("MaxOutstandingR2T", "1024"), "1024");
        assert_eq!(
            short("MaxRecvDataSegmentLength,MaxBurstLength"),
            "MaxRecvDataSegmentLength(+1)"
        );
        assert_eq!(short("qd"), "qd");
    }
}
