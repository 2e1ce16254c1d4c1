//! Finite-difference checks of every CPU backward. The loss is
//! L = sum(output * r) for a fixed random r, so the backward is fed dy = r.
//! Central differences in f32 with the loss summed in f64.

use crate::common;

use captune::backend::{
    Backend, CellGates, LstmStep, Matmul, SoftmaxRows, TokenIndex, VocabSubsets,
};
use captune::cpu::CpuBackend;
use captune::index::FULL_VOCAB;
use captune::ops::additive_attention::{AdditiveAttention, AdditiveShape, Rows};
use captune::ops::attention::{Attention, AttentionKernel, AttentionShape};
use captune::ops::contrastive::Contrastive;
use captune::ops::cross_attention::{CrossAttention, CrossAttentionShape};
use captune::ops::cross_entropy::CrossEntropy;
use captune::ops::linear::Linear;
use common::{Probing, assert_close, check_gradient, random, random_ids};

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Compares `analytic` with central differences of `loss` at 48 random
/// coordinates of `x` (seeded by `what`; all of them when there are fewer).
#[track_caller]
fn check(what: &str, x: &[f32], analytic: &[f32], loss: impl FnMut(&[f32]) -> f64) {
    let probing = Probing {
        eps: 1e-2,
        count: 48,
        atol: 2e-3,
        rtol: 2e-2,
    };
    check_gradient(what, x, analytic, loss, &probing);
}

#[test]
fn linear_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let l = Linear {
        rows: 5,
        inputs: 7,
        outputs: 3,
    };
    let (x, w, bias) = (random(35, 1), random(21, 2), random(3, 3));
    let r = random(15, 4);
    let forward = |x: &[f32], w: &[f32], bias: &[f32]| {
        let mut y = vec![0.0; 15];
        l.forward(&b, &x.to_vec(), &w.to_vec(), Some(&bias.to_vec()), &mut y);
        dot(&y, &r)
    };
    let (mut dw, mut dbias, mut dx) = (vec![0.0; 21], vec![0.0; 3], vec![0.0; 35]);
    l.backward(
        &b,
        &r,
        &x,
        &w,
        &mut dw,
        Some(&mut dbias),
        Some((&mut dx, false)),
    );
    check("linear dx", &x, &dx, |x| forward(x, &w, &bias));
    check("linear dW", &w, &dw, |w| forward(&x, w, &bias));
    check("linear dbias", &bias, &dbias, |bias| forward(&x, &w, bias));
}

#[test]
fn gelu_mlp_backward_matches_finite_differences() {
    // y = GELU(x W1 + b1) W2 + b2, with the fused GELU forward and the
    // second layer's backward through the GELU.
    let b = CpuBackend::new();
    let (rows, inputs, hidden, outputs) = (4, 5, 6, 3);
    let l1 = Linear {
        rows,
        inputs,
        outputs: hidden,
    };
    let l2 = Linear {
        rows,
        inputs: hidden,
        outputs,
    };
    let (x, w1, b1) = (
        random(rows * inputs, 1),
        random(inputs * hidden, 2),
        random(hidden, 3),
    );
    let (w2, b2) = (random(hidden * outputs, 4), random(outputs, 5));
    let r = random(rows * outputs, 6);
    let forward = |x: &[f32], w1: &[f32], b1: &[f32], w2: &[f32]| {
        let (mut pre, mut act) = (vec![0.0; rows * hidden], vec![0.0; rows * hidden]);
        l1.forward_gelu(
            &b,
            &x.to_vec(),
            &w1.to_vec(),
            &b1.to_vec(),
            &mut pre,
            &mut act,
        );
        let mut y = vec![0.0; rows * outputs];
        l2.forward(&b, &act, &w2.to_vec(), Some(&b2), &mut y);
        (dot(&y, &r), pre, act)
    };
    let (_, pre, act) = forward(&x, &w1, &b1, &w2);
    let (mut dw2, mut db2, mut d_pre) = (
        vec![0.0; w2.len()],
        vec![0.0; outputs],
        vec![0.0; pre.len()],
    );
    l2.backward_through_gelu(
        &b,
        &r,
        &act,
        &w2,
        &mut dw2,
        Some(&mut db2),
        &pre,
        &mut d_pre,
    );
    let (mut dw1, mut db1, mut dx) = (vec![0.0; w1.len()], vec![0.0; hidden], vec![0.0; x.len()]);
    l1.backward(
        &b,
        &d_pre,
        &x,
        &w1,
        &mut dw1,
        Some(&mut db1),
        Some((&mut dx, false)),
    );
    check("gelu mlp dx", &x, &dx, |x| forward(x, &w1, &b1, &w2).0);
    check("gelu mlp dW1", &w1, &dw1, |w1| forward(&x, w1, &b1, &w2).0);
    check("gelu mlp db1", &b1, &db1, |b1| forward(&x, &w1, b1, &w2).0);
    check("gelu mlp dW2", &w2, &dw2, |w2| forward(&x, &w1, &b1, w2).0);
}

