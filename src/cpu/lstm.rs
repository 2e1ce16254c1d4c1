//! CPU twin of `shaders/lstm.wgsl`, a task per row, with the vectorisable
//! `exp` and `tanh` of the elementwise kernels (libm's tanhf took a tenth
//! of an LSTM training step).

use super::elementwise::{exp, tanh};
use crate::backend::{CellGates, LstmStep};
use rayon::prelude::*;

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    // `exp` clamps its argument, so this stays finite at both tails.
    1.0 / (1.0 + exp(-x))
}

/// The first `rows` rows of a tensor whose rows start at `offset`,
/// `stride` apart, each to the next row's start.
fn rows_mut(
    x: &mut [f32],
    offset: usize,
    stride: usize,
    rows: usize,
) -> rayon::iter::Take<rayon::slice::ChunksMut<'_, f32>> {
    x[offset..].par_chunks_mut(stride).take(rows)
}

/// [`rows_mut`], to read.
fn rows(
    x: &[f32],
    offset: usize,
    stride: usize,
    rows: usize,
) -> rayon::iter::Take<rayon::slice::Chunks<'_, f32>> {
    x[offset..].par_chunks(stride).take(rows)
}

/// The `N` gates of a row, `h` each.
fn gates_of<const N: usize>(g: &mut [f32], h: usize) -> [&mut [f32]; N] {
    let mut chunks = g[..N * h].chunks_mut(h);
    std::array::from_fn(|_| chunks.next().expect("N chunks of h"))
}

/// The share of the maxout cell input's gradient that goes to its first
/// candidate: all when it is the larger, half at a tie (as PyTorch's
/// `torch.max` of two tensors splits it).
#[inline(always)]
fn first_share(a: f32, b: f32) -> f32 {
    if a > b {
        1.0
    } else if a == b {
        0.5
    } else {
        0.0
    }
}

/// A row's slot `prev` to read and slot `next` to write, `h` each.
fn slots(x: &mut [f32], prev: usize, next: usize, h: usize) -> (&[f32], &mut [f32]) {
    if prev < next {
        let (a, b) = x.split_at_mut(next);
        (&a[prev..prev + h], &mut b[..h])
    } else {
        let (a, b) = x.split_at_mut(prev);
        (&b[..h], &mut a[next..next + h])
    }
}

pub fn cell(gates: &mut [f32], cells: &mut [f32], hidden: &mut [f32], s: &LstmStep) {
    s.check(gates.len(), &[cells.len(), hidden.len()]);
    let h = s.hidden;
    // A row's states from its first slot touched.
    let first = s.prev.min(s.next);
    let (prev, next) = (s.prev - first, s.next - first);
    rows_mut(gates, s.gates_offset, s.gates_stride, s.rows)
        .zip(rows_mut(cells, first, s.state_stride, s.rows))
        .zip(rows_mut(hidden, first, s.state_stride, s.rows))
        .for_each(|((g, c), out)| {
            let (c_prev, c_next) = slots(c, prev, next, h);
            let out = &mut out[next..next + h];
            match s.cell {
                CellGates::Lstm => lstm_row(gates_of(g, h), c_prev, c_next, out),
                CellGates::Maxout => maxout_row(gates_of(g, h), c_prev, c_next, out),
            }
        });
}

/// One row of PyTorch's cell; the gates become their activations.
fn lstm_row(gates: [&mut [f32]; 4], c_prev: &[f32], c_next: &mut [f32], out: &mut [f32]) {
    let n = out.len();
    let [gi, gf, gc, go] = gates.map(|g| &mut g[..n]);
    let (c_prev, c_next) = (&c_prev[..n], &mut c_next[..n]);
    // Slices of one length, indexed alike: the loop vectorises.
    for j in 0..n {
        let (i, f) = (sigmoid(gi[j]), sigmoid(gf[j]));
        let (c_in, o) = (tanh(gc[j]), sigmoid(go[j]));
        (gi[j], gf[j], gc[j], go[j]) = (i, f, c_in, o);
        let cell = f * c_prev[j] + i * c_in;
        c_next[j] = cell;
        out[j] = o * tanh(cell);
    }
}

