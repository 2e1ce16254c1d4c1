//! The generation engine: the transformer run one position at a time over
//! its KV cache equals the full forward; generation over the cache (token
//! choice on the device) gives the captions and log-probabilities of full
//! recomputation with the same choice rule; every workspace sees the
//! current weights; trimmed batches give the same losses and gradients.
//! Each check runs on the CPU and, where an adapter exists, on the GPU.

use crate::common;

use captune::backend::{Backend, Candidates, ChoiceRule, Sampling, Storage, TokenChoice};
use captune::captioner::decode::{BeamShape, DecodeOptions, Decoding, Generated, generate};
use captune::captioner::inputs::TokenInputs;
use captune::captioner::model::Captioner;
use captune::captioner::objectives::token::{BatchTargets, Losses, ObjectiveKind, TokenObjective};
use captune::captioner::{
    CaptionerConfig, DecoderFamily, ImageFeed, LstmConfig, LstmModel, LstmVariant, SpecialIds,
};
use captune::cpu::CpuBackend;
use captune::data::vocab::{BOS, EOS, PAD, UNK};
use captune::model::layers::Activation;
use captune::model::params::Params;
use captune::model::transformer::{Transformer, TransformerConfig};
use common::{assert_close, gpu, random};
use rand::SeedableRng;

const WIDTH: usize = 12;

fn transformer_config() -> TransformerConfig {
    TransformerConfig::new(WIDTH, 2, 3, true)
}

/// Parameters drawn larger than the initialisation, so that every path
/// (attention included) changes the output.
fn randomise<B: Backend>(b: &B, params: &mut Params<B>, seed: u64) {
    for (i, value) in params.values.iter_mut().enumerate() {
        let v: Vec<f32> = random(value.len(), seed + i as u64)
            .iter()
            .map(|x| 0.6 * x)
            .collect();
        b.write(value, &v);
    }
}

/// (the cached outputs, the full forward's) at every position of three
/// sequences of 7: the first 4 positions, then, after row r takes over
/// row parents[r]'s cache, 3 more positions.
fn cached_and_full<B: Backend>(b: &B) -> (Vec<f32>, Vec<f32>) {
    let (rows, seq, w) = (3, 7, WIDTH);
    let mut params = Params::new(0);
    let t = Transformer::new(&mut params, "t", transformer_config());
    params.finish(b);
    randomise(b, &mut params, 40);
    let first = random(rows * seq * w, 1);
    let later = random(rows * seq * w, 2);
    let parents = [2u32, 0, 0];
    // Row r's sequence: first[parents[r]] up to position 4, then later[r].
    let at = |x: &[f32], r: usize, p: usize| x[(r * seq + p) * w..][..w].to_vec();
    let mut whole = Vec::with_capacity(rows * seq * w);
    for (r, &parent) in parents.iter().enumerate() {
        for p in 0..seq {
            whole.extend(if p < 4 {
                at(&first, parent as usize, p)
            } else {
                at(&later, r, p)
            });
        }
    }
    let mut acts = t.activations(b, rows, seq);
    b.write(acts.input(), &whole);
    let mut full_out = b.zeros(rows * seq * w);
    t.forward(b, &params, &mut acts, None, &mut full_out);
    let full = b.to_vec(&full_out);

    let mut cache = t.kv_cache(b, rows, seq);
    let mut out = b.zeros(rows * w);
    let mut cached = vec![0.0; rows * seq * w];
    for p in 0..seq {
        if p == 4 {
            cache.reorder(b, &b.ids(&parents));
        }
        let source = if p < 4 { &first } else { &later };
        let input: Vec<f32> = (0..rows).flat_map(|r| at(source, r, p)).collect();
        b.write(cache.input(), &input);
        t.forward_cached(b, &params, &mut cache, &mut out);
        let got = b.to_vec(&out);
        for r in 0..rows {
            cached[(r * seq + p) * w..][..w].copy_from_slice(&got[r * w..][..w]);
        }
    }
    // Before the reorder, cached row r ran sequence r's prefix, which the
    // full forward ran in every row r' whose parent is r.
    let mut comparable_cached = Vec::new();
    let mut comparable_full = Vec::new();
    for r in 0..rows {
        for p in 0..seq {
            let full_rows: Vec<usize> = if p < 4 {
                (0..rows).filter(|&k| parents[k] as usize == r).collect()
            } else {
                vec![r]
            };
            for k in full_rows {
                comparable_cached.extend(at(&cached, r, p));
                comparable_full.extend(at(&full, k, p));
            }
        }
    }
    (comparable_cached, comparable_full)
}

/// (the cached outputs, the full forward's) at positions 3 to 6 of three
/// sequences of 7, after a prefill of positions 0 to 2 at once.
fn prefilled_and_full<B: Backend>(b: &B) -> (Vec<f32>, Vec<f32>) {
    let (rows, seq, w, len) = (3, 7, WIDTH, 3);
    let mut params = Params::new(0);
    let t = Transformer::new(&mut params, "t", transformer_config());
    params.finish(b);
    randomise(b, &mut params, 41);
    let whole = random(rows * seq * w, 3);
    let mut acts = t.activations(b, rows, seq);
    b.write(acts.input(), &whole);
    let mut full_out = b.zeros(rows * seq * w);
    t.forward(b, &params, &mut acts, None, &mut full_out);
    let full = b.to_vec(&full_out);
    let at = |x: &[f32], r: usize, p: usize| x[(r * seq + p) * w..][..w].to_vec();

    let mut cache = t.kv_cache(b, rows, seq);
    let mut prefill = t.prefill(b, rows, len);
    let mut first = Vec::new();
    for r in 0..rows {
        for p in 0..len {
            first.extend(at(&whole, r, p));
        }
    }
    b.write(prefill.input(), &first);
    t.prefill_cached(b, &params, &mut cache, &mut prefill);
    assert_eq!(cache.len(), len);
    let mut out = b.zeros(rows * w);
    let (mut cached, mut wanted) = (Vec::new(), Vec::new());
    for p in len..seq {
        let input: Vec<f32> = (0..rows).flat_map(|r| at(&whole, r, p)).collect();
        b.write(cache.input(), &input);
        t.forward_cached(b, &params, &mut cache, &mut out);
        cached.extend(b.to_vec(&out));
        wanted.extend((0..rows).flat_map(|r| at(&full, r, p)));
    }
    (cached, wanted)
}

