//! Multi-head cross-attention: queries from one sequence (a caption's
//! positions, `[batch, q_len, channels]`), keys and values from another
//! (image tokens, a fused kv tensor `[batch, kv_len, 2 * channels]`: k,
//! then v), the two of different lengths, with an optional key padding
//! mask `[batch, kv_len]` (nonzero = a real token). Every query sees every
//! real key.
//!
//! Batched products per head and the masked softmax, each operand read in
//! place, with the weights `[batch, heads, q_len, kv_len]` kept for the
//! backward: the same ops as self-attention's products path, so both
//! backends and their parity tests already cover every kernel it runs.

use crate::backend::{Backend, HeadLayout, Matmul, Operand, SoftmaxRows};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrossAttentionShape {
    pub batch: usize,
    /// Query positions per item.
    pub q_len: usize,
    /// Key (and value) positions per item.
    pub kv_len: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl CrossAttentionShape {
    pub fn channels(&self) -> usize {
        self.heads * self.head_dim
    }

    /// What q k is multiplied by: 1 / sqrt(head_dim).
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Elements of the queries and of the output, `[batch, q_len, channels]`.
    pub fn q_elements(&self) -> usize {
        self.batch * self.q_len * self.channels()
    }

    /// Elements of the fused keys and values, `[batch, kv_len, 2 channels]`.
    pub fn kv_elements(&self) -> usize {
        self.batch * self.kv_len * 2 * self.channels()
    }

    /// The heads of the queries (or of the output, or their gradients).
    fn query_heads(&self) -> Operand {
        Operand::heads_in_rows(&HeadLayout {
            batch: self.batch,
            seq: self.q_len,
            heads: self.heads,
            head_dim: self.head_dim,
            row_stride: self.channels(),
            col_offset: 0,
        })
    }

    /// The heads of k (part 0) or v (part 1) inside the fused kv.
    fn kv_heads(&self, part: usize) -> Operand {
        Operand::heads_in_rows(&HeadLayout {
            batch: self.batch,
            seq: self.kv_len,
            heads: self.heads,
            head_dim: self.head_dim,
            row_stride: 2 * self.channels(),
            col_offset: part * self.channels(),
        })
    }

    fn weights_len(&self) -> usize {
        self.batch * self.heads * self.q_len * self.kv_len
    }
}

/// One cross-attention layer's saved weights and scratch for one batch
/// shape.
pub struct CrossAttention<B: Backend> {
    pub shape: CrossAttentionShape,
    /// Scores before softmax; in backward, their gradient.
    scores: B::Tensor,
    /// Attention weights, `[batch, heads, q_len, kv_len]`.
    probs: B::Tensor,
    /// Their gradient (empty without backward).
    dprobs: B::Tensor,
}

impl<B: Backend> CrossAttention<B> {
    pub fn new(b: &B, shape: CrossAttentionShape, backward: bool) -> Self {
        let n = shape.weights_len();
        CrossAttention {
            shape,
            scores: b.zeros(n),
            probs: b.zeros(n),
            dprobs: b.zeros(if backward { n } else { 0 }),
        }
    }

    /// out `[batch, q_len, channels]` = softmax(scale q k^T, masked) v, per head.
    pub fn forward(
        &mut self,
        b: &B,
        q: &B::Tensor,
        kv: &B::Tensor,
        key_mask: Option<&B::Ids>,
        out: &mut B::Tensor,
    ) {
        let s = self.shape;
        let (lq, lk, d) = (s.q_len, s.kv_len, s.head_dim);
        let per_head = |m, n, k| Matmul::per_head(s.batch, s.heads, m, n, k);
        b.matmul(
            q,
            kv,
            &mut self.scores,
            &per_head(lq, lk, d)
                .with_a(s.query_heads())
                .with_b(s.kv_heads(0))
                .trans_b()
                .alpha(s.scale()),
        );
        let rows = SoftmaxRows {
            rows: s.batch * s.heads * lq,
            cols: lk,
            q_len: lq,
            heads: s.heads,
            causal: false,
        };
        b.softmax(&self.scores, &mut self.probs, &rows, key_mask);
        b.matmul(
            &self.probs,
            kv,
            out,
            &per_head(lq, d, lk)
                .with_b(s.kv_heads(1))
                .with_c(s.query_heads()),
        );
    }

    /// dq and dkv (both overwritten) = the gradients of the loss w.r.t. the
    /// forward's queries and fused keys and values, given d_out.
    pub fn backward(
        &mut self,
        b: &B,
        (q, kv): (&B::Tensor, &B::Tensor),
        d_out: &B::Tensor,
        dq: &mut B::Tensor,
        dkv: &mut B::Tensor,
    ) {
        let s = self.shape;
        let (lq, lk, d) = (s.q_len, s.kv_len, s.head_dim);
        let per_head = |m, n, k| Matmul::per_head(s.batch, s.heads, m, n, k);
        // d weights = d_out v^T; dv = weights^T d_out.
        b.matmul(
            d_out,
            kv,
            &mut self.dprobs,
            &per_head(lq, lk, d)
                .with_a(s.query_heads())
                .with_b(s.kv_heads(1))
                .trans_b(),
        );
        b.matmul(
            &self.probs,
            d_out,
            dkv,
            &per_head(lk, d, lq)
                .trans_a()
                .with_b(s.query_heads())
                .with_c(s.kv_heads(1)),
        );
        let d_scores = &mut self.scores;
        b.softmax_backward(&self.probs, &self.dprobs, d_scores, lk, false);
        // dq = scale d_scores k; dk = scale d_scores^T q.
        b.matmul(
            d_scores,
            kv,
            dq,
            &per_head(lq, d, lk)
                .with_b(s.kv_heads(0))
                .with_c(s.query_heads())
                .alpha(s.scale()),
        );
        b.matmul(
            d_scores,
            q,
            dkv,
            &per_head(lk, d, lq)
                .trans_a()
                .with_b(s.query_heads())
                .with_c(s.kv_heads(0))
                .alpha(s.scale()),
        );
    }
}
