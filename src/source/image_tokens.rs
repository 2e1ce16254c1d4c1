//! The image tokens an attending decoder reads (BLIP's, an attention
//! LSTM's): every image of a data set through a BLIP or CLIP folder's
//! frozen vision tower ([`TokenTower`]), once, into an image-tokens file
//! in the on-disk cache, keyed by the folder's weights and the images;
//! then read a batch's rows at a time.

use super::images_listing;
use crate::backend::Backend;
use crate::cache::{self, absolute, file_identity};
use crate::data::features::EMBEDDINGS;
use crate::data::image_processor;
use crate::data::image_tokens::{ImageTokens, TokenShape, TokensWriter};
use crate::data::{Dataset, Item};
use crate::model::hf::HfFolder;
use crate::model::token_tower::{TokenTower, TowerKind};
use crate::progress::Progress;
use crate::tensorfile::fingerprint;
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::Path;

/// Images through the vision tower at once.
const IMAGES_PER_BATCH: usize = 16;

/// The image tokens of a data set's items, by item.
#[derive(Debug)]
pub struct TokenRows {
    file: ImageTokens,
    /// Each item's row in `file`.
    rows: Vec<usize>,
}

impl TokenRows {
    pub fn shape(&self) -> TokenShape {
        self.file.shape
    }

    /// The tokens of `items`, `[items.len(), tokens, dim]`.
    pub fn of(&self, items: &[usize]) -> Result<Vec<f32>> {
        let rows: Vec<usize> = items.iter().map(|&i| self.rows[i]).collect();
        self.file.rows(&rows)
    }
}

/// The image tokens of `data`'s items through the BLIP or CLIP folder
/// `folder`'s vision tower ([`super::CaptionData::attach_image_tokens`]
/// gives them to a data set): from the features file `features` when
/// that holds them (`captune embed --image-tokens`), else from the cache,
/// else computed (with a progress bar) and cached.
pub fn rows<B: Backend>(
    b: &B,
    data: &Dataset,
    features: Option<&Path>,
    folder: &Path,
    progress: &Progress,
) -> Result<TokenRows> {
    let kind = TowerKind::of_folder(folder)?;
    let weights = weights_identity(folder)?;
    let encoder = encoder_of(kind, &weights);
    let file = match held_by_features(features, &encoder)? {
        Some(file) => {
            eprintln!(
                "image tokens from the features file: {}",
                file.path.display()
            );
            file
        }
        None => {
            let path = cached(data, (folder, kind), &weights);
            if !path.is_file() {
                let ids: Vec<String> = data.items.iter().map(|i| i.id.clone()).collect();
                let start = |shape| TokensWriter::create(&path, &ids, shape, &encoder);
                compute(b, data, folder, progress, start)?;
            } else {
                eprintln!("image tokens from the cache: {}", path.display());
            }
            ImageTokens::open(&path)?
        }
    };
    let index = file.index();
    let rows = data
        .items
        .iter()
        .map(|item| {
            index.get(item.id.as_str()).copied().with_context(|| {
                format!(
                    "{}: no tokens of image {}; a cached file can be deleted to compute them \
                     again, a features file written again with `captune embed --image-tokens`",
                    file.path.display(),
                    item.id
                )
            })
        })
        .collect::<Result<Vec<usize>>>()?;
    Ok(TokenRows { file, rows })
}

/// Writes a features file `out`: `embeddings` (`[items, dim]`, with
/// `metadata`) and then every item's image tokens from the BLIP or CLIP
/// folder `folder`'s vision tower, in item order.
pub fn write_with_embeddings<B: Backend>(
    b: &B,
    data: &Dataset,
    folder: &Path,
    out: &Path,
    (embeddings, dim): (&[f32], usize),
    metadata: HashMap<String, String>,
    progress: &Progress,
) -> Result<()> {
    let ids: Vec<String> = data.items.iter().map(|i| i.id.clone()).collect();
    let leading = [(EMBEDDINGS, vec![ids.len(), dim], embeddings)];
    let encoder = encoder_of(TowerKind::of_folder(folder)?, &weights_identity(folder)?);
    let start = |shape| TokensWriter::beside(out, &ids, (shape, &encoder), &leading, metadata);
    compute(b, data, folder, progress, start)
}

/// The identity of a vision tower as an encoder of image tokens, from
/// its kind and its weights file's ([`weights_identity`]).
fn encoder_of(kind: TowerKind, weights: &str) -> String {
    format!("{}:{}", kind.name(), fingerprint(weights.as_bytes()))
}

/// The folder's weights file as the cache knows it: its absolute
/// path, size and time.
fn weights_identity(folder: &Path) -> Result<String> {
    Ok(file_identity(&absolute(&tower_weights(folder)?)))
}

/// The tokens of the features file `features`, when it holds some of
/// `encoder`.
fn held_by_features(features: Option<&Path>, encoder: &str) -> Result<Option<ImageTokens>> {
    let Some(path) = features else {
        return Ok(None);
    };
    // A .npy file holds embeddings only.
    if path.extension().is_some_and(|e| e == "npy") {
        return Ok(None);
    }
    match ImageTokens::open_if_held(path)? {
        Some(file) if file.encoder.as_deref() == Some(encoder) => Ok(Some(file)),
        Some(_) => {
            eprintln!(
                "warning: {}'s image tokens were not made by this folder's weights file as it \
                 is now (another tower, or the file moved or changed since); computing them",
                path.display()
            );
            Ok(None)
        }
        None => Ok(None),
    }
}

/// Where the cache keeps the tokens of `data`'s images through `folder`'s
/// tower of `kind` (whose weights file is `weights`, [`weights_identity`]):
/// keyed by the tower's weights, its config and preprocessing, and the
/// images.
fn cached(data: &Dataset, (folder, kind): (&Path, TowerKind), weights: &str) -> std::path::PathBuf {
    let mut listing = format!("{}\n{weights}\n", kind.name());
    for file in [
        folder.join("config.json"),
        image_processor::config_file(folder),
    ] {
        listing.push_str(&format!("{}\n", file_identity(&absolute(&file))));
    }
    listing.push_str(&images_listing(data));
    cache::image_tokens(&data.name, &fingerprint(listing.as_bytes()))
}

/// The folder's weights file (or index), which must be there.
fn tower_weights(folder: &Path) -> Result<std::path::PathBuf> {
    let weights = HfFolder::open(folder)?.weights_file();
    if !weights.is_file() {
        bail!(
            "{}: no model.safetensors; the image tokens come from a BLIP or CLIP folder saved \
             with save_pretrained",
            folder.display()
        );
    }
    Ok(weights)
}

/// Every item's tokens through `folder`'s vision tower, in item order,
/// into the writer `start` makes for their shape.
fn compute<B: Backend>(
    b: &B,
    data: &Dataset,
    folder: &Path,
    progress: &Progress,
    start: impl FnOnce(TokenShape) -> Result<TokensWriter>,
) -> Result<()> {
    let mut tower = TokenTower::open(b, folder)?;
    let mut out = start(tower.shape())?;
    let n = data.items.len() as u64;
    let bar = progress.start(&format!("image tokens of {n} images"), n);
    for chunk in data.items.chunks(IMAGES_PER_BATCH) {
        let items: Vec<&Item> = chunk.iter().collect();
        let patches = super::image_pixels::patches_of_items(tower.patcher(), data, &items)?;
        out.push(&tower.image_tokens(b, &patches)?)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    out.finish()
}
