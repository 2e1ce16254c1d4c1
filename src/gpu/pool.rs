//! Mean pooling on the GPU: the twin of `shaders/pool.wgsl` and
//! `src/cpu/pool.rs`.

use super::{GpuBackend, GpuTensor, u};
use crate::backend::Storage;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct PoolParams {
    len: u32,
    cols: u32,
    group: u32,
    accumulate: u32,
}

pub(super) fn mean_pool(
    gpu: &GpuBackend,
    x: &GpuTensor,
    y: &mut GpuTensor,
    group: usize,
    cols: usize,
) {
    let params = PoolParams {
        len: u(y.len()),
        cols: u(cols),
        group: u(group),
        accumulate: 0,
    };
    gpu.dispatch(
        "pool",
        "mean_pool",
        &params,
        &[&x.0, &y.0],
        gpu.grid_for(y.len()),
    );
}

pub(super) fn mean_pool_backward(
    gpu: &GpuBackend,
    dy: &GpuTensor,
    dx: &mut GpuTensor,
    group: usize,
    cols: usize,
    accumulate: bool,
) {
    let params = PoolParams {
        len: u(dx.len()),
        cols: u(cols),
        group: u(group),
        accumulate: accumulate as u32,
    };
    let grid = gpu.grid_for(dx.len());
    gpu.dispatch("pool", "mean_pool_backward", &params, &[&dy.0, &dx.0], grid);
}
