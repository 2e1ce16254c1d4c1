//! What the attention LSTMs share: image tokens embedded, v_n =
//! ReLU(`att_embed`(x_n)), and projected once to attention keys, k_n =
//! `ctx2att`(v_n), with v̄ their mean; and the layers they are built of,
//! in PyTorch's layouts (`[outputs, inputs]`) and initial spreads.

use crate::backend::Backend;
use crate::backend::Matmul;
use crate::captioner::CaptionerConfig;
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

/// `nn.LSTMCell`'s parameters, `hidden` wide.
pub(super) struct Cell {
    pub weight_ih: ParamId,
    pub weight_hh: ParamId,
    pub bias_ih: ParamId,
    pub bias_hh: ParamId,
}

impl Cell {
    pub fn new<B: Backend>(p: &mut Params<B>, name: &str, inputs: usize, hidden: usize) -> Self {
        let h = hidden;
        let mut add = |what: &str, shape: &[usize], init, decay| {
            p.add(format!("{name}.{what}"), shape, init, decay)
        };
        Cell {
            weight_ih: add("weight_ih", &[4 * h, inputs], spread(h), true),
            weight_hh: add("weight_hh", &[4 * h, h], spread(h), true),
            bias_ih: add("bias_ih", &[4 * h], Init::Const(0.0), false),
            bias_hh: add("bias_hh", &[4 * h], Init::Const(0.0), false),
        }
    }

    /// Its two biases summed.
    pub fn bias<B: Backend>(&self, b: &B, p: &Params<B>, out: &mut B::Tensor) {
        b.add(1.0, p.value(self.bias_ih), 1.0, p.value(self.bias_hh), out);
    }
}

/// The token embedding and the keys' projection.
pub(super) struct TokenLayers {
    att_embed: Linear,
    ctx2att: Linear,
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
        }
    }
}

/// The gradients w.r.t. a batch's keys and values, which the attention
/// adds to, and the scratch of their way back.
pub(super) struct ImageGrads<B: Backend> {
    pub d_keys: B::Tensor,
    pub d_values: B::Tensor,
    d_pre: B::Tensor,
}

impl<B: Backend> ImageGrads<B> {
    pub fn new(b: &B, c: &CaptionerConfig, rows: usize) -> Self {
        let n = rows * c.image_tokens * c.decoder.width;
        ImageGrads {
            d_keys: b.zeros(n),
            d_values: b.zeros(n),
            d_pre: b.zeros(n),
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
        TokenLayers {
            att_embed: linear(p, "att_embed", h, c.embed_dim),
            ctx2att: linear(p, "ctx2att", h, h),
        }
    }

    /// Whether parameter `name` is one of these layers: the adapter
    /// between the image and the decoder.
    pub fn is_adapter(name: &str) -> bool {
        name.starts_with("att_embed.") || name.starts_with("ctx2att.")
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
        b.mean_pool(&image.values, &mut image.mean, c.image_tokens, h);
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
