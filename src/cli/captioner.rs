//! The captioner's commands: train, eval, score, caption, inspect.

use super::{DataArgs, check_new_output};
use anyhow::{Context, Result, bail};
use captune::backend::Backend;
use captune::cache;
use captune::captioner::Checkpoint;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::inspect::score_caption;
use captune::captioner::objectives::{
    self,
    settings::{SettingKind, SettingValue, Settings},
};
use captune::captioner::run::RunConfig;
use captune::captioner::run_folder::{Begin, RunFolder};
use captune::captioner::train::{self, CaptionData, Event, Flow};
use captune::data::features::{FeatureSource, Features, retriever_encoder_id};
use captune::data::source::{DataSource, absolute};
use captune::data::tokenize::ptb_tokenize;
use captune::data::{Dataset, Item, Split, images};
use captune::metrics::coco_scores;
use captune::progress::Progress;
use captune::retriever::Checkpoint as RetrieverCheckpoint;
use captune::retriever::eval::embed_images;
use captune::tensorfile::fingerprint;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where image embeddings come from.
#[derive(clap::Args, Clone, Default)]
pub struct FeatureArgs {
    /// A features file (safetensors from `captune embed` or any encoder, or .npy with --features-ids).
    #[arg(long)]
    pub features: Option<PathBuf>,
    /// The image ids of a .npy features file, one per line.
    #[arg(long)]
    pub features_ids: Option<PathBuf>,
    /// The retriever that embeds the images (and scores self-retrieval and
    /// relevance). Default: the one the captioner was trained with, else on
    /// the shapes world the shapes retriever carried in the binary.
    #[arg(long)]
    pub retriever: Option<PathBuf>,
}

/// What a captioner was trained on, and where that record is (a
/// checkpoint or a run folder's config), for defaults and checks.
#[derive(Clone, Copy)]
pub struct TrainedOn<'a> {
    pub record: &'a Path,
    pub source: &'a FeatureSource,
}

impl<'a> TrainedOn<'a> {
    pub fn of(record: &'a Path, source: &'a Option<FeatureSource>) -> Option<TrainedOn<'a>> {
        source.as_ref().map(|source| TrainedOn { record, source })
    }
}

/// A retriever file and its identity as an encoder.
pub struct RetrieverFile {
    pub path: PathBuf,
    pub encoder: String,
}

impl RetrieverFile {
    fn open(path: &Path) -> Result<RetrieverFile> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Ok(RetrieverFile {
            path: path.to_path_buf(),
            encoder: retriever_encoder_id(&bytes),
        })
    }
}

/// The retriever that embeds images and judges captions: the one asked
/// for, else the captioner's (while its file is there), else on the
/// shapes world the one the binary carries.
pub fn default_retriever(
    asked: Option<&Path>,
    recorded: Option<&FeatureSource>,
    shapes: bool,
) -> Result<Option<RetrieverFile>> {
    let recorded_file = recorded
        .and_then(|r| r.retriever.as_deref())
        .filter(|p| p.is_file());
    let shapes = recorded.map_or(shapes, |r| r.data == DataSource::Shapes.to_string());
    match asked.or(recorded_file) {
        Some(path) => Ok(Some(RetrieverFile::open(path)?)),
        None if shapes => Ok(Some(RetrieverFile::open(&cache::shapes_retriever()?)?)),
        None => Ok(None),
    }
}

/// The data set to use: the one asked for, else the one the captioner
/// was trained on, else the shapes world. Warns when the two differ.
pub fn resolve_data(data: &DataArgs, trained_on: Option<TrainedOn<'_>>) -> Result<DataArgs> {
    let Some(t) = trained_on else {
        return Ok(data.clone());
    };
    let recorded_shapes = t.source.shapes.unwrap_or(data.shapes);
    match &data.data {
        None => Ok(DataArgs {
            data: Some(t.source.data.parse().map_err(|e: String| {
                anyhow::anyhow!("{}: the recorded data set: {e}", t.record.display())
            })?),
            images: data.images.clone().or(t.source.images.clone()),
            shapes: recorded_shapes,
        }),
        Some(asked) => {
            let differs = asked.absolute().to_string() != t.source.data
                || (asked == &DataSource::Shapes && data.shapes != recorded_shapes);
            if differs {
                eprintln!(
                    "warning: {} was trained on {}; using {} as asked",
                    t.record.display(),
                    t.source.data,
                    asked
                );
            }
            Ok(data.clone())
        }
    }
}

