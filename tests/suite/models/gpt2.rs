//! A Hugging Face GPT-2 read into captune's decoder: on a tiny random
//! GPT-2 saved by transformers (tests/data/gpt2-tiny, made by
//! scripts/gpt2_fixtures.py), captune's transformer gives transformers'
//! final hidden states and logits for the same token ids, on the CPU and
//! on the GPU, and the folder's tokenizer gives transformers' ids. Bad
//! folders get errors naming the file and the tensor or field.

use crate::common;

use captune::backend::Backend;
use captune::cpu::CpuBackend;
use captune::data::bpe::{BpeVocab, END};
use captune::model::gpt2;
use captune::model::params::Params;
use captune::model::transformer::Transformer;
use captune::tensorfile;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny")
}

fn expected() -> tensorfile::TensorFile {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2_tiny_expected.safetensors");
    tensorfile::read(&path).unwrap()
}

/// The final hidden states `[batch, seq, width]` and the logits
/// `[batch, seq, vocab]` of GPT-2 read from `dir`, run on `b`.
fn run<B: Backend>(b: &B, dir: &Path, ids: &[u32], batch: usize) -> (Vec<f32>, Vec<f64>) {
    let gpt2 = gpt2::read(dir, "decoder").unwrap();
    let c = gpt2.config.clone();
    let mut weights = gpt2.weights;
    let wte = weights.tensors.remove("decoder.tokens").unwrap().data;
    let wpe = weights.tensors.remove("decoder.positions").unwrap().data;
    let mut params = Params::new(0);
    let decoder = Transformer::new(&mut params, "decoder", c.transformer());
    params.finish(b);
    params.load(b, dir, &mut weights).unwrap();
    assert!(weights.tensors.is_empty(), "every tensor is used");

    let (seq, w) = (ids.len() / batch, c.n_embd);
    let input: Vec<f32> = ids
        .iter()
        .enumerate()
        .flat_map(|(k, &id)| {
            let (t, id) = (k % seq, id as usize);
            (0..w).map(move |j| (id, t, j))
        })
        .map(|(id, t, j)| wte[id * w + j] + wpe[t * w + j])
        .collect();
    let mut acts = decoder.activations(b, batch, seq);
    b.write(acts.input(), &input);
    let mut out = b.zeros(batch * seq * w);
    decoder.forward(b, &params, &mut acts, None, &mut out);
    let hidden = b.to_vec(&out);
    let logits = hidden
        .chunks(w)
        .flat_map(|h| {
            wte.chunks(w).map(move |e| {
                h.iter()
                    .zip(e)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
            })
        })
        .collect();
    (hidden, logits)
}

fn max_difference(a: impl Iterator<Item = f64>, b: impl Iterator<Item = f64>) -> f64 {
    a.zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

fn matches_transformers<B: Backend>(b: &B, what: &str) {
    let mut want = expected();
    let ids_tensor = want.take("ids", Path::new("expected")).unwrap();
    let batch = ids_tensor.shape[0];
    let ids: Vec<u32> = ids_tensor.data.iter().map(|&x| x as u32).collect();
    let (hidden, logits) = run(b, &fixture(), &ids, batch);
    let want_hidden = &want.tensors["hidden"].data;
    let want_logits = &want.tensors["logits"].data;
    assert_eq!(hidden.len(), want_hidden.len());
    assert_eq!(logits.len(), want_logits.len());
    let dh = max_difference(
        hidden.iter().map(|&x| f64::from(x)),
        want_hidden.iter().map(|&x| f64::from(x)),
    );
    let dl = max_difference(
        logits.iter().copied(),
        want_logits.iter().map(|&x| f64::from(x)),
    );
    eprintln!("{what}: hidden states within {dh:.2e}, logits within {dl:.2e} of transformers");
    assert!(dh < 1e-4, "{what}: hidden states differ by {dh}");
    assert!(dl < 1e-4, "{what}: logits differ by {dl}");
}

#[test]
fn gpt2_equals_transformers_on_the_cpu() {
    matches_transformers(&CpuBackend, "cpu");
}

#[test]
fn gpt2_equals_transformers_on_the_gpu() {
    if let Some(gpu) = common::gpu() {
        matches_transformers(&gpu, "gpu");
    }
}

/// A copy of the fixture in a scratch folder, its config and tensors
/// changed by `edit`.
fn edited(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value, &mut tensorfile::TensorFile),
) -> PathBuf {
    let dir = crate::common::fresh_temp(&format!("gpt2-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
            .unwrap();
    let mut weights = tensorfile::read(&fixture().join("model.safetensors")).unwrap();
    edit(&mut config, &mut weights);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tensors: Vec<(&str, Vec<usize>, &[f32])> = weights
        .tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t.shape.clone(), t.data.as_slice()))
        .collect();
    tensorfile::write(&dir.join("model.safetensors"), &tensors, Default::default()).unwrap();
    dir
}

