//! Token-level training objectives (SMILE: Yue et al., "Learning
//! Descriptive Image Captioning via Semipermeable Maximum Likelihood
//! Estimation", NeurIPS 2023): MLE, SMILE and its
//! ablations. Each is a cross-entropy over a per-row vocabulary subset
//! (`VocabSubsets`): the whole vocabulary for MLE, the target sequence's
//! own tokens for SMILE, ten random ids for random subsetting, the
//! complement of the sequence's tokens for reverse subsetting (the label
//! always takes part). Every batch also reports the plain MLE and SMILE
//! losses, whichever objective trains, so runs can be compared.

use super::settings::{Setting, SettingKind, SettingValue, Settings};
use crate::backend::{Backend, Reduce, VocabSubsets};
use crate::captioner::inputs::{TokenInputs, teacher_targets};
use crate::captioner::objective::{
    MLE_WEIGHT, Needs, Objective, ObjectiveInfo, StepContext, TrainsOn,
};
use crate::captioner::{CaptionVocab, CaptionerConfig};
use crate::index::FULL_VOCAB;
use crate::ops::cross_entropy::CrossEntropy;
use anyhow::{Result, bail};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectiveKind {
    /// Cross-entropy over the full vocabulary.
    Mle,
    /// Cross-entropy over the unique tokens of the target sequence.
    Smile,
    /// Ablation: over 10 random ids (never `<pad>` or `<bos>`) plus the
    /// label, drawn per step.
    SmileRandom,
    /// Ablation: over the complement of the sequence's tokens, plus the label.
    SmileReverse,
}

/// How step 0 of a subset objective is trained (SMILE section 3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FirstToken {
    /// Step 0 uses the full vocabulary.
    Mle,
    /// Step 0's label becomes the word's reserved alternative id.
    Shift,
    /// Step 0 is subset like every other step.
    None,
}

/// How step 0 of a subset objective is trained (the `first_token` setting).
pub const FIRST_TOKEN: Setting = Setting {
    key: "first_token",
    label: "first token",
    help: "How step 0 is trained: mle (over the whole vocabulary), shift (its label becomes \
           the word's reserved alternative id), none (over the subset like every step)",
    kind: SettingKind::Choice {
        choices: &["mle", "shift", "none"],
        default: "mle",
    },
};

/// The SMILE family's fine-tuning rate: the demo's SMILE stage.
const SMILE_FINE_TUNE_LR: f32 = 5e-4;

pub const MLE: ObjectiveInfo = ObjectiveInfo {
    name: "mle",
    help: "cross-entropy over the full vocabulary",
    settings: &[],
    plots: &[],
    trains_on: TrainsOn::Captions,
    fine_tune_lr: None,
    reward: None,
    needs: Needs::nothing,
    explains: false,
};

pub const SMILE: ObjectiveInfo = ObjectiveInfo {
    name: "smile",
    help: "cross-entropy over the unique tokens of each target caption (SMILE)",
    settings: &[&FIRST_TOKEN, &MLE_WEIGHT],
    plots: &[],
    trains_on: TrainsOn::Captions,
    fine_tune_lr: Some(SMILE_FINE_TUNE_LR),
    reward: None,
    needs: Needs::nothing,
    explains: false,
};

pub const SMILE_RANDOM: ObjectiveInfo = ObjectiveInfo {
    name: "smile-random",
    help: "ablation: over 10 random ids plus the label, drawn per step",
    settings: &[&FIRST_TOKEN, &MLE_WEIGHT],
    plots: &[],
    trains_on: TrainsOn::Captions,
    fine_tune_lr: Some(SMILE_FINE_TUNE_LR),
    reward: None,
    needs: Needs::nothing,
    explains: false,
};

pub const SMILE_REVERSE: ObjectiveInfo = ObjectiveInfo {
    name: "smile-reverse",
    help: "ablation: over the ids the caption does not use, plus the label",
    settings: &[&FIRST_TOKEN, &MLE_WEIGHT],
    plots: &[],
    trains_on: TrainsOn::Captions,
    fine_tune_lr: Some(SMILE_FINE_TUNE_LR),
    reward: None,
    needs: Needs::nothing,
    explains: false,
};

