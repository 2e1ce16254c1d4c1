//! Every GPU kernel against its CPU twin on random inputs, with sizes that
//! are not multiples of any tile or workgroup, and batch 1.
//! Each case is a generic function run on both backends.

use crate::common;

use captune::backend::{
    AdamWStep, Backend, CachedAttention, CellGates, ChoiceRule, HeadLayout, LstmStep, Matmul,
    NO_ROW, Operand, Reduce, Sampling, SoftmaxRows, Storage, TokenChoice, TokenIndex, VocabSubsets,
};
use captune::cpu::CpuBackend;
use captune::gpu::{MatmulKernel, MatmulTile};
use captune::index::FULL_VOCAB;
use captune::ops::additive_attention::{AdditiveAttention, AdditiveShape, Rows};
use captune::ops::attention::{Attention, AttentionKernel, AttentionShape};
use captune::ops::contrastive::Contrastive;
use captune::ops::cross_attention::{CrossAttention, CrossAttentionShape};
use captune::ops::cross_entropy::CrossEntropy;
use captune::ops::sequence_likelihood::SequenceLikelihood;
use common::{assert_close, gpu, random, random_ids};

/// Runs `case` on both backends and compares each output it returns.
macro_rules! parity {
    ($case:ident, $rtol:expr, $atol:expr) => {{
        let Some(g) = gpu() else { return };
        let want = $case(&CpuBackend::new());
        let got = $case(&g);
        assert_eq!(got.len(), want.len());
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_close(
                &format!("{} output {i}", stringify!($case)),
                got,
                want,
                $rtol,
                $atol,
            );
        }
    }};
}

// ---- matmul ----

/// Every transpose combination, accumulate, alpha, shared B, batch 1 and 3,
/// the bias epilogue, odd sizes that straddle 64- and 128-wide tiles.
fn matmul_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    for &(batch, m, n, k) in &[
        (1, 1, 1, 1),
        (1, 37, 53, 29),
        (3, 65, 130, 67),
        (1, 129, 7, 300),
    ] {
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                let mut s = Matmul::batched(batch, m, n, k).alpha(0.75);
                s.trans_a = trans_a;
                s.trans_b = trans_b;
                let a = b.tensor(&random(batch * m * k, 1));
                let w = b.tensor(&random(batch * k * n, 2));
                let mut c = b.tensor(&random(batch * m * n, 3));
                b.matmul(&a, &w, &mut c, &s);
                b.matmul(&a, &w, &mut c, &s.accumulate());
                outs.push(b.to_vec(&c));
                if batch > 1 {
                    let mut c = b.zeros(batch * m * n);
                    b.matmul(&a, &w, &mut c, &s.shared_b());
                    outs.push(b.to_vec(&c));
                } else {
                    // The bias epilogue, over a C that held other values.
                    let bias = b.tensor(&random(n, 4));
                    b.matmul_bias(&a, &w, &bias, &mut c, &s);
                    outs.push(b.to_vec(&c));
                    // The residual stream added after the bias.
                    let residual = b.tensor(&random(m * n, 8));
                    let mut joined = b.zeros(m * n);
                    b.matmul_bias_residual(&a, &w, &bias, &residual, &mut joined, &s);
                    outs.push(b.to_vec(&joined));
                }
                if batch == 1 {
                    // GELU after the bias, and the gradient through a GELU.
                    let bias = b.tensor(&random(n, 6));
                    let mut act = b.zeros(m * n);
                    b.matmul_bias_gelu(&a, &w, &bias, &mut c, &mut act, &s);
                    outs.extend([b.to_vec(&c), b.to_vec(&act)]);
                    let pre =
                        b.tensor(&random(m * n, 7).iter().map(|v| 3.0 * v).collect::<Vec<_>>());
                    b.matmul_gelu_backward(&a, &w, &pre, &mut c, &s);
                    outs.push(b.to_vec(&c));
                }
                if batch == 1 && !trans_b {
                    // B's column sums beside the product, written then added.
                    let mut sums = b.tensor(&random(n, 5));
                    b.matmul_column_sums(&a, &w, &mut c, &mut sums, &s);
                    b.matmul_column_sums(&a, &w, &mut c, &mut sums, &s.accumulate());
                    outs.extend([b.to_vec(&c), b.to_vec(&sums)]);
                }
            }
        }
    }
    outs
}

