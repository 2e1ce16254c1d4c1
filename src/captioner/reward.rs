//! CIDEr-D as a training reward (Vedantam et al., 2015). Document frequencies
//! and the reference-length term log(#images) come from the training
//! references, counted once per data set and cached on disk
//! (`$CAPTUNE_CACHE/cider/`; made again whenever missing or unreadable);
//! every training image's reference vectors are made once; n-grams are
//! packed word ids; the rewards of a step's samples are computed in
//! parallel. The formula is `metrics::cider::CiderD`'s (pycocoevalcap's),
//! and the two agree given the same references (tests/suite/objectives/sequence_objectives.rs).

use super::CaptionVocab;
use super::objective::TrainingCorpus;
use crate::{cache, tensorfile};
use anyhow::Context;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;

const N: usize = 4;
const SIGMA: f64 = 6.0;

/// An n-gram of one to four word ids, each plus one in 32 bits (zero
/// lanes: no word), so that grams of different orders never collide.
type Gram = u128;

fn pack(words: &[u32]) -> Gram {
    words
        .iter()
        .fold(0, |g, &w| (g << 32) | (u128::from(w) + 1))
}

/// Document frequencies of n-grams over a reference set, one document per
/// image: what is cached.
#[derive(Serialize, Deserialize)]
struct DocumentFrequencies {
    format: String,
    /// The references' words; a gram's lanes index this list.
    words: Vec<String>,
    documents: usize,
    grams: Vec<(Gram, u32)>,
}

const FORMAT: &str = "captune cider-d document frequencies 1";

impl DocumentFrequencies {
    fn count(references: &[Vec<Vec<String>>]) -> Self {
        let mut words = Words::default();
        let mut df: HashMap<Gram, u32> = HashMap::new();
        for image in references {
            let mut grams: Vec<Gram> = image
                .iter()
                .flat_map(|r| grams_of(&words.intern(r)).collect::<Vec<_>>())
                .collect();
            grams.sort_unstable();
            grams.dedup();
            for g in grams {
                *df.entry(g).or_default() += 1;
            }
        }
        let mut grams: Vec<(Gram, u32)> = df.into_iter().collect();
        grams.sort_unstable();
        DocumentFrequencies {
            format: FORMAT.into(),
            words: words.list,
            // Images without references (unlabelled ones) are no documents.
            documents: documents(references),
            grams,
        }
    }

    /// From the cache when it holds these references' counts, else
    /// counted and cached (a cache that cannot be written is only warned about).
    fn cached(corpus: &TrainingCorpus) -> Self {
        let path = cache_path(corpus);
        let read = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<DocumentFrequencies>(&bytes).ok())
            .filter(|d| d.format == FORMAT && d.documents == documents(&corpus.references));
        if let Some(df) = read {
            return df;
        }
        let df = Self::count(&corpus.references);
        let written = serde_json::to_vec(&df)
            .context("encoding")
            .and_then(|bytes| tensorfile::write_atomic(&path, &bytes));
        if let Err(e) = written {
            eprintln!(
                "warning: could not cache the CIDEr-D statistics at {}: {e:#}; they are counted \
                 again next time",
                path.display()
            );
        }
        df
    }
}

fn documents(references: &[Vec<Vec<String>>]) -> usize {
    references.iter().filter(|r| !r.is_empty()).count()
}

/// Where the counts of `corpus` are cached: named by the data set and a
/// fingerprint of every reference, so a changed data set is counted again.
fn cache_path(corpus: &TrainingCorpus) -> PathBuf {
    let mut text = String::new();
    for image in &corpus.references {
        for r in image {
            text.push_str(&r.join(" "));
            text.push('\n');
        }
        text.push('\n');
    }
    cache::cider_statistics(&corpus.name, &tensorfile::fingerprint(text.as_bytes()))
}

/// Words to ids, in order of first appearance.
#[derive(Default)]
struct Words {
    list: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Words {
    fn id(&mut self, word: &str) -> u32 {
        if let Some(&id) = self.ids.get(word) {
            return id;
        }
        let id = self.list.len() as u32;
        self.list.push(word.to_string());
        self.ids.insert(word.to_string(), id);
        id
    }

    fn intern(&mut self, words: &[String]) -> Vec<u32> {
        words.iter().map(|w| self.id(w)).collect()
    }
}

/// Every 1- to 4-gram of `words`, with repeats.
fn grams_of(words: &[u32]) -> impl Iterator<Item = Gram> + '_ {
    (1..=N).flat_map(move |n| words.windows(n).map(pack))
}

/// A caption's tf-idf vector: per order, (gram, weight) sorted by gram.
struct Vector {
    weights: [Vec<(Gram, f64)>; N],
    norms: [f64; N],
    /// Bigrams, as pycocoevalcap counts a caption's length.
    length: f64,
}

/// The ids given to words the document frequencies never saw.
type Unseen = HashMap<String, u32>;

/// Rewards of sampled captions: CIDEr-D against their image's references
/// under fixed document frequencies.
pub struct CiderReward {
    log_documents: f64,
    /// ln(document frequency) of every gram the references hold.
    log_df: HashMap<Gram, f64>,
    /// Word -> id, for the references' words.
    word_ids: HashMap<String, u32>,
    /// Reads generated ids as words.
    vocab: CaptionVocab,
    /// Each image's reference vectors, by the corpus's image index.
    images: Vec<Vec<Vector>>,
}

