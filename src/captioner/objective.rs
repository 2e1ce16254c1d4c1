//! The interface between the training core and an objective: what an
//! objective is to the config, the command line and the app
//! ([`ObjectiveInfo`]), what it sees at a step ([`StepContext`]: the model
//! with its parameters and workspaces, which also decodes and samples with
//! the current weights; the batch as the host holds it, references
//! included; the training corpus; the vocabulary; the frozen retriever
//! when the run has one; a generator seeded for the step), and what it
//! does ([`Objective`]): it accumulates its gradient into the model's
//! parameter gradients and names the values it logs. The trainer zeroes
//! the gradients before and runs the optimiser after; the log line, the
//! run folder and the app take whatever names an objective reports. The
//! objectives themselves and their registry are in `objectives`.

use super::CaptionVocab;
use super::collapse::RewardWatch;
pub use super::corpus::TrainingCorpus;
use super::explain::{ExplainContext, Explanation};
use super::model::Captioner;
use super::objectives::settings::{Setting, SettingKind, SettingValue, Settings};
use crate::backend::Backend;
use crate::retriever::frozen::FrozenRetriever;
use anyhow::{Result, bail};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// lambda in lambda * MLE on the references + (1 - lambda) * an
/// objective's own loss: SMILE's mix inside its softmax pass, every other
/// objective's through the core's wrapper ([`super::mle_mix`]).
pub const MLE_WEIGHT: Setting = Setting {
    key: "mle_weight",
    label: "lambda (MLE weight)",
    help: "lambda in lambda * MLE on the references + (1 - lambda) * the objective's own loss",
    kind: SettingKind::Number {
        min: 0.0,
        max: 1.0,
        default: 0.0,
    },
};

/// An objective as the config, the command line and the app know it.
#[derive(Debug)]
pub struct ObjectiveInfo {
    /// What `[train] objective` and `--objective` say.
    pub name: &'static str,
    pub help: &'static str,
    pub settings: &'static [&'static Setting],
    /// Series it logs that the app plots apart from the losses, a plot
    /// per group; series in no group share the loss plot.
    pub plots: &'static [&'static SeriesGroup],
    /// What it learns from, which decides the images it trains on under
    /// a labelled fraction ([`super::labelled`]).
    pub trains_on: TrainsOn,
    /// The peak learning rate of a run that starts from a checkpoint
    /// (`--init`) without `--lr`: fine-tuning a converged captioner at a
    /// from-scratch rate collapses it. None: the config's rate.
    pub fine_tune_lr: Option<f32>,
    /// The logged series it raises, which the collapse guard watches.
    pub reward: Option<RewardWatch>,
    /// What it needs besides the batch, with these settings: the trainer
    /// supplies exactly that, and refuses a run that cannot.
    pub needs: fn(&Settings) -> Needs,
    /// Its `Objective::explain` says what it makes of a caption (those
    /// that reward nothing, MLE and SMILE, do not: `inspect`'s token
    /// table shows their losses).
    pub explains: bool,
}

/// What an objective needs besides its batch and the corpus' references.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// The run's frozen retriever (`--retriever`).
    pub retriever: bool,
    /// Every training image's embedding (`TrainingCorpus::image_embeddings`).
    pub image_embeddings: bool,
}

impl Needs {
    /// Nothing beyond the batch: `ObjectiveInfo::needs` of most objectives.
    pub fn nothing(_: &Settings) -> Needs {
        Needs::default()
    }

    /// The frozen retriever and nothing else.
    pub fn retriever(_: &Settings) -> Needs {
        Needs {
            retriever: true,
            image_embeddings: false,
        }
    }
}

impl ObjectiveInfo {
    /// "name (setting: value, ...)" over its own settings in `settings`
    /// (defaults for those not given), as the log's `objective` field and
    /// the app show it.
    pub fn describe(&self, settings: &Settings) -> String {
        let values: Vec<String> = self
            .settings
            .iter()
            .map(|s| {
                let value = match settings.get(s.key).cloned().unwrap_or(s.default_value()) {
                    SettingValue::Number(v) => format!("{v}"),
                    SettingValue::Choice(c) => c,
                };
                format!("{}: {value}", s.key.replace('_', " "))
            })
            .collect();
        if values.is_empty() {
            self.name.into()
        } else {
            format!("{} ({})", self.name, values.join(", "))
        }
    }
}

/// What an objective's own term learns from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrainsOn {
    /// Each row's reference caption (or rewards against the image's
    /// references): trains on the labelled images.
    Captions,
    /// The images alone: trains on the unlabelled images when some are;
    /// an MLE mix reads [`TrainingBatch::references`].
    Images,
}

/// Logged series the app plots together.
#[derive(Debug)]
pub struct SeriesGroup {
    pub title: &'static str,
    pub series: &'static [&'static str],
}

