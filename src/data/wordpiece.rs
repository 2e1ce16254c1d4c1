//! A BERT WordPiece tokenizer (`tokenizer.json`, as BLIP's folders hold
//! it) run by Hugging Face's `tokenizers` crate: pieces that continue a
//! word begin with `##`. A caption's ids are its start id (BLIP's [DEC]),
//! its pieces, then its end id ([SEP]); the ids come from the model's
//! config, the tokenizer only spells them.

use super::bpe::{parse_tokenizer, read_tokenizer_file};
use anyhow::{Result, anyhow, bail};
use std::path::Path;
use tokenizers::Tokenizer;

#[derive(Clone)]
pub struct WordPieceVocab {
    tokenizer: Tokenizer,
    /// Where it was read from, for messages.
    origin: String,
}

impl std::fmt::Debug for WordPieceVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WordPieceVocab({}, {} ids)", self.origin, self.len())
    }
}

impl WordPieceVocab {
    /// Reads `dir/tokenizer.json`, which must be a WordPiece model.
    pub fn load(dir: &Path) -> Result<Self> {
        let (json, origin) = read_tokenizer_file(dir, "processor")?;
        let tokenizer = parse_tokenizer(&json, &origin)?;
        if !matches!(
            tokenizer.get_model(),
            tokenizers::ModelWrapper::WordPiece(_)
        ) {
            bail!("{origin}: not a WordPiece tokenizer (BERT's, as BLIP's folders hold)");
        }
        Ok(WordPieceVocab { tokenizer, origin })
    }

    /// Ids, special tokens included.
    pub fn len(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces of `text`, without the tokenizer's own special tokens
    /// ([CLS], [SEP]).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        super::bpe::pieces_of(&self.tokenizer, text, &self.origin)
    }

    /// The text of pieces (special tokens left out, continuations joined
    /// to their words), as the tokenizer decodes them.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| anyhow!("{}: cannot decode {ids:?}: {e}", self.origin))
    }
}