/// Which token-level objective trains, and its settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenObjective {
    pub kind: ObjectiveKind,
    pub first_token: FirstToken,
    /// lambda in lambda * MLE + (1 - lambda) * subset loss; ignored by `mle`.
    pub mle_weight: f32,
}

impl TokenObjective {
    pub fn mle() -> Self {
        TokenObjective {
            kind: ObjectiveKind::Mle,
            first_token: FirstToken::Mle,
            mle_weight: 0.0,
        }
    }

    pub fn smile() -> Self {
        TokenObjective {
            kind: ObjectiveKind::Smile,
            ..TokenObjective::mle()
        }
    }

    /// The objective `name` (one of this file's) with `settings`.
    pub fn from_settings(name: &str, settings: &Settings) -> Result<Self> {
        use clap::ValueEnum;
        let kind = ObjectiveKind::from_str(name, false)
            .map_err(|_| anyhow::anyhow!("{name:?} is not a token-level objective"))?;
        let first = FIRST_TOKEN.choice(settings);
        let first_token = FirstToken::from_str(first, false)
            .map_err(|_| anyhow::anyhow!("first_token {first:?} is not mle, shift or none"))?;
        Ok(TokenObjective {
            kind,
            first_token,
            mle_weight: MLE_WEIGHT.number(settings) as f32,
        })
    }

    /// Whether the subset term is exactly the standard SMILE loss (which is
    /// computed anyway for the log).
    fn term_is_standard_smile(&self) -> bool {
        self.kind == ObjectiveKind::Smile && self.first_token == FirstToken::Mle
    }

    pub fn describe(&self) -> String {
        self.info().describe(&self.settings())
    }

    /// Its name among the objectives.
    pub fn name(&self) -> &'static str {
        self.info().name
    }

    /// Its declaration.
    fn info(&self) -> &'static ObjectiveInfo {
        match self.kind {
            ObjectiveKind::Mle => &MLE,
            ObjectiveKind::Smile => &SMILE,
            ObjectiveKind::SmileRandom => &SMILE_RANDOM,
            ObjectiveKind::SmileReverse => &SMILE_REVERSE,
        }
    }

    /// Its settings, as the config holds them.
    pub fn settings(&self) -> Settings {
        use clap::ValueEnum;
        let first = self.first_token.to_possible_value().expect("named");
        Settings::from([
            (
                FIRST_TOKEN.key.to_string(),
                SettingValue::Choice(first.get_name().to_string()),
            ),
            (
                MLE_WEIGHT.key.to_string(),
                // Through its shortest decimal, so that 0.3f32 stays 0.3.
                SettingValue::Number(self.mle_weight.to_string().parse().expect("a number")),
            ),
        ])
    }
}

/// Ids drawn per step by random subsetting.
pub const RANDOM_SUBSET_SIZE: usize = 10;

/// One batch's subsets as host data: `row_subset[r]` indexes `subsets` or
/// is [`FULL_VOCAB`]; `targets` are the labels the loss uses (shifted at
/// step 0 under first-token shifting).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsetPlan {
    pub targets: Vec<u32>,
    pub subsets: Vec<Vec<u32>>,
    pub row_subset: Vec<u32>,
}

