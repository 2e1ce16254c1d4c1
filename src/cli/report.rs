//! `captune report`: run folders as one self-contained HTML file, and
//! their series as CSV.

use super::check_new_output;
use anyhow::{Context, Result};
use captune::report;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Run folders (as `captune train` writes them); their curves share axes.
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// The HTML file to write: charts, final metrics and samples, viewable
    /// offline in any browser.
    #[arg(long, default_value = "report.html")]
    pub out: PathBuf,
    /// Also write each run's series as CSV into this folder:
    /// DIR/RUN/log.csv and DIR/RUN/metrics.csv.
    #[arg(long, value_name = "DIR")]
    pub csv: Option<PathBuf>,
    /// Replace --out and --csv if they exist.
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(args: &ReportArgs) -> Result<()> {
    check_new_output(&args.out, args.overwrite, "--out")?;
    if let Some(dir) = &args.csv {
        check_new_output(dir, args.overwrite, "--csv")?;
    }
    let runs = report::read_runs(&args.runs)?;
    let html = report::html(&runs)?;
    // Written beside and renamed, so a reader never sees half a report.
    let tmp = args.out.with_extension("html.tmp");
    std::fs::write(&tmp, html).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.out)
        .with_context(|| format!("cannot move the report to {}", args.out.display()))?;
    eprintln!("report: {}", args.out.display());
    if let Some(dir) = &args.csv {
        for run in &runs {
            report::csv::write(&run.history, &dir.join(&run.name))?;
        }
        eprintln!("series: {}/RUN/log.csv and metrics.csv", dir.display());
    }
    Ok(())
}
