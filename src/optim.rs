//! AdamW with decoupled weight decay and global-norm gradient clipping,
//! entirely on the device: the squared norm of every gradient is reduced
//! into a slot, the slots into one total, and the update kernel reads the
//! total to clip. Nothing is read back unless the norm is logged.

use crate::backend::{AdamWStep, Backend, Reduce};
use crate::model::params::{decay_groups, grouped_tensors};

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Clip the global gradient norm to this; None = no clipping.
    pub max_grad_norm: Option<f32>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
        }
    }
}

/// Linear warm-up over `warmup` steps to `peak`, then cosine decay to 0
/// at step `total`.
pub fn warmup_cosine(peak: f32, warmup: usize, step: usize, total: usize) -> f32 {
    if step < warmup {
        return peak * (step + 1) as f32 / warmup as f32;
    }
    let progress = (step - warmup) as f32 / (total - warmup).max(1) as f32;
    peak * 0.5 * (1.0 + (std::f32::consts::PI * progress.min(1.0)).cos())
}

pub struct AdamW<B: Backend> {
    pub config: AdamWConfig,
    step: u64,
    /// The parameters that decay, then the others (biases and norms), as
    /// `Params` groups them; the moments are grouped the same way. A frozen
    /// parameter is in neither (`train_only`).
    groups: [Vec<usize>; 2],
    m: Vec<B::Tensor>,
    v: Vec<B::Tensor>,
    grad_sumsq: B::Tensor,
}

impl<B: Backend> AdamW<B> {
    /// `params[i]` = (element count, whether weight decay applies).
    pub fn new(b: &B, config: AdamWConfig, params: &[(usize, bool)]) -> Self {
        let groups = decay_groups(params.iter().map(|p| p.1));
        let zeros: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.0]).collect();
        AdamW {
            config,
            step: 0,
            m: grouped_tensors(b, &zeros, &groups),
            v: grouped_tensors(b, &zeros, &groups),
            groups,
            grad_sumsq: b.zeros(1),
        }
    }

    /// Leaves the parameters `trains` says no to untouched from now on:
    /// no update, no weight decay, and no part in the gradient norm.
    pub fn train_only(&mut self, trains: impl Fn(usize) -> bool) {
        for group in &mut self.groups {
            group.retain(|&i| trains(i));
        }
    }

    /// Updates every trained parameter from its gradient (same order as in `new`):
    /// one op per group where the backend lays groups out in one
    /// allocation (`Backend::span`), else one per tensor.
    pub fn step(&mut self, b: &B, params: &mut [&mut B::Tensor], grads: &[&B::Tensor]) {
        assert!(
            params.len() == self.m.len() && grads.len() == self.m.len(),
            "AdamW: one gradient per parameter"
        );
        self.step += 1;
        // The squared norm over every group (or trained tensor).
        let spans: Vec<Option<B::Tensor>> = self
            .groups
            .iter()
            .map(|group| b.span(&group.iter().map(|&i| grads[i]).collect::<Vec<_>>()))
            .collect();
        let parts: Vec<&B::Tensor> = if spans.iter().all(Option::is_some) {
            spans.iter().flatten().collect()
        } else {
            self.groups.iter().flatten().map(|&i| grads[i]).collect()
        };
        b.reduce_parts(&parts, Reduce::SumSquares, &mut self.grad_sumsq, 0);
        for (g, group) in self.groups.iter().enumerate() {
            let s = AdamWStep {
                lr: self.config.lr,
                beta1: self.config.beta1,
                beta2: self.config.beta2,
                eps: self.config.eps,
                // Group 0 decays.
                weight_decay: if g == 0 {
                    self.config.weight_decay
                } else {
                    0.0
                },
                t: self.step,
                max_norm: self.config.max_grad_norm.unwrap_or(0.0),
            };
            let span =
                |ts: &[&B::Tensor]| b.span(&group.iter().map(|&i| ts[i]).collect::<Vec<_>>());
            let values: Vec<&B::Tensor> = params.iter().map(|p| &**p).collect();
            let (m, v): (Vec<&B::Tensor>, Vec<&B::Tensor>) =
                (self.m.iter().collect(), self.v.iter().collect());
            if let (Some(mut value), Some(grad), Some(mut m), Some(mut v)) =
                (span(&values), span(grads), span(&m), span(&v))
            {
                b.adamw(&mut value, &grad, &mut m, &mut v, &self.grad_sumsq, &s);
                continue;
            }
            for &i in group {
                b.adamw(
                    params[i],
                    grads[i],
                    &mut self.m[i],
                    &mut self.v[i],
                    &self.grad_sumsq,
                    &s,
                );
            }
        }
    }

    /// The global gradient norm of the last step, before clipping (reads back).
    pub fn last_grad_norm(&self, b: &B) -> f32 {
        b.to_vec(&self.grad_sumsq)[0].sqrt()
    }

    /// Its square, on the device (one element).
    pub fn grad_sumsq(&self) -> &B::Tensor {
        &self.grad_sumsq
    }

    /// The step count and both moments of every parameter (for resuming).
    pub fn state(&self, b: &B) -> (u64, Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let read = |ts: &[B::Tensor]| ts.iter().map(|t| b.to_vec(t)).collect();
        (self.step, read(&self.m), read(&self.v))
    }

    /// Restores what `state` returned.
    pub fn restore(&mut self, b: &B, step: u64, m: &[Vec<f32>], v: &[Vec<f32>]) {
        assert!(
            m.len() == self.m.len() && v.len() == self.v.len(),
            "one moment per parameter"
        );
        self.step = step;
        for (dst, src) in self.m.iter_mut().zip(m).chain(self.v.iter_mut().zip(v)) {
            b.write(dst, src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::warmup_cosine;

    #[test]
    fn the_schedule_warms_up_from_its_first_step_then_follows_the_cosine() {
        // Warm-up over 4 of 12 steps: the first step already trains, at a
        // quarter of the peak, and the 4th reaches it.
        let lr = |step| warmup_cosine(2.0, 4, step, 12);
        let warm: Vec<f32> = (0..5).map(lr).collect();
        assert_eq!(warm, [0.5, 1.0, 1.5, 2.0, 2.0]);
        // Then half way through the 8 decay steps: half the peak; at the
        // end and past it: 0.
        assert!((lr(8) - 1.0).abs() < 1e-6, "{}", lr(8));
        assert!((lr(6) - (1.0 + (std::f32::consts::PI / 4.0).cos())).abs() < 1e-6);
        assert!(lr(12).abs() < 1e-6 && lr(20).abs() < 1e-6);
        // Without warm-up the first step is at the peak; a schedule as
        // long as its warm-up stays there.
        assert_eq!(warmup_cosine(2.0, 0, 0, 12), 2.0);
        assert_eq!(warmup_cosine(2.0, 3, 3, 3), 2.0);
    }
}
