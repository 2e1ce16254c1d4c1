//! DiscriTune (Dessì et al., "Cross-Domain Image Captioning with
//! Discriminative Finetuning", CVPR 2023): the frozen
//! retriever is the listener. Each image of the batch gets one caption
//! (greedy, as in the paper, or one sample), the retriever's text tower
//! embeds its words, and its reward is the log
//! probability, at the retriever's learned scale, that the retriever picks
//! the caption's own image among the candidates: the batch's images plus,
//! optionally, the k training images nearest the target by image-embedding
//! cosine (hard negatives). The baseline is the running mean of all past
//! rewards; the loss -(R - b) mean_t log p(w_t) (`<eos>` included) over
//! the batch's captions goes through REINFORCE's surrogate on the device.
//! No gradient flows into the retriever.

use super::reinforce::{REWARDS_PLOT, SAMPLES_PLOT, Surrogates, token_terms};
use super::settings::{Setting, SettingKind, Settings};
use crate::backend::Backend;
use crate::captioner::collapse::{RewardWatch, repetition};
use crate::captioner::decode::{DecodeOptions, Decoding, generate};
use crate::captioner::explain::{Compared, ExplainContext, Explanation, Figures};
use crate::captioner::listener::{embed_generated, frozen_retriever};
use crate::captioner::objective::{
    MLE_WEIGHT, Needs, Objective, ObjectiveInfo, SeriesGroup, StepContext, TrainsOn,
};
use crate::retriever::neighbours::Neighbours;
use anyhow::{Result, bail};
use rand::Rng;

pub const HARD_NEGATIVES: Setting = Setting {
    key: "hard_negatives",
    label: "hard negatives",
    help: "DiscriTune: each caption's candidates are the batch's images plus this many \
           training images nearest its own by image-embedding cosine (one already in the batch \
           counts once)",
    kind: SettingKind::Number {
        min: 0.0,
        max: 64.0,
        default: 0.0,
    },
};

pub const CAPTION_DECODING: Setting = Setting {
    key: "caption_decoding",
    label: "captions",
    help: "DiscriTune: the caption the retriever judges: greedy (the paper) or one sample at \
           temperature 1",
    kind: SettingKind::Choice {
        choices: &["greedy", "sample"],
        default: "greedy",
    },
};

pub const DISCRITUNE_ENTROPY: Setting = Setting {
    key: "discritune_entropy",
    label: "entropy weight",
    help: "DiscriTune: the loss minus this times the mean entropy of the next-token \
           distribution over the captions' tokens (0: none, as in the paper)",
    kind: SettingKind::Number {
        min: 0.0,
        max: 1.0,
        default: 0.0,
    },
};

/// Where the caption's own image ranks among its candidates.
pub const RANK_PLOT: SeriesGroup = SeriesGroup {
    title: "retrieval: the caption's rank among its candidates (1: first)",
    series: &["rank"],
};

/// How often the retriever picks the caption's own image.
pub const ACCURACY_PLOT: SeriesGroup = SeriesGroup {
    title: "retrieval accuracy (own image first among the candidates)",
    series: &["accuracy"],
};

pub const DISCRITUNE: ObjectiveInfo = ObjectiveInfo {
    name: "discritune",
    help: "discriminative fine-tuning: REINFORCE with the frozen retriever's log probability \
           of picking the caption's own image among the batch's (and hard negatives); needs \
           --retriever, the encoder of --features",
    settings: &[
        &HARD_NEGATIVES,
        &CAPTION_DECODING,
        &DISCRITUNE_ENTROPY,
        &MLE_WEIGHT,
    ],
    plots: &[&REWARDS_PLOT, &RANK_PLOT, &ACCURACY_PLOT, &SAMPLES_PLOT],
    trains_on: TrainsOn::Images,
    // With the shapes world's retriever; a weak retriever needs less
    // (2e-6 on Flickr8k: docs/training.md#discritune).
    fine_tune_lr: Some(2e-5),
    // A log-probability near 0 has no useful half: a collapse is the own
    // image's probability quartered (ln 4).
    reward: Some(RewardWatch {
        series: "reward",
        min_drop: 1.386,
    }),
    needs: discritune_needs,
    explains: true,
};

/// The frozen retriever, and with hard negatives every training image's
/// embedding (the nearest ones are mined among them).
fn discritune_needs(settings: &Settings) -> Needs {
    Needs {
        retriever: true,
        image_embeddings: HARD_NEGATIVES.number(settings) > 0.0,
    }
}

/// DiscriTune's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DiscriTuneConfig {
    pub hard_negatives: usize,
    /// One sample per image instead of the greedy caption.
    pub sample: bool,
    pub entropy_weight: f32,
    pub mle_weight: f32,
}