/// One row of the maxout cell; the gates become i, f, o, the cell input
/// and the first candidate's share of its gradient.
fn maxout_row(gates: [&mut [f32]; 5], c_prev: &[f32], c_next: &mut [f32], out: &mut [f32]) {
    let n = out.len();
    let [gi, gf, go, ga, gb] = gates.map(|g| &mut g[..n]);
    let (c_prev, c_next) = (&c_prev[..n], &mut c_next[..n]);
    for j in 0..n {
        let (i, f, o) = (sigmoid(gi[j]), sigmoid(gf[j]), sigmoid(go[j]));
        let c_in = ga[j].max(gb[j]);
        let share = first_share(ga[j], gb[j]);
        (gi[j], gf[j], go[j], ga[j], gb[j]) = (i, f, o, c_in, share);
        let cell = f * c_prev[j] + i * c_in;
        c_next[j] = cell;
        out[j] = o * tanh(cell);
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
    let first = s.prev.min(s.next);
    let (prev, next) = (s.prev - first, s.next - first);
    rows(gates, s.gates_offset, s.gates_stride, s.rows)
        .zip(rows_mut(d_gates, s.gates_offset, s.gates_stride, s.rows))
        .zip(rows(cells, first, s.state_stride, s.rows))
        .zip(rows(d_hidden, first, s.state_stride, s.rows))
        .zip(d_cell.par_chunks_mut(h).take(s.rows))
        .for_each(|((((g, dg), c), dh), dc_row)| {
            let (c_prev, c_next) = (&c[prev..prev + h], &c[next..next + h]);
            let (dh, dc) = (&dh[next..next + h], &mut dc_row[..h]);
            match s.cell {
                CellGates::Lstm => lstm_row_backward(g, gates_of(dg, h), c_prev, c_next, dh, dc),
                CellGates::Maxout => {
                    maxout_row_backward(g, gates_of(dg, h), c_prev, c_next, dh, dc)
                }
            }
        });
}

/// `d_cell` goes from the gradient w.r.t. c_next to the one w.r.t. c_prev.
fn lstm_row_backward(
    g: &[f32],
    d_gates: [&mut [f32]; 4],
    c_prev: &[f32],
    c_next: &[f32],
    dh: &[f32],
    d_cell: &mut [f32],
) {
    let h = dh.len();
    let (gi, gf, gc, go) = (&g[..h], &g[h..2 * h], &g[2 * h..3 * h], &g[3 * h..4 * h]);
    let [di, df, dgc, d_o] = d_gates.map(|g| &mut g[..h]);
    let (c_prev, c_next, d_cell) = (&c_prev[..h], &c_next[..h], &mut d_cell[..h]);
    for j in 0..h {
        let (i, f, c_in, o) = (gi[j], gf[j], gc[j], go[j]);
        let t = tanh(c_next[j]);
        let dc = d_cell[j] + dh[j] * o * (1.0 - t * t);
        di[j] = dc * c_in * i * (1.0 - i);
        df[j] = dc * c_prev[j] * f * (1.0 - f);
        dgc[j] = dc * i * (1.0 - c_in * c_in);
        d_o[j] = dh[j] * t * o * (1.0 - o);
        d_cell[j] = dc * f;
    }
}

/// [`lstm_row_backward`] for the maxout cell: the cell input's gradient
/// goes to its candidates by their shares.
fn maxout_row_backward(
    g: &[f32],
    d_gates: [&mut [f32]; 5],
    c_prev: &[f32],
    c_next: &[f32],
    dh: &[f32],
    d_cell: &mut [f32],
) {
    let h = dh.len();
    let (gi, gf, go) = (&g[..h], &g[h..2 * h], &g[2 * h..3 * h]);
    let (gc, share) = (&g[3 * h..4 * h], &g[4 * h..5 * h]);
    let [di, df, d_o, da, db] = d_gates.map(|g| &mut g[..h]);
    let (c_prev, c_next, d_cell) = (&c_prev[..h], &c_next[..h], &mut d_cell[..h]);
    for j in 0..h {
        let (i, f, o, c_in) = (gi[j], gf[j], go[j], gc[j]);
        let t = tanh(c_next[j]);
        let dc = d_cell[j] + dh[j] * o * (1.0 - t * t);
        di[j] = dc * c_in * i * (1.0 - i);
        df[j] = dc * c_prev[j] * f * (1.0 - f);
        d_o[j] = dh[j] * t * o * (1.0 - o);
        let d_in = dc * i;
        da[j] = d_in * share[j];
        db[j] = d_in * (1.0 - share[j]);
        d_cell[j] = dc * f;
    }
}
