//! A Hugging Face tokenizer as a captioner's vocabulary: `tokenizer.json`,
//! read and run by Hugging Face's own `tokenizers` crate (no hand-written
//! BPE), as GPT-2 tokenises. GPT-2 has one special token,
//! `<|endoftext|>`, which serves as the start, the end and the padding of
//! a caption: a caption is `<|endoftext|> pieces <|endoftext|>`, and
//! decoding ends at the first `<|endoftext|>` after the start.

use anyhow::{Context, Result, anyhow, bail};
use std::ops::Range;
use std::path::Path;
use tokenizers::Tokenizer;

/// GPT-2's one special token.
pub const END: &str = "<|endoftext|>";

#[derive(Clone)]
pub struct BpeVocab {
    tokenizer: Tokenizer,
    end: u32,
    /// The tokenizer's JSON as read: what a checkpoint stores.
    json: String,
    /// Where it was read from, for messages.
    origin: String,
}

impl std::fmt::Debug for BpeVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BpeVocab({}, {} ids)", self.origin, self.len())
    }
}

/// Two vocabularies are the same when their tokenizers' JSON and their
/// captions' end are.
impl PartialEq for BpeVocab {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json && self.end == other.end
    }
}

impl Eq for BpeVocab {}

/// A `tokenizer.json`'s text as the tokenizers library reads it; `origin`
/// names where it came from in messages.
pub fn parse_tokenizer(json: &str, origin: &str) -> Result<Tokenizer> {
    let not_read =
        |why: String| anyhow!("{origin}: not a tokenizer the tokenizers library reads: {why}");
    // The library panics on some malformed JSON inside a tokenizer rather
    // than returning its error: the syntax is checked first, and a panic
    // on valid JSON is caught and reported the same way.
    serde_json::from_str::<serde_json::Value>(json).map_err(|e| not_read(e.to_string()))?;
    std::panic::catch_unwind(|| json.parse::<Tokenizer>())
        .map_err(|_| not_read("the library failed on it".into()))?
        .map_err(|e| not_read(e.to_string()))
}

/// The ids of `text` without the tokenizer's own special tokens; an error
/// names `origin`.
pub fn pieces_of(tokenizer: &Tokenizer, text: &str, origin: &str) -> Result<Vec<u32>> {
    let encoding = tokenizer
        .encode(text, false)
        .map_err(|e| anyhow!("{origin}: cannot tokenise {text:?}: {e}"))?;
    Ok(encoding.get_ids().to_vec())
}

/// The text of `dir/tokenizer.json` and the file's name for messages;
/// a missing file is an error that says to save it with `saver`
/// (`tokenizer`, `processor`: what the folder's owner calls
/// `save_pretrained` on).
pub fn read_tokenizer_file(dir: &Path, saver: &str) -> Result<(String, String)> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        bail!(
            "{}: no tokenizer.json; save the tokenizer beside the model \
             ({saver}.save_pretrained) so that captune tokenises as it does",
            dir.display()
        );
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok((text, path.display().to_string()))
}

impl BpeVocab {
    /// Reads `dir/tokenizer.json`, which must know [`END`].
    pub fn load(dir: &Path) -> Result<BpeVocab> {
        let (text, origin) = read_tokenizer_file(dir, "tokenizer")?;
        BpeVocab::from_json(text, &origin)
    }

    /// A tokenizer from its JSON (`origin` names where it came from in
    /// messages: a file, or a checkpoint's metadata).
    pub fn from_json(json: String, origin: &str) -> Result<BpeVocab> {
        let tokenizer = parse_tokenizer(&json, origin)?;
        let end = tokenizer.token_to_id(END).with_context(|| {
            format!("{origin}: no {END} token, which GPT-2 starts and ends captions with")
        })?;
        Ok(BpeVocab {
            tokenizer,
            end,
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

    /// The id of [`END`], or of the token given to [`BpeVocab::ending_at`]:
    /// a caption's start and end.
    pub fn end(&self) -> u32 {
        self.end
    }

    /// The same tokenizer with captions started and ended by the one piece
    /// `token` instead of [`END`] (ClipCap's released checkpoints end
    /// captions at ".").
    pub fn ending_at(mut self, token: &str) -> Result<BpeVocab> {
        self.end = self
            .tokenizer
            .token_to_id(token)
            .with_context(|| format!("{}: no piece {token:?} to end captions at", self.origin))?;
        Ok(self)
    }

    /// The piece captions end at.
    pub fn end_token(&self) -> String {
        self.tokenizer.id_to_token(self.end).unwrap_or_default()
    }

    /// `<|endoftext|> pieces <|endoftext|>`, the pieces truncated so that
    /// it fits in `max_len` (at least 3).
    pub fn encode(&self, caption: &str, max_len: usize) -> Result<Vec<u32>> {
        if max_len < 3 {
            bail!("max_len {max_len} leaves no room for the start, a piece and the end");
        }
        let pieces = self.pieces_of(caption)?;
        let keep = pieces.len().min(max_len - 2);
        Ok(std::iter::once(self.end)
            .chain(pieces[..keep].iter().copied())
            .chain(std::iter::once(self.end))
            .collect())
    }

    /// The pieces of `text`, without start or end.
    pub fn pieces_of(&self, text: &str) -> Result<Vec<u32>> {
        pieces_of(&self.tokenizer, text, &self.origin)
    }

    /// The text of a caption's ids after its start, up to the end. (The
    /// start is the end's id too: a caption whose first id is the end is
    /// empty, whatever follows.)
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let end = ids
            .iter()
            .position(|&id| id == self.end)
            .unwrap_or(ids.len());
        self.tokenizer
            .decode(&ids[..end], false)
            .map_err(|e| anyhow!("{}: cannot decode {:?}: {e}", self.origin, &ids[..end]))
    }

    /// Each id's piece as the text it stands for (a piece that begins a
    /// word begins with its space), or as its byte-level token when it is
    /// part of a character; [`END`] as itself.
    pub fn pieces(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&id| {
                if id == self.end {
                    return END.to_string();
                }
                // A piece holding part of a character's bytes decodes to
                // U+FFFD alone: it shows as its byte-level token instead.
                match self.tokenizer.decode(&[id], false) {
                    Ok(text) if !text.contains('\u{FFFD}') => text,
                    _ => (self.tokenizer.id_to_token(id)).unwrap_or_else(|| format!("<{id}>")),
                }
            })
            .collect()
    }

    /// The words the pieces of `ids` make, each with the range of its
    /// pieces: a word starts at a piece that begins with a space, and at
    /// [`END`], which is a word of its own.
    pub fn words(&self, ids: &[u32]) -> Vec<(String, Range<usize>)> {
        let mut words: Vec<(String, Range<usize>)> = Vec::new();
        for (k, (id, piece)) in ids.iter().zip(self.pieces(ids)).enumerate() {
            let continues = *id != self.end
                && !piece.starts_with(' ')
                && words.last().is_some_and(|(w, _)| w != END);
            match words.last_mut() {
                Some((word, range)) if continues => {
                    word.push_str(&piece);
                    range.end = k + 1;
                }
                _ => words.push((piece.trim_start().to_string(), k..k + 1)),
            }
        }
        words
    }
}
