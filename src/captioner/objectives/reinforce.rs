//! What the REINFORCE objectives share: the surrogate loss on the
//! device over captions the model generated, teacher-forced on them
//! ([`Surrogates::train`]); each token's part in it, for explanations
//! ([`token_terms`]); and the plot groups of rewards and samples.

use crate::backend::{Backend, Reduce};
use crate::captioner::CaptionVocab;
use crate::captioner::decode::Generated;
use crate::captioner::explain::TokenTerm;
use crate::captioner::inputs::{TokenInputs, teacher_targets};
use crate::captioner::model::Captioner;
use crate::captioner::objective::{SeriesGroup, StepContext};
use crate::ops::sequence_likelihood::SequenceLikelihood;
use anyhow::{Result, bail};

/// The reward, its baseline and the spread of the advantages (per caption).
pub const REWARDS_PLOT: SeriesGroup = SeriesGroup {
    title: "rewards (per sampled caption)",
    series: &["reward", "baseline", "advantage_spread"],
};

/// What the samples look like: entropy of the sampled steps, words, and
/// the share of a caption's words its most frequent word takes.
pub const SAMPLES_PLOT: SeriesGroup = SeriesGroup {
    title: "samples: entropy (nats per step), length (words), repetition",
    series: &["entropy", "sample_length", "repetition"],
};

/// The surrogate loss on the device: -(1/N) sum_j A_j sum_t log p(y_jt)
/// minus `entropy_weight` times the mean entropy of the sampled steps'
/// next-token distributions; `d_logits` its gradient.
pub struct Surrogate<B: Backend> {
    pub likelihood: SequenceLikelihood<B>,
    /// The padding id: targets that count for nothing.
    pad: u32,
    advantages: B::Tensor,
    /// 1 / (real tokens) on each real token's row, 0 on padding.
    token_mean: B::Tensor,
    /// d loss / d entropy[r]: -entropy_weight * token_mean[r].
    d_entropy: B::Tensor,
    entropy: B::Tensor,
    lse: B::Tensor,
    weighted: B::Tensor,
    /// The mean entropy over real tokens, one element.
    pub mean_entropy: B::Tensor,
    pub d_logits: B::Tensor,
}

impl<B: Backend> Surrogate<B> {
    pub fn new(b: &B, sequences: usize, per_sequence: usize, vocab: usize, pad: u32) -> Self {
        let rows = sequences * per_sequence;
        Surrogate {
            likelihood: SequenceLikelihood::new(b, sequences, per_sequence, vocab, pad),
            pad,
            advantages: b.zeros(sequences),
            token_mean: b.zeros(rows),
            d_entropy: b.zeros(rows),
            entropy: b.zeros(rows),
            lse: b.zeros(rows),
            weighted: b.zeros(rows),
            mean_entropy: b.zeros(1),
            d_logits: b.zeros(rows * vocab),
        }
    }

    /// The loss of `logits` for the sampled `targets` (host copy
    /// `host_targets`, padding after each sequence's end) and `advantages`
    /// (one per sequence, already scaled as the gradient should be);
    /// `d_logits` its gradient. With `monitor`, also the mean entropy
    /// when it is not trained.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward(
        &mut self,
        b: &B,
        logits: &B::Tensor,
        targets: &B::Ids,
        host_targets: &[u32],
        advantages: &[f32],
        entropy_weight: f32,
        monitor: bool,
    ) {
        let l = &mut self.likelihood;
        let vocab = l.vocab;
        b.write(&mut self.advantages, advantages);
        l.forward(
            b,
            logits,
            targets,
            &self.advantages,
            advantages.len() as f32,
        );
        l.backward(b, logits, targets, &mut self.d_logits, false);
        if entropy_weight == 0.0 && !monitor {
            return;
        }
        let pad = self.pad;
        let real = host_targets.iter().filter(|&&t| t != pad).count().max(1) as f32;
        let token_mean: Vec<f32> = host_targets
            .iter()
            .map(|&t| if t == pad { 0.0 } else { 1.0 / real })
            .collect();
        b.write(&mut self.token_mean, &token_mean);
        b.softmax_entropy(logits, vocab, &mut self.entropy, &mut self.lse);
        b.mul(1.0, &self.token_mean, &self.entropy, &mut self.weighted);
        b.reduce(&self.weighted, Reduce::Sum, &mut self.mean_entropy, 0);
        if entropy_weight != 0.0 {
            let d: Vec<f32> = token_mean.iter().map(|m| -entropy_weight * m).collect();
            b.write(&mut self.d_entropy, &d);
            b.softmax_entropy_backward(
                logits,
                vocab,
                &self.entropy,
                &self.lse,
                &self.d_entropy,
                &mut self.d_logits,
                true,
            );
        }
    }
}

