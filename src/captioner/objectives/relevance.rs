//! CLIP relevance (Jin, "Self-Supervised Image Captioning with CLIP",
//! arXiv:2306.15111, 2023): the
//! captioner captions each image of the batch by the Gumbel-max trick on
//! the device; the captions, relaxed by the Gumbel-softmax at temperature
//! tau (straight-through by default, or soft), are read by the frozen
//! retriever's text tower ([`RelaxedListener`]), and the loss
//! -mean cos(image embedding, text embedding) is minimised through the
//! tower (input gradients only) into the decoder. After a supervised
//! (MLE) stage, this needs no captions: the labelled-fraction setting of
//! the paper trains it on the images whose captions are not used.

use super::settings::{Setting, SettingKind, Settings};
use crate::backend::Backend;
use crate::captioner::collapse::{RewardWatch, repetition};
use crate::captioner::decode::{DecodeOptions, Decoding, generate};
use crate::captioner::inputs::TokenInputs;
use crate::captioner::listener::{
    Relaxation, RelaxedListener, VocabMap, frozen_retriever, negative_cosine,
};
use crate::captioner::objective::{
    MLE_WEIGHT, Needs, Objective, ObjectiveInfo, SeriesGroup, StepContext, TrainsOn,
};
use anyhow::Result;
use rand::Rng;

pub const GUMBEL: Setting = Setting {
    key: "gumbel",
    label: "Gumbel-softmax",
    help: "CLIP relevance: hard (straight-through: the sampled tokens forward, the softmax's \
           gradient back) or soft (the softmax's mixture of token embeddings both ways)",
    kind: SettingKind::Choice {
        choices: &["hard", "soft"],
        default: "hard",
    },
};

pub const TAU: Setting = Setting {
    key: "tau",
    label: "Gumbel temperature",
    help: "CLIP relevance: the Gumbel-softmax temperature (lower: closer to one-hot, noisier \
           gradients)",
    kind: SettingKind::Number {
        min: 0.05,
        max: 10.0,
        default: 1.0,
    },
};

/// How well each caption matches its image, to the retriever.
pub const COSINE_PLOT: SeriesGroup = SeriesGroup {
    title: "relevance: cosine of each caption with its image",
    series: &["cosine"],
};

pub const TAU_PLOT: SeriesGroup = SeriesGroup {
    title: "Gumbel-softmax temperature",
    series: &["tau"],
};

pub const CLIP_RELEVANCE: ObjectiveInfo = ObjectiveInfo {
    name: "clip-relevance",
    help: "self-supervised relevance: Gumbel-softmax captions read by the frozen retriever's \
           text tower, -cos(image, caption) minimised through it; needs --retriever, the \
           encoder of --features",
    settings: &[&GUMBEL, &TAU, &MLE_WEIGHT],
    plots: &[&COSINE_PLOT, &TAU_PLOT],
    trains_on: TrainsOn::Images,
    fine_tune_lr: Some(2e-4),
    // Half of a small start is noise: at least 0.2 of cosine.
    reward: Some(RewardWatch {
        series: "cosine",
        min_drop: 0.2,
    }),
    needs: Needs::retriever,
    explains: false,
};

#[derive(Clone, Copy, Debug, Default)]
struct StepFigures {
    loss: f64,
    cosine: f64,
    sample_length: f64,
    repetition: f64,
}

pub struct ClipRelevance<B: Backend> {
    relaxation: Relaxation,
    tau: f32,
    described: String,
    listener: Option<RelaxedListener<B>>,
    figures: StepFigures,
}

impl<B: Backend> ClipRelevance<B> {
    pub fn new(settings: &Settings) -> Self {
        ClipRelevance {
            relaxation: match GUMBEL.choice(settings) {
                "soft" => Relaxation::Soft,
                _ => Relaxation::StraightThrough,
            },
            tau: TAU.number(settings) as f32,
            described: CLIP_RELEVANCE.describe(settings),
            listener: None,
            figures: StepFigures::default(),
        }
    }
}

impl<B: Backend> Objective<B> for ClipRelevance<B> {
    fn describe(&self) -> String {
        self.described.clone()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> Result<()> {
        let b = cx.b;
        let dim = cx.batch.embedding_dim();
        let name = CLIP_RELEVANCE.name;
        let retriever = frozen_retriever(cx.retriever.as_deref_mut(), dim, name)?;
        let distinct = cx.batch.distinct_images();
        if self.listener.is_none() {
            let map = VocabMap::new(cx.vocab, &retriever.captions)?;
            self.listener = Some(RelaxedListener::new(b, &retriever.model, map));
        }
        let listener = self.listener.as_mut().expect("made above");
        let seed: u64 = cx.rng.random();
        let decoding = Decoding::Gumbel { n: 1, seed };
        let captions = generate(
            b,
            cx.model,
            &distinct.inputs,
            &decoding,
            &DecodeOptions::default(),
        )?;
        let ids: Vec<Vec<u32>> = captions.iter().map(|g| g.ids.clone()).collect();
        let sequences: Vec<Vec<u32>> = ids
            .iter()
            .map(|c| {
                std::iter::once(cx.model.config.specials.start)
                    .chain(c.iter().copied())
                    .collect()
            })
            .collect();
        let inputs = TokenInputs::trimmed(b, &cx.model.config, &sequences)?;
        cx.model.forward(b, &distinct.inputs, &inputs)?;
        let texts = listener.forward(
            b,
            &mut retriever.model,
            cx.model.logits(),
            &ids,
            inputs.positions,
            seed,
            self.tau,
            self.relaxation,
        )?;
        let (loss, cosines, d_texts) = negative_cosine(&distinct.embeddings, &texts, dim);
        let d_logits = listener.backward(b, &mut retriever.model, &d_texts);
        cx.model.backward(b, &inputs, d_logits);
        if cx.monitor {
            let n = cosines.len().max(1) as f64;
            let words: Vec<Vec<String>> = captions.iter().map(|g| g.words(cx.vocab)).collect();
            self.figures = StepFigures {
                loss,
                cosine: cosines.iter().sum::<f64>() / n,
                sample_length: words.iter().map(|w| w.len() as f64).sum::<f64>() / n,
                repetition: repetition(&words),
            };
        }
        Ok(())
    }

    /// Its figures come from the host: nothing to read from the device.
    fn logged(&self) -> Vec<&B::Tensor> {
        Vec::new()
    }

    fn report(&self, _: &[f32]) -> Vec<(&'static str, f32)> {
        let f = &self.figures;
        vec![
            ("loss", f.loss as f32),
            ("cosine", f.cosine as f32),
            ("tau", self.tau),
            ("sample_length", f.sample_length as f32),
            ("repetition", f.repetition as f32),
        ]
    }
}
