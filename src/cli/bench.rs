//! `captune bench`: kernels, training and decoding throughput on each
//! backend asked for.

use anyhow::Result;
use captune::backend::Backend;
use captune::bench;
use captune::captioner::bench::{
    BenchModel, ScstWorkload, VOCAB, Workload, decode_throughput, scst_throughput, train_throughput,
};
use captune::device::{self, AnyBackend, DeviceChoice};
use captune::retriever::bench::embed_throughput;
use captune::source::DataArgs;
use captune::source::embeddings::{self, FeatureArgs, TrainedOn};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};

/// The network a captioner benchmark times.
#[derive(Args)]
pub struct ModelArgs {
    /// A preset's network and batch.
    #[arg(long, default_value = "shapes", conflicts_with = "config")]
    preset: String,
    /// A run config file (TOML, as assets/presets/*.toml) instead of a
    /// preset, e.g. scripts/bench/gpt2-small.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Ids of the synthetic vocabulary (GPT-2's: 50257).
    #[arg(long, default_value_t = VOCAB)]
    vocab: usize,
    /// Images per step of `train` and `scst`, instead of the config's
    /// batch (`decode` takes 64 images at once, as `eval` does).
    #[arg(long)]
    batch: Option<usize>,
    /// Also profile one more step (or decoded batch) kernel by kernel, on
    /// a GPU with timestamp queries: each kernel's device time and
    /// dispatches, and the costliest kernel-and-grid groups.
    #[arg(long)]
    profile: bool,
}

impl ModelArgs {
    fn bench_model(&self) -> Result<BenchModel> {
        let mut bench =
            BenchModel::new(&self.preset, self.config.as_deref(), self.vocab, self.batch)?;
        bench.profile = self.profile;
        Ok(bench)
    }
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Matmul GFLOP/s (square sizes) and elementwise GB/s on each backend asked for.
    Kernels {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        /// Square matmul sizes.
        #[arg(long, value_delimiter = ',', default_value = "256,512,1024,2048")]
        sizes: Vec<usize>,
        /// Elements of the elementwise benchmark (0 skips it).
        #[arg(long, default_value_t = 1 << 24)]
        elementwise_len: usize,
    },
    /// Every matmul kernel on every product of a training and a decoding
    /// step, each checked against the CPU backend and timed (GPU only).
    Matmuls {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        /// Whose products: a GPT-2-small ClipCap's, or tiny ones.
        #[arg(long, value_enum, default_value = "gpt2-small")]
        sizes: bench::ProductSizes,
    },
    /// Captioner training throughput (tokens/s) and peak memory of a
    /// network on each backend asked for.
    Train {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        model: ModelArgs,
        /// Objectives to time (default settings), any that train on
        /// captions alone.
        #[arg(long, value_delimiter = ',', default_value = "mle,smile")]
        objectives: Vec<String>,
        /// Captions to train on: synthetic (full length, no padding: the
        /// PyTorch script's workload, in positions/s) and shapes (real
        /// shapes-world captions, trimmed batches: real tokens/s).
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "synthetic,shapes"
        )]
        captions: Vec<Workload>,
        #[arg(long, default_value_t = 20)]
        steps: usize,
        #[arg(long, default_value_t = 3)]
        warmup: usize,
    },
    /// SCST steps per second (5 samples and the greedy caption per image,
    /// CIDEr-D rewards, update) of a network, and the step's split;
    /// scripts/bench_torch_scst.py is the PyTorch reference.
    Scst {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        model: ModelArgs,
        /// A trained captioner (default: the preset's network with fresh
        /// weights, whose samples run to the maximum length), stepped on
        /// its data's training images in order, rewarded against their
        /// references. Its own network, not a preset's: --batch sets the
        /// images per step.
        #[arg(long, conflicts_with_all = ["preset", "config", "vocab"])]
        checkpoint: Option<PathBuf>,
        /// The checkpoint's data (default: the data it was trained on).
        #[arg(long, requires = "checkpoint")]
        data: Option<captune::source::DataSource>,
        /// Its image embeddings (default: the features it was trained on).
        #[arg(long, requires = "checkpoint")]
        features: Option<PathBuf>,
        #[arg(long, default_value_t = 10)]
        steps: usize,
        #[arg(long, default_value_t = 2)]
        warmup: usize,
    },
    /// Image embedding throughput (images/s) of a Hugging Face CLIP's
    /// image tower on random preprocessed images;
    /// scripts/bench_torch_clip_embed.py is the PyTorch reference.
    Embed {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        /// A Hugging Face CLIP folder (`python3
        /// scripts/bench_torch_clip_embed.py --random-clip DIR` writes one
        /// of ViT-B/32's shape).
        #[arg(long, value_name = "FOLDER")]
        clip: PathBuf,
        /// Images to embed (rounded up to whole batches).
        #[arg(long, default_value_t = 64)]
        images: usize,
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
        batch: u32,
    },
    /// Caption decoding throughput (captions/s, tokens/s) of a network
    /// on random image embeddings, with the GPU's counts per decoded batch.
    Decode {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        model: ModelArgs,
        /// A trained captioner (default: the preset's network with fresh
        /// weights, whose captions run to the maximum length).
        #[arg(long, conflicts_with_all = ["preset", "config", "vocab"])]
        checkpoint: Option<PathBuf>,
        /// Image embeddings to decode: the first --images rows of this
        /// features file (the checkpoint's own, for the captions it
        /// writes) instead of random ones.
        #[arg(long, requires = "checkpoint")]
        features: Option<PathBuf>,
        /// greedy, beam:W, sample:N...
        #[arg(long, default_value = "greedy", value_parser = captune::captioner::decode::Decoding::parse)]
        decode: captune::captioner::decode::Decoding,
        #[arg(long, default_value_t = 500)]
        images: usize,
    },
}

