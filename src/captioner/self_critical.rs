//! Self-critical training's own checkpoints (the self-critical.pytorch
//! code of Rennie et al., 2017, "Self-critical Sequence Training for Image
//! Captioning", and the papers built on it): its `model.pth`,
//! `torch.save` of a model's state dict, read without running its pickle
//! ([`crate::torch_checkpoint`]), with the vocabulary its data
//! preparation wrote (`ix_to_word` of `cocotalk.json`).
//!
//! Its models that are captune's LSTM models as self-critical computes
//! them ([`LstmVariant::SelfCritical`]): `FCModel` and `NewFCModel` (the
//! same network: the image fed as the input of a step before the start,
//! its features read as they come, unnormalised), `Att2in2Model` and
//! `UpDownModel`. The map, its names to captune's:
//!
//! | self-critical | captune |
//! | --- | --- |
//! | `img_embed.*` (FC) | `fc_embed.*` |
//! | `core.i2h.{weight,bias}`, `_core.i2h.*` (new FC) | `core.lstm.{weight,bias}_ih` (`_ih_l0` for FC) |
//! | `core.h2h.{weight,bias}`, `_core.h2h.*` (new FC) | `core.lstm.{weight,bias}_hh` (`_hh_l0` for FC) |
//! | `embed.0.weight`, `att_embed.0.*`, `fc_embed.0.*` | without the `.0` |
//! | `core.attention.alpha_net.bias` | none: it adds the same to every score |
//! | every other tensor | the same name |
//!
//! and the rows of `embed.weight`, `logit.weight` and `logit.bias` move to
//! captune's vocabulary. Its vocabulary has one id, 0, for the start, the
//! end and the padding, then the words 1 to V; captune's has `<pad>`,
//! `<bos>`, `<eos>` and `<unk>`, then the words. Id 0's embedding becomes
//! `<bos>`'s and its logit `<eos>`'s; the word `UNK` (its stand-in for
//! rare words) becomes `<unk>`; the other words follow in its order. Rows
//! captune has and self-critical does not (`<pad>`, `<eos>`'s embedding,
//! `<bos>`'s logit: never fed or predicted) are zero; without an `UNK`,
//! `<unk>`'s logit gets a bias of -1e4, so it is never chosen and moves
//! no probability.

use super::model::Captioner;
use super::pretrained::write_params;
use super::{
    CaptionVocab, CaptionerConfig, Checkpoint, DecoderFamily, ImageFeed, LstmConfig, LstmModel,
    LstmVariant, SpecialIds,
};
use crate::backend::Backend;
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
            if by_id.insert(id, word.to_string()).is_some() {
                bail!("{shown}: word id {id} appears twice in ix_to_word (as {key:?})");
            }
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
        // captune's word vocabulary marks first-token alternatives so.
        if let Some(w) = words.iter().find(|w| w.starts_with("##")) {
            bail!(
                "{shown}: the word {w:?} starts with \"##\", which captune's vocabulary reserves"
            );
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

/// Which of its models a state dict holds, and its sizes.
#[derive(Clone, Copy, Debug)]
struct Shape {
    model: LstmModel,
    /// Its `fc_feat_size` (FC) or `att_feat_size`.
    features: usize,
    hidden: usize,
}

/// A captioner from self-critical's `model.pth` at `path` with its
/// vocabulary `vocab`, captions of at most `max_len` positions (as
/// `[model] max_len` counts them: its `max_length` words, the start and
/// the end). An attention model reads `image_tokens` tokens per image.
pub fn read<B: Backend>(
    b: &B,
    path: &Path,
    vocab: &Path,
    max_len: usize,
    image_tokens: Option<usize>,
) -> Result<Checkpoint<B>> {
    let shown = path.display();
    let theirs = torch_checkpoint::read_state_dict(path, None)?;
    let words = TheirVocab::read(vocab)?;
    let shape = shape(&theirs).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    let image_tokens = match (shape.model, image_tokens) {
        (LstmModel::Fc, None) => 0,
        (LstmModel::Fc, Some(_)) => {
            bail!("{shown}: its FCModel reads one feature vector per image, no image tokens")
        }
        (_, Some(n)) if n > 0 => n,
        (model, _) => bail!(
            "{shown}: an attention model ({}): give the number of image tokens (regions) per \
             image its features have (convert's --tokens)",
            their_name(model)
        ),
    };
    let ours = convert(theirs, &words)
        .map_err(|e| anyhow::anyhow!("{shown} with {}: {e}", vocab.display()))?;
    let vocab = words.ours();
    let config = config(shape, image_tokens, vocab.len(), max_len);
    // Its sizes come from tensor shapes alone: refuse a file whose values
    // cannot fill the network they describe before making it.
    let held: usize = ours.tensors.values().map(|t| t.data.len()).sum();
    if held as u128 != config.parameter_count() {
        bail!(
            "{shown}: its tensors hold {held} values, but the {} its shapes describe has {}: \
             the file is damaged or not one of its models",
            their_name(shape.model),
            config.parameter_count()
        );
    }
    let mut model = Captioner::new(b, config, 0)?;
    write_params(b, &mut model, ours, path, |_| true)?;
    Ok(Checkpoint { model, vocab })
}

fn their_name(model: LstmModel) -> &'static str {
    match model {
        LstmModel::Fc => "FCModel (or NewFCModel)",
        LstmModel::Att2in => "Att2in2Model",
        LstmModel::UpDown => "UpDownModel",
    }
}

