//! The LSTM run one token at a time: each layer keeps its cell and hidden
//! states in two slots per row, `[rows, 2, hidden]`, read from one and
//! written to the other in turn, so a step copies nothing.

use super::{Lstm, Sizes, strided};
use crate::backend::{Backend, HeadLayout, LstmStep, Matmul};
use crate::captioner::decoder::Stepper;

pub(super) struct LstmStepper<'m, B: Backend> {
    net: &'m Lstm<B>,
    rows: usize,
    /// The slot (0 or 1) holding the current states.
    current: usize,
    /// Per layer: cell and hidden states, `[rows, 2, hidden]`.
    cells: Vec<B::Tensor>,
    states: Vec<B::Tensor>,
    spare: B::Tensor,
    gates: B::Tensor,
    gate_bias: Vec<B::Tensor>,
    features: B::Tensor,
    /// `[rows, hidden]`: the image projection, then each step's token
    /// embeddings.
    input: B::Tensor,
    logit_bias: B::Tensor,
    logits: B::Tensor,
}

impl<'m, B: Backend> LstmStepper<'m, B> {
    pub(super) fn new(b: &B, net: &'m Lstm<B>, rows: usize) -> Self {
        let c = &net.config;
        let h = c.decoder.width;
        let g = Sizes::new(c, rows, 0).gates;
        let layers = net.layers.len();
        let mut gate_bias: Vec<_> = (0..layers).map(|_| b.zeros(g)).collect();
        net.gate_biases(b, &mut gate_bias);
        let mut logit_bias = b.zeros(c.vocab_size);
        net.output.bias(b, &net.params, &mut logit_bias);
        LstmStepper {
            net,
            rows,
            current: 0,
            cells: (0..layers).map(|_| b.zeros(rows * 2 * h)).collect(),
            states: (0..layers).map(|_| b.zeros(rows * 2 * h)).collect(),
            spare: b.zeros(rows * 2 * h),
            gates: b.zeros(rows * g),
            gate_bias,
            features: b.zeros(rows * c.embed_dim),
            input: b.zeros(rows * h),
            logit_bias,
            logits: b.zeros(rows * c.vocab_size),
        }
    }

    fn hidden(&self) -> usize {
        self.net.config.decoder.width
    }

    /// One step of every layer on `self.input`; the states move to the
    /// other slot.
    fn step(&mut self, b: &B) {
        let (h, rows, p) = (self.hidden(), self.rows, &self.net.params);
        let (prev, next) = (self.current, 1 - self.current);
        let cell = self.net.config.lstm.map(|l| l.cell()).unwrap_or_default();
        let step = LstmStep::between_slots(cell, rows, h, prev);
        let g = step.row();
        for (l, layer) in self.net.layers.iter().enumerate() {
            // The layer's input: the step's, or the layer below's new states.
            let (below, this) = self.states.split_at_mut(l);
            let (input, from) = match below.last() {
                Some(states) => (states, strided(next * h, 2 * h)),
                None => (&self.input, strided(0, 0)),
            };
            b.matmul_bias(
                input,
                p.value(layer.weight_ih),
                &self.gate_bias[l],
                &mut self.gates,
                &Matmul::new(rows, g, h).trans_b().with_a(from),
            );
            let states = &mut this[0];
            b.matmul(
                states,
                p.value(layer.weight_hh),
                &mut self.gates,
                &Matmul::new(rows, g, h)
                    .trans_b()
                    .accumulate()
                    .with_a(strided(prev * h, 2 * h)),
            );
            b.lstm_cell(&mut self.gates, &mut self.cells[l], states, &step);
        }
        self.current = next;
    }
}

impl<B: Backend> Stepper<B> for LstmStepper<'_, B> {
    /// The image projection: every layer's hidden state, or the input of
    /// a first step from zero states.
    fn start(&mut self, b: &B, features: &[f32]) {
        b.write(&mut self.features, features);
        self.net
            .project_image(b, &self.features, &mut self.input, self.rows);
        self.current = 0;
        for (cells, states) in self.cells.iter_mut().zip(&mut self.states) {
            b.fill(cells, 0.0);
            b.fill(states, 0.0);
        }
        if self.net.image_is_state() {
            let slot0 = HeadLayout {
                batch: self.rows,
                seq: 1,
                heads: 1,
                head_dim: self.hidden(),
                row_stride: 2 * self.hidden(),
                col_offset: 0,
            };
            for states in &mut self.states {
                b.heads_to_tokens(&self.input, states, &slot0, false);
            }
        } else {
            self.step(b);
        }
    }

    fn advance(&mut self, b: &B, ids: &B::Ids) {
        let (net, h) = (self.net, self.hidden());
        b.embedding(net.params.value(net.embed), ids, &mut self.input, h, false);
        self.step(b);
        let top = self.states.last().expect("an LSTM has a layer");
        let at = strided(self.current * h, 2 * h);
        let (bias, logits) = (&self.logit_bias, &mut self.logits);
        (net.output).forward(b, &net.params, (top, at), bias, logits, self.rows);
    }

    fn logits(&self) -> &B::Tensor {
        &self.logits
    }

    /// Row r takes its parent's cell and hidden states.
    fn reorder(&mut self, b: &B, parents: &B::Ids) {
        let per_row = 2 * self.hidden();
        for state in self.cells.iter_mut().chain(&mut self.states) {
            b.embedding(state, parents, &mut self.spare, per_row, false);
            std::mem::swap(state, &mut self.spare);
        }
    }
}
