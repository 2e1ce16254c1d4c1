//! Caption metrics. BLEU, CIDEr-D and ROUGE-L follow
//! pycocoevalcap exactly (`scripts/coco_reference.py` computes its values
//! for the tests); captions are PTB-tokenised first (`data::tokenize`).

pub mod bleu;
pub mod cider;
pub mod clipscore;
pub mod diversity;
pub mod fluency;
pub mod meteor;
mod ngrams;
pub mod rouge;

use serde::Serialize;

/// The reference-based scores of a corpus, on pycocoevalcap's scale.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CocoScores {
    #[serde(rename = "BLEU-1")]
    pub bleu1: f64,
    #[serde(rename = "BLEU-2")]
    pub bleu2: f64,
    #[serde(rename = "BLEU-3")]
    pub bleu3: f64,
    #[serde(rename = "BLEU-4")]
    pub bleu4: f64,
    #[serde(rename = "CIDEr-D")]
    pub cider_d: f64,
    #[serde(rename = "ROUGE-L")]
    pub rouge_l: f64,
}

/// Scores one candidate per image against that image's references (token
/// lists); CIDEr-D's document frequencies come from these references.
pub fn coco_scores<S: AsRef<str>>(candidates: &[Vec<S>], references: &[Vec<Vec<S>>]) -> CocoScores {
    assert_eq!(
        candidates.len(),
        references.len(),
        "one candidate per image"
    );
    let mut bleu = bleu::BleuStats::default();
    let cider = cider::CiderD::new(references);
    let (mut cider_sum, mut rouge_sum) = (0.0, 0.0);
    for (c, refs) in candidates.iter().zip(references) {
        bleu.add(c, refs);
        cider_sum += cider.score(c, refs);
        rouge_sum += rouge::rouge_l(c, refs);
    }
    let [bleu1, bleu2, bleu3, bleu4] = bleu.scores();
    let n = candidates.len().max(1) as f64;
    CocoScores {
        bleu1,
        bleu2,
        bleu3,
        bleu4,
        cider_d: cider_sum / n,
        rouge_l: rouge_sum / n,
    }
}