/// Loads the data set with one embedding per item, and the retriever when
/// there is one. `trained_on` (the captioner's record) fills in what the
/// command line leaves out, and embeddings from another encoder than the
/// captioner's are refused. Embeddings computed with a retriever are
/// cached on disk, keyed by the retriever and the data set.
pub fn caption_data<B: Backend>(
    b: &B,
    data: &DataArgs,
    features: &FeatureArgs,
    trained_on: Option<TrainedOn<'_>>,
    progress: &Progress,
) -> Result<(CaptionData, Option<RetrieverCheckpoint<B>>)> {
    let data = resolve_data(data, trained_on)?;
    let recorded = trained_on.map(|t| t.source);
    let mut dataset = data.load()?;
    let retriever_file =
        default_retriever(features.retriever.as_deref(), recorded, data.is_shapes())?;
    // The features file: asked for, else the captioner's unless a retriever was asked for.
    let features_file = features.features.clone().or_else(|| {
        recorded
            .and_then(|r| r.features.clone())
            .filter(|_| features.retriever.is_none())
    });
    let mut retriever = match &retriever_file {
        Some(r) => Some(RetrieverCheckpoint::load(b, &r.path, 128)?),
        None => None,
    };
    let (embeddings, dim, source) = match (&features_file, retriever.as_mut()) {
        (Some(path), _) => {
            let f = Features::load(path, features.features_ids.as_deref())?;
            let embeddings = f.align(&mut dataset)?;
            let source = FeatureSource {
                features: Some(absolute(path)),
                encoder: f.encoder.clone(),
                ..source_of(&data, f.dim)
            };
            (embeddings, f.dim, source)
        }
        (None, Some(r)) => {
            let file = retriever_file
                .as_ref()
                .expect("a loaded retriever has a file");
            let embeddings = embed_cached(b, r, &file.encoder, &mut dataset, progress)?;
            let dim = r.model.config.embed_dim;
            let source = FeatureSource {
                retriever: Some(absolute(&file.path)),
                encoder: Some(file.encoder.clone()),
                ..source_of(&data, dim)
            };
            (embeddings, dim, source)
        }
        (None, None) => bail!(
            "no image embeddings: give --features FILE (from `captune embed` or another encoder) or --retriever CHECKPOINT"
        ),
    };
    if let Some(t) = trained_on {
        check_same_encoder(t, &source)?;
    }
    // Self-retrieval and relevance compare the retriever's text embeddings
    // with these image embeddings: only meaningful from the same encoder.
    if let Some(file) = &retriever_file
        && source.encoder.as_ref() != Some(&file.encoder)
    {
        eprintln!(
            "warning: the image embeddings come from {} ({}), not from the retriever {}; \
             self-retrieval and relevance metrics are left out",
            source.origin(),
            source.encoder.as_deref().unwrap_or("an unrecorded encoder"),
            file.path.display()
        );
        retriever = None;
    }
    if !dataset.report.is_clean() {
        eprintln!("{}", dataset.report);
    }
    Ok((
        CaptionData {
            data: dataset,
            features: embeddings,
            dim,
            source: Some(source),
        },
        retriever,
    ))
}

/// A record of `data` with embeddings of `dim`; the caller adds their origin.
fn source_of(data: &DataArgs, dim: usize) -> FeatureSource {
    FeatureSource {
        data: data.source().absolute().to_string(),
        dim,
        images: data.images.as_deref().map(absolute),
        features: None,
        retriever: None,
        encoder: None,
        shapes: data.is_shapes().then_some(data.shapes),
    }
}

