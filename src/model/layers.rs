//! Layers bound to their parameters: a dense layer and a layer norm, each
//! a thin wrapper over the ops that looks its weights up by id.

use super::params::{Init, ParamId, Params};
use crate::backend::Backend;
use crate::ops::linear::Linear;

const LN_EPS: f32 = 1e-5;

/// y = x W + b over `rows` rows.
pub struct Dense {
    pub shape: Linear,
    pub w: ParamId,
    pub bias: ParamId,
}

impl Dense {
    pub fn new<B: Backend>(
        b: &B,
        params: &mut Params<B>,
        name: &str,
        rows: usize,
        inputs: usize,
        outputs: usize,
        std: f32,
    ) -> Self {
        Dense {
            shape: Linear {
                rows,
                inputs,
                outputs,
            },
            w: params.add(
                b,
                format!("{name}.weight"),
                &[inputs, outputs],
                Init::Normal(std),
                true,
            ),
            bias: params.add(
                b,
                format!("{name}.bias"),
                &[outputs],
                Init::Const(0.0),
                false,
            ),
        }
    }

    pub fn forward<B: Backend>(&self, b: &B, params: &Params<B>, x: &B::Tensor, y: &mut B::Tensor) {
        self.shape
            .forward(b, x, params.value(self.w), Some(params.value(self.bias)), y);
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
        self.shape
            .backward(b, dy, x, &values[self.w.0], dw, Some(dbias), dx);
    }
}

/// Layer norm over rows of `cols`, with its saved statistics.
pub struct Norm<B: Backend> {
    pub cols: usize,
    pub gamma: ParamId,
    pub beta: ParamId,
    mean: B::Tensor,
    rstd: B::Tensor,
}

impl<B: Backend> Norm<B> {
    pub fn new(b: &B, params: &mut Params<B>, name: &str, rows: usize, cols: usize) -> Self {
        Norm {
            cols,
            gamma: params.add(
                b,
                format!("{name}.weight"),
                &[cols],
                Init::Const(1.0),
                false,
            ),
            beta: params.add(b, format!("{name}.bias"), &[cols], Init::Const(0.0), false),
            mean: b.zeros(rows),
            rstd: b.zeros(rows),
        }
    }

    pub fn forward(&mut self, b: &B, params: &Params<B>, x: &B::Tensor, y: &mut B::Tensor) {
        b.layer_norm(
            x,
            params.value(self.gamma),
            params.value(self.beta),
            y,
            &mut self.mean,
            &mut self.rstd,
            self.cols,
            LN_EPS,
        );
    }

    /// dx (+)= the input gradient; gamma's and beta's accumulate.
    pub fn backward(
        &self,
        b: &B,
        params: &mut Params<B>,
        dy: &B::Tensor,
        x: &B::Tensor,
        dx: &mut B::Tensor,
        accumulate: bool,
    ) {
        let (values, [dgamma, dbeta]) = params.for_backward(self.gamma, self.beta);
        b.layer_norm_backward(
            dy,
            x,
            &values[self.gamma.0],
            &self.mean,
            &self.rstd,
            dx,
            dgamma,
            dbeta,
            self.cols,
            accumulate,
        );
    }
}
