//! A training run's configuration, read from TOML: the network's shape
//! (`[model]`) and the training settings (`[train]`). Presets live in
//! `assets/presets/`; `captune train --config FILE` reads any other file
//! of the same form.

use super::objective::Objective;
use super::objectives;
use super::objectives::settings::Settings;
use super::{CaptionerConfig, DecoderFamily, ImageFeed, LstmConfig, LstmModel, MapperTransformer};
use crate::backend::Backend;
use crate::model::hf::HfFolder;
use crate::model::layers::Activation;
use crate::model::transformer::TransformerConfig;
use crate::progress::Progress;
use crate::source::embeddings::{CaptionData, FeatureSource};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub prefix_len: usize,
    pub mapper_hidden: usize,
    /// "gelu" (the default), ClipCap's "tanh" (its MLP) or "relu" (its
    /// transformer mapper's blocks). A GPT-2 decoder takes ClipCap's.
    #[serde(default, skip_serializing_if = "is_gelu")]
    pub mapper_activation: Activation,
    /// ClipCap's transformer mapper (`[model.mapper_transformer]`:
    /// clip_len, layers, heads) instead of the MLP; mapper_hidden is then
    /// its blocks' MLP width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapper_transformer: Option<MapperTransformer>,
    pub width: usize,
    pub layers: usize,
    pub heads: usize,
    /// Caption positions, <bos> and <eos> included.
    pub max_len: usize,
    /// Another decoder than the prefix transformer: a pretrained one,
    /// `hf:FOLDER` (a Hugging Face GPT-2 or BLIP folder), which replaces
    /// width, layers and heads, and its tokenizer the word vocabulary;
    /// ClipCap's own checkpoint, `clipcap:FILE` (with `gpt2`), which also
    /// replaces the prefix; BLIP's own, `blip:FILE` (with `blip_config`);
    /// or an LSTM, `lstm:fc`, `width` wide with `layers` layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder: Option<String>,
    /// The Hugging Face GPT-2 folder whose config.json and tokenizer.json
    /// a `clipcap:FILE` decoder was trained with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpt2: Option<PathBuf>,
    /// The Hugging Face BLIP folder of a `blip:FILE` decoder's sizes, whose
    /// config, tokenizer and image processor it is read with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blip_config: Option<PathBuf>,
    /// Where an LSTM decoder takes the image: "hidden" (its initial
    /// hidden state, the default) or "input" (a step before the start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_feed: Option<ImageFeed>,
    /// The vision tower whose image tokens an attention LSTM reads,
    /// `hf:FOLDER` (a Hugging Face BLIP or CLIP folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_tokens: Option<String>,
    /// Text a BLIP decoder is fed after the start of every caption, never
    /// predicted (BLIP's captioning checkpoints: "a picture of").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Train a BLIP decoder's vision tower with it (the SMILE paper's
    /// fine-tuning): each batch's images go through the tower, whose
    /// weights become the captioner's; by default the tower is frozen and
    /// its tokens are computed once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub train_vision: bool,
}

impl ModelSection {
    /// The folder of a pretrained decoder, when there is one.
    pub fn decoder_folder(&self) -> Result<Option<PathBuf>> {
        let Some(spec) = &self.decoder else {
            return Ok(None);
        };
        if self.lstm()?.is_some() || self.clipcap()?.is_some() {
            return Ok(None);
        }
        if let Some(file) = spec.strip_prefix("blip:").filter(|f| !f.is_empty()) {
            let Some(config) = &self.blip_config else {
                bail!(
                    "decoder blip:{file} needs a Hugging Face BLIP folder of its sizes, for the \
                     config, tokenizer and image processor: --blip-config FOLDER ([model] \
                     blip_config)"
                );
            };
            let converted = crate::model::blip_original::converted_folder(Path::new(file), config)?;
            return Ok(Some(converted));
        }
        match spec.strip_prefix("hf:") {
            Some(dir) if !dir.is_empty() => Ok(Some(PathBuf::from(dir))),
            _ => bail!(
                "decoder {spec:?}: name a Hugging Face GPT-2 or BLIP folder as hf:PATH \
                 (config.json, model.safetensors and tokenizer.json in it), ClipCap's own \
                 checkpoint as clipcap:FILE.pt, BLIP's own as blip:FILE.pth, or an LSTM as \
                 lstm:fc"
            ),
        }
    }