impl DiscriTuneConfig {
    pub fn from_settings(settings: &Settings) -> Self {
        DiscriTuneConfig {
            hard_negatives: HARD_NEGATIVES.number(settings).round() as usize,
            sample: CAPTION_DECODING.choice(settings) == "sample",
            entropy_weight: DISCRITUNE_ENTROPY.number(settings) as f32,
            mle_weight: MLE_WEIGHT.number(settings) as f32,
        }
    }
}

/// A caption's reward and where its own image ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judged {
    /// log softmax over the candidates of scale * cosine, at the own image.
    pub reward: f64,
    /// 1 + the candidates whose cosine is at least the own image's.
    pub rank: usize,
}

/// DiscriTune's reward: `own` the cosine of the caption with its image,
/// `others` with each other candidate, at the retriever's `scale`.
pub fn judge(scale: f64, own: f64, others: &[f64]) -> Judged {
    let logits = std::iter::once(own)
        .chain(others.iter().copied())
        .map(|c| scale * c);
    let max = logits.clone().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + logits.map(|z| (z - max).exp()).sum::<f64>().ln();
    Judged {
        reward: scale * own - lse,
        rank: 1 + others.iter().filter(|&&c| c >= own).count(),
    }
}

/// The running mean of every reward seen: a step's baseline is the mean
/// of the rewards of all earlier steps (the first step's, its own mean).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunningMean {
    sum: f64,
    count: u64,
}

impl RunningMean {
    /// The sum and the count, as a run's state saves them.
    pub fn saved(&self) -> Vec<f64> {
        vec![self.sum, self.count as f64]
    }

    /// From `saved`'s values.
    pub fn from_saved(values: &[f64]) -> Result<Self> {
        match *values {
            [sum, count] if count >= 0.0 && count.fract() == 0.0 && sum.is_finite() => {
                Ok(RunningMean {
                    sum,
                    count: count as u64,
                })
            }
            _ => {
                bail!("discritune's saved baseline is not a sum and a count of rewards: {values:?}")
            }
        }
    }

    /// The baseline for a step with `rewards`, which then join the mean.
    pub fn baseline_then_add(&mut self, rewards: &[f64]) -> f64 {
        let baseline = if self.count == 0 {
            rewards.iter().sum::<f64>() / rewards.len().max(1) as f64
        } else {
            self.sum / self.count as f64
        };
        self.sum += rewards.iter().sum::<f64>();
        self.count += rewards.len() as u64;
        baseline
    }
}

/// The dot product of two unit rows.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// A step's figures for its log line.
#[derive(Clone, Copy, Debug, Default)]
struct StepFigures {
    reward: f64,
    baseline: f64,
    advantage_spread: f64,
    rank: f64,
    accuracy: f64,
    sample_length: f64,
    repetition: f64,
}

/// What is made on the first step from the run's retriever and corpus.
struct Listener {
    scale: f64,
    neighbours: Option<Neighbours>,
}

pub struct DiscriTune<B: Backend> {
    config: DiscriTuneConfig,
    described: String,
    listener: Option<Listener>,
    baseline: RunningMean,
    surrogates: Surrogates<B>,
    figures: StepFigures,
}

impl<B: Backend> DiscriTune<B> {
    pub fn new(settings: &Settings) -> Self {
        DiscriTune {
            config: DiscriTuneConfig::from_settings(settings),
            described: DISCRITUNE.describe(settings),
            listener: None,
            baseline: RunningMean::default(),
            surrogates: Surrogates::default(),
            figures: StepFigures::default(),
        }
    }
}

