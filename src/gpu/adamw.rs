//! AdamW on the GPU: the twin of `shaders/adamw.wgsl` and
//! `src/cpu/adamw.rs`.

use super::{GpuBackend, GpuTensor, u};
use crate::backend::{AdamWStep, Storage};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AdamWParams {
    len: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    bias_correction1: f32,
    bias_correction2: f32,
    max_norm: f32,
    _pad: [u32; 3],
}

pub(super) fn step(
    gpu: &GpuBackend,
    param: &mut GpuTensor,
    grad: &GpuTensor,
    m: &mut GpuTensor,
    v: &mut GpuTensor,
    grad_sumsq: &GpuTensor,
    s: &AdamWStep,
) {
    let (bc1, bc2) = s.bias_corrections();
    let params = AdamWParams {
        len: u(param.len()),
        lr: s.lr,
        beta1: s.beta1,
        beta2: s.beta2,
        eps: s.eps,
        weight_decay: s.weight_decay,
        bias_correction1: bc1,
        bias_correction2: bc2,
        max_norm: s.max_norm,
        _pad: [0; 3],
    };
    let bufs = [&grad.0, &grad_sumsq.0, &param.0, &m.0, &v.0];
    gpu.dispatch(
        "adamw",
        "adamw_step",
        &params,
        &bufs,
        gpu.grid_for(param.len()),
    );
}
