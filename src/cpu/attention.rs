//! CPU twin of `shaders/attention.wgsl`.
//!
//! Self-attention computes the kernels' function another way: per item,
//! the heads' batched products on the CPU's matmul kernel, with the
//! `[heads, seq, seq]` weights in scratch that lives for that item only.
//! The backward recomputes the weights from each query's log-sum-exp, as
//! the kernels do. (Taking the kernels' tiles of 16 keys pair by pair
//! made a `shapes` training step 1.6 times as long on the CPU.)
//!
//! Decoding's attention over a KV cache, each (row, head) in the kernel's
//! order (scores, their maximum, the sum of their exponentials as the
//! kernel's workgroup adds them, then the values weighted in key order).

use super::elementwise::{exp, exp_shifted};
use super::matmul::matmul;
use crate::backend::{AttentionShape, CachedAttention};
use rayon::prelude::*;

/// One item of a batch: its shape (batch 1), its slices, and which keys
/// each query sees.
struct Item<'a> {
    l: AttentionShape,
    qkv: &'a [f32],
    mask: Option<&'a [u32]>,
}

impl<'a> Item<'a> {
    fn new(l: &AttentionShape, b: usize, qkv: &'a [f32], mask: Option<&'a [u32]>) -> Self {
        let s = l.seq;
        Item {
            l: AttentionShape { batch: 1, ..*l },
            qkv: &qkv[b * s * 3 * l.channels()..][..s * 3 * l.channels()],
            mask: mask.map(|m| &m[b * s..][..s]),
        }
    }

    /// Whether query q sees key j.
    fn visible(&self, q: usize, j: usize) -> bool {
        (!self.l.causal || j <= q) && self.mask.is_none_or(|m| m[j] != 0)
    }

    /// The weights `[heads, seq, seq]`, from scale q k (and, with `lse`
    /// empty, each query's log-sum-exp written to `write_lse`): exp(score -
    /// lse) where visible, else 0.
    fn weights(&self, lse: Option<&[f32]>, write_lse: &mut [f32]) -> Vec<f32> {
        let s = self.l.seq;
        let mut w = vec![0.0; self.l.heads * s * s];
        matmul(self.qkv, self.qkv, &mut w, &self.l.products().scores);
        let mut exps = Vec::with_capacity(s);
        for (r, row) in w.chunks_mut(s).enumerate() {
            let q = r % s;
            // A causal query's keys after it are hidden: zeroed, not
            // exponentiated. (Their exact zeros change no sum below.)
            let reach = if self.l.causal { q + 1 } else { s };
            let (row, after) = row.split_at_mut(reach);
            after.fill(0.0);
            let lse = match lse {
                Some(lse) => lse[r],
                None => {
                    write_lse[r] = self.log_sum_exp(q, row, &mut exps);
                    write_lse[r]
                }
            };
            // Every score, then the hidden ones zeroed: a branch per key
            // would keep the exponentials from vectorising.
            exp_shifted(lse, row);
            self.hide(q, row);
        }
        w
    }

    /// Query q's log-sum-exp over the keys it sees (0 where it sees none):
    /// the largest score, then the exponentials in one vectorised pass
    /// (`exps` is scratch), summed in key order with the hidden keys' as
    /// exact zeros, so the bits are those of a sum over the seen keys.
    fn log_sum_exp(&self, q: usize, scores: &[f32], exps: &mut Vec<f32>) -> f32 {
        let max = (0..scores.len())
            .filter(|&j| self.visible(q, j))
            .map(|j| scores[j])
            .fold(f32::MIN, f32::max);
        exps.clear();
        exps.extend_from_slice(scores);
        exp_shifted(max, exps);
        self.hide(q, exps);
        let sum: f32 = exps.iter().sum();
        if sum > 0.0 { max + sum.ln() } else { 0.0 }
    }

    /// Zeroes query q's weights of the keys it does not see.
    fn hide(&self, q: usize, row: &mut [f32]) {
        for (j, x) in row.iter_mut().enumerate() {
            if !self.visible(q, j) {
                *x = 0.0;
            }
        }
    }
}

