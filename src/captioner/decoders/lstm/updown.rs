//! Top-down attention (Anderson et al., 2018, "Bottom-Up and Top-Down
//! Attention for Image Captioning and Visual Question Answering") over a
//! vision tower's image tokens, named as self-critical training's
//! implementation names its modules. The tokens are embedded, v_n =
//! ReLU(`att_embed`(x_n)), and projected once into attention keys k_n =
//! `ctx2att`(v_n); v̄ is their mean. Each position runs
//!
//! ```text
//! h1 = att_lstm([h2_prev; v̄; embed(w)], h1_prev)
//! a = softmax_n(alpha_net . tanh(k_n + h2att(h1))),  v̂ = sum_n a_n v_n
//! h2 = lang_lstm([v̂; h1], h2_prev)
//! logits = logit(h2)
//! ```
//!
//! from zero states. Products with a column block of a weight (the three
//! parts of the attention LSTM's input) read the block in place. The
//! image side's gradients are summed over the positions, then taken back
//! through the projections once.

use super::network::{Network, Recurrent};
use super::output::Output;
use super::tokens::{Cell, Image, ImageGrads, Linear, TokenLayers, Words, linear, spread};
use super::{Sizes, strided};
use crate::backend::{Backend, CellGates, LstmStep, Matmul, Operand};
use crate::captioner::CaptionerConfig;
use crate::captioner::decoder::Stepper;
use crate::captioner::inputs::TokenInputs;
use crate::model::params::{ParamId, Params};
use crate::ops::additive_attention::{AdditiveAttention, AdditiveShape, Rows};

pub type UpDownDecoder<B> = Recurrent<B, UpDown<B>>;

pub struct UpDown<B: Backend> {
    config: CaptionerConfig,
    params: Params<B>,
    image_layers: TokenLayers,
    words: Words,
    /// Input `[h2_prev; v̄; word]`: `[4h, 3h]`.
    att_lstm: Cell,
    h2att: Linear,
    /// `[1, h]`.
    alpha_net: ParamId,
    /// Input `[v̂; h1]`: `[4h, 2h]`.
    lang_lstm: Cell,
    output: Output<B>,
}

/// Column block `part` (of `parts`, `h` wide) of a weight `[rows, parts h]`,
/// as a product's operand.
fn block(part: usize, parts: usize, h: usize) -> Operand {
    strided(part * h, parts * h)
}

pub struct Workspace<B: Backend> {
    sizes: Sizes,
    image: Image<B>,
    attention: AdditiveAttention<B>,
    /// `[positions]` ones: broadcasts a row over the positions, sums over them.
    ones: B::Tensor,
    /// `[batch, positions, h]`: the words' vectors, and before their ReLU.
    tokens: B::Tensor,
    words_pre: B::Tensor,
    gates1: B::Tensor,
    cells1: B::Tensor,
    states1: B::Tensor,
    gates2: B::Tensor,
    cells2: B::Tensor,
    states2: B::Tensor,
    /// `[batch, 4h]`: v̄'s part of the attention LSTM's gates.
    mean_gates: B::Tensor,
    bias1: B::Tensor,
    bias2: B::Tensor,
    /// `[batch, h]`: a position's query, and its gradient.
    query: B::Tensor,
    d_query: B::Tensor,
    /// `[batch, positions, h]`: each position's context v̂.
    contexts: B::Tensor,
    d_context: B::Tensor,
    top: B::Tensor,
    logit_bias: B::Tensor,
    logits: B::Tensor,
    d_top: B::Tensor,
    d_states1: B::Tensor,
    d_states2: B::Tensor,
    d_cell1: B::Tensor,
    d_cell2: B::Tensor,
    d_gates1: B::Tensor,
    d_gates2: B::Tensor,
    /// `[batch, positions, h]`: states copied out packed for the weights'
    /// gradients.
    packed: B::Tensor,
    d_tokens: B::Tensor,
    /// `[batch, 4h]`: the attention LSTM's gate gradients summed over the
    /// positions.
    d_mean_gates: B::Tensor,
    d_mean: B::Tensor,
    image_grads: ImageGrads<B>,
}

