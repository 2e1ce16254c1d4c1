//! The golden test, as llm.c's test_gpt2.c: an independent implementation
//! of the captioner and the retriever (scripts/golden.py, PyTorch in
//! float64, written from docs/checkpoints.md) made a checkpoint of each
//! and, for one fixed batch, the loss, every parameter's gradient and
//! every weight after one AdamW step with clipping and weight decay
//! active. Both backends must reproduce them. GPU and CPU are otherwise checked only against
//! each other, so a mistake made in both twins, or in AdamW's maths,
//! shows only here.

use crate::common;

use captune::backend::Backend;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::inputs::{TokenInputs, teacher_targets};
use captune::captioner::model::Captioner;
use captune::captioner::objective::{StepContext, TrainingBatch, TrainingCorpus};
use captune::captioner::objectives::token::{BatchTargets, Losses, TokenObjective};
use captune::captioner::objectives::{self, settings::Settings};
use captune::captioner::{CaptionVocab, Checkpoint};
use captune::cpu::CpuBackend;
use captune::data::images::Images;
use captune::data::vocab::PAD;
use captune::gpu::GpuBackend;
use captune::model::params::Params;
use captune::model::retriever::TextBatch;
use captune::optim::{AdamW, AdamWConfig};
use captune::tensorfile::{self, TensorFile};
use rand::SeedableRng;
use std::path::{Path, PathBuf};

pub(super) fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// What one training step gives: the loss, then each parameter's name,
/// gradient and value after the AdamW step.
struct Step {
    loss: f32,
    grads: Vec<(String, Vec<f32>)>,
    /// The global gradient norm AdamW clipped with.
    grad_norm: f32,
    after: Vec<(String, Vec<f32>)>,
    /// AdamW's first and second moments after the step, by parameter.
    moments: Vec<(String, Vec<f32>, Vec<f32>)>,
}

/// One MLE step of `model` on the image inputs `features` and the
/// captions `sequences` (each its start, its tokens and its end): the
/// loss, every parameter's gradient left in `model`. The logits are the
/// model's, `inputs.positions` per caption.
pub(super) fn mle_step<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    vocab: &CaptionVocab,
    features: &[f32],
    sequences: &[Vec<u32>],
) -> f32 {
    let c = model.config;
    let inputs = TokenInputs::new(b, &c, sequences).unwrap();
    let steps = inputs.positions;
    let targets = teacher_targets(sequences, steps, c.specials.pad);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let objective = TokenObjective::mle();
    let batch = BatchTargets::new(b, &objective, vocab, &c, &targets, steps, &mut rng).unwrap();
    let mut losses = Losses::new(b, objective, inputs.rows(), c.vocab_size);
    model.forward(b, features, &inputs).unwrap();
    losses.forward_backward(b, model.logits(), &batch, true);
    model.params_mut().zero_grads(b);
    model.backward(b, &inputs, &losses.d_logits);
    losses.read(b, &batch).loss
}

/// Asserts that every gradient in `params` is within `tolerance` of
/// `want(name)`'s, relative to that tensor's largest (f32 against a
/// float64 fixture); `what` and `whose` name the case and the reference.
pub(super) fn assert_gradients_close<'w, B: Backend>(
    b: &B,
    params: &Params<B>,
    want: impl Fn(&str) -> &'w [f32],
    tolerance: f32,
    (what, whose): (&str, &str),
) {
    for (spec, grad) in params.specs.iter().zip(&params.grads) {
        let off = common::relative_difference(&b.to_vec(grad), want(&spec.name));
        assert!(
            off <= tolerance,
            "{what}: gradient of {} is {off} off {whose}",
            spec.name
        );
    }
}

fn ids(file: &TensorFile, name: &str) -> Vec<u32> {
    file.tensors[name].data.iter().map(|&x| x as u32).collect()
}

