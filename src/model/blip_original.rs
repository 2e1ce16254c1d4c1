//! BLIP's own checkpoints (Li, Li, Xiong and Hoi, 2022, "BLIP:
//! Bootstrapping Language-Image Pre-training"), as its authors' code saves
//! them: `torch.save({"model": state_dict, ...})` of a `BLIP_Decoder`
//! (`model_base_caption_capfilt_large.pth`, and the SMILE paper's released
//! model, saved the same way), read without running code and written as
//! the Hugging Face folder [`super::blip`] reads.
//!
//! The text decoder (`text_decoder.bert.*`, `text_decoder.cls.*`) has
//! transformers' names already. The vision tower is renamed from the
//! authors' ViT (`visual_encoder.`): `cls_token`, `pos_embed`,
//! `patch_embed.proj`, `blocks.{i}.norm1`, `attn.qkv`, `attn.proj`,
//! `norm2`, `mlp.fc1`, `mlp.fc2`, and the final `norm`; the layouts are
//! the same. Their ViT's layer norms take epsilon 1e-6, which the
//! folder's config then says (transformers' BLIP config defaults to 1e-5).

use super::hf::HfFolder;
use crate::cache::{self, absolute, file_identity};
use crate::tensorfile::{self, Tensor, TensorFile, fingerprint, temporary_suffix};
use crate::torch_checkpoint;
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The layer-norm epsilon of the authors' ViT (`partial(nn.LayerNorm,
/// eps=1e-6)` in its vit.py).
const VISION_NORM_EPS: f64 = 1e-6;

/// transformers' name of the authors' vision tensor `name` (after
/// `visual_encoder.`), or None for one transformers has no place for.
fn vision_name(name: &str) -> Option<String> {
    let theirs = match name {
        "cls_token" => "embeddings.class_embedding".to_string(),
        "pos_embed" => "embeddings.position_embedding".to_string(),
        "norm.weight" | "norm.bias" => format!("post_layernorm.{}", &name[5..]),
        _ => {
            if let Some(part) = name.strip_prefix("patch_embed.proj.") {
                format!("embeddings.patch_embedding.{part}")
            } else {
                let rest = name.strip_prefix("blocks.")?;
                let (layer, inner) = rest.split_once('.')?;
                let inner = match inner.split_once('.')? {
                    ("norm1", part) => format!("layer_norm1.{part}"),
                    ("norm2", part) => format!("layer_norm2.{part}"),
                    ("attn", part) if part.starts_with("qkv.") => format!("self_attn.{part}"),
                    ("attn", part) => {
                        format!("self_attn.projection.{}", part.strip_prefix("proj.")?)
                    }
                    ("mlp", part) => format!("mlp.{part}"),
                    _ => return None,
                };
                format!("encoder.layers.{layer}.{inner}")
            }
        }
    };
    Some(format!("vision_model.{theirs}"))
}

/// The tensors of BLIP's checkpoint at `path` (its `model` entry, or a
/// bare state dict) under transformers' names.
fn renamed(path: &Path) -> Result<TensorFile> {
    let shown = path.display();
    let file = torch_checkpoint::read_state_dict(path, None)?;
    let mut out = TensorFile::new([]);
    let mut tensors: Vec<(String, Tensor)> = file.tensors.into_iter().collect();
    // In name order, so that an error names the same tensor every time.
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, tensor) in tensors {
        let theirs = if let Some(vision) = name.strip_prefix("visual_encoder.") {
            vision_name(vision)
        } else if name.starts_with("text_decoder.") {
            // A buffer of positions 0..n, which transformers makes itself.
            (!name.ends_with(".position_ids")).then(|| name.clone())
        } else {
            bail!(
                "{shown}: tensor {name:?} is neither the vision tower's (visual_encoder.) nor the \
                 text decoder's (text_decoder.): not a BLIP captioner's (BLIP_Decoder) state dict"
            );
        };
        match theirs {
            Some(theirs) => {
                out.tensors.insert(theirs, tensor);
            }
            None if name.ends_with(".position_ids") => {}
            None => bail!("{shown}: vision tensor {name:?} has no place in BLIP's vision tower"),
        }
    }
    Ok(out)
}

