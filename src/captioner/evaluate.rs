//! Every caption metric of spec section 4 for a set of generated captions:
//! the reference-based scores (pycocoevalcap's), diversity, and, given the
//! retriever, self-retrieval, P@1 among 100, CLIPScore-style relevance and
//! RefCompare; on the shapes world, fact precision and recall.

use crate::backend::Backend;
use crate::data::shapes::facts;
use crate::data::{Caption, Item};
use crate::metrics::diversity::{diversity, mean_length, vocabulary_usage};
use crate::metrics::{CocoScores, coco_scores};
use crate::retriever::Checkpoint as RetrieverCheckpoint;
use crate::retriever::eval::{embed_captions, recall};
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
    /// Distinct words over all captions (the SMILE paper's lexical diversity).
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
    pub fact_precision: Option<f64>,
    pub fact_recall: Option<f64>,
}

/// The retriever and the evaluated images' embeddings (L2-normalised, one
/// row per item).
pub struct Judge<'r, B: Backend> {
    pub retriever: &'r mut RetrieverCheckpoint<B>,
    pub image_embeddings: &'r [f32],
}

/// `generated[i]` are item i's captions (tokens); the first is the one
/// scored against references and retrieved.
pub fn evaluate<B: Backend>(
    b: &B,
    items: &[&Item],
    generated: &[Vec<Vec<String>>],
    judge: Option<Judge<'_, B>>,
) -> Result<CaptionMetrics> {
    assert_eq!(items.len(), generated.len(), "captions for every item");
    let firsts: Vec<Vec<String>> = generated.iter().map(|g| g[0].clone()).collect();
    let references: Vec<Vec<Vec<String>>> = items
        .iter()
        .map(|i| i.captions.iter().map(|c| c.tokens.clone()).collect())
        .collect();
    let all: Vec<Vec<String>> = generated.iter().flatten().cloned().collect();
    let mut m = CaptionMetrics {
        images: items.len(),
        coco: Some(coco_scores(&firsts, &references)),
        mean_length: mean_length(&all),
        lexical_diversity: vocabulary_usage(&all),
        vocabulary_usage: vocabulary_usage(&all),
        ..Default::default()
    };
    if generated.iter().all(|g| g.len() >= 2) {
        let d = diversity(generated);
        (m.div1, m.div2, m.mbleu4) = (Some(d.div1), Some(d.div2), Some(d.mbleu4));
    }
    if items.iter().all(|i| i.scene.is_some()) {
        let (mut p, mut r) = (0.0, 0.0);
        for (item, c) in items.iter().zip(&firsts) {
            let checked = facts::check(&c.join(" "), item.scene.as_ref().expect("checked above"));
            p += checked.precision();
            r += checked.recall();
        }
        let n = items.len().max(1) as f64;
        (m.fact_precision, m.fact_recall) = (Some(p / n), Some(r / n));
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
    let dim = ck.model.config.embed_dim;
    let as_caption = |tokens: &Vec<String>| Caption {
        raw: tokens.join(" "),
        tokens: if tokens.is_empty() {
            vec!["<unk>".into()]
        } else {
            tokens.clone()
        },
    };
    let generated: Vec<Caption> = captions.iter().map(as_caption).collect();
    let text = embed_captions(
        b,
        &mut ck.model,
        &ck.vocab,
        &generated.iter().collect::<Vec<_>>(),
    )?;
    let images = judge.image_embeddings;
    let n = items.len();
    let r = recall(images, &text, dim, &(0..n).collect::<Vec<_>>());
    (m.self_retrieval_r1, m.self_retrieval_r5) = (Some(r.t2i_r1), Some(r.t2i_r5));
    let cos = |i: usize, t: &[f32]| -> f64 {
        images[i * dim..(i + 1) * dim]
            .iter()
            .zip(t)
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum()
    };
    let row = |j: usize| &text[j * dim..(j + 1) * dim];
    // P@1 among 100: the target against 99 other images drawn at random.
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut hits = 0usize;
    for j in 0..n {
        let mut others: Vec<usize> = (0..n).filter(|&k| k != j).collect();
        others.shuffle(&mut rng);
        let s = cos(j, row(j));
        hits += usize::from(others.iter().take(99).all(|&k| cos(k, row(j)) < s));
    }
    m.p1_among_100 = Some(hits as f64 / n.max(1) as f64);
    // CLIPScore-style relevance and RefCompare against the references.
    let references: Vec<&Caption> = items.iter().flat_map(|i| &i.captions).collect();
    let ref_text = embed_captions(b, &mut ck.model, &ck.vocab, &references)?;
    let (mut clip, mut better, mut k) = (0.0, 0.0, 0);
    for (j, item) in items.iter().enumerate() {
        let s = cos(j, row(j));
        clip += 100.0 * 2.5 * s.max(0.0);
        let refs = item.captions.len();
        let lower = (0..refs)
            .filter(|&r| cos(j, &ref_text[(k + r) * dim..(k + r + 1) * dim]) < s)
            .count();
        better += lower as f64 / refs.max(1) as f64;
        k += refs;
    }
    m.clipscore = Some(clip / n.max(1) as f64);
    m.refcompare = Some(better / n.max(1) as f64);
    Ok(())
}
