//! CPU twin of `shaders/pool.wgsl`.

pub fn mean_pool(x: &[f32], y: &mut [f32], group: usize, cols: usize) {
    for (g, out) in y.chunks_mut(cols).enumerate() {
        out.fill(0.0);
        for row in x[g * group * cols..(g + 1) * group * cols].chunks(cols) {
            for (o, &v) in out.iter_mut().zip(row) {
                *o += v;
            }
        }
        out.iter_mut().for_each(|o| *o /= group as f32);
    }
}

pub fn mean_pool_backward(dy: &[f32], dx: &mut [f32], group: usize, cols: usize, accumulate: bool) {
    for (r, row) in dx.chunks_mut(cols).enumerate() {
        let g = &dy[(r / group) * cols..(r / group + 1) * cols];
        for (d, &v) in row.iter_mut().zip(g) {
            let v = v / group as f32;
            *d = if accumulate { *d + v } else { v };
        }
    }
}
