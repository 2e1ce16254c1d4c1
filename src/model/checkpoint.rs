//! What both models' checkpoints share: the weights by name, with the
//! model's config (JSON) and its word list in the safetensors metadata.

use super::params::Params;
use crate::backend::Backend;
use crate::tensorfile::{self, TensorFile};
use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::path::Path;

const VOCAB_KEY: &str = "vocab";

/// Which model a checkpoint holds: its `format` value and the metadata
/// key of its config.
pub struct Kind {
    pub format: &'static str,
    pub config_key: &'static str,
}

/// Writes `params` (atomically) with `config`, `words` and `metadata`.
pub fn save<B: Backend>(
    b: &B,
    kind: &Kind,
    params: &Params<B>,
    config: &impl Serialize,
    words: &[String],
    path: &Path,
    mut metadata: HashMap<String, String>,
) -> Result<()> {
    metadata.insert(kind.config_key.into(), serde_json::to_string(config)?);
    metadata.insert(VOCAB_KEY.into(), serde_json::to_string(words)?);
    metadata.insert("format".into(), kind.format.into());
    params.save(b, path, metadata)
}

/// What loading checks of a model's config before the model is built.
pub trait ModelConfig: DeserializeOwned {
    fn validate(&self) -> Result<()>;
    /// The parameters a model of this config has.
    fn parameter_count(&self) -> u128;
    /// Ids in its vocabulary, the four specials included.
    fn vocab_size(&self) -> usize;
}

/// Reads a checkpoint's config and word list, and refuses a config that
/// is invalid or does not fit the file's tensors or words, before any
/// model of it is allocated (a damaged config could ask for any size).
/// The file stays open for `Params::load`.
pub fn read<C: ModelConfig>(kind: &Kind, path: &Path) -> Result<(C, Vec<String>, TensorFile)> {
    let file = tensorfile::read(path)?;
    let config: C = serde_json::from_str(file.meta(kind.config_key, path)?).with_context(|| {
        format!(
            "{}: metadata {:?} is not a {} config",
            path.display(),
            kind.config_key,
            kind.format
        )
    })?;
    let words: Vec<String> =
        serde_json::from_str(file.meta(VOCAB_KEY, path)?).with_context(|| {
            format!(
                "{}: metadata {VOCAB_KEY:?} is not a word list",
                path.display()
            )
        })?;
    config.validate().map_err(|e| {
        anyhow::anyhow!(
            "{}: the config in its metadata is invalid: {e}",
            path.display()
        )
    })?;
    check_size(path, &file, config.parameter_count())?;
    let ids = words.len() + crate::data::vocab::SPECIALS.len();
    if ids != config.vocab_size() {
        bail!(
            "{}: the vocabulary has {ids} words but the config says {}",
            path.display(),
            config.vocab_size()
        );
    }
    Ok((config, words, file))
}

/// Refuses a file whose tensors do not hold the `expected` number of
/// parameters of its config.
fn check_size(path: &Path, file: &TensorFile, expected: u128) -> Result<()> {
    let held: u128 = file.tensors.values().map(|t| t.data.len() as u128).sum();
    if held != expected {
        bail!(
            "{}: the config in the metadata describes {expected} parameters but the file holds \
             {held}; the config or the tensors are damaged",
            path.display()
        );
    }
    Ok(())
}
