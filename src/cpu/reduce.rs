//! CPU twins of `shaders/reduce.wgsl`. Sums accumulate in f64, so the CPU
//! reference is at least as accurate as the GPU's tree.

use crate::backend::Reduce;

pub fn reduce(x: &[f32], op: Reduce) -> f32 {
    match op {
        Reduce::Sum => x.iter().map(|&v| v as f64).sum::<f64>() as f32,
        Reduce::Mean => (x.iter().map(|&v| v as f64).sum::<f64>() / x.len().max(1) as f64) as f32,
        Reduce::Max => x.iter().copied().fold(f32::MIN, f32::max),
        Reduce::SumSquares => x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() as f32,
    }
}

pub fn column_sum(x: &[f32], rows: usize, cols: usize, out: &mut [f32], accumulate: bool) {
    if !accumulate {
        out[..cols].fill(0.0);
    }
    for row in x[..rows * cols].chunks(cols) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}
