//! Elementwise ops on the GPU: the twin of `shaders/elementwise.wgsl` and
//! `src/cpu/elementwise.rs`.

use super::{GpuBackend, GpuBuffer, GpuTensor, u};
use crate::backend::Storage;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ElementwiseParams {
    len: u32,
    cols: u32,
    alpha: f32,
    beta: f32,
}

fn elementwise(
    gpu: &GpuBackend,
    entry: &'static str,
    len: usize,
    cols: usize,
    alpha: f32,
    beta: f32,
    bufs: &[&GpuBuffer],
) {
    let params = ElementwiseParams {
        len: u(len),
        cols: u(cols),
        alpha,
        beta,
    };
    gpu.dispatch("elementwise", entry, &params, bufs, gpu.grid_for(len));
}

pub(super) fn fill(gpu: &GpuBackend, x: &mut GpuTensor, value: f32) {
    elementwise(gpu, "fill", x.len(), 0, value, 0.0, &[&x.0]);
}

pub(super) fn scale(gpu: &GpuBackend, x: &mut GpuTensor, alpha: f32) {
    elementwise(gpu, "scale", x.len(), 0, alpha, 0.0, &[&x.0]);
}

pub(super) fn axpby(gpu: &GpuBackend, alpha: f32, x: &GpuTensor, beta: f32, y: &mut GpuTensor) {
    assert_eq!(x.len(), y.len(), "axpby: length mismatch");
    elementwise(gpu, "axpby", y.len(), 0, alpha, beta, &[&x.0, &y.0]);
}

pub(super) fn add(
    gpu: &GpuBackend,
    alpha: f32,
    a: &GpuTensor,
    beta: f32,
    b: &GpuTensor,
    out: &mut GpuTensor,
) {
    assert!(
        a.len() == out.len() && b.len() == out.len(),
        "add: length mismatch"
    );
    elementwise(gpu, "add", out.len(), 0, alpha, beta, &[&a.0, &b.0, &out.0]);
}

pub(super) fn mul(gpu: &GpuBackend, alpha: f32, a: &GpuTensor, b: &GpuTensor, out: &mut GpuTensor) {
    assert!(
        a.len() == out.len() && b.len() == out.len(),
        "mul: length mismatch"
    );
    elementwise(gpu, "mul", out.len(), 0, alpha, 0.0, &[&a.0, &b.0, &out.0]);
}

pub(super) fn add_bias(gpu: &GpuBackend, y: &mut GpuTensor, bias: &GpuTensor) {
    assert_eq!(
        y.len() % bias.len().max(1),
        0,
        "add_bias: rows are not whole"
    );
    elementwise(
        gpu,
        "add_bias",
        y.len(),
        bias.len(),
        0.0,
        0.0,
        &[&bias.0, &y.0],
    );
}

pub(super) fn gelu(gpu: &GpuBackend, x: &GpuTensor, y: &mut GpuTensor) {
    elementwise(gpu, "gelu", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
}

pub(super) fn tanh_forward(gpu: &GpuBackend, x: &GpuTensor, y: &mut GpuTensor) {
    elementwise(gpu, "tanh_forward", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
}

pub(super) fn tanh_backward(gpu: &GpuBackend, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
    elementwise(
        gpu,
        "tanh_backward",
        dx.len(),
        0,
        0.0,
        0.0,
        &[&x.0, &dy.0, &dx.0],
    );
}

pub(super) fn gelu_erf_forward(gpu: &GpuBackend, x: &GpuTensor, y: &mut GpuTensor) {
    elementwise(gpu, "gelu_erf_forward", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
}

pub(super) fn gelu_erf_backward(
    gpu: &GpuBackend,
    x: &GpuTensor,
    dy: &GpuTensor,
    dx: &mut GpuTensor,
) {
    elementwise(
        gpu,
        "gelu_erf_backward",
        dx.len(),
        0,
        0.0,
        0.0,
        &[&x.0, &dy.0, &dx.0],
    );
}

pub(super) fn quick_gelu_forward(gpu: &GpuBackend, x: &GpuTensor, y: &mut GpuTensor) {
    elementwise(
        gpu,
        "quick_gelu_forward",
        y.len(),
        0,
        0.0,
        0.0,
        &[&x.0, &y.0],
    );
}

pub(super) fn quick_gelu_backward(
    gpu: &GpuBackend,
    x: &GpuTensor,
    dy: &GpuTensor,
    dx: &mut GpuTensor,
) {
    elementwise(
        gpu,
        "quick_gelu_backward",
        dx.len(),
        0,
        0.0,
        0.0,
        &[&x.0, &dy.0, &dx.0],
    );
}

pub(super) fn relu_forward(gpu: &GpuBackend, x: &GpuTensor, y: &mut GpuTensor) {
    elementwise(gpu, "relu_forward", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
}

pub(super) fn relu_backward(gpu: &GpuBackend, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
    elementwise(
        gpu,
        "relu_backward",
        dx.len(),
        0,
        0.0,
        0.0,
        &[&x.0, &dy.0, &dx.0],
    );
}

pub(super) fn gelu_backward(
    gpu: &GpuBackend,
    x: &GpuTensor,
    dy: &GpuTensor,
    dx: &mut GpuTensor,
    accumulate: bool,
) {
    let beta = if accumulate { 1.0 } else { 0.0 };
    elementwise(
        gpu,
        "gelu_backward",
        dx.len(),
        0,
        0.0,
        beta,
        &[&x.0, &dy.0, &dx.0],
    );
}

pub(super) fn scale_by_exp(
    gpu: &GpuBackend,
    log_scale: &GpuTensor,
    x: &GpuTensor,
    y: &mut GpuTensor,
    accumulate: bool,
) {
    let beta = if accumulate { 1.0 } else { 0.0 };
    elementwise(
        gpu,
        "scale_by_exp",
        y.len(),
        0,
        0.0,
        beta,
        &[&x.0, &y.0, &log_scale.0],
    );
}

pub(super) fn clamp(gpu: &GpuBackend, x: &mut GpuTensor, lo: f32, hi: f32) {
    elementwise(gpu, "clamp_values", x.len(), 0, lo, hi, &[&x.0]);
}
