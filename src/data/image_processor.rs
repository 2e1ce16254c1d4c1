//! An image as transformers' image processors make it with their PIL
//! backend:
//! - CLIP's (`CLIPImageProcessor`): the shortest side resized to `size`
//!   (bicubic, the other side in proportion, rounded down), the centre
//!   `crop` x `crop` cut out (its offset rounded down, as transformers
//!   does; OpenAI's own torchvision transform rounds it to the nearest,
//!   which moves the crop by a pixel for some sizes);
//! - BLIP's (`BlipImageProcessorPil`): both sides resized to `size`
//!   (bicubic), no crop;
//!
//! then bytes rescaled to [0, 1] and normalised per channel with the
//! folder's mean and std. The `[3, side, side]` result is what
//! `model::vision::patches_of_pixels` cuts into a tower's patches.
//!
//! The resize is Pillow's bicubic resampling as it documents and computes
//! it, so that the bytes are the same: a separable filter (the cubic with
//! a = -0.5, its support widened by the scale when shrinking), weights
//! normalised and held in fixed point with 22 fractional bits, the
//! horizontal pass first and its result rounded to bytes, then the
//! vertical pass. A side that keeps its length is not filtered. That is
//! Pillow's order up to version 12; Pillow 13 runs the vertical pass first
//! for some shapes (a tall image shrunk more in height than in width, for
//! one), which moves some bytes by one.

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::path::Path;

/// Fractional bits of Pillow's fixed-point filter weights (8-bit images).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// The preprocessing a CLIP or BLIP folder's processor config gives
/// ([`config_file`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ImageProcessor {
    /// The shortest side after resizing, or (no crop) both sides.
    pub size: u32,
    /// The side of the centre crop; None: the image is resized to a
    /// `size` square instead.
    pub crop: Option<u32>,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

/// The fields captune reads; it refuses settings it does not compute.
#[derive(Deserialize)]
struct Config {
    size: Side,
    image_mean: [f32; 3],
    image_std: [f32; 3],
    #[serde(default = "bicubic")]
    resample: u32,
    #[serde(default = "yes")]
    do_resize: bool,
    /// Absent in BLIP's, which never crops.
    #[serde(default)]
    crop_size: Option<Side>,
    #[serde(default)]
    do_center_crop: Option<bool>,
    #[serde(default = "yes")]
    do_rescale: bool,
    #[serde(default = "yes")]
    do_normalize: bool,
    #[serde(default = "byte_scale")]
    rescale_factor: f64,
}

/// `{"shortest_edge": n}`, `{"height": n, "width": n}` or `n`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Side {
    Shortest { shortest_edge: u32 },
    Square { height: u32, width: u32 },
    Plain(u32),
}

fn bicubic() -> u32 {
    3
}
fn yes() -> bool {
    true
}
fn byte_scale() -> f64 {
    1.0 / 255.0
}

/// Where a folder keeps its image processor's settings: a
/// `preprocessor_config.json` (an image processor's `save_pretrained`,
/// and transformers before version 5 for a whole processor), else the
/// `image_processor` entry of a `processor_config.json` (a whole
/// processor's `save_pretrained` since transformers 5). The file is the
/// one whose change makes cached image tokens stale.
pub fn config_file(dir: &Path) -> std::path::PathBuf {
    let alone = dir.join("preprocessor_config.json");
    let within = dir.join("processor_config.json");
    if !alone.exists() && within.exists() {
        within
    } else {
        alone
    }
}

