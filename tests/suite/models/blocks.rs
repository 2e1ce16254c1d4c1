//! The transformer's block variants beyond GPT-2's: post-LN blocks
//! (BERT's) and cross-attention to a memory of other tokens (BLIP's text
//! decoder reading image tokens), against their definition in float64,
//! finite differences, and the GPU.

use crate::common;

use captune::backend::{Backend, Storage};
use captune::cpu::CpuBackend;
use captune::model::layers::{Activation, NormEpsilon};
use captune::model::params::Params;
use captune::model::transformer::{Transformer, TransformerConfig};
use common::{Probing, assert_close, check_gradient, gpu, random};
use std::collections::HashMap;

const WIDTH: usize = 6;
const MEMORY_WIDTH: usize = 5;
const BATCH: usize = 2;
const SEQ: usize = 3;
const MEMORY_LEN: usize = 4;

/// Two causal blocks of 2 heads with BERT's exact GELU, cross-attending
/// or not; post-LN ones as BLIP's text decoder has them (a layer norm on
/// the input, none after the last block, BERT's epsilon), pre-LN ones as
/// GPT-2's.
fn config(post_norm: bool, cross: bool) -> TransformerConfig {
    TransformerConfig {
        activation: Activation::GeluErf,
        post_norm,
        pre_norm: post_norm,
        final_norm: !post_norm,
        norm_eps: NormEpsilon(if post_norm { 1e-12 } else { 1e-5 }),
        cross_width: cross.then_some(MEMORY_WIDTH),
        ..TransformerConfig::new(WIDTH, 2, 2, true)
    }
}

/// A transformer of `config` with every parameter drawn in [-0.6, 0.6]
/// (layer norms around 1), so that every path changes the output.
fn built<B: Backend>(b: &B, config: TransformerConfig) -> (Transformer, Params<B>) {
    let mut params = Params::new(0);
    let t = Transformer::new(&mut params, "t", config);
    params.finish(b);
    for (i, value) in params.values.iter_mut().enumerate() {
        let spec = &params.specs[i];
        let gain = spec.shape.len() == 1 && spec.name.ends_with(".weight");
        let v: Vec<f32> = random(value.len(), 70 + i as u64)
            .iter()
            .map(|x| if gain { 1.0 + 0.3 * x } else { 0.6 * x })
            .collect();
        b.write(value, &v);
    }
    (t, params)
}

/// The output for `input` and `memory` (empty without cross-attention).
fn output<B: Backend>(
    b: &B,
    t: &Transformer,
    params: &Params<B>,
    input: &[f32],
    memory: &[f32],
) -> Vec<f32> {
    let mut acts = match t.config.cross_width {
        Some(_) => t.cross_activations(b, (BATCH, SEQ, MEMORY_LEN), true),
        None => t.activations(b, BATCH, SEQ),
    };
    b.write(acts.input(), input);
    if !memory.is_empty() {
        b.write(acts.memory(), memory);
    }
    let mut out = b.zeros(BATCH * SEQ * WIDTH);
    t.forward(b, params, &mut acts, None, &mut out);
    b.to_vec(&out)
}

fn inputs(cross: bool) -> (Vec<f32>, Vec<f32>) {
    let memory = match cross {
        true => random(BATCH * MEMORY_LEN * MEMORY_WIDTH, 2),
        false => Vec::new(),
    };
    (random(BATCH * SEQ * WIDTH, 1), memory)
}

// ---- the definition, in float64 ----

type Weights = HashMap<String, Vec<f64>>;

fn weights<B: Backend>(b: &B, params: &Params<B>) -> Weights {
    let values = params.values.iter().map(|v| b.to_vec(v));
    let f64s = values.map(|v| v.iter().map(|&x| x as f64).collect());
    params
        .specs
        .iter()
        .map(|s| s.name.clone())
        .zip(f64s)
        .collect()
}

