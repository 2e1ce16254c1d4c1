//! Layers bound to their parameters: a dense layer and a layer norm, each
//! a thin wrapper over the ops that looks its weights up by id. A layer
//! holds no activations, so one layer serves batches of any size; what a
//! layer norm saves for its backward lives in the caller's [`NormStats`].

use super::params::{Init, ParamId, Params};
use crate::backend::{Backend, Storage};
use crate::ops::linear::Linear;

const LN_EPS: f32 = 1e-5;

/// y = x W + b over the rows of x.
pub struct Dense {
    pub inputs: usize,
    pub outputs: usize,
    pub w: ParamId,
    pub bias: ParamId,
}

impl Dense {
    pub fn new<B: Backend>(
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
            bias: params.add(format!("{name}.bias"), &[outputs], Init::Const(0.0), false),
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
        self.on(x.len())
            .forward(b, x, params.value(self.w), Some(params.value(self.bias)), y);
    }

    /// y = GELU(x W + b), the pre-activation kept in `pre`.
    pub fn forward_gelu<B: Backend>(
        &self,
        b: &B,
        params: &Params<B>,
        x: &B::Tensor,
        pre: &mut B::Tensor,
        y: &mut B::Tensor,
    ) {
        let (w, bias) = (params.value(self.w), params.value(self.bias));
        self.on(x.len()).forward_gelu(b, x, w, bias, pre, y);
    }

    /// `backward` for a layer whose input x was GELU(pre) (the layer after
    /// `forward_gelu`): writes the gradient w.r.t. pre to `d_pre`.
    pub fn backward_through_gelu<B: Backend>(
        &self,
        b: &B,
        params: &mut Params<B>,
        dy: &B::Tensor,
        x: &B::Tensor,
        pre: &B::Tensor,
        d_pre: &mut B::Tensor,
    ) {
        let (values, [dw, dbias]) = params.for_backward(self.w, self.bias);
        self.on(x.len())
            .backward_through_gelu(b, dy, x, &values[self.w.0], dw, dbias, pre, d_pre);
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
        let (values, [dw, dbias]) = params.for_backward(self.w, self.bias);
        self.on(x.len())
            .backward(b, dy, x, &values[self.w.0], dw, Some(dbias), dx);
    }
}

/// Layer norm over rows of `cols`.
pub struct Norm {
    pub cols: usize,
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
        Norm {
            cols,
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
            LN_EPS,
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
