//! Training the retriever: shuffled batches of (image, one of its
//! captions), AdamW with warm-up and cosine decay, the temperature clamped
//! after every step as CLIP does, a checkpoint after every epoch.

use super::eval::{self, Recall};
use super::{Checkpoint, patchify};
use crate::backend::Backend;
use crate::data::images::{self, Images};
use crate::data::vocab::Vocab;
use crate::data::{Caption, Dataset, Split};
use crate::model::retriever::TextBatch;
use crate::optim::{AdamW, AdamWConfig, warmup_cosine};
use crate::progress::Progress;
use anyhow::{Result, bail};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

/// A data set with its images decoded at the model's resolution.
pub struct Prepared {
    pub data: Dataset,
    pub images: Images,
}

impl Prepared {
    /// Decodes `data`'s images, with a progress bar on the terminal.
    pub fn new(mut data: Dataset, image_size: u32) -> Result<Self> {
        let bar = Progress::terminal().start(
            &format!("loading {} images", data.items.len()),
            data.items.len() as u64,
        );
        let images = images::load(&mut data, image_size, &bar)?;
        bar.finish_and_clear();
        Ok(Prepared { data, images })
    }

    /// Item indices of one split.
    pub fn items(&self, split: Split) -> Vec<usize> {
        (0..self.data.items.len())
            .filter(|&i| self.data.items[i].split == split)
            .collect()
    }

    /// The recall of `model` on one split: every image against every caption.
    pub fn evaluate<B: Backend>(
        &self,
        b: &B,
        ck: &mut Checkpoint<B>,
        split: Split,
    ) -> Result<Recall> {
        let items = self.items(split);
        if items.is_empty() {
            bail!("{}: the {} split is empty", self.data.name, split.name());
        }
        let mut captions: Vec<&Caption> = Vec::new();
        let mut caption_image = Vec::new();
        for (row, &i) in items.iter().enumerate() {
            for c in &self.data.items[i].captions {
                captions.push(c);
                caption_image.push(row);
            }
        }
        let img = eval::embed_images(
            b,
            &mut ck.model,
            &self.images,
            &items,
            &indicatif::ProgressBar::hidden(),
        )?;
        let txt = eval::embed_captions(b, &mut ck.model, &ck.vocab, &captions)?;
        Ok(eval::recall(
            &img,
            &txt,
            ck.model.config.embed_dim,
            &caption_image,
        ))
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TrainOptions {
    pub epochs: usize,
    pub lr: f32,
    pub weight_decay: f32,
    /// Steps of linear warm-up before the cosine decay.
    pub warmup: usize,
    pub seed: u64,
    pub checkpoint: PathBuf,
    /// Evaluate on the validation split after each epoch.
    pub eval_each_epoch: bool,
    /// Read the loss back every this many steps (reading waits for the GPU).
    pub log_every: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct EpochRecord {
    pub epoch: usize,
    pub steps: usize,
    pub mean_loss: f32,
    /// Mean over the steps whose loss was read.
    pub mean_in_batch_accuracy: f32,
    pub seconds: f64,
    pub val: Option<Recall>,
}

/// Trains `ck.model` on the training split; `on_epoch` sees each epoch's record.
pub fn train<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    prep: &Prepared,
    o: &TrainOptions,
    metadata: &HashMap<String, String>,
    mut on_epoch: impl FnMut(&EpochRecord),
) -> Result<Vec<EpochRecord>> {
    let batch = ck.model.batch;
    let config = ck.model.config;
    let train_items = prep.items(Split::Train);
    if train_items.len() < batch {
        bail!(
            "{}: {} training images, fewer than one batch of {batch}; lower --batch",
            prep.data.name,
            train_items.len()
        );
    }
    let steps_per_epoch = train_items.len() / batch;
    let total = steps_per_epoch * o.epochs;
    let mut opt = AdamW::new(
        b,
        AdamWConfig {
            lr: o.lr,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-6,
            weight_decay: o.weight_decay,
            max_grad_norm: Some(1.0),
        },
        &ck.model.params.optimizer_layout(),
    );
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    let mut records = Vec::new();
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps {elapsed_precise} (eta {eta}) {msg}",
        )
        .expect("a valid template"),
    );
    let mut step = 0;
    for epoch in 0..o.epochs {
        let start = Instant::now();
        let mut order = train_items.clone();
        order.shuffle(&mut rng);
        let (mut loss_sum, mut accuracy_sum, mut losses) = (0.0f32, 0.0f32, 0usize);
        for chunk in order.chunks_exact(batch) {
            let ids: Vec<Vec<u32>> = chunk
                .iter()
                .map(|&i| {
                    let caps = &prep.data.items[i].captions;
                    ck.vocab.encode(
                        &caps[rng.random_range(0..caps.len())].tokens,
                        config.max_len,
                    )
                })
                .collect();
            let texts = TextBatch::new(b, &config, &ids)?;
            let patches = patchify(&config, &prep.images, chunk);
            ck.model.forward_backward(b, &patches, &texts)?;
            opt.config.lr = warmup_cosine(o.lr, o.warmup, step, total);
            let params = &mut ck.model.params;
            let mut values: Vec<&mut B::Tensor> = params.values.iter_mut().collect();
            let grads: Vec<&B::Tensor> = params.grads.iter().collect();
            opt.step(b, &mut values, &grads);
            let log_scale = ck.model.log_scale;
            b.clamp(
                ck.model.params.value_mut(log_scale),
                0.0,
                crate::model::retriever::MAX_LOG_SCALE,
            );
            step += 1;
            if step % o.log_every.max(1) == 0 || step == total {
                let loss = ck.model.loss.read_loss(b);
                if !loss.is_finite() {
                    bar.abandon();
                    bail!(
                        "the loss became {loss} at step {step} (epoch {}); the last good checkpoint is {} \
                         (from the end of epoch {epoch}); lower --lr and start again from it with --init",
                        epoch + 1,
                        o.checkpoint.display()
                    );
                }
                let accuracy = ck.model.loss.in_batch_accuracy(b);
                loss_sum += loss;
                accuracy_sum += accuracy;
                losses += 1;
                bar.set_message(format!(
                    "epoch {} loss {loss:.3} in-batch acc {accuracy:.2}",
                    epoch + 1
                ));
            }
            bar.inc(1);
        }
        ck.save(b, &o.checkpoint, metadata.clone())?;
        let seconds = start.elapsed().as_secs_f64();
        let val = if o.eval_each_epoch {
            Some(prep.evaluate(b, ck, Split::Val)?)
        } else {
            None
        };
        let record = EpochRecord {
            epoch: epoch + 1,
            steps: steps_per_epoch,
            mean_loss: loss_sum / losses.max(1) as f32,
            mean_in_batch_accuracy: accuracy_sum / losses.max(1) as f32,
            seconds,
            val,
        };
        bar.suspend(|| on_epoch(&record));
        records.push(record);
    }
    bar.finish();
    Ok(records)
}

/// The vocabulary a new retriever uses for `data`.
pub fn vocab_for(data: &Dataset, min_count: usize) -> Result<Vocab> {
    let vocab = Vocab::build(data, min_count);
    if vocab.words().is_empty() {
        bail!(
            "{}: no word occurs {min_count} times in the training captions; lower --min-count",
            data.name
        );
    }
    Ok(vocab)
}
