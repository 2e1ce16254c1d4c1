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

/// One `log.jsonl` line: the losses of one batch.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct LossPoint {
    pub step: usize,
    pub epoch: usize,
    pub objective: String,
    pub loss: f64,
    pub mle: f64,
    pub smile: f64,
    pub lr: f64,
    pub tokens_per_s: f64,
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
                let point: LossPoint = serde_json::from_str(line).with_context(bad)?;
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