#[test]
fn transposed_and_batched_matmul_backward_matches_finite_differences() {
    // C = A^T B^T per batch item; dA = (dC^T B^T)... expressed with the same op.
    let b = CpuBackend::new();
    let (batch, m, n, k) = (2, 3, 4, 5);
    let s = Matmul::batched(batch, m, n, k).trans_a().trans_b();
    let (a, w, r) = (
        random(batch * k * m, 1),
        random(batch * n * k, 2),
        random(batch * m * n, 3),
    );
    let forward = |a: &[f32], w: &[f32]| {
        let mut c = vec![0.0; batch * m * n];
        b.matmul(&a.to_vec(), &w.to_vec(), &mut c, &s);
        dot(&c, &r)
    };
    // A stored [k, m]: dA = op(B) dC^T... = B^T-as-stored times dC^T: dA[k, m] = B^T[k, n] dC^T[n, m].
    let mut da = vec![0.0; batch * k * m];
    b.matmul(
        &w,
        &r,
        &mut da,
        &Matmul::batched(batch, k, m, n).trans_a().trans_b(),
    );
    // B stored [n, k]: dB[n, k] = dC^T[n, m] A^T[m, k].
    let mut dw = vec![0.0; batch * n * k];
    b.matmul(
        &r,
        &a,
        &mut dw,
        &Matmul::batched(batch, n, k, m).trans_a().trans_b(),
    );
    check("matmul dA", &a, &da, |a| forward(a, &w));
    check("matmul dB", &w, &dw, |w| forward(&a, w));
}

#[test]
fn gelu_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let x: Vec<f32> = random(64, 1).iter().map(|v| 3.0 * v).collect();
    let r = random(64, 2);
    let mut dx = vec![0.0; 64];
    b.gelu_backward(&x, &r, &mut dx, false);
    check("gelu", &x, &dx, |x| {
        let mut y = vec![0.0; 64];
        b.gelu(&x.to_vec(), &mut y);
        dot(&y, &r)
    });
}

#[test]
fn tanh_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let x: Vec<f32> = random(64, 3).iter().map(|v| 2.0 * v).collect();
    let r = random(64, 4);
    let mut dx = vec![0.0; 64];
    b.tanh_backward(&x, &r, &mut dx);
    check("tanh", &x, &dx, |x| {
        let mut y = vec![0.0; 64];
        b.tanh(&x.to_vec(), &mut y);
        dot(&y, &r)
    });
}

#[test]
fn quick_gelu_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let x: Vec<f32> = random(64, 7).iter().map(|v| 3.0 * v).collect();
    let r = random(64, 8);
    let mut dx = vec![0.0; 64];
    b.quick_gelu_backward(&x, &r, &mut dx);
    check("quick_gelu", &x, &dx, |x| {
        let mut y = vec![0.0; 64];
        b.quick_gelu(&x.to_vec(), &mut y);
        dot(&y, &r)
    });
}

