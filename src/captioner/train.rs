//! Training a captioner into a run folder:
//!
//! - `config.toml`: the run's configuration;
//! - `log.jsonl`: every `log_every` steps the objective, its loss, the MLE
//!   and the SMILE loss of the batch (whichever objective trains), lr,
//!   gradient norm and tokens/s;
//! - `samples.jsonl`: after each epoch, greedy captions of fixed
//!   validation images with their per-token losses;
//! - `metrics.jsonl`: after each epoch, validation metrics;
//! - `checkpoint.safetensors` (the model) and `optimizer.safetensors`
//!   (AdamW's moments and the position in the run), both written
//!   atomically after each epoch. Resuming from them continues exactly
//!   as the uninterrupted run would have: batch order and random subsets
//!   are drawn from generators seeded by epoch and step.

use super::Checkpoint;
use super::decode::{Decoding, generate};
use super::evaluate::{CaptionMetrics, Judge, evaluate};
use super::inspect::{TokenScore, score_caption};
use super::model::TokenInputs;
use super::objective::{BatchTargets, LossValues, Losses, Objective};
use super::run::RunConfig;
use crate::backend::Backend;
use crate::data::vocab::PAD;
use crate::data::{Dataset, Split};
use crate::optim::{AdamW, AdamWConfig, warmup_cosine};
use crate::retriever::Checkpoint as RetrieverCheckpoint;
use crate::tensorfile;
use anyhow::{Context, Result, bail};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A data set with one image embedding per item.
pub struct CaptionData {
    pub data: Dataset,
    /// `[items, dim]`, L2-normalised.
    pub features: Vec<f32>,
    pub dim: usize,
}

impl CaptionData {
    pub fn items(&self, split: Split) -> Vec<usize> {
        (0..self.data.items.len())
            .filter(|&i| self.data.items[i].split == split)
            .collect()
    }

    pub fn features_of(&self, items: &[usize]) -> Vec<f32> {
        items
            .iter()
            .flat_map(|&i| {
                self.features[i * self.dim..(i + 1) * self.dim]
                    .iter()
                    .copied()
            })
            .collect()
    }
}

/// Where a run is and what it writes.
pub struct RunFolder {
    pub dir: PathBuf,
}

