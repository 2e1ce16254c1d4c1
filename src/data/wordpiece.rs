//! A BERT WordPiece tokenizer (`tokenizer.json`, as BLIP's folders hold
//! it) run by Hugging Face's `tokenizers` crate: pieces that continue a
//! word begin with `##`. A caption's ids are its start id (BLIP's [DEC]),
//! its pieces, then its end id ([SEP]); the ids come from the model's
//! config, the tokenizer only spells them.

use super::bpe::{parse_tokenizer, pieces_of, read_tokenizer_file};
use anyhow::{Result, anyhow, bail};
use std::path::Path;
use tokenizers::Tokenizer;

/// What a piece that continues a word begins with.
const CONTINUES: &str = "##";

#[derive(Clone)]
pub struct WordPieceVocab {
    tokenizer: Tokenizer,
    /// The tokenizer's JSON as read: what a checkpoint stores.
    json: String,
    /// Where it was read from, for messages.
    origin: String,
}

impl std::fmt::Debug for WordPieceVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WordPieceVocab({}, {} ids)", self.origin, self.len())
    }
}

/// Two vocabularies are the same when their tokenizers' JSON is.
impl PartialEq for WordPieceVocab {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl Eq for WordPieceVocab {}

impl WordPieceVocab {
    /// Reads `dir/tokenizer.json`, which must be a WordPiece model.
    pub fn load(dir: &Path) -> Result<Self> {
        let (json, origin) = read_tokenizer_file(dir, "processor")?;
        WordPieceVocab::from_json(json, &origin)
    }

    /// A tokenizer from its JSON (`origin` names where it came from in
    /// messages: a file, or a checkpoint's metadata).
    pub fn from_json(json: String, origin: &str) -> Result<Self> {
        let tokenizer = parse_tokenizer(&json, origin)?;
        if !is_wordpiece(&tokenizer) {
            bail!("{origin}: not a WordPiece tokenizer (BERT's, as BLIP's folders hold)");
        }
        Ok(WordPieceVocab {
            tokenizer,
            json,
            origin: origin.to_string(),
        })
    }

    /// The tokenizer's JSON, as `tokenizer.json` holds it.
    pub fn json(&self) -> &str {
        &self.json
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
        pieces_of(&self.tokenizer, text, &self.origin)
    }

    /// The text of pieces (special tokens left out, continuations joined
    /// to their words), as the tokenizer decodes them.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| anyhow!("{}: cannot decode {ids:?}: {e}", self.origin))
    }

    /// The id of a token (a special one, such as `[SEP]`), if it has one.
    pub fn id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The piece of `id` as the tokenizer lists it (`##ing` continues a
    /// word), or `<id>` for an id the tokenizer lacks.
    pub fn piece(&self, id: u32) -> String {
        self.tokenizer
            .id_to_token(id)
            .unwrap_or_else(|| format!("<{id}>"))
    }

    /// The piece of `id` without the mark of a continuation.
    pub fn spelled(&self, id: u32) -> String {
        let piece = self.piece(id);
        match piece.strip_prefix(CONTINUES) {
            Some(rest) if !rest.is_empty() => rest.to_string(),
            _ => piece,
        }
    }
}

/// Whether a tokenizer is a WordPiece model (BERT's) rather than another
/// (GPT-2's byte-level BPE).
pub fn is_wordpiece(tokenizer: &Tokenizer) -> bool {
    matches!(
        tokenizer.get_model(),
        tokenizers::ModelWrapper::WordPiece(_)
    )
}
