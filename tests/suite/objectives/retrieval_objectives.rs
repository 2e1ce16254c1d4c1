//! The retriever-in-the-loop objectives: DiscriTune's step against a hand
//! computation (captions, the frozen retriever's reward over the batch
//! and hard negatives, the running-mean baseline, the loss), the
//! retriever left untouched, and one step GPU vs CPU; CLIP relevance's
//! relaxed listener by finite differences from the logits to -cos, its
//! step against the captions it draws, and GPU vs CPU.

use crate::common;

use captune::backend::Backend;
use captune::captioner::CaptionVocab;
use captune::captioner::Checkpoint;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::inspect::score_caption;
use captune::captioner::listener::{
    Relaxation, RelaxedListener, VocabMap, embed_generated, negative_cosine,
};
use captune::captioner::objective::{StepContext, TrainingBatch, TrainingCorpus};
use captune::captioner::objectives;
use captune::captioner::objectives::discritune::judge;
use captune::captioner::objectives::settings::{SettingValue, Settings};
use captune::captioner::records::{Event, Flow};
use captune::captioner::run::RunConfig;
use captune::captioner::run_folder::{Begin, RunFolder};
use captune::captioner::train::{Trainer, fresh_checkpoint};
use captune::cpu::CpuBackend;
use captune::data::vocab::{BOS, EOS, Vocab};
use captune::gpu::GpuBackend;
use captune::model::retriever::Retriever;
use captune::model::retriever::RetrieverConfig;
use captune::model::transformer::TransformerConfig;
use captune::optim::{AdamW, AdamWConfig};
use captune::retriever::Checkpoint as RetrieverCheckpoint;
use captune::retriever::frozen::{CaptionReader, FrozenRetriever};
use captune::retriever::neighbours::Neighbours;
use captune::source::embeddings::CaptionData;
use common::{TINY_DIM, assert_close, gpu, new_run, tiny_data, tiny_retriever};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The tiny world with unit features (as a features file loads them).
fn unit_data() -> CaptionData {
    let mut data = tiny_data();
    for row in data.features.chunks_mut(data.dim) {
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        row.iter_mut().for_each(|x| *x /= norm);
    }
    data
}

/// The training split as a corpus (embeddings included) and a batch of
/// rows `rows` (corpus indices; a repeated image is one candidate).
fn corpus_and_batch(
    data: &CaptionData,
    ck_vocab: &CaptionVocab,
    rows: &[usize],
) -> (TrainingCorpus, TrainingBatch) {
    let (mut corpus, items) = TrainingCorpus::training_split(&data.data);
    corpus.image_embeddings = data.features_of(&items);
    let chosen: Vec<usize> = rows.iter().map(|&r| items[r]).collect();
    let batch = TrainingBatch {
        inputs: data.features_of(&chosen),
        embeddings: None,
        sequences: chosen
            .iter()
            .map(|&i| {
                ck_vocab
                    .encode(&data.data.items[i].captions[0].tokens, 24)
                    .unwrap()
            })
            .collect(),
        images: rows.to_vec(),
        labelled: None,
    };
    (corpus, batch)
}

fn tiny_run() -> RunConfig {
    let mut config = RunConfig::preset("tiny").unwrap();
    config.train.batch = 8;
    config
}

/// `steps` steps of `name`; returns the last step's report.
#[allow(clippy::too_many_arguments)]
fn train_steps<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    retriever: &mut FrozenRetriever<B>,
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
            retriever: Some(&mut *retriever),
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

/// 20 steps of MLE on `batch`, so that the captions differ between images.
fn warm_up<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    retriever: &mut FrozenRetriever<B>,
    corpus: &TrainingCorpus,
    batch: &TrainingBatch,
) {
    let mle = Settings::new();
    train_steps(b, ck, retriever, corpus, batch, "mle", &mle, 3e-3, 20);
}

