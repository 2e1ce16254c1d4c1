//! Training objectives behind one trait. An objective gets a step's
//! context (the model with its parameters and workspaces, the batch as the
//! host holds it, the vocabulary, a generator seeded for the step),
//! accumulates its gradient into the model's parameter gradients, and
//! names the values it logs. The trainer zeroes the gradients before and
//! runs the optimiser after; the log line, the run folder and the app take
//! whatever names an objective reports, so a new objective is a file here
//! (or in a test) and needs no change elsewhere.
//!
//! - [`token`]: MLE and the SMILE family (teacher-forced, token-level).

pub mod token;

use super::CaptionVocab;
use super::model::Captioner;
use crate::backend::Backend;
use anyhow::Result;
use rand_chacha::ChaCha8Rng;

/// One training step's batch as the host holds it.
pub struct TrainingBatch {
    /// `[batch, embed_dim]` image embeddings, one row per caption.
    pub features: Vec<f32>,
    /// Each row's reference caption, encoded `<bos> .. <eos>` within the
    /// model's `max_len`.
    pub sequences: Vec<Vec<u32>>,
}

impl TrainingBatch {
    /// Real target tokens (each caption's ids after `<bos>`): what the
    /// trainer's tokens/s counts.
    pub fn tokens(&self) -> usize {
        self.sequences
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .sum()
    }
}

/// What an objective sees at one training step.
pub struct StepContext<'a, B: Backend> {
    pub b: &'a B,
    /// Its parameters' gradients are zero when the step begins.
    pub model: &'a mut Captioner<B>,
    pub vocab: &'a CaptionVocab,
    pub batch: &'a TrainingBatch,
    /// What the gradient (not a reported loss) is multiplied by: the
    /// batch's share of tokens when batches are formed by length, so that
    /// every token weighs what it would in a random batch
    /// (docs/training.md#batches); 1 elsewhere.
    pub gradient_weight: f32,
    /// Seeded by the run's seed and the step: subsets, samples.
    pub rng: &'a mut ChaCha8Rng,
    /// The step is logged: compute every value `logged` names, also the
    /// ones the objective does not train on.
    pub monitor: bool,
}

/// A training objective.
pub trait Objective<B: Backend> {
    /// What the log's `objective` field and the app show.
    fn describe(&self) -> String;

    /// Runs the forwards the objective needs on `cx.batch` and adds its
    /// gradient to `cx.model`'s parameter gradients. Nothing is read back.
    fn step(&mut self, cx: &mut StepContext<'_, B>) -> Result<()>;

    /// After a monitored step: the one-element device tensors whose
    /// values `report` turns into the log's values. The trainer gathers
    /// them with the optimiser's figures and reads them back at once.
    fn logged(&self) -> Vec<&B::Tensor>;

    /// The named values of the log line, from the values of `logged`'s
    /// tensors in order. `loss`, what the objective minimises, comes
    /// first; the names are the log's series.
    fn report(&self, read: &[f32]) -> Vec<(&'static str, f32)>;
}
