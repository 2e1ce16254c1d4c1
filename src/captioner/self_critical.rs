//! Self-critical training's own checkpoints (the self-critical.pytorch
//! code of Rennie et al., 2017, "Self-critical Sequence Training for Image
//! Captioning", and the papers built on it): its `model.pth`,
//! `torch.save` of a model's state dict, read without running its pickle
//! ([`crate::torch_checkpoint`]), with the vocabulary its data
//! preparation wrote (`ix_to_word` of `cocotalk.json`).
//!
//! Its `FCModel` is captune's FC model with self-critical's maxout cell,
//! the image fed as the input of a step before the start, read as its
//! features come (unnormalised). The map, its names to captune's:
//!
//! | self-critical | captune |
//! | --- | --- |
//! | `img_embed.{weight,bias}` | `fc_embed.{weight,bias}` |
//! | `core.i2h.{weight,bias}` | `core.lstm.{weight,bias}_ih_l0` |
//! | `core.h2h.{weight,bias}` | `core.lstm.{weight,bias}_hh_l0` |
//! | `embed.weight` | `embed.weight`, rows moved |
//! | `logit.{weight,bias}` | `logit.{weight,bias}`, rows moved |
//!
//! Its vocabulary has one id, 0, for the start, the end and the padding,
//! then the words 1 to V; captune's has `<pad>`, `<bos>`, `<eos>` and
//! `<unk>`, then the words. Id 0's embedding becomes `<bos>`'s and its
//! logit `<eos>`'s; the word `UNK` (its stand-in for rare words) becomes
//! `<unk>`; the other words follow in its order. Rows captune has and
//! self-critical does not (`<pad>`, `<eos>`'s embedding, `<bos>`'s logit:
//! never fed or predicted) are zero; without an `UNK`, `<unk>`'s logit
//! gets a bias of -1e4, so it is never chosen and moves no probability.

use super::model::Captioner;
use super::pretrained::write_params;
use super::{
    CaptionVocab, CaptionerConfig, Checkpoint, DecoderFamily, ImageFeed, LstmConfig, LstmModel,
    LstmVariant, SpecialIds,
};
use crate::backend::{Backend, CellGates};
use crate::data::vocab::{BOS, EOS, SPECIALS, UNK};
use crate::model::transformer::TransformerConfig;
use crate::tensorfile::{Tensor, TensorFile};
use crate::torch_checkpoint;
use anyhow::{Context, Result, bail};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// The word self-critical's data preparation puts for rare words.
const THEIR_UNK: &str = "UNK";

/// The logit bias of a `<unk>` the checkpoint has no word for.
const NEVER: f32 = -1e4;

/// Self-critical's vocabulary: its words, id 1 first.
#[derive(Clone, Debug)]
pub struct TheirVocab {
    words: Vec<String>,
}

