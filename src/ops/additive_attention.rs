//! Additive attention (Bahdanau, Cho and Bengio, 2015), as the attention
//! LSTM captioners use it: for each of `batch` queries q (`[width]`) over
//! its image's `tokens` keys k_n (`[width]`, the tokens already projected)
//! and values v_n (`[values]`),
//!
//! ```text
//! e_n = w . tanh(k_n + q),   a = softmax(e),   context = sum_n a_n v_n
//! ```
//!
//! A query is one row of a tensor and a context is written to one (a
//! decoder keeps them per position), placed by [`Rows`]. The backward
//! recomputes the scores from the query rather than keeping `[batch,
//! tokens, width]` per position. Every step is a kernel both backends
//! already have: batched products (a broadcast is a product with a column
//! of ones), tanh and the row softmax.

use crate::backend::{Backend, Matmul, Operand, SoftmaxRows};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdditiveShape {
    pub batch: usize,
    /// Keys (and values) per query.
    pub tokens: usize,
    /// Width of a key and a query.
    pub width: usize,
    /// Width of a value and of the context.
    pub values: usize,
}

/// Where each of a batch's rows sits in a tensor: row b at `offset + b *
/// stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rows {
    pub offset: usize,
    pub stride: usize,
}

impl Rows {
    pub fn packed(width: usize) -> Self {
        Rows {
            offset: 0,
            stride: width,
        }
    }

    /// Each batch item's matrix is its one row.
    fn operand(&self) -> Operand {
        Operand {
            offset: self.offset,
            row_stride: 0,
            group_stride: self.stride,
            head_stride: 0,
        }
    }
}

/// The scratch of one batch shape.
pub struct AdditiveAttention<B: Backend> {
    pub shape: AdditiveShape,
    /// `[tokens]` ones: broadcasts a query over its keys, and sums over them.
    ones: B::Tensor,
    /// `[batch, tokens, width]`: k + q.
    pre: B::Tensor,
    /// `[batch, tokens, width]`: tanh(k + q); in the backward, once d w
    /// has it, the gradient w.r.t. it.
    act: B::Tensor,
    /// `[batch, tokens, width]`: the gradient w.r.t. k + q.
    d_pre: B::Tensor,
    /// `[batch, tokens]`: the scores e; in the backward, their gradient.
    scores: B::Tensor,
    /// `[batch, tokens]`: the weights a.
    weights: B::Tensor,
    d_weights: B::Tensor,
}

impl<B: Backend> AdditiveAttention<B> {
    pub fn new(b: &B, shape: AdditiveShape) -> Self {
        let AdditiveShape {
            batch,
            tokens,
            width,
            ..
        } = shape;
        AdditiveAttention {
            shape,
            ones: b.tensor(&vec![1.0; tokens]),
            pre: b.zeros(batch * tokens * width),
            act: b.zeros(batch * tokens * width),
            d_pre: b.zeros(batch * tokens * width),
            scores: b.zeros(batch * tokens),
            weights: b.zeros(batch * tokens),
            d_weights: b.zeros(batch * tokens),
        }
    }

    /// The weights a of the last `forward`, `[batch, tokens]`.
    pub fn weights(&self) -> &B::Tensor {
        &self.weights
    }

    /// k + q, its tanh, the scores and the weights, for `query`'s rows.
    fn scores(&mut self, b: &B, keys: &B::Tensor, w: &B::Tensor, query: (&B::Tensor, Rows)) {
        let AdditiveShape {
            batch,
            tokens,
            width,
            ..
        } = self.shape;
        b.axpby(1.0, keys, 0.0, &mut self.pre);
        // k_n + q: a column of ones times each query row, added.
        let broadcast = Matmul::batched(batch, tokens, width, 1)
            .with_a(Operand::packed(0))
            .with_b(query.1.operand())
            .accumulate();
        b.matmul(&self.ones, query.0, &mut self.pre, &broadcast);
        b.tanh(&self.pre, &mut self.act);
        b.matmul(
            &self.act,
            w,
            &mut self.scores,
            &Matmul::new(batch * tokens, 1, width),
        );
        let rows = SoftmaxRows::plain(batch, tokens);
        b.softmax(&self.scores, &mut self.weights, &rows, None);
    }

    /// Writes each query's context to `context`'s rows.
    pub fn forward(
        &mut self,
        b: &B,
        (keys, values, w): (&B::Tensor, &B::Tensor, &B::Tensor),
        query: (&B::Tensor, Rows),
        context: (&mut B::Tensor, Rows),
    ) {
        self.scores(b, keys, w, query);
        let s = self.shape;
        let weighted = Matmul::batched(s.batch, 1, s.values, s.tokens).with_c(context.1.operand());
        b.matmul(&self.weights, values, context.0, &weighted);
    }

    /// The gradients of a loss whose gradient w.r.t. `query`'s contexts is
    /// `d_context`'s rows: written to `d_query` (`[batch, width]`), added to
    /// `d_keys`, `d_values` and `d_w`. Recomputes the forward first.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        b: &B,
        (keys, values, w): (&B::Tensor, &B::Tensor, &B::Tensor),
        query: (&B::Tensor, Rows),
        d_context: (&B::Tensor, Rows),
        d_query: &mut B::Tensor,
        (d_keys, d_values, d_w): (&mut B::Tensor, &mut B::Tensor, &mut B::Tensor),
    ) {
        self.scores(b, keys, w, query);
        let AdditiveShape {
            batch,
            tokens,
            width,
            values: v,
        } = self.shape;
        let d_at = d_context.1.operand();
        // d a = d context v^T; d v += a^T d context.
        let d_weights = Matmul::batched(batch, 1, tokens, v).trans_b().with_a(d_at);
        b.matmul(d_context.0, values, &mut self.d_weights, &d_weights);
        let d_values_shape = Matmul::batched(batch, tokens, v, 1)
            .trans_a()
            .with_b(d_at)
            .accumulate();
        b.matmul(&self.weights, d_context.0, d_values, &d_values_shape);
        b.softmax_backward(
            &self.weights,
            &self.d_weights,
            &mut self.scores,
            tokens,
            false,
        );
        // d w += tanh(k + q)^T d e, then d tanh = d e w^T and d (k + q).
        let d_w_shape = Matmul::new(width, 1, batch * tokens).trans_a().accumulate();
        b.matmul(&self.act, &self.scores, d_w, &d_w_shape);
        b.matmul(
            &self.scores,
            w,
            &mut self.act,
            &Matmul::new(batch * tokens, width, 1),
        );
        b.tanh_backward(&self.pre, &self.act, &mut self.d_pre);
        b.axpby(1.0, &self.d_pre, 1.0, d_keys);
        // d q = the sum over the keys: a row of ones times each image's block.
        let sum = Matmul::batched(batch, 1, width, tokens).with_a(Operand::packed(0));
        b.matmul(&self.ones, &self.d_pre, d_query, &sum);
    }
}