#[test]
fn gelu_erf_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let x: Vec<f32> = random(64, 9).iter().map(|v| 3.0 * v).collect();
    let r = random(64, 10);
    let mut dx = vec![0.0; 64];
    b.gelu_erf_backward(&x, &r, &mut dx);
    check("gelu_erf", &x, &dx, |x| {
        let mut y = vec![0.0; 64];
        b.gelu_erf(&x.to_vec(), &mut y);
        dot(&y, &r)
    });
}

#[test]
fn relu_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    // Kept a step away from the kink at 0, where no derivative exists.
    let x: Vec<f32> = random(64, 5)
        .iter()
        .map(|v| 2.0 * v + 0.1 * v.signum())
        .collect();
    assert!(x.iter().any(|&v| v < 0.0) && x.iter().any(|&v| v > 0.0));
    let r = random(64, 6);
    let mut dx = vec![0.0; 64];
    b.relu_backward(&x, &r, &mut dx);
    check("relu", &x, &dx, |x| {
        let mut y = vec![0.0; 64];
        b.relu(&x.to_vec(), &mut y);
        dot(&y, &r)
    });
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (rows, cols) = (4, 9);
    let x: Vec<f32> = random(rows * cols, 1)
        .iter()
        .map(|v| 2.0 * v + 0.5)
        .collect();
    let (gamma, beta, r) = (random(cols, 2), random(cols, 3), random(rows * cols, 4));
    let forward = |x: &[f32], gamma: &[f32], beta: &[f32]| {
        let (mut y, mut mean, mut rstd) =
            (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
        b.layer_norm(
            &x.to_vec(),
            &gamma.to_vec(),
            &beta.to_vec(),
            &mut y,
            &mut mean,
            &mut rstd,
            cols,
            1e-5,
        );
        (dot(&y, &r), mean, rstd)
    };
    let (_, mean, rstd) = forward(&x, &gamma, &beta);
    let (mut dx, mut dgamma, mut dbeta) =
        (vec![0.0; rows * cols], vec![0.0; cols], vec![0.0; cols]);
    b.layer_norm_backward(
        &r,
        &x,
        &gamma,
        &mean,
        &rstd,
        &mut dx,
        &mut dgamma,
        &mut dbeta,
        cols,
        false,
    );
    check("layer norm dx", &x, &dx, |x| forward(x, &gamma, &beta).0);
    check("layer norm dgamma", &gamma, &dgamma, |g| {
        forward(&x, g, &beta).0
    });
    check("layer norm dbeta", &beta, &dbeta, |bt| {
        forward(&x, &gamma, bt).0
    });
}

#[test]
fn masked_softmax_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (heads, t) = (2, 5);
    let rows = SoftmaxRows {
        rows: heads * t,
        cols: t,
        q_len: t,
        heads,
        causal: true,
    };
    let mask = vec![1, 1, 1, 1, 0];
    let x = random(heads * t * t, 1);
    let r = random(heads * t * t, 2);
    let forward = |x: &[f32]| {
        let mut y = vec![0.0; x.len()];
        b.softmax(&x.to_vec(), &mut y, &rows, Some(&mask));
        y
    };
    let y = forward(&x);
    let mut dx = vec![0.0; x.len()];
    b.softmax_backward(&y, &r, &mut dx, t, false);
    check("softmax", &x, &dx, |x| dot(&forward(x), &r));
}

/// Both kernels; the fused one over 19 positions (two tiles of keys and
/// of queries).
#[test]
fn attention_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    for (kernel, seq) in [
        (AttentionKernel::Products, 4),
        (AttentionKernel::Fused, 4),
        (AttentionKernel::Fused, 19),
    ] {
        for causal in [true, false] {
            let shape = AttentionShape {
                batch: 2,
                seq,
                heads: 2,
                head_dim: 3,
                causal,
            };
            let c = shape.channels();
            let mut mask = vec![1; 2 * seq];
            mask[seq - 1] = 0;
            let qkv = random(2 * seq * 3 * c, 1);
            let r = random(2 * seq * c, 2);
            let forward = |qkv: &[f32]| {
                let mut attn = Attention::with_kernel(&b, shape, true, kernel);
                let mut out = vec![0.0; 2 * seq * c];
                attn.forward(&b, &qkv.to_vec(), Some(&mask), &mut out);
                (out, attn)
            };
            let (out, mut attn) = forward(&qkv);
            let mut dqkv = vec![0.0; qkv.len()];
            attn.backward(&b, &qkv, Some(&mask), &out, &r, &mut dqkv);
            check(
                &format!("attention ({kernel:?}, {seq} positions, causal {causal}) dqkv"),
                &qkv,
                &dqkv,
                |x| dot(&forward(x).0, &r),
            );
        }
    }
}