/// x `[rows, n_in]` times the input-major weight `name.weight` plus its bias.
fn dense(w: &Weights, name: &str, x: &[f64], n_in: usize) -> Vec<f64> {
    let (weight, bias) = (&w[&format!("{name}.weight")], &w[&format!("{name}.bias")]);
    let n_out = bias.len();
    x.chunks(n_in)
        .flat_map(|row| {
            (0..n_out).map(move |j| {
                bias[j]
                    + (0..n_in)
                        .map(|i| row[i] * weight[i * n_out + j])
                        .sum::<f64>()
            })
        })
        .collect()
}

fn layer_norm(w: &Weights, name: &str, x: &[f64]) -> Vec<f64> {
    let (gamma, beta) = (&w[&format!("{name}.weight")], &w[&format!("{name}.bias")]);
    x.chunks(WIDTH)
        .flat_map(|row| {
            let mean = row.iter().sum::<f64>() / WIDTH as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / WIDTH as f64;
            let rstd = 1.0 / (var + 1e-12).sqrt();
            (0..WIDTH).map(move |j| (row[j] - mean) * rstd * gamma[j] + beta[j])
        })
        .collect()
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// Multi-head attention of queries `[BATCH, q_len, WIDTH]` over keys and
/// values `[BATCH, k_len, WIDTH]`, causal or not.
fn attend(q: &[f64], k: &[f64], v: &[f64], k_len: usize, causal: bool) -> Vec<f64> {
    let (heads, d) = (2, WIDTH / 2);
    let q_len = q.len() / BATCH / WIDTH;
    let mut out = vec![0.0; q.len()];
    for item in 0..BATCH {
        for h in 0..heads {
            for i in 0..q_len {
                let at = |x: &[f64], len: usize, t: usize, e: usize| {
                    x[(item * len + t) * WIDTH + h * d + e]
                };
                let keys = if causal { i + 1 } else { k_len };
                let scores: Vec<f64> = (0..keys)
                    .map(|j| {
                        (0..d)
                            .map(|e| at(q, q_len, i, e) * at(k, k_len, j, e))
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for e in 0..d {
                    out[(item * q_len + i) * WIDTH + h * d + e] = (0..keys)
                        .map(|j| (scores[j] - max).exp() / total * at(v, k_len, j, e))
                        .sum();
                }
            }
        }
    }
    out
}

fn split(x: &[f64], parts: usize) -> Vec<Vec<f64>> {
    (0..parts)
        .map(|p| {
            x.chunks(parts * WIDTH)
                .flat_map(|row| row[p * WIDTH..(p + 1) * WIDTH].to_vec())
                .collect()
        })
        .collect()
}

fn gelu_erf(x: f64) -> f64 {
    // erf by its Abramowitz-Stegun 7.1.26 approximation is too coarse
    // for 1e-5; integrate exp(-t^2) by Simpson's rule instead.
    let n = 2000;
    let h = x / std::f64::consts::SQRT_2 / n as f64;
    let f = |t: f64| (-t * t).exp();
    let simpson: f64 = (0..=n)
        .map(|i| {
            let weight = if i == 0 || i == n {
                1.0
            } else if i % 2 == 1 {
                4.0
            } else {
                2.0
            };
            weight * f(i as f64 * h)
        })
        .sum::<f64>()
        * h
        / 3.0;
    let erf = 2.0 / std::f64::consts::PI.sqrt() * simpson;
    0.5 * x * (1.0 + erf)
}

/// The post-LN, cross-attending transformer from BERT's definition: the
/// embeddings' layer norm x = LN(input), then block after block
/// h = LN1(x + attn(x)), c = LN_c(h + cross(h, memory)),
/// out = LN2(c + fc2(gelu(fc1(c)))), with BERT's epsilon 1e-12.
fn post_norm_reference(w: &Weights, input: &[f32], memory: &[f32]) -> Vec<f64> {
    let input: Vec<f64> = input.iter().map(|&v| v as f64).collect();
    let mut x = layer_norm(w, "t.ln_pre", &input);
    let memory: Vec<f64> = memory.iter().map(|&v| v as f64).collect();
    for l in 0..2 {
        let name = |part: &str| format!("t.blocks.{l}.{part}");
        let qkv = split(&dense(w, &name("attn.qkv"), &x, WIDTH), 3);
        let attended = attend(&qkv[0], &qkv[1], &qkv[2], SEQ, true);
        let h = layer_norm(
            w,
            &name("ln1"),
            &add(&x, &dense(w, &name("attn.proj"), &attended, WIDTH)),
        );
        let q = dense(w, &name("cross.q"), &h, WIDTH);
        let kv = split(&dense(w, &name("cross.kv"), &memory, MEMORY_WIDTH), 2);
        let crossed = attend(&q, &kv[0], &kv[1], MEMORY_LEN, false);
        let c = layer_norm(
            w,
            &name("cross.ln"),
            &add(&h, &dense(w, &name("cross.proj"), &crossed, WIDTH)),
        );
        let hidden: Vec<f64> = dense(w, &name("mlp.fc1"), &c, WIDTH)
            .into_iter()
            .map(gelu_erf)
            .collect();
        let mlp = dense(w, &name("mlp.fc2"), &hidden, 4 * WIDTH);
        x = layer_norm(w, &name("ln2"), &add(&c, &mlp));
    }
    x
}

#[test]
fn a_post_norm_cross_attending_transformer_is_berts_definition() {
    let b = CpuBackend::new();
    let (t, params) = built(&b, config(true, true));
    let (input, memory) = inputs(true);
    let got = output(&b, &t, &params, &input, &memory);
    let want: Vec<f32> = post_norm_reference(&weights(&b, &params), &input, &memory)
        .iter()
        .map(|&v| v as f32)
        .collect();
    assert_close(
        "post-LN cross-attending transformer",
        &got,
        &want,
        1e-4,
        1e-5,
    );
}

#[test]
fn parameter_counts_include_cross_attention() {
    let b = CpuBackend::new();
    for (post_norm, cross) in [(false, true), (true, true), (true, false)] {
        let c = config(post_norm, cross);
        let (_, params) = built(&b, c);
        assert_eq!(c.parameter_count(), params.count() as u128, "{c:?}");
    }
}

// ---- gradients ----

/// Central differences at 24 coordinates, of steps 3e-3, not the kernel
/// checks' 1e-2: layer norms over 6 columns curve enough within 1e-2 to
/// move a difference by a few percent.
const PROBING: Probing = Probing {
    eps: 3e-3,
    count: 24,
    atol: 3e-3,
    rtol: 3e-2,
};

/// The gradients of sum(out * r): (input, memory, every parameter).
fn gradients<B: Backend>(
    b: &B,
    t: &Transformer,
    params: &mut Params<B>,
    (input, memory): (&[f32], &[f32]),
    r: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<Vec<f32>>) {
    let cross = t.config.cross_width.is_some();
    let mut acts = match cross {
        true => t.cross_activations(b, (BATCH, SEQ, MEMORY_LEN), true),
        false => t.activations(b, BATCH, SEQ),
    };
    b.write(acts.input(), input);
    if cross {
        b.write(acts.memory(), memory);
    }
    let mut out = b.zeros(r.len());
    t.forward(b, params, &mut acts, None, &mut out);
    params.zero_grads(b);
    let d_input = b.to_vec(t.backward(b, params, &mut acts, None, &b.tensor(r)));
    let d_memory = b.to_vec(acts.d_memory());
    (
        d_input,
        d_memory,
        params.grads.iter().map(|g| b.to_vec(g)).collect(),
    )
}

#[test]
fn post_norm_and_cross_attention_backward_match_finite_differences() {
    let b = CpuBackend::new();
    for (post_norm, cross) in [(false, true), (true, true), (true, false)] {
        let what = format!("post_norm {post_norm}, cross {cross}");
        let (t, mut params) = built(&b, config(post_norm, cross));
        let (input, memory) = inputs(cross);
        let r = random(BATCH * SEQ * WIDTH, 3);
        let loss = |params: &Params<CpuBackend>, input: &[f32], memory: &[f32]| {
            let out = output(&b, &t, params, input, memory);
            out.iter()
                .zip(&r)
                .map(|(&o, &r)| o as f64 * r as f64)
                .sum::<f64>()
        };
        let (d_input, d_memory, d_params) = gradients(&b, &t, &mut params, (&input, &memory), &r);
        let input_loss = |x: &[f32]| loss(&params, x, &memory);
        check_gradient(
            &format!("{what}: input"),
            &input,
            &d_input,
            input_loss,
            &PROBING,
        );
        if cross {
            let memory_loss = |m: &[f32]| loss(&params, &input, m);
            check_gradient(
                &format!("{what}: memory"),
                &memory,
                &d_memory,
                memory_loss,
                &PROBING,
            );
        }
        common::check_parameter_gradients(
            &mut params,
            |p| p,
            &d_params,
            PROBING.eps,
            |p| loss(p, &input, &memory),
        );
    }
}

// ---- the GPU ----

fn forward_and_backward<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    for (post_norm, cross) in [(false, true), (true, true), (true, false)] {
        let (t, mut params) = built(b, config(post_norm, cross));
        let (input, memory) = inputs(cross);
        outs.push(output(b, &t, &params, &input, &memory));
        let r = random(BATCH * SEQ * WIDTH, 3);
        let (d_input, d_memory, d_params) = gradients(b, &t, &mut params, (&input, &memory), &r);
        outs.extend([d_input, d_memory]);
        outs.extend(d_params);
    }
    outs
}

#[test]
fn post_norm_and_cross_attention_match_on_the_gpu() {
    let Some(g) = gpu() else { return };
    let want = forward_and_backward(&CpuBackend::new());
    let got = forward_and_backward(&g);
    assert_eq!(got.len(), want.len());
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("output {i}"), got, want, 1e-4, 1e-5);
    }
}