fn value(report: &[(&str, f32)], name: &str) -> f32 {
    report
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("{name} is not logged: {report:?}"))
        .1
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// DiscriTune's first step by hand: captions (`decoding`) of the batch's
/// distinct images, the retriever's unit text embeddings, rewards over
/// the batch's images and each image's `hard` nearest training images,
/// the baseline (the step's own mean on a first step)
/// and the loss (1/N) sum_j (R_j - b) / T_j * sum_t -log p(y_jt).
fn discritune_by_hand<B: Backend>(
    b: &B,
    ck: &mut Checkpoint<B>,
    retriever: &mut FrozenRetriever<B>,
    corpus: &TrainingCorpus,
    rows: &[usize],
    hard: usize,
    decoding: &Decoding,
) -> (f64, f64, f64) {
    let dim = TINY_DIM;
    let mut images: Vec<usize> = Vec::new();
    for &r in rows {
        if !images.contains(&r) {
            images.push(r);
        }
    }
    let e = &corpus.image_embeddings;
    let row = |i: usize| &e[i * dim..(i + 1) * dim];
    let features: Vec<f32> = images.iter().flat_map(|&i| row(i).to_vec()).collect();
    let captions = generate(b, &ck.model, &features, decoding, &DecodeOptions::default()).unwrap();
    let ids: Vec<&[u32]> = captions.iter().map(|g| g.ids.as_slice()).collect();
    let reader = &retriever.captions;
    let text = embed_generated(b, &mut retriever.model, reader, &ck.vocab, &ids).unwrap();
    let m = &retriever.model;
    let scale = (b.to_vec(m.params.value(m.log_scale))[0] as f64).exp();
    let neighbours = Neighbours::compute(e, dim, e.len() / dim);
    let rewards: Vec<f64> = (0..images.len())
        .map(|j| {
            let t = &text[j * dim..(j + 1) * dim];
            let mut others: Vec<f64> = images
                .iter()
                .filter(|&&k| k != images[j])
                .map(|&k| dot(t, row(k)))
                .collect();
            // The `hard` nearest; one already in the batch is not added twice.
            let nearest = neighbours.of(images[j]).iter().take(hard);
            let added = nearest.map(|&k| k as usize).filter(|k| !images.contains(k));
            others.extend(added.map(|k| dot(t, row(k))));
            judge(scale, dot(t, row(images[j])), &others).reward
        })
        .collect();
    let n = rewards.len() as f64;
    let baseline = rewards.iter().sum::<f64>() / n;
    let mut loss = 0.0;
    for (g, r) in captions.iter().zip(&rewards) {
        let ids: Vec<u32> = std::iter::once(BOS).chain(g.ids.iter().copied()).collect();
        let f = &features[g.image * dim..(g.image + 1) * dim];
        let scores = score_caption(b, &mut ck.model, &ck.vocab, f, &ids).unwrap();
        let nll: f64 = scores.iter().map(|s| s.mle_loss as f64).sum();
        loss += (r - baseline) / g.ids.len() as f64 * nll;
    }
    (loss / n, rewards.iter().sum::<f64>() / n, baseline)
}

#[test]
fn a_discritune_step_by_hand_with_and_without_hard_negatives() {
    let b = CpuBackend::new();
    let data = unit_data();
    let mut ck = fresh_checkpoint(&b, &data, &tiny_run()).unwrap();
    let mut retriever = tiny_retriever(&b, &data, 4);
    // Rows 0 and 3 show one image twice: five rows, four candidates.
    let rows = [0, 3, 7, 3, 12];
    let (corpus, batch) = corpus_and_batch(&data, &ck.vocab, &rows);
    // A little MLE first, so that captions differ between images.
    warm_up(&b, &mut ck, &mut retriever, &corpus, &batch);
    let retriever_before: Vec<Vec<f32>> = retriever
        .model
        .params
        .values
        .iter()
        .map(|v| b.to_vec(v))
        .collect();
    // One sample per image: seeded by the step's first draw.
    let seed: u64 = rand::Rng::random(&mut ChaCha8Rng::seed_from_u64(0));
    let sampled = Decoding::Sample {
        n: 1,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed,
    };
    for (hard, decoding) in [(0, Decoding::Greedy), (3, Decoding::Greedy), (0, sampled)] {
        let mut settings = Settings::from([(
            "hard_negatives".to_string(),
            SettingValue::Number(hard as f64),
        )]);
        if decoding != Decoding::Greedy {
            let sample = SettingValue::Choice("sample".into());
            settings.insert("caption_decoding".to_string(), sample);
        }
        let (loss, reward, baseline) =
            discritune_by_hand(&b, &mut ck, &mut retriever, &corpus, &rows, hard, &decoding);
        let mut stepped = Checkpoint {
            model: ck.model_on(&b, &b).unwrap(),
            vocab: ck.vocab.clone(),
        };
        let report = train_steps(
            &b,
            &mut stepped,
            &mut retriever,
            &corpus,
            &batch,
            "discritune",
            &settings,
            1e-3,
            1,
        );
        let close = |name: &str, want: f64| {
            let got = value(&report, name) as f64;
            assert!(
                (got - want).abs() <= 1e-4 + 1e-4 * want.abs(),
                "hard negatives {hard}, {decoding:?}: {name} {got}, by hand {want}"
            );
        };
        close("loss", loss);
        close("reward", reward);
        close("baseline", baseline);
        assert!(reward < 0.0, "a log probability among candidates");
        let rank = value(&report, "rank");
        assert!((1.0..=4.0 + hard as f32).contains(&rank), "{rank}");
    }
    // The retriever is frozen.
    for (i, v) in retriever.model.params.values.iter().enumerate() {
        assert_eq!(
            b.to_vec(v),
            retriever_before[i],
            "retriever parameter {i} moved"
        );
    }
}

