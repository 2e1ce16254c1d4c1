//! A model's parameters and their gradients, by name: layers hold a
//! [`ParamId`], the optimiser and checkpoints see the whole list.
//!
//! A model declares its parameters (`add`), then `finish` allocates them:
//! the parameters that decay in one [`Backend::tensor_group`], the others
//! in another, and the gradients the same way, so that zeroing the
//! gradients, their norm and the AdamW update are one op per group
//! (on the GPU, one dispatch over one buffer) instead of one per tensor.

use crate::backend::{Backend, Storage};
use crate::tensorfile;
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use std::collections::HashMap;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamId(pub(crate) usize);

#[derive(Clone, Copy, Debug)]
pub enum Init {
    Normal(f32),
    Const(f32),
}

pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Weight decay applies (matrices), or not (biases, norms, embeddings' scale).
    pub decay: bool,
}

impl ParamSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct Params<B: Backend> {
    pub specs: Vec<ParamSpec>,
    pub values: Vec<B::Tensor>,
    pub grads: Vec<B::Tensor>,
    /// Initial values of the parameters declared and not yet allocated.
    pending: Vec<Vec<f32>>,
    /// Initial values come from here, on the host, so every backend starts
    /// from the same numbers.
    rng: ChaCha8Rng,
    /// Every value starts at zero instead (the caller writes the weights).
    zeros: bool,
}

/// The indices of the tensors that decay, then of those that do not,
/// each ascending: the two groups parameters, gradients and AdamW's
/// moments are allocated in.
pub fn decay_groups(decays: impl IntoIterator<Item = bool>) -> [Vec<usize>; 2] {
    let mut groups = [Vec::new(), Vec::new()];
    for (i, decays) in decays.into_iter().enumerate() {
        groups[usize::from(!decays)].push(i);
    }
    groups
}

/// Tensors of `data` allocated as the groups of `decay_groups`, returned
/// in index order.
pub fn grouped_tensors<B: Backend>(
    b: &B,
    data: &[Vec<f32>],
    groups: &[Vec<usize>; 2],
) -> Vec<B::Tensor> {
    let mut out: Vec<Option<B::Tensor>> = (0..data.len()).map(|_| None).collect();
    for group in groups {
        let members: Vec<&[f32]> = group.iter().map(|&i| data[i].as_slice()).collect();
        for (&i, t) in group.iter().zip(b.tensor_group(&members)) {
            out[i] = Some(t);
        }
    }
    out.into_iter()
        .map(|t| t.expect("every index is in one group"))
        .collect()
}

/// Runs `op` once on the span of each group of `tensors` where the
/// backend has one, else on every tensor.
pub fn for_each_group<B: Backend>(
    b: &B,
    tensors: &mut [B::Tensor],
    groups: &[Vec<usize>; 2],
    mut op: impl FnMut(&mut B::Tensor),
) {
    for group in groups {
        let members: Vec<&B::Tensor> = group.iter().map(|&i| &tensors[i]).collect();
        match b.span(&members) {
            Some(mut all) => op(&mut all),
            None => group.iter().for_each(|&i| op(&mut tensors[i])),
        }
    }
}

impl<B: Backend> Params<B> {
    pub fn new(seed: u64) -> Self {
        Params {
            specs: Vec::new(),
            values: Vec::new(),
            grads: Vec::new(),
            pending: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            zeros: false,
        }
    }

    /// Parameters whose values the caller writes after `finish` (weights
    /// read from a file): declared at zero, with no random draws.
    pub fn for_loading() -> Self {
        Params {
            zeros: true,
            ..Params::new(0)
        }
    }

    /// Declares a parameter; `finish` allocates it.
    pub fn add(&mut self, name: String, shape: &[usize], init: Init, decay: bool) -> ParamId {
        let spec = ParamSpec {
            name,
            shape: shape.to_vec(),
            decay,
        };
        let data: Vec<f32> = match init {
            _ if self.zeros => vec![0.0; spec.len()],
            Init::Normal(std) => {
                let normal = Normal::new(0.0, std).expect("a positive standard deviation");
                (0..spec.len())
                    .map(|_| normal.sample(&mut self.rng))
                    .collect()
            }
            Init::Const(v) => vec![v; spec.len()],
        };
        self.pending.push(data);
        self.specs.push(spec);
        ParamId(self.specs.len() - 1)
    }