    /// ClipCap's own checkpoint that `decoder = "clipcap:FILE"` names, and
    /// the GPT-2 folder (`gpt2`) it was trained with.
    pub fn clipcap(&self) -> Result<Option<(PathBuf, PathBuf)>> {
        let file = self
            .decoder
            .as_deref()
            .and_then(|d| d.strip_prefix("clipcap:"));
        match (file, &self.gpt2) {
            (None, None) => Ok(None),
            (None, Some(_)) => bail!(
                "gpt2 names the GPT-2 folder of ClipCap's own checkpoint (decoder = \
                 \"clipcap:FILE\"); this decoder is not one"
            ),
            (Some(""), _) => bail!("decoder clipcap: name ClipCap's checkpoint as clipcap:FILE.pt"),
            (Some(file), None) => bail!(
                "decoder clipcap:{file} needs the Hugging Face GPT-2 folder it was trained with, \
                 for its config.json and tokenizer.json: --gpt2 FOLDER ([model] gpt2)"
            ),
            (Some(file), Some(dir)) => Ok(Some((PathBuf::from(file), dir.clone()))),
        }
    }

    /// The LSTM decoder `decoder = "lstm:MODEL"` names, when it names one.
    pub fn lstm(&self) -> Result<Option<LstmConfig>> {
        let model = match self
            .decoder
            .as_deref()
            .and_then(|d| d.strip_prefix("lstm:"))
        {
            Some("fc") => LstmModel::Fc,
            Some("att2in") => LstmModel::Att2in,
            Some("updown") => LstmModel::UpDown,
            Some(other) => {
                bail!(
                    "decoder lstm:{other}: the LSTM models are lstm:fc, lstm:att2in and lstm:updown"
                )
            }
            None if self.image_feed.is_some() => {
                bail!("image_feed is an LSTM decoder's setting; this decoder is not one (lstm:fc)")
            }
            None if self.image_tokens.is_some() => bail!(
                "image_tokens names the vision tower whose tokens an attention LSTM reads \
                 (lstm:att2in, lstm:updown); this decoder is not one"
            ),
            None => return Ok(None),
        };
        if model.reads_tokens() {
            if self.image_feed.is_some() {
                bail!(
                    "image_feed is the FC model's setting; an attention LSTM reads the image by \
                     attending"
                );
            }
            if self.layers != 1 {
                bail!(
                    "an attention LSTM has its own cells: layers must be 1, not {}",
                    self.layers
                );
            }
        } else if self.image_tokens.is_some() {
            bail!(
                "image_tokens names the vision tower whose tokens an attention LSTM reads; \
                 lstm:fc reads one image embedding"
            );
        }
        Ok(Some(LstmConfig::new(
            model,
            self.image_feed.unwrap_or_default(),
        )))
    }

    /// The folder whose vision tower gives the image tokens the decoder
    /// reads, when it reads tokens: a BLIP decoder's own folder, or
    /// an attention LSTM's `image_tokens`.
    pub fn token_folder(&self) -> Result<Option<PathBuf>> {
        if let Some(spec) = &self.image_tokens {
            return match spec.strip_prefix("hf:") {
                Some(dir) if !dir.is_empty() => Ok(Some(PathBuf::from(dir))),
                _ => bail!(
                    "image_tokens {spec:?}: name a Hugging Face BLIP or CLIP folder as hf:PATH"
                ),
            };
        }
        self.blip_folder()
    }

    /// Gives a new run's data the image inputs its decoder reads beside
    /// the embeddings: the tokens of the vision tower named by
    /// [`ModelSection::token_folder`], computed once and cached, or, for a
    /// tower trained with the decoder, its folder's pixels.
    pub fn attach_image_inputs<B: Backend>(
        &self,
        b: &B,
        data: &mut CaptionData,
        progress: &Progress,
    ) -> Result<()> {
        if data.reads_more_than_embeddings() {
            return Ok(());
        }
        match self.token_folder()? {
            Some(dir) if self.train_vision => data.attach_pixels(&dir),
            Some(dir) => data.attach_image_tokens(b, &dir, progress),
            None => Ok(()),
        }
    }

    /// The folder of a pretrained decoder that is BLIP's, when it is one.
    pub fn blip_folder(&self) -> Result<Option<PathBuf>> {
        match self.decoder_folder()? {
            Some(dir) if HfFolder::open(&dir)?.model_type()? == "blip" => Ok(Some(dir)),
            _ => Ok(None),
        }
    }

    /// Takes the network's shape from the captioner the run trains (a
    /// pretrained decoder's, or a checkpoint's it started from), so that
    /// the run's config says it.
    pub fn take_shape(&mut self, c: &CaptionerConfig) {
        self.prefix_len = c.prefix_len;
        self.mapper_hidden = c.mapper_hidden;
        self.max_len = c.max_len;
        self.mapper_activation = c.mapper_activation;
        self.mapper_transformer = c.mapper_transformer;
        self.width = c.decoder.width;
        self.layers = c.decoder.layers;
        self.heads = c.decoder.heads;
        self.train_vision = c.vision.is_some();
    }
}

