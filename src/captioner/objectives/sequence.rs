//! Sequence-level objectives (Chen and Jin, "Better Captioning with
//! Sequence-Level Exploration", CVPR 2020): SCST
//! (self-critical sequence training) with the greedy or the mean-of-others
//! baseline, SLL-ME (SCST plus an entropy bonus) and SLE (sequence-level
//! exploration: a precision term and a diversity term).
//!
//! A step samples n captions per image at temperature 1 from the current
//! weights on the device, reads their ids back (with the greedy captions'
//! and decoding's end checks, all a step reads back), scores them on the host ([`CiderReward`] against the image's
//! references with the training statistics, plus an optional BLEU-4
//! weight), turns rewards into one advantage A_j per sample, and trains
//! the REINFORCE surrogate
//!   -(1/N) sum_j A_j sum_t log p(y_jt)   (<eos> included, N = samples)
//! minus the entropy bonus, teacher-forcing the model on its own samples.

use super::reinforce::{REWARDS_PLOT, SAMPLES_PLOT, Surrogates, token_terms};
use super::settings::{Setting, SettingKind, Settings};
use crate::backend::Backend;
use crate::captioner::CaptionVocab;
use crate::captioner::collapse::{RewardWatch, repetition};
use crate::captioner::decode::{DecodeOptions, Decoding, Generated, generate};
use crate::captioner::explain::{Compared, ExplainContext, Explanation, Figures};
use crate::captioner::objective::{
    MLE_WEIGHT, Needs, Objective, ObjectiveInfo, SeriesGroup, StepContext, TrainsOn,
};
use crate::captioner::reward::CiderReward;
use crate::metrics::bleu::sentence_bleu;
use crate::metrics::diversity::diversity;
use anyhow::Result;
use rand::Rng;
use std::time::{Duration, Instant};

pub const SAMPLES: Setting = Setting {
    key: "samples",
    label: "samples per image",
    help: "Captions sampled per image at each step (temperature 1)",
    kind: SettingKind::Number {
        min: 2.0,
        max: 16.0,
        default: 5.0,
    },
};

pub const BASELINE: Setting = Setting {
    key: "baseline",
    label: "baseline",
    help: "What a sample's reward is measured against: greedy (the reward of the greedy \
           caption under the current weights) or mean (the mean reward of the image's other \
           samples, \"new self-critical\")",
    kind: SettingKind::Choice {
        choices: &["greedy", "mean"],
        default: "greedy",
    },
};

pub const REWARD: Setting = Setting {
    key: "reward",
    label: "reward",
    help: "The sequence reward: cider-d (CIDEr-D against the image's references, with \
           document frequencies from the training references)",
    kind: SettingKind::Choice {
        choices: &["cider-d"],
        default: "cider-d",
    },
};

pub const BLEU4_WEIGHT: Setting = Setting {
    key: "bleu4_weight",
    label: "BLEU-4 weight",
    help: "Reward = CIDEr-D + this times the sample's BLEU-4 against its references",
    kind: SettingKind::Number {
        min: 0.0,
        max: 10.0,
        default: 0.0,
    },
};

pub const ENTROPY_WEIGHT: Setting = Setting {
    key: "entropy_weight",
    label: "entropy weight",
    help: "SLL-ME: the loss minus this times the mean entropy of the next-token \
           distribution over the sampled tokens",
    kind: SettingKind::Number {
        min: 0.0,
        max: 1.0,
        default: 1e-2,
    },
};

pub const ALPHA: Setting = Setting {
    key: "alpha",
    label: "alpha (precision weight)",
    help: "SLE: alpha * the precision (reward) term + (1 - alpha) * the diversity term",
    kind: SettingKind::Number {
        min: 0.0,
        max: 1.0,
        default: 0.75,
    },
};

/// The diversity of each image's samples at each logged step.
pub const DIVERSITY_PLOT: SeriesGroup = SeriesGroup {
    title: "diversity of each image's samples",
    series: &["div1", "div2", "mbleu4"],
};

/// Started from an MLE checkpoint, as self-critical.pytorch recommends,
/// at a low rate.
const FINE_TUNE_LR: f32 = 5e-5;

/// A CIDEr-D reward collapses when it falls below half its start (and
/// by at least 0.05, under which a barely trained model's reward is noise).
const CIDER_WATCH: RewardWatch = RewardWatch {
    series: "reward",
    min_drop: 0.05,
};

