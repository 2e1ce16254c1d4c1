//! LSTM captioners as a decoder family. The FC model: a linear layer
//! (`fc_embed`) projects the image embedding to the hidden size; that
//! projection is every layer's hidden state before the first word (the
//! sequence-level exploration paper, Chen and Jin, 2020) or the input of
//! a step before the start token (self-critical training's FC model,
//! Rennie et al., 2017); then the word embedding (`embed`), stacked LSTM
//! layers (`core.lstm`, PyTorch's `nn.LSTM` parameters and gate order, or
//! self-critical training's maxout cell of five chunks) and an untied
//! output layer (`logit`) plus the policy mask. No dropout.
//!
//! Weights are stored as PyTorch stores them (`[outputs, inputs]`), so a
//! PyTorch checkpoint's tensors carry over by name.
//!
//! A layer runs its input-to-gates product for all positions at once, then
//! one position at a time: the hidden-to-gates product of the previous
//! state added in place, and the cell kernel. Where a batch has more
//! positions than the vocabulary has ids, the first layer's products go
//! through the word table instead: each id's gates, embed W_ih^T + b,
//! computed once and gathered per position; and back, the gates'
//! gradients summed per id, then multiplied once per id. States live in
//! `[batch, steps + 1, hidden]` tensors whose slot 0 is the initial
//! state, so step t reads slot t and writes slot t + 1; the rows a next
//! layer or the output layer reads are copied out packed.

pub mod att2in;
pub mod network;
mod output;
mod stepper;
mod tokens;
pub mod updown;

use crate::backend::{Backend, CellGates, HeadLayout, LstmStep, Matmul, Operand};
use crate::captioner::decoder::Stepper;
use crate::captioner::inputs::TokenInputs;
use crate::captioner::{CaptionerConfig, ImageFeed};
use crate::model::params::{Init, ParamId, Params};
use network::{Network, Recurrent};
use output::Output;
use stepper::LstmStepper;
use tokens::spread;

pub type LstmDecoder<B> = Recurrent<B, Lstm<B>>;

/// The network: its shape and weights.
pub struct Lstm<B: Backend> {
    config: CaptionerConfig,
    params: Params<B>,
    /// `[hidden, embed_dim]` and `[hidden]`: the image projection.
    fc_embed: (ParamId, ParamId),
    /// `[vocab, hidden]`: the word embedding.
    embed: ParamId,
    layers: Vec<LayerParams>,
    output: Output<B>,
}

/// One layer's `nn.LSTM` parameters: `[gates, inputs]`, `[gates,
/// hidden]` and two `[gates]` biases, `gates` = the cell's chunks times
/// the hidden size.
struct LayerParams {
    weight_ih: ParamId,
    weight_hh: ParamId,
    bias_ih: ParamId,
    bias_hh: ParamId,
}

/// Where the sizes of a batch sit: `batch` sequences of `positions` token
/// positions, run as `steps` LSTM steps (one more when the image is an
/// input), `hidden` wide.
#[derive(Clone, Copy)]
struct Sizes {
    batch: usize,
    positions: usize,
    steps: usize,
    hidden: usize,
    cell: CellGates,
    /// Pre-activations per row of gates: the cell's chunks times `hidden`.
    gates: usize,
    /// Steps before the first token: 1 when the image is fed as an input.
    lead: usize,
    /// The first layer's gates come from the word table ([`Sizes::new`]).
    word_table: bool,
}

impl Sizes {
    fn new(c: &CaptionerConfig, batch: usize, positions: usize) -> Self {
        let lead = usize::from(c.lstm.map(|l| l.image_feed) == Some(ImageFeed::Input));
        let cell = c.lstm.map(|l| l.cell()).unwrap_or_default();
        Sizes {
            batch,
            positions,
            steps: positions + lead,
            hidden: c.decoder.width,
            cell,
            gates: cell.chunks() * c.decoder.width,
            lead,
            // A product per id is cheaper than one per position; the
            // image as the first input is a row no id gives.
            word_table: lead == 0 && c.vocab_size < batch * positions,
        }
    }

