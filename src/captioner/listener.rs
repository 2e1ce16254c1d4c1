//! The frozen retriever reading the captioner's captions (the "listener"
//! of the retriever-in-the-loop objectives): the two models' vocabularies
//! differ, so a caption's ids go through a map built once, then through
//! the retriever's text tower.

use super::CaptionVocab;
use crate::backend::Backend;
use crate::data::vocab::{BOS, EOS, UNK, Vocab};
use crate::retriever::eval::embed_ids;
use crate::retriever::model::Retriever;
use anyhow::Result;

/// Captioner id -> retriever id: the same word, or the retriever's
/// `<unk>` for a word it does not know; an alternative (SMILE's reserved
/// copy of a word) maps as its word.
#[derive(Clone, Debug, PartialEq)]
pub struct VocabMap {
    ids: Vec<u32>,
}

impl VocabMap {
    pub fn new(captioner: &CaptionVocab, retriever: &Vocab) -> VocabMap {
        let ids = (0..captioner.len() as u32)
            .map(|id| retriever.id(captioner.words.word(captioner.canonical(id))))
            .collect();
        VocabMap { ids }
    }

    /// The retriever's id of captioner id `id` (`<unk>` past the vocabulary).
    pub fn map(&self, id: u32) -> u32 {
        self.ids.get(id as usize).copied().unwrap_or(UNK)
    }

    /// A generated caption (ids up to its `<eos>`, if any; `<bos>` and
    /// specials dropped) as the retriever reads it: `<bos> words <eos>`
    /// within `max_len`, the words cut as `Vocab::encode` cuts them. An
    /// empty caption reads as `<unk>`, as evaluation embeds it.
    pub fn caption(&self, generated: &[u32], max_len: usize) -> Vec<u32> {
        let mut words: Vec<u32> = generated
            .iter()
            .take_while(|&&id| id != EOS)
            .filter(|&&id| id >= UNK)
            .map(|&id| self.map(id))
            .collect();
        if words.is_empty() {
            words.push(UNK);
        }
        words.truncate(max_len.saturating_sub(2));
        std::iter::once(BOS)
            .chain(words)
            .chain(std::iter::once(EOS))
            .collect()
    }
}

/// The unit text embeddings `[n, embed_dim]` of generated captions.
pub fn embed_generated<B: Backend>(
    b: &B,
    retriever: &mut Retriever<B>,
    map: &VocabMap,
    captions: &[&[u32]],
) -> Result<Vec<f32>> {
    let max_len = retriever.config.max_len;
    let ids: Vec<Vec<u32>> = captions.iter().map(|c| map.caption(c, max_len)).collect();
    embed_ids(b, retriever, &ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn words_map_by_name_and_unknown_words_become_unk() {
        let captioner = CaptionVocab::from_words(words(&["a", "red", "zebra", "circle", "##red"]));
        let retriever = Vocab::from_words(words(&["circle", "a", "red"]));
        let map = VocabMap::new(&captioner, &retriever);
        let id = |v: &Vocab, w: &str| v.id(w);
        assert_eq!(map.map(captioner.words.id("a")), id(&retriever, "a"));
        assert_eq!(
            map.map(captioner.words.id("circle")),
            id(&retriever, "circle")
        );
        assert_eq!(map.map(captioner.words.id("zebra")), UNK);
        assert_eq!(map.map(captioner.words.id("##red")), id(&retriever, "red"));
        assert_eq!(map.map(10_000), UNK);
        // A caption reads as the retriever's own encoding of its words.
        let generated: Vec<u32> = ["a", "red", "zebra", "circle"]
            .iter()
            .map(|w| captioner.words.id(w))
            .chain([EOS, captioner.words.id("a")])
            .collect();
        let tokens: Vec<String> = ["a", "red", "zebra", "circle"].map(String::from).to_vec();
        assert_eq!(map.caption(&generated, 16), retriever.encode(&tokens, 16));
        assert_eq!(map.caption(&generated, 4), retriever.encode(&tokens, 4));
        assert_eq!(map.caption(&[EOS], 16), vec![BOS, UNK, EOS]);
    }
}
