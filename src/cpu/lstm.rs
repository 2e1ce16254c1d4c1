//! CPU twin of `shaders/lstm.wgsl`, a task per row, with the vectorisable
//! `exp` and `tanh` of the elementwise kernels (libm's tanhf took a tenth
//! of an LSTM training step).

use super::elementwise::{exp, tanh};
use crate::backend::LstmStep;
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

/// The four gates of a row, `h` each.
fn gates_of(g: &mut [f32], h: usize) -> [&mut [f32]; 4] {
    let (i, rest) = g[..4 * h].split_at_mut(h);
    let (f, rest) = rest.split_at_mut(h);
    let (c, o) = rest.split_at_mut(h);
    [i, f, c, o]
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
            let [gi, gf, gc, go] = gates_of(g, h);
            let (c_prev, c_next) = slots(c, prev, next, h);
            let out = &mut out[next..next + h];
            // Slices of one length, indexed alike: the loop vectorises.
            for j in 0..h {
                let (i, f) = (sigmoid(gi[j]), sigmoid(gf[j]));
                let (c_in, o) = (tanh(gc[j]), sigmoid(go[j]));
                (gi[j], gf[j], gc[j], go[j]) = (i, f, c_in, o);
                let cell = f * c_prev[j] + i * c_in;
                c_next[j] = cell;
                out[j] = o * tanh(cell);
            }
        });
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
            let (gi, gf, gc, go) = (&g[..h], &g[h..2 * h], &g[2 * h..3 * h], &g[3 * h..4 * h]);
            let [di, df, dgc, d_o] = gates_of(dg, h);
            let (c_prev, c_next) = (&c[prev..prev + h], &c[next..next + h]);
            let (dh, dc_row) = (&dh[next..next + h], &mut dc_row[..h]);
            for j in 0..h {
                let (i, f, c_in, o) = (gi[j], gf[j], gc[j], go[j]);
                let t = tanh(c_next[j]);
                let dc = dc_row[j] + dh[j] * o * (1.0 - t * t);
                di[j] = dc * c_in * i * (1.0 - i);
                df[j] = dc * c_prev[j] * f * (1.0 - f);
                dgc[j] = dc * i * (1.0 - c_in * c_in);
                d_o[j] = dh[j] * t * o * (1.0 - o);
                dc_row[j] = dc * f;
            }
        });
}
