//! The sequence-level objectives (SCST, SLL-ME, SLE): the CIDEr-D reward
//! against `metrics::cider` and against pycocoevalcap with the training
//! statistics (`tests/data/cider_reward_flickr8k.json`, made by
//! `scripts/cider_reward_reference.py`), the advantages and the surrogate
//! loss against hand computations, one step of each objective GPU vs
//! CPU, and SCST raising the mean reward on a tiny world.

use crate::common;

use captune::backend::Backend;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::inputs::TokenInputs;
use captune::captioner::model::Captioner;
use captune::captioner::objective::{StepContext, TrainingBatch, TrainingCorpus};
use captune::captioner::objectives;
use captune::captioner::objectives::reinforce::Surrogate;
use captune::captioner::objectives::sequence::{
    Advantages, Baseline, distance, distances, self_critical, sle,
};
use captune::captioner::objectives::settings::{SettingValue, Settings};
use captune::captioner::reward::CiderReward;
use captune::captioner::run::RunConfig;
use captune::captioner::train::fresh_checkpoint;
use captune::captioner::{CaptionVocab, Checkpoint};
use captune::cpu::CpuBackend;
use captune::data::Split;
use captune::data::vocab::{EOS, PAD, UNK};
use captune::metrics::cider::CiderD;
use captune::optim::{AdamW, AdamWConfig};
use captune::source::embeddings::CaptionData;
use common::{assert_close, gpu, random, tiny_data};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// A vocabulary of every word of `corpus` and `extra` (specials first,
/// as a stored word list has them).
fn vocab_of(corpus: &TrainingCorpus, extra: &[&str]) -> CaptionVocab {
    let mut list: Vec<String> = ["<pad>", "<bos>", "<eos>", "<unk>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut seen: HashSet<String> = list.iter().cloned().collect();
    let words = corpus.references.iter().flatten().flatten();
    for w in words.map(String::as_str).chain(extra.iter().copied()) {
        if seen.insert(w.to_string()) {
            list.push(w.to_string());
        }
    }
    CaptionVocab::from_words(list)
}

fn encode(vocab: &CaptionVocab, words: &[String]) -> Vec<u32> {
    let ids = vocab.encode(words, 64).unwrap();
    ids[1..].to_vec()
}

#[test]
fn the_reward_equals_metrics_cider_given_the_same_references() {
    let corpus = TrainingCorpus::new(
        "hand-made",
        vec![
            vec![
                words("a red circle on the left"),
                words("a circle"),
                words("red circle left of a square"),
            ],
            vec![words("two blue squares"), words("a pair of blue squares")],
            vec![
                words("a green triangle above a red circle"),
                words("a triangle"),
            ],
        ],
    );
    // "hexagon": a word of the vocabulary no reference holds.
    let vocab = vocab_of(&corpus, &["hexagon"]);
    let reward = CiderReward::counted(&corpus, &vocab);
    let cider = CiderD::new(&corpus.references);
    let candidates = [
        "a red circle on the left",
        "a red circle",
        "blue squares blue squares",
        "a hexagon above a red circle",
        "",
    ];
    for (image, refs) in corpus.references.iter().enumerate() {
        for c in candidates {
            let want = cider.score(&words(c), refs);
            let got = reward.reward(image, &encode(&vocab, &words(c)));
            assert!(
                (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                "image {image}, {c:?}: reward {got}, metrics::cider {want}"
            );
        }
    }
    // <unk> matches no reference word, and the ids after <eos> do not count.
    let id = |w: &str| vocab.word_list().unwrap().id(w);
    let with_unk = reward.reward(0, &[id("a"), UNK, id("circle"), EOS, id("red")]);
    let want = cider.score(&words("a <unk> circle"), &corpus.references[0]);
    assert!((with_unk - want).abs() < 1e-9, "{with_unk} vs {want}");
    // References outside the corpus: each unseen word stays its own word.
    let outside = vec![words("a zebra and a giraffe"), words("zebra giraffe okapi")];
    let against = reward.reward_against(&encode(&vocab, &words("a red circle")), &outside);
    let want = CiderD::new(&corpus.references).score(&words("a red circle"), &outside);
    assert!((against - want).abs() < 1e-9, "{against} vs {want}");
    // Many at once, in parallel, give the same values in order.
    let ids: Vec<Vec<u32>> = candidates
        .iter()
        .map(|c| encode(&vocab, &words(c)))
        .collect();
    let pairs: Vec<(usize, &[u32])> = ids.iter().map(|i| (1, i.as_slice())).collect();
    let each: Vec<f64> = ids.iter().map(|i| reward.reward(1, i)).collect();
    assert_eq!(reward.rewards(&pairs), each);
}

#[test]
fn the_reward_equals_pycocoevalcap_with_training_statistics_on_flickr8k() {
    let Some(flickr8k) = common::flickr8k() else {
        return;
    };
    let data: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(flickr8k.join("dataset_flickr8k.json")).unwrap(),
    )
    .unwrap();
    let references: Vec<Vec<Vec<String>>> = data["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["split"] == "train")
        .map(|i| {
            i["sentences"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let tokens = s["tokens"].as_array().unwrap();
                    tokens
                        .iter()
                        .map(|t| t.as_str().unwrap().to_string())
                        .collect()
                })
                .collect()
        })
        .collect();
    let corpus = TrainingCorpus::new(
        format!("flickr8kTrainTest{}", std::process::id()),
        references,
    );
    let vocab = vocab_of(&corpus, &[]);
    let expected: serde_json::Value =
        serde_json::from_str(include_str!("../../data/cider_reward_flickr8k.json")).unwrap();
    assert_eq!(
        expected["training_images"].as_u64().unwrap() as usize,
        corpus.references.len()
    );
    let cache = captune::cache::root().join("cider");
    let cached = |name: &str| {
        std::fs::read_dir(&cache)
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(name))
            })
            .unwrap_or(false)
    };
    assert!(!cached(&corpus.name), "a fresh name has no cache yet");
    // Counted and cached, then read from the cache: the same rewards.
    let first = CiderReward::for_training(&corpus, &vocab);
    assert!(
        cached(&corpus.name),
        "the statistics are cached in {}",
        cache.display()
    );
    let second = CiderReward::for_training(&corpus, &vocab);
    for set in expected["sets"].as_array().unwrap() {
        let name = set["name"].as_str().unwrap();
        let candidates = set["candidates"].as_array().unwrap();
        let want = set["cider_d"].as_array().unwrap();
        for (image, (c, w)) in candidates.iter().zip(want).enumerate() {
            let ids = encode(&vocab, &words(c.as_str().unwrap()));
            let w = w.as_f64().unwrap();
            for (which, reward) in [("counted", &first), ("cached", &second)] {
                let got = reward.reward(image, &ids);
                assert!(
                    (got - w).abs() <= 1e-9 * w.abs().max(1.0),
                    "{name}, image {image} ({which}): reward {got}, pycocoevalcap {w}"
                );
            }
        }
    }
    for entry in std::fs::read_dir(&cache).unwrap().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(&corpus.name)
        {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
}

