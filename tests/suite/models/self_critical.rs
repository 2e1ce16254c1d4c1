//! Self-critical training's own checkpoints, converted: each tiny random
//! model (FCModel, NewFCModel, Att2in2Model, UpDownModel) that
//! scripts/self_critical_fixtures.py trained and ran with
//! self-critical.pytorch's own classes (float64) gives, through captune's
//! conversion, its MLE loss, every parameter's gradient (its gradients
//! moved by the same conversion) and its greedy captions, on the CPU and
//! on the GPU; its word `UNK` decodes as `<unk>`.

use super::golden::{self, data};
use crate::common;

use captune::backend::Backend;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::self_critical::{self, TheirVocab};
use captune::captioner::{CaptionVocab, Checkpoint};
use captune::cpu::CpuBackend;
use captune::data::vocab::{BOS, EOS, PAD, UNK};
use captune::tensorfile::{self, Tensor, TensorFile};

/// Its `max_length` of 8 words, the start and the end.
const MAX_LEN: usize = 10;

/// Each fixture, and the image tokens its features have (none for FC).
const MODELS: [(&str, Option<usize>); 4] = [
    ("fc", None),
    ("newfc", None),
    ("att2in2", Some(5)),
    ("updown", Some(5)),
];

fn fixture(name: &str) -> std::path::PathBuf {
    data(&format!("self-critical/{name}"))
}

/// captune's id of self-critical's id `id` (0: the end).
fn our_id(vocab: &CaptionVocab, theirs: &[String], id: f32) -> u32 {
    match id as usize {
        0 => EOS,
        k => vocab.word_list().unwrap().id(&theirs[k - 1]),
    }
}

fn their_words() -> Vec<String> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("cocotalk.json")).unwrap()).unwrap();
    let table = json["ix_to_word"].as_object().unwrap();
    (1..=table.len())
        .map(|i| table[&i.to_string()].as_str().unwrap().to_string())
        .collect()
}