    /// `len` states from slot `first` of every sequence's
    /// `[steps + 1, hidden]` states, as one packed "head" per sequence.
    fn slots(&self, first: usize, len: usize) -> HeadLayout {
        self.columns(
            first * self.hidden,
            len * self.hidden,
            (self.steps + 1) * self.hidden,
        )
    }

    /// `width` values from column `offset` of each sequence's row of
    /// `row` values.
    fn columns(&self, offset: usize, width: usize, row: usize) -> HeadLayout {
        HeadLayout {
            batch: self.batch,
            seq: 1,
            heads: 1,
            head_dim: width,
            row_stride: row,
            col_offset: offset,
        }
    }

    fn step(&self, t: usize) -> LstmStep {
        LstmStep::of_sequence(self.cell, self.batch, self.hidden, self.steps, t)
    }

    /// The product of step t's previous hidden states (`[batch, hidden]`,
    /// strided) and a `[hidden, gates]` operand into step t's gates:
    /// `Matmul::new(batch, gates, hidden)` with the operands placed.
    fn recurrent(&self, t: usize) -> Matmul {
        let (h, g) = (self.hidden, self.gates);
        Matmul::new(self.batch, g, h)
            .with_a(strided(t * h, (self.steps + 1) * h))
            .with_c(strided(t * g, self.steps * g))
    }

    /// The gradient of step t's previous hidden states from its gates'.
    fn recurrent_backward(&self, t: usize) -> Matmul {
        let (h, g) = (self.hidden, self.gates);
        Matmul::new(self.batch, h, g)
            .with_a(strided(t * g, self.steps * g))
            .with_c(strided(t * h, (self.steps + 1) * h))
    }
}

/// One matrix whose rows are `row_stride` apart from `offset` on.
fn strided(offset: usize, row_stride: usize) -> Operand {
    Operand {
        offset,
        row_stride,
        ..Operand::packed(0)
    }
}

/// One layer's activations: the gates' activations `[batch, steps,
/// gates]`, the cell and hidden states `[batch, steps + 1, hidden]`.
struct LayerActivations<B: Backend> {
    gates: B::Tensor,
    cells: B::Tensor,
    states: B::Tensor,
}

/// The activations of one batch shape.
pub struct Workspace<B: Backend> {
    sizes: Sizes,
    /// `[batch, embed_dim]` and `[batch, hidden]`: the image embeddings and
    /// their projection.
    features: B::Tensor,
    image: B::Tensor,
    /// `[batch, positions, hidden]`: the token embeddings.
    tokens: B::Tensor,
    /// `[vocab, gates]` with the word table: each id's first-layer gates
    /// (with their biases), and the gradient summed per id.
    word_gates: B::Tensor,
    d_word_gates: B::Tensor,
    /// Layer l's input `[batch, steps, hidden]`: the token embeddings
    /// (after the image when it is an input), then each layer's outputs.
    inputs: Vec<B::Tensor>,
    layers: Vec<LayerActivations<B>>,
    /// `[gates]` per layer: its two biases summed.
    gate_bias: Vec<B::Tensor>,
    /// `[batch, positions, hidden]`: the top layer's outputs at the token
    /// positions, the output layer's input.
    top: B::Tensor,
    /// `[vocab]`: the output bias plus the policy mask.
    logit_bias: B::Tensor,
    /// `[batch * positions, vocab]`.
    logits: B::Tensor,
    /// `[batch, positions, hidden]`: the gradient w.r.t. the output
    /// layer's input; then, with the image as an input, w.r.t. the token
    /// embeddings.
    d_top: B::Tensor,
    d_states: B::Tensor,
    d_cell: B::Tensor,
    d_gates: B::Tensor,
    /// `[batch, steps, hidden]`: a layer's previous hidden states, packed
    /// for its recurrent weight's gradient.
    previous: B::Tensor,
    /// `[batch, steps, hidden]`: the gradient w.r.t. a layer's input.
    d_inputs: B::Tensor,
    d_image: B::Tensor,
    d_slot: B::Tensor,
}

