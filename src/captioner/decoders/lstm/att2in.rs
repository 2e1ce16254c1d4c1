//! Att2in (Rennie et al., 2017, "Self-critical Sequence Training for Image
//! Captioning"): one LSTM whose previous hidden state queries additive
//! attention over the image tokens, the attended context entering only
//! the cell's input (the g gate):
//!
//! ```text
//! a = softmax_n(alpha_net . tanh(k_n + h2att(h_prev))),  c = sum_n a_n v_n
//! gates = lstm's own (word, h_prev) + [0; 0; a2c(c); 0]
//! ```
//!
//! from zero states, the tokens embedded and keyed as the top-down model
//! does ([`super::tokens`]). The context's product writes the g gate's
//! columns of the gates in place.
//!
//! Self-critical training's Att2in2 (its code's) has its maxout cell: five
//! chunks of gates, and the context, `a2c` `[2h, h]`, in both of the cell
//! input's candidates; and a ReLU after the word embedding.

use super::network::{Network, Recurrent};
use super::output::Output;
use super::tokens::{Cell, Image, ImageGrads, Linear, TokenLayers, Words, linear, spread};
use super::{Sizes, strided};
use crate::backend::{Backend, CellGates, HeadLayout, LstmStep, Matmul, Operand};
use crate::captioner::CaptionerConfig;
use crate::captioner::decoder::Stepper;
use crate::captioner::inputs::TokenInputs;
use crate::model::params::{ParamId, Params};
use crate::ops::additive_attention::{AdditiveAttention, AdditiveShape, Rows};

pub type Att2inDecoder<B> = Recurrent<B, Att2in<B>>;

pub struct Att2in<B: Backend> {
    config: CaptionerConfig,
    params: Params<B>,
    image_layers: TokenLayers,
    words: Words,
    lstm: Cell,
    /// `[h, h]`: the context into the g gate (`[2h, h]` into the maxout
    /// cell's two candidates).
    a2c: Linear,
    h2att: Linear,
    /// `[1, h]`.
    alpha_net: ParamId,
    output: Output<B>,
}

/// The columns of a row of gates that the context enters: the g gate's
/// `[2h, 3h)` of PyTorch's cell, the candidates' `[3h, 5h)` of the maxout
/// cell.
fn context_columns(cell: CellGates, h: usize) -> HeadLayout {
    let (col_offset, head_dim) = match cell {
        CellGates::Lstm => (2 * h, h),
        CellGates::Maxout => (3 * h, 2 * h),
    };
    HeadLayout {
        batch: 1,
        seq: 1,
        heads: 1,
        head_dim,
        row_stride: cell.chunks() * h,
        col_offset,
    }
}

pub struct Workspace<B: Backend> {
    sizes: Sizes,
    image: Image<B>,
    image_grads: ImageGrads<B>,
    attention: AdditiveAttention<B>,
    /// `[batch, positions, h]`: the words' vectors, and before their ReLU.
    tokens: B::Tensor,
    words_pre: B::Tensor,
    gates: B::Tensor,
    cells: B::Tensor,
    states: B::Tensor,
    /// A row of gates: the cell's biases and the context's.
    bias: B::Tensor,
    query: B::Tensor,
    d_query: B::Tensor,
    /// `[batch, positions, h]`: each position's context.
    contexts: B::Tensor,
    d_context: B::Tensor,
    top: B::Tensor,
    logit_bias: B::Tensor,
    logits: B::Tensor,
    d_top: B::Tensor,
    d_states: B::Tensor,
    d_cell: B::Tensor,
    d_gates: B::Tensor,
    packed: B::Tensor,
    d_tokens: B::Tensor,
    /// A row of gates, and the context's columns: the gates' gradient
    /// summed over the rows, and the context's part (its bias's gradient).
    gate_sums: B::Tensor,
    context_sums: B::Tensor,
}

