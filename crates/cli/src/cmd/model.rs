//! `iscsi model DIR`: fits the seed paper's models to a sweep's
//! `DIR/results.csv` (see `iscsi_analysis`), writes `DIR/models.json` and
//! the plots, and prints a table. `iscsi sweep` ends with the same step; run
//! it again after editing or merging result files.

use std::path::{Path, PathBuf};

use anyhow::Context;
use iscsi_analysis::plot::{PlotError, write_plots};
use iscsi_analysis::{Analysis, Results, analyze};

/// Options of `iscsi model`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A directory written by `iscsi sweep` (holding results.csv).
    dir: PathBuf,
}

/// Runs `iscsi model`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    refit(&args.dir)
}

/// The names of the PNGs a fit may write, so that a re-fit removes the
/// plots an earlier one drew and this one does not.
fn is_our_plot(name: &str) -> bool {
    name.ends_with(".png")
        && (name.starts_with("throughput_vs_")
            || name.starts_with("eq1_")
            || name.starts_with("eq2_")
            || name.starts_with("eq3_heatmap"))
}

/// Fits the models to `dir/results.csv`, writes `models.json` and the
/// plots, and prints the table.
pub fn refit(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join("results.csv");
    let file = std::fs::File::open(&path).with_context(|| {
        format!(
            "opening {} (a directory written by a finished iscsi sweep)",
            path.display()
        )
    })?;
    let results = Results::read_csv(file).with_context(|| format!("reading {}", path.display()))?;
    let analysis = analyze(&results);
    let models = dir.join("models.json");
    let temporary = dir.join("models.json.partial");
    std::fs::write(&temporary, analysis.models_json() + "\n")
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, &models)
        .with_context(|| format!("renaming {}", temporary.display()))?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        if entry.file_name().to_str().is_some_and(is_our_plot) {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    print_table(&results, &analysis);
    println!("wrote {}", models.display());
    match write_plots(&results, &analysis, dir) {
        Ok(plots) => {
            for plot in plots {
                println!("wrote {}", plot.display());
            }
        }
        // The numbers stand without the pictures.
        Err(error @ PlotError::NoFont) => eprintln!("iscsi: no plots: {error}"),
        Err(error) => return Err(error.into()),
    }
    Ok(())
}

fn print_table(results: &Results, analysis: &Analysis) {
    println!(
        "{} rows, swept keys: {}",
        results.rows.len(),
        if results.key_names.is_empty() {
            "none".to_owned()
        } else {
            results.key_names.join(", ")
        }
    );
    println!("{:<6} {:>6} {:>8}  coefficients", "model", "n", "r2");
    for model in &analysis.models {
        let coefficients = model
            .terms
            .iter()
            .zip(&model.coefficients)
            .map(|(t, c)| format!("{t}={c:.6}"))
            .collect::<Vec<_>>()
            .join(" ");
        let r2 = model.r2.map_or("-".to_owned(), |r| format!("{r:.4}"));
        println!(
            "{:<6} {:>6} {:>8}  {coefficients}",
            model.model, model.n, r2
        );
        if let Some(group) = &model.group {
            println!("{:<6} {:>6} {:>8}  rows: {group}", "", "", "");
        }
        for choice in model.table.iter().flatten() {
            println!(
                "{:<6} {:>6} {:>8}  m = {} KiB: n = {} (n*m = {}, {:.1} of best {:.1} MiB/s{})",
                "",
                "",
                "",
                choice.mrdsl_kb,
                choice.n,
                choice.n_times_m,
                choice.chosen_mib_per_s,
                choice.best_mib_per_s,
                if choice.censored {
                    ", at the edge of the n tried"
                } else {
                    ""
                }
            );
        }
        for note in &model.notes {
            println!("{:<6} {:>6} {:>8}  note: {note}", "", "", "");
        }
    }
    for skipped in &analysis.skipped {
        println!(
            "{:<6} {:>6} {:>8}  skipped: {}",
            skipped.model, "-", "-", skipped.reason
        );
    }
}