#[test]
fn a_prefilled_cache_continues_as_the_full_forward() {
    let c = CpuBackend::new();
    let (cached, full) = prefilled_and_full(&c);
    assert_eq!(cached.len(), 3 * 4 * WIDTH);
    assert_close("cpu: prefilled vs full", &cached, &full, 1e-5, 1e-5);
    let Some(g) = gpu() else { return };
    let (gpu_cached, gpu_full) = prefilled_and_full(&g);
    assert_close("gpu: prefilled vs full", &gpu_cached, &gpu_full, 1e-4, 1e-5);
    assert_close("gpu vs cpu", &gpu_cached, &cached, 1e-4, 1e-5);
}

#[test]
fn the_cached_transformer_equals_the_full_forward() {
    let c = CpuBackend::new();
    let (cached, full) = cached_and_full(&c);
    assert_eq!(cached.len(), 3 * 7 * WIDTH);
    assert_close("cpu: cached vs full", &cached, &full, 1e-5, 1e-5);
    let Some(g) = gpu() else { return };
    let (gpu_cached, gpu_full) = cached_and_full(&g);
    assert_close("gpu: cached vs full", &gpu_cached, &gpu_full, 1e-4, 1e-5);
    assert_close("gpu vs cpu", &gpu_cached, &cached, 1e-4, 1e-5);
}

fn captioner_config() -> CaptionerConfig {
    CaptionerConfig {
        family: DecoderFamily::Prefix,
        image_tokens: 0,
        embed_dim: 6,
        prefix_len: 3,
        mapper_hidden: 10,
        mapper_activation: Activation::Gelu,
        mapper_transformer: None,
        decoder: transformer_config(),
        lstm: None,
        vision: None,
        prompt: Default::default(),
        max_len: 10,
        vocab_size: 23,
        specials: SpecialIds::WORDS,
        prefix_predicts_first: false,
        raw_embeddings: false,
    }
}

/// Two stacked LSTM layers at the same sizes, fed the image `feed`'s way.
fn lstm_config(feed: ImageFeed) -> CaptionerConfig {
    CaptionerConfig {
        family: DecoderFamily::Lstm,
        prefix_len: 0,
        mapper_hidden: 0,
        decoder: TransformerConfig::new(12, 2, 1, true),
        lstm: Some(LstmConfig::new(LstmModel::Fc, feed)),
        ..captioner_config()
    }
}

/// Every decoder family that runs incrementally its own way, the prefix
/// decoder in ClipCap's layout (no start fed), and self-critical
/// training's three LSTMs.
fn every_family() -> [CaptionerConfig; 9] {
    let updown = CaptionerConfig {
        image_tokens: 4,
        decoder: TransformerConfig::new(12, 1, 1, true),
        lstm: Some(LstmConfig::new(LstmModel::UpDown, ImageFeed::Hidden)),
        ..lstm_config(ImageFeed::Hidden)
    };
    let att2in = CaptionerConfig {
        lstm: Some(LstmConfig::new(LstmModel::Att2in, ImageFeed::Hidden)),
        ..updown
    };
    let clipcap = CaptionerConfig {
        prefix_predicts_first: true,
        ..captioner_config()
    };
    let self_critical = |c: CaptionerConfig| CaptionerConfig {
        lstm: c.lstm.map(|l| LstmConfig {
            variant: LstmVariant::SelfCritical,
            ..l
        }),
        ..c
    };
    [
        captioner_config(),
        clipcap,
        lstm_config(ImageFeed::Hidden),
        lstm_config(ImageFeed::Input),
        self_critical(lstm_config(ImageFeed::Input)),
        updown,
        att2in,
        self_critical(updown),
        self_critical(att2in),
    ]
}

fn random_captioner<B: Backend>(b: &B) -> Captioner<B> {
    random_captioner_of(b, captioner_config())
}

fn random_captioner_of<B: Backend>(b: &B, config: CaptionerConfig) -> Captioner<B> {
    let mut model = Captioner::new(b, config, 3).unwrap();
    randomise(b, model.params_mut(), 70);
    model
}