fn one_step<B: Backend>(b: &B, expected: &TensorFile) -> Step {
    let path = data("golden_captioner.safetensors");
    let mut ck = Checkpoint::load(b, &path).unwrap();
    let c = ck.model.config;
    let steps = c.token_positions();
    let (inputs, targets) = (ids(expected, "inputs"), ids(expected, "targets"));
    // Each caption: <bos>, then its targets up to the first pad.
    let sequences: Vec<Vec<u32>> = (0..3)
        .map(|r| {
            let row = r * steps..(r + 1) * steps;
            std::iter::once(inputs[row.start])
                .chain(targets[row].iter().copied().take_while(|&id| id != PAD))
                .collect()
        })
        .collect();
    let features = &expected.tensors["features"].data;
    let loss = mle_step(b, &mut ck.model, &ck.vocab, features, &sequences);
    finish(b, loss, ck.model.params_mut(), expected)
}

/// One step of the retriever's contrastive training on the golden batch.
fn retriever_step<B: Backend>(b: &B, expected: &TensorFile) -> Step {
    let path = data("golden_retriever.safetensors");
    let mut ck = captune::retriever::Checkpoint::load(b, &path, 3).unwrap();
    let c = ck.model.config;
    let images = Images {
        size: c.image_size,
        pixels: expected.tensors["pixels"]
            .data
            .iter()
            .map(|&v| v as u8)
            .collect(),
    };
    let ids = ids(expected, "ids");
    let captions: Vec<Vec<u32>> = ids
        .chunks(c.max_len)
        .map(|row| row.iter().copied().take_while(|&id| id != PAD).collect())
        .collect();
    let texts = TextBatch::new(b, &c, &captions).unwrap();
    let patches = captune::retriever::patchify(&c, &images, &[0, 1, 2]);
    ck.model.forward_backward(b, &patches, &texts).unwrap();
    let loss = ck.model.loss.read_loss(b);
    finish(b, loss, &mut ck.model.params, expected)
}

/// Collects the gradients, takes the AdamW step the golden file names and
/// collects the weights.
fn finish<B: Backend>(b: &B, loss: f32, params: &mut Params<B>, expected: &TensorFile) -> Step {
    let names: Vec<String> = params.specs.iter().map(|s| s.name.clone()).collect();
    let grads = names
        .iter()
        .cloned()
        .zip(params.grads.iter().map(|g| b.to_vec(g)))
        .collect();
    let number = |key: &str| -> f32 { expected.metadata[key].parse().unwrap() };
    let config = AdamWConfig {
        lr: number("lr"),
        beta1: number("beta1"),
        beta2: number("beta2"),
        eps: number("eps"),
        weight_decay: number("weight_decay"),
        max_grad_norm: Some(number("max_grad_norm")),
    };
    let mut opt = AdamW::new(b, config, &params.optimizer_layout());
    let mut values: Vec<&mut B::Tensor> = params.values.iter_mut().collect();
    let grad_refs: Vec<&B::Tensor> = params.grads.iter().collect();
    opt.step(b, &mut values, &grad_refs);
    let (_, m, v) = opt.state(b);
    let moments = names
        .iter()
        .cloned()
        .zip(m.into_iter().zip(v))
        .map(|(n, (m, v))| (n, m, v))
        .collect();
    let after = names
        .into_iter()
        .zip(params.values.iter().map(|v| b.to_vec(v)))
        .collect();
    Step {
        loss,
        grads,
        grad_norm: opt.last_grad_norm(b),
        after,
        moments,
    }
}

