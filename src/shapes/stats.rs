//! What a generated split looks like: the caption mix, caption lengths,
//! and how well the captions can identify their image at all.

use super::Generated;
use super::domain::Verbosity;
use super::facts;
use rayon::prelude::*;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct VerbosityStats {
    pub verbosity: Verbosity,
    pub captions: usize,
    pub share: f64,
    pub mean_words: f64,
    pub min_words: usize,
    pub max_words: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct SplitStats {
    pub images: usize,
    pub by_verbosity: Vec<VerbosityStats>,
    /// Mean over captions of 1 / (images of the split whose scene makes
    /// every fact the caption states true): the text-to-image R@1 that a
    /// retriever knowing only the stated facts would reach on average.
    pub oracle_t2i_r1: f64,
    /// The same among the images with as many objects as the caption's own
    /// (a retriever can tell the count from how a caption is written).
    pub oracle_t2i_r1_known_count: f64,
    /// Mean fact recall of the references against their own scene.
    pub mean_fact_recall: f64,
}

pub fn split_stats(split: &[Generated]) -> SplitStats {
    let captions: Vec<(usize, Verbosity, &str)> = split
        .iter()
        .enumerate()
        .flat_map(|(i, g)| g.references.iter().map(move |(v, c)| (i, *v, c.as_str())))
        .collect();
    let total = captions.len().max(1);
    let by_verbosity = Verbosity::ALL
        .iter()
        .map(|&v| {
            let words: Vec<usize> = captions
                .iter()
                .filter(|c| c.1 == v)
                .map(|c| c.2.split_whitespace().count())
                .collect();
            VerbosityStats {
                verbosity: v,
                captions: words.len(),
                share: words.len() as f64 / total as f64,
                mean_words: words.iter().sum::<usize>() as f64 / words.len().max(1) as f64,
                min_words: words.iter().copied().min().unwrap_or(0),
                max_words: words.iter().copied().max().unwrap_or(0),
            }
        })
        .collect();
    let per_caption: Vec<[f64; 3]> = captions
        .par_iter()
        .map(|&(i, _, caption)| {
            let statements = facts::parse(caption);
            let count = split[i].scene.objects.len();
            let (mut matches, mut same_count) = (0usize, 0usize);
            for g in split
                .iter()
                .filter(|g| statements.check(&g.scene).consistent())
            {
                matches += 1;
                same_count += usize::from(g.scene.objects.len() == count);
            }
            [
                1.0 / matches.max(1) as f64,
                1.0 / same_count.max(1) as f64,
                statements.check(&split[i].scene).recall(),
            ]
        })
        .collect();
    let mean = |k: usize| per_caption.iter().map(|c| c[k]).sum::<f64>() / total as f64;
    SplitStats {
        images: split.len(),
        by_verbosity,
        oracle_t2i_r1: mean(0),
        oracle_t2i_r1_known_count: mean(1),
        mean_fact_recall: mean(2),
    }
}
