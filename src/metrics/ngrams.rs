//! n-gram counting shared by BLEU, CIDEr-D and the diversity metrics.

use std::collections::HashMap;

/// Counts of every n-gram of order 1..=max_n, keyed by its words.
pub type NgramCounts = HashMap<Vec<String>, usize>;

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
