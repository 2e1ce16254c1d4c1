//! The prefix decoder (ClipCap, Mokady et al., 2021): a mapper turns
//! each image embedding into k prefix vectors; a causal pre-LN
//! transformer reads `[prefix ; <bos> w1 .. wn]` plus learned positions,
//! and the logits of the token positions come from the tied token
//! embedding: logits = h E^T + m, with m the policy mask
//! ([`super::super::inputs::policy_mask`]). captune's own decoder and a
//! Hugging Face GPT-2 read as ClipCap are both this family.
//!
//! The prefix and the token embeddings are placed into the decoder's
//! `[batch, prefix + tokens, width]` input by strided copies (the
//! attention-head layout ops with one "head" per batch item), and the
//! token positions are read back the same way. In ClipCap's own layout
//! (`prefix_predicts_first`) no start is fed: the prefix's last vector
//! takes the start's place, written over it, so the same rows predict
//! the same tokens.
//!
//! The weights live once in [`PrefixDecoder`]; the activations of each
//! batch shape (rows, token positions) it has run live in a
//! [`Workspace`] it keeps, so training, scoring and the inspector's batch
//! of one all use the current weights, and a batch trimmed to its longest
//! caption pays only for the positions it has. Generation runs a
//! [`PrefixStepper`] over a KV cache.

mod mapper;
mod stepper;

use crate::backend::{Backend, HeadLayout, Matmul, TokenIndex};
use crate::captioner::CaptionerConfig;
use crate::captioner::decoder::{Decoder, Stepper};
use crate::captioner::inputs::{TokenInputs, Workspaces, policy_mask};
use crate::model::params::{Init, ParamId, Params};
use crate::model::transformer::{Activations, Transformer};
use anyhow::Result;
use mapper::{Mapper, MapperActivations};
use stepper::PrefixStepper;

pub struct PrefixDecoder<B: Backend> {
    config: CaptionerConfig,
    params: Params<B>,
    mapper: Mapper,
    /// [vocab, width], also the output layer.
    tokens: ParamId,
    positions: ParamId,
    decoder: Transformer,
    output: OutputLayer<B>,
    workspaces: Workspaces<Workspace<B>>,
}

/// The activations of one batch shape: `batch` sequences of `positions`
/// token positions (after the prefix).
struct Workspace<B: Backend> {
    position_ids: TokenIndex<B>,
    prefix_layout: HeadLayout,
    token_layout: HeadLayout,
    /// Where the prefix predicts the first token: each sequence's first
    /// token position (the start's, which the prefix's last vector
    /// holds), and `[batch, width]` zeros, its embedding's gradient.
    start_slot: Option<(HeadLayout, B::Tensor)>,
    decoder: Activations<B>,
    mapper: MapperActivations<B>,
    token_embed: B::Tensor,
    hidden: B::Tensor,
    token_hidden: B::Tensor,
    /// [batch * positions, vocab]: row b * positions + t predicts token t + 1.
    logits: B::Tensor,
    d_hidden: B::Tensor,
    /// `token_hidden`'s gradient, packed like it.
    d_token_hidden: B::Tensor,
    d_token_embed: B::Tensor,
    d_prefix: B::Tensor,
}

/// The output layer: the tied token embedding and the policy mask.
struct OutputLayer<B: Backend> {
    tokens: ParamId,
    /// `[vocab]`: the policy mask.
    policy_mask: B::Tensor,
}

impl<B: Backend> OutputLayer<B> {
    /// logits `[rows, vocab]` = hidden E^T + the policy mask, for teacher
    /// forcing and decoding alike.
    fn forward(
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

impl<B: Backend> Workspace<B> {
    fn new(b: &B, m: &PrefixDecoder<B>, batch: usize, positions: usize) -> Result<Self> {
        let c = &m.config;
        let (w, k, t) = (c.decoder.width, c.prefix_len, positions);
        // The start's place is the prefix's last vector's in ClipCap's layout.
        let shift = usize::from(c.prefix_predicts_first);
        let s = k + t - shift;
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
            position_ids: TokenIndex::new(b, &position_ids, c.seq_len())?,
            prefix_layout: one_run_per_item(k * w, 0),
            token_layout: one_run_per_item(t * w, (k - shift) * w),
            start_slot: c.prefix_predicts_first.then(|| {
                let first = HeadLayout {
                    row_stride: t * w,
                    ..one_run_per_item(w, 0)
                };
                (first, b.zeros(batch * w))
            }),
            decoder: m.decoder.activations(b, batch, s),
            mapper: MapperActivations::new(b, &m.mapper, c, batch, true),
            token_embed: b.zeros(batch * t * w),
            hidden: b.zeros(batch * s * w),
            token_hidden: b.zeros(batch * t * w),
            logits: b.zeros(batch * t * c.vocab_size),
            d_hidden: b.zeros(batch * s * w),
            d_token_hidden: b.zeros(batch * t * w),
            d_token_embed: b.zeros(batch * t * w),
            d_prefix: b.zeros(batch * k * w),
        })
    }
}

