//! Captioner training and decoding on a tiny shapes world: training lowers
//! the loss and writes the run folder, an interrupted and resumed run
//! gives the same numbers as an uninterrupted one, and greedy and beam
//! decoding agree between GPU and CPU and with teacher forcing.

use crate::common;

use captune::backend::Backend;
use captune::captioner::decode::{DecodeOptions, Decoding, Generated, generate};
use captune::captioner::inputs::TokenInputs;
use captune::captioner::model::Captioner;
use captune::captioner::objectives::settings::SettingValue;
use captune::captioner::objectives::token::{BatchTargets, Losses, TokenObjective};
use captune::captioner::records::{Event, Flow};
use captune::captioner::run::RunConfig;
use captune::captioner::run_folder::{Begin, RunFolder};
use captune::captioner::train::{self};
use captune::captioner::{CaptionVocab, Checkpoint, MapperTransformer};
use captune::cpu::CpuBackend;
use captune::data::vocab::{BOS, EOS, PAD};
use captune::model::layers::Activation;
use captune::progress::Progress;
use captune::source::embeddings::CaptionData;
use captune::tensorfile;
use common::{TINY_DIM, gpu, tiny_data};
use rand::SeedableRng;
use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    crate::common::fresh_temp(&format!("captioner-{name}"))
}

const DIM: usize = TINY_DIM;

fn tiny_run(epochs: usize) -> RunConfig {
    let mut c = RunConfig::preset("tiny").unwrap();
    c.train.epochs = epochs;
    c.train.eval_images = 4;
    c.train.sample_images = 1;
    c.train.log_every = 1;
    c
}

fn new_checkpoint<B: Backend>(b: &B, data: &CaptionData, run: &RunConfig) -> Checkpoint<B> {
    let vocab = CaptionVocab::build(&data.data, run.train.min_count).unwrap();
    let config = run.captioner(DIM, vocab.len());
    Checkpoint {
        model: Captioner::new(b, config, 4).unwrap(),
        vocab,
    }
}

/// Trains `ck` on `data` into `folder` to the run's end, without a retriever.
fn train_to_end<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    data: &CaptionData,
    run: &RunConfig,
    folder: &RunFolder,
    begin: Begin,
) {
    let hidden = Progress::hidden();
    train::train(
        b,
        ck,
        data,
        run,
        folder,
        begin,
        false,
        None,
        None,
        &hidden,
        |_| Flow::Continue,
    )
    .unwrap();
}

fn log_lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn training_writes_the_run_folder_and_lowers_the_loss() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let run = tiny_run(6);
    let mut ck = new_checkpoint(&b, &data, &run);
    let folder = RunFolder::new(temp("run"));
    train_to_end(&b, &mut ck, &data, &run, &folder, Begin::New);
    let log = log_lines(&folder.dir);
    assert_eq!(log.len(), 6 * (96 / 16));
    for line in &log {
        for key in [
            "step",
            "objective",
            "loss",
            "mle",
            "smile",
            "lr",
            "grad_norm",
            "tokens_per_s",
        ] {
            assert!(!line[key].is_null(), "log line lacks {key}: {line}");
        }
    }
    let mean_mle = |lines: &[serde_json::Value]| {
        lines
            .iter()
            .map(|l| l["mle"].as_f64().unwrap())
            .sum::<f64>()
            / lines.len() as f64
    };
    let (first, last) = (mean_mle(&log[..6]), mean_mle(&log[log.len() - 6..]));
    assert!(
        last < 0.8 * first,
        "MLE loss, first epoch {first} -> last epoch {last}"
    );
    let samples = std::fs::read_to_string(folder.dir.join("samples.jsonl")).unwrap();
    let sample: serde_json::Value = serde_json::from_str(samples.lines().last().unwrap()).unwrap();
    assert!(!sample["tokens"].as_array().unwrap().is_empty(), "{sample}");
    let metrics = std::fs::read_to_string(folder.dir.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 6);
    let reloaded = RunConfig::load(&folder.dir.join("config.toml")).unwrap();
    assert_eq!(reloaded, run);
    std::fs::remove_dir_all(&folder.dir).unwrap();
}