fn check(backend: &str, got: &Step, expected: &TensorFile) {
    let want = expected.tensors["loss"].data[0];
    assert!(
        (got.loss - want).abs() <= 1e-5 * want.abs(),
        "{backend}: loss {} against PyTorch's {want}",
        got.loss
    );
    let graded = expected
        .tensors
        .keys()
        .filter(|k| k.starts_with("grad."))
        .count();
    assert_eq!(
        got.grads.len(),
        graded,
        "{backend}: one gradient per parameter"
    );
    for (name, grad) in &got.grads {
        let want = &expected.tensors[&format!("grad.{name}")].data;
        common::assert_close(
            &format!("{backend}: gradient of {name}"),
            grad,
            want,
            1e-5,
            1e-6,
        );
    }
    // Adam's first step moves a weight by lr * g / (|g| + eps), g the
    // clipped gradient. Where |g| is not far above eps that quotient turns
    // the gradients' f32 rounding (up to the 1e-5 relative and 1e-6
    // absolute allowed above, times the clipping factor) into a larger
    // change, up to lr where the exact gradient is zero (the keys' biases:
    // softmax ignores a shift shared by all keys). The tolerance carries
    // that bound; elsewhere it is 1e-5 relative.
    // The norm clipping used, and the moments, which carry the clipped
    // gradient (the step itself is about lr * sign(g) at step one, blind
    // to the clipping factor and the betas).
    let norm = expected.tensors["grad_norm"].data[0];
    assert!(
        (got.grad_norm - norm).abs() <= 1e-5 * norm,
        "{backend}: gradient norm {} against PyTorch's {norm}",
        got.grad_norm
    );
    let number = |key: &str| -> f32 { expected.metadata[key].parse().unwrap() };
    let (lr, eps) = (number("lr"), number("eps"));
    let clip = (number("max_grad_norm") / norm).min(1.0);
    for (name, m, v) in &got.moments {
        let (want_m, want_v) = (
            &expected.tensors[&format!("m.{name}")].data,
            &expected.tensors[&format!("v.{name}")].data,
        );
        let what = format!("{backend}: AdamW's first moment of {name}");
        common::assert_close(&what, m, want_m, 1e-5, 1e-7 * clip);
        let what = format!("{backend}: AdamW's second moment of {name}");
        common::assert_close(&what, v, want_v, 2e-5, 1e-12);
    }
    for (name, value) in &got.after {
        let want = &expected.tensors[&format!("after.{name}")].data;
        let exact_grad = &expected.tensors[&format!("grad.{name}")].data;
        for (i, (&v, &w)) in value.iter().zip(want).enumerate() {
            let g = exact_grad[i].abs() * clip;
            let g_error = (1e-5 * exact_grad[i].abs() + 1e-6) * clip;
            let sensitivity = (eps * g_error / (g + eps).powi(2)).min(1.0);
            let tol = 1e-5 * w.abs() + 1e-6 + lr * sensitivity;
            assert!(
                (v - w).abs() <= tol,
                "{backend}: {name}[{i}] after AdamW is {v} but PyTorch gives {w} (gradient {})",
                exact_grad[i]
            );
        }
    }
}

#[test]
fn both_backends_reproduce_an_independent_captioner() {
    let expected = tensorfile::read(&data("golden_captioner_expected.safetensors")).unwrap();
    check("CPU", &one_step(&CpuBackend::new(), &expected), &expected);
    if let Some(g) = common::gpu() {
        check("GPU", &one_step(&g, &expected), &expected);
    }
}

#[test]
fn both_backends_reproduce_an_independent_retriever() {
    let expected = tensorfile::read(&data("golden_retriever_expected.safetensors")).unwrap();
    check(
        "CPU",
        &retriever_step(&CpuBackend::new(), &expected),
        &expected,
    );
    if let Some(g) = common::gpu() {
        check("GPU", &retriever_step(&g, &expected), &expected);
    }
}

/// The SMILE family against the same independent implementation
/// (`golden_smile*.safetensors`): on a checkpoint whose vocabulary holds
/// the first-token alternatives, for each case (first-token MLE, none,
/// shift with an MLE mix) the loss and every parameter's gradient.
fn smile_steps<B: Backend>(b: &B, expected: &TensorFile) -> Vec<Outcome> {
    let steps = 7;
    let (inputs, targets) = (ids(expected, "inputs"), ids(expected, "targets"));
    let sequences: Vec<Vec<u32>> = (0..3)
        .map(|r| {
            let row = r * steps..(r + 1) * steps;
            std::iter::once(inputs[row.start])
                .chain(targets[row].iter().copied().take_while(|&id| id != PAD))
                .collect()
        })
        .collect();
    let batch = TrainingBatch {
        inputs: expected.tensors["features"].data.clone(),
        embeddings: None,
        sequences,
        images: vec![0, 1, 2],
        labelled: None,
    };
    let at = Golden {
        checkpoint: "golden_smile.safetensors",
        batch: &batch,
        corpus: &TrainingCorpus::new("golden-smile", vec![Vec::new(); 3]),
    };
    objective_steps(b, expected, &at, None)
}

