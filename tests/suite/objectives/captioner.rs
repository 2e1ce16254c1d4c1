//! The captioner's objectives and network: SMILE against Yue et al.'s (2023)
//! Algorithm 1 computed by hand, the subset plans of the ablations,
//! finite-difference gradients through the whole network, and one
//! training step per objective agreeing between GPU and CPU.

use crate::common;

use captune::backend::Backend;
use captune::captioner::inputs::TokenInputs;
use captune::captioner::model::Captioner;
use captune::captioner::objective::{Objective, StepContext, TrainingBatch, TrainingCorpus};
use captune::captioner::objectives::token::{
    self, BatchTargets, FirstToken, Losses, ObjectiveKind, RANDOM_SUBSET_SIZE, TokenLevel,
    TokenObjective,
};
use captune::captioner::records::read_log;
use captune::captioner::{
    CaptionVocab, CaptionerConfig, DecoderFamily, ImageFeed, LstmConfig, LstmModel, LstmVariant,
    MapperTransformer, SpecialIds,
};
use captune::cpu::CpuBackend;
use captune::data::vocab::{BOS, EOS, PAD};
use captune::gpu::GpuBackend;
use captune::index::FULL_VOCAB;
use captune::model::layers::Activation;
use captune::model::transformer::TransformerConfig;
use captune::optim::{AdamW, AdamWConfig};
use common::{assert_close, gpu, random};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Ten ids: four specials, five words, and the alternative of "a" (id 9).
fn small_vocab() -> CaptionVocab {
    let words = ["a", "red", "circle", "blue", "square", "##a"];
    CaptionVocab::from_words(words.iter().map(|w| w.to_string()).collect())
}

const STEPS: usize = 4;
/// "a red circle <eos>", "blue square <eos> <pad>"
const TARGETS: [u32; 8] = [4, 5, 6, EOS, 7, 8, EOS, PAD];

