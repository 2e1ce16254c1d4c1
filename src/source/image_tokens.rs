//! The image tokens a cross-attending decoder reads (BLIP's): every image
//! of a data set through a BLIP folder's frozen vision tower, once, into
//! an image-tokens file in the on-disk cache, keyed by the folder's
//! weights and the images; then read a batch's rows at a time.

use super::embeddings::CaptionData;
use super::{absolute, file_identity};
use crate::backend::Backend;
use crate::cache;
use crate::data::image_tokens::{ImageTokens, TokenShape, TokensWriter};
use crate::data::{Dataset, Item};
use crate::model::blip::{self, BlipVision};
use crate::model::hf::HfFolder;
use crate::progress::Progress;
use crate::tensorfile::fingerprint;
use anyhow::{Context, Result, bail};
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

/// Gives `data` the image tokens of the BLIP folder `folder`'s vision
/// tower: from the cache, else computed (with a progress bar) and cached.
pub fn attach<B: Backend>(
    b: &B,
    data: &mut CaptionData,
    folder: &Path,
    progress: &Progress,
) -> Result<()> {
    let weights = blip_weights(folder)?;
    // The tower's weights, its config and its preprocessing make the tokens.
    let weights = file_identity(&absolute(&weights));
    let mut listing = format!("blip-vision\n{weights}\n");
    for file in ["config.json", "preprocessor_config.json"] {
        listing.push_str(&format!(
            "{}\n",
            file_identity(&absolute(&folder.join(file)))
        ));
    }
    for item in &data.data.items {
        listing.push_str(&format!("{}\t{}\n", item.id, file_identity(&item.image)));
    }
    let key = fingerprint(listing.as_bytes());
    let path = cache::image_tokens(&data.data.name, &key);
    let encoder = format!("blip-vision:{}", fingerprint(weights.as_bytes()));
    if !path.is_file() {
        compute(b, &data.data, folder, &path, &encoder, progress)?;
    } else {
        eprintln!("image tokens from the cache: {}", path.display());
    }
    let file = ImageTokens::open(&path)?;
    let index = file.index();
    let rows = data
        .data
        .items
        .iter()
        .map(|item| {
            index.get(item.id.as_str()).copied().with_context(|| {
                format!(
                    "{}: no tokens of image {}; delete the file to compute them again",
                    path.display(),
                    item.id
                )
            })
        })
        .collect::<Result<Vec<usize>>>()?;
    data.image_tokens = Some(TokenRows { file, rows });
    if let Some(source) = &mut data.source {
        source.image_tokens = Some(absolute(folder));
    }
    Ok(())
}

/// The BLIP folder's weights file (or index), which must be there.
fn blip_weights(folder: &Path) -> Result<std::path::PathBuf> {
    let weights = HfFolder::open(folder)?.weights_file();
    if !weights.is_file() {
        bail!(
            "{}: no model.safetensors; the image tokens come from a BLIP folder saved with \
             save_pretrained",
            folder.display()
        );
    }
    Ok(weights)
}

/// Every item's tokens into the file `path`, in item order.
fn compute<B: Backend>(
    b: &B,
    data: &Dataset,
    folder: &Path,
    path: &Path,
    encoder: &str,
    progress: &Progress,
) -> Result<()> {
    let mut blip = blip::read(folder)?;
    let v = blip.config.vision_config.clone();
    let mut vision = BlipVision::new(b, folder, &mut blip)?;
    let shape = TokenShape {
        tokens: v.tokens(),
        dim: v.hidden_size,
    };
    let ids: Vec<String> = data.items.iter().map(|i| i.id.clone()).collect();
    let mut out = TokensWriter::create(path, &ids, shape, encoder)?;
    let n = data.items.len() as u64;
    let bar = progress.start(&format!("image tokens of {n} images with BLIP"), n);
    for chunk in data.items.chunks(IMAGES_PER_BATCH) {
        let items: Vec<&Item> = chunk.iter().collect();
        let patches = super::image_pixels::patches_of_items(&vision.patcher, data, &items)?;
        out.push(&vision.image_tokens(b, &patches)?)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    out.finish()
}