/// One training step's batch as the host holds it.
pub struct TrainingBatch {
    /// The decoder's image inputs, one row per caption: `[batch, dim]`
    /// embeddings for a prefix decoder, `[batch, tokens, dim]` tokens for
    /// a cross-attending one.
    pub inputs: Vec<f32>,
    /// `[batch, dim]` unit embeddings in the retriever's space, where they
    /// are not the inputs (None: the inputs are the embeddings).
    pub embeddings: Option<Vec<f32>>,
    /// Each row's reference caption, encoded `<bos> .. <eos>` within the
    /// model's `max_len`.
    pub sequences: Vec<Vec<u32>>,
    /// Each row's image, as an index into the run's [`TrainingCorpus`]
    /// (whose references a metric reward scores samples against).
    pub images: Vec<usize>,
    /// Under a labelled fraction, a batch of unlabelled images (no
    /// `sequences`) carries a batch of labelled ones for an MLE mix.
    pub labelled: Option<Box<TrainingBatch>>,
}

impl TrainingBatch {
    /// The batch whose reference captions training may read: the
    /// labelled batch beside unlabelled images, else this one.
    pub fn references(&self) -> &TrainingBatch {
        self.labelled.as_deref().unwrap_or(self)
    }

    /// `[batch, dim]`: each row's image embedding in the retriever's space.
    pub fn embeddings(&self) -> &[f32] {
        self.embeddings.as_deref().unwrap_or(&self.inputs)
    }

    /// The size of an image embedding: what [`TrainingBatch::embeddings`]
    /// and [`DistinctImages::embeddings`] are sliced by.
    pub fn embedding_dim(&self) -> usize {
        self.embeddings().len() / self.images.len().max(1)
    }

    /// The batch's distinct images in order of first appearance.
    pub fn distinct_images(&self) -> DistinctImages {
        let rows = self.images.len().max(1);
        let (input, dim) = (self.inputs.len() / rows, self.embedding_dim());
        let mut out = DistinctImages::default();
        for (row, &image) in self.images.iter().enumerate() {
            if !out.images.contains(&image) {
                out.images.push(image);
                out.inputs
                    .extend_from_slice(&self.inputs[row * input..(row + 1) * input]);
                out.embeddings
                    .extend_from_slice(&self.embeddings()[row * dim..(row + 1) * dim]);
            }
        }
        out
    }

    /// Real target tokens (each caption's ids after `<bos>`): what the
    /// trainer's tokens/s counts.
    pub fn tokens(&self) -> usize {
        self.sequences
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .sum()
    }
}

/// A batch's distinct images ([`TrainingBatch::distinct_images`]).
#[derive(Debug, Default)]
pub struct DistinctImages {
    /// Indices into the corpus.
    pub images: Vec<usize>,
    /// Their decoder inputs.
    pub inputs: Vec<f32>,
    /// Their embeddings, `[images, dim]`.
    pub embeddings: Vec<f32>,
}

/// What an objective sees at one training step.
pub struct StepContext<'a, B: Backend> {
    pub b: &'a B,
    /// Its parameters' gradients are zero when the step begins. It also
    /// decodes and samples with the current weights (`decode::generate`).
    pub model: &'a mut Captioner<B>,
    pub vocab: &'a CaptionVocab,
    pub batch: &'a TrainingBatch,
    pub corpus: &'a TrainingCorpus,
    /// What the gradient (not a reported loss) is multiplied by: the
    /// batch's share of tokens when batches are formed by length, so that
    /// every token weighs what it would in a random batch
    /// (docs/training.md#batches); 1 elsewhere.
    pub gradient_weight: f32,
    /// The frozen retriever the run was given, if any (its weights are
    /// not trained).
    pub retriever: Option<&'a mut FrozenRetriever<B>>,
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

    /// What it carries from one step to the next (none by default), saved
    /// with the run's state so that a resumed run continues exactly.
    fn state(&self) -> Vec<f64> {
        Vec::new()
    }

    /// Where its last step's time went, by phase, for `captune bench`
    /// (none by default: the step is one phase).
    fn phases(&self) -> Vec<(&'static str, Duration)> {
        Vec::new()
    }

    /// What it makes of `cx.ids` as the caption of `cx.item` at a training
    /// step, from a fresh start (its own baselines not yet run); None when
    /// it rewards nothing (`ObjectiveInfo::explains`).
    fn explain(&mut self, _cx: &mut ExplainContext<'_, B>) -> Result<Option<Explanation>> {
        Ok(None)
    }

    /// Continues from a `state` it returned.
    fn restore(&mut self, state: &[f64]) -> Result<()> {
        if state.is_empty() {
            Ok(())
        } else {
            bail!(
                "{} carries no state, but {} values were saved",
                self.describe(),
                state.len()
            )
        }
    }
}
