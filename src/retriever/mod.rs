//! The CLIP-like retriever: its configuration, model, training, evaluation
//! and checkpoints.

pub mod bench;
pub mod eval;
pub mod frozen;
pub mod model;
pub mod neighbours;
pub mod train;

use crate::backend::Backend;
use crate::data::images::Images;
use crate::data::vocab::Vocab;
use crate::model::checkpoint;
use crate::model::params::Params;
use crate::model::transformer::TransformerConfig;
use crate::model::vision::VisionConfig;
use crate::tensorfile::TensorFile;
use anyhow::{Result, bail};
use model::Retriever;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetrieverConfig {
    pub image_size: u32,
    pub patch: u32,
    pub image: TransformerConfig,
    pub text: TransformerConfig,
    /// Token positions of the text tower, <bos> and <eos> included.
    pub max_len: usize,
    pub vocab_size: usize,
    pub embed_dim: usize,
    /// How the image tower pools its outputs.
    #[serde(default, skip_serializing_if = "ImagePool::is_mean")]
    pub image_pool: ImagePool,
    /// Whether the patch embedding and both projections have biases
    /// (CLIP's have none).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub biases: bool,
}

/// The image tower's pooling: the mean over the patches' outputs
/// (captune's), or a learned class vector placed before the patches whose
/// output alone is pooled (CLIP's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImagePool {
    #[default]
    Mean,
    Class,
}

impl ImagePool {
    fn is_mean(&self) -> bool {
        *self == ImagePool::Mean
    }
}

fn yes() -> bool {
    true
}

fn is_true(x: &bool) -> bool {
    *x
}

impl RetrieverConfig {
    pub fn patches_per_image(&self) -> usize {
        let side = (self.image_size / self.patch) as usize;
        side * side
    }

    /// Positions of the image tower: the patches, after the class vector
    /// when there is one.
    pub fn image_positions(&self) -> usize {
        self.patches_per_image() + usize::from(self.image_pool == ImagePool::Class)
    }

    /// Parameters of a retriever of this shape (see `docs/checkpoints.md`).
    pub fn parameter_count(&self) -> u128 {
        let (di, dt) = (self.image.width as u128, self.text.width as u128);
        let e = self.embed_dim as u128;
        let bias = |n: u128| if self.biases { n } else { 0 };
        let class = if self.image_pool == ImagePool::Class {
            di
        } else {
            0
        };
        let image = self.patch_dim() as u128 * di
            + bias(di)
            + class
            + self.image_positions() as u128 * di
            + self.image.parameter_count()
            + di * e
            + bias(e);
        let text = (self.vocab_size as u128 + self.max_len as u128) * dt
            + self.text.parameter_count()
            + dt * e
            + bias(e);
        image + text + 1
    }

    /// The image tower's ViT.
    pub fn vision(&self) -> VisionConfig {
        VisionConfig {
            patches: self.patches_per_image(),
            patch_dim: self.patch_dim(),
            class: self.image_pool == ImagePool::Class,
            patch_bias: self.biases,
            transformer: self.image,
        }
    }

    /// Floats per patch: RGB values of a patch x patch square.
    pub fn patch_dim(&self) -> usize {
        (3 * self.patch * self.patch) as usize
    }

    pub fn validate(&self) -> Result<()> {
        if self.patch == 0 || !self.image_size.is_multiple_of(self.patch) {
            bail!(
                "image size {} is not a multiple of the patch size {}",
                self.image_size,
                self.patch
            );
        }
        for (tower, t) in [("image", &self.image), ("text", &self.text)] {
            if t.heads == 0 || t.width % t.heads != 0 {
                bail!(
                    "{tower} tower: width {} is not a multiple of heads {}",
                    t.width,
                    t.heads
                );
            }
        }
        if self.max_len < 3 {
            bail!(
                "max_len {} leaves no room for a token between <bos> and <eos>",
                self.max_len
            );
        }
        Ok(())
    }
}

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

impl checkpoint::ModelConfig for RetrieverConfig {
    fn validate(&self) -> Result<()> {
        RetrieverConfig::validate(self)
    }
    fn parameter_count(&self) -> u128 {
        RetrieverConfig::parameter_count(self)
    }
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
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
