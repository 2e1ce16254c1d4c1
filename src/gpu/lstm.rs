//! An LSTM layer's time step on the GPU: the twin of `shaders/lstm.wgsl`
//! and `src/cpu/lstm.rs`.

use super::{GpuBackend, GpuTensor, u};
use crate::backend::{CellGates, LstmStep, Storage};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LstmParams {
    rows: u32,
    hidden: u32,
    gates_offset: u32,
    gates_stride: u32,
    prev: u32,
    next: u32,
    state_stride: u32,
    maxout: u32,
}

impl LstmParams {
    fn new(s: &LstmStep) -> Self {
        LstmParams {
            rows: u(s.rows),
            hidden: u(s.hidden),
            gates_offset: u(s.gates_offset),
            gates_stride: u(s.gates_stride),
            prev: u(s.prev),
            next: u(s.next),
            state_stride: u(s.state_stride),
            maxout: u32::from(s.cell == CellGates::Maxout),
        }
    }
}

pub(super) fn cell(
    gpu: &GpuBackend,
    gates: &mut GpuTensor,
    cells: &mut GpuTensor,
    hidden: &mut GpuTensor,
    step: &LstmStep,
) {
    step.check(gates.len(), &[cells.len(), hidden.len()]);
    let grid = gpu.grid_for(step.rows * step.hidden);
    let params = LstmParams::new(step);
    let bufs = [&gates.0, &cells.0, &hidden.0];
    gpu.dispatch("lstm", "lstm_cell", &params, &bufs, grid);
}

pub(super) fn cell_backward(
    gpu: &GpuBackend,
    gates: &GpuTensor,
    cells: &GpuTensor,
    d_hidden: &GpuTensor,
    d_cell: &mut GpuTensor,
    d_gates: &mut GpuTensor,
    step: &LstmStep,
) {
    step.check_backward(
        gates.len(),
        d_gates.len(),
        &[cells.len(), d_hidden.len()],
        d_cell.len(),
    );
    let grid = gpu.grid_for(step.rows * step.hidden);
    let params = LstmParams::new(step);
    let bufs = [&gates.0, &cells.0, &d_hidden.0, &d_cell.0, &d_gates.0];
    gpu.dispatch("lstm", "lstm_cell_backward", &params, &bufs, grid);
}
