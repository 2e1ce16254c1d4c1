//! A ClipCap MLE step with a Hugging Face GPT-2 as the captioner's
//! decoder: on the tiny random GPT-2 of tests/data/gpt2-tiny, with the
//! mapper weights, image embeddings and BPE captions that
//! scripts/clipcap_fixtures.py gave transformers (float64), captune's
//! logits at every real position, its MLE loss and every parameter's
//! gradient match transformers' on the CPU and on the GPU. The
//! gradients of the mapper are those a frozen decoder passes back too.
//! The padding row captune adds to GPT-2's embedding stays masked and
//! gets no gradient. The same holds with ClipCap's transformer mapper.
//! A ClipCap fine-tuned by transformers
//! (scripts/clipcap_decode_fixtures.py) gives transformers' greedy and
//! beam captions, with its beam log-probabilities, on both backends.

use crate::common;

use captune::backend::Backend;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::decoders::prefix::is_mapper_param;
use captune::captioner::model::{MASKED_LOGIT, TokenInputs, teacher_targets};
use captune::captioner::objectives::token::{BatchTargets, Losses, TokenObjective};
use captune::captioner::pretrained::{self, PrefixShape};
use captune::captioner::{CaptionVocab, MapperTransformer};
use captune::cpu::CpuBackend;
use captune::model::gpt2;
use captune::tensorfile::{self, TensorFile};
use rand::SeedableRng;
use std::path::Path;

/// The MLP mapper's step.
const MLP_STEP: &str = "clipcap_step_expected.safetensors";
/// The transformer mapper's step.
const TRANSFORMER_STEP: &str = "clipcap_transformer_step_expected.safetensors";

fn expected(file: &str) -> TensorFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file);
    tensorfile::read(&path).unwrap()
}

/// What captune computes for the fixture's step: the logits of the real
/// positions (`[rows, vocab + 1]`), the loss, and each parameter's name
/// and gradient.
struct Step {
    logits: Vec<f32>,
    loss: f32,
    grads: Vec<(String, Vec<f32>)>,
}

fn clipcap_step<B: Backend>(b: &B, want: &TensorFile) -> Step {
    let shape: serde_json::Value = serde_json::from_str(&want.metadata["shape"]).unwrap();
    let field = |k: &str| shape[k].as_u64().unwrap() as usize;
    let mapper_transformer = shape.get("clip_len").map(|_| MapperTransformer {
        clip_len: field("clip_len"),
        layers: field("layers"),
        heads: field("heads"),
    });
    let shape = PrefixShape {
        embed_dim: field("embed_dim"),
        prefix_len: field("prefix_len"),
        mapper_hidden: field("mapper_hidden"),
        mapper_transformer,
        max_len: field("max_len"),
    };
    let end: u32 = want.metadata["end"].parse().unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let gpt2 = gpt2::read(&dir, "decoder").unwrap();
    let mut model = pretrained::from_gpt2(b, gpt2, shape, end, 0).unwrap();
    let params = model.params_mut();
    for (spec, value) in params.specs.iter().zip(&mut params.values) {
        if is_mapper_param(&spec.name) {
            b.write(value, &want.tensors[&spec.name].data);
        }
    }
    let c = model.config;
    let max_len = shape.max_len;
    let sequences = common::padded_ids(&want.tensors["ids"].data, max_len);
    let inputs = TokenInputs::new(b, &c, &sequences).unwrap();
    let steps = inputs.positions;
    let targets = teacher_targets(&sequences, steps, c.specials.pad);
    // MLE reads no word of the vocabulary (only first-token shifting does).
    let words = CaptionVocab::from_words(Vec::new());
    let objective = TokenObjective::mle();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let batch = BatchTargets::new(b, &objective, &words, &c, &targets, steps, &mut rng).unwrap();
    let mut losses = Losses::new(b, objective, inputs.rows(), c.vocab_size);
    model
        .forward(b, &want.tensors["features"].data, &inputs)
        .unwrap();
    losses.forward_backward(b, model.logits(), &batch, true);
    model.params_mut().zero_grads(b);
    model.backward(b, &inputs, &losses.d_logits);
    let loss = losses.read(b, &batch).loss;
    let all = b.to_vec(model.logits());
    let v = c.vocab_size;
    let logits = sequences
        .iter()
        .enumerate()
        .flat_map(|(s, seq)| (0..seq.len() - 1).map(move |t| s * steps + t))
        .flat_map(|row| all[row * v..(row + 1) * v].to_vec())
        .collect();
    let grads = model
        .params()
        .specs
        .iter()
        .zip(&model.params().grads)
        .map(|(spec, g)| (spec.name.clone(), b.to_vec(g)))
        .collect();
    Step {
        logits,
        loss,
        grads,
    }
}