/// -log(exp(z[y]) / sum over allowed j of exp(z[j])) in f64, the allowed
/// set given as a mask: Algorithm 1's masked fill with -inf, then
/// cross-entropy.
fn masked_nll(z: &[f32], y: u32, allowed: impl Fn(usize) -> bool) -> f64 {
    let masked: Vec<f64> = z
        .iter()
        .enumerate()
        .map(|(j, &v)| {
            if allowed(j) {
                v as f64
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect();
    let max = masked.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + masked.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    lse - masked[y as usize]
}

/// The loss of Algorithm 1 over the two sequences, by hand.
fn smile_by_hand(z: &[f32], v: usize, targets: &[u32], first: FirstToken) -> f64 {
    let (mut sum, mut count) = (0.0, 0);
    for (s, seq) in targets.chunks(STEPS).enumerate() {
        let subset: Vec<u32> = seq.iter().copied().filter(|&id| id != PAD).collect();
        for (t, &y) in seq.iter().enumerate() {
            if y == PAD {
                continue;
            }
            let row = &z[(s * STEPS + t) * v..(s * STEPS + t + 1) * v];
            sum += if t == 0 && first == FirstToken::Mle {
                masked_nll(row, y, |_| true)
            } else {
                masked_nll(row, y, |j| subset.contains(&(j as u32)))
            };
            count += 1;
        }
    }
    sum / count as f64
}

fn mle_by_hand(z: &[f32], v: usize) -> f64 {
    let real: Vec<(usize, u32)> = TARGETS
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, y)| y != PAD)
        .collect();
    real.iter()
        .map(|&(r, y)| masked_nll(&z[r * v..(r + 1) * v], y, |_| true))
        .sum::<f64>()
        / real.len() as f64
}

/// The losses `Losses` reports and its d_logits, for one objective.
fn losses_of<B: Backend>(b: &B, objective: TokenObjective, z: &[f32]) -> (f32, f32, f32, Vec<f32>) {
    let (mut losses, t) = step_of(b, objective, z, true);
    let v = losses.read(b, &t);
    (v.loss, v.mle, v.smile, b.to_vec(&losses.d_logits))
}

/// One forward and backward of `objective` on logits `z`, its losses
/// computed for the log (`monitor`) or not, by a fresh `Losses`.
fn step_of<B: Backend>(
    b: &B,
    objective: TokenObjective,
    z: &[f32],
    monitor: bool,
) -> (Losses<B>, BatchTargets<B>) {
    let vocab = small_vocab();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let config = tiny_config(vocab.len());
    let t = BatchTargets::new(b, &objective, &vocab, &config, &TARGETS, STEPS, &mut rng).unwrap();
    let mut losses = Losses::new(b, objective, TARGETS.len(), vocab.len());
    losses.forward_backward(b, &b.tensor(z), &t, monitor);
    (losses, t)
}

/// A step whose losses are not logged skips the passes only the log needs,
/// and trains exactly as a logged one: the same gradient for every
/// token-level objective, mixed with MLE or not.
#[test]
fn an_unlogged_step_has_the_gradient_of_a_logged_one() {
    let b = CpuBackend::new();
    let v = small_vocab().len();
    let z: Vec<f32> = random(TARGETS.len() * v, 5)
        .iter()
        .map(|x| 3.0 * x)
        .collect();
    let smile = TokenObjective::smile();
    let objectives = [
        TokenObjective::mle(),
        smile,
        TokenObjective {
            mle_weight: 0.3,
            ..smile
        },
        TokenObjective {
            first_token: FirstToken::None,
            ..smile
        },
        TokenObjective {
            kind: ObjectiveKind::SmileReverse,
            mle_weight: 0.3,
            ..smile
        },
        TokenObjective {
            kind: ObjectiveKind::SmileRandom,
            ..smile
        },
    ];
    for objective in objectives {
        let logged = b.to_vec(&step_of(&b, objective, &z, true).0.d_logits);
        let unlogged = b.to_vec(&step_of(&b, objective, &z, false).0.d_logits);
        assert!(logged.iter().any(|&d| d != 0.0), "{objective:?}");
        assert_eq!(logged, unlogged, "{objective:?}");
    }
}

/// REINFORCE's surrogate trains the same with its figures unlogged: with
/// an entropy weight (SLL-ME), an unlogged step's gradient is a logged
/// one's, and differs from the gradient without the entropy term.
#[test]
fn an_unlogged_reinforce_step_keeps_its_entropy_term() {
    use captune::captioner::objectives::reinforce::Surrogate;
    let b = CpuBackend::new();
    let (sequences, positions, vocab) = (3, 4, 7);
    let logits = b.tensor(&random(sequences * positions * vocab, 11));
    // Each sequence's sampled ids, padded after its end.
    let host_targets: Vec<u32> = [[4, 5, 2, PAD], [6, 2, PAD, PAD], [3, 4, 5, 2]]
        .into_iter()
        .flatten()
        .collect();
    let targets = b.ids(&host_targets);
    let advantages = [0.5, -1.0, 0.25];
    let d_logits = |entropy_weight: f32, monitor: bool| {
        let mut s = Surrogate::new(&b, sequences, positions, vocab, PAD);
        s.forward_backward(
            &b,
            &logits,
            &targets,
            &host_targets,
            &advantages,
            entropy_weight,
            monitor,
        );
        b.to_vec(&s.d_logits)
    };
    let logged = d_logits(0.3, true);
    assert_eq!(d_logits(0.3, false), logged);
    assert_ne!(
        d_logits(0.0, false),
        logged,
        "the entropy term has a gradient"
    );
    assert_eq!(d_logits(0.0, false), d_logits(0.0, true));
}

#[test]
fn smile_matches_algorithm_1_computed_by_hand() {
    let b = CpuBackend::new();
    let v = small_vocab().len();
    let z: Vec<f32> = random(TARGETS.len() * v, 7)
        .iter()
        .map(|x| 3.0 * x)
        .collect();
    let smile = smile_by_hand(&z, v, &TARGETS, FirstToken::Mle);
    let mle = mle_by_hand(&z, v);
    assert!((smile - mle).abs() > 0.1, "the subset must change the loss");

    let (loss, got_mle, got_smile, _) = losses_of(&b, TokenObjective::smile(), &z);
    assert!(
        (got_smile as f64 - smile).abs() < 1e-5,
        "{got_smile} vs {smile}"
    );
    assert!((got_mle as f64 - mle).abs() < 1e-5, "{got_mle} vs {mle}");
    assert_eq!(loss, got_smile);

    // No initial restriction: step 0 is subset too.
    let none = TokenObjective {
        first_token: FirstToken::None,
        ..TokenObjective::smile()
    };
    let want = smile_by_hand(&z, v, &TARGETS, FirstToken::None);
    let (loss, _, reported_smile, _) = losses_of(&b, none, &z);
    assert!((loss as f64 - want).abs() < 1e-5, "{loss} vs {want}");
    assert_eq!(
        reported_smile, got_smile,
        "the logged SMILE loss is the standard one"
    );

    // Shifting: "a" becomes its alternative (id 9) at step 0 and joins the
    // subset; "blue" has no alternative and stays.
    let shift = TokenObjective {
        first_token: FirstToken::Shift,
        ..TokenObjective::smile()
    };
    let mut shifted = TARGETS;
    shifted[0] = 9;
    let want = smile_by_hand(&z, v, &shifted, FirstToken::None);
    let (loss, _, _, _) = losses_of(&b, shift, &z);
    assert!((loss as f64 - want).abs() < 1e-5, "{loss} vs {want}");

    // Mixing: lambda * MLE + (1 - lambda) * SMILE, gradient included.
    let mixed = TokenObjective {
        mle_weight: 0.3,
        ..TokenObjective::smile()
    };
    let (loss, _, _, d) = losses_of(&b, mixed, &z);
    let want = 0.3 * mle + 0.7 * smile;
    assert!((loss as f64 - want).abs() < 1e-5, "{loss} vs {want}");
    let eps = 1e-3f32;
    for i in (0..z.len()).step_by(3) {
        let mut up = z.clone();
        up[i] += eps;
        let mut down = z.clone();
        down[i] -= eps;
        let f = |z: &[f32]| {
            0.3 * mle_by_hand(z, v) + 0.7 * smile_by_hand(z, v, &TARGETS, FirstToken::Mle)
        };
        let numeric = ((f(&up) - f(&down)) / (2.0 * eps as f64)) as f32;
        assert!(
            (numeric - d[i]).abs() < 1e-3,
            "d loss / d z[{i}]: {} analytically, {numeric} numerically",
            d[i]
        );
    }
}

/// The mean over real rows of -log p(label) among a plan's subset plus
/// the label (the full vocabulary where the plan says so), by hand.
fn subset_nll_by_hand(z: &[f32], v: usize, plan: &token::SubsetPlan) -> f64 {
    let real: Vec<(usize, u32)> = (TARGETS.iter().copied().enumerate())
        .filter(|&(_, y)| y != PAD)
        .collect();
    let nll = |(r, y): (usize, u32)| {
        let set = plan.row_subset[r];
        let allowed = |j: usize| {
            set == FULL_VOCAB || j as u32 == y || plan.subsets[set as usize].contains(&(j as u32))
        };
        masked_nll(&z[r * v..(r + 1) * v], y, allowed)
    };
    real.iter().map(|&row| nll(row)).sum::<f64>() / real.len() as f64
}

/// The ablations train on their own subsets, not on the standard SMILE
/// loss they also log: reverse over the ids its caption does not use plus
/// the label, random over the ids drawn for each row plus the label (the
/// first step over the full vocabulary, as `first_token` mle says).
#[test]
fn the_ablations_train_on_their_own_subsets() {
    let b = CpuBackend::new();
    let vocab = small_vocab();
    let v = vocab.len();
    let z: Vec<f32> = random(TARGETS.len() * v, 11)
        .iter()
        .map(|x| 3.0 * x)
        .collect();
    for kind in [ObjectiveKind::SmileReverse, ObjectiveKind::SmileRandom] {
        let objective = TokenObjective {
            kind,
            ..TokenObjective::smile()
        };
        // The plan `losses_of` draws, from the same seed.
        let plan = token::plan(
            kind,
            FirstToken::Mle,
            &vocab,
            &tiny_config(v),
            &TARGETS,
            STEPS,
            &mut ChaCha8Rng::seed_from_u64(1),
        );
        let want = subset_nll_by_hand(&z, v, &plan);
        let (loss, _, smile, _) = losses_of(&b, objective, &z);
        assert!(
            (loss as f64 - want).abs() < 1e-5,
            "{kind:?}: {loss} vs {want}"
        );
        assert!(
            (loss - smile).abs() > 0.05,
            "{kind:?}: its own loss {loss}, the standard SMILE loss {smile}"
        );
    }
}

/// A token-level objective made from its settings names itself, describes
/// itself with those settings (what the run's log and the app show), and
/// gives them back as the config holds them.
#[test]
fn a_token_objective_describes_itself_by_its_settings() {
    use captune::captioner::objectives::settings::{SettingValue, Settings};
    let settings = Settings::from([
        (
            "first_token".to_string(),
            SettingValue::Choice("none".into()),
        ),
        ("mle_weight".to_string(), SettingValue::Number(0.3)),
    ]);
    let o = TokenObjective::from_settings("smile-reverse", &settings).unwrap();
    assert_eq!(o.name(), "smile-reverse");
    assert_eq!(
        o.describe(),
        "smile-reverse (first token: none, mle weight: 0.3)"
    );
    assert_eq!(o.settings(), settings);
    assert_eq!(TokenObjective::mle().describe(), "mle");
    // As the registry builds it for a run.
    let built = captune::captioner::objectives::build::<CpuBackend>("smile-reverse", &settings, 10)
        .unwrap();
    assert_eq!(built.describe(), o.describe());
}

/// Every objective the registry builds describes itself by its name and
/// its settings' values, as the run's log and the app show it.
#[test]
fn every_objective_describes_itself_by_its_settings() {
    use captune::captioner::objectives::{self, OBJECTIVES, settings::Settings};
    for info in OBJECTIVES {
        let settings = Settings::new();
        let built = objectives::build::<CpuBackend>(info.name, &settings, 10).unwrap();
        let described = built.describe();
        assert_eq!(described, objectives::describe(info.name, &settings));
        assert!(described.starts_with(info.name), "{described}");
        for setting in info.settings {
            let key = setting.key.replace('_', " ");
            assert!(described.contains(&format!("{key}: ")), "{described}");
        }
    }
}

#[test]
fn ablation_plans_random_and_reverse_subsets() {
    let vocab = small_vocab();
    let v = vocab.len() as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let random = token::plan(
        ObjectiveKind::SmileRandom,
        FirstToken::Mle,
        &vocab,
        &tiny_config(vocab.len()),
        &TARGETS,
        STEPS,
        &mut rng,
    );
    for (r, &y) in TARGETS.iter().enumerate() {
        let set = random.row_subset[r];
        if y == PAD || r % STEPS == 0 {
            assert_eq!(
                set, FULL_VOCAB,
                "row {r}: padding and step 0 use the full vocabulary"
            );
            continue;
        }
        let ids = &random.subsets[set as usize];
        // Drawn among the policy's ids: never <pad> or <bos>.
        let masked = SpecialIds::WORDS.masked();
        let want =
            RANDOM_SUBSET_SIZE.min(v as usize - 1 - SpecialIds::WORDS.masked_distinct().len());
        assert_eq!(ids.len(), want, "row {r}: distinct random ids");
        assert!(!ids.contains(&y), "row {r}: the label is added, not drawn");
        assert!(
            !ids.iter().any(|id| masked.contains(id)),
            "row {r}: {ids:?}"
        );
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
    }
    let distinct: std::collections::BTreeSet<_> = random
        .row_subset
        .iter()
        .filter(|&&s| s != FULL_VOCAB)
        .collect();
    assert_eq!(
        distinct.len(),
        5,
        "each real row after step 0 draws its own subset"
    );
    // With more words than that, each subset is the ablation's 10 ids.
    let words: Vec<String> = (0..30).map(|i| format!("w{i}")).collect();
    let large = CaptionVocab::from_words(words);
    let plan = token::plan(
        ObjectiveKind::SmileRandom,
        FirstToken::Mle,
        &large,
        &tiny_config(large.len()),
        &TARGETS,
        STEPS,
        &mut rng,
    );
    assert!(!plan.subsets.is_empty());
    assert!(
        plan.subsets.iter().all(|s| s.len() == 10),
        "{:?}",
        plan.subsets
    );

    let reverse = token::plan(
        ObjectiveKind::SmileReverse,
        FirstToken::None,
        &vocab,
        &tiny_config(vocab.len()),
        &TARGETS,
        STEPS,
        &mut rng,
    );
    assert_eq!(reverse.subsets.len(), 2, "one subset per sequence");
    assert_eq!(reverse.subsets[0], vec![0, 1, 3, 7, 8, 9]);
    assert_eq!(reverse.subsets[1], vec![0, 1, 3, 4, 5, 6, 9]);
    assert_eq!(reverse.row_subset, vec![0, 0, 0, 0, 1, 1, 1, 1]);
}

fn tiny_config(vocab: usize) -> CaptionerConfig {
    CaptionerConfig {
        family: DecoderFamily::Prefix,
        image_tokens: 0,
        embed_dim: 6,
        prefix_len: 2,
        mapper_hidden: 10,
        mapper_activation: Activation::Gelu,
        mapper_transformer: None,
        decoder: TransformerConfig::new(8, 2, 2, true),
        lstm: None,
        vision: None,
        prompt: Default::default(),
        max_len: STEPS + 1,
        vocab_size: vocab,
        specials: SpecialIds::WORDS,
        prefix_predicts_first: false,
        raw_embeddings: false,
    }
}

/// Two stacked LSTM layers reading the image `feed`'s way.
fn tiny_lstm_config(vocab: usize, feed: ImageFeed) -> CaptionerConfig {
    CaptionerConfig {
        family: DecoderFamily::Lstm,
        prefix_len: 0,
        mapper_hidden: 0,
        decoder: TransformerConfig::new(7, 2, 1, true),
        lstm: Some(LstmConfig::new(LstmModel::Fc, feed)),
        ..tiny_config(vocab)
    }
}

/// Top-down attention over 3 image tokens of 5.
fn tiny_updown_config(vocab: usize) -> CaptionerConfig {
    CaptionerConfig {
        embed_dim: 5,
        image_tokens: 3,
        decoder: TransformerConfig::new(6, 1, 1, true),
        lstm: Some(LstmConfig::new(LstmModel::UpDown, ImageFeed::Hidden)),
        ..tiny_lstm_config(vocab, ImageFeed::Hidden)
    }
}

/// The prefix transformer, the LSTM fed the image either way, both
/// attention LSTMs, and the three as self-critical.pytorch computes them.
fn every_family(vocab: usize) -> [CaptionerConfig; 8] {
    let updown = tiny_updown_config(vocab);
    let att2in = CaptionerConfig {
        lstm: Some(LstmConfig::new(LstmModel::Att2in, ImageFeed::Hidden)),
        ..updown
    };
    let self_critical = |c: CaptionerConfig| CaptionerConfig {
        lstm: c.lstm.map(|l| LstmConfig {
            variant: LstmVariant::SelfCritical,
            ..l
        }),
        ..c
    };
    [
        tiny_config(vocab),
        tiny_lstm_config(vocab, ImageFeed::Hidden),
        tiny_lstm_config(vocab, ImageFeed::Input),
        updown,
        att2in,
        self_critical(tiny_lstm_config(vocab, ImageFeed::Input)),
        self_critical(updown),
        self_critical(att2in),
    ]
}

/// `<bos>` then the targets shifted right: the decoder's inputs.
fn inputs_of(targets: &[u32]) -> Vec<Vec<u32>> {
    targets
        .chunks(STEPS)
        .map(|seq| {
            std::iter::once(captune::data::vocab::BOS)
                .chain(seq.iter().copied().take_while(|&id| id != PAD))
                .collect()
        })
        .collect()
}

/// One forward and backward; returns the losses, the logits and every
/// parameter gradient.
fn step<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    objective: TokenObjective,
    features: &[f32],
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let vocab = small_vocab();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let targets = BatchTargets::new(
        b,
        &objective,
        &vocab,
        &model.config,
        &TARGETS,
        STEPS,
        &mut rng,
    )
    .unwrap();
    let inputs = TokenInputs::new(b, &model.config, &inputs_of(&TARGETS)).unwrap();
    let mut losses = Losses::new(b, objective, inputs.rows(), vocab.len());
    model.forward(b, features, &inputs).unwrap();
    losses.forward_backward(b, model.logits(), &targets, true);
    model.params_mut().zero_grads(b);
    model.backward(b, &inputs, &losses.d_logits);
    let v = losses.read(b, &targets);
    let mut outs = vec![vec![v.loss, v.mle, v.smile], b.to_vec(model.logits())];
    outs.extend(model.params().grads.iter().map(|g| b.to_vec(g)));
    (outs[0].clone(), outs[1..].to_vec())
}

