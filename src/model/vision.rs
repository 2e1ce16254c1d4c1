//! A ViT's body, shared by every image tower: patches (`[batch, patches,
//! patch_dim]`) through a linear patch embedding (a convolution whose
//! stride is its kernel, as a product on patch rows), a learned class
//! vector before them where the model has one (CLIP's, BLIP's), learned
//! positions, then the transformer. Its output is every token's state,
//! `[batch, tokens, width]`: the retriever pools and projects it, BLIP's
//! text decoder cross-attends to all of it.

use super::layers::Dense;
use super::params::{Init, ParamId, Params};
use super::transformer::{Activations, Transformer, TransformerConfig};
use crate::backend::{Backend, HeadLayout, TokenIndex};
use crate::data::image_processor::{self, ImageProcessor};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The tower's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionConfig {
    pub patches: usize,
    /// Values of one patch: channels x side x side.
    pub patch_dim: usize,
    /// A class vector before the patches.
    pub class: bool,
    /// Whether the patch embedding has a bias.
    pub patch_bias: bool,
    pub transformer: TransformerConfig,
}

impl VisionConfig {
    /// Tokens per image: the patches, after the class vector if any.
    pub fn tokens(&self) -> usize {
        self.patches + usize::from(self.class)
    }

    /// Weights of a tower of this shape: the patch embedding (and its
    /// bias), the class vector, the positions and the transformer.
    pub fn parameter_count(&self) -> u128 {
        let w = self.transformer.width as u128;
        let patch = self.patch_dim as u128 * w + u128::from(self.patch_bias) * w;
        let class = u128::from(self.class) * w;
        patch + class + self.tokens() as u128 * w + self.transformer.parameter_count()
    }
}

/// The tower's weights: `{name}.patch_embed`, `{name}.class`,
/// `{name}.positions` (`[tokens, width]`), and the transformer `{name}`.
pub struct VisionTower {
    pub config: VisionConfig,
    patch_embed: Dense,
    class: Option<ParamId>,
    positions: ParamId,
    pub transformer: Transformer,
}

/// The tower's activations for batches of `batch` images.
pub struct VisionWork<B: Backend> {
    pub batch: usize,
    position_ids: TokenIndex<B>,
    activations: Activations<B>,
    patches: B::Tensor,
    class: Option<ClassWork<B>>,
    /// `[batch, tokens, width]`: the last forward's output.
    pub hidden: B::Tensor,
}

/// The class vector's buffers: the transformer's input is `[batch, 1 +
/// patches, width]`, each image's class vector first.
struct ClassWork<B: Backend> {
    /// `[batch]` zeros: the class vector for each image.
    ids: TokenIndex<B>,
    rows: B::Tensor,
    patch_rows: B::Tensor,
    class_layout: HeadLayout,
    patch_layout: HeadLayout,
    d_rows: B::Tensor,
    d_patch_rows: B::Tensor,
}

impl VisionTower {
    /// A tower of fresh weights named `name`.
    pub fn new<B: Backend>(p: &mut Params<B>, name: &str, config: VisionConfig) -> Self {
        let w = config.transformer.width;
        let patch_name = format!("{name}.patch_embed");
        let patch_embed = match config.patch_bias {
            true => Dense::new(p, &patch_name, config.patch_dim, w, 0.02),
            false => Dense::without_bias(p, &patch_name, config.patch_dim, w, 0.02),
        };
        VisionTower {
            patch_embed,
            class: config
                .class
                .then(|| p.add(format!("{name}.class"), &[1, w], Init::Normal(0.02), false)),
            positions: p.add(
                format!("{name}.positions"),
                &[config.tokens(), w],
                Init::Normal(0.02),
                false,
            ),
            transformer: Transformer::new(p, name, config.transformer),
            config,
        }
    }

