//! The stacked bar chart of the table: one bar per row, each category's
//! share of the instructions per PDU (100% stacks, like the FAST '05
//! study's figures 11 and 15), the total above the bar.
//!
//! Text needs a font. plotters' default font path goes through fontconfig
//! (a system library and its headers), so the `ab_glyph` feature is used
//! instead with a TrueType file read at run time; without one (no DejaVu or
//! Liberation fonts installed) the bars are drawn without any text rather
//! than failing, and the caller is told.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::category::Category;
use super::table::{Row, size_label};

/// Fonts tried in order (Debian's fonts-dejavu-core, fonts-liberation).
const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers the first font found as "sans-serif"; whether there was one.
fn register_font() -> bool {
    for path in FONTS {
        if let Ok(bytes) = std::fs::read(path) {
            // The font must live as long as the process: plotters keeps it
            // in a global registry. One small leak per chart drawn.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

fn color(category: Category) -> RGBColor {
    match category {
        Category::Header => RGBColor(31, 119, 180),
        Category::Digest => RGBColor(214, 39, 40),
        Category::Copy => RGBColor(255, 127, 14),
        Category::Zero => RGBColor(255, 200, 120),
        Category::Syscall => RGBColor(148, 103, 189),
        Category::Scsi => RGBColor(44, 160, 44),
        Category::Backstore => RGBColor(140, 86, 75),
        Category::Other => RGBColor(160, 160, 160),
    }
}

/// Shares of each category in a row's instructions per PDU (negative
/// differences, which noise can give a tiny category, count as zero).
pub fn shares(row: &Row) -> [f64; 8] {
    let positive: f64 = row.per_pdu.iter().map(|v| v.max(0.0)).sum();
    let mut out = [0.0; 8];
    if positive > 0.0 {
        for (o, v) in out.iter_mut().zip(row.per_pdu) {
            *o = v.max(0.0) / positive;
        }
    }
    out
}

/// A count as a short label: 1234 -> "1.2k", 2_500_000 -> "2.5M".
pub fn short_count(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1}k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

/// Draws `rows` into a PNG at `path`; returns whether text was drawn.
pub fn draw(rows: &[Row], path: &Path, title: &str) -> anyhow::Result<bool> {
    let text = register_font();
    let (width, height) = (1500u32, 760u32);
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    let fail = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(fail)?;
    let (left, right, top, bottom) = (70i32, 190i32, 80i32, 110i32);
    let plot_w = width as i32 - left - right;
    let plot_h = height as i32 - top - bottom;
    let y_of = |share: f64| top + plot_h - (share * plot_h as f64).round() as i32;
    let grey = RGBColor(220, 220, 220);
    for step in 0..=4 {
        let y = y_of(step as f64 / 4.0);
        root.draw(&PathElement::new(vec![(left, y), (left + plot_w, y)], grey))
            .map_err(fail)?;
        if text {
            let label = format!("{}%", step * 25);
            root.draw(&Text::new(label, (left - 45, y - 7), ("sans-serif", 14)))
                .map_err(fail)?;
        }
    }
    let slot = plot_w as f64 / rows.len().max(1) as f64;
    let bar = (slot * 0.7).max(1.0) as i32;
    for (i, row) in rows.iter().enumerate() {
        let x = left + (slot * i as f64 + (slot - bar as f64) / 2.0) as i32;
        let mut base = 0.0;
        for (category, share) in Category::ALL.iter().zip(shares(row)) {
            let (y0, y1) = (y_of(base), y_of(base + share));
            if y0 != y1 {
                root.draw(&Rectangle::new(
                    [(x, y1), (x + bar, y0)],
                    color(*category).filled(),
                ))
                .map_err(fail)?;
            }
            base += share;
        }
        if text {
            let small = ("sans-serif", 12).into_font();
            let total = short_count(row.total_per_pdu);
            root.draw(&Text::new(total, (x, top - 16), small.clone()))
                .map_err(fail)?;
            let lines = [
                if row.side == "target" { "tgt" } else { "ini" }.to_owned(),
                row.rw.clone(),
                size_label(row.bs),
                if row.digests { "crc" } else { "none" }.to_owned(),
            ];
            for (n, line) in lines.into_iter().enumerate() {
                let y = top + plot_h + 6 + 15 * n as i32;
                root.draw(&Text::new(line, (x, y), small.clone()))
                    .map_err(fail)?;
            }
        }
    }
    if text {
        root.draw(&Text::new(title.to_owned(), (left, 12), ("sans-serif", 18)))
            .map_err(fail)?;
        root.draw(&Text::new(
            "instructions per PDU (callgrind) above each bar",
            (left, 36),
            ("sans-serif", 13),
        ))
        .map_err(fail)?;
    }
    for (n, category) in Category::ALL.iter().rev().enumerate() {
        let x = width as i32 - right + 20;
        let y = top + 10 + 28 * n as i32;
        root.draw(&Rectangle::new(
            [(x, y), (x + 18, y + 18)],
            color(*category).filled(),
        ))
        .map_err(fail)?;
        if text {
            root.draw(&Text::new(
                category.name(),
                (x + 26, y + 1),
                ("sans-serif", 15),
            ))
            .map_err(fail)?;
        }
    }
    root.present().map_err(fail)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(per_pdu: [f64; 8]) -> Row {
        Row {
            side: "initiator".into(),
            rw: "read".into(),
            bs: 8192,
            digests: true,
            pdus_per_command: 2.0,
            per_pdu,
            total_per_pdu: per_pdu.iter().sum(),
            total_per_command: 0.0,
            total_per_byte: 0.0,
            digest_per_byte: 0.0,
            copy_per_byte: 0.0,
            kernel: None,
        }
    }

    #[test]
    fn shares_sum_to_one_and_ignore_negative_noise() {
        let s = shares(&row([30.0, 50.0, 20.0, 0.0, 0.0, 0.0, 0.0, -5.0]));
        assert_eq!(s, [0.3, 0.5, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(shares(&row([0.0; 8])), [0.0; 8]);
    }

    #[test]
    fn short_counts() {
        assert_eq!(short_count(950.0), "950");
        assert_eq!(short_count(52_300.0), "52.3k");
        assert_eq!(short_count(2_500_000.0), "2.5M");
    }

    /// Draws a real PNG (with or without a font) and checks its signature.
    #[test]
    fn draws_a_png() {
        let dir = std::env::temp_dir().join(format!("pdu-cost-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.png");
        let rows = vec![row([30.0, 50.0, 20.0, 4.0, 1.0, 0.0, 0.0, 5.0]); 3];
        draw(&rows, &path, "test").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
