//! A captioner as a Hugging Face folder: its decoder as a GPT-2 that
//! transformers' `GPT2LMHeadModel.from_pretrained` loads as is
//! (`config.json`, `model.safetensors`, `generation_config.json`), its
//! vocabulary as a `tokenizer.json` that `PreTrainedTokenizerFast` reads
//! (a word vocabulary as a word-level tokenizer; a GPT-2's BPE tokenizer
//! as it came), and its mapper in `mapper.safetensors` (docs/checkpoints.md,
//! "Export to transformers").
//!
//! The decoder's token embedding is GPT-2's `wte` (tied, so no
//! `lm_head`), its positions `wpe` (`n_positions` = the prefix and the
//! caption's positions), its blocks GPT-2's blocks under the names
//! `model::gpt2` maps. Ids keep their numbers. A word vocabulary's masked
//! ids go to `suppress_tokens` in the generation config, so that
//! transformers' `generate` never chooses them either; a GPT-2's padding
//! row, which captune added after GPT-2's ids, is left out, so the
//! folder is a GPT-2 of its original vocabulary again.
//!
//! A decoder that came from a GPT-2 folder, given that folder, is written
//! as that GPT-2 with what training changed: its `config.json` as it was
//! (every field kept), its generation config, and the position rows past
//! the captioner's positions, which training never reads. A BLIP decoder
//! is written as the BLIP folder it came from ([`blip`]).

mod blip;

use super::decoders::prefix::is_mapper_param;
use super::{CaptionVocab, CaptionerConfig, Checkpoint, DecoderFamily};
use crate::backend::Backend;
use crate::data::bpe::END;
use crate::data::karpathy::read_json;
use crate::data::vocab::{SPECIALS, Vocab};
use crate::model::gpt2;
use crate::model::layers::Activation;
use crate::tensorfile;
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;

/// The mapper's file in an export.
pub const MAPPER_FILE: &str = "mapper.safetensors";