/// Attention's products with q, k and v read in place in a fused qkv
/// tensor `[groups, seq, 3 * heads * dim]` and heads written in place in a
/// `[groups, seq, heads * dim]` output. Returns (in place, through copies
/// to head-major order and packed products) for each case.
fn strided_matmul_cases<B: Backend>(b: &B) -> Vec<(Vec<f32>, Vec<f32>)> {
    let (groups, heads, seq, dim) = (2, 3, 7, 5);
    let width = heads * dim;
    let part = |k: usize| HeadLayout {
        batch: groups,
        seq,
        heads,
        head_dim: dim,
        row_stride: 3 * width,
        col_offset: k * width,
    };
    let out = HeadLayout {
        row_stride: width,
        col_offset: 0,
        ..part(0)
    };
    let qkv = b.tensor(&random(groups * seq * 3 * width, 1));
    let head_major = |layout: &HeadLayout| {
        let mut t = b.zeros(layout.len());
        b.tokens_to_heads(&qkv, &mut t, layout);
        t
    };
    let (q, k, v) = (
        head_major(&part(0)),
        head_major(&part(1)),
        head_major(&part(2)),
    );
    let mut cases = Vec::new();
    // Scores: alpha Q K^T.
    let scores = Matmul::per_head(groups, heads, seq, seq, dim)
        .trans_b()
        .alpha(0.5);
    let mut in_place = b.zeros(groups * heads * seq * seq);
    let strided = scores
        .with_a(Operand::heads_in_rows(&part(0)))
        .with_b(Operand::heads_in_rows(&part(1)));
    b.matmul(&qkv, &qkv, &mut in_place, &strided);
    let mut packed = b.zeros(groups * heads * seq * seq);
    b.matmul(&q, &k, &mut packed, &scores);
    cases.push((b.to_vec(&in_place), b.to_vec(&packed)));
    // P V (and P^T V) added into the output rows in place.
    let p = b.tensor(&random(groups * heads * seq * seq, 2));
    let o0 = random(groups * seq * width, 3);
    for trans_a in [false, true] {
        let pv = Matmul {
            trans_a,
            ..Matmul::per_head(groups, heads, seq, dim, seq).accumulate()
        };
        let mut in_place = b.tensor(&o0);
        let strided = pv
            .with_b(Operand::heads_in_rows(&part(2)))
            .with_c(Operand::heads_in_rows(&out));
        b.matmul(&p, &qkv, &mut in_place, &strided);
        let mut packed = b.zeros(out.len());
        b.tokens_to_heads(&b.tensor(&o0), &mut packed, &out);
        b.matmul(&p, &v, &mut packed, &pv);
        let mut packed_out = b.zeros(groups * seq * width);
        b.heads_to_tokens(&packed, &mut packed_out, &out, false);
        cases.push((b.to_vec(&in_place), b.to_vec(&packed_out)));
    }
    cases
}

#[test]
fn strided_products_equal_copies_and_packed_products() {
    let check = |name: &str, cases: Vec<(Vec<f32>, Vec<f32>)>| {
        for (i, (in_place, packed)) in cases.iter().enumerate() {
            assert_close(&format!("{name} case {i}"), in_place, packed, 1e-5, 1e-6);
        }
    };
    check("cpu", strided_matmul_cases(&CpuBackend::new()));
    let Some(g) = gpu() else { return };
    for tile in MatmulTile::ALL {
        g.set_matmul_kernel(MatmulKernel::Only(tile));
        check(&format!("gpu {tile:?}"), strided_matmul_cases(&g));
    }
}

/// Every matmul kernel, forced onto every product, and the choice per
/// product of both kernel families.
#[test]
fn every_matmul_kernel_matches_cpu() {
    let Some(g) = gpu() else { return };
    let want = matmul_cases(&CpuBackend::new());
    let kernels = MatmulTile::ALL.map(MatmulKernel::Only).into_iter().chain([
        MatmulKernel::Registers,
        MatmulKernel::Shared,
        MatmulKernel::SharedBuffered,
    ]);
    for kernel in kernels {
        g.set_matmul_kernel(kernel);
        let got = matmul_cases(&g);
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_close(
                &format!("{kernel:?} matmul case {i}"),
                got,
                want,
                1e-4,
                1e-4,
            );
        }
    }
}

/// Products of few output tiles and a long k, which the GPU runs split-K:
/// weight-gradient shapes (A transposed) and others, k not a multiple of
/// a slice, alpha, accumulate, and B's column sums beside the product.
fn split_k_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    for &(m, n, k) in &[(40, 70, 2001), (96, 33, 700), (5, 200, 4096)] {
        for trans_a in [false, true] {
            let mut s = Matmul::new(m, n, k).alpha(0.75);
            s.trans_a = trans_a;
            let a = b.tensor(&random(m * k, 1));
            let w = b.tensor(&random(k * n, 2));
            let mut c = b.tensor(&random(m * n, 3));
            b.matmul(&a, &w, &mut c, &s.accumulate());
            outs.push(b.to_vec(&c));
            let mut sums = b.tensor(&random(n, 5));
            b.matmul_column_sums(&a, &w, &mut c, &mut sums, &s);
            b.matmul_column_sums(&a, &w, &mut c, &mut sums, &s.accumulate());
            outs.extend([b.to_vec(&c), b.to_vec(&sums)]);
            // Each epilogue after the splits' sum (a second pass).
            let bias = b.tensor(&random(n, 6));
            let other = b.tensor(&random(m * n, 7));
            b.matmul_bias(&a, &w, &bias, &mut c, &s.accumulate());
            outs.push(b.to_vec(&c));
            b.matmul_bias_residual(&a, &w, &bias, &other, &mut c, &s);
            outs.push(b.to_vec(&c));
            let mut act = b.tensor(&random(m * n, 8));
            b.matmul_bias_gelu(&a, &w, &bias, &mut c, &mut act, &s);
            outs.extend([b.to_vec(&c), b.to_vec(&act)]);
            b.matmul_gelu_backward(&a, &w, &other, &mut c, &s);
            outs.push(b.to_vec(&c));
        }
    }
    outs
}