/// Plans the subsets of `kind` for `[batch, steps]` targets (the
/// vocabulary's padding id after the end). `rng` draws random subsets.
pub fn plan(
    kind: ObjectiveKind,
    first_token: FirstToken,
    vocab: &CaptionVocab,
    config: &CaptionerConfig,
    targets: &[u32],
    steps: usize,
    rng: &mut impl Rng,
) -> SubsetPlan {
    let mut targets = targets.to_vec();
    if first_token == FirstToken::Shift && kind != ObjectiveKind::Mle {
        for seq in targets.chunks_mut(steps) {
            if let Some(alt) = vocab.alternative(seq[0]) {
                seq[0] = alt;
            }
        }
    }
    let (v, specials) = (config.vocab_size as u32, config.specials);
    let mut subsets = Vec::new();
    let mut row_subset = vec![FULL_VOCAB; targets.len()];
    for (s, seq) in targets.chunks(steps).enumerate() {
        let own: BTreeSet<u32> = seq
            .iter()
            .copied()
            .filter(|&id| id != specials.pad)
            .collect();
        let rows = s * steps..(s + 1) * steps;
        match kind {
            ObjectiveKind::Mle => continue,
            ObjectiveKind::Smile | ObjectiveKind::SmileReverse => {
                let subset: Vec<u32> = if kind == ObjectiveKind::Smile {
                    own.into_iter().collect()
                } else {
                    (0..v).filter(|id| !own.contains(id)).collect()
                };
                row_subset[rows].fill(subsets.len() as u32);
                subsets.push(subset);
            }
            ObjectiveKind::SmileRandom => {
                for (t, &label) in seq.iter().enumerate() {
                    if label == specials.pad {
                        continue;
                    }
                    // Ids of the policy (no padding, no start) besides the label.
                    let others = v as usize - 1 - specials.masked_distinct().len();
                    let mut drawn = BTreeSet::new();
                    while drawn.len() < RANDOM_SUBSET_SIZE.min(others) {
                        let id = rng.random_range(0..v);
                        if id != label && !specials.is_masked(id) {
                            drawn.insert(id);
                        }
                    }
                    row_subset[s * steps + t] = subsets.len() as u32;
                    subsets.push(drawn.into_iter().collect());
                }
            }
        }
        if first_token == FirstToken::Mle {
            row_subset[s * steps] = FULL_VOCAB;
        }
    }
    SubsetPlan {
        targets,
        subsets,
        row_subset,
    }
}

/// A batch's targets on the device, for every loss `Losses` computes.
pub struct BatchTargets<B: Backend> {
    /// The true next tokens, the padding id where there is none.
    pub targets: B::Ids,
    pub weights: Vec<f32>,
    /// What the gradient (not the reported loss, a per-token mean) is
    /// multiplied by: 1, or the batch's share of tokens when batches are
    /// formed by length (`Trainer`), so that every token weighs what it
    /// would in a random batch.
    pub gradient_weight: f32,
    full: VocabSubsets<B>,
    smile: VocabSubsets<B>,
    /// The objective's own labels and subsets, where they differ from
    /// both plain MLE and standard SMILE.
    term: Option<(B::Ids, VocabSubsets<B>)>,
}

impl<B: Backend> BatchTargets<B> {
    /// `vocab` gives the first-token alternatives; `config`, the model's
    /// ids.
    pub fn new(
        b: &B,
        objective: &TokenObjective,
        vocab: &CaptionVocab,
        config: &CaptionerConfig,
        targets: &[u32],
        steps: usize,
        rng: &mut impl Rng,
    ) -> Result<Self> {
        let shifts =
            objective.first_token == FirstToken::Shift && objective.kind != ObjectiveKind::Mle;
        if shifts && !vocab.has_alternatives() {
            bail!(
                "first_token = shift trains step 0 towards a word's reserved alternative id, and \
                 this vocabulary has none (a pretrained decoder's pieces have none): use \
                 --first-token mle or none"
            );
        }
        let (v, pad) = (config.vocab_size, config.specials.pad);
        let weights = targets
            .iter()
            .map(|&id| if id == pad { 0.0 } else { 1.0 })
            .collect();
        let device_plan = |p: &SubsetPlan| -> Result<(B::Ids, VocabSubsets<B>)> {
            Ok((
                b.ids(&p.targets),
                VocabSubsets::new(b, v, &p.subsets, &p.row_subset)?,
            ))
        };
        let standard = plan(
            ObjectiveKind::Smile,
            FirstToken::Mle,
            vocab,
            config,
            targets,
            steps,
            rng,
        );
        let term = match objective.kind {
            ObjectiveKind::Mle => None,
            _ if objective.term_is_standard_smile() => None,
            kind => Some(device_plan(&plan(
                kind,
                objective.first_token,
                vocab,
                config,
                targets,
                steps,
                rng,
            ))?),
        };
        Ok(BatchTargets {
            targets: b.ids(targets),
            weights,
            gradient_weight: 1.0,
            full: VocabSubsets::full(b, targets.len()),
            smile: device_plan(&standard)?.1,
            term,
        })
    }
}

