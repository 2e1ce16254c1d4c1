//! CPU twins of `shaders/softmax.wgsl`.

use super::elementwise::exp;
use crate::backend::SoftmaxRows;
use rayon::prelude::*;

/// The largest allowed entry of `x`, and the sum of exp(entry - largest)
/// over the allowed entries: the two passes of a stable (log-)softmax.
/// `exp` is the inlined polynomial: libm's, a call per entry, was a
/// twentieth of a small transformer's training step.
pub(super) fn masked_max_and_sum(x: &[f32], allowed: impl Fn(usize) -> bool) -> (f32, f32) {
    let max = (0..x.len())
        .filter(|&j| allowed(j))
        .map(|j| x[j])
        .fold(f32::MIN, f32::max);
    let sum = (0..x.len())
        .filter(|&j| allowed(j))
        .map(|j| exp(x[j] - max))
        .sum();
    (max, sum)
}

pub fn forward(x: &[f32], y: &mut [f32], rows: &SoftmaxRows, key_mask: Option<&[u32]>) {
    let cols = rows.cols;
    y[..rows.rows * cols]
        .par_chunks_mut(cols)
        .enumerate()
        .for_each(|(r, y)| {
            let x = &x[r * cols..(r + 1) * cols];
            let q = r % rows.q_len;
            let b = r / rows.q_len / rows.heads;
            let allowed = |j: usize| {
                (!rows.causal || j <= q) && key_mask.is_none_or(|m| m[b * cols + j] != 0)
            };
            let (max, sum) = masked_max_and_sum(x, allowed);
            for j in 0..cols {
                y[j] = if allowed(j) {
                    exp(x[j] - max) / sum
                } else {
                    0.0
                };
            }
        });
}

pub fn backward(y: &[f32], dy: &[f32], dx: &mut [f32], cols: usize, accumulate: bool) {
    dx[..y.len()]
        .par_chunks_mut(cols)
        .enumerate()
        .for_each(|(r, dx)| {
            let (y, dy) = (&y[r * cols..(r + 1) * cols], &dy[r * cols..(r + 1) * cols]);
            let s: f32 = y.iter().zip(dy).map(|(a, b)| a * b).sum();
            for j in 0..cols {
                let v = y[j] * (dy[j] - s);
                dx[j] = if accumulate { dx[j] + v } else { v };
            }
        });
}
