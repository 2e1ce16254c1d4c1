//! The MLE mix: lambda x MLE on the references + (1 - lambda) x an
//! objective's own loss (`mle_weight`), one wrapper for every objective
//! that takes the setting and does not mix inside its own loss (the SMILE
//! family mixes in its softmax pass). The registry wraps them and hands
//! in its MLE (`objectives::build`), so neither an objective's own file
//! nor this one names another objective.
//!
//! The own objective's gradient, written into zeroed gradients, is scaled
//! by 1 - lambda; MLE's is then added at lambda, times the step's gradient
//! weight (which evens out reference captions' lengths; generated captions
//! have none to even out). Under a labelled fraction MLE reads the
//! labelled batch beside the unlabelled images
//! (`TrainingBatch::references`).

use super::explain::{ExplainContext, Explanation};
use super::objective::{Objective, StepContext};
use crate::backend::Backend;
use anyhow::Result;
use std::time::Duration;

pub struct MleMix<B: Backend> {
    own: Box<dyn Objective<B>>,
    mle: Box<dyn Objective<B>>,
    /// lambda.
    weight: f32,
}

impl<B: Backend> MleMix<B> {
    /// `own` mixed with `mle` at `weight`.
    pub fn new(own: Box<dyn Objective<B>>, mle: Box<dyn Objective<B>>, weight: f32) -> Self {
        MleMix { own, mle, weight }
    }
}

impl<B: Backend> Objective<B> for MleMix<B> {
    fn describe(&self) -> String {
        self.own.describe()
    }

    fn step(&mut self, cx: &mut StepContext<'_, B>) -> Result<()> {
        self.own.step(cx)?;
        cx.model.params_mut().scale_grads(cx.b, 1.0 - self.weight);
        let full = cx.gradient_weight;
        cx.gradient_weight = full * self.weight;
        let stepped = self.mle.step(cx);
        cx.gradient_weight = full;
        stepped
    }

    fn logged(&self) -> Vec<&B::Tensor> {
        let mut out = self.own.logged();
        out.extend(self.mle.logged());
        out
    }

    /// The own values, its `loss` mixed, then `mle`.
    fn report(&self, read: &[f32]) -> Vec<(&'static str, f32)> {
        let own = self.own.logged().len();
        let mle = self.mle.report(&read[own..])[0].1;
        let mut values = self.own.report(&read[..own]);
        for (name, value) in values.iter_mut() {
            if *name == "loss" {
                *value = (1.0 - self.weight) * *value + self.weight * mle;
            }
        }
        values.push(("mle", mle));
        values
    }

    fn phases(&self) -> Vec<(&'static str, Duration)> {
        self.own.phases()
    }

    /// The own objective's: its token terms already carry 1 - lambda.
    fn explain(&mut self, cx: &mut ExplainContext<'_, B>) -> Result<Option<Explanation>> {
        self.own.explain(cx)
    }

    fn state(&self) -> Vec<f64> {
        self.own.state()
    }

    fn restore(&mut self, state: &[f64]) -> Result<()> {
        self.own.restore(state)
    }
}