#[test]
fn both_backends_reproduce_the_smile_family_independently() {
    check_both(
        "golden_smile_expected.safetensors",
        "golden_smile.safetensors",
        &["loss"],
        (smile_steps, smile_steps),
    );
}

/// The seed a run's first step (its generator seeded with 0) draws its
/// captions with: what the golden inputs must be drawn with.
pub(super) fn first_step_seed() -> u64 {
    rand::Rng::random(&mut rand_chacha::ChaCha8Rng::seed_from_u64(0))
}

/// The captions `decoding` draws for `features` with `ck`, each padded
/// with `<pad>` to the token positions, as the rows of an inputs file.
pub(super) fn drawn(
    ck: &Checkpoint<CpuBackend>,
    features: &[f32],
    decoding: &Decoding,
) -> Vec<f32> {
    let t = ck.model.config.token_positions();
    let options = DecodeOptions::default();
    let generated = generate(&CpuBackend::new(), &ck.model, features, decoding, &options).unwrap();
    generated
        .iter()
        .flat_map(|g| {
            let mut row: Vec<f32> = g.ids.iter().map(|&id| id as f32).collect();
            row.resize(t, PAD as f32);
            row
        })
        .collect()
}

/// Writes an inputs file of a fixture script (tests/data), naming the
/// test that made it (`test`: its file in tests/suite/models and its
/// name) beside `metadata`.
pub(super) fn write_inputs(
    file: &str,
    tensors: &[(&str, Vec<usize>, &[f32])],
    test: &str,
    metadata: &[(&str, String)],
) {
    let mut meta: std::collections::HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    meta.insert("made_by".into(), format!("tests/suite/models/{test}"));
    tensorfile::write(&data(file), tensors, meta).unwrap();
}

/// The sequence-level golden batch: three rows showing training images 2,
/// 0 and 3 (corpus indices, not positions) of a corpus of four, whose
/// references use the golden captioner's words.
pub(super) const SEQUENCE_IMAGES: [usize; 3] = [2, 0, 3];
pub(super) const SEQUENCE_REFERENCES: [&[&str]; 4] = [
    &[
        "a red circle",
        "a big red circle",
        "a red circle and a blue star",
    ],
    &["a blue star", "a small blue star"],
    &["a big circle and a small star", "a red circle and a star"],
    &["a small red star", "a red star", "a star"],
];
/// Samples per image.
pub(super) const SEQUENCE_SAMPLES: usize = 5;

pub(super) fn sequence_corpus() -> TrainingCorpus {
    let references = SEQUENCE_REFERENCES
        .iter()
        .map(|refs| {
            refs.iter()
                .map(|r| r.split(' ').map(str::to_string).collect())
                .collect()
        })
        .collect();
    TrainingCorpus::new("golden-sequence", references)
}

/// The samples and greedy captions a sequence-level step on the golden
/// captioner draws with the trainer's first step's generator, for
/// scripts/golden.py (`cargo test --test suite golden:: -- --ignored`).
#[test]
#[ignore = "writes tests/data/golden_sequence_inputs.safetensors for scripts/golden.py"]
fn write_sequence_inputs() {
    let b = CpuBackend::new();
    let ck = Checkpoint::load(&b, &data("golden_captioner.safetensors")).unwrap();
    let expected = tensorfile::read(&data("golden_captioner_expected.safetensors")).unwrap();
    let features = expected.tensors["features"].data.clone();
    let sampling = Decoding::Sample {
        n: SEQUENCE_SAMPLES,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: first_step_seed(),
    };
    let t = ck.model.config.token_positions();
    let samples = drawn(&ck, &features, &sampling);
    let greedy = drawn(&ck, &features, &Decoding::Greedy);
    let metadata = [
        (
            "references",
            serde_json::to_string(&SEQUENCE_REFERENCES).unwrap(),
        ),
        ("images", serde_json::to_string(&SEQUENCE_IMAGES).unwrap()),
    ];
    write_inputs(
        "golden_sequence_inputs.safetensors",
        &[
            ("features", vec![3, features.len() / 3], &features),
            ("samples", vec![3 * SEQUENCE_SAMPLES, t], &samples),
            ("greedy", vec![3, t], &greedy),
        ],
        "golden.rs write_sequence_inputs",
        &metadata,
    );
}

