//! The CLIP-like retriever's uses: its training, evaluation, checkpoints,
//! the frozen retriever that scores captions, and its benchmark (the
//! network itself is `model::retriever`).

pub mod bench;
pub mod eval;
pub mod frozen;
pub mod neighbours;
pub mod train;

use crate::backend::Backend;
use crate::data::images::Images;
use crate::data::vocab::Vocab;
use crate::model::checkpoint;
use crate::model::params::Params;
use crate::model::retriever::{Retriever, RetrieverConfig};
use crate::tensorfile::TensorFile;
use anyhow::Result;
use std::collections::HashMap;
use std::path::Path;

/// Cuts images into patches, `[batch, patches, patch_dim]`, each value
/// scaled from a byte to about [-2, 2] ((v / 255 - 0.5) / 0.25).
pub fn patchify(config: &RetrieverConfig, images: &Images, indices: &[usize]) -> Vec<f32> {
    assert_eq!(
        images.size, config.image_size,
        "images are loaded at the model's size"
    );
    let (size, p) = (config.image_size as usize, config.patch as usize);
    let side = size / p;
    let mut out =
        Vec::with_capacity(indices.len() * config.patches_per_image() * config.patch_dim());
    for &i in indices {
        let img = images.image(i);
        for py in 0..side {
            for px in 0..side {
                for y in py * p..(py + 1) * p {
                    let row = &img[(y * size + px * p) * 3..(y * size + (px + 1) * p) * 3];
                    out.extend(row.iter().map(|&v| (v as f32 / 255.0 - 0.5) * 4.0));
                }
            }
        }
    }
    out
}

const KIND: checkpoint::Kind = checkpoint::Kind {
    format: "captune retriever",
    config_key: "retriever_config",
};

impl<B: Backend> checkpoint::Model for Retriever<B> {
    type Backend = B;
    type Config = RetrieverConfig;
    type Vocab = Vocab;
    const KIND: checkpoint::Kind = KIND;

    fn config(&self) -> &RetrieverConfig {
        &self.config
    }

    fn params(&self) -> &Params<B> {
        &self.params
    }

    fn params_mut(&mut self) -> &mut Params<B> {
        &mut self.params
    }
}

impl checkpoint::StoredVocab for Vocab {
    fn store(&self, metadata: &mut HashMap<String, String>) -> Result<()> {
        checkpoint::store_words(self.words(), metadata)
    }

    fn read(file: &TensorFile, path: &Path, ids: usize) -> Result<Self> {
        checkpoint::read_words(file, path, ids).map(Vocab::from_words)
    }
}

/// A trained retriever with its vocabulary, as a checkpoint holds them.
pub type Checkpoint<B> = checkpoint::Checkpoint<Retriever<B>>;

impl<B: Backend> Checkpoint<B> {
    /// Loads a checkpoint into a model built for batches of `batch`.
    pub fn load(b: &B, path: &Path, batch: usize) -> Result<Self> {
        Self::load_with(b, path, |config| Retriever::new(b, config, batch, 0))
    }
}
