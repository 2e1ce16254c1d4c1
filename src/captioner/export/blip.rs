//! A BLIP captioner as a Hugging Face folder: the BLIP folder its decoder
//! came from, with the text decoder's tensors as training left them. The
//! vision tower, the position rows past the captioner's, the config, the
//! processor's and tokenizer's files are the folder's, unchanged, so that
//! `BlipForConditionalGeneration.from_pretrained` loads it as the model it
//! was, fine-tuned.

use crate::backend::Backend;
use crate::captioner::decoders::blip::blip_config;
use crate::captioner::{CaptionerConfig, Checkpoint};
use crate::model::blip::{self, blip_text_tensors};
use crate::tensorfile::{self, Tensor};
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::Path;

const POSITIONS: &str = "text_decoder.bert.embeddings.position_embeddings.weight";

/// Writes `ck` into `out` as the BLIP folder `base` with its text decoder.
pub fn to_hf<B: Backend>(b: &B, ck: &Checkpoint<B>, out: &Path, base: &Path) -> Result<()> {
    let folder = blip::read(base)?;
    let c = ck.model.config;
    let theirs = CaptionerConfig {
        prompt: c.prompt,
        ..blip_config(&folder.config, c.max_len)
    };
    if theirs != c {
        bail!(
            "{}: not the BLIP folder this captioner's decoder came from (its text decoder is \
             {:?}, the captioner's {:?}); pass the folder it was trained from",
            base.display(),
            theirs.decoder,
            c.decoder
        );
    }
    let params = ck.model.params();
    let mut ours: HashMap<&str, Tensor> = (params.specs.iter())
        .zip(&params.values)
        .map(|(spec, value)| {
            let tensor = Tensor {
                shape: spec.shape.clone(),
                data: b.to_vec(value),
            };
            (spec.name.as_str(), tensor)
        })
        .collect();
    let mut weights = folder.weights.tensors;
    let positions = weights
        .get(POSITIONS)
        .with_context(|| format!("{}: no tensor {POSITIONS:?}", base.display()))?;
    let trained = blip_text_tensors(&folder.config.text_config, positions, |name| {
        ours.remove(name)
            .with_context(|| format!("the captioner has no tensor {name:?}"))
    })?;
    if let Some(name) = ours.keys().next() {
        bail!("the captioner's tensor {name:?} has no place in a BLIP folder");
    }
    for (name, tensor) in trained {
        if weights.insert(name.clone(), tensor).is_none() {
            bail!("{}: no tensor {name:?} to replace", base.display());
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    copy_files(base, out)?;
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    let tensors: Vec<(&str, Vec<usize>, &[f32])> = names
        .iter()
        .map(|name| {
            let t = &weights[*name];
            (name.as_str(), t.shape.clone(), t.data.as_slice())
        })
        .collect();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    tensorfile::write(&out.join("model.safetensors"), &tensors, metadata)
}

/// Every file of the folder but its weights (config, generation config,
/// processor, tokenizer) into `out`.
fn copy_files(base: &Path, out: &Path) -> Result<()> {
    let entries =
        std::fs::read_dir(base).with_context(|| format!("cannot read {}", base.display()))?;
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !path.is_file() || name.starts_with("model") && name.contains(".safetensors") {
            continue;
        }
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        tensorfile::write_atomic(&out.join(&name), &bytes)?;
    }
    Ok(())
}