/// Refuses embeddings that differ from the captioner's in dimension or
/// encoder, naming both and what differs.
fn check_same_encoder(t: TrainedOn<'_>, now: &FeatureSource) -> Result<()> {
    let was = t.source;
    if was.dim != now.dim {
        bail!(
            "{} was trained on {}-dimensional embeddings ({}), but {} gives {}; \
             use the captioner's own features or retriever",
            t.record.display(),
            was.dim,
            was.origin(),
            now.origin(),
            now.dim
        );
    }
    if let (Some(a), Some(b)) = (&was.encoder, &now.encoder)
        && a != b
    {
        bail!(
            "{} was trained on embeddings from encoder {a} ({}), but {} comes from encoder {b}; \
             a captioner reads only its own encoder's embeddings: use the same retriever or features",
            t.record.display(),
            was.origin(),
            now.origin()
        );
    }
    Ok(())
}

/// The embeddings of `data`'s images by the retriever `r` (identity
/// `encoder`), from the cache when they are there; else computed (with
/// progress bars) and cached. Items whose image cannot be read are
/// removed from `data`, as `images::load` does.
fn embed_cached<B: Backend>(
    b: &B,
    r: &mut RetrieverCheckpoint<B>,
    encoder: &str,
    data: &mut Dataset,
    progress: &Progress,
) -> Result<Vec<f32>> {
    let size = r.model.config.image_size;
    let mut listing = format!("{encoder}\n{size}\n");
    for item in &data.items {
        let meta = std::fs::metadata(&item.image).ok();
        let modified = meta
            .as_ref()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let len = meta.map_or(0, |m| m.len());
        listing.push_str(&format!(
            "{}\t{}\t{len}\t{modified}\n",
            item.id,
            item.image.display()
        ));
    }
    let cached = cache::features(&data.name, &fingerprint(listing.as_bytes()));
    if cached.is_file() {
        match Features::load(&cached, None).and_then(|f| f.align(data)) {
            Ok(embeddings) => {
                eprintln!("image embeddings from the cache: {}", cached.display());
                return Ok(embeddings);
            }
            Err(e) => {
                eprintln!("warning: ignoring the cached embeddings ({e:#}); computing them again")
            }
        }
    }
    let bar = progress.start(
        &format!("loading {} images", data.items.len()),
        data.items.len() as u64,
    );
    let images = images::load(data, size, &bar)?;
    bar.finish_and_clear();
    let all: Vec<usize> = (0..data.items.len()).collect();
    let bar = progress.start(&format!("embedding {} images", all.len()), all.len() as u64);
    let embeddings = embed_images(b, &mut r.model, &images, &all, &bar)?;
    bar.finish_and_clear();
    let mut features = Features {
        source: cached.clone(),
        ids: data.items.iter().map(|i| i.id.clone()).collect(),
        dim: r.model.config.embed_dim,
        embeddings,
        encoder: Some(encoder.to_string()),
    };
    // As loading them back from the cache would: the same bits either way.
    features.normalise()?;
    let metadata = HashMap::from([("dataset".to_string(), data.name.clone())]);
    if let Err(e) = features.save(&cached, metadata) {
        eprintln!("warning: cannot cache the image embeddings ({e:#})");
    }
    Ok(features.embeddings)
}

/// `--objective NAME` and a flag for each objective setting, made from
/// the objectives' declarations (`captune::captioner::objectives`), so a
/// new objective's settings reach the command line with no code here.
#[derive(Clone, Debug, Default)]
pub struct ObjectiveArgs {
    pub objective: Option<String>,
    /// The settings given, by key.
    pub settings: Settings,
}

impl clap::FromArgMatches for ObjectiveArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut args = ObjectiveArgs::default();
        args.update_from_arg_matches(m)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        if let Some(o) = m.get_one::<String>("objective") {
            self.objective = Some(o.clone());
        }
        for s in objectives::declared_settings() {
            if let Some(v) = m.get_one::<SettingValue>(s.key) {
                self.settings.insert(s.key.to_string(), v.clone());
            }
        }
        Ok(())
    }
}

