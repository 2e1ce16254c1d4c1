//! `captune app`: the desktop app on a data set, training in the app,
//! following a run folder, or inspecting a checkpoint.

use super::check_new_output;
use anyhow::{Result, bail};
use captune::app::window::{self, WindowOptions};
use captune::app::{Source, Tab, TrainSetup};
use captune::captioner::run::RunConfig;
use captune::captioner::run_folder::RunFolder;
use captune::device::{self, DeviceChoice};
use captune::source::DataArgs;
use captune::source::embeddings::FeatureSource;
use captune::source::embeddings::{self, FeatureArgs, TrainedOn};
use std::path::{Path, PathBuf};

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
    /// Training in the app: the preset the knobs start from (tiny, shapes, flickr8k, shapes-lstm, flickr8k-lstm).
    #[arg(long, default_value = "shapes", conflicts_with = "config")]
    pub preset: String,
    /// Training in the app: a run config (TOML) instead of a preset.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Training in the app: start from this captioner checkpoint.
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// Training in the app: the run folder it writes (default: runs/app, or
    /// runs/app-2... when taken). A folder holding a run is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
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
    /// Replace the --screenshot and --stats files if they exist.
    #[arg(long)]
    pub overwrite: bool,
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

/// What a followed run or an opened checkpoint was trained on, and where
/// that is recorded.
fn recorded(args: &AppArgs) -> Result<Option<(PathBuf, FeatureSource)>> {
    let (record, source) = if let Some(dir) = &args.follow {
        let config = RunFolder::new(dir).config();
        let source = RunConfig::load(&config).ok().and_then(|c| c.features);
        (config, source)
    } else if let Some(path) = &args.checkpoint {
        (path.clone(), captune::captioner::trained_on(path)?)
    } else {
        return Ok(None);
    };
    Ok(source.map(|s| (record, s)))
}

pub fn run(device_choice: DeviceChoice, args: &AppArgs) -> Result<()> {
    for (file, flag) in [(&args.screenshot, "--screenshot"), (&args.stats, "--stats")] {
        if let Some(path) = file {
            check_new_output(path, args.overwrite, flag)?;
        }
    }
    let trained_on = recorded(args)?;
    // A new run's [model], which says what image inputs it reads.
    let mut new_model = None;
    let source = if let Some(dir) = &args.follow {
        Source::Follow(dir.clone())
    } else if let Some(path) = &args.checkpoint {
        Source::Checkpoint(path.clone())
    } else {
        let config = match &args.config {
            Some(path) => RunConfig::load(path)?,
            None => RunConfig::preset(&args.preset)?,
        };
        if args.init.is_none() {
            new_model = Some(config.model.clone());
        }
        let out = match &args.out {
            Some(out) => {
                if RunFolder::new(out).holds_run() {
                    bail!(
                        "{} already holds a training run; follow it with `captune app --follow {}`, \
                         or choose another --out",
                        out.display(),
                        out.display()
                    );
                }
                out.clone()
            }
            None => RunFolder::free(Path::new("runs/app")),
        };
        Source::Train(Box::new(TrainSetup {
            device: device_choice,
            config,
            out,
            init: args.init.clone(),
            // Set once the data is loaded: the retriever that embedded it.
            retriever: None,
            autostart: args.start,
        }))
    };
    let (data, features) = (args.data.clone(), args.features.clone());
    // Embedding the images happens once, on the chosen device, while the
    // window shows the progress; the data then lives on the host and is
    // shared by the UI, trainer and scorer.
    let load: window::Loader = Box::new(move |progress| {
        let selection = device::select(device_choice)?;
        eprintln!("{selection}");
        let trained_on = trained_on.as_ref().map(|(record, source)| TrainedOn {
            record: record.as_path(),
            source,
        });
        let (data, judged) = captune::with_backend!(&selection.backend, b => {
            let (mut data, retriever) = embeddings::load(b, &data, &features, trained_on, progress)?;
            // A new run of a decoder that reads image tokens (BLIP's, an
            // attention LSTM) computes them with its vision tower, or
            // reads its pixels to train it.
            if let Some(model) = &new_model {
                model.attach_image_inputs(b, &mut data, progress)?;
            }
            anyhow::Ok((data, retriever.is_some()))
        })?;
        // The retriever caption_data kept as the judge of these embeddings
        // (recorded in their source).
        let retriever = data
            .source
            .as_ref()
            .filter(|_| judged)
            .and_then(|s| s.retriever.clone());
        Ok(window::Loaded { data, retriever })
    });
    window::run(
        load,
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
