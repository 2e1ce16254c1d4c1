//! The captioner network. The mapper (an MLP, as in ClipCap) turns each
//! image embedding into k prefix vectors; the decoder reads
//! `[prefix ; <bos> w1 .. wn]` plus learned positions, and the logits of
//! the token positions come from the tied token embedding:
//! logits = h E^T + m, where the policy mask m is [`MASKED_LOGIT`] at
//! the padding and start ids (`SpecialIds::masked`: `<pad>` and `<bos>`)
//! and 0 elsewhere: decoding never chooses them, so the distribution
//! every loss, sample and explanation reads is the one captions are
//! generated from (docs/training.md#one-policy).
//!
//! The prefix and the token embeddings are placed into the decoder's
//! `[batch, prefix + tokens, width]` input by strided copies (the
//! attention-head layout ops with one "head" per batch item), and the
//! token positions are read back the same way.
//!
//! The weights live once in [`Captioner`]; the activations of each batch
//! shape (rows, token positions) it has run live in a [`Workspace`] it
//! keeps, so training, scoring and the inspector's batch of one all use
//! the current weights, and a batch trimmed to its longest caption pays
//! only for the positions it has. Generation uses its own cache
//! (`decode`).

use super::CaptionerConfig;
use super::mapper::{Mapper, MapperActivations};
use crate::backend::{Backend, HeadLayout, Matmul, Operand, TokenIndex};
use crate::model::params::{Init, ParamId, Params};
use crate::model::transformer::{Activations, Transformer};
use anyhow::Result;

/// Token positions of trimmed batches are rounded up to a multiple of
/// this, so that a run keeps a few workspaces, not one per length: every
/// workspace holds its own `[rows, vocab]` logits, so all of them together
/// take at most about 2.7 times the full width's (widths 8, 16, 24 and 31
/// of 31), and a finer step buys little (about 5% of a shapes step).
const TRIM_STEP: usize = 8;

/// The logit of an id outside the policy: exp of it underflows to exactly
/// 0 in every softmax, while staying finite, so that 0 * log p is 0 in
/// an entropy and a weighted-out `<pad>` target adds 0 to a loss.
pub const MASKED_LOGIT: f32 = -1e30;

pub struct Captioner<B: Backend> {
    pub config: CaptionerConfig,
    pub params: Params<B>,
    mapper: Mapper,
    /// [vocab, width], also the output layer.
    pub(super) tokens: ParamId,
    pub(super) positions: ParamId,
    pub(super) decoder: Transformer,
    pub(super) output: OutputLayer<B>,
    workspaces: Vec<Workspace<B>>,
    /// The workspace of the last `forward`.
    current: usize,
}

/// The activations of one batch shape: `batch` sequences of `positions`
/// token positions (after the prefix).
struct Workspace<B: Backend> {
    batch: usize,
    positions: usize,
    position_ids: TokenIndex<B>,
    prefix_layout: HeadLayout,
    token_layout: HeadLayout,
    decoder: Activations<B>,
    mapper: MapperActivations<B>,
    token_embed: B::Tensor,
    hidden: B::Tensor,
    token_hidden: B::Tensor,
    /// [batch * positions, vocab]: row b * positions + t predicts token t + 1.
    logits: B::Tensor,
    d_hidden: B::Tensor,
    d_token_embed: B::Tensor,
    d_prefix: B::Tensor,
}

/// The output layer: the tied token embedding and the policy mask.
pub(super) struct OutputLayer<B: Backend> {
    tokens: ParamId,
    /// `[vocab]`: [`MASKED_LOGIT`] at the masked ids, else 0.
    policy_mask: B::Tensor,
}

impl<B: Backend> OutputLayer<B> {
    /// logits `[rows, vocab]` = hidden E^T + the policy mask, for teacher
    /// forcing and decoding alike.
    pub(super) fn forward(
        &self,
        b: &B,
        p: &Params<B>,
        c: &CaptionerConfig,
        hidden: &B::Tensor,
        logits: &mut B::Tensor,
        rows: usize,
    ) {
        b.matmul_bias(
            hidden,
            p.value(self.tokens),
            &self.policy_mask,
            logits,
            &Matmul::new(rows, c.vocab_size, c.decoder.width).trans_b(),
        );
    }
}

/// Whether the parameter named `name` is the mapper's (`mapper.*`).
pub fn is_mapper_param(name: &str) -> bool {
    name.starts_with("mapper.")
}

/// Decoder inputs for one batch: `[batch, positions]` ids, each row
/// `<bos> w1 .. wn` then padding.
pub struct TokenInputs<B: Backend> {
    pub ids: TokenIndex<B>,
    pub batch: usize,
    /// Token positions per row: the model's maximum, or fewer when trimmed.
    pub positions: usize,
}

