//! Embedding lookup and its backward on the GPU: the twin of
//! `shaders/embedding.wgsl` and `src/cpu/embedding.rs`.

use super::{GpuBackend, GpuIds, GpuTensor, u};
use crate::backend::{Storage, TokenIndex};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct EmbeddingParams {
    len: u32,
    dim: u32,
    accumulate: u32,
    _pad: u32,
}

pub(super) fn forward(
    gpu: &GpuBackend,
    table: &GpuTensor,
    ids: &GpuIds,
    out: &mut GpuTensor,
    dim: usize,
    accumulate: bool,
) {
    let len = ids.len() * dim;
    let params = EmbeddingParams {
        len: u(len),
        dim: u(dim),
        accumulate: accumulate as u32,
        _pad: 0,
    };
    gpu.dispatch(
        "embedding",
        "embedding_forward",
        &params,
        &[&table.0, &ids.0, &out.0],
        gpu.grid_for(len),
    );
}

pub(super) fn backward(
    gpu: &GpuBackend,
    dout: &GpuTensor,
    ids: &TokenIndex<GpuBackend>,
    dtable: &mut GpuTensor,
    dim: usize,
) {
    let len = ids.unique_len() * dim;
    let params = EmbeddingParams {
        len: u(len),
        dim: u(dim),
        accumulate: 1,
        _pad: 0,
    };
    let bufs = [
        &dout.0,
        &ids.unique.0,
        &ids.offsets.0,
        &ids.order.0,
        &dtable.0,
    ];
    gpu.dispatch(
        "embedding",
        "embedding_backward",
        &params,
        &bufs,
        gpu.grid_for(len),
    );
}