const PLOTS: &[&SeriesGroup] = &[&REWARDS_PLOT, &DIVERSITY_PLOT, &SAMPLES_PLOT];

pub const SCST: ObjectiveInfo = ObjectiveInfo {
    name: "scst",
    help: "self-critical sequence training: REINFORCE on sampled captions with a CIDEr-D \
           reward and a greedy or mean-of-others baseline",
    settings: &[&SAMPLES, &BASELINE, &REWARD, &BLEU4_WEIGHT, &MLE_WEIGHT],
    plots: PLOTS,
    trains_on: TrainsOn::Captions,
    fine_tune_lr: Some(FINE_TUNE_LR),
    reward: Some(CIDER_WATCH),
    needs: Needs::nothing,
    explains: true,
};

pub const SLL_ME: ObjectiveInfo = ObjectiveInfo {
    name: "sll-me",
    help: "SCST plus an entropy bonus on every sampled step",
    settings: &[
        &SAMPLES,
        &BASELINE,
        &REWARD,
        &BLEU4_WEIGHT,
        &ENTROPY_WEIGHT,
        &MLE_WEIGHT,
    ],
    plots: PLOTS,
    trains_on: TrainsOn::Captions,
    fine_tune_lr: Some(FINE_TUNE_LR),
    reward: Some(CIDER_WATCH),
    needs: Needs::nothing,
    explains: true,
};

pub const SLE: ObjectiveInfo = ObjectiveInfo {
    name: "sle",
    help: "sequence-level exploration: a CIDEr-D precision term (greedy baseline) and a \
           diversity term rewarding samples far from the image's other samples",
    settings: &[&SAMPLES, &ALPHA, &REWARD, &BLEU4_WEIGHT, &MLE_WEIGHT],
    plots: PLOTS,
    trains_on: TrainsOn::Captions,
    fine_tune_lr: Some(FINE_TUNE_LR),
    reward: Some(CIDER_WATCH),
    needs: Needs::nothing,
    explains: true,
};

/// The objectives of this file.
const SEQUENCE_OBJECTIVES: [&ObjectiveInfo; 3] = [&SCST, &SLL_ME, &SLE];

/// The declaration of `name`, one of this file's objectives.
fn info_of(name: &str) -> Result<&'static ObjectiveInfo> {
    match SEQUENCE_OBJECTIVES.iter().find(|o| o.name == name) {
        Some(info) => Ok(info),
        None => anyhow::bail!("{name:?} is not a sequence-level objective"),
    }
}

/// Which sequence-level objective, with its settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SequenceObjective {
    pub kind: SequenceKind,
    pub samples: usize,
    pub baseline: Baseline,
    pub bleu4_weight: f64,
    /// The entropy bonus's weight (SLL-ME; 0 otherwise).
    pub entropy_weight: f32,
    /// SLE's alpha (1 otherwise: the precision term alone).
    pub alpha: f64,
    /// lambda in lambda * MLE on the references + (1 - lambda) * this loss.
    pub mle_weight: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceKind {
    Scst,
    SllMe,
    Sle,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The reward of the image's greedy caption.
    Greedy,
    /// The mean reward of the image's other samples.
    MeanOfOthers,
}

impl SequenceObjective {
    /// The objective `name` (one of this file's) with `settings`.
    pub fn from_settings(name: &str, settings: &Settings) -> Result<Self> {
        let kind = match name {
            "scst" => SequenceKind::Scst,
            "sll-me" => SequenceKind::SllMe,
            "sle" => SequenceKind::Sle,
            other => anyhow::bail!("{other:?} is not a sequence-level objective"),
        };
        let baseline = match (kind, BASELINE.choice(settings)) {
            (SequenceKind::Sle, _) | (_, "greedy") => Baseline::Greedy,
            _ => Baseline::MeanOfOthers,
        };
        Ok(SequenceObjective {
            kind,
            samples: SAMPLES.number(settings).round() as usize,
            baseline,
            bleu4_weight: BLEU4_WEIGHT.number(settings),
            entropy_weight: match kind {
                SequenceKind::SllMe => ENTROPY_WEIGHT.number(settings) as f32,
                _ => 0.0,
            },
            alpha: match kind {
                SequenceKind::Sle => ALPHA.number(settings),
                _ => 1.0,
            },
            mle_weight: MLE_WEIGHT.number(settings) as f32,
        })
    }

    fn needs_greedy(&self) -> bool {
        self.baseline == Baseline::Greedy
    }
}