impl<B: Backend> Objective<B> for DiscriTune<B> {
    fn describe(&self) -> String {
        self.described.clone()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> Result<()> {
        let b = cx.b;
        let c = self.config;
        let dim = cx.batch.embedding_dim();
        let retriever = frozen_retriever(cx.retriever.as_deref_mut(), dim, DISCRITUNE.name)?;
        if self.listener.is_none() {
            let neighbours = if c.hard_negatives > 0 {
                let e = &cx.corpus.image_embeddings;
                if e.len() != cx.corpus.references.len() * dim {
                    bail!("discritune --hard-negatives needs every training image's embedding");
                }
                Some(Neighbours::cached(
                    &cx.corpus.name,
                    e,
                    dim,
                    c.hard_negatives,
                ))
            } else {
                None
            };
            let log_scale = b.to_vec(retriever.model.params.value(retriever.model.log_scale))[0];
            self.listener = Some(Listener {
                scale: (log_scale as f64).exp(),
                neighbours,
            });
        }
        let listener = self.listener.as_ref().expect("made above");
        // One caption per image: rows of the same image are one candidate.
        let distinct = cx.batch.distinct_images();
        let (images, embeddings) = (&distinct.images, &distinct.embeddings);
        let decoding = if c.sample {
            Decoding::Sample {
                n: 1,
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: cx.rng.random(),
            }
        } else {
            Decoding::Greedy
        };
        let captions = generate(
            b,
            cx.model,
            &distinct.inputs,
            &decoding,
            &DecodeOptions::default(),
        )?;
        let ids: Vec<&[u32]> = captions.iter().map(|g| g.ids.as_slice()).collect();
        let text = embed_generated(b, &mut retriever.model, &retriever.captions, cx.vocab, &ids)?;
        let row = |e: &[f32], i: usize| -> Vec<f32> { e[i * dim..(i + 1) * dim].to_vec() };
        let judged: Vec<Judged> = captions
            .iter()
            .enumerate()
            .map(|(j, g)| {
                let t = &text[j * dim..(j + 1) * dim];
                let own = cosine(t, &row(embeddings, g.image));
                let mut others: Vec<f64> = (0..images.len())
                    .filter(|&k| k != g.image)
                    .map(|k| cosine(t, &row(embeddings, k)))
                    .collect();
                if let Some(n) = &listener.neighbours {
                    // One already in the batch is a candidate once.
                    let hard = n.of(images[g.image]).iter().map(|&k| k as usize);
                    others.extend(
                        hard.filter(|k| !images.contains(k))
                            .map(|k| cosine(t, &row(&cx.corpus.image_embeddings, k))),
                    );
                }
                judge(listener.scale, own, &others)
            })
            .collect();
        let rewards: Vec<f64> = judged.iter().map(|j| j.reward).collect();
        let baseline = self.baseline.baseline_then_add(&rewards);
        // -(R - b) mean_t log p: the sequence's advantage over its tokens.
        let advantages: Vec<f32> = captions
            .iter()
            .zip(&rewards)
            .map(|(g, r)| ((r - baseline) / g.ids.len().max(1) as f64) as f32)
            .collect();
        self.surrogates.train(
            cx,
            &distinct.inputs,
            &captions,
            &advantages,
            c.entropy_weight,
        )?;
        if cx.monitor {
            let n = rewards.len().max(1) as f64;
            let mean_reward = rewards.iter().sum::<f64>() / n;
            let words: Vec<Vec<String>> = captions.iter().map(|g| g.words(cx.vocab)).collect();
            self.figures = StepFigures {
                reward: mean_reward,
                baseline,
                advantage_spread: (rewards
                    .iter()
                    .map(|r| (r - mean_reward).powi(2))
                    .sum::<f64>()
                    / n)
                    .sqrt(),
                rank: judged.iter().map(|j| j.rank as f64).sum::<f64>() / n,
                accuracy: judged.iter().filter(|j| j.rank == 1).count() as f64 / n,
                sample_length: words.iter().map(|w| w.len() as f64).sum::<f64>() / n,
                repetition: repetition(&words),
            };
        }
        Ok(())
    }

    fn logged(&self) -> Vec<&B::Tensor> {
        let s = self.surrogates.last();
        vec![&s.likelihood.loss, &s.mean_entropy]
    }

    fn explain(&mut self, cx: &mut ExplainContext<'_, B>) -> Result<Option<Explanation>> {
        let (b, c, vocab) = (cx.b, self.config, cx.vocab);
        let dim = cx.data.dim;
        let candidates = cx.batch(c.hard_negatives)?;
        let retriever = frozen_retriever(cx.retriever.as_deref_mut(), dim, DISCRITUNE.name)?;
        let n = candidates.ids.len();
        let m = &retriever.model;
        let scale = (b.to_vec(m.params.value(m.log_scale))[0] as f64).exp();
        let features = &candidates.embeddings;
        let greedy = generate(
            b,
            cx.model,
            &candidates.inputs,
            &Decoding::Greedy,
            &DecodeOptions::default(),
        )?;
        let mut captions: Vec<&[u32]> = vec![&cx.ids[1..]];
        captions.extend(greedy.iter().map(|g| g.ids.as_slice()));
        let text = embed_generated(
            b,
            &mut retriever.model,
            &retriever.captions,
            vocab,
            &captions,
        )?;
        // Row j of `text` against every candidate, and judged as image `own`'s.
        let cosines = |j: usize| -> Vec<f64> {
            (0..n)
                .map(|k| {
                    cosine(
                        &text[j * dim..(j + 1) * dim],
                        &features[k * dim..(k + 1) * dim],
                    )
                })
                .collect()
        };
        let judged = |j: usize, own: usize| {
            let all = cosines(j);
            let others: Vec<f64> = (0..n).filter(|&k| k != own).map(|k| all[k]).collect();
            judge(scale, all[own], &others)
        };
        let own = judged(0, 0);
        // A first step's baseline: every candidate's own greedy caption's reward.
        let baseline = (0..n).map(|k| judged(k + 1, k).reward).sum::<f64>() / n as f64;
        let advantage = own.reward - baseline;
        let all = cosines(0);
        // log p(candidate k) = scale * cos_k - lse, and lse = scale * cos_0 - reward.
        let lse = scale * all[0] - own.reward;
        let mut best: Vec<usize> = (0..n).collect();
        best.sort_by(|&a, &b| all[b].total_cmp(&all[a]).then(a.cmp(&b)));
        best.truncate(5);
        let compared_with = best
            .into_iter()
            .map(|k| Compared {
                kind: if k == 0 { "own image" } else { "image" },
                what: candidates.ids[k].clone(),
                figures: Figures(vec![
                    ("cosine", all[k]),
                    ("probability", (scale * all[k] - lse).exp()),
                ]),
            })
            .collect();
        let rest = 1.0 - c.mle_weight as f64;
        let steps = (cx.ids.len() - 1) as f64;
        let tokens = token_terms(
            b,
            cx.model,
            vocab,
            &candidates.inputs[..cx.model.config.image_input_len()],
            cx.ids,
            rest * advantage / steps,
            rest * c.entropy_weight as f64 / steps,
        )?;
        Ok(Some(Explanation {
            objective: self.described.clone(),
            caption: vocab.decode(&cx.ids[1..]),
            reward_is: format!("log p of its own image among {n} candidates"),
            reward: own.reward,
            baseline,
            advantage,
            figures: Figures(vec![("rank", own.rank as f64), ("candidates", n as f64)]),
            compared_with,
            tokens,
        }))
    }

    fn state(&self) -> Vec<f64> {
        self.baseline.saved()
    }

    fn restore(&mut self, state: &[f64]) -> Result<()> {
        self.baseline = RunningMean::from_saved(state)?;
        Ok(())
    }

    fn report(&self, read: &[f32]) -> Vec<(&'static str, f32)> {
        let (surrogate, entropy) = (read[0], read[1]);
        let loss = surrogate - self.config.entropy_weight * entropy;
        let f = &self.figures;
        vec![
            ("loss", loss),
            ("reward", f.reward as f32),
            ("baseline", f.baseline as f32),
            ("advantage_spread", f.advantage_spread as f32),
            ("rank", f.rank as f32),
            ("accuracy", f.accuracy as f32),
            ("entropy", entropy),
            ("sample_length", f.sample_length as f32),
            ("repetition", f.repetition as f32),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reward_is_the_log_probability_of_the_own_image() {
        // Scale 10, own cosine 0.5, others 0.3 and 0.6: by hand,
        // 5 - ln(e^5 + e^3 + e^6).
        let j = judge(10.0, 0.5, &[0.3, 0.6]);
        let by_hand = 5.0 - (5f64.exp() + 3f64.exp() + 6f64.exp()).ln();
        assert!((j.reward - by_hand).abs() < 1e-12, "{}", j.reward);
        assert_eq!(j.rank, 2);
        // Alone, the own image is certain; a tie ranks it below.
        assert_eq!(judge(10.0, 0.5, &[]).reward, 0.0);
        assert_eq!(judge(10.0, 0.5, &[0.5]).rank, 2);
        assert_eq!(judge(10.0, 0.9, &[0.5, 0.1]).rank, 1);
    }

    #[test]
    fn the_baseline_is_the_mean_of_all_earlier_rewards() {
        let mut m = RunningMean::default();
        assert_eq!(m.baseline_then_add(&[-1.0, -3.0]), -2.0);
        assert_eq!(m.baseline_then_add(&[-6.0]), -2.0);
        // (-1 - 3 - 6) / 3.
        assert!((m.baseline_then_add(&[0.0]) + 10.0 / 3.0).abs() < 1e-12);
        // Saved and restored, it goes on as it was.
        let mut again = RunningMean::from_saved(&m.saved()).unwrap();
        assert_eq!(again, m);
        assert_eq!(again.baseline_then_add(&[1.0]), m.baseline_then_add(&[1.0]));
        assert!(RunningMean::from_saved(&[1.0]).is_err());
        assert!(RunningMean::from_saved(&[1.0, 0.5]).is_err());
    }
}