impl clap::Args for ObjectiveArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let names: Vec<&str> = objectives::OBJECTIVES.iter().map(|o| o.name).collect();
        let help: Vec<String> = objectives::OBJECTIVES
            .iter()
            .map(|o| format!("{}: {}", o.name, o.help))
            .collect();
        let mut cmd = cmd.arg(
            clap::Arg::new("objective")
                .long("objective")
                .value_name("NAME")
                .help(format!("The objective ({})", help.join("; ")))
                .value_parser(clap::builder::PossibleValuesParser::new(names)),
        );
        for setting in objectives::declared_settings() {
            let takers: Vec<&str> = objectives::OBJECTIVES
                .iter()
                .filter(|o| o.settings.iter().any(|s| s.key == setting.key))
                .map(|o| o.name)
                .collect();
            let (value_name, range) = match setting.kind {
                SettingKind::Number { min, max, default } => {
                    ("X", format!("{min} to {max}, default {default}"))
                }
                SettingKind::Choice { choices, default } => {
                    ("NAME", format!("{}, default {default}", choices.join(", ")))
                }
            };
            // Flags live as long as the program.
            let flag: &'static str = Box::leak(setting.flag().into_boxed_str());
            cmd = cmd.arg(
                clap::Arg::new(setting.key)
                    .long(flag)
                    .value_name(value_name)
                    .help(format!(
                        "{} ({range}; objectives {})",
                        setting.help,
                        takers.join(", ")
                    ))
                    .value_parser(move |text: &str| setting.parse(text)),
            );
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[derive(clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub features: FeatureArgs,
    /// A preset: tiny, shapes or flickr8k.
    #[arg(long, conflicts_with = "config")]
    pub preset: Option<String>,
    /// A run config (TOML, as assets/presets/*.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub objective: ObjectiveArgs,
    /// Epochs to train; with --resume, epochs to train beyond those done.
    #[arg(long)]
    pub epochs: Option<usize>,
    #[arg(long)]
    pub lr: Option<f32>,
    /// Start from this captioner checkpoint's weights (its config and vocabulary win).
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// The run folder (config, logs, samples, metrics, checkpoints).
    #[arg(long, default_value = "runs/captioner")]
    pub out: PathBuf,
    /// Continue the run in --out from its last saved state.
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: bool,
    /// Start a new run in --out even though one is there (its files are deleted).
    #[arg(long)]
    pub overwrite: bool,
}

impl TrainArgs {
    /// The run's config: the folder's when resuming, else a file or a
    /// preset; then the command line's overrides.
    fn run_config(&self) -> Result<RunConfig> {
        let run = RunFolder::new(&self.out);
        let mut c = if self.resume {
            RunConfig::load(&run.config())?
        } else if let Some(path) = &self.config {
            RunConfig::load(path)?
        } else {
            RunConfig::preset(self.preset.as_deref().unwrap_or("shapes"))?
        };
        let t = &mut c.train;
        if let Some(o) = &self.objective.objective {
            t.objective = o.clone();
        }
        let info = objectives::find(&t.objective)?;
        for (key, value) in &self.objective.settings {
            if !info.settings.iter().any(|s| s.key == key) {
                let own: Vec<String> = info
                    .settings
                    .iter()
                    .map(|s| format!("--{}", s.flag()))
                    .collect();
                bail!(
                    "--{} is not a setting of objective {}; its settings are: {}",
                    key.replace('_', "-"),
                    info.name,
                    if own.is_empty() {
                        "none".into()
                    } else {
                        own.join(", ")
                    }
                );
            }
            t.settings.insert(key.clone(), value.clone());
        }
        if let Some(e) = self.epochs {
            t.epochs = if self.resume {
                run.position()?.epoch + e
            } else {
                e
            };
        }
        if let Some(lr) = self.lr {
            t.lr = lr;
        }
        RunConfig::parse(&c.to_toml(), "the run config with command-line overrides")
    }
}

/// Trains into a run folder; returns the final checkpoint.
pub fn train<B: Backend>(
    b: &B,
    args: &TrainArgs,
    loaded: Option<(&CaptionData, Option<&mut RetrieverCheckpoint<B>>)>,
) -> Result<Checkpoint<B>> {
    let run = RunFolder::new(&args.out);
    // Before anything slow: a resumable folder, or one free for a new run
    // (an overwritten run's files go only once its --config and --init,
    // which may lie inside it, are read).
    let begin = match (args.resume, args.overwrite) {
        (true, _) => {
            run.recover()?;
            Begin::Resume
        }
        (false, overwrite) => {
            run.check_free(overwrite)?;
            if overwrite {
                Begin::Overwrite
            } else {
                Begin::New
            }
        }
    };
    let config = args.run_config()?;
    let progress = Progress::terminal();
    let mut owned = None;
    let (data, retriever) = match loaded {
        Some(l) => l,
        None => {
            let trained_on = if args.resume {
                config.features.as_ref()
            } else {
                None
            };
            let trained_on = trained_on.map(|source| TrainedOn {
                record: &args.out,
                source,
            });
            let (d, r) = caption_data(b, &args.data, &args.features, trained_on, &progress)?;
            let o = owned.insert((d, r));
            (&o.0, o.1.as_mut())
        }
    };
    let mut ck = if args.resume {
        Checkpoint::load(b, &run.checkpoint())?
    } else if let Some(init) = &args.init {
        let start = Captioner::load(b, init)?;
        if let (Some(t), Some(now)) = (TrainedOn::of(init, &start.trained_on), &data.source) {
            check_same_encoder(t, now)?;
        }
        start.ck
    } else {
        train::fresh_checkpoint(b, data, &config)?
    };
    if ck.model.config.embed_dim != data.dim {
        bail!(
            "the captioner reads {}-dimensional image embeddings but {} gives {}",
            ck.model.config.embed_dim,
            data.source
                .as_ref()
                .map_or("the features".into(), |s| s.origin()),
            data.dim
        );
    }
    eprintln!(
        "{}: {} train images; captioner {} parameters, vocabulary {} ids; objective {}",
        data.data.name,
        data.items(Split::Train).len(),
        ck.model.params.count(),
        ck.vocab.len(),
        objectives::describe(&config.train.objective, &config.train.settings)
    );
    train::train(
        b,
        &mut ck,
        data,
        &config,
        &run,
        begin,
        retriever,
        &progress,
        |e| {
            match e {
                Event::Log(_) => {}
                Event::Sample(s) => eprintln!("  sample {}: {}", s.image_id, s.caption),
                Event::Metrics(m) => eprintln!(
                    "epoch {} val: {}",
                    m.epoch,
                    serde_json::to_string(&m.metrics).unwrap_or_default()
                ),
            }
            Flow::Continue
        },
    )?;
    eprintln!("run folder: {}", run.dir.display());
    Ok(ck)
}

/// How captions are decoded, for `eval` and `caption`.
#[derive(clap::Args)]
pub struct DecodeArgs {
    /// greedy, beam:W, beam:W:N, sample:N or sample:N:t=..,k=..,p=..,seed=..
    #[arg(long, default_value = "greedy", value_parser = Decoding::parse)]
    pub decode: Decoding,
    /// Stop captions after this many words (default: the model's maximum).
    #[arg(long)]
    pub max_words: Option<usize>,
    /// Never emit <unk>: the decoder chooses among the other words.
    #[arg(long)]
    pub suppress_unk: bool,
}

impl DecodeArgs {
    fn options(&self, progress: &indicatif::ProgressBar) -> DecodeOptions {
        DecodeOptions {
            max_words: self.max_words,
            suppress_unk: self.suppress_unk,
            progress: Some(progress.clone()),
        }
    }
}

#[derive(clap::Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub features: FeatureArgs,
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[arg(long, value_parser = parse_split, default_value = "test")]
    pub split: Split,
    #[command(flatten)]
    pub decoding: DecodeArgs,
    /// Where to write the COCO-format results (default: beside the checkpoint).
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// Replace the results file if it exists.
    #[arg(long)]
    pub overwrite: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn parse_split(s: &str) -> Result<Split> {
    Split::parse(s).with_context(|| format!("{s:?} is not a split; use train, val or test"))
}

/// A captioner checkpoint with what it was trained on.
pub struct Captioner<B: Backend> {
    pub ck: Checkpoint<B>,
    pub trained_on: Option<FeatureSource>,
}

impl<B: Backend> Captioner<B> {
    pub fn load(b: &B, path: &Path) -> Result<Self> {
        Ok(Captioner {
            ck: Checkpoint::load(b, path)?,
            trained_on: captune::captioner::trained_on(path)?,
        })
    }

    /// Refuses embeddings of another size than the model reads.
    pub fn check_dim(&self, path: &Path, data: &CaptionData) -> Result<()> {
        let want = self.ck.model.config.embed_dim;
        if want != data.dim {
            bail!(
                "{} reads {want}-dimensional image embeddings, but {} gives {}; \
                 use the features or retriever it was trained with",
                path.display(),
                data.source
                    .as_ref()
                    .map_or("the features".into(), |s| s.origin()),
                data.dim
            );
        }
        Ok(())
    }
}

/// A results entry's `image_id`: a number where the data set's id is one
/// (COCO and Karpathy ids are), as pycocotools' `loadRes` expects.
fn result_id(id: &str) -> serde_json::Value {
    match id.parse::<u64>() {
        Ok(n) if n.to_string() == id => serde_json::Value::from(n),
        _ => serde_json::Value::from(id),
    }
}

pub fn eval<B: Backend>(b: &B, args: &EvalArgs) -> Result<()> {
    let path = args.results.clone().unwrap_or_else(|| {
        args.checkpoint
            .with_file_name(format!("results-{}.json", args.split.name()))
    });
    check_new_output(&path, args.overwrite, "--results")?;
    let captioner = Captioner::load(b, &args.checkpoint)?;
    let progress = Progress::terminal();
    let trained_on = TrainedOn::of(&args.checkpoint, &captioner.trained_on);
    let (data, mut retriever) = caption_data(b, &args.data, &args.features, trained_on, &progress)?;
    captioner.check_dim(&args.checkpoint, &data)?;
    let items = data.items(args.split);
    if items.is_empty() {
        bail!(
            "{}: the {} split is empty",
            data.data.name,
            args.split.name()
        );
    }
    let bar = progress.start(
        &format!("captioning {} images", items.len()),
        items.len() as u64,
    );
    let options = args.decoding.options(&bar);
    let captions = train::caption_items(
        b,
        &captioner.ck,
        &data,
        &items,
        &args.decoding.decode,
        &options,
    )?;
    bar.finish_and_clear();
    let results: Vec<serde_json::Value> = items
        .iter()
        .zip(&captions)
        .flat_map(|(&i, caps)| {
            let id = result_id(&data.data.items[i].id);
            caps.iter()
                .map(move |c| serde_json::json!({"image_id": id, "caption": c}))
        })
        .collect();
    captune::tensorfile::write_atomic(&path, serde_json::to_string_pretty(&results)?.as_bytes())?;
    let metrics = train::score_captions(b, &data, &items, &captions, retriever.as_mut())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&metrics)?);
    } else {
        print_metrics(&metrics)?;
        eprintln!("results: {}", path.display());
    }
    Ok(())
}

