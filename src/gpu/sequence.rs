//! Per-sequence quantities spread over each sequence's rows on the GPU: the
//! twin of `shaders/sequence.wgsl` (the CPU backend computes them in
//! `src/cpu/mod.rs`).

use super::{GpuBackend, GpuIds, GpuTensor, u};
use crate::backend::Storage;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SequenceParams {
    rows: u32,
    per_sequence: u32,
    pad: u32,
    alpha: f32,
}

pub(super) fn spread_weights(
    gpu: &GpuBackend,
    weights: &GpuTensor,
    ids: &GpuIds,
    per_sequence: usize,
    pad: u32,
    alpha: f32,
    coef: &mut GpuTensor,
) {
    let rows = ids.len();
    assert!(
        per_sequence > 0 && coef.len() >= rows && weights.len() >= rows.div_ceil(per_sequence),
        "spread_sequence_weights: shapes do not fit"
    );
    let params = SequenceParams {
        rows: u(rows),
        per_sequence: u(per_sequence),
        pad,
        alpha,
    };
    gpu.dispatch(
        "sequence",
        "spread_sequence_weights",
        &params,
        &[&weights.0, &ids.0, &coef.0],
        gpu.grid_for(rows),
    );
}