#[test]
fn advantages_by_hand() {
    // Greedy baseline: each reward minus the greedy caption's.
    let a = self_critical(&[1.0, 0.5, 2.0], Baseline::Greedy, 1.0);
    assert!(close(&a.advantages, &[0.0, -0.5, 1.0]), "{a:?}");
    assert!(close(&a.baselines, &[1.0, 1.0, 1.0]));
    // Mean of the others: 1.0 against (0.5 + 2) / 2, and so on.
    let a = self_critical(&[1.0, 0.5, 2.0], Baseline::MeanOfOthers, 99.0);
    assert!(close(&a.baselines, &[1.25, 1.5, 0.75]), "{a:?}");
    assert!(close(&a.advantages, &[-0.25, -1.0, 1.25]));
    // Equal rewards leave nothing to learn; the advantages of the mean
    // baseline always sum to zero.
    let a = self_critical(&[0.7, 0.7], Baseline::MeanOfOthers, 0.0);
    assert!(close(&a.advantages, &[0.0, 0.0]));

    // SLE's distance: 0 to a copy, 1 to a caption sharing no 3-gram.
    let c = |s: &'static str| s.split(' ').collect::<Vec<&str>>();
    assert!(
        distance(
            &c("a red circle on the left"),
            &c("a red circle on the left")
        )
        .abs()
            < 1e-9
    );
    assert!((distance(&c("a red circle on the left"), &c("two blue squares")) - 1.0).abs() < 1e-6);
    // Equal captions are 0 apart however short (BLEU alone would not say so).
    assert_eq!(distance(&c("a circle"), &c("a circle")), 0.0);
    let d = distances(&[c("a b c d"), c("a b c d"), c("e f g h")]);
    assert_eq!(d[0][0], 0.0);
    assert!(
        d[0][1].abs() < 1e-9 && (d[0][2] - 1.0).abs() < 1e-6,
        "{d:?}"
    );

    // SLE with hand-set distances: s = 2, d = [[0, 0.6], [0.6, 0]]:
    // b2 = 1.2 / 4 = 0.3, each sample's diversity term (2/2)(0.6 - 0.3 +
    // 0 - 0.3) = 0; with three samples the far one gains.
    let a = sle(&[1.0, 0.0], 0.5, &[vec![0.0, 0.6], vec![0.6, 0.0]], 0.75);
    assert!(close(&a.advantages, &[0.375, -0.375]), "{a:?}");
    let d3 = vec![
        vec![0.0, 0.2, 0.9],
        vec![0.2, 0.0, 0.8],
        vec![0.9, 0.8, 0.0],
    ];
    let a: Advantages = sle(&[0.4, 0.4, 0.4], 0.4, &d3, 0.5);
    // b2 = 3.8 / 9; sample 3: 0.5 * (2/3) * (1.7 - 3 * 3.8 / 9).
    let b2 = 3.8 / 9.0;
    let want: Vec<f64> = d3
        .iter()
        .map(|row| 0.5 * 2.0 / 3.0 * row.iter().map(|d| d - b2).sum::<f64>())
        .collect();
    assert!(close(&a.advantages, &want), "{a:?} vs {want:?}");
    assert!(a.advantages[2] > 0.0 && a.advantages[0] < 0.0);
}