/// Queries and keys of different lengths, a padded item: dq and the
/// fused dkv (whose padded keys must get no gradient).
#[test]
fn cross_attention_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let shape = CrossAttentionShape {
        batch: 2,
        q_len: 3,
        kv_len: 5,
        heads: 2,
        head_dim: 3,
    };
    let mask: Vec<u32> = [4, 5]
        .iter()
        .flat_map(|&n| (0..5).map(move |t| u32::from(t < n)))
        .collect();
    let (q, kv) = (
        random(shape.q_elements(), 1),
        random(shape.kv_elements(), 2),
    );
    let r = random(shape.q_elements(), 3);
    let forward = |q: &[f32], kv: &[f32]| {
        let mut attn = CrossAttention::new(&b, shape, true);
        let mut out = vec![0.0; shape.q_elements()];
        attn.forward(&b, &q.to_vec(), &kv.to_vec(), Some(&mask), &mut out);
        (out, attn)
    };
    let (_, mut attn) = forward(&q, &kv);
    let (mut dq, mut dkv) = (vec![0.0; q.len()], vec![0.0; kv.len()]);
    attn.backward(&b, (&q, &kv), &r, &mut dq, &mut dkv);
    check("cross-attention dq", &q, &dq, |x| {
        dot(&forward(x, &kv).0, &r)
    });
    check("cross-attention dkv", &kv, &dkv, |x| {
        dot(&forward(&q, x).0, &r)
    });
    // The first item's fifth key is padding: its k and v get nothing.
    let row = &dkv[4 * 2 * shape.channels()..5 * 2 * shape.channels()];
    assert!(row.iter().all(|&g| g == 0.0), "a padded key got {row:?}");
}

