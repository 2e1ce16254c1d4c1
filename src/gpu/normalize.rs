//! Rows scaled to unit L2 norm on the GPU: the twin of
//! `shaders/normalize.wgsl` and `src/cpu/normalize.rs`.

use super::{GpuBackend, GpuTensor, u};
use crate::backend::Storage;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct NormalizeParams {
    rows: u32,
    cols: u32,
    accumulate: u32,
    _pad: u32,
}

pub(super) fn forward(
    gpu: &GpuBackend,
    x: &GpuTensor,
    y: &mut GpuTensor,
    norm: &mut GpuTensor,
    cols: usize,
) {
    let rows = x.len() / cols;
    let params = NormalizeParams {
        rows: u(rows),
        cols: u(cols),
        accumulate: 0,
        _pad: 0,
    };
    let bufs = [&x.0, &y.0, &norm.0];
    gpu.dispatch(
        "normalize",
        "l2_normalize_forward",
        &params,
        &bufs,
        gpu.grid(rows),
    );
}

pub(super) fn backward(
    gpu: &GpuBackend,
    y: &GpuTensor,
    norm: &GpuTensor,
    dy: &GpuTensor,
    dx: &mut GpuTensor,
    cols: usize,
    accumulate: bool,
) {
    let rows = y.len() / cols;
    let params = NormalizeParams {
        rows: u(rows),
        cols: u(cols),
        accumulate: accumulate as u32,
        _pad: 0,
    };
    let bufs = [&y.0, &norm.0, &dy.0, &dx.0];
    gpu.dispatch(
        "normalize",
        "l2_normalize_backward",
        &params,
        &bufs,
        gpu.grid(rows),
    );
}
