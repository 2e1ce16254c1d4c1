//! Text as CLIP's tokenizer encodes it: the folder's `tokenizer.json`,
//! run by Hugging Face's `tokenizers` crate, the pieces between
//! `<|startoftext|>` and `<|endoftext|>`, cut as transformers cuts with
//! truncation to the text tower's positions (the pieces shortened, the two
//! specials kept). The text tower reads its state at the end token.

use super::bpe::{parse_tokenizer, read_tokenizer_file};
use anyhow::{Context, Result, anyhow, bail};
use std::path::Path;
use tokenizers::Tokenizer;

pub const START: &str = "<|startoftext|>";
pub const END: &str = "<|endoftext|>";

pub struct ClipTokenizer {
    tokenizer: Tokenizer,
    start: u32,
    end: u32,
    /// The text tower's positions: the longest encoding.
    max_len: usize,
    origin: String,
}

impl ClipTokenizer {
    /// Reads `dir/tokenizer.json`, which must know both specials, for a
    /// text tower of `max_len` positions.
    pub fn load(dir: &Path, max_len: usize) -> Result<ClipTokenizer> {
        let (text, origin) = read_tokenizer_file(dir, "tokenizer")?;
        let mut tokenizer = parse_tokenizer(&text, &origin)?;
        // Pieces are read word by word: a padding or truncation the file
        // sets would pad or cut every word (captune cuts captions itself).
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| anyhow!("{origin}: {e}"))?;
        let special = |token: &str| {
            tokenizer
                .token_to_id(token)
                .with_context(|| format!("{origin}: no {token} token, which CLIP's captions need"))
        };
        let (start, end) = (special(START)?, special(END)?);
        if max_len < 2 {
            bail!("{origin}: a text tower of {max_len} positions holds no caption");
        }
        Ok(ClipTokenizer {
            tokenizer,
            start,
            end,
            max_len,
            origin,
        })
    }

    /// `<|startoftext|>`, the pieces of `text` (at most `max_len - 2`),
    /// `<|endoftext|>`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let pieces = self.pieces(text)?;
        let kept = pieces.len().min(self.max_len - 2);
        let mut ids = Vec::with_capacity(kept + 2);
        ids.push(self.start);
        ids.extend_from_slice(&pieces[..kept]);
        ids.push(self.end);
        Ok(ids)
    }

    /// The pieces of `text`, uncut and without the two specials. CLIP's
    /// tokenizer splits text into words before it splits words into
    /// pieces, so a caption's pieces are its words' pieces one after
    /// another.
    pub fn pieces(&self, text: &str) -> Result<Vec<u32>> {
        super::bpe::pieces_of(&self.tokenizer, text, &self.origin)
    }

    /// `<|startoftext|>`'s id.
    pub fn start(&self) -> u32 {
        self.start
    }

    /// `<|endoftext|>`'s id, where the text tower reads its state.
    pub fn end(&self) -> u32 {
        self.end
    }
}
