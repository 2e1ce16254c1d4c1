//! The captioner's vocabulary: a data set's words for a decoder trained
//! from scratch, a pretrained GPT-2's BPE pieces, or BLIP's WordPiece
//! pieces. Everything else
//! reads captions through [`CaptionVocab`]: metrics and rewards see the
//! words a caption's ids decode to, never the ids.

use super::SpecialIds;
use crate::data::bpe::BpeVocab;
use crate::data::tokenize::ptb_tokenize;
use crate::data::vocab::{BOS, EOS, UNK, Vocab};
use crate::data::wordpiece::{WordPieceVocab, is_wordpiece};
use crate::data::{Dataset, Split};
use crate::model::checkpoint::{self, StoredVocab};
use crate::tensorfile::TensorFile;
use anyhow::{Result, bail};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// Metadata key of a pretrained vocabulary's tokenizer (its `tokenizer.json`).
pub const TOKENIZER_KEY: &str = "tokenizer";
/// The piece a pretrained vocabulary's captions end at, where it is not
/// the tokenizer's own end (ClipCap's ".").
pub const CAPTION_END_KEY: &str = "caption_end";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptionVocab {
    Words(WordVocab),
    /// Boxed: a tokenizer is far larger than a word list's handle.
    Pieces(Box<PieceVocab>),
    WordPieces(Box<WordPieces>),
}

/// The data set's words, then one reserved alternative id (`##word`) for
/// each word that begins a training caption. First-token shifting (SMILE
/// section 3.3) trains step 0 towards the alternative; decoding maps it
/// back to the word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WordVocab {
    pub words: Vocab,
    /// Ids below this are words; from it on, alternatives.
    first_alternative: u32,
    /// alternative id - first_alternative -> word id, and back.
    alternative_word: Vec<u32>,
    word_alternative: HashMap<u32, u32>,
}

/// A GPT-2's BPE pieces, then one id more: the padding, which no caption
/// holds (`<|endoftext|>` is the start and the end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PieceVocab {
    pub bpe: BpeVocab,
    /// The model's ids: GPT-2's and the padding (the last).
    ids: usize,
}

/// BLIP's WordPiece pieces: a caption is `[DEC] pieces [SEP]`, and
/// `[PAD]` pads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WordPieces {
    pub pieces: WordPieceVocab,
    /// The model's ids (its config's vocab_size: the tokenizer's or more).
    ids: usize,
    specials: SpecialIds,
}

/// The tokens of BLIP's tokenizer that start, end and pad a caption.
const WORDPIECE_SPECIALS: [&str; 3] = ["[DEC]", "[SEP]", "[PAD]"];

const ALTERNATIVE_MARK: &str = "##";

impl CaptionVocab {
    /// Words seen `min_count` times in the training captions, plus the
    /// alternatives of every word that begins one of them.
    pub fn build(data: &Dataset, min_count: usize) -> Result<CaptionVocab> {
        let base = Vocab::build(data, min_count);
        if base.words().is_empty() {
            bail!(
                "{}: no word occurs {min_count} times in the training captions; lower --min-count",
                data.name
            );
        }
        let firsts: BTreeSet<u32> = data
            .split(Split::Train)
            .flat_map(|item| &item.captions)
            .filter_map(|c| c.tokens.first())
            .map(|w| base.id(w))
            .filter(|&id| id > UNK)
            .collect();
        let mut words = base.words().to_vec();
        for &id in &firsts {
            words.push(format!("{ALTERNATIVE_MARK}{}", base.word(id)));
        }
        Ok(CaptionVocab::from_words(words))
    }

