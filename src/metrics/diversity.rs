//! Diversity of generated captions: per image, over its
//! set of captions (five samples), Div-n = distinct n-grams / total words
//! and mBLEU-4 = the mean BLEU-4 of each caption against the others; over
//! all captions, the distinct words used (the "lexical diversity" of Yue et
//! al., 2023) and the mean length.

use super::bleu::sentence_bleu;
use std::collections::HashSet;

#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Diversity {
    pub div1: f64,
    pub div2: f64,
    pub mbleu4: f64,
}

/// Means over images of Div-1, Div-2 and mBLEU-4; `sets[i]` are image i's
/// captions (at least two each for mBLEU-4).
pub fn diversity<S: AsRef<str>>(sets: &[Vec<Vec<S>>]) -> Diversity {
    let mut sum = Diversity::default();
    for set in sets {
        let words: usize = set.iter().map(Vec::len).sum();
        let distinct = |n: usize| -> usize {
            set.iter()
                .flat_map(|c| {
                    c.windows(n)
                        .map(|w| w.iter().map(|s| s.as_ref()).collect::<Vec<_>>())
                })
                .collect::<HashSet<_>>()
                .len()
        };
        if words > 0 {
            sum.div1 += distinct(1) as f64 / words as f64;
            sum.div2 += distinct(2) as f64 / words as f64;
        }
        let mut mbleu = 0.0;
        for (i, c) in set.iter().enumerate() {
            let others: Vec<Vec<&str>> = set
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, o)| o.iter().map(|s| s.as_ref()).collect())
                .collect();
            let c: Vec<&str> = c.iter().map(|s| s.as_ref()).collect();
            mbleu += sentence_bleu(&c, &others)[3];
        }
        sum.mbleu4 += mbleu / set.len().max(1) as f64;
    }
    let n = sets.len().max(1) as f64;
    Diversity {
        div1: sum.div1 / n,
        div2: sum.div2 / n,
        mbleu4: sum.mbleu4 / n,
    }
}

/// Distinct words across all captions.
pub fn vocabulary_usage<S: AsRef<str>>(captions: &[Vec<S>]) -> usize {
    captions
        .iter()
        .flatten()
        .map(|w| w.as_ref())
        .collect::<HashSet<_>>()
        .len()
}

/// Mean words per caption.
pub fn mean_length<S>(captions: &[Vec<S>]) -> f64 {
    captions.iter().map(Vec::len).sum::<usize>() as f64 / captions.len().max(1) as f64
}