#[test]
fn discritune_refuses_a_run_without_a_matching_retriever() {
    let b = CpuBackend::new();
    let data = unit_data();
    let mut ck = fresh_checkpoint(&b, &data, &tiny_run()).unwrap();
    let (corpus, batch) = corpus_and_batch(&data, &ck.vocab, &[0, 1]);
    let mut objective =
        objectives::build::<CpuBackend>("discritune", &Settings::new(), ck.model.config.vocab_size)
            .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut cx = StepContext {
        b: &b,
        model: &mut ck.model,
        vocab: &ck.vocab,
        batch: &batch,
        corpus: &corpus,
        gradient_weight: 1.0,
        retriever: None,
        rng: &mut rng,
        monitor: false,
    };
    let e = objective.step(&mut cx).unwrap_err().to_string();
    assert!(e.contains("--retriever"), "{e}");
    // A retriever of another width than the features.
    let mut other = tiny_retriever(&b, &data, 2);
    let mut config = other.model.config;
    config.embed_dim = TINY_DIM * 2;
    other.model = Retriever::new(&b, config, 2, 0).unwrap();
    cx.retriever = Some(&mut other);
    let e = objective.step(&mut cx).unwrap_err().to_string();
    assert!(e.contains("captune embed --checkpoint"), "{e}");
}

#[test]
fn one_discritune_step_agrees_gpu_vs_cpu() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new();
    let data = unit_data();
    let mut on_cpu = fresh_checkpoint(&c, &data, &tiny_run()).unwrap();
    let mut retriever_cpu = tiny_retriever(&c, &data, 4);
    let rows = [0, 3, 7, 12];
    let (corpus, batch) = corpus_and_batch(&data, &on_cpu.vocab, &rows);
    warm_up(&c, &mut on_cpu, &mut retriever_cpu, &corpus, &batch);
    let mut on_gpu = Checkpoint {
        model: on_cpu.model_on(&c, &g).unwrap(),
        vocab: on_cpu.vocab.clone(),
    };
    let CaptionReader::Words(vocab) = &retriever_cpu.captions else {
        unreachable!("the tiny retriever reads words")
    };
    let ck = RetrieverCheckpoint {
        model: Retriever::new(&g, retriever_cpu.model.config, 4, 5).unwrap(),
        vocab: vocab.clone(),
    };
    let mut retriever_gpu = FrozenRetriever::from_checkpoint(&g, ck).unwrap();
    let settings = Settings::from([
        ("hard_negatives".to_string(), SettingValue::Number(2.0)),
        ("mle_weight".to_string(), SettingValue::Number(0.2)),
        ("discritune_entropy".to_string(), SettingValue::Number(0.05)),
    ]);
    let cpu_report = train_steps(
        &c,
        &mut on_cpu,
        &mut retriever_cpu,
        &corpus,
        &batch,
        "discritune",
        &settings,
        1e-3,
        1,
    );
    let gpu_report = train_steps(
        &g,
        &mut on_gpu,
        &mut retriever_gpu,
        &corpus,
        &batch,
        "discritune",
        &settings,
        1e-3,
        1,
    );
    for ((n, x), (_, y)) in cpu_report.iter().zip(&gpu_report) {
        assert!(
            (x - y).abs() <= 1e-3 + 1e-3 * x.abs(),
            "discritune {n}: cpu {x}, gpu {y}"
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
            &format!("discritune: gradient {i}"),
            &g.to_vec(y),
            &c.to_vec(x),
            2e-3,
            2e-4,
        );
    }
}

