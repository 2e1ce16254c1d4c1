//! A Hugging Face BLIP folder as a captioner: its text decoder (and, to
//! train with it, its vision tower) in the BLIP decoder family
//! ([`super::decoders::blip`]), its WordPiece tokenizer as the vocabulary,
//! and an optional prompt.

use super::model::Captioner;
use super::{CaptionVocab, CaptionerConfig, Checkpoint, DecoderFamily, Prompt, SpecialIds};
use crate::backend::Backend;
use crate::data::wordpiece::WordPieceVocab;
use crate::model::blip::{Blip, BlipConfig, text_decoder_tensors, vision_tensors};
use crate::model::layers::Activation;
use crate::tensorfile::TensorFile;
use anyhow::{Context, Result, bail};
use std::path::Path;

/// The captioner config of a BLIP folder's text decoder, for captions of
/// `max_len` ids (the start and the end included): BLIP's network and
/// vocabulary, its start id ([DEC]) as the start, [SEP] as the end,
/// [PAD] as the padding, and the vision tower's tokens as the image input.
pub fn blip_config(blip: &BlipConfig, max_len: usize) -> CaptionerConfig {
    let (t, v) = (&blip.text_config, &blip.vision_config);
    CaptionerConfig {
        family: DecoderFamily::Blip,
        embed_dim: v.hidden_size,
        image_tokens: v.tokens(),
        prefix_len: 0,
        mapper_hidden: 0,
        mapper_activation: Activation::default(),
        mapper_transformer: None,
        decoder: blip.text_transformer(),
        lstm: None,
        vision: None,
        prompt: Default::default(),
        max_len,
        vocab_size: t.vocab_size,
        prefix_predicts_first: false,
        raw_embeddings: false,
        specials: SpecialIds {
            start: t.bos_token_id,
            end: t.sep_token_id,
            pad: t.pad_token_id,
        },
    }
}

/// Longest caption a BLIP folder is asked for as it is (`caption`,
/// `inspect`), in pieces with the end: SMILE's recipe decodes up to 75
/// (BLIP's own default is 20).
pub const BLIP_CAPTION_IDS: usize = 75;

/// The BLIP folder `dir`'s text decoder (from `blip`, read from it) and
/// its tokenizer, for captions of at most `max_len` ids (fewer where the
/// decoder has fewer positions), fed after `prompt` when there is one;
/// with `vision`, the folder's vision tower too, to train with it.
pub fn blip_checkpoint<B: Backend>(
    b: &B,
    dir: &Path,
    blip: Blip,
    (max_len, prompt): (usize, Option<&str>),
    vision: bool,
) -> Result<Checkpoint<B>> {
    let t = &blip.config.text_config;
    let tokenizer = dir.join("tokenizer.json").display().to_string();
    let vocab = CaptionVocab::from_wordpiece(WordPieceVocab::load(dir)?, t.vocab_size, &tokenizer)?;
    let config = blip_config(&blip.config, max_len);
    if vocab.specials() != config.specials {
        bail!(
            "{tokenizer}: [DEC], [SEP] and [PAD] are ids {:?}, but config.json's text_config \
             says bos_token_id, sep_token_id and pad_token_id {:?}: the tokenizer and the model \
             are of different folders",
            vocab.specials(),
            config.specials
        );
    }
    let pieces = match prompt {
        Some(text) => vocab.encode_text(text)?,
        None => Vec::new(),
    };
    // The start, the prompt and a caption's pieces share the positions.
    let positions = t.max_position_embeddings;
    if pieces.len() + 2 > positions {
        bail!(
            "a prompt of {} pieces leaves no room for a caption in the decoder's {positions} \
             positions (text_config.max_position_embeddings)",
            pieces.len()
        );
    }
    let text = prompt.unwrap_or_default();
    let prompt = Prompt::new(&pieces).with_context(|| format!("prompt {text:?}"))?;
    let max_len = max_len.min(positions + 1 - prompt.len());
    let model = from_blip(b, blip, max_len, prompt, vision)?;
    Ok(Checkpoint { model, vocab })
}

/// A captioner with a BLIP folder's text decoder, for captions of
/// `max_len` ids after `prompt`; with `vision`, its vision tower too.
pub fn from_blip<B: Backend>(
    b: &B,
    mut blip: Blip,
    max_len: usize,
    prompt: Prompt,
    vision: bool,
) -> Result<Captioner<B>> {
    let v = &blip.config.vision_config;
    let config = CaptionerConfig {
        prompt,
        vision: vision.then(|| v.vision()),
        ..blip_config(&blip.config, max_len)
    };
    let path = &blip.weights_path;
    let mut model = Captioner::new(b, config, 0)
        .with_context(|| format!("{}: not a BLIP decoder captune computes", path.display()))?;
    let mut tensors = match vision {
        true => vision_tensors(v, &mut blip.weights, path)?,
        false => Vec::new(),
    };
    let mut weights = blip.weights.tensors;
    let text = text_decoder_tensors(&blip.config.text_config, config.seq_len(), |name| {
        weights
            .remove(name)
            .with_context(|| format!("{}: no tensor {name:?}", path.display()))
    })
    .with_context(|| format!("{}", path.display()))?;
    tensors.extend(text);
    model
        .params_mut()
        .load(b, path, &mut TensorFile::new(tensors))?;
    Ok(model)
}