    /// Buffers for batches of `batch` images; without `backward` (a
    /// frozen tower's) no gradient buffers.
    pub fn work<B: Backend>(&self, b: &B, batch: usize, backward: bool) -> Result<VisionWork<B>> {
        let c = &self.config;
        let (patches, w, tokens) = (c.patches, c.transformer.width, c.tokens());
        let grad = |len: usize| b.zeros(if backward { len } else { 0 });
        let class = c.class.then(|| {
            let one_run_per_image = |head_dim, col_offset| HeadLayout {
                batch,
                seq: 1,
                heads: 1,
                head_dim,
                row_stride: tokens * w,
                col_offset,
            };
            Ok::<_, anyhow::Error>(ClassWork {
                ids: TokenIndex::new(b, &vec![0; batch], 1)?,
                rows: b.zeros(batch * w),
                patch_rows: b.zeros(batch * patches * w),
                class_layout: one_run_per_image(w, 0),
                patch_layout: one_run_per_image(patches * w, w),
                d_rows: grad(batch * w),
                d_patch_rows: grad(batch * patches * w),
            })
        });
        let ids: Vec<u32> = (0..batch).flat_map(|_| 0..tokens as u32).collect();
        Ok(VisionWork {
            batch,
            position_ids: TokenIndex::new(b, &ids, tokens)?,
            activations: match backward {
                true => self.transformer.activations(b, batch, tokens),
                false => self.transformer.forward_activations(b, batch, tokens),
            },
            patches: b.zeros(batch * patches * c.patch_dim),
            class: class.transpose()?,
            hidden: b.zeros(batch * tokens * w),
        })
    }

    /// `w.hidden` = the tower on `patches` (`[w.batch, patches, patch_dim]`).
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        w: &mut VisionWork<B>,
        patches: &[f32],
    ) {
        let width = self.config.transformer.width;
        b.write(&mut w.patches, patches);
        let input = w.activations.input();
        match (&mut w.class, self.class) {
            (Some(cw), Some(class)) => {
                self.patch_embed
                    .forward(b, p, &w.patches, &mut cw.patch_rows);
                b.embedding(p.value(class), &cw.ids.ids, &mut cw.rows, width, false);
                b.heads_to_tokens(&cw.rows, input, &cw.class_layout, false);
                b.heads_to_tokens(&cw.patch_rows, input, &cw.patch_layout, false);
            }
            _ => self.patch_embed.forward(b, p, &w.patches, input),
        }
        b.embedding(
            p.value(self.positions),
            &w.position_ids.ids,
            input,
            width,
            true,
        );
        self.transformer
            .forward(b, p, &mut w.activations, None, &mut w.hidden);
    }

    /// Parameter gradients (+)= those of a loss whose gradient w.r.t. the
    /// last forward's `hidden` is `d_hidden`.
    pub fn backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        w: &mut VisionWork<B>,
        d_hidden: &B::Tensor,
    ) {
        let width = self.config.transformer.width;
        let d_input = self
            .transformer
            .backward(b, p, &mut w.activations, None, d_hidden);
        b.embedding_backward(d_input, &w.position_ids, p.grad(self.positions), width);
        match (&mut w.class, self.class) {
            (Some(cw), Some(class)) => {
                b.tokens_to_heads(d_input, &mut cw.d_rows, &cw.class_layout);
                b.embedding_backward(&cw.d_rows, &cw.ids, p.grad(class), width);
                b.tokens_to_heads(d_input, &mut cw.d_patch_rows, &cw.patch_layout);
                self.patch_embed
                    .backward(b, p, &cw.d_patch_rows, &w.patches, None);
            }
            _ => self.patch_embed.backward(b, p, d_input, &w.patches, None),
        }
    }
}

/// How a vision tower sees an image file: its folder's image processor,
/// then patches of the tower's size.
#[derive(Clone, Debug)]
pub struct Patcher {
    /// The folder's preprocessing, which makes the pixels the tower reads.
    pub processor: ImageProcessor,
    /// The pixels of an image's side, and of a patch's.
    side: usize,
    patch: usize,
}

