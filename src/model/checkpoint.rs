//! Both models' checkpoints: the weights by name, with the model's config
//! (JSON) and its vocabulary in the safetensors metadata, written and read
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
    /// Its vocabulary, kept in the metadata.
    type Vocab: StoredVocab;
    const KIND: Kind;
    fn config(&self) -> &Self::Config;
    fn params(&self) -> &Params<Self::Backend>;
    fn params_mut(&mut self) -> &mut Params<Self::Backend>;
}

/// A vocabulary as a checkpoint's metadata keeps it.
pub trait StoredVocab: Sized {
    fn store(&self, metadata: &mut HashMap<String, String>) -> Result<()>;
    /// Reads it from `file`'s metadata; it must have the config's `ids`.
    fn read(file: &TensorFile, path: &Path, ids: usize) -> Result<Self>;
}

/// Stores a word vocabulary: the words after the four specials, in id
/// order.
pub fn store_words(words: &[String], metadata: &mut HashMap<String, String>) -> Result<()> {
    metadata.insert(VOCAB_KEY.into(), serde_json::to_string(words)?);
    Ok(())
}

/// The words [`store_words`] stored, which with the four specials must
/// make `ids` ids.
pub fn read_words(file: &TensorFile, path: &Path, ids: usize) -> Result<Vec<String>> {
    let words: Vec<String> =
        serde_json::from_str(file.meta(VOCAB_KEY, path)?).with_context(|| {
            format!(
                "{}: metadata {VOCAB_KEY:?} is not a word list",
                path.display()
            )
        })?;
    let held = words.len() + crate::data::vocab::SPECIALS.len();
    if held != ids {
        bail!(
            "{}: the vocabulary has {held} words but the config says {ids}",
            path.display()
        );
    }
    Ok(words)
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
        self.vocab.store(&mut metadata)?;
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
        let (config, vocab, mut file) = read::<M::Config, M::Vocab>(&M::KIND, path)?;
        let mut model = build(config)?;
        model.params_mut().load(b, path, &mut file)?;
        Ok(Checkpoint { model, vocab })
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

/// Reads a checkpoint's config and vocabulary, and refuses a config that
/// is invalid or does not fit the file's tensors or vocabulary, before
/// any model of it is allocated (a damaged config could ask for any
/// size). The file stays open for `Params::load`.
fn read<C: ModelConfig, V: StoredVocab>(kind: &Kind, path: &Path) -> Result<(C, V, TensorFile)> {
    let file = tensorfile::read(path)?;
    let config: C = serde_json::from_str(file.meta(kind.config_key, path)?).with_context(|| {
        format!(
            "{}: metadata {:?} is not a {} config",
            path.display(),
            kind.config_key,
            kind.format
        )
    })?;
    config.validate().map_err(|e| {
        anyhow::anyhow!(
            "{}: the config in its metadata is invalid: {e}",
            path.display()
        )
    })?;
    check_size(path, &file, config.parameter_count())?;
    let vocab = V::read(&file, path, config.vocab_size())?;
    Ok((config, vocab, file))
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