// ---- decoding ----

/// (the outputs over the KV cache, one position at a time after the
/// memory is remembered; the full forward's), every position of every row.
fn cached_and_full<B: Backend>(b: &B, post_norm: bool) -> (Vec<f32>, Vec<f32>) {
    let (t, params) = built(b, config(post_norm, true));
    let (input, memory) = inputs(true);
    let full = output(b, &t, &params, &input, &memory);
    let mut cache = t.memory_kv_cache(b, BATCH, SEQ, MEMORY_LEN);
    t.remember(b, &params, &mut cache, &b.tensor(&memory));
    let mut out = b.zeros(BATCH * WIDTH);
    let mut cached = vec![0.0; full.len()];
    for p in 0..SEQ {
        let at = |r: usize| (r * SEQ + p) * WIDTH..(r * SEQ + p + 1) * WIDTH;
        let step: Vec<f32> = (0..BATCH).flat_map(|r| input[at(r)].to_vec()).collect();
        b.write(cache.input(), &step);
        t.forward_cached(b, &params, &mut cache, &mut out);
        let got = b.to_vec(&out);
        for r in 0..BATCH {
            cached[at(r)].copy_from_slice(&got[r * WIDTH..(r + 1) * WIDTH]);
        }
    }
    (cached, full)
}

#[test]
fn cross_attending_decoding_over_the_cache_equals_the_full_forward() {
    for post_norm in [false, true] {
        let (cached, full) = cached_and_full(&CpuBackend::new(), post_norm);
        assert_close(
            &format!("CPU, post_norm {post_norm}"),
            &cached,
            &full,
            1e-5,
            1e-6,
        );
        if let Some(g) = gpu() {
            let (cached, full) = cached_and_full(&g, post_norm);
            assert_close(
                &format!("GPU, post_norm {post_norm}"),
                &cached,
                &full,
                1e-4,
                1e-5,
            );
        }
    }
}