impl<B: Backend> PrefixDecoder<B> {
    /// A decoder with fresh weights from `seed`, for a validated `config`.
    pub fn new(b: &B, config: CaptionerConfig, seed: u64) -> Self {
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
        PrefixDecoder {
            output: OutputLayer {
                tokens,
                policy_mask: b.tensor(&policy_mask(c)),
            },
            config,
            mapper,
            tokens,
            positions,
            decoder,
            params: p,
            workspaces: Workspaces::default(),
        }
    }
}

impl<B: Backend> Decoder<B> for PrefixDecoder<B> {
    fn params(&self) -> &Params<B> {
        &self.params
    }

    fn params_mut(&mut self) -> &mut Params<B> {
        &mut self.params
    }

    /// The mapper is the adapter.
    fn is_adapter(&self, i: usize) -> bool {
        is_mapper_param(&self.params.specs[i].name)
    }

    fn logits(&self) -> &B::Tensor {
        &self.workspaces.current().logits
    }

    fn stepper(&self, b: &B, rows: usize, steps: usize) -> Box<dyn Stepper<B> + '_> {
        Box::new(PrefixStepper::new(b, self, rows, steps))
    }

    /// The images are `[batch, embed_dim]` embeddings.
    fn forward(&mut self, b: &B, features: &[f32], inputs: &TokenInputs<B>) -> Result<()> {
        let c = self.config;
        assert_eq!(
            features.len(),
            inputs.batch * c.embed_dim,
            "one image embedding per sequence"
        );
        if !self.workspaces.select(inputs) {
            let ws = Workspace::new(b, self, inputs.batch, inputs.positions)?;
            self.workspaces.add(inputs, ws);
        }
        let (ws, p) = (self.workspaces.current_for(inputs), &self.params);
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
        // The prefix last: in ClipCap's layout its last vector replaces the start.
        b.heads_to_tokens(&ws.token_embed, input, &ws.token_layout, false);
        b.heads_to_tokens(&ws.mapper.prefix, input, &ws.prefix_layout, false);
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

    fn backward(&mut self, b: &B, inputs: &TokenInputs<B>, d_logits: &B::Tensor) {
        let c = self.config;
        let ws = self.workspaces.current_for(inputs);
        let (w, rows) = (c.decoder.width, inputs.rows());
        let p = &mut self.params;
        // One product over every token row, then each sequence's rows put
        // in place: a batch of per-sequence products of some 30 rows each
        // would be too short for the large tiles and could not split k.
        // The prefix rows of d_hidden stay zero from the workspace's
        // making (no loss reads the prefix's outputs).
        b.matmul(
            d_logits,
            p.value(self.tokens),
            &mut ws.d_token_hidden,
            &Matmul::new(rows, w, c.vocab_size),
        );
        b.heads_to_tokens(
            &ws.d_token_hidden,
            &mut ws.d_hidden,
            &ws.token_layout,
            false,
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
        if let Some((first, zeros)) = &ws.start_slot {
            // That position's gradient is the prefix's, not the start's.
            b.heads_to_tokens(zeros, &mut ws.d_token_embed, first, false);
        }
        b.embedding_backward(&ws.d_token_embed, &inputs.ids, p.grad(self.tokens), w);
        b.tokens_to_heads(d_input, &mut ws.d_prefix, &ws.prefix_layout);
        self.mapper.backward(b, p, &mut ws.mapper, &ws.d_prefix);
    }
}
