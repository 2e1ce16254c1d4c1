//! CIDEr-D as pycocoevalcap's `CiderScorer` computes it: tf-idf vectors of
//! 1- to 4-grams, document frequencies over a reference set (one document
//! per image), the candidate's weights clipped by the reference's, a
//! Gaussian penalty (sigma 6) on the difference in length, the mean over
//! references and n, times 10. As there, "length" counts bigrams.
//!
//! Words are numbered and an n-gram packed into one integer, so that
//! counting allocates nothing per n-gram; vectors are sorted by n-gram,
//! so that dot products sum in a fixed order and a score is the same to
//! the last bit in every process.

use std::collections::HashMap;

const N: usize = 4;
const SIGMA: f64 = 6.0;

/// An n-gram of one to four word numbers, each plus one in 32 bits (zero
/// lanes: no word), so that grams of different orders never collide.
type Gram = u128;

/// Document frequencies of a reference set: the evaluated images' own
/// references for evaluation, the training references for rewards.
pub struct CiderD {
    /// The references' words, numbered.
    words: HashMap<String, u32>,
    document_frequency: HashMap<Gram, f64>,
    /// log(number of images).
    log_documents: f64,
}

/// A caption's tf-idf vector of each order, sorted by n-gram.
struct TfIdf {
    vectors: [Vec<(Gram, f64)>; N],
    norms: [f64; N],
    length: f64,
}

/// Each order's n-grams of `ids` with their counts, sorted.
fn counted_grams(ids: &[u32]) -> [Vec<(Gram, usize)>; N] {
    std::array::from_fn(|n| {
        let mut grams: Vec<Gram> = ids
            .windows(n + 1)
            .map(|w| w.iter().fold(0, |g, &id| (g << 32) | (Gram::from(id) + 1)))
            .collect();
        grams.sort_unstable();
        let mut counted: Vec<(Gram, usize)> = Vec::with_capacity(grams.len());
        for g in grams {
            match counted.last_mut() {
                Some((last, count)) if *last == g => *count += 1,
                _ => counted.push((g, 1)),
            }
        }
        counted
    })
}

impl CiderD {
    /// From every image's reference token lists.
    pub fn new<S: AsRef<str>>(references: &[Vec<Vec<S>>]) -> CiderD {
        let mut words: HashMap<String, u32> = HashMap::new();
        let mut document_frequency: HashMap<Gram, f64> = HashMap::new();
        for refs in references {
            let mut grams: Vec<Gram> = Vec::new();
            for r in refs {
                let ids: Vec<u32> = (r.iter())
                    .map(|w| {
                        let next = words.len() as u32;
                        *words.entry(w.as_ref().to_string()).or_insert(next)
                    })
                    .collect();
                grams.extend(counted_grams(&ids).iter().flatten().map(|&(g, _)| g));
            }
            grams.sort_unstable();
            grams.dedup();
            for g in grams {
                *document_frequency.entry(g).or_default() += 1.0;
            }
        }
        CiderD {
            words,
            document_frequency,
            log_documents: (references.len() as f64).ln(),
        }
    }

    /// The words' numbers; a word no reference has gets one of its own
    /// from `unseen`.
    fn ids<S: AsRef<str>>(&self, caption: &[S], unseen: &mut HashMap<String, u32>) -> Vec<u32> {
        (caption.iter())
            .map(|w| match self.words.get(w.as_ref()) {
                Some(&id) => id,
                None => {
                    let next = (self.words.len() + unseen.len()) as u32;
                    *unseen.entry(w.as_ref().to_string()).or_insert(next)
                }
            })
            .collect()
    }

    fn tf_idf(&self, ids: &[u32]) -> TfIdf {
        let mut t = TfIdf {
            vectors: Default::default(),
            norms: [0.0; N],
            length: 0.0,
        };
        for (n, grams) in counted_grams(ids).into_iter().enumerate() {
            for (gram, tf) in grams {
                let df = self
                    .document_frequency
                    .get(&gram)
                    .copied()
                    .unwrap_or(0.0)
                    .max(1.0)
                    .ln();
                let w = tf as f64 * (self.log_documents - df);
                t.vectors[n].push((gram, w));
                t.norms[n] += w * w;
                if n == 1 {
                    t.length += tf as f64;
                }
            }
        }
        for norm in &mut t.norms {
            *norm = norm.sqrt();
        }
        t
    }

    /// CIDEr-D of one candidate against its image's references.
    pub fn score<S: AsRef<str>>(&self, candidate: &[S], references: &[Vec<S>]) -> f64 {
        let mut unseen = HashMap::new();
        let cand = self.tf_idf(&self.ids(candidate, &mut unseen));
        let mut sum = [0.0f64; N];
        for r in references {
            let reference = self.tf_idf(&self.ids(r, &mut unseen));
            let delta = cand.length - reference.length;
            let penalty = (-(delta * delta) / (2.0 * SIGMA * SIGMA)).exp();
            for (n, total) in sum.iter_mut().enumerate() {
                let mut value = clipped_dot(&cand.vectors[n], &reference.vectors[n]);
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

/// The sum over the candidate's n-grams of min(its weight, the
/// reference's) times the reference's, in n-gram order (a gram the
/// reference lacks adds nothing).
fn clipped_dot(candidate: &[(Gram, f64)], reference: &[(Gram, f64)]) -> f64 {
    let mut value = 0.0;
    let mut r = reference.iter().peekable();
    for &(gram, w) in candidate {
        while r.next_if(|(g, _)| *g < gram).is_some() {}
        if let Some(&&(g, wr)) = r.peek()
            && g == gram
        {
            value += w.min(wr) * wr;
        }
    }
    value
}
