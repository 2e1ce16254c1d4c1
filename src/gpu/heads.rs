//! Attention heads moved between layouts on the GPU: the twin of
//! `shaders/heads.wgsl` and `src/cpu/heads.rs`.

use super::{GpuBackend, GpuTensor, u};
use crate::backend::HeadLayout;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct HeadsParams {
    batch: u32,
    seq: u32,
    heads: u32,
    head_dim: u32,
    row_stride: u32,
    col_offset: u32,
    accumulate: u32,
    _pad: u32,
}

fn heads_params(l: &HeadLayout, accumulate: bool) -> HeadsParams {
    HeadsParams {
        batch: u(l.batch),
        seq: u(l.seq),
        heads: u(l.heads),
        head_dim: u(l.head_dim),
        row_stride: u(l.row_stride),
        col_offset: u(l.col_offset),
        accumulate: accumulate as u32,
        _pad: 0,
    }
}

pub(super) fn tokens_to_heads(
    gpu: &GpuBackend,
    src: &GpuTensor,
    dst: &mut GpuTensor,
    l: &HeadLayout,
) {
    let params = heads_params(l, false);
    gpu.dispatch(
        "heads",
        "tokens_to_heads",
        &params,
        &[&src.0, &dst.0],
        gpu.grid_for(l.len()),
    );
}

pub(super) fn heads_to_tokens(
    gpu: &GpuBackend,
    src: &GpuTensor,
    dst: &mut GpuTensor,
    l: &HeadLayout,
    accumulate: bool,
) {
    let params = heads_params(l, accumulate);
    gpu.dispatch(
        "heads",
        "heads_to_tokens",
        &params,
        &[&src.0, &dst.0],
        gpu.grid_for(l.len()),
    );
}
