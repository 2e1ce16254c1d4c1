//! n-gram counting shared by BLEU, CIDEr-D and the diversity metrics.

use std::collections::BTreeMap;

/// Counts of every n-gram of order 1..=max_n, keyed by its words. Ordered,
/// so that sums over n-grams take the same order in every process and the
/// scores are the same to the last bit.
pub type NgramCounts = BTreeMap<Vec<String>, usize>;

pub fn count_ngrams<S: AsRef<str>>(words: &[S], max_n: usize) -> NgramCounts {
    let mut counts = NgramCounts::new();
    for n in 1..=max_n {
        for window in words.windows(n) {
            let gram: Vec<String> = window.iter().map(|w| w.as_ref().to_string()).collect();
            *counts.entry(gram).or_default() += 1;
        }
    }
    counts
}