impl<B: Backend> Workspace<B> {
    fn new(b: &B, c: &CaptionerConfig, batch: usize, positions: usize) -> Self {
        // No step before the first token: the image is attended to.
        let z = Sizes::new(c, batch, positions);
        let (h, t, v, g) = (z.hidden, positions, c.vocab_size, z.gates);
        let shape = AdditiveShape {
            batch,
            tokens: c.image_tokens,
            width: h,
            values: h,
        };
        Workspace {
            sizes: z,
            image: Image::new(b, c, batch),
            image_grads: ImageGrads::new(b, c, batch),
            attention: AdditiveAttention::new(b, shape),
            tokens: b.zeros(batch * t * h),
            words_pre: b.zeros(batch * t * h),
            gates: b.zeros(batch * t * g),
            cells: b.zeros(batch * (t + 1) * h),
            states: b.zeros(batch * (t + 1) * h),
            bias: b.zeros(g),
            query: b.zeros(batch * h),
            d_query: b.zeros(batch * h),
            contexts: b.zeros(batch * t * h),
            d_context: b.zeros(batch * h),
            top: b.zeros(batch * t * h),
            logit_bias: b.zeros(v),
            logits: b.zeros(batch * t * v),
            d_top: b.zeros(batch * t * h),
            d_states: b.zeros(batch * (t + 1) * h),
            d_cell: b.zeros(batch * h),
            d_gates: b.zeros(batch * t * g),
            packed: b.zeros(batch * t * h),
            d_tokens: b.zeros(batch * t * h),
            gate_sums: b.zeros(g),
            context_sums: b.zeros(context_columns(z.cell, h).head_dim),
        }
    }
}

impl<B: Backend> Att2in<B> {
    /// Fresh weights from `seed`, for a validated `config`.
    pub fn new(b: &B, config: CaptionerConfig, seed: u64) -> Self {
        let c = &config;
        let h = c.decoder.width;
        let mut p = Params::new(seed);
        let image_layers = TokenLayers::new(&mut p, c);
        let words = Words::new(&mut p, c);
        let cell = c.lstm.map(|l| l.cell()).unwrap_or_default();
        let lstm = Cell::new(&mut p, "core.lstm", h, h, cell);
        let a2c = linear(&mut p, "core.a2c", context_columns(cell, h).head_dim, h);
        let h2att = linear(&mut p, "core.attention.h2att", h, h);
        let alpha_net = p.add(
            "core.attention.alpha_net.weight".into(),
            &[1, h],
            spread(h),
            true,
        );
        let output = Output::new(b, &mut p, c);
        p.finish(b);
        Att2in {
            config,
            params: p,
            image_layers,
            words,
            lstm,
            a2c,
            h2att,
            alpha_net,
            output,
        }
    }

    fn hidden(&self) -> usize {
        self.config.decoder.width
    }

    fn cell(&self) -> CellGates {
        self.config.lstm.map(|l| l.cell()).unwrap_or_default()
    }

    /// The columns the context enters.
    fn context_columns(&self) -> HeadLayout {
        context_columns(self.cell(), self.hidden())
    }

    /// A row of gates: the cell's two biases, and the context's.
    fn gate_bias(&self, b: &B, out: &mut B::Tensor) {
        let p = &self.params;
        self.lstm.bias(b, p, out);
        b.heads_to_tokens(p.value(self.a2c.1), out, &self.context_columns(), true);
    }

    /// `[rows, h]` queries of the hidden states `states` (rows at `at`).
    fn query(&self, b: &B, states: &B::Tensor, at: Rows, rows: usize, out: &mut B::Tensor) {
        let (p, h) = (&self.params, self.hidden());
        let (w, bias) = self.h2att;
        let shape = Matmul::new(rows, h, h)
            .trans_b()
            .with_a(strided(at.offset, at.stride));
        b.matmul_bias(states, p.value(w), p.value(bias), out, &shape);
    }

    /// The context rows `context` into their columns of the gate rows
    /// `gates`.
    fn context_into_gates(
        &self,
        b: &B,
        context: (&B::Tensor, Rows),
        gates: (&mut B::Tensor, Rows),
        rows: usize,
    ) {
        let (h, columns) = (self.hidden(), self.context_columns());
        let (at, into) = (context.1, gates.1);
        let shape = Matmul::new(rows, columns.head_dim, h)
            .trans_b()
            .accumulate()
            .with_a(strided(at.offset, at.stride))
            .with_c(strided(into.offset + columns.col_offset, into.stride));
        b.matmul(context.0, self.params.value(self.a2c.0), gates.0, &shape);
    }
}

