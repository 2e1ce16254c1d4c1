//! What a training run records and hands its caller as it goes: the log
//! line of a step (read back from the device at once), the samples and
//! the metrics of an epoch. The run folder keeps each as a JSON-lines
//! file (`run_folder`).

use super::evaluate::CaptionMetrics;
use super::inspect::TokenScore;
use super::objective::Objective;
use crate::backend::{Backend, Reduce};
use serde::Serialize;
use std::collections::BTreeMap;

/// A `log.jsonl` line: a logged step.
#[derive(Clone, Debug, Serialize)]
pub struct LogLine {
    pub step: usize,
    pub epoch: usize,
    pub objective: String,
    /// What the objective reports, by name: `loss` (what it minimises),
    /// then its own (`mle`, `smile`, ...). Each name is a series of the
    /// app's loss panel.
    #[serde(flatten)]
    pub values: BTreeMap<String, f32>,
    pub lr: f32,
    pub grad_norm: f32,
    pub tokens_per_s: f64,
}

/// A `samples.jsonl` line: a validation image's captions at an epoch's end.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub epoch: usize,
    pub step: usize,
    pub image_id: String,
    /// The greedy caption, scored token by token.
    pub caption: String,
    pub tokens: Vec<TokenScore>,
    /// Sampled captions (temperature 1).
    pub samples: Vec<String>,
}

/// A `metrics.jsonl` line: an epoch's validation metrics.
#[derive(Clone, Debug, Serialize)]
pub struct EpochMetrics {
    pub epoch: usize,
    pub step: usize,
    #[serde(flatten)]
    pub metrics: CaptionMetrics,
}

/// What the caller sees as training goes.
pub enum Event<'a> {
    Log(&'a LogLine),
    /// Something the person running it should see at once, with advice
    /// (the first sign of a collapse).
    Warning(&'a str),
    Sample(&'a Sample),
    Metrics(&'a EpochMetrics),
}

/// The caller's answer to an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// End training now. The run folder keeps the last epoch's checkpoint;
    /// `--resume` continues from there.
    Stop,
}

/// The objective's values of the last (monitored) step and the
/// optimiser's squared gradient norm (`grad_sumsq`), gathered on the
/// device and read back at once.
pub fn read_log<B: Backend>(
    b: &B,
    objective: &dyn Objective<B>,
    grad_sumsq: &B::Tensor,
) -> (Vec<(&'static str, f32)>, f32) {
    let logged = objective.logged();
    let mut gathered = b.zeros(logged.len() + 1);
    for (slot, x) in logged.iter().copied().chain([grad_sumsq]).enumerate() {
        b.reduce(x, Reduce::Sum, &mut gathered, slot);
    }
    let read = b.to_vec(&gathered);
    let (values, grad_sumsq) = read.split_at(logged.len());
    (objective.report(values), grad_sumsq[0])
}