/// With `freeze_decoder` only the mapper trains: every decoder weight
/// comes out bit for bit as it went in, every mapper weight moves, and the
/// MLE loss still falls (the gradient reaches the prefix through the
/// frozen decoder). The run's config keeps the setting.
#[test]
fn a_frozen_decoder_trains_the_mapper_only() {
    frozen_decoder_run(&CpuBackend::new(), None, "cpu");
    if let Some(g) = gpu() {
        frozen_decoder_run(&g, None, "gpu");
    }
}

/// The same with ClipCap's transformer mapper, the one its paper pairs
/// with a frozen decoder: its linear layer, constants and blocks all
/// train; the run's config and checkpoint keep its shape.
#[test]
fn a_frozen_decoder_trains_the_transformer_mapper() {
    let shape = MapperTransformer {
        clip_len: 2,
        layers: 2,
        heads: 2,
    };
    frozen_decoder_run(&CpuBackend::new(), Some(shape), "cpu");
    if let Some(g) = gpu() {
        frozen_decoder_run(&g, Some(shape), "gpu");
    }
}

fn frozen_decoder_run<B: Backend>(b: &B, mapper: Option<MapperTransformer>, what: &str) {
    let data = tiny_data();
    let mut run = tiny_run(3);
    run.train.freeze_decoder = true;
    run.model.mapper_transformer = mapper;
    if mapper.is_some() {
        run.model.mapper_activation = Activation::Relu;
    }
    let mut ck = new_checkpoint(b, &data, &run);
    let before: Vec<Vec<f32>> = ck
        .model
        .params()
        .values
        .iter()
        .map(|v| b.to_vec(v))
        .collect();
    let kind = if mapper.is_some() {
        "transformer"
    } else {
        "mlp"
    };
    let folder = RunFolder::new(temp(&format!("frozen-{kind}-{what}")));
    train_to_end(b, &mut ck, &data, &run, &folder, Begin::New);
    for (i, (spec, value)) in ck
        .model
        .params()
        .specs
        .iter()
        .zip(&ck.model.params().values)
        .enumerate()
    {
        let after = b.to_vec(value);
        if ck.model.is_adapter(i) {
            assert_ne!(after, before[i], "{what}: {} did not train", spec.name);
        } else {
            assert_eq!(after, before[i], "{what}: {} moved", spec.name);
        }
    }
    assert!((0..ck.model.params().specs.len()).any(|i| ck.model.is_adapter(i)));
    let log = log_lines(&folder.dir);
    let mle = |l: &serde_json::Value| l["mle"].as_f64().unwrap();
    let first: f64 = log[..3].iter().map(mle).sum::<f64>() / 3.0;
    let last: f64 = log[log.len() - 3..].iter().map(mle).sum::<f64>() / 3.0;
    assert!(
        last < first,
        "{what}: MLE loss, first {first} -> last {last}"
    );
    // Decoding runs the mapper forward only: its captions' log-probabilities
    // are teacher forcing's.
    let items = data.items(captune::data::Split::Val);
    let features = data.features_of(&items[..2]);
    let greedy = generate(
        b,
        &ck.model,
        &features,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    for (g, image) in greedy.iter().zip(features.chunks(DIM)) {
        let forced = teacher_forced_logprob(b, &mut ck.model, &ck.vocab, image, g);
        assert!(
            (forced - g.logprob).abs() < 1e-3 * (1.0 + forced.abs()),
            "{what}: decoded {} vs teacher-forced {forced}",
            g.logprob
        );
    }
    let reloaded = RunConfig::load(&folder.dir.join("config.toml")).unwrap();
    assert!(reloaded.train.freeze_decoder);
    assert_eq!(reloaded.model.mapper_transformer, mapper);
    let saved = Checkpoint::load(b, &folder.checkpoint()).unwrap();
    assert_eq!(saved.model.config, ck.model.config);
    for (spec, (a, z)) in saved.model.params().specs.iter().zip(
        saved
            .model
            .params()
            .values
            .iter()
            .zip(&ck.model.params().values),
    ) {
        assert_eq!(b.to_vec(a), b.to_vec(z), "{what}: {} reloaded", spec.name);
    }
    std::fs::remove_dir_all(&folder.dir).unwrap();
}

#[test]
fn a_resumed_run_gives_the_numbers_of_an_uninterrupted_one() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let mut run = tiny_run(3);
    run.train.objective = "smile-random".into();
    run.train
        .settings
        .insert("mle_weight".into(), SettingValue::Number(0.2));
    let whole = RunFolder::new(temp("whole"));
    let mut ck = new_checkpoint(&b, &data, &run);
    train_to_end(&b, &mut ck, &data, &run, &whole, Begin::New);

    let parts = RunFolder::new(temp("parts"));
    let mut ck = new_checkpoint(&b, &data, &run);
    train::train(
        &b,
        &mut ck,
        &data,
        &run,
        &parts,
        Begin::New,
        false,
        None,
        None,
        &Progress::hidden(),
        |e| match e {
            Event::Metrics(m) if m.epoch == 1 => Flow::Stop,
            _ => Flow::Continue,
        },
    )
    .unwrap();
    let mut ck = Checkpoint::load(&b, &parts.checkpoint()).unwrap();
    train_to_end(&b, &mut ck, &data, &run, &parts, Begin::Resume);

    let strip = |mut v: serde_json::Value| {
        v.as_object_mut().unwrap().remove("tokens_per_s");
        v
    };
    let a: Vec<_> = log_lines(&whole.dir).into_iter().map(strip).collect();
    let b_lines: Vec<_> = log_lines(&parts.dir).into_iter().map(strip).collect();
    assert_eq!(a, b_lines, "the same log, line for line");
    let mut x = tensorfile::read(&whole.checkpoint()).unwrap();
    let mut y = tensorfile::read(&parts.checkpoint()).unwrap();
    for spec in &ck.model.params().specs {
        let (p, q) = (
            x.take(&spec.name, &whole.checkpoint()).unwrap(),
            y.take(&spec.name, &parts.checkpoint()).unwrap(),
        );
        assert_eq!(p.data, q.data, "{} differs after resuming", spec.name);
    }
    std::fs::remove_dir_all(&whole.dir).unwrap();
    std::fs::remove_dir_all(&parts.dir).unwrap();
}