/// Split-K on every matmul kernel, with and without an epilogue: the
/// CPU's numbers, the same bits on a second run, and dispatches of
/// `splits` times the output tiles.
#[test]
fn split_k_products_match_cpu_and_repeat_exactly() {
    let Some(g) = gpu() else { return };
    let want = split_k_cases(&CpuBackend::new());
    for tile in MatmulTile::ALL {
        g.set_matmul_kernel(MatmulKernel::Only(tile));
        let before = g.matmul_workgroups();
        let got = split_k_cases(&g);
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("{tile:?} split-K case {i}"), got, want, 1e-4, 1e-3);
        }
        assert_eq!(got, split_k_cases(&g), "{tile:?}: a second run differs");
        // 5 x 200 over k = 4096: its tiles, split as many ways as make the
        // workgroups the kernel wants, at most 16.
        let tiles = tile.tiles(5, 200);
        let splits = captune::gpu::k_split(tile, 5, 200, 4096).map(|per| 4096usize.div_ceil(per));
        let want_splits = tile.wanted_workgroups().div_ceil(tiles).min(16);
        assert_eq!(splits, Some(want_splits), "{tile:?}");
        let counts = g.matmul_workgroups().since(&before);
        assert!(
            counts
                .workgroups
                .contains_key(&((tiles * want_splits) as u64)),
            "{tile:?}: no dispatch of {} workgroups in {counts:?}",
            tiles * want_splits
        );
    }
}

// ---- decoding's attention ----

/// `attend_cached` at the first position, a middle one and the last of a
/// cache of 300 (more keys than a workgroup has threads): its output and
/// both caches after the append.
fn cached_attention_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (rows, heads, head_dim, capacity) = (2, 3, 40, 300);
    let width = heads * head_dim;
    let mut outs = Vec::new();
    for (i, position) in [0, 7, capacity - 1].into_iter().enumerate() {
        let l = CachedAttention {
            rows,
            heads,
            head_dim,
            capacity,
            position,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let cache = rows * heads * capacity * head_dim;
        let qkv = b.tensor(&random(rows * 3 * width, 10 + i as u64));
        let mut keys = b.tensor(&random(cache, 20 + i as u64));
        let mut values = b.tensor(&random(cache, 30 + i as u64));
        let mut out = b.zeros(rows * width);
        b.attend_cached(&qkv, &mut keys, &mut values, &mut out, &l);
        outs.extend([b.to_vec(&out), b.to_vec(&keys), b.to_vec(&values)]);
    }
    outs
}

#[test]
fn cached_attention_matches_cpu() {
    let Some(g) = gpu() else { return };
    let want = cached_attention_cases(&CpuBackend::new());
    let got = cached_attention_cases(&g);
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("attend_cached case {i}"), got, want, 1e-5, 1e-5);
    }
}

// ---- elementwise ----

fn elementwise_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let n = 1000 * 3 + 7;
    let x = b.tensor(&random(n, 1).iter().map(|v| v * 4.0).collect::<Vec<_>>());
    let y0 = random(n, 2);
    let mut outs = Vec::new();
    let mut y = b.tensor(&y0);
    b.fill(&mut y, 0.25);
    outs.push(b.to_vec(&y));
    let mut y = b.tensor(&y0);
    b.scale(&mut y, -1.5);
    outs.push(b.to_vec(&y));
    for beta in [0.0, 0.3] {
        let mut y = b.tensor(&y0);
        b.axpby(2.0, &x, beta, &mut y);
        outs.push(b.to_vec(&y));
    }
    let mut out = b.zeros(n);
    b.add(0.5, &x, -2.0, &b.tensor(&y0), &mut out);
    outs.push(b.to_vec(&out));
    b.mul(3.0, &x, &b.tensor(&y0), &mut out);
    outs.push(b.to_vec(&out));
    let mut y = b.tensor(&y0[..n - 1]); // 3006 = 6 rows of 501 columns
    b.add_bias(&mut y, &b.tensor(&random(501, 5)));
    outs.push(b.to_vec(&y));
    let mut g = b.zeros(n);
    b.gelu(&x, &mut g);
    outs.push(b.to_vec(&g));
    b.tanh(&x, &mut g);
    outs.push(b.to_vec(&g));
    let mut dx = b.zeros(n);
    b.tanh_backward(&x, &b.tensor(&random(n, 7)), &mut dx);
    outs.push(b.to_vec(&dx));
    b.relu(&x, &mut g);
    outs.push(b.to_vec(&g));
    b.quick_gelu(&x, &mut g);
    outs.push(b.to_vec(&g));
    b.quick_gelu_backward(&x, &b.tensor(&random(n, 9)), &mut dx);
    outs.push(b.to_vec(&dx));
    b.gelu_erf(&x, &mut g);
    outs.push(b.to_vec(&g));
    b.gelu_erf_backward(&x, &b.tensor(&random(n, 10)), &mut dx);
    outs.push(b.to_vec(&dx));
    b.relu_backward(&x, &b.tensor(&random(n, 8)), &mut dx);
    outs.push(b.to_vec(&dx));
    for accumulate in [false, true] {
        let mut dx = b.tensor(&y0);
        b.gelu_backward(&x, &b.tensor(&random(n, 6)), &mut dx, accumulate);
        outs.push(b.to_vec(&dx));
    }
    outs
}

#[test]
fn elementwise_kernels_match_cpu() {
    parity!(elementwise_cases, 1e-5, 1e-5);
}

// ---- reductions ----