impl<B: Backend> Network<B> for Att2in<B> {
    type Workspace = Workspace<B>;

    fn config(&self) -> &CaptionerConfig {
        &self.config
    }

    fn params(&self) -> &Params<B> {
        &self.params
    }

    fn params_mut(&mut self) -> &mut Params<B> {
        &mut self.params
    }

    /// The image tokens' embedding and keys are the adapter.
    fn is_adapter(&self, name: &str) -> bool {
        TokenLayers::is_adapter(name)
    }

    fn workspace(&self, b: &B, batch: usize, positions: usize) -> Workspace<B> {
        Workspace::new(b, &self.config, batch, positions)
    }

    fn forward(&self, b: &B, features: &[f32], inputs: &TokenInputs<B>, ws: &mut Workspace<B>) {
        let (c, p, z) = (&self.config, &self.params, ws.sizes);
        let (h, t) = (z.hidden, z.positions);
        (self.image_layers).forward(b, p, c, features, &mut ws.image);
        let (pre, tokens) = (&mut ws.words_pre, &mut ws.tokens);
        (self.words).forward(b, p, &inputs.ids.ids, pre, tokens, h);
        self.gate_bias(b, &mut ws.bias);
        let g = z.gates;
        let words = Matmul::new(z.batch * t, g, h).trans_b();
        b.matmul_bias(
            &ws.tokens,
            p.value(self.lstm.weight_ih),
            &ws.bias,
            &mut ws.gates,
            &words,
        );
        let weights = (&ws.image.keys, &ws.image.values, p.value(self.alpha_net));
        for step in 0..t {
            let previous = Rows {
                offset: step * h,
                stride: (t + 1) * h,
            };
            self.query(b, &ws.states, previous, z.batch, &mut ws.query);
            let context = Rows {
                offset: step * h,
                stride: t * h,
            };
            let query = (&ws.query, Rows::packed(h));
            ws.attention
                .forward(b, weights, query, (&mut ws.contexts, context));
            let gates_at = Rows {
                offset: step * g,
                stride: t * g,
            };
            self.context_into_gates(
                b,
                (&ws.contexts, context),
                (&mut ws.gates, gates_at),
                z.batch,
            );
            if step > 0 {
                let recurrent = z.recurrent(step).trans_b().accumulate();
                b.matmul(
                    &ws.states,
                    p.value(self.lstm.weight_hh),
                    &mut ws.gates,
                    &recurrent,
                );
            }
            b.lstm_cell(&mut ws.gates, &mut ws.cells, &mut ws.states, &z.step(step));
        }
        b.tokens_to_heads(&ws.states, &mut ws.top, &z.slots(1, t));
        self.output.bias(b, p, &mut ws.logit_bias);
        let top = (&ws.top, Operand::packed(0));
        (self.output).forward(b, p, top, &ws.logit_bias, &mut ws.logits, z.batch * t);
    }

