//! A captioner whose decoder is a pretrained GPT-2 (ClipCap: Mokady et
//! al., 2021, "ClipCap: CLIP Prefix for Image Captioning", arXiv
//! 2111.09734). GPT-2's weights become the decoder's as `model::gpt2`
//! maps them; the mapper is new: ClipCap's MLP with tanh, or its
//! transformer mapper with ReLU. Two things differ from a GPT-2 as
//! transformers holds it:
//! - the token embedding has one row more, after GPT-2's ids: the padding
//!   id, which no caption contains and the policy masks, so that target
//!   positions after a caption's end are never taken for its end
//!   (`<|endoftext|>` is both the start and the end). The row starts at
//!   zero and, masked and never read at a real position, keeps no
//!   gradient;
//! - the learned positions are GPT-2's first `prefix_len + max_len - 1`,
//!   the prefix's and the caption's, as ClipCap feeds them.

use super::decoders::prefix::is_mapper_param;
use super::export::{MAPPER_FILE, mapper_metadata};
use super::model::Captioner;
use super::{
    CaptionVocab, CaptionerConfig, Checkpoint, DecoderFamily, MapperTransformer, SpecialIds,
};
use crate::backend::Backend;
use crate::data::bpe::BpeVocab;
use crate::model::gpt2::{self, Gpt2};
use crate::model::hf::HfFolder;
use crate::model::layers::Activation;
use crate::tensorfile::{self, TensorFile};
use anyhow::{Context, Result, bail};
use std::path::Path;

/// The prefix and caption a GPT-2 decoder is given: what a run config's
/// `[model]` says beside the pretrained network.
#[derive(Clone, Copy, Debug)]
pub struct PrefixShape {
    /// Size of the image embedding the mapper reads.
    pub embed_dim: usize,
    pub prefix_len: usize,
    /// The MLP mapper's hidden size, or a transformer mapper's blocks' MLP width.
    pub mapper_hidden: usize,
    /// ClipCap's transformer mapper; None for its MLP.
    pub mapper_transformer: Option<MapperTransformer>,
    /// Caption positions, the start and the end included.
    pub max_len: usize,
}

/// How a GPT-2 captioner reads its input: captune's way (the default), or
/// as ClipCap's own checkpoints do ([`super::clipcap`]): no start fed,
/// and for its MLP, embeddings unnormalised.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reading {
    pub prefix_predicts_first: bool,
    pub raw_embeddings: bool,
}

/// The captioner config of a GPT-2 decoder with `shape`'s prefix: GPT-2's
/// network, its ids and one more for the padding, `end` (`<|endoftext|>`,
/// or ClipCap's ".") as start and end, ClipCap's activation for the mapper
/// (tanh in the MLP, ReLU in the transformer's blocks), read `reading`'s
/// way.
pub fn gpt2_config(
    gpt2: &Gpt2,
    shape: PrefixShape,
    end: u32,
    reading: Reading,
) -> Result<CaptionerConfig> {
    let c = &gpt2.config;
    let config = CaptionerConfig {
        family: DecoderFamily::Prefix,
        image_tokens: 0,
        embed_dim: shape.embed_dim,
        prefix_len: shape.prefix_len,
        mapper_hidden: shape.mapper_hidden,
        mapper_activation: match shape.mapper_transformer {
            None => Activation::Tanh,
            Some(_) => Activation::Relu,
        },
        mapper_transformer: shape.mapper_transformer,
        decoder: c.transformer(),
        lstm: None,
        vision: None,
        prompt: Default::default(),
        max_len: shape.max_len,
        vocab_size: c.vocab_size + 1,
        prefix_predicts_first: reading.prefix_predicts_first,
        raw_embeddings: reading.raw_embeddings,
        specials: SpecialIds {
            start: end,
            end,
            pad: c.vocab_size as u32,
        },
    };
    if config.seq_len() > c.n_positions {
        bail!(
            "a prefix of {} and captions of {} positions need {} positions; this GPT-2 has {} \
             (n_positions): shorten the prefix or max_len",
            shape.prefix_len,
            shape.max_len,
            config.seq_len(),
            c.n_positions
        );
    }
    config.validate()?;
    Ok(config)
}