/// Cross-attention against a float64 loop over items, heads, queries and
/// keys written from the definition.
#[test]
fn cross_attention_equals_its_definition() {
    let b = CpuBackend::new();
    let s = CrossAttentionShape {
        batch: 2,
        q_len: 4,
        kv_len: 6,
        heads: 2,
        head_dim: 3,
    };
    let real = [6, 2];
    let mask: Vec<u32> = real
        .iter()
        .flat_map(|&n| (0..6).map(move |t| u32::from(t < n)))
        .collect();
    let q: Vec<f32> = random(s.q_elements(), 1).iter().map(|v| 3.0 * v).collect();
    let kv: Vec<f32> = random(s.kv_elements(), 2).iter().map(|v| 3.0 * v).collect();
    let mut out = vec![0.0; s.q_elements()];
    CrossAttention::new(&b, s, false).forward(&b, &q, &kv, Some(&mask), &mut out);
    let c = s.channels();
    let mut want = vec![0.0f32; out.len()];
    for item in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.q_len {
                let qi = |e: usize| q[(item * s.q_len + i) * c + h * s.head_dim + e] as f64;
                let k = |j: usize, e: usize| kv[(item * s.kv_len + j) * 2 * c + h * s.head_dim + e];
                let v =
                    |j: usize, e: usize| kv[(item * s.kv_len + j) * 2 * c + c + h * s.head_dim + e];
                let scores: Vec<f64> = (0..real[item])
                    .map(|j| {
                        let dot: f64 = (0..s.head_dim).map(|e| qi(e) * k(j, e) as f64).sum();
                        dot / (s.head_dim as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let total: f64 = scores.iter().map(|x| (x - max).exp()).sum();
                for e in 0..s.head_dim {
                    let mixed: f64 = (0..real[item])
                        .map(|j| (scores[j] - max).exp() / total * v(j, e) as f64)
                        .sum();
                    want[(item * s.q_len + i) * c + h * s.head_dim + e] = mixed as f32;
                }
            }
        }
    }
    assert_close("cross-attention", &out, &want, 1e-5, 1e-6);
}

/// The fused kernels against batched products and a softmax, an
/// independent computation of the same function, over several tiles of
/// positions, padded keys and an item with none.
#[test]
fn fused_attention_equals_products() {
    let b = CpuBackend::new();
    for (seq, head_dim) in [(40, 64), (33, 24)] {
        for causal in [true, false] {
            let shape = AttentionShape {
                batch: 3,
                seq,
                heads: 3,
                head_dim,
                causal,
            };
            let c = shape.channels();
            let mask: Vec<u32> = [seq, 17, 0]
                .iter()
                .flat_map(|&n| (0..seq).map(move |t| u32::from(t < n)))
                .collect();
            let qkv: Vec<f32> = random(3 * seq * 3 * c, 1).iter().map(|v| 3.0 * v).collect();
            let d_out = random(3 * seq * c, 2);
            let run = |kernel| {
                let mut attn = Attention::with_kernel(&b, shape, true, kernel);
                let mut out = vec![0.0; 3 * seq * c];
                attn.forward(&b, &qkv, Some(&mask), &mut out);
                let mut dqkv = random(qkv.len(), 3);
                attn.backward(&b, &qkv, Some(&mask), &out, &d_out, &mut dqkv);
                (out, dqkv)
            };
            let (fused, products) = (run(AttentionKernel::Fused), run(AttentionKernel::Products));
            let what = format!("{seq} positions, heads of {head_dim}, causal {causal}");
            assert_close(&format!("out, {what}"), &fused.0, &products.0, 1e-5, 1e-5);
            assert_close(&format!("dqkv, {what}"), &fused.1, &products.1, 1e-4, 1e-5);
        }
    }
}

#[test]
fn embedding_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (vocab, dim) = (6, 4);
    let ids = TokenIndex::new(&b, &[3, 1, 3, 3, 0], vocab).unwrap();
    let table = random(vocab * dim, 1);
    let r = random(5 * dim, 2);
    let mut dtable = vec![0.0; vocab * dim];
    b.embedding_backward(&r, &ids, &mut dtable, dim);
    check("embedding", &table, &dtable, |t| {
        let mut out = vec![0.0; 5 * dim];
        b.embedding(&t.to_vec(), &ids.ids, &mut out, dim, false);
        dot(&out, &r)
    });
}

#[test]
fn log_softmax_gather_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (rows, vocab) = (4, 11);
    let targets = random_ids(rows, vocab as u32, 1);
    let sets = vec![vec![0, 2, 4, 6], vec![1, 9]];
    let subsets = VocabSubsets::new(&b, vocab, &sets, &[0, FULL_VOCAB, 1, 0]).unwrap();
    let logits = random(rows * vocab, 2);
    let r = random(rows, 3);
    let forward = |z: &[f32]| {
        let (mut logp, mut lse) = (vec![0.0; rows], vec![0.0; rows]);
        b.log_softmax_gather(&z.to_vec(), &targets, &subsets, vocab, &mut logp, &mut lse);
        (dot(&logp, &r), lse)
    };
    let (_, lse) = forward(&logits);
    let mut dz = vec![0.0; rows * vocab];
    b.log_softmax_gather_backward(&logits, &targets, &subsets, vocab, &lse, &r, &mut dz, false);
    check("log-softmax gather", &logits, &dz, |z| forward(z).0);
}

