//! Multi-head scaled dot-product attention over a fused qkv tensor
//! `[batch, seq, 3 * channels]` (q, then k, then v), causal or
//! bidirectional, with an optional key padding mask `[batch, seq]`
//! (nonzero = a real token).

use crate::backend::{Backend, HeadLayout, Matmul, SoftmaxRows};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub causal: bool,
}

impl AttentionShape {
    pub fn channels(&self) -> usize {
        self.heads * self.head_dim
    }

    /// q (part 0), k (1) or v (2) inside the fused qkv tensor.
    fn qkv_part(&self, part: usize) -> HeadLayout {
        HeadLayout {
            batch: self.batch,
            seq: self.seq,
            heads: self.heads,
            head_dim: self.head_dim,
            row_stride: 3 * self.channels(),
            col_offset: part * self.channels(),
        }
    }

    fn output(&self) -> HeadLayout {
        HeadLayout {
            row_stride: self.channels(),
            col_offset: 0,
            ..self.qkv_part(0)
        }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// [batch * heads] products of seq x n by n x seq-or-head_dim.
    fn per_head(&self, m: usize, n: usize, k: usize) -> Matmul {
        Matmul::batched(self.batch * self.heads, m, n, k)
    }
}

/// One attention layer's saved activations and gradient scratch.
pub struct Attention<B: Backend> {
    pub shape: AttentionShape,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    /// Scores before softmax; in backward, their gradient.
    scores: B::Tensor,
    /// Attention weights, `[batch, heads, seq, seq]`.
    pub probs: B::Tensor,
    /// Per-head output; in backward, its gradient.
    heads_out: B::Tensor,
    dprobs: B::Tensor,
    dq: B::Tensor,
    dk: B::Tensor,
    dv: B::Tensor,
}

impl<B: Backend> Attention<B> {
    pub fn new(b: &B, shape: AttentionShape) -> Self {
        let per_head = shape.batch * shape.heads * shape.seq * shape.head_dim;
        let square = shape.batch * shape.heads * shape.seq * shape.seq;
        Attention {
            shape,
            q: b.zeros(per_head),
            k: b.zeros(per_head),
            v: b.zeros(per_head),
            scores: b.zeros(square),
            probs: b.zeros(square),
            heads_out: b.zeros(per_head),
            dprobs: b.zeros(square),
            dq: b.zeros(per_head),
            dk: b.zeros(per_head),
            dv: b.zeros(per_head),
        }
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
        let (t, d) = (s.seq, s.head_dim);
        b.tokens_to_heads(qkv, &mut self.q, &s.qkv_part(0));
        b.tokens_to_heads(qkv, &mut self.k, &s.qkv_part(1));
        b.tokens_to_heads(qkv, &mut self.v, &s.qkv_part(2));
        b.matmul(
            &self.q,
            &self.k,
            &mut self.scores,
            &s.per_head(t, t, d).trans_b().alpha(s.scale()),
        );
        let rows = SoftmaxRows {
            rows: s.batch * s.heads * t,
            cols: t,
            q_len: t,
            heads: s.heads,
            causal: s.causal,
        };
        b.softmax(&self.scores, &mut self.probs, &rows, key_mask);
        b.matmul(
            &self.probs,
            &self.v,
            &mut self.heads_out,
            &s.per_head(t, d, t),
        );
        b.heads_to_tokens(&self.heads_out, out, &s.output(), false);
    }

    /// dqkv = the gradient of the loss w.r.t. qkv, given dout (overwrites dqkv).
    pub fn backward(&mut self, b: &B, dout: &B::Tensor, dqkv: &mut B::Tensor) {
        let s = self.shape;
        let (t, d) = (s.seq, s.head_dim);
        let dheads = &mut self.heads_out;
        b.tokens_to_heads(dout, dheads, &s.output());
        b.matmul(
            dheads,
            &self.v,
            &mut self.dprobs,
            &s.per_head(t, t, d).trans_b(),
        );
        b.matmul(
            &self.probs,
            dheads,
            &mut self.dv,
            &s.per_head(t, d, t).trans_a(),
        );
        let dscores = &mut self.scores;
        b.softmax_backward(&self.probs, &self.dprobs, dscores, t, false);
        b.matmul(
            dscores,
            &self.k,
            &mut self.dq,
            &s.per_head(t, d, t).alpha(s.scale()),
        );
        b.matmul(
            dscores,
            &self.q,
            &mut self.dk,
            &s.per_head(t, d, t).trans_a().alpha(s.scale()),
        );
        b.heads_to_tokens(&self.dq, dqkv, &s.qkv_part(0), false);
        b.heads_to_tokens(&self.dk, dqkv, &s.qkv_part(1), false);
        b.heads_to_tokens(&self.dv, dqkv, &s.qkv_part(2), false);
    }
}