impl RunFolder {
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("checkpoint.safetensors")
    }
    fn optimizer(&self) -> PathBuf {
        self.dir.join("optimizer.safetensors")
    }
    fn append(&self, file: &str, line: &impl Serialize) -> Result<()> {
        let path = self.dir.join(file);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("{}: cannot append", path.display()))?;
        writeln!(f, "{}", serde_json::to_string(line)?)?;
        Ok(())
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct LogLine {
    pub step: usize,
    pub epoch: usize,
    pub objective: String,
    #[serde(flatten)]
    pub losses: LossValues,
    pub lr: f32,
    pub grad_norm: f32,
    pub tokens_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub epoch: usize,
    pub image_id: String,
    pub caption: String,
    pub tokens: Vec<TokenScore>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EpochMetrics {
    pub epoch: usize,
    pub step: usize,
    #[serde(flatten)]
    pub metrics: CaptionMetrics,
}

/// What the caller sees as training goes.
pub enum Event<'a> {
    Log(&'a LogLine),
    Sample(&'a Sample),
    Metrics(&'a EpochMetrics),
}

/// The caller's answer to an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// End training now. The run folder keeps the last epoch's checkpoint;
    /// `--resume` continues from there.
    Stop,
}

/// Teacher-forcing targets `[batch, steps]`: each sequence's ids after <bos>.
fn targets_of(sequences: &[Vec<u32>], steps: usize) -> Vec<u32> {
    let mut t = vec![PAD; sequences.len() * steps];
    for (i, s) in sequences.iter().enumerate() {
        t[i * steps..i * steps + s.len() - 1].copy_from_slice(&s[1..]);
    }
    t
}

const STEP_KEY: &str = "step";
const EPOCH_KEY: &str = "epoch";

/// Trains `ck` on the training split and writes the run folder. `resume`
/// continues from the folder's optimizer state. The retriever, when
/// given, adds its metrics to the per-epoch validation.
#[allow(clippy::too_many_arguments)]
pub fn train<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    data: &CaptionData,
    config: &RunConfig,
    run: &RunFolder,
    resume: bool,
    mut retriever: Option<&mut RetrieverCheckpoint<B>>,
    mut on_event: impl FnMut(Event<'_>) -> Flow,
) -> Result<()> {
    let t = &config.train;
    let objective: Objective = config.objective();
    let c = ck.model.config;
    let steps = c.token_positions();
    let train_items = data.items(Split::Train);
    if train_items.len() < t.batch {
        bail!(
            "{}: {} training images, fewer than one batch of {}; lower [train] batch",
            data.data.name,
            train_items.len(),
            t.batch
        );
    }
    let per_epoch = train_items.len() / t.batch;
    let total = per_epoch * t.epochs;
    if t.warmup >= total {
        eprintln!(
            "warning: [train] warmup ({} steps) is not shorter than the run ({total} steps); \
             the learning rate never reaches {}",
            t.warmup, t.lr
        );
    }
    let mut opt = AdamW::new(
        b,
        AdamWConfig {
            lr: t.lr,
            weight_decay: t.weight_decay,
            ..AdamWConfig::default()
        },
        &ck.model.params.optimizer_layout(),
    );
    std::fs::create_dir_all(&run.dir)
        .with_context(|| format!("{}: cannot create the run folder", run.dir.display()))?;
    let (mut step, first_epoch) = if resume {
        load_optimizer(b, &mut opt, &run.optimizer())?
    } else {
        tensorfile::write_atomic(&run.dir.join("config.toml"), config.to_toml().as_bytes())?;
        for f in ["log.jsonl", "samples.jsonl", "metrics.jsonl"] {
            let _ = std::fs::remove_file(run.dir.join(f));
        }
        (0, 0)
    };
    let val_items = data.items(Split::Val);
    let sample_items: Vec<usize> = val_items.iter().copied().take(t.sample_images).collect();
    let eval_items: Vec<usize> = val_items.iter().copied().take(t.eval_images).collect();
    let mut losses = Losses::new(b, objective, ck.model.rows(), c.vocab_size);
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps {elapsed_precise} (eta {eta}) {msg}",
        )
        .expect("a valid template"),
    );
    bar.set_position(step as u64);
    let (mut since, mut tokens) = (Instant::now(), 0usize);
    for epoch in first_epoch..t.epochs {
        let mut rng = ChaCha8Rng::seed_from_u64(t.seed ^ (epoch as u64).wrapping_mul(0x9e37_79b9));
        let mut order = train_items.clone();
        order.shuffle(&mut rng);
        for chunk in order.chunks_exact(t.batch) {
            let sequences: Vec<Vec<u32>> = chunk
                .iter()
                .map(|&i| {
                    let caps = &data.data.items[i].captions;
                    ck.vocab
                        .encode(&caps[rng.random_range(0..caps.len())].tokens, c.max_len)
                })
                .collect();
            let targets = targets_of(&sequences, steps);
            tokens += targets.iter().filter(|&&id| id != PAD).count();
            let mut subset_rng = ChaCha8Rng::seed_from_u64(t.seed.wrapping_add(step as u64));
            let batch_targets =
                BatchTargets::new(b, &objective, &ck.vocab, &targets, steps, &mut subset_rng)?;
            let inputs = TokenInputs::new(b, &c, &sequences)?;
            ck.model.forward(b, &data.features_of(chunk), &inputs);
            losses.forward_backward(b, &ck.model.logits, &batch_targets);
            ck.model.params.zero_grads(b);
            ck.model.backward(b, &inputs, &losses.d_logits);
            opt.config.lr = warmup_cosine(t.lr, t.warmup, step, total);
            let params = &mut ck.model.params;
            let mut values: Vec<&mut B::Tensor> = params.values.iter_mut().collect();
            let grads: Vec<&B::Tensor> = params.grads.iter().collect();
            opt.step(b, &mut values, &grads);
            step += 1;
            bar.inc(1);
            if step % t.log_every.max(1) == 0 || step == total {
                let values = losses.read(b, &batch_targets);
                if !values.loss.is_finite() {
                    bar.abandon();
                    bail!(
                        "the loss became {} at step {step} (epoch {}); the last good checkpoint is {} \
                         (end of epoch {epoch}); resume from it with `captune train --resume {}` after \
                         lowering lr in its config.toml",
                        values.loss,
                        epoch + 1,
                        run.checkpoint().display(),
                        run.dir.display()
                    );
                }
                let line = LogLine {
                    step,
                    epoch: epoch + 1,
                    objective: objective.describe(),
                    losses: values,
                    lr: opt.config.lr,
                    grad_norm: opt.last_grad_norm(b),
                    tokens_per_s: tokens as f64 / since.elapsed().as_secs_f64(),
                };
                (since, tokens) = (Instant::now(), 0);
                run.append("log.jsonl", &line)?;
                bar.set_message(format!(
                    "epoch {} loss {:.3} (mle {:.3} smile {:.3})",
                    epoch + 1,
                    values.loss,
                    values.mle,
                    values.smile
                ));
                if bar.suspend(|| on_event(Event::Log(&line))) == Flow::Stop {
                    bar.abandon();
                    return Ok(());
                }
            }
        }
        ck.save(b, &run.checkpoint(), HashMap::new())?;
        save_optimizer(b, &opt, &run.optimizer(), step, epoch + 1)?;
        for &i in &sample_items {
            let sample = sample_caption(b, ck, data, i, epoch + 1)?;
            run.append("samples.jsonl", &sample)?;
            if bar.suspend(|| on_event(Event::Sample(&sample))) == Flow::Stop {
                bar.abandon();
                return Ok(());
            }
        }
        if !eval_items.is_empty() {
            let metrics = evaluate_items(
                b,
                ck,
                data,
                &eval_items,
                &Decoding::Greedy,
                retriever.as_deref_mut(),
            )?;
            let record = EpochMetrics {
                epoch: epoch + 1,
                step,
                metrics,
            };
            run.append("metrics.jsonl", &record)?;
            if bar.suspend(|| on_event(Event::Metrics(&record))) == Flow::Stop {
                bar.abandon();
                return Ok(());
            }
        }
        since = Instant::now();
        tokens = 0;
    }
    bar.finish();
    Ok(())
}

