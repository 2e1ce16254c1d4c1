//! What the panels show, read from a run folder's JSON-lines files
//! (`log.jsonl`, `metrics.jsonl`, `samples.jsonl`) whether the run is
//! headless or trains inside the app: loss points, metric points, the
//! newest samples per image, and where the objective changed.

use crate::captioner::inspect::TokenScore;
use anyhow::{Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The run folder's record files and what each holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordFile {
    Log,
    Metrics,
    Samples,
}

impl RecordFile {
    pub const ALL: [RecordFile; 3] = [RecordFile::Log, RecordFile::Metrics, RecordFile::Samples];

    pub fn file_name(self) -> &'static str {
        match self {
            RecordFile::Log => "log.jsonl",
            RecordFile::Metrics => "metrics.jsonl",
            RecordFile::Samples => "samples.jsonl",
        }
    }
}

/// One `log.jsonl` line: what the objective reported for one batch, by
/// name (`loss`, `mle`, `smile`, and whatever else an objective logs),
/// and the optimiser's and the throughput's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct LossPoint {
    pub step: usize,
    pub epoch: usize,
    pub objective: String,
    /// Every other number on the line, by its key.
    pub series: BTreeMap<String, f64>,
}

/// Keys of a log line that are not series: where the line stands.
const LOG_POSITION: [&str; 3] = ["step", "epoch", "objective"];
/// Series the trainer logs whatever the objective: the optimiser's and
/// the throughput.
pub const TRAINING_SERIES: [&str; 3] = ["lr", "grad_norm", "tokens_per_s"];

impl LossPoint {
    fn parse(line: &str) -> Option<LossPoint> {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        let object = value.as_object()?;
        let whole = |key: &str| Some(object.get(key)?.as_u64()? as usize);
        Some(LossPoint {
            step: whole("step")?,
            epoch: whole("epoch")?,
            objective: object.get("objective")?.as_str()?.to_string(),
            series: object
                .iter()
                .filter(|(k, _)| !LOG_POSITION.contains(&k.as_str()))
                .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                .collect(),
        })
    }

    /// The value of series `key` (NaN where this line lacks it).
    pub fn get(&self, key: &str) -> f64 {
        self.series.get(key).copied().unwrap_or(f64::NAN)
    }

    /// The objective's series: every one but the trainer's own.
    pub fn objective_series(&self) -> impl Iterator<Item = (&str, f64)> {
        self.series
            .iter()
            .filter(|(k, _)| !TRAINING_SERIES.contains(&k.as_str()))
            .map(|(k, &v)| (k.as_str(), v))
    }
}

/// One `metrics.jsonl` line: every numeric validation metric by its key.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricPoint {
    pub step: usize,
    pub epoch: usize,
    pub values: BTreeMap<String, f64>,
}

/// One `samples.jsonl` line: an image's greedy caption (scored per token)
/// and its sampled captions.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct SampleRecord {
    pub epoch: usize,
    /// Absent in run folders written before samples carried it.
    #[serde(default)]
    pub step: usize,
    pub image_id: String,
    pub caption: String,
    pub tokens: Vec<TokenScore>,
    /// Absent in run folders written before samples carried them.
    #[serde(default)]
    pub samples: Vec<String>,
}

/// An objective change: the first logged step under the new objective.
#[derive(Clone, Debug, PartialEq)]
pub struct Switch {
    pub step: usize,
    pub objective: String,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub losses: Vec<LossPoint>,
    pub metrics: Vec<MetricPoint>,
    /// Every metric key of `metrics.jsonl`, in first-seen order, those
    /// whose value is undefined (null) included.
    pub metric_keys: Vec<String>,
    /// The newest samples of each image, in the order images first appeared.
    pub samples: Vec<SampleRecord>,
    pub switches: Vec<Switch>,
}

impl History {
    /// Adds one line of `file`; `origin` names it in errors.
    pub fn ingest(&mut self, file: RecordFile, line: &str, origin: &str) -> Result<()> {
        let bad = || format!("{origin}: not a {} record", file.file_name());
        match file {
            RecordFile::Log => {
                let point = LossPoint::parse(line).with_context(bad)?;
                if self.losses.last().map(|p| &p.objective) != Some(&point.objective) {
                    self.switches.push(Switch {
                        step: point.step,
                        objective: point.objective.clone(),
                    });
                }
                self.losses.push(point);
            }
            RecordFile::Metrics => {
                let value: serde_json::Value = serde_json::from_str(line).with_context(bad)?;
                let object = value.as_object().with_context(bad)?;
                let whole = |key: &str| object.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
                for key in object.keys() {
                    let metric = !matches!(key.as_str(), "step" | "epoch" | "images");
                    if metric && !self.metric_keys.contains(key) {
                        self.metric_keys.push(key.clone());
                    }
                }
                self.metrics.push(MetricPoint {
                    step: whole("step") as usize,
                    epoch: whole("epoch") as usize,
                    values: object
                        .iter()
                        .filter(|(k, _)| !matches!(k.as_str(), "step" | "epoch" | "images"))
                        .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                        .collect(),
                });
            }
            RecordFile::Samples => {
                let record: SampleRecord = serde_json::from_str(line).with_context(bad)?;
                match self
                    .samples
                    .iter_mut()
                    .find(|s| s.image_id == record.image_id)
                {
                    Some(old) => *old = record,
                    None => self.samples.push(record),
                }
            }
        }
        Ok(())
    }