impl<B: Backend> Workspace<B> {
    fn new(b: &B, c: &CaptionerConfig, batch: usize, positions: usize) -> Self {
        // No step before the first token: the image is attended to.
        let z = Sizes::new(c, batch, positions);
        let (h, t, v) = (z.hidden, positions, c.vocab_size);
        Workspace {
            sizes: z,
            image: Image::new(b, c, batch),
            attention: AdditiveAttention::new(b, attention_shape(c, batch)),
            ones: b.tensor(&vec![1.0; t]),
            tokens: b.zeros(batch * t * h),
            words_pre: b.zeros(batch * t * h),
            gates1: b.zeros(batch * t * 4 * h),
            cells1: b.zeros(batch * (t + 1) * h),
            states1: b.zeros(batch * (t + 1) * h),
            gates2: b.zeros(batch * t * 4 * h),
            cells2: b.zeros(batch * (t + 1) * h),
            states2: b.zeros(batch * (t + 1) * h),
            mean_gates: b.zeros(batch * 4 * h),
            bias1: b.zeros(4 * h),
            bias2: b.zeros(4 * h),
            query: b.zeros(batch * h),
            d_query: b.zeros(batch * h),
            contexts: b.zeros(batch * t * h),
            d_context: b.zeros(batch * h),
            top: b.zeros(batch * t * h),
            logit_bias: b.zeros(v),
            logits: b.zeros(batch * t * v),
            d_top: b.zeros(batch * t * h),
            d_states1: b.zeros(batch * (t + 1) * h),
            d_states2: b.zeros(batch * (t + 1) * h),
            d_cell1: b.zeros(batch * h),
            d_cell2: b.zeros(batch * h),
            d_gates1: b.zeros(batch * t * 4 * h),
            d_gates2: b.zeros(batch * t * 4 * h),
            packed: b.zeros(batch * t * h),
            d_tokens: b.zeros(batch * t * h),
            d_mean_gates: b.zeros(batch * 4 * h),
            d_mean: b.zeros(batch * h),
            image_grads: ImageGrads::new(b, c, batch),
        }
    }
}

fn attention_shape(c: &CaptionerConfig, rows: usize) -> AdditiveShape {
    AdditiveShape {
        batch: rows,
        tokens: c.image_tokens,
        width: c.decoder.width,
        values: c.decoder.width,
    }
}

impl<B: Backend> UpDown<B> {
    /// Fresh weights from `seed`, for a validated `config`.
    pub fn new(b: &B, config: CaptionerConfig, seed: u64) -> Self {
        let c = &config;
        let h = c.decoder.width;
        let mut p = Params::new(seed);
        let image_layers = TokenLayers::new(&mut p, c);
        let words = Words::new(&mut p, c);
        let att_lstm = Cell::new(&mut p, "core.att_lstm", 3 * h, h, CellGates::Lstm);
        let h2att = linear(&mut p, "core.attention.h2att", h, h);
        let alpha_net = p.add(
            "core.attention.alpha_net.weight".into(),
            &[1, h],
            spread(h),
            true,
        );
        let lang_lstm = Cell::new(&mut p, "core.lang_lstm", 2 * h, h, CellGates::Lstm);
        let output = Output::new(b, &mut p, c);
        p.finish(b);
        UpDown {
            config,
            params: p,
            image_layers,
            words,
            att_lstm,
            h2att,
            alpha_net,
            lang_lstm,
            output,
        }
    }

    fn hidden(&self) -> usize {
        self.config.decoder.width
    }

    /// The image side from `features` (`[rows, tokens, embed_dim]`).
    fn image(&self, b: &B, features: &[f32], image: &mut Image<B>) {
        (self.image_layers).forward(b, &self.params, &self.config, features, image);
    }

    /// v̄'s part of the attention LSTM's gates, `[rows, 4h]`.
    fn mean_gates(&self, b: &B, image: &Image<B>, out: &mut B::Tensor) {
        let h = self.hidden();
        let shape = Matmul::new(image.rows, 4 * h, h)
            .trans_b()
            .with_b(block(1, 3, h));
        b.matmul(
            &image.mean,
            self.params.value(self.att_lstm.weight_ih),
            out,
            &shape,
        );
    }

    /// `[rows, h]` queries of the hidden states `states` (rows at `rows`).
    fn query(&self, b: &B, states: &B::Tensor, at: Operand, rows: usize, out: &mut B::Tensor) {
        let (p, h) = (&self.params, self.hidden());
        let (w, bias) = self.h2att;
        let shape = Matmul::new(rows, h, h).trans_b().with_a(at);
        b.matmul_bias(states, p.value(w), p.value(bias), out, &shape);
    }