/// A relaxed listener over a made-up pair of vocabularies (the captioner
/// knows "zebra", the retriever does not), a fresh retriever of 6
/// positions, and three captions: one that fits, one cut at the tower's
/// length, one empty.
fn relaxed_setup<B: Backend>(b: &B) -> (Listening<B>, Vec<Vec<u32>>, usize, usize) {
    let words = |list: &[&str]| list.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let captioner =
        CaptionVocab::from_words(words(&["a", "red", "blue", "circle", "square", "zebra"]));
    let vocab = Vocab::from_words(words(&["circle", "a", "red", "blue", "square"]));
    let tower = |causal| TransformerConfig::new(16, 1, 2, causal);
    let config = RetrieverConfig {
        image_size: 8,
        patch: 4,
        image: tower(false),
        text: tower(true),
        max_len: 6,
        vocab_size: vocab.len(),
        embed_dim: 8,
        image_pool: captune::model::retriever::ImagePool::Mean,
        biases: true,
    };
    let ck = RetrieverCheckpoint {
        model: Retriever::new(b, config, 2, 11).unwrap(),
        vocab,
    };
    let retriever = FrozenRetriever::from_checkpoint(b, ck).unwrap();
    let id = |w: &str| captioner.word_list().unwrap().id(w);
    let captions = vec![
        vec![id("a"), id("red"), id("circle"), EOS],
        vec![
            id("blue"),
            id("square"),
            id("zebra"),
            id("a"),
            id("red"),
            id("circle"),
            EOS,
        ],
        vec![EOS],
    ];
    let map = VocabMap::new(&captioner, &retriever.captions).unwrap();
    let listener = RelaxedListener::new(b, &retriever.model, map);
    let listening = Listening {
        listener,
        retriever: retriever.model,
    };
    (listening, captions, 7, captioner.len())
}

/// A relaxed listener with the frozen retriever it reads: more captions
/// (3) than the retriever's batch (2).
struct Listening<B: Backend> {
    listener: RelaxedListener<B>,
    retriever: Retriever<B>,
}

impl<B: Backend> Listening<B> {
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &mut self,
        b: &B,
        logits: &B::Tensor,
        captions: &[Vec<u32>],
        positions: usize,
        seed: u64,
        tau: f32,
        relaxation: Relaxation,
    ) -> anyhow::Result<Vec<f32>> {
        let r = &mut self.retriever;
        (self.listener).forward(b, r, logits, captions, positions, seed, tau, relaxation)
    }

    fn backward(&mut self, b: &B, d_embeddings: &[f32]) -> &B::Tensor {
        self.listener.backward(b, &mut self.retriever, d_embeddings)
    }
}

fn relaxed_loss<B: Backend>(
    b: &B,
    listener: &mut Listening<B>,
    captions: &[Vec<u32>],
    positions: usize,
    logits: &[f32],
    images: &[f32],
    relaxation: Relaxation,
) -> (f64, Vec<f32>) {
    let texts = listener
        .forward(
            b,
            &b.tensor(logits),
            captions,
            positions,
            5,
            0.7,
            relaxation,
        )
        .unwrap();
    let (loss, _, d_texts) = negative_cosine(images, &texts, 8);
    (loss, d_texts)
}

