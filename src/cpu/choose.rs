//! CPU twin of `shaders/choose.wgsl`: the vocabulary split into the
//! kernel's 256 lanes, each summed in id order and the lanes in lane
//! order, the same f32 arithmetic and the same random bits, so both
//! backends choose the same ids for the same seed (up to a device's `exp`
//! and `log` rounding, for a draw on the boundary between two tokens).

use crate::backend::{Candidates, ChoiceRule, TokenChoice};
use rayon::prelude::*;

fn mix32(v: u32) -> u32 {
    let mut x = v;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// A uniform number in [0, 1) from the counter (seed, row, step).
pub fn random_unit(seed: u64, row: u32, step: u32) -> f32 {
    let mut h = mix32(seed as u32 ^ 0x9e37_79b9);
    h = mix32(h ^ (seed >> 32) as u32);
    h = mix32(h ^ row);
    h = mix32(h ^ step);
    (h >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Gumbel noise -ln(-ln u) for token j, u from the counter
/// (seed, row, step, j).
pub fn gumbel(seed: u64, row: u32, step: u32, j: u32) -> f32 {
    let mut h = mix32(seed as u32 ^ 0x85eb_ca6b);
    h = mix32(h ^ (seed >> 32) as u32);
    h = mix32(h ^ row);
    h = mix32(h ^ step);
    h = mix32(h ^ j);
    gumbel_of_bits(h >> 8)
}

/// The noise of 24 random bits: u = (bits + 0.5) / 2^24, which f32
/// rounds to 1 for the largest bits (one draw in 2^24), so -ln u is kept
/// at least the smallest normal float: the noise stays finite (at most
/// 87.3), since an infinite one turns the Gumbel-softmax into NaN.
pub fn gumbel_of_bits(bits: u32) -> f32 {
    let u = (bits as f32 + 0.5) * (1.0 / 16_777_216.0);
    -(-u.ln()).max(f32::MIN_POSITIVE).ln()
}

/// Larger floats get larger keys.
fn order_key(x: f32) -> u32 {
    let bits = x.to_bits();
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// Threads of the kernel's workgroup: the lanes a row's vocabulary is
/// split among.
const LANES: usize = 256;

/// Lane t's contiguous chunk of a vocabulary of `v` tokens.
fn chunk(v: usize, lane: usize) -> std::ops::Range<usize> {
    let per = v.div_ceil(LANES);
    let begin = (lane * per).min(v);
    begin..(begin + per).min(v)
}

/// Each lane's chunk summed in id order, then the lanes' sums in lane
/// order: the kernel's order.
fn lane_sum(v: usize, term: impl Fn(usize) -> Option<f32>) -> f32 {
    lane_sums(v, term).iter().fold(0.0, |s, m| s + m)
}

fn lane_sums(v: usize, term: impl Fn(usize) -> Option<f32>) -> Vec<f32> {
    (0..LANES)
        .map(|t| chunk(v, t).filter_map(&term).fold(0.0, |s, x| s + x))
        .collect()
}

/// The log-sum-exp of a row over the tokens that may be chosen, its sum in
/// the kernel's order.
fn log_sum_exp(z: &[f32], allowed: impl Fn(usize) -> bool) -> f32 {
    let top = (0..z.len())
        .filter(|&j| allowed(j))
        .fold(f32::NEG_INFINITY, |m, j| m.max(z[j]));
    let sum = lane_sum(z.len(), |j| allowed(j).then(|| (z[j] - top).exp()));
    top + sum.ln()
}

/// The choice for one row of logits, given the previous chosen token
/// (None at step 0): (token, its log-probability).
fn choose_row(z: &[f32], c: &TokenChoice, row: u32, previous: Option<u32>) -> (u32, f32) {
    if previous.is_some_and(|t| t == c.eos || t == c.pad) {
        return (c.pad, 0.0);
    }
    let v = z.len();
    let allowed = |j: usize| {
        let j = j as u32;
        j != c.banned && j != c.bos && j != c.pad
    };
    let lse = log_sum_exp(z, allowed);
    // The argmax in id order, lowest id on ties (exact in any order).
    let argmax = |value: &dyn Fn(usize) -> f32| {
        let mut chosen = None::<(usize, f32)>;
        for j in (0..v).filter(|&j| allowed(j)) {
            let x = value(j);
            if chosen.is_none_or(|(_, best)| x > best) {
                chosen = Some((j, x));
            }
        }
        chosen.map_or(0, |c| c.0)
    };
    let chosen = match c.rule {
        ChoiceRule::Greedy => argmax(&|j| z[j]),
        ChoiceRule::Gumbel => {
            argmax(&|j| z[j] + gumbel(c.seed, c.first_row + row, c.step, j as u32))
        }
        ChoiceRule::Sample(s) => {
            let tempered = |j: usize| (z[j] - lse) / s.temperature;
            let candidates = (0..v).filter(|&j| allowed(j)).count();
            let best = (0..v)
                .filter(|&j| allowed(j))
                .fold(f32::MIN, |m, j| m.max(tempered(j)));
            let kept = |j: usize, floor: u32, threshold: u32| {
                let key = order_key(tempered(j));
                allowed(j) && key >= floor && key >= threshold
            };
            let mass_term = |floor: u32, threshold: u32| {
                move |j: usize| kept(j, floor, threshold).then(|| (tempered(j) - best).exp())
            };
            // The largest key in [lo, u32::MAX] that `keeps`.
            let bisect = |mut lo: u32, keeps: &dyn Fn(u32) -> bool| {
                let mut hi = u32::MAX;
                while lo < hi {
                    let mid = hi - (hi - lo) / 2;
                    if keeps(mid) {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
                lo
            };
            let mut floor = 0;
            if s.top_k > 0 && (s.top_k as usize) < candidates {
                let count = |threshold: u32| (0..v).filter(|&j| kept(j, 0, threshold)).count();
                floor = bisect(0, &|mid| count(mid) >= s.top_k as usize);
            }
            if s.top_p < 1.0 {
                let goal = s.top_p * lane_sum(v, mass_term(floor, 0));
                floor = bisect(floor, &|mid| lane_sum(v, mass_term(floor, mid)) >= goal);
            }
            // The lane whose share of the kept mass the draw falls in walks
            // its kept tokens from the lanes' running total before it; a
            // draw at the very top (rounding) takes the last kept token.
            let masses = lane_sums(v, mass_term(floor, 0));
            let total = masses.iter().fold(0.0f32, |s, m| s + m);
            let draw = random_unit(c.seed, c.first_row + row, c.step) * total;
            let last_kept = (0..v).rev().find(|&j| kept(j, floor, 0)).unwrap_or(0);
            let mut before = 0.0f32;
            let mut chosen = last_kept;
            for (t, mass) in masses.iter().enumerate() {
                if before <= draw && draw < before + mass {
                    let mut acc = before;
                    for j in chunk(v, t).filter(|&j| kept(j, floor, 0)) {
                        chosen = j;
                        acc += (tempered(j) - best).exp();
                        if draw < acc {
                            break;
                        }
                    }
                    break;
                }
                before += mass;
            }
            chosen
        }
    };
    (chosen as u32, z[chosen] - lse)
}

pub fn choose_tokens(
    logits: &[f32],
    c: &TokenChoice,
    next: &mut [u32],
    history: &mut [u32],
    logprobs: &mut [f32],
) {
    let (v, steps, step) = (c.vocab, c.steps, c.step as usize);
    let chosen: Vec<(u32, f32)> = (0..c.rows)
        .into_par_iter()
        .map(|r| {
            let previous = (step > 0).then(|| history[r * steps + step - 1]);
            choose_row(&logits[r * v..(r + 1) * v], c, r as u32, previous)
        })
        .collect();
    for (r, (token, logprob)) in chosen.into_iter().enumerate() {
        history[r * steps + step] = token;
        logprobs[r * steps + step] = logprob;
        next[r] = token;
    }
}

/// CPU twin of the `top_candidates` kernel: the best `count` allowed
/// tokens of each row by (log-probability, then lowest id), as each of the
/// kernel's rounds takes the next.
pub fn top_candidates(logits: &[f32], c: &Candidates, candidates: &mut [u32]) {
    let (v, count) = (c.vocab, c.count);
    if count == 0 {
        return;
    }
    candidates
        .par_chunks_mut(2 * count)
        .enumerate()
        .for_each(|(r, out)| {
            let z = &logits[r * v..(r + 1) * v];
            let allowed = |j: usize| c.allowed(j as u32);
            let lse = log_sum_exp(z, allowed);
            let logprob = |j: usize| z[j] - lse;
            // Kept best first; a token goes in after every kept one it
            // does not beat, so ties keep id order.
            let mut best: Vec<usize> = Vec::with_capacity(count + 1);
            for j in (0..v).filter(|&j| allowed(j)) {
                if best.len() == count && logprob(j) <= logprob(best[count - 1]) {
                    continue;
                }
                let at = best.partition_point(|&k| logprob(k) >= logprob(j));
                best.insert(at, j);
                best.truncate(count);
            }
            for (n, pair) in out.chunks_mut(2).enumerate() {
                let (id, logprob) = match best.get(n) {
                    Some(&j) => (j as u32, logprob(j)),
                    None => (u32::MAX, f32::NEG_INFINITY),
                };
                pair.copy_from_slice(&[id, logprob.to_bits()]);
            }
        });
}

/// CPU twin of the `gumbel_logits` kernel.
pub fn gumbel_logits(
    logits: &[f32],
    vocab: usize,
    positions: usize,
    seed: u64,
    first_row: u32,
    tau: f32,
    out: &mut [f32],
) {
    out.par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .enumerate()
        .for_each(|(r, (o, z))| {
            let (sequence, step) = ((r / positions) as u32, (r % positions) as u32);
            for (j, (o, &z)) in o.iter_mut().zip(z).enumerate() {
                *o = (z + gumbel(seed, first_row + sequence, step, j as u32)) / tau;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gumbel_noise_is_finite_for_every_draw() {
        // The largest bits round u to exactly 1 in f32.
        assert_eq!((0xff_ffff as f32 + 0.5) * (1.0 / 16_777_216.0), 1.0);
        for bits in [0, 1, 0x80_0000, 0xff_fffe, 0xff_ffff] {
            let g = gumbel_of_bits(bits);
            assert!(g.is_finite(), "{bits:#x}: {g}");
        }
        assert!((gumbel_of_bits(0xff_ffff) - 87.336_54).abs() < 1e-3);
        // Every other draw is -ln(-ln u) as it was.
        let u = (0x12_3456 as f32 + 0.5) * (1.0 / 16_777_216.0);
        assert_eq!(gumbel_of_bits(0x12_3456), -(-u.ln()).ln());
    }
}
