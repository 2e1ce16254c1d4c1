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
