//! The captioner (ClipCap-style): a mapper from a frozen image embedding
//! to `prefix_len` prefix vectors, then a causal pre-LN decoder over
//! `[prefix ; <bos> caption]` with learned positions and an output layer
//! tied to the token embedding. Its configuration, vocabulary and
//! checkpoints live here; the network in `model`, the training objectives
//! in `objectives`, caption generation in `decode`.

pub mod bench;
pub mod blip;
pub mod clipcap;
pub mod collapse;
pub mod corpus;
pub mod decode;
pub mod decoder;
pub mod decoders;
mod epoch_plan;
pub mod evaluate;
pub mod explain;
pub mod export;
pub mod inputs;
pub mod inspect;
pub mod labelled;
pub mod listener;
pub mod mle_mix;
pub mod model;
pub mod objective;
pub mod objectives;
pub mod pretrained;
pub mod prompt;
pub mod records;
pub mod reward;
pub mod run;
pub mod run_folder;
pub mod self_critical;
pub mod train;
pub mod vocab;
pub mod word_marks;

pub use prompt::Prompt;
pub use vocab::CaptionVocab;

use crate::backend::{Backend, CellGates};
use crate::cpu::CpuBackend;
use crate::data::vocab::{BOS, EOS, PAD};
use crate::model::checkpoint;
use crate::model::layers::Activation;
use crate::model::params::Params;
use crate::model::transformer::TransformerConfig;
use crate::model::vision::VisionConfig;
use crate::source::embeddings::{CaptionData, EmbeddingReading, FeatureSource};
use anyhow::{Result, bail};
use model::Captioner;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The ids a captioner gives its special roles. A caption is `start`,
/// its tokens, then `end`; `pad` fills a batch's positions after a
/// caption's end and marks targets that count for nothing, so it must be
/// an id no caption contains (never `end`). A vocabulary may use one id
/// as both start and end (GPT-2's `<|endoftext|>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialIds {
    pub start: u32,
    pub end: u32,
    pub pad: u32,
}

impl SpecialIds {
    /// A word vocabulary's: `<bos>`, `<eos>`, `<pad>`.
    pub const WORDS: SpecialIds = SpecialIds {
        start: BOS,
        end: EOS,
        pad: PAD,
    };

    /// The ids outside the policy, which no caption contains: padding,
    /// and the start unless it is also the end (the second entry repeats
    /// the first then).
    pub fn masked(&self) -> [u32; 2] {
        let start = if self.start == self.end {
            self.pad
        } else {
            self.start
        };
        [self.pad, start]
    }

    pub fn is_masked(&self, id: u32) -> bool {
        self.masked().contains(&id)
    }

    /// The ids of [`SpecialIds::masked`], each once, ascending.
    pub fn masked_distinct(&self) -> Vec<u32> {
        let mut ids = self.masked().to_vec();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

fn word_specials() -> SpecialIds {
    SpecialIds::WORDS
}

/// ClipCap's transformer mapper (Mokady et al., 2021), its variant for a
/// frozen language model: a linear layer turns the image embedding into
/// `clip_len` vectors, the `prefix_len` learned constants follow them, and
/// a non-causal transformer at the decoder's width reads all of them; its
/// outputs at the constants are the prefix. Its blocks are ClipCap's: an
/// MLP `mapper_hidden` wide with `mapper_activation` (ClipCap: twice the
/// width, ReLU), q, k and v without biases, and no final layer norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapperTransformer {
    pub clip_len: usize,
    pub layers: usize,
    pub heads: usize,
}

impl MapperTransformer {
    /// ClipCap's: 10 vectors, 8 blocks of 8 heads.
    pub const CLIPCAP: MapperTransformer = MapperTransformer {
        clip_len: 10,
        layers: 8,
        heads: 8,
    };

    /// The transformer of a captioner `c` with this mapper.
    pub fn blocks(&self, c: &CaptionerConfig) -> TransformerConfig {
        TransformerConfig {
            mlp_width: Some(c.mapper_hidden),
            activation: c.mapper_activation,
            qkv_bias: false,
            final_norm: false,
            ..TransformerConfig::new(c.decoder.width, self.layers, self.heads, false)
        }
    }
}

/// A captioner's decoder family ([`decoder::Decoder`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecoderFamily {
    /// A mapper's prefix from one image embedding, then a causal pre-LN
    /// transformer: captune's own decoder, and GPT-2 read as ClipCap.
    #[default]
    Prefix,
    /// BLIP's text decoder (Li et al., 2022): a causal post-LN BERT whose
    /// every block cross-attends to image tokens, with BERT's prediction
    /// head.
    Blip,
    /// A recurrent decoder ([`LstmConfig`]): the sequence-level
    /// exploration paper's and self-critical training's LSTM captioners.
    Lstm,
}