impl<B: Backend> Workspace<B> {
    fn new(b: &B, c: &CaptionerConfig, batch: usize, positions: usize) -> Self {
        let z = Sizes::new(c, batch, positions);
        let (h, s, g) = (z.hidden, z.steps, z.gates);
        let layers = c.decoder.layers;
        let table = if z.word_table { c.vocab_size * g } else { 0 };
        Workspace {
            sizes: z,
            features: b.zeros(batch * c.embed_dim),
            image: b.zeros(batch * h),
            tokens: b.zeros(batch * positions * h),
            word_gates: b.zeros(table),
            d_word_gates: b.zeros(table),
            inputs: (0..layers).map(|_| b.zeros(batch * s * h)).collect(),
            layers: (0..layers)
                .map(|_| LayerActivations {
                    gates: b.zeros(batch * s * g),
                    cells: b.zeros(batch * (s + 1) * h),
                    states: b.zeros(batch * (s + 1) * h),
                })
                .collect(),
            gate_bias: (0..layers).map(|_| b.zeros(g)).collect(),
            top: b.zeros(batch * positions * h),
            logit_bias: b.zeros(c.vocab_size),
            logits: b.zeros(batch * positions * c.vocab_size),
            d_top: b.zeros(batch * positions * h),
            d_states: b.zeros(batch * (s + 1) * h),
            d_cell: b.zeros(batch * h),
            d_gates: b.zeros(batch * s * g),
            previous: b.zeros(batch * s * h),
            d_inputs: b.zeros(batch * s * h),
            d_image: b.zeros(batch * h),
            d_slot: b.zeros(batch * h),
        }
    }
}

impl<B: Backend> Lstm<B> {
    /// Fresh weights from `seed`, for a validated `config`.
    pub fn new(b: &B, config: CaptionerConfig, seed: u64) -> Self {
        let c = &config;
        let (h, e, v) = (c.decoder.width, c.embed_dim, c.vocab_size);
        let g = Sizes::new(c, 0, 0).gates;
        let mut p = Params::new(seed);
        let fc_embed = (
            p.add("fc_embed.weight".into(), &[h, e], spread(e), true),
            p.add("fc_embed.bias".into(), &[h], Init::Const(0.0), false),
        );
        let embed = p.add("embed.weight".into(), &[v, h], Init::Normal(0.1), false);
        let layers = (0..c.decoder.layers)
            .map(|l| {
                let name = |what: &str| format!("core.lstm.{what}_l{l}");
                LayerParams {
                    weight_ih: p.add(name("weight_ih"), &[g, h], spread(h), true),
                    weight_hh: p.add(name("weight_hh"), &[g, h], spread(h), true),
                    bias_ih: p.add(name("bias_ih"), &[g], Init::Const(0.0), false),
                    bias_hh: p.add(name("bias_hh"), &[g], Init::Const(0.0), false),
                }
            })
            .collect();
        let output = Output::new(b, &mut p, c);
        p.finish(b);
        Lstm {
            config,
            params: p,
            fc_embed,
            embed,
            layers,
            output,
        }
    }

    /// `[rows, hidden]` = the image projection of `features` (`[rows,
    /// embed_dim]`).
    fn project_image(&self, b: &B, features: &B::Tensor, image: &mut B::Tensor, rows: usize) {
        let (c, p) = (&self.config, &self.params);
        let shape = Matmul::new(rows, c.decoder.width, c.embed_dim).trans_b();
        b.matmul_bias(
            features,
            p.value(self.fc_embed.0),
            p.value(self.fc_embed.1),
            image,
            &shape,
        );
    }

    /// Each layer's two biases summed, for its input-to-gates products.
    fn gate_biases(&self, b: &B, out: &mut [B::Tensor]) {
        let p = &self.params;
        for (layer, bias) in self.layers.iter().zip(out) {
            b.add(
                1.0,
                p.value(layer.bias_ih),
                1.0,
                p.value(layer.bias_hh),
                bias,
            );
        }
    }

    /// The image is fed as a hidden state (not as an input).
    fn image_is_state(&self) -> bool {
        self.config.lstm.map(|l| l.image_feed) != Some(ImageFeed::Input)
    }
}

impl<B: Backend> Network<B> for Lstm<B> {
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

    /// The image projection is the adapter.
    fn is_adapter(&self, name: &str) -> bool {
        name.starts_with("fc_embed.")
    }