/// The reference: every step runs the whole decoder over the partial
/// captions (no cache), and the CPU twin of the device's token choice
/// picks from the logits of each caption's last position.
fn recomputed<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    features: &[f32],
    decoding: &Decoding,
    banned: u32,
) -> Vec<Generated> {
    let c = model.config;
    let (d, v, steps) = (c.image_input_len(), c.vocab_size, c.token_positions());
    let per_image = decoding.rows_per_image();
    let rows = features.len() / d * per_image;
    let (rule, seed) = match *decoding {
        Decoding::Sample {
            temperature,
            top_k,
            top_p,
            seed,
            ..
        } => (
            ChoiceRule::Sample(captune::backend::Sampling {
                temperature,
                top_k: top_k as u32,
                top_p,
            }),
            seed,
        ),
        Decoding::Gumbel { seed, .. } => (ChoiceRule::Gumbel, seed),
        _ => (ChoiceRule::Greedy, 0),
    };
    let row_features: Vec<f32> = (0..rows)
        .flat_map(|r| features[r / per_image * d..][..d].to_vec())
        .collect();
    let mut seqs = vec![vec![BOS]; rows];
    let (mut next, mut history, mut logprobs) = (
        vec![0; rows],
        vec![PAD; rows * steps],
        vec![0.0; rows * steps],
    );
    for step in 0..steps {
        let inputs = TokenInputs::new(b, &c, &seqs).unwrap();
        model.forward(b, &row_features, &inputs).unwrap();
        let all = b.to_vec(model.logits());
        let last: Vec<f32> = (0..rows)
            .flat_map(|r| all[(r * steps + seqs[r].len() - 1) * v..][..v].to_vec())
            .collect();
        let choice = TokenChoice {
            rows,
            vocab: v,
            step: step as u32,
            steps,
            rule,
            seed,
            first_row: 0,
            banned,
            bos: BOS,
            eos: EOS,
            pad: PAD,
        };
        captune::cpu::choose::choose_tokens(&last, &choice, &mut next, &mut history, &mut logprobs);
        for (r, s) in seqs.iter_mut().enumerate() {
            if next[r] != PAD && s.len() < steps {
                s.push(next[r]);
            }
        }
    }
    (0..rows)
        .map(|r| {
            let row = &history[r * steps..][..steps];
            let n = row.iter().position(|&t| t == EOS).map_or(steps, |e| e + 1);
            Generated {
                image: r / per_image,
                ids: row[..n].to_vec(),
                logprob: logprobs[r * steps..][..n].iter().sum(),
            }
        })
        .collect()
}

fn decodings() -> Vec<(Decoding, bool)> {
    [
        ("greedy", false),
        ("greedy", true),
        ("sample:3:seed=11", false),
        ("sample:3:k=4,seed=12", false),
        ("sample:3:p=0.8,seed=13", true),
        ("sample:2:t=0.7,k=5,p=0.9,seed=14", false),
    ]
    .into_iter()
    .map(|(text, suppress)| (Decoding::parse(text).unwrap(), suppress))
    .chain([(Decoding::Gumbel { n: 3, seed: 15 }, true)])
    .collect()
}

/// Every decoding's captions from the cache and from recomputation.
fn both_ways<B: Backend>(b: &B, config: CaptionerConfig) -> Vec<(Vec<Generated>, Vec<Generated>)> {
    let mut model = random_captioner_of(b, config);
    let features = random(5 * config.image_input_len(), 8);
    decodings()
        .into_iter()
        .map(|(decoding, suppress_unk)| {
            let options = DecodeOptions {
                suppress_unk,
                ..DecodeOptions::default()
            };
            let cached = generate(b, &model, &features, &decoding, &options).unwrap();
            let banned = if suppress_unk { UNK } else { u32::MAX };
            let reference = recomputed(b, &mut model, &features, &decoding, banned);
            (cached, reference)
        })
        .collect()
}

fn assert_same_captions(what: &str, got: &[Generated], want: &[Generated]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.image, &g.ids), (w.image, &w.ids), "{what}");
        assert!(
            (g.logprob - w.logprob).abs() <= 1e-5 * (1.0 + w.logprob.abs()),
            "{what}: log-probability {} vs {}",
            g.logprob,
            w.logprob
        );
    }
}

#[test]
fn cached_generation_equals_full_recomputation_on_both_backends() {
    for config in every_family() {
        incremental_generation_equals_recomputation(config);
    }
}

fn incremental_generation_equals_recomputation(config: CaptionerConfig) {
    let c = CpuBackend::new();
    let on_cpu = both_ways(&c, config);
    let mut lengths = std::collections::BTreeSet::new();
    for ((decoding, suppress), (cached, reference)) in decodings().iter().zip(&on_cpu) {
        assert_same_captions(&format!("cpu {decoding:?} {suppress}"), cached, reference);
        lengths.extend(cached.iter().map(|g| g.ids.len()));
        if *suppress {
            assert!(cached.iter().all(|g| !g.ids.contains(&UNK)));
        }
    }
    assert!(
        lengths.len() > 2,
        "captions of several lengths: {lengths:?}"
    );
    let Some(g) = gpu() else { return };
    let on_gpu = both_ways(&g, config);
    for ((decoding, _), ((gpu_cached, gpu_reference), (cpu_cached, _))) in
        decodings().iter().zip(on_gpu.iter().zip(&on_cpu))
    {
        assert_same_captions(&format!("gpu {decoding:?}"), gpu_cached, gpu_reference);
        let ids = |v: &[Generated]| v.iter().map(|x| x.ids.clone()).collect::<Vec<_>>();
        assert_eq!(
            ids(gpu_cached),
            ids(cpu_cached),
            "{decoding:?}: the same ids on both"
        );
    }
}

#[test]
fn sampling_differs_by_seed_and_repeats_with_it() {
    let c = CpuBackend::new();
    let model = random_captioner(&c);
    let features = random(4 * 6, 8);
    let run = |text: &str| {
        let d = Decoding::parse(text).unwrap();
        let out = generate(&c, &model, &features, &d, &DecodeOptions::default()).unwrap();
        out.into_iter().map(|g| g.ids).collect::<Vec<_>>()
    };
    assert_eq!(run("sample:4:seed=1"), run("sample:4:seed=1"));
    assert_ne!(run("sample:4:seed=1"), run("sample:4:seed=2"));
}