#[test]
fn cross_entropy_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (rows, vocab) = (5, 13);
    let targets = random_ids(rows, vocab as u32, 1);
    let subsets =
        VocabSubsets::new(&b, vocab, &[vec![1, 2, 3, 5, 8]], &[0, 0, FULL_VOCAB, 0, 0]).unwrap();
    let logits = random(rows * vocab, 2);
    let mut ce = CrossEntropy::new(&b, rows, vocab);
    ce.set_weights(&b, &[1.0, 1.0, 1.0, 1.0, 0.0], 1.0);
    let loss = |z: &[f32], ce: &mut CrossEntropy<CpuBackend>| {
        ce.forward(&b, &z.to_vec(), &targets, &subsets, true);
        ce.read_loss(&b) as f64
    };
    loss(&logits, &mut ce);
    let mut dz = vec![0.0; rows * vocab];
    ce.backward(&b, &logits, &targets, &subsets, &mut dz, false);
    let mut probe = CrossEntropy::new(&b, rows, vocab);
    probe.set_weights(&b, &[1.0, 1.0, 1.0, 1.0, 0.0], 1.0);
    check("cross-entropy", &logits, &dz, |z| loss(z, &mut probe));
}

#[test]
fn l2_normalize_and_mean_pool_backward_match_finite_differences() {
    let b = CpuBackend::new();
    let (rows, cols, group) = (6, 5, 3);
    let x = random(rows * cols, 1);
    let r = random(rows * cols, 2);
    let normalized = |x: &[f32]| {
        let (mut y, mut n) = (vec![0.0; rows * cols], vec![0.0; rows]);
        b.l2_normalize(&x.to_vec(), &mut y, &mut n, cols);
        (y, n)
    };
    let (y, norm) = normalized(&x);
    let mut dx = vec![0.0; rows * cols];
    b.l2_normalize_backward(&y, &norm, &r, &mut dx, cols, false);
    check("l2_normalize", &x, &dx, |x| dot(&normalized(x).0, &r));

    let rp = random(rows / group * cols, 3);
    let mut dx = vec![0.0; rows * cols];
    b.mean_pool_backward(&rp, &mut dx, group, cols, false);
    check("mean_pool", &x, &dx, |x| {
        let mut y = vec![0.0; rows / group * cols];
        b.mean_pool(&x.to_vec(), &mut y, group, cols);
        dot(&y, &rp)
    });
}

/// Step 1 of two, so that the gates, the states and the rows all sit at
/// an offset with a stride; the loss reads h_next and c_next (the second
/// as a later step would, through `d_cell`). Both cells.
#[test]
fn lstm_cell_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (rows, hidden, steps) = (3, 5, 2);
    for cell in [CellGates::Lstm, CellGates::Maxout] {
        let step = LstmStep::of_sequence(cell, rows, hidden, steps, 1);
        let gates = random(rows * steps * step.row(), 1);
        let cells = random(rows * (steps + 1) * hidden, 2);
        let (r_hidden, r_cell) = (random(cells.len(), 3), random(rows * hidden, 4));
        let loss = |gates: &[f32], cells: &[f32]| {
            let (mut g, mut c, mut h) = (gates.to_vec(), cells.to_vec(), vec![0.0; cells.len()]);
            b.lstm_cell(&mut g, &mut c, &mut h, &step);
            let next = |x: &[f32]| -> Vec<f32> {
                (0..rows)
                    .flat_map(|r| x[step.next + r * step.state_stride..][..hidden].to_vec())
                    .collect()
            };
            let r_next = next(&r_hidden);
            dot(&next(&h), &r_next) + dot(&next(&c), &r_cell)
        };
        let (mut activated, mut c, mut h) = (gates.clone(), cells.clone(), vec![0.0; cells.len()]);
        b.lstm_cell(&mut activated, &mut c, &mut h, &step);
        let mut d_cell = r_cell.clone();
        let mut d_gates = vec![0.0; gates.len()];
        b.lstm_cell_backward(&activated, &c, &r_hidden, &mut d_cell, &mut d_gates, &step);
        // Only step 1's gates reach the loss; d_gates is written there alone.
        check(&format!("{cell:?} d_gates"), &gates, &d_gates, |g| {
            loss(g, &cells)
        });
        let mut d_cells = vec![0.0; cells.len()];
        for r in 0..rows {
            let at = step.prev + r * step.state_stride;
            d_cells[at..at + hidden].copy_from_slice(&d_cell[r * hidden..][..hidden]);
        }
        check(&format!("{cell:?} d_cell_prev"), &cells, &d_cells, |c| {
            loss(&gates, c)
        });
    }
}