/// An LSTM decoder's model. Its hidden size (also the word embedding's
/// width) is the config's `decoder.width`, its stacked layers
/// `decoder.layers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LstmConfig {
    pub model: LstmModel,
    /// How the FC model's projected image embedding enters the LSTM (the
    /// attention models start from zero states and read the image by
    /// attending).
    #[serde(default)]
    pub image_feed: ImageFeed,
    /// The papers' model, or the model as self-critical.pytorch's code
    /// computes it (what `captune convert --self-critical` writes).
    #[serde(default, skip_serializing_if = "LstmVariant::is_papers")]
    pub variant: LstmVariant,
}

impl LstmConfig {
    /// The papers' `model`, fed the image `image_feed`'s way.
    pub fn new(model: LstmModel, image_feed: ImageFeed) -> Self {
        LstmConfig {
            model,
            image_feed,
            variant: LstmVariant::Papers,
        }
    }

    /// The cell's gates: self-critical's FC and Att2in2 models have its
    /// maxout cell, every other one PyTorch's.
    pub fn cell(&self) -> CellGates {
        match (self.variant, self.model) {
            (LstmVariant::SelfCritical, LstmModel::Fc | LstmModel::Att2in) => CellGates::Maxout,
            _ => CellGates::Lstm,
        }
    }

    /// A ReLU after the word embedding (self-critical's attention models).
    pub fn word_relu(&self) -> bool {
        self.variant == LstmVariant::SelfCritical && self.model.reads_tokens()
    }
}

/// Whose version of an LSTM model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LstmVariant {
    /// As the papers and docs/lstm.md state it.
    #[default]
    Papers,
    /// As self-critical.pytorch computes it: its FC model's maxout cell;
    /// its Att2in2's maxout cell with the context in both candidates and
    /// a ReLU after the word embedding; its top-down model's ReLU after
    /// the word embedding and v̄ = ReLU(`fc_embed`(the tokens' mean)).
    SelfCritical,
}

impl LstmVariant {
    fn is_papers(&self) -> bool {
        *self == LstmVariant::Papers
    }
}

/// The LSTM captioners.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LstmModel {
    /// Show and tell (Vinyals et al., 2015) as the sequence-level
    /// exploration paper (Chen and Jin, 2020) and self-critical training's
    /// FC model (Rennie et al., 2017) use it: a linear layer projects the
    /// image embedding to the hidden size, then words through an LSTM
    /// and an untied output layer.
    Fc,
    /// Att2in (Rennie et al., 2017): one LSTM whose previous state queries
    /// additive attention over image tokens, the context entering only
    /// the cell's input (the g gate).
    Att2in,
    /// Top-down attention (Anderson et al., 2018): an attention LSTM
    /// whose state queries additive attention over image tokens, and a
    /// language LSTM that reads the attended context.
    #[serde(rename = "updown")]
    UpDown,
}

impl LstmModel {
    /// Whether the model reads image tokens, not one embedding.
    pub fn reads_tokens(&self) -> bool {
        *self != LstmModel::Fc
    }
}

/// Where an LSTM's projected image embedding enters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ImageFeed {
    /// As every layer's hidden state before the first word (the
    /// sequence-level exploration paper's decoder).
    #[default]
    Hidden,
    /// As the input of a step before the start token, from zero states
    /// (self-critical training's FC model and show and tell).
    Input,
}