/// A sequence fits a batch's token positions when its ids after the last
/// fed one are at most its end (a target only); a longer one is refused,
/// not cut.
#[test]
fn a_sequence_longer_than_the_positions_is_refused() {
    let c = CpuBackend::new();
    let config = captioner_config();
    let t = config.token_positions();
    let fits: Vec<u32> = (0..t as u32 + 1).map(|i| 4 + i % 10).collect();
    assert_eq!(
        TokenInputs::new(&c, &config, std::slice::from_ref(&fits))
            .unwrap()
            .positions,
        t
    );
    let long = [fits, vec![5]].concat();
    let e = TokenInputs::new(&c, &config, &[long]).err().unwrap();
    assert!(
        e.to_string()
            .contains(&format!("{} ids does not fit the {t}", t + 2)),
        "{e}"
    );
}

/// Images decoded in parts, each part told where it starts
/// (`DecodeOptions::first_image`), get the captions one call gives them:
/// sampled and Gumbel draws go on across parts instead of repeating (with
/// every part starting at 0, image 64 would repeat image 0's draws). The
/// log-probabilities agree to rounding only: the CPU's matrix products
/// block their rows by the batch's size, and at this model's small shapes
/// a row's sums round differently in a batch of 70 and one of 6.
#[test]
fn decoding_in_parts_gives_the_captions_of_one_call() {
    let c = CpuBackend::new();
    let model = random_captioner(&c);
    let images = 70;
    let features = random(images * 6, 9);
    for text in ["sample:2:seed=3", "greedy"] {
        let d = Decoding::parse(text).unwrap();
        let whole = generate(&c, &model, &features, &d, &DecodeOptions::default()).unwrap();
        let mut parts = Vec::new();
        for (first, last) in [(0, 64), (64, images)] {
            let options = DecodeOptions {
                first_image: first,
                ..DecodeOptions::default()
            };
            let part = &features[first * 6..last * 6];
            for mut g in generate(&c, &model, part, &d, &options).unwrap() {
                g.image += first;
                parts.push(g);
            }
        }
        let key = |g: &[captune::captioner::decode::Generated]| {
            g.iter()
                .map(|g| (g.image, g.ids.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&whole), key(&parts), "{text}");
        for (w, p) in whole.iter().zip(&parts) {
            assert!(
                (w.logprob - p.logprob).abs() <= 1e-5 * w.logprob.abs().max(1.0),
                "{text}: image {} log-probability {} in one call, {} in parts",
                w.image,
                w.logprob,
                p.logprob
            );
        }
    }
    let d = Decoding::parse("sample:1:seed=3").unwrap();
    let ids = |first_image| {
        let options = DecodeOptions {
            first_image,
            ..DecodeOptions::default()
        };
        let out = generate(&c, &model, &features[..6], &d, &options).unwrap();
        out[0].ids.clone()
    };
    assert_ne!(ids(0), ids(64), "another image's draws");
}

/// The logits of one caption, decoded alone (a workspace of batch 1) and
/// as the first of a batch of 3: before and after a weight update.
fn logits_alone_and_in_a_batch<B: Backend>(b: &B) -> Vec<Vec<f32>> {
    let mut model = random_captioner(b);
    let c = model.config;
    let (t, v) = (c.token_positions(), c.vocab_size);
    let features = random(3 * c.embed_dim, 5);
    let seqs = vec![
        vec![BOS, 5, 6, EOS],
        vec![BOS, 7, EOS],
        vec![BOS, 8, 9, 10, EOS],
    ];
    let mut out = Vec::new();
    for update in [false, true] {
        if update {
            let tokens = model.params().values.len() - 1;
            let doubled: Vec<f32> = b
                .to_vec(&model.params().values[tokens])
                .iter()
                .map(|x| 2.0 * x)
                .collect();
            b.write(&mut model.params_mut().values[tokens], &doubled);
        }
        let batch = TokenInputs::new(b, &c, &seqs).unwrap();
        model.forward(b, &features, &batch).unwrap();
        out.push(b.to_vec(model.logits())[..t * v].to_vec());
        let alone = TokenInputs::new(b, &c, &seqs[..1]).unwrap();
        model.forward(b, &features[..c.embed_dim], &alone).unwrap();
        out.push(b.to_vec(model.logits()));
    }
    out
}

#[test]
fn every_workspace_uses_the_current_weights() {
    let check = |what: &str, outs: Vec<Vec<f32>>| {
        assert_close(&format!("{what}: before"), &outs[1], &outs[0], 1e-5, 1e-6);
        assert_close(&format!("{what}: after"), &outs[3], &outs[2], 1e-5, 1e-6);
        assert!(
            outs[2]
                .iter()
                .zip(&outs[0])
                .any(|(a, b)| (a - b).abs() > 1e-3),
            "{what}: the update changed the logits"
        );
    };
    check("cpu", logits_alone_and_in_a_batch(&CpuBackend::new()));
    let Some(g) = gpu() else { return };
    check("gpu", logits_alone_and_in_a_batch(&g));
}

/// Loss values and every parameter gradient of one batch of short
/// captions, over all token positions or trimmed.
fn loss_and_gradients<B: Backend>(
    b: &B,
    objective: TokenObjective,
    trimmed: bool,
) -> Vec<Vec<f32>> {
    let mut config = captioner_config();
    config.max_len = 20;
    let mut model = Captioner::new(b, config, 4).unwrap();
    randomise(b, model.params_mut(), 90);
    let vocab = captune::captioner::CaptionVocab::from_words(
        (4..config.vocab_size).map(|i| format!("w{i}")).collect(),
    );
    let seqs = vec![
        vec![BOS, 5, 6, EOS],
        vec![BOS, 7, EOS],
        vec![BOS, 8, 9, 10, 11, EOS],
    ];
    let inputs = if trimmed {
        TokenInputs::trimmed(b, &config, &seqs).unwrap()
    } else {
        TokenInputs::new(b, &config, &seqs).unwrap()
    };
    let steps = inputs.positions;
    let mut targets = vec![PAD; seqs.len() * steps];
    for (i, s) in seqs.iter().enumerate() {
        targets[i * steps..][..s.len() - 1].copy_from_slice(&s[1..]);
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    let batch =
        BatchTargets::new(b, &objective, &vocab, &config, &targets, steps, &mut rng).unwrap();
    let mut losses = Losses::new(b, objective, inputs.rows(), config.vocab_size);
    let features = random(seqs.len() * config.embed_dim, 6);
    model.forward(b, &features, &inputs).unwrap();
    losses.forward_backward(b, model.logits(), &batch, true);
    model.params_mut().zero_grads(b);
    model.backward(b, &inputs, &losses.d_logits);
    let v = losses.read(b, &batch);
    let mut out = vec![vec![v.loss, v.mle, v.smile, steps as f32]];
    out.extend(model.params().grads.iter().map(|g| b.to_vec(g)));
    out
}

#[test]
fn trimmed_batches_give_the_same_losses_and_gradients() {
    for kind in [
        ObjectiveKind::Mle,
        ObjectiveKind::Smile,
        ObjectiveKind::SmileRandom,
    ] {
        let objective = TokenObjective {
            kind,
            mle_weight: 0.3,
            ..TokenObjective::smile()
        };
        let c = CpuBackend::new();
        let full = loss_and_gradients(&c, objective, false);
        let trimmed = loss_and_gradients(&c, objective, true);
        assert_eq!((full[0][3], trimmed[0][3]), (19.0, 8.0), "positions");
        assert_close(
            &format!("{kind:?} losses"),
            &trimmed[0][..3],
            &full[0][..3],
            1e-5,
            1e-6,
        );
        for (i, (t, f)) in trimmed[1..].iter().zip(&full[1..]).enumerate() {
            // The positions past the trimmed width get no gradient.
            let n = t.len().min(f.len());
            assert_close(
                &format!("{kind:?} gradient {i}"),
                &t[..n],
                &f[..n],
                1e-4,
                1e-6,
            );
        }
    }
}

/// Beam search written plainly on the host, as the reference for the
/// device's (`Backend::beam_step`): per image, the live beams' candidates
/// (`step_candidates(moved)`'s pairs for [`BeamShape::candidates`], after
/// row r took over row `parents[r]`'s history and was fed `next[r]`;
/// `moved` = `None` at the first step) are sorted, those among the best
/// width that end finish, the best width others go on, and an image stops
/// once its n_best-th finished caption beats every live beam.
fn host_beam_search(
    shape: &BeamShape,
    mut step_candidates: impl FnMut(Option<(&[u32], &[u32])>) -> Vec<u32>,
) -> Vec<(Vec<u32>, f32)> {
    let BeamShape {
        images,
        width,
        n_best,
        steps,
        specials,
        ..
    } = *shape;
    let count = shape.candidates().count;
    let rows = images * width;
    // Live beams per image: (ids after <bos>, score).
    let mut live: Vec<Vec<(Vec<u32>, f32)>> = vec![vec![(vec![], 0.0)]; images];
    let mut finished: Vec<Vec<(Vec<u32>, f32)>> = vec![Vec::new(); images];
    let mut moved: Option<(Vec<u32>, Vec<u32>)> = None;
    for step in 0..steps {
        if live.iter().all(Vec::is_empty) {
            break;
        }
        let pairs = step_candidates(moved.as_ref().map(|(p, n)| (p.as_slice(), n.as_slice())));
        let last_step = step + 1 == steps;
        let mut parents: Vec<u32> = (0..rows as u32).collect();
        let mut next_ids = vec![specials.pad; rows];
        for i in 0..images {
            let mut candidates: Vec<(f32, usize, u32)> = Vec::new();
            for (k, (_, score)) in live[i].iter().enumerate() {
                let row = (i * width + k) * count;
                for pair in pairs[2 * row..2 * (row + count)].chunks(2) {
                    if pair[0] != u32::MAX {
                        candidates.push((score + f32::from_bits(pair[1]), k, pair[0]));
                    }
                }
            }
            candidates.sort_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2).cmp(&(y.1, y.2))));
            let mut next = Vec::new();
            for (rank, (score, k, id)) in candidates.into_iter().take(2 * width).enumerate() {
                let mut ids = live[i][k].0.clone();
                ids.push(id);
                if id == specials.end || last_step {
                    if rank < width {
                        finished[i].push((ids, score));
                    }
                } else if next.len() < width {
                    let row = i * width + next.len();
                    parents[row] = (i * width + k) as u32;
                    next_ids[row] = id;
                    next.push((ids, score));
                }
            }
            finished[i].sort_by(|x, y| y.1.total_cmp(&x.1));
            finished[i].truncate(width);
            if let Some(kth) = finished[i].get(n_best - 1)
                && next.iter().all(|l| l.1 <= kth.1)
            {
                next.clear();
            }
            live[i] = next;
        }
        moved = Some((parents, next_ids));
    }
    finished
        .into_iter()
        .flat_map(|done| {
            (0..n_best).map(move |k| {
                done.get(k)
                    .cloned()
                    .unwrap_or((vec![specials.end], f32::NEG_INFINITY))
            })
        })
        .collect()
}

