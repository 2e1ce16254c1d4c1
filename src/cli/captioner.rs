//! What the captioner's commands share besides their data
//! (`captune::source`): decoding options, loading a checkpoint with its
//! record, the fluency metric, METEOR's data, printing metrics.

use anyhow::{Context, Result};
use captune::backend::Backend;
use captune::captioner::decode::{DecodeOptions, Decoding};
use captune::captioner::{Checkpoint, pretrained};
use captune::data::Split;
use captune::metrics::fluency::Perplexity;
use captune::metrics::meteor::{HOW_TO_GET, Meteor, MeteorData};
use captune::model::gpt2_lm::Gpt2Lm;
use captune::model::hf::HfFolder;
use captune::source::embeddings::{CaptionData, FeatureSource};
use std::path::{Path, PathBuf};

/// How captions are decoded, for `eval` and `caption`.
#[derive(clap::Args)]
pub struct DecodeArgs {
    /// greedy, beam:W, beam:W:N, sample:N or sample:N:t=..,k=..,p=..,seed=..
    #[arg(long, default_value = "greedy", value_parser = Decoding::parse)]
    pub decode: Decoding,
    /// Stop captions after this many words (default: the model's maximum).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_words: Option<u32>,
    /// Never emit <unk>: the decoder chooses among the other words.
    #[arg(long)]
    pub suppress_unk: bool,
}

/// `--fluency hf:FOLDER`, for `eval` and `score`.
#[derive(clap::Args)]
pub struct FluencyArgs {
    /// A Hugging Face GPT-2 folder (config.json, model.safetensors,
    /// tokenizer.json): also report the captions' perplexity under it, the
    /// fluency of Yue et al. (2023).
    #[arg(long, value_name = "hf:FOLDER")]
    pub fluency: Option<String>,
}

impl FluencyArgs {
    /// The perplexity of every caption under the GPT-2, if one is named.
    pub fn perplexity<B: Backend>(&self, b: &B, captions: &[String]) -> Result<Option<Perplexity>> {
        let Some(spec) = &self.fluency else {
            return Ok(None);
        };
        // As --decoder names a folder; a plain path is taken too.
        let dir = Path::new(spec.strip_prefix("hf:").unwrap_or(spec));
        let lm = Gpt2Lm::load(b, dir).with_context(|| format!("--fluency {spec}"))?;
        eprintln!(
            "scoring {} captions' fluency under the GPT-2 in {}",
            captions.len(),
            dir.display()
        );
        lm.perplexity(b, captions)
    }
}

/// What `--meteor` takes to leave METEOR out.
const OFF: &str = "none";

/// `--meteor DIR`, for `eval`, `score` and `train`.
#[derive(clap::Args)]
pub struct MeteorArgs {
    /// METEOR 1.5's data: a folder with meteor-1.5.jar and
    /// data/paraphrase-en.gz (pycocoevalcap's `meteor` folder is one, and
    /// is found by itself when pycocoevalcap is installed); `none` leaves
    /// METEOR out. No Java is needed.
    #[arg(long, env = "CAPTUNE_METEOR", value_name = "DIR")]
    pub meteor: Option<String>,
}

impl MeteorArgs {
    pub fn off() -> MeteorArgs {
        MeteorArgs {
            meteor: Some(OFF.to_string()),
        }
    }

    /// The METEOR scorer, or None where METEOR is turned off or, not
    /// asked for by a folder, its data is not found (a note says how to
    /// get it). A folder given without the data is an error.
    pub fn scorer(&self) -> Result<Option<Meteor>> {
        self.data()?.map(|data| Meteor::load(&data)).transpose()
    }

    /// Where METEOR's data is, as [`MeteorArgs::scorer`] finds it (with
    /// its note), without reading it.
    pub fn data(&self) -> Result<Option<MeteorData>> {
        Ok(Some(match self.meteor.as_deref() {
            Some(OFF) => return Ok(None),
            Some(dir) => MeteorData::at(Path::new(dir))
                .context("--meteor (or CAPTUNE_METEOR) names no METEOR data")?,
            None => match MeteorData::installed() {
                Ok(Some(data)) => data,
                found => {
                    let why = match found {
                        Err(e) => format!("{e:#}"),
                        _ => "its data was not found".to_string(),
                    };
                    eprintln!(
                        "note: no METEOR: {why}; to have it, {HOW_TO_GET} (--meteor none \
                         leaves this note out)"
                    );
                    return Ok(None);
                }
            },
        }))
    }
}

impl DecodeArgs {
    pub fn options(&self, progress: &indicatif::ProgressBar) -> DecodeOptions {
        DecodeOptions {
            max_words: self.max_words.map(|w| w as usize),
            suppress_unk: self.suppress_unk,
            progress: Some(progress.clone()),
            first_image: 0,
        }
    }
}

pub fn parse_split(s: &str) -> Result<Split> {
    Split::parse(s).with_context(|| format!("{s:?} is not a split; use train, val or test"))
}

/// A captioner checkpoint with what it was trained on.
pub struct Captioner<B: Backend> {
    pub ck: Checkpoint<B>,
    pub trained_on: Option<FeatureSource>,
}

/// The BLIP folder `hf:FOLDER` names as a checkpoint, when it names one
/// (another `hf:` folder is an export, which [`Captioner::load`] reads).
pub fn blip_checkpoint_folder(checkpoint: &Path) -> Result<Option<PathBuf>> {
    let Some(dir) = checkpoint.to_str().and_then(|s| s.strip_prefix("hf:")) else {
        return Ok(None);
    };
    let dir = PathBuf::from(dir);
    let is_blip = HfFolder::open(&dir)?.model_type()? == "blip";
    Ok(is_blip.then_some(dir))
}

impl<B: Backend> Captioner<B> {
    /// A checkpoint file, or `hf:DIR`: a captioner `captune export` or
    /// `captune convert` wrote, which records no features.
    pub fn load(b: &B, path: &Path) -> Result<Self> {
        if let Some(dir) = path.to_str().and_then(|s| s.strip_prefix("hf:")) {
            return Ok(Captioner {
                ck: pretrained::from_export(b, Path::new(dir))?,
                trained_on: None,
            });
        }
        Ok(Captioner {
            ck: Checkpoint::load(b, path)?,
            trained_on: captune::captioner::trained_on(path)?,
        })
    }

    /// Refuses embeddings of another size than the model reads.
    pub fn check_dim(&self, path: &Path, data: &CaptionData) -> Result<()> {
        let what = path.display().to_string();
        self.ck.model.config.check_inputs(data, &what)
    }
}

/// A results entry's `image_id`: a number where the data set's id is one
/// (COCO and Karpathy ids are), as pycocotools' `loadRes` expects.
pub fn result_id(id: &str) -> serde_json::Value {
    match id.parse::<u64>() {
        Ok(n) if n.to_string() == id => serde_json::Value::from(n),
        _ => serde_json::Value::from(id),
    }
}

pub fn print_metrics(m: &impl serde::Serialize) -> Result<()> {
    let value = serde_json::to_value(m)?;
    for (k, v) in value.as_object().expect("metrics are an object") {
        if !v.is_null() {
            println!("{k:>20} {v}");
        }
    }
    Ok(())
}