    fn workspace(&self, b: &B, batch: usize, positions: usize) -> Workspace<B> {
        Workspace::new(b, &self.config, batch, positions)
    }

    fn forward(&self, b: &B, features: &[f32], inputs: &TokenInputs<B>, ws: &mut Workspace<B>) {
        let (p, z) = (&self.params, ws.sizes);
        let (h, s, g) = (z.hidden, z.steps, z.gates);
        b.write(&mut ws.features, features);
        self.project_image(b, &ws.features, &mut ws.image, z.batch);
        // The first layer's input, unless its gates come from the word table.
        if !z.word_table {
            let embed = p.value(self.embed);
            b.embedding(embed, &inputs.ids.ids, &mut ws.tokens, h, false);
            if z.lead == 0 {
                b.axpby(1.0, &ws.tokens, 0.0, &mut ws.inputs[0]);
            } else {
                let row = s * h;
                let image = z.columns(0, h, row);
                b.heads_to_tokens(&ws.image, &mut ws.inputs[0], &image, false);
                let tokens = z.columns(h, z.positions * h, row);
                b.heads_to_tokens(&ws.tokens, &mut ws.inputs[0], &tokens, false);
            }
        }
        self.gate_biases(b, &mut ws.gate_bias);
        let last = self.layers.len() - 1;
        for (l, layer) in self.layers.iter().enumerate() {
            let (done, rest) = ws.inputs.split_at_mut(l + 1);
            let a = &mut ws.layers[l];
            if l == 0 && z.word_table {
                let words = Matmul::new(self.config.vocab_size, g, h).trans_b();
                let (embed, w_ih) = (p.value(self.embed), p.value(layer.weight_ih));
                b.matmul_bias(embed, w_ih, &ws.gate_bias[l], &mut ws.word_gates, &words);
                b.embedding(&ws.word_gates, &inputs.ids.ids, &mut a.gates, g, false);
            } else {
                b.matmul_bias(
                    &done[l],
                    p.value(layer.weight_ih),
                    &ws.gate_bias[l],
                    &mut a.gates,
                    &Matmul::new(z.batch * s, g, h).trans_b(),
                );
            }
            // Slot 0: the image, or zero states (never written).
            if self.image_is_state() {
                b.heads_to_tokens(&ws.image, &mut a.states, &z.slots(0, 1), false);
            }
            for t in 0..s {
                if t > 0 || self.image_is_state() {
                    let recurrent = z.recurrent(t).trans_b().accumulate();
                    b.matmul(
                        &a.states,
                        p.value(layer.weight_hh),
                        &mut a.gates,
                        &recurrent,
                    );
                }
                b.lstm_cell(&mut a.gates, &mut a.cells, &mut a.states, &z.step(t));
            }
            if l < last {
                b.tokens_to_heads(&a.states, &mut rest[0], &z.slots(1, s));
            }
        }
        let top = &ws.layers[last].states;
        b.tokens_to_heads(top, &mut ws.top, &z.slots(1 + z.lead, z.positions));
        self.output.bias(b, p, &mut ws.logit_bias);
        let top = (&ws.top, Operand::packed(0));
        let rows = z.batch * z.positions;
        (self.output).forward(b, p, top, &ws.logit_bias, &mut ws.logits, rows);
    }