/// One image's samples scored: rewards, the baseline each is measured
/// against, and the advantages that weigh their log-likelihoods.
#[derive(Clone, Debug, PartialEq)]
pub struct Advantages {
    pub rewards: Vec<f64>,
    pub baselines: Vec<f64>,
    pub advantages: Vec<f64>,
}

/// SCST's advantages of one image's sample rewards: r_j - the greedy
/// caption's reward, or r_j - the mean of the other samples' rewards.
pub fn self_critical(rewards: &[f64], baseline: Baseline, greedy: f64) -> Advantages {
    let s = rewards.len();
    let total: f64 = rewards.iter().sum();
    let baselines: Vec<f64> = match baseline {
        Baseline::Greedy => vec![greedy; s],
        Baseline::MeanOfOthers => rewards
            .iter()
            .map(|r| (total - r) / (s - 1).max(1) as f64)
            .collect(),
    };
    Advantages {
        advantages: rewards.iter().zip(&baselines).map(|(r, b)| r - b).collect(),
        rewards: rewards.to_vec(),
        baselines,
    }
}

/// SLE's distance between two captions: 1 - (BLEU-3 + BLEU-4) / 2 of `a`
/// against `b` alone; 0 between equal captions (BLEU's smoothing would
/// put two equal captions of under four words far apart, and so reward
/// duplicate short samples as diverse).
pub fn distance(a: &[&str], b: &[&str]) -> f64 {
    if a == b {
        return 0.0;
    }
    let bleu = sentence_bleu(a, &[b.to_vec()]);
    1.0 - (bleu[2] + bleu[3]) / 2.0
}

/// SLE's advantages of one image's samples (the paper's eq. 16 with its
/// baselines): A_j = alpha (r_j - b1) + (1 - alpha) (2/s) sum_k (d_jk - b2)
/// over all k (d_jj = 0), b1 the greedy caption's reward, b2 the mean of
/// all s^2 distances.
pub fn sle(rewards: &[f64], greedy: f64, distances: &[Vec<f64>], alpha: f64) -> Advantages {
    let s = rewards.len() as f64;
    let b2 = distances.iter().flatten().sum::<f64>() / (s * s);
    let advantages = rewards
        .iter()
        .zip(distances)
        .map(|(r, d)| {
            let spread: f64 = d.iter().map(|d| d - b2).sum();
            alpha * (r - greedy) + (1.0 - alpha) * 2.0 / s * spread
        })
        .collect();
    Advantages {
        rewards: rewards.to_vec(),
        baselines: vec![greedy; rewards.len()],
        advantages,
    }
}

/// The pairwise distances of one image's samples (words), d[j][k].
pub fn distances(samples: &[Vec<&str>]) -> Vec<Vec<f64>> {
    samples
        .iter()
        .enumerate()
        .map(|(j, a)| {
            samples
                .iter()
                .enumerate()
                .map(|(k, b)| if j == k { 0.0 } else { distance(a, b) })
                .collect()
        })
        .collect()
}

/// What a step's samples looked like, for its log line (host values).
#[derive(Clone, Debug, Default)]
struct StepFigures {
    reward: f64,
    baseline: f64,
    advantage_spread: f64,
    div1: f64,
    div2: f64,
    mbleu4: f64,
    sample_length: f64,
    repetition: f64,
}

/// Where the last step's time went on the host's clock (sampling ends
/// with a readback, so it includes the device's work on it).
#[derive(Clone, Copy, Debug, Default)]
struct StepTiming {
    /// Sampling and the greedy captions.
    sampling: Duration,
    /// Rewards, baselines and advantages.
    rewards: Duration,
}

/// SCST, SLL-ME and SLE as an [`Objective`].
pub struct SequenceLevel<B: Backend> {
    /// The last step's split, for `captune bench scst`.
    timing: StepTiming,
    config: SequenceObjective,
    /// What `describe` shows.
    described: String,
    /// Made on the first step, from the run's training corpus.
    reward: Option<CiderReward>,
    surrogates: Surrogates<B>,
    figures: StepFigures,
}

impl<B: Backend> SequenceLevel<B> {
    /// The objective `name` (one of this file's) with `settings`.
    pub fn new(name: &str, settings: &Settings) -> Result<Self> {
        Ok(SequenceLevel {
            config: SequenceObjective::from_settings(name, settings)?,
            described: info_of(name)?.describe(settings),
            reward: None,
            surrogates: Surrogates::default(),
            figures: StepFigures::default(),
            timing: StepTiming::default(),
        })
    }

