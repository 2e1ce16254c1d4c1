//! CPU twins of `shaders/elementwise.wgsl`.

use rayon::prelude::*;

const GELU_S: f32 = 0.797_884_6; // sqrt(2 / pi)

/// Elements per parallel task of the transcendental kernels (GELU's tanh
/// dominates a training step on one thread).
const CHUNK: usize = 1 << 14;

pub fn gelu(x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| {
            for (yi, &v) in y.iter_mut().zip(x) {
                *yi = 0.5 * v * (1.0 + (GELU_S * (v + 0.044715 * v * v * v)).tanh());
            }
        });
}

pub fn gelu_backward(x: &[f32], dy: &[f32], dx: &mut [f32], accumulate: bool) {
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(dx, (x, dy))| {
            for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
                let t = (GELU_S * (v + 0.044715 * v * v * v)).tanh();
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