impl CiderReward {
    /// With the training references' statistics (cached per data set),
    /// scoring against `corpus`'s images.
    pub fn for_training(corpus: &TrainingCorpus, vocab: &CaptionVocab) -> Self {
        Self::with_frequencies(DocumentFrequencies::cached(corpus), corpus, vocab)
    }

    /// With the statistics of `corpus`'s own references, counted now (as
    /// evaluation does: `metrics::coco_scores`).
    pub fn counted(corpus: &TrainingCorpus, vocab: &CaptionVocab) -> Self {
        Self::with_frequencies(
            DocumentFrequencies::count(&corpus.references),
            corpus,
            vocab,
        )
    }

    fn with_frequencies(
        df: DocumentFrequencies,
        corpus: &TrainingCorpus,
        vocab: &CaptionVocab,
    ) -> Self {
        let mut words = Words::default();
        for w in &df.words {
            words.id(w);
        }
        let mut reward = CiderReward {
            word_ids: words.ids,
            log_documents: (df.documents as f64).ln(),
            log_df: df
                .grams
                .iter()
                .map(|&(g, n)| (g, f64::from(n).ln()))
                .collect(),
            vocab: vocab.clone(),
            images: Vec::new(),
        };
        let images = corpus
            .references
            .par_iter()
            .map(|refs| reward.reference_vectors(refs, &mut Unseen::new()))
            .collect();
        reward.images = images;
        reward
    }

    /// Each reference's vector; words the statistics never saw get ids
    /// from `unseen`.
    fn reference_vectors(&self, references: &[Vec<String>], unseen: &mut Unseen) -> Vec<Vector> {
        (references.iter())
            .map(|r| self.vector(&self.word_ids_of(r.iter().cloned(), unseen)))
            .collect()
    }

    /// The ids of `words`; a word the statistics never saw (an image
    /// outside the corpus) gets an id of its own from `unseen`, counted
    /// down from the top of the range: it stays a distinct word, and
    /// matches only the same word read with the same `unseen`.
    fn word_ids_of(&self, words: impl Iterator<Item = String>, unseen: &mut Unseen) -> Vec<u32> {
        words
            .map(|w| match self.word_ids.get(&w) {
                Some(&id) => id,
                None => {
                    // (`pack` adds one to every id.)
                    let next = u32::MAX - 1 - unseen.len() as u32;
                    *unseen.entry(w).or_insert(next)
                }
            })
            .collect()
    }

    fn vector(&self, words: &[u32]) -> Vector {
        let mut grams: Vec<Gram> = grams_of(words).collect();
        grams.sort_unstable();
        let mut v = Vector {
            weights: Default::default(),
            norms: [0.0; N],
            length: 0.0,
        };
        for run in grams.chunk_by(|a, b| a == b) {
            let gram = run[0];
            let n = (128 - gram.leading_zeros() as usize).div_ceil(32) - 1;
            let log_df = self.log_df.get(&gram).copied().unwrap_or(0.0);
            let w = run.len() as f64 * (self.log_documents - log_df);
            v.weights[n].push((gram, w));
            v.norms[n] += w * w;
            if n == 1 {
                v.length += run.len() as f64;
            }
        }
        for norm in &mut v.norms {
            *norm = norm.sqrt();
        }
        v
    }

    /// CIDEr-D of generated ids (after `<bos>`; `<eos>` ends them) against
    /// image `image`'s references.
    pub fn reward(&self, image: usize, ids: &[u32]) -> f64 {
        self.score(ids, &self.images[image], &mut Unseen::new())
    }

    /// CIDEr-D of generated ids against any `references` (PTB tokens),
    /// under the same statistics: for an image outside the corpus.
    pub fn reward_against(&self, ids: &[u32], references: &[Vec<String>]) -> f64 {
        let mut unseen = Unseen::new();
        let refs = self.reference_vectors(references, &mut unseen);
        self.score(ids, &refs, &mut unseen)
    }

    /// CIDEr-D of generated ids, read as words, against `refs` (read
    /// with `unseen`).
    fn score(&self, ids: &[u32], refs: &[Vector], unseen: &mut Unseen) -> f64 {
        let words = self.word_ids_of(self.vocab.decode_words(ids).into_iter(), unseen);
        let cand = self.vector(&words);
        let mut sum = [0.0f64; N];
        for r in refs {
            let delta = cand.length - r.length;
            let penalty = (-(delta * delta) / (2.0 * SIGMA * SIGMA)).exp();
            for (n, total) in sum.iter_mut().enumerate() {
                let mut value = clipped_dot(&cand.weights[n], &r.weights[n]);
                if cand.norms[n] != 0.0 && r.norms[n] != 0.0 {
                    value /= cand.norms[n] * r.norms[n];
                }
                *total += value * penalty;
            }
        }
        sum.iter().sum::<f64>() / N as f64 / refs.len().max(1) as f64 * 10.0
    }

    /// The rewards of many (image, ids) at once, in parallel.
    pub fn rewards(&self, captions: &[(usize, &[u32])]) -> Vec<f64> {
        captions
            .par_iter()
            .map(|&(image, ids)| self.reward(image, ids))
            .collect()
    }
}

/// sum over grams of min(w_c, w_r) * w_r, over two gram-sorted vectors.
fn clipped_dot(cand: &[(Gram, f64)], reference: &[(Gram, f64)]) -> f64 {
    let (mut i, mut j, mut sum) = (0, 0, 0.0);
    while i < cand.len() && j < reference.len() {
        match cand[i].0.cmp(&reference[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                sum += cand[i].1.min(reference[j].1) * reference[j].1;
                i += 1;
                j += 1;
            }
        }
    }
    sum
}
