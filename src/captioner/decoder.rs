//! The decoder interface: what training, decoding, explaining and export
//! need from a caption decoder, whatever its family. A family (the prefix
//! transformer today; cross-attention and recurrent decoders fit the same
//! shape) is one type implementing [`Decoder`], and its incremental form
//! one implementing [`Stepper`]; nothing outside its file knows how it
//! reads the image or where its weights sit.
//!
//! Every family speaks the captioner's policy: logits over the whole
//! vocabulary with [`super::inputs::MASKED_LOGIT`] at the ids no caption
//! contains (`SpecialIds::masked`), so that losses, samples and
//! explanations all read the distribution captions are generated from.

use super::inputs::TokenInputs;
use crate::backend::Backend;
use crate::model::params::Params;
use anyhow::Result;

/// A caption decoder with its weights and the activations of the batch
/// shapes it has run (weights live once; a batch's buffers are its own).
pub trait Decoder<B: Backend> {
    fn params(&self) -> &Params<B>;

    fn params_mut(&mut self) -> &mut Params<B>;

    /// Whether parameter `i` (in `params` order) belongs to the adapter
    /// between the image and the decoder proper: what
    /// `train --freeze-decoder` still trains.
    fn is_adapter(&self, i: usize) -> bool;

    /// Teacher forcing: the logits of every token position of `inputs`,
    /// given one image input per sequence (`images`, `[batch, width]`).
    fn forward(&mut self, b: &B, images: &[f32], inputs: &TokenInputs<B>) -> Result<()>;

    /// The logits of the last `forward`, `[inputs.rows(), vocab]`: row
    /// `b * positions + t` predicts token `t + 1` of sequence `b`.
    fn logits(&self) -> &B::Tensor;

    /// Parameter gradients (+)= those of a loss whose gradient w.r.t. the
    /// logits of the last `forward` (on these `inputs`) is `d_logits`.
    /// The caller zeroes them first.
    fn backward(&mut self, b: &B, inputs: &TokenInputs<B>, d_logits: &B::Tensor);

    /// The decoder run one token position at a time on `rows` sequences
    /// of at most `steps` token positions, with the current weights.
    fn stepper(&self, b: &B, rows: usize, steps: usize) -> Box<dyn Stepper<B> + '_>;
}

/// A decoder run incrementally, as generation runs it: its cache of the
/// positions so far, one row per sequence.
pub trait Stepper<B: Backend> {
    /// Starts a batch, one image input per row (`[rows, width]`): what
    /// every position after it reads is computed here, once.
    fn start(&mut self, b: &B, images: &[f32]);

    /// Runs the next token position on `ids` (one per row); [`Stepper::logits`]
    /// become the logits of the token after it.
    fn advance(&mut self, b: &B, ids: &B::Ids);

    /// `[rows, vocab]`: the policy's logits after the last `advance`.
    fn logits(&self) -> &B::Tensor;

    /// Row `r` continues from row `parents[r]` (beam search): the cached
    /// positions follow their parents.
    fn reorder(&mut self, b: &B, parents: &B::Ids);
}
