//! One policy: the distribution decoding samples from is the one every
//! loss reads. `<pad>` and `<bos>`, which no caption contains, have no
//! probability in the model's output; a sampled caption's recorded
//! log-probability is the teacher-forced one; a suppressed `<unk>` is
//! left out of the recorded log-probability; and a REINFORCE surrogate
//! with a negative advantage moves no probability onto the masked ids.
//! The same holds for a vocabulary whose start is also its end (GPT-2's
//! `<|endoftext|>`), whose padding is an id of its own: there only the
//! padding is masked, and a caption ends where it chooses the end. On
//! the CPU and, where an adapter exists, on the GPU.

use crate::common;

use captune::backend::{Backend, Storage};
use captune::captioner::decode::{DecodeOptions, Decoding, Generated, generate};
use captune::captioner::inputs::{MASKED_LOGIT, TokenInputs, teacher_targets};
use captune::captioner::model::Captioner;
use captune::captioner::objectives::reinforce::Surrogate;
use captune::captioner::{CaptionerConfig, DecoderFamily, SpecialIds};
use captune::cpu::CpuBackend;
use captune::data::vocab::UNK;
use captune::model::layers::Activation;
use captune::model::transformer::TransformerConfig;
use common::{gpu, random};

const VOCAB: usize = 19;

/// GPT-2's roles: one id starts and ends a caption; padding is the id
/// after the others.
const START_IS_END: SpecialIds = SpecialIds {
    start: VOCAB as u32 - 2,
    end: VOCAB as u32 - 2,
    pad: VOCAB as u32 - 1,
};

fn random_captioner<B: Backend>(b: &B, specials: SpecialIds) -> Captioner<B> {
    let config = CaptionerConfig {
        family: DecoderFamily::Prefix,
        image_tokens: 0,
        embed_dim: 6,
        prefix_len: 2,
        mapper_hidden: 10,
        mapper_activation: Activation::Gelu,
        mapper_transformer: None,
        decoder: TransformerConfig::new(12, 2, 3, true),
        lstm: None,
        vision: None,
        prompt: Default::default(),
        max_len: 9,
        vocab_size: VOCAB,
        specials,
        prefix_predicts_first: false,
        raw_embeddings: false,
    };
    let mut model = Captioner::new(b, config, 5).unwrap();
    // Weights larger than the initialisation: every id, <pad> and <bos>
    // too, would have mass without the mask.
    for (i, value) in model.params_mut().values.iter_mut().enumerate() {
        let v: Vec<f32> = random(value.len(), 90 + i as u64)
            .iter()
            .map(|x| 0.6 * x)
            .collect();
        b.write(value, &v);
    }
    model
}

/// The teacher-forced log-softmax rows `[captions * positions, vocab]`
/// of `generated` (f64, from the read-back logits) and the inputs' width.
fn teacher_forced<B: Backend>(
    b: &B,
    model: &mut Captioner<B>,
    features: &[f32],
    generated: &[Generated],
) -> (Vec<Vec<f64>>, usize, Vec<Vec<u32>>) {
    let start = model.config.specials.start;
    let sequences: Vec<Vec<u32>> = generated
        .iter()
        .map(|g| {
            std::iter::once(start)
                .chain(g.ids.iter().copied())
                .collect()
        })
        .collect();
    let dim = model.config.embed_dim;
    let rows: Vec<f32> = generated
        .iter()
        .flat_map(|g| features[g.image * dim..(g.image + 1) * dim].to_vec())
        .collect();
    let inputs = TokenInputs::new(b, &model.config, &sequences).unwrap();
    model.forward(b, &rows, &inputs).unwrap();
    let logits = b.to_vec(model.logits());
    let logp = logits
        .chunks(VOCAB)
        .map(|z| {
            let max = z.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
            let lse = max + z.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            z.iter().map(|&x| x as f64 - lse).collect()
        })
        .collect();
    (logp, inputs.positions, sequences)
}

