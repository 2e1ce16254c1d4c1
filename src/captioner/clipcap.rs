//! ClipCap's own checkpoints (Mokady, Hertz and Bermano, 2021, "ClipCap:
//! CLIP Prefix for Image Captioning"): `torch.save` of a
//! `ClipCaptionModel`'s state dict, such as its released COCO and
//! Conceptual Captions weights, read without running code
//! ([`crate::torch_checkpoint`]). Its GPT-2 is under `gpt.`, named as a
//! Hugging Face GPT-2 saves it after that; its mapper under
//! `clip_project.`, one of two:
//! - the MLP: `model.0` (the embedding to the hidden size), tanh,
//!   `model.2` (to `prefix_len` vectors of GPT-2's width);
//! - the transformer mapper: `linear` (the embedding to `clip_len`
//!   vectors), `prefix_const` (the `prefix_len` learned constants), and
//!   blocks `transformer.layers.{i}` of 8 heads: `norm1`, `attn.to_queries`
//!   and `attn.to_keys_values` (without biases), `attn.project`, `norm2`,
//!   `mlp.fc1`, ReLU, `mlp.fc2`.
//!
//! Weights are PyTorch's `nn.Linear` `[out, in]`, transposed to captune's
//! `[in, out]`; the queries' weight beside the keys' and values' is the
//! fused qkv (columns q, k, v, as `to_keys_values` orders keys before
//! values). A converted captioner reads and decodes as ClipCap does: no
//! start token is fed (the prefix's last position predicts the first
//! piece), captions end at ".", which its training captions end with,
//! and an MLP reads image embeddings unnormalised, as its authors feed
//! CLIP's.

use super::pretrained::{PrefixShape, Reading, gpt2_config, with_gpt2_weights, write_mapper};
use super::{CaptionVocab, Checkpoint, MapperTransformer};
use crate::backend::Backend;
use crate::data::bpe::BpeVocab;
use crate::model::gpt2;
use crate::tensorfile::{Tensor, TensorFile};
use crate::torch_checkpoint;
use anyhow::{Context, Result, bail};
use std::path::Path;

/// The piece ClipCap's captions end at.
pub const STOP: &str = ".";

/// Heads of every block of ClipCap's transformer mapper.
const MAPPER_HEADS: usize = 8;

/// GPT-2 tensors a `ClipCaptionModel` state dict holds that captune has
/// no place for: the output layer (tied to the token embedding) and the
/// attention's mask buffers of older transformers.
fn is_unused_gpt2_tensor(name: &str) -> bool {
    name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
}

/// A captioner from the ClipCap checkpoint `path`, with the GPT-2 folder
/// `gpt2_dir`'s config.json and tokenizer.json (its weights are the
/// checkpoint's), captions of at most `max_len` positions.
pub fn read<B: Backend>(
    b: &B,
    path: &Path,
    gpt2_dir: &Path,
    max_len: usize,
) -> Result<Checkpoint<B>> {
    let shown = path.display();
    let file = torch_checkpoint::read_state_dict(path, None)?;
    let (mut gpt, mut mapper) = (TensorFile::new([]), TensorFile::new([]));
    let mut tensors: Vec<(String, Tensor)> = file.tensors.into_iter().collect();
    // In name order, so that an error names the same tensor every time.
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, tensor) in tensors {
        if let Some(rest) = name.strip_prefix("gpt.") {
            gpt.tensors.insert(rest.to_string(), tensor);
        } else if let Some(rest) = name.strip_prefix("clip_project.") {
            mapper.tensors.insert(rest.to_string(), tensor);
        } else {
            bail!(
                "{shown}: tensor {name:?} is neither GPT-2's (gpt.) nor the mapper's \
                 (clip_project.): not a ClipCaptionModel's state dict"
            );
        }
    }
    let gpt2 = gpt2::from_tensors(gpt2_dir, &mut gpt, path, "decoder")
        .with_context(|| format!("{shown}: its GPT-2 (gpt.) against {}", gpt2_dir.display()))?;
    if let Some(name) = (gpt.tensors.keys())
        .filter(|n| !is_unused_gpt2_tensor(n))
        .min()
    {
        bail!("{shown}: GPT-2 tensor \"gpt.{name}\" has no place in GPT-2");
    }
    let width = gpt2.config.n_embd;
    let (shape, ours) =
        mapper_tensors(mapper, width, max_len).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    let bpe = BpeVocab::load(gpt2_dir)?.ending_at(STOP)?;
    let reading = Reading {
        prefix_predicts_first: true,
        // The MLP was trained on CLIP's embeddings as they come
        // (predict.py); the transformer mapper on L2-normalised ones (its
        // notebook).
        raw_embeddings: shape.mapper_transformer.is_none(),
    };
    let config = gpt2_config(&gpt2, shape, bpe.end(), reading)?;
    let mut model = with_gpt2_weights(b, gpt2, config, 0)?;
    write_mapper(b, &mut model, ours, path)?;
    let vocab = CaptionVocab::from_tokenizer(bpe, config.vocab_size)?;
    Ok(Checkpoint { model, vocab })
}