/// A model trained until its predictions are decided (16 epochs: after 8,
/// it still loops on "a" for some images, and beam search can prune
/// greedy's caption in favour of such a loop).
fn trained() -> (Checkpoint<CpuBackend>, CaptionData, PathBuf) {
    let c = CpuBackend::new();
    let data = tiny_data();
    let run = tiny_run(16);
    let mut ck = new_checkpoint(&c, &data, &run);
    // One folder per call: tests that call this run at once.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let folder = RunFolder::new(temp(&format!("decode-{n}")));
    train_to_end(&c, &mut ck, &data, &run, &folder, Begin::New);
    (ck, data, folder.checkpoint())
}

/// A trained model decoding six validation images at once: the
/// checkpoint, its path, the images' features and the model.
fn six_images() -> (Checkpoint<CpuBackend>, PathBuf, Vec<f32>) {
    let (ck, data, path) = trained();
    let items = data.items(captune::data::Split::Val);
    let features = data.features_of(&items[..6]);
    (ck, path, features)
}

/// log p of `g`'s ids under teacher forcing, summed.
fn teacher_forced_logprob<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    vocab: &CaptionVocab,
    features: &[f32],
    g: &Generated,
) -> f32 {
    let c = model.config;
    let steps = c.token_positions();
    let mut seq = vec![BOS];
    seq.extend(&g.ids);
    let mut targets = vec![PAD; steps];
    targets[..g.ids.len()].copy_from_slice(&g.ids);
    let inputs = TokenInputs::new(b, &c, &[seq[..seq.len() - 1].to_vec()]).unwrap();
    model.forward(b, features, &inputs).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mle = TokenObjective::mle();
    let t = BatchTargets::new(b, &mle, vocab, &c, &targets, steps, &mut rng).unwrap();
    let mut losses = Losses::new(b, TokenObjective::mle(), inputs.rows(), c.vocab_size);
    losses.forward_backward(b, model.logits(), &t, true);
    losses.row_logprobs(b).0[..g.ids.len()].iter().sum()
}

