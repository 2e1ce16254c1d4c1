//! CIDEr-D as pycocoevalcap's `CiderScorer` computes it: tf-idf vectors of
//! 1- to 4-grams, document frequencies over a reference set (one document
//! per image), the candidate's weights clipped by the reference's, a
//! Gaussian penalty (sigma 6) on the difference in length, the mean over
//! references and n, times 10. As there, "length" counts bigrams.

use super::ngrams::{NgramCounts, count_ngrams};
use std::collections::{BTreeMap, HashMap, HashSet};

const N: usize = 4;
const SIGMA: f64 = 6.0;

/// Document frequencies of a reference set: the evaluated images' own
/// references for evaluation, the training references for rewards.
pub struct CiderD {
    document_frequency: HashMap<Vec<String>, f64>,
    /// log(number of images).
    log_documents: f64,
}

struct TfIdf {
    /// Ordered, as `NgramCounts`: the dot products sum in a fixed order.
    vectors: [BTreeMap<Vec<String>, f64>; N],
    norms: [f64; N],
    length: f64,
}

impl CiderD {
    /// From every image's reference token lists.
    pub fn new<S: AsRef<str>>(references: &[Vec<Vec<S>>]) -> CiderD {
        let mut document_frequency: HashMap<Vec<String>, f64> = HashMap::new();
        for refs in references {
            let grams: HashSet<Vec<String>> = refs
                .iter()
                .flat_map(|r| count_ngrams(r, N).into_keys())
                .collect();
            for g in grams {
                *document_frequency.entry(g).or_default() += 1.0;
            }
        }
        CiderD {
            document_frequency,
            log_documents: (references.len() as f64).ln(),
        }
    }

    fn tf_idf(&self, counts: &NgramCounts) -> TfIdf {
        let mut t = TfIdf {
            vectors: Default::default(),
            norms: [0.0; N],
            length: 0.0,
        };
        for (gram, &tf) in counts {
            let df = self
                .document_frequency
                .get(gram)
                .copied()
                .unwrap_or(0.0)
                .max(1.0)
                .ln();
            let n = gram.len() - 1;
            let w = tf as f64 * (self.log_documents - df);
            t.vectors[n].insert(gram.clone(), w);
            t.norms[n] += w * w;
            if n == 1 {
                t.length += tf as f64;
            }
        }
        for norm in &mut t.norms {
            *norm = norm.sqrt();
        }
        t
    }

    /// CIDEr-D of one candidate against its image's references.
    pub fn score<S: AsRef<str>>(&self, candidate: &[S], references: &[Vec<S>]) -> f64 {
        let cand = self.tf_idf(&count_ngrams(candidate, N));
        let mut sum = [0.0f64; N];
        for r in references {
            let reference = self.tf_idf(&count_ngrams(r, N));
            let delta = cand.length - reference.length;
            let penalty = (-(delta * delta) / (2.0 * SIGMA * SIGMA)).exp();
            for (n, total) in sum.iter_mut().enumerate() {
                let mut value: f64 = cand.vectors[n]
                    .iter()
                    .map(|(gram, &w)| {
                        let wr = reference.vectors[n].get(gram).copied().unwrap_or(0.0);
                        w.min(wr) * wr
                    })
                    .sum();
                if cand.norms[n] != 0.0 && reference.norms[n] != 0.0 {
                    value /= cand.norms[n] * reference.norms[n];
                }
                *total += value * penalty;
            }
        }
        let mean_over_n = sum.iter().sum::<f64>() / N as f64;
        mean_over_n / references.len() as f64 * 10.0
    }
}