fn log_softmax(z: &[f32]) -> Vec<f64> {
    let max = z.iter().fold(f32::MIN, |m, &v| m.max(v)) as f64;
    let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    z.iter().map(|&v| v as f64 - lse).collect()
}

/// The surrogate in f64 from its definition: -(1/N) sum_j A_j sum_t log
/// p(y_jt) - w * (mean entropy over real tokens).
fn surrogate_by_hand(logits: &[f32], targets: &[u32], adv: &[f32], w: f32, v: usize) -> f64 {
    let per = targets.len() / adv.len();
    let (mut likelihood, mut entropy, mut real) = (0.0, 0.0, 0.0);
    for (r, &t) in targets.iter().enumerate() {
        if t == PAD {
            continue;
        }
        let lp = log_softmax(&logits[r * v..(r + 1) * v]);
        likelihood += adv[r / per] as f64 * lp[t as usize];
        entropy -= lp.iter().map(|l| l.exp() * l).sum::<f64>();
        real += 1.0;
    }
    -likelihood / adv.len() as f64 - w as f64 * entropy / real
}

#[test]
fn the_surrogate_and_its_gradient_by_hand() {
    let b = CpuBackend::new();
    let v = 5;
    // Two samples of three positions; the second ended after two tokens.
    let logits: Vec<f32> = random(6 * v, 4).iter().map(|x| 2.0 * x).collect();
    let targets = vec![3, 1, EOS, 4, EOS, PAD];
    for (adv, w) in [
        ([0.5f32, -1.0], 0.0f32),
        ([0.5, -1.0], 0.1),
        ([-2.0, 0.0], 0.3),
    ] {
        let mut s = Surrogate::new(&b, 2, 3, v, PAD);
        s.forward_backward(&b, &logits, &targets, &targets, &adv, w, true);
        let loss =
            b.to_vec(&s.likelihood.loss)[0] as f64 - w as f64 * b.to_vec(&s.mean_entropy)[0] as f64;
        let want = surrogate_by_hand(&logits, &targets, &adv, w, v);
        assert!(
            (loss - want).abs() < 1e-5,
            "A {adv:?}, w {w}: {loss} vs {want}"
        );
        // The gradient against central differences of the hand loss.
        let grad = b.to_vec(&s.d_logits);
        let eps = 1e-2;
        for i in 0..logits.len() {
            let mut z = logits.clone();
            z[i] += eps;
            let up = surrogate_by_hand(&z, &targets, &adv, w, v);
            z[i] -= 2.0 * eps;
            let down = surrogate_by_hand(&z, &targets, &adv, w, v);
            let numeric = ((up - down) / (2.0 * eps as f64)) as f32;
            assert!(
                (numeric - grad[i]).abs() <= 1e-3 + 1e-2 * numeric.abs(),
                "A {adv:?}, w {w}: d/dz[{i}] {} vs {numeric}",
                grad[i]
            );
        }
        // Padding rows get no gradient; a positive advantage pushes its
        // sampled token up (its logit's gradient is negative).
        assert!(grad[5 * v..].iter().all(|&g| g == 0.0));
        if adv[0] > 0.0 && w == 0.0 {
            assert!(grad[3] < 0.0, "{}", grad[3]);
        }
    }
}