/// Queries read from and contexts written to strided rows, as a decoder
/// keeps them per position.
#[test]
fn additive_attention_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let shape = AdditiveShape {
        batch: 2,
        tokens: 5,
        width: 4,
        values: 3,
    };
    let (n, a, v) = (shape.batch * shape.tokens, shape.width, shape.values);
    let (query_rows, context_rows) = (
        Rows {
            offset: 4,
            stride: 9,
        },
        Rows {
            offset: 1,
            stride: 7,
        },
    );
    let (keys, values, w) = (random(n * a, 1), random(n * v, 2), random(a, 3));
    let query = random(4 + 2 * 9, 4);
    let r = random(1 + 2 * 7, 5);
    let loss = |keys: &[f32], values: &[f32], w: &[f32], query: &[f32]| {
        let mut op = AdditiveAttention::new(&b, shape);
        let mut context = vec![0.0; r.len()];
        let weights = (&keys.to_vec(), &values.to_vec(), &w.to_vec());
        op.forward(
            &b,
            weights,
            (&query.to_vec(), query_rows),
            (&mut context, context_rows),
        );
        dot(&context, &r)
    };
    let mut op = AdditiveAttention::new(&b, shape);
    let (mut d_query, mut d_keys, mut d_values, mut d_w) = (
        vec![0.0; 2 * a],
        vec![0.0; n * a],
        vec![0.0; n * v],
        vec![0.0; a],
    );
    op.backward(
        &b,
        (&keys, &values, &w),
        (&query, query_rows),
        (&r, context_rows),
        &mut d_query,
        (&mut d_keys, &mut d_values, &mut d_w),
    );
    check("additive d_keys", &keys, &d_keys, |x| {
        loss(x, &values, &w, &query)
    });
    check("additive d_values", &values, &d_values, |x| {
        loss(&keys, x, &w, &query)
    });
    check("additive d_w", &w, &d_w, |x| {
        loss(&keys, &values, x, &query)
    });
    let mut d_query_rows = vec![0.0; query.len()];
    for row in 0..2 {
        let at = query_rows.offset + row * query_rows.stride;
        d_query_rows[at..at + a].copy_from_slice(&d_query[row * a..][..a]);
    }
    check("additive d_query", &query, &d_query_rows, |x| {
        loss(&keys, &values, &w, x)
    });
}

#[test]
fn contrastive_backward_matches_finite_differences() {
    let b = CpuBackend::new();
    let (n, d) = (5, 4);
    let (image, text, log_scale) = (random(n * d, 1), random(n * d, 2), vec![1.5f32]);
    let loss_of = |image: &[f32], text: &[f32], s: &[f32]| {
        let mut l = Contrastive::new(&b, n, d);
        l.forward(&b, &image.to_vec(), &text.to_vec(), &s.to_vec());
        l.read_loss(&b) as f64
    };
    let mut l = Contrastive::new(&b, n, d);
    l.forward(&b, &image, &text, &log_scale);
    let (mut di, mut dt, mut ds) = (vec![0.0; n * d], vec![0.0; n * d], vec![0.0; 1]);
    l.backward(&b, &log_scale, &mut di, &mut dt, &mut ds);
    check("contrastive d_image", &image, &di, |x| {
        loss_of(x, &text, &log_scale)
    });
    check("contrastive d_text", &text, &dt, |x| {
        loss_of(&image, x, &log_scale)
    });
    check("contrastive d_log_scale", &log_scale, &ds, |s| {
        loss_of(&image, &text, s)
    });
}

