//! A Hugging Face GPT-2 as a language model that scores text: the
//! log-likelihood of each text's tokens, for the fluency of captions as
//! their perplexity ([`crate::metrics::fluency`]).
//!
//! A text is read as GPT-2 was trained to read a document:
//! `<|endoftext|>` (which separated its training documents), then the
//! text's pieces as the folder's tokenizer makes them. Every piece is
//! scored, the first one given `<|endoftext|>` alone; no end is appended
//! or scored, as transformers' perplexity guide scores text.

use super::gpt2::{self, Gpt2Config};
use super::params::{Init, ParamId, Params};
use super::transformer::Transformer;
use crate::backend::{Backend, Matmul, TokenIndex, VocabSubsets};
use crate::data::bpe::BpeVocab;
use crate::metrics::fluency::{Perplexity, TextLikelihood, perplexity};
use anyhow::Result;
use std::path::Path;

/// Texts scored in one forward pass.
const BATCH: usize = 16;

pub struct Gpt2Lm<B: Backend> {
    config: Gpt2Config,
    tokenizer: BpeVocab,
    params: Params<B>,
    /// `[vocab, width]`, also the output layer (tied).
    tokens: ParamId,
    positions: ParamId,
    transformer: Transformer,
}

impl<B: Backend> Gpt2Lm<B> {
    /// The GPT-2 of a Hugging Face folder (config.json, model.safetensors,
    /// tokenizer.json), every tensor checked against its config.
    pub fn load(b: &B, dir: &Path) -> Result<Self> {
        let tokenizer = BpeVocab::load(dir)?;
        let mut gpt2 = gpt2::read(dir, "lm")?;
        let c = gpt2.config.clone();
        let mut params = Params::new(0);
        let tokens = params.add(
            "lm.tokens".into(),
            &[c.vocab_size, c.n_embd],
            Init::Const(0.0),
            false,
        );
        let positions = params.add(
            "lm.positions".into(),
            &[c.n_positions, c.n_embd],
            Init::Const(0.0),
            false,
        );
        let transformer = Transformer::new(&mut params, "lm", c.transformer());
        params.finish(b);
        params.load(b, dir, &mut gpt2.weights)?;
        Ok(Gpt2Lm {
            config: c,
            tokenizer,
            params,
            tokens,
            positions,
            transformer,
        })
    }

    /// Each text's likelihood, in order. A text longer than GPT-2's
    /// positions is scored on its first pieces that fit; an empty text
    /// has no pieces and a likelihood of 0 over 0 tokens.
    pub fn score(&self, b: &B, texts: &[String]) -> Result<Vec<TextLikelihood>> {
        let end = self.tokenizer.end();
        let sequences = texts
            .iter()
            .map(|t| {
                let mut ids = vec![end];
                ids.extend(self.tokenizer.pieces_of(t)?);
                ids.truncate(self.config.n_positions);
                Ok(ids)
            })
            .collect::<Result<Vec<_>>>()?;
        // Texts of similar lengths share a batch, so little is padding.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| sequences[i].len());
        let mut out = vec![
            TextLikelihood {
                nll: 0.0,
                tokens: 0
            };
            texts.len()
        ];
        for chunk in order.chunks(BATCH) {
            let batch: Vec<&[u32]> = chunk.iter().map(|&i| sequences[i].as_slice()).collect();
            for (&i, logp) in chunk.iter().zip(self.piece_logps(b, &batch)?) {
                out[i] = TextLikelihood {
                    nll: -logp.iter().map(|&x| f64::from(x)).sum::<f64>(),
                    tokens: logp.len(),
                };
            }
        }
        Ok(out)
    }

    /// The perplexity of `texts`; None when none has a piece.
    pub fn perplexity(&self, b: &B, texts: &[String]) -> Result<Option<Perplexity>> {
        Ok(perplexity(&self.score(b, texts)?))
    }

    /// For each sequence, the log-probability of each id after the first
    /// given the ids before it.
    fn piece_logps(&self, b: &B, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let (w, vocab) = (self.config.n_embd, self.config.vocab_size);
        let len = batch.iter().map(|s| s.len()).max().unwrap_or(0);
        if len < 2 {
            return Ok(vec![Vec::new(); batch.len()]);
        }
        let rows = batch.len() * len;
        // Padding (the end id) only follows a sequence's own ids, so the
        // causal mask keeps it out of what they attend to.
        let mut ids = vec![self.tokenizer.end(); rows];
        let mut targets = ids.clone();
        for (r, s) in batch.iter().enumerate() {
            ids[r * len..r * len + s.len()].copy_from_slice(s);
            targets[r * len..r * len + s.len() - 1].copy_from_slice(&s[1..]);
        }
        let positions: Vec<u32> = (0..batch.len()).flat_map(|_| 0..len as u32).collect();
        let p = &self.params;
        let mut acts = self.transformer.forward_activations(b, batch.len(), len);
        let input = acts.input();
        b.embedding(
            p.value(self.tokens),
            &TokenIndex::new(b, &ids, vocab)?.ids,
            input,
            w,
            false,
        );
        b.embedding(
            p.value(self.positions),
            &TokenIndex::new(b, &positions, self.config.n_positions)?.ids,
            input,
            w,
            true,
        );
        let mut hidden = b.zeros(rows * w);
        self.transformer.forward(b, p, &mut acts, None, &mut hidden);
        let mut logits = b.zeros(rows * vocab);
        b.matmul(
            &hidden,
            p.value(self.tokens),
            &mut logits,
            &Matmul::new(rows, vocab, w).trans_b(),
        );
        let (mut logp, mut lse) = (b.zeros(rows), b.zeros(rows));
        b.log_softmax_gather(
            &logits,
            &b.ids(&targets),
            &VocabSubsets::full(b, rows),
            vocab,
            &mut logp,
            &mut lse,
        );
        let logp = b.to_vec(&logp);
        Ok(batch
            .iter()
            .enumerate()
            .map(|(r, s)| logp[r * len..r * len + s.len() - 1].to_vec())
            .collect())
    }
}