fn agrees_with_self_critical<B: Backend>(
    b: &B,
    backend: &str,
    (model, tokens): (&str, Option<usize>),
) {
    let backend = &format!("{backend}, {model}");
    let file = fixture(&format!("{model}.pth"));
    let mut ck: Checkpoint<B> =
        self_critical::read(b, &file, &fixture("cocotalk.json"), MAX_LEN, tokens).unwrap();
    let expected = tensorfile::read(&fixture(&format!("{model}_expected.safetensors"))).unwrap();
    let theirs = their_words();
    let c = ck.model.config;
    let steps = c.token_positions();
    // Each caption's targets: its words and the end, then padding.
    let targets: Vec<u32> = expected.tensors["targets"]
        .data
        .chunks(steps)
        .flat_map(|row| {
            let real = row.iter().take_while(|&&id| id >= 0.0);
            let ids: Vec<u32> = real.map(|&id| our_id(&ck.vocab, &theirs, id)).collect();
            let pad = steps - ids.len();
            ids.into_iter().chain(std::iter::repeat_n(PAD, pad))
        })
        .collect();
    assert!(targets.contains(&UNK), "a caption holds its UNK");
    let sequences: Vec<Vec<u32>> = targets
        .chunks(steps)
        .map(|row| {
            let real = row.iter().copied().take_while(|&id| id != PAD);
            std::iter::once(BOS).chain(real).collect()
        })
        .collect();
    let features = &expected.tensors["features"].data;
    let loss = golden::mle_step(b, &mut ck.model, &ck.vocab, features, &sequences);
    let want = expected.tensors["loss"].data[0];
    assert!(
        (loss - want).abs() <= 1e-5 * want,
        "{backend}: loss {loss} against self-critical's {want}"
    );
    let mut their_grads = TensorFile::new([]);
    for (name, t) in &expected.tensors {
        if let Some(param) = name.strip_prefix("grad.") {
            let copy = Tensor {
                shape: t.shape.clone(),
                data: t.data.clone(),
            };
            their_grads.tensors.insert(param.into(), copy);
        }
    }
    let vocab = TheirVocab::read(&fixture("cocotalk.json")).unwrap();
    let want_grads = self_critical::convert(their_grads, &vocab).unwrap();
    // Relative to the tensor's largest gradient, f32 against float64: the
    // FC model's within 1.2e-5 on both backends, the attention models'
    // (summed over the positions and the tokens) within 4.1e-5.
    let want = |name: &str| want_grads.tensors[name].data.as_slice();
    let whose = (backend.as_str(), "self-critical's");
    golden::assert_gradients_close(b, ck.model.params(), want, 5e-5, whose);
    let greedy = generate(
        b,
        &ck.model,
        features,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    let want: Vec<Vec<u32>> = common::padded_ids(&expected.tensors["greedy"].data, steps - 1)
        .into_iter()
        .map(|row| {
            let words = row.iter().map(|&id| our_id(&ck.vocab, &theirs, id as f32));
            words.chain([EOS]).collect()
        })
        .collect();
    let got: Vec<Vec<u32>> = greedy.into_iter().map(|g| g.ids).collect();
    assert_eq!(got, want, "{backend}: greedy captions");
}

#[test]
fn self_critical_models_convert_and_agree_with_its_code() {
    let gpu = common::gpu();
    for model in MODELS {
        agrees_with_self_critical(&CpuBackend::new(), "cpu", model);
        if let Some(g) = &gpu {
            agrees_with_self_critical(g, "gpu", model);
        }
    }
}

/// An attention model needs its token count; the FC model takes none.
#[test]
fn an_attention_model_needs_its_token_count() {
    let b = CpuBackend::new();
    let vocab = fixture("cocotalk.json");
    let refusal = |model: &str, tokens| {
        let read = self_critical::read(&b, &fixture(model), &vocab, MAX_LEN, tokens);
        read.err().expect("refused").to_string()
    };
    let err = refusal("updown.pth", None);
    assert!(err.contains("UpDownModel"), "{err}");
    let err = refusal("fc.pth", Some(5));
    assert!(err.contains("no image tokens"), "{err}");
}

/// The vocabulary's mistakes are named with the file.
#[test]
fn a_bad_vocabulary_is_refused_by_name() {
    let path = common::fresh_temp("cocotalk.json");
    for (json, says) in [
        (r#"{"ix_to_word": {"1": "a", "3": "b"}}"#, "without a gap"),
        (r#"{"ix_to_word": {"1": "a", "2": "a"}}"#, "has two ids"),
        (r#"{"ix_to_word": {"0": "a"}}"#, "not a word id"),
        (r#"{"ix_to_word": {"1": "<eos>"}}"#, "special tokens"),
        ("{\"ix_to_word\": {\"1\": \"##s\"}}", "reserves"),
        (r#"{"ix_to_word": {"1": "a", "01": "b"}}"#, "appears twice"),
        (r#"[1, 2]"#, "ix_to_word"),
    ] {
        std::fs::write(&path, json).unwrap();
        let err = TheirVocab::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("cocotalk.json") && err.contains(says),
            "{json}: {err}"
        );
    }
    std::fs::remove_file(&path).unwrap();
}

/// A vocabulary without `UNK`: `<unk>` is never chosen and moves no
/// probability (its bias far below), the other rows as with one.
#[test]
fn without_an_unk_word_unk_is_never_chosen() {
    let theirs = their_words();
    let renamed: serde_json::Map<String, serde_json::Value> = theirs
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let w = if w == "UNK" { "unknown" } else { w };
            ((i + 1).to_string(), w.into())
        })
        .collect();
    let path = common::fresh_temp("vocab.json");
    std::fs::write(&path, serde_json::to_string(&renamed).unwrap()).unwrap();
    let b = CpuBackend::new();
    let ck = self_critical::read(&b, &fixture("fc.pth"), &path, MAX_LEN, None).unwrap();
    std::fs::remove_file(&path).unwrap();
    let params = ck.model.params();
    let bias = params
        .specs
        .iter()
        .position(|s| s.name == "logit.bias")
        .unwrap();
    let bias = b.to_vec(&params.values[bias]);
    assert!(
        bias[UNK as usize] <= -1e4,
        "<unk>'s bias {}",
        bias[UNK as usize]
    );
    assert_eq!(ck.vocab.len(), 4 + theirs.len());
}

/// `captune convert --self-critical` writes the checkpoint the reader
/// makes, which loads as any captune checkpoint.
#[test]
fn convert_writes_a_checkpoint_that_loads() {
    let out = common::fresh_temp("converted.safetensors");
    let cache = common::fresh_temp("cache");
    let (model, vocab) = (fixture("fc.pth"), fixture("cocotalk.json"));
    let args = [
        "convert",
        "--self-critical",
        model.to_str().unwrap(),
        "--vocab",
        vocab.to_str().unwrap(),
        "--max-len",
        "10",
        "--out",
        out.to_str().unwrap(),
    ];
    let (ok, _, stderr) = common::captune_on_cpu(&cache, &args);
    assert!(ok, "convert failed: {stderr}");
    let b = CpuBackend::new();
    let loaded = Checkpoint::load(&b, &out).unwrap();
    std::fs::remove_file(&out).unwrap();
    let read = self_critical::read(&b, &model, &vocab, MAX_LEN, None).unwrap();
    assert_eq!(loaded.model.config, read.model.config);
    assert_eq!(loaded.vocab, read.vocab);
    let (a, b_) = (loaded.model.params(), read.model.params());
    for ((spec, x), y) in a.specs.iter().zip(&a.values).zip(&b_.values) {
        assert_eq!(b.to_vec(x), b.to_vec(y), "{}", spec.name);
    }
}

/// Models of its zoo that captune does not convert are named, whatever
/// tensors they share with those it does.
#[test]
fn other_models_are_refused_by_name() {
    let vocab = TheirVocab::read(&fixture("cocotalk.json")).unwrap();
    let tensor = || Tensor {
        shape: vec![1, 1],
        data: vec![0.0],
    };
    for (names, says) in [
        (&["img_embed.weight", "core.weight_ih_l0"][..], "ShowTell"),
        (
            &["core.att_lstm.weight_ih", "refiner.layers.0.w"][..],
            "AoA",
        ),
        (
            &["att_embed.0.weight", "att_embed.3.bias", "core.a2c.weight"][..],
            "use_bn",
        ),
        (&["logit.0.weight"][..], "logit_layers"),
        (
            &["encoder.layers.0.w"][..],
            "none of the self-critical models",
        ),
    ] {
        let file = TensorFile::new(names.iter().map(|n| (n.to_string(), tensor())));
        let err = self_critical::convert(file, &vocab)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(says), "{names:?}: {err}");
    }
}
