//! The LSTM captioners against an independent PyTorch implementation
//! (scripts/lstm_fixtures.py: `nn.LSTM` and `nn.LSTMCell` in float64,
//! written from the papers and docs/lstm.md), the FC model fed the image
//! either way, top-down attention and Att2in over image tokens: one MLE step's
//! loss and every parameter's gradient, the greedy captions and the two
//! best of a beam search, on both backends; and one SCST step of each
//! model for the samples captune draws. The FC model fed the image as its
//! hidden state runs its first layer through the word table (3 captions
//! of 7 positions, 12 ids), fed the image as an input without it.

use super::golden::{self, Golden, data};
use crate::common;

use captune::backend::Backend;
use captune::captioner::Checkpoint;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::objective::TrainingBatch;
use captune::cpu::CpuBackend;
use captune::data::vocab::PAD;
use captune::tensorfile::{self, TensorFile};

const MODELS: [&str; 4] = ["fc_hidden", "fc_input", "updown", "att2in"];

fn ids(file: &TensorFile, name: &str) -> Vec<u32> {
    file.tensors[name].data.iter().map(|&x| x as u32).collect()
}

fn agrees_with_pytorch<B: Backend>(b: &B, backend: &str, model: &str) {
    let what = format!("{backend}, {model}");
    let mut ck = Checkpoint::load(b, &data(&format!("lstm_{model}.safetensors"))).unwrap();
    let expected = tensorfile::read(&data(&format!("lstm_{model}_expected.safetensors"))).unwrap();
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
    let features = &expected.tensors["features"].data;
    let loss = golden::mle_step(b, &mut ck.model, &ck.vocab, features, &sequences);
    let want = expected.tensors["loss"].data[0];
    assert!(
        (loss - want).abs() <= 1e-5 * want,
        "{what}: loss {loss} against PyTorch's {want}"
    );
    // Relative to the tensor's largest gradient, as the tests against
    // transformers' float64 fixtures compare: the FC model's are within
    // 2e-6 of it; top-down attention's, summed in f32 over the positions
    // and the tokens, within 2e-5.
    let want = |name: &str| expected.tensors[&format!("grad.{name}")].data.as_slice();
    let whose = (what.as_str(), "PyTorch's");
    golden::assert_gradients_close(b, ck.model.params(), want, 5e-5, whose);
    let generated = generate(
        b,
        &ck.model,
        features,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    let want = common::padded_ids(&expected.tensors["greedy"].data, steps);
    let got: Vec<Vec<u32>> = generated.into_iter().map(|g| g.ids).collect();
    assert_eq!(got, want, "{what}: greedy captions");

    let beam = Decoding::Beam {
        width: 3,
        n_best: 2,
    };
    let generated = generate(b, &ck.model, features, &beam, &DecodeOptions::default()).unwrap();
    let want_ids = common::padded_ids(&expected.tensors["beam"].data, steps);
    let want_logp = &expected.tensors["beam_logp"].data;
    assert_eq!(
        generated.len(),
        want_logp.len(),
        "{what}: two captions per image"
    );
    for ((g, ids), &logp) in generated.iter().zip(want_ids).zip(want_logp) {
        assert_eq!(g.ids, ids, "{what}: beam captions");
        assert!(
            (g.logprob - logp).abs() <= 1e-5 * logp.abs(),
            "{what}: beam log-probability {} against PyTorch's {logp}",
            g.logprob
        );
    }
}

#[test]
fn an_lstm_captioner_matches_pytorch() {
    for model in MODELS {
        agrees_with_pytorch(&CpuBackend::new(), "cpu", model);
        if let Some(g) = common::gpu() {
            agrees_with_pytorch(&g, "gpu", model);
        }
    }
}

/// The samples and greedy captions the first step of an SCST run draws
/// with each LSTM fixture for its three images, for scripts/lstm_fixtures.py
/// (`cargo test --test suite lstm:: -- --ignored`).
#[test]
#[ignore = "writes tests/data/lstm_*_scst_inputs.safetensors for scripts/lstm_fixtures.py"]
fn write_scst_inputs() {
    for model in MODELS {
        let ck = Checkpoint::load(
            &CpuBackend::new(),
            &data(&format!("lstm_{model}.safetensors")),
        )
        .unwrap();
        let expected =
            tensorfile::read(&data(&format!("lstm_{model}_expected.safetensors"))).unwrap();
        let features = &expected.tensors["features"].data;
        let sampling = Decoding::Sample {
            n: golden::SEQUENCE_SAMPLES,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: golden::first_step_seed(),
        };
        let t = ck.model.config.token_positions();
        let samples = golden::drawn(&ck, features, &sampling);
        let greedy = golden::drawn(&ck, features, &Decoding::Greedy);
        let metadata = [
            (
                "references",
                serde_json::to_string(&golden::SEQUENCE_REFERENCES).unwrap(),
            ),
            (
                "images",
                serde_json::to_string(&golden::SEQUENCE_IMAGES).unwrap(),
            ),
        ];
        golden::write_inputs(
            &format!("lstm_{model}_scst_inputs.safetensors"),
            &[
                ("samples", vec![3 * golden::SEQUENCE_SAMPLES, t], &samples),
                ("greedy", vec![3, t], &greedy),
            ],
            "lstm.rs write_scst_inputs",
            &metadata,
        );
    }
}

/// One SCST step (greedy baseline) of each LSTM model against PyTorch's
/// (`lstm_*_scst_expected.safetensors`): for the samples captune draws at a
/// run's first step, with rewards by pycocoevalcap's CIDEr-D over the
/// golden sequence corpus, the loss and every parameter's gradient.
#[test]
fn an_lstm_scst_step_matches_pytorch() {
    let corpus = golden::sequence_corpus();
    for model in MODELS {
        let file = format!("lstm_{model}.safetensors");
        let features = tensorfile::read(&data(&format!("lstm_{model}_expected.safetensors")))
            .unwrap()
            .tensors["features"]
            .data
            .clone();
        let expected =
            tensorfile::read(&data(&format!("lstm_{model}_scst_expected.safetensors"))).unwrap();
        let batch = TrainingBatch {
            inputs: features,
            embeddings: None,
            sequences: Vec::new(),
            images: golden::SEQUENCE_IMAGES.to_vec(),
            labelled: None,
        };
        let at = Golden {
            checkpoint: &file,
            batch: &batch,
            corpus: &corpus,
        };
        let cpu = golden::objective_steps(&CpuBackend::new(), &expected, &at, None);
        golden::check_outcomes(&format!("CPU {model}"), cpu, &expected, &file, &["loss"]);
        if let Some(g) = common::gpu() {
            let gpu = golden::objective_steps(&g, &expected, &at, None);
            golden::check_outcomes(&format!("GPU {model}"), gpu, &expected, &file, &["loss"]);
        }
    }
}

/// `train --decoder lstm:fc` from the command line, then what a user does
/// with the run: evaluate it, inspect a caption, caption by beam search,
/// resume it; export says there is no Hugging Face form.
#[test]
fn an_lstm_run_trains_evaluates_inspects_and_resumes() {
    let dir = common::fresh_temp("lstm-run");
    let (run, cache) = (dir.join("run"), dir.join("cache"));
    let captune = |args: &[&str]| crate::common::captune_on_cpu(&cache, args);
    let run_arg = run.display().to_string();
    let mut train = vec!["train", "--preset", "tiny", "--epochs", "1"];
    train.extend([
        "--decoder",
        "lstm:fc",
        "--image-feed",
        "input",
        "--out",
        &run_arg,
    ]);
    train.extend(common::TINY_WORLD_ARGS);
    let (ok, _, err) = captune(&train);
    assert!(ok, "{err}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains("decoder = \"lstm:fc\"") && config.contains("image_feed = \"input\""),
        "{config}"
    );
    let checkpoint = run.join("checkpoint.safetensors").display().to_string();
    let results = dir.join("results.json").display().to_string();
    let eval = [
        "eval",
        "--checkpoint",
        &checkpoint,
        "--split",
        "val",
        "--results",
        &results,
    ];
    let (ok, out, err) = captune(&eval);
    assert!(ok, "{err}");
    assert!(out.contains("CIDEr-D"), "{out}");
    let captions: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(captions.len(), 16, "a caption per validation image");
    let image = captions[0]["image_id"].to_string().replace('"', "");

    let inspect = ["inspect", "--checkpoint", &checkpoint, "--image", &image];
    let (ok, out, err) = captune(&[&inspect[..], &["--caption", "a red circle"]].concat());
    assert!(ok, "{err}");
    let first: Vec<&str> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(first, ["a", "red", "circle", "<eos>"], "{out}");

    let (ok, out, err) = captune(&["eval", "--checkpoint", &checkpoint, "--decode", "beam:3"]);
    assert!(ok, "{err}");
    assert!(out.contains("CIDEr-D"), "{out}");

    let resume = ["train", "--resume", "--epochs", "1", "--out", &run_arg];
    let (ok, _, err) = captune(&resume);
    assert!(ok, "{err}");
    let log = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 2, "an epoch more: {log}");

    let hf = dir.join("hf").display().to_string();
    let (ok, _, err) = captune(&["export", &run_arg, "--hf", &hf]);
    assert!(!ok && err.contains("no Hugging Face form"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `train --decoder lstm:updown --image-tokens hf:BLIP`: the tokens are
/// computed once into the cache, recorded with the run, and read again
/// by `eval`, `inspect` and `caption` without being named.
#[test]
fn a_top_down_run_reads_its_recorded_image_tokens() {
    an_attention_run_reads_its_recorded_image_tokens("lstm:updown", "blip-tiny");
}

/// The same for Att2in over a CLIP folder's image tower.
#[test]
fn an_att2in_run_reads_a_clip_tower_s_image_tokens() {
    an_attention_run_reads_its_recorded_image_tokens("lstm:att2in", "clip-tiny");
}

fn an_attention_run_reads_its_recorded_image_tokens(decoder: &str, tower: &str) {
    let dir = common::fresh_temp(&format!("{}-run", &decoder[5..]));
    let (run, cache) = (dir.join("run"), dir.join("cache"));
    let captune = |args: &[&str]| crate::common::captune_on_cpu(&cache, args);
    let folder = format!("hf:{}", data(tower).display());
    let run_arg = run.display().to_string();
    let mut train = vec!["train", "--preset", "tiny", "--epochs", "1"];
    train.extend([
        "--decoder",
        decoder,
        "--image-tokens",
        &folder,
        "--out",
        &run_arg,
    ]);
    train.extend(common::TINY_WORLD_ARGS);
    let (ok, _, err) = captune(&train);
    assert!(ok, "{err}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains(&format!("decoder = \"{decoder}\"")),
        "{config}"
    );
    let cached = std::fs::read_dir(cache.join("image-tokens"))
        .unwrap()
        .count();
    assert_eq!(cached, 1, "the tokens are computed once, into the cache");

    let checkpoint = run.join("checkpoint.safetensors").display().to_string();
    let results = dir.join("results.json").display().to_string();
    let eval = [
        "eval",
        "--checkpoint",
        &checkpoint,
        "--split",
        "val",
        "--results",
        &results,
    ];
    let (ok, out, err) = captune(&eval);
    assert!(ok, "{err}");
    assert!(err.contains("image tokens from the cache"), "{err}");
    assert!(out.contains("CIDEr-D"), "{out}");
    let captions: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let image = captions[0]["image_id"].to_string().replace('"', "");
    let inspect = ["inspect", "--checkpoint", &checkpoint, "--image", &image];
    let (ok, out, err) = captune(&[&inspect[..], &["--caption", "a red circle"]].concat());
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|l| l.trim_start().starts_with("a ")),
        "{out}"
    );

    // An image file goes through the recorded tower to a caption.
    let picture = data("clip-images").join("wide.png").display().to_string();
    let (ok, out, err) = captune(&["caption", "--checkpoint", &checkpoint, &picture]);
    assert!(ok, "{err}");
    let caption = out.lines().next().and_then(|l| l.strip_prefix(&picture));
    assert!(
        caption.is_some_and(|c| c.starts_with('\t') && c.trim().len() > 1),
        "a caption of {picture}: {out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