    /// The names of every objective series logged, in first-seen order
    /// of their keys (sorted within a line).
    pub fn objective_series_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for p in &self.losses {
            for (k, _) in p.objective_series() {
                if !names.iter().any(|n| n == k) {
                    names.push(k.to_string());
                }
            }
        }
        names
    }

    /// The series `key` of the log over steps (lines without it skipped).
    pub fn log_series(&self, key: &str) -> Vec<[f64; 2]> {
        self.losses
            .iter()
            .filter_map(|p| Some([p.step as f64, *p.series.get(key)?]))
            .collect()
    }

    /// The series of metric `key` over steps.
    pub fn metric_series(&self, key: &str) -> Vec<[f64; 2]> {
        self.metrics
            .iter()
            .filter_map(|m| Some([m.step as f64, *m.values.get(key)?]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(step: usize, objective: &str) -> String {
        format!(
            r#"{{"step":{step},"epoch":1,"objective":"{objective}","loss":2.0,"mle":2.0,"smile":1.0,"lr":0.001,"grad_norm":1.0,"tokens_per_s":100.0}}"#
        )
    }

    #[test]
    fn objective_changes_become_switches() {
        let mut h = History::default();
        for (step, o) in [(5, "mle"), (10, "mle"), (15, "smile"), (20, "smile")] {
            h.ingest(RecordFile::Log, &log(step, o), "log").unwrap();
        }
        assert_eq!(h.losses.len(), 4);
        let steps: Vec<(usize, &str)> = h
            .switches
            .iter()
            .map(|s| (s.step, s.objective.as_str()))
            .collect();
        assert_eq!(steps, [(5, "mle"), (15, "smile")]);
        assert_eq!(h.objective_series_names(), ["loss", "mle", "smile"]);
        assert_eq!(h.log_series("mle").len(), 4);
    }

    #[test]
    fn any_number_an_objective_logs_becomes_a_series() {
        let mut h = History::default();
        h.ingest(RecordFile::Log, &log(5, "mle"), "log").unwrap();
        h.ingest(
            RecordFile::Log,
            r#"{"step":10,"epoch":1,"objective":"scst","loss":-0.5,"reward":1.25,"baseline":1.0,"note":"x","lr":0.001,"grad_norm":1.0,"tokens_per_s":100.0}"#,
            "log",
        )
        .unwrap();
        assert_eq!(
            h.objective_series_names(),
            ["loss", "mle", "smile", "baseline", "reward"]
        );
        assert_eq!(h.log_series("reward"), [[10.0, 1.25]]);
        assert_eq!(h.log_series("mle"), [[5.0, 2.0]]);
        assert!(h.losses[1].get("mle").is_nan());
        assert!(!h.losses[1].series.contains_key("note"));
    }

    #[test]
    fn metrics_keep_numbers_and_newest_samples_replace_older_ones() {
        let mut h = History::default();
        h.ingest(
            RecordFile::Metrics,
            r#"{"epoch":1,"step":40,"images":4,"mean_length":7.5,"div1":null,"BLEU-4":0.25}"#,
            "metrics",
        )
        .unwrap();
        assert_eq!(h.metric_series("mean_length"), [[40.0, 7.5]]);
        assert!(h.metric_series("div1").is_empty());
        assert!(!h.metrics[0].values.contains_key("images"));
        for (step, caption) in [(40, "a red circle"), (80, "a big red circle")] {
            let line = format!(
                r#"{{"epoch":1,"step":{step},"image_id":"v1","caption":"{caption}","tokens":[],"samples":["x"]}}"#
            );
            h.ingest(RecordFile::Samples, &line, "samples").unwrap();
        }
        assert_eq!(h.samples.len(), 1);
        assert_eq!(h.samples[0].caption, "a big red circle");
        let err = h
            .ingest(RecordFile::Log, "{\"step\": 1}", "run/log.jsonl line 3")
            .unwrap_err();
        assert!(format!("{err:#}").contains("run/log.jsonl line 3"));
    }
}
