//! Why an objective would reward or punish one caption of one image, as
//! if the caption were the image's at a training step: what an objective
//! is given to say so ([`ExplainContext`]) and what it says
//! ([`Explanation`]). `inspect`, the app's per-token view and its scorer
//! ask through `Objective::explain`, so they know no objective by name.

use super::CaptionVocab;
use super::corpus::TrainingCorpus;
use super::model::Captioner;
use crate::backend::Backend;
use crate::retriever::frozen::FrozenRetriever;
use crate::retriever::neighbours::nearest;
use crate::source::embeddings::CaptionData;
use anyhow::Result;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::Serialize;
use serde::ser::SerializeMap;

/// What an objective is given to explain a caption.
pub struct ExplainContext<'a, B: Backend> {
    pub b: &'a B,
    /// The captioner under its current weights; it also decodes.
    pub model: &'a mut Captioner<B>,
    pub vocab: &'a CaptionVocab,
    /// The caption, `<bos> .. <eos>` in `vocab`.
    pub ids: &'a [u32],
    /// The data set with the image embeddings the captioner reads.
    pub data: &'a CaptionData,
    /// The caption's image: an item of `data`.
    pub item: usize,
    /// The run's frozen retriever, if one was given.
    pub retriever: Option<&'a mut FrozenRetriever<B>>,
    /// How many images a training batch holds, the caption's own
    /// included: those a retrieval reward ranks the caption among.
    pub batch_images: usize,
    /// Seeds the other samples and the batch's other images.
    pub seed: u64,
}

/// Images by decoder input, embedding (`[n, dim]`) and data-set id, in
/// order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Images {
    pub inputs: Vec<f32>,
    pub embeddings: Vec<f32>,
    pub ids: Vec<String>,
}

impl<B: Backend> ExplainContext<'_, B> {
    /// The image's embedding, `[dim]`.
    pub fn features(&self) -> Vec<f32> {
        self.data.features_of(&[self.item])
    }

    /// The image as the decoder reads it.
    pub fn inputs(&self) -> Result<Vec<f32>> {
        self.data
            .inputs_of(&[self.item], self.model.config.embedding_reading())
    }

    /// The image's reference captions as PTB tokens.
    pub fn references(&self) -> Vec<Vec<String>> {
        let captions = &self.data.data.items[self.item].captions;
        captions.iter().map(|c| c.tokens.clone()).collect()
    }

    /// The training split, whose statistics rewards are computed with.
    pub fn training_corpus(&self) -> TrainingCorpus {
        TrainingCorpus::training_split(&self.data.data).0
    }

    /// A training batch's images: the caption's own first, then
    /// `batch_images - 1` others of its split drawn with `seed`; then
    /// the `nearest` images of its split nearest its own not drawn already.
    pub fn batch(&self, nearest_too: usize) -> Result<Images> {
        let data = self.data;
        let split = data.items(data.data.items[self.item].split);
        let mut others: Vec<usize> = split.iter().copied().filter(|&j| j != self.item).collect();
        others.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(self.seed));
        others.truncate(self.batch_images.saturating_sub(1));
        let mut chosen = vec![self.item];
        chosen.extend(others);
        if nearest_too > 0 {
            let all = data.features_of(&split);
            let at = split.iter().position(|&j| j == self.item);
            let near = nearest(&all, data.dim, &self.features(), at, nearest_too);
            let new: Vec<usize> = near
                .into_iter()
                .map(|k| split[k])
                .filter(|j| !chosen.contains(j))
                .collect();
            chosen.extend(new);
        }
        Ok(Images {
            inputs: data.inputs_of(&chosen, self.model.config.embedding_reading())?,
            embeddings: data.features_of(&chosen),
            ids: chosen
                .iter()
                .map(|&j| data.data.items[j].id.clone())
                .collect(),
        })
    }
}

/// What an objective makes of a caption as the image's at a step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    /// The objective with its settings.
    pub objective: String,
    pub caption: String,
    /// What the reward is, in a few words.
    pub reward_is: String,
    pub reward: f64,
    /// What the reward is measured against.
    pub baseline: f64,
    pub advantage: f64,
    /// Other figures a reader needs (DiscriTune: the caption's rank).
    pub figures: Figures,
    /// What the caption was measured against: other captions with their
    /// rewards, or candidate images with their match to it.
    pub compared_with: Vec<Compared>,
    /// Each token's part in the caption's loss.
    pub tokens: Vec<TokenTerm>,
}

impl Explanation {
    /// The caption's loss as the step's only sample: its tokens' terms summed.
    pub fn loss(&self) -> f32 {
        let terms = self
            .tokens
            .iter()
            .map(|t| t.likelihood_term + t.entropy_term);
        terms.sum()
    }

    /// What the advantage does to the caption's tokens, in words.
    pub fn verdict(&self) -> &'static str {
        if self.advantage > 0.0 {
            "its tokens are made more likely"
        } else if self.advantage < 0.0 {
            "its tokens are made less likely"
        } else {
            "no gradient"
        }
    }
}

/// A caption or an image the explained caption was measured against.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Compared {
    /// "greedy", "sample", "own image", "image".
    pub kind: &'static str,
    /// The caption, or the image's id.
    pub what: String,
    pub figures: Figures,
}

/// Named figures in the order they read best; a JSON object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures(pub Vec<(&'static str, f64)>);

impl Figures {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = (self.0.iter())
            .map(|(n, v)| match v.fract() == 0.0 && v.abs() < 1e9 {
                true => format!("{n} {v:.0}"),
                false => format!("{n} {v:.3}"),
            })
            .collect();
        f.write_str(&parts.join(", "))
    }
}

impl Serialize for Figures {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// One token's part in a caption's surrogate loss.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenTerm {
    pub token: String,
    /// log p of the token under the current weights (the policy).
    pub logprob: f32,
    /// -(1 - lambda) * advantage * log p (DiscriTune: the advantage over
    /// the caption's tokens): what the token adds to the caption's loss as
    /// one sample (a step divides the sum over its samples by their number).
    pub likelihood_term: f32,
    /// The entropy (nats) of the next-token distribution at this step.
    pub entropy: f32,
    /// -(1 - lambda) * entropy_weight * entropy / (the caption's tokens):
    /// the bonus's part, as if the caption were the step's only sample
    /// (0 without an entropy bonus).
    pub entropy_term: f32,
}
