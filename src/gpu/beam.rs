//! Beam search's step on the GPU: the twin of `shaders/beam.wgsl` and
//! `src/cpu/beam.rs`.

use super::{GpuBackend, GpuIds, u};
use crate::backend::{BeamStep, Storage};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct BeamParams {
    images: u32,
    width: u32,
    n_best: u32,
    count: u32,
    steps: u32,
    step: u32,
    eos: u32,
    pad: u32,
}

pub(super) fn beam_step(
    gpu: &GpuBackend,
    candidates: &GpuIds,
    step: &BeamStep,
    parents: &mut GpuIds,
    next: &mut GpuIds,
    state: &mut GpuIds,
) {
    step.check((candidates.len(), parents.len(), next.len(), state.len()));
    let params = BeamParams {
        images: u(step.images),
        width: u(step.width),
        n_best: u(step.n_best),
        count: u(step.count()),
        steps: u(step.steps),
        step: u(step.step),
        eos: step.eos,
        pad: step.pad,
    };
    gpu.dispatch(
        "beam",
        "beam_step",
        &params,
        &[&candidates.0, &parents.0, &next.0, &state.0],
        gpu.grid(step.images.div_ceil(64)),
    );
}
