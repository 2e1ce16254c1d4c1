//! Attention's shapes: softmax rows with their masks, where heads sit in
//! a token-major tensor, self-attention over a fused qkv tensor and its
//! products per head, and decoding's attention over a KV cache.

use super::{Matmul, Operand};

/// Rows of a row-wise softmax, grouped as `[batch, heads, q_len]` so that
/// attention masks can be applied: a causal mask (key j visible to query q
/// when j <= q) and a key padding mask (`[batch, cols]`, nonzero = real).
/// A plain softmax is `SoftmaxRows::plain(rows, cols)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftmaxRows {
    pub rows: usize,
    pub cols: usize,
    pub q_len: usize,
    pub heads: usize,
    pub causal: bool,
}

impl SoftmaxRows {
    pub fn plain(rows: usize, cols: usize) -> Self {
        SoftmaxRows {
            rows,
            cols,
            q_len: rows.max(1),
            heads: 1,
            causal: false,
        }
    }
}

/// Where attention heads sit in a token-major tensor: element e of head h of
/// token t of item b is at `(b * seq + t) * row_stride + col_offset + h * head_dim + e`.
/// The head-major side is `[batch, heads, seq, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadLayout {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub row_stride: usize,
    pub col_offset: usize,
}

impl HeadLayout {
    pub fn len(&self) -> usize {
        self.batch * self.seq * self.heads * self.head_dim
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Multi-head self-attention over a fused qkv tensor `[batch, seq, 3 *
/// channels]` (q, then k, then v, each `[heads, head_dim]` per token), with
/// its output `[batch, seq, channels]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Each position attends only to itself and earlier ones.
    pub causal: bool,
}

impl AttentionShape {
    /// The widest head the fused kernels take: they hold 16 rows of
    /// three operands in 16 KiB of workgroup memory.
    pub const MAX_FUSED_HEAD_DIM: usize = 64;

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

    /// What q k is multiplied by: 1 / sqrt(head_dim).
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Attention as batched products per head, each operand read in place.
    pub fn products(&self) -> AttentionProducts {
        let (t, d) = (self.seq, self.head_dim);
        let per_head = |m, n, k| Matmul::per_head(self.batch, self.heads, m, n, k);
        let part = |p| Operand::heads_in_rows(&self.qkv_part(p));
        let out = Operand::heads_in_rows(&HeadLayout {
            row_stride: self.channels(),
            col_offset: 0,
            ..self.qkv_part(0)
        });
        AttentionProducts {
            scores: per_head(t, t, d)
                .with_a(part(0))
                .with_b(part(1))
                .trans_b()
                .alpha(self.scale()),
            weighted_values: per_head(t, d, t).with_b(part(2)).with_c(out),
            d_weights: per_head(t, t, d).with_a(out).with_b(part(2)).trans_b(),
            d_values: per_head(t, d, t).trans_a().with_b(out).with_c(part(2)),
            d_queries: per_head(t, d, t)
                .with_b(part(1))
                .with_c(part(0))
                .alpha(self.scale()),
            d_keys: per_head(t, d, t)
                .trans_a()
                .with_b(part(0))
                .with_c(part(1))
                .alpha(self.scale()),
        }
    }

    /// Panics unless the tensors of [`Backend::attention`](super::Backend::attention) have this shape:
    /// qkv `[batch, seq, 3 channels]`, out `[batch, seq, channels]`, the
    /// log-sum-exps `[batch, heads, seq]` and the mask `[batch, seq]`; and
    /// unless the heads fit the fused kernels.
    pub fn check(&self, (qkv, out, lse): (usize, usize, usize), mask: Option<usize>) {
        let tokens = self.batch * self.seq;
        assert!(
            qkv == tokens * 3 * self.channels()
                && out == tokens * self.channels()
                && lse == tokens * self.heads
                && mask.is_none_or(|m| m == tokens),
            "attention: tensors of {qkv}, {out}, {lse} and {mask:?} elements for {self:?}"
        );
        assert!(
            self.head_dim <= Self::MAX_FUSED_HEAD_DIM,
            "attention: heads of {} (the fused kernels take at most {})",
            self.head_dim,
            Self::MAX_FUSED_HEAD_DIM
        );
    }

    /// `check`, and d_out as large as out and dqkv as qkv: the tensors of
    /// [`Backend::attention_backward`](super::Backend::attention_backward).
    pub fn check_backward(
        &self,
        (qkv, out, lse, d_out, dqkv): (usize, usize, usize, usize, usize),
        mask: Option<usize>,
    ) {
        self.check((qkv, out, lse), mask);
        assert!(
            d_out == out && dqkv == qkv,
            "attention_backward: d_out of {d_out} and dqkv of {dqkv} elements for {self:?}"
        );
    }
}

/// Attention's products per head ([`AttentionShape::products`]): q, k and
/// v read inside qkv, the heads of out and of its gradient inside `[batch,
/// seq, channels]`, the weights and scores packed `[batch, heads, seq,
/// seq]`. Each writes its part of C (none accumulates).
#[derive(Clone, Copy, Debug)]
pub struct AttentionProducts {
    /// scores = scale q k^T.
    pub scores: Matmul,
    /// out = weights v.
    pub weighted_values: Matmul,
    /// d weights = d_out v^T.
    pub d_weights: Matmul,
    /// dv = weights^T d_out.
    pub d_values: Matmul,
    /// dq = scale d_scores k.
    pub d_queries: Matmul,
    /// dk = scale d_scores^T q.
    pub d_keys: Matmul,
}

/// Decoding's attention at one new position of `rows` sequences, over a
/// KV cache of `[rows, heads, capacity, head_dim]` per layer (see
/// [`Backend::attend_cached`](super::Backend::attend_cached)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CachedAttention {
    pub rows: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub capacity: usize,
    /// The new position: keys 0..=position take part.
    pub position: usize,
    /// Multiplies q k (1 / sqrt(head_dim)).
    pub scale: f32,
}

impl CachedAttention {
    /// Keys a cache may hold: the GPU kernel keeps a row's weights in
    /// workgroup memory.
    pub const MAX_CAPACITY: usize = 1024;

    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Panics unless the tensors have this shape: qkv `[rows, 3 width]`,
    /// each cache `[rows, heads, capacity, head_dim]`, out `[rows, width]`.
    pub fn check(&self, (qkv, keys, values, out): (usize, usize, usize, usize)) {
        let w = self.width();
        let cache = self.rows * self.heads * self.capacity * self.head_dim;
        assert!(
            qkv == self.rows * 3 * w && keys == cache && values == cache && out == self.rows * w,
            "attend_cached: tensors of {qkv}, {keys}, {values}, {out} elements for {self:?}"
        );
        assert!(
            self.position < self.capacity && self.capacity <= Self::MAX_CAPACITY,
            "attend_cached: position {} of a cache of {} (at most {})",
            self.position,
            self.capacity,
            Self::MAX_CAPACITY
        );
    }
}
