//! A report of one or more run folders for a machine without a display:
//! one self-contained HTML file (inline SVG charts, images as data URLs,
//! no script and nothing fetched) holding the runs' loss, reward and
//! metric curves on shared axes, their final metrics side by side, and
//! their newest sample captions with the images, facts marked on the
//! shapes world. `csv` writes the same series for pandas.

pub mod csv;
mod plot;

use crate::app::follow::RunFiles;
use crate::app::history::{History, SampleRecord, TRAINING_SERIES};
use crate::captioner::run::RunConfig;
use crate::captioner::run_folder::RunFolder;
use crate::captioner::word_marks::{Marker, NO_REFERENCE_USES, WordMark};
use crate::data::Dataset;
use crate::shapes::facts::FactMark;
use crate::source::DataSource;
use crate::source::embeddings::FeatureSource;
use anyhow::{Context, Result, bail};
use base64::Engine;
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Thumbnails in the report are at most this many pixels a side.
const THUMBNAIL: u32 = 128;

/// One run folder's records, and the data set its samples come from.
pub struct Run {
    /// Its name in the report: the folder's name, with its parents' where
    /// two runs share one.
    pub name: String,
    pub dir: PathBuf,
    pub config: RunConfig,
    pub history: History,
    /// The data set, or why it could not be read (the report goes on
    /// without images).
    data: std::result::Result<Arc<Dataset>, String>,
}

/// Reads run folders; each data set is loaded once.
pub fn read_runs(dirs: &[PathBuf]) -> Result<Vec<Run>> {
    let mut canonical: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        let c = dir
            .canonicalize()
            .with_context(|| format!("{}: no such run folder", dir.display()))?;
        if canonical.contains(&c) {
            bail!("{}: the run folder is given twice", dir.display());
        }
        canonical.push(c);
    }
    let names = names(&canonical);
    let mut loaded: HashMap<String, std::result::Result<Arc<Dataset>, String>> = HashMap::new();
    let mut runs = Vec::new();
    for (dir, name) in dirs.iter().zip(names) {
        let config_path = RunFolder::new(dir).config();
        if !config_path.is_file() {
            bail!(
                "{}: not a run folder (no config.toml); pass folders that `captune train` wrote",
                dir.display()
            );
        }
        let config = RunConfig::load(&config_path)?;
        let mut history = History::default();
        RunFiles::new(dir).poll(&mut history)?;
        let data = match &config.features {
            Some(source) => {
                let key = serde_json::to_string(&(&source.data, &source.images, &source.shapes))?;
                loaded
                    .entry(key)
                    .or_insert_with(|| {
                        load_data(source)
                            .map(Arc::new)
                            .map_err(|e| format!("{e:#}"))
                    })
                    .clone()
            }
            None => Err("the run does not record its data set".into()),
        };
        runs.push(Run {
            name,
            dir: dir.clone(),
            config,
            history,
            data,
        });
    }
    Ok(runs)
}

fn load_data(source: &FeatureSource) -> Result<Dataset> {
    let data: DataSource = source
        .data
        .parse()
        .map_err(|e: String| anyhow::anyhow!("the recorded data set: {e}"))?;
    data.load(source.images.as_deref(), &source.shapes.unwrap_or_default())
}