pub fn run(devices: &[DeviceChoice], what: BenchCommand) -> Result<()> {
    match what {
        BenchCommand::Kernels {
            json,
            sizes,
            elementwise_len,
        } => bench_each(devices, json, |selection, emit| {
            captune::with_backend!(&selection.backend, b => {
                bench::kernels(b, &sizes, elementwise_len, |r| emit(r.clone()))
            });
            Ok(())
        }),
        BenchCommand::Matmuls { json, sizes } => bench_each(devices, json, |selection, emit| {
            match &selection.backend {
                AnyBackend::Gpu(gpu) => bench::matmul_variants(gpu, sizes, |r| emit(r.clone())),
                AnyBackend::Cpu(_) => anyhow::bail!(
                    "bench matmuls compares the GPU's matmul kernels; {}. Use --device gpu",
                    selection.reason
                ),
            }
            Ok(())
        }),
        BenchCommand::Decode {
            json,
            model,
            checkpoint,
            features,
            decode,
            images,
        } => {
            if model.batch.is_some() {
                anyhow::bail!(
                    "bench decode takes 64 images at once, as eval does; --batch is for \
                     bench train and bench scst"
                );
            }
            let bench = model.bench_model()?;
            bench_each(devices, json, |selection, emit| {
                emit(captune::with_backend!(&selection.backend, b => {
                    decode_throughput(
                        b,
                        &bench,
                        checkpoint.as_deref(),
                        features.as_deref(),
                        &decode,
                        images,
                    )
                })?);
                Ok(())
            })
        }
        BenchCommand::Embed {
            json,
            clip,
            images,
            batch,
        } => bench_each(devices, json, |selection, emit| {
            emit(captune::with_backend!(&selection.backend, b => {
                let mut model = captune::model::clip::read(&clip)?.into_retriever(b, batch as usize)?;
                embed_throughput(b, &mut model, &clip.display().to_string(), images)
            })?);
            Ok(())
        }),
        BenchCommand::Scst {
            json,
            model,
            checkpoint,
            data,
            features,
            steps,
            warmup,
        } => {
            let bench = model.bench_model()?;
            let data = DataArgs {
                data,
                images: None,
                shapes: Default::default(),
            };
            let features = FeatureArgs {
                features,
                features_ids: None,
                retriever: None,
            };
            bench_each(devices, json, |selection, emit| {
                emit(captune::with_backend!(&selection.backend, b => {
                    let work = match &checkpoint {
                        Some(path) => trained_scst(b, path, &data, &features)?,
                        None => ScstWorkload::synthetic(b, &bench)?,
                    };
                    scst_throughput(b, &bench, work, warmup, steps)
                })?);
                Ok(())
            })
        }
        BenchCommand::Train {
            json,
            model,
            objectives,
            captions,
            steps,
            warmup,
        } => {
            let bench = model.bench_model()?;
            if model.vocab != VOCAB && captions.contains(&Workload::Shapes) {
                anyhow::bail!(
                    "--vocab sets the synthetic vocabulary; the shapes workload has the shapes \
                     world's words. Add --captions synthetic"
                );
            }
            bench_each(devices, json, |selection, emit| {
                for objective in &objectives {
                    for &workload in &captions {
                        emit(captune::with_backend!(&selection.backend, b => {
                            train_throughput(b, &bench, objective, workload, warmup, steps)
                        })?);
                    }
                }
                Ok(())
            })
        }
    }
}

/// `bench scst --checkpoint`'s workload: the captioner on its data's
/// training images, with the features it was trained on unless others
/// are given.
fn trained_scst<B: Backend>(
    b: &B,
    path: &Path,
    data: &DataArgs,
    features: &FeatureArgs,
) -> Result<ScstWorkload<B>> {
    let start = super::captioner::Captioner::load(b, path)?;
    let trained_on = TrainedOn::of(path, &start.trained_on);
    let progress = captune::progress::Progress::terminal();
    let (loaded, _) = embeddings::load(b, data, features, trained_on, &progress)?;
    start.check_dim(path, &loaded)?;
    ScstWorkload::trained(path.display().to_string(), start.ck, &loaded)
}

/// Runs a benchmark on each device asked for, printing records as they
/// come, or one JSON array at the end.
fn bench_each<R: serde::Serialize + std::fmt::Display>(
    devices: &[DeviceChoice],
    json: bool,
    mut run: impl FnMut(&device::Selection, &mut dyn FnMut(R)) -> Result<()>,
) -> Result<()> {
    let mut records = Vec::new();
    for &choice in devices {
        let selection = device::select(choice)?;
        if !json {
            println!("{selection}");
        }
        run(&selection, &mut |r| {
            if !json {
                println!("{r}");
            }
            records.push(r);
        })?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&records)?);
    }
    Ok(())
}