/// The tiny shapes world's training images as a corpus, and a batch of
/// the first `n` with their first captions.
fn corpus_and_batch(
    data: &CaptionData,
    vocab: &CaptionVocab,
    n: usize,
) -> (TrainingCorpus, TrainingBatch) {
    let train = data.items(Split::Train);
    let references = train
        .iter()
        .map(|&i| {
            let captions = &data.data.items[i].captions;
            captions.iter().map(|c| c.tokens.clone()).collect()
        })
        .collect();
    let corpus = TrainingCorpus::new("tiny-world-test", references);
    let images: Vec<usize> = (0..n).collect();
    let batch = TrainingBatch {
        inputs: data.features_of(&train[..n]),
        embeddings: None,
        sequences: train[..n]
            .iter()
            .map(|&i| {
                vocab
                    .encode(&data.data.items[i].captions[0].tokens, 24)
                    .unwrap()
            })
            .collect(),
        images,
        labelled: None,
    };
    (corpus, batch)
}

fn tiny_run() -> RunConfig {
    let mut config = RunConfig::preset("tiny").unwrap();
    config.train.batch = 8;
    config
}

/// Steps of `name` on one batch; returns the objective's last report.
#[allow(clippy::too_many_arguments)]
fn train_steps<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    corpus: &TrainingCorpus,
    batch: &TrainingBatch,
    name: &str,
    settings: &Settings,
    lr: f32,
    steps: usize,
) -> Vec<(&'static str, f32)> {
    let mut objective = objectives::build::<B>(name, settings, ck.model.config.vocab_size).unwrap();
    let mut opt = AdamW::new(
        b,
        AdamWConfig {
            lr,
            ..AdamWConfig::default()
        },
        &ck.model.params().optimizer_layout(),
    );
    let mut report = Vec::new();
    for step in 0..steps {
        let mut rng = ChaCha8Rng::seed_from_u64(step as u64);
        ck.model.params_mut().zero_grads(b);
        let mut cx = StepContext {
            b,
            model: &mut ck.model,
            vocab: &ck.vocab,
            batch,
            corpus,
            gradient_weight: 1.0,
            retriever: None,
            rng: &mut rng,
            monitor: step + 1 == steps,
        };
        objective.step(&mut cx).unwrap();
        if step + 1 == steps {
            let read: Vec<f32> = objective.logged().iter().map(|t| b.to_vec(t)[0]).collect();
            report = objective.report(&read);
        }
        let params = ck.model.params_mut();
        let mut values: Vec<&mut B::Tensor> = params.values.iter_mut().collect();
        let grads: Vec<&B::Tensor> = params.grads.iter().collect();
        opt.step(b, &mut values, &grads);
    }
    report
}

