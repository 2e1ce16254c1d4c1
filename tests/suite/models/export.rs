//! `captune export`: a captioner written as a Hugging Face GPT-2 folder.
//! Read back with captune's own GPT-2 reader (which checks config.json the
//! way it checks any GPT-2), every decoder tensor is the captioner's, bit
//! for bit; the mapper file holds the mapper with its shape; the tokenizer
//! encodes and decodes captions with the captioner's ids; the generation
//! config suppresses the ids the policy masks. A GPT-2 captioner's export
//! starts the same captioner again. The command refuses to replace a
//! folder unless asked. Where python3 has torch and transformers,
//! scripts/check_export.py loads a frozen GPT-2 run's export with
//! transformers itself: no weight missing or left over, every tensor and
//! the config the original GPT-2's, and eval's captions decoded again.

use crate::common;

use captune::backend::Backend;
use captune::captioner::decoders::prefix::is_mapper_param;
use captune::captioner::model::Captioner;
use captune::captioner::pretrained::{self, PrefixShape};
use captune::captioner::run::RunConfig;
use captune::captioner::{CaptionVocab, Checkpoint, MapperTransformer, export};
use captune::cpu::CpuBackend;
use captune::model::gpt2;
use captune::model::layers::Activation;
use captune::tensorfile;
use common::{TINY_DIM, random, tiny_data};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

fn temp(name: &str) -> PathBuf {
    crate::common::fresh_temp(&format!("export-{name}"))
}

/// A tiny captioner with ClipCap's tanh mapper and random weights, saved.
fn saved_checkpoint(b: &CpuBackend, path: &std::path::Path) -> Checkpoint<CpuBackend> {
    let data = tiny_data();
    let mut run = RunConfig::preset("tiny").unwrap();
    run.model.mapper_activation = Activation::Tanh;
    let vocab = CaptionVocab::build(&data.data, 1).unwrap();
    let mut model = Captioner::new(b, run.captioner(TINY_DIM, vocab.len()), 3).unwrap();
    for (i, value) in model.params_mut().values.iter_mut().enumerate() {
        let v = random(value.len(), 40 + i as u64);
        b.write(value, &v);
    }
    let ck = Checkpoint { model, vocab };
    ck.save(b, path, HashMap::new()).unwrap();
    ck
}