    /// Scores each image's samples; `greedy` holds the greedy captions
    /// when the baseline needs them.
    fn score(
        &self,
        vocab: &CaptionVocab,
        references: &[Vec<Vec<String>>],
        images: &[usize],
        samples: &[Generated],
        greedy: Option<&[Generated]>,
    ) -> Vec<Advantages> {
        let c = &self.config;
        let reward = self.reward.as_ref().expect("made before scoring");
        let n = c.samples;
        let mut scored: Vec<(usize, &[u32])> = samples
            .iter()
            .map(|g| (images[g.image], g.ids.as_slice()))
            .collect();
        if let Some(greedy) = greedy {
            scored.extend(greedy.iter().map(|g| (images[g.image], g.ids.as_slice())));
        }
        let mut rewards = reward.rewards(&scored);
        let words: Vec<Vec<String>> = samples.iter().map(|g| g.words(vocab)).collect();
        if c.bleu4_weight > 0.0 {
            let greedy_words: Vec<Vec<String>> = greedy
                .unwrap_or_default()
                .iter()
                .map(|g| g.words(vocab))
                .collect();
            let captions = words
                .iter()
                .zip(samples)
                .chain(greedy_words.iter().zip(greedy.unwrap_or_default()));
            for (r, (w, g)) in rewards.iter_mut().zip(captions) {
                *r += c.bleu4_weight * sentence_bleu(w, &references[images[g.image]])[3];
            }
        }
        let greedy_reward = |i: usize| rewards.get(samples.len() + i).copied().unwrap_or(0.0);
        (0..images.len())
            .map(|i| {
                let own = &rewards[i * n..(i + 1) * n];
                match c.kind {
                    SequenceKind::Sle => {
                        let w: Vec<Vec<&str>> = words[i * n..(i + 1) * n]
                            .iter()
                            .map(|s| s.iter().map(String::as_str).collect())
                            .collect();
                        sle(own, greedy_reward(i), &distances(&w), c.alpha)
                    }
                    _ => self_critical(own, c.baseline, greedy_reward(i)),
                }
            })
            .collect()
    }
}

/// The words of generated ids.
fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    sum / n.max(1) as f64
}

