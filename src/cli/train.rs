//! `captune train`: a captioner trained into a run folder, with the
//! objective and its settings from the command line.

use super::captioner::{Captioner, MeteorArgs};
use anyhow::{Result, bail};
use captune::backend::Backend;
use captune::captioner::objectives::{
    self,
    settings::{SettingKind, SettingValue, Settings},
};
use captune::captioner::records::{Event, Flow};
use captune::captioner::run::RunConfig;
use captune::captioner::run_folder::{Begin, RunFolder};
use captune::captioner::train::{self};
use captune::captioner::{Checkpoint, ImageFeed, MapperTransformer};
use captune::data::Split;
use captune::progress::Progress;
use captune::retriever::frozen::FrozenRetriever;
use captune::source::DataArgs;
use captune::source::embeddings::CaptionData;
use captune::source::embeddings::{self, FeatureArgs, TrainedOn, check_same_encoder};
use std::path::PathBuf;

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
    /// A preset: tiny, shapes, flickr8k, or shapes-lstm and flickr8k-lstm (an LSTM decoder).
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
    /// Images per training step ([train] batch); a resumed run keeps its own.
    #[arg(long, value_name = "N", value_parser = positive)]
    pub batch: Option<usize>,
    /// The fraction of the training images whose captions are used, above
    /// 0 and at most 1 (default 1): objectives that learn from captions
    /// train on those images, clip-relevance and discritune on the rest
    /// (with their --mle-weight mix on the labelled ones). Which images are
    /// labelled depends on their ids only, so runs with one fraction agree.
    #[arg(long, value_name = "FRACTION")]
    pub labelled: Option<f64>,
    /// Start from this captioner checkpoint's weights (its config and
    /// vocabulary win); the data, features and retriever it was trained on
    /// are the defaults.
    #[arg(long, conflicts_with = "decoder")]
    pub init: Option<PathBuf>,
    /// Another decoder ([model] decoder). A pretrained one, hf:FOLDER: a
    /// Hugging Face GPT-2 or BLIP folder (config.json, model.safetensors,
    /// tokenizer.json), whose network and tokenizer replace [model]'s
    /// width, layers and heads and the word vocabulary (a GPT-2 gets a new
    /// mapper: see --mapper). ClipCap's own checkpoint, clipcap:FILE.pt
    /// (its GPT-2 and mapper, with --gpt2), decoding as ClipCap does.
    /// BLIP's own checkpoint, blip:FILE.pth (with --blip-config), converted
    /// once into the cache. Or an
    /// LSTM captioner, [model] width wide: lstm:fc ([model] layers layers),
    /// or lstm:att2in or lstm:updown (attention over image tokens: see
    /// --image-tokens). The run's checkpoints carry it from then on.
    #[arg(
        long,
        value_name = "hf:FOLDER|clipcap:FILE|blip:FILE|lstm:MODEL",
        conflicts_with = "resume"
    )]
    pub decoder: Option<String>,
    /// With --decoder clipcap:FILE: the Hugging Face GPT-2 folder it was
    /// trained with, for its config.json and tokenizer.json ([model] gpt2).
    #[arg(long, value_name = "FOLDER", conflicts_with = "resume")]
    pub gpt2: Option<PathBuf>,
    /// With --decoder blip:FILE: a Hugging Face BLIP folder of its sizes,
    /// for the config, tokenizer and image processor ([model] blip_config).
    #[arg(long, value_name = "FOLDER", conflicts_with = "resume")]
    pub blip_config: Option<PathBuf>,
    /// With an attention LSTM (lstm:att2in, lstm:updown): the Hugging Face
    /// BLIP or CLIP folder, hf:FOLDER, whose vision tower makes the image
    /// tokens it reads ([model] image_tokens).
    #[arg(long, value_name = "hf:FOLDER")]
    pub image_tokens: Option<String>,
    /// With a BLIP decoder: train its vision tower too, as the SMILE paper
    /// fine-tunes BLIP ([model] train_vision). Each batch's images are
    /// read and go through the tower at every step; by default the tower
    /// is frozen and its tokens are computed once and cached.
    #[arg(long, conflicts_with_all = ["resume", "init"])]
    pub train_vision: bool,
    /// With an LSTM decoder: the projected image embedding is every
    /// layer's initial hidden state (hidden, the default), or the input of
    /// a step before the start token (input) ([model] image_feed).
    #[arg(long, value_enum)]
    pub image_feed: Option<ImageFeed>,
    /// With a BLIP decoder: text fed after the start of every caption and
    /// never predicted, so no loss or reward reads it ([model] prompt;
    /// BLIP's captioning checkpoints were trained after "a picture of").
    #[arg(long, value_name = "TEXT", requires = "decoder")]
    pub prompt: Option<String>,
    /// The mapper from image embeddings to the prefix: ClipCap's MLP, or
    /// its transformer mapper ([model.mapper_transformer]: the embedding
    /// as 10 vectors, 8 blocks of 8 heads, [model] mapper_hidden wide
    /// MLPs; ReLU with a GPT-2 decoder), the one its paper pairs with
    /// --freeze-decoder.
    #[arg(long, value_enum, conflicts_with_all = ["resume", "init"])]
    pub mapper: Option<MapperKind>,
    /// The run folder (config, logs, samples, metrics, checkpoints).
    #[arg(long, default_value = "runs/captioner")]
    pub out: PathBuf,
    /// Continue the run in --out from its last saved state.
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: bool,
    /// With --resume: train no further, but validate the saved state,
    /// appending the samples and metrics records of its epoch and step as
    /// an epoch's end writes them (for a run another engine trained, such
    /// as the PyTorch package's).
    #[arg(long, requires = "resume")]
    pub validate_only: bool,
    /// Start a new run in --out even though one is there (its files are deleted).
    #[arg(long)]
    pub overwrite: bool,
    /// When the captions collapse (one word repeated, no entropy left at
    /// the maximum length, or the objective's reward far below its start),
    /// warn but train on instead of stopping ([train] collapse_stop = false).
    #[arg(long)]
    pub no_collapse_stop: bool,
    /// Train the mapper only ([train] freeze_decoder = true): the
    /// decoder's weights stay as they are while gradients flow through it
    /// to the prefix (ClipCap's prefix-only mode). With --init, a trained
    /// decoder's language stays and the mapper learns new image features.
    #[arg(long)]
    pub freeze_decoder: bool,
    /// METEOR at validation (when its data is found).
    #[command(flatten)]
    pub meteor: MeteorArgs,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum MapperKind {
    Mlp,
    Transformer,
}