fn error(dir: &Path) -> String {
    match gpt2::read(dir, "decoder") {
        Ok(_) => panic!("{} was read", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn names_without_the_transformer_prefix_read_the_same() {
    // As GPT2Model (the hub's gpt2) saves them.
    let dir = edited("bare", |_, w| {
        w.tensors = std::mem::take(&mut w.tensors)
            .into_iter()
            .map(|(n, t)| (n.trim_start_matches("transformer.").to_string(), t))
            .collect();
    });
    let cpu = CpuBackend;
    let ids = [0u32, 33, 292, 347];
    assert_eq!(run(&cpu, &dir, &ids, 1).0, run(&cpu, &fixture(), &ids, 1).0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_folders_are_refused_naming_the_file_and_what_is_wrong() {
    let missing = edited("missing", |_, w| {
        w.tensors.remove("transformer.h.1.mlp.c_fc.bias");
    });
    let e = error(&missing);
    assert!(
        e.contains("model.safetensors") && e.contains("h.1.mlp.c_fc.bias"),
        "{e}"
    );

    let llama = edited("llama", |c, _| c["model_type"] = "llama".into());
    let e = error(&llama);
    assert!(e.contains("config.json") && e.contains("\"llama\""), "{e}");

    let wider = edited("wider", |c, _| c["n_embd"] = 64.into());
    let e = error(&wider);
    assert!(
        e.contains("wte.weight") && e.contains("[400, 32]") && e.contains("[400, 64]"),
        "{e}"
    );

    let relu = edited("relu", |c, _| c["activation_function"] = "relu".into());
    let e = error(&relu);
    assert!(e.contains("activation_function"), "{e}");

    let empty = crate::common::fresh_temp("gpt2-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = error(&empty);
    assert!(e.contains("no config.json"), "{e}");
    for dir in [missing, llama, wider, relu, empty] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// The captions as transformers' tokenizer gave them: `<|endoftext|>`,
/// then the pieces.
#[test]
fn the_tokenizer_gives_transformers_ids_and_decodes_back() {
    let vocab = BpeVocab::load(&fixture()).unwrap();
    assert_eq!(vocab.len(), 400);
    let want = expected();
    let captions: Vec<String> = serde_json::from_str(&want.metadata["captions"]).unwrap();
    let lengths: Vec<usize> = serde_json::from_str(&want.metadata["lengths"]).unwrap();
    let ids = &want.tensors["ids"];
    let width = ids.shape[1];
    for (k, caption) in captions.iter().enumerate() {
        let encoded = vocab.encode(caption, 64).unwrap();
        let theirs: Vec<u32> = ids.data[k * width..k * width + lengths[k]]
            .iter()
            .map(|&x| x as u32)
            .collect();
        // Theirs has no end: transformers' tokenizer adds no special token.
        assert_eq!(encoded[..encoded.len() - 1], theirs[..], "{caption:?}");
        assert_eq!(encoded.last(), Some(&vocab.end()));
        assert_eq!(vocab.decode(&encoded[1..]).unwrap(), *caption);
    }
    // Truncated to fit: the start, the first pieces, the end.
    let short = vocab.encode(&captions[0], 4).unwrap();
    assert_eq!(short.len(), 4);
    assert_eq!((short[0], short[3]), (vocab.end(), vocab.end()));
    assert!(vocab.encode("a dog", 2).is_err());
}

#[test]
fn pieces_join_into_words() {
    let vocab = BpeVocab::load(&fixture()).unwrap();
    let ids = vocab.encode("A dog runs through the grass .", 64).unwrap();
    let pieces = vocab.pieces(&ids);
    assert_eq!(pieces[0], END);
    assert_eq!(
        pieces[1..].concat(),
        format!("A dog runs through the grass .{END}")
    );
    let words: Vec<String> = vocab.words(&ids).into_iter().map(|(w, _)| w).collect();
    assert_eq!(
        words,
        [END, "A", "dog", "runs", "through", "the", "grass", ".", END]
    );
    // "runs" is more than one piece here ("run" "s"): its range says which.
    let (_, runs) = vocab
        .words(&ids)
        .into_iter()
        .find(|(w, _)| w == "runs")
        .unwrap();
    assert!(runs.len() > 1, "{:?}", &pieces[runs.clone()]);
    assert!(pieces[runs.start].starts_with(' '));
}

#[test]
fn a_folder_without_a_tokenizer_is_refused_naming_the_file() {
    let dir = crate::common::fresh_temp("bpe-none");
    std::fs::create_dir_all(&dir).unwrap();
    let e = format!("{:#}", BpeVocab::load(&dir).err().unwrap());
    assert!(e.contains("no tokenizer.json"), "{e}");
    std::fs::write(dir.join("tokenizer.json"), "{\"not\": \"a tokenizer\"}").unwrap();
    let e = format!("{:#}", BpeVocab::load(&dir).err().unwrap());
    assert!(
        e.contains("tokenizer.json") && e.contains("not a tokenizer"),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