fn reduce_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    for &n in &[1usize, 1000, 300_001] {
        let x = b.tensor(&random(n, n as u64));
        let mut out = b.tensor(&[7.0; 4]);
        for (i, op) in [Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::SumSquares]
            .into_iter()
            .enumerate()
        {
            b.reduce(&x, op, &mut out, i);
        }
        outs.push(b.to_vec(&out));
    }
    // Several tensors reduced as one (a gradient norm over groups), one of
    // them empty, and the whole of them against the single-tensor path.
    let lens = [1000usize, 0, 300_001, 3];
    let parts: Vec<Vec<f32>> = lens.iter().map(|&n| random(n, n as u64 + 11)).collect();
    let whole = b.tensor(&parts.concat());
    let parts: Vec<B::Tensor> = parts.iter().map(|x| b.tensor(x)).collect();
    let parts: Vec<&B::Tensor> = parts.iter().collect();
    for op in [Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::SumSquares] {
        let mut out = b.zeros(2);
        b.reduce_parts(&parts, op, &mut out, 0);
        b.reduce(&whole, op, &mut out, 1);
        let out = b.to_vec(&out);
        assert!(
            (out[0] - out[1]).abs() <= 1e-4 * out[1].abs().max(1.0),
            "{op:?} of the parts {} and of the whole {}",
            out[0],
            out[1]
        );
        outs.push(out);
    }
    for &(rows, cols) in &[(1usize, 5usize), (37, 300), (200, 33)] {
        let x = b.tensor(&random(rows * cols, 9));
        let mut out = b.tensor(&random(cols, 10));
        b.column_sum(&x, rows, cols, &mut out, true);
        outs.push(b.to_vec(&out));
        b.column_sum(&x, rows, cols, &mut out, false);
        outs.push(b.to_vec(&out));
    }
    outs
}

#[test]
fn reductions_match_cpu() {
    parity!(reduce_cases, 1e-4, 1e-3);
}

// ---- layer norm ----

fn layer_norm_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    for &(rows, cols) in &[(1usize, 33usize), (70, 300)] {
        let x = b.tensor(
            &random(rows * cols, 1)
                .iter()
                .map(|v| 3.0 * v + 1.0)
                .collect::<Vec<_>>(),
        );
        let gamma = b.tensor(&random(cols, 2));
        let beta = b.tensor(&random(cols, 3));
        let (mut y, mut mean, mut rstd) = (b.zeros(rows * cols), b.zeros(rows), b.zeros(rows));
        b.layer_norm(&x, &gamma, &beta, &mut y, &mut mean, &mut rstd, cols, 1e-5);
        let dy = b.tensor(&random(rows * cols, 4));
        let mut dx = b.tensor(&random(rows * cols, 5));
        let (mut dgamma, mut dbeta) = (b.tensor(&random(cols, 6)), b.tensor(&random(cols, 7)));
        b.layer_norm_backward(
            &dy,
            &x,
            &gamma,
            &mean,
            &rstd,
            &mut dx,
            &mut dgamma,
            &mut dbeta,
            cols,
            true,
        );
        outs.extend(
            [y, mean, rstd, dx, dgamma, dbeta]
                .iter()
                .map(|t| b.to_vec(t)),
        );
    }
    outs
}

#[test]
fn layer_norm_matches_cpu() {
    parity!(layer_norm_cases, 1e-4, 1e-4);
}

// ---- softmax and attention masks ----

fn softmax_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    // Plain, wider than a workgroup.
    let (rows, cols) = (5, 300);
    let x = b.tensor(
        &random(rows * cols, 1)
            .iter()
            .map(|v| 5.0 * v)
            .collect::<Vec<_>>(),
    );
    let mut y = b.zeros(rows * cols);
    b.softmax(&x, &mut y, &SoftmaxRows::plain(rows, cols), None);
    let mut dx = b.zeros(rows * cols);
    b.softmax_backward(&y, &b.tensor(&random(rows * cols, 2)), &mut dx, cols, false);
    outs.extend([b.to_vec(&y), b.to_vec(&dx)]);
    // Attention rows: batch 2, heads 3, 7 queries and keys, causal and padded.
    let (batch, heads, t) = (2, 3, 7);
    let mask = b.ids(&[1, 1, 1, 1, 1, 0, 0, /* item 2 */ 1, 1, 1, 1, 1, 1, 1]);
    let x = b.tensor(&random(batch * heads * t * t, 3));
    for causal in [false, true] {
        let rows = SoftmaxRows {
            rows: batch * heads * t,
            cols: t,
            q_len: t,
            heads,
            causal,
        };
        let mut y = b.zeros(batch * heads * t * t);
        b.softmax(&x, &mut y, &rows, Some(&mask));
        outs.push(b.to_vec(&y));
    }
    outs
}

#[test]
fn softmax_matches_cpu() {
    parity!(softmax_cases, 1e-5, 1e-6);
}

// ---- head layout ----

fn heads_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let l = HeadLayout {
        batch: 2,
        seq: 5,
        heads: 3,
        head_dim: 4,
        row_stride: 36,
        col_offset: 12,
    };
    let src = b.tensor(&random(2 * 5 * 36, 1));
    let mut heads = b.zeros(l.len());
    b.tokens_to_heads(&src, &mut heads, &l);
    let mut back = b.tensor(&random(2 * 5 * 36, 2));
    b.heads_to_tokens(&heads, &mut back, &l, true);
    vec![b.to_vec(&heads), b.to_vec(&back)]
}

#[test]
fn head_layout_matches_cpu() {
    parity!(heads_cases, 0.0, 0.0);
}

// ---- embeddings ----

fn embedding_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (vocab, dim, n) = (50, 37, 300); // many repeated ids
    let ids = TokenIndex::new(b, &random_ids(n, vocab as u32, 1), vocab).unwrap();
    let table = b.tensor(&random(vocab * dim, 2));
    let mut out = b.tensor(&random(n * dim, 3));
    b.embedding(&table, &ids.ids, &mut out, dim, true);
    let mut dtable = b.tensor(&random(vocab * dim, 4));
    b.embedding_backward(&b.tensor(&random(n * dim, 5)), &ids, &mut dtable, dim);
    // A gather with rows of no source: zero when written, unchanged when added.
    let mut moved = random_ids(n, vocab as u32, 6);
    moved.iter_mut().step_by(3).for_each(|id| *id = NO_ROW);
    let moved = b.ids(&moved);
    let mut written = b.tensor(&random(n * dim, 7));
    b.embedding(&table, &moved, &mut written, dim, false);
    let mut added = b.tensor(&random(n * dim, 8));
    b.embedding(&table, &moved, &mut added, dim, true);
    vec![
        b.to_vec(&out),
        b.to_vec(&dtable),
        b.to_vec(&written),
        b.to_vec(&added),
    ]
}

