//! CPU twins of `shaders/heads.wgsl`.

use crate::backend::HeadLayout;

/// Index in the token-major layout of head-major element i.
fn token_major_index(l: &HeadLayout, i: usize) -> usize {
    let e = i % l.head_dim;
    let t = (i / l.head_dim) % l.seq;
    let h = (i / (l.head_dim * l.seq)) % l.heads;
    let b = i / (l.head_dim * l.seq * l.heads);
    (b * l.seq + t) * l.row_stride + l.col_offset + h * l.head_dim + e
}

pub fn tokens_to_heads(src: &[f32], dst: &mut [f32], l: &HeadLayout) {
    for (i, d) in dst[..l.len()].iter_mut().enumerate() {
        *d = src[token_major_index(l, i)];
    }
}

pub fn heads_to_tokens(src: &[f32], dst: &mut [f32], l: &HeadLayout, accumulate: bool) {
    for (i, &v) in src[..l.len()].iter().enumerate() {
        let j = token_major_index(l, i);
        dst[j] = if accumulate { dst[j] + v } else { v };
    }
}