pub fn forward(
    qkv: &[f32],
    mask: Option<&[u32]>,
    out: &mut [f32],
    lse: &mut [f32],
    l: &AttentionShape,
) {
    let (s, w) = (l.seq, l.channels());
    if out.is_empty() {
        return;
    }
    out.par_chunks_mut(s * w)
        .zip(lse.par_chunks_mut(l.heads * s))
        .enumerate()
        .for_each(|(b, (out, lse))| {
            let item = Item::new(l, b, qkv, mask);
            let weights = item.weights(None, lse);
            matmul(&weights, item.qkv, out, &item.l.products().weighted_values);
        });
}

#[allow(clippy::too_many_arguments)]
pub fn backward(
    qkv: &[f32],
    mask: Option<&[u32]>,
    out: &[f32],
    lse: &[f32],
    d_out: &[f32],
    dqkv: &mut [f32],
    l: &AttentionShape,
) {
    let (s, w, d) = (l.seq, l.channels(), l.head_dim);
    if dqkv.is_empty() {
        return;
    }
    dqkv.par_chunks_mut(s * 3 * w)
        .enumerate()
        .for_each(|(b, dqkv)| {
            let item = Item::new(l, b, qkv, mask);
            let products = item.l.products();
            let (out, d_out) = (&out[b * s * w..][..s * w], &d_out[b * s * w..][..s * w]);
            let weights = item.weights(Some(&lse[b * l.heads * s..][..l.heads * s]), &mut []);
            let mut d_scores = vec![0.0; weights.len()];
            matmul(d_out, item.qkv, &mut d_scores, &products.d_weights);
            matmul(&weights, d_out, dqkv, &products.d_values);
            // d score = weight (d weight - d_out . out), row by row.
            for (r, (ds, p)) in d_scores.chunks_mut(s).zip(weights.chunks(s)).enumerate() {
                let (h, q) = (r / s, r % s);
                let at = q * w + h * d;
                let delta: f32 = (at..at + d).map(|e| d_out[e] * out[e]).sum();
                for (ds, p) in ds.iter_mut().zip(p) {
                    *ds = p * (*ds - delta);
                }
            }
            matmul(&d_scores, item.qkv, dqkv, &products.d_queries);
            matmul(&d_scores, item.qkv, dqkv, &products.d_keys);
        });
}

pub fn attend_cached(
    qkv: &[f32],
    keys: &mut [f32],
    values: &mut [f32],
    out: &mut [f32],
    l: &CachedAttention,
) {
    let w = l.width();
    let per_row = l.heads * l.capacity * l.head_dim;
    keys.par_chunks_mut(per_row)
        .zip(values.par_chunks_mut(per_row))
        .zip(out.par_chunks_mut(w))
        .enumerate()
        .for_each(|(row, ((keys, values), out))| {
            let qkv = &qkv[row * 3 * w..][..3 * w];
            #[cfg(target_arch = "x86_64")]
            if fma::available() {
                // SAFETY: the CPU has FMA, checked just above.
                return unsafe { fma::attend_row(qkv, keys, values, out, l) };
            }
            attend_row(qkv, keys, values, out, l)
        });
}

/// One row's step of cached attention, every head: its key and value
/// appended to the cache, then its query against all the row's keys.
///
/// Each score is one fused multiply-add chain over the head's elements
/// in order, and each output element one over the keys in order, as the
/// kernel's threads take them; the chains of several keys (or of the
/// head's elements) run side by side so that neither waits on the last
/// add's latency.
#[inline(always)]
fn attend_row(
    qkv: &[f32],
    keys: &mut [f32],
    values: &mut [f32],
    out: &mut [f32],
    l: &CachedAttention,
) {
    /// Keys whose scores are computed side by side.
    const KEYS: usize = 8;
    let (w, d, pos) = (l.width(), l.head_dim, l.position);
    let per_head = l.capacity * d;
    // The scores, then their exponentials, of one head at a time.
    let mut weights = vec![0.0f32; pos + 1];
    for h in 0..l.heads {
        let part = |k: usize| &qkv[k * w + h * d..][..d];
        let keys = &mut keys[h * per_head..][..per_head];
        let values = &mut values[h * per_head..][..per_head];
        keys[pos * d..][..d].copy_from_slice(part(1));
        values[pos * d..][..d].copy_from_slice(part(2));
        let q = part(0);
        // Plain loops: an iterator's fold would be a function of its own,
        // compiled without FMA, calling the software `fmaf` per term.
        let whole = weights.len() / KEYS * KEYS;
        for (block, scores) in weights[..whole].chunks_exact_mut(KEYS).enumerate() {
            let keys = &keys[block * KEYS * d..][..KEYS * d];
            let mut dots = [0.0f32; KEYS];
            for i in 0..d {
                for (t, dot) in dots.iter_mut().enumerate() {
                    *dot = q[i].mul_add(keys[t * d + i], *dot);
                }
            }
            for (score, dot) in scores.iter_mut().zip(dots) {
                *score = l.scale * dot;
            }
        }
        for (j, score) in weights.iter_mut().enumerate().skip(whole) {
            let k = &keys[j * d..][..d];
            let mut dot = 0.0f32;
            for i in 0..d {
                dot = q[i].mul_add(k[i], dot);
            }
            *score = l.scale * dot;
        }
        let max = weights.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        for weight in weights.iter_mut() {
            *weight = exp(*weight - max);
        }
        let total = workgroup_sum(&weights);
        let out = &mut out[h * d..][..d];
        out.fill(0.0);
        for (j, &weight) in weights.iter().enumerate() {
            for (o, &v) in out.iter_mut().zip(&values[j * d..][..d]) {
                *o = weight.mul_add(v, *o);
            }
        }
        for o in out.iter_mut() {
            *o /= total;
        }
    }
}