impl<B: Backend> Objective<B> for SequenceLevel<B> {
    fn describe(&self) -> String {
        self.described.clone()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> Result<()> {
        let b = cx.b;
        let c = self.config;
        let n = c.samples;
        if self.reward.is_none() {
            self.reward = Some(CiderReward::for_training(cx.corpus, cx.vocab));
        }
        let inputs = &cx.batch.inputs;
        let start = Instant::now();
        let sampling = Decoding::Sample {
            n,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: cx.rng.random(),
        };
        let options = DecodeOptions::default();
        let samples = generate(b, cx.model, inputs, &sampling, &options)?;
        let greedy = if c.needs_greedy() {
            Some(generate(b, cx.model, inputs, &Decoding::Greedy, &options)?)
        } else {
            None
        };
        let sampled = Instant::now();
        let scored = self.score(
            cx.vocab,
            &cx.corpus.references,
            &cx.batch.images,
            &samples,
            greedy.as_deref(),
        );
        self.timing = StepTiming {
            sampling: sampled - start,
            rewards: sampled.elapsed(),
        };
        // The gradient weight evens out reference captions' lengths, which
        // samples do not have: the surrogate does not take it.
        let advantages: Vec<f32> = scored
            .iter()
            .flat_map(|a| a.advantages.iter().map(|&v| v as f32))
            .collect();
        self.surrogates
            .train(cx, inputs, &samples, &advantages, c.entropy_weight)?;
        if cx.monitor {
            let all = |f: fn(&Advantages) -> &Vec<f64>| scored.iter().flat_map(f).copied();
            let adv_mean = mean(all(|a| &a.advantages));
            let sets: Vec<Vec<Vec<String>>> = samples
                .chunks(n)
                .map(|set| set.iter().map(|g| g.words(cx.vocab)).collect())
                .collect();
            let d = diversity(&sets);
            self.figures = StepFigures {
                reward: mean(all(|a| &a.rewards)),
                baseline: mean(all(|a| &a.baselines)),
                advantage_spread: mean(all(|a| &a.advantages).map(|v| (v - adv_mean).powi(2)))
                    .sqrt(),
                div1: d.div1,
                div2: d.div2,
                mbleu4: d.mbleu4,
                sample_length: mean(sets.iter().flatten().map(|w| w.len() as f64)),
                repetition: repetition(&sets.concat()),
            };
        }
        Ok(())
    }

    fn phases(&self) -> Vec<(&'static str, Duration)> {
        vec![
            ("sampling", self.timing.sampling),
            ("rewards", self.timing.rewards),
        ]
    }

    fn explain(&mut self, cx: &mut ExplainContext<'_, B>) -> Result<Option<Explanation>> {
        if self.reward.is_none() {
            self.reward = Some(CiderReward::for_training(&cx.training_corpus(), cx.vocab));
        }
        let reward = self.reward.as_ref().expect("made above");
        let (b, c, vocab) = (cx.b, self.config, cx.vocab);
        let (inputs, references) = (cx.inputs()?, cx.references());
        let words = |ids: &[u32]| vocab.decode_words(ids);
        let score = |ids: &[u32]| {
            let bleu = if c.bleu4_weight > 0.0 {
                c.bleu4_weight * sentence_bleu(&words(ids), &references)[3]
            } else {
                0.0
            };
            reward.reward_against(ids, &references) + bleu
        };
        let caption = &cx.ids[1..];
        let own = score(caption);
        let options = DecodeOptions::default();
        let greedy = if c.needs_greedy() {
            let g = generate(b, cx.model, &inputs, &Decoding::Greedy, &options)?;
            Some((g[0].ids.clone(), score(&g[0].ids)))
        } else {
            None
        };
        // SLE's diversity term and the mean baseline compare the caption
        // with the image's other samples.
        let others: Vec<(Vec<u32>, f64)> = if c.needs_greedy() && c.kind != SequenceKind::Sle {
            Vec::new()
        } else {
            let sampling = Decoding::Sample {
                n: c.samples - 1,
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: cx.seed,
            };
            generate(b, cx.model, &inputs, &sampling, &options)?
                .into_iter()
                .map(|g| {
                    let r = score(&g.ids);
                    (g.ids, r)
                })
                .collect()
        };
        let rewards: Vec<f64> = std::iter::once(own)
            .chain(others.iter().map(|o| o.1))
            .collect();
        let greedy_reward = greedy.as_ref().map_or(0.0, |g| g.1);
        let scored = match c.kind {
            SequenceKind::Sle => {
                let all: Vec<Vec<String>> = std::iter::once(caption)
                    .chain(others.iter().map(|o| o.0.as_slice()))
                    .map(words)
                    .collect();
                let w: Vec<Vec<&str>> = all
                    .iter()
                    .map(|s| s.iter().map(String::as_str).collect())
                    .collect();
                sle(&rewards, greedy_reward, &distances(&w), c.alpha)
            }
            _ => self_critical(&rewards, c.baseline, greedy_reward),
        };
        let advantage = scored.advantages[0];
        let rest = 1.0 - c.mle_weight as f64;
        let steps = (cx.ids.len() - 1) as f64;
        let tokens = token_terms(
            b,
            cx.model,
            vocab,
            &inputs,
            cx.ids,
            rest * advantage,
            rest * c.entropy_weight as f64 / steps,
        )?;
        let compared = |kind, (ids, reward): &(Vec<u32>, f64)| Compared {
            kind,
            what: vocab.decode(ids),
            figures: Figures(vec![("reward", *reward)]),
        };
        let compared_with = (greedy.iter().map(|g| compared("greedy", g)))
            .chain(others.iter().map(|o| compared("sample", o)))
            .collect();
        let reward_is = if c.bleu4_weight > 0.0 {
            format!(
                "CIDEr-D + {} x BLEU-4 against the image's references",
                c.bleu4_weight
            )
        } else {
            "CIDEr-D against the image's references".into()
        };
        Ok(Some(Explanation {
            objective: self.described.clone(),
            caption: vocab.decode(caption),
            reward_is,
            reward: own,
            baseline: scored.baselines[0],
            advantage,
            figures: Figures::default(),
            compared_with,
            tokens,
        }))
    }

    fn logged(&self) -> Vec<&B::Tensor> {
        let s = self.surrogates.last();
        vec![&s.likelihood.loss, &s.mean_entropy]
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
            ("entropy", entropy),
            ("sample_length", f.sample_length as f32),
            ("repetition", f.repetition as f32),
            ("div1", f.div1 as f32),
            ("div2", f.div2 as f32),
            ("mbleu4", f.mbleu4 as f32),
        ]
    }
}
