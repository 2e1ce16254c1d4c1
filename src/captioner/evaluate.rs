//! Captioning a split's images and scoring the captions: every caption
//! metric captune reports for a set of generated captions, the
//! reference-based scores (pycocoevalcap's), diversity, and, given the
//! retriever, self-retrieval, P@1 among 100, CLIPScore-style relevance and
//! RefCompare; on the shapes world, fact precision and recall.

use super::Checkpoint;
use super::decode::{DecodeOptions, Decoding, IMAGES_PER_BATCH, generate};
use crate::backend::Backend;
use crate::data::Item;
use crate::metrics::clipscore::{PROMPT, corpus_scores};
use crate::metrics::diversity::{diversity, mean_length, vocabulary_usage};
use crate::metrics::meteor::Meteor;
use crate::metrics::{CocoScores, coco_scores};
use crate::retriever::eval::recall;
use crate::retriever::frozen::FrozenRetriever;
use crate::shapes::{self, Scene, facts};
use crate::source::embeddings::CaptionData;
use anyhow::Result;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CaptionMetrics {
    pub images: usize,
    #[serde(flatten)]
    pub coco: Option<CocoScores>,
    pub mean_length: f64,
    /// Distinct words over all captions (the lexical diversity of Yue et al., 2023).
    pub lexical_diversity: usize,
    pub vocabulary_usage: usize,
    /// With several captions per image: Div-1, Div-2 and mBLEU-4.
    pub div1: Option<f64>,
    pub div2: Option<f64>,
    pub mbleu4: Option<f64>,
    pub self_retrieval_r1: Option<f64>,
    pub self_retrieval_r5: Option<f64>,
    pub p1_among_100: Option<f64>,
    pub clipscore: Option<f64>,
    pub refcompare: Option<f64>,
    /// Given a CLIP: CLIP-S and RefCLIP-S (Hessel et al., 2021), named
    /// as `score` names them.
    #[serde(rename = "CLIP-S", skip_serializing_if = "Option::is_none")]
    pub clip_s: Option<f64>,
    #[serde(rename = "RefCLIP-S", skip_serializing_if = "Option::is_none")]
    pub ref_clip_s: Option<f64>,
    /// Given a GPT-2 (`--fluency`): the captions' perplexity under it, the
    /// mean over captions and the corpus's ([`crate::metrics::fluency`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corpus_perplexity: Option<f64>,
    /// METEOR 1.5, where its data is found ([`crate::metrics::meteor`]).
    #[serde(rename = "METEOR", skip_serializing_if = "Option::is_none")]
    pub meteor: Option<f64>,
    pub fact_precision: Option<f64>,
    pub fact_recall: Option<f64>,
    /// Shapes world: the objects a caption names, on average (its breadth).
    pub objects_named: Option<f64>,
    /// Shapes world: attributes stated per named object (its detail).
    pub attributes_per_object: Option<f64>,
}

/// The retriever and the evaluated images' embeddings (L2-normalised, one
/// row per item).
struct Judge<'r, B: Backend> {
    retriever: &'r mut FrozenRetriever<B>,
    image_embeddings: &'r [f32],
    /// The data set's name, under which the references' embeddings are cached.
    data_name: &'r str,
}

/// `generated[i]` are item i's captions (tokens); the first is the one
/// scored against references (by METEOR too, when given) and retrieved.
fn evaluate<B: Backend>(
    b: &B,
    items: &[&Item],
    generated: &[Vec<Vec<String>>],
    judge: Option<Judge<'_, B>>,
    meteor: Option<&mut Meteor>,
) -> Result<CaptionMetrics> {
    assert_eq!(items.len(), generated.len(), "captions for every item");
    let firsts: Vec<Vec<String>> = generated.iter().map(|g| g[0].clone()).collect();
    let references: Vec<Vec<Vec<String>>> = items
        .iter()
        .map(|i| i.captions.iter().map(|c| c.tokens.clone()).collect())
        .collect();
    let all: Vec<Vec<String>> = generated.iter().flatten().cloned().collect();
    let words = vocabulary_usage(&all);
    let mut m = CaptionMetrics {
        images: items.len(),
        coco: Some(coco_scores(&firsts, &references)),
        meteor: match meteor {
            Some(meteor) => Some(meteor.score_tokens(&firsts, &references)?.corpus),
            None => None,
        },
        mean_length: mean_length(&all),
        lexical_diversity: words,
        vocabulary_usage: words,
        ..Default::default()
    };
    if generated.iter().all(|g| g.len() >= 2) {
        let d = diversity(generated);
        (m.div1, m.div2, m.mbleu4) = (Some(d.div1), Some(d.div2), Some(d.mbleu4));
    }
    let scenes: Option<Vec<Scene>> = items.iter().map(|i| shapes::scene(i)).collect();
    if let Some(scenes) = scenes {
        let (mut p, mut stating, mut r) = (0.0, 0, 0.0);
        let (mut objects, mut attributes) = (0, 0);
        for (scene, c) in scenes.iter().zip(&firsts) {
            let statements = facts::parse(&c.join(" "));
            let checked = statements.check(scene);
            if let Some(precision) = checked.precision() {
                (p, stating) = (p + precision, stating + 1);
            }
            r += checked.recall();
            let (o, a) = statements.described();
            (objects, attributes) = (objects + o, attributes + a);
        }
        let n = items.len().max(1) as f64;
        // Over the captions that state a fact: undefined when none does.
        m.fact_precision = (stating > 0).then(|| p / stating as f64);
        m.fact_recall = Some(r / n);
        m.objects_named = Some(objects as f64 / n);
        m.attributes_per_object = Some(attributes as f64 / objects.max(1) as f64);
    }
    if let Some(judge) = judge {
        relevance(b, items, &firsts, judge, &mut m)?;
    }
    Ok(m)
}