#[test]
fn embedding_matches_cpu() {
    parity!(embedding_cases, 1e-5, 1e-5);
}

// ---- log-probabilities over full and subset vocabularies ----

fn logprob_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (rows, vocab) = (9, 301);
    let targets_host = random_ids(rows, vocab as u32, 1);
    let targets = b.ids(&targets_host);
    let logits = b.tensor(
        &random(rows * vocab, 2)
            .iter()
            .map(|v| 4.0 * v)
            .collect::<Vec<_>>(),
    );
    let sets = vec![random_ids(12, vocab as u32, 3), vec![0, 1, 2, 300]];
    let row_subset = [0, 0, FULL_VOCAB, 1, 1, 1, FULL_VOCAB, 0, 1];
    let mut outs = Vec::new();
    for subsets in [
        VocabSubsets::full(b, rows),
        VocabSubsets::new(b, vocab, &sets, &row_subset).unwrap(),
    ] {
        let (mut logp, mut lse) = (b.zeros(rows), b.zeros(rows));
        b.log_softmax_gather(&logits, &targets, &subsets, vocab, &mut logp, &mut lse);
        let mut dlogits = b.tensor(&random(rows * vocab, 4));
        let dlogp = b.tensor(&random(rows, 5));
        b.log_softmax_gather_backward(
            &logits,
            &targets,
            &subsets,
            vocab,
            &lse,
            &dlogp,
            &mut dlogits,
            true,
        );
        outs.extend([b.to_vec(&logp), b.to_vec(&lse), b.to_vec(&dlogits)]);
    }
    outs
}

#[test]
fn log_softmax_gather_matches_cpu() {
    parity!(logprob_cases, 1e-5, 1e-5);
}

// ---- optimiser ----

fn adamw_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let n = 1031;
    let mut outs = Vec::new();
    for (max_norm, sumsq) in [(0.0, 9.0), (1.0, 9.0), (1.0, 0.25)] {
        let (mut p, mut m, mut v) = (b.tensor(&random(n, 1)), b.tensor(&random(n, 2)), b.zeros(n));
        b.write(
            &mut v,
            &random(n, 3).iter().map(|x| x.abs()).collect::<Vec<_>>(),
        );
        let step = AdamWStep {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            t: 3,
            max_norm,
        };
        b.adamw(
            &mut p,
            &b.tensor(&random(n, 4)),
            &mut m,
            &mut v,
            &b.tensor(&[sumsq]),
            &step,
        );
        outs.extend([b.to_vec(&p), b.to_vec(&m), b.to_vec(&v)]);
    }
    outs
}

#[test]
fn adamw_matches_cpu() {
    parity!(adamw_cases, 1e-5, 1e-6);
}

// ---- composites built from the kernels ----

/// Both attention kernels, causal and not, with padded keys: the fused
/// kernels at one tile of positions and at several (37 positions, an
/// item whose keys are all padding, heads of 64, the widest they take),
/// and without a key mask.
fn attention_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    let cases = [
        (AttentionKernel::Products, 6, 5, Some([4, 6])),
        (AttentionKernel::Fused, 6, 5, Some([4, 6])),
        (AttentionKernel::Fused, 37, 64, Some([20, 0])),
        (AttentionKernel::Fused, 37, 24, Some([37, 33])),
        (AttentionKernel::Fused, 37, 24, None),
    ];
    for (kernel, seq, head_dim, real) in cases {
        for causal in [true, false] {
            let shape = AttentionShape {
                batch: 2,
                seq,
                heads: 2,
                head_dim,
                causal,
            };
            let c = shape.channels();
            let mask = real.map(|real| {
                let mask: Vec<u32> = real
                    .iter()
                    .flat_map(|&n| (0..seq).map(move |t| u32::from(t < n)))
                    .collect();
                b.ids(&mask)
            });
            let qkv = b.tensor(&random(2 * seq * 3 * c, 1));
            let mut attn = Attention::with_kernel(b, shape, true, kernel);
            let mut out = b.zeros(2 * seq * c);
            attn.forward(b, &qkv, mask.as_ref(), &mut out);
            let mut dqkv = b.tensor(&random(2 * seq * 3 * c, 3));
            let dout = b.tensor(&random(2 * seq * c, 2));
            attn.backward(b, &qkv, mask.as_ref(), &out, &dout, &mut dqkv);
            outs.extend([b.to_vec(&out), b.to_vec(&dqkv)]);
        }
    }
    outs
}

#[test]
fn attention_matches_cpu() {
    parity!(attention_cases, 1e-4, 1e-5);
}

