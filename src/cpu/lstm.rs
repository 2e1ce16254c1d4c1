//! CPU twin of `shaders/lstm.wgsl`.

use crate::backend::LstmStep;

/// The logistic function, without overflow at either tail.
fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

pub fn cell(gates: &mut [f32], cells: &mut [f32], hidden: &mut [f32], s: &LstmStep) {
    s.check(gates.len(), &[cells.len(), hidden.len()]);
    let h = s.hidden;
    for r in 0..s.rows {
        let g = s.gates_offset + r * s.gates_stride;
        let (prev, next) = (s.prev + r * s.state_stride, s.next + r * s.state_stride);
        for j in 0..h {
            let i = sigmoid(gates[g + j]);
            let f = sigmoid(gates[g + h + j]);
            let c_in = gates[g + 2 * h + j].tanh();
            let o = sigmoid(gates[g + 3 * h + j]);
            gates[g + j] = i;
            gates[g + h + j] = f;
            gates[g + 2 * h + j] = c_in;
            gates[g + 3 * h + j] = o;
            let c = f * cells[prev + j] + i * c_in;
            cells[next + j] = c;
            hidden[next + j] = o * c.tanh();
        }
    }
}

pub fn cell_backward(
    gates: &[f32],
    cells: &[f32],
    d_hidden: &[f32],
    d_cell: &mut [f32],
    d_gates: &mut [f32],
    s: &LstmStep,
) {
    s.check_backward(
        gates.len(),
        d_gates.len(),
        &[cells.len(), d_hidden.len()],
        d_cell.len(),
    );
    let h = s.hidden;
    for r in 0..s.rows {
        let g = s.gates_offset + r * s.gates_stride;
        let (prev, next) = (s.prev + r * s.state_stride, s.next + r * s.state_stride);
        for j in 0..h {
            let (i, f) = (gates[g + j], gates[g + h + j]);
            let (c_in, o) = (gates[g + 2 * h + j], gates[g + 3 * h + j]);
            let t = cells[next + j].tanh();
            let dh = d_hidden[next + j];
            let dc = d_cell[r * h + j] + dh * o * (1.0 - t * t);
            d_gates[g + j] = dc * c_in * i * (1.0 - i);
            d_gates[g + h + j] = dc * cells[prev + j] * f * (1.0 - f);
            d_gates[g + 2 * h + j] = dc * i * (1.0 - c_in * c_in);
            d_gates[g + 3 * h + j] = dh * t * o * (1.0 - o);
            d_cell[r * h + j] = dc * f;
        }
    }
}
