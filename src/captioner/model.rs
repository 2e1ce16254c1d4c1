//! The captioner network. The mapper (an MLP, as in ClipCap) turns each
//! image embedding into k prefix vectors; the decoder reads
//! `[prefix ; <bos> w1 .. wn]` plus learned positions, and the logits of
//! the token positions come from the tied token embedding:
//! logits = h E^T.
//!
//! The prefix and the token embeddings are placed into the decoder's
//! `[batch, prefix + tokens, width]` input by strided copies (the
//! attention-head layout ops with one "head" per batch item), and the
//! token positions are read back the same way.

use super::CaptionerConfig;
use crate::backend::{Backend, HeadLayout, Matmul};
use crate::data::vocab::PAD;
use crate::index::TokenIndex;
use crate::model::layers::Dense;
use crate::model::params::{Init, ParamId, Params};
use crate::model::transformer::Transformer;
use anyhow::Result;

pub struct Captioner<B: Backend> {
    pub config: CaptionerConfig,
    pub batch: usize,
    pub params: Params<B>,
    mapper_in: Dense,
    mapper_out: Dense,
    /// [vocab, width], also the output layer.
    tokens: ParamId,
    positions: ParamId,
    position_ids: TokenIndex<B>,
    decoder: Transformer<B>,
    prefix_layout: HeadLayout,
    token_layout: HeadLayout,
    features: B::Tensor,
    mapper_hidden: B::Tensor,
    mapper_act: B::Tensor,
    prefix: B::Tensor,
    token_embed: B::Tensor,
    hidden: B::Tensor,
    token_hidden: B::Tensor,
    /// [batch * token_positions, vocab]: row b * T + t predicts token t + 1.
    pub logits: B::Tensor,
    d_token_hidden: B::Tensor,
    d_hidden: B::Tensor,
    d_token_embed: B::Tensor,
    d_prefix: B::Tensor,
    d_mapper_act: B::Tensor,
    d_mapper_hidden: B::Tensor,
}

/// Decoder inputs for one batch: `[batch, token_positions]` ids, each row
/// `<bos> w1 .. wn` then PAD.
pub struct TokenInputs<B: Backend> {
    pub ids: TokenIndex<B>,
}

impl<B: Backend> TokenInputs<B> {
    /// From encoded captions (`<bos> .. <eos>`, as `CaptionVocab::encode`
    /// gives), or from partial captions while decoding (`<bos> ..`).
    pub fn new(b: &B, config: &CaptionerConfig, sequences: &[Vec<u32>]) -> Result<Self> {
        let t = config.token_positions();
        let mut ids = vec![PAD; sequences.len() * t];
        for (i, s) in sequences.iter().enumerate() {
            let n = s.len().min(t);
            ids[i * t..i * t + n].copy_from_slice(&s[..n]);
        }
        Ok(TokenInputs {
            ids: TokenIndex::new(b, &ids, config.vocab_size)?,
        })
    }
}

impl<B: Backend> Captioner<B> {
    pub fn new(b: &B, config: CaptionerConfig, batch: usize, seed: u64) -> Result<Self> {
        config.validate()?;
        let c = &config;
        let (w, k, t, s) = (
            c.decoder.width,
            c.prefix_len,
            c.token_positions(),
            c.seq_len(),
        );
        let mut p = Params::new(seed);
        let mapper_in = Dense::new(
            b,
            &mut p,
            "mapper.fc1",
            batch,
            c.embed_dim,
            c.mapper_hidden,
            (c.embed_dim as f32).powf(-0.5),
        );
        let mapper_out = Dense::new(b, &mut p, "mapper.fc2", batch, c.mapper_hidden, k * w, 0.02);
        let tokens = p.add(
            b,
            "decoder.tokens".into(),
            &[c.vocab_size, w],
            Init::Normal(0.02),
            false,
        );
        let positions = p.add(
            b,
            "decoder.positions".into(),
            &[s, w],
            Init::Normal(0.01),
            false,
        );
        let position_ids: Vec<u32> = (0..batch).flat_map(|_| 0..s as u32).collect();
        let decoder = Transformer::new(b, &mut p, "decoder", c.decoder, batch, s);
        let one_run_per_item = |head_dim, col_offset| HeadLayout {
            batch,
            seq: 1,
            heads: 1,
            head_dim,
            row_stride: s * w,
            col_offset,
        };
        Ok(Captioner {
            config,
            batch,
            mapper_in,
            mapper_out,
            tokens,
            positions,
            position_ids: TokenIndex::new(b, &position_ids, s)?,
            decoder,
            prefix_layout: one_run_per_item(k * w, 0),
            token_layout: one_run_per_item(t * w, k * w),
            features: b.zeros(batch * c.embed_dim),
            mapper_hidden: b.zeros(batch * c.mapper_hidden),
            mapper_act: b.zeros(batch * c.mapper_hidden),
            prefix: b.zeros(batch * k * w),
            token_embed: b.zeros(batch * t * w),
            hidden: b.zeros(batch * s * w),
            token_hidden: b.zeros(batch * t * w),
            logits: b.zeros(batch * t * c.vocab_size),
            d_token_hidden: b.zeros(batch * t * w),
            d_hidden: b.zeros(batch * s * w),
            d_token_embed: b.zeros(batch * t * w),
            d_prefix: b.zeros(batch * k * w),
            d_mapper_act: b.zeros(batch * c.mapper_hidden),
            d_mapper_hidden: b.zeros(batch * c.mapper_hidden),
            params: p,
        })
    }