/// Each op with an `accumulate` flag (all but the head-layout copy, which
/// the parity tests cover) overwrites its output without the flag and adds
/// to it with the flag (the paths a tensor used twice takes in a
/// backward), the same values either way, which the checks above hold
/// against finite differences.
#[test]
fn every_accumulate_flag_adds_to_what_is_there() {
    let b = CpuBackend::new();
    let (rows, cols) = (6, 5);
    let n = rows * cols;
    let before = random(rows * rows.max(cols), 90);
    // Runs `op` without the flag over `before` (which it must overwrite),
    // and with it (which it must add to): the second must be the first
    // plus `before`.
    let adds = |what: &str, len: usize, op: &dyn Fn(&mut Vec<f32>, bool)| {
        let mut fresh = before[..len].to_vec();
        op(&mut fresh, false);
        let mut into_zeros = vec![0.0; len];
        op(&mut into_zeros, false);
        assert_eq!(
            fresh, into_zeros,
            "{what}: without the flag the output is overwritten"
        );
        let mut summed = before[..len].to_vec();
        op(&mut summed, true);
        let want: Vec<f32> = fresh.iter().zip(&before).map(|(f, p)| f + p).collect();
        common::assert_close(what, &summed, &want, 1e-6, 1e-6);
        assert!(
            fresh.iter().any(|&x| x != 0.0),
            "{what}: computes something"
        );
    };
    let (x, dy) = (random(n, 91), random(n, 92));
    adds("gelu backward", n, &|dx, acc| {
        b.gelu_backward(&x, &dy, dx, acc)
    });
    adds("scale by exp", n, &|y, acc| {
        b.scale_by_exp(&vec![0.3], &x, y, acc)
    });
    adds("matmul", rows * rows, &|c, acc| {
        let shape = Matmul::new(rows, rows, cols).trans_b();
        let shape = if acc { shape.accumulate() } else { shape };
        b.matmul(&x, &dy, c, &shape);
    });
    adds("column sum", cols, &|out, acc| {
        b.column_sum(&x, rows, cols, out, acc)
    });
    let (gamma, beta) = (random(cols, 93), random(cols, 94));
    let (mut y, mut mean, mut rstd) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
    b.layer_norm(&x, &gamma, &beta, &mut y, &mut mean, &mut rstd, cols, 1e-5);
    adds("layer norm backward (dx)", n, &|dx, acc| {
        let (mut dgamma, mut dbeta) = (vec![0.0; cols], vec![0.0; cols]);
        b.layer_norm_backward(
            &dy,
            &x,
            &gamma,
            &mean,
            &rstd,
            dx,
            &mut dgamma,
            &mut dbeta,
            cols,
            acc,
        );
    });
    let (mut unit, mut norm) = (vec![0.0; n], vec![0.0; rows]);
    b.l2_normalize(&x, &mut unit, &mut norm, cols);
    adds("l2 normalise backward", n, &|dx, acc| {
        b.l2_normalize_backward(&unit, &norm, &dy, dx, cols, acc)
    });
    adds("mean pool backward", n, &|dx, acc| {
        b.mean_pool_backward(&dy[..2 * cols].to_vec(), dx, 3, cols, acc)
    });
    let mut soft = vec![0.0; n];
    b.softmax(&x, &mut soft, &SoftmaxRows::plain(rows, cols), None);
    adds("softmax backward", n, &|dx, acc| {
        b.softmax_backward(&soft, &dy, dx, cols, acc)
    });
    let ids = TokenIndex::new(&b, &[3, 1, 3, 0], rows).unwrap();
    adds("embedding", 4 * cols, &|out, acc| {
        b.embedding(&x, &ids.ids, out, cols, acc)
    });
    let vocab = cols;
    let targets = random_ids(rows, vocab as u32, 95);
    let subsets =
        VocabSubsets::new(&b, vocab, &[vec![0, 2, 4]], &[0, FULL_VOCAB, 0, 0, 0, 0]).unwrap();
    let (mut logp, mut lse) = (vec![0.0; rows], vec![0.0; rows]);
    b.log_softmax_gather(&x, &targets, &subsets, vocab, &mut logp, &mut lse);
    adds("log-softmax gather backward", n, &|dz, acc| {
        b.log_softmax_gather_backward(
            &x,
            &targets,
            &subsets,
            vocab,
            &lse,
            &dy[..rows].to_vec(),
            dz,
            acc,
        )
    });
}