/// The model: FC (`img_embed` and `core.i2h`), the new FC (`fc_embed`
/// and `_core.i2h`), Att2in2 (`core.a2c` and `core.i2h`) or top-down
/// (`core.att_lstm` and `core.lang_lstm`); what captune has no place for
/// is refused by name.
fn model(theirs: &TensorFile) -> Result<LstmModel> {
    let has = |name: &str| theirs.tensors.contains_key(name);
    let has_prefix = |prefix: &str| theirs.tensors.keys().any(|n| n.starts_with(prefix));
    let batch_norm = theirs.tensors.keys().any(|n| {
        n.strip_prefix("att_embed.")
            .and_then(|rest| rest.split('.').next())
            .is_some_and(|layer| layer != "0")
    });
    if batch_norm || has("att_embed.0.running_mean") {
        bail!("its att_embed has a batch norm (use_bn), which captune's models do not");
    }
    if has("logit.0.weight") {
        bail!("its output has more than one layer (logit_layers), which captune's has not");
    }
    if has_prefix("refiner.") || has_prefix("core.att2ctx.") {
        bail!("it is an AoA model, which captune does not convert");
    }
    if has("core.weight_ih_l0") {
        bail!("it is a ShowTell model (an nn.LSTM core), which captune does not convert");
    }
    let fc = has("img_embed.weight") && has("core.i2h.weight");
    let new_fc = has("fc_embed.weight") && has("_core.i2h.weight");
    Ok(if fc || new_fc {
        LstmModel::Fc
    } else if has("core.a2c.weight") && has("core.i2h.weight") && has("att_embed.0.weight") {
        LstmModel::Att2in
    } else if has("core.att_lstm.weight_ih") && has("core.lang_lstm.weight_ih") {
        LstmModel::UpDown
    } else {
        bail!(
            "none of the self-critical models captune converts (FCModel, NewFCModel, \
             Att2in2Model, UpDownModel); its transformers and other models are not"
        )
    })
}

/// `[rows, cols]` of the matrix `name`.
fn matrix(theirs: &TensorFile, name: &str) -> Result<(usize, usize)> {
    let t = theirs
        .tensors
        .get(name)
        .with_context(|| format!("no tensor {name:?}"))?;
    match t.shape[..] {
        [rows, cols] => Ok((rows, cols)),
        ref other => bail!("tensor {name:?} has shape {other:?}, not a matrix"),
    }
}

/// The model's sizes. captune's LSTMs embed words and attend at their
/// hidden size: the checkpoint's input_encoding_size and att_hid_size
/// must be its rnn_size.
fn shape(theirs: &TensorFile) -> Result<Shape> {
    let model = model(theirs)?;
    let new_fc = theirs.tensors.contains_key("_core.h2h.weight");
    let (recurrent, features, word) = match model {
        LstmModel::Fc if new_fc => ("_core.h2h.weight", "fc_embed.weight", "embed.weight"),
        LstmModel::Fc => ("core.h2h.weight", "img_embed.weight", "embed.weight"),
        LstmModel::Att2in => ("core.h2h.weight", "att_embed.0.weight", "embed.0.weight"),
        LstmModel::UpDown => (
            "core.att_lstm.weight_hh",
            "att_embed.0.weight",
            "embed.0.weight",
        ),
    };
    let hidden = matrix(theirs, recurrent)?.1;
    let features = matrix(theirs, features)?.1;
    let mut widths = vec![("input_encoding_size", matrix(theirs, word)?.1)];
    if model.reads_tokens() {
        widths.push(("att_hid_size", matrix(theirs, "ctx2att.weight")?.0));
    }
    if let Some((what, width)) = widths.into_iter().find(|&(_, w)| w != hidden) {
        bail!(
            "its {what} {width} differs from its rnn_size {hidden}: captune's LSTMs embed and \
             attend at their hidden size"
        );
    }
    if model == LstmModel::UpDown {
        let pooled = matrix(theirs, "fc_embed.0.weight")?.1;
        if pooled != features {
            bail!(
                "its fc_feat_size {pooled} differs from its att_feat_size {features}: captune's \
                 pooled feature is the tokens' mean"
            );
        }
    }
    Ok(Shape {
        model,
        features,
        hidden,
    })
}