/// Finite differences through the whole relaxed path, decoder logits to
/// -cos: the Gumbel-softmax at temperature 0.7, the mixture of the
/// retriever's token embeddings, the frozen text tower and the cosine;
/// steps past a caption's end or cut from the tower get no gradient.
#[test]
fn finite_differences_from_the_logits_through_the_frozen_text_tower() {
    let b = CpuBackend::new();
    let (mut listener, captions, positions, vocab) = relaxed_setup(&b);
    let rows = captions.len() * positions;
    let logits: Vec<f32> = common::random(rows * vocab, 21)
        .iter()
        .map(|x| 2.0 * x)
        .collect();
    let mut images = common::random(captions.len() * 8, 22);
    for row in images.chunks_mut(8) {
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        row.iter_mut().for_each(|x| *x /= norm);
    }
    let soft = Relaxation::Soft;
    let (_, d_texts) = relaxed_loss(
        &b,
        &mut listener,
        &captions,
        positions,
        &logits,
        &images,
        soft,
    );
    let analytic = b.to_vec(listener.backward(&b, &d_texts));
    assert_eq!(analytic.len(), rows * vocab);
    // The gradients are small (at most about 3e-3 here): the tolerance is
    // scaled to them, so that a gradient 30% off fails.
    let largest = analytic.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    assert!(largest > 1e-3, "{largest}");
    let eps = 1e-2f32;
    // Random coordinates over every row and every vocabulary column.
    let probed = common::probes("relaxed listener logits", rows * vocab, 80);
    let columns: std::collections::BTreeSet<usize> = probed.iter().map(|i| i % vocab).collect();
    assert_eq!(columns.len(), vocab, "every column is probed");
    for i in probed {
        let mut at = |delta: f32| {
            let mut z = logits.clone();
            z[i] += delta;
            relaxed_loss(&b, &mut listener, &captions, positions, &z, &images, soft).0
        };
        let numeric = (at(eps) - at(-eps)) / (2.0 * eps as f64);
        let (row, t) = (i / vocab, i / vocab % positions);
        let caption = &captions[row / positions];
        // Caption 1's sixth token and later do not fit the tower's 6 positions.
        let reaches = t < caption.len() && !(row / positions == 1 && t >= 4);
        if !reaches {
            assert_eq!(analytic[i], 0.0, "row {row} (step {t}) reaches no input");
        }
        assert!(
            (analytic[i] as f64 - numeric).abs() <= 3e-2 * largest + 2e-2 * numeric.abs(),
            "logit {i} (row {row}, step {t}): analytic {}, numeric {numeric}",
            analytic[i]
        );
    }
    // Straight-through reads exactly the chosen tokens: the embeddings of
    // the retriever's own encoding of the captions' words.
    let st = listener
        .forward(
            &b,
            &b.tensor(&logits),
            &captions,
            positions,
            5,
            0.7,
            Relaxation::StraightThrough,
        )
        .unwrap();
    let (mut again, _, _, _) = relaxed_setup(&b);
    let moved: Vec<f32> = logits.iter().map(|z| z + 3.0).collect();
    let other = again
        .forward(
            &b,
            &b.tensor(&moved),
            &captions,
            positions,
            9,
            2.0,
            Relaxation::StraightThrough,
        )
        .unwrap();
    assert_eq!(
        st, other,
        "the forward of straight-through ignores the logits"
    );
}

#[test]
fn the_relaxed_listener_agrees_gpu_vs_cpu() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new();
    let run = |relaxation| {
        let (mut on_cpu, captions, positions, vocab) = relaxed_setup(&c);
        let (mut on_gpu, _, _, _) = relaxed_setup(&g);
        let rows = captions.len() * positions;
        let logits = common::random(rows * vocab, 31);
        let t_cpu = on_cpu
            .forward(
                &c,
                &c.tensor(&logits),
                &captions,
                positions,
                5,
                0.5,
                relaxation,
            )
            .unwrap();
        let t_gpu = on_gpu
            .forward(
                &g,
                &g.tensor(&logits),
                &captions,
                positions,
                5,
                0.5,
                relaxation,
            )
            .unwrap();
        assert_close("relaxed embeddings", &t_gpu, &t_cpu, 1e-4, 1e-5);
        let d = common::random(t_cpu.len(), 32);
        let d_cpu = c.to_vec(on_cpu.backward(&c, &d));
        let d_gpu = g.to_vec(on_gpu.backward(&g, &d));
        assert_eq!(d_cpu.len(), rows * vocab);
        assert_close("d logits", &d_gpu, &d_cpu, 1e-3, 1e-5);
    };
    run(Relaxation::Soft);
    run(Relaxation::StraightThrough);
}