impl<B: Backend> TokenInputs<B> {
    /// From encoded captions (`<bos> .. <eos>`, as `CaptionVocab::encode`
    /// gives), or from partial captions, over all the model's token positions.
    pub fn new(b: &B, config: &CaptionerConfig, sequences: &[Vec<u32>]) -> Result<Self> {
        Self::with_positions(b, config, sequences, config.token_positions())
    }

    /// The same, over only as many positions as the longest sequence
    /// needs (rounded up to a multiple of 8): the positions after every
    /// caption's end would be padding, and the causal mask keeps padding
    /// out of every real position, so the loss is the same.
    pub fn trimmed(b: &B, config: &CaptionerConfig, sequences: &[Vec<u32>]) -> Result<Self> {
        let longest = sequences.iter().map(Vec::len).max().unwrap_or(1);
        // A caption of n ids (<bos> .. <eos>) feeds n - 1 positions.
        let needed = longest.saturating_sub(1).max(1);
        let positions = needed
            .next_multiple_of(TRIM_STEP)
            .min(config.token_positions());
        Self::with_positions(b, config, sequences, positions)
    }

    fn with_positions(
        b: &B,
        config: &CaptionerConfig,
        sequences: &[Vec<u32>],
        positions: usize,
    ) -> Result<Self> {
        let t = positions;
        let mut ids = vec![config.specials.pad; sequences.len() * t];
        for (i, s) in sequences.iter().enumerate() {
            let n = s.len().min(t);
            ids[i * t..i * t + n].copy_from_slice(&s[..n]);
        }
        Ok(TokenInputs {
            ids: TokenIndex::new(b, &ids, config.vocab_size)?,
            batch: sequences.len(),
            positions,
        })
    }

    /// Rows of the logits: one per token position of every sequence.
    pub fn rows(&self) -> usize {
        self.batch * self.positions
    }
}

/// Teacher-forcing targets `[batch, steps]`: each sequence's ids after
/// `<bos>`, then `pad` (the config's padding id: no target).
pub fn teacher_targets(sequences: &[Vec<u32>], steps: usize, pad: u32) -> Vec<u32> {
    let mut t = vec![pad; sequences.len() * steps];
    for (i, s) in sequences.iter().enumerate() {
        let n = (s.len() - 1).min(steps);
        t[i * steps..i * steps + n].copy_from_slice(&s[1..1 + n]);
    }
    t
}

impl<B: Backend> Workspace<B> {
    fn new(b: &B, m: &Captioner<B>, batch: usize, positions: usize) -> Result<Self> {
        let c = &m.config;
        let (w, k, t) = (c.decoder.width, c.prefix_len, positions);
        let s = k + t;
        let position_ids: Vec<u32> = (0..batch).flat_map(|_| 0..s as u32).collect();
        let one_run_per_item = |head_dim, col_offset| HeadLayout {
            batch,
            seq: 1,
            heads: 1,
            head_dim,
            row_stride: s * w,
            col_offset,
        };
        Ok(Workspace {
            batch,
            positions,
            position_ids: TokenIndex::new(b, &position_ids, c.seq_len())?,
            prefix_layout: one_run_per_item(k * w, 0),
            token_layout: one_run_per_item(t * w, k * w),
            decoder: m.decoder.activations(b, batch, s),
            mapper: MapperActivations::new(b, &m.mapper, c, batch, true),
            token_embed: b.zeros(batch * t * w),
            hidden: b.zeros(batch * s * w),
            token_hidden: b.zeros(batch * t * w),
            logits: b.zeros(batch * t * c.vocab_size),
            d_hidden: b.zeros(batch * s * w),
            d_token_embed: b.zeros(batch * t * w),
            d_prefix: b.zeros(batch * k * w),
        })
    }
}

impl<B: Backend> Captioner<B> {
    /// A model with fresh weights from `seed`.
    pub fn new(b: &B, config: CaptionerConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let c = &config;
        let (w, s) = (c.decoder.width, c.seq_len());
        let mut p = Params::new(seed);
        let mapper = Mapper::new(&mut p, c);
        let tokens = p.add(
            "decoder.tokens".into(),
            &[c.vocab_size, w],
            Init::Normal(0.02),
            false,
        );
        let positions = p.add(
            "decoder.positions".into(),
            &[s, w],
            Init::Normal(0.01),
            false,
        );
        let decoder = Transformer::new(&mut p, "decoder", c.decoder);
        p.finish(b);
        let mut mask = vec![0.0; c.vocab_size];
        for id in c.specials.masked() {
            mask[id as usize] = MASKED_LOGIT;
        }
        Ok(Captioner {
            output: OutputLayer {
                tokens,
                policy_mask: b.tensor(&mask),
            },
            config,
            mapper,
            tokens,
            positions,
            decoder,
            params: p,
            workspaces: Vec::new(),
            current: 0,
        })
    }