/// Each folder's name, with as many parent folders as make it unique:
/// `dirs` are distinct canonical paths, so the names are plain relative
/// paths, and `--csv` puts a run's files under its name.
fn names(dirs: &[PathBuf]) -> Vec<String> {
    let parts: Vec<Vec<String>> = dirs
        .iter()
        .map(|d| {
            d.components()
                .rev()
                .filter_map(|c| match c {
                    std::path::Component::Normal(part) => Some(part.to_string_lossy().into_owned()),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let name = |k: usize, depth: usize| {
        let mut p: Vec<&str> = parts[k].iter().take(depth).map(String::as_str).collect();
        p.reverse();
        p.join("/")
    };
    let mut depth = 1;
    loop {
        let now: Vec<String> = (0..dirs.len()).map(|k| name(k, depth)).collect();
        let unique = now.iter().collect::<std::collections::HashSet<_>>().len() == now.len();
        if unique || depth > parts.iter().map(Vec::len).max().unwrap_or(0) {
            return now;
        }
        depth += 1;
    }
}

/// The report as one HTML document.
pub fn html(runs: &[Run]) -> Result<String> {
    let mut out = String::new();
    out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
    let title = runs
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    writeln!(out, "<title>captune report: {}</title>", escape(&title))?;
    out += STYLE;
    out += "</head>\n<body>\n<h1>captune report</h1>\n";
    runs_table(&mut out, runs)?;
    out += "<h2>Training curves</h2>\n<p>Every logged series over training steps, one line per run.</p>\n";
    charts(&mut out, runs, &log_keys(runs), |h, k| h.log_series(k))?;
    out +=
        "<h2>Validation metrics</h2>\n<p>Each epoch's validation metrics, one line per run.</p>\n";
    let metric_keys = metric_keys(runs);
    charts(&mut out, runs, &metric_keys, |h, k| h.metric_series(k))?;
    final_metrics(&mut out, runs, &metric_keys)?;
    samples(&mut out, runs)?;
    out += "</body>\n</html>\n";
    Ok(out)
}

const STYLE: &str = "<style>
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1500px; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; }
.charts svg { border: 1px solid #ddd; }
.run { font-weight: bold; }
.sample { display: flex; gap: 1em; align-items: flex-start; margin: 0.8em 0; }
.sample img { width: 128px; height: 128px; object-fit: contain; image-rendering: pixelated; border: 1px solid #ccc; }
.caption { margin: 0.15em 0; }
.kind { color: #888; display: inline-block; width: 4.5em; }
.f-true { color: #1f8f3f; }
.f-new { color: #1f5fd0; font-weight: bold; text-decoration: underline; }
.f-wrong { color: #d06a00; font-weight: bold; }
.f-absent { color: #c81e1e; font-weight: bold; text-decoration: line-through; }
.novel { color: #c0308f; font-weight: bold; }
.note { color: #666; }
</style>
";

fn runs_table(out: &mut String, runs: &[Run]) -> Result<()> {
    out.push_str("<table>\n<tr><th>run</th><th>folder</th><th>objectives</th><th>data</th><th>epochs</th><th>steps</th></tr>\n");
    for (k, run) in runs.iter().enumerate() {
        let objectives: Vec<&str> = run
            .history
            .switches
            .iter()
            .map(|s| s.objective.as_str())
            .collect();
        let objectives = if objectives.is_empty() {
            run.config.train.objective.clone()
        } else {
            objectives.join(" → ")
        };
        let data = run
            .config
            .features
            .as_ref()
            .map_or("unrecorded".into(), |f| f.data.clone());
        let last = run.history.losses.last();
        writeln!(
            out,
            "<tr><td class=\"run\" style=\"color:{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            plot::css_colour(k),
            escape(&run.name),
            escape(&run.dir.display().to_string()),
            escape(&objectives),
            escape(&data),
            last.map_or(0, |p| p.epoch),
            last.map_or(0, |p| p.step),
        )?;
    }
    out.push_str("</table>\n");
    Ok(())
}

/// The log's series in every run, the objectives' first, then the
/// optimiser's (not the throughput, which measures the machine).
fn log_keys(runs: &[Run]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for run in runs {
        for k in run.history.objective_series_names() {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys.extend(
        TRAINING_SERIES
            .iter()
            .filter(|&&k| k != "tokens_per_s")
            .map(|k| k.to_string()),
    );
    keys
}

fn metric_keys(runs: &[Run]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for run in runs {
        for k in &run.history.metric_keys {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    keys
}

fn charts(
    out: &mut String,
    runs: &[Run],
    keys: &[String],
    series: impl Fn(&History, &str) -> Vec<[f64; 2]>,
) -> Result<()> {
    out.push_str("<div class=\"charts\">\n");
    for key in keys {
        let lines: Vec<plot::Line<'_>> = runs
            .iter()
            .enumerate()
            .map(|(k, run)| plot::Line {
                run: k,
                name: &run.name,
                points: series(&run.history, key)
                    .into_iter()
                    .map(|[x, y]| (x, y))
                    .collect(),
            })
            .filter(|l| !l.points.is_empty())
            .collect();
        if let Some(svg) = plot::chart(key, &lines)? {
            out.push_str(&svg);
            out.push('\n');
        }
    }
    out.push_str("</div>\n");
    Ok(())
}

fn final_metrics(out: &mut String, runs: &[Run], keys: &[String]) -> Result<()> {
    out.push_str("<h2>Final metrics</h2>\n<p>Each run's last validation record.</p>\n<table>\n<tr><th>metric</th>");
    for (k, run) in runs.iter().enumerate() {
        write!(
            out,
            "<th class=\"run\" style=\"color:{}\">{}</th>",
            plot::css_colour(k),
            escape(&run.name)
        )?;
    }
    out.push_str("</tr>\n");
    let mut rows = vec!["epoch".to_string()];
    rows.extend(keys.iter().cloned());
    for key in &rows {
        write!(out, "<tr><td>{}</td>", escape(key))?;
        for run in runs {
            let last = run.history.metrics.last();
            let cell = match (key.as_str(), last) {
                (_, None) => "–".to_string(),
                ("epoch", Some(m)) => m.epoch.to_string(),
                (_, Some(m)) => m.values.get(key).map_or("–".into(), |v| format!("{v:.4}")),
            };
            write!(out, "<td>{cell}</td>")?;
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    Ok(())
}

fn samples(out: &mut String, runs: &[Run]) -> Result<()> {
    out.push_str("<h2>Samples</h2>\n<p>Each run's newest greedy caption and samples of the images it logs.</p>\n");
    for (k, run) in runs.iter().enumerate() {
        let epoch = run.history.samples.iter().map(|s| s.epoch).max();
        writeln!(
            out,
            "<h3 class=\"run\" style=\"color:{}\">{}{}</h3>",
            plot::css_colour(k),
            escape(&run.name),
            epoch.map_or(String::new(), |e| format!(" (epoch {e})"))
        )?;
        let data = match &run.data {
            Ok(data) => {
                legend(out, data)?;
                Some(data)
            }
            Err(why) => {
                writeln!(
                    out,
                    "<p class=\"note\">Images and marks unavailable: {}</p>",
                    escape(why)
                )?;
                None
            }
        };
        if run.history.samples.is_empty() {
            out.push_str("<p class=\"note\">No samples logged yet.</p>\n");
        }
        let by_id: HashMap<&str, usize> = data.map_or_else(HashMap::new, |d| {
            d.items
                .iter()
                .enumerate()
                .map(|(i, item)| (item.id.as_str(), i))
                .collect()
        });
        for s in &run.history.samples {
            let item = data.and_then(|d| Some(&d.items[*by_id.get(s.image_id.as_str())?]));
            if data.is_some() && item.is_none() {
                writeln!(
                    out,
                    "<p class=\"note\">Image {} is not in the run's data set.</p>",
                    escape(&s.image_id)
                )?;
            }
            sample(out, s, item)?;
        }
    }
    Ok(())
}

/// What a run's marks mean: the fact legend where its data set has
/// scenes, else what the highlight shows.
fn legend(out: &mut String, data: &Dataset) -> Result<()> {
    if data
        .items
        .first()
        .is_some_and(|i| Marker::of(i).checks_facts())
    {
        let legend: Vec<String> = FactMark::ALL
            .iter()
            .map(|&m| {
                let class = class(WordMark::Fact(m));
                format!("<span class=\"{class}\">{}</span>", escape(m.meaning()))
            })
            .collect();
        writeln!(
            out,
            "<p>Facts checked against the scene: {}</p>",
            legend.join(" · ")
        )?;
    } else {
        writeln!(out, "<p class=\"novel\">{}</p>", escape(NO_REFERENCE_USES))?;
    }
    Ok(())
}

fn sample(out: &mut String, s: &SampleRecord, item: Option<&crate::data::Item>) -> Result<()> {
    out.push_str("<div class=\"sample\">");
    match item.map(|i| thumbnail(&i.image)) {
        Some(Ok(png)) => write!(
            out,
            "<img alt=\"image {}\" src=\"data:image/png;base64,{}\">",
            escape(&s.image_id),
            base64::engine::general_purpose::STANDARD.encode(png)
        )?,
        Some(Err(e)) => write!(out, "<p class=\"note\">{}</p>", escape(&format!("{e:#}")))?,
        None => {}
    }
    write!(
        out,
        "<div><div class=\"note\">image {} (step {})</div>",
        escape(&s.image_id),
        s.step
    )?;
    let marker = item.map(Marker::of);
    let captions =
        std::iter::once(("greedy", &s.caption)).chain(s.samples.iter().map(|c| ("sample", c)));
    for (kind, caption) in captions {
        write!(
            out,
            "<div class=\"caption\"><span class=\"kind\">{kind}</span>"
        )?;
        match &marker {
            Some(marker) => {
                let words: Vec<String> = marker
                    .mark(caption)
                    .into_iter()
                    .map(|(w, m)| match m {
                        Some(m) => format!("<span class=\"{}\">{}</span>", class(m), escape(&w)),
                        None => escape(&w),
                    })
                    .collect();
                out.push_str(&words.join(" "));
            }
            None => out.push_str(&escape(caption)),
        }
        out.push_str("</div>");
    }
    out.push_str("</div></div>\n");
    Ok(())
}

fn class(mark: WordMark) -> &'static str {
    match mark {
        WordMark::Fact(FactMark::True) => "f-true",
        WordMark::Fact(FactMark::NewDetail) => "f-new",
        WordMark::Fact(FactMark::Wrong) => "f-wrong",
        WordMark::Fact(FactMark::Absent) => "f-absent",
        WordMark::NoReferenceUses => "novel",
    }
}

/// The image at `path` as a PNG at most [`THUMBNAIL`] pixels a side.
fn thumbnail(path: &Path) -> Result<Vec<u8>> {
    let image =
        image::open(path).with_context(|| format!("{}: cannot read the image", path.display()))?;
    let small = if image.width().max(image.height()) > THUMBNAIL {
        image.thumbnail(THUMBNAIL, THUMBNAIL)
    } else {
        image
    };
    let mut png = Vec::new();
    small
        .to_rgb8()
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)?;
    Ok(png)
}

/// Text made safe for HTML content and attribute values.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_take_as_many_parent_folders_as_make_them_unique() {
        let dirs = [
            PathBuf::from("/runs/a/mle"),
            PathBuf::from("/runs/b/mle"),
            PathBuf::from("/runs/a/smile"),
        ];
        assert_eq!(names(&dirs), ["a/mle", "b/mle", "a/smile"]);
        assert_eq!(names(&dirs[..1]), ["mle"]);
        assert_eq!(escape("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
    }
}