/// Writes `ck` into the folder `out` (created; files in it are replaced);
/// `base` is the GPT-2 or BLIP folder its decoder came from, if any (a
/// BLIP decoder's is needed: it holds the rest of the model).
pub fn to_hf<B: Backend>(b: &B, ck: &Checkpoint<B>, out: &Path, base: Option<&Path>) -> Result<()> {
    if let CaptionVocab::WordPieces(_) = ck.vocab {
        let Some(base) = base else {
            bail!(
                "a BLIP captioner is exported as the BLIP folder it came from, with its trained \
                 text decoder: name that folder (--decoder hf:FOLDER)"
            );
        };
        return blip::to_hf(b, ck, out, base);
    }
    if ck.model.config.family == DecoderFamily::Lstm {
        bail!(
            "an LSTM captioner has no Hugging Face form; its checkpoint's tensors carry \
             PyTorch's names and layouts already (docs/lstm.md says how to load them)"
        );
    }
    let model = &ck.model;
    let c = model.config;
    let d = c.decoder;
    // A GPT-2's own ids, and no padding: the padding row after them goes.
    let (exported_ids, pad) = match &ck.vocab {
        CaptionVocab::Words(_) => (c.vocab_size, Some(c.specials.pad)),
        CaptionVocab::Pieces(_) => (c.vocab_size - 1, None),
        CaptionVocab::WordPieces(_) => unreachable!("exported above"),
    };
    let base = match base {
        Some(dir) => Some(Base::read(dir, &c, exported_ids)?),
        None => None,
    };
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut decoder: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut mapper: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (spec, value) in model.params().specs.iter().zip(&model.params().values) {
        let data = b.to_vec(value);
        if is_mapper_param(&spec.name) {
            mapper.push((spec.name.clone(), spec.shape.clone(), data));
            continue;
        }
        let ours = spec
            .name
            .strip_prefix("decoder.")
            .with_context(|| format!("{}: not a decoder tensor", spec.name))?;
        let Some(theirs) = gpt2::gpt2_name(ours) else {
            bail!("{}: GPT-2 has no such tensor", spec.name);
        };
        let (shape, data) = match (ours, &base) {
            ("tokens", _) => (
                vec![exported_ids, d.width],
                data[..exported_ids * d.width].to_vec(),
            ),
            // The trained rows, then the GPT-2's own past them.
            ("positions", Some(base)) => {
                let mut rows = data;
                rows.extend_from_slice(&base.positions.data[rows.len()..]);
                (base.positions.shape.clone(), rows)
            }
            _ => (spec.shape.clone(), data),
        };
        decoder.push((theirs, shape, data));
    }
    let write = |file: &str, tensors: &[(String, Vec<usize>, Vec<f32>)], meta| {
        let views: Vec<(&str, Vec<usize>, &[f32])> = tensors
            .iter()
            .map(|(n, s, v)| (n.as_str(), s.clone(), v.as_slice()))
            .collect();
        tensorfile::write(&out.join(file), &views, meta)
    };
    let pt = HashMap::from([("format".to_string(), "pt".to_string())]);
    write("model.safetensors", &decoder, pt)?;
    let s = c.specials;
    let mapper_meta = mapper_metadata(&c)
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect();
    write(MAPPER_FILE, &mapper, mapper_meta)?;
    let mut config = json!({
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": exported_ids,
        "n_positions": c.seq_len(),
        "n_embd": d.width,
        "n_layer": d.layers,
        "n_head": d.heads,
        "n_inner": null,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": true,
        "bos_token_id": s.start,
        "eos_token_id": s.end,
        "pad_token_id": pad,
    });
    let mut generation = json!({
        "bos_token_id": s.start,
        "eos_token_id": s.end,
        "pad_token_id": pad,
        "suppress_tokens": s.masked_distinct().into_iter().filter(|&id| (id as usize) < exported_ids).collect::<Vec<_>>(),
    });
    if let Some(base) = base {
        config = base.config;
        generation = base.generation.unwrap_or(generation);
    }
    // Where the prefix ends and how many positions a caption may take,
    // which n_positions no longer says when the GPT-2's are kept.
    config["captune_prefix_len"] = json!(c.prefix_len);
    config["captune_caption_positions"] = json!(c.token_positions());
    if c.prefix_predicts_first {
        config[PREFIX_PREDICTS_FIRST] = json!(true);
    }
    if c.raw_embeddings {
        config[RAW_EMBEDDINGS] = json!(true);
    }
    if let CaptionVocab::Pieces(v) = &ck.vocab
        && v.bpe.end_token() != END
    {
        config[CAPTION_END] = json!(v.bpe.end_token());
    }
    write_json(out, "config.json", &config)?;
    write_json(out, "generation_config.json", &generation)?;
    match &ck.vocab {
        CaptionVocab::Words(v) => write_word_tokenizer(out, &v.words),
        CaptionVocab::Pieces(v) => {
            tensorfile::write_atomic(&out.join("tokenizer.json"), v.bpe.json().as_bytes())?;
            let config = json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": END,
                "eos_token": END,
                "unk_token": END,
            });
            write_json(out, "tokenizer_config.json", &config)
        }
        CaptionVocab::WordPieces(_) => unreachable!("exported above"),
    }
}

/// config.json's mark of a decoder in ClipCap's own layout: no start is
/// fed, the prefix's last position predicts the first piece.
pub const PREFIX_PREDICTS_FIRST: &str = "captune_prefix_predicts_first";
/// config.json's mark of a mapper that reads image embeddings
/// unnormalised (ClipCap's MLP checkpoints).
pub const RAW_EMBEDDINGS: &str = "captune_raw_embeddings";
/// config.json's piece a GPT-2 decoder's captions end at, where it is not
/// `<|endoftext|>` (ClipCap's own ".").
pub const CAPTION_END: &str = "captune_caption_end";