/// One step of each sequence-level objective against scripts/golden.py
/// (`golden_sequence_expected.safetensors`): the same samples, rewards by
/// pycocoevalcap's CIDEr-D with the corpus' statistics, SLE's distances by
/// its BLEU, and the loss and every parameter's gradient in float64.
fn sequence_steps<B: Backend>(b: &B, expected: &TensorFile) -> Vec<Outcome> {
    let inputs = tensorfile::read(&data("golden_sequence_inputs.safetensors")).unwrap();
    let batch = TrainingBatch {
        inputs: inputs.tensors["features"].data.clone(),
        embeddings: None,
        sequences: Vec::new(),
        images: SEQUENCE_IMAGES.to_vec(),
        labelled: None,
    };
    let at = Golden {
        checkpoint: "golden_captioner.safetensors",
        batch: &batch,
        corpus: &sequence_corpus(),
    };
    objective_steps(b, expected, &at, None)
}

/// The PyTorch package (`python/`) and captune take the same SCST step:
/// for the samples and greedy captions captune draws at its first step on
/// the golden captioner, the package's loss, gradients, norm, AdamW
/// moments and weights after one step (`python/tests/scst_step.py`) hold
/// captune's own step (sampling included) to the golden test's
/// tolerances, with the greedy and the mean baseline. Skipped where
/// python3 has no torch.
#[test]
fn the_pytorch_package_takes_captunes_scst_step() {
    let Some(python) = common::python_with_torch() else {
        return;
    };
    let b = CpuBackend::new();
    let inputs = tensorfile::read(&data("golden_sequence_inputs.safetensors")).unwrap();
    let hyper = tensorfile::read(&data("golden_captioner_expected.safetensors")).unwrap();
    let batch = TrainingBatch {
        inputs: inputs.tensors["features"].data.clone(),
        embeddings: None,
        sequences: Vec::new(),
        images: SEQUENCE_IMAGES.to_vec(),
        labelled: None,
    };
    let corpus = sequence_corpus();
    for baseline in ["greedy", "mean"] {
        let out = std::env::temp_dir().join(format!(
            "captune-torch-scst-{baseline}-{}.safetensors",
            captune::tensorfile::temporary_suffix()
        ));
        let run = std::process::Command::new(python)
            .args(["-m", "tests.scst_step"])
            .arg(&out)
            .arg(baseline)
            .current_dir(common::python_dir())
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let package = tensorfile::read(&out).unwrap();
        std::fs::remove_file(&out).unwrap();

        let at = Golden {
            checkpoint: "golden_captioner.safetensors",
            batch: &batch,
            corpus: &corpus,
        };
        let settings = serde_json::json!({ "baseline": baseline });
        let (mut ck, values) = objective_step(&b, &at, "scst", &settings, None);
        let loss = values.into_iter().find(|(k, _)| *k == "loss").unwrap().1;
        let step = finish(&b, loss, ck.model.params_mut(), &hyper);
        check(
            &format!("captune's SCST step ({baseline} baseline) against the PyTorch package's"),
            &step,
            &package,
        );
    }
}

#[test]
fn both_backends_reproduce_the_sequence_level_objectives_independently() {
    check_both(
        "golden_sequence_expected.safetensors",
        "golden_captioner.safetensors",
        &["loss"],
        (sequence_steps, sequence_steps),
    );
}

/// Where a golden objective step runs: the checkpoint (in tests/data), the
/// batch and the training corpus.
pub(super) struct Golden<'a> {
    pub checkpoint: &'a str,
    pub batch: &'a TrainingBatch,
    pub corpus: &'a TrainingCorpus,
}

