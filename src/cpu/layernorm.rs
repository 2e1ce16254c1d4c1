//! CPU twins of `shaders/layernorm.wgsl`.
//!
//! Rows go to the threads in blocks of [`ROWS`], and a row's sums are taken
//! in eight interleaved lanes, so that they vectorise and give the same bits
//! on every CPU and thread count; the backward's gamma and beta gradients
//! are summed per block, then block by block in order.

use rayon::prelude::*;

/// Rows per parallel task.
const ROWS: usize = 64;

pub struct LayerNormOut<'a> {
    pub y: &'a mut [f32],
    pub mean: &'a mut [f32],
    pub rstd: &'a mut [f32],
}

pub fn forward(x: &[f32], gamma: &[f32], beta: &[f32], out: LayerNormOut, cols: usize, eps: f32) {
    if cols == 0 {
        return;
    }
    out.y
        .par_chunks_mut(ROWS * cols)
        .zip(out.mean.par_chunks_mut(ROWS))
        .zip(out.rstd.par_chunks_mut(ROWS))
        .zip(x.par_chunks(ROWS * cols))
        .for_each(|(((y, mean), rstd), x)| {
            let rows = ForwardRows {
                x,
                gamma,
                beta,
                out: LayerNormOut { y, mean, rstd },
                cols,
                eps,
            };
            #[cfg(target_arch = "x86_64")]
            if avx2::available() {
                // SAFETY: the CPU has AVX2, checked just above.
                return unsafe { avx2::forward_rows(rows) };
            }
            forward_rows(rows)
        });
}

/// A block of rows of the forward, with the affine parameters.
struct ForwardRows<'a> {
    x: &'a [f32],
    gamma: &'a [f32],
    beta: &'a [f32],
    out: LayerNormOut<'a>,
    cols: usize,
    eps: f32,
}

#[inline(always)]
fn forward_rows(r: ForwardRows) {
    let n = r.cols as f32;
    let rows = r
        .out
        .y
        .chunks_exact_mut(r.cols)
        .zip(r.x.chunks_exact(r.cols));
    for ((y, x), (mean, rstd)) in rows.zip(r.out.mean.iter_mut().zip(r.out.rstd.iter_mut())) {
        let m = lane_sum(x, |v| v) / n;
        let var = lane_sum(x, |v| (v - m) * (v - m)) / n;
        let s = 1.0 / (var + r.eps).sqrt();
        for (((y, &x), &g), &b) in y.iter_mut().zip(x).zip(r.gamma).zip(r.beta) {
            *y = (x - m) * s * g + b;
        }
        *mean = m;
        *rstd = s;
    }
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
    if cols == 0 {
        return;
    }
    let affine = !grads.dgamma.is_empty();
    // Each block's gamma and beta gradients, side by side.
    let partials: Vec<Vec<f32>> = grads
        .dx
        .par_chunks_mut(ROWS * cols)
        .enumerate()
        .map(|(block, dx)| {
            let (first, rows) = (block * ROWS, dx.len() / cols);
            let mut partial = vec![0.0; if affine { 2 * cols } else { 0 }];
            let rows = BackwardRows {
                dy: &dy[first * cols..][..rows * cols],
                x: &x[first * cols..][..rows * cols],
                gamma,
                mean: &mean[first..][..rows],
                rstd: &rstd[first..][..rows],
                dx,
                partial: &mut partial,
                cols,
                accumulate_dx,
            };
            #[cfg(target_arch = "x86_64")]
            if avx2::available() {
                // SAFETY: the CPU has AVX2, checked just above.
                unsafe { avx2::backward_rows(rows) };
                return partial;
            }
            backward_rows(rows);
            partial
        })
        .collect();
    if !affine {
        return;
    }
    for partial in &partials {
        let (dgamma, dbeta) = partial.split_at(cols);
        for (g, p) in grads.dgamma.iter_mut().zip(dgamma) {
            *g += p;
        }
        for (b, p) in grads.dbeta.iter_mut().zip(dbeta) {
            *b += p;
        }
    }
}

/// A block of rows of the backward; `partial` (empty, or gamma's then
/// beta's gradient over the block) is added to.
struct BackwardRows<'a> {
    dy: &'a [f32],
    x: &'a [f32],
    gamma: &'a [f32],
    mean: &'a [f32],
    rstd: &'a [f32],
    dx: &'a mut [f32],
    partial: &'a mut [f32],
    cols: usize,
    accumulate_dx: bool,
}

#[inline(always)]
fn backward_rows(r: BackwardRows) {
    let cols = r.cols;
    let n = cols as f32;
    let mut xhat = vec![0.0; cols];
    let mut g = vec![0.0; cols];
    let rows = (r.dx.chunks_exact_mut(cols))
        .zip(r.dy.chunks_exact(cols))
        .zip(r.x.chunks_exact(cols));
    for (row, ((dx, dy), x)) in rows.enumerate() {
        let (m, s) = (r.mean[row], r.rstd[row]);
        for (((h, g), (&x, &dy)), &gamma) in (xhat.iter_mut().zip(g.iter_mut()))
            .zip(x.iter().zip(dy))
            .zip(r.gamma)
        {
            *h = (x - m) * s;
            *g = dy * gamma;
        }
        let mean_g = lane_sum(&g, |v| v) / n;
        let mean_gx = lane_dot(&g, &xhat) / n;
        for ((dx, &g), &h) in dx.iter_mut().zip(&g).zip(&xhat) {
            let v = s * (g - mean_g - h * mean_gx);
            *dx = if r.accumulate_dx { *dx + v } else { v };
        }
        if !r.partial.is_empty() {
            let (dgamma, dbeta) = r.partial.split_at_mut(cols);
            for ((dg, db), (&dy, &h)) in dgamma.iter_mut().zip(dbeta).zip(dy.iter().zip(&xhat)) {
                *dg += dy * h;
                *db += dy;
            }
        }
    }
}

/// The sum of f(x) over `x` in eight interleaved partial sums, added
/// pairwise at the end: whole arrays at a time, so that it vectorises the
/// same way on every CPU.
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let (chunks, tail) = x.as_chunks::<8>();
    let mut lanes = [0.0f32; 8];
    for chunk in chunks {
        let chunk = *chunk;
        for i in 0..8 {
            lanes[i] += f(chunk[i]);
        }
    }
    fold_lanes(lanes) + tail.iter().map(|&v| f(v)).sum::<f32>()
}

/// The sum of a b over two equally long rows, as [`lane_sum`] takes it.
#[inline(always)]
fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
    let b = &b[..a.len()];
    let ((a_chunks, a_tail), (b_chunks, b_tail)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    let mut lanes = [0.0f32; 8];
    for (a, b) in a_chunks.iter().zip(b_chunks) {
        let (a, b) = (*a, *b);
        for i in 0..8 {
            lanes[i] += a[i] * b[i];
        }
    }
    fold_lanes(lanes) + a_tail.iter().zip(b_tail).map(|(a, b)| a * b).sum::<f32>()
}

#[inline(always)]
fn fold_lanes(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

/// The row loops compiled for AVX2 (8 lanes), chosen at run time; the
/// same sums in the same order as the baseline build.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BackwardRows, ForwardRows};

    #[target_feature(enable = "avx2")]
    pub(super) fn forward_rows(rows: ForwardRows) {
        super::forward_rows(rows)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn backward_rows(rows: BackwardRows) {
        super::backward_rows(rows)
    }

    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }
}
