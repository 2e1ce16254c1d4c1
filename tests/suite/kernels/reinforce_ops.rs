//! The ops REINFORCE needs, on the CPU against hand computations and
//! finite differences: the signed per-sequence weighted log-likelihood
//! (`SequenceLikelihood`, over `spread_sequence_weights`) and the entropy
//! of the softmax. Their GPU kernels are checked against these in
//! tests/suite/kernels/gpu_parity.rs.

use crate::common;

use captune::backend::Backend;
use captune::cpu::CpuBackend;
use captune::ops::sequence_likelihood::SequenceLikelihood;
use common::{probes, random};

const PAD: u32 = 0;

fn log_softmax(z: &[f32]) -> Vec<f64> {
    let max = z.iter().fold(f32::MIN, |m, &v| m.max(v)) as f64;
    let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    z.iter().map(|&v| v as f64 - lse).collect()
}

/// Central differences of `loss` at up to 40 coordinates of `x` against
/// `analytic`.
#[track_caller]
fn check(what: &str, x: &[f32], analytic: &[f32], loss: impl Fn(&[f32]) -> f64) {
    let eps = 1e-2;
    let mut x = x.to_vec();
    for i in probes(what, x.len(), 40) {
        let orig = x[i];
        x[i] = orig + eps;
        let up = loss(&x);
        x[i] = orig - eps;
        let down = loss(&x);
        x[i] = orig;
        let numeric = ((up - down) / (2.0 * eps as f64)) as f32;
        assert!(
            (numeric - analytic[i]).abs() <= 1e-3 + 1e-2 * numeric.abs(),
            "{what}: d/dx[{i}] is {} analytically but {numeric} numerically",
            analytic[i]
        );
    }
}

/// Two sequences of three positions over five tokens; the second ends
/// after two tokens (padding on its last row).
fn sequences() -> (Vec<f32>, Vec<u32>) {
    (
        random(6 * 5, 1).iter().map(|v| 2.0 * v).collect(),
        vec![3, 1, 4, 2, 4, PAD],
    )
}

fn sequence_loss(b: &CpuBackend, logits: &[f32], targets: &[u32], weights: &[f32]) -> f32 {
    let mut sl = SequenceLikelihood::new(b, 2, 3, 5, PAD);
    sl.forward(
        b,
        &logits.to_vec(),
        &targets.to_vec(),
        &weights.to_vec(),
        2.0,
    );
    b.to_vec(&sl.loss)[0]
}

#[test]
fn sequence_likelihood_is_the_signed_weighted_sum_not_renormalised() {
    let b = CpuBackend::new();
    let (logits, targets) = sequences();
    // log p of each row's target, by hand.
    let logp: Vec<f64> = (0..6)
        .map(|r| log_softmax(&logits[r * 5..(r + 1) * 5])[targets[r] as usize])
        .collect();
    let per_sequence = [logp[0] + logp[1] + logp[2], logp[3] + logp[4]];
    // Weights of both signs, summing to zero: CrossEntropy would have no
    // loss here; this loss is -(1/N) sum_b w_b sum_t log p.
    for weights in [[1.5f32, -1.5], [-0.5, 2.0], [0.0, 0.0]] {
        let want =
            -(weights[0] as f64 * per_sequence[0] + weights[1] as f64 * per_sequence[1]) / 2.0;
        let got = sequence_loss(&b, &logits, &targets, &weights);
        assert!(
            (got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
            "weights {weights:?}: loss {got}, by hand {want}"
        );
    }
}

#[test]
fn sequence_likelihood_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (logits, targets) = sequences();
    for weights in [[1.5f32, -1.5], [-0.5, 2.0]] {
        let mut sl = SequenceLikelihood::new(&b, 2, 3, 5, PAD);
        sl.forward(&b, &logits, &targets, &weights.to_vec(), 2.0);
        // Accumulating onto a gradient that holds something else.
        let before = random(logits.len(), 2);
        let mut dlogits = before.clone();
        sl.backward(&b, &logits, &targets, &mut dlogits, true);
        let added: Vec<f32> = dlogits.iter().zip(&before).map(|(a, b)| a - b).collect();
        // Padding rows get no gradient.
        assert!(added[25..30].iter().all(|&g| g.abs() < 1e-7), "{added:?}");
        check(
            &format!("sequence likelihood {weights:?}"),
            &logits,
            &added,
            |z| sequence_loss(&b, z, &targets, &weights) as f64,
        );
    }
}

#[test]
fn spread_sequence_weights_puts_each_weight_on_its_real_tokens() {
    let b = CpuBackend::new();
    let mut coef = vec![9.0; 6];
    b.spread_sequence_weights(
        &vec![2.0, -3.0],
        &vec![5, 1, PAD, 7, 7, 7],
        3,
        PAD,
        0.5,
        &mut coef,
    );
    assert_eq!(coef, vec![1.0, 1.0, 0.0, -1.5, -1.5, -1.5]);
}

fn entropies(b: &CpuBackend, logits: &[f32], vocab: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = logits.len() / vocab;
    let (mut h, mut lse) = (vec![0.0; rows], vec![0.0; rows]);
    b.softmax_entropy(&logits.to_vec(), vocab, &mut h, &mut lse);
    (h, lse)
}

#[test]
fn softmax_entropy_matches_hand_computation() {
    let b = CpuBackend::new();
    let vocab = 7;
    // Uniform (ln 7), nearly one-hot (about 0), and random rows.
    let mut logits = vec![0.5; vocab];
    logits.extend((0..vocab).map(|j| if j == 2 { 40.0 } else { 0.0 }));
    logits.extend(random(vocab, 3).iter().map(|v| 3.0 * v));
    let (h, _) = entropies(&b, &logits, vocab);
    let lp = log_softmax(&logits[14..21]);
    let by_hand = -lp.iter().map(|l| l.exp() * l).sum::<f64>();
    assert!((h[0] as f64 - (vocab as f64).ln()).abs() < 1e-5, "{h:?}");
    assert!(h[1].abs() < 1e-5, "{h:?}");
    assert!((h[2] as f64 - by_hand).abs() < 1e-5, "{h:?} vs {by_hand}");
}

#[test]
fn softmax_entropy_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (rows, vocab) = (3, 6);
    let logits: Vec<f32> = random(rows * vocab, 4).iter().map(|v| 2.0 * v).collect();
    let r = random(rows, 5);
    let (h, lse) = entropies(&b, &logits, vocab);
    let mut dlogits = vec![0.0; rows * vocab];
    b.softmax_entropy_backward(&logits, vocab, &h, &lse, &r, &mut dlogits, false);
    check("softmax entropy", &logits, &dlogits, |z| {
        let (h, _) = entropies(&b, z, vocab);
        h.iter().zip(&r).map(|(&h, &r)| h as f64 * r as f64).sum()
    });
}
