//! The LSTM captioners' untied output layer, `logit`, with the policy mask
//! every family adds: logits = h W^T + b + m.

use super::tokens::{Linear, linear};
use crate::backend::{Backend, Matmul, Operand};
use crate::captioner::CaptionerConfig;
use crate::captioner::inputs::policy_mask;
use crate::model::params::Params;

pub(super) struct Output<B: Backend> {
    /// `[vocab, hidden]` and `[vocab]`.
    logit: Linear,
    /// `[vocab]`.
    policy_mask: B::Tensor,
    vocab: usize,
    hidden: usize,
}

impl<B: Backend> Output<B> {
    /// Declares `logit` in `p`.
    pub fn new(b: &B, p: &mut Params<B>, c: &CaptionerConfig) -> Self {
        let (vocab, hidden) = (c.vocab_size, c.decoder.width);
        Output {
            logit: linear(p, "logit", vocab, hidden),
            policy_mask: b.tensor(&policy_mask(c)),
            vocab,
            hidden,
        }
    }

    /// `[vocab]`: the output bias plus the policy mask, what
    /// [`Output::forward`] adds.
    pub fn bias(&self, b: &B, p: &Params<B>, out: &mut B::Tensor) {
        b.add(1.0, p.value(self.logit.1), 1.0, &self.policy_mask, out);
    }

    /// `logits` `[rows, vocab]` of the `rows` hidden states of `hidden`
    /// that `at` places.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        b: &B,
        p: &Params<B>,
        (hidden, at): (&B::Tensor, Operand),
        bias: &B::Tensor,
        logits: &mut B::Tensor,
        rows: usize,
    ) {
        let shape = Matmul::new(rows, self.vocab, self.hidden)
            .trans_b()
            .with_a(at);
        b.matmul_bias(hidden, p.value(self.logit.0), bias, logits, &shape);
    }

    /// From the gradient w.r.t. the logits of `rows` packed hidden states
    /// `top`: `d_top` = the gradient w.r.t. them, and the layer's
    /// gradients added.
    pub fn backward(
        &self,
        b: &B,
        p: &mut Params<B>,
        d_logits: &B::Tensor,
        top: &B::Tensor,
        d_top: &mut B::Tensor,
        rows: usize,
    ) {
        let (v, h) = (self.vocab, self.hidden);
        let (w, bias) = self.logit;
        b.matmul(d_logits, p.value(w), d_top, &Matmul::new(rows, h, v));
        let d_weight = Matmul::new(v, h, rows).trans_a().accumulate();
        b.matmul(d_logits, top, p.grad(w), &d_weight);
        b.column_sum(d_logits, rows, v, p.grad(bias), true);
    }
}