/// Unknown keys are refused by `RunConfig::check`: they would land in
/// `settings` (serde cannot deny them beside a flattened map).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainSection {
    /// The objective's name (`captune train --help` lists them).
    pub objective: String,
    /// Passes over the training images, one random reference each.
    pub epochs: usize,
    pub batch: usize,
    pub lr: f32,
    pub warmup: usize,
    pub weight_decay: f32,
    /// A word enters the vocabulary when the training captions use it this often.
    pub min_count: usize,
    /// Read the losses back and write a log line every this many steps.
    pub log_every: usize,
    /// Validation images whose captions (with per-token losses) are logged each epoch.
    pub sample_images: usize,
    /// Validation images scored each epoch (0: none).
    pub eval_images: usize,
    pub seed: u64,
    /// The fraction of the training images whose captions training may
    /// read (Jin, 2023, self-supervised captioning with CLIP; `captioner::labelled`).
    #[serde(default = "all_labelled")]
    pub labelled: f64,
    /// Stop when the captions collapse (`captioner::collapse`), keeping
    /// the last good checkpoint; false only warns.
    #[serde(default = "stops_on_collapse")]
    pub collapse_stop: bool,
    /// Train the mapper only: the decoder's weights stay as they are,
    /// while gradients still flow through it to the prefix (ClipCap's
    /// prefix-only mode, for a pretrained language model).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub freeze_decoder: bool,
    /// The objectives' settings (`first_token`, `mle_weight`, ...), each
    /// declared by the objectives that take it.
    #[serde(flatten)]
    pub settings: Settings,
}

fn is_gelu(a: &Activation) -> bool {
    *a == Activation::Gelu
}

fn all_labelled() -> f64 {
    1.0
}

fn stops_on_collapse() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelSection,
    pub train: TrainSection,
    /// Where the run's image embeddings came from (written by training;
    /// `eval`, `inspect` and `app --follow` default to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<FeatureSource>,
}

pub const PRESETS: [(&str, &str); 5] = [
    ("tiny", include_str!("../../assets/presets/tiny.toml")),
    ("shapes", include_str!("../../assets/presets/shapes.toml")),
    (
        "shapes-lstm",
        include_str!("../../assets/presets/shapes-lstm.toml"),
    ),
    (
        "flickr8k",
        include_str!("../../assets/presets/flickr8k.toml"),
    ),
    (
        "flickr8k-lstm",
        include_str!("../../assets/presets/flickr8k-lstm.toml"),
    ),
];

impl RunConfig {
    pub fn preset(name: &str) -> Result<RunConfig> {
        let Some((_, text)) = PRESETS.iter().find(|(n, _)| *n == name) else {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
            bail!("no preset {name:?}; the presets are {}", names.join(", "));
        };
        RunConfig::parse(text, &format!("preset {name}"))
    }

