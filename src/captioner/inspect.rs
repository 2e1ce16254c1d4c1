//! Why a loss punishes a caption, token by token (Yue et al., 2023,
//! Figure 5): for each position, the MLE loss (softmax over the whole
//! vocabulary) and the SMILE loss (over the caption's own tokens; step 0
//! over the whole vocabulary, as first-token MLE trains it), the label's
//! probability under each, and the top-5 predictions of each.

use super::CaptionVocab;
use super::inputs::TokenInputs;
use super::model::Captioner;
use crate::backend::Backend;
use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Prediction {
    pub token: String,
    pub probability: f32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TokenScore {
    /// The label at this position.
    pub token: String,
    pub mle_loss: f32,
    pub smile_loss: f32,
    /// The label's probability over the full vocabulary.
    pub p_full: f32,
    /// The label's probability over the caption's own tokens.
    pub p_subset: f32,
    pub top5_full: Vec<Prediction>,
    pub top5_subset: Vec<Prediction>,
}

/// Scores `ids` (`<bos> .. <eos>`) as a caption of the image with
/// embedding `features`, in a batch of one.
pub fn score_caption<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    vocab: &CaptionVocab,
    features: &[f32],
    ids: &[u32],
) -> Result<Vec<TokenScore>> {
    let c = model.config;
    if ids.len() < 2 || ids.len() > c.max_len {
        bail!(
            "a caption to score has 1 to {} words; this one has {}",
            c.max_len - 2,
            ids.len().saturating_sub(2)
        );
    }
    let inputs = TokenInputs::new(b, &c, &[ids[..ids.len() - 1].to_vec()])?;
    model.forward(b, features, &inputs)?;
    let steps = ids.len() - 1;
    let logits = b.to_vec(model.logits());
    let labels = &ids[1..];
    let subset: BTreeSet<u32> = labels.iter().copied().collect();
    let top5 = |z: &[f64], allowed: &dyn Fn(usize) -> bool| -> Vec<Prediction> {
        let mut order: Vec<usize> = (0..z.len()).filter(|&j| allowed(j)).collect();
        order.sort_by(|&x, &y| z[y].total_cmp(&z[x]).then(x.cmp(&y)));
        order
            .iter()
            .take(5)
            .map(|&j| Prediction {
                token: vocab.label(j as u32),
                probability: z[j].exp() as f32,
            })
            .collect()
    };
    let mut out = Vec::with_capacity(steps);
    for (t, &label) in labels.iter().enumerate() {
        let z: Vec<f64> = logits[t * c.vocab_size..(t + 1) * c.vocab_size]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let full = log_softmax_over(&z, |_| true);
        let in_subset = |j: usize| subset.contains(&(j as u32));
        let sub = log_softmax_over(&z, in_subset);
        let y = label as usize;
        out.push(TokenScore {
            token: vocab.label(label),
            mle_loss: -full[y] as f32,
            smile_loss: if t == 0 { -full[y] } else { -sub[y] } as f32,
            p_full: full[y].exp() as f32,
            p_subset: sub[y].exp() as f32,
            top5_full: top5(&full, &|_| true),
            top5_subset: top5(&sub, &in_subset),
        });
    }
    Ok(out)
}

/// log softmax over the allowed entries (others: -inf).
fn log_softmax_over(z: &[f64], allowed: impl Fn(usize) -> bool) -> Vec<f64> {
    let max = (0..z.len())
        .filter(|&j| allowed(j))
        .map(|j| z[j])
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = (0..z.len())
        .filter(|&j| allowed(j))
        .map(|j| (z[j] - max).exp())
        .sum();
    let lse = max + sum.ln();
    (0..z.len())
        .map(|j| {
            if allowed(j) {
                z[j] - lse
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect()
}
