//! The captioner: its configuration and a decoder of one family
//! ([`super::decoder::Decoder`]); what every family shares is in
//! [`super::inputs`].

use super::CaptionerConfig;
use super::decoder::Stepper;
use super::decoders::Family;
use super::inputs::TokenInputs;
use crate::backend::Backend;
use crate::model::params::Params;
use anyhow::Result;

/// A captioner: its shape, and its decoder with the weights.
pub struct Captioner<B: Backend> {
    pub config: CaptionerConfig,
    decoder: Family<B>,
}

impl<B: Backend> Captioner<B> {
    /// A model with fresh weights from `seed`.
    pub fn new(b: &B, config: CaptionerConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        Ok(Captioner {
            decoder: Family::new(b, config, seed),
            config,
        })
    }

    pub fn params(&self) -> &Params<B> {
        self.decoder.get().params()
    }

    pub fn params_mut(&mut self) -> &mut Params<B> {
        self.decoder.get_mut().params_mut()
    }

    /// Whether parameter `i` (in `params` order) is the adapter's: what
    /// `--freeze-decoder` trains.
    pub fn is_adapter(&self, i: usize) -> bool {
        self.decoder.get().is_adapter(i)
    }

    /// logits = the decoder on `images` (one image input per sequence)
    /// and the given token inputs ([`Decoder::forward`]).
    pub fn forward(&mut self, b: &B, images: &[f32], inputs: &TokenInputs<B>) -> Result<()> {
        self.decoder.get_mut().forward(b, images, inputs)
    }

    /// The logits of the last `forward`, `[inputs.rows(), vocab]`: row
    /// b * positions + t predicts token t + 1 of sequence b.
    pub fn logits(&self) -> &B::Tensor {
        self.decoder.get().logits()
    }

    /// Parameter gradients (+)= those of a loss whose gradient w.r.t. the
    /// logits of the last `forward` (on these `inputs`) is `d_logits`.
    /// Zero them first.
    pub fn backward(&mut self, b: &B, inputs: &TokenInputs<B>, d_logits: &B::Tensor) {
        self.decoder.get_mut().backward(b, inputs, d_logits)
    }

    /// The decoder run incrementally on `rows` sequences of at most
    /// `steps` token positions ([`Decoder::stepper`]).
    pub fn stepper(&self, b: &B, rows: usize, steps: usize) -> Box<dyn Stepper<B> + '_> {
        self.decoder.get().stepper(b, rows, steps)
    }
}
