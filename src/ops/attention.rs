//! Multi-head scaled dot-product attention over a fused qkv tensor
//! `[batch, seq, 3 * channels]` (q, then k, then v), causal or
//! bidirectional, with an optional key padding mask `[batch, seq]`
//! (nonzero = a real token).
//!
//! Heads up to [`AttentionShape::MAX_FUSED_HEAD_DIM`] wide take the fused
//! kernels ([`Backend::attention`]): one op forward and one backward, each
//! query's log-sum-exp the only thing kept between them. Wider heads take
//! batched products and a masked softmax, with the `[batch, heads, seq,
//! seq]` weights stored; tests compare the two.

pub use crate::backend::AttentionShape;
use crate::backend::{Backend, SoftmaxRows};

/// How an [`Attention`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// [`Backend::attention`] and its backward.
    Fused,
    /// Products per head and a softmax, the weights stored.
    Products,
}

impl AttentionKernel {
    /// Fused where the heads fit the fused kernels.
    pub fn for_shape(shape: &AttentionShape) -> Self {
        match shape.head_dim <= AttentionShape::MAX_FUSED_HEAD_DIM {
            true => AttentionKernel::Fused,
            false => AttentionKernel::Products,
        }
    }
}

/// What one attention layer keeps between its forward and backward.
enum Saved<B: Backend> {
    /// Each query's log-sum-exp, `[batch, heads, seq]`.
    Fused { lse: B::Tensor },
    Products {
        /// Scores before softmax; in backward, their gradient.
        scores: B::Tensor,
        /// Attention weights, `[batch, heads, seq, seq]`.
        probs: B::Tensor,
        /// Their gradient (empty without backward).
        dprobs: B::Tensor,
    },
}

/// One attention layer's saved state and scratch for one batch shape.
pub struct Attention<B: Backend> {
    pub shape: AttentionShape,
    saved: Saved<B>,
}

impl<B: Backend> Attention<B> {
    /// The kernel the shape allows ([`AttentionKernel::for_shape`]).
    pub fn new(b: &B, shape: AttentionShape, backward: bool) -> Self {
        Self::with_kernel(b, shape, backward, AttentionKernel::for_shape(&shape))
    }

    /// A given kernel (the fused one panics on heads wider than it takes).
    pub fn with_kernel(
        b: &B,
        shape: AttentionShape,
        backward: bool,
        kernel: AttentionKernel,
    ) -> Self {
        let s = shape;
        let saved = match kernel {
            AttentionKernel::Fused => Saved::Fused {
                lse: b.zeros(s.batch * s.heads * s.seq),
            },
            AttentionKernel::Products => {
                let square = s.batch * s.heads * s.seq * s.seq;
                Saved::Products {
                    scores: b.zeros(square),
                    probs: b.zeros(square),
                    dprobs: b.zeros(if backward { square } else { 0 }),
                }
            }
        };
        Attention { shape, saved }
    }

    /// out[batch, seq, channels] = attention(qkv).
    pub fn forward(
        &mut self,
        b: &B,
        qkv: &B::Tensor,
        key_mask: Option<&B::Ids>,
        out: &mut B::Tensor,
    ) {
        let s = self.shape;
        let (scores, probs) = match &mut self.saved {
            Saved::Fused { lse } => return b.attention(qkv, key_mask, out, lse, &s),
            Saved::Products { scores, probs, .. } => (scores, probs),
        };
        let products = s.products();
        b.matmul(qkv, qkv, scores, &products.scores);
        let rows = SoftmaxRows {
            rows: s.batch * s.heads * s.seq,
            cols: s.seq,
            q_len: s.seq,
            heads: s.heads,
            causal: s.causal,
        };
        b.softmax(scores, probs, &rows, key_mask);
        b.matmul(probs, qkv, out, &products.weighted_values);
    }

    /// dqkv = the gradient of the loss w.r.t. qkv (overwritten), given the
    /// forward's qkv, key mask and out, and dout.
    pub fn backward(
        &mut self,
        b: &B,
        qkv: &B::Tensor,
        key_mask: Option<&B::Ids>,
        out: &B::Tensor,
        dout: &B::Tensor,
        dqkv: &mut B::Tensor,
    ) {
        let s = self.shape;
        let (dscores, probs, dprobs) = match &mut self.saved {
            Saved::Fused { lse } => {
                return b.attention_backward(qkv, key_mask, out, lse, dout, dqkv, &s);
            }
            Saved::Products {
                scores,
                probs,
                dprobs,
            } => (scores, probs, dprobs),
        };
        let products = s.products();
        b.matmul(dout, qkv, dprobs, &products.d_weights);
        b.matmul(probs, dout, dqkv, &products.d_values);
        b.softmax_backward(probs, dprobs, dscores, s.seq, false);
        b.matmul(dscores, qkv, dqkv, &products.d_queries);
        b.matmul(dscores, qkv, dqkv, &products.d_keys);
    }
}
