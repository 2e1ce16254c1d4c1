//! Token-level cross-entropy: `scale` times the weighted mean over rows of
//! -log p(target), where p is a softmax over the full vocabulary or over a
//! per-row subset (SMILE). Row weights are 0 for padding. The loss stays on
//! the device; read it only when logging.

use crate::backend::{Backend, Reduce, VocabSubsets};

pub struct CrossEntropy<B: Backend> {
    pub rows: usize,
    pub vocab: usize,
    /// log p(target) per row.
    pub logp: B::Tensor,
    lse: B::Tensor,
    /// d loss / d logp[r] = -scale * weight[r] / sum(weights).
    coef: B::Tensor,
    host_coef: Vec<f32>,
    /// What `backward` propagates: `coef` times the gradient scale.
    d_coef: B::Tensor,
    weighted: B::Tensor,
    /// The loss, one element.
    pub loss: B::Tensor,
}

impl<B: Backend> CrossEntropy<B> {
    pub fn new(b: &B, rows: usize, vocab: usize) -> Self {
        CrossEntropy {
            rows,
            vocab,
            logp: b.zeros(rows),
            lse: b.zeros(rows),
            coef: b.zeros(rows),
            host_coef: vec![0.0; rows],
            d_coef: b.zeros(rows),
            weighted: b.zeros(rows),
            loss: b.zeros(1),
        }
    }

    /// Sets the row weights (0 = ignore the row) and the loss scale.
    pub fn set_weights(&mut self, b: &B, weights: &[f32], scale: f32) {
        assert_eq!(weights.len(), self.rows, "one weight per row");
        let total: f32 = weights.iter().sum();
        let norm = if total > 0.0 { scale / total } else { 0.0 };
        self.host_coef = weights.iter().map(|w| -w * norm).collect();
        b.write(&mut self.coef, &self.host_coef);
        b.write(&mut self.d_coef, &self.host_coef);
    }

    /// Scales what `backward` propagates, not the loss: for a weighted sum
    /// of losses whose parts are still reported on their own scale.
    pub fn set_gradient_scale(&mut self, b: &B, factor: f32) {
        let d: Vec<f32> = self.host_coef.iter().map(|c| c * factor).collect();
        b.write(&mut self.d_coef, &d);
    }

    /// What `backward` needs; with `with_loss`, the loss too (a step
    /// that does not log it skips its reduction).
    pub fn forward(
        &mut self,
        b: &B,
        logits: &B::Tensor,
        targets: &B::Ids,
        subsets: &VocabSubsets<B>,
        with_loss: bool,
    ) {
        b.log_softmax_gather(
            logits,
            targets,
            subsets,
            self.vocab,
            &mut self.logp,
            &mut self.lse,
        );
        if with_loss {
            b.mul(1.0, &self.coef, &self.logp, &mut self.weighted);
            b.reduce(&self.weighted, Reduce::Sum, &mut self.loss, 0);
        }
    }

    /// dlogits (+)= d loss / d logits. Call after `forward` on the same logits.
    pub fn backward(
        &self,
        b: &B,
        logits: &B::Tensor,
        targets: &B::Ids,
        subsets: &VocabSubsets<B>,
        dlogits: &mut B::Tensor,
        accumulate: bool,
    ) {
        b.log_softmax_gather_backward(
            logits,
            targets,
            subsets,
            self.vocab,
            &self.lse,
            &self.d_coef,
            dlogits,
            accumulate,
        );
    }

    pub fn read_loss(&self, b: &B) -> f32 {
        b.to_vec(&self.loss)[0]
    }
}
