//! A run's logged series as CSV, one row per record and one column per
//! series, for pandas and spreadsheets: `log.csv` (what the objective and
//! the optimiser logged per batch) and `metrics.csv` (the validation
//! metrics per epoch). A cell is empty where a record lacks the series.

use crate::app::history::History;
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::path::Path;

/// Writes `log.csv` and `metrics.csv` of `history` into `dir`.
pub fn write(history: &History, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let log_keys: BTreeSet<&str> = history
        .losses
        .iter()
        .flat_map(|p| p.series.keys().map(String::as_str))
        .collect();
    let mut log = row(["step", "epoch", "objective"]
        .into_iter()
        .chain(log_keys.iter().copied()));
    for p in &history.losses {
        let cells = [p.step.to_string(), p.epoch.to_string(), p.objective.clone()];
        let values = log_keys.iter().map(|k| number(p.series.get(*k)));
        log += &row(cells.into_iter().chain(values));
    }
    let keys = &history.metric_keys;
    let mut metrics = row(["step", "epoch"]
        .into_iter()
        .chain(keys.iter().map(String::as_str)));
    for m in &history.metrics {
        let cells = [m.step.to_string(), m.epoch.to_string()];
        metrics += &row(cells
            .into_iter()
            .chain(keys.iter().map(|k| number(m.values.get(k)))));
    }
    for (name, text) in [("log.csv", log), ("metrics.csv", metrics)] {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn number(value: Option<&f64>) -> String {
    value.map_or(String::new(), f64::to_string)
}

/// One CSV line; a cell holding a comma, a quote or a line break is quoted.
fn row<S: AsRef<str>>(cells: impl Iterator<Item = S>) -> String {
    let cells: Vec<String> = cells
        .map(|c| {
            let c = c.as_ref();
            if c.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", c.replace('"', "\"\""))
            } else {
                c.to_string()
            }
        })
        .collect();
    cells.join(",") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::history::RecordFile;

    #[test]
    fn every_series_is_a_column_and_missing_values_are_empty() {
        let mut h = History::default();
        for line in [
            r#"{"step":5,"epoch":1,"objective":"mle","loss":2.5,"mle":2.5,"lr":0.001}"#,
            r#"{"step":10,"epoch":1,"objective":"scst","loss":-0.5,"reward":1.25,"lr":0.001}"#,
        ] {
            h.ingest(RecordFile::Log, line, "log").unwrap();
        }
        h.ingest(
            RecordFile::Metrics,
            r#"{"epoch":1,"step":10,"images":4,"CIDEr-D":0.5,"fact_precision":null}"#,
            "metrics",
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!(
            "captune-csv-{}",
            crate::tensorfile::temporary_suffix()
        ));
        write(&h, &dir).unwrap();
        let log = std::fs::read_to_string(dir.join("log.csv")).unwrap();
        assert_eq!(
            log,
            "step,epoch,objective,loss,lr,mle,reward\n\
             5,1,mle,2.5,0.001,2.5,\n\
             10,1,scst,-0.5,0.001,,1.25\n"
        );
        let metrics = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
        assert_eq!(metrics, "step,epoch,CIDEr-D,fact_precision\n10,1,0.5,\n");
        assert_eq!(
            row(["a,b", "say \"x\""].into_iter()),
            "\"a,b\",\"say \"\"x\"\"\"\n"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
