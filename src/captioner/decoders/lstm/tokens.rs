//! What the attention LSTMs share: image tokens embedded, v_n =
//! ReLU(`att_embed`(x_n)), and projected once to attention keys, k_n =
//! `ctx2att`(v_n), with v̄ their mean (or, as self-critical's top-down
//! model has it, v̄ = ReLU(`fc_embed`(the mean of the x_n))); the word
//! embedding; and the layers they are built of, in PyTorch's layouts
//! (`[outputs, inputs]`) and initial spreads.

use crate::backend::{Backend, CellGates, Matmul, TokenIndex};
use crate::captioner::{CaptionerConfig, LstmModel, LstmVariant};
use crate::model::params::{Init, ParamId, Params};

/// PyTorch's U(-1/sqrt(fan), 1/sqrt(fan)) spread, as a normal.
pub(super) fn spread(fan: usize) -> Init {
    Init::Normal(1.0 / (3.0 * fan as f32).sqrt())
}

/// A linear layer's weight (`[outputs, inputs]`) and bias.
pub(super) type Linear = (ParamId, ParamId);

pub(super) fn linear<B: Backend>(
    p: &mut Params<B>,
    name: &str,
    outputs: usize,
    inputs: usize,
) -> Linear {
    let weight = format!("{name}.weight");
    (
        p.add(weight, &[outputs, inputs], spread(inputs), true),
        p.add(format!("{name}.bias"), &[outputs], Init::Const(0.0), false),
    )
}

/// `nn.LSTMCell`'s parameters, `hidden` wide (for the maxout cell, five
/// chunks of gates where PyTorch's has four).
pub(super) struct Cell {
    pub weight_ih: ParamId,
    pub weight_hh: ParamId,
    pub bias_ih: ParamId,
    pub bias_hh: ParamId,
}

impl Cell {
    pub fn new<B: Backend>(
        p: &mut Params<B>,
        name: &str,
        inputs: usize,
        hidden: usize,
        cell: CellGates,
    ) -> Self {
        let (h, g) = (hidden, cell.chunks() * hidden);
        let mut add = |what: &str, shape: &[usize], init, decay| {
            p.add(format!("{name}.{what}"), shape, init, decay)
        };
        Cell {
            weight_ih: add("weight_ih", &[g, inputs], spread(h), true),
            weight_hh: add("weight_hh", &[g, h], spread(h), true),
            bias_ih: add("bias_ih", &[g], Init::Const(0.0), false),
            bias_hh: add("bias_hh", &[g], Init::Const(0.0), false),
        }
    }

    /// Its two biases summed.
    pub fn bias<B: Backend>(&self, b: &B, p: &Params<B>, out: &mut B::Tensor) {
        b.add(1.0, p.value(self.bias_ih), 1.0, p.value(self.bias_hh), out);
    }
}

/// The word embedding `embed` (`[vocab, h]`), followed by a ReLU in
/// self-critical's attention models.
pub(super) struct Words {
    pub table: ParamId,
    relu: bool,
}

impl Words {
    pub fn new<B: Backend>(p: &mut Params<B>, c: &CaptionerConfig) -> Self {
        let shape = [c.vocab_size, c.decoder.width];
        Words {
            table: p.add("embed.weight".into(), &shape, Init::Normal(0.1), false),
            relu: c.lstm.is_some_and(|l| l.word_relu()),
        }
    }

    /// `out` = the vectors of `ids`, `h` each; `pre` keeps them before the
    /// ReLU, where there is one.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        ids: &B::Ids,
        pre: &mut B::Tensor,
        out: &mut B::Tensor,
        h: usize,
    ) {
        if self.relu {
            b.embedding(p.value(self.table), ids, pre, h, false);
            b.relu(pre, out);
        } else {
            b.embedding(p.value(self.table), ids, out, h, false);
        }
    }

    /// The table's gradient from `d_out`, the one w.r.t. the vectors;
    /// `scratch` is of its size.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        ids: &TokenIndex<B>,
        pre: &B::Tensor,
        d_out: &B::Tensor,
        scratch: &mut B::Tensor,
        h: usize,
    ) {
        let d_vectors = if self.relu {
            b.relu_backward(pre, d_out, scratch);
            &*scratch
        } else {
            d_out
        };
        b.embedding_backward(d_vectors, ids, p.grad(self.table), h);
    }
}

/// The token embedding and the keys' projection; in self-critical's
/// top-down model, the pooled feature's projection too.
pub(super) struct TokenLayers {
    att_embed: Linear,
    ctx2att: Linear,
    /// `[h, embed_dim]`: v̄ = ReLU(`fc_embed`(mean of the x_n)).
    fc_embed: Option<Linear>,
}

/// A batch's image side: its tokens embedded, their keys and mean.
pub(super) struct Image<B: Backend> {
    pub rows: usize,
    /// `[rows, tokens, embed_dim]`.
    pub features: B::Tensor,
    /// `[rows, tokens, h]`: before and after the ReLU.
    pub pre: B::Tensor,
    pub values: B::Tensor,
    pub keys: B::Tensor,
    /// `[rows, h]`: v̄.
    pub mean: B::Tensor,
    /// With `fc_embed`: `[rows, embed_dim]`, the tokens' mean, and `[rows,
    /// h]`, its projection before the ReLU.
    raw_mean: B::Tensor,
    mean_pre: B::Tensor,
}

impl<B: Backend> Image<B> {
    pub fn new(b: &B, c: &CaptionerConfig, rows: usize) -> Self {
        let (n, h) = (rows * c.image_tokens, c.decoder.width);
        Image {
            rows,
            features: b.zeros(n * c.embed_dim),
            pre: b.zeros(n * h),
            values: b.zeros(n * h),
            keys: b.zeros(n * h),
            mean: b.zeros(rows * h),
            raw_mean: b.zeros(rows * c.embed_dim),
            mean_pre: b.zeros(rows * h),
        }
    }
}