impl DecoderFamily {
    pub fn is_prefix(&self) -> bool {
        *self == DecoderFamily::Prefix
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The network's shape. `embed_dim` and `vocab_size` come from the data
/// (the features file and the vocabulary) when a run starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptionerConfig {
    /// The decoder family; checkpoints from before this field hold a
    /// prefix decoder.
    #[serde(default, skip_serializing_if = "DecoderFamily::is_prefix")]
    pub family: DecoderFamily,
    /// Size of the image embedding the mapper reads, or of each image
    /// token a cross-attending decoder reads.
    pub embed_dim: usize,
    /// Image tokens per image a decoder that reads tokens takes (BLIP's
    /// and the attention LSTMs'; BLIP-base at 384 pixels: 577); 0 for one
    /// that reads one embedding.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub image_tokens: usize,
    /// Number of prefix vectors k.
    pub prefix_len: usize,
    /// Hidden size of the mapper's MLP (the MLP mapper's, or each block's
    /// of a transformer mapper).
    pub mapper_hidden: usize,
    /// Its activation; checkpoints from before this field have GELU.
    #[serde(default)]
    pub mapper_activation: Activation,
    /// ClipCap's transformer mapper; absent, the mapper is the MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapper_transformer: Option<MapperTransformer>,
    /// The transformer families' blocks; an LSTM decoder's hidden size
    /// (`width`) and layers.
    pub decoder: TransformerConfig,
    /// The vision tower a BLIP decoder trains with it (`--train-vision`):
    /// its image input is then an image's patches, not its tokens, and
    /// the tower's weights are the captioner's. None where the tokens come
    /// from a frozen tower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionConfig>,
    /// An LSTM decoder's model; none for the transformer families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lstm: Option<LstmConfig>,
    /// Ids fed after the start and before every caption, never predicted
    /// (a BLIP decoder's captioning prompt); none for a prefix decoder.
    #[serde(default, skip_serializing_if = "Prompt::is_empty")]
    pub prompt: Prompt,
    /// Caption positions, <bos> and <eos> included (as `Vocab::encode` counts).
    pub max_len: usize,
    pub vocab_size: usize,
    /// Checkpoints from before this field hold a word vocabulary's.
    #[serde(default = "word_specials")]
    pub specials: SpecialIds,
    /// ClipCap's own layout (Mokady et al.'s released checkpoints): no
    /// start token is fed; the prefix's last position predicts a
    /// caption's first token. A prefix decoder only, with prefix_len >= 2.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefix_predicts_first: bool,
    /// The image embeddings are read as their encoder gives them, not
    /// L2-normalised (ClipCap's MLP checkpoints were trained so). A
    /// decoder that reads one embedding only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub raw_embeddings: bool,
}

impl CaptionerConfig {
    /// How the decoder reads image embeddings.
    pub fn embedding_reading(&self) -> EmbeddingReading {
        if self.raw_embeddings {
            EmbeddingReading::Raw
        } else {
            EmbeddingReading::Unit
        }
    }

    /// Values of one image's input: its embedding, its tokens, or the
    /// patches of a vision tower trained with the decoder.
    pub fn image_input_len(&self) -> usize {
        match &self.vision {
            Some(v) => v.patches * v.patch_dim,
            None => self.embed_dim * self.image_tokens.max(1),
        }
    }

    /// A caption's positions fed with tokens: <bos> and the words, not
    /// <eos>.
    pub fn token_positions(&self) -> usize {
        self.max_len - 1
    }

    /// Decoder sequence length: the prefix, the start (unless the prefix
    /// predicts the first token), the prompt, then the caption's other
    /// token positions.
    pub fn seq_len(&self) -> usize {
        self.prefix_len + self.prompt.len() + self.token_positions()
            - usize::from(self.prefix_predicts_first)
    }

