//! `captune report` on two real runs of a tiny world: one self-contained
//! HTML file (inline SVG charts with both runs, final metrics side by
//! side, samples with their images and facts marked) and the series as
//! CSV; then the page in a real headless browser, whose screenshot must
//! show the charts' lines (skipped, visibly, without a browser).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn captune(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_captune"))
        .args(args)
        .env_remove("CAPTUNE_DEVICE")
        .env("CAPTUNE_CACHE", cache)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `captune train` on the tiny world into `out`.
fn train(out: &Path, cache: &Path, extra: &[&str]) {
    let mut args = vec!["--device", "cpu", "train", "--preset", "tiny", "--out"];
    args.push(out.to_str().unwrap());
    args.extend(extra);
    args.extend(common::TINY_WORLD_ARGS);
    let run = captune(&args, cache);
    assert!(run.status.success(), "{}", text(&run.stderr));
}

#[test]
fn a_report_of_two_runs_holds_their_curves_metrics_and_samples() {
    // Under the build's folder, not /tmp: a browser installed as a snap
    // sees its own /tmp.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "captune-report-{}",
        captune::tensorfile::temporary_suffix()
    ));
    let cache = dir.join("cache");
    let (mle, smile) = (dir.join("runs/mle"), dir.join("runs/smile"));
    train(&mle, &cache, &["--epochs", "3"]);
    let init = mle.join("checkpoint.safetensors");
    let init = init.to_str().unwrap();
    train(
        &smile,
        &cache,
        &["--epochs", "2", "--objective", "smile", "--init", init],
    );

    let html_path = dir.join("report.html");
    let csv = dir.join("csv");
    let args = [
        "report",
        mle.to_str().unwrap(),
        smile.to_str().unwrap(),
        "--out",
        html_path.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ];
    let out = captune(&args, &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(&html_path).unwrap();

    // Self-contained: nothing to fetch, nothing to run.
    for outside in ["src=\"http", "href=\"http", "<script", "<link"] {
        assert!(!html.contains(outside), "the report holds {outside}");
    }
    // A chart per logged series and per metric, each with both runs in
    // its legend.
    let texts = svg_texts(&html);
    let count = |t: &str| texts.iter().filter(|&x| x == t).count();
    for key in ["loss", "lr", "grad_norm", "CIDEr-D", "fact_recall"] {
        assert_eq!(count(key), 1, "charts titled {key}");
    }
    let charts = html.matches("<svg").count();
    assert!(charts >= 7, "{charts} charts");
    // "mle" and "smile" title their own charts and name a run in every legend.
    assert_eq!(count("mle"), charts + 1);
    assert_eq!(count("smile"), charts + 1);
    // The final metrics side by side: a row per metric, a column per run.
    let table = &html[html.find("<h2>Final metrics").unwrap()..html.find("<h2>Samples").unwrap()];
    assert!(table.contains(">mle</th>") && table.contains(">smile</th>"));
    let cider_row = table
        .lines()
        .find(|l| l.starts_with("<tr><td>CIDEr-D</td>"))
        .unwrap();
    let cells: Vec<&str> = cider_row
        .split("<td>")
        .skip(2)
        .map(|c| c.split('<').next().unwrap())
        .collect();
    assert_eq!(cells.len(), 2, "{cider_row}");
    assert!(
        cells.iter().all(|c| c.parse::<f64>().is_ok()),
        "{cider_row}"
    );
    // Samples with their images, their facts checked.
    let samples = &html[html.find("<h2>Samples").unwrap()..];
    assert!(samples.matches("<img ").count() >= 2);
    assert!(samples.contains("src=\"data:image/png;base64,"));
    assert!(samples.contains("class=\"f-"), "no fact marked");

    // The series as CSV: a row per record.
    for run in ["mle", "smile"] {
        let log = std::fs::read_to_string(csv.join(run).join("log.csv")).unwrap();
        let records =
            std::fs::read_to_string(dir.join("runs").join(run).join("log.jsonl")).unwrap();
        assert!(log.starts_with("step,epoch,objective,"), "{log}");
        assert_eq!(log.lines().count(), records.lines().count() + 1);
        let metrics = std::fs::read_to_string(csv.join(run).join("metrics.csv")).unwrap();
        assert!(metrics.lines().next().unwrap().contains("CIDEr-D"));
    }

    // What a user made stays unless they ask.
    let again = captune(&args, &cache);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("--overwrite"),
        "{}",
        text(&again.stderr)
    );
    let not_a_run = captune(&["report", dir.to_str().unwrap()], &cache);
    assert!(!not_a_run.status.success());
    assert!(
        text(&not_a_run.stderr).contains("not a run folder"),
        "{}",
        text(&not_a_run.stderr)
    );
    let twice_html = dir.join("twice.html");
    let (m, t) = (mle.to_str().unwrap(), twice_html.to_str().unwrap());
    let twice = captune(&["report", m, m, "--out", t], &cache);
    assert!(!twice.status.success());
    assert!(
        text(&twice.stderr).contains("given twice"),
        "{}",
        text(&twice.stderr)
    );

    in_a_browser(&html_path, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The text of every SVG `<text>` element, trimmed.
fn svg_texts(html: &str) -> Vec<String> {
    html.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            Some(body[..body.find("</text>")?].trim().to_string())
        })
        .collect()
}

fn browser() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// `path` as a file URL, the characters a URL gives meaning escaped.
fn file_url(path: &Path) -> String {
    let mut url = String::from("file://");
    for c in path.display().to_string().chars() {
        match c {
            '%' | ' ' | '#' | '?' => url += &format!("%{:02X}", c as u32),
            c => url.push(c),
        }
    }
    url
}

/// The report in headless chromium: its screenshot shows a page with
/// both runs' line colours (the charts drew), not a blank one.
fn in_a_browser(report: &Path, dir: &Path) {
    let Some(browser) = browser() else {
        common::skip("no chromium, chromium-browser or google-chrome on PATH");
        return;
    };
    let shot = dir.join("report.png");
    let out = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", dir.join("browser").display()))
        .arg("--window-size=1200,1600")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(file_url(report))
        .output()
        .unwrap();
    assert!(
        shot.is_file(),
        "{}: no screenshot\n{}",
        browser.display(),
        text(&out.stderr)
    );
    let image = image::open(&shot).unwrap().to_rgb8();
    let near = |p: &image::Rgb<u8>, c: [u8; 3]| p.0.iter().zip(c).all(|(&a, b)| a.abs_diff(b) < 24);
    let count = |c: [u8; 3]| image.pixels().filter(|p| near(p, c)).count();
    let ink = image
        .pixels()
        .filter(|p| p.0.iter().any(|&v| v < 200))
        .count();
    let total = image.pixels().count();
    assert!(
        ink * 100 > total,
        "the page is blank: {ink} of {total} pixels drawn"
    );
    // The first two runs' colours (plot.rs): blue and orange lines.
    assert!(count([31, 119, 180]) > 200, "no blue run line");
    assert!(count([255, 127, 14]) > 200, "no orange run line");
}