/// Beam search over the KV cache, on the device, against the host's
/// search fed by full recomputation of each row's whole history.
fn beams_both_ways<B: Backend>(
    b: &B,
    config: CaptionerConfig,
) -> (Vec<Generated>, Vec<(Vec<u32>, f32)>) {
    let mut model = random_captioner_of(b, config);
    let c = model.config;
    let (d, v, t) = (c.image_input_len(), c.vocab_size, c.token_positions());
    let (images, width, n_best) = (4, 3, 2);
    let features = random(images * d, 8);
    let decoding = Decoding::Beam { width, n_best };
    let cached = generate(b, &model, &features, &decoding, &DecodeOptions::default()).unwrap();
    let row_features: Vec<f32> = (0..images * width)
        .flat_map(|r| features[r / width * d..][..d].to_vec())
        .collect();
    let shape = BeamShape {
        images,
        width,
        n_best,
        steps: t,
        vocab: v,
        suppress_unk: false,
        specials: SpecialIds::WORDS,
    };
    let candidates = shape.candidates();
    let mut seqs = vec![vec![BOS]; images * width];
    let reference = host_beam_search(&shape, |moved| {
        if let Some((parents, next)) = moved {
            seqs = parents
                .iter()
                .zip(next)
                .map(|(&p, &id)| [seqs[p as usize].as_slice(), &[id]].concat())
                .collect();
        }
        let inputs = TokenInputs::new(b, &c, &seqs).unwrap();
        model.forward(b, &row_features, &inputs).unwrap();
        let all = b.to_vec(model.logits());
        let last: Vec<f32> = (0..seqs.len())
            .flat_map(|r| all[(r * t + seqs[r].len() - 1) * v..][..v].to_vec())
            .collect();
        let mut pairs = b.ids(&vec![0; candidates.rows * candidates.count * 2]);
        b.top_candidates(&b.tensor(&last), &candidates, &mut pairs);
        b.ids_to_vec(&pairs)
    });
    (cached, reference)
}