#[test]
fn captioner_gradients_match_finite_differences() {
    for config in every_family(small_vocab().len()) {
        gradients_match_finite_differences(config);
    }
}

fn gradients_match_finite_differences(config: CaptionerConfig) {
    let b = CpuBackend::new();
    let mut model = Captioner::new(&b, config, 5).unwrap();
    // Larger weights than the initialisation, so every path matters.
    for (i, value) in model.params_mut().values.iter_mut().enumerate() {
        let scaled: Vec<f32> = random(value.len(), 100 + i as u64)
            .iter()
            .map(|x| 0.5 * x)
            .collect();
        b.write(value, &scaled);
    }
    let features = random(2 * config.image_input_len(), 9);
    let objective = TokenObjective {
        mle_weight: 0.5,
        ..TokenObjective::smile()
    };
    let (_, outs) = step(&b, &mut model, objective, &features);
    let grads = &outs[1..];
    common::check_parameter_gradients(
        &mut model,
        |m| m.params_mut(),
        grads,
        1e-2,
        |m| {
            let (losses, _) = step(&b, m, objective, &features);
            f64::from(losses[0])
        },
    );
}

#[test]
fn one_step_of_every_objective_agrees_between_gpu_and_cpu() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new();
    for config in every_family(small_vocab().len()) {
        every_objective_agrees(&c, &g, config);
    }
}

