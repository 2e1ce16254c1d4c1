//! CPU twin of `shaders/adamw.wgsl`.

use crate::backend::AdamWStep;

pub fn step(
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    grad_sumsq: f32,
    s: &AdamWStep,
) {
    let clip = if s.max_norm > 0.0 {
        (s.max_norm / (grad_sumsq.sqrt() + 1e-6)).min(1.0)
    } else {
        1.0
    };
    let (bc1, bc2) = s.bias_corrections();
    for i in 0..param.len() {
        let g = grad[i] * clip;
        m[i] = s.beta1 * m[i] + (1.0 - s.beta1) * g;
        v[i] = s.beta2 * v[i] + (1.0 - s.beta2) * g * g;
        let update = (m[i] / bc1) / ((v[i] / bc2).sqrt() + s.eps);
        param[i] -= s.lr * (s.weight_decay * param[i] + update);
    }
}