/// A captioner whose decoder is the GPT-2 in the Hugging Face folder
/// `dir` (config.json, model.safetensors, tokenizer.json), its vocabulary
/// the folder's tokenizer. The mapper is the folder's `mapper.safetensors`
/// when it has one (`captune export` writes it), else fresh (from `seed`).
pub fn from_folder<B: Backend>(
    b: &B,
    dir: &Path,
    shape: PrefixShape,
    seed: u64,
) -> Result<Checkpoint<B>> {
    let mut bpe = BpeVocab::load(dir)?;
    let gpt2 = gpt2::read(dir, "decoder")?;
    // An export of ClipCap's own checkpoint keeps its layout and its end.
    let layout: ExportedLayout = HfFolder::open(dir)?.config()?;
    if let Some(end) = &layout.end {
        bpe = bpe.ending_at(end)?;
    }
    let reading = Reading {
        prefix_predicts_first: layout.prefix_predicts_first,
        raw_embeddings: layout.raw_embeddings,
    };
    let config = gpt2_config(&gpt2, shape, bpe.end(), reading)?;
    let mut model = with_gpt2_weights(b, gpt2, config, seed)?;
    let mapper = dir.join(MAPPER_FILE);
    if mapper.is_file() {
        load_mapper(b, &mut model, &mapper)?;
    }
    let vocab = CaptionVocab::from_tokenizer(bpe, model.config.vocab_size)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    Ok(Checkpoint { model, vocab })
}

/// The captioner `captune export` (or `captune convert`) wrote to the
/// folder `dir`, as it was: the prefix's and the mapper's shape from its
/// `mapper.safetensors`' metadata, its caption positions from config.json.
pub fn from_export<B: Backend>(b: &B, dir: &Path) -> Result<Checkpoint<B>> {
    let mapper = dir.join(MAPPER_FILE);
    if !mapper.is_file() {
        bail!(
            "{}: no {MAPPER_FILE}, so not a captioner `captune export` or `captune convert` \
             wrote (a GPT-2 folder alone starts a run: train --decoder hf:FOLDER)",
            dir.display()
        );
    }
    let meta = tensorfile::read_metadata(&mapper)?;
    let number = |key: &str| -> Result<usize> {
        let text = meta
            .get(key)
            .with_context(|| format!("{}: no metadata {key:?}", mapper.display()))?;
        text.parse().with_context(|| {
            format!(
                "{}: metadata {key:?} is {text:?}, not a count",
                mapper.display()
            )
        })
    };
    let mapper_transformer = match meta.get("mapper").map(String::as_str) {
        Some("transformer") => Some(MapperTransformer {
            clip_len: number("clip_len")?,
            layers: number("layers")?,
            heads: number("heads")?,
        }),
        _ => None,
    };
    let positions: ExportedPositions = HfFolder::open(dir)?.config()?;
    let shape = PrefixShape {
        embed_dim: number("embed_dim")?,
        prefix_len: number("prefix_len")?,
        mapper_hidden: number("mapper_hidden")?,
        mapper_transformer,
        max_len: positions.caption_positions + 1,
    };
    from_folder(b, dir, shape, 0)
}

/// Caption positions an export's config.json records.
#[derive(serde::Deserialize)]
struct ExportedPositions {
    #[serde(rename = "captune_caption_positions")]
    caption_positions: usize,
}

/// What an export's config.json says of a decoder in ClipCap's own layout.
#[derive(serde::Deserialize)]
struct ExportedLayout {
    #[serde(default, rename = "captune_prefix_predicts_first")]
    prefix_predicts_first: bool,
    #[serde(default, rename = "captune_caption_end")]
    end: Option<String>,
    #[serde(default, rename = "captune_raw_embeddings")]
    raw_embeddings: bool,
}