fn every_objective_agrees(c: &CpuBackend, g: &GpuBackend, config: CaptionerConfig) {
    let features = random(2 * config.image_input_len(), 4);
    for kind in [
        ObjectiveKind::Mle,
        ObjectiveKind::Smile,
        ObjectiveKind::SmileRandom,
        ObjectiveKind::SmileReverse,
    ] {
        for first_token in [FirstToken::Mle, FirstToken::Shift] {
            let objective = TokenObjective {
                kind,
                first_token,
                mle_weight: 0.25,
            };
            let mut on_cpu = Captioner::new(c, config, 8).unwrap();
            let mut on_gpu = Captioner::new(g, config, 8).unwrap();
            let (want_losses, want) = step(c, &mut on_cpu, objective, &features);
            let (got_losses, got) = step(g, &mut on_gpu, objective, &features);
            let what = format!("{:?} {kind:?}, first token {first_token:?}", config.family);
            assert_close(
                &format!("{what}: losses"),
                &got_losses,
                &want_losses,
                1e-4,
                1e-5,
            );
            for (i, (got, want)) in got.iter().zip(&want).enumerate() {
                let name = if i == 0 {
                    "logits".to_string()
                } else {
                    on_cpu.params().specs[i - 1].name.clone()
                };
                assert_close(&format!("{what}: {name}"), got, want, 1e-3, 1e-5);
            }
        }
    }
}