impl TheirVocab {
    /// From `cocotalk.json` (its `ix_to_word`), or from a JSON object of
    /// ids to words (an infos pickle's `vocab`, saved as JSON).
    pub fn read(path: &Path) -> Result<Self> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {shown}"))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{shown}: not JSON (self-critical's cocotalk.json)"))?;
        let table = json.get("ix_to_word").unwrap_or(&json);
        let Some(table) = table.as_object() else {
            bail!("{shown}: no \"ix_to_word\" object of ids to words (cocotalk.json's)");
        };
        let mut by_id = BTreeMap::new();
        for (key, word) in table {
            let id: usize = match key.parse() {
                Ok(id) if id >= 1 => id,
                _ => bail!("{shown}: key {key:?} of ix_to_word is not a word id (1, 2, ...)"),
            };
            let Some(word) = word.as_str().filter(|w| !w.is_empty()) else {
                bail!("{shown}: ix_to_word[{key:?}] is not a word");
            };
            by_id.insert(id, word.to_string());
        }
        if by_id.keys().copied().ne(1..=by_id.len()) {
            bail!(
                "{shown}: ix_to_word's ids are not 1 to {} without a gap",
                by_id.len()
            );
        }
        let words: Vec<String> = by_id.into_values().collect();
        let mut seen = HashSet::new();
        if let Some(w) = words.iter().find(|w| !seen.insert(w.as_str())) {
            bail!("{shown}: the word {w:?} has two ids");
        }
        if let Some(w) = words.iter().find(|w| SPECIALS.contains(&w.as_str())) {
            bail!("{shown}: the word {w:?} is one of captune's special tokens");
        }
        Ok(TheirVocab { words })
    }

    /// For each of captune's ids: the row of self-critical's embedding,
    /// and of its output layer, that it takes, if any.
    fn rows(&self) -> (Vec<Option<usize>>, Vec<Option<usize>>) {
        let unk = self.words.iter().position(|w| w == THEIR_UNK);
        let mut embed = vec![None; SPECIALS.len()];
        let mut logit = vec![None; SPECIALS.len()];
        embed[BOS as usize] = Some(0);
        logit[EOS as usize] = Some(0);
        embed[UNK as usize] = unk.map(|i| i + 1);
        logit[UNK as usize] = unk.map(|i| i + 1);
        for i in (0..self.words.len()).filter(|&i| Some(i) != unk) {
            embed.push(Some(i + 1));
            logit.push(Some(i + 1));
        }
        (embed, logit)
    }

    /// captune's vocabulary of these words.
    fn ours(&self) -> CaptionVocab {
        let words = self.words.iter().filter(|w| *w != THEIR_UNK).cloned();
        CaptionVocab::from_words(words.collect())
    }

    fn has_unk(&self) -> bool {
        self.words.iter().any(|w| w == THEIR_UNK)
    }
}

/// The FC model's sizes, read from its tensors.
#[derive(Clone, Copy, Debug)]
struct FcShape {
    features: usize,
    hidden: usize,
}

/// A captioner from self-critical's `model.pth` at `path` with its
/// vocabulary `vocab`, captions of at most `max_len` positions (as
/// `[model] max_len` counts them: its `max_length` words, the start and
/// the end).
pub fn read<B: Backend>(b: &B, path: &Path, vocab: &Path, max_len: usize) -> Result<Checkpoint<B>> {
    let shown = path.display();
    let theirs = torch_checkpoint::read_state_dict(path, None)?;
    let words = TheirVocab::read(vocab)?;
    let shape = fc_shape(&theirs).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    let ours = convert(theirs, &words)
        .map_err(|e| anyhow::anyhow!("{shown} with {}: {e}", vocab.display()))?;
    let vocab = words.ours();
    let config = fc_config(shape, vocab.len(), max_len);
    let mut model = Captioner::new(b, config, 0)?;
    write_params(b, &mut model, ours, path, |_| true)?;
    Ok(Checkpoint { model, vocab })
}

/// The FC model's sizes from `img_embed` and `core.h2h`; other models of
/// self-critical's zoo are refused, naming what is converted.
fn fc_shape(theirs: &TensorFile) -> Result<FcShape> {
    let Some(img_embed) = theirs.tensors.get("img_embed.weight") else {
        bail!(
            "no tensor \"img_embed.weight\": not self-critical's FCModel, the one of its models \
             captune converts (its attention models, AoA and transformers are not)"
        );
    };
    let h2h = theirs
        .tensors
        .get("core.h2h.weight")
        .context("no tensor \"core.h2h.weight\" (FCModel's LSTMCore)")?;
    let (h, cell) = (h2h.shape.get(1).copied().unwrap_or(0), CellGates::Maxout);
    if h2h.shape != [cell.chunks() * h, h] || img_embed.shape.len() != 2 {
        bail!(
            "core.h2h.weight {:?} and img_embed.weight {:?} are not FCModel's maxout LSTM's \
             ([5 rnn_size, rnn_size] and [input_encoding_size, fc_feat_size])",
            h2h.shape,
            img_embed.shape
        );
    }
    if img_embed.shape[0] != h {
        bail!(
            "input_encoding_size {} differs from rnn_size {h}: captune's FC model embeds words \
             and the image at its hidden size",
            img_embed.shape[0]
        );
    }
    Ok(FcShape {
        features: img_embed.shape[1],
        hidden: h,
    })
}

