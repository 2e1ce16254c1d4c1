//! Both models' checkpoints: the weights by name, with the model's config
//! (JSON) and its word list in the safetensors metadata, written and read
//! here once for both ([`Checkpoint`]).

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

/// A model a checkpoint holds.
pub trait Model {
    type Backend: Backend;
    type Config: ModelConfig + Serialize;
    /// Its vocabulary, kept as a word list in the metadata.
    type Vocab: WordList;
    const KIND: Kind;
    fn config(&self) -> &Self::Config;
    fn params(&self) -> &Params<Self::Backend>;
    fn params_mut(&mut self) -> &mut Params<Self::Backend>;
}

/// A vocabulary as the words after the specials, in id order.
pub trait WordList {
    fn from_words(words: Vec<String>) -> Self;
    fn words(&self) -> &[String];
}

/// A model with its vocabulary, as a checkpoint holds them.
pub struct Checkpoint<M: Model> {
    pub model: M,
    pub vocab: M::Vocab,
}

impl<M: Model> Checkpoint<M> {
    /// Writes the weights (atomically), with the config and vocabulary in
    /// the metadata.
    pub fn save(
        &self,
        b: &M::Backend,
        path: &Path,
        mut metadata: HashMap<String, String>,
    ) -> Result<()> {
        let kind = &M::KIND;
        let config = serde_json::to_string(self.model.config())?;
        metadata.insert(kind.config_key.into(), config);
        let words = serde_json::to_string(self.vocab.words())?;
        metadata.insert(VOCAB_KEY.into(), words);
        metadata.insert("format".into(), kind.format.into());
        self.model.params().save(b, path, metadata)
    }

    /// Reads a checkpoint: its config is checked against the file (`read`)
    /// before `build` makes the model, whose weights are then loaded.
    pub fn load_with(
        b: &M::Backend,
        path: &Path,
        build: impl FnOnce(M::Config) -> Result<M>,
    ) -> Result<Self> {
        let (config, words, mut file) = read::<M::Config>(&M::KIND, path)?;
        let mut model = build(config)?;
        model.params_mut().load(b, path, &mut file)?;
        Ok(Checkpoint {
            model,
            vocab: M::Vocab::from_words(words),
        })
    }
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
fn read<C: ModelConfig>(kind: &Kind, path: &Path) -> Result<(C, Vec<String>, TensorFile)> {
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