    fn attention_weights<'a>(
        &self,
        image: &'a Image<B>,
    ) -> (&'a B::Tensor, &'a B::Tensor, &B::Tensor) {
        (
            &image.keys,
            &image.values,
            self.params.value(self.alpha_net),
        )
    }
}

impl<B: Backend> Network<B> for UpDown<B> {
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
        let (p, z) = (&self.params, ws.sizes);
        let (h, t) = (z.hidden, z.positions);
        let state_row = (t + 1) * h;
        self.image(b, features, &mut ws.image);
        let (pre, tokens) = (&mut ws.words_pre, &mut ws.tokens);
        (self.words).forward(b, p, &inputs.ids.ids, pre, tokens, h);
        self.att_lstm.bias(b, p, &mut ws.bias1);
        self.lang_lstm.bias(b, p, &mut ws.bias2);
        // The attention LSTM's word and v̄ parts, for every position at once.
        let words = Matmul::new(z.batch * t, 4 * h, h)
            .trans_b()
            .with_b(block(2, 3, h));
        b.matmul_bias(
            &ws.tokens,
            p.value(self.att_lstm.weight_ih),
            &ws.bias1,
            &mut ws.gates1,
            &words,
        );
        self.mean_gates(b, &ws.image, &mut ws.mean_gates);
        let over_positions = Matmul::batched(z.batch, t, 4 * h, 1)
            .with_a(Operand::packed(0))
            .accumulate();
        b.matmul(&ws.ones, &ws.mean_gates, &mut ws.gates1, &over_positions);
        // The language LSTM's bias at every position, the rest added per position.
        let bias_rows = Matmul::batched(z.batch, t, 4 * h, 1)
            .with_a(Operand::packed(0))
            .shared_b();
        b.matmul(&ws.ones, &ws.bias2, &mut ws.gates2, &bias_rows);
        let (att, lang) = (&self.att_lstm, &self.lang_lstm);
        for step in 0..t {
            let s = z.step(step);
            if step > 0 {
                let from_lang = z
                    .recurrent(step)
                    .trans_b()
                    .accumulate()
                    .with_b(block(0, 3, h));
                b.matmul(
                    &ws.states2,
                    p.value(att.weight_ih),
                    &mut ws.gates1,
                    &from_lang,
                );
                let recurrent = z.recurrent(step).trans_b().accumulate();
                b.matmul(
                    &ws.states1,
                    p.value(att.weight_hh),
                    &mut ws.gates1,
                    &recurrent,
                );
            }
            b.lstm_cell(&mut ws.gates1, &mut ws.cells1, &mut ws.states1, &s);
            let h1 = strided((step + 1) * h, state_row);
            self.query(b, &ws.states1, h1, z.batch, &mut ws.query);
            let context_rows = Rows {
                offset: step * h,
                stride: t * h,
            };
            ws.attention.forward(
                b,
                self.attention_weights(&ws.image),
                (&ws.query, Rows::packed(h)),
                (&mut ws.contexts, context_rows),
            );
            let into_gates = z.recurrent(step).trans_b().accumulate();
            let from_context = into_gates
                .with_a(strided(step * h, t * h))
                .with_b(block(0, 2, h));
            b.matmul(
                &ws.contexts,
                p.value(lang.weight_ih),
                &mut ws.gates2,
                &from_context,
            );
            let from_h1 = into_gates.with_a(h1).with_b(block(1, 2, h));
            b.matmul(
                &ws.states1,
                p.value(lang.weight_ih),
                &mut ws.gates2,
                &from_h1,
            );
            if step > 0 {
                b.matmul(
                    &ws.states2,
                    p.value(lang.weight_hh),
                    &mut ws.gates2,
                    &into_gates,
                );
            }
            b.lstm_cell(&mut ws.gates2, &mut ws.cells2, &mut ws.states2, &s);
        }
        b.tokens_to_heads(&ws.states2, &mut ws.top, &z.slots(1, t));
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
        let (h, t) = (z.hidden, z.positions);
        let rows = z.batch * t;
        let state_row = (t + 1) * h;
        // The output layer.
        let p = &mut self.params;
        (self.output).backward(b, p, d_logits, &ws.top, &mut ws.d_top, rows);
        for x in [
            &mut ws.d_states1,
            &mut ws.d_states2,
            &mut ws.d_cell1,
            &mut ws.d_cell2,
        ] {
            b.fill(x, 0.0);
        }
        ws.image_grads.zero(b);
        b.heads_to_tokens(&ws.d_top, &mut ws.d_states2, &z.slots(1, t), false);
        let (att, lang) = (&self.att_lstm, &self.lang_lstm);
        for step in (0..t).rev() {
            let s = z.step(step);
            let h1 = strided((step + 1) * h, state_row);
            let gates_at = strided(step * 4 * h, t * 4 * h);
            b.lstm_cell_backward(
                &ws.gates2,
                &ws.cells2,
                &ws.d_states2,
                &mut ws.d_cell2,
                &mut ws.d_gates2,
                &s,
            );
            let p = &self.params;
            if step > 0 {
                let recurrent = z.recurrent_backward(step).accumulate();
                b.matmul(
                    &ws.d_gates2,
                    p.value(lang.weight_hh),
                    &mut ws.d_states2,
                    &recurrent,
                );
            }
            // The language LSTM's input [v̂; h1].
            let to_h1 = Matmul::new(z.batch, h, 4 * h)
                .with_a(gates_at)
                .with_b(block(1, 2, h))
                .with_c(h1)
                .accumulate();
            b.matmul(
                &ws.d_gates2,
                p.value(lang.weight_ih),
                &mut ws.d_states1,
                &to_h1,
            );
            let to_context = Matmul::new(z.batch, h, 4 * h)
                .with_a(gates_at)
                .with_b(block(0, 2, h));
            b.matmul(
                &ws.d_gates2,
                p.value(lang.weight_ih),
                &mut ws.d_context,
                &to_context,
            );
            // The attention, its query from h1.
            self.query(b, &ws.states1, h1, z.batch, &mut ws.query);
            let p = &mut self.params;
            let (values, d_alpha) = p.for_backward_one(self.alpha_net);
            ws.attention.backward(
                b,
                (&ws.image.keys, &ws.image.values, &values[self.alpha_net.0]),
                (&ws.query, Rows::packed(h)),
                (&ws.d_context, Rows::packed(h)),
                &mut ws.d_query,
                (
                    &mut ws.image_grads.d_keys,
                    &mut ws.image_grads.d_values,
                    d_alpha,
                ),
            );
            let (w, bias) = self.h2att;
            let to_h1 = Matmul::new(z.batch, h, h).with_c(h1).accumulate();
            b.matmul(&ws.d_query, p.value(w), &mut ws.d_states1, &to_h1);
            let d_weight = Matmul::new(h, h, z.batch).trans_a().with_b(h1).accumulate();
            b.matmul(&ws.d_query, &ws.states1, p.grad(w), &d_weight);
            b.column_sum(&ws.d_query, z.batch, h, p.grad(bias), true);
            // The attention LSTM.
            b.lstm_cell_backward(
                &ws.gates1,
                &ws.cells1,
                &ws.d_states1,
                &mut ws.d_cell1,
                &mut ws.d_gates1,
                &s,
            );
            if step > 0 {
                let recurrent = z.recurrent_backward(step).accumulate();
                b.matmul(
                    &ws.d_gates1,
                    p.value(att.weight_hh),
                    &mut ws.d_states1,
                    &recurrent,
                );
                let to_lang = recurrent.with_b(block(0, 3, h));
                b.matmul(
                    &ws.d_gates1,
                    p.value(att.weight_ih),
                    &mut ws.d_states2,
                    &to_lang,
                );
            }
        }
        let p = &mut self.params;
        // The cells' weights, from every position at once.
        let weight_grad = |part: usize, parts: usize| {
            Matmul::new(4 * h, h, rows)
                .trans_a()
                .accumulate()
                .with_c(block(part, parts, h))
        };
        b.tokens_to_heads(&ws.states2, &mut ws.packed, &z.slots(0, t));
        b.matmul(
            &ws.d_gates2,
            &ws.packed,
            p.grad(lang.weight_hh),
            &weight_grad(0, 1),
        );
        b.matmul(
            &ws.d_gates1,
            &ws.packed,
            p.grad(att.weight_ih),
            &weight_grad(0, 3),
        );
        b.tokens_to_heads(&ws.states1, &mut ws.packed, &z.slots(0, t));
        b.matmul(
            &ws.d_gates1,
            &ws.packed,
            p.grad(att.weight_hh),
            &weight_grad(0, 1),
        );
        b.tokens_to_heads(&ws.states1, &mut ws.packed, &z.slots(1, t));
        b.matmul(
            &ws.d_gates2,
            &ws.packed,
            p.grad(lang.weight_ih),
            &weight_grad(1, 2),
        );
        b.matmul(
            &ws.d_gates2,
            &ws.contexts,
            p.grad(lang.weight_ih),
            &weight_grad(0, 2),
        );
        b.matmul(
            &ws.d_gates1,
            &ws.tokens,
            p.grad(att.weight_ih),
            &weight_grad(2, 3),
        );
        for (gates, cell) in [(&ws.d_gates1, att), (&ws.d_gates2, lang)] {
            b.column_sum(gates, rows, 4 * h, p.grad(cell.bias_ih), true);
            b.column_sum(gates, rows, 4 * h, p.grad(cell.bias_hh), true);
        }
        let to_words = Matmul::new(rows, h, 4 * h).with_b(block(2, 3, h));
        b.matmul(
            &ws.d_gates1,
            p.value(att.weight_ih),
            &mut ws.d_tokens,
            &to_words,
        );
        // d_top is spent (it went into d_states2): the words' scratch.
        let scratch = &mut ws.d_top;
        (self.words).backward(b, p, &inputs.ids, &ws.words_pre, &ws.d_tokens, scratch, h);
        // v̄: its gates' gradient summed over the positions.
        let over_positions = Matmul::batched(z.batch, 1, 4 * h, t).with_a(Operand::packed(0));
        b.matmul(
            &ws.ones,
            &ws.d_gates1,
            &mut ws.d_mean_gates,
            &over_positions,
        );
        let mean_weight = Matmul::new(4 * h, h, z.batch)
            .trans_a()
            .accumulate()
            .with_c(block(1, 3, h));
        b.matmul(
            &ws.d_mean_gates,
            &ws.image.mean,
            p.grad(att.weight_ih),
            &mean_weight,
        );
        let to_mean = Matmul::new(z.batch, h, 4 * h).with_b(block(1, 3, h));
        b.matmul(
            &ws.d_mean_gates,
            p.value(att.weight_ih),
            &mut ws.d_mean,
            &to_mean,
        );
        // The image side: v̄, then the keys and values.
        let (c, grads) = (&self.config, &mut ws.image_grads);
        (self.image_layers).mean_backward(b, p, c, &ws.image, &ws.d_mean, grads);
        (self.image_layers).backward(b, p, c, &ws.image, grads);
    }

    fn logits(ws: &Workspace<B>) -> &B::Tensor {
        &ws.logits
    }

    fn stepper<'m>(&'m self, b: &B, rows: usize) -> Box<dyn Stepper<B> + 'm> {
        Box::new(UpDownStepper::new(b, self, rows))
    }
}

