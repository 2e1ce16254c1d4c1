//! Row-wise softmax on the GPU: the twin of `shaders/softmax.wgsl` and
//! `src/cpu/softmax.rs`.

use super::{GpuBackend, GpuIds, GpuTensor, u};
use crate::backend::{SoftmaxRows, Storage};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SoftmaxParams {
    rows: u32,
    cols: u32,
    q_len: u32,
    heads: u32,
    causal: u32,
    use_mask: u32,
    accumulate: u32,
    _pad: u32,
}

pub(super) fn forward(
    gpu: &GpuBackend,
    x: &GpuTensor,
    y: &mut GpuTensor,
    r: &SoftmaxRows,
    key_mask: Option<&GpuIds>,
) {
    let params = SoftmaxParams {
        rows: u(r.rows),
        cols: u(r.cols),
        q_len: u(r.q_len),
        heads: u(r.heads),
        causal: r.causal as u32,
        use_mask: key_mask.is_some() as u32,
        accumulate: 0,
        _pad: 0,
    };
    let mask = &key_mask.unwrap_or(&gpu.no_mask).0;
    gpu.dispatch(
        "softmax",
        "softmax_forward",
        &params,
        &[&x.0, mask, &y.0],
        gpu.grid(r.rows),
    );
}

pub(super) fn backward(
    gpu: &GpuBackend,
    y: &GpuTensor,
    dy: &GpuTensor,
    dx: &mut GpuTensor,
    cols: usize,
    accumulate: bool,
) {
    let rows = y.len() / cols;
    let params = SoftmaxParams {
        rows: u(rows),
        cols: u(cols),
        q_len: u(rows.max(1)),
        heads: 1,
        causal: 0,
        use_mask: 0,
        accumulate: accumulate as u32,
        _pad: 0,
    };
    gpu.dispatch(
        "softmax",
        "softmax_backward",
        &params,
        &[&y.0, &dy.0, &dx.0],
        gpu.grid(rows),
    );
}