    fn backward(
        &mut self,
        b: &B,
        inputs: &TokenInputs<B>,
        d_logits: &B::Tensor,
        ws: &mut Workspace<B>,
    ) {
        let z = ws.sizes;
        let (h, t, g) = (z.hidden, z.positions, z.gates);
        let rows = z.batch * t;
        let columns = self.context_columns();
        let p = &mut self.params;
        (self.output).backward(b, p, d_logits, &ws.top, &mut ws.d_top, rows);
        b.fill(&mut ws.d_states, 0.0);
        b.fill(&mut ws.d_cell, 0.0);
        ws.image_grads.zero(b);
        b.heads_to_tokens(&ws.d_top, &mut ws.d_states, &z.slots(1, t), false);
        for step in (0..t).rev() {
            b.lstm_cell_backward(
                &ws.gates,
                &ws.cells,
                &ws.d_states,
                &mut ws.d_cell,
                &mut ws.d_gates,
                &z.step(step),
            );
            let p = &self.params;
            if step > 0 {
                let recurrent = z.recurrent_backward(step).accumulate();
                b.matmul(
                    &ws.d_gates,
                    p.value(self.lstm.weight_hh),
                    &mut ws.d_states,
                    &recurrent,
                );
            }
            // The context's gradient from its columns'.
            let at = strided(step * g + columns.col_offset, t * g);
            let to_context = Matmul::new(z.batch, h, columns.head_dim).with_a(at);
            b.matmul(
                &ws.d_gates,
                p.value(self.a2c.0),
                &mut ws.d_context,
                &to_context,
            );
            let previous = Rows {
                offset: step * h,
                stride: (t + 1) * h,
            };
            self.query(b, &ws.states, previous, z.batch, &mut ws.query);
            let p = &mut self.params;
            let (values, d_alpha) = p.for_backward_one(self.alpha_net);
            let grads = &mut ws.image_grads;
            ws.attention.backward(
                b,
                (&ws.image.keys, &ws.image.values, &values[self.alpha_net.0]),
                (&ws.query, Rows::packed(h)),
                (&ws.d_context, Rows::packed(h)),
                &mut ws.d_query,
                (&mut grads.d_keys, &mut grads.d_values, d_alpha),
            );
            // The query came from the previous hidden state (slot `step`).
            let h_prev = strided(step * h, (t + 1) * h);
            let (w, bias) = self.h2att;
            let to_state = Matmul::new(z.batch, h, h).with_c(h_prev).accumulate();
            b.matmul(&ws.d_query, p.value(w), &mut ws.d_states, &to_state);
            let d_weight = Matmul::new(h, h, z.batch)
                .trans_a()
                .with_b(h_prev)
                .accumulate();
            b.matmul(&ws.d_query, &ws.states, p.grad(w), &d_weight);
            b.column_sum(&ws.d_query, z.batch, h, p.grad(bias), true);
        }
        let p = &mut self.params;
        let cell = &self.lstm;
        let weight_grad = Matmul::new(g, h, rows).trans_a().accumulate();
        b.tokens_to_heads(&ws.states, &mut ws.packed, &z.slots(0, t));
        b.matmul(
            &ws.d_gates,
            &ws.packed,
            p.grad(cell.weight_hh),
            &weight_grad,
        );
        b.matmul(
            &ws.d_gates,
            &ws.tokens,
            p.grad(cell.weight_ih),
            &weight_grad,
        );
        b.column_sum(&ws.d_gates, rows, g, &mut ws.gate_sums, false);
        b.axpby(1.0, &ws.gate_sums, 1.0, p.grad(cell.bias_ih));
        b.axpby(1.0, &ws.gate_sums, 1.0, p.grad(cell.bias_hh));
        // The context layer: its weight from its columns' gradients, its
        // bias their sum.
        let (w, bias) = self.a2c;
        let d_a2c = Matmul::new(columns.head_dim, h, rows)
            .trans_a()
            .accumulate()
            .with_a(strided(columns.col_offset, g));
        b.matmul(&ws.d_gates, &ws.contexts, p.grad(w), &d_a2c);
        b.tokens_to_heads(&ws.gate_sums, &mut ws.context_sums, &columns);
        b.axpby(1.0, &ws.context_sums, 1.0, p.grad(bias));
        let to_words = Matmul::new(rows, h, g);
        b.matmul(
            &ws.d_gates,
            p.value(cell.weight_ih),
            &mut ws.d_tokens,
            &to_words,
        );
        // d_top is spent (it went into d_states): the words' scratch.
        let scratch = &mut ws.d_top;
        (self.words).backward(b, p, &inputs.ids, &ws.words_pre, &ws.d_tokens, scratch, h);
        (self.image_layers).backward(b, p, &self.config, &ws.image, &mut ws.image_grads);
    }

    fn logits(ws: &Workspace<B>) -> &B::Tensor {
        &ws.logits
    }

    fn stepper<'m>(&'m self, b: &B, rows: usize) -> Box<dyn Stepper<B> + 'm> {
        Box::new(Att2inStepper::new(b, self, rows))
    }
}