/// `steps` steps of MLE on `batch` at 3e-3: a model that already
/// captions, as the sequence-level objectives start from.
fn mle_steps<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    corpus: &TrainingCorpus,
    batch: &TrainingBatch,
    steps: usize,
) {
    train_steps(b, ck, corpus, batch, "mle", &Settings::new(), 3e-3, steps);
}

/// The mean CIDEr-D of 8 samples per image of `batch`.
fn mean_sample_reward<B: Backend>(
    b: &B,
    model: &Captioner<B>,
    reward: &CiderReward,
    batch: &TrainingBatch,
) -> f64 {
    let sampling = Decoding::Sample {
        n: 8,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 77,
    };
    let samples = generate(
        b,
        model,
        &batch.inputs,
        &sampling,
        &DecodeOptions::default(),
    )
    .unwrap();
    let pairs: Vec<(usize, &[u32])> = samples
        .iter()
        .map(|g| (batch.images[g.image], g.ids.as_slice()))
        .collect();
    let r = reward.rewards(&pairs);
    r.iter().sum::<f64>() / r.len() as f64
}

#[test]
fn scst_raises_the_mean_reward_on_a_tiny_world() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let mut ck = fresh_checkpoint(&b, &data, &tiny_run()).unwrap();
    let (corpus, batch) = corpus_and_batch(&data, &ck.vocab, 8);
    // MLE first, as SCST is used: from a model that already captions.
    mle_steps(&b, &mut ck, &corpus, &batch, 60);
    let reward = CiderReward::for_training(&corpus, &ck.vocab);
    let before = mean_sample_reward(&b, &ck.model, &reward, &batch);
    let settings = Settings::from([("baseline".to_string(), SettingValue::Choice("mean".into()))]);
    let report = train_steps(&b, &mut ck, &corpus, &batch, "scst", &settings, 1e-3, 40);
    let after = mean_sample_reward(&b, &ck.model, &reward, &batch);
    assert!(
        after > before + 0.1,
        "40 SCST steps moved the mean sample reward from {before:.3} to {after:.3}"
    );
    let names: Vec<&str> = report.iter().map(|(n, _)| *n).collect();
    for name in [
        "loss",
        "reward",
        "baseline",
        "advantage_spread",
        "entropy",
        "div1",
        "div2",
        "mbleu4",
        "sample_length",
    ] {
        assert!(names.contains(&name), "{name} is not logged: {names:?}");
    }
    assert!(report.iter().all(|(_, v)| v.is_finite()), "{report:?}");
}

#[test]
fn one_step_of_each_objective_agrees_gpu_vs_cpu() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new();
    let data = tiny_data();
    let config = tiny_run();
    for (name, settings) in [
        ("scst", Settings::new()),
        (
            "scst",
            Settings::from([("baseline".to_string(), SettingValue::Choice("mean".into()))]),
        ),
        (
            "sll-me",
            Settings::from([("mle_weight".to_string(), SettingValue::Number(0.3))]),
        ),
        ("sle", Settings::new()),
    ] {
        let mut on_cpu = fresh_checkpoint(&c, &data, &config).unwrap();
        let (corpus, batch) = corpus_and_batch(&data, &on_cpu.vocab, 4);
        // A little MLE first, so that samples and rewards differ.
        mle_steps(&c, &mut on_cpu, &corpus, &batch, 20);
        let mut on_gpu = Checkpoint {
            model: on_cpu.model_on(&c, &g).unwrap(),
            vocab: on_cpu.vocab.clone(),
        };
        let cpu_report = train_steps(&c, &mut on_cpu, &corpus, &batch, name, &settings, 1e-3, 1);
        let gpu_report = train_steps(&g, &mut on_gpu, &corpus, &batch, name, &settings, 1e-3, 1);
        for ((n, x), (_, y)) in cpu_report.iter().zip(&gpu_report) {
            assert!(
                (x - y).abs() <= 1e-3 + 1e-3 * x.abs(),
                "{name} {n}: cpu {x}, gpu {y}"
            );
        }
        for (i, (x, y)) in on_cpu
            .model
            .params()
            .grads
            .iter()
            .zip(&on_gpu.model.params().grads)
            .enumerate()
        {
            assert_close(
                &format!("{name}: gradient {i}"),
                &g.to_vec(y),
                &c.to_vec(x),
                2e-3,
                2e-4,
            );
        }
    }
}

