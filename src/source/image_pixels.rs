//! The pixels of a vision tower trained with its decoder
//! (`--train-vision`): no tokens are cached, since the tower changes at
//! every step; a batch's images are read, prepared by the BLIP folder's
//! image processor and cut into the tower's patches when it is drawn.

use crate::data::{Dataset, Item};
use crate::model::blip;
use crate::model::vision::Patcher;
use anyhow::Result;
use std::path::Path;

/// Where a data set's images become a trained tower's patches.
#[derive(Debug)]
pub struct PixelRows {
    patcher: Patcher,
}

impl PixelRows {
    /// The patches `[items.len(), patches, patch_dim]` of `data`'s `items`.
    pub fn of(&self, data: &Dataset, items: &[usize]) -> Result<Vec<f32>> {
        let items: Vec<&Item> = items.iter().map(|&i| &data.items[i]).collect();
        patches_of_items(&self.patcher, data, &items)
    }

    /// Patches per image and values per patch.
    pub fn shape(&self) -> (usize, usize) {
        self.patcher.shape()
    }
}

/// The pixels of the BLIP folder `folder`'s image processor
/// ([`super::CaptionData::attach_pixels`] gives them to a data set).
pub fn rows(folder: &Path) -> Result<PixelRows> {
    Ok(PixelRows {
        patcher: blip::patcher(folder)?,
    })
}

/// The patches of `items`' images, naming an unreadable one's item and
/// data set.
pub(super) fn patches_of_items(
    patcher: &Patcher,
    data: &Dataset,
    items: &[&Item],
) -> Result<Vec<f32>> {
    let files: Vec<&Path> = items.iter().map(|item| item.image.as_path()).collect();
    patcher.patches_of_files(&files, |i| {
        format!(
            " of {} ({}); fix it or leave the item out of the data set",
            items[i].id, data.name
        )
    })
}