/// A batch's gradient weight (batches formed by length) multiplies the
/// gradient of every term and leaves the reported per-token loss alone.
#[test]
fn the_gradient_weight_scales_the_gradient_not_the_loss() {
    let b = CpuBackend::new();
    let vocab = small_vocab();
    let logits = b.tensor(&random(TARGETS.len() * vocab.len(), 3));
    let smile = TokenObjective {
        mle_weight: 0.4,
        ..TokenObjective::smile()
    };
    // SMILE's own loss, and an ablation's term of its own.
    let reverse = TokenObjective {
        kind: ObjectiveKind::SmileReverse,
        ..smile
    };
    for objective in [smile, reverse] {
        let run = |weight: f32| {
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            let config = tiny_config(vocab.len());
            let mut t =
                BatchTargets::new(&b, &objective, &vocab, &config, &TARGETS, STEPS, &mut rng)
                    .unwrap();
            t.gradient_weight = weight;
            let mut losses = Losses::new(&b, objective, TARGETS.len(), vocab.len());
            losses.forward_backward(&b, &logits, &t, true);
            (losses.read(&b, &t), b.to_vec(&losses.d_logits))
        };
        let (loss, grad) = run(1.0);
        let (weighed_loss, weighed_grad) = run(2.5);
        assert_eq!(loss, weighed_loss);
        assert!(grad.iter().any(|g| g.abs() > 1e-3));
        for (g, w) in grad.iter().zip(&weighed_grad) {
            assert!(
                (w - 2.5 * g).abs() <= 1e-6,
                "{objective:?}: {w} vs 2.5 x {g}"
            );
        }
    }
}