/// A batch of the tiny world's training images `images` (corpus indices,
/// not batch positions), with their first captions.
fn batch_of(data: &CaptionData, vocab: &CaptionVocab, images: &[usize]) -> TrainingBatch {
    let train = data.items(Split::Train);
    let items: Vec<usize> = images.iter().map(|&i| train[i]).collect();
    TrainingBatch {
        inputs: data.features_of(&items),
        embeddings: None,
        sequences: items
            .iter()
            .map(|&i| {
                vocab
                    .encode(&data.data.items[i].captions[0].tokens, 24)
                    .unwrap()
            })
            .collect(),
        images: images.to_vec(),
        labelled: None,
    }
}

/// -log p of each caption's ids (after `<bos>`) under the model's policy,
/// teacher-forced on image `features`, summed per caption; and the mean
/// entropy (nats) of the next-token distribution over all their steps.
fn nll_and_entropy(
    b: &CpuBackend,
    model: &mut Captioner<CpuBackend>,
    features: &[f32],
    captions: &[&[u32]],
) -> (Vec<f64>, f64) {
    let (mut nll, mut entropy, mut steps) = (Vec::new(), 0.0, 0usize);
    for &ids in captions {
        let sequence: Vec<u32> = std::iter::once(captune::data::vocab::BOS)
            .chain(ids.iter().copied())
            .collect();
        let inputs = TokenInputs::new(b, &model.config, &[sequence]).unwrap();
        model.forward(b, features, &inputs).unwrap();
        let logits = b.to_vec(model.logits());
        let v = model.config.vocab_size;
        let mut sum = 0.0;
        for (t, &id) in ids.iter().enumerate() {
            let lp = log_softmax(&logits[t * v..(t + 1) * v]);
            sum -= lp[id as usize];
            entropy -= lp.iter().map(|&l| l.exp() * l).sum::<f64>();
            steps += 1;
        }
        nll.push(sum);
    }
    (nll, entropy / steps as f64)
}

