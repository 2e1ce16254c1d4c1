//! Reading a Hugging Face model folder as `save_pretrained` writes it:
//! `config.json` and the weights, `model.safetensors` or the shards that
//! `model.safetensors.index.json` lists (float32, float16 or bfloat16,
//! widened to f32). What the tensors mean is each architecture's file.

use crate::tensorfile::{self, TensorFile};
use anyhow::{Context, Result, bail};
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

pub struct HfFolder {
    pub dir: PathBuf,
}

impl HfFolder {
    pub fn open(dir: &Path) -> Result<HfFolder> {
        if !dir.join("config.json").is_file() {
            bail!(
                "{}: not a Hugging Face model folder (no config.json); pass the folder \
                 `save_pretrained` wrote",
                dir.display()
            );
        }
        Ok(HfFolder {
            dir: dir.to_path_buf(),
        })
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.json")
    }

    /// `config.json` as `T`; an error names the file and the field.
    pub fn config<T: DeserializeOwned>(&self) -> Result<T> {
        let path = self.config_path();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not a config this model reads", path.display()))
    }

    /// `config.json`'s `model_type` ("gpt2", "blip", ...; empty when it
    /// has none): read first, since another model's config lacks the
    /// fields an architecture reads and its type says more than they do.
    pub fn model_type(&self) -> Result<String> {
        #[derive(serde::Deserialize)]
        struct ModelType {
            #[serde(default)]
            model_type: String,
        }
        Ok(self.config::<ModelType>()?.model_type)
    }

    /// The file that lists the weights: `model.safetensors`, or the index
    /// of its shards.
    pub fn weights_file(&self) -> PathBuf {
        let single = self.dir.join("model.safetensors");
        if single.is_file() {
            single
        } else {
            self.dir.join("model.safetensors.index.json")
        }
    }

    /// Every weight tensor, by the checkpoint's names, and the file (or
    /// index) they came from.
    pub fn weights(&self) -> Result<(TensorFile, PathBuf)> {
        let single = self.dir.join("model.safetensors");
        if single.is_file() {
            return Ok((tensorfile::read(&single)?, single));
        }
        let index = self.dir.join("model.safetensors.index.json");
        if !index.is_file() {
            bail!(
                "{}: no model.safetensors (nor a sharded model.safetensors.index.json); \
                 save the model with safe_serialization=True",
                self.dir.display()
            );
        }
        let text = std::fs::read_to_string(&index)
            .with_context(|| format!("cannot read {}", index.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not JSON", index.display()))?;
        let map = value["weight_map"]
            .as_object()
            .with_context(|| format!("{}: no \"weight_map\" object", index.display()))?;
        let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut all = TensorFile::new([]);
        for shard in shards {
            let file = tensorfile::read(&self.dir.join(shard))?;
            all.tensors.extend(file.tensors);
        }
        Ok((all, index))
    }
}
