use anyhow::{Context, Result, bail};
use captune::backend::Backend;
use captune::bench;
use captune::captioner::bench::{Workload, train_throughput};
use captune::captioner::objectives::token::{ObjectiveKind, TokenObjective};
use captune::data::Split;
use captune::data::shapes::{self, ShapesConfig};
use captune::device::{self, DeviceChoice};
use captune::gpu::adapter::{self, AdapterReport};
use captune::retriever::Checkpoint;
use captune::retriever::train::{Prepared, TrainOptions};
use clap::{Parser, Subcommand};
use cli::DataArgs;

mod cli;
use std::collections::HashMap;
use std::path::PathBuf;

/// Train and inspect image-caption decoders on WGSL compute shaders (wgpu) or the CPU.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// What runs the ops: auto (a hardware GPU if there is one, else the CPU),
    /// gpu (any GPU adapter, software ones included) or cpu. `bench` takes a
    /// comma-separated list, e.g. cpu,gpu.
    #[arg(
        long,
        global = true,
        env = "CAPTUNE_DEVICE",
        value_delimiter = ',',
        default_value = "auto"
    )]
    device: Vec<DeviceChoice>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the chosen backend and every GPU adapter with the limits and features that matter here.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Data sets: write the shapes world for a person to look at.
    Data {
        #[command(subcommand)]
        what: DataCommand,
    },
    /// The CLIP-like retriever: train it, evaluate its recall.
    Retriever {
        #[command(subcommand)]
        what: RetrieverCommand,
    },
    /// Write a data set's image embeddings (a features file) with a trained retriever.
    Embed {
        #[command(flatten)]
        data: DataArgs,
        /// The retriever checkpoint.
        #[arg(long)]
        checkpoint: PathBuf,
        /// Output features file (safetensors).
        #[arg(long)]
        out: PathBuf,
        /// Replace --out if it exists.
        #[arg(long)]
        overwrite: bool,
    },
    /// Train a captioner (MLE, SMILE and its ablations) into a run folder.
    Train(Box<cli::captioner::TrainArgs>),
    /// Caption a split and compute every metric; writes COCO-format results.
    Eval(Box<cli::captioner::EvalArgs>),
    /// Score any COCO-format results file against a split's references (pycocoevalcap's BLEU, CIDEr-D, ROUGE-L).
    Score(cli::captioner::ScoreArgs),
    /// Caption image files.
    Caption(cli::captioner::CaptionArgs),
    /// Per token: MLE and SMILE loss, the label's probability over the vocabulary and the subset, top-5 of each.
    Inspect(Box<cli::captioner::InspectArgs>),
    /// The shapes world end to end: retriever, MLE, then SMILE, and a table comparing them.
    Demo(cli::demo::DemoArgs),
    /// The desktop app: train and watch live, follow a run folder, or inspect a checkpoint per token.
    App(Box<cli::app::AppArgs>),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum DataCommand {
    /// Generate the shapes world into DIR (PNG images and dataset_shapes.json) and print its caption mix.
    Shapes {
        #[arg(long)]
        out: PathBuf,
        /// Replace --out if it exists.
        #[arg(long)]
        overwrite: bool,
        #[command(flatten)]
        config: ShapesConfig,
    },
}

#[derive(Subcommand)]
enum RetrieverCommand {
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
        shape: cli::RetrieverShape,
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

#[derive(Subcommand)]
enum BenchCommand {
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
    /// Captioner training throughput (tokens/s) of a preset on each backend asked for.
    Train {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "shapes")]
        preset: String,
        /// Objectives to time.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "mle,smile")]
        objectives: Vec<ObjectiveKind>,
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
    /// Caption decoding throughput (captions/s, tokens/s) of a preset's
    /// network on random image embeddings, with the GPU's counts per decoded batch.
    Decode {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "shapes")]
        preset: String,
        /// A trained captioner (default: fresh weights, whose captions run to the maximum length).
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// greedy, beam:W, sample:N...
        #[arg(long, default_value = "greedy", value_parser = captune::captioner::decode::Decoding::parse)]
        decode: captune::captioner::decode::Decoding,
        #[arg(long, default_value_t = 500)]
        images: usize,
    },
}