fn relevance<B: Backend>(
    b: &B,
    items: &[&Item],
    captions: &[Vec<String>],
    judge: Judge<'_, B>,
    m: &mut CaptionMetrics,
) -> Result<()> {
    let ck = judge.retriever;
    let text = ck.embed_captions(b, captions)?;
    let references: Vec<Vec<String>> = (items.iter())
        .flat_map(|i| i.captions.iter().map(|c| c.tokens.clone()))
        .collect();
    let reference_text = ck.embed_reference_captions(b, judge.data_name, &references)?;
    let counts: Vec<usize> = items.iter().map(|i| i.captions.len()).collect();
    let r = retrieval_scores(
        judge.image_embeddings,
        &text,
        &reference_text,
        &counts,
        ck.model.config.embed_dim,
    );
    m.self_retrieval_r1 = Some(r.r1);
    m.self_retrieval_r5 = Some(r.r5);
    m.p1_among_100 = Some(r.p1_among_100);
    m.clipscore = Some(r.clipscore);
    m.refcompare = Some(r.refcompare);
    if ck.is_clip() {
        // CLIPScore as its authors define it: raw text after the prompt.
        let prompted = |text: &str| format!("{PROMPT}{text}");
        let candidates: Vec<String> = captions.iter().map(|c| prompted(&c.join(" "))).collect();
        let references: Vec<String> = (items.iter())
            .flat_map(|i| i.captions.iter().map(|c| prompted(&c.raw)))
            .collect();
        let scores = corpus_scores(
            judge.image_embeddings,
            &ck.embed_texts(b, &candidates)?,
            &ck.embed_reference_texts(b, judge.data_name, &references)?,
            &counts,
            ck.model.config.embed_dim,
        );
        m.clip_s = Some(scores.clip_s);
        m.ref_clip_s = Some(scores.ref_clip_s);
    }
    Ok(())
}

/// The retriever-based scores of captions, from unit embeddings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetrievalScores {
    pub r1: f64,
    pub r5: f64,
    pub p1_among_100: f64,
    pub clipscore: f64,
    pub refcompare: f64,
}

/// `images` and `captions` are `[n, dim]` (caption j describes image j);
/// `references` holds image j's `reference_counts[j]` reference embeddings
/// in image order.
pub fn retrieval_scores(
    images: &[f32],
    captions: &[f32],
    references: &[f32],
    reference_counts: &[usize],
    dim: usize,
) -> RetrievalScores {
    let n = images.len() / dim;
    let r = recall(images, captions, dim, &(0..n).collect::<Vec<_>>());
    let cos = |i: usize, t: &[f32]| -> f64 {
        images[i * dim..(i + 1) * dim]
            .iter()
            .zip(t)
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum()
    };
    let caption = |j: usize| &captions[j * dim..(j + 1) * dim];
    // P@1 among 100: the target against 99 other images drawn at random.
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut hits = 0usize;
    for j in 0..n {
        let mut others: Vec<usize> = (0..n).filter(|&k| k != j).collect();
        others.shuffle(&mut rng);
        let s = cos(j, caption(j));
        hits += usize::from(others.iter().take(99).all(|&k| cos(k, caption(j)) < s));
    }
    let (mut clip, mut better, mut first) = (0.0, 0.0, 0);
    for (j, &count) in reference_counts.iter().enumerate() {
        let s = cos(j, caption(j));
        clip += 100.0 * 2.5 * s.max(0.0);
        let lower = (first..first + count)
            .filter(|&k| cos(j, &references[k * dim..(k + 1) * dim]) < s)
            .count();
        better += lower as f64 / count.max(1) as f64;
        first += count;
    }
    let n = n.max(1) as f64;
    RetrievalScores {
        r1: r.t2i_r1,
        r5: r.t2i_r5,
        p1_among_100: hits as f64 / n,
        clipscore: clip / n,
        refcompare: better / n,
    }
}

