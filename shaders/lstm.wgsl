// One time step of an LSTM layer. One thread per (row, hidden unit), on a
// 2-D grid. The gates' pre-activations of row r start at gates_offset +
// r * gates_stride, `hidden` each: PyTorch's (input, forget, cell input,
// output), or with `maxout` self-critical training's (input, forget,
// output, then two candidates whose larger is the cell input, no tanh).
// The cell and hidden states of row r are read at prev + r * state_stride
// and written at next + r * state_stride.

struct Params {
    rows: u32,
    hidden: u32,
    gates_offset: u32,
    gates_stride: u32,
    prev: u32,
    next: u32,
    state_stride: u32,
    maxout: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// The logistic function, without overflow at either tail.
fn sigmoid(x: f32) -> f32 {
    if (x >= 0.0) { return 1.0 / (1.0 + exp(-x)); }
    let e = exp(x);
    return e / (1.0 + e);
}

@group(0) @binding(1) var<storage, read_write> gates: array<f32>;
@group(0) @binding(2) var<storage, read_write> cells: array<f32>;
@group(0) @binding(3) var<storage, read_write> hidden_states: array<f32>;

// The gates become their activations (with maxout: i, f, o, the cell
// input and its first candidate's share of the gradient, all of it when
// the larger, half at a tie as PyTorch's torch.max splits it);
// c_next = f c_prev + i c_in, h_next = o tanh(c_next).
@compute @workgroup_size(256)
fn lstm_cell(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let e = flat_index(wid, nwg, lid);
    if (e >= p.rows * p.hidden) { return; }
    let r = e / p.hidden;
    let j = e % p.hidden;
    let h = p.hidden;
    let g = p.gates_offset + r * p.gates_stride + j;
    let i = sigmoid(gates[g]);
    let f = sigmoid(gates[g + h]);
    var c_in: f32;
    var o: f32;
    if (p.maxout == 1u) {
        o = sigmoid(gates[g + 2u * h]);
        let a = gates[g + 3u * h];
        let b = gates[g + 4u * h];
        c_in = max(a, b);
        gates[g + 2u * h] = o;
        gates[g + 3u * h] = c_in;
        gates[g + 4u * h] = select(select(0.0, 0.5, a == b), 1.0, a > b);
    } else {
        c_in = stable_tanh(gates[g + 2u * h]);
        o = sigmoid(gates[g + 3u * h]);
        gates[g + 2u * h] = c_in;
        gates[g + 3u * h] = o;
    }
    gates[g] = i;
    gates[g + h] = f;
    let c = f * cells[p.prev + r * p.state_stride + j] + i * c_in;
    let next = p.next + r * p.state_stride + j;
    cells[next] = c;
    hidden_states[next] = o * stable_tanh(c);
}

@group(0) @binding(1) var<storage, read> activations: array<f32>;
@group(0) @binding(2) var<storage, read> cell_states: array<f32>;
@group(0) @binding(3) var<storage, read> d_hidden: array<f32>;
@group(0) @binding(4) var<storage, read_write> d_cell: array<f32>;
@group(0) @binding(5) var<storage, read_write> d_gates: array<f32>;

// From the activations lstm_cell left: d_gates = the gradient w.r.t. the
// pre-activations; d_cell (`[rows, hidden]`) goes from the gradient
// w.r.t. c_next (from later steps) to the one w.r.t. c_prev.
@compute @workgroup_size(256)
fn lstm_cell_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let e = flat_index(wid, nwg, lid);
    if (e >= p.rows * p.hidden) { return; }
    let r = e / p.hidden;
    let j = e % p.hidden;
    let h = p.hidden;
    let g = p.gates_offset + r * p.gates_stride + j;
    let i = activations[g];
    let f = activations[g + h];
    let maxout = p.maxout == 1u;
    let c_in = activations[g + select(2u, 3u, maxout) * h];
    let o = activations[g + select(3u, 2u, maxout) * h];
    let next = p.next + r * p.state_stride + j;
    let t = stable_tanh(cell_states[next]);
    let dh = d_hidden[next];
    let dc = d_cell[e] + dh * o * (1.0 - t * t);
    d_gates[g] = dc * c_in * i * (1.0 - i);
    d_gates[g + h] = dc * cell_states[p.prev + r * p.state_stride + j] * f * (1.0 - f);
    let d_o = dh * t * o * (1.0 - o);
    if (maxout) {
        let share = activations[g + 4u * h];
        d_gates[g + 2u * h] = d_o;
        d_gates[g + 3u * h] = dc * i * share;
        d_gates[g + 4u * h] = dc * i * (1.0 - share);
    } else {
        d_gates[g + 2u * h] = dc * i * (1.0 - c_in * c_in);
        d_gates[g + 3u * h] = d_o;
    }
    d_cell[e] = dc * f;
}
