//! Layers bound to their parameters: a dense layer and a layer norm, each
//! a thin wrapper over the ops that looks its weights up by id. A layer
//! holds no activations, so one layer serves batches of any size; what a
//! layer norm saves for its backward lives in the caller's [`NormStats`].

use super::params::{Init, ParamId, Params};
use crate::backend::{Backend, Storage};
use crate::ops::linear::Linear;
use serde::{Deserialize, Serialize};

/// A layer norm's epsilon, added to the variance: 1e-5 (GPT-2's and
/// CLIP's) unless a model says otherwise (BERT's 1e-12). Compared bit for
/// bit, so that the configs holding one stay `Eq`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NormEpsilon(pub f32);

impl NormEpsilon {
    pub const DEFAULT: NormEpsilon = NormEpsilon(1e-5);

    pub fn is_default(&self) -> bool {
        *self == Self::DEFAULT
    }
}

impl Default for NormEpsilon {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl PartialEq for NormEpsilon {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for NormEpsilon {}

/// The activation after a dense layer: GELU (tanh approximation, GPT-2's
/// and captune's), tanh (ClipCap's MLP mapper), ReLU (ClipCap's
/// transformer mapper), quick GELU (x sigmoid(1.702 x), OpenAI's CLIPs)
/// or GELU with the exact normal CDF (other CLIPs').
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    #[default]
    Gelu,
    Tanh,
    Relu,
    #[serde(rename = "quick_gelu")]
    QuickGelu,
    #[serde(rename = "gelu_erf")]
    GeluErf,
}

impl Activation {
    /// Whether the activation's gradient is fused into the next layer's
    /// input gradient (GELU's is); the others need a buffer of their own
    /// for the gradient at their output.
    pub fn is_fused(self) -> bool {
        self == Activation::Gelu
    }
}

/// y = x W + b over the rows of x (b optional).
pub struct Dense {
    pub inputs: usize,
    pub outputs: usize,
    pub w: ParamId,
    pub bias: Option<ParamId>,
}

impl Dense {
    pub fn new<B: Backend>(
        params: &mut Params<B>,
        name: &str,
        inputs: usize,
        outputs: usize,
        std: f32,
    ) -> Self {
        let mut dense = Self::without_bias(params, name, inputs, outputs, std);
        dense.bias = Some(params.add(format!("{name}.bias"), &[outputs], Init::Const(0.0), false));
        dense
    }

    /// y = x W: a layer with no bias parameter.
    pub fn without_bias<B: Backend>(
        params: &mut Params<B>,
        name: &str,
        inputs: usize,
        outputs: usize,
        std: f32,
    ) -> Self {
        Dense {
            inputs,
            outputs,
            w: params.add(
                format!("{name}.weight"),
                &[inputs, outputs],
                Init::Normal(std),
                true,
            ),
            bias: None,
        }
    }

    /// The shape of this layer applied to x (`[rows, inputs]`).
    fn on(&self, x_len: usize) -> Linear {
        debug_assert!(x_len.is_multiple_of(self.inputs), "x is [rows, inputs]");
        Linear {
            rows: x_len / self.inputs,
            inputs: self.inputs,
            outputs: self.outputs,
        }
    }

    pub fn forward<B: Backend>(&self, b: &B, params: &Params<B>, x: &B::Tensor, y: &mut B::Tensor) {
        let bias = self.bias.map(|id| params.value(id));
        self.on(x.len())
            .forward(b, x, params.value(self.w), bias, y);
    }

    /// y = x W + b + residual: the layer ending a residual branch, joined
    /// to the stream in the same dispatch on the GPU.
    pub fn forward_residual<B: Backend>(
        &self,
        b: &B,
        params: &Params<B>,
        x: &B::Tensor,
        residual: &B::Tensor,
        y: &mut B::Tensor,
    ) {
        let bias = self.bias.map(|id| params.value(id));
        self.on(x.len())
            .forward_residual(b, x, params.value(self.w), bias, residual, y);
    }

    /// y = act(x W + b), the pre-activation kept in `pre` (GELU in the
    /// same dispatch on the GPU).
    pub fn forward_act<B: Backend>(
        &self,
        b: &B,
        params: &Params<B>,
        act: Activation,
        x: &B::Tensor,
        pre: &mut B::Tensor,
        y: &mut B::Tensor,
    ) {
        match (act, self.bias) {
            (Activation::Gelu, Some(bias)) => {
                let (w, bias) = (params.value(self.w), params.value(bias));
                self.on(x.len()).forward_gelu(b, x, w, bias, pre, y);
            }
            (Activation::Gelu, None) => {
                self.forward(b, params, x, pre);
                b.gelu(pre, y);
            }
            (Activation::Tanh, _) => {
                self.forward(b, params, x, pre);
                b.tanh(pre, y);
            }
            (Activation::Relu, _) => {
                self.forward(b, params, x, pre);
                b.relu(pre, y);
            }
            (Activation::QuickGelu, _) => {
                self.forward(b, params, x, pre);
                b.quick_gelu(pre, y);
            }
            (Activation::GeluErf, _) => {
                self.forward(b, params, x, pre);
                b.gelu_erf(pre, y);
            }
        }
    }

