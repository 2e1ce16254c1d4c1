//! Corpus BLEU-1..4 as pycocoevalcap's `BleuScorer` computes it with the
//! "closest" reference length: clipped n-gram matches and candidate
//! n-grams summed over the corpus, p_n = (matches + 1e-15) / (guesses +
//! 1e-9), BLEU-n the geometric mean of p_1..p_n, times the brevity
//! penalty exp(1 - r / c) when the candidates are shorter in total.

use super::ngrams::{NgramCounts, count_ngrams};

pub const MAX_N: usize = 4;

/// Sums over the corpus, per n-gram order.
#[derive(Clone, Debug, Default)]
pub struct BleuStats {
    candidate_len: f64,
    reference_len: f64,
    guesses: [f64; MAX_N],
    matches: [f64; MAX_N],
}

impl BleuStats {
    /// Adds one candidate with its references (token lists).
    pub fn add<S: AsRef<str>>(&mut self, candidate: &[S], references: &[Vec<S>]) {
        let c = candidate.len();
        // The reference length closest to the candidate's; ties: the shorter.
        let r = references
            .iter()
            .map(|r| r.len())
            .min_by_key(|&l| (l.abs_diff(c), l))
            .unwrap_or(0);
        self.candidate_len += c as f64;
        self.reference_len += r as f64;
        let ref_counts: Vec<NgramCounts> =
            references.iter().map(|r| count_ngrams(r, MAX_N)).collect();
        let cand = count_ngrams(candidate, MAX_N);
        for (gram, &count) in &cand {
            let n = gram.len() - 1;
            let max_ref = ref_counts
                .iter()
                .map(|rc| rc.get(gram).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            self.matches[n] += count.min(max_ref) as f64;
        }
        for n in 0..MAX_N {
            self.guesses[n] += (c + 1).saturating_sub(n + 1) as f64;
        }
    }

    /// BLEU-1..4.
    pub fn scores(&self) -> [f64; MAX_N] {
        const TINY: f64 = 1e-15;
        const SMALL: f64 = 1e-9;
        let ratio = (self.candidate_len + TINY) / (self.reference_len + SMALL);
        let penalty = if ratio < 1.0 {
            (1.0 - 1.0 / ratio).exp()
        } else {
            1.0
        };
        let mut product = 1.0;
        let mut out = [0.0; MAX_N];
        for (n, score) in out.iter_mut().enumerate() {
            product *= (self.matches[n] + TINY) / (self.guesses[n] + SMALL);
            *score = product.powf(1.0 / (n + 1) as f64) * penalty;
        }
        out
    }
}

/// BLEU-1..4 of one candidate against its references, as a corpus of one.
pub fn sentence_bleu<S: AsRef<str>>(candidate: &[S], references: &[Vec<S>]) -> [f64; MAX_N] {
    let mut stats = BleuStats::default();
    stats.add(candidate, references);
    stats.scores()
}
