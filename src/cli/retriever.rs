//! `captune retriever`: train the CLIP-like retriever, evaluate its recall.

use super::{RetrieverShape, check_new_output};
use anyhow::Result;
use captune::backend::Backend;
use captune::data::Split;
use captune::retriever::Checkpoint;
use captune::retriever::train::{Prepared, TrainOptions};
use captune::source::DataArgs;
use clap::Subcommand;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum RetrieverCommand {
    /// Train a retriever from scratch (or from --init) and write a checkpoint after every epoch.
    Train {
        #[command(flatten)]
        data: DataArgs,
        /// Checkpoint to write (safetensors, config and vocabulary in its metadata).
        #[arg(long, default_value = "retriever.safetensors")]
        out: PathBuf,
        /// Start from this checkpoint's weights, config and vocabulary.
        #[arg(long)]
        init: Option<PathBuf>,
        /// Replace --out if it exists (not needed when --out is --init).
        #[arg(long)]
        overwrite: bool,
        #[arg(long, default_value_t = 10)]
        epochs: usize,
        #[arg(long, default_value_t = 128)]
        batch: usize,
        #[arg(long, default_value_t = 1e-3)]
        lr: f32,
        #[arg(long, default_value_t = 0.1)]
        weight_decay: f32,
        #[arg(long, default_value_t = 200)]
        warmup: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        shape: RetrieverShape,
        /// Skip the validation recall after each epoch.
        #[arg(long)]
        no_eval: bool,
    },
    /// Image-to-text and text-to-image recall at 1, 5 and 10 on a split.
    Eval {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        checkpoint: PathBuf,
        #[arg(long, value_enum, default_value = "val")]
        split: Split,
        #[arg(long, default_value_t = 128)]
        batch: usize,
        /// Print a JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn run<B: Backend>(b: &B, what: RetrieverCommand) -> Result<()> {
    match what {
        RetrieverCommand::Train {
            data,
            out,
            init,
            overwrite,
            epochs,
            batch,
            lr,
            weight_decay,
            warmup,
            seed,
            shape,
            no_eval,
        } => {
            if init.as_ref() != Some(&out) {
                check_new_output(&out, overwrite, "--out")?;
            }
            let dataset = data.load()?;
            let mut ck = match &init {
                Some(path) => Checkpoint::load(b, path, batch)?,
                None => shape.new_retriever(b, &dataset, batch, seed)?,
            };
            let prep = Prepared::new(dataset, ck.model.config.image_size)?;
            eprintln!(
                "{}: {} images ({} train), vocabulary {} words, {} parameters",
                prep.data.name,
                prep.data.items.len(),
                prep.items(Split::Train).len(),
                ck.vocab.len(),
                ck.model.params.count()
            );
            let options = TrainOptions {
                epochs,
                lr,
                weight_decay,
                warmup,
                seed,
                checkpoint: out.clone(),
                eval_each_epoch: !no_eval,
                log_every: 10,
            };
            let metadata = HashMap::from([
                ("dataset".to_string(), prep.data.name.clone()),
                (
                    "train_options".to_string(),
                    serde_json::to_string(&options)?,
                ),
            ]);
            captune::retriever::train::train(b, &mut ck, &prep, &options, &metadata, |r| {
                let val = r.val.map(|v| format!(" | val {v}")).unwrap_or_default();
                eprintln!(
                    "epoch {} loss {:.3} in-batch acc {:.2} {:.1}s{val}",
                    r.epoch, r.mean_loss, r.mean_in_batch_accuracy, r.seconds
                );
            })?;
            eprintln!("checkpoint: {}", out.display());
            Ok(())
        }
        RetrieverCommand::Eval {
            data,
            checkpoint,
            split,
            batch,
            json,
        } => {
            let mut ck = Checkpoint::load(b, &checkpoint, batch)?;
            let prep = Prepared::new(data.load()?, ck.model.config.image_size)?;
            let recall = prep.evaluate(b, &mut ck, split)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&recall)?);
            } else {
                println!("{} {}: {recall}", prep.data.name, split.name());
            }
            Ok(())
        }
    }
}
