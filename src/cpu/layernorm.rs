//! CPU twins of `shaders/layernorm.wgsl`.

use rayon::prelude::*;

pub struct LayerNormOut<'a> {
    pub y: &'a mut [f32],
    pub mean: &'a mut [f32],
    pub rstd: &'a mut [f32],
}

pub fn forward(x: &[f32], gamma: &[f32], beta: &[f32], out: LayerNormOut, cols: usize, eps: f32) {
    out.y
        .par_chunks_mut(cols)
        .zip(out.mean.par_iter_mut())
        .zip(out.rstd.par_iter_mut())
        .zip(x.par_chunks(cols))
        .for_each(|(((y, mean), rstd), x)| {
            let m = x.iter().sum::<f32>() / cols as f32;
            let var = x.iter().map(|&v| (v - m) * (v - m)).sum::<f32>() / cols as f32;
            let r = 1.0 / (var + eps).sqrt();
            for c in 0..cols {
                y[c] = (x[c] - m) * r * gamma[c] + beta[c];
            }
            *mean = m;
            *rstd = r;
        });
}

pub struct LayerNormGrads<'a> {
    pub dx: &'a mut [f32],
    pub dgamma: &'a mut [f32],
    pub dbeta: &'a mut [f32],
}

#[allow(clippy::too_many_arguments)]
pub fn backward(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    grads: LayerNormGrads,
    cols: usize,
    accumulate_dx: bool,
) {
    grads
        .dx
        .par_chunks_mut(cols)
        .enumerate()
        .for_each(|(r, dx)| {
            let (dy, x) = (&dy[r * cols..(r + 1) * cols], &x[r * cols..(r + 1) * cols]);
            let xhat = |c: usize| (x[c] - mean[r]) * rstd[r];
            let mean_g = (0..cols).map(|c| dy[c] * gamma[c]).sum::<f32>() / cols as f32;
            let mean_gx = (0..cols).map(|c| dy[c] * gamma[c] * xhat(c)).sum::<f32>() / cols as f32;
            for c in 0..cols {
                let v = rstd[r] * (dy[c] * gamma[c] - mean_g - xhat(c) * mean_gx);
                dx[c] = if accumulate_dx { dx[c] + v } else { v };
            }
        });
    if grads.dgamma.is_empty() {
        return;
    }
    for (r, dy) in dy.chunks(cols).enumerate() {
        for c in 0..cols {
            grads.dgamma[c] += dy[c] * (x[r * cols + c] - mean[r]) * rstd[r];
            grads.dbeta[c] += dy[c];
        }
    }
}