/// The search's record after `beam_step` on each step's candidates in turn.
fn beam_record<B: Backend>(b: &B, shape: &BeamShape, step_pairs: &[Vec<u32>]) -> Vec<u32> {
    let rows = shape.images * shape.width;
    let (mut parents, mut next) = (b.ids(&vec![0; rows]), b.ids(&vec![0; rows]));
    let mut state = b.ids(&vec![0; shape.at(0).state_len()]);
    for (step, pairs) in step_pairs.iter().enumerate() {
        let at = shape.at(step);
        b.beam_step(&b.ids(pairs), &at, &mut parents, &mut next, &mut state);
    }
    b.ids_to_vec(&state)
}

/// The device's beam steps, fed random candidates with many ties (of
/// score across beams, and of finished captions), rows offering fewer
/// candidates than asked, and frequent ends, give the host search's
/// captions and scores exactly, and the same record on both backends.
#[test]
fn beam_steps_equal_the_host_search() {
    for (images, width, n_best, steps) in [(5, 3, 2, 7), (3, 1, 1, 5), (2, 4, 4, 9)] {
        let shape = BeamShape {
            images,
            width,
            n_best,
            steps,
            vocab: 8,
            suppress_unk: false,
            specials: SpecialIds::WORDS,
        };
        let c = shape.candidates();
        let mut rng = rand::rngs::StdRng::seed_from_u64(steps as u64);
        let step_pairs: Vec<Vec<u32>> = (0..steps)
            .map(|_| {
                (0..c.rows)
                    .flat_map(|_| {
                        let mut ids: Vec<u32> =
                            (0..c.vocab as u32).filter(|&j| c.allowed(j)).collect();
                        rand::seq::SliceRandom::shuffle(ids.as_mut_slice(), &mut rng);
                        let offered = rand::Rng::random_range(&mut rng, 1..=c.count);
                        (0..c.count).flat_map(move |n| match ids.get(n).filter(|_| n < offered) {
                            // Quarters, so sums tie exactly; <eos> is
                            // favoured, so captions end before the last step.
                            Some(&id) => {
                                let quarters = if id == EOS { n } else { n + id as usize % 3 };
                                [id, (0.0 - quarters as f32 / 4.0).to_bits()]
                            }
                            None => [u32::MAX, f32::NEG_INFINITY.to_bits()],
                        })
                    })
                    .collect()
            })
            .collect();
        let mut at = 0;
        let want = host_beam_search(&shape, |_| {
            at += 1;
            step_pairs[at - 1].clone()
        });
        assert!(
            want.iter()
                .any(|(ids, _)| ids.len() < steps && ids.last() == Some(&EOS)),
            "some caption ends before the last step: {want:?}"
        );
        let cpu = beam_record(&CpuBackend::new(), &shape, &step_pairs);
        assert_eq!(shape.captions(&cpu, steps), want, "cpu: {images} x {width}");
        if let Some(g) = gpu() {
            let on_gpu = beam_record(&g, &shape, &step_pairs);
            assert_eq!(on_gpu, cpu, "gpu record: {images} x {width}");
        }
    }
}

