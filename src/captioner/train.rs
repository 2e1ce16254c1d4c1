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

use super::decode::{Decoding, generate};
use super::evaluate::{CaptionMetrics, Judge, evaluate};
use super::inspect::{TokenScore, score_caption};
use super::model::Captioner;
use super::model::TokenInputs;
use super::objective::{BatchTargets, LossValues, Losses, Objective};
use super::run::RunConfig;
use super::{CaptionVocab, Checkpoint};
use crate::backend::Backend;
use crate::data::vocab::PAD;
use crate::data::{Dataset, Split};
use crate::metrics::diversity::diversity;
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
#[derive(Clone)]
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
    pub step: usize,
    pub image_id: String,
    /// The greedy caption, scored token by token.
    pub caption: String,
    pub tokens: Vec<TokenScore>,
    /// Sampled captions (temperature 1).
    pub samples: Vec<String>,
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

/// Stochastic captions per image: in each sample record, and for the
/// per-epoch Div-1, Div-2 and mBLEU-4 (spec section 4: 5 per image).
const SAMPLES_PER_IMAGE: usize = 5;
/// Validation images whose samples give the per-epoch diversity figures
/// (the first of the evaluated images; sampling all of them would double
/// the evaluation time).
const DIVERSITY_IMAGES: usize = 100;

/// A captioner with fresh weights and a vocabulary from `data`'s training
/// captions, shaped by `config`.
pub fn fresh_checkpoint<B: Backend>(
    b: &B,
    data: &CaptionData,
    config: &RunConfig,
) -> Result<Checkpoint<B>> {
    let vocab = CaptionVocab::build(&data.data, config.train.min_count)?;
    let model_config = config.captioner(data.dim, vocab.len());
    Ok(Checkpoint {
        model: Captioner::new(b, model_config, config.train.batch, config.train.seed)?,
        vocab,
    })
}

/// A training run in progress: the optimizer, the objective's buffers and
/// the position in the run. [`train`] drives it to the end; the desktop
/// app steps it from its own thread and may change the objective and the
/// learning rate between steps.
pub struct Trainer<'d, B: Backend> {
    pub ck: &'d mut Checkpoint<B>,
    data: &'d CaptionData,
    retriever: Option<&'d mut RetrieverCheckpoint<B>>,
    config: RunConfig,
    run: RunFolder,
    opt: AdamW<B>,
    losses: Losses<B>,
    train_items: Vec<usize>,
    sample_items: Vec<usize>,
    eval_items: Vec<usize>,
    total: usize,
    step: usize,
    /// Epochs completed.
    epoch: usize,
    /// This epoch's image order and the batches of it done so far.
    order: Vec<usize>,
    batches_done: usize,
    /// Draws this epoch's order, then each batch's references.
    rng: ChaCha8Rng,
    since: Instant,
    tokens: usize,
}

impl<'d, B: Backend> Trainer<'d, B> {
    /// Prepares the run folder (or, with `resume`, restores the optimizer
    /// from it). The retriever, when given, adds its metrics to the
    /// per-epoch validation.
    pub fn new(
        b: &B,
        ck: &'d mut Checkpoint<B>,
        data: &'d CaptionData,
        config: &RunConfig,
        run: RunFolder,
        resume: bool,
        retriever: Option<&'d mut RetrieverCheckpoint<B>>,
    ) -> Result<Self> {
        let t = &config.train;
        let train_items = data.items(Split::Train);
        if train_items.len() < t.batch {
            bail!(
                "{}: {} training images, fewer than one batch of {}; lower [train] batch",
                data.data.name,
                train_items.len(),
                t.batch
            );
        }
        let total = train_items.len() / t.batch * t.epochs;
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
        let (step, epoch) = if resume {
            load_optimizer(b, &mut opt, &run.optimizer())?
        } else {
            for f in ["log.jsonl", "samples.jsonl", "metrics.jsonl"] {
                let _ = std::fs::remove_file(run.dir.join(f));
            }
            (0, 0)
        };
        // A resumed run may continue with another objective or more
        // epochs: the folder's config is always the one training now.
        tensorfile::write_atomic(&run.dir.join("config.toml"), config.to_toml().as_bytes())?;
        let val_items = data.items(Split::Val);
        let losses = Losses::new(
            b,
            config.objective(),
            ck.model.rows(),
            ck.model.config.vocab_size,
        );
        Ok(Trainer {
            ck,
            data,
            retriever,
            config: config.clone(),
            run,
            opt,
            losses,
            train_items,
            sample_items: val_items.iter().copied().take(t.sample_images).collect(),
            eval_items: val_items.iter().copied().take(t.eval_images).collect(),
            total,
            step,
            epoch,
            order: Vec::new(),
            batches_done: 0,
            rng: ChaCha8Rng::seed_from_u64(0),
            since: Instant::now(),
            tokens: 0,
        })
    }

