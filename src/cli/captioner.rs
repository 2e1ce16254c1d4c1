//! The captioner's commands: train, eval, score, caption, inspect.

use super::DataArgs;
use anyhow::{Context, Result, bail};
use captune::backend::Backend;
use captune::captioner::Checkpoint;
use captune::captioner::decode::{Decoding, generate};
use captune::captioner::inspect::score_caption;
use captune::captioner::objective::{FirstToken, ObjectiveKind};
use captune::captioner::run::RunConfig;
use captune::captioner::train::{self, CaptionData, Event, Flow, RunFolder};
use captune::data::features::Features;
use captune::data::tokenize::ptb_tokenize;
use captune::data::{Dataset, Item, Split, images};
use captune::metrics::coco_scores;
use captune::retriever::Checkpoint as RetrieverCheckpoint;
use captune::retriever::eval::embed_images;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The shapes world's retriever, made by `captune retriever train` and kept in the repository.
pub const SHAPES_RETRIEVER: &str = "assets/shapes-retriever.safetensors";

/// Where image embeddings come from.
#[derive(clap::Args, Clone)]
pub struct FeatureArgs {
    /// A features file (safetensors from `captune embed` or any encoder, or .npy with --features-ids).
    #[arg(long)]
    pub features: Option<PathBuf>,
    /// The image ids of a .npy features file, one per line.
    #[arg(long)]
    pub features_ids: Option<PathBuf>,
    /// The retriever that embeds the images (and scores self-retrieval and
    /// relevance). Default on the shapes world: assets/shapes-retriever.safetensors.
    #[arg(long)]
    pub retriever: Option<PathBuf>,
}

impl FeatureArgs {
    pub fn retriever_path(&self, data: &DataArgs) -> Option<PathBuf> {
        self.retriever.clone().or_else(|| {
            (data.is_shapes() && Path::new(SHAPES_RETRIEVER).exists())
                .then(|| SHAPES_RETRIEVER.into())
        })
    }
}

/// Loads the data set with one embedding per item, and the retriever when there is one.
pub fn caption_data<B: Backend>(
    b: &B,
    data: &DataArgs,
    features: &FeatureArgs,
) -> Result<(CaptionData, Option<RetrieverCheckpoint<B>>)> {
    let mut dataset = data.load()?;
    let mut retriever = match features.retriever_path(data) {
        Some(path) => Some(RetrieverCheckpoint::load(b, &path, 128)?),
        None => None,
    };
    let (embeddings, dim) = match (&features.features, retriever.as_mut()) {
        (Some(path), r) => {
            let f = Features::load(path, features.features_ids.as_deref())?;
            if let Some(r) = r {
                f.expect_dim(r.model.config.embed_dim)?;
            }
            (f.align(&mut dataset), f.dim)
        }
        (None, Some(r)) => {
            eprintln!(
                "embedding {} images with the retriever",
                dataset.items.len()
            );
            let images = images::load(&mut dataset, r.model.config.image_size)?;
            let all: Vec<usize> = (0..dataset.items.len()).collect();
            (
                embed_images(b, &mut r.model, &images, &all)?,
                r.model.config.embed_dim,
            )
        }
        (None, None) => bail!(
            "no image embeddings: give --features FILE (from `captune embed` or another encoder) or --retriever CHECKPOINT"
        ),
    };
    if !dataset.report.is_clean() {
        eprintln!("{}", dataset.report);
    }
    Ok((
        CaptionData {
            data: dataset,
            features: embeddings,
            dim,
        },
        retriever,
    ))
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
    #[arg(long, value_enum)]
    pub objective: Option<ObjectiveKind>,
    #[arg(long, value_enum)]
    pub first_token: Option<FirstToken>,
    /// lambda in lambda * MLE + (1 - lambda) * SMILE.
    #[arg(long)]
    pub mle_weight: Option<f32>,
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
    /// Continue the run in --out from its last checkpoint.
    #[arg(long)]
    pub resume: bool,
}

