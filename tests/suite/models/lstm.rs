//! The LSTM captioner against an independent PyTorch implementation
//! (scripts/lstm_fixtures.py: `nn.LSTM` in float64, written from the
//! papers and docs/lstm.md), fed the image either way: one MLE step's
//! loss and every parameter's gradient, and the greedy captions, on both
//! backends.

use crate::common;

use captune::backend::Backend;
use captune::captioner::Checkpoint;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::model::TokenInputs;
use captune::captioner::objectives::token::{BatchTargets, Losses, TokenObjective};
use captune::cpu::CpuBackend;
use captune::data::vocab::PAD;
use captune::tensorfile::{self, TensorFile};
use rand::SeedableRng;
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn ids(file: &TensorFile, name: &str) -> Vec<u32> {
    file.tensors[name].data.iter().map(|&x| x as u32).collect()
}

fn agrees_with_pytorch<B: Backend>(b: &B, backend: &str, feed: &str) {
    let what = format!("{backend}, image as {feed}");
    let mut ck = Checkpoint::load(b, &data(&format!("lstm_fc_{feed}.safetensors"))).unwrap();
    let expected =
        tensorfile::read(&data(&format!("lstm_fc_{feed}_expected.safetensors"))).unwrap();
    let c = ck.model.config;
    let steps = c.token_positions();
    let (inputs, targets) = (ids(&expected, "inputs"), ids(&expected, "targets"));
    let sequences: Vec<Vec<u32>> = (0..3)
        .map(|r| {
            let row = r * steps..(r + 1) * steps;
            std::iter::once(inputs[row.start])
                .chain(targets[row].iter().copied().take_while(|&id| id != PAD))
                .collect()
        })
        .collect();
    let token_inputs = TokenInputs::new(b, &c, &sequences).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let objective = TokenObjective::mle();
    let batch = BatchTargets::new(b, &objective, &ck.vocab, &c, &targets, steps, &mut rng).unwrap();
    let mut losses = Losses::new(b, objective, token_inputs.rows(), c.vocab_size);
    let features = &expected.tensors["features"].data;
    let model = &mut ck.model;
    model.forward(b, features, &token_inputs).unwrap();
    losses.forward_backward(b, model.logits(), &batch, true);
    model.params_mut().zero_grads(b);
    model.backward(b, &token_inputs, &losses.d_logits);
    let loss = losses.read(b, &batch).loss;
    let want = expected.tensors["loss"].data[0];
    assert!(
        (loss - want).abs() <= 1e-5 * want,
        "{what}: loss {loss} against PyTorch's {want}"
    );
    let params = model.params();
    for (spec, grad) in params.specs.iter().zip(&params.grads) {
        let want = &expected.tensors[&format!("grad.{}", spec.name)].data;
        let got = b.to_vec(grad);
        common::assert_close(
            &format!("{what}: gradient of {}", spec.name),
            &got,
            want,
            1e-5,
            1e-6,
        );
    }
    let generated = generate(
        b,
        &ck.model,
        features,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    let want: Vec<Vec<u32>> = expected.tensors["greedy"]
        .data
        .chunks(steps)
        .map(|row| {
            row.iter()
                .take_while(|&&x| x >= 0.0)
                .map(|&x| x as u32)
                .collect()
        })
        .collect();
    let got: Vec<Vec<u32>> = generated.into_iter().map(|g| g.ids).collect();
    assert_eq!(got, want, "{what}: greedy captions");
}

#[test]
fn an_lstm_captioner_matches_pytorch() {
    for feed in ["hidden", "input"] {
        agrees_with_pytorch(&CpuBackend::new(), "cpu", feed);
        if let Some(g) = common::gpu() {
            agrees_with_pytorch(&g, "gpu", feed);
        }
    }
}