/// Replaces `model`'s mapper with the one in `path` (as `captune export`
/// writes it), which must have the model's shape.
fn load_mapper<B: Backend>(b: &B, model: &mut Captioner<B>, path: &Path) -> Result<()> {
    let file = tensorfile::read(path)?;
    for (key, want) in mapper_metadata(&model.config) {
        let held = match (key, file.metadata.get(key)) {
            // Exports from before transformer mappers hold an MLP.
            ("mapper", None) => "mlp",
            _ => file.meta(key, path)?,
        };
        if held != want {
            bail!(
                "{}: the mapper's {key} is {held} but the run's is {want}; give the run the \
                 mapper's shape ([model] prefix_len, mapper_hidden, mapper_activation and \
                 mapper_transformer, image embeddings of embed_dim), or remove {MAPPER_FILE} \
                 from the folder for a fresh mapper",
                path.display()
            );
        }
    }
    write_mapper(b, model, file, path)
}

/// Writes the mapper tensors of `file` (read from `path`, under captune's
/// names) into `model`: every mapper parameter, each of its shape, and
/// nothing else.
pub fn write_mapper<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    file: TensorFile,
    path: &Path,
) -> Result<()> {
    write_params(b, model, file, path, is_mapper_param)
}

/// The parameters of `model` that `which` names, from `file`, which must
/// hold those tensors in their shapes and no other.
pub fn write_params<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    mut file: TensorFile,
    path: &Path,
    which: impl Fn(&str) -> bool,
) -> Result<()> {
    let params = model.params_mut();
    for (spec, value) in params.specs.iter().zip(&mut params.values) {
        if !which(&spec.name) {
            continue;
        }
        let Some(tensor) = file.tensors.remove(&spec.name) else {
            bail!("{}: no tensor {:?}", path.display(), spec.name);
        };
        if tensor.shape != spec.shape {
            bail!(
                "{}: tensor {:?} has shape {:?}, the captioner's is {:?}",
                path.display(),
                spec.name,
                tensor.shape,
                spec.shape
            );
        }
        b.write(value, &tensor.data);
    }
    if let Some(name) = file.tensors.keys().min() {
        bail!(
            "{}: tensor {name:?} has no place in the captioner",
            path.display()
        );
    }
    Ok(())
}

/// A captioner with `gpt2` as its decoder and a freshly initialised
/// mapper (from `seed`).
pub fn from_gpt2<B: Backend>(
    b: &B,
    gpt2: Gpt2,
    shape: PrefixShape,
    end: u32,
    seed: u64,
) -> Result<Captioner<B>> {
    let config = gpt2_config(&gpt2, shape, end, Reading::default())?;
    with_gpt2_weights(b, gpt2, config, seed)
}

/// A captioner of `config` (a GPT-2 decoder's, [`gpt2_config`]) with
/// `gpt2`'s weights in its decoder and a fresh mapper (from `seed`).
pub fn with_gpt2_weights<B: Backend>(
    b: &B,
    gpt2: Gpt2,
    config: CaptionerConfig,
    seed: u64,
) -> Result<Captioner<B>> {
    let mut model = Captioner::new(b, config, seed)?;
    let mut weights = gpt2.weights;
    let (w, rows) = (config.decoder.width, config.seq_len());
    let params = model.params_mut();
    for (spec, value) in params.specs.iter().zip(&mut params.values) {
        let Some(tensor) = weights.tensors.remove(&spec.name) else {
            if is_mapper_param(&spec.name) {
                continue;
            }
            bail!("the captioner's {:?} has no GPT-2 tensor", spec.name);
        };
        let mut data = tensor.data;
        match spec.name.as_str() {
            // GPT-2's ids, then the padding row at zero.
            "decoder.tokens" => data.resize(config.vocab_size * w, 0.0),
            "decoder.positions" => data.truncate(rows * w),
            _ => {}
        }
        assert_eq!(
            data.len(),
            spec.len(),
            "{}: checked by gpt2::read",
            spec.name
        );
        b.write(value, &data);
    }
    if let Some(name) = weights.tensors.keys().next() {
        bail!("GPT-2 tensor {name:?} has no place in the captioner");
    }
    Ok(model)
}
