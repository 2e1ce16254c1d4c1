//! Training objectives behind one trait. An objective gets a step's
//! context (the model with its parameters and workspaces, which also
//! decodes and samples with the current weights; the batch as the host
//! holds it, references included; the vocabulary; the frozen retriever
//! when the run has one; a generator seeded for the step),
//! accumulates its gradient into the model's parameter gradients, and
//! names the values it logs. The trainer zeroes the gradients before and
//! runs the optimiser after; the log line, the run folder and the app take
//! whatever names an objective reports, so a new objective is a file here
//! (or in a test) and needs no change elsewhere.
//!
//! - [`token`]: MLE and the SMILE family (teacher-forced, token-level).
//! - [`sequence`]: SCST, SLL-ME and SLE (REINFORCE on sampled captions).
//! - [`discritune`]: DiscriTune (REINFORCE with the frozen retriever's
//!   discriminative reward).
//! - [`relevance`]: CLIP relevance (Gumbel-softmax captions through the
//!   frozen text tower).
//!
//! An objective is known by name through [`OBJECTIVES`], with its settings
//! declared there once ([`settings`]); [`build`] makes one from a name and
//! settings. Adding an objective: its file, an entry in `OBJECTIVES` and
//! an arm in `build`.

pub mod discritune;
pub mod relevance;
pub mod sequence;
pub mod settings;
pub mod token;

use super::CaptionVocab;
use super::collapse::RewardWatch;
use super::model::Captioner;
use crate::backend::Backend;
use crate::data::{Dataset, Split};
use crate::retriever::Checkpoint as RetrieverCheckpoint;
use anyhow::{Result, bail};
use rand_chacha::ChaCha8Rng;
use settings::{Setting, Settings};

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

/// Every objective's series groups, each once, in the order of `OBJECTIVES`.
pub fn series_groups() -> Vec<&'static SeriesGroup> {
    let mut all: Vec<&'static SeriesGroup> = Vec::new();
    for g in OBJECTIVES.iter().flat_map(|o| o.plots.iter()) {
        if !all.iter().any(|d| d.title == g.title) {
            all.push(g);
        }
    }
    all
}

/// Every objective, by name.
pub const OBJECTIVES: [&ObjectiveInfo; 9] = [
    &token::MLE,
    &token::SMILE,
    &token::SMILE_RANDOM,
    &token::SMILE_REVERSE,
    &sequence::SCST,
    &sequence::SLL_ME,
    &sequence::SLE,
    &discritune::DISCRITUNE,
    &relevance::CLIP_RELEVANCE,
];

/// The objective called `name`.
pub fn find(name: &str) -> Result<&'static ObjectiveInfo> {
    match OBJECTIVES.iter().find(|o| o.name == name) {
        Some(info) => Ok(info),
        None => {
            let names: Vec<&str> = OBJECTIVES.iter().map(|o| o.name).collect();
            bail!(
                "no objective {name:?}; the objectives are {}",
                names.join(", ")
            )
        }
    }
}

/// The peak learning rate of a run of objective `name` when none is
/// given: its fine-tuning rate when the run starts from a checkpoint and
/// the objective declares one, else `config_lr`.
pub fn default_lr(name: &str, from_checkpoint: bool, config_lr: f32) -> f32 {
    let declared = find(name).ok().and_then(|o| o.fine_tune_lr);
    match declared {
        Some(lr) if from_checkpoint => lr,
        _ => config_lr,
    }
}

/// Every setting some objective declares, each key once, in the order
/// of `OBJECTIVES`.
pub fn declared_settings() -> Vec<&'static Setting> {
    let mut all: Vec<&'static Setting> = Vec::new();
    for s in OBJECTIVES.iter().flat_map(|o| o.settings.iter()) {
        if !all.iter().any(|d| d.key == s.key) {
            all.push(s);
        }
    }
    all
}

/// Refuses a key no objective declares and a value its declaration
/// refuses; `origin` names where they came from. Keys of other
/// objectives than the one training are kept, for a switch back.
pub fn check_settings(settings: &Settings, origin: &str) -> Result<()> {
    let declared = declared_settings();
    for (key, value) in settings {
        let Some(setting) = declared.iter().find(|s| s.key == key) else {
            let keys: Vec<&str> = declared.iter().map(|s| s.key).collect();
            bail!(
                "{origin}: unknown key {key:?}; besides the training fields, [train] takes the \
                 objectives' settings: {}",
                keys.join(", ")
            );
        };
        if let Some(why) = setting.refuse(value) {
            bail!("{origin}: {key}: {why}");
        }
    }
    Ok(())
}