/// A CLIP-relevance step: its logged cosine is the mean cosine of each
/// image with the retriever's embedding of the caption the Gumbel-max
/// trick chose for it (straight-through reads exactly those captions),
/// and the gradient reaches the decoder, not the retriever.
#[test]
fn a_clip_relevance_step_scores_its_own_captions() {
    let b = CpuBackend::new();
    let data = unit_data();
    let mut ck = fresh_checkpoint(&b, &data, &tiny_run()).unwrap();
    let mut retriever = tiny_retriever(&b, &data, 4);
    let rows = [0, 3, 7, 3, 12];
    let (corpus, batch) = corpus_and_batch(&data, &ck.vocab, &rows);
    warm_up(&b, &mut ck, &mut retriever, &corpus, &batch);
    let retriever_before: Vec<Vec<f32>> = retriever
        .model
        .params
        .values
        .iter()
        .map(|v| b.to_vec(v))
        .collect();
    // The captions the step will draw: its generator's first number seeds them.
    let seed: u64 = rand::Rng::random(&mut ChaCha8Rng::seed_from_u64(0));
    let features = batch.distinct_images().inputs;
    let decoding = Decoding::Gumbel { n: 1, seed };
    let captions = generate(
        &b,
        &ck.model,
        &features,
        &decoding,
        &DecodeOptions::default(),
    )
    .unwrap();
    let ids: Vec<&[u32]> = captions.iter().map(|g| g.ids.as_slice()).collect();
    let reader = &retriever.captions;
    let text = embed_generated(&b, &mut retriever.model, reader, &ck.vocab, &ids).unwrap();
    let by_hand: f64 = (0..captions.len())
        .map(|j| {
            dot(
                &text[j * TINY_DIM..][..TINY_DIM],
                &features[j * TINY_DIM..][..TINY_DIM],
            )
        })
        .sum::<f64>()
        / captions.len() as f64;
    let report = train_steps(
        &b,
        &mut ck,
        &mut retriever,
        &corpus,
        &batch,
        "clip-relevance",
        &Settings::new(),
        1e-3,
        1,
    );
    let cosine = value(&report, "cosine") as f64;
    assert!(
        (cosine - by_hand).abs() < 1e-4,
        "logged {cosine}, by hand {by_hand}"
    );
    // The loss is -cos, by hand.
    assert!(
        (value(&report, "loss") as f64 + by_hand).abs() < 1e-4,
        "{report:?}"
    );
    // Its captions' mean length and repetition, as the log shows them.
    let words: Vec<Vec<String>> = captions.iter().map(|g| g.words(&ck.vocab)).collect();
    let mean_length = words.iter().map(Vec::len).sum::<usize>() as f64 / words.len() as f64;
    assert!(
        (value(&report, "sample_length") as f64 - mean_length).abs() < 1e-5,
        "{report:?}: {words:?}"
    );
    assert_eq!(
        value(&report, "repetition"),
        captune::captioner::collapse::repetition(&words) as f32
    );
    let moved = ck
        .model
        .params()
        .grads
        .iter()
        .any(|g| b.to_vec(g).iter().any(|&x| x != 0.0));
    assert!(moved, "the decoder gets a gradient");
    for (i, v) in retriever.model.params.values.iter().enumerate() {
        assert_eq!(
            b.to_vec(v),
            retriever_before[i],
            "retriever parameter {i} moved"
        );
    }
}

/// An objective is mixed with MLE only at a positive `mle_weight`: at 0
/// its log has no `mle` value (a mix weighted 0 would add one, and an MLE
/// pass to every step).
#[test]
fn an_objective_mixes_mle_only_at_a_positive_weight() {
    let c = CpuBackend::new();
    let data = unit_data();
    let mut logs_mle = Vec::new();
    for weight in [0.0, 0.2] {
        let mut ck = fresh_checkpoint(&c, &data, &tiny_run()).unwrap();
        let mut retriever = tiny_retriever(&c, &data, 4);
        let (corpus, batch) = corpus_and_batch(&data, &ck.vocab, &[0, 3, 7, 12]);
        let settings = Settings::from([("mle_weight".to_string(), SettingValue::Number(weight))]);
        let report = train_steps(
            &c,
            &mut ck,
            &mut retriever,
            &corpus,
            &batch,
            "clip-relevance",
            &settings,
            1e-3,
            1,
        );
        logs_mle.push(report.iter().any(|(name, _)| *name == "mle"));
    }
    assert_eq!(logs_mle, [false, true]);
}