#[test]
fn an_export_reads_back_as_the_same_gpt2_mapper_and_vocabulary() {
    let b = CpuBackend::new();
    let dir = temp("lib");
    std::fs::create_dir_all(&dir).unwrap();
    let ck = saved_checkpoint(&b, &dir.join("checkpoint.safetensors"));
    let out = dir.join("hf");
    export::to_hf(&b, &ck, &out, None).unwrap();

    let read = gpt2::read(&out, "decoder").unwrap();
    let c = ck.model.config;
    assert_eq!(read.config.n_positions, c.seq_len());
    assert_eq!(read.config.vocab_size, c.vocab_size);
    let mut decoder = read.weights;
    let mut mapper = tensorfile::read(&out.join(export::MAPPER_FILE)).unwrap();
    for (spec, value) in ck
        .model
        .params()
        .specs
        .iter()
        .zip(&ck.model.params().values)
    {
        let file = if is_mapper_param(&spec.name) {
            &mut mapper
        } else {
            &mut decoder
        };
        let tensor = file.tensors.remove(&spec.name);
        let tensor = tensor.unwrap_or_else(|| panic!("{} is not in the export", spec.name));
        assert_eq!(tensor.shape, spec.shape, "{}", spec.name);
        assert_eq!(tensor.data, b.to_vec(value), "{} differs", spec.name);
    }
    assert!(mapper.tensors.is_empty() && decoder.tensors.is_empty());
    assert_eq!(mapper.metadata["activation"], "tanh");
    assert_eq!(mapper.metadata["prefix_len"], c.prefix_len.to_string());

    let tokenizer = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let words = ["a", "red", "circle", "zebraish"];
    let encoding = tokenizer.encode(words.join(" "), false).unwrap();
    let want: Vec<u32> = words
        .iter()
        .map(|w| ck.vocab.word_list().unwrap().id(w))
        .collect();
    assert_eq!(encoding.get_ids(), want, "unknown words go to <unk> too");
    let known = &want[..3];
    assert_eq!(tokenizer.decode(known, true).unwrap(), "a red circle");

    let generation: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(generation["suppress_tokens"], serde_json::json!([0, 1]));
    assert_eq!(generation["eos_token_id"], 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_command_exports_a_run_and_replaces_only_when_asked() {
    let b = CpuBackend::new();
    let dir = temp("cli");
    std::fs::create_dir_all(&dir).unwrap();
    saved_checkpoint(&b, &dir.join("checkpoint.safetensors"));
    let out = dir.join("hf");
    let export = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_captune"))
            .arg("export")
            .arg(&dir)
            .arg("--hf")
            .arg(&out)
            .args(extra)
            .output()
            .unwrap()
    };
    let first = export(&[]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(gpt2::read(&out, "decoder").is_ok());
    let again = export(&[]);
    assert!(!again.status.success());
    let why = String::from_utf8_lossy(&again.stderr);
    assert!(why.contains("--overwrite"), "{why}");
    let replaced = export(&["--overwrite"]);
    assert!(
        replaced.status.success(),
        "{}",
        String::from_utf8_lossy(&replaced.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A captioner started from a GPT-2 folder, exported, and started again
/// from the export (`captune train --decoder hf:EXPORT`) is the same
/// captioner, bit for bit: the padding row captune adds comes off on
/// export and back on import, the mapper comes back from its file, and
/// the tokenizer is the original's.
#[test]
fn a_gpt2_captioner_comes_back_from_its_export() {
    let out = gpt2_round_trip(None, "gpt2");
    std::fs::remove_dir_all(&out).unwrap();
}

/// The same with ClipCap's transformer mapper; a run with the MLP is told
/// the export holds a transformer mapper.
#[test]
fn a_gpt2_captioner_with_the_transformer_mapper_comes_back_from_its_export() {
    let mapper = MapperTransformer {
        clip_len: 3,
        layers: 2,
        heads: 4,
    };
    let out = gpt2_round_trip(Some(mapper), "gpt2-transformer");
    let mlp = PrefixShape {
        embed_dim: TINY_DIM,
        prefix_len: 2,
        mapper_hidden: 16,
        mapper_transformer: None,
        max_len: 20,
    };
    let Err(e) = pretrained::from_folder(&CpuBackend::new(), &out, mlp, 6) else {
        panic!("a transformer mapper loaded into an MLP run");
    };
    let e = format!("{e:#}");
    assert!(
        e.contains("mapper is transformer but the run's is mlp"),
        "{e}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// Exports a captioner made from the tiny GPT-2 with `mapper` and starts
/// it again from the export; returns the export's folder.
fn gpt2_round_trip(mapper: Option<MapperTransformer>, name: &str) -> PathBuf {
    let b = CpuBackend::new();
    let gpt2_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let shape = PrefixShape {
        embed_dim: TINY_DIM,
        prefix_len: 2,
        mapper_hidden: 16,
        mapper_transformer: mapper,
        max_len: 20,
    };
    let ck = pretrained::from_folder(&b, &gpt2_dir, shape, 5).unwrap();
    let out = temp(name);
    export::to_hf(&b, &ck, &out, None).unwrap();
    let original = std::fs::read(gpt2_dir.join("tokenizer.json")).unwrap();
    assert_eq!(std::fs::read(out.join("tokenizer.json")).unwrap(), original);
    let read = gpt2::read(&out, "decoder").unwrap();
    assert_eq!(read.config.vocab_size, ck.model.config.vocab_size - 1);

    let back = pretrained::from_folder(&b, &out, shape, 6).unwrap();
    assert_eq!(back.model.config, ck.model.config);
    assert_eq!(back.vocab, ck.vocab);
    for ((spec, a), z) in (ck.model.params().specs.iter())
        .zip(&ck.model.params().values)
        .zip(&back.model.params().values)
    {
        assert_eq!(b.to_vec(a), b.to_vec(z), "{}", spec.name);
    }
    // A run of another shape is told which.
    let other = PrefixShape {
        mapper_hidden: 32,
        ..shape
    };
    let Err(e) = pretrained::from_folder(&b, &out, other, 6) else {
        panic!("a mapper of 16 hidden units loaded into a run of 32");
    };
    let e = format!("{e:#}");
    assert!(e.contains("mapper_hidden is 16 but the run's is 32"), "{e}");
    out
}

fn gpt2_tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny")
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every tensor of two GPT-2 folders, read under captune's names, bit for
/// bit.
fn assert_same_gpt2(got: &std::path::Path, want: &std::path::Path) {
    let (got, want) = (
        gpt2::read(got, "d").unwrap(),
        gpt2::read(want, "d").unwrap(),
    );
    assert_eq!(got.weights.tensors.len(), want.weights.tensors.len());
    for (name, w) in &want.weights.tensors {
        let g = &got.weights.tensors[name];
        assert_eq!(g.shape, w.shape, "{name}");
        let same = g
            .data
            .iter()
            .zip(&w.data)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name} differs");
    }
}

/// A captioner whose decoder came from a GPT-2 (of 32 positions, here
/// using 21), exported with that folder: the GPT-2 again, whole. Its
/// config.json is the folder's, every field kept, with captune's prefix
/// and caption lengths added; its position table has all 32 rows, the
/// trained ones first; an untrained (or frozen) decoder comes out bit for
/// bit as it went in. A folder of another shape is refused by name.
#[test]
fn a_gpt2_decoder_exports_as_the_whole_gpt2_it_came_from() {
    let b = CpuBackend::new();
    let shape = PrefixShape {
        embed_dim: TINY_DIM,
        prefix_len: 2,
        mapper_hidden: 16,
        mapper_transformer: None,
        max_len: 20,
    };
    let mut ck = pretrained::from_folder(&b, &gpt2_tiny(), shape, 5).unwrap();
    let out = temp("whole");
    export::to_hf(&b, &ck, &out, Some(&gpt2_tiny())).unwrap();
    let mut want = json(&gpt2_tiny().join("config.json"));
    want["captune_prefix_len"] = 2.into();
    want["captune_caption_positions"] = 19.into();
    assert_eq!(json(&out.join("config.json")), want);
    assert_eq!(
        json(&out.join("generation_config.json")),
        json(&gpt2_tiny().join("generation_config.json"))
    );
    assert_same_gpt2(&out, &gpt2_tiny());

    // Trained positions are the first rows; the GPT-2's own follow.
    let at = ck
        .model
        .params()
        .specs
        .iter()
        .position(|s| s.name == "decoder.positions")
        .unwrap();
    let trained: Vec<f32> = random(ck.model.params().values[at].len(), 7);
    b.write(&mut ck.model.params_mut().values[at], &trained);
    export::to_hf(&b, &ck, &out, Some(&gpt2_tiny())).unwrap();
    let (got, original) = (
        gpt2::read(&out, "d").unwrap(),
        gpt2::read(&gpt2_tiny(), "d").unwrap(),
    );
    let rows = &got.weights.tensors["d.positions"];
    assert_eq!(rows.shape, [32, 32]);
    assert_eq!(&rows.data[..trained.len()], trained.as_slice());
    assert_eq!(
        &rows.data[trained.len()..],
        &original.weights.tensors["d.positions"].data[trained.len()..]
    );
    // Without the folder: the captioner's 21 positions and a config of its own.
    export::to_hf(&b, &ck, &out, None).unwrap();
    let alone = json(&out.join("config.json"));
    assert_eq!(
        (alone["n_positions"].as_u64(), alone.get("attn_pdrop")),
        (Some(21), None)
    );
    assert_eq!(alone["captune_caption_positions"], 19);

    // Another GPT-2 is refused, naming its config and the field.
    let other = temp("other-gpt2");
    std::fs::create_dir_all(&other).unwrap();
    for file in [
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    ] {
        std::fs::copy(gpt2_tiny().join(file), other.join(file)).unwrap();
    }
    let mut config = json(&gpt2_tiny().join("config.json"));
    config["n_head"] = 8.into();
    std::fs::write(other.join("config.json"), config.to_string()).unwrap();
    let e = export::to_hf(&b, &ck, &out, Some(&other)).err().unwrap();
    let e = format!("{e:#}");
    assert!(
        e.contains("config.json") && e.contains("n_head is 8"),
        "{e}"
    );
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_dir_all(&other).unwrap();
}

/// As a user meets it: `captune train --decoder hf:GPT2 --freeze-decoder`,
/// then `captune export RUN --hf OUT`, which finds the GPT-2 in the run's
/// record: the export's decoder is that GPT-2, bit for bit, with its
/// config. Given no folder and none recorded, it says what it leaves out.
#[test]
fn a_frozen_gpt2_run_exports_its_gpt2_bit_for_bit() {
    let dir = temp("frozen-run");
    let _ = std::fs::remove_dir_all(&dir);
    let run = dir.join("run");
    let decoder = format!("hf:{}", gpt2_tiny().display());
    let out = Command::new(env!("CARGO_BIN_EXE_captune"))
        .args([
            "--device", "cpu", "train", "--preset", "tiny", "--epochs", "1",
        ])
        .args(["--decoder", &decoder, "--freeze-decoder", "--out"])
        .arg(&run)
        .args(common::TINY_WORLD_ARGS)
        .env("CAPTUNE_CACHE", dir.join("cache"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let export = |from: &std::path::Path, hf: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_captune"))
            .arg("export")
            .arg(from)
            .arg("--hf")
            .arg(hf)
            .output()
            .unwrap()
    };
    let hf = dir.join("hf");
    let done = export(&run, &hf);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_same_gpt2(&hf, &gpt2_tiny());
    let config = json(&hf.join("config.json"));
    assert_eq!(
        (
            config["n_positions"].as_u64(),
            config["attn_pdrop"].as_f64()
        ),
        (Some(32), Some(0.1))
    );
    // transformers itself: the folder loads as it is, its decoder is the
    // GPT-2's, and it decodes the captions captune's eval gave.
    if let Some(python) = common::python_with_transformers() {
        let results = dir.join("results.json");
        let eval = Command::new(env!("CARGO_BIN_EXE_captune"))
            .args(["--device", "cpu", "eval", "--checkpoint"])
            .arg(run.join("checkpoint.safetensors"))
            .args(["--split", "val", "--results"])
            .arg(&results)
            .env("CAPTUNE_CACHE", dir.join("cache"))
            .output()
            .unwrap();
        assert!(
            eval.status.success(),
            "{}",
            String::from_utf8_lossy(&eval.stderr)
        );
        let features: Vec<PathBuf> = std::fs::read_dir(dir.join("cache/features"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(features.len(), 1, "{features:?}");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/check_export.py");
        let check = Command::new(python)
            .arg(&script)
            .arg(&hf)
            .arg("--same-as")
            .arg(gpt2_tiny())
            .arg("--features")
            .arg(&features[0])
            .arg("--results")
            .arg(&results)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&check.stdout);
        assert!(
            check.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&check.stderr)
        );
        assert!(said.contains("bit for bit"), "{said}");
        assert!(said.contains("16 of 16 captions identical"), "{said}");
    }
    // The checkpoint file alone carries no record of its GPT-2.
    let alone = dir.join("alone");
    let done = export(&run.join("checkpoint.safetensors"), &alone);
    assert!(done.status.success());
    let note = String::from_utf8_lossy(&done.stderr);
    assert!(note.contains("--decoder hf:FOLDER"), "{note}");
    std::fs::remove_dir_all(&dir).unwrap();
}