fn positive(text: &str) -> Result<usize> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{text:?}: expected a whole number of images, at least 1"),
    }
}

impl TrainArgs {
    /// The run's config: the folder's when resuming, else a file or a
    /// preset; then the command line's overrides. Also what the run says
    /// of its learning rate.
    fn run_config(&self) -> Result<(RunConfig, String)> {
        let run = RunFolder::new(&self.out);
        let (mut c, origin) = if self.resume {
            let path = run.config();
            (RunConfig::load(&path)?, path.display().to_string())
        } else if let Some(path) = &self.config {
            (RunConfig::load(path)?, path.display().to_string())
        } else {
            let preset = self.preset.as_deref().unwrap_or("shapes");
            (RunConfig::preset(preset)?, format!("preset {preset}"))
        };
        let before = c.train.clone();
        if let Some(decoder) = &self.decoder {
            c.model.decoder = Some(decoder.clone());
        }
        if let Some(dir) = &self.gpt2 {
            c.model.gpt2 = Some(dir.clone());
        }
        if let Some(dir) = &self.blip_config {
            c.model.blip_config = Some(dir.clone());
        }
        if let Some(feed) = self.image_feed {
            c.model.image_feed = Some(feed);
        }
        if let Some(tokens) = &self.image_tokens {
            c.model.image_tokens = Some(tokens.clone());
        }
        if let Some(prompt) = &self.prompt {
            c.model.prompt = Some(prompt.clone());
        }
        if self.train_vision {
            c.model.train_vision = true;
        }
        if let Some(kind) = self.mapper {
            c.model.mapper_transformer = match kind {
                MapperKind::Mlp => None,
                MapperKind::Transformer => Some(MapperTransformer::CLIPCAP),
            };
        }
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
        if let Some(batch) = self.batch {
            t.batch = batch;
        }
        if let Some(fraction) = self.labelled {
            t.labelled = fraction;
        }
        if self.no_collapse_stop {
            t.collapse_stop = false;
        }
        if self.freeze_decoder {
            t.freeze_decoder = true;
        }
        if self.resume {
            let new_run = format!(
                "start a new run from its checkpoint (--init {}) instead",
                run.checkpoint().display()
            );
            if t.batch != before.batch {
                bail!(
                    "--batch {}: {} was trained with batch {}, and a run keeps its batch size \
                     (its position within an epoch counts batches); {new_run}",
                    t.batch,
                    run.dir.display(),
                    before.batch
                );
            }
            if t.labelled != before.labelled {
                bail!(
                    "--labelled {}: {} was trained with labelled {}, and a run keeps its \
                     labelled fraction; {new_run}",
                    t.labelled,
                    run.dir.display(),
                    before.labelled
                );
            }
            let trained_on = objectives::find(&before.objective)?.trains_on;
            if t.labelled < 1.0 && info.trains_on != trained_on {
                bail!(
                    "--objective {}: with labelled {} it trains on other images than {} did \
                     (objective {}); {new_run}",
                    info.name,
                    t.labelled,
                    run.dir.display(),
                    before.objective
                );
            }
        }
        // Fine-tuning: a new run from a checkpoint with a preset's rate (a
        // --config file's rate is the user's), or a switch of objective on
        // --resume.
        let fine_tuning = if self.resume {
            (c.train.objective != before.objective).then_some("a switch of objective on --resume")
        } else {
            (self.init.is_some() && self.config.is_none())
                .then_some("a run started from a checkpoint (--init)")
        };
        let lr_reason = c.choose_lr(self.lr, fine_tuning, &origin);
        let c = RunConfig::parse(&c.to_toml(), "the run config with command-line overrides")?;
        Ok((c, lr_reason))
    }
}

