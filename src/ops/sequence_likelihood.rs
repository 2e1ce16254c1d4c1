//! REINFORCE's surrogate loss over whole sequences (sampled captions):
//!   loss = -(1/N) sum_b w_b sum_t log p(y_bt)
//! over each sequence's real tokens (ids other than padding), with one
//! weight per sequence of any sign (an advantage) that stays on the device,
//! and a normaliser N (the number of sequences, usually). Unlike
//! `CrossEntropy`, nothing is renormalised by the sum of the weights: a
//! batch whose advantages sum to zero or less still has its gradient.

use crate::backend::{Backend, Reduce, VocabSubsets};

pub struct SequenceLikelihood<B: Backend> {
    pub rows: usize,
    /// Rows (token positions) per sequence.
    pub per_sequence: usize,
    pub vocab: usize,
    pad: u32,
    /// log p(target) per row, full vocabulary.
    pub logp: B::Tensor,
    lse: B::Tensor,
    /// d loss / d logp[r]: -w_b / N on real tokens, 0 on padding.
    coef: B::Tensor,
    weighted: B::Tensor,
    full: VocabSubsets<B>,
    /// The loss, one element.
    pub loss: B::Tensor,
}

impl<B: Backend> SequenceLikelihood<B> {
    /// For `sequences` sequences of `per_sequence` rows over `vocab`
    /// tokens; rows whose target is `pad` do not count.
    pub fn new(b: &B, sequences: usize, per_sequence: usize, vocab: usize, pad: u32) -> Self {
        let rows = sequences * per_sequence;
        SequenceLikelihood {
            rows,
            per_sequence,
            vocab,
            pad,
            logp: b.zeros(rows),
            lse: b.zeros(rows),
            coef: b.zeros(rows),
            weighted: b.zeros(rows),
            full: VocabSubsets::full(b, rows),
            loss: b.zeros(1),
        }
    }

    /// The loss of `logits` (`[rows, vocab]`) for `targets` (`[rows]`)
    /// with per-sequence `weights` (`[sequences]`) and normaliser N.
    pub fn forward(
        &mut self,
        b: &B,
        logits: &B::Tensor,
        targets: &B::Ids,
        weights: &B::Tensor,
        normaliser: f32,
    ) {
        b.log_softmax_gather(
            logits,
            targets,
            &self.full,
            self.vocab,
            &mut self.logp,
            &mut self.lse,
        );
        b.spread_sequence_weights(
            weights,
            targets,
            self.per_sequence,
            self.pad,
            -1.0 / normaliser,
            &mut self.coef,
        );
        b.mul(1.0, &self.coef, &self.logp, &mut self.weighted);
        b.reduce(&self.weighted, Reduce::Sum, &mut self.loss, 0);
    }

    /// dlogits (+)= d loss / d logits. Call after `forward` on the same inputs.
    pub fn backward(
        &self,
        b: &B,
        logits: &B::Tensor,
        targets: &B::Ids,
        dlogits: &mut B::Tensor,
        accumulate: bool,
    ) {
        b.log_softmax_gather_backward(
            logits, targets, &self.full, self.vocab, &self.lse, &self.coef, dlogits, accumulate,
        );
    }
}
