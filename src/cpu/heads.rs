//! CPU twins of `shaders/heads.wgsl`: strided copies between the
//! token-major and head-major layouts, one contiguous run of `head_dim`
//! values at a time.

use crate::backend::HeadLayout;
use rayon::prelude::*;

/// Start, in the token-major layout, of head h of token t of item b.
fn token_major_start(l: &HeadLayout, b: usize, h: usize, t: usize) -> usize {
    (b * l.seq + t) * l.row_stride + l.col_offset + h * l.head_dim
}

pub fn tokens_to_heads(src: &[f32], dst: &mut [f32], l: &HeadLayout) {
    let d = l.head_dim;
    dst[..l.len()]
        .par_chunks_mut(l.seq * d)
        .enumerate()
        .for_each(|(bh, out)| {
            let (b, h) = (bh / l.heads, bh % l.heads);
            for (t, run) in out.chunks_mut(d).enumerate() {
                let s = token_major_start(l, b, h, t);
                run.copy_from_slice(&src[s..s + d]);
            }
        });
}

pub fn heads_to_tokens(src: &[f32], dst: &mut [f32], l: &HeadLayout, accumulate: bool) {
    let d = l.head_dim;
    let per_item = l.seq * l.row_stride;
    // Item b's tokens are rows b * seq .. (b + 1) * seq of dst: one task per item.
    dst.par_chunks_mut(per_item)
        .take(l.batch)
        .enumerate()
        .for_each(|(b, rows)| {
            for h in 0..l.heads {
                for t in 0..l.seq {
                    let s = token_major_start(l, b, h, t) - b * per_item;
                    let from = &src[((b * l.heads + h) * l.seq + t) * d..][..d];
                    let to = &mut rows[s..s + d];
                    if accumulate {
                        to.iter_mut().zip(from).for_each(|(x, &v)| *x += v);
                    } else {
                        to.copy_from_slice(from);
                    }
                }
            }
        });
}
