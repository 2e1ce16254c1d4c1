//! Multi-head scaled dot-product attention over a fused qkv tensor
//! `[batch, seq, 3 * channels]` (q, then k, then v), causal or
//! bidirectional, with an optional key padding mask `[batch, seq]`
//! (nonzero = a real token).

use crate::backend::{Backend, HeadLayout, Matmul, Operand, SoftmaxRows};

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
    pub fn qkv_part(&self, part: usize) -> HeadLayout {
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

    /// What q k is multiplied by: 1 / sqrt(head_dim).
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// [batch * heads] products of seq x n by n x seq-or-head_dim, every
    /// operand packed head-major until given a token-major layout.
    fn per_head(&self, m: usize, n: usize, k: usize) -> Matmul {
        Matmul::per_head(self.batch, self.heads, m, n, k)
    }

    /// q (0), k (1) or v (2) read in place inside the fused qkv tensor.
    fn qkv(&self, part: usize) -> Operand {
        Operand::heads_in_rows(&self.qkv_part(part))
    }

    /// The heads of the `[batch, seq, channels]` output, in place.
    fn out(&self) -> Operand {
        Operand::heads_in_rows(&self.output())
    }
}

/// One attention layer's saved attention weights and gradient scratch.
/// The batched products read q, k and v in place in the fused qkv tensor
/// and write the heads in place in the output, so no head is copied.
pub struct Attention<B: Backend> {
    pub shape: AttentionShape,
    /// Scores before softmax; in backward, their gradient.
    scores: B::Tensor,
    /// Attention weights, `[batch, heads, seq, seq]`.
    pub probs: B::Tensor,
    /// Their gradient (empty without backward).
    dprobs: B::Tensor,
}

impl<B: Backend> Attention<B> {
    pub fn new(b: &B, shape: AttentionShape, backward: bool) -> Self {
        let square = shape.batch * shape.heads * shape.seq * shape.seq;
        Attention {
            shape,
            scores: b.zeros(square),
            probs: b.zeros(square),
            dprobs: b.zeros(if backward { square } else { 0 }),
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
        let scores = s
            .per_head(t, t, d)
            .with_a(s.qkv(0))
            .with_b(s.qkv(1))
            .trans_b()
            .alpha(s.scale());
        b.matmul(qkv, qkv, &mut self.scores, &scores);
        let rows = SoftmaxRows {
            rows: s.batch * s.heads * t,
            cols: t,
            q_len: t,
            heads: s.heads,
            causal: s.causal,
        };
        b.softmax(&self.scores, &mut self.probs, &rows, key_mask);
        let values = s.per_head(t, d, t).with_b(s.qkv(2)).with_c(s.out());
        b.matmul(&self.probs, qkv, out, &values);
    }

    /// dqkv = the gradient of the loss w.r.t. qkv, given the forward's
    /// qkv and dout (overwrites dqkv).
    pub fn backward(&mut self, b: &B, qkv: &B::Tensor, dout: &B::Tensor, dqkv: &mut B::Tensor) {
        let s = self.shape;
        let (t, d) = (s.seq, s.head_dim);
        let dprobs = s
            .per_head(t, t, d)
            .with_a(s.out())
            .with_b(s.qkv(2))
            .trans_b();
        b.matmul(dout, qkv, &mut self.dprobs, &dprobs);
        let dv = s
            .per_head(t, d, t)
            .trans_a()
            .with_b(s.out())
            .with_c(s.qkv(2));
        b.matmul(&self.probs, dout, dqkv, &dv);
        let dscores = &mut self.scores;
        b.softmax_backward(&self.probs, &self.dprobs, dscores, t, false);
        let dq = s
            .per_head(t, d, t)
            .with_b(s.qkv(1))
            .with_c(s.qkv(0))
            .alpha(s.scale());
        b.matmul(dscores, qkv, dqkv, &dq);
        let dk = s
            .per_head(t, d, t)
            .trans_a()
            .with_b(s.qkv(0))
            .with_c(s.qkv(1))
            .alpha(s.scale());
        b.matmul(dscores, qkv, dqkv, &dk);
    }
}