    /// `backward` for a layer whose input x was act(pre) (the layer after
    /// `forward_act`): writes the gradient w.r.t. pre to `d_pre`. Unless
    /// the activation is fused, `d_x` holds the gradient w.r.t. x on the
    /// way (`[rows, inputs]`; unused, and may be empty, for GELU).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_through_act<B: Backend>(
        &self,
        b: &B,
        params: &mut Params<B>,
        act: Activation,
        dy: &B::Tensor,
        x: &B::Tensor,
        pre: &B::Tensor,
        d_x: &mut B::Tensor,
        d_pre: &mut B::Tensor,
    ) {
        match act {
            Activation::Gelu => {
                let linear = self.on(x.len());
                match self.bias {
                    Some(bias) => {
                        let (values, [dw, dbias]) = params.for_backward(self.w, bias);
                        let w = &values[self.w.0];
                        linear.backward_through_gelu(b, dy, x, w, dw, Some(dbias), pre, d_pre);
                    }
                    None => {
                        let (values, dw) = params.for_backward_one(self.w);
                        let w = &values[self.w.0];
                        linear.backward_through_gelu(b, dy, x, w, dw, None, pre, d_pre);
                    }
                }
            }
            Activation::Tanh => {
                self.backward(b, params, dy, x, Some((d_x, false)));
                b.tanh_backward(pre, d_x, d_pre);
            }
            Activation::Relu => {
                self.backward(b, params, dy, x, Some((d_x, false)));
                b.relu_backward(pre, d_x, d_pre);
            }
            Activation::QuickGelu => {
                self.backward(b, params, dy, x, Some((d_x, false)));
                b.quick_gelu_backward(pre, d_x, d_pre);
            }
            Activation::GeluErf => {
                self.backward(b, params, dy, x, Some((d_x, false)));
                b.gelu_erf_backward(pre, d_x, d_pre);
            }
        }
    }

    /// Gradients accumulate into the parameters'; dx (+)= when given.
    pub fn backward<B: Backend>(
        &self,
        b: &B,
        params: &mut Params<B>,
        dy: &B::Tensor,
        x: &B::Tensor,
        dx: Option<(&mut B::Tensor, bool)>,
    ) {
        let linear = self.on(x.len());
        match self.bias {
            Some(bias) => {
                let (values, [dw, dbias]) = params.for_backward(self.w, bias);
                linear.backward(b, dy, x, &values[self.w.0], dw, Some(dbias), dx);
            }
            None => {
                let (values, dw) = params.for_backward_one(self.w);
                linear.backward(b, dy, x, &values[self.w.0], dw, None, dx);
            }
        }
    }
}

/// Layer norm over rows of `cols`.
pub struct Norm {
    pub cols: usize,
    eps: f32,
    pub gamma: ParamId,
    pub beta: ParamId,
}

/// A layer norm's per-row mean and 1/std, saved by forward for backward.
pub struct NormStats<B: Backend> {
    mean: B::Tensor,
    rstd: B::Tensor,
}

impl<B: Backend> NormStats<B> {
    pub fn new(b: &B, rows: usize) -> Self {
        NormStats {
            mean: b.zeros(rows),
            rstd: b.zeros(rows),
        }
    }
}

impl Norm {
    pub fn new<B: Backend>(params: &mut Params<B>, name: &str, cols: usize) -> Self {
        Self::with_eps(params, name, cols, NormEpsilon::DEFAULT)
    }

    pub fn with_eps<B: Backend>(
        params: &mut Params<B>,
        name: &str,
        cols: usize,
        eps: NormEpsilon,
    ) -> Self {
        Norm {
            cols,
            eps: eps.0,
            gamma: params.add(format!("{name}.weight"), &[cols], Init::Const(1.0), false),
            beta: params.add(format!("{name}.bias"), &[cols], Init::Const(0.0), false),
        }
    }

    pub fn forward<B: Backend>(
        &self,
        b: &B,
        params: &Params<B>,
        x: &B::Tensor,
        y: &mut B::Tensor,
        stats: &mut NormStats<B>,
    ) {
        b.layer_norm(
            x,
            params.value(self.gamma),
            params.value(self.beta),
            y,
            &mut stats.mean,
            &mut stats.rstd,
            self.cols,
            self.eps,
        );
    }

    /// dx (+)= the input gradient; gamma's and beta's accumulate.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Backend>(
        &self,
        b: &B,
        params: &mut Params<B>,
        dy: &B::Tensor,
        x: &B::Tensor,
        stats: &NormStats<B>,
        dx: &mut B::Tensor,
        accumulate: bool,
    ) {
        let (values, [dgamma, dbeta]) = params.for_backward(self.gamma, self.beta);
        b.layer_norm_backward(
            dy,
            x,
            &values[self.gamma.0],
            &stats.mean,
            &stats.rstd,
            dx,
            dgamma,
            dbeta,
            self.cols,
            accumulate,
        );
    }
}