/// Cross-attention from 7 query positions to 19 keys (padding in one
/// item, none in the other's, and without a mask), forward and backward.
fn cross_attention_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    for real in [Some([11, 19]), None] {
        let shape = CrossAttentionShape {
            batch: 2,
            q_len: 7,
            kv_len: 19,
            heads: 3,
            head_dim: 5,
        };
        let mask = real.map(|real| {
            let mask: Vec<u32> = real
                .iter()
                .flat_map(|&n| (0..shape.kv_len).map(move |t| u32::from(t < n)))
                .collect();
            b.ids(&mask)
        });
        let q = b.tensor(&random(shape.q_elements(), 1));
        let kv = b.tensor(&random(shape.kv_elements(), 2));
        let mut attn = CrossAttention::new(b, shape, true);
        let mut out = b.zeros(shape.q_elements());
        attn.forward(b, &q, &kv, mask.as_ref(), &mut out);
        let d_out = b.tensor(&random(shape.q_elements(), 3));
        let mut dq = b.tensor(&random(shape.q_elements(), 4));
        let mut dkv = b.tensor(&random(shape.kv_elements(), 5));
        attn.backward(b, (&q, &kv), &d_out, &mut dq, &mut dkv);
        outs.extend([b.to_vec(&out), b.to_vec(&dq), b.to_vec(&dkv)]);
    }
    outs
}

#[test]
fn cross_attention_matches_cpu() {
    parity!(cross_attention_cases, 1e-4, 1e-5);
}

/// The ops REINFORCE needs: the entropy of the softmax and its gradient,
/// per-sequence weights spread over rows, and the signed per-sequence
/// weighted log-likelihood built on them.
fn reinforce_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (sequences, per_sequence, vocab) = (5, 7, 300);
    let rows = sequences * per_sequence;
    let logits = b.tensor(
        &random(rows * vocab, 1)
            .iter()
            .map(|v| 4.0 * v)
            .collect::<Vec<_>>(),
    );
    let (mut h, mut lse) = (b.zeros(rows), b.zeros(rows));
    b.softmax_entropy(&logits, vocab, &mut h, &mut lse);
    let mut dlogits = b.tensor(&random(rows * vocab, 2));
    b.softmax_entropy_backward(
        &logits,
        vocab,
        &h,
        &lse,
        &b.tensor(&random(rows, 3)),
        &mut dlogits,
        true,
    );
    let mut outs = vec![b.to_vec(&h), b.to_vec(&lse), b.to_vec(&dlogits)];
    // Sequences end at different lengths (id 0 is padding).
    let mut ids = random_ids(rows, vocab as u32, 4);
    for (s, end) in [3usize, 7, 1, 5, 0].into_iter().enumerate() {
        for t in end..per_sequence {
            ids[s * per_sequence + t] = 0;
        }
    }
    let ids = b.ids(&ids);
    let weights = b.tensor(&[1.5, -2.0, 0.25, -0.75, 1.0]);
    let mut coef = b.zeros(rows);
    b.spread_sequence_weights(&weights, &ids, per_sequence, 0, -0.2, &mut coef);
    outs.push(b.to_vec(&coef));
    let mut sl = SequenceLikelihood::new(b, sequences, per_sequence, vocab, 0);
    sl.forward(b, &logits, &ids, &weights, 5.0);
    sl.backward(b, &logits, &ids, &mut dlogits, false);
    outs.extend([b.to_vec(&sl.loss), b.to_vec(&sl.logp), b.to_vec(&dlogits)]);
    outs
}

#[test]
fn reinforce_ops_match_cpu() {
    parity!(reinforce_cases, 1e-4, 1e-5);
}

fn cross_entropy_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (rows, vocab) = (7, 97);
    let targets = b.ids(&random_ids(rows, vocab as u32, 1));
    let logits = b.tensor(&random(rows * vocab, 2));
    let sets = vec![vec![3, 5, 8, 13], vec![1, 2, 3]];
    let subsets = VocabSubsets::new(b, vocab, &sets, &[FULL_VOCAB, 0, 0, 0, 1, 1, 1]).unwrap();
    let mut ce = CrossEntropy::new(b, rows, vocab);
    ce.set_weights(b, &[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0], 0.5);
    ce.forward(b, &logits, &targets, &subsets, true);
    let mut dlogits = b.zeros(rows * vocab);
    ce.backward(b, &logits, &targets, &subsets, &mut dlogits, false);
    vec![b.to_vec(&ce.loss), b.to_vec(&ce.logp), b.to_vec(&dlogits)]
}

#[test]
fn cross_entropy_matches_cpu() {
    parity!(cross_entropy_cases, 1e-5, 1e-6);
}

fn rows_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (rows, cols, group) = (12, 37, 4);
    let x = b.tensor(&random(rows * cols, 1));
    let dy = b.tensor(&random(rows * cols, 2));
    let (mut y, mut norm, mut dx) = (
        b.zeros(rows * cols),
        b.zeros(rows),
        b.tensor(&random(rows * cols, 3)),
    );
    b.l2_normalize(&x, &mut y, &mut norm, cols);
    b.l2_normalize_backward(&y, &norm, &dy, &mut dx, cols, true);
    let mut pooled = b.zeros(rows / group * cols);
    b.mean_pool(&x, &mut pooled, group, cols);
    let mut dpool = b.tensor(&random(rows * cols, 4));
    b.mean_pool_backward(&pooled, &mut dpool, group, cols, true);
    let log_scale = b.tensor(&[0.7]);
    let mut scaled = b.tensor(&random(rows * cols, 5));
    b.scale_by_exp(&log_scale, &x, &mut scaled, true);
    let mut clamped = b.tensor(&random(rows * cols, 6));
    b.clamp(&mut clamped, -0.25, 0.5);
    [&y, &norm, &dx, &pooled, &dpool, &scaled, &clamped]
        .iter()
        .map(|t| b.to_vec(t))
        .collect()
}