/// The losses of one batch: plain MLE and standard SMILE always, and the
/// objective's own term when it is neither.
pub struct Losses<B: Backend> {
    pub objective: TokenObjective,
    mle: CrossEntropy<B>,
    smile: CrossEntropy<B>,
    term: CrossEntropy<B>,
    pub d_logits: B::Tensor,
    /// Where `read` gathers the losses, so that reading them costs one
    /// readback.
    gathered: B::Tensor,
}

/// The loss buffers of every batch width (token positions) trained so
/// far, each made on first use: trimmed batches come in a few widths.
pub struct LossesByWidth<B: Backend> {
    objective: TokenObjective,
    vocab: usize,
    by_width: Vec<(usize, Losses<B>)>,
}

impl<B: Backend> LossesByWidth<B> {
    pub fn new(objective: TokenObjective, vocab: usize) -> Self {
        LossesByWidth {
            objective,
            vocab,
            by_width: Vec::new(),
        }
    }

    /// The buffers for batches shaped as `inputs`.
    pub fn of(&mut self, b: &B, inputs: &TokenInputs<B>) -> &mut Losses<B> {
        let at = match self.position(inputs.positions) {
            Some(at) => at,
            None => {
                let losses = Losses::new(b, self.objective, inputs.rows(), self.vocab);
                self.by_width.push((inputs.positions, losses));
                self.by_width.len() - 1
            }
        };
        &mut self.by_width[at].1
    }

    /// The buffers of batches `positions` wide, if one was trained.
    pub fn width(&self, positions: usize) -> Option<&Losses<B>> {
        Some(&self.by_width[self.position(positions)?].1)
    }

    fn position(&self, positions: usize) -> Option<usize> {
        self.by_width.iter().position(|(p, _)| *p == positions)
    }
}

/// Loss values read back for the log.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LossValues {
    /// What the objective minimises.
    pub loss: f32,
    pub mle: f32,
    pub smile: f32,
}

impl<B: Backend> Losses<B> {
    pub fn new(b: &B, objective: TokenObjective, rows: usize, vocab: usize) -> Self {
        Losses {
            objective,
            mle: CrossEntropy::new(b, rows, vocab),
            smile: CrossEntropy::new(b, rows, vocab),
            term: CrossEntropy::new(b, rows, vocab),
            d_logits: b.zeros(rows * vocab),
            gathered: b.zeros(3),
        }
    }

    /// (lambda for MLE, 1 - lambda for the subset term).
    fn mix(&self) -> (f32, f32) {
        match self.objective.kind {
            ObjectiveKind::Mle => (1.0, 0.0),
            _ => (self.objective.mle_weight, 1.0 - self.objective.mle_weight),
        }
    }

    /// The objective's losses on `logits`, then `d_logits` = its
    /// gradient. With `monitor`, also the losses it does not train on
    /// (plain MLE and standard SMILE are always logged), for a step whose
    /// losses are read; without, a step skips their softmax passes and
    /// every loss's reduction.
    pub fn forward_backward(
        &mut self,
        b: &B,
        logits: &B::Tensor,
        t: &BatchTargets<B>,
        monitor: bool,
    ) {
        let (lambda, rest) = self.mix();
        for ce in [&mut self.mle, &mut self.smile, &mut self.term] {
            ce.set_weights(b, &t.weights, 1.0);
        }
        if monitor || lambda > 0.0 {
            self.mle.forward(b, logits, &t.targets, &t.full, monitor);
        }
        if monitor || (rest > 0.0 && t.term.is_none()) {
            self.smile.forward(b, logits, &t.targets, &t.smile, monitor);
        }
        if let Some((targets, subsets)) = &t.term {
            self.term.forward(b, logits, targets, subsets, monitor);
        }
        // The first loss with a gradient writes d_logits, the next adds.
        let mut written = false;
        let w = t.gradient_weight;
        if lambda > 0.0 {
            self.mle.set_gradient_scale(b, lambda * w);
            self.mle
                .backward(b, logits, &t.targets, &t.full, &mut self.d_logits, written);
            written = true;
        }
        if rest > 0.0 {
            match &t.term {
                Some((targets, subsets)) => {
                    self.term.set_gradient_scale(b, rest * w);
                    self.term
                        .backward(b, logits, targets, subsets, &mut self.d_logits, written);
                }
                None => {
                    self.smile.set_gradient_scale(b, rest * w);
                    self.smile.backward(
                        b,
                        logits,
                        &t.targets,
                        &t.smile,
                        &mut self.d_logits,
                        written,
                    );
                }
            }
            written = true;
        }
        if !written {
            b.fill(&mut self.d_logits, 0.0);
        }
    }