fn print_metrics(m: &impl serde::Serialize) -> Result<()> {
    let value = serde_json::to_value(m)?;
    for (k, v) in value.as_object().expect("metrics are an object") {
        if !v.is_null() {
            println!("{k:>20} {v}");
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[arg(long, value_parser = parse_split, default_value = "test")]
    pub split: Split,
    /// COCO-format results: [{"image_id": ..., "caption": ...}].
    #[arg(long)]
    pub results: PathBuf,
    #[arg(long)]
    pub json: bool,
}

/// What `score` reports: the reference-based scores of each image's first
/// caption, and with several captions per image their diversity.
#[derive(serde::Serialize)]
struct Scores {
    images: usize,
    captions_per_image: usize,
    #[serde(flatten)]
    coco: captune::metrics::CocoScores,
    #[serde(skip_serializing_if = "Option::is_none")]
    div1: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    div2: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mbleu4: Option<f64>,
}

/// Scores a results file against the split's references, exactly as
/// pycocoevalcap does (its tokenizer, BLEU, CIDEr-D, ROUGE-L). Only the
/// references are read, never the images. Several captions of one image
/// (`eval --decode sample:5`) are accepted as eval scores them: the first
/// for the reference-based scores, all for Div-1, Div-2 and mBLEU-4.
pub fn score(args: &ScoreArgs) -> Result<()> {
    let data = args.data.source().load_references(&args.data.shapes)?;
    let by_id: HashMap<&str, &Item> = data.split(args.split).map(|i| (i.id.as_str(), i)).collect();
    let file = args.results.display();
    let text = std::fs::read_to_string(&args.results)
        .with_context(|| format!("{file}: cannot read the results"))?;
    let results: Vec<serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("{file}: not a JSON list of {{\"image_id\", \"caption\"}}"))?;
    // Each image's captions, images in their first appearance's order.
    let mut order: Vec<&Item> = Vec::new();
    let mut captions: HashMap<String, Vec<Vec<String>>> = HashMap::new();
    for (k, r) in results.iter().enumerate() {
        let id = match &r["image_id"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => bail!("{file}: entry {k} has no image_id"),
        };
        let Some(caption) = r["caption"].as_str() else {
            bail!("{file}: entry {k} (image {id}) has no caption string");
        };
        let Some(item) = by_id.get(id.as_str()) else {
            bail!(
                "{file}: entry {k}: image {id} is not in the {} split of {}",
                args.split.name(),
                data.name
            );
        };
        let list = captions.entry(id).or_default();
        if list.is_empty() {
            order.push(item);
        }
        list.push(ptb_tokenize(caption));
    }
    let sets: Vec<Vec<Vec<String>>> = order
        .iter()
        .map(|item| {
            captions
                .remove(&item.id)
                .expect("every listed image has captions")
        })
        .collect();
    let per_image = sets.iter().map(Vec::len).max().unwrap_or(0);
    if sets.iter().any(|s| s.len() != per_image) {
        bail!(
            "{file}: images have different numbers of captions (from 1 to {per_image}); \
             give every image one caption, or the same number each"
        );
    }
    let firsts: Vec<Vec<String>> = sets.iter().map(|s| s[0].clone()).collect();
    let references: Vec<Vec<Vec<String>>> = order
        .iter()
        .map(|item| item.captions.iter().map(|c| c.tokens.clone()).collect())
        .collect();
    let d = (per_image >= 2).then(|| captune::metrics::diversity::diversity(&sets));
    let scores = Scores {
        images: sets.len(),
        captions_per_image: per_image,
        coco: coco_scores(&firsts, &references),
        div1: d.as_ref().map(|d| d.div1),
        div2: d.as_ref().map(|d| d.div2),
        mbleu4: d.as_ref().map(|d| d.mbleu4),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&scores)?);
    } else {
        println!(
            "{} images of {} {}",
            scores.images,
            data.name,
            args.split.name()
        );
        print_metrics(&scores)?;
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct CaptionArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The retriever whose image tower embeds the images. Default: the one
    /// the captioner was trained with (on the shapes world, the carried one).
    #[arg(long)]
    pub retriever: Option<PathBuf>,
    #[command(flatten)]
    pub decoding: DecodeArgs,
    /// Image files.
    #[arg(required = true)]
    pub images: Vec<PathBuf>,
}