/// Writes BLIP's checkpoint `checkpoint` as a Hugging Face BLIP folder
/// `out`: the folder `config_dir`'s files (a BLIP of the same sizes, saved
/// with save_pretrained: config.json, the tokenizer, the processor's
/// config), its weights replaced by the checkpoint's, its vision config
/// given the authors' layer-norm epsilon. The folder is then read as any
/// BLIP folder is, which checks every tensor against the config.
pub fn convert(checkpoint: &Path, config_dir: &Path, out: &Path) -> Result<()> {
    let folder = HfFolder::open(config_dir)?;
    if folder.model_type()? != "blip" {
        bail!(
            "{}: not a BLIP folder (model_type \"blip\"); --blip-config names a Hugging Face BLIP \
             captioner's folder of the checkpoint's sizes, for its config and tokenizer",
            config_dir.display()
        );
    }
    let weights = renamed(checkpoint)?;
    let mut config: serde_json::Value = folder.config()?;
    let Some(vision) = config
        .get_mut("vision_config")
        .and_then(|v| v.as_object_mut())
    else {
        bail!(
            "{}: no vision_config object; --blip-config names a BLIP folder saved with \
             save_pretrained",
            folder.config_path().display()
        );
    };
    vision.insert("layer_norm_eps".into(), serde_json::json!(VISION_NORM_EPS));
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for entry in std::fs::read_dir(config_dir)
        .with_context(|| format!("cannot read the folder {}", config_dir.display()))?
    {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let is_weights =
            name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json");
        if path.is_file() && !is_weights && name != "config.json" {
            std::fs::copy(&path, out.join(path.file_name().expect("a file")))
                .with_context(|| format!("cannot copy {}", path.display()))?;
        }
    }
    let text = serde_json::to_string_pretty(&config)?;
    tensorfile::write_atomic(&out.join("config.json"), text.as_bytes())?;
    let mut names: Vec<&String> = weights.tensors.keys().collect();
    names.sort();
    let tensors: Vec<(&str, Vec<usize>, &[f32])> = names
        .iter()
        .map(|n| {
            let t: &Tensor = &weights.tensors[*n];
            (n.as_str(), t.shape.clone(), &t.data[..])
        })
        .collect();
    tensorfile::write(&out.join("model.safetensors"), &tensors, HashMap::new())?;
    // Read back as any BLIP folder: every tensor there, of its shape.
    super::blip::read(out).map(drop).with_context(|| {
        format!(
            "{}: converted with {}, it is not a BLIP of that folder's sizes",
            checkpoint.display(),
            config_dir.display()
        )
    })
}

/// The folder BLIP's checkpoint `checkpoint` converts to with the BLIP
/// folder `config_dir` ([`convert`]), in the cache: converted the first
/// time (into a temporary folder, then renamed), read from there after.
pub fn converted_folder(checkpoint: &Path, config_dir: &Path) -> Result<PathBuf> {
    let mut listing = format!("blip-original\n{}\n", file_identity(&absolute(checkpoint)));
    let mut files: Vec<PathBuf> = std::fs::read_dir(config_dir)
        .with_context(|| format!("cannot read the folder {}", config_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    for file in files {
        listing.push_str(&format!("{}\n", file_identity(&absolute(&file))));
    }
    let dir = cache::converted(&fingerprint(listing.as_bytes()));
    if !dir.join("model.safetensors").is_file() {
        let partial = dir.with_extension(temporary_suffix());
        eprintln!(
            "converting {} into {} (once)",
            checkpoint.display(),
            dir.display()
        );
        convert(checkpoint, config_dir, &partial)?;
        std::fs::rename(&partial, &dir)
            .with_context(|| format!("cannot rename {} to {}", partial.display(), dir.display()))?;
    }
    Ok(dir)
}