    /// From the stored word list (alternatives last, marked `##`).
    pub fn from_words(words: Vec<String>) -> CaptionVocab {
        let words = Vocab::from_words(words);
        let first_alternative = (0..words.len() as u32)
            .find(|&id| words.word(id).starts_with(ALTERNATIVE_MARK))
            .unwrap_or(words.len() as u32);
        let alternative_word: Vec<u32> = (first_alternative..words.len() as u32)
            .map(|id| words.id(&words.word(id)[ALTERNATIVE_MARK.len()..]))
            .collect();
        let word_alternative = alternative_word
            .iter()
            .enumerate()
            .map(|(i, &w)| (w, first_alternative + i as u32))
            .collect();
        CaptionVocab::Words(WordVocab {
            words,
            first_alternative,
            alternative_word,
            word_alternative,
        })
    }

    /// A GPT-2 tokenizer's pieces for a model of `ids` ids, the last of
    /// them the padding; the tokenizer must have fewer.
    pub fn from_tokenizer(bpe: BpeVocab, ids: usize) -> Result<CaptionVocab> {
        if bpe.len() >= ids {
            bail!(
                "the tokenizer has {} ids but the model {ids}, its padding included: the \
                 tokenizer is not this model's",
                bpe.len()
            );
        }
        Ok(CaptionVocab::Pieces(Box::new(PieceVocab { bpe, ids })))
    }

    /// A BLIP tokenizer's pieces for a model of `ids` ids: its `[DEC]`
    /// starts a caption, `[SEP]` ends it and `[PAD]` pads.
    pub fn from_wordpiece(
        pieces: WordPieceVocab,
        ids: usize,
        origin: &str,
    ) -> Result<CaptionVocab> {
        if pieces.len() > ids {
            bail!(
                "{origin}: the tokenizer has {} ids but the model {ids}: the tokenizer is not \
                 this model's",
                pieces.len()
            );
        }
        let [start, end, pad] = WORDPIECE_SPECIALS.map(|token| pieces.id(token));
        let (Some(start), Some(end), Some(pad)) = (start, end, pad) else {
            bail!(
                "{origin}: the tokenizer lacks one of {WORDPIECE_SPECIALS:?}, which start, end \
                 and pad BLIP's captions"
            );
        };
        let specials = SpecialIds { start, end, pad };
        Ok(CaptionVocab::WordPieces(Box::new(WordPieces {
            pieces,
            ids,
            specials,
        })))
    }