/// Runs `$body` with `$b` bound to the backend `--device` selects.
macro_rules! on_device {
    ($devices:expr, $b:ident => $body:expr) => {{
        let selection = device::select(single_device($devices)?)?;
        eprintln!("{selection}");
        captune::with_backend!(&selection.backend, $b => $body)
    }};
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn single_device(devices: &[DeviceChoice]) -> Result<DeviceChoice> {
    match devices {
        [one] => Ok(*one),
        _ => bail!(
            "--device takes one of auto, gpu, cpu for this command (got {} values)",
            devices.len()
        ),
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Info { json } => info(single_device(&cli.device)?, json),
        Command::Data {
            what:
                DataCommand::Shapes {
                    out,
                    overwrite,
                    config,
                },
        } => {
            cli::check_new_output(&out, overwrite, "--out")?;
            data_shapes(&out, &config)
        }
        Command::Retriever { what } => {
            let selection = device::select(single_device(&cli.device)?)?;
            eprintln!("{selection}");
            captune::with_backend!(&selection.backend, b => retriever(b, what))
        }
        Command::Embed {
            data,
            checkpoint,
            out,
            overwrite,
        } => {
            cli::check_new_output(&out, overwrite, "--out")?;
            let selection = device::select(single_device(&cli.device)?)?;
            eprintln!("{selection}");
            captune::with_backend!(&selection.backend, b => embed(b, &data, &checkpoint, &out))
        }
        Command::Train(args) => {
            on_device!(&cli.device, b => cli::captioner::train(b, &args, None).map(|_| ()))
        }
        Command::Eval(args) => on_device!(&cli.device, b => cli::captioner::eval(b, &args)),
        Command::Score(args) => cli::captioner::score(&args),
        Command::Caption(args) => on_device!(&cli.device, b => cli::captioner::caption(b, &args)),
        Command::Inspect(args) => on_device!(&cli.device, b => cli::captioner::inspect(b, &args)),
        Command::Demo(args) => on_device!(&cli.device, b => cli::demo::demo(b, &args)),
        Command::App(args) => cli::app::run(single_device(&cli.device)?, &args),
        Command::Bench {
            what:
                BenchCommand::Kernels {
                    json,
                    sizes,
                    elementwise_len,
                },
        } => bench_each(&cli.device, json, |selection, emit| {
            captune::with_backend!(&selection.backend, b => {
                bench::kernels(b, &sizes, elementwise_len, |r| emit(r.clone()))
            });
            Ok(())
        }),
        Command::Bench {
            what:
                BenchCommand::Decode {
                    json,
                    preset,
                    checkpoint,
                    decode,
                    images,
                },
        } => bench_each(&cli.device, json, |selection, emit| {
            emit(captune::with_backend!(&selection.backend, b => {
                captune::captioner::bench::decode_throughput(b, &preset, checkpoint.as_deref(), &decode, images)
            })?);
            Ok(())
        }),
        Command::Bench {
            what:
                BenchCommand::Train {
                    json,
                    preset,
                    objectives,
                    captions,
                    steps,
                    warmup,
                },
        } => bench_each(&cli.device, json, |selection, emit| {
            for &kind in &objectives {
                let objective = TokenObjective {
                    kind,
                    ..TokenObjective::mle()
                };
                for &workload in &captions {
                    emit(captune::with_backend!(&selection.backend, b => {
                        train_throughput(b, &preset, objective, workload, warmup, steps)
                    })?);
                }
            }
            Ok(())
        }),
    }
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

fn info(choice: DeviceChoice, json: bool) -> Result<()> {
    let selection = device::select(choice)?;
    let reports: Vec<AdapterReport> = adapter::adapters(adapter::backends_from_env()?)
        .iter()
        .map(AdapterReport::new)
        .collect();
    let (kind, name) =
        captune::with_backend!(&selection.backend, b => (b.kind(), b.adapter_name()));
    if json {
        let value = serde_json::json!({
            "backend": kind,
            "device": name,
            "reason": selection.reason,
            "cpu_threads": rayon::current_num_threads(),
            "adapters": reports,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("captune {}", env!("CARGO_PKG_VERSION"));
    println!("{selection}");
    println!(
        "CPU: {} ({} threads)",
        captune::cpu::cpu_model_name(),
        rayon::current_num_threads()
    );
    if reports.is_empty() {
        println!(
            "GPU adapters: none (install a Vulkan driver, e.g. mesa-vulkan-drivers, for the GPU backend)"
        );
    }
    for (i, r) in reports.iter().enumerate() {
        println!("GPU adapter {i}:\n{r}");
    }
    Ok(())
}

fn data_shapes(out: &std::path::Path, config: &ShapesConfig) -> Result<()> {
    shapes::write(config, out)?;
    let val: Vec<_> = (0..config.val)
        .map(|i| shapes::generate(config.seed, Split::Val, i))
        .collect();
    let stats = shapes::stats::split_stats(&val);
    println!(
        "wrote {} images to {} ({} train, {} val, {} test); caption mix of the val split:",
        config.train + config.val + config.test,
        out.display(),
        config.train,
        config.val,
        config.test
    );
    println!("{}", serde_json::to_string_pretty(&stats)?);
    Ok(())
}

fn retriever<B: Backend>(b: &B, what: RetrieverCommand) -> Result<()> {
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
                cli::check_new_output(&out, overwrite, "--out")?;
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

fn embed<B: Backend>(
    b: &B,
    data: &DataArgs,
    checkpoint: &std::path::Path,
    out: &std::path::Path,
) -> Result<()> {
    let mut ck = Checkpoint::load(b, checkpoint, 128)?;
    let prep = Prepared::new(data.load()?, ck.model.config.image_size)?;
    let all: Vec<usize> = (0..prep.data.items.len()).collect();
    let bar = captune::progress::Progress::terminal()
        .start(&format!("embedding {} images", all.len()), all.len() as u64);
    let embeddings =
        captune::retriever::eval::embed_images(b, &mut ck.model, &prep.images, &all, &bar)?;
    bar.finish_and_clear();
    let bytes = std::fs::read(checkpoint)
        .with_context(|| format!("cannot read {}", checkpoint.display()))?;
    let features = captune::data::features::Features {
        source: out.to_path_buf(),
        ids: prep.data.items.iter().map(|i| i.id.clone()).collect(),
        dim: ck.model.config.embed_dim,
        embeddings,
        encoder: Some(captune::data::features::retriever_encoder_id(&bytes)),
    };
    let metadata = HashMap::from([
        (
            "encoder".to_string(),
            format!("captune retriever {}", checkpoint.display()),
        ),
        ("dataset".to_string(), prep.data.name.clone()),
    ]);
    features.save(out, metadata)?;
    println!(
        "wrote {} embeddings of {} dimensions to {}",
        features.ids.len(),
        features.dim,
        out.display()
    );
    Ok(())
}
