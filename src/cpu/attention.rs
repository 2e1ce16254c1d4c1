//! CPU twin of `shaders/attention.wgsl`: decoding's attention over a KV
//! cache, each (row, head) in the kernel's order (scores, their maximum,
//! the sum of their exponentials as the kernel's workgroup adds them, then
//! the values weighted in key order).

use crate::backend::CachedAttention;
use rayon::prelude::*;

pub fn attend_cached(
    qkv: &[f32],
    keys: &mut [f32],
    values: &mut [f32],
    out: &mut [f32],
    l: &CachedAttention,
) {
    let (w, d, pos) = (l.width(), l.head_dim, l.position);
    let per_head = l.capacity * d;
    let per_row = l.heads * per_head;
    keys.par_chunks_mut(per_row)
        .zip(values.par_chunks_mut(per_row))
        .zip(out.par_chunks_mut(w))
        .enumerate()
        .for_each(|(row, ((keys, values), out))| {
            let qkv = &qkv[row * 3 * w..][..3 * w];
            for h in 0..l.heads {
                let part = |k: usize| &qkv[k * w + h * d..][..d];
                let keys = &mut keys[h * per_head..][..per_head];
                let values = &mut values[h * per_head..][..per_head];
                keys[pos * d..][..d].copy_from_slice(part(1));
                values[pos * d..][..d].copy_from_slice(part(2));
                let q = part(0);
                let scores: Vec<f32> = (0..=pos)
                    .map(|j| {
                        let k = &keys[j * d..][..d];
                        l.scale * q.iter().zip(k).fold(0.0, |s, (a, b)| a.mul_add(*b, s))
                    })
                    .collect();
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total = workgroup_sum(&weights);
                for (i, o) in out[h * d..][..d].iter_mut().enumerate() {
                    let sum = weights
                        .iter()
                        .enumerate()
                        .fold(0.0, |s, (j, e)| e.mul_add(values[j * d + i], s));
                    *o = sum / total;
                }
            }
        });
}

/// Threads of the kernel's workgroup.
const WG: usize = 256;

/// The sum of `x` as `workgroup_reduce` in `shaders/prelude.wgsl` takes it:
/// thread t adds the elements t, t + 256, ... in order, then each of the
/// first `stride` threads adds thread t + stride's sum, for strides 128
/// down to 1.
fn workgroup_sum(x: &[f32]) -> f32 {
    let mut partial = [0.0f32; WG];
    for (t, p) in partial.iter_mut().enumerate() {
        *p = x.iter().skip(t).step_by(WG).fold(0.0, |s, v| s + v);
    }
    let mut stride = WG / 2;
    while stride > 0 {
        let (low, high) = partial.split_at_mut(stride);
        for (a, b) in low.iter_mut().zip(&high[..stride]) {
            *a += b;
        }
        stride /= 2;
    }
    partial[0]
}