    pub fn step(&self) -> usize {
        self.step
    }

    pub fn total_steps(&self) -> usize {
        self.total
    }

    pub fn finished(&self) -> bool {
        self.step >= self.total
    }

    pub fn run_folder(&self) -> &RunFolder {
        &self.run
    }

    /// Trains on with `objective` (and `lr` as the schedule's peak) from
    /// the next batch; the run folder's config.toml records the change,
    /// so `--resume` continues with it.
    pub fn set_objective(&mut self, b: &B, objective: Objective, lr: f32) -> Result<()> {
        let t = &mut self.config.train;
        (t.objective, t.first_token, t.mle_weight, t.lr) = (
            objective.kind,
            objective.first_token,
            objective.mle_weight,
            lr,
        );
        self.config = RunConfig::parse(&self.config.to_toml(), "the changed run config")?;
        self.losses = Losses::new(
            b,
            objective,
            self.ck.model.rows(),
            self.ck.model.config.vocab_size,
        );
        tensorfile::write_atomic(
            &self.run.dir.join("config.toml"),
            self.config.to_toml().as_bytes(),
        )
    }

    /// Trains one batch; at the end of an epoch also writes the
    /// checkpoint, the samples and the validation metrics.
    pub fn train_batch(
        &mut self,
        b: &B,
        mut on_event: impl FnMut(Event<'_>) -> Flow,
    ) -> Result<Flow> {
        let t = self.config.train.clone();
        let c = self.ck.model.config;
        let steps = c.token_positions();
        if self.batches_done == 0 {
            self.rng =
                ChaCha8Rng::seed_from_u64(t.seed ^ (self.epoch as u64).wrapping_mul(0x9e37_79b9));
            self.order = self.train_items.clone();
            self.order.shuffle(&mut self.rng);
        }
        let chunk = &self.order[self.batches_done * t.batch..(self.batches_done + 1) * t.batch];
        let sequences: Vec<Vec<u32>> = chunk
            .iter()
            .map(|&i| {
                let caps = &self.data.data.items[i].captions;
                self.ck.vocab.encode(
                    &caps[self.rng.random_range(0..caps.len())].tokens,
                    c.max_len,
                )
            })
            .collect();
        let features = self.data.features_of(chunk);
        let targets = targets_of(&sequences, steps);
        self.tokens += targets.iter().filter(|&&id| id != PAD).count();
        let objective = self.config.objective();
        let mut subset_rng = ChaCha8Rng::seed_from_u64(t.seed.wrapping_add(self.step as u64));
        let batch_targets = BatchTargets::new(
            b,
            &objective,
            &self.ck.vocab,
            &targets,
            steps,
            &mut subset_rng,
        )?;
        let inputs = TokenInputs::new(b, &c, &sequences)?;
        let model = &mut self.ck.model;
        model.forward(b, &features, &inputs);
        self.losses
            .forward_backward(b, &model.logits, &batch_targets);
        model.params.zero_grads(b);
        model.backward(b, &inputs, &self.losses.d_logits);
        self.opt.config.lr = warmup_cosine(t.lr, t.warmup, self.step, self.total);
        let mut values: Vec<&mut B::Tensor> = model.params.values.iter_mut().collect();
        let grads: Vec<&B::Tensor> = model.params.grads.iter().collect();
        self.opt.step(b, &mut values, &grads);
        self.step += 1;
        self.batches_done += 1;
        if self.step.is_multiple_of(t.log_every.max(1)) || self.step == self.total {
            let values = self.losses.read(b, &batch_targets);
            if !values.loss.is_finite() {
                bail!(
                    "the loss became {} at step {} (epoch {}); the last good checkpoint is {} \
                     (end of epoch {}); resume from it with `captune train --resume {}` after \
                     lowering lr in its config.toml",
                    values.loss,
                    self.step,
                    self.epoch + 1,
                    self.run.checkpoint().display(),
                    self.epoch,
                    self.run.dir.display()
                );
            }
            let line = LogLine {
                step: self.step,
                epoch: self.epoch + 1,
                objective: objective.describe(),
                losses: values,
                lr: self.opt.config.lr,
                grad_norm: self.opt.last_grad_norm(b),
                tokens_per_s: self.tokens as f64 / self.since.elapsed().as_secs_f64(),
            };
            (self.since, self.tokens) = (Instant::now(), 0);
            self.run.append("log.jsonl", &line)?;
            if on_event(Event::Log(&line)) == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        if self.batches_done == self.train_items.len() / t.batch {
            return self.end_epoch(b, on_event);
        }
        Ok(Flow::Continue)
    }

    fn end_epoch(&mut self, b: &B, mut on_event: impl FnMut(Event<'_>) -> Flow) -> Result<Flow> {
        self.epoch += 1;
        self.batches_done = 0;
        self.ck.save(b, &self.run.checkpoint(), HashMap::new())?;
        save_optimizer(b, &self.opt, &self.run.optimizer(), self.step, self.epoch)?;
        if self.write_samples(b, &mut on_event)? == Flow::Stop {
            return Ok(Flow::Stop);
        }
        if !self.eval_items.is_empty() {
            let mut metrics = evaluate_items(
                b,
                self.ck,
                self.data,
                &self.eval_items,
                &Decoding::Greedy,
                self.retriever.as_deref_mut(),
            )?;
            let diverse = &self.eval_items[..self.eval_items.len().min(DIVERSITY_IMAGES)];
            let sampled =
                caption_items(b, self.ck, self.data, diverse, &sampling(self.step), None)?;
            let sets: Vec<Vec<Vec<String>>> = sampled
                .iter()
                .map(|g| g.iter().map(|c| words(c)).collect())
                .collect();
            let d = diversity(&sets);
            (metrics.div1, metrics.div2, metrics.mbleu4) =
                (Some(d.div1), Some(d.div2), Some(d.mbleu4));
            let record = EpochMetrics {
                epoch: self.epoch,
                step: self.step,
                metrics,
            };
            self.run.append("metrics.jsonl", &record)?;
            if on_event(Event::Metrics(&record)) == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        (self.since, self.tokens) = (Instant::now(), 0);
        Ok(Flow::Continue)
    }

    /// Captions the fixed validation images now (greedy with per-token
    /// losses, and samples) into `samples.jsonl`.
    pub fn write_samples(
        &mut self,
        b: &B,
        mut on_event: impl FnMut(Event<'_>) -> Flow,
    ) -> Result<Flow> {
        // One pass samples every image; one batch-1 model decodes and scores the greedy captions.
        let sampled = caption_items(
            b,
            self.ck,
            self.data,
            &self.sample_items,
            &sampling(self.step),
            None,
        )?;
        let mut model = self.ck.with_batch(b, 1)?;
        for (&i, samples) in self.sample_items.iter().zip(sampled) {
            let features = self.data.features_of(&[i]);
            let generated = generate(b, &mut model, &features, &Decoding::Greedy, None)?;
            let ids: Vec<u32> = std::iter::once(crate::data::vocab::BOS)
                .chain(generated[0].ids.iter().copied())
                .collect();
            let sample = Sample {
                epoch: self.epoch,
                step: self.step,
                image_id: self.data.data.items[i].id.clone(),
                caption: generated[0].text(&self.ck.vocab),
                tokens: score_caption(b, &mut model, &self.ck.vocab, &features, &ids)?,
                samples,
            };
            self.run.append("samples.jsonl", &sample)?;
            if on_event(Event::Sample(&sample)) == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }

    /// Writes the model now (atomically) to `path`.
    pub fn save(&self, b: &B, path: &Path) -> Result<()> {
        self.ck.save(b, path, HashMap::new())
    }
}

/// The samples' decoding: temperature 1 over the full vocabulary, seeded
/// by the step so that a resumed run draws the same ones.
fn sampling(step: usize) -> Decoding {
    Decoding::Sample {
        n: SAMPLES_PER_IMAGE,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: step as u64,
    }
}

/// Trains `ck` on the training split to the end of the run, writing the
/// run folder, with a progress bar. `resume` continues from the folder's
/// optimizer state. The retriever, when given, adds its metrics to the
/// per-epoch validation.
#[allow(clippy::too_many_arguments)]
pub fn train<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    data: &CaptionData,
    config: &RunConfig,
    run: &RunFolder,
    resume: bool,
    retriever: Option<&mut RetrieverCheckpoint<B>>,
    mut on_event: impl FnMut(Event<'_>) -> Flow,
) -> Result<()> {
    let mut trainer = Trainer::new(b, ck, data, config, run.clone(), resume, retriever)?;
    let bar = indicatif::ProgressBar::new(trainer.total_steps() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps {elapsed_precise} (eta {eta}) {msg}",
        )
        .expect("a valid template"),
    );
    while !trainer.finished() {
        let flow = trainer.train_batch(b, |e| {
            if let Event::Log(l) = e {
                bar.set_message(format!(
                    "epoch {} loss {:.3} (mle {:.3} smile {:.3})",
                    l.epoch, l.losses.loss, l.losses.mle, l.losses.smile
                ));
            }
            bar.suspend(|| on_event(e))
        });
        bar.set_position(trainer.step() as u64);
        match flow {
            Ok(Flow::Continue) => {}
            Ok(Flow::Stop) => {
                bar.abandon();
                return Ok(());
            }
            Err(e) => {
                bar.abandon();
                return Err(e);
            }
        }
    }
    bar.finish();
    Ok(())
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