    /// Reads the losses back (this waits for the device); the last
    /// `forward_backward` must have monitored them.
    pub fn read(&mut self, b: &B, t: &BatchTargets<B>) -> LossValues {
        let scalars = [&self.mle.loss, &self.smile.loss, &self.term.loss];
        for (slot, x) in scalars.into_iter().enumerate() {
            b.reduce(x, Reduce::Sum, &mut self.gathered, slot);
        }
        let got = b.to_vec(&self.gathered);
        self.values([got[0], got[1], got[2]], t.term.is_some())
    }

    /// The MLE, SMILE and own-term losses on the device.
    fn scalars(&self) -> [&B::Tensor; 3] {
        [&self.mle.loss, &self.smile.loss, &self.term.loss]
    }

    /// The values of `scalars`, read, as the losses; `has_term`: the
    /// batch had a term of its own.
    fn values(&self, [mle, smile, term]: [f32; 3], has_term: bool) -> LossValues {
        let term = if has_term { term } else { smile };
        let (lambda, rest) = self.mix();
        LossValues {
            loss: lambda * mle + rest * term,
            mle,
            smile,
        }
    }

    /// log p(target) per row under the full vocabulary and under the
    /// standard SMILE subset, as the last forward computed them (the
    /// decoding tests' teacher-forced reference).
    pub fn row_logprobs(&self, b: &B) -> (Vec<f32>, Vec<f32>) {
        (b.to_vec(&self.mle.logp), b.to_vec(&self.smile.logp))
    }
}

/// MLE and the SMILE family as an [`Objective`]: teacher forcing on each
/// row's reference caption, the batch trimmed to its longest caption.
pub struct TokenLevel<B: Backend> {
    config: TokenObjective,
    losses: LossesByWidth<B>,
    /// The last step's width (token positions) and whether its batch had
    /// a term of its own.
    last: Option<(usize, bool)>,
}

impl<B: Backend> TokenLevel<B> {
    pub fn new(config: TokenObjective, vocab: usize) -> Self {
        TokenLevel {
            config,
            losses: LossesByWidth::new(config, vocab),
            last: None,
        }
    }

    fn last_losses(&self) -> (&Losses<B>, bool) {
        let (width, has_term) = self.last.expect("a step before its log");
        let losses = self.losses.width(width).expect("the last step's buffers");
        (losses, has_term)
    }
}

impl<B: Backend> Objective<B> for TokenLevel<B> {
    fn describe(&self) -> String {
        self.config.describe()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> Result<()> {
        let b = cx.b;
        // An MLE mix beside images without captions reads the labelled batch.
        let batch = cx.batch.references();
        let sequences = &batch.sequences;
        let inputs = TokenInputs::trimmed(b, &cx.model.config, sequences)?;
        let steps = inputs.positions;
        let ids = teacher_targets(sequences, steps, cx.model.config.specials.pad);
        let mut targets = BatchTargets::new(
            b,
            &self.config,
            cx.vocab,
            &cx.model.config,
            &ids,
            steps,
            cx.rng,
        )?;
        targets.gradient_weight = cx.gradient_weight;
        cx.model.forward(b, &batch.inputs, &inputs)?;
        let losses = self.losses.of(b, &inputs);
        losses.forward_backward(b, cx.model.logits(), &targets, cx.monitor);
        cx.model.backward(b, &inputs, &losses.d_logits);
        self.last = Some((steps, targets.term.is_some()));
        Ok(())
    }

    fn logged(&self) -> Vec<&B::Tensor> {
        self.last_losses().0.scalars().to_vec()
    }

    fn report(&self, read: &[f32]) -> Vec<(&'static str, f32)> {
        let (losses, has_term) = self.last_losses();
        let v = losses.values([read[0], read[1], read[2]], has_term);
        vec![("loss", v.loss), ("mle", v.mle), ("smile", v.smile)]
    }
}