    /// The logits of the last `forward`, `[inputs.rows(), vocab]`: row
    /// b * positions + t predicts token t + 1 of sequence b.
    /// Whether parameter `i` (in `params` order) belongs to the mapper.
    pub fn is_mapper(&self, i: usize) -> bool {
        is_mapper_param(&self.params.specs[i].name)
    }

    pub fn logits(&self) -> &B::Tensor {
        &self.workspaces[self.current].logits
    }

    pub(super) fn mapper(&self) -> &Mapper {
        &self.mapper
    }

    /// The workspace for `inputs`' shape, made on first use.
    fn select(&mut self, b: &B, inputs: &TokenInputs<B>) -> Result<usize> {
        let found = self
            .workspaces
            .iter()
            .position(|w| (w.batch, w.positions) == (inputs.batch, inputs.positions));
        self.current = match found {
            Some(i) => i,
            None => {
                let ws = Workspace::new(b, self, inputs.batch, inputs.positions)?;
                self.workspaces.push(ws);
                self.workspaces.len() - 1
            }
        };
        Ok(self.current)
    }

    /// logits = the decoder on `[batch, embed_dim]` image embeddings and
    /// the given token inputs (one row per image).
    pub fn forward(&mut self, b: &B, features: &[f32], inputs: &TokenInputs<B>) -> Result<()> {
        let c = self.config;
        assert_eq!(
            features.len(),
            inputs.batch * c.embed_dim,
            "one image embedding per sequence"
        );
        let i = self.select(b, inputs)?;
        let (ws, p) = (&mut self.workspaces[i], &self.params);
        let w = c.decoder.width;
        self.mapper.forward(b, p, &mut ws.mapper, features);
        b.embedding(
            p.value(self.tokens),
            &inputs.ids.ids,
            &mut ws.token_embed,
            w,
            false,
        );
        let input = ws.decoder.input();
        b.heads_to_tokens(&ws.mapper.prefix, input, &ws.prefix_layout, false);
        b.heads_to_tokens(&ws.token_embed, input, &ws.token_layout, false);
        b.embedding(
            p.value(self.positions),
            &ws.position_ids.ids,
            input,
            w,
            true,
        );
        // Padding only follows a caption's real tokens, so the causal mask
        // already keeps it out of every real position's attention.
        self.decoder
            .forward(b, p, &mut ws.decoder, None, &mut ws.hidden);
        b.tokens_to_heads(&ws.hidden, &mut ws.token_hidden, &ws.token_layout);
        self.output
            .forward(b, p, &c, &ws.token_hidden, &mut ws.logits, inputs.rows());
        Ok(())
    }

    /// Parameter gradients (+)= those of a loss whose gradient w.r.t. the
    /// logits of the last `forward` (on these `inputs`) is `d_logits`.
    /// Zero them first.
    pub fn backward(&mut self, b: &B, inputs: &TokenInputs<B>, d_logits: &B::Tensor) {
        let c = self.config;
        let ws = &mut self.workspaces[self.current];
        assert_eq!(
            (ws.batch, ws.positions),
            (inputs.batch, inputs.positions),
            "backward follows the forward of the same inputs"
        );
        let (w, rows) = (c.decoder.width, inputs.rows());
        let p = &mut self.params;
        // Each sequence's token rows of d_hidden, written in place; its
        // prefix rows stay zero from the workspace's making (no loss
        // reads the prefix's outputs).
        let token_rows = Operand {
            offset: c.prefix_len * w,
            ..Operand::packed((c.prefix_len + inputs.positions) * w)
        };
        b.matmul(
            d_logits,
            p.value(self.tokens),
            &mut ws.d_hidden,
            &Matmul::batched(inputs.batch, inputs.positions, w, c.vocab_size)
                .shared_b()
                .with_c(token_rows),
        );
        b.matmul(
            d_logits,
            &ws.token_hidden,
            p.grad(self.tokens),
            &Matmul::new(c.vocab_size, w, rows).trans_a().accumulate(),
        );
        let d_input = self
            .decoder
            .backward(b, p, &mut ws.decoder, None, &ws.d_hidden);
        b.embedding_backward(d_input, &ws.position_ids, p.grad(self.positions), w);
        b.tokens_to_heads(d_input, &mut ws.d_token_embed, &ws.token_layout);
        b.embedding_backward(&ws.d_token_embed, &inputs.ids, p.grad(self.tokens), w);
        b.tokens_to_heads(d_input, &mut ws.d_prefix, &ws.prefix_layout);
        self.mapper.backward(b, p, &mut ws.mapper, &ws.d_prefix);
    }
}
