//! The one transformer: a stack of pre-LN blocks and a final layer norm,
//! used by the retriever's image and text towers and by the caption
//! decoder. Forward is the list of layer calls; backward is the same list
//! reversed, with every activation it needs kept in a named buffer.

use super::layers::{Dense, Norm};
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

    /// Parameters of the blocks and the final layer norm: per block two
    /// layer norms (4d), qkv (3d^2 + 3d), the projection (d^2 + d) and
    /// the MLP (8d^2 + 5d). Checked against a built model in the tests;
    /// checkpoint loading compares it with a file before allocating.
    pub fn parameter_count(&self) -> u128 {
        let d = self.width as u128;
        self.layers as u128 * (12 * d * d + 13 * d) + 2 * d
    }
}

/// x + attn(ln1(x)), then + mlp(ln2(.)).
struct Block<B: Backend> {
    ln1: Norm<B>,
    qkv: Dense,
    attn: Attention<B>,
    proj: Dense,
    ln2: Norm<B>,
    fc1: Dense,
    fc2: Dense,
    // activations, [rows, width] unless named otherwise
    ln1_out: B::Tensor,
    qkv_out: B::Tensor, // [rows, 3 width]
    attn_out: B::Tensor,
    branch_out: B::Tensor,
    mid: B::Tensor,
    ln2_out: B::Tensor,
    fc1_out: B::Tensor, // [rows, 4 width]
    gelu_out: B::Tensor,
    // gradients
    d_mid: B::Tensor,
    d_ln: B::Tensor,
    d_qkv: B::Tensor,
    d_attn: B::Tensor,
    d_hidden: B::Tensor, // [rows, 4 width]
    d_fc1: B::Tensor,
}

impl<B: Backend> Block<B> {
    fn new(
        b: &B,
        params: &mut Params<B>,
        name: &str,
        c: &TransformerConfig,
        batch: usize,
        seq: usize,
    ) -> Self {
        let rows = batch * seq;
        let w = c.width;
        let std = c.init_std();
        // Residual projections scaled down with depth, as GPT-2 does.
        let residual_std = std / (2.0 * c.layers as f32).sqrt();
        let shape = AttentionShape {
            batch,
            seq,
            heads: c.heads,
            head_dim: w / c.heads,
            causal: c.causal,
        };
        Block {
            ln1: Norm::new(b, params, &format!("{name}.ln1"), rows, w),
            qkv: Dense::new(b, params, &format!("{name}.attn.qkv"), rows, w, 3 * w, std),
            attn: Attention::new(b, shape),
            proj: Dense::new(
                b,
                params,
                &format!("{name}.attn.proj"),
                rows,
                w,
                w,
                residual_std,
            ),
            ln2: Norm::new(b, params, &format!("{name}.ln2"), rows, w),
            fc1: Dense::new(b, params, &format!("{name}.mlp.fc1"), rows, w, 4 * w, std),
            fc2: Dense::new(
                b,
                params,
                &format!("{name}.mlp.fc2"),
                rows,
                4 * w,
                w,
                residual_std,
            ),
            ln1_out: b.zeros(rows * w),
            qkv_out: b.zeros(rows * 3 * w),
            attn_out: b.zeros(rows * w),
            branch_out: b.zeros(rows * w),
            mid: b.zeros(rows * w),
            ln2_out: b.zeros(rows * w),
            fc1_out: b.zeros(rows * 4 * w),
            gelu_out: b.zeros(rows * 4 * w),
            d_mid: b.zeros(rows * w),
            d_ln: b.zeros(rows * w),
            d_qkv: b.zeros(rows * 3 * w),
            d_attn: b.zeros(rows * w),
            d_hidden: b.zeros(rows * 4 * w),
            d_fc1: b.zeros(rows * 4 * w),
        }
    }

    fn forward(
        &mut self,
        b: &B,
        p: &Params<B>,
        x: &B::Tensor,
        key_mask: Option<&B::Ids>,
        out: &mut B::Tensor,
    ) {
        self.ln1.forward(b, p, x, &mut self.ln1_out);
        self.qkv.forward(b, p, &self.ln1_out, &mut self.qkv_out);
        self.attn
            .forward(b, &self.qkv_out, key_mask, &mut self.attn_out);
        self.proj
            .forward(b, p, &self.attn_out, &mut self.branch_out);
        b.add(1.0, x, 1.0, &self.branch_out, &mut self.mid);
        self.ln2.forward(b, p, &self.mid, &mut self.ln2_out);
        self.fc1.forward(b, p, &self.ln2_out, &mut self.fc1_out);
        b.gelu(&self.fc1_out, &mut self.gelu_out);
        self.fc2.forward(b, p, &self.gelu_out, &mut self.branch_out);
        b.add(1.0, &self.mid, 1.0, &self.branch_out, out);
    }