#[test]
fn normalize_pool_scale_and_clamp_match_cpu() {
    parity!(rows_cases, 1e-5, 1e-6);
}

/// For each cell: two steps forward over strided sequences, then both
/// back, and a decoding-style step between two slots of one state row.
/// The maxout cell's candidates tie in some units (the gradient's split).
fn lstm_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (rows, hidden, steps) = (3, 37, 2);
    let mut out = Vec::new();
    for cell in [CellGates::Lstm, CellGates::Maxout] {
        let g = cell.chunks() * hidden;
        let mut pre = random(rows * steps * g, 1);
        if cell == CellGates::Maxout {
            for unit in (0..pre.len() - g).step_by(g + 3).filter(|u| u % g < hidden) {
                pre[unit + 4 * hidden] = pre[unit + 3 * hidden];
            }
        }
        let mut gates = b.tensor(&pre);
        let mut cells = b.tensor(&random(rows * (steps + 1) * hidden, 2));
        let mut states = b.tensor(&random(rows * (steps + 1) * hidden, 3));
        for t in 0..steps {
            let step = LstmStep::of_sequence(cell, rows, hidden, steps, t);
            b.lstm_cell(&mut gates, &mut cells, &mut states, &step);
        }
        let d_hidden = b.tensor(&random(rows * (steps + 1) * hidden, 4));
        let mut d_cell = b.tensor(&random(rows * hidden, 5));
        let mut d_gates = b.zeros(rows * steps * g);
        for t in (0..steps).rev() {
            let step = LstmStep::of_sequence(cell, rows, hidden, steps, t);
            b.lstm_cell_backward(&gates, &cells, &d_hidden, &mut d_cell, &mut d_gates, &step);
        }
        let mut one = b.tensor(&random(rows * g, 6));
        let (mut c, mut h) = (
            b.tensor(&random(rows * 2 * hidden, 7)),
            b.zeros(rows * 2 * hidden),
        );
        let back = LstmStep::between_slots(cell, rows, hidden, 1);
        b.lstm_cell(&mut one, &mut c, &mut h, &back);
        let tensors = [&gates, &cells, &states, &d_cell, &d_gates, &one, &c, &h];
        out.extend(tensors.iter().map(|t| b.to_vec(t)));
    }
    out
}

#[test]
fn lstm_cell_matches_cpu() {
    parity!(lstm_cases, 1e-5, 1e-6);
}

fn additive_attention_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let shape = AdditiveShape {
        batch: 3,
        tokens: 37,
        width: 19,
        values: 23,
    };
    let (n, a, v) = (shape.batch * shape.tokens, shape.width, shape.values);
    let (keys, values, w) = (
        b.tensor(&random(n * a, 1)),
        b.tensor(&random(n * v, 2)),
        b.tensor(&random(a, 3)),
    );
    let rows = Rows {
        offset: 2,
        stride: 40,
    };
    let query = b.tensor(&random(2 + 3 * 40, 4));
    let mut op = AdditiveAttention::new(b, shape);
    let mut context = b.zeros(2 + 3 * 40);
    op.forward(
        b,
        (&keys, &values, &w),
        (&query, rows),
        (&mut context, rows),
    );
    let d_context = b.tensor(&random(2 + 3 * 40, 5));
    let mut d_query = b.zeros(3 * a);
    let (mut d_keys, mut d_values, mut d_w) = (b.zeros(n * a), b.zeros(n * v), b.zeros(a));
    op.backward(
        b,
        (&keys, &values, &w),
        (&query, rows),
        (&d_context, rows),
        &mut d_query,
        (&mut d_keys, &mut d_values, &mut d_w),
    );
    [&context, &d_query, &d_keys, &d_values, &d_w]
        .iter()
        .map(|t| b.to_vec(t))
        .collect()
}

#[test]
fn additive_attention_matches_cpu() {
    parity!(additive_attention_cases, 1e-4, 1e-6);
}

fn contrastive_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (n, d) = (9, 13);
    let (image, text, log_scale) = (
        b.tensor(&random(n * d, 1)),
        b.tensor(&random(n * d, 2)),
        b.tensor(&[2.0]),
    );
    let mut loss = Contrastive::new(b, n, d);
    loss.forward(b, &image, &text, &log_scale);
    let (mut di, mut dt, mut ds) = (b.zeros(n * d), b.zeros(n * d), b.zeros(1));
    loss.backward(b, &log_scale, &mut di, &mut dt, &mut ds);
    [&loss.loss, &di, &dt, &ds]
        .iter()
        .map(|t| b.to_vec(t))
        .collect()
}

#[test]
fn contrastive_loss_matches_cpu() {
    parity!(contrastive_cases, 1e-4, 1e-6);
}

#[test]
fn recorded_work_runs_in_program_order_around_writes() {
    // A write after recorded (unsubmitted) reads must not overtake them.
    let Some(g) = gpu() else { return };
    let mut x = g.tensor(&[1.0, 2.0, 3.0]);
    let mut y = g.zeros(3);
    g.axpby(1.0, &x, 0.0, &mut y); // y = x, recorded
    g.write(&mut x, &[10.0, 20.0, 30.0]);
    g.axpby(1.0, &x, 1.0, &mut y); // y += new x
    assert_eq!(g.to_vec(&y), vec![11.0, 22.0, 33.0]);
}

// ---- token choice ----