/// Captions `items` with `decoding` and scores them (with the retriever's
/// metrics when one is given).
pub fn evaluate_items<B: Backend>(
    b: &B,
    ck: &Checkpoint<B>,
    data: &CaptionData,
    items: &[usize],
    decoding: &Decoding,
    retriever: Option<&mut FrozenRetriever<B>>,
) -> Result<CaptionMetrics> {
    let generated = caption_items(b, ck, data, items, decoding, &DecodeOptions::default())?;
    score_captions(b, data, items, &generated, retriever, None)
}

/// Every metric of `captions[k]` (the captions of item `items[k]`), with
/// the retriever's and METEOR when they are given.
pub fn score_captions<B: Backend>(
    b: &B,
    data: &CaptionData,
    items: &[usize],
    captions: &[Vec<String>],
    retriever: Option<&mut FrozenRetriever<B>>,
    meteor: Option<&mut Meteor>,
) -> Result<CaptionMetrics> {
    let chosen: Vec<&Item> = items.iter().map(|&i| &data.data.items[i]).collect();
    let tokens: Vec<Vec<Vec<String>>> = captions
        .iter()
        .map(|g| g.iter().map(|c| words(c)).collect())
        .collect();
    let image_embeddings = data.features_of(items);
    let judge = retriever.map(|r| Judge {
        retriever: r,
        image_embeddings: &image_embeddings,
        data_name: &data.data.name,
    });
    evaluate(b, &chosen, &tokens, judge, meteor)
}

pub(super) fn words(caption: &str) -> Vec<String> {
    caption.split_whitespace().map(str::to_string).collect()
}

/// The captions of `items`, `decoding.per_image()` each.
pub fn caption_items<B: Backend>(
    b: &B,
    ck: &Checkpoint<B>,
    data: &CaptionData,
    items: &[usize],
    decoding: &Decoding,
    options: &DecodeOptions,
) -> Result<Vec<Vec<String>>> {
    let mut out = vec![Vec::new(); items.len()];
    // A batch's inputs at a time: image tokens are too large for all at once.
    let batch = IMAGES_PER_BATCH;
    for (first, chunk) in (0..items.len()).step_by(batch).zip(items.chunks(batch)) {
        let options = DecodeOptions {
            first_image: first,
            ..options.clone()
        };
        let inputs = data.inputs_of(chunk, ck.model.config.embedding_reading())?;
        let generated = generate(b, &ck.model, &inputs, decoding, &options)?;
        for g in generated {
            out[first + g.image].push(g.text(&ck.vocab));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retrieval_scores_on_hand_made_embeddings() {
        // Three images on the axes; caption 0 and 1 point at their own
        // image, caption 2 points at image 0.
        let images = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        let s = 0.6f32;
        let c = 0.8f32;
        let captions = [1.0, 0.0, 0.0, 0.0, c, s, c, 0.0, s];
        // Image 0's references: one exact (cos 1), one at cos 0.5. Image 1:
        // one at cos 0.9. Image 2: two at cos 0.
        let references = [
            1.0, 0.0, 0.0, 0.5, 0.866, 0.0, 0.0, 0.9, 0.436, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0,
        ];
        let r = retrieval_scores(&images, &captions, &references, &[2, 1, 2], 3);
        assert!((r.r1 - 2.0 / 3.0).abs() < 1e-12, "{r:?}");
        assert!((r.r5 - 1.0).abs() < 1e-12);
        assert!((r.p1_among_100 - 2.0 / 3.0).abs() < 1e-12);
        // cos per caption: 1, 0.8, 0.6 -> 250, 200, 150.
        assert!((r.clipscore - 200.0).abs() < 1e-4, "{r:?}");
        // Image 0: 1 of 2 references below 1 (the exact one ties); image 1:
        // 0.9 > 0.8, none; image 2: both at 0 < 0.6.
        assert!(
            (r.refcompare - (0.5 + 0.0 + 1.0) / 3.0).abs() < 1e-12,
            "{r:?}"
        );
    }
}