/// The mapper's shape, read from its tensors' (ClipCap names them
/// without the `clip_project.` prefix), and its tensors under captune's
/// names and layouts.
fn mapper_tensors(
    mut theirs: TensorFile,
    width: usize,
    max_len: usize,
) -> Result<(PrefixShape, TensorFile)> {
    let mut take = |name: &str| take_from(&mut theirs, name);
    let mut ours = TensorFile::new([]);
    let mut put = |name: &str, t: Tensor| ours.tensors.insert(format!("mapper.{name}"), t);
    let mlp = take("model.0.weight").ok();
    let shape = if let Some(fc1) = mlp {
        let fc1 = matrix(fc1, "model.0.weight")?;
        let fc2 = matrix(take("model.2.weight")?, "model.2.weight")?;
        let (hidden, embed_dim, out) = (fc1.shape[0], fc1.shape[1], fc2.shape[0]);
        if fc2.shape[1] != hidden || out % width != 0 {
            bail!(
                "the MLP's weights {:?} and {:?} do not make vectors of GPT-2's width {width}",
                fc1.shape,
                fc2.shape
            );
        }
        put("fc1.weight", fc1.transposed());
        put("fc1.bias", take("model.0.bias")?);
        put("fc2.weight", fc2.transposed());
        put("fc2.bias", take("model.2.bias")?);
        PrefixShape {
            embed_dim,
            prefix_len: out / width,
            mapper_hidden: hidden,
            mapper_transformer: None,
            max_len,
        }
    } else {
        let linear = matrix(take("linear.weight")?, "linear.weight")?;
        let constants = take("prefix_const")?;
        let (out, embed_dim) = (linear.shape[0], linear.shape[1]);
        if out % width != 0 || constants.shape.len() != 2 || constants.shape[1] != width {
            bail!(
                "the transformer mapper's linear {:?} and prefix_const {:?} are not of GPT-2's \
                 width {width}",
                linear.shape,
                constants.shape
            );
        }
        let prefix_len = constants.shape[0];
        put("linear.weight", linear.transposed());
        put("linear.bias", take("linear.bias")?);
        put("constants", constants);
        let mut layers = 0;
        let mut hidden = 0;
        while let Ok(norm1) = take(&format!("transformer.layers.{layers}.norm1.weight")) {
            let block = |name: &str| format!("transformer.layers.{layers}.{name}");
            let ours = |name: &str| format!("transformer.blocks.{layers}.{name}");
            put(&ours("ln1.weight"), norm1);
            put(&ours("ln1.bias"), take(&block("norm1.bias"))?);
            put(&ours("ln2.weight"), take(&block("norm2.weight"))?);
            put(&ours("ln2.bias"), take(&block("norm2.bias"))?);
            let (q, kv) = (
                take(&block("attn.to_queries.weight"))?,
                take(&block("attn.to_keys_values.weight"))?,
            );
            if q.shape != [width, width] || kv.shape != [2 * width, width] {
                bail!(
                    "block {layers}'s to_queries {:?} and to_keys_values {:?} are not of GPT-2's \
                     width {width}",
                    q.shape,
                    kv.shape
                );
            }
            let qkv = Tensor {
                shape: vec![3 * width, width],
                data: [q.data, kv.data].concat(),
            };
            put(&ours("attn.qkv.weight"), qkv.transposed());
            put(
                &ours("attn.proj.weight"),
                matrix(take(&block("attn.project.weight"))?, "attn.project.weight")?.transposed(),
            );
            put(&ours("attn.proj.bias"), take(&block("attn.project.bias"))?);
            let fc1 = matrix(take(&block("mlp.fc1.weight"))?, "mlp.fc1.weight")?;
            hidden = fc1.shape[0];
            put(&ours("mlp.fc1.weight"), fc1.transposed());
            put(&ours("mlp.fc1.bias"), take(&block("mlp.fc1.bias"))?);
            put(
                &ours("mlp.fc2.weight"),
                matrix(take(&block("mlp.fc2.weight"))?, "mlp.fc2.weight")?.transposed(),
            );
            put(&ours("mlp.fc2.bias"), take(&block("mlp.fc2.bias"))?);
            layers += 1;
        }
        if layers == 0 {
            bail!(
                "no mapper tensor \"clip_project.model.0.weight\" (the MLP) nor \
                 \"clip_project.transformer.layers.0.norm1.weight\" (the transformer mapper)"
            );
        }
        PrefixShape {
            embed_dim,
            prefix_len,
            mapper_hidden: hidden,
            mapper_transformer: Some(MapperTransformer {
                clip_len: out / width,
                layers,
                heads: MAPPER_HEADS,
            }),
            max_len,
        }
    };
    if let Some(name) = theirs.tensors.keys().min() {
        bail!("mapper tensor \"clip_project.{name}\" has no place in ClipCap's mapper");
    }
    Ok((shape, ours))
}

/// `t`, the mapper tensor `name`, which must be a matrix.
fn matrix(t: Tensor, name: &str) -> Result<Tensor> {
    if t.shape.len() != 2 {
        bail!(
            "mapper tensor \"clip_project.{name}\" has shape {:?}, not a matrix",
            t.shape
        );
    }
    Ok(t)
}

/// The mapper tensor `name` (ClipCap's, without `clip_project.`), taken.
fn take_from(theirs: &mut TensorFile, name: &str) -> Result<Tensor> {
    theirs
        .tensors
        .remove(name)
        .with_context(|| format!("no mapper tensor \"clip_project.{name}\""))
}
