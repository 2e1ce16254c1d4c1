//! A linear layer y = x W + b, W stored [inputs, outputs].

use crate::backend::{Backend, Matmul, Storage};

/// Dimensions of a linear layer applied to `rows` rows.
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    pub rows: usize,
    pub inputs: usize,
    pub outputs: usize,
}

impl Linear {
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &B::Tensor,
        w: &B::Tensor,
        bias: Option<&B::Tensor>,
        y: &mut B::Tensor,
    ) {
        let shape = Matmul::new(self.rows, self.outputs, self.inputs);
        match bias {
            Some(bias) => b.matmul_bias(x, w, bias, y, &shape),
            None => b.matmul(x, w, y, &shape),
        }
    }

    /// y = x W + b + residual (one dispatch on the GPU where there is a
    /// bias): a residual branch's output joining the stream.
    pub fn forward_residual<B: Backend>(
        &self,
        b: &B,
        x: &B::Tensor,
        w: &B::Tensor,
        bias: Option<&B::Tensor>,
        residual: &B::Tensor,
        y: &mut B::Tensor,
    ) {
        let shape = Matmul::new(self.rows, self.outputs, self.inputs);
        match bias {
            Some(bias) => b.matmul_bias_residual(x, w, bias, residual, y, &shape),
            None => {
                b.matmul(x, w, y, &shape);
                b.axpby(1.0, residual, 1.0, y);
            }
        }
    }

    /// y = GELU(x W + b), keeping the pre-activation x W + b in `pre`
    /// (one dispatch on the GPU).
    pub fn forward_gelu<B: Backend>(
        &self,
        b: &B,
        x: &B::Tensor,
        w: &B::Tensor,
        bias: &B::Tensor,
        pre: &mut B::Tensor,
        y: &mut B::Tensor,
    ) {
        let shape = Matmul::new(self.rows, self.outputs, self.inputs);
        b.matmul_bias_gelu(x, w, bias, pre, y, &shape);
    }

    /// dW += x^T dy; dbias += column sums of dy; dx (+)= dy W^T when asked for.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Backend>(
        &self,
        b: &B,
        dy: &B::Tensor,
        x: &B::Tensor,
        w: &B::Tensor,
        dw: &mut B::Tensor,
        dbias: Option<&mut B::Tensor>,
        dx: Option<(&mut B::Tensor, bool)>,
    ) {
        self.parameter_gradients(b, dy, x, dw, dbias);
        if let Some((dx, accumulate)) = dx {
            let mut shape = self.input_gradient();
            shape.accumulate = accumulate;
            b.matmul(dy, w, dx, &shape);
        }
    }

    /// `backward` for a layer whose input x was GELU(pre): the gradient
    /// w.r.t. pre, not x, is written to `d_pre`, in the same dispatch on
    /// the GPU as dy W^T.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_through_gelu<B: Backend>(
        &self,
        b: &B,
        dy: &B::Tensor,
        x: &B::Tensor,
        w: &B::Tensor,
        dw: &mut B::Tensor,
        dbias: Option<&mut B::Tensor>,
        pre: &B::Tensor,
        d_pre: &mut B::Tensor,
    ) {
        self.parameter_gradients(b, dy, x, dw, dbias);
        b.matmul_gelu_backward(dy, w, pre, d_pre, &self.input_gradient());
    }

    /// dW += x^T dy; dbias += column sums of dy. Nothing for a frozen
    /// layer (an empty dW).
    fn parameter_gradients<B: Backend>(
        &self,
        b: &B,
        dy: &B::Tensor,
        x: &B::Tensor,
        dw: &mut B::Tensor,
        dbias: Option<&mut B::Tensor>,
    ) {
        if dw.is_empty() {
            return;
        }
        let dw_shape = Matmul::new(self.inputs, self.outputs, self.rows)
            .trans_a()
            .accumulate();
        match dbias {
            Some(dbias) => b.matmul_column_sums(x, dy, dw, dbias, &dw_shape),
            None => b.matmul(x, dy, dw, &dw_shape),
        }
    }

    /// dx = dy W^T.
    fn input_gradient(&self) -> Matmul {
        Matmul::new(self.rows, self.inputs, self.outputs).trans_b()
    }
}