/// One step of SCST (greedy and mean baselines, with and without a BLEU-4
/// weight), SLE and SLL-ME on a batch whose images are not its positions,
/// reproduced by hand: the same samples (drawn with the step's seed) and
/// greedy captions, their CIDEr-D (plus W x BLEU-4) against their own
/// image's references, the baselines and advantages, and the logged
/// reward, baseline, advantage spread, entropy and loss
/// -(1/N) sum_j A_j sum_t log p(y_jt) - w x entropy.
#[test]
fn a_sequence_level_step_by_hand() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let mut ck = fresh_checkpoint(&b, &data, &tiny_run()).unwrap();
    let (corpus, warm) = corpus_and_batch(&data, &ck.vocab, 8);
    mle_steps(&b, &mut ck, &corpus, &warm, 40);
    let images = [5, 2, 9, 0];
    let batch = batch_of(&data, &ck.vocab, &images);
    let reward = CiderReward::for_training(&corpus, &ck.vocab);
    let choice = |c: &str| SettingValue::Choice(c.into());
    let cases: Vec<(&str, Vec<(&str, SettingValue)>)> = vec![
        ("scst", vec![("baseline", choice("greedy"))]),
        ("scst", vec![("baseline", choice("mean"))]),
        ("scst", vec![("bleu4_weight", SettingValue::Number(1.0))]),
        ("sle", vec![]),
        (
            "sll-me",
            vec![("entropy_weight", SettingValue::Number(0.05))],
        ),
    ];
    for (name, settings) in cases {
        let settings: Settings = settings
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let what = format!("{name} {settings:?}");
        let number = |key: &str, default: f64| match settings.get(key) {
            Some(SettingValue::Number(x)) => *x,
            _ => default,
        };
        let mean_baseline = settings.get("baseline") == Some(&choice("mean"));
        let (bleu_weight, entropy_weight) =
            (number("bleu4_weight", 0.0), number("entropy_weight", 0.0));
        // The step's samples: 5 per image, seeded by the step's first draw.
        let seed: u64 = rand::Rng::random(&mut ChaCha8Rng::seed_from_u64(0));
        let sampling = Decoding::Sample {
            n: 5,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed,
        };
        let options = DecodeOptions::default();
        let samples = generate(&b, &ck.model, &batch.inputs, &sampling, &options).unwrap();
        let greedy = generate(&b, &ck.model, &batch.inputs, &Decoding::Greedy, &options).unwrap();
        let score = |g: &captune::captioner::decode::Generated| {
            let image = images[g.image];
            let refs = &corpus.references[image];
            let text = ck.vocab.decode(&g.ids);
            let w: Vec<String> = text.split_whitespace().map(str::to_string).collect();
            let bleu = captune::metrics::bleu::sentence_bleu(&w, refs)[3];
            reward.reward(image, &g.ids) + bleu_weight * bleu
        };
        let rewards: Vec<f64> = samples.iter().map(score).collect();
        let greedy_rewards: Vec<f64> = greedy.iter().map(score).collect();
        let mut baselines = Vec::new();
        let mut advantages = Vec::new();
        for (i, own) in rewards.chunks(5).enumerate() {
            for (j, r) in own.iter().enumerate() {
                let b = if mean_baseline {
                    (own.iter().sum::<f64>() - r) / 4.0
                } else {
                    greedy_rewards[i]
                };
                baselines.push(b);
                advantages.push(r - b);
                if name == "sle" {
                    // alpha (r - b1) + (1 - alpha) (2/s) sum_k (d_jk - b2).
                    let texts: Vec<String> = samples[i * 5..(i + 1) * 5]
                        .iter()
                        .map(|g| ck.vocab.decode(&g.ids))
                        .collect();
                    let w: Vec<Vec<&str>> = texts
                        .iter()
                        .map(|t| t.split_whitespace().collect())
                        .collect();
                    let d = |x: usize, y: usize| if x == y { 0.0 } else { distance(&w[x], &w[y]) };
                    let b2 = (0..5)
                        .flat_map(|x| (0..5).map(move |y| (x, y)))
                        .map(|(x, y)| d(x, y))
                        .sum::<f64>()
                        / 25.0;
                    let spread: f64 = (0..5).map(|k| d(j, k) - b2).sum();
                    *advantages.last_mut().unwrap() = 0.75 * (r - b) + 0.25 * 2.0 / 5.0 * spread;
                }
            }
        }
        let dim = data.dim;
        let mut nll = Vec::new();
        let mut entropy_sum = 0.0;
        let mut tokens = 0usize;
        for g in &samples {
            let f = &batch.inputs[g.image * dim..(g.image + 1) * dim];
            let (n, h) = nll_and_entropy(&b, &mut ck.model, f, &[g.ids.as_slice()]);
            nll.push(n[0]);
            entropy_sum += h * g.ids.len() as f64;
            tokens += g.ids.len();
        }
        let n = samples.len() as f64;
        let surrogate: f64 = advantages.iter().zip(&nll).map(|(a, l)| a * l).sum::<f64>() / n;
        let entropy = entropy_sum / tokens as f64;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let a_mean = mean(&advantages);
        let spread = (advantages.iter().map(|a| (a - a_mean).powi(2)).sum::<f64>() / n).sqrt();

        let mut stepped = Checkpoint {
            model: ck.model_on(&b, &b).unwrap(),
            vocab: ck.vocab.clone(),
        };
        let report = train_steps(&b, &mut stepped, &corpus, &batch, name, &settings, 1e-3, 1);
        let got = |key: &str| report.iter().find(|(k, _)| *k == key).unwrap().1 as f64;
        for (key, want) in [
            ("reward", mean(&rewards)),
            ("baseline", mean(&baselines)),
            ("advantage_spread", spread),
            ("entropy", entropy),
            ("loss", surrogate - entropy_weight * entropy),
        ] {
            assert!(
                (got(key) - want).abs() <= 1e-4 + 1e-4 * want.abs(),
                "{what}: {key} {}, by hand {want}",
                got(key)
            );
        }
    }
}

