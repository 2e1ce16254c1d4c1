//! A BLIP captioner as a Hugging Face folder: the BLIP folder its decoder
//! came from, with the text decoder's tensors (and the vision tower's,
//! when it was trained) as training left them. The rest (a frozen vision
//! tower, the position rows past the captioner's, the config, the
//! processor's and tokenizer's files) is the folder's, unchanged, so that
//! `BlipForConditionalGeneration.from_pretrained` loads it as the model it
//! was, fine-tuned.

use crate::backend::Backend;
use crate::captioner::blip::blip_config;
use crate::captioner::{CaptionerConfig, Checkpoint};
use crate::model::blip::{self, blip_text_tensors, blip_vision_tensors};
use crate::tensorfile::{self, Tensor};
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::Path;

const POSITIONS: &str = "text_decoder.bert.embeddings.position_embeddings.weight";

/// The prediction head's decoder, tied to the word embedding and the
/// output bias, which some files store as tensors of their own.
const TIED: [(&str, &str); 2] = [
    (
        "text_decoder.cls.predictions.decoder.weight",
        "text_decoder.bert.embeddings.word_embeddings.weight",
    ),
    (
        "text_decoder.cls.predictions.decoder.bias",
        "text_decoder.cls.predictions.bias",
    ),
];

/// Weight files of other formats a Hugging Face folder may hold.
const WEIGHT_FILES: [&str; 4] = [".bin", ".h5", ".msgpack", ".pth"];

/// Writes `ck` into `out` as the BLIP folder `base` with its text decoder.
pub fn to_hf<B: Backend>(b: &B, ck: &Checkpoint<B>, out: &Path, base: &Path) -> Result<()> {
    if let (Ok(o), Ok(f)) = (out.canonicalize(), base.canonicalize())
        && o == f
    {
        bail!(
            "{}: the export would replace the BLIP folder it is made from; choose another --hf",
            out.display()
        );
    }
    let folder = blip::read(base)?;
    let c = ck.model.config;
    let vision = folder.config.vision_config.clone();
    let theirs = CaptionerConfig {
        lstm: None,
        prompt: c.prompt,
        vision: c.vision.map(|_| vision.vision()),
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
    let mut take = |name: &str| {
        ours.remove(name)
            .with_context(|| format!("the captioner has no tensor {name:?}"))
    };
    let mut trained = blip_text_tensors(&folder.config.text_config, positions, &mut take)?;
    // The modules whose every tensor training wrote.
    let mut modules = vec!["text_decoder."];
    if c.vision.is_some() {
        trained.extend(blip_vision_tensors(&vision, &mut take)?);
        modules.push("vision_model.");
    }
    if let Some(name) = ours.keys().next() {
        bail!("the captioner's tensor {name:?} has no place in a BLIP folder");
    }
    let mut replaced: Vec<String> = Vec::new();
    for (name, tensor) in trained {
        if weights.insert(name.clone(), tensor).is_none() {
            bail!("{}: no tensor {name:?} to replace", base.display());
        }
        replaced.push(name);
    }
    // Files converted from PyTorch pickles may also store the head's tied
    // decoder: it is the trained word embedding and output bias too.
    for (tied, from) in TIED {
        let value = weights.get(from).map(|t| t.data.clone());
        if let (Some(t), Some(value)) = (weights.get_mut(tied), value) {
            t.data = value;
        }
    }
    if let Some(name) = weights.keys().find(|n| {
        modules.iter().any(|m| n.starts_with(m))
            && !replaced.contains(n)
            && !TIED.iter().any(|(t, _)| t == n)
    }) {
        bail!(
            "{}: tensor {name:?} is part of a trained module but not of captune's map; the folder \
             is not one captune exports",
            base.display()
        );
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
/// processor, tokenizer) into `out`: weights in any format would be the
/// untrained model beside the trained one.
fn copy_files(base: &Path, out: &Path) -> Result<()> {
    let entries =
        std::fs::read_dir(base).with_context(|| format!("cannot read {}", base.display()))?;
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let weights = name.starts_with("model") && name.contains(".safetensors")
            || WEIGHT_FILES.iter().any(|w| name.ends_with(w));
        if !path.is_file() || weights {
            continue;
        }
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        tensorfile::write_atomic(&out.join(&name), &bytes)?;
    }
    Ok(())
}