impl ImageProcessor {
    /// Reads the image processor's settings in `dir` ([`config_file`]); an
    /// error names the file and the field.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = config_file(dir);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} (a folder needs preprocessor_config.json or \
                 processor_config.json: save it with the processor's save_pretrained)",
                path.display()
            )
        })?;
        let c: Config = if path.file_name() == Some("processor_config.json".as_ref()) {
            let processor: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not JSON", path.display()))?;
            let Some(settings) = processor.get("image_processor") else {
                bail!(
                    "{}: no image_processor entry (a processor's config holds its image \
                     processor's settings there)",
                    path.display()
                );
            };
            serde_json::from_value(settings.clone()).with_context(|| {
                format!(
                    "{}: its image_processor is not an image processor config captune reads",
                    path.display()
                )
            })?
        } else {
            serde_json::from_str(&text).with_context(|| {
                format!(
                    "{}: not an image processor config captune reads",
                    path.display()
                )
            })?
        };
        let refuse = |what: &str| {
            bail!(
                "{}: {what}; captune computes CLIP's and BLIP's preprocessing only",
                path.display()
            )
        };
        if !(c.do_resize && c.do_rescale && c.do_normalize) {
            return refuse("a do_* step is turned off");
        }
        if c.resample != 3 {
            return refuse(&format!("resample is {} (not bicubic, 3)", c.resample));
        }
        if (c.rescale_factor * 255.0 - 1.0).abs() > 1e-9 {
            return refuse(&format!(
                "rescale_factor is {} (not 1/255)",
                c.rescale_factor
            ));
        }
        // CLIP's: the shortest side, then a square crop; BLIP's: a square.
        let (size, crop) = match (c.size, c.crop_size, c.do_center_crop) {
            (
                Side::Shortest { shortest_edge: n } | Side::Plain(n),
                Some(crop),
                Some(true) | None,
            ) => match crop {
                Side::Square { height, width } if height == width => (n, Some(height)),
                Side::Plain(side) => (n, Some(side)),
                _ => return refuse("crop_size is not a square"),
            },
            (Side::Square { height, width }, None, Some(false) | None) if height == width => {
                (height, None)
            }
            (Side::Square { .. }, None, _) => return refuse("size is not a square"),
            _ => {
                return refuse(
                    "size and the crop are neither CLIP's (shortest_edge, then a centre crop) \
                     nor BLIP's (a square size, no crop)",
                );
            }
        };
        if size == 0 || crop.is_some_and(|c| c == 0 || c > size) || c.image_std.contains(&0.0) {
            return refuse("size, crop_size or image_std is zero, or the crop is larger than size");
        }
        Ok(ImageProcessor {
            size,
            crop,
            mean: c.image_mean,
            std: c.image_std,
        })
    }

    /// The side of the square the pixels are: the crop's, or the size.
    pub fn side(&self) -> u32 {
        self.crop.unwrap_or(self.size)
    }

    /// `[3, side, side]` floats, channel-major, of an RGB image.
    pub fn pixels(&self, image: &image::RgbImage) -> Vec<f32> {
        let (w, h) = (image.width() as usize, image.height() as usize);
        let size = self.size as usize;
        let (new_w, new_h) = match self.crop {
            None => (size, size),
            Some(_) => {
                let (short, long) = if w <= h { (w, h) } else { (h, w) };
                let new_long = (size as f64 * long as f64 / short as f64) as usize;
                if w <= h {
                    (size, new_long)
                } else {
                    (new_long, size)
                }
            }
        };
        let resized = resize_bicubic(image.as_raw(), w, h, new_w, new_h);
        let crop = self.side() as usize;
        let (top, left) = ((new_h - crop) / 2, (new_w - crop) / 2);
        let mut out = vec![0.0; 3 * crop * crop];
        for c in 0..3 {
            for y in 0..crop {
                for x in 0..crop {
                    let v = resized[((top + y) * new_w + left + x) * 3 + c];
                    // As numpy rescales: in float64, then to float32.
                    let scaled = (f64::from(v) * (1.0 / 255.0)) as f32;
                    out[(c * crop + y) * crop + x] = (scaled - self.mean[c]) / self.std[c];
                }
            }
        }
        out
    }
}

