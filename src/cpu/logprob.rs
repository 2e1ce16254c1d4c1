//! CPU twins of `shaders/logprob.wgsl`.

use super::softmax::masked_max_and_sum;
use crate::index::allowed;
use rayon::prelude::*;

/// Row r's subset description, as the GPU kernel reads it.
pub struct Subsets<'a> {
    pub row_subset: &'a [u32],
    pub bits: &'a [u32],
    pub words: usize,
}

pub fn forward(
    logits: &[f32],
    targets: &[u32],
    s: &Subsets,
    vocab: usize,
    logp: &mut [f32],
    lse: &mut [f32],
) {
    logp.par_iter_mut()
        .zip(lse.par_iter_mut())
        .enumerate()
        .for_each(|(r, (logp, lse))| {
            let z = &logits[r * vocab..(r + 1) * vocab];
            let ok = |j: usize| allowed(s.row_subset, s.bits, s.words, targets, r, j);
            let (max, sum) = masked_max_and_sum(z, ok);
            *lse = max + sum.ln();
            *logp = z[targets[r] as usize] - *lse;
        });
}

#[allow(clippy::too_many_arguments)]
pub fn backward(
    logits: &[f32],
    targets: &[u32],
    s: &Subsets,
    vocab: usize,
    lse: &[f32],
    dlogp: &[f32],
    dlogits: &mut [f32],
    accumulate: bool,
) {
    dlogits[..lse.len() * vocab]
        .par_chunks_mut(vocab)
        .enumerate()
        .for_each(|(r, dz)| {
            for j in 0..vocab {
                let mut g = if allowed(s.row_subset, s.bits, s.words, targets, r, j) {
                    -(logits[r * vocab + j] - lse[r]).exp()
                } else {
                    0.0
                };
                if j == targets[r] as usize {
                    g += 1.0;
                }
                let v = dlogp[r] * g;
                dz[j] = if accumulate { dz[j] + v } else { v };
            }
        });
}

pub fn softmax_entropy(logits: &[f32], vocab: usize, entropy: &mut [f32], lse: &mut [f32]) {
    entropy
        .par_iter_mut()
        .zip(lse.par_iter_mut())
        .enumerate()
        .for_each(|(r, (h, lse))| {
            let z = &logits[r * vocab..(r + 1) * vocab];
            let (max, sum) = masked_max_and_sum(z, |_| true);
            *lse = max + sum.ln();
            // H = lse - sum_j p_j z_j.
            let mean_z: f64 = z
                .iter()
                .map(|&zj| ((zj - *lse) as f64).exp() * zj as f64)
                .sum();
            *h = (*lse as f64 - mean_z) as f32;
        });
}

#[allow(clippy::too_many_arguments)]
pub fn softmax_entropy_backward(
    logits: &[f32],
    vocab: usize,
    entropy: &[f32],
    lse: &[f32],
    d_entropy: &[f32],
    dlogits: &mut [f32],
    accumulate: bool,
) {
    dlogits[..lse.len() * vocab]
        .par_chunks_mut(vocab)
        .enumerate()
        .for_each(|(r, dz)| {
            for (j, d) in dz.iter_mut().enumerate() {
                let log_p = logits[r * vocab + j] - lse[r];
                let v = -d_entropy[r] * log_p.exp() * (log_p + entropy[r]);
                *d = if accumulate { *d + v } else { v };
            }
        });
}