    /// Parameters of a captioner of this shape (see `docs/checkpoints.md`).
    pub fn parameter_count(&self) -> u128 {
        let (d, k) = (self.decoder.width as u128, self.prefix_len as u128);
        let (e, h) = (self.embed_dim as u128, self.mapper_hidden as u128);
        let adapter = match (self.family, &self.mapper_transformer) {
            (DecoderFamily::Prefix, None) => e * h + h + h * k * d + k * d,
            (DecoderFamily::Prefix, Some(t)) => {
                let clip = t.clip_len as u128 * d;
                e * clip + clip + k * d + t.blocks(self).parameter_count()
            }
            // BERT's prediction head: a dense layer, a layer norm, the
            // output bias.
            (DecoderFamily::Blip, _) => d * d + d + 2 * d + self.vocab_size as u128,
            (DecoderFamily::Lstm, _) => {
                let (l, v) = (self.decoder.layers as u128, self.vocab_size as u128);
                let lstm = self.lstm.expect("an LSTM decoder has its model");
                let output = v * d + v;
                // A row of gates: four or five chunks of d.
                let gates = lstm.cell().chunks() as u128 * d;
                // Every attention model: the tokens' embedding and keys, the
                // word table, the query and the scores.
                let attention = e * d + d + d * d + d + v * d + d * d + d + d;
                return match lstm.model {
                    // One cell, and the context into its g gate (into the
                    // maxout cell's two candidates).
                    LstmModel::Att2in => {
                        let context = (gates - 3 * d) * (d + 1);
                        attention + 2 * gates * d + 2 * gates + context + output
                    }
                    // The attention cell ([h2; v̄; word] in) and the
                    // language cell ([v̂; h1] in); self-critical's v̄ has a
                    // projection of its own.
                    LstmModel::UpDown => {
                        let cell = |inputs: u128| 4 * d * inputs + 4 * d * d + 8 * d;
                        let pooled = if lstm.variant == LstmVariant::SelfCritical {
                            e * d + d
                        } else {
                            0
                        };
                        attention + cell(3 * d) + cell(2 * d) + pooled + output
                    }
                    // The image projection, the word table, each layer's
                    // two matrices and two biases, the output layer.
                    LstmModel::Fc => e * d + d + v * d + l * (2 * gates * d + 2 * gates) + output,
                };
            }
        };
        let embeddings = (self.vocab_size as u128 + self.seq_len() as u128) * d;
        let vision = self.vision.map_or(0, |v| v.parameter_count());
        adapter + embeddings + self.decoder.parameter_count() + vision
    }

    /// Refuses data whose image inputs are not what this captioner reads
    /// (`what` names it): embeddings of another size, or no image tokens
    /// of its vision tower's shape, or no pixels of the shape its trained
    /// tower reads.
    pub fn check_inputs(&self, data: &CaptionData, what: &str) -> Result<()> {
        let origin = || {
            data.source
                .as_ref()
                .map_or("the features".into(), |s| s.origin())
        };
        if self.image_tokens == 0 {
            if self.embed_dim != data.dim {
                bail!(
                    "{what} reads {}-dimensional image embeddings, but {} gives {}; use the \
                     features or retriever it was trained with",
                    self.embed_dim,
                    origin(),
                    data.dim
                );
            }
            if self.raw_embeddings {
                data.norms_for_raw()?;
            }
            return Ok(());
        }
        if let Some(v) = &self.vision {
            return match data.pixels.as_ref().map(|p| p.shape()) {
                Some(shape) if shape == (v.patches, v.patch_dim) => Ok(()),
                Some((patches, dim)) => bail!(
                    "{what} trains a vision tower of {} patches of {} values, but the data's \
                     image processor makes {patches} of {dim}: it is another BLIP folder's",
                    v.patches,
                    v.patch_dim
                ),
                None => bail!(
                    "{what} trains its vision tower and reads image pixels, but the data has none: \
                     they come from the BLIP folder its record names (features.image_pixels), \
                     which this checkpoint or run lacks"
                ),
            };
        }
        match data.image_tokens.as_ref().map(|t| t.shape()) {
            Some(s) if s.tokens == self.image_tokens && s.dim == self.embed_dim => Ok(()),
            Some(s) => bail!(
                "{what} reads {} image tokens of {} per image, but the data's image tokens are \
                 {} of {}: they come from another vision tower",
                self.image_tokens,
                self.embed_dim,
                s.tokens,
                s.dim
            ),
            None => bail!(
                "{what} reads {} image tokens of {} per image (a BLIP vision tower's), but the \
                 data has none: they come from the BLIP folder its record names \
                 (features.image_tokens), which this checkpoint or run lacks",
                self.image_tokens,
                self.embed_dim
            ),
        }
    }