/// Trains into a run folder; returns the final checkpoint.
pub fn train<B: Backend>(
    b: &B,
    args: &TrainArgs,
    loaded: Option<(&CaptionData, Option<&mut FrozenRetriever<B>>)>,
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
    let (config, lr_reason) = args.run_config()?;
    let progress = Progress::terminal();
    // A fine-tune starts from its checkpoint's record of data and features,
    // as a resumed run from its own.
    let start = match (&args.init, args.resume) {
        (Some(init), false) => Some((init, Captioner::load(b, init)?)),
        _ => None,
    };
    let mut owned = None;
    let (data, retriever) = match loaded {
        Some(l) => l,
        None => {
            let trained_on = match &start {
                Some((init, start)) => TrainedOn::of(init, &start.trained_on),
                None if args.resume => config.features.as_ref().map(|source| TrainedOn {
                    record: &args.out,
                    source,
                }),
                None => None,
            };
            let (mut d, r) =
                embeddings::load(b, &args.data, &args.features, trained_on, &progress)?;
            // A new run of a decoder that reads image tokens (BLIP's, an
            // attention LSTM) computes them with its vision tower, or
            // reads its pixels to train it (a resumed or --init run reads
            // those its record names).
            let new = !args.resume && start.is_none();
            if new {
                config.model.attach_image_inputs(b, &mut d, &progress)?;
            }
            let o = owned.insert((d, r));
            (&o.0, o.1.as_mut())
        }
    };
    let mut ck = if args.resume {
        Checkpoint::load(b, &run.checkpoint())?
    } else if let Some((init, start)) = start {
        if let (Some(t), Some(now)) = (TrainedOn::of(init, &start.trained_on), &data.source) {
            check_same_encoder(t, now)?;
        }
        start.ck
    } else {
        train::fresh_checkpoint(b, data, &config)?
    };
    ck.model.config.check_inputs(data, "the captioner")?;
    eprintln!(
        "{}: {} train images; captioner {} parameters, vocabulary {} ids; objective {}",
        data.data.name,
        data.items(Split::Train).len(),
        ck.model.params().count(),
        ck.vocab.len(),
        objectives::describe(&config.train.objective, &config.train.settings)
    );
    let show = |e: Event<'_>| {
        match e {
            Event::Log(_) => {}
            Event::Warning(w) => eprintln!("{w}"),
            Event::Sample(s) => eprintln!("  sample {}: {}", s.image_id, s.caption),
            Event::Metrics(m) => eprintln!(
                "epoch {} val: {}",
                m.epoch,
                serde_json::to_string(&m.metrics).unwrap_or_default()
            ),
        }
        Flow::Continue
    };
    let meteor = args.meteor.scorer()?;
    if args.validate_only {
        train::validate_saved(
            b, &mut ck, data, &config, &run, retriever, meteor, &progress, show,
        )?;
    } else {
        eprintln!("{lr_reason}");
        let validate_start = args.init.is_some() && !args.resume;
        train::train(
            b,
            &mut ck,
            data,
            &config,
            &run,
            begin,
            validate_start,
            retriever,
            meteor,
            &progress,
            show,
        )?;
    }
    eprintln!("run folder: {}", run.dir.display());
    Ok(ck)
}