fn check_policy<B: Backend>(b: &B, what: &str, specials: SpecialIds) {
    let mut model = random_captioner(b, specials);
    let features = random(4 * 6, 7);
    let sampling = Decoding::Sample {
        n: 3,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 11,
    };
    let options = DecodeOptions::default();
    let samples = generate(b, &model, &features, &sampling, &options).unwrap();
    let (logp, positions, sequences) = teacher_forced(b, &mut model, &features, &samples);
    for (r, row) in logp.iter().enumerate() {
        for id in specials.masked() {
            assert_eq!(
                row[id as usize].exp(),
                0.0,
                "{what}: row {r}: id {id} has mass"
            );
        }
        // The end of a caption is never masked (a masked logit is MASKED_LOGIT).
        assert!(
            row[specials.end as usize] > f64::from(MASKED_LOGIT) / 2.0,
            "{what}: row {r}: the end id is masked"
        );
        let total: f64 = row.iter().map(|lp| lp.exp()).sum();
        assert!(
            (total - 1.0).abs() < 1e-9,
            "{what}: row {r} sums to {total}"
        );
    }
    // Each sample's recorded log-probability is the teacher-forced one.
    for (n, g) in samples.iter().enumerate() {
        let forced: f64 = (g.ids.iter().enumerate())
            .map(|(t, &id)| logp[n * positions + t][id as usize])
            .sum();
        assert!(
            (forced - g.logprob as f64).abs() < 1e-4 * (1.0 + forced.abs()),
            "{what}: sample {n}: recorded {} vs teacher-forced {forced}",
            g.logprob
        );
    }

    // With <unk> suppressed (a vocabulary that has one), the recorded
    // log-probability is renormalised over the ids that remain.
    let has_unk = specials == SpecialIds::WORDS;
    let suppressed = DecodeOptions {
        suppress_unk: has_unk,
        ..DecodeOptions::default()
    };
    let greedy = generate(b, &model, &features, &Decoding::Greedy, &suppressed).unwrap();
    let (logp, positions, _) = teacher_forced(b, &mut model, &features, &greedy);
    for (n, g) in greedy.iter().enumerate() {
        assert!(
            !has_unk || !g.ids.contains(&UNK),
            "{what}: <unk> chosen while suppressed"
        );
        let renormalised: f64 = (g.ids.iter().enumerate())
            .map(|(t, &id)| {
                let row = &logp[n * positions + t];
                let unk = if has_unk {
                    row[UNK as usize].exp()
                } else {
                    0.0
                };
                row[id as usize] - (1.0 - unk).ln()
            })
            .sum();
        assert!(
            (renormalised - g.logprob as f64).abs() < 1e-4 * (1.0 + renormalised.abs()),
            "{what}: greedy {n}: recorded {} vs renormalised {renormalised}",
            g.logprob
        );
    }

    // A negative advantage (with the entropy bonus too) puts no gradient
    // on the masked ids' logits: nothing moves probability onto them.
    let (logp, positions, _) = teacher_forced(b, &mut model, &features, &samples);
    assert_eq!(logp.len(), samples.len() * positions);
    let targets = teacher_targets(&sequences, positions, specials.pad);
    let mut surrogate = Surrogate::new(b, samples.len(), positions, VOCAB, specials.pad);
    let advantages = vec![-1.0f32; samples.len()];
    surrogate.forward_backward(
        b,
        model.logits(),
        &b.ids(&targets),
        &targets,
        &advantages,
        0.1,
        true,
    );
    let d = b.to_vec(&surrogate.d_logits);
    let mut moved = 0.0f32;
    for (r, row) in d.chunks(VOCAB).enumerate() {
        if targets[r] == specials.pad {
            continue;
        }
        moved = moved.max(row.iter().fold(0.0f32, |m, x| m.max(x.abs())));
        for id in specials.masked() {
            assert_eq!(
                row[id as usize], 0.0,
                "{what}: row {r}: gradient on id {id}"
            );
        }
    }
    assert!(moved > 0.0, "{what}: the surrogate has a gradient");
    // No padding; the start only where it is the end, and the end only
    // last, in sampled, greedy and beam-searched captions alike.
    let beam = Decoding::Beam {
        width: 3,
        n_best: 2,
    };
    let beamed = generate(b, &model, &features, &beam, &options).unwrap();
    for g in samples.iter().chain(&greedy).chain(&beamed) {
        assert!(!g.ids.contains(&specials.pad), "{what}: {:?}", g.ids);
        let body = &g.ids[..g.ids.len() - 1];
        assert!(
            !body.contains(&specials.start) && !body.contains(&specials.end),
            "{what}: {:?}",
            g.ids
        );
    }
    let ended = samples
        .iter()
        .filter(|g| g.ids.last() == Some(&specials.end));
    assert!(ended.count() > 0, "{what}: no sample chose the end");
}

#[test]
fn one_policy_on_both_backends() {
    check_policy(&CpuBackend::new(), "cpu", SpecialIds::WORDS);
    if let Some(g) = gpu() {
        check_policy(&g, "gpu", SpecialIds::WORDS);
    }
}

#[test]
fn one_policy_when_the_start_is_the_end() {
    assert_eq!(START_IS_END.masked_distinct().len(), 1);
    check_policy(&CpuBackend::new(), "cpu", START_IS_END);
    if let Some(g) = gpu() {
        check_policy(&g, "gpu", START_IS_END);
    }
}

/// `--suppress-unk` is refused for a vocabulary without `<unk>`, such as
/// GPT-2's, instead of banning whatever id 3 is there.
#[test]
fn suppressing_unk_is_refused_without_unk() {
    let b = CpuBackend::new();
    let model = random_captioner(&b, START_IS_END);
    let options = DecodeOptions {
        suppress_unk: true,
        ..DecodeOptions::default()
    };
    let features = random(6, 3);
    let Err(e) = generate(&b, &model, &features, &Decoding::Greedy, &options) else {
        panic!("suppressing <unk> in a vocabulary without one");
    };
    assert!(e.to_string().contains("no <unk>"), "{e}");
}