/// Pillow's bicubic kernel (a = -0.5).
fn bicubic_kernel(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// For each output index along an axis of `from` samples resized to
/// `to`: the first input index and its fixed-point weights.
fn taps(from: usize, to: usize) -> Vec<(usize, Vec<i64>)> {
    let scale = from as f64 / to as f64;
    let filter_scale = scale.max(1.0);
    let support = 2.0 * filter_scale;
    (0..to)
        .map(|out| {
            let center = (out as f64 + 0.5) * scale;
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(from as i64) as usize;
            let weights: Vec<f64> = (first..end)
                .map(|x| bicubic_kernel((x as f64 - center + 0.5) / filter_scale))
                .collect();
            let total: f64 = weights.iter().sum();
            let one = f64::from(1u32 << PRECISION_BITS);
            let fixed = weights
                .iter()
                .map(|&w| {
                    let w = if total != 0.0 { w / total } else { w };
                    // Rounded half away from zero, then truncated, as Pillow does.
                    if w < 0.0 {
                        (-0.5 + w * one) as i64
                    } else {
                        (0.5 + w * one) as i64
                    }
                })
                .collect();
            (first, fixed)
        })
        .collect()
}

/// The weighted sum of fixed-point products, rounded back to a byte.
fn to_byte(sum: i64) -> u8 {
    ((sum + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS).clamp(0, 255) as u8
}

/// RGB bytes `w` x `h` resized to `new_w` x `new_h`: rows first, then
/// columns, each pass rounded to bytes.
fn resize_bicubic(rgb: &[u8], w: usize, h: usize, new_w: usize, new_h: usize) -> Vec<u8> {
    let rows = if new_w == w {
        rgb.to_vec()
    } else {
        let taps = taps(w, new_w);
        let mut out = vec![0u8; new_w * h * 3];
        for y in 0..h {
            for (x, (first, weights)) in taps.iter().enumerate() {
                for c in 0..3 {
                    let sum: i64 = weights
                        .iter()
                        .enumerate()
                        .map(|(k, &wt)| i64::from(rgb[(y * w + first + k) * 3 + c]) * wt)
                        .sum();
                    out[(y * new_w + x) * 3 + c] = to_byte(sum);
                }
            }
        }
        out
    };
    if new_h == h {
        return rows;
    }
    let taps = taps(h, new_h);
    let mut out = vec![0u8; new_w * new_h * 3];
    for (y, (first, weights)) in taps.iter().enumerate() {
        for x in 0..new_w {
            for c in 0..3 {
                let sum: i64 = weights
                    .iter()
                    .enumerate()
                    .map(|(k, &wt)| i64::from(rows[((first + k) * new_w + x) * 3 + c]) * wt)
                    .sum();
                out[(y * new_w + x) * 3 + c] = to_byte(sum);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ImageProcessor;

    /// A processor's settings read from a `processor_config.json`, as
    /// transformers 5 saves a whole processor, equal those of the same
    /// settings alone in `preprocessor_config.json`, which wins where
    /// both are; without an `image_processor` entry the error names the
    /// file.
    #[test]
    fn a_whole_processors_config_gives_its_image_processors_settings() {
        let dir = std::env::temp_dir().join(format!(
            "captune-processor-config-{}",
            crate::tensorfile::temporary_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let blip = r#"{"size": {"height": 48, "width": 48}, "image_mean": [0.5, 0.4, 0.3],
            "image_std": [0.2, 0.25, 0.3], "resample": 3, "do_normalize": true}"#;
        let nested =
            format!(r#"{{"image_processor": {blip}, "processor_class": "BlipProcessor"}}"#);
        std::fs::write(dir.join("processor_config.json"), nested).unwrap();
        let from_processor = ImageProcessor::load(&dir).unwrap();
        assert_eq!((from_processor.size, from_processor.crop), (48, None));
        assert_eq!(
            (from_processor.mean, from_processor.std),
            ([0.5, 0.4, 0.3], [0.2, 0.25, 0.3])
        );
        std::fs::write(
            dir.join("preprocessor_config.json"),
            blip.replace("48", "40"),
        )
        .unwrap();
        assert_eq!(ImageProcessor::load(&dir).unwrap().size, 40);
        std::fs::remove_file(dir.join("preprocessor_config.json")).unwrap();
        std::fs::write(
            dir.join("processor_config.json"),
            r#"{"processor_class": "X"}"#,
        )
        .unwrap();
        let error = format!("{:#}", ImageProcessor::load(&dir).unwrap_err());
        assert!(
            error.contains("processor_config.json") && error.contains("image_processor"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An image whose every byte says where it is: (x, y, x + y) mod 256.
    fn positions(w: u32, h: u32) -> image::RgbImage {
        image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, (x + y) as u8]))
    }

    #[test]
    fn the_crop_is_centred_with_its_offset_rounded_down_on_either_orientation() {
        // Mean 0 and std 1/255 give the bytes back.
        let p = ImageProcessor {
            size: 40,
            crop: Some(32),
            mean: [0.0; 3],
            std: [1.0 / 255.0; 3],
        };
        // The shortest side already 40: no filtering, only the crop, whose
        // offsets (61 - 32) / 2 = 14 and (40 - 32) / 2 = 4 round down.
        for (w, h, left, top) in [(40, 61, 4, 14), (61, 40, 14, 4), (40, 40, 4, 4)] {
            let out = p.pixels(&positions(w, h));
            assert_eq!(out.len(), 3 * 32 * 32);
            for (y, x) in [(0, 0), (0, 31), (31, 0), (17, 9)] {
                let at = |c: usize| out[(c * 32 + y) * 32 + x].round() as u32;
                let (sx, sy) = ((left + x) as u32, (top + y) as u32);
                assert_eq!(
                    [at(0), at(1), at(2)],
                    [sx, sy, (sx + sy) % 256],
                    "{w}x{h}: pixel ({x}, {y})"
                );
            }
        }
    }

    #[test]
    fn without_a_crop_both_sides_are_resized_to_the_square() {
        let p = ImageProcessor {
            size: 24,
            crop: None,
            mean: [0.0; 3],
            std: [1.0 / 255.0; 3],
        };
        assert_eq!(p.side(), 24);
        // A 24 x 24 image is the square already: its bytes come back.
        let out = p.pixels(&positions(24, 24));
        for (y, x) in [(0, 0), (5, 23), (23, 7)] {
            let at = |c: usize| out[(c * 24 + y) * 24 + x].round() as u32;
            assert_eq!(
                [at(0), at(1), at(2)],
                [x as u32, y as u32, (x + y) as u32 % 256]
            );
        }
        // A wide image is squeezed, not cropped: its left and right
        // columns both reach the square's edges.
        let wide = image::RgbImage::from_fn(60, 24, |x, _| match x {
            0..2 => image::Rgb([255, 0, 0]),
            58.. => image::Rgb([0, 0, 255]),
            _ => image::Rgb([0, 0, 0]),
        });
        let out = p.pixels(&wide);
        assert!(out[12 * 24] > 50.0, "the left edge's red is kept");
        assert!(
            out[(2 * 24 + 12) * 24 + 23] > 50.0,
            "the right edge's blue is kept"
        );
    }

    #[test]
    fn the_shortest_side_is_resized_and_the_other_rounded_down() {
        // The shortest side to 40 and the other in proportion, rounded
        // down; the 40-wide crop then keeps the whole width.
        let p = ImageProcessor {
            size: 40,
            crop: Some(40),
            mean: [0.0; 3],
            std: [1.0 / 255.0; 3],
        };
        let flat = image::RgbImage::from_pixel(50, 75, image::Rgb([200, 100, 50]));
        let out = p.pixels(&flat);
        // A flat image stays flat under any resampling.
        assert!(
            out.chunks(40 * 40)
                .zip([200.0, 100.0, 50.0])
                .all(|(plane, v)| plane.iter().all(|&x| (x - v).abs() < 1e-3))
        );
        // 77 / 50 x 40 = 61.6: 61 rows, so the crop starts at row
        // (61 - 40) / 2 = 10, rounded down.
        let tall = positions(50, 77);
        let cropped = p.pixels(&tall);
        let resized = super::resize_bicubic(tall.as_raw(), 50, 77, 40, 61);
        for y in [0, 20, 39] {
            let want = f32::from(resized[((10 + y) * 40 + 7) * 3]);
            assert!((cropped[y * 40 + 7] - want).abs() < 1e-3, "row {y}");
        }
    }
}