    /// dx = the gradient w.r.t. the block's input x, given d_out.
    fn backward(
        &mut self,
        b: &B,
        p: &mut Params<B>,
        x: &B::Tensor,
        d_out: &B::Tensor,
        dx: &mut B::Tensor,
    ) {
        // MLP branch; the residual passes d_out straight to d_mid.
        self.fc2.backward(
            b,
            p,
            d_out,
            &self.gelu_out,
            Some((&mut self.d_hidden, false)),
        );
        b.gelu_backward(&self.fc1_out, &self.d_hidden, &mut self.d_fc1, false);
        self.fc1.backward(
            b,
            p,
            &self.d_fc1,
            &self.ln2_out,
            Some((&mut self.d_ln, false)),
        );
        b.axpby(1.0, d_out, 0.0, &mut self.d_mid);
        self.ln2
            .backward(b, p, &self.d_ln, &self.mid, &mut self.d_mid, true);
        // Attention branch.
        self.proj.backward(
            b,
            p,
            &self.d_mid,
            &self.attn_out,
            Some((&mut self.d_attn, false)),
        );
        self.attn.backward(b, &self.d_attn, &mut self.d_qkv);
        self.qkv.backward(
            b,
            p,
            &self.d_qkv,
            &self.ln1_out,
            Some((&mut self.d_ln, false)),
        );
        b.axpby(1.0, &self.d_mid, 0.0, dx);
        self.ln1.backward(b, p, &self.d_ln, x, dx, true);
    }
}

/// Blocks and a final layer norm over `[batch, seq, width]` activations.
pub struct Transformer<B: Backend> {
    pub config: TransformerConfig,
    blocks: Vec<Block<B>>,
    ln_f: Norm<B>,
    /// stream[0] is the input, stream[i + 1] block i's output.
    stream: Vec<B::Tensor>,
    d_stream: [B::Tensor; 2],
}

impl<B: Backend> Transformer<B> {
    pub fn new(
        b: &B,
        params: &mut Params<B>,
        name: &str,
        config: TransformerConfig,
        batch: usize,
        seq: usize,
    ) -> Self {
        assert!(
            config.width.is_multiple_of(config.heads),
            "width must be a multiple of heads"
        );
        let rows = batch * seq;
        let blocks = (0..config.layers)
            .map(|i| {
                Block::new(
                    b,
                    params,
                    &format!("{name}.blocks.{i}"),
                    &config,
                    batch,
                    seq,
                )
            })
            .collect();
        Transformer {
            config,
            blocks,
            ln_f: Norm::new(b, params, &format!("{name}.ln_f"), rows, config.width),
            stream: (0..=config.layers)
                .map(|_| b.zeros(rows * config.width))
                .collect(),
            d_stream: [b.zeros(rows * config.width), b.zeros(rows * config.width)],
        }
    }

    /// The input buffer: write the embeddings here before `forward`.
    pub fn input(&mut self) -> &mut B::Tensor {
        &mut self.stream[0]
    }

    /// out = ln_f(blocks(input)).
    pub fn forward(
        &mut self,
        b: &B,
        p: &Params<B>,
        key_mask: Option<&B::Ids>,
        out: &mut B::Tensor,
    ) {
        for (i, block) in self.blocks.iter_mut().enumerate() {
            let (done, rest) = self.stream.split_at_mut(i + 1);
            block.forward(b, p, &done[i], key_mask, &mut rest[0]);
        }
        self.ln_f
            .forward(b, p, &self.stream[self.config.layers], out);
    }

    /// The gradient w.r.t. the input, given d_out; parameter gradients accumulate.
    pub fn backward(&mut self, b: &B, p: &mut Params<B>, d_out: &B::Tensor) -> &B::Tensor {
        let [d_a, d_b] = &mut self.d_stream;
        self.ln_f
            .backward(b, p, d_out, &self.stream[self.config.layers], d_a, false);
        let (mut d_next, mut d_prev) = (d_a, d_b);
        for (i, block) in self.blocks.iter_mut().enumerate().rev() {
            block.backward(b, p, &self.stream[i], d_next, d_prev);
            std::mem::swap(&mut d_next, &mut d_prev);
        }
        d_next
    }
}