/// Greedy, plain sampling, temperature with top-k, top-p, both with a
/// banned token, and Gumbel-max (banned token too), over rows of which
/// some ended at the previous step.
/// The chosen ids must be identical (compared exactly), the
/// log-probabilities close.
fn choose_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (rows, vocab, steps) = (37, 301, 3);
    // Spread logits, so that probabilities differ by orders of magnitude.
    let logits: Vec<f32> = random(rows * vocab, 1).iter().map(|x| 6.0 * x).collect();
    let logits = b.tensor(&logits);
    let settings = [
        None,
        Some((1.0, 0, 1.0)),
        Some((0.7, 5, 1.0)),
        Some((1.3, 0, 0.9)),
        Some((1.0, 40, 0.8)),
        None,
    ];
    let mut outs = Vec::new();
    for (i, setting) in settings.into_iter().enumerate() {
        // Step 1 of 3: rows 0 and 5 ended at step 0 (<eos>, then padding).
        let mut history = vec![7u32; rows * steps];
        history[0] = 2;
        history[5 * steps] = 0;
        let mut history = b.ids(&history);
        let mut next = b.ids(&vec![0; rows]);
        let mut logprobs = b.zeros(rows * steps);
        let choice = TokenChoice {
            rows,
            vocab,
            step: 1,
            steps,
            rule: match setting {
                None if i == 0 => ChoiceRule::Greedy,
                None => ChoiceRule::Gumbel,
                Some((temperature, top_k, top_p)) => ChoiceRule::Sample(Sampling {
                    temperature,
                    top_k,
                    top_p,
                }),
            },
            seed: 0x1234_5678_9abc_def0 + i as u64,
            first_row: 100,
            banned: if i >= 3 { 3 } else { u32::MAX },
            bos: 1,
            eos: 2,
            pad: 0,
        };
        b.choose_tokens(&logits, &choice, &mut next, &mut history, &mut logprobs);
        let as_f32 = |ids: Vec<u32>| ids.into_iter().map(|x| x as f32).collect::<Vec<_>>();
        outs.push(as_f32(b.ids_to_vec(&next)));
        outs.push(as_f32(b.ids_to_vec(&history)));
        outs.push(b.to_vec(&logprobs));
    }
    outs
}

#[test]
fn token_choice_matches_cpu() {
    parity!(choose_cases, 1e-5, 1e-5);
}

/// The Gumbel-perturbed, tempered logits of 5 sequences x 7 positions,
/// at two temperatures and a seed past 32 bits.
fn gumbel_cases<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let (rows, vocab) = (5 * 7, 129);
    let logits = b.tensor(&random(rows * vocab, 4));
    [(0.5, 3u64, 0u32), (2.0, 0xfeed_0000_0001, 40)]
        .into_iter()
        .map(|(tau, seed, first_row)| {
            let mut out = b.zeros(rows * vocab);
            b.gumbel_logits(&logits, vocab, 7, seed, first_row, tau, &mut out);
            b.to_vec(&out)
        })
        .collect()
}

#[test]
fn gumbel_logits_match_cpu() {
    parity!(gumbel_cases, 1e-4, 1e-4);
}

/// A buffer dropped after recording serves the next allocation at once,
/// even before anything is submitted: what was recorded with its old
/// contents still sees them, what comes after sees the new ones, and a
/// reused buffer handed out as zeros is zeros.
#[test]
fn pooled_buffers_are_reused_in_program_order() {
    let Some(g) = gpu() else { return };
    let mut first = g.zeros(4);
    let mut second = g.zeros(4);
    let a = g.tensor(&[1.0, 2.0, 3.0, 4.0]);
    g.axpby(1.0, &a, 0.0, &mut first);
    drop(a);
    let created = g.counters().buffers_created;
    let b = g.tensor(&[10.0, 20.0, 30.0, 40.0]);
    assert_eq!(
        g.counters().buffers_created,
        created,
        "a's buffer is reused"
    );
    g.axpby(1.0, &b, 0.0, &mut second);
    drop(b);
    let zeros = g.zeros(4);
    assert_eq!(
        g.counters().buffers_created,
        created,
        "b's buffer is reused"
    );
    assert_eq!(g.to_vec(&first), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(g.to_vec(&second), [10.0, 20.0, 30.0, 40.0]);
    assert_eq!(g.to_vec(&zeros), [0.0; 4]);
}

/// A group's span covers its members in order, so one op reaches all of
/// them; tensors allocated apart, or a group's members out of order,
/// have no span.
#[test]
fn a_tensor_group_is_one_span() {
    let Some(g) = gpu() else { return };
    let data: [&[f32]; 3] = [&[1.0; 5], &[2.0; 70], &[3.0; 1]];
    let mut group = g.tensor_group(&data);
    {
        let members: Vec<&_> = group.iter().collect();
        let mut all = g.span(&members).expect("a group has a span");
        assert!(all.len() >= 76, "{}", all.len());
        let total = g.to_vec(&all).iter().sum::<f32>();
        assert_eq!(total, 5.0 + 140.0 + 3.0, "padding holds zeros");
        g.scale(&mut all, 2.0);
    }
    assert_eq!(g.to_vec(&group[1]), vec![4.0; 70]);
    assert_eq!(g.to_vec(&group[2]), vec![6.0; 1]);
    assert!(g.span(&[&group[1], &group[0]]).is_none());
    let apart = [g.tensor(&[1.0]), g.tensor(&[2.0])];
    assert!(g.span(&[&apart[0], &apart[1]]).is_none());
    g.write(&mut group[0], &[9.0; 5]);
    assert_eq!(g.to_vec(&group[0]), vec![9.0; 5]);
    assert_eq!(
        g.to_vec(&group[1]),
        vec![4.0; 70],
        "a write stays in its member"
    );
}