    fn backward(
        &mut self,
        b: &B,
        inputs: &TokenInputs<B>,
        d_logits: &B::Tensor,
        ws: &mut Workspace<B>,
    ) {
        let z = ws.sizes;
        let (h, s, g) = (z.hidden, z.steps, z.gates);
        let rows = z.batch * z.positions;
        let image_is_state = self.image_is_state();
        let p = &mut self.params;
        (self.output).backward(b, p, d_logits, &ws.top, &mut ws.d_top, rows);
        b.fill(&mut ws.d_image, 0.0);
        let last = self.layers.len() - 1;
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let a = &ws.layers[l];
            // The gradient w.r.t. the layer's outputs: from the output
            // layer at the token positions, or from the layer above.
            b.fill(&mut ws.d_states, 0.0);
            if l == last {
                let tokens = z.slots(1 + z.lead, z.positions);
                b.heads_to_tokens(&ws.d_top, &mut ws.d_states, &tokens, false);
            } else {
                b.heads_to_tokens(&ws.d_inputs, &mut ws.d_states, &z.slots(1, s), false);
            }
            b.fill(&mut ws.d_cell, 0.0);
            for t in (0..s).rev() {
                let step = z.step(t);
                b.lstm_cell_backward(
                    &a.gates,
                    &a.cells,
                    &ws.d_states,
                    &mut ws.d_cell,
                    &mut ws.d_gates,
                    &step,
                );
                if t > 0 || image_is_state {
                    let recurrent = z.recurrent_backward(t).accumulate();
                    b.matmul(
                        &ws.d_gates,
                        p.value(layer.weight_hh),
                        &mut ws.d_states,
                        &recurrent,
                    );
                }
            }
            if image_is_state {
                b.tokens_to_heads(&ws.d_states, &mut ws.d_slot, &z.slots(0, 1));
                b.axpby(1.0, &ws.d_slot, 1.0, &mut ws.d_image);
            }
            let products = z.batch * s;
            let weight_grad =
                |inputs: usize| Matmul::new(g, inputs, products).trans_a().accumulate();
            b.tokens_to_heads(&a.states, &mut ws.previous, &z.slots(0, s));
            b.matmul(
                &ws.d_gates,
                &ws.previous,
                p.grad(layer.weight_hh),
                &weight_grad(h),
            );
            b.column_sum(&ws.d_gates, products, g, p.grad(layer.bias_ih), true);
            b.column_sum(&ws.d_gates, products, g, p.grad(layer.bias_hh), true);
            if l == 0 && z.word_table {
                // The gates' gradients summed per id, then the word
                // table's products once per id.
                let v = self.config.vocab_size;
                b.fill(&mut ws.d_word_gates, 0.0);
                b.embedding_backward(&ws.d_gates, &inputs.ids, &mut ws.d_word_gates, g);
                let (values, d_weight) = p.for_backward_one(layer.weight_ih);
                let weight_grad = Matmul::new(g, h, v).trans_a().accumulate();
                let embed = &values[self.embed.0];
                b.matmul(&ws.d_word_gates, embed, d_weight, &weight_grad);
                let (values, d_embed) = p.for_backward_one(self.embed);
                let w_ih = &values[layer.weight_ih.0];
                let to_words = Matmul::new(v, h, g).accumulate();
                b.matmul(&ws.d_word_gates, w_ih, d_embed, &to_words);
                continue;
            }
            b.matmul(
                &ws.d_gates,
                &ws.inputs[l],
                p.grad(layer.weight_ih),
                &weight_grad(h),
            );
            b.matmul(
                &ws.d_gates,
                p.value(layer.weight_ih),
                &mut ws.d_inputs,
                &Matmul::new(products, h, g),
            );
        }
        // The first layer's input: the token embeddings, after the image
        // when it is an input (with the word table, done above).
        let d_tokens = if z.word_table {
            None
        } else if z.lead == 0 {
            Some(&ws.d_inputs)
        } else {
            let row = s * h;
            b.tokens_to_heads(&ws.d_inputs, &mut ws.d_slot, &z.columns(0, h, row));
            b.axpby(1.0, &ws.d_slot, 1.0, &mut ws.d_image);
            b.tokens_to_heads(
                &ws.d_inputs,
                &mut ws.d_top,
                &z.columns(h, z.positions * h, row),
            );
            Some(&ws.d_top)
        };
        if let Some(d_tokens) = d_tokens {
            b.embedding_backward(d_tokens, &inputs.ids, p.grad(self.embed), h);
        }
        let c = &self.config;
        b.matmul(
            &ws.d_image,
            &ws.features,
            p.grad(self.fc_embed.0),
            &Matmul::new(h, c.embed_dim, z.batch).trans_a().accumulate(),
        );
        b.column_sum(&ws.d_image, z.batch, h, p.grad(self.fc_embed.1), true);
    }

    fn logits(ws: &Workspace<B>) -> &B::Tensor {
        &ws.logits
    }

    fn stepper<'m>(&'m self, b: &B, rows: usize) -> Box<dyn Stepper<B> + 'm> {
        Box::new(LstmStepper::new(b, self, rows))
    }
}