fn config(shape: Shape, image_tokens: usize, vocab_size: usize, max_len: usize) -> CaptionerConfig {
    let fc = shape.model == LstmModel::Fc;
    let feed = if fc {
        ImageFeed::Input
    } else {
        ImageFeed::Hidden
    };
    CaptionerConfig {
        family: DecoderFamily::Lstm,
        embed_dim: shape.features,
        image_tokens,
        prefix_len: 0,
        mapper_hidden: 0,
        mapper_activation: Default::default(),
        mapper_transformer: None,
        decoder: TransformerConfig::new(shape.hidden, 1, 1, true),
        vision: None,
        lstm: Some(LstmConfig {
            variant: LstmVariant::SelfCritical,
            ..LstmConfig::new(shape.model, feed)
        }),
        prompt: Default::default(),
        max_len,
        vocab_size,
        specials: SpecialIds::WORDS,
        prefix_predicts_first: false,
        // The FC model's features are a CNN's pooled outputs, fed as they
        // come.
        raw_embeddings: fc,
    }
}

/// captune's name for self-critical's tensor `theirs` of `model`, or none
/// for one captune has no place for.
fn our_name(model: LstmModel, theirs: &str) -> Option<String> {
    if theirs == "core.attention.alpha_net.bias" {
        return None;
    }
    let layer = if model == LstmModel::Fc { "_l0" } else { "" };
    // The new FC model keeps FCModel's core as `_core`.
    let theirs = theirs.strip_prefix('_').unwrap_or(theirs);
    for (from, side) in [("core.i2h.", "ih"), ("core.h2h.", "hh")] {
        if let Some(what) = theirs.strip_prefix(from) {
            return Some(format!("core.lstm.{what}_{side}{layer}"));
        }
    }
    if let Some(what) = theirs.strip_prefix("img_embed.") {
        return Some(format!("fc_embed.{what}"));
    }
    for sequential in ["embed.0.", "att_embed.0.", "fc_embed.0."] {
        if let Some(what) = theirs.strip_prefix(sequential) {
            return Some(format!("{}{what}", &sequential[..sequential.len() - 2]));
        }
    }
    Some(theirs.to_string())
}

/// self-critical's tensors (weights, or their gradients) under captune's
/// names, with the vocabulary's rows moved.
pub fn convert(theirs: TensorFile, vocab: &TheirVocab) -> Result<TensorFile> {
    let model = model(&theirs)?;
    let (embed_rows, logit_rows) = vocab.rows();
    let ids = vocab.words.len() + 1;
    let mut ours = TensorFile::new([]);
    let mut tensors: Vec<(String, Tensor)> = theirs.tensors.into_iter().collect();
    // In name order, so that an error names the same tensor every time.
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, tensor) in tensors {
        let Some(to) = our_name(model, &name) else {
            continue;
        };
        let rows = match to.as_str() {
            "embed.weight" => Some(&embed_rows),
            "logit.weight" | "logit.bias" => Some(&logit_rows),
            _ => None,
        };
        let tensor = match rows {
            Some(_) if tensor.shape.first() != Some(&ids) => bail!(
                "{name} has {} rows, but the vocabulary has {} words and id 0: is it this \
                 model's cocotalk.json?",
                tensor.shape.first().copied().unwrap_or(0),
                ids - 1
            ),
            Some(rows) => {
                let mut moved = moved_rows(&tensor, rows);
                if to == "logit.bias" && !vocab.has_unk() {
                    moved.data[UNK as usize] = NEVER;
                }
                moved
            }
            None => tensor,
        };
        if ours.tensors.insert(to.clone(), tensor).is_some() {
            bail!("two of its tensors would both be {to:?}");
        }
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