#[test]
fn one_clip_relevance_step_agrees_gpu_vs_cpu() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new();
    let data = unit_data();
    for settings in [
        Settings::from([("mle_weight".to_string(), SettingValue::Number(0.2))]),
        Settings::from([
            ("gumbel".to_string(), SettingValue::Choice("soft".into())),
            ("tau".to_string(), SettingValue::Number(0.5)),
        ]),
    ] {
        let mut on_cpu = fresh_checkpoint(&c, &data, &tiny_run()).unwrap();
        let mut retriever_cpu = tiny_retriever(&c, &data, 4);
        let (corpus, batch) = corpus_and_batch(&data, &on_cpu.vocab, &[0, 3, 7, 12]);
        warm_up(&c, &mut on_cpu, &mut retriever_cpu, &corpus, &batch);
        let mut on_gpu = Checkpoint {
            model: on_cpu.model_on(&c, &g).unwrap(),
            vocab: on_cpu.vocab.clone(),
        };
        let mut retriever_gpu = tiny_retriever(&g, &data, 4);
        let name = "clip-relevance";
        let cpu_report = train_steps(
            &c,
            &mut on_cpu,
            &mut retriever_cpu,
            &corpus,
            &batch,
            name,
            &settings,
            1e-3,
            1,
        );
        let gpu_report = train_steps(
            &g,
            &mut on_gpu,
            &mut retriever_gpu,
            &corpus,
            &batch,
            name,
            &settings,
            1e-3,
            1,
        );
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

/// The relaxed listener reads the run's retriever in place: after the
/// first steps of a shape, a CLIP-relevance step (decoding, the tower
/// both ways, the update) creates no device buffer, with more images than
/// the retriever's own batch.
#[test]
fn clip_relevance_steps_of_one_shape_create_no_buffer() {
    let Some(g) = gpu() else { return };
    let data = unit_data();
    let mut ck = fresh_checkpoint(&g, &data, &tiny_run()).unwrap();
    let mut retriever = tiny_retriever(&g, &data, 2);
    let (corpus, batch) = corpus_and_batch(&data, &ck.vocab, &[0, 3, 7, 12]);
    let soft = Settings::from([("gumbel".to_string(), SettingValue::Choice("soft".into()))]);
    let mut objective =
        objectives::build::<GpuBackend>("clip-relevance", &soft, ck.vocab.len()).unwrap();
    let mut step = |rng_seed: u64| {
        let mut rng = ChaCha8Rng::seed_from_u64(rng_seed);
        ck.model.params_mut().zero_grads(&g);
        let mut cx = StepContext {
            b: &g,
            model: &mut ck.model,
            vocab: &ck.vocab,
            batch: &batch,
            corpus: &corpus,
            gradient_weight: 1.0,
            retriever: Some(&mut retriever),
            rng: &mut rng,
            monitor: false,
        };
        objective.step(&mut cx).unwrap();
        g.flush();
    };
    // Captions of other lengths are other shapes: the same seed twice
    // gives the same captions.
    step(1);
    step(1);
    let before = g.counters();
    step(1);
    let after = g.counters().since(&before);
    assert_eq!(after.buffers_created, 0, "{after:?}");
    assert!(after.dispatches > 0);
}

/// The labelled-fraction setting end to end: CLIP relevance with an MLE
/// mix on a quarter of the images' captions trains through the trainer,
/// one epoch over the 72 unlabelled images, logging its cosine and the
/// mix's loss on the labelled batches.
#[test]
fn clip_relevance_trains_on_the_unlabelled_images_with_an_mle_mix() {
    let b = CpuBackend::new();
    let data = unit_data();
    let mut config = tiny_run();
    config.train.objective = "clip-relevance".into();
    config.train.labelled = 0.25;
    config.train.epochs = 1;
    config.train.log_every = 1;
    config.train.eval_images = 0;
    config.train.sample_images = 0;
    config
        .train
        .settings
        .insert("mle_weight".into(), SettingValue::Number(0.5));
    let mut ck = fresh_checkpoint(&b, &data, &config).unwrap();
    let mut retriever = tiny_retriever(&b, &data, 8);
    let (mut trainer, dir) = new_run(
        &b,
        &mut ck,
        &data,
        &config,
        "labelled-clip",
        Some(&mut retriever),
    );
    let mut lines = Vec::new();
    while !trainer.finished() {
        trainer
            .train_batch(&b, |e| {
                if let Event::Log(l) = e {
                    lines.push(l.values.clone());
                }
                Flow::Continue
            })
            .unwrap();
    }
    drop(trainer);
    assert_eq!(lines.len(), 9);
    for v in &lines {
        let (loss, cosine, mle) = (v["loss"], v["cosine"], v["mle"]);
        assert!(mle.is_finite() && mle > 0.0, "{v:?}");
        assert!((-1.0..=1.0).contains(&cosine), "{v:?}");
        // loss = (1 - w) (-cos) + w mle, w = 0.5
        assert!((loss - 0.5 * (mle - cosine)).abs() < 1e-4, "{v:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An MLE mix is exactly lambda x MLE + (1 - lambda) x the objective's own
/// loss: with the same draws, the mixed step's gradient is that mix of the
/// two steps' gradients, for every objective that takes `mle_weight`.
#[test]
fn every_mle_mix_is_the_weighted_sum_of_its_parts() {
    let b = CpuBackend::new();
    let data = unit_data();
    let mut ck = fresh_checkpoint(&b, &data, &tiny_run()).unwrap();
    let mut retriever = tiny_retriever(&b, &data, 4);
    let rows = [0, 3, 7, 3, 12];
    let (corpus, batch) = corpus_and_batch(&data, &ck.vocab, &rows);
    warm_up(&b, &mut ck, &mut retriever, &corpus, &batch);
    let mut gradients = |name: &str, weight: Option<f64>| -> Vec<f32> {
        let mut stepped = Checkpoint {
            model: ck.model_on(&b, &b).unwrap(),
            vocab: ck.vocab.clone(),
        };
        let settings: Settings = weight
            .map(|w| ("mle_weight".to_string(), SettingValue::Number(w)))
            .into_iter()
            .collect();
        train_steps(
            &b,
            &mut stepped,
            &mut retriever,
            &corpus,
            &batch,
            name,
            &settings,
            1e-3,
            1,
        );
        let grads = &stepped.model.params().grads;
        grads.iter().flat_map(|g| b.to_vec(g)).collect()
    };
    let mle = gradients("mle", None);
    let mixed_objectives: Vec<&str> = objectives::OBJECTIVES
        .iter()
        .filter(|o| o.settings.iter().any(|s| s.key == "mle_weight"))
        .map(|o| o.name)
        .collect();
    assert!(mixed_objectives.len() >= 8, "{mixed_objectives:?}");
    for name in mixed_objectives {
        let own = gradients(name, Some(0.0));
        let mixed = gradients(name, Some(0.3));
        let want: Vec<f32> = own
            .iter()
            .zip(&mle)
            .map(|(o, m)| 0.7 * o + 0.3 * m)
            .collect();
        assert_close(&format!("{name} at lambda 0.3"), &mixed, &want, 2e-3, 1e-6);
        let apart = own
            .iter()
            .zip(&mle)
            .map(|(o, m)| (o - m).abs())
            .fold(0.0, f32::max);
        assert!(apart > 1e-4, "{name}: its own gradient equals MLE's");
    }
}

/// What an objective declares it needs is checked before a run starts:
/// DiscriTune and CLIP relevance without a retriever are refused by
/// `Trainer::new`, naming the flag, and the run folder is not created.
#[test]
fn a_run_missing_what_its_objective_needs_is_refused_before_it_starts() {
    let b = CpuBackend::new();
    let data = unit_data();
    for name in ["discritune", "clip-relevance"] {
        let mut config = tiny_run();
        config.train.objective = name.into();
        let mut ck = fresh_checkpoint(&b, &data, &config).unwrap();
        let dir = crate::common::fresh_temp(&format!("needs-{name}"));
        let run = RunFolder::new(&dir);
        let refused = Trainer::new(&b, &mut ck, &data, &config, run, Begin::New, None);
        let e = format!("{:#}", refused.err().expect("refused"));
        assert!(e.contains(name) && e.contains("--retriever"), "{e}");
        assert!(!dir.exists(), "{name}: the run folder was created");
    }
}