/// One position at a time, the cell's states in two slots per row.
struct Att2inStepper<'m, B: Backend> {
    net: &'m Att2in<B>,
    rows: usize,
    current: usize,
    image: Image<B>,
    attention: AdditiveAttention<B>,
    bias: B::Tensor,
    cells: B::Tensor,
    states: B::Tensor,
    spare: B::Tensor,
    word: B::Tensor,
    word_pre: B::Tensor,
    gates: B::Tensor,
    query: B::Tensor,
    context: B::Tensor,
    logit_bias: B::Tensor,
    logits: B::Tensor,
}

impl<'m, B: Backend> Att2inStepper<'m, B> {
    fn new(b: &B, net: &'m Att2in<B>, rows: usize) -> Self {
        let c = &net.config;
        let h = net.hidden();
        let g = net.cell().chunks() * h;
        let mut bias = b.zeros(g);
        net.gate_bias(b, &mut bias);
        let mut logit_bias = b.zeros(c.vocab_size);
        net.output.bias(b, &net.params, &mut logit_bias);
        let shape = AdditiveShape {
            batch: rows,
            tokens: c.image_tokens,
            width: h,
            values: h,
        };
        Att2inStepper {
            net,
            rows,
            current: 0,
            image: Image::new(b, c, rows),
            attention: AdditiveAttention::new(b, shape),
            bias,
            cells: b.zeros(rows * 2 * h),
            states: b.zeros(rows * 2 * h),
            spare: b.zeros(rows * 2 * h),
            word: b.zeros(rows * h),
            word_pre: b.zeros(rows * h),
            gates: b.zeros(rows * g),
            query: b.zeros(rows * h),
            context: b.zeros(rows * h),
            logit_bias,
            logits: b.zeros(rows * c.vocab_size),
        }
    }
}

impl<B: Backend> Stepper<B> for Att2inStepper<'_, B> {
    fn start(&mut self, b: &B, features: &[f32]) {
        let net = self.net;
        (net.image_layers).forward(b, &net.params, &net.config, features, &mut self.image);
        b.fill(&mut self.cells, 0.0);
        b.fill(&mut self.states, 0.0);
        self.current = 0;
    }

    fn advance(&mut self, b: &B, ids: &B::Ids) {
        let (net, rows) = (self.net, self.rows);
        let (p, h) = (&net.params, net.hidden());
        let (prev, next) = (self.current, 1 - self.current);
        let was = Rows {
            offset: prev * h,
            stride: 2 * h,
        };
        net.query(b, &self.states, was, rows, &mut self.query);
        let weights = (&self.image.keys, &self.image.values, p.value(net.alpha_net));
        let (query, context) = ((&self.query, Rows::packed(h)), Rows::packed(h));
        self.attention
            .forward(b, weights, query, (&mut self.context, context));
        (net.words).forward(b, p, ids, &mut self.word_pre, &mut self.word, h);
        let step = LstmStep::between_slots(net.cell(), rows, h, prev);
        let gates = Matmul::new(rows, step.row(), h).trans_b();
        b.matmul_bias(
            &self.word,
            p.value(net.lstm.weight_ih),
            &self.bias,
            &mut self.gates,
            &gates,
        );
        net.context_into_gates(
            b,
            (&self.context, context),
            (&mut self.gates, Rows::packed(step.row())),
            rows,
        );
        let recurrent = gates.accumulate().with_a(strided(was.offset, was.stride));
        b.matmul(
            &self.states,
            p.value(net.lstm.weight_hh),
            &mut self.gates,
            &recurrent,
        );
        b.lstm_cell(&mut self.gates, &mut self.cells, &mut self.states, &step);
        self.current = next;
        let (bias, logits) = (&self.logit_bias, &mut self.logits);
        (net.output).forward(
            b,
            p,
            (&self.states, strided(next * h, 2 * h)),
            bias,
            logits,
            rows,
        );
    }

    fn logits(&self) -> &B::Tensor {
        &self.logits
    }

    /// Row r takes its parent's states; the image side is its image's.
    fn reorder(&mut self, b: &B, parents: &B::Ids) {
        let per_row = 2 * self.net.hidden();
        for state in [&mut self.cells, &mut self.states] {
            b.embedding(state, parents, &mut self.spare, per_row, false);
            std::mem::swap(state, &mut self.spare);
        }
    }
}
