//! Deterministic reductions on the GPU: the twin of `shaders/reduce.wgsl`
//! and `src/cpu/reduce.rs`.

use super::{GpuBackend, GpuTensor, u};
use crate::backend::{Matmul, Reduce, Storage};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
struct ReduceParams {
    len: u32,
    cols: u32,
    chunk: u32,
    op: u32,
    out_index: u32,
    accumulate: u32,
    scale: f32,
    _pad: u32,
}

/// Rows per block of the two-pass column reductions (ROW_BLOCK in the shaders).
pub(super) const ROW_BLOCK: usize = 64;
/// Partials a full reduction's first pass produces at most.
const MAX_PARTIALS: usize = 1024;

pub(super) fn reduce_parts(
    gpu: &GpuBackend,
    parts: &[&GpuTensor],
    op: Reduce,
    out: &mut GpuTensor,
    out_index: usize,
) {
    assert!(
        out_index < out.len(),
        "reduce: out_index {out_index} outside an output of {}",
        out.len()
    );
    // Each part's chunks into one run of partials, then one final pass.
    let n: usize = parts.iter().map(|x| x.len()).sum();
    let chunk = n.div_ceil(MAX_PARTIALS).next_multiple_of(256).max(256);
    let chunks = |x: &GpuTensor| x.len().div_ceil(chunk).max(1);
    let total_chunks: usize = parts.iter().map(|x| chunks(x)).sum();
    let partials = gpu.scratch(total_chunks.max(1));
    let (first_op, final_op) = match op {
        Reduce::Sum | Reduce::Mean => (0, 0),
        Reduce::Max => (1, 1),
        Reduce::SumSquares => (2, 0),
    };
    let mut first = 0;
    for x in parts {
        let params = ReduceParams {
            len: u(x.len()),
            chunk: u(chunk),
            op: first_op,
            out_index: u(first),
            ..Default::default()
        };
        gpu.dispatch(
            "reduce",
            "reduce_partials",
            &params,
            &[&x.0, &partials.0],
            gpu.grid(chunks(x)),
        );
        first += chunks(x);
    }
    let scale = if op == Reduce::Mean {
        1.0 / n.max(1) as f32
    } else {
        1.0
    };
    let params = ReduceParams {
        len: u(total_chunks),
        op: final_op,
        out_index: u(out_index),
        scale,
        ..Default::default()
    };
    gpu.dispatch(
        "reduce",
        "reduce_final",
        &params,
        &[&partials.0, &out.0],
        [1, 1, 1],
    );
}

pub(super) fn column_sum(
    gpu: &GpuBackend,
    x: &GpuTensor,
    rows: usize,
    cols: usize,
    out: &mut GpuTensor,
    accumulate: bool,
) {
    assert!(
        x.len() >= rows * cols && out.len() >= cols,
        "column_sum: shapes do not fit"
    );
    // In two passes when the rows span more than one block.
    let blocks = rows.div_ceil(ROW_BLOCK);
    let col_groups = cols.div_ceil(256) as u32;
    let sum = |src: &GpuTensor, rows: usize| {
        let params = ReduceParams {
            len: u(rows),
            cols: u(cols),
            accumulate: accumulate as u32,
            ..Default::default()
        };
        gpu.dispatch(
            "reduce",
            "column_sum",
            &params,
            &[&src.0, &out.0],
            [col_groups, 1, 1],
        );
    };
    if blocks <= 1 {
        sum(x, rows);
        return;
    }
    let partials = gpu.scratch(blocks * cols);
    let params = ReduceParams {
        len: u(rows),
        cols: u(cols),
        ..Default::default()
    };
    gpu.dispatch(
        "reduce",
        "column_partials",
        &params,
        &[&x.0, &partials.0],
        [col_groups, u(blocks), 1],
    );
    sum(&partials, blocks);
}

/// A split-K product's second pass (`matmul::split_matmul`): the `splits`
/// partial products in `partials`, then their column sums (`sum_cols`
/// each, none without that epilogue), added split by split into C (scaled
/// by alpha) and into `sums`, accumulating where `s` says.
pub(super) fn split_sum(
    gpu: &GpuBackend,
    partials: &GpuTensor,
    c: &mut GpuTensor,
    sums: &GpuTensor,
    sum_cols: usize,
    splits: usize,
    s: &Matmul,
) {
    let product = s.m * s.n;
    let sum = ReduceParams {
        len: u(product),
        cols: u(sum_cols),
        chunk: u(splits),
        accumulate: s.accumulate as u32,
        scale: s.alpha,
        ..Default::default()
    };
    gpu.dispatch(
        "reduce",
        "split_sum",
        &sum,
        &[&partials.0, &c.0, &sums.0],
        gpu.grid_for(product + sum_cols),
    );
}
