//! A 2-layer MLP trained with AdamW (weight decay, clipping) for 20 steps on
//! each backend: the losses must fall and agree to 1e-4 relative.

use crate::common;

use captune::backend::{Backend, VocabSubsets};
use captune::cpu::CpuBackend;
use captune::ops::cross_entropy::CrossEntropy;
use captune::ops::linear::Linear;
use captune::optim::{AdamW, AdamWConfig};
use common::{gpu, random};

const BATCH: usize = 32;
const INPUTS: usize = 20;
const HIDDEN: usize = 48;
const CLASSES: usize = 10;
/// Below the first steps' gradient norm, so clipping is exercised.
const CLIP: f32 = 0.3;

/// Labels from a fixed random linear teacher, so there is something to learn.
fn data() -> (Vec<f32>, Vec<u32>) {
    let x = random(BATCH * INPUTS, 11);
    let teacher = random(INPUTS * CLASSES, 12);
    let labels = (0..BATCH)
        .map(|r| {
            let score = |c: usize| {
                (0..INPUTS)
                    .map(|i| x[r * INPUTS + i] * teacher[i * CLASSES + c])
                    .sum::<f32>()
            };
            (0..CLASSES)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap() as u32
        })
        .collect();
    (x, labels)
}

/// Per step: (loss, global gradient norm).
fn train<B: Backend>(b: &B) -> Vec<(f32, f32)> {
    let (x_host, labels) = data();
    let x = b.tensor(&x_host);
    let targets = b.ids(&labels);
    let subsets = VocabSubsets::full(b, BATCH);
    let l1 = Linear {
        rows: BATCH,
        inputs: INPUTS,
        outputs: HIDDEN,
    };
    let l2 = Linear {
        rows: BATCH,
        inputs: HIDDEN,
        outputs: CLASSES,
    };
    let scale = |v: Vec<f32>, s: f32| v.into_iter().map(|x| x * s).collect::<Vec<_>>();
    let mut w1 = b.tensor(&scale(random(INPUTS * HIDDEN, 1), 0.4));
    let mut b1 = b.zeros(HIDDEN);
    let mut w2 = b.tensor(&scale(random(HIDDEN * CLASSES, 2), 0.3));
    let mut b2 = b.zeros(CLASSES);
    let (mut dw1, mut db1, mut dw2, mut db2) = (
        b.zeros(INPUTS * HIDDEN),
        b.zeros(HIDDEN),
        b.zeros(HIDDEN * CLASSES),
        b.zeros(CLASSES),
    );
    let (mut a1, mut h, mut logits) = (
        b.zeros(BATCH * HIDDEN),
        b.zeros(BATCH * HIDDEN),
        b.zeros(BATCH * CLASSES),
    );
    let (mut dlogits, mut dh, mut da1) = (
        b.zeros(BATCH * CLASSES),
        b.zeros(BATCH * HIDDEN),
        b.zeros(BATCH * HIDDEN),
    );
    let mut ce = CrossEntropy::new(b, BATCH, CLASSES);
    ce.set_weights(b, &[1.0; BATCH], 1.0);
    let config = AdamWConfig {
        lr: 2e-2,
        weight_decay: 0.01,
        max_grad_norm: Some(CLIP),
        ..Default::default()
    };
    let sizes = [
        (INPUTS * HIDDEN, true),
        (HIDDEN, false),
        (HIDDEN * CLASSES, true),
        (CLASSES, false),
    ];
    let mut opt = AdamW::new(b, config, &sizes);
    let mut history = Vec::new();
    for _ in 0..20 {
        // forward
        l1.forward(b, &x, &w1, Some(&b1), &mut a1);
        b.gelu(&a1, &mut h);
        l2.forward(b, &h, &w2, Some(&b2), &mut logits);
        ce.forward(b, &logits, &targets, &subsets, true);
        // backward, the same list reversed
        for g in [&mut dw1, &mut db1, &mut dw2, &mut db2] {
            b.fill(g, 0.0);
        }
        ce.backward(b, &logits, &targets, &subsets, &mut dlogits, false);
        l2.backward(
            b,
            &dlogits,
            &h,
            &w2,
            &mut dw2,
            Some(&mut db2),
            Some((&mut dh, false)),
        );
        b.gelu_backward(&a1, &dh, &mut da1, false);
        l1.backward(b, &da1, &x, &w1, &mut dw1, Some(&mut db1), None);
        opt.step(
            b,
            &mut [&mut w1, &mut b1, &mut w2, &mut b2],
            &[&dw1, &db1, &dw2, &db2],
        );
        history.push((ce.read_loss(b), opt.last_grad_norm(b)));
    }
    history
}

#[test]
fn mlp_trains_on_cpu() {
    let history = train(&CpuBackend::new());
    let (first, last) = (history[0].0, history[19].0);
    assert!(last < 0.5 * first, "loss fell only from {first} to {last}");
    assert!(
        history[0].1 > CLIP,
        "the first gradient norm {} should exceed the clip {CLIP}",
        history[0].1
    );
}

#[test]
fn mlp_gives_the_same_losses_on_gpu_and_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = train(&CpuBackend::new());
    let gpu = train(&g);
    for (step, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        let rel = |a: f32, b: f32| (a - b).abs() / b.abs().max(1e-12);
        assert!(
            rel(g.0, c.0) <= 1e-4,
            "step {step}: loss {} on GPU, {} on CPU",
            g.0,
            c.0
        );
        assert!(
            rel(g.1, c.1) <= 1e-4,
            "step {step}: grad norm {} on GPU, {} on CPU",
            g.1,
            c.1
        );
    }
}