    pub fn validate(&self) -> Result<()> {
        let d = &self.decoder;
        if d.width == 0 || d.heads == 0 || !d.width.is_multiple_of(d.heads) {
            bail!(
                "decoder width {} must be a positive multiple of heads {}",
                d.width,
                d.heads
            );
        }
        if !d.causal {
            bail!("the caption decoder must be causal");
        }
        if self.max_len < 3 {
            bail!(
                "max_len {} leaves no room for <bos>, a word and <eos>",
                self.max_len
            );
        }
        if self.lstm.is_some() != (self.family == DecoderFamily::Lstm) {
            bail!("lstm is an LSTM decoder's model: family \"lstm\" has one, and only it");
        }
        if self.prefix_predicts_first && self.family != DecoderFamily::Prefix {
            bail!("only a prefix decoder predicts the first token from its prefix");
        }
        if self.raw_embeddings && (self.image_tokens > 0 || self.vision.is_some()) {
            bail!("raw_embeddings is for a decoder that reads one image embedding");
        }
        if self.vision.is_some() && self.family != DecoderFamily::Blip {
            bail!("only a BLIP decoder trains a vision tower with it (vision)");
        }
        match self.family {
            DecoderFamily::Prefix => self.validate_prefix()?,
            DecoderFamily::Blip => self.validate_blip()?,
            DecoderFamily::Lstm => self.validate_lstm()?,
        }
        // Decoding's KV cache holds the decoder's whole sequence.
        let positions = self.seq_len();
        if positions > crate::backend::CachedAttention::MAX_CAPACITY {
            bail!(
                "prefix_len {}, a prompt of {} and max_len {} make {positions} decoder \
                 positions; decoding caches at most {}",
                self.prefix_len,
                self.prompt.len(),
                self.max_len,
                crate::backend::CachedAttention::MAX_CAPACITY
            );
        }
        if let Some(id) = (self.prompt.ids().iter()).find(|&&id| id as usize >= self.vocab_size) {
            bail!(
                "prompt id {id} must be below the vocabulary size {}",
                self.vocab_size
            );
        }
        let s = self.specials;
        if [s.start, s.end, s.pad]
            .iter()
            .any(|&id| id as usize >= self.vocab_size)
        {
            bail!(
                "special ids {s:?} must be below the vocabulary size {}",
                self.vocab_size
            );
        }
        if s.pad == s.end {
            bail!("the padding id {} must not be the end id", s.pad);
        }
        Ok(())
    }

    fn validate_prefix(&self) -> Result<()> {
        let d = &self.decoder;
        if d.pre_norm || d.post_norm || d.cross_width.is_some() || self.image_tokens > 0 {
            bail!(
                "a prefix decoder is GPT-2's blocks: no layer norm before the first block \
                 (pre_norm), no post_norm, no cross-attention (cross_width, image_tokens)"
            );
        }
        if !self.prompt.is_empty() {
            bail!("a prefix decoder takes no prompt; its prefix comes from the image");
        }
        if self.prefix_len == 0 || self.embed_dim == 0 || self.mapper_hidden == 0 {
            bail!("prefix_len, embed_dim and mapper_hidden must be positive");
        }
        if self.prefix_predicts_first && self.prefix_len < 2 {
            bail!(
                "a prefix that predicts the first token stands its last vector where the start \
                 would be, so it needs prefix_len >= 2"
            );
        }
        if let Some(t) = &self.mapper_transformer {
            if t.clip_len == 0 || t.layers == 0 || t.heads == 0 {
                bail!("the transformer mapper's clip_len, layers and heads must be positive");
            }
            if !d.width.is_multiple_of(t.heads) {
                bail!(
                    "the transformer mapper's {} heads must divide the decoder width {}",
                    t.heads,
                    d.width
                );
            }
        }
        Ok(())
    }

    fn validate_lstm(&self) -> Result<()> {
        let Some(lstm) = self.lstm else {
            bail!("an LSTM decoder needs its model (lstm)");
        };
        if self.decoder.layers == 0 || self.embed_dim == 0 {
            bail!(
                "an LSTM decoder needs a positive number of layers and an image input (embed_dim)"
            );
        }
        if self.prefix_len > 0 || self.mapper_hidden > 0 || self.mapper_transformer.is_some() {
            bail!(
                "an LSTM decoder has no mapper: prefix_len and mapper_hidden must be 0, and \
                 there is no mapper_transformer"
            );
        }
        match lstm.model {
            LstmModel::Fc if self.image_tokens > 0 => {
                bail!("the FC model reads one image embedding: image_tokens must be 0")
            }
            LstmModel::Att2in | LstmModel::UpDown if self.image_tokens == 0 => {
                bail!("an attention LSTM attends over image tokens: image_tokens must be positive")
            }
            LstmModel::Att2in | LstmModel::UpDown
                if self.decoder.layers != 1 || lstm.image_feed != ImageFeed::Hidden =>
            {
                bail!(
                    "an attention LSTM has its own cells (layers = 1) and reads the image by \
                     attending (no image_feed)"
                )
            }
            _ => {}
        }
        if !self.prompt.is_empty() {
            bail!("an LSTM decoder takes no prompt");
        }
        Ok(())
    }