/// `attend_row` compiled for CPUs with FMA, chosen at run time: its fused
/// multiply-adds (the GPU kernel's, so that both pick the same words) are
/// then one instruction each instead of a call to a software `fmaf`.
#[cfg(target_arch = "x86_64")]
mod fma {
    use super::CachedAttention;

    #[target_feature(enable = "fma")]
    pub(super) fn attend_row(
        qkv: &[f32],
        keys: &mut [f32],
        values: &mut [f32],
        out: &mut [f32],
        l: &CachedAttention,
    ) {
        super::attend_row(qkv, keys, values, out, l)
    }

    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("fma")
    }
}

/// Threads of the kernel's workgroup.
const WG: usize = 256;

/// The sum of `x` (attention weights: never negative) as
/// `workgroup_reduce` in `shaders/prelude.wgsl` takes it: thread t adds the
/// elements t, t + 256, ... in order, then each of the first `stride`
/// threads adds thread t + stride's sum, for strides 128 down to 1.
/// Threads past the elements hold +0, which changes no sum of non-negative
/// numbers, so they and the additions of them are left out: a short row
/// (a caption's few positions) costs its length, not the workgroup's.
fn workgroup_sum(x: &[f32]) -> f32 {
    let mut partial = [0.0f32; WG];
    let mut holding = x.len().min(WG);
    for (t, p) in partial[..holding].iter_mut().enumerate() {
        *p = x[t..].iter().step_by(WG).fold(0.0, |s, v| s + v);
    }
    let mut stride = WG / 2;
    while stride > 0 {
        if stride < holding {
            let (low, high) = partial.split_at_mut(stride);
            for (a, b) in low.iter_mut().zip(&high[..holding - stride]) {
                *a += b;
            }
            holding = stride;
        }
        stride /= 2;
    }
    partial[0]
}

#[cfg(test)]
mod tests {
    use super::{WG, workgroup_sum};
    use rand::{Rng, SeedableRng};

    /// The workgroup's reduction with every thread and stride taken.
    fn every_thread(x: &[f32]) -> f32 {
        let mut partial = [0.0f32; WG];
        for (t, p) in partial.iter_mut().enumerate() {
            *p = x.iter().skip(t).step_by(WG).fold(0.0, |s, v| s + v);
        }
        let mut stride = WG / 2;
        while stride > 0 {
            for t in 0..stride {
                partial[t] += partial[t + stride];
            }
            stride /= 2;
        }
        partial[0]
    }

    #[test]
    fn a_short_row_sums_to_the_same_bits_as_the_whole_workgroup() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for len in (0..300).chain([511, 512, 513, 1000]) {
            let x: Vec<f32> = (0..len)
                .map(|_| match rng.random_range(0..4) {
                    0 => 0.0,
                    1 => rng.random::<f32>() * 1e-30,
                    _ => rng.random::<f32>() * 10.0,
                })
                .collect();
            assert_eq!(
                workgroup_sum(&x).to_bits(),
                every_thread(&x).to_bits(),
                "{len} weights"
            );
        }
    }
}