impl Patcher {
    /// The image processor of the folder `dir`, which must make the
    /// `side` pixels a side that its tower, of `patch`-pixel patches,
    /// reads.
    pub fn new(dir: &Path, side: usize, patch: usize) -> Result<Self> {
        let processor = ImageProcessor::load(dir)?;
        if processor.side() as usize != side {
            bail!(
                "{}: the processor's config makes {} pixels a side, but config.json's vision \
                 tower reads {side}: the processor and the model are of different folders",
                image_processor::config_file(dir).display(),
                processor.side()
            );
        }
        Ok(Patcher {
            processor,
            side,
            patch,
        })
    }

    /// Patches per image and values per patch.
    pub fn shape(&self) -> (usize, usize) {
        let side = self.side / self.patch;
        (side * side, 3 * self.patch * self.patch)
    }

    /// The patches `[images, patches, patch_dim]` of images' processed
    /// pixels, one after another.
    pub fn patches(&self, pixels: &[f32]) -> Vec<f32> {
        patches_of_pixels(pixels, self.side, self.patch)
    }

    /// The patches of image files (read in parallel), prepared by the
    /// processor; an unreadable one is named, followed by `which(i)` for
    /// the i-th (what the image is, and what to do).
    pub fn patches_of_files(
        &self,
        files: &[&Path],
        which: impl Fn(usize) -> String + Sync,
    ) -> Result<Vec<f32>> {
        use rayon::prelude::*;
        let pixels: Vec<Vec<f32>> = (files.par_iter().enumerate())
            .map(|(i, file)| {
                let image = image::open(file).with_context(|| {
                    format!("{}: cannot read the image{}", file.display(), which(i))
                })?;
                Ok(self.processor.pixels(&image.to_rgb8()))
            })
            .collect::<Result<_>>()?;
        Ok(self.patches(&pixels.concat()))
    }
}

/// Images as CLIP's and BLIP's processors give them (`pixel_values`,
/// `[images, 3, size, size]`, channel-major) as a tower's patches (`[images,
/// patches, patch * patch * 3]`, each patch's rows, columns and channels
/// in that order, as the patch embedding's rows are).
pub fn patches_of_pixels(pixels: &[f32], size: usize, patch: usize) -> Vec<f32> {
    let plane = size * size;
    let side = size / patch;
    let mut out = Vec::with_capacity(pixels.len());
    for image in pixels.chunks(3 * plane) {
        for py in 0..side {
            for px in 0..side {
                for y in py * patch..(py + 1) * patch {
                    for x in px * patch..(px + 1) * patch {
                        out.extend((0..3).map(|c| image[c * plane + y * size + x]));
                    }
                }
            }
        }
    }
    out
}

/// The patch convolution `[width, 3, p, p]` as the patch embedding's
/// `[p * p * 3, width]`, rows in captune's patch order: row, column,
/// channel.
pub fn patch_rows(conv: &[f32], width: usize, p: usize) -> Vec<f32> {
    let mut out = vec![0.0; conv.len()];
    for o in 0..width {
        for c in 0..3 {
            for y in 0..p {
                for x in 0..p {
                    let row = (y * p + x) * 3 + c;
                    out[row * width + o] = conv[((o * 3 + c) * p + y) * p + x];
                }
            }
        }
    }
    out
}

/// The inverse of [`patch_rows`]: the patch embedding's `[patch_dim,
/// width]` rows back to a convolution's `[width, 3, p, p]` weight.
pub fn conv_of_patch_rows(rows: &[f32], width: usize, p: usize) -> Vec<f32> {
    let mut conv = vec![0.0; rows.len()];
    for (row, values) in rows.chunks(width).enumerate() {
        // Row (y * p + x) * 3 + c holds conv[o, c, y, x].
        let (c, pixel) = (row % 3, row / 3);
        for (o, &value) in values.iter().enumerate() {
            conv[(o * 3 + c) * p * p + pixel] = value;
        }
    }
    conv
}
