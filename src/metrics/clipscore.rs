//! CLIPScore and RefCLIPScore as their authors define them (Hessel,
//! Holtzman, Forbes, Le Bras and Choi, "CLIPScore: A Reference-free
//! Evaluation Metric for Image Captioning", 2021): a caption is read by
//! CLIP's text tower after the prompt "A photo depicts " (references too),
//! CLIP-S = w max(cos(image, caption), 0) with w = 2.5, and RefCLIP-S is
//! the harmonic mean of CLIP-S and max(max over the references of
//! cos(caption, reference), 0). A corpus' figure is the mean over its
//! images. Embeddings here are unit-norm, so a cosine is a dot product.
//! Images are preprocessed as transformers' CLIP image processor does
//! (`data::image_processor`), whose crop can sit a pixel from that of the
//! authors' code (OpenAI's transform) for some image sizes.

/// The weight w.
pub const W: f64 = 2.5;
/// The prompt before every caption and reference.
pub const PROMPT: &str = "A photo depicts ";

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum()
}

/// CLIP-S of an image and a caption (unit-norm embeddings).
pub fn clip_s(image: &[f32], caption: &[f32]) -> f64 {
    W * dot(image, caption).max(0.0)
}

/// RefCLIP-S of a caption whose CLIP-S is `clip_s`, given its references'
/// unit-norm embeddings.
pub fn ref_clip_s(clip_s: f64, caption: &[f32], references: &[&[f32]]) -> f64 {
    let text = references
        .iter()
        .map(|r| dot(caption, r))
        .fold(f64::NEG_INFINITY, f64::max)
        .max(0.0);
    if clip_s + text == 0.0 {
        0.0
    } else {
        2.0 * clip_s * text / (clip_s + text)
    }
}

/// A corpus' mean CLIP-S and RefCLIP-S.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CorpusScores {
    pub clip_s: f64,
    pub ref_clip_s: f64,
}

/// The mean CLIP-S and RefCLIP-S of `candidates[j]` on `images[j]` (unit
/// embeddings `[n, dim]`, texts embedded after the prompt); `references`
/// holds image j's `reference_counts[j]` embeddings in image order.
pub fn corpus_scores(
    images: &[f32],
    candidates: &[f32],
    references: &[f32],
    reference_counts: &[usize],
    dim: usize,
) -> CorpusScores {
    fn row(e: &[f32], k: usize, dim: usize) -> &[f32] {
        &e[k * dim..(k + 1) * dim]
    }
    let (mut total, mut ref_total, mut next) = (0.0, 0.0, 0);
    for (j, &count) in reference_counts.iter().enumerate() {
        let (image, caption) = (row(images, j, dim), row(candidates, j, dim));
        let s = clip_s(image, caption);
        let own: Vec<&[f32]> = (next..next + count)
            .map(|k| row(references, k, dim))
            .collect();
        next += count;
        total += s;
        ref_total += ref_clip_s(s, caption, &own);
    }
    let n = reference_counts.len().max(1) as f64;
    CorpusScores {
        clip_s: total / n,
        ref_clip_s: ref_total / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit vector at `angle` radians from the first axis, in the plane
    /// of the first two.
    fn at(angle: f64) -> Vec<f32> {
        vec![angle.cos() as f32, angle.sin() as f32, 0.0]
    }

    #[test]
    fn negative_cosines_are_floored_at_zero() {
        // cos = 0.6: CLIP-S = 2.5 x 0.6.
        let image = at(0.0);
        let caption = at(0.6f64.acos());
        assert!((clip_s(&image, &caption) - 1.5).abs() < 1e-6);
        // cos = -0.6: floored, not -1.5.
        let away = at((-0.6f64).acos());
        assert_eq!(clip_s(&image, &away), 0.0);
        // RefCLIP-S with references at cos 0.8 and -0.9 from the caption:
        // the harmonic mean of 1.5 and 0.8.
        let references = [
            at(0.6f64.acos() + 0.8f64.acos()),
            at(0.6f64.acos() + (-0.9f64).acos()),
        ];
        let refs: Vec<&[f32]> = references.iter().map(Vec::as_slice).collect();
        let want = 2.0 * 1.5 * 0.8 / (1.5 + 0.8);
        assert!((ref_clip_s(1.5, &caption, &refs) - want).abs() < 1e-6);
        // Every reference facing away: the text side is 0, and so is the mean.
        let opposite = [at(0.6f64.acos() + (-0.9f64).acos())];
        let opposite: Vec<&[f32]> = opposite.iter().map(Vec::as_slice).collect();
        assert_eq!(ref_clip_s(1.5, &caption, &opposite), 0.0);
        // Both sides 0: 0, not 0 / 0.
        assert_eq!(ref_clip_s(0.0, &caption, &opposite), 0.0);
        // Both sides equal (0.5, exact in binary): their mean is that value.
        let even = [vec![0.5, 0.75f32.sqrt(), 0.0]];
        let even: Vec<&[f32]> = even.iter().map(Vec::as_slice).collect();
        assert_eq!(ref_clip_s(0.5, &image, &even), 0.5);
    }

    #[test]
    fn corpus_scores_average_each_image_with_its_own_references() {
        // Image 0: caption at cos 0.6, one reference at cos 0.8 from the
        // caption. Image 1: caption at cos 0.8, references at cos 0.5 and
        // -0.3 from it.
        let (c0, c1) = (0.6f64.acos(), 0.8f64.acos());
        let images = [at(0.0), at(0.0)].concat();
        let candidates = [at(c0), at(c1)].concat();
        let references = [
            at(c0 + 0.8f64.acos()),
            at(c1 - 0.5f64.acos()),
            at(c1 + (-0.3f64).acos()),
        ]
        .concat();
        let got = corpus_scores(&images, &candidates, &references, &[1, 2], 3);
        let harmonic = |a: f64, b: f64| 2.0 * a * b / (a + b);
        assert!((got.clip_s - (1.5 + 2.0) / 2.0).abs() < 1e-6, "{got:?}");
        let want = (harmonic(1.5, 0.8) + harmonic(2.0, 0.5)) / 2.0;
        assert!((got.ref_clip_s - want).abs() < 1e-6, "{got:?}");
    }
}