/// The gradients w.r.t. a batch's keys and values, which the attention
/// adds to, and the scratch of their way back.
pub(super) struct ImageGrads<B: Backend> {
    pub d_keys: B::Tensor,
    pub d_values: B::Tensor,
    d_pre: B::Tensor,
    /// `[rows, h]`: the gradient w.r.t. `fc_embed`'s output.
    d_mean_pre: B::Tensor,
}

impl<B: Backend> ImageGrads<B> {
    pub fn new(b: &B, c: &CaptionerConfig, rows: usize) -> Self {
        let n = rows * c.image_tokens * c.decoder.width;
        ImageGrads {
            d_keys: b.zeros(n),
            d_values: b.zeros(n),
            d_pre: b.zeros(n),
            d_mean_pre: b.zeros(rows * c.decoder.width),
        }
    }

    pub fn zero(&mut self, b: &B) {
        b.fill(&mut self.d_keys, 0.0);
        b.fill(&mut self.d_values, 0.0);
    }
}

impl TokenLayers {
    pub fn new<B: Backend>(p: &mut Params<B>, c: &CaptionerConfig) -> Self {
        let h = c.decoder.width;
        let pooled = c.lstm.is_some_and(|l| {
            l.variant == LstmVariant::SelfCritical && l.model == LstmModel::UpDown
        });
        TokenLayers {
            att_embed: linear(p, "att_embed", h, c.embed_dim),
            ctx2att: linear(p, "ctx2att", h, h),
            fc_embed: pooled.then(|| linear(p, "fc_embed", h, c.embed_dim)),
        }
    }

    /// Whether parameter `name` is one of these layers: the adapter
    /// between the image and the decoder.
    pub fn is_adapter(name: &str) -> bool {
        ["att_embed.", "ctx2att.", "fc_embed."]
            .iter()
            .any(|layer| name.starts_with(layer))
    }

    /// The image side from `features` (`[rows, tokens, embed_dim]`).
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        c: &CaptionerConfig,
        features: &[f32],
        image: &mut Image<B>,
    ) {
        let (h, n) = (c.decoder.width, image.rows * c.image_tokens);
        b.write(&mut image.features, features);
        let (w, bias) = self.att_embed;
        let embed = Matmul::new(n, h, c.embed_dim).trans_b();
        b.matmul_bias(
            &image.features,
            p.value(w),
            p.value(bias),
            &mut image.pre,
            &embed,
        );
        b.relu(&image.pre, &mut image.values);
        let (w, bias) = self.ctx2att;
        let keys = Matmul::new(n, h, h).trans_b();
        b.matmul_bias(
            &image.values,
            p.value(w),
            p.value(bias),
            &mut image.keys,
            &keys,
        );
        match self.fc_embed {
            Some((w, bias)) => {
                let e = c.embed_dim;
                b.mean_pool(&image.features, &mut image.raw_mean, c.image_tokens, e);
                let shape = Matmul::new(image.rows, h, e).trans_b();
                let (raw, pre) = (&image.raw_mean, &mut image.mean_pre);
                b.matmul_bias(raw, p.value(w), p.value(bias), pre, &shape);
                b.relu(&image.mean_pre, &mut image.mean);
            }
            None => b.mean_pool(&image.values, &mut image.mean, c.image_tokens, h),
        }
    }

    /// The gradient w.r.t. v̄, `d_mean` `[rows, h]`, taken back: into the
    /// values' gradient, or `fc_embed`'s.
    pub fn mean_backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        c: &CaptionerConfig,
        image: &Image<B>,
        d_mean: &B::Tensor,
        grads: &mut ImageGrads<B>,
    ) {
        let h = c.decoder.width;
        match self.fc_embed {
            Some((w, bias)) => {
                b.relu_backward(&image.mean_pre, d_mean, &mut grads.d_mean_pre);
                let weight_grad = Matmul::new(h, c.embed_dim, image.rows)
                    .trans_a()
                    .accumulate();
                b.matmul(&grads.d_mean_pre, &image.raw_mean, p.grad(w), &weight_grad);
                b.column_sum(&grads.d_mean_pre, image.rows, h, p.grad(bias), true);
            }
            None => {
                let tokens = c.image_tokens;
                b.mean_pool_backward(d_mean, &mut grads.d_values, tokens, h, true);
            }
        }
    }

    /// The layers' gradients from those w.r.t. the keys and the values.
    pub fn backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        c: &CaptionerConfig,
        image: &Image<B>,
        grads: &mut ImageGrads<B>,
    ) {
        let (h, n) = (c.decoder.width, image.rows * c.image_tokens);
        let (w, bias) = self.ctx2att;
        let weight_grad = Matmul::new(h, h, n).trans_a().accumulate();
        b.matmul(&grads.d_keys, &image.values, p.grad(w), &weight_grad);
        b.column_sum(&grads.d_keys, n, h, p.grad(bias), true);
        let to_values = Matmul::new(n, h, h).accumulate();
        b.matmul(&grads.d_keys, p.value(w), &mut grads.d_values, &to_values);
        b.relu_backward(&image.pre, &grads.d_values, &mut grads.d_pre);
        let (w, bias) = self.att_embed;
        let weight_grad = Matmul::new(h, c.embed_dim, n).trans_a().accumulate();
        b.matmul(&grads.d_pre, &image.features, p.grad(w), &weight_grad);
        b.column_sum(&grads.d_pre, n, h, p.grad(bias), true);
    }
}
