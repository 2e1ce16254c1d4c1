//! Decoding a data set's images into memory as RGB bytes at one square
//! resolution (resized exactly, as the Flickr8k copies already are).

use super::Dataset;
use anyhow::{Result, bail};
use image::imageops::FilterType;
use indicatif::ProgressBar;
use rayon::prelude::*;

/// `len` images of `size` x `size` RGB bytes, row-major, in item order.
pub struct Images {
    pub size: u32,
    pub pixels: Vec<u8>,
}

impl Images {
    pub fn bytes_per_image(&self) -> usize {
        (self.size * self.size * 3) as usize
    }

    pub fn len(&self) -> usize {
        self.pixels.len() / self.bytes_per_image()
    }

    pub fn is_empty(&self) -> bool {
        self.pixels.is_empty()
    }

    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.bytes_per_image();
        &self.pixels[i * n..(i + 1) * n]
    }
}

/// Decodes every item's image, advancing `progress` by one for each; an
/// item whose image cannot be read is removed from `data` and recorded in
/// its report.
pub fn load(data: &mut Dataset, size: u32, progress: &ProgressBar) -> Result<Images> {
    let decoded: Vec<Result<Vec<u8>, String>> = data
        .items
        .par_iter()
        .map(|item| {
            progress.inc(1);
            let img = image::open(&item.image).map_err(|e| {
                format!(
                    "{}: image of item {}: {e}; skipped",
                    item.image.display(),
                    item.id
                )
            })?;
            let rgb = img.to_rgb8();
            let rgb = if rgb.width() == size && rgb.height() == size {
                rgb
            } else {
                image::imageops::resize(&rgb, size, size, FilterType::Triangle)
            };
            Ok(rgb.into_raw())
        })
        .collect();
    let mut pixels = Vec::with_capacity(decoded.len() * (size * size * 3) as usize);
    let mut kept = Vec::with_capacity(decoded.len());
    for (item, result) in std::mem::take(&mut data.items).into_iter().zip(decoded) {
        match result {
            Ok(bytes) => {
                pixels.extend_from_slice(&bytes);
                kept.push(item);
            }
            Err(why) => data.report.skip_item(why),
        }
    }
    data.items = kept;
    if data.items.is_empty() {
        bail!("{}: no image could be read ({})", data.name, data.report);
    }
    Ok(Images { size, pixels })
}
