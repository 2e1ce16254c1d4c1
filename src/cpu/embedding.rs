//! CPU twins of `shaders/embedding.wgsl`.

pub fn forward(table: &[f32], ids: &[u32], out: &mut [f32], dim: usize, accumulate: bool) {
    for (row, &id) in out.chunks_mut(dim).zip(ids) {
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
