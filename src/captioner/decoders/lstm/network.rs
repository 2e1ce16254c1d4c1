//! What the LSTM captioners share as decoders: each is a [`Network`] of
//! weights that runs a batch in a workspace of its own, and [`Recurrent`]
//! keeps a workspace per batch shape and makes it a [`Decoder`].

use crate::backend::Backend;
use crate::captioner::CaptionerConfig;
use crate::captioner::decoder::{Decoder, Stepper};
use crate::captioner::inputs::{TokenInputs, Workspaces};
use crate::model::params::Params;
use anyhow::Result;
use std::marker::PhantomData;

pub trait Network<B: Backend> {
    /// The activations of one batch shape.
    type Workspace;

    fn config(&self) -> &CaptionerConfig;

    fn params(&self) -> &Params<B>;

    fn params_mut(&mut self) -> &mut Params<B>;

    /// Whether the parameter `name` is the adapter between the image and
    /// the decoder proper.
    fn is_adapter(&self, name: &str) -> bool;

    fn workspace(&self, b: &B, batch: usize, positions: usize) -> Self::Workspace;

    fn forward(&self, b: &B, images: &[f32], inputs: &TokenInputs<B>, ws: &mut Self::Workspace);

    fn backward(
        &mut self,
        b: &B,
        inputs: &TokenInputs<B>,
        d_logits: &B::Tensor,
        ws: &mut Self::Workspace,
    );

    fn logits(ws: &Self::Workspace) -> &B::Tensor;

    fn stepper<'m>(&'m self, b: &B, rows: usize) -> Box<dyn Stepper<B> + 'm>;
}

/// A [`Network`] as a decoder.
pub struct Recurrent<B: Backend, N: Network<B>> {
    net: N,
    workspaces: Workspaces<N::Workspace>,
    backend: PhantomData<fn() -> B>,
}

impl<B: Backend, N: Network<B>> Recurrent<B, N> {
    pub fn new(net: N) -> Self {
        Recurrent {
            net,
            workspaces: Workspaces::default(),
            backend: PhantomData,
        }
    }
}

impl<B: Backend, N: Network<B>> Decoder<B> for Recurrent<B, N> {
    fn params(&self) -> &Params<B> {
        self.net.params()
    }

    fn params_mut(&mut self) -> &mut Params<B> {
        self.net.params_mut()
    }

    fn is_adapter(&self, i: usize) -> bool {
        self.net.is_adapter(&self.net.params().specs[i].name)
    }

    fn logits(&self) -> &B::Tensor {
        N::logits(self.workspaces.current())
    }

    fn stepper(&self, b: &B, rows: usize, _steps: usize) -> Box<dyn Stepper<B> + '_> {
        self.net.stepper(b, rows)
    }

    /// The images are `[batch, image_input_len]`: an embedding, or tokens.
    fn forward(&mut self, b: &B, images: &[f32], inputs: &TokenInputs<B>) -> Result<()> {
        assert_eq!(
            images.len(),
            inputs.batch * self.net.config().image_input_len(),
            "one image input per sequence"
        );
        if !self.workspaces.select(inputs) {
            let ws = self.net.workspace(b, inputs.batch, inputs.positions);
            self.workspaces.add(inputs, ws);
        }
        let ws = self.workspaces.current_for(inputs);
        self.net.forward(b, images, inputs, ws);
        Ok(())
    }

    fn backward(&mut self, b: &B, inputs: &TokenInputs<B>, d_logits: &B::Tensor) {
        let ws = self.workspaces.current_for(inputs);
        self.net.backward(b, inputs, d_logits, ws);
    }
}