/// What an export keeps of the GPT-2 folder a decoder came from.
struct Base {
    /// Its `config.json`, every field as written.
    config: serde_json::Value,
    /// Its `generation_config.json`, where it has one.
    generation: Option<serde_json::Value>,
    /// Its whole position table, `[n_positions, width]`.
    positions: tensorfile::Tensor,
}

impl Base {
    /// Reads `dir`, which must be a GPT-2 of the checkpoint's shape.
    fn read(dir: &Path, c: &CaptionerConfig, vocab: usize) -> Result<Base> {
        let mut gpt2 = gpt2::read(dir, "decoder")?;
        let g = &gpt2.config;
        let config_path = dir.join("config.json");
        let d = c.decoder;
        for (field, theirs, ours) in [
            ("vocab_size", g.vocab_size, vocab),
            ("n_embd", g.n_embd, d.width),
            ("n_layer", g.n_layer, d.layers),
            ("n_head", g.n_head, d.heads),
        ] {
            if theirs != ours {
                bail!(
                    "{}: {field} is {theirs} but the captioner's is {ours}: this is not the GPT-2 \
                     its decoder came from",
                    config_path.display()
                );
            }
        }
        if g.n_positions < c.seq_len() {
            bail!(
                "{}: n_positions is {} but the captioner uses {}: this is not the GPT-2 its \
                 decoder came from",
                config_path.display(),
                g.n_positions,
                c.seq_len()
            );
        }
        let generation_path = dir.join("generation_config.json");
        let generation = match generation_path.is_file() {
            true => Some(read_json(&generation_path)?),
            false => None,
        };
        let positions = gpt2
            .weights
            .tensors
            .remove("decoder.positions")
            .expect("gpt2::read gives the positions");
        Ok(Base {
            config: read_json(&config_path)?,
            generation,
            positions,
        })
    }
}

/// The mapper's shape, as `mapper.safetensors`'s metadata gives it: its
/// kind (`mlp` or `transformer`), the embedding, prefix and hidden sizes,
/// the activation, and a transformer mapper's `clip_len`, `layers` and
/// `heads`.
pub fn mapper_metadata(c: &CaptionerConfig) -> Vec<(&'static str, String)> {
    let activation = match c.mapper_activation {
        Activation::Gelu => "gelu_new",
        Activation::Tanh => "tanh",
        Activation::Relu => "relu",
        Activation::QuickGelu => "quick_gelu",
        Activation::GeluErf => "gelu",
    };
    let kind = if c.mapper_transformer.is_some() {
        "transformer"
    } else {
        "mlp"
    };
    let mut meta = vec![
        ("mapper", kind.to_string()),
        ("embed_dim", c.embed_dim.to_string()),
        ("prefix_len", c.prefix_len.to_string()),
        ("mapper_hidden", c.mapper_hidden.to_string()),
        ("activation", activation.to_string()),
    ];
    if let Some(t) = &c.mapper_transformer {
        meta.push(("clip_len", t.clip_len.to_string()));
        meta.push(("layers", t.layers.to_string()));
        meta.push(("heads", t.heads.to_string()));
    }
    meta
}

fn write_json(dir: &Path, file: &str, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    tensorfile::write_atomic(&dir.join(file), text.as_bytes())
}

/// The word vocabulary as a `tokenizer.json` (a word-level model that
/// splits on whitespace, as captune's captions are PTB words) and a
/// `tokenizer_config.json` naming the special tokens.
fn write_word_tokenizer(dir: &Path, words: &Vocab) -> Result<()> {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..words.len())
        .map(|id| (words.word(id as u32).to_string(), json!(id)))
        .collect();
    let added: Vec<serde_json::Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(id, token)| {
            json!({"id": id, "content": token, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": SPECIALS[3]},
    });
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": SPECIALS[0],
        "bos_token": SPECIALS[1],
        "eos_token": SPECIALS[2],
        "unk_token": SPECIALS[3],
    });
    write_json(dir, "tokenizer.json", &tokenizer)?;
    write_json(dir, "tokenizer_config.json", &config)
}
