//! The vocabulary: the words of the training captions seen at least
//! `min_count` times, after four special tokens.

use super::{Dataset, Split};
use std::collections::HashMap;

pub const PAD: u32 = 0;
pub const BOS: u32 = 1;
pub const EOS: u32 = 2;
pub const UNK: u32 = 3;
pub const SPECIALS: [&str; 4] = ["<pad>", "<bos>", "<eos>", "<unk>"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vocab {
    words: Vec<String>,
    index: HashMap<String, u32>,
}

pub const DEFAULT_MIN_COUNT: usize = 5;

impl Vocab {
    /// From the training captions of `data`; words in order of falling
    /// count, ties alphabetical, so the ids are reproducible.
    pub fn build(data: &Dataset, min_count: usize) -> Vocab {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for item in data.split(Split::Train) {
            for c in &item.captions {
                for t in &c.tokens {
                    *counts.entry(t).or_default() += 1;
                }
            }
        }
        let mut kept: Vec<(&str, usize)> = counts
            .into_iter()
            .filter(|&(_, n)| n >= min_count)
            .collect();
        kept.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        Vocab::from_words(kept.into_iter().map(|(w, _)| w.to_string()).collect())
    }

    /// From the non-special words, in id order (as a checkpoint stores them).
    pub fn from_words(words: Vec<String>) -> Vocab {
        let words: Vec<String> = SPECIALS
            .iter()
            .map(|s| s.to_string())
            .chain(words)
            .collect();
        let index = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.clone(), i as u32))
            .collect();
        Vocab { words, index }
    }

    /// The non-special words, in id order.
    pub fn words(&self) -> &[String] {
        &self.words[SPECIALS.len()..]
    }

    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub fn id(&self, word: &str) -> u32 {
        self.index.get(word).copied().unwrap_or(UNK)
    }

    pub fn word(&self, id: u32) -> &str {
        self.words.get(id as usize).map_or("<unk>", String::as_str)
    }

    /// `<bos> tokens <eos>`, the tokens truncated so it fits in `max_len`.
    pub fn encode(&self, tokens: &[String], max_len: usize) -> Vec<u32> {
        assert!(
            max_len >= 3,
            "max_len must leave room for <bos>, a token and <eos>"
        );
        let keep = tokens.len().min(max_len - 2);
        std::iter::once(BOS)
            .chain(tokens[..keep].iter().map(|t| self.id(t)))
            .chain(std::iter::once(EOS))
            .collect()
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .filter(|&&id| id >= UNK)
            .map(|&id| self.word(id))
            .collect::<Vec<_>>()
            .join(" ")
    }
}