/// A case's step: its name, its logged values and every parameter's gradient.
pub(super) struct Outcome {
    case: String,
    values: Vec<(&'static str, f32)>,
    grads: Vec<Vec<f32>>,
}

/// One step of each case of `expected` (its metadata's `cases`: a name,
/// the objective and its settings) from the checkpoint, with the
/// generator of a run's first step and, when given, the retriever.
pub(super) fn objective_steps<B: Backend>(
    b: &B,
    expected: &TensorFile,
    at: &Golden<'_>,
    mut retriever: Option<&mut captune::retriever::frozen::FrozenRetriever<B>>,
) -> Vec<Outcome> {
    let cases: Vec<serde_json::Value> = serde_json::from_str(&expected.metadata["cases"]).unwrap();
    let mut out = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap().to_string();
        let objective = case["objective"].as_str().unwrap();
        let (ck, values) = objective_step(
            b,
            at,
            objective,
            &case["settings"],
            retriever.as_deref_mut(),
        );
        let grads = ck
            .model
            .params()
            .grads
            .iter()
            .map(|g| b.to_vec(g))
            .collect();
        out.push(Outcome {
            case: name,
            values,
            grads,
        });
    }
    out
}

/// One step of `objective` with `settings` (JSON) from the golden
/// checkpoint on the golden batch, its generator seeded as a trainer's
/// first step: the checkpoint with the step's gradients, and the values
/// it reports.
fn objective_step<B: Backend>(
    b: &B,
    at: &Golden<'_>,
    objective: &str,
    settings: &serde_json::Value,
    retriever: Option<&mut captune::retriever::frozen::FrozenRetriever<B>>,
) -> (Checkpoint<B>, Vec<(&'static str, f32)>) {
    let settings: Settings = serde_json::from_value(settings.clone()).unwrap();
    let mut ck = Checkpoint::load(b, &data(at.checkpoint)).unwrap();
    let vocab = ck.model.config.vocab_size;
    let mut objective = objectives::build::<B>(objective, &settings, vocab).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    ck.model.params_mut().zero_grads(b);
    let mut cx = StepContext {
        b,
        model: &mut ck.model,
        vocab: &ck.vocab,
        batch: at.batch,
        corpus: at.corpus,
        gradient_weight: 1.0,
        retriever,
        rng: &mut rng,
        monitor: true,
    };
    objective.step(&mut cx).unwrap();
    let read: Vec<f32> = objective.logged().iter().map(|t| b.to_vec(t)[0]).collect();
    let values = objective.report(&read);
    (ck, values)
}

/// An objective's golden cases on the CPU and, where an adapter exists,
/// the GPU: `steps` (one function, for each backend) against the expected
/// file, for the parameters of the checkpoint `file`.
type Steps<B> = fn(&B, &TensorFile) -> Vec<Outcome>;
fn check_both(
    expected: &str,
    file: &str,
    keys: &[&str],
    steps: (Steps<CpuBackend>, Steps<GpuBackend>),
) {
    let expected = tensorfile::read(&data(expected)).unwrap();
    check_outcomes(
        "CPU",
        steps.0(&CpuBackend::new(), &expected),
        &expected,
        file,
        keys,
    );
    if let Some(g) = common::gpu() {
        check_outcomes("GPU", steps.1(&g, &expected), &expected, file, keys);
    }
}

/// Each outcome's logged `keys` (`{case}.{key}`, 1e-5 relative) and every
/// gradient (`{case}.grad.{name}`, 1e-4 relative) against `expected`, for
/// the parameters of the checkpoint `file`; every case of it must be there.
pub(super) fn check_outcomes(
    backend: &str,
    got: Vec<Outcome>,
    expected: &TensorFile,
    file: &str,
    keys: &[&str],
) {
    let names: Vec<String> = {
        let ck = Checkpoint::load(&CpuBackend::new(), &data(file)).unwrap();
        ck.model
            .params()
            .specs
            .iter()
            .map(|s| s.name.clone())
            .collect()
    };
    let cases: Vec<serde_json::Value> = serde_json::from_str(&expected.metadata["cases"]).unwrap();
    assert_eq!(got.len(), cases.len(), "{backend}: one outcome per case");
    for o in got {
        for key in keys {
            let value = o.values.iter().find(|(k, _)| k == key).unwrap().1;
            let want = expected.tensors[&format!("{}.{key}", o.case)].data[0];
            assert!(
                (value - want).abs() <= 1e-5 * want.abs().max(1e-2),
                "{backend} {}: {key} {value} against PyTorch's {want}",
                o.case
            );
        }
        for (name, grad) in names.iter().zip(&o.grads) {
            let want = &expected.tensors[&format!("{}.grad.{name}", o.case)].data;
            let what = format!("{backend} {}: gradient of {name}", o.case);
            common::assert_close(&what, grad, want, 1e-4, 1e-6);
        }
    }
}

/// DiscriTune's golden batch: four rows showing corpus images 1, 3, 1
/// and 0 (three distinct: one caption each) of a corpus of five random
/// unit embeddings in the golden retriever's width.
const DISCRITUNE_ROWS: [usize; 4] = [1, 3, 1, 0];

fn discritune_corpus(embeddings: &[f32]) -> TrainingCorpus {
    let references = vec![vec![vec!["a".to_string()]]; embeddings.len() / 8];
    TrainingCorpus::new("golden-discritune", references).with_image_embeddings(embeddings.to_vec())
}

/// The batch of DiscriTune's golden rows, with their corpus embeddings.
fn discritune_batch(corpus: &TrainingCorpus) -> TrainingBatch {
    TrainingBatch {
        inputs: DISCRITUNE_ROWS
            .iter()
            .flat_map(|&i| corpus.image_embeddings[i * 8..(i + 1) * 8].to_vec())
            .collect(),
        embeddings: None,
        sequences: Vec::new(),
        images: DISCRITUNE_ROWS.to_vec(),
        labelled: None,
    }
}

/// The corpus embeddings and the greedy and sampled captions of the
/// batch's distinct images a DiscriTune step on the golden listener
/// captioner draws, for scripts/golden.py.
#[test]
#[ignore = "writes tests/data/golden_discritune_inputs.safetensors for scripts/golden.py"]
fn write_discritune_inputs() {
    let b = CpuBackend::new();
    let ck = Checkpoint::load(&b, &data("golden_listener_captioner.safetensors")).unwrap();
    let mut corpus = common::random(5 * 8, 41);
    for row in corpus.chunks_mut(8) {
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        row.iter_mut().for_each(|x| *x /= norm);
    }
    let distinct = discritune_batch(&discritune_corpus(&corpus)).distinct_images();
    let (distinct, features) = (distinct.images, distinct.inputs);
    let sampled = Decoding::Sample {
        n: 1,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: first_step_seed(),
    };
    let (greedy, sample) = (
        drawn(&ck, &features, &Decoding::Greedy),
        drawn(&ck, &features, &sampled),
    );
    let rows: Vec<f32> = DISCRITUNE_ROWS.iter().map(|&r| r as f32).collect();
    let (n, t) = (distinct.len(), ck.model.config.token_positions());
    write_inputs(
        "golden_discritune_inputs.safetensors",
        &[
            ("corpus_embeddings", vec![5, 8], &corpus),
            ("batch_images", vec![rows.len()], &rows),
            ("greedy", vec![n, t], &greedy),
            ("sampled", vec![n, t], &sample),
        ],
        "golden.rs write_discritune_inputs",
        &[],
    );
}

/// One DiscriTune step of each case (greedy, with 2 hard negatives,
/// sampled captions) against scripts/golden.py: the golden retriever's
/// text tower in PyTorch reading the captions through the vocabulary map,
/// the rewards over the candidates at its scale, the first step's baseline,
/// and the loss, the mean reward and every captioner gradient.
fn discritune_steps<B: Backend>(b: &B, expected: &TensorFile) -> Vec<Outcome> {
    let inputs = tensorfile::read(&data("golden_discritune_inputs.safetensors")).unwrap();
    let corpus = discritune_corpus(&inputs.tensors["corpus_embeddings"].data);
    let batch = discritune_batch(&corpus);
    let ck = captune::retriever::Checkpoint::load(b, &data("golden_retriever.safetensors"), 4);
    let mut retriever =
        captune::retriever::frozen::FrozenRetriever::from_checkpoint(b, ck.unwrap()).unwrap();
    let at = Golden {
        checkpoint: "golden_listener_captioner.safetensors",
        batch: &batch,
        corpus: &corpus,
    };
    objective_steps(b, expected, &at, Some(&mut retriever))
}

#[test]
fn both_backends_reproduce_discritune_independently() {
    check_both(
        "golden_discritune_expected.safetensors",
        "golden_listener_captioner.safetensors",
        &["loss", "reward"],
        (discritune_steps, discritune_steps),
    );
}

/// CLIP relevance's golden batch: the discritune corpus' images 1, 3 and
/// 0, one Gumbel-max caption each.
const RELEVANCE_IMAGES: [usize; 3] = [1, 3, 0];

/// The captions a CLIP-relevance step on the golden listener captioner
/// chooses by the Gumbel-max trick, and the Gumbel noise it draws at every
/// (caption, step, token), for scripts/golden.py.
#[test]
#[ignore = "writes tests/data/golden_relevance_inputs.safetensors for scripts/golden.py"]
fn write_relevance_inputs() {
    let b = CpuBackend::new();
    let ck = Checkpoint::load(&b, &data("golden_listener_captioner.safetensors")).unwrap();
    let corpus = tensorfile::read(&data("golden_discritune_inputs.safetensors")).unwrap();
    let e = &corpus.tensors["corpus_embeddings"].data;
    let features: Vec<f32> = RELEVANCE_IMAGES
        .iter()
        .flat_map(|&i| e[i * 8..(i + 1) * 8].to_vec())
        .collect();
    let seed = first_step_seed();
    let captions = drawn(&ck, &features, &Decoding::Gumbel { n: 1, seed });
    let (t, v) = (
        ck.model.config.token_positions(),
        ck.model.config.vocab_size,
    );
    let n = RELEVANCE_IMAGES.len();
    let noise: Vec<f32> = (0..n)
        .flat_map(|c| (0..t).flat_map(move |s| (0..v).map(move |j| (c, s, j))))
        .map(|(c, s, j)| captune::cpu::choose::gumbel(seed, c as u32, s as u32, j as u32))
        .collect();
    write_inputs(
        "golden_relevance_inputs.safetensors",
        &[
            ("features", vec![n, 8], &features),
            ("captions", vec![n, t], &captions),
            ("noise", vec![n, t, v], &noise),
        ],
        "golden.rs write_relevance_inputs",
        &[],
    );
}

/// One CLIP-relevance step of each case (straight-through at tau 1, soft
/// at tau 0.5) against scripts/golden.py: the Gumbel-softmax of the
/// teacher-forced logits with captune's noise, read by the golden
/// retriever's text tower in PyTorch, -mean cos, and every captioner
/// gradient through the tower.
fn relevance_steps<B: Backend>(b: &B, expected: &TensorFile) -> Vec<Outcome> {
    let inputs = tensorfile::read(&data("golden_relevance_inputs.safetensors")).unwrap();
    let corpus = tensorfile::read(&data("golden_discritune_inputs.safetensors")).unwrap();
    let corpus = discritune_corpus(&corpus.tensors["corpus_embeddings"].data);
    let batch = TrainingBatch {
        inputs: inputs.tensors["features"].data.clone(),
        embeddings: None,
        sequences: Vec::new(),
        images: RELEVANCE_IMAGES.to_vec(),
        labelled: None,
    };
    let ck = captune::retriever::Checkpoint::load(b, &data("golden_retriever.safetensors"), 4);
    let mut retriever =
        captune::retriever::frozen::FrozenRetriever::from_checkpoint(b, ck.unwrap()).unwrap();
    let at = Golden {
        checkpoint: "golden_listener_captioner.safetensors",
        batch: &batch,
        corpus: &corpus,
    };
    objective_steps(b, expected, &at, Some(&mut retriever))
}

#[test]
fn both_backends_reproduce_clip_relevance_independently() {
    check_both(
        "golden_relevance_expected.safetensors",
        "golden_listener_captioner.safetensors",
        &["loss"],
        (relevance_steps, relevance_steps),
    );
}