#[test]
fn decoding_is_consistent_and_agrees_between_gpu_and_cpu() {
    let c = CpuBackend::new();
    let (mut ck, path, features) = six_images();
    let greedy = generate(
        &c,
        &ck.model,
        &features,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(greedy.len(), 6);
    assert!(
        greedy.iter().any(|g| g.ids.len() > 2),
        "the trained model says something"
    );
    assert!(greedy.iter().all(|g| g.ids.last() == Some(&EOS) || g.ids.len() == ck.model.config.token_positions()));

    // Beam of width 1 is greedy; so is sampling from the top token only.
    let beam1 = generate(
        &c,
        &ck.model,
        &features,
        &Decoding::Beam {
            width: 1,
            n_best: 1,
        },
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(
        beam1.iter().map(|g| &g.ids).collect::<Vec<_>>(),
        greedy.iter().map(|g| &g.ids).collect::<Vec<_>>()
    );
    let top1 = Decoding::parse("sample:2:k=1,seed=5").unwrap();
    let sampled = generate(&c, &ck.model, &features, &top1, &DecodeOptions::default()).unwrap();
    for (k, s) in sampled.iter().enumerate() {
        assert_eq!(s.ids, greedy[k / 2].ids, "top-1 sampling is greedy");
    }
    let free = generate(
        &c,
        &ck.model,
        &features,
        &Decoding::parse("sample:3:t=1.5,seed=2").unwrap(),
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(free.len(), 18);
    assert!(
        free.iter()
            .map(|g| &g.ids)
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 6,
        "sampling varies"
    );

    // A word limit keeps at most that many words, then <eos> if the
    // caption ended there: greedy's captions are the unlimited ones' first
    // two words, and every kept caption's log-probability is that of its
    // ids, the cut ones' too.
    let two_words = |ids: &[u32]| {
        let words = ids.iter().filter(|&&id| id != EOS).count();
        words <= 2
            && ids
                .iter()
                .position(|&id| id == EOS)
                .is_none_or(|end| end == words)
    };
    let short = generate(&c, &ck.model, &features, &Decoding::Greedy, &words(2)).unwrap();
    let beam_short = Decoding::Beam {
        width: 3,
        n_best: 2,
    };
    let beam_short = generate(&c, &ck.model, &features, &beam_short, &words(2)).unwrap();
    assert!(
        short.iter().any(|s| s.ids.len() == 2 && s.ids[1] != EOS),
        "some caption is cut: {:?}",
        short.iter().map(|s| &s.ids).collect::<Vec<_>>()
    );
    for (s, g) in short.iter().zip(&greedy) {
        let cut = (g.ids.len()).min(if g.ids.get(2) == Some(&EOS) { 3 } else { 2 });
        assert_eq!(s.ids[..], g.ids[..cut], "the unlimited caption, cut");
    }
    for s in short.iter().chain(&beam_short) {
        assert!(two_words(&s.ids), "{:?}", s.ids);
        let f = &features[s.image * DIM..(s.image + 1) * DIM];
        let forced = teacher_forced_logprob(&c, &mut ck.model, &ck.vocab, f, s);
        assert!(
            (forced - s.logprob).abs() < 1e-3,
            "{:?}: decoded {} vs forced {forced}",
            s.ids,
            s.logprob
        );
    }

    // Beam: n best in order, the best at least as likely as greedy's caption
    // (not promised in general, but on a decided model a width-4 beam keeps
    // greedy's path), and every reported log-probability is the teacher-forced one.
    let beam = generate(
        &c,
        &ck.model,
        &features,
        &Decoding::Beam {
            width: 4,
            n_best: 2,
        },
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(beam.len(), 12);
    for (k, g) in beam.iter().enumerate() {
        let image = k / 2;
        assert_eq!(g.image, image);
        if k % 2 == 1 {
            assert!(beam[k - 1].logprob >= g.logprob);
        } else {
            assert!(
                g.logprob >= greedy[image].logprob - 1e-4,
                "beam {} < greedy {}",
                g.logprob,
                greedy[image].logprob
            );
        }
        let f = &features[image * DIM..(image + 1) * DIM];
        let forced = teacher_forced_logprob(&c, &mut ck.model, &ck.vocab, f, g);
        assert!(
            (forced - g.logprob).abs() < 1e-3,
            "decoded {} vs forced {forced}",
            g.logprob
        );
    }

    let Some(g) = gpu() else {
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        return;
    };
    let on_gpu = Checkpoint::load(&g, &path).unwrap();
    for decoding in [
        Decoding::Greedy,
        Decoding::Beam {
            width: 3,
            n_best: 2,
        },
    ] {
        let want = generate(
            &c,
            &ck.model,
            &features,
            &decoding,
            &DecodeOptions::default(),
        )
        .unwrap();
        let got = generate(
            &g,
            &on_gpu.model,
            &features,
            &decoding,
            &DecodeOptions::default(),
        )
        .unwrap();
        let ids = |v: &[Generated]| v.iter().map(|x| x.ids.clone()).collect::<Vec<_>>();
        assert_eq!(
            ids(&got),
            ids(&want),
            "{decoding:?}: GPU and CPU captions differ"
        );
    }
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

fn words(max_words: usize) -> DecodeOptions {
    DecodeOptions {
        max_words: Some(max_words),
        ..DecodeOptions::default()
    }
}

/// `suppress_unk` on a model made to prefer `<unk>`: its output row is
/// three times that of greedy's first word, so plain greedy says `<unk>`
/// first, and the suppressed decoder never does.
#[test]
fn suppressed_unk_is_never_emitted() {
    let c = CpuBackend::new();
    let (mut ck, path, features) = six_images();
    let plain = generate(
        &c,
        &ck.model,
        &features,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    let tokens = ck
        .model
        .params()
        .specs
        .iter()
        .position(|s| s.name == "decoder.tokens")
        .unwrap();
    let width = ck.model.params().specs[tokens].shape[1];
    let mut table = c.to_vec(&ck.model.params().values[tokens]);
    let first = plain[0].ids[0] as usize;
    let unk = captune::data::vocab::UNK as usize;
    for k in 0..width {
        table[unk * width + k] = 3.0 * table[first * width + k];
    }
    c.write(&mut ck.model.params_mut().values[tokens], &table);
    let greedy = generate(
        &c,
        &ck.model,
        &features,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(
        greedy[0].ids[0] as usize, unk,
        "the doctored model prefers <unk>"
    );
    let bar = indicatif::ProgressBar::hidden();
    let suppress = DecodeOptions {
        suppress_unk: true,
        progress: Some(bar.clone()),
        ..DecodeOptions::default()
    };
    for decoding in [
        Decoding::Greedy,
        Decoding::Beam {
            width: 3,
            n_best: 2,
        },
        Decoding::parse("sample:3:seed=4").unwrap(),
    ] {
        let out = generate(&c, &ck.model, &features, &decoding, &suppress).unwrap();
        assert!(
            out.iter()
                .all(|g| !g.ids.contains(&(unk as u32)) && !g.ids.is_empty()),
            "{decoding:?}: {out:?}"
        );
    }
    assert_eq!(bar.position(), 3 * 6, "one tick per image captioned");
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn decoding_strings_parse_or_say_what_is_expected() {
    assert_eq!(Decoding::parse("greedy").unwrap(), Decoding::Greedy);
    assert_eq!(
        Decoding::parse("beam:5").unwrap(),
        Decoding::Beam {
            width: 5,
            n_best: 1
        }
    );
    assert_eq!(
        Decoding::parse("sample:5:t=0.7,k=40,p=0.9,seed=3").unwrap(),
        Decoding::Sample {
            n: 5,
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            seed: 3
        }
    );
    for (bad, says) in [
        ("beam:0", "positive whole number"),
        ("beam:2:3", "cannot exceed"),
        ("sample:2:q=1", "is not t=, k=, p= or seed="),
        ("sample:2:t=0", "temperature must be positive"),
        ("sample:2:t=nan", "temperature must be positive"),
        ("nucleus", "expected greedy, beam:W"),
    ] {
        let err = Decoding::parse(bad).unwrap_err().to_string();
        assert!(err.contains(says), "{bad}: {err}");
    }
}