    /// Rows of `logits`.
    pub fn rows(&self) -> usize {
        self.batch * self.config.token_positions()
    }

    /// logits = the decoder on `[batch, embed_dim]` image embeddings and
    /// the given token inputs.
    pub fn forward(&mut self, b: &B, features: &[f32], inputs: &TokenInputs<B>) {
        let (c, p) = (&self.config, &self.params);
        let w = c.decoder.width;
        b.write(&mut self.features, features);
        self.mapper_in
            .forward(b, p, &self.features, &mut self.mapper_hidden);
        b.gelu(&self.mapper_hidden, &mut self.mapper_act);
        self.mapper_out
            .forward(b, p, &self.mapper_act, &mut self.prefix);
        b.embedding(
            p.value(self.tokens),
            &inputs.ids,
            &mut self.token_embed,
            w,
            false,
        );
        let input = self.decoder.input();
        b.heads_to_tokens(&self.prefix, input, &self.prefix_layout, false);
        b.heads_to_tokens(&self.token_embed, input, &self.token_layout, false);
        b.embedding(p.value(self.positions), &self.position_ids, input, w, true);
        // Padding only follows a caption's real tokens, so the causal mask
        // already keeps it out of every real position's attention.
        self.decoder.forward(b, p, None, &mut self.hidden);
        b.tokens_to_heads(&self.hidden, &mut self.token_hidden, &self.token_layout);
        let rows = self.batch * c.token_positions();
        b.matmul(
            &self.token_hidden,
            p.value(self.tokens),
            &mut self.logits,
            &Matmul::new(rows, c.vocab_size, w).trans_b(),
        );
    }

    /// Parameter gradients (+)= those of a loss whose gradient w.r.t. the
    /// logits of the last `forward` is `d_logits`. Zero them first.
    pub fn backward(&mut self, b: &B, inputs: &TokenInputs<B>, d_logits: &B::Tensor) {
        let c = self.config;
        let (w, rows) = (c.decoder.width, self.rows());
        let p = &mut self.params;
        b.matmul(
            d_logits,
            p.value(self.tokens),
            &mut self.d_token_hidden,
            &Matmul::new(rows, w, c.vocab_size),
        );
        b.matmul(
            d_logits,
            &self.token_hidden,
            p.grad(self.tokens),
            &Matmul::new(c.vocab_size, w, rows).trans_a().accumulate(),
        );
        b.fill(&mut self.d_hidden, 0.0);
        b.heads_to_tokens(
            &self.d_token_hidden,
            &mut self.d_hidden,
            &self.token_layout,
            false,
        );
        let d_input = self.decoder.backward(b, p, &self.d_hidden);
        b.embedding_backward(d_input, &self.position_ids, p.grad(self.positions), w);
        b.tokens_to_heads(d_input, &mut self.d_token_embed, &self.token_layout);
        b.embedding_backward(&self.d_token_embed, &inputs.ids, p.grad(self.tokens), w);
        b.tokens_to_heads(d_input, &mut self.d_prefix, &self.prefix_layout);
        self.mapper_out.backward(
            b,
            p,
            &self.d_prefix,
            &self.mapper_act,
            Some((&mut self.d_mapper_act, false)),
        );
        b.gelu_backward(
            &self.mapper_hidden,
            &self.d_mapper_act,
            &mut self.d_mapper_hidden,
            false,
        );
        self.mapper_in
            .backward(b, p, &self.d_mapper_hidden, &self.features, None);
    }
}