/// A search none of whose captions ends, cut to one word fewer than its
/// steps (as `--max-words` runs it): every caption is cut, with its beam's
/// score at the cut, and a beam's continuations cut to the same words are
/// one caption, the rest padded at minus infinity.
#[test]
fn captions_cut_at_a_word_limit_are_distinct_and_scored_at_the_cut() {
    let shape = BeamShape {
        images: 1,
        width: 3,
        n_best: 3,
        steps: 3,
        vocab: 8,
        suppress_unk: false,
        specials: SpecialIds::WORDS,
    };
    let c = shape.candidates();
    // Every row offers its words in the same order, at scores -1/4, -2/4,
    // ..., and never <eos>: the best beam's continuations rank first.
    let words: Vec<u32> = (0..c.vocab as u32)
        .filter(|&j| c.allowed(j) && j != EOS)
        .collect();
    let pairs: Vec<u32> = (0..c.rows)
        .flat_map(|_| {
            (0..c.count).flat_map(|n| match words.get(n) {
                Some(&id) => [id, (-(n as f32 + 1.0) / 4.0).to_bits()],
                None => [u32::MAX, f32::NEG_INFINITY.to_bits()],
            })
        })
        .collect();
    let record = beam_record(&CpuBackend::new(), &shape, &vec![pairs; shape.steps]);
    let whole = shape.captions(&record, shape.steps);
    assert!(whole.iter().all(|(ids, _)| ids.len() == 3), "{whole:?}");
    assert_eq!(
        whole[0].0[..2],
        whole[1].0[..2],
        "the best beam's two continuations"
    );
    let cut = shape.captions(&record, 2);
    let (w0, w1) = (words[0], words[1]);
    assert_eq!(
        cut,
        vec![
            (vec![w0, w0], -0.5),
            (vec![w0, w1], -0.75),
            (vec![EOS], f32::NEG_INFINITY),
        ],
        "from {whole:?}"
    );
}

#[test]
fn beam_search_over_the_cache_equals_recomputation() {
    let check = |what: &str, (cached, reference): (Vec<Generated>, Vec<(Vec<u32>, f32)>)| {
        assert_eq!(cached.len(), reference.len(), "{what}");
        for (g, (ids, logprob)) in cached.iter().zip(&reference) {
            assert_eq!(&g.ids, ids, "{what}");
            assert!(
                (g.logprob - logprob).abs() <= 1e-5 * (1.0 + logprob.abs()),
                "{what}"
            );
        }
        // Each image's two best differ and come best first: the search
        // kept several beams, so rows followed other rows' caches.
        for pair in cached.chunks(2) {
            assert_ne!(pair[0].ids, pair[1].ids, "{what}");
            assert!(pair[0].logprob >= pair[1].logprob, "{what}");
        }
    };
    for config in every_family() {
        let family = config.family;
        check(
            &format!("cpu {family:?}"),
            beams_both_ways(&CpuBackend::new(), config),
        );
        if let Some(g) = gpu() {
            check(&format!("gpu {family:?}"), beams_both_ways(&g, config));
        }
    }
}

/// Beam search's candidates are each row's best allowed tokens by
/// log-probability, lowest id first among equals, with their log-probabilities over the
/// allowed tokens; a row with fewer allowed tokens than asked fills the
/// rest with no token.
#[test]
fn top_candidates_are_the_best_allowed_tokens() {
    let check = |b: &dyn Fn(&[f32], &Candidates) -> Vec<u32>, what: &str| {
        for (vocab, count) in [(1000, 6), (5, 6)] {
            let rows = 3;
            // Few distinct values, so ties span the kernel's lanes.
            let z: Vec<f32> = random(rows * vocab, 4)
                .iter()
                .map(|x| (x * 4.0).round())
                .collect();
            let c = Candidates {
                rows,
                vocab,
                count,
                banned: 3,
                bos: 1,
                pad: 0,
            };
            let pairs = b(&z, &c);
            for r in 0..rows {
                let z = &z[r * vocab..][..vocab];
                let mut allowed: Vec<usize> = (0..vocab).filter(|&j| c.allowed(j as u32)).collect();
                let lse = allowed
                    .iter()
                    .map(|&j| (z[j] as f64).exp())
                    .sum::<f64>()
                    .ln();
                allowed.sort_by(|&x, &y| z[y].total_cmp(&z[x]).then(x.cmp(&y)));
                for n in 0..count {
                    let at = 2 * (r * count + n);
                    let (id, logprob) = (pairs[at], f32::from_bits(pairs[at + 1]));
                    match allowed.get(n) {
                        Some(&j) => {
                            assert_eq!(id, j as u32, "{what}: row {r}, candidate {n}");
                            let want = z[j] as f64 - lse;
                            assert!(
                                (logprob as f64 - want).abs() < 1e-5,
                                "{what}: {logprob} vs {want}"
                            );
                        }
                        None => assert_eq!((id, logprob), (u32::MAX, f32::NEG_INFINITY), "{what}"),
                    }
                }
            }
        }
    };
    fn on<B: Backend>(b: &B) -> impl Fn(&[f32], &Candidates) -> Vec<u32> + '_ {
        move |z, c| {
            let mut pairs = b.ids(&vec![0; c.rows * c.count * 2]);
            b.top_candidates(&b.tensor(z), c, &mut pairs);
            b.ids_to_vec(&pairs)
        }
    }
    check(&on(&CpuBackend::new()), "cpu");
    let Some(g) = gpu() else { return };
    check(&on(&g), "gpu");
}

/// Sampled ids of 4,000 rows of one distribution over 1,000 tokens, whose
/// likely tokens sit in different lanes of the kernel's split of the
/// vocabulary (chunks of 4 tokens), plainly and with top-k 2.
fn sampled<B: Backend>(b: &B, likely: &[(usize, f32)]) -> Vec<Vec<u32>> {
    let (rows, vocab) = (4000, 1000);
    let mut z = vec![-30.0f32; vocab];
    for &(j, v) in likely {
        z[j] = v;
    }
    let logits = b.tensor(&z.repeat(rows));
    [0, 2]
        .into_iter()
        .map(|top_k| {
            let (mut next, mut history, mut logprobs) =
                (b.ids(&vec![0; rows]), b.ids(&vec![0; rows]), b.zeros(rows));
            let choice = TokenChoice {
                rows,
                vocab,
                step: 0,
                steps: 1,
                rule: ChoiceRule::Sample(Sampling {
                    temperature: 1.0,
                    top_k,
                    top_p: 1.0,
                }),
                seed: 7,
                first_row: 0,
                banned: u32::MAX,
                bos: 0,
                eos: 1,
                pad: 2,
            };
            b.choose_tokens(&logits, &choice, &mut next, &mut history, &mut logprobs);
            b.ids_to_vec(&next)
        })
        .collect()
}