/// The greedy caption of item `i` with its per-token losses.
pub fn sample_caption<B: Backend>(
    b: &B,
    ck: &Checkpoint<B>,
    data: &CaptionData,
    i: usize,
    epoch: usize,
) -> Result<Sample> {
    let mut model = ck.with_batch(b, 1)?;
    let features = data.features_of(&[i]);
    let generated = generate(b, &mut model, &features, &Decoding::Greedy, None)?;
    let ids: Vec<u32> = std::iter::once(crate::data::vocab::BOS)
        .chain(generated[0].ids.iter().copied())
        .collect();
    Ok(Sample {
        epoch,
        image_id: data.data.items[i].id.clone(),
        caption: generated[0].text(&ck.vocab),
        tokens: score_caption(b, &mut model, &ck.vocab, &features, &ids)?,
    })
}

/// Captions `items` with `decoding` and scores them (with the retriever's
/// metrics when one is given).
pub fn evaluate_items<B: Backend>(
    b: &B,
    ck: &Checkpoint<B>,
    data: &CaptionData,
    items: &[usize],
    decoding: &Decoding,
    retriever: Option<&mut RetrieverCheckpoint<B>>,
) -> Result<CaptionMetrics> {
    let generated = caption_items(b, ck, data, items, decoding, None)?;
    score_captions(b, data, items, &generated, retriever)
}