impl TrainArgs {
    fn run_config(&self) -> Result<RunConfig> {
        let mut c = if self.resume {
            RunConfig::load(&self.out.join("config.toml"))?
        } else if let Some(path) = &self.config {
            RunConfig::load(path)?
        } else {
            RunConfig::preset(self.preset.as_deref().unwrap_or("shapes"))?
        };
        let t = &mut c.train;
        if let Some(o) = self.objective {
            t.objective = o;
        }
        if let Some(f) = self.first_token {
            t.first_token = f;
        }
        if let Some(w) = self.mle_weight {
            t.mle_weight = w;
        }
        if let Some(e) = self.epochs {
            t.epochs = e;
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
    let config = args.run_config()?;
    let mut owned = None;
    let (data, retriever) = match loaded {
        Some(l) => l,
        None => {
            let (d, r) = caption_data(b, &args.data, &args.features)?;
            let o = owned.insert((d, r));
            (&o.0, o.1.as_mut())
        }
    };
    let run = RunFolder {
        dir: args.out.clone(),
    };
    let batch = config.train.batch;
    let mut ck = if args.resume {
        Checkpoint::load(b, &run.checkpoint(), batch)?
    } else if let Some(init) = &args.init {
        Checkpoint::load(b, init, batch)?
    } else {
        train::fresh_checkpoint(b, data, &config)?
    };
    if ck.model.config.embed_dim != data.dim {
        bail!(
            "the captioner reads {}-dimensional image embeddings but the features have {}",
            ck.model.config.embed_dim,
            data.dim
        );
    }
    eprintln!(
        "{}: {} train images; captioner {} parameters, vocabulary {} ids; objective {}",
        data.data.name,
        data.items(Split::Train).len(),
        ck.model.params.count(),
        ck.vocab.len(),
        config.objective().describe()
    );
    train::train(
        b,
        &mut ck,
        data,
        &config,
        &run,
        args.resume,
        retriever,
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
    /// greedy, beam:W, beam:W:N, sample:N or sample:N:t=..,k=..,p=..,seed=..
    #[arg(long, default_value = "greedy", value_parser = Decoding::parse)]
    pub decode: Decoding,
    /// Stop captions after this many words (default: the model's maximum).
    #[arg(long)]
    pub max_words: Option<usize>,
    /// Where to write the COCO-format results (default: beside the checkpoint).
    #[arg(long)]
    pub results: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn parse_split(s: &str) -> Result<Split> {
    Split::parse(s).with_context(|| format!("{s:?} is not a split; use train, val or test"))
}

pub fn eval<B: Backend>(b: &B, args: &EvalArgs) -> Result<()> {
    let (data, mut retriever) = caption_data(b, &args.data, &args.features)?;
    let ck = Checkpoint::load(b, &args.checkpoint, 1)?;
    let items = data.items(args.split);
    if items.is_empty() {
        bail!(
            "{}: the {} split is empty",
            data.data.name,
            args.split.name()
        );
    }
    let captions = train::caption_items(b, &ck, &data, &items, &args.decode, args.max_words)?;
    let results: Vec<serde_json::Value> = items
        .iter()
        .zip(&captions)
        .flat_map(|(&i, caps)| {
            let id = &data.data.items[i].id;
            caps.iter()
                .map(move |c| serde_json::json!({"image_id": id, "caption": c}))
        })
        .collect();
    let path = args.results.clone().unwrap_or_else(|| {
        args.checkpoint
            .with_file_name(format!("results-{}.json", args.split.name()))
    });
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

/// Scores a results file against the split's references, exactly as
/// pycocoevalcap does (its tokenizer, BLEU, CIDEr-D, ROUGE-L).
pub fn score(args: &ScoreArgs) -> Result<()> {
    let data = args.data.load()?;
    let by_id: HashMap<&str, &Item> = data.split(args.split).map(|i| (i.id.as_str(), i)).collect();
    let text = std::fs::read_to_string(&args.results)
        .with_context(|| format!("{}: cannot read the results", args.results.display()))?;
    let results: Vec<serde_json::Value> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a JSON list of {{\"image_id\", \"caption\"}}",
            args.results.display()
        )
    })?;
    let (mut candidates, mut references) = (Vec::new(), Vec::new());
    let mut seen = std::collections::HashSet::new();
    for (k, r) in results.iter().enumerate() {
        let id = match &r["image_id"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => bail!("{}: entry {k} has no image_id", args.results.display()),
        };
        let Some(caption) = r["caption"].as_str() else {
            bail!(
                "{}: entry {k} (image {id}) has no caption string",
                args.results.display()
            );
        };
        let Some(item) = by_id.get(id.as_str()) else {
            bail!(
                "{}: entry {k}: image {id} is not in the {} split of {}",
                args.results.display(),
                args.split.name(),
                data.name
            );
        };
        if !seen.insert(id.clone()) {
            bail!(
                "{}: entry {k}: image {id} appears twice; give one caption per image",
                args.results.display()
            );
        }
        candidates.push(ptb_tokenize(caption));
        references.push(
            item.captions
                .iter()
                .map(|c| c.tokens.clone())
                .collect::<Vec<_>>(),
        );
    }
    let scores = coco_scores(&candidates, &references);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&scores)?);
    } else {
        println!(
            "{} images of {} {}",
            candidates.len(),
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
    /// The retriever whose image tower embeds the images (the captioner was trained on its features).
    #[arg(long, default_value = SHAPES_RETRIEVER)]
    pub retriever: PathBuf,
    #[arg(long, default_value = "greedy", value_parser = Decoding::parse)]
    pub decode: Decoding,
    /// Stop captions after this many words (default: the model's maximum).
    #[arg(long)]
    pub max_words: Option<usize>,
    /// Image files.
    #[arg(required = true)]
    pub images: Vec<PathBuf>,
}

pub fn caption<B: Backend>(b: &B, args: &CaptionArgs) -> Result<()> {
    let mut retriever = RetrieverCheckpoint::load(b, &args.retriever, 128)?;
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
    let images = images::load(&mut data, retriever.model.config.image_size)?;
    if !data.report.is_clean() {
        eprintln!("{}", data.report);
    }
    let all: Vec<usize> = (0..data.items.len()).collect();
    let features = embed_images(b, &mut retriever.model, &images, &all)?;
    let ck = Checkpoint::load(b, &args.checkpoint, 1)?;
    let mut model = ck.with_batch(b, args.decode.rows_per_image().max(8))?;
    for g in generate(b, &mut model, &features, &args.decode, args.max_words)? {
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
    let (data, _) = caption_data(b, &args.data, &args.features)?;
    let Some(i) = data.data.items.iter().position(|it| it.id == args.image) else {
        bail!("{}: no image with id {:?}", data.data.name, args.image);
    };
    let ck = Checkpoint::load(b, &args.checkpoint, 1)?;
    let ids = ck
        .vocab
        .encode(&ptb_tokenize(&args.caption), ck.model.config.max_len);
    let mut model = ck.with_batch(b, 1)?;
    let scores = score_caption(b, &mut model, &ck.vocab, &data.features_of(&[i]), &ids)?;
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
