//! CPU twins of `shaders/elementwise.wgsl`.

use rayon::prelude::*;

const GELU_S: f32 = 0.797_884_6; // sqrt(2 / pi)

/// tanh from one `exp` (libm's tanhf costs several times more, and GELU
/// dominates a CPU training step): 1 - 2 / (e^{2u} + 1), exact at both
/// tails, within 1e-7 of tanh near 0.
fn tanh(u: f32) -> f32 {
    1.0 - 2.0 / ((2.0 * u).exp() + 1.0)
}

/// Elements per parallel task of the transcendental kernels (GELU's tanh
/// dominates a training step on one thread).
const CHUNK: usize = 1 << 14;

pub fn gelu(x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| {
            for (yi, &v) in y.iter_mut().zip(x) {
                *yi = 0.5 * v * (1.0 + tanh(GELU_S * (v + 0.044715 * v * v * v)));
            }
        });
}

pub fn gelu_backward(x: &[f32], dy: &[f32], dx: &mut [f32], accumulate: bool) {
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(dx, (x, dy))| {
            for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
                let t = tanh(GELU_S * (v + 0.044715 * v * v * v));
                let du = GELU_S * (1.0 + 3.0 * 0.044715 * v * v);
                let grad = g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du);
                *d = if accumulate { *d + grad } else { grad };
            }
        });
}

pub fn add_bias(y: &mut [f32], bias: &[f32]) {
    for row in y.chunks_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

pub fn scale_by_exp(log_scale: f32, x: &[f32], y: &mut [f32], accumulate: bool) {
    let scale = log_scale.exp();
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = if accumulate {
            *yi + scale * xi
        } else {
            scale * xi
        };
    }
}