fn fc_config(shape: FcShape, vocab_size: usize, max_len: usize) -> CaptionerConfig {
    CaptionerConfig {
        family: DecoderFamily::Lstm,
        embed_dim: shape.features,
        image_tokens: 0,
        prefix_len: 0,
        mapper_hidden: 0,
        mapper_activation: Default::default(),
        mapper_transformer: None,
        decoder: TransformerConfig::new(shape.hidden, 1, 1, true),
        vision: None,
        lstm: Some(LstmConfig {
            variant: LstmVariant::SelfCritical,
            ..LstmConfig::new(LstmModel::Fc, ImageFeed::Input)
        }),
        prompt: Default::default(),
        max_len,
        vocab_size,
        specials: SpecialIds::WORDS,
        prefix_predicts_first: false,
        // Its features are a CNN's pooled outputs, fed as they come.
        raw_embeddings: true,
    }
}

/// self-critical's FCModel tensors (weights, or their gradients) under
/// captune's names, with the vocabulary's rows moved.
pub fn convert(mut theirs: TensorFile, vocab: &TheirVocab) -> Result<TensorFile> {
    let mut ours = TensorFile::new([]);
    let renames = [
        ("img_embed.weight", "fc_embed.weight"),
        ("img_embed.bias", "fc_embed.bias"),
        ("core.i2h.weight", "core.lstm.weight_ih_l0"),
        ("core.i2h.bias", "core.lstm.bias_ih_l0"),
        ("core.h2h.weight", "core.lstm.weight_hh_l0"),
        ("core.h2h.bias", "core.lstm.bias_hh_l0"),
    ];
    for (from, to) in renames {
        let tensor = take(&mut theirs, from)?;
        ours.tensors.insert(to.into(), tensor);
    }
    let (embed_rows, logit_rows) = vocab.rows();
    let ids = vocab.words.len() + 1;
    for (name, rows) in [
        ("embed.weight", &embed_rows),
        ("logit.weight", &logit_rows),
        ("logit.bias", &logit_rows),
    ] {
        let tensor = take(&mut theirs, name)?;
        if tensor.shape.first() != Some(&ids) {
            bail!(
                "{name} has {:?} rows, not the vocabulary's {} words and id 0",
                tensor.shape.first(),
                ids - 1
            );
        }
        let mut moved = moved_rows(&tensor, rows);
        if name == "logit.bias" && !vocab.has_unk() {
            moved.data[UNK as usize] = NEVER;
        }
        ours.tensors.insert(name.into(), moved);
    }
    if let Some(name) = theirs.tensors.keys().min() {
        bail!("tensor {name:?} has no place in captune's FC model");
    }
    Ok(ours)
}

/// Row i of the result is `tensor`'s row `rows[i]`, or zeros.
fn moved_rows(tensor: &Tensor, rows: &[Option<usize>]) -> Tensor {
    let width: usize = tensor.shape[1..].iter().product();
    let mut data = vec![0.0; rows.len() * width];
    for (to, from) in rows.iter().enumerate() {
        if let Some(from) = from {
            data[to * width..][..width].copy_from_slice(&tensor.data[from * width..][..width]);
        }
    }
    let mut shape = tensor.shape.clone();
    shape[0] = rows.len();
    Tensor { shape, data }
}

fn take(theirs: &mut TensorFile, name: &str) -> Result<Tensor> {
    theirs
        .tensors
        .remove(name)
        .with_context(|| format!("no tensor {name:?}"))
}
