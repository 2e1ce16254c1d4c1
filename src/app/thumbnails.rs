//! Image thumbnails as textures, decoded once per image on first use.

use crate::data::Item;
use egui::{ColorImage, TextureHandle, TextureOptions};
use std::collections::HashMap;

/// Longest side of a thumbnail texture, in pixels.
const SIDE: u32 = 128;

#[derive(Default)]
pub struct Thumbnails {
    textures: HashMap<usize, Option<TextureHandle>>,
}

impl Thumbnails {
    /// Item `i`'s thumbnail; `None` when its image cannot be read (the
    /// data loaders reported such items already).
    pub fn get(&mut self, ctx: &egui::Context, i: usize, item: &Item) -> Option<TextureHandle> {
        self.textures
            .entry(i)
            .or_insert_with(|| {
                let image = image::open(&item.image)
                    .ok()?
                    .thumbnail(SIDE, SIDE)
                    .to_rgb8();
                let size = [image.width() as usize, image.height() as usize];
                Some(ctx.load_texture(
                    format!("thumbnail {}", item.id),
                    ColorImage::from_rgb(size, image.as_raw()),
                    TextureOptions::NEAREST,
                ))
            })
            .clone()
    }
}
