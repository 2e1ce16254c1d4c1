//! Layer norm on the GPU: the twin of `shaders/layernorm.wgsl` and
//! `src/cpu/layernorm.rs`.

use super::reduce::ROW_BLOCK;
use super::{GpuBackend, GpuTensor, u};
use crate::backend::Storage;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LayerNormParams {
    rows: u32,
    cols: u32,
    eps: f32,
    accumulate: u32,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    gpu: &GpuBackend,
    x: &GpuTensor,
    gamma: &GpuTensor,
    beta: &GpuTensor,
    y: &mut GpuTensor,
    mean: &mut GpuTensor,
    rstd: &mut GpuTensor,
    cols: usize,
    eps: f32,
) {
    let rows = x.len() / cols;
    let params = LayerNormParams {
        rows: u(rows),
        cols: u(cols),
        eps,
        accumulate: 0,
    };
    let bufs = [&x.0, &gamma.0, &beta.0, &y.0, &mean.0, &rstd.0];
    gpu.dispatch(
        "layernorm",
        "layer_norm_forward",
        &params,
        &bufs,
        gpu.grid(rows),
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    gpu: &GpuBackend,
    dy: &GpuTensor,
    x: &GpuTensor,
    gamma: &GpuTensor,
    mean: &GpuTensor,
    rstd: &GpuTensor,
    dx: &mut GpuTensor,
    dgamma: &mut GpuTensor,
    dbeta: &mut GpuTensor,
    cols: usize,
    accumulate_dx: bool,
) {
    let rows = x.len() / cols;
    let params = LayerNormParams {
        rows: u(rows),
        cols: u(cols),
        eps: 0.0,
        accumulate: accumulate_dx as u32,
    };
    let bufs = [&dy.0, &x.0, &gamma.0, &mean.0, &rstd.0, &dx.0];
    gpu.dispatch(
        "layernorm",
        "layer_norm_backward",
        &params,
        &bufs,
        gpu.grid(rows),
    );
    if dgamma.is_empty() {
        return;
    }
    let blocks = rows.div_ceil(ROW_BLOCK);
    let dgamma_partial = gpu.scratch(blocks * cols);
    let dbeta_partial = gpu.scratch(blocks * cols);
    let bufs = [
        &dy.0,
        &x.0,
        &mean.0,
        &rstd.0,
        &dgamma_partial.0,
        &dbeta_partial.0,
    ];
    let groups = [u(cols.div_ceil(256)), u(blocks), 1];
    gpu.dispatch(
        "layernorm",
        "layer_norm_param_partials",
        &params,
        &bufs,
        groups,
    );
    let params = LayerNormParams {
        rows: u(blocks),
        ..params
    };
    let bufs = [&dgamma_partial.0, &dbeta_partial.0, &dgamma.0, &dbeta.0];
    gpu.dispatch(
        "layernorm",
        "layer_norm_param_sums",
        &params,
        &bufs,
        [u(cols.div_ceil(256)), 1, 1],
    );
}