/// Every metric of `captions[k]` (the captions of item `items[k]`), with
/// the retriever's when one is given.
pub fn score_captions<B: Backend>(
    b: &B,
    data: &CaptionData,
    items: &[usize],
    captions: &[Vec<String>],
    retriever: Option<&mut RetrieverCheckpoint<B>>,
) -> Result<CaptionMetrics> {
    let chosen: Vec<&crate::data::Item> = items.iter().map(|&i| &data.data.items[i]).collect();
    let tokens: Vec<Vec<Vec<String>>> = captions
        .iter()
        .map(|g| g.iter().map(|c| words(c)).collect())
        .collect();
    let image_embeddings = data.features_of(items);
    let judge = retriever.map(|r| Judge {
        retriever: r,
        image_embeddings: &image_embeddings,
    });
    evaluate(b, &chosen, &tokens, judge)
}

fn words(caption: &str) -> Vec<String> {
    caption.split_whitespace().map(str::to_string).collect()
}

/// The captions of `items`, `decoding.per_image()` each.
pub fn caption_items<B: Backend>(
    b: &B,
    ck: &Checkpoint<B>,
    data: &CaptionData,
    items: &[usize],
    decoding: &Decoding,
    max_words: Option<usize>,
) -> Result<Vec<Vec<String>>> {
    let per_row = decoding.rows_per_image();
    let batch = (64 / per_row).max(1) * per_row;
    let mut model = ck.with_batch(b, batch)?;
    let generated = generate(b, &mut model, &data.features_of(items), decoding, max_words)?;
    let mut out = vec![Vec::new(); items.len()];
    for g in generated {
        out[g.image].push(g.text(&ck.vocab));
    }
    Ok(out)
}

fn save_optimizer<B: Backend>(
    b: &B,
    opt: &AdamW<B>,
    path: &Path,
    step: usize,
    epoch: usize,
) -> Result<()> {
    let (t, m, v) = opt.state(b);
    let names: Vec<String> = (0..m.len())
        .flat_map(|i| [format!("m.{i}"), format!("v.{i}")])
        .collect();
    let tensors: Vec<(&str, Vec<usize>, &[f32])> = names
        .iter()
        .zip(m.iter().zip(&v).flat_map(|(a, b)| [a, b]))
        .map(|(n, d)| (n.as_str(), vec![d.len()], d.as_slice()))
        .collect();
    let metadata = HashMap::from([
        (STEP_KEY.to_string(), step.to_string()),
        (EPOCH_KEY.to_string(), epoch.to_string()),
        ("adamw_step".to_string(), t.to_string()),
    ]);
    tensorfile::write(path, &tensors, metadata)
}

/// (step, epochs done) after restoring the moments.
fn load_optimizer<B: Backend>(b: &B, opt: &mut AdamW<B>, path: &Path) -> Result<(usize, usize)> {
    let mut file = tensorfile::read(path).with_context(|| {
        format!(
            "{}: no optimizer state to resume from; was the run folder written by `captune train`?",
            path.display()
        )
    })?;
    let number = |file: &tensorfile::TensorFile, key: &str| -> Result<u64> {
        file.meta(key, path)?
            .parse()
            .with_context(|| format!("{}: metadata {key:?} is not a number", path.display()))
    };
    let (step, epoch, t) = (
        number(&file, STEP_KEY)?,
        number(&file, EPOCH_KEY)?,
        number(&file, "adamw_step")?,
    );
    let count = opt.state(b).1.len();
    let (mut m, mut v) = (Vec::new(), Vec::new());
    for i in 0..count {
        m.push(file.take(&format!("m.{i}"), path)?.data);
        v.push(file.take(&format!("v.{i}"), path)?.data);
    }
    opt.restore(b, t, &m, &v);
    Ok((step as usize, epoch as usize))
}