    /// The model's ids.
    pub fn len(&self) -> usize {
        match self {
            CaptionVocab::Words(v) => v.words.len(),
            CaptionVocab::Pieces(v) => v.ids,
            CaptionVocab::WordPieces(v) => v.ids,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The start, end and padding ids.
    pub fn specials(&self) -> SpecialIds {
        match self {
            CaptionVocab::Words(_) => SpecialIds::WORDS,
            CaptionVocab::Pieces(v) => SpecialIds {
                start: v.bpe.end(),
                end: v.bpe.end(),
                pad: (v.ids - 1) as u32,
            },
            CaptionVocab::WordPieces(v) => v.specials,
        }
    }

    /// Whether words have reserved alternatives (first-token shifting
    /// needs them; BPE pieces have none).
    pub fn has_alternatives(&self) -> bool {
        matches!(self, CaptionVocab::Words(v) if !v.alternative_word.is_empty())
    }

    /// The reserved alternative of a word, if it has one.
    pub fn alternative(&self, id: u32) -> Option<u32> {
        match self {
            CaptionVocab::Words(v) => v.word_alternative.get(&id).copied(),
            CaptionVocab::Pieces(_) | CaptionVocab::WordPieces(_) => None,
        }
    }

    /// A caption's ids, `start tokens end`, at most `max_len` of them, from
    /// its PTB tokens (pieces encode the tokens joined by spaces).
    pub fn encode(&self, tokens: &[String], max_len: usize) -> Result<Vec<u32>> {
        match self {
            CaptionVocab::Words(v) => Ok(v.words.encode(tokens, max_len)),
            CaptionVocab::Pieces(v) => v.bpe.encode(&tokens.join(" "), max_len),
            CaptionVocab::WordPieces(v) => {
                if max_len < 3 {
                    bail!("max_len {max_len} leaves no room for the start, a piece and the end");
                }
                let pieces = v.pieces.encode(&tokens.join(" "))?;
                let keep = pieces.len().min(max_len - 2);
                let s = v.specials;
                Ok(std::iter::once(s.start)
                    .chain(pieces[..keep].iter().copied())
                    .chain(std::iter::once(s.end))
                    .collect())
            }
        }
    }

    /// The ids of `text` without a start or an end: what a prompt feeds
    /// after the start.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            CaptionVocab::Words(v) => {
                Ok(ptb_tokenize(text).iter().map(|w| v.words.id(w)).collect())
            }
            CaptionVocab::Pieces(v) => v.bpe.pieces_of(text),
            CaptionVocab::WordPieces(v) => v.pieces.encode(text),
        }
    }

    /// The text of generated ids (after the start), up to the first end.
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            CaptionVocab::Words(v) => {
                let words: Vec<u32> = ids
                    .iter()
                    .take_while(|&&id| id != EOS)
                    .filter(|&&id| id != BOS)
                    .map(|&id| v.canonical(id))
                    .collect();
                v.words.decode(&words)
            }
            // The tokenizer drops ids it lacks (the padding) and decodes
            // bytes lossily: its decoder has no error left to report.
            CaptionVocab::Pieces(v) => v.bpe.decode(ids).unwrap_or_default(),
            // Special tokens (the start, the padding) decode to nothing.
            CaptionVocab::WordPieces(v) => {
                let end = ids.iter().position(|&id| id == v.specials.end);
                let ids = &ids[..end.unwrap_or(ids.len())];
                v.pieces.decode(ids).unwrap_or_default()
            }
        }
    }

    /// The PTB words of generated ids, as metrics and rewards read them.
    pub fn decode_words(&self, ids: &[u32]) -> Vec<String> {
        match self {
            CaptionVocab::Words(_) => self
                .decode(ids)
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            CaptionVocab::Pieces(_) | CaptionVocab::WordPieces(_) => {
                ptb_tokenize(&self.decode(ids))
            }
        }
    }

    /// What id `id` shows as in per-token views: its word (an
    /// alternative as `##word`), or its piece (a piece that begins a word
    /// with its space).
    pub fn label(&self, id: u32) -> String {
        match self {
            CaptionVocab::Words(v) => v.words.word(id).to_string(),
            CaptionVocab::Pieces(v) if id as usize == v.ids - 1 => "<pad>".into(),
            CaptionVocab::Pieces(v) => v.bpe.pieces(&[id]).remove(0),
            CaptionVocab::WordPieces(v) => v.pieces.piece(id),
        }
    }

    /// The word id `id` spells for a word-level reader (the retriever):
    /// its word (an alternative's word), or its piece without the space
    /// that begins a word. The specials spell `<pad>`, `<bos>`, `<eos>`.
    pub fn spelled(&self, id: u32) -> String {
        let specials = self.specials();
        match self {
            CaptionVocab::Words(v) => v.words.word(v.canonical(id)).to_string(),
            CaptionVocab::Pieces(_) if id == specials.pad => "<pad>".into(),
            CaptionVocab::Pieces(_) if id == specials.end => "<eos>".into(),
            CaptionVocab::Pieces(v) => v.bpe.pieces(&[id]).remove(0).trim_start().to_string(),
            CaptionVocab::WordPieces(_) if id == specials.pad => "<pad>".into(),
            CaptionVocab::WordPieces(_) if id == specials.end => "<eos>".into(),
            CaptionVocab::WordPieces(_) if id == specials.start => "<bos>".into(),
            CaptionVocab::WordPieces(v) => v.pieces.spelled(id),
        }
    }

    /// The word vocabulary, when it is one.
    pub fn word_list(&self) -> Option<&Vocab> {
        match self {
            CaptionVocab::Words(v) => Some(&v.words),
            CaptionVocab::Pieces(_) | CaptionVocab::WordPieces(_) => None,
        }
    }
}