/// The parameter gradients of one step of `name` from `ck`'s weights.
fn step_gradients(
    ck: &Checkpoint<CpuBackend>,
    corpus: &TrainingCorpus,
    batch: &TrainingBatch,
    name: &str,
    settings: &Settings,
) -> Vec<f32> {
    let b = CpuBackend::new();
    let mut stepped = Checkpoint {
        model: ck.model_on(&b, &b).unwrap(),
        vocab: ck.vocab.clone(),
    };
    train_steps(&b, &mut stepped, corpus, batch, name, settings, 1e-3, 1);
    stepped
        .model
        .params()
        .grads
        .iter()
        .flat_map(|g| b.to_vec(g))
        .collect()
}

/// SLL-ME's entropy bonus reaches the gradient: with the same samples,
/// its gradient minus SCST's is -w times the entropy's gradient, so twice
/// the weight gives twice the difference, and it is not zero.
#[test]
fn the_entropy_weight_scales_sll_me_s_gradient() {
    let b = CpuBackend::new();
    let data = tiny_data();
    let mut ck = fresh_checkpoint(&b, &data, &tiny_run()).unwrap();
    let (corpus, batch) = corpus_and_batch(&data, &ck.vocab, 4);
    mle_steps(&b, &mut ck, &corpus, &batch, 20);
    let weight = |w: f64| Settings::from([("entropy_weight".to_string(), SettingValue::Number(w))]);
    let scst = step_gradients(&ck, &corpus, &batch, "scst", &Settings::new());
    let once = step_gradients(&ck, &corpus, &batch, "sll-me", &weight(0.01));
    let twice = step_gradients(&ck, &corpus, &batch, "sll-me", &weight(0.02));
    let d1: Vec<f32> = once.iter().zip(&scst).map(|(a, b)| a - b).collect();
    let d2: Vec<f32> = twice
        .iter()
        .zip(&scst)
        .map(|(a, b)| (a - b) / 2.0)
        .collect();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(
        norm(&d1) > 1e-4,
        "the bonus changes no gradient ({})",
        norm(&d1)
    );
    // The differences cancel most of two nearly equal gradients: compared
    // as vectors, not element by element.
    let off: Vec<f32> = d2.iter().zip(&d1).map(|(a, b)| a - b).collect();
    let relative = norm(&off) / norm(&d1);
    assert!(
        relative < 1e-2,
        "twice the weight, {relative} off twice the difference"
    );
}

/// The CIDEr-D statistics are cached under a fingerprint of every
/// reference: a changed corpus of the same name and size is counted
/// afresh, not served the first one's document frequencies.
#[test]
fn a_changed_corpus_of_the_same_name_and_size_gets_fresh_statistics() {
    let corpus = |refs: &[&str]| {
        TrainingCorpus::new(
            "cider-cache-test",
            refs.iter().map(|r| vec![words(r)]).collect(),
        )
    };
    let first = corpus(&["a red circle", "a blue star", "two green squares"]);
    // Every image alike: every n-gram is in every document, so its idf
    // and every reward are 0.
    let changed = corpus(&["a red circle", "a red circle", "a red circle"]);
    let vocab = vocab_of(&first, &[]);
    let caption = encode(&vocab, &words("a red circle"));
    let cached = CiderReward::for_training(&first, &vocab).reward(0, &caption);
    assert!(cached > 1.0, "{cached}");
    let fresh = CiderReward::for_training(&changed, &vocab).reward(0, &caption);
    let counted = CiderReward::counted(&changed, &vocab).reward(0, &caption);
    assert_eq!(counted, 0.0);
    assert_eq!(
        fresh, counted,
        "the changed corpus was served stale statistics"
    );
}