/// The surrogate's buffers for each (sequences, positions) shape seen,
/// and REINFORCE's update on generated captions.
pub struct Surrogates<B: Backend> {
    shapes: Vec<((usize, usize), Surrogate<B>)>,
    /// The last step's.
    last: usize,
}

impl<B: Backend> Default for Surrogates<B> {
    fn default() -> Self {
        Surrogates {
            shapes: Vec::new(),
            last: 0,
        }
    }
}

impl<B: Backend> Surrogates<B> {
    /// The last step's surrogate (its loss and mean entropy).
    pub fn last(&self) -> &Surrogate<B> {
        &self.shapes[self.last].1
    }

    /// Teacher-forces the model on its own `generated` captions (of the
    /// images whose decoder `inputs` they were generated from) and adds the
    /// gradient of -(1/N) sum_j advantages[j] sum_t log p(y_jt) minus
    /// `entropy_weight` times the mean entropy of the generated steps.
    pub fn train(
        &mut self,
        cx: &mut StepContext<'_, B>,
        inputs: &[f32],
        generated: &[Generated],
        advantages: &[f32],
        entropy_weight: f32,
    ) -> Result<()> {
        let b = cx.b;
        let specials = cx.model.config.specials;
        let sequences: Vec<Vec<u32>> = generated
            .iter()
            .map(|g| {
                std::iter::once(specials.start)
                    .chain(g.ids.iter().copied())
                    .collect()
            })
            .collect();
        let dim = cx.model.config.image_input_len();
        let repeated: Vec<f32> = generated
            .iter()
            .flat_map(|g| inputs[g.image * dim..(g.image + 1) * dim].iter().copied())
            .collect();
        let inputs = TokenInputs::trimmed(b, &cx.model.config, &sequences)?;
        let host_targets = teacher_targets(&sequences, inputs.positions, specials.pad);
        let targets = b.ids(&host_targets);
        cx.model.forward(b, &repeated, &inputs)?;
        let vocab = cx.model.config.vocab_size;
        let key = (sequences.len(), inputs.positions);
        self.last = match self.shapes.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let s = Surrogate::new(b, sequences.len(), inputs.positions, vocab, specials.pad);
                self.shapes.push((key, s));
                self.shapes.len() - 1
            }
        };
        let surrogate = &mut self.shapes[self.last].1;
        surrogate.forward_backward(
            b,
            cx.model.logits(),
            &targets,
            &host_targets,
            advantages,
            entropy_weight,
            cx.monitor,
        );
        cx.model.backward(b, &inputs, &surrogate.d_logits);
        Ok(())
    }
}

/// Each token of `ids` (`<bos> .. <eos>`) as a caption of the image whose
/// decoder input is `image` under the current weights: its log p and entropy,
/// and its terms of a REINFORCE loss, -`weight` * log p and
/// -`entropy_weight` * entropy.
pub fn token_terms<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    vocab: &CaptionVocab,
    image: &[f32],
    ids: &[u32],
    weight: f64,
    entropy_weight: f64,
) -> Result<Vec<TokenTerm>> {
    let inputs = TokenInputs::new(b, &model.config, &[ids[..ids.len() - 1].to_vec()])?;
    if ids.len() - 1 > inputs.positions {
        bail!(
            "a caption of {} ids needs {} positions, and the captioner has {}: encode it \
             with the model's max_len",
            ids.len(),
            ids.len() - 1,
            inputs.positions
        );
    }
    model.forward(b, image, &inputs)?;
    let v = model.config.vocab_size;
    let logits = b.to_vec(model.logits());
    Ok(ids[1..]
        .iter()
        .enumerate()
        .map(|(t, &label)| {
            let z = &logits[t * v..(t + 1) * v];
            let max = z.iter().fold(f32::MIN, |m, &x| m.max(x)) as f64;
            let lse = max + z.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            let entropy: f64 = z
                .iter()
                .map(|&x| {
                    let lp = x as f64 - lse;
                    -lp.exp() * lp
                })
                .sum();
            let logprob = z[label as usize] as f64 - lse;
            TokenTerm {
                token: vocab.label(label),
                logprob: logprob as f32,
                likelihood_term: (-weight * logprob) as f32,
                entropy: entropy as f32,
                entropy_term: (-entropy_weight * entropy) as f32,
            }
        })
        .collect())
}
