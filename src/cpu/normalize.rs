//! CPU twin of `shaders/normalize.wgsl`.

use rayon::prelude::*;

const EPS: f32 = 1e-12;

pub fn forward(x: &[f32], y: &mut [f32], norm: &mut [f32], cols: usize) {
    y.par_chunks_mut(cols)
        .zip(norm.par_iter_mut())
        .zip(x.par_chunks(cols))
        .for_each(|((y, n), x)| {
            *n = x.iter().map(|v| v * v).sum::<f32>().sqrt().max(EPS);
            for (yi, &xi) in y.iter_mut().zip(x) {
                *yi = xi / *n;
            }
        });
}

pub fn backward(
    y: &[f32],
    norm: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    cols: usize,
    accumulate: bool,
) {
    dx.par_chunks_mut(cols)
        .zip(y.par_chunks(cols).zip(dy.par_chunks(cols)))
        .zip(norm.par_iter())
        .for_each(|((dx, (y, dy)), &n)| {
            let dot: f32 = y.iter().zip(dy).map(|(a, b)| a * b).sum();
            for c in 0..cols {
                let g = (dy[c] - y[c] * dot) / n;
                dx[c] = if accumulate { dx[c] + g } else { g };
            }
        });
}