/// "name (setting: value, ...)" over the objective's own settings, as
/// the log's `objective` field and the app show it.
pub fn describe(name: &str, settings: &Settings) -> String {
    let Ok(info) = find(name) else {
        return name.into();
    };
    let values: Vec<String> = info
        .settings
        .iter()
        .map(|s| {
            let value = match settings.get(s.key).cloned().unwrap_or(s.default_value()) {
                settings::SettingValue::Number(v) => format!("{v}"),
                settings::SettingValue::Choice(c) => c,
            };
            format!("{}: {value}", s.key.replace('_', " "))
        })
        .collect();
    if values.is_empty() {
        name.into()
    } else {
        format!("{name} ({})", values.join(", "))
    }
}

/// The objective `name` with `settings` (defaults for those not given),
/// for a vocabulary of `vocab` ids.
pub fn build<B: Backend>(
    name: &str,
    settings: &Settings,
    vocab: usize,
) -> Result<Box<dyn Objective<B>>> {
    let info = find(name)?;
    check_settings(settings, &format!("objective {name}"))?;
    Ok(match info.name {
        "mle" | "smile" | "smile-random" | "smile-reverse" => Box::new(token::TokenLevel::new(
            token::TokenObjective::from_settings(info.name, settings)?,
            vocab,
        )),
        "scst" | "sll-me" | "sle" => {
            Box::new(sequence::SequenceLevel::new(info.name, settings, vocab)?)
        }
        "discritune" => Box::new(discritune::DiscriTune::new(settings, vocab)),
        "clip-relevance" => Box::new(relevance::ClipRelevance::new(settings, vocab)),
        other => unreachable!("objective {other} is listed but not built"),
    })
}

/// One training step's batch as the host holds it.
pub struct TrainingBatch {
    /// `[batch, embed_dim]` image embeddings, one row per caption.
    pub features: Vec<f32>,
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

/// The training split as objectives see it beyond one batch: every
/// training image's references, over which statistics (CIDEr-D's
/// document frequencies) are computed once.
#[derive(Clone, Debug, Default)]
pub struct TrainingCorpus {
    /// The data set's name (part of the on-disk cache's key).
    pub name: String,
    /// Every training image's reference captions as PTB tokens, by the
    /// index `TrainingBatch::images` gives.
    pub references: Vec<Vec<Vec<String>>>,
    /// Every training image's embedding `[images, embed_dim]` (unit
    /// rows), in the same order; empty where no objective needs them.
    pub image_embeddings: Vec<f32>,
}

impl TrainingCorpus {
    /// The training split of `data`, and the item of each corpus image.
    pub fn training_split(data: &Dataset) -> (TrainingCorpus, Vec<usize>) {
        let items: Vec<usize> = (0..data.items.len())
            .filter(|&i| data.items[i].split == Split::Train)
            .collect();
        let references = items
            .iter()
            .map(|&i| {
                let captions = &data.items[i].captions;
                captions.iter().map(|c| c.tokens.clone()).collect()
            })
            .collect();
        let corpus = TrainingCorpus {
            name: data.name.clone(),
            references,
            image_embeddings: Vec::new(),
        };
        (corpus, items)
    }
}

impl TrainingBatch {
    /// The batch whose reference captions training may read: the
    /// labelled batch beside unlabelled images, else this one.
    pub fn references(&self) -> &TrainingBatch {
        self.labelled.as_deref().unwrap_or(self)
    }

    /// The batch's distinct images in order of first appearance, as
    /// indices into the corpus, and their embeddings `[images, dim]`.
    pub fn distinct_images(&self, dim: usize) -> (Vec<usize>, Vec<f32>) {
        let mut images: Vec<usize> = Vec::new();
        let mut features: Vec<f32> = Vec::new();
        for (row, &image) in self.images.iter().enumerate() {
            if !images.contains(&image) {
                images.push(image);
                features.extend_from_slice(&self.features[row * dim..(row + 1) * dim]);
            }
        }
        (images, features)
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
    pub retriever: Option<&'a mut RetrieverCheckpoint<B>>,
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