    pub fn load(path: &Path) -> Result<RunConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read the run config", path.display()))?;
        RunConfig::parse(&text, &path.display().to_string())
    }

    /// `origin` names the file in errors (toml's messages give line and column).
    pub fn parse(text: &str, origin: &str) -> Result<RunConfig> {
        let config: RunConfig = toml::from_str(text).map_err(|e| {
            anyhow::anyhow!("{origin}: {e}; see assets/presets/shapes.toml for every field")
        })?;
        config.check(origin)?;
        Ok(config)
    }

    fn check(&self, origin: &str) -> Result<()> {
        let t = &self.train;
        self.model
            .decoder_folder()
            .and(self.model.clipcap())
            .and(self.model.lstm())
            .map_err(|e| anyhow::anyhow!("{origin}: [model] {e}"))?;
        let blip_file = (self.model.decoder.as_deref()).is_some_and(|d| d.starts_with("blip:"));
        if self.model.blip_config.is_some() && !blip_file {
            bail!(
                "{origin}: [model] blip_config is the BLIP folder of BLIP's own checkpoint \
                 (decoder = \"blip:FILE\"); this decoder is not one"
            );
        }
        if self.model.train_vision && t.freeze_decoder {
            bail!(
                "{origin}: [model] train_vision trains the vision tower, [train] freeze_decoder \
                 the cross-attention only: choose one"
            );
        }
        if t.batch == 0 || t.epochs == 0 {
            bail!("{origin}: [train] batch and epochs must be positive");
        }
        objectives::find(&t.objective).map_err(|e| anyhow::anyhow!("{origin}: [train] {e}"))?;
        objectives::check_settings(&t.settings, &format!("{origin}: [train]"))?;
        if t.lr.is_nan() || t.lr <= 0.0 {
            bail!("{origin}: [train] lr must be positive");
        }
        if !(t.labelled > 0.0 && t.labelled <= 1.0) {
            bail!(
                "{origin}: [train] labelled is {}; it is the fraction of training images whose \
                 captions are used, above 0 and at most 1",
                t.labelled
            );
        }
        Ok(())
    }

    /// Sets the peak learning rate of a run: `given` (`--lr`) when there
    /// is one; else, when the run fine-tunes a trained captioner
    /// (`fine_tuning` says how: from a checkpoint, or by a switch of
    /// objective), the objective's fine-tuning rate when it declares one;
    /// else the config's (read from `origin`). Returns what the run prints:
    /// the rate and why.
    pub fn choose_lr(
        &mut self,
        given: Option<f32>,
        fine_tuning: Option<&str>,
        origin: &str,
    ) -> String {
        let t = &mut self.train;
        if let Some(lr) = given {
            t.lr = lr;
            return format!("learning rate {lr:e} (--lr)");
        }
        let configured = t.lr;
        let lr = objectives::default_lr(&t.objective, fine_tuning.is_some(), configured);
        match fine_tuning {
            Some(how) if lr != configured => {
                t.lr = lr;
                format!(
                    "learning rate {lr:e}: {}'s fine-tuning rate, for {how} without --lr ({origin} \
                     says {configured:e}, a rate for training from scratch); --lr sets another",
                    t.objective
                )
            }
            _ => format!("learning rate {lr:e} (from {origin})"),
        }
    }

    /// The configured objective, for a vocabulary of `vocab` ids.
    pub fn objective<B: Backend>(&self, vocab: usize) -> Result<Box<dyn Objective<B>>> {
        objectives::build(&self.train.objective, &self.train.settings, vocab)
    }

    /// The network for image embeddings of `embed_dim` and `vocab_size` ids.
    /// An LSTM decoder (checked by `parse`) has no mapper, and no heads.
    pub fn captioner(&self, embed_dim: usize, vocab_size: usize) -> CaptionerConfig {
        let m = &self.model;
        let lstm = m.lstm().ok().flatten();
        let (prefix_len, mapper_hidden, heads) = match lstm {
            Some(_) => (0, 0, 1),
            None => (m.prefix_len, m.mapper_hidden, m.heads),
        };
        CaptionerConfig {
            family: match lstm {
                Some(_) => DecoderFamily::Lstm,
                None => DecoderFamily::Prefix,
            },
            image_tokens: 0,
            embed_dim,
            prefix_len,
            mapper_hidden,
            mapper_activation: m.mapper_activation,
            mapper_transformer: m.mapper_transformer.filter(|_| lstm.is_none()),
            decoder: TransformerConfig::new(m.width, m.layers, heads, true),
            lstm,
            vision: None,
            prompt: Default::default(),
            max_len: m.max_len,
            vocab_size,
            prefix_predicts_first: false,
            raw_embeddings: false,
            specials: super::SpecialIds::WORDS,
        }
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a run config serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_bad_fields_are_named() {
        for (name, _) in PRESETS {
            let c = RunConfig::preset(name).unwrap();
            assert_eq!(RunConfig::parse(&c.to_toml(), "round trip").unwrap(), c);
        }
        let text =
            include_str!("../../assets/presets/tiny.toml").replace("heads = 2", "heads = \"two\"");
        let err = RunConfig::parse(&text, "my.toml").unwrap_err().to_string();
        assert!(
            err.contains("my.toml") && err.contains("heads") && err.contains("line"),
            "{err}"
        );
        let text = include_str!("../../assets/presets/tiny.toml")
            .replace("mle_weight = 0.0", "mle_weight = 2.0");
        let err = RunConfig::parse(&text, "my.toml").unwrap_err().to_string();
        assert!(
            err.contains("my.toml") && err.contains("mle_weight: 2 is outside [0, 1]"),
            "{err}"
        );
        // A misspelt key is named, with the keys [train] takes.
        let text = include_str!("../../assets/presets/tiny.toml")
            .replace("mle_weight = 0.0", "mle_wieght = 0.5");
        let err = RunConfig::parse(&text, "my.toml").unwrap_err().to_string();
        assert!(
            err.contains("unknown key \"mle_wieght\"") && err.contains("first_token, mle_weight"),
            "{err}"
        );
        let text = include_str!("../../assets/presets/tiny.toml")
            .replace("objective = \"mle\"", "objective = \"smiel\"");
        let err = RunConfig::parse(&text, "my.toml").unwrap_err().to_string();
        assert!(
            err.contains("no objective \"smiel\"") && err.contains("smile-random"),
            "{err}"
        );
    }
}
