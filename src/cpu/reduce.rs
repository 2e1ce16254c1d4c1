//! CPU twins of `shaders/reduce.wgsl`. Sums accumulate in f64, so the CPU
//! reference is at least as accurate as the GPU's tree.

use crate::backend::Reduce;

/// The reduction of the concatenation of `parts`.
pub fn reduce_parts(parts: &[&Vec<f32>], op: Reduce) -> f32 {
    let values = || parts.iter().flat_map(|x| x.iter().copied());
    let sum = |f: fn(f64) -> f64| values().map(|v| f(v as f64)).sum::<f64>();
    match op {
        Reduce::Sum => sum(|v| v) as f32,
        Reduce::Mean => {
            let n: usize = parts.iter().map(|x| x.len()).sum();
            (sum(|v| v) / n.max(1) as f64) as f32
        }
        Reduce::Max => values().fold(f32::MIN, f32::max),
        Reduce::SumSquares => sum(|v| v * v) as f32,
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
