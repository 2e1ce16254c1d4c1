//! CPU twins of `shaders/embedding.wgsl`.

use crate::backend::NO_ROW;

pub fn forward(table: &[f32], ids: &[u32], out: &mut [f32], dim: usize, accumulate: bool) {
    for (row, &id) in out.chunks_mut(dim).zip(ids) {
        if id == NO_ROW {
            if !accumulate {
                row.fill(0.0);
            }
            continue;
        }
        let src = &table[id as usize * dim..(id as usize + 1) * dim];
        for (o, &v) in row.iter_mut().zip(src) {
            *o = if accumulate { *o + v } else { v };
        }
    }
}

/// Sums in the same order as the GPU: per id, positions ascending.
pub fn backward(
    dout: &[f32],
    unique: &[u32],
    offsets: &[u32],
    order: &[u32],
    dtable: &mut [f32],
    dim: usize,
) {
    for (u, &id) in unique.iter().enumerate() {
        for c in 0..dim {
            let s: f32 = (offsets[u]..offsets[u + 1])
                .map(|k| dout[order[k as usize] as usize * dim + c])
                .sum();
            dtable[id as usize * dim + c] += s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_row_gathers_zeros_and_adds_nothing() {
        let table = [1.0, 2.0, 3.0, 4.0];
        let mut out = [9.0; 4];
        forward(&table, &[1, NO_ROW], &mut out, 2, false);
        assert_eq!(out, [3.0, 4.0, 0.0, 0.0]);
        let mut out = [9.0; 4];
        forward(&table, &[NO_ROW, 0], &mut out, 2, true);
        assert_eq!(out, [9.0, 9.0, 10.0, 11.0]);
    }
}