/// One position at a time: each cell's states in two slots per row, read
/// from one and written to the other in turn.
struct UpDownStepper<'m, B: Backend> {
    net: &'m UpDown<B>,
    rows: usize,
    current: usize,
    image: Image<B>,
    attention: AdditiveAttention<B>,
    /// `[rows, 4h]`: v̄'s part of the attention LSTM's gates, with its bias.
    mean_gates: B::Tensor,
    /// `[4h]` each: the attention and language cells' summed biases.
    bias1: B::Tensor,
    bias2: B::Tensor,
    cells1: B::Tensor,
    states1: B::Tensor,
    cells2: B::Tensor,
    states2: B::Tensor,
    spare: B::Tensor,
    word: B::Tensor,
    word_pre: B::Tensor,
    gates: B::Tensor,
    query: B::Tensor,
    context: B::Tensor,
    logit_bias: B::Tensor,
    logits: B::Tensor,
}

impl<'m, B: Backend> UpDownStepper<'m, B> {
    fn new(b: &B, net: &'m UpDown<B>, rows: usize) -> Self {
        let c = &net.config;
        let h = net.hidden();
        let (mut bias1, mut bias2) = (b.zeros(4 * h), b.zeros(4 * h));
        net.att_lstm.bias(b, &net.params, &mut bias1);
        net.lang_lstm.bias(b, &net.params, &mut bias2);
        let mut logit_bias = b.zeros(c.vocab_size);
        net.output.bias(b, &net.params, &mut logit_bias);
        let state = || b.zeros(rows * 2 * h);
        UpDownStepper {
            net,
            rows,
            current: 0,
            image: Image::new(b, c, rows),
            attention: AdditiveAttention::new(b, attention_shape(c, rows)),
            mean_gates: b.zeros(rows * 4 * h),
            bias1,
            bias2,
            cells1: state(),
            states1: state(),
            cells2: state(),
            states2: state(),
            spare: state(),
            word: b.zeros(rows * h),
            word_pre: b.zeros(rows * h),
            gates: b.zeros(rows * 4 * h),
            query: b.zeros(rows * h),
            context: b.zeros(rows * h),
            logit_bias,
            logits: b.zeros(rows * c.vocab_size),
        }
    }
}

