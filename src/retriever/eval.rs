//! Retrieval recall: embed a split's images and captions, rank by cosine.

use super::patchify;
use crate::backend::{Backend, Matmul};
use crate::cpu::CpuBackend;
use crate::data::Caption;
use crate::data::images::Images;
use crate::data::vocab::Vocab;
use crate::model::retriever::{Retriever, TextBatch};
use anyhow::Result;
use indicatif::ProgressBar;
use serde::Serialize;

/// Recall at 1, 5 and 10 in both directions, fractions in [0, 1].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Recall {
    pub t2i_r1: f64,
    pub t2i_r5: f64,
    pub t2i_r10: f64,
    pub i2t_r1: f64,
    pub i2t_r5: f64,
    pub i2t_r10: f64,
}

/// Runs `encode` over `count` items in batches of the model's size (the
/// last one padded by repeating its final item) and returns the
/// embeddings `[count, embed_dim]` as the model gives them.
fn embed_in_batches<B: Backend>(
    model: &mut Retriever<B>,
    count: usize,
    progress: &ProgressBar,
    mut encode: impl FnMut(&mut Retriever<B>, &[usize]) -> Result<Vec<f32>>,
) -> Result<Vec<f32>> {
    let (batch, dim) = (model.batch, model.config.embed_dim);
    let mut out = Vec::with_capacity(count * dim);
    for start in (0..count).step_by(batch) {
        let real = batch.min(count - start);
        let indices: Vec<usize> = (0..batch).map(|k| start + k.min(real - 1)).collect();
        let e = encode(model, &indices)?;
        out.extend_from_slice(&e[..real * dim]);
        progress.inc(real as u64);
    }
    Ok(out)
}

/// Embeddings `[rows, dim]` made unit-norm on the host, by the same
/// normalisation the contrastive loss applies.
pub fn unit_rows(rows: Vec<f32>, dim: usize) -> Vec<f32> {
    unit_rows_and_norms(rows, dim).0
}

/// As [`unit_rows`], with each row's norm before.
pub fn unit_rows_and_norms(rows: Vec<f32>, dim: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut unit, mut norms) = (vec![0.0; rows.len()], vec![0.0; rows.len() / dim]);
    CpuBackend::new().l2_normalize(&rows, &mut unit, &mut norms, dim);
    (unit, norms)
}

/// The unit-norm embeddings of `images[items]`, advancing `progress` by one for each.
pub fn embed_images<B: Backend>(
    b: &B,
    model: &mut Retriever<B>,
    images: &Images,
    items: &[usize],
    progress: &ProgressBar,
) -> Result<Vec<f32>> {
    let dim = model.config.embed_dim;
    Ok(unit_rows(
        embed_images_raw(b, model, images, items, progress)?,
        dim,
    ))
}

/// The embeddings of `images[items]` as the model gives them, before
/// they are made unit-norm.
pub fn embed_images_raw<B: Backend>(
    b: &B,
    model: &mut Retriever<B>,
    images: &Images,
    items: &[usize],
    progress: &ProgressBar,
) -> Result<Vec<f32>> {
    let config = model.config;
    embed_in_batches(model, items.len(), progress, |m, idx| {
        let chosen: Vec<usize> = idx.iter().map(|&k| items[k]).collect();
        m.encode_images(b, &patchify(&config, images, &chosen))?;
        Ok(b.to_vec(m.image_embeddings()))
    })
}

pub fn embed_captions<B: Backend>(
    b: &B,
    model: &mut Retriever<B>,
    vocab: &Vocab,
    captions: &[&Caption],
) -> Result<Vec<f32>> {
    let max_len = model.config.max_len;
    let ids: Vec<Vec<u32>> = captions
        .iter()
        .map(|c| vocab.encode(&c.tokens, max_len))
        .collect();
    embed_ids(b, model, &ids)
}

/// The unit-norm embeddings of captions already encoded with the
/// retriever's vocabulary (`<bos> .. <eos>`, at most its `max_len` ids).
pub fn embed_ids<B: Backend>(
    b: &B,
    model: &mut Retriever<B>,
    ids: &[Vec<u32>],
) -> Result<Vec<f32>> {
    let config = model.config;
    let raw = embed_in_batches(model, ids.len(), &ProgressBar::hidden(), |m, idx| {
        let chosen: Vec<Vec<u32>> = idx.iter().map(|&k| ids[k].clone()).collect();
        let batch = TextBatch::new(b, &config, &chosen)?;
        m.encode_texts(b, &batch)?;
        Ok(b.to_vec(m.text_embeddings()))
    })?;
    Ok(unit_rows(raw, config.embed_dim))
}

/// `caption_image[j]` is the image (row of `images`) caption j describes.
pub fn recall(images: &[f32], captions: &[f32], dim: usize, caption_image: &[usize]) -> Recall {
    let (n, m) = (images.len() / dim, captions.len() / dim);
    assert_eq!(m, caption_image.len());
    let mut sim = vec![0.0; n * m];
    CpuBackend::new().matmul(
        &images.to_vec(),
        &captions.to_vec(),
        &mut sim,
        &Matmul::new(n, m, dim).trans_b(),
    );
    // Rank = how many candidates score strictly higher than the true one.
    let mut t2i = [0usize; 3];
    for (j, &i) in caption_image.iter().enumerate() {
        let s = sim[i * m + j];
        let rank = (0..n).filter(|&k| sim[k * m + j] > s).count();
        for (hits, k) in t2i.iter_mut().zip([1, 5, 10]) {
            *hits += usize::from(rank < k);
        }
    }
    let mut i2t = [0usize; 3];
    for i in 0..n {
        let row = &sim[i * m..(i + 1) * m];
        let best = (0..m)
            .filter(|&j| caption_image[j] == i)
            .map(|j| row.iter().filter(|&&v| v > row[j]).count())
            .min()
            .unwrap_or(usize::MAX);
        for (hits, k) in i2t.iter_mut().zip([1, 5, 10]) {
            *hits += usize::from(best < k);
        }
    }
    let t = |h: usize| h as f64 / m.max(1) as f64;
    let i = |h: usize| h as f64 / n.max(1) as f64;
    Recall {
        t2i_r1: t(t2i[0]),
        t2i_r5: t(t2i[1]),
        t2i_r10: t(t2i[2]),
        i2t_r1: i(i2t[0]),
        i2t_r5: i(i2t[1]),
        i2t_r10: i(i2t[2]),
    }
}

impl std::fmt::Display for Recall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "text->image R@1 {:.3} R@5 {:.3} R@10 {:.3} | image->text R@1 {:.3} R@5 {:.3} R@10 {:.3}",
            self.t2i_r1, self.t2i_r5, self.t2i_r10, self.i2t_r1, self.i2t_r5, self.i2t_r10
        )
    }
}