#[test]
fn sampling_draws_each_token_with_its_probability() {
    let likely = [(5, 1.0f32), (300, 2.0), (301, 0.5), (777, 1.5), (999, 0.0)];
    let check = |what: &str, drawn: &[Vec<u32>]| {
        for (i, ids) in drawn.iter().enumerate() {
            // Top-k 2 keeps tokens 300 and 777 alone.
            let kept: Vec<(usize, f32)> = if i == 0 {
                likely.to_vec()
            } else {
                vec![likely[1], likely[3]]
            };
            let total: f64 = kept.iter().map(|&(_, v)| (v as f64).exp()).sum();
            for &(j, v) in &kept {
                let share = ids.iter().filter(|&&c| c as usize == j).count() as f64 / 4000.0;
                let p = (v as f64).exp() / total;
                assert!(
                    (share - p).abs() < 0.025,
                    "{what} top-k {i}: token {j}: {share} vs {p}"
                );
            }
            let unlikely = ids
                .iter()
                .filter(|&&c| !kept.iter().any(|k| k.0 == c as usize));
            assert!(unlikely.count() <= 2, "{what}: tokens of e^-30 drawn");
        }
    };
    let cpu = sampled(&CpuBackend::new(), &likely);
    check("cpu", &cpu);
    let Some(g) = gpu() else { return };
    let drawn = sampled(&g, &likely);
    check("gpu", &drawn);
    assert_eq!(drawn, cpu, "the GPU drew other ids than the CPU");
}

/// Greedy choice among tied logits in different chunks of the kernel's
/// split of the vocabulary (chunks of 4 tokens) takes the lowest id.
#[test]
fn greedy_takes_the_lowest_id_among_ties() {
    fn chosen<B: Backend>(b: &B) -> u32 {
        let mut z = vec![0.0f32; 1000];
        for j in [700, 259, 3] {
            z[j] = 5.0;
        }
        let (mut next, mut history, mut logprobs) = (b.ids(&[0]), b.ids(&[0]), b.zeros(1));
        let choice = TokenChoice {
            rows: 1,
            vocab: 1000,
            step: 0,
            steps: 1,
            rule: ChoiceRule::Greedy,
            seed: 0,
            first_row: 0,
            banned: u32::MAX,
            bos: 0,
            eos: 1,
            pad: 2,
        };
        b.choose_tokens(
            &b.tensor(&z),
            &choice,
            &mut next,
            &mut history,
            &mut logprobs,
        );
        b.ids_to_vec(&next)[0]
    }
    assert_eq!(chosen(&CpuBackend::new()), 3);
    let Some(g) = gpu() else { return };
    assert_eq!(chosen(&g), 3);
}

/// Gumbel-max choice samples the softmax: over 6000 rows of the same
/// logits, each token's share is within 0.02 of its probability; and
/// `gumbel_logits` draws the noise it chose with: the perturbed row's
/// largest allowed entry is the chosen token, at any temperature.
#[test]
fn gumbel_max_samples_the_softmax_and_its_noise_is_drawn_again() {
    let b = CpuBackend::new();
    let (rows, vocab) = (6000, 6);
    let z = [0.0f32, 0.0, 1.0, 0.5, -1.0, 2.0];
    let logits: Vec<f32> = (0..rows).flat_map(|_| z).collect();
    let logits = b.tensor(&logits);
    let (mut next, mut history, mut logprobs) = (
        b.ids(&vec![0; rows]),
        b.ids(&vec![PAD; rows]),
        b.zeros(rows),
    );
    let choice = TokenChoice {
        rows,
        vocab,
        step: 0,
        steps: 1,
        rule: ChoiceRule::Gumbel,
        seed: 99,
        first_row: 0,
        banned: u32::MAX,
        bos: 0,
        eos: 1,
        pad: 4,
    };
    b.choose_tokens(&logits, &choice, &mut next, &mut history, &mut logprobs);
    let chosen = b.ids_to_vec(&next);
    // Tokens 0 and 4 (bos, pad) are never chosen: the rest share the mass.
    let allowed = [1usize, 2, 3, 5];
    let total: f64 = allowed.iter().map(|&j| (z[j] as f64).exp()).sum();
    for (j, &zj) in z.iter().enumerate() {
        let share = chosen.iter().filter(|&&c| c as usize == j).count() as f64 / rows as f64;
        let p = if allowed.contains(&j) {
            (zj as f64).exp() / total
        } else {
            0.0
        };
        assert!((share - p).abs() < 0.02, "token {j}: share {share}, p {p}");
    }
    for tau in [0.3, 1.0, 3.0] {
        let mut perturbed = b.zeros(rows * vocab);
        b.gumbel_logits(&logits, vocab, 1, 99, 0, tau, &mut perturbed);
        let perturbed = b.to_vec(&perturbed);
        for (r, &c) in chosen.iter().enumerate() {
            let row = &perturbed[r * vocab..(r + 1) * vocab];
            let best = allowed
                .iter()
                .copied()
                .max_by(|&x, &y| row[x].total_cmp(&row[y]))
                .unwrap();
            assert_eq!(best as u32, c, "row {r} at tau {tau}");
        }
    }
}
