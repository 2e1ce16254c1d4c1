//! `captune bench`: kernels, training and decoding throughput on each
//! backend asked for.

use anyhow::Result;
use captune::bench;
use captune::captioner::bench::{Workload, decode_throughput, scst_throughput, train_throughput};
use captune::device::{self, DeviceChoice};
use clap::Subcommand;
use std::path::PathBuf;

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
    /// Captioner training throughput (tokens/s) of a preset on each backend asked for.
    Train {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "shapes")]
        preset: String,
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
    /// CIDEr-D rewards, update) of a preset's network, and the step's
    /// split; scripts/bench_torch_scst.py is the PyTorch reference.
    Scst {
        /// Print a JSON array of records instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "shapes")]
        preset: String,
        #[arg(long, default_value_t = 10)]
        steps: usize,
        #[arg(long, default_value_t = 2)]
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
        BenchCommand::Decode {
            json,
            preset,
            checkpoint,
            decode,
            images,
        } => bench_each(devices, json, |selection, emit| {
            emit(captune::with_backend!(&selection.backend, b => {
                decode_throughput(b, &preset, checkpoint.as_deref(), &decode, images)
            })?);
            Ok(())
        }),
        BenchCommand::Scst {
            json,
            preset,
            steps,
            warmup,
        } => bench_each(devices, json, |selection, emit| {
            emit(captune::with_backend!(&selection.backend, b => {
                scst_throughput(b, &preset, warmup, steps)
            })?);
            Ok(())
        }),
        BenchCommand::Train {
            json,
            preset,
            objectives,
            captions,
            steps,
            warmup,
        } => bench_each(devices, json, |selection, emit| {
            for objective in &objectives {
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