    fn validate_blip(&self) -> Result<()> {
        let d = &self.decoder;
        let berts = d.pre_norm && d.post_norm && !d.final_norm;
        if !berts || d.cross_width != Some(self.embed_dim) {
            bail!(
                "a BLIP decoder is BERT's blocks: an embedding layer norm (pre_norm), post_norm, \
                 no final norm, and cross-attention to image tokens of embed_dim {} (cross_width)",
                self.embed_dim
            );
        }
        if self.image_tokens == 0 || self.embed_dim == 0 {
            bail!("a BLIP decoder reads image tokens: image_tokens and embed_dim must be positive");
        }
        if let Some(v) = &self.vision
            && (v.tokens() != self.image_tokens || v.transformer.width != self.embed_dim)
        {
            bail!(
                "the vision tower makes {} tokens of {}, but the decoder reads {} of {} \
                 (image_tokens, embed_dim)",
                v.tokens(),
                v.transformer.width,
                self.image_tokens,
                self.embed_dim
            );
        }
        if self.prefix_len > 0 || self.mapper_hidden > 0 || self.mapper_transformer.is_some() {
            bail!("a BLIP decoder has no mapper: prefix_len and mapper_hidden must be 0");
        }
        Ok(())
    }
}

impl checkpoint::ModelConfig for CaptionerConfig {
    fn validate(&self) -> Result<()> {
        CaptionerConfig::validate(self)
    }
    fn parameter_count(&self) -> u128 {
        CaptionerConfig::parameter_count(self)
    }
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

const KIND: checkpoint::Kind = checkpoint::Kind {
    format: "captune captioner",
    config_key: "captioner_config",
};

/// Metadata key of where the captioner's features came from (a
/// [`FeatureSource`] as JSON); checkpoints from before it lack it.
pub const FEATURES_KEY: &str = "features";

/// Where the captioner in the checkpoint `path` got its image embeddings,
/// when the checkpoint records it.
pub fn trained_on(path: &Path) -> Result<Option<FeatureSource>> {
    let meta = crate::tensorfile::read_metadata(path)?;
    meta.get(FEATURES_KEY)
        .map(|json| {
            serde_json::from_str(json).map_err(|e| {
                anyhow::anyhow!(
                    "{}: metadata {FEATURES_KEY:?} is not a feature record ({e})",
                    path.display()
                )
            })
        })
        .transpose()
}

impl<B: Backend> checkpoint::Model for Captioner<B> {
    type Backend = B;
    type Config = CaptionerConfig;
    type Vocab = CaptionVocab;
    const KIND: checkpoint::Kind = KIND;

    fn config(&self) -> &CaptionerConfig {
        &self.config
    }

    fn params(&self) -> &Params<B> {
        Captioner::params(self)
    }

    fn params_mut(&mut self) -> &mut Params<B> {
        Captioner::params_mut(self)
    }
}

/// A captioner with its vocabulary, as a checkpoint holds them.
pub type Checkpoint<B> = checkpoint::Checkpoint<Captioner<B>>;

impl<B: Backend> Checkpoint<B> {
    /// Loads a checkpoint.
    pub fn load(b: &B, path: &Path) -> Result<Self> {
        let ck = Self::load_with(b, path, |config| Captioner::new(b, config, 0))?;
        let (config, vocab) = (ck.model.config.specials, ck.vocab.specials());
        if config != vocab {
            bail!(
                "{}: captioner_config's specials {config:?} are not those of its \
                 vocabulary, {vocab:?}",
                path.display()
            );
        }
        Ok(ck)
    }

    /// The same weights in a model on backend `to`.
    pub fn model_on<C: Backend>(&self, b: &B, to: &C) -> Result<Captioner<C>> {
        let mut model = Captioner::new(to, self.model.config, 0)?;
        for (dst, src) in model
            .params_mut()
            .values
            .iter_mut()
            .zip(&self.model.params().values)
        {
            to.write(dst, &b.to_vec(src));
        }
        Ok(model)
    }

    /// A copy on the CPU backend, for scoring single captions away from
    /// the training device (the desktop app's inspector).
    pub fn to_cpu(&self, b: &B) -> Result<Checkpoint<CpuBackend>> {
        Ok(Checkpoint {
            model: self.model_on(b, &CpuBackend::new())?,
            vocab: self.vocab.clone(),
        })
    }
}
