//! The frozen vision towers whose image tokens a decoder attends to: a
//! BLIP folder's vision tower (BLIP's own decoder, or an attention LSTM's)
//! or a CLIP folder's image tower (an attention LSTM's), chosen by the
//! folder's model type. Either gives every token of its last layer through
//! its final layer norm, the class token first, then the patches.

use super::blip::{self, BlipVision};
use super::clip::{self, ClipVision};
use super::hf::HfFolder;
use super::vision::Patcher;
use crate::backend::Backend;
use crate::data::image_tokens::TokenShape;
use anyhow::{Result, bail};
use std::path::Path;

/// Which tower a folder holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TowerKind {
    Blip,
    Clip,
}

impl TowerKind {
    /// The kind of the folder `dir`'s tower, by its config's model type.
    pub fn of_folder(dir: &Path) -> Result<Self> {
        let folder = HfFolder::open(dir)?;
        match folder.model_type()?.as_str() {
            "blip" => Ok(TowerKind::Blip),
            "clip" => Ok(TowerKind::Clip),
            other => bail!(
                "{}: model_type {other:?} has no vision tower captune reads image tokens from; \
                 name a Hugging Face BLIP (\"blip\") or CLIP (\"clip\") folder",
                folder.config_path().display()
            ),
        }
    }

    /// The name of the tower's tokens in encoder identities and cache keys.
    pub fn name(self) -> &'static str {
        match self {
            TowerKind::Blip => "blip-vision",
            TowerKind::Clip => "clip-vision",
        }
    }

    /// How the tower of `dir` sees an image, from the folder's configs
    /// alone (checked, as before anything slow).
    pub fn patcher(self, dir: &Path) -> Result<Patcher> {
        match self {
            TowerKind::Blip => blip::patcher(dir),
            TowerKind::Clip => clip::patcher(dir),
        }
    }
}

/// A folder's tower with its weights.
pub enum TokenTower<B: Backend> {
    Blip(Box<BlipVision<B>>),
    Clip(Box<ClipVision<B>>),
}

impl<B: Backend> TokenTower<B> {
    /// The tower of the BLIP or CLIP folder `dir`.
    pub fn open(b: &B, dir: &Path) -> Result<Self> {
        Ok(match TowerKind::of_folder(dir)? {
            TowerKind::Blip => {
                let mut folder = blip::read(dir)?;
                TokenTower::Blip(Box::new(BlipVision::new(b, dir, &mut folder)?))
            }
            TowerKind::Clip => TokenTower::Clip(Box::new(ClipVision::new(b, dir)?)),
        })
    }

    pub fn patcher(&self) -> &Patcher {
        match self {
            TokenTower::Blip(t) => &t.patcher,
            TokenTower::Clip(t) => &t.patcher,
        }
    }

    /// One image's tokens.
    pub fn shape(&self) -> TokenShape {
        let (tokens, dim) = match self {
            TokenTower::Blip(t) => (t.tower.config.tokens(), t.tower.config.transformer.width),
            TokenTower::Clip(t) => t.shape(),
        };
        TokenShape { tokens, dim }
    }

    /// The image tokens `[images, tokens, dim]` of `patches` (`[images,
    /// patches, patch_dim]`, as [`Self::patcher`] cuts them).
    pub fn image_tokens(&mut self, b: &B, patches: &[f32]) -> Result<Vec<f32>> {
        match self {
            TokenTower::Blip(t) => t.image_tokens(b, patches),
            TokenTower::Clip(t) => t.image_tokens(b, patches),
        }
    }

    /// The image tokens `[files, tokens, dim]` of image files, as the
    /// folder's processor prepares them.
    pub fn tokens_of_files(&mut self, b: &B, files: &[&Path]) -> Result<Vec<f32>> {
        let patches = self.patcher().patches_of_files(files, |_| String::new())?;
        self.image_tokens(b, &patches)
    }
}
