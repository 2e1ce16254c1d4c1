//! A linear layer y = x W + b, W stored [inputs, outputs].

use crate::backend::{Backend, Matmul};

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
        let dw_shape = Matmul::new(self.inputs, self.outputs, self.rows)
            .trans_a()
            .accumulate();
        match dbias {
            Some(dbias) => b.matmul_column_sums(x, dy, dw, dbias, &dw_shape),
            None => b.matmul(x, dy, dw, &dw_shape),
        }
        if let Some((dx, accumulate)) = dx {
            let mut shape = Matmul::new(self.rows, self.inputs, self.outputs).trans_b();
            shape.accumulate = accumulate;
            b.matmul(dy, w, dx, &shape);
        }
    }
}