/// A log line's values and gradient norm come back in one readback, and
/// are the values each tensor read alone gives.
#[test]
fn a_log_line_reads_back_once() {
    let Some(g) = gpu() else { return };
    let vocab = small_vocab();
    let mut model = Captioner::new(&g, tiny_config(vocab.len()), 0).unwrap();
    let objective = TokenObjective {
        mle_weight: 0.4,
        ..TokenObjective::smile()
    };
    let mut trained = TokenLevel::new(objective, vocab.len());
    let batch = TrainingBatch {
        inputs: random(2 * 6, 2),
        embeddings: None,
        sequences: vec![vec![BOS, 4, 5, 6, EOS], vec![BOS, 7, 8, EOS]],
        images: Vec::new(),
        labelled: None,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    trained
        .step(&mut StepContext {
            b: &g,
            model: &mut model,
            vocab: &vocab,
            batch: &batch,
            corpus: &TrainingCorpus::default(),
            gradient_weight: 1.0,
            retriever: None,
            rng: &mut rng,
            monitor: true,
        })
        .unwrap();
    let norm = g.tensor(&[2.25]);
    g.flush();
    let before = g.counters().readbacks;
    let (values, sumsq) = read_log(&g, &trained, &norm);
    assert_eq!(g.counters().readbacks - before, 1);
    assert_eq!(sumsq, 2.25);
    let alone: Vec<f32> = trained.logged().iter().map(|t| g.to_vec(t)[0]).collect();
    assert_eq!(values, trained.report(&alone));
    let names: Vec<&str> = values.iter().map(|v| v.0).collect();
    assert_eq!(names, ["loss", "mle", "smile"]);
    let (loss, mle, smile) = (values[0].1, values[1].1, values[2].1);
    assert!(mle > 0.0 && smile > 0.0);
    assert!((loss - (0.4 * mle + 0.6 * smile)).abs() < 1e-5);
}

/// `[model] mapper_activation = "tanh"` reaches the model, and a run
/// config without it keeps GELU; both read back from a checkpoint.
#[test]
fn the_mapper_activation_comes_from_the_run_config() {
    use captune::captioner::run::RunConfig;
    let tiny = include_str!("../../../assets/presets/tiny.toml");
    let gelu = RunConfig::parse(tiny, "tiny").unwrap();
    assert_eq!(gelu.captioner(8, 20).mapper_activation, Activation::Gelu);
    let with_tanh = tiny.replace("[model]\n", "[model]\nmapper_activation = \"tanh\"\n");
    let tanh = RunConfig::parse(&with_tanh, "tanh").unwrap();
    let config = tanh.captioner(8, 20);
    assert_eq!(config.mapper_activation, Activation::Tanh);
    let json = serde_json::to_string(&config).unwrap();
    let back: CaptionerConfig = serde_json::from_str(&json).unwrap();
    assert_eq!(back, config);
    // A checkpoint's config from before the field reads as GELU.
    let old = json.replace(",\"mapper_activation\":\"tanh\"", "");
    assert_ne!(old, json);
    let old: CaptionerConfig = serde_json::from_str(&old).unwrap();
    assert_eq!(old.mapper_activation, Activation::Gelu);
    let bad = tiny.replace("[model]\n", "[model]\nmapper_activation = \"swish\"\n");
    let e = RunConfig::parse(&bad, "bad.toml").unwrap_err().to_string();
    assert!(e.contains("bad.toml") && e.contains("swish"), "{e}");
}

/// `[model.mapper_transformer]` gives the captioner ClipCap's transformer
/// mapper: a linear layer, the constants and non-causal blocks without
/// q, k, v biases or a final norm, `mapper_hidden` wide; the parameter
/// count that checkpoint loading checks files against is the model's;
/// the config reads back from JSON, and a checkpoint's config without
/// the field (all from before it) is an MLP mapper's.
#[test]
fn a_transformer_mapper_comes_from_the_run_config() {
    use captune::captioner::run::RunConfig;
    let tiny = include_str!("../../../assets/presets/tiny.toml");
    let text = tiny.replace(
        "max_len = 24\n",
        "max_len = 24\n\n[model.mapper_transformer]\nclip_len = 3\nlayers = 2\nheads = 4\n",
    );
    let run = RunConfig::parse(&text, "transformer.toml").unwrap();
    let config = run.captioner(8, 20);
    assert_eq!(
        config.mapper_transformer,
        Some(MapperTransformer {
            clip_len: 3,
            layers: 2,
            heads: 4
        })
    );
    let b = CpuBackend::new();
    let model = Captioner::new(&b, config, 0).unwrap();
    assert_eq!(config.parameter_count(), model.params().count() as u128);
    let names: Vec<&str> = model
        .params()
        .specs
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    for name in [
        "mapper.linear.weight",
        "mapper.constants",
        "mapper.transformer.blocks.1.attn.qkv.weight",
        "mapper.transformer.blocks.1.mlp.fc1.weight",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    assert!(!names.iter().any(|n| n.starts_with("mapper.fc")
        || *n == "mapper.transformer.blocks.0.attn.qkv.bias"
        || n.starts_with("mapper.transformer.ln_f")));
    let spec = |name: &str| {
        model
            .params()
            .specs
            .iter()
            .find(|s| s.name == name)
            .unwrap()
    };
    assert_eq!(spec("mapper.linear.weight").shape, [8, 3 * 32]);
    assert_eq!(spec("mapper.constants").shape, [2, 32]);
    assert_eq!(
        spec("mapper.transformer.blocks.0.mlp.fc1.weight").shape,
        [32, 32]
    );
    // Weight decay reaches the dense layers' weight matrices only, not
    // the constants (which ClipCap draws as a standard normal and which
    // decay would pull towards 0): one AdamW step with every gradient 0
    // scales exactly those by 1 - lr x decay and leaves the rest.
    let mut decayed = model;
    let before: Vec<Vec<f32>> = decayed
        .params()
        .values
        .iter()
        .map(|v| b.to_vec(v))
        .collect();
    let adamw = AdamWConfig {
        lr: 0.1,
        weight_decay: 0.5,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(&b, adamw, &decayed.params().optimizer_layout());
    let zeros: Vec<_> = before.iter().map(|v| b.zeros(v.len())).collect();
    let grads: Vec<_> = zeros.iter().collect();
    let mut values: Vec<_> = decayed.params_mut().values.iter_mut().collect();
    opt.step(&b, &mut values, &grads);
    for (p, spec) in decayed.params().specs.iter().enumerate() {
        let dense_weight = spec.name.ends_with(".weight")
            && spec.shape.len() == 2
            && !spec.name.contains("ln")
            && !spec.name.starts_with("decoder.wte")
            && !spec.name.starts_with("decoder.wpe");
        let factor = if dense_weight { 1.0 - 0.1 * 0.5 } else { 1.0 };
        let want: Vec<f32> = before[p].iter().map(|x| x * factor).collect();
        common::assert_close(
            &spec.name,
            &b.to_vec(&decayed.params().values[p]),
            &want,
            1e-6,
            0.0,
        );
    }
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(
        serde_json::from_str::<CaptionerConfig>(&json).unwrap(),
        config
    );
    let mlp = json.replace(
        ",\"mapper_transformer\":{\"clip_len\":3,\"layers\":2,\"heads\":4}",
        "",
    );
    assert_ne!(mlp, json);
    let mlp: CaptionerConfig = serde_json::from_str(&mlp).unwrap();
    assert_eq!(mlp.mapper_transformer, None);
    // Heads that do not divide the width are refused with both named.
    let bad = text.replace("heads = 4\n", "heads = 5\n");
    let bad = RunConfig::parse(&bad, "bad.toml").unwrap();
    let e = Captioner::new(&b, bad.captioner(8, 20), 0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("5 heads") && e.contains("width 32"), "{e}");
}