fn matches_transformers<B: Backend>(b: &B, file: &str, what: &str) {
    let want = expected(file);
    let got = clipcap_step(b, &want);
    let expected_logits = &want.tensors["logits"];
    let v = expected_logits.shape[1];
    let rows = expected_logits.shape[0];
    // GPT-2's ids, then the padding column, masked.
    let (ours, pad): (Vec<f32>, Vec<f32>) = {
        let (mut ours, mut pad) = (Vec::new(), Vec::new());
        for row in got.logits.chunks(v + 1) {
            ours.extend(&row[..v]);
            pad.push(row[v]);
        }
        (ours, pad)
    };
    assert_eq!(pad.len(), rows, "{what}");
    assert!(
        pad.iter().all(|&z| z <= MASKED_LOGIT * 0.99),
        "{what}: {pad:?}"
    );
    let d = common::relative_difference(&ours, &expected_logits.data);
    assert!(d < 1e-5, "{what}: logits differ by {d} of their largest");
    let loss = want.tensors["loss"].data[0];
    assert!(
        (got.loss - loss).abs() < 1e-5 * loss.abs(),
        "{what}: loss {} vs transformers' {loss}",
        got.loss
    );
    let expected_grads = want
        .tensors
        .keys()
        .filter(|k| k.starts_with("grad."))
        .count();
    assert_eq!(
        got.grads.len(),
        expected_grads,
        "{what}: one gradient per parameter"
    );
    for (name, grad) in &got.grads {
        let expected = &want.tensors[&format!("grad.{name}")].data;
        let grad = if name == "decoder.tokens" {
            let (ours, pad_row) = grad.split_at(expected.len());
            assert!(
                pad_row.iter().all(|&g| g == 0.0),
                "{what}: the padding row moved"
            );
            ours
        } else {
            grad
        };
        let d = common::relative_difference(grad, expected);
        assert!(
            d < 1e-5,
            "{what}: {name}'s gradient differs by {d} of its largest"
        );
    }
}

#[test]
fn a_clipcap_step_matches_transformers_on_both_backends() {
    matches_transformers(&CpuBackend::new(), MLP_STEP, "cpu");
    if let Some(g) = common::gpu() {
        matches_transformers(&g, MLP_STEP, "gpu");
    }
}

/// ClipCap's transformer mapper (ReLU blocks, bias-free q, k, v, learned
/// constants, no final norm), against the script's PyTorch version of it
/// with ClipCap's separate query and key-value weights.
#[test]
fn a_clipcap_step_with_the_transformer_mapper_matches_on_both_backends() {
    matches_transformers(&CpuBackend::new(), TRANSFORMER_STEP, "cpu");
    if let Some(g) = common::gpu() {
        matches_transformers(&g, TRANSFORMER_STEP, "gpu");
    }
}

/// A prefix and captions longer than GPT-2's positions are refused,
/// naming both and what to shorten.
#[test]
fn a_prefix_and_captions_past_gpt2_s_positions_are_refused() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let gpt2 = gpt2::read(&dir, "decoder").unwrap();
    let shape = PrefixShape {
        embed_dim: 8,
        prefix_len: 10,
        mapper_hidden: 16,
        mapper_transformer: None,
        max_len: 24,
    };
    let Err(e) = pretrained::from_gpt2(&CpuBackend::new(), gpt2, shape, 0, 0) else {
        panic!("33 positions fit in 32");
    };
    let e = e.to_string();
    assert!(
        e.contains("33 positions") && e.contains("has 32 (n_positions)"),
        "{e}"
    );
}

/// Greedy and beam captions (width 3) of the fine-tuned ClipCap in
/// tests/data/clipcap-tiny, made by scripts/clipcap_decode_fixtures.py
/// with transformers (beam search by its own `generate`), for image
/// embeddings it was trained on and some it never saw.
fn decodes_as_transformers<B: Backend>(b: &B, what: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clipcap-tiny");
    let want = tensorfile::read(&dir.join("decode_expected.safetensors")).unwrap();
    let meta = |key: &str| want.metadata[key].parse::<usize>().unwrap();
    let shape = PrefixShape {
        embed_dim: 8,
        prefix_len: 4,
        mapper_hidden: 32,
        mapper_transformer: None,
        max_len: meta("max_len"),
    };
    let ck = pretrained::from_folder(b, &dir, shape, 0).unwrap();
    let features = &want.tensors["features"].data;
    let images = features.len() / shape.embed_dim;
    let rows = |name: &str| -> Vec<Vec<u32>> {
        (want.tensors[name].data.chunks(shape.max_len))
            .map(|r| {
                r.iter()
                    .take_while(|&&x| x >= 0.0)
                    .map(|&x| x as u32)
                    .collect()
            })
            .collect()
    };
    let options = DecodeOptions::default();
    let greedy = generate(b, &ck.model, features, &Decoding::Greedy, &options).unwrap();
    let beam = Decoding::Beam {
        width: meta("beams"),
        n_best: 1,
    };
    let beamed = generate(b, &ck.model, features, &beam, &options).unwrap();
    let (want_greedy, want_beam) = (rows("greedy"), rows("beam"));
    let beam_logp = &want.tensors["beam_logp"].data;
    assert_eq!(greedy.len(), images);
    let mut differ = 0;
    for i in 0..images {
        assert_eq!(greedy[i].ids, want_greedy[i], "{what}: greedy, image {i}");
        assert_eq!(beamed[i].ids, want_beam[i], "{what}: beam, image {i}");
        let gap = (beamed[i].logprob - beam_logp[i]).abs();
        assert!(
            gap < 1e-3,
            "{what}: beam log-probability of image {i} off by {gap}"
        );
        differ += usize::from(want_greedy[i] != want_beam[i]);
    }
    // The fixture tells the two searches apart, and holds captions that
    // end before the maximum length.
    assert!(differ > 0, "greedy and beam agree on every image");
    assert!(
        want_greedy
            .iter()
            .any(|g| g.len() > 3 && g.len() < shape.max_len - 1)
    );
}

#[test]
fn greedy_and_beam_captions_match_transformers_on_both_backends() {
    decodes_as_transformers(&CpuBackend::new(), "CPU");
    if let Some(g) = common::gpu() {
        decodes_as_transformers(&g, "GPU");
    }
}