impl WordVocab {
    /// The word an id stands for: itself, or the word of an alternative.
    fn canonical(&self, id: u32) -> u32 {
        if id >= self.first_alternative {
            self.alternative_word[(id - self.first_alternative) as usize]
        } else {
            id
        }
    }
}

/// A word vocabulary keeps its word list (`vocab`); a pretrained one its
/// tokenizer's JSON (`tokenizer`), whose model says which it is.
impl StoredVocab for CaptionVocab {
    fn store(&self, metadata: &mut HashMap<String, String>) -> Result<()> {
        match self {
            CaptionVocab::Words(v) => checkpoint::store_words(v.words.words(), metadata),
            CaptionVocab::Pieces(v) => {
                metadata.insert(TOKENIZER_KEY.into(), v.bpe.json().to_string());
                let end = v.bpe.end_token();
                if end != crate::data::bpe::END {
                    metadata.insert(CAPTION_END_KEY.into(), end);
                }
                Ok(())
            }
            CaptionVocab::WordPieces(v) => {
                metadata.insert(TOKENIZER_KEY.into(), v.pieces.json().to_string());
                Ok(())
            }
        }
    }

    fn read(file: &TensorFile, path: &Path, ids: usize) -> Result<Self> {
        match file.metadata.get(TOKENIZER_KEY) {
            None => checkpoint::read_words(file, path, ids).map(CaptionVocab::from_words),
            Some(json) => {
                let origin = format!("{}: metadata {TOKENIZER_KEY:?}", path.display());
                let tokenizer = crate::data::bpe::parse_tokenizer(json, &origin)?;
                if is_wordpiece(&tokenizer) {
                    let pieces = WordPieceVocab::from_json(json.clone(), &origin)?;
                    return CaptionVocab::from_wordpiece(pieces, ids, &origin);
                }
                let mut bpe = BpeVocab::from_json(json.clone(), &origin)?;
                if let Some(end) = file.metadata.get(CAPTION_END_KEY) {
                    bpe = bpe.ending_at(end)?;
                }
                CaptionVocab::from_tokenizer(bpe, ids)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Caption, Item};

    fn item(split: Split, captions: &[&str]) -> Item {
        Item {
            id: format!("{split:?}"),
            split,
            image: Default::default(),
            captions: captions
                .iter()
                .map(|c| Caption {
                    raw: c.to_string(),
                    tokens: c.split(' ').map(str::to_string).collect(),
                })
                .collect(),
            extensions: Default::default(),
        }
    }

    #[test]
    fn words_that_begin_captions_get_an_alternative_that_decodes_back() {
        let data = Dataset {
            name: "toy".into(),
            items: vec![
                item(
                    Split::Train,
                    &["a red circle", "two red circles", "a circle"],
                ),
                item(Split::Val, &["three circles"]),
            ],
            report: Default::default(),
        };
        let v = CaptionVocab::build(&data, 1).unwrap();
        let words = v.word_list().unwrap().clone();
        // 4 specials, 5 training words, alternatives of "a" and "two" only.
        assert_eq!(v.len(), 4 + 5 + 2);
        let (a, two, red) = (words.id("a"), words.id("two"), words.id("red"));
        let alt_a = v.alternative(a).unwrap();
        assert_eq!(v.label(alt_a), "##a");
        assert!(v.alternative(two).is_some() && v.alternative(red).is_none());
        assert_eq!(v.spelled(alt_a), "a");
        assert_eq!(v.spelled(red), "red");
        assert_eq!(v.decode(&[alt_a, red, EOS, red]), "a red");
        // The stored word list rebuilds the same vocabulary.
        assert_eq!(CaptionVocab::from_words(words.words().to_vec()), v);
    }
}