impl<B: Backend> Stepper<B> for UpDownStepper<'_, B> {
    fn start(&mut self, b: &B, features: &[f32]) {
        let net = self.net;
        net.image(b, features, &mut self.image);
        net.mean_gates(b, &self.image, &mut self.mean_gates);
        b.add_bias(&mut self.mean_gates, &self.bias1);
        for x in [
            &mut self.cells1,
            &mut self.states1,
            &mut self.cells2,
            &mut self.states2,
        ] {
            b.fill(x, 0.0);
        }
        self.current = 0;
    }

    fn advance(&mut self, b: &B, ids: &B::Ids) {
        let (net, rows) = (self.net, self.rows);
        let (p, h) = (&net.params, net.hidden());
        let (prev, next) = (self.current, 1 - self.current);
        let (was, now) = (strided(prev * h, 2 * h), strided(next * h, 2 * h));
        let step = LstmStep::between_slots(CellGates::Lstm, rows, h, prev);
        let gates = Matmul::new(rows, 4 * h, h).trans_b();
        let (att, lang) = (&net.att_lstm, &net.lang_lstm);
        (net.words).forward(b, p, ids, &mut self.word_pre, &mut self.word, h);
        b.axpby(1.0, &self.mean_gates, 0.0, &mut self.gates);
        let added = gates.accumulate();
        b.matmul(
            &self.word,
            p.value(att.weight_ih),
            &mut self.gates,
            &added.with_b(block(2, 3, h)),
        );
        let from_lang = added.with_a(was).with_b(block(0, 3, h));
        b.matmul(
            &self.states2,
            p.value(att.weight_ih),
            &mut self.gates,
            &from_lang,
        );
        b.matmul(
            &self.states1,
            p.value(att.weight_hh),
            &mut self.gates,
            &added.with_a(was),
        );
        b.lstm_cell(&mut self.gates, &mut self.cells1, &mut self.states1, &step);
        net.query(b, &self.states1, now, rows, &mut self.query);
        self.attention.forward(
            b,
            net.attention_weights(&self.image),
            (&self.query, Rows::packed(h)),
            (&mut self.context, Rows::packed(h)),
        );
        let from_context = gates.with_b(block(0, 2, h));
        b.matmul_bias(
            &self.context,
            p.value(lang.weight_ih),
            &self.bias2,
            &mut self.gates,
            &from_context,
        );
        let from_h1 = added.with_a(now).with_b(block(1, 2, h));
        b.matmul(
            &self.states1,
            p.value(lang.weight_ih),
            &mut self.gates,
            &from_h1,
        );
        b.matmul(
            &self.states2,
            p.value(lang.weight_hh),
            &mut self.gates,
            &added.with_a(was),
        );
        b.lstm_cell(&mut self.gates, &mut self.cells2, &mut self.states2, &step);
        self.current = next;
        let (bias, logits) = (&self.logit_bias, &mut self.logits);
        (net.output).forward(b, p, (&self.states2, now), bias, logits, rows);
    }

    fn logits(&self) -> &B::Tensor {
        &self.logits
    }

    /// Row r takes its parent's states; the image side is its image's,
    /// which a beam's parent shares.
    fn reorder(&mut self, b: &B, parents: &B::Ids) {
        let per_row = 2 * self.net.hidden();
        for state in [
            &mut self.cells1,
            &mut self.states1,
            &mut self.cells2,
            &mut self.states2,
        ] {
            b.embedding(state, parents, &mut self.spare, per_row, false);
            std::mem::swap(state, &mut self.spare);
        }
    }
}
