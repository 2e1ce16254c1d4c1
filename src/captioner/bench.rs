//! `captune bench train`: captioner training throughput in tokens per
//! second on a fixed synthetic workload that `scripts/bench_torch_captioner.py`
//! reproduces in PyTorch: the preset's network, 128-dimensional image
//! embeddings, a 79-id vocabulary (the shapes world's), every caption the
//! full `max_len - 1` tokens (no padding), one complete step each time
//! (forward, loss, backward, AdamW).

use super::CaptionVocab;
use super::model::{Captioner, TokenInputs};
use super::objective::{BatchTargets, Losses, Objective};
use super::run::RunConfig;
use crate::backend::{Backend, BackendKind};
use crate::data::vocab::{BOS, EOS};
use crate::optim::{AdamW, AdamWConfig};
use anyhow::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::time::Instant;

pub const EMBED_DIM: usize = 128;
pub const VOCAB: usize = 79;

#[derive(Clone, Debug, Serialize)]
pub struct TrainBench {
    pub op: String,
    pub backend: BackendKind,
    pub adapter: String,
    pub preset: String,
    pub objective: String,
    pub batch: usize,
    pub tokens_per_step: usize,
    pub parameters: usize,
    pub steps: usize,
    pub seconds_per_step: f64,
    pub tokens_per_s: f64,
}

impl std::fmt::Display for TrainBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<4} train {} ({}) batch {}: {:9.0} tokens/s ({:.1} ms/step)",
            self.backend,
            self.preset,
            self.objective,
            self.batch,
            self.tokens_per_s,
            self.seconds_per_step * 1e3
        )
    }
}

/// Times `steps` training steps after `warmup` untimed ones.
pub fn train_throughput<B: Backend>(
    b: &B,
    preset: &str,
    objective: Objective,
    warmup: usize,
    steps: usize,
) -> Result<TrainBench> {
    let run = RunConfig::preset(preset)?;
    let batch = run.train.batch;
    let config = run.captioner(EMBED_DIM, VOCAB);
    let vocab = CaptionVocab::from_words((4..VOCAB).map(|i| format!("w{i}")).collect());
    let mut model = Captioner::new(b, config, batch, 0)?;
    let mut opt = AdamW::new(b, AdamWConfig::default(), &model.params.optimizer_layout());
    let mut losses = Losses::new(b, objective, model.rows(), VOCAB);
    let t = config.token_positions();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let features: Vec<f32> = (0..batch * EMBED_DIM)
        .map(|_| rng.random_range(-0.1..0.1))
        .collect();
    // <bos>, t - 1 random words, <eos>: t inputs and t targets per caption.
    let sequences: Vec<Vec<u32>> = (0..batch)
        .map(|_| {
            std::iter::once(BOS)
                .chain((1..t).map(|_| rng.random_range(4..VOCAB as u32)))
                .chain(std::iter::once(EOS))
                .collect()
        })
        .collect();
    let targets: Vec<u32> = sequences
        .iter()
        .flat_map(|s| s[1..].iter().copied())
        .collect();
    let mut step = || -> Result<()> {
        let inputs = TokenInputs::new(b, &config, &sequences)?;
        let batch_targets = BatchTargets::new(b, &objective, &vocab, &targets, t, &mut rng)?;
        model.forward(b, &features, &inputs);
        losses.forward_backward(b, &model.logits, &batch_targets);
        model.params.zero_grads(b);
        model.backward(b, &inputs, &losses.d_logits);
        let params = &mut model.params;
        let mut values: Vec<&mut B::Tensor> = params.values.iter_mut().collect();
        let grads: Vec<&B::Tensor> = params.grads.iter().collect();
        opt.step(b, &mut values, &grads);
        Ok(())
    };
    for _ in 0..warmup {
        step()?;
    }
    b.flush();
    let start = Instant::now();
    for _ in 0..steps {
        step()?;
    }
    b.flush();
    let seconds = start.elapsed().as_secs_f64() / steps as f64;
    let parameters = model.params.count();
    Ok(TrainBench {
        op: "train".into(),
        backend: b.kind(),
        adapter: b.adapter_name(),
        preset: preset.into(),
        objective: objective.describe(),
        batch,
        tokens_per_step: batch * t,
        parameters,
        steps,
        seconds_per_step: seconds,
        tokens_per_s: (batch * t) as f64 / seconds,
    })
}