    /// Allocates every declared parameter, with its initial value, and
    /// its gradient (zeros), in the decay groups.
    pub fn finish(&mut self, b: &B) {
        self.finish_values(b);
        let zeros: Vec<Vec<f32>> = self.specs.iter().map(|s| vec![0.0; s.len()]).collect();
        self.grads = grouped_tensors(b, &zeros, &self.groups());
    }

    /// `finish` for a frozen model: no gradient buffers ([`Params::freeze`]).
    pub fn finish_frozen(&mut self, b: &B) {
        self.finish_values(b);
        self.freeze(b);
    }

    fn finish_values(&mut self, b: &B) {
        assert!(self.values.is_empty(), "Params::finish runs once");
        let groups = self.groups();
        self.values = grouped_tensors(b, &std::mem::take(&mut self.pending), &groups);
    }

    fn groups(&self) -> [Vec<usize>; 2] {
        decay_groups(self.specs.iter().map(|s| s.decay))
    }

    pub fn value(&self, id: ParamId) -> &B::Tensor {
        &self.values[id.0]
    }

    pub fn value_mut(&mut self, id: ParamId) -> &mut B::Tensor {
        &mut self.values[id.0]
    }

    pub fn grad(&mut self, id: ParamId) -> &mut B::Tensor {
        &mut self.grads[id.0]
    }

    /// The values, and one gradient (a layer's weight without a bias),
    /// borrowed at once by a backward pass.
    pub fn for_backward_one(&mut self, a: ParamId) -> (&[B::Tensor], &mut B::Tensor) {
        (&self.values, &mut self.grads[a.0])
    }

    /// The values, and two distinct gradients (a layer's weight and bias),
    /// borrowed at once by a backward pass.
    pub fn for_backward(&mut self, a: ParamId, b: ParamId) -> (&[B::Tensor], [&mut B::Tensor; 2]) {
        let grads = self
            .grads
            .get_disjoint_mut([a.0, b.0])
            .expect("two distinct parameters");
        (&self.values, grads)
    }

    /// Drops every gradient buffer: a frozen model's backward passes (to
    /// an input's gradient, through it) compute no parameter gradient,
    /// since each layer skips a gradient that is empty.
    pub fn freeze(&mut self, b: &B) {
        self.grads = self.specs.iter().map(|_| b.zeros(0)).collect();
    }

    pub fn is_frozen(&self) -> bool {
        self.grads.first().is_some_and(|g| g.is_empty())
    }

    pub fn zero_grads(&mut self, b: &B) {
        if self.is_frozen() {
            return;
        }
        let groups = self.groups();
        for_each_group(b, &mut self.grads, &groups, |g| b.fill(g, 0.0));
    }

    /// Every gradient times `factor` (one dispatch per group on the GPU).
    pub fn scale_grads(&mut self, b: &B, factor: f32) {
        if self.is_frozen() {
            return;
        }
        let groups = self.groups();
        for_each_group(b, &mut self.grads, &groups, |g| b.scale(g, factor));
    }

    /// (element count, decays) per parameter, for the optimiser.
    pub fn optimizer_layout(&self) -> Vec<(usize, bool)> {
        self.specs.iter().map(|s| (s.len(), s.decay)).collect()
    }

    pub fn count(&self) -> usize {
        self.specs.iter().map(ParamSpec::len).sum()
    }

    pub fn save(&self, b: &B, path: &Path, metadata: HashMap<String, String>) -> Result<()> {
        let data: Vec<Vec<f32>> = self.values.iter().map(|v| b.to_vec(v)).collect();
        let tensors: Vec<(&str, Vec<usize>, &[f32])> = self
            .specs
            .iter()
            .zip(&data)
            .map(|(s, d)| (s.name.as_str(), s.shape.clone(), d.as_slice()))
            .collect();
        tensorfile::write(path, &tensors, metadata)
    }

    /// Overwrites every parameter from a checkpoint, which must hold each
    /// by name with the same shape.
    pub fn load(&mut self, b: &B, path: &Path, file: &mut tensorfile::TensorFile) -> Result<()> {
        for (spec, value) in self.specs.iter().zip(&mut self.values) {
            let t = file.take(&spec.name, path)?;
            if t.shape != spec.shape {
                bail!(
                    "{}: tensor {:?} has shape {:?} but the model expects {:?}; the checkpoint's config does not match",
                    path.display(),
                    spec.name,
                    t.shape,
                    spec.shape
                );
            }
            b.write(value, &t.data);
        }
        Ok(())
    }
}