pub fn caption<B: Backend>(b: &B, args: &CaptionArgs) -> Result<()> {
    let captioner = Captioner::load(b, &args.checkpoint)?;
    let ck_path = args.checkpoint.display();
    if captioner.trained_on.is_none() && args.retriever.is_none() {
        eprintln!(
            "warning: {ck_path} does not record its features (it predates the record); \
             embedding with the shapes retriever; pass --retriever for another"
        );
    }
    let Some(file) = default_retriever(
        args.retriever.as_deref(),
        captioner.trained_on.as_ref(),
        true,
    )?
    else {
        bail!(
            "{ck_path} was trained on {}, and `caption` embeds images only with a captune \
             retriever: pass --retriever with the retriever of those features",
            captioner
                .trained_on
                .as_ref()
                .map_or("unrecorded features".into(), |t| t.origin())
        );
    };
    let mut retriever = RetrieverCheckpoint::load(b, &file.path, 128)?;
    let embed_dim = retriever.model.config.embed_dim;
    let now = FeatureSource {
        retriever: Some(file.path.clone()),
        encoder: Some(file.encoder.clone()),
        dim: embed_dim,
        ..captioner
            .trained_on
            .clone()
            .unwrap_or_else(|| FeatureSource {
                data: "image files".into(),
                dim: embed_dim,
                images: None,
                features: None,
                retriever: None,
                encoder: None,
                shapes: None,
            })
    };
    match TrainedOn::of(&args.checkpoint, &captioner.trained_on) {
        Some(t) => check_same_encoder(t, &now)?,
        None if embed_dim != captioner.ck.model.config.embed_dim => bail!(
            "{ck_path} reads {}-dimensional image embeddings but the retriever {} makes \
             {embed_dim}; pass the retriever it was trained with",
            captioner.ck.model.config.embed_dim,
            file.path.display()
        ),
        None => {}
    }
    let mut data = Dataset {
        name: "images".into(),
        items: args
            .images
            .iter()
            .map(|p| Item {
                id: p.display().to_string(),
                split: Split::Test,
                image: p.clone(),
                captions: Vec::new(),
                scene: None,
            })
            .collect(),
        report: Default::default(),
    };
    let progress = Progress::terminal();
    let n = data.items.len() as u64;
    let bar = progress.start("loading images", n);
    let images = images::load(&mut data, retriever.model.config.image_size, &bar)?;
    bar.finish_and_clear();
    if !data.report.is_clean() {
        eprintln!("{}", data.report);
    }
    let all: Vec<usize> = (0..data.items.len()).collect();
    let bar = progress.start("embedding images", all.len() as u64);
    let features = embed_images(b, &mut retriever.model, &images, &all, &bar)?;
    bar.finish_and_clear();
    let ck = &captioner.ck;
    let decode = &args.decoding.decode;
    let bar = progress.start("captioning", all.len() as u64);
    let generated = generate(
        b,
        &ck.model,
        &features,
        decode,
        &args.decoding.options(&bar),
    )?;
    bar.finish_and_clear();
    for g in generated {
        println!("{}\t{}", data.items[g.image].id, g.text(&ck.vocab));
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub features: FeatureArgs,
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The image id in the data set.
    #[arg(long)]
    pub image: String,
    /// The caption to score (tokenised as the references are).
    #[arg(long)]
    pub caption: String,
    #[arg(long)]
    pub json: bool,
}

pub fn inspect<B: Backend>(b: &B, args: &InspectArgs) -> Result<()> {
    let captioner = Captioner::load(b, &args.checkpoint)?;
    let trained_on = TrainedOn::of(&args.checkpoint, &captioner.trained_on);
    let (data, _) = caption_data(
        b,
        &args.data,
        &args.features,
        trained_on,
        &Progress::terminal(),
    )?;
    captioner.check_dim(&args.checkpoint, &data)?;
    let Some(i) = data.data.items.iter().position(|it| it.id == args.image) else {
        bail!("{}: no image with id {:?}", data.data.name, args.image);
    };
    let mut ck = captioner.ck;
    let ids = ck
        .vocab
        .encode(&ptb_tokenize(&args.caption), ck.model.config.max_len);
    let features = data.features_of(&[i]);
    let scores = score_caption(b, &mut ck.model, &ck.vocab, &features, &ids)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&scores)?);
        return Ok(());
    }
    println!(
        "{:>12} {:>8} {:>8} {:>7} {:>7}  {:<44} top-5 subset",
        "token", "MLE", "SMILE", "p full", "p sub", "top-5 full"
    );
    let top = |p: &[captune::captioner::inspect::Prediction]| {
        p.iter()
            .map(|x| format!("{} {:.2}", x.token, x.probability))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for s in &scores {
        println!(
            "{:>12} {:>8.3} {:>8.3} {:>7.3} {:>7.3}  {:<44} {}",
            s.token,
            s.mle_loss,
            s.smile_loss,
            s.p_full,
            s.p_subset,
            top(&s.top5_full),
            top(&s.top5_subset)
        );
    }
    Ok(())
}
