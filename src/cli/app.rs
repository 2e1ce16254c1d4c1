//! `captune app`: the desktop app on a data set, training in the app,
//! following a run folder, or inspecting a checkpoint.

use super::DataArgs;
use super::captioner::{FeatureArgs, caption_data};
use anyhow::{Result, bail};
use captune::app::window::{self, WindowOptions};
use captune::app::{Source, Tab, TrainSetup};
use captune::captioner::run::RunConfig;
use captune::device::{self, DeviceChoice};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct AppArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub features: FeatureArgs,
    /// Follow a run folder written by `captune train` (on the same --data).
    #[arg(long, conflicts_with = "checkpoint")]
    pub follow: Option<PathBuf>,
    /// Open a captioner checkpoint for inspection only.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Training in the app: the preset the knobs start from (tiny, shapes, flickr8k).
    #[arg(long, default_value = "shapes", conflicts_with = "config")]
    pub preset: String,
    /// Training in the app: a run config (TOML) instead of a preset.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Training in the app: start from this captioner checkpoint.
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// Training in the app: the run folder it writes.
    #[arg(long, default_value = "runs/app")]
    pub out: PathBuf,
    /// Training in the app: start at once.
    #[arg(long)]
    pub start: bool,
    /// The panel shown first: losses, per-token, samples, metrics, inspector.
    #[arg(long, value_parser = parse_tab)]
    pub tab: Option<Tab>,
    /// Draw this many frames continuously, then close (with --screenshot and --stats, for scripts).
    #[arg(long)]
    pub frames: Option<usize>,
    /// Save the window's pixels (PNG) after --frames frames.
    #[arg(long, requires = "frames")]
    pub screenshot: Option<PathBuf>,
    /// Write frame times and peak memory (JSON) when the window closes.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// The window's size in points, e.g. 1280x800.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<[f32; 2]>,
}

fn parse_tab(name: &str) -> Result<Tab> {
    Tab::parse(name).ok_or_else(|| {
        anyhow::anyhow!(
            "no panel {name:?}; the panels are losses, per-token, samples, metrics, inspector"
        )
    })
}

fn parse_size(text: &str) -> Result<[f32; 2]> {
    match text
        .split_once('x')
        .map(|(w, h)| (w.parse::<f32>(), h.parse::<f32>()))
    {
        Some((Ok(w), Ok(h))) if w >= 200.0 && h >= 200.0 => Ok([w, h]),
        _ => bail!("--size {text:?}: expected WIDTHxHEIGHT, each at least 200, e.g. 1280x800"),
    }
}

pub fn run(device_choice: DeviceChoice, args: &AppArgs) -> Result<()> {
    // Embedding the images happens once, on the chosen device; the data
    // then lives on the host and is shared by the UI, trainer and scorer.
    let selection = device::select(device_choice)?;
    eprintln!("{selection}");
    let data = captune::with_backend!(&selection.backend, b => {
        caption_data(b, &args.data, &args.features).map(|(data, _)| data)
    })?;
    drop(selection);
    let source = if let Some(dir) = &args.follow {
        Source::Follow(dir.clone())
    } else if let Some(path) = &args.checkpoint {
        Source::Checkpoint(path.clone())
    } else {
        let config = match &args.config {
            Some(path) => RunConfig::load(path)?,
            None => RunConfig::preset(&args.preset)?,
        };
        Source::Train(TrainSetup {
            device: device_choice,
            config,
            out: args.out.clone(),
            init: args.init.clone(),
            retriever: args.features.retriever_path(&args.data),
            autostart: args.start,
        })
    };
    window::run(
        Arc::new(data),
        source,
        WindowOptions {
            tab: args.tab,
            screenshot: args.screenshot.clone(),
            frames: args.frames,
            stats: args.stats.clone(),
            size: args.size,
        },
    )
}
