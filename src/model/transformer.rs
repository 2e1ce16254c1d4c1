//! The one transformer: a stack of pre-LN blocks and a final layer norm,
//! used by the retriever's image and text towers and by the caption
//! decoder. [`Transformer`] is the weights (parameter ids); the
//! activations of one batch shape live in an [`Activations`], so one set
//! of weights serves any number of batch shapes. Forward is the list of
//! layer calls; backward is the same list reversed, with every activation
//! it needs kept in a named buffer. Decoding one position at a time over
//! cached keys and values is in [`super::kv_cache`].

use super::layers::{Dense, Norm, NormStats};
use super::params::Params;
use crate::backend::Backend;
use crate::ops::attention::{Attention, AttentionShape};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformerConfig {
    pub width: usize,
    pub layers: usize,
    pub heads: usize,
    /// Each position attends only to itself and earlier ones.
    pub causal: bool,
}

impl TransformerConfig {
    fn init_std(&self) -> f32 {
        0.02
    }

    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// Parameters of the blocks and the final layer norm: per block two
    /// layer norms (4d), qkv (3d^2 + 3d), the projection (d^2 + d) and
    /// the MLP (8d^2 + 5d). Checked against a built model in the tests;
    /// checkpoint loading compares it with a file before allocating.
    pub fn parameter_count(&self) -> u128 {
        let d = self.width as u128;
        self.layers as u128 * (12 * d * d + 13 * d) + 2 * d
    }
}

/// x + attn(ln1(x)), then + mlp(ln2(.)): the weights.
pub(super) struct Block {
    pub(super) ln1: Norm,
    pub(super) qkv: Dense,
    pub(super) proj: Dense,
    pub(super) ln2: Norm,
    pub(super) fc1: Dense,
    pub(super) fc2: Dense,
}

/// One block's activations for a batch shape, `[rows, width]` unless
/// named otherwise.
pub(super) struct BlockActivations<B: Backend> {
    pub(super) ln1: NormStats<B>,
    attn: Attention<B>,
    ln2: NormStats<B>,
    pub(super) ln1_out: B::Tensor,
    pub(super) qkv_out: B::Tensor, // [rows, 3 width]
    pub(super) attn_out: B::Tensor,
    branch_out: B::Tensor,
    pub(super) mid: B::Tensor,
    ln2_out: B::Tensor,
    fc1_out: B::Tensor, // [rows, 4 width]
    gelu_out: B::Tensor,
    // gradients
    d_ln: B::Tensor,
    d_qkv: B::Tensor,
    d_attn: B::Tensor,
    d_fc1: B::Tensor,
}

impl<B: Backend> BlockActivations<B> {
    /// Buffers for `[batch, seq]`; with `backward` false (incremental
    /// decoding, which runs no backward and no full attention) the
    /// gradient buffers are empty.
    pub(super) fn new(
        b: &B,
        c: &TransformerConfig,
        batch: usize,
        seq: usize,
        backward: bool,
    ) -> Self {
        let (rows, w) = (batch * seq, c.width);
        let grad = |len: usize| b.zeros(if backward { len } else { 0 });
        let shape = AttentionShape {
            batch,
            seq,
            heads: c.heads,
            head_dim: c.head_dim(),
            causal: c.causal,
        };
        BlockActivations {
            ln1: NormStats::new(b, rows),
            attn: Attention::new(b, shape, backward),
            ln2: NormStats::new(b, rows),
            ln1_out: b.zeros(rows * w),
            qkv_out: b.zeros(rows * 3 * w),
            attn_out: b.zeros(rows * w),
            branch_out: b.zeros(rows * w),
            mid: b.zeros(rows * w),
            ln2_out: b.zeros(rows * w),
            fc1_out: b.zeros(rows * 4 * w),
            gelu_out: b.zeros(rows * 4 * w),
            d_ln: grad(rows * w),
            d_qkv: grad(rows * 3 * w),
            d_attn: grad(rows * w),
            d_fc1: grad(rows * 4 * w),
        }
    }
}

impl Block {
    fn new<B: Backend>(params: &mut Params<B>, name: &str, c: &TransformerConfig) -> Self {
        let w = c.width;
        let std = c.init_std();
        // Residual projections scaled down with depth, as GPT-2 does.
        let residual_std = std / (2.0 * c.layers as f32).sqrt();
        Block {
            ln1: Norm::new(params, &format!("{name}.ln1"), w),
            qkv: Dense::new(params, &format!("{name}.attn.qkv"), w, 3 * w, std),
            proj: Dense::new(params, &format!("{name}.attn.proj"), w, w, residual_std),
            ln2: Norm::new(params, &format!("{name}.ln2"), w),
            fc1: Dense::new(params, &format!("{name}.mlp.fc1"), w, 4 * w, std),
            fc2: Dense::new(params, &format!("{name}.mlp.fc2"), 4 * w, w, residual_std),
        }
    }

    fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        x: &B::Tensor,
        key_mask: Option<&B::Ids>,
        out: &mut B::Tensor,
    ) {
        self.ln1.forward(b, p, x, &mut a.ln1_out, &mut a.ln1);
        self.qkv.forward(b, p, &a.ln1_out, &mut a.qkv_out);
        a.attn.forward(b, &a.qkv_out, key_mask, &mut a.attn_out);
        self.proj.forward(b, p, &a.attn_out, &mut a.branch_out);
        b.add(1.0, x, 1.0, &a.branch_out, &mut a.mid);
        self.mlp_forward(b, p, a, out);
    }

    /// out = mid + mlp(ln2(mid)).
    pub(super) fn mlp_forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        out: &mut B::Tensor,
    ) {
        self.ln2.forward(b, p, &a.mid, &mut a.ln2_out, &mut a.ln2);
        self.fc1
            .forward_gelu(b, p, &a.ln2_out, &mut a.fc1_out, &mut a.gelu_out);
        self.fc2.forward(b, p, &a.gelu_out, &mut a.branch_out);
        b.add(1.0, &a.mid, 1.0, &a.branch_out, out);
    }

    /// Given the gradient w.r.t. the block's output in `d`, leaves there
    /// the gradient w.r.t. its input x. The residual connections pass the
    /// gradient through unchanged, so each branch's layer norm adds its
    /// share in place.
    fn backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        a: &mut BlockActivations<B>,
        x: &B::Tensor,
        d: &mut B::Tensor,
    ) {
        // MLP branch: d becomes the gradient w.r.t. mid.
        self.fc2
            .backward_through_gelu(b, p, d, &a.gelu_out, &a.fc1_out, &mut a.d_fc1);
        self.fc1
            .backward(b, p, &a.d_fc1, &a.ln2_out, Some((&mut a.d_ln, false)));
        self.ln2.backward(b, p, &a.d_ln, &a.mid, &a.ln2, d, true);
        // Attention branch: d becomes the gradient w.r.t. x.
        self.proj
            .backward(b, p, d, &a.attn_out, Some((&mut a.d_attn, false)));
        a.attn.backward(b, &a.qkv_out, &a.d_attn, &mut a.d_qkv);
        self.qkv
            .backward(b, p, &a.d_qkv, &a.ln1_out, Some((&mut a.d_ln, false)));
        self.ln1.backward(b, p, &a.d_ln, x, &a.ln1, d, true);
    }
}

/// Blocks and a final layer norm: the weights.
pub struct Transformer {
    pub config: TransformerConfig,
    pub(super) blocks: Vec<Block>,
    pub(super) ln_f: Norm,
}

/// The activations of a transformer for `[batch, seq, width]` inputs.
pub struct Activations<B: Backend> {
    pub batch: usize,
    pub seq: usize,
    blocks: Vec<BlockActivations<B>>,
    ln_f: NormStats<B>,
    /// stream[0] is the input, stream[i + 1] block i's output.
    stream: Vec<B::Tensor>,
    /// The gradient w.r.t. the residual stream, from the top down.
    d_stream: B::Tensor,
}

impl<B: Backend> Activations<B> {
    /// The input buffer: write the embeddings here before `forward`.
    pub fn input(&mut self) -> &mut B::Tensor {
        &mut self.stream[0]
    }

    /// The gradient of the input, as the last `Transformer::backward` left it.
    pub fn d_input(&self) -> &B::Tensor {
        &self.d_stream
    }
}

impl Transformer {
    pub fn new<B: Backend>(params: &mut Params<B>, name: &str, config: TransformerConfig) -> Self {
        assert!(
            config.width.is_multiple_of(config.heads),
            "width must be a multiple of heads"
        );
        let blocks = (0..config.layers)
            .map(|i| Block::new(params, &format!("{name}.blocks.{i}"), &config))
            .collect();
        Transformer {
            config,
            blocks,
            ln_f: Norm::new(params, &format!("{name}.ln_f"), config.width),
        }
    }

    /// Buffers for running this transformer on `[batch, seq, width]`.
    pub fn activations<B: Backend>(&self, b: &B, batch: usize, seq: usize) -> Activations<B> {
        let rows = batch * seq;
        let w = self.config.width;
        Activations {
            batch,
            seq,
            blocks: (0..self.config.layers)
                .map(|_| BlockActivations::new(b, &self.config, batch, seq, true))
                .collect(),
            ln_f: NormStats::new(b, rows),
            stream: (0..=self.config.layers)
                .map(|_| b.zeros(rows * w))
                .collect(),
            d_stream: b.zeros(rows * w),
        }
    }

    /// out = ln_f(blocks(a.input())).
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut Activations<B>,
        key_mask: Option<&B::Ids>,
        out: &mut B::Tensor,
    ) {
        for (i, (block, acts)) in self.blocks.iter().zip(&mut a.blocks).enumerate() {
            let (done, rest) = a.stream.split_at_mut(i + 1);
            block.forward(b, p, acts, &done[i], key_mask, &mut rest[0]);
        }
        self.ln_f
            .forward(b, p, &a.stream[self.config.layers], out, &mut a.ln_f);
    }

    /// The gradient w.r.t. the input, given d_out; parameter gradients accumulate.
    pub fn backward<'a, B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        a: &'a mut Activations<B>,
        d_out: &B::Tensor,
    ) -> &'a B::Tensor {
        let d = &mut a.d_stream;
        let top = &a.stream[self.config.layers];
        self.ln_f.backward(b, p, d_out, top, &a.ln_f, d, false);
        for (i, (block, acts)) in self.blocks.iter().zip(&mut a.blocks).enumerate().rev() {
            block.backward(b, p, acts, &a.stream[i], d);
        }
        d
    }
}
