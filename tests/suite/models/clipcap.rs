//! A ClipCap MLE step with a Hugging Face GPT-2 as the captioner's
//! decoder: on the tiny random GPT-2 of tests/data/gpt2-tiny, with the
//! mapper weights, image embeddings and BPE captions that
//! scripts/clipcap_fixtures.py gave transformers (float64), captune's
//! logits at every real position, its MLE loss and every parameter's
//! gradient match transformers' on the CPU and on the GPU. The
//! gradients of the mapper are those a frozen decoder passes back too.
//! The padding row captune adds to GPT-2's embedding stays masked and
//! gets no gradient. The same holds with ClipCap's transformer mapper.
//! A ClipCap fine-tuned by transformers
//! (scripts/clipcap_decode_fixtures.py) gives transformers' greedy and
//! beam captions, with its beam log-probabilities, on both backends.

use crate::common;

use captune::backend::Backend;
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::decoders::prefix::is_mapper_param;
use captune::captioner::inputs::{MASKED_LOGIT, TokenInputs, teacher_targets};
use captune::captioner::model::Captioner;
use captune::captioner::objectives::token::{BatchTargets, Losses, TokenObjective};
use captune::captioner::pretrained::{self, PrefixShape};
use captune::captioner::{CaptionVocab, Checkpoint, MapperTransformer, clipcap, export};
use captune::cpu::CpuBackend;
use captune::model::gpt2;
use captune::tensorfile::{self, TensorFile};
use rand::SeedableRng;
use std::path::Path;

/// The MLP mapper's step.
const MLP_STEP: &str = "clipcap_step_expected.safetensors";
/// The transformer mapper's step.
const TRANSFORMER_STEP: &str = "clipcap_transformer_step_expected.safetensors";

/// The fixture at `path` in tests/data.
fn expected(path: &str) -> TensorFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(path);
    tensorfile::read(&path).unwrap()
}

/// What captune computes for the fixture's step: the logits of the real
/// positions (`[rows, vocab + 1]`), the loss, and each parameter's name
/// and gradient.
struct Step {
    logits: Vec<f32>,
    loss: f32,
    grads: Vec<(String, Vec<f32>)>,
}

fn clipcap_step<B: Backend>(b: &B, want: &TensorFile) -> Step {
    let shape: serde_json::Value = serde_json::from_str(&want.metadata["shape"]).unwrap();
    let field = |k: &str| shape[k].as_u64().unwrap() as usize;
    let mapper_transformer = shape.get("clip_len").map(|_| MapperTransformer {
        clip_len: field("clip_len"),
        layers: field("layers"),
        heads: field("heads"),
    });
    let shape = PrefixShape {
        embed_dim: field("embed_dim"),
        prefix_len: field("prefix_len"),
        mapper_hidden: field("mapper_hidden"),
        mapper_transformer,
        max_len: field("max_len"),
    };
    let end: u32 = want.metadata["end"].parse().unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let gpt2 = gpt2::read(&dir, "decoder").unwrap();
    let mut model = pretrained::from_gpt2(b, gpt2, shape, end, 0).unwrap();
    let params = model.params_mut();
    for (spec, value) in params.specs.iter().zip(&mut params.values) {
        if is_mapper_param(&spec.name) {
            b.write(value, &want.tensors[&spec.name].data);
        }
    }
    step_of(b, &mut model, want, shape.max_len)
}

/// One MLE step of `model` on the fixture's features and ids (captions of
/// at most `max_len` positions).
fn step_of<B: Backend>(b: &B, model: &mut Captioner<B>, want: &TensorFile, max_len: usize) -> Step {
    let c = model.config;
    let sequences = common::padded_ids(&want.tensors["ids"].data, max_len);
    let inputs = TokenInputs::new(b, &c, &sequences).unwrap();
    let steps = inputs.positions;
    let targets = teacher_targets(&sequences, steps, c.specials.pad);
    // MLE reads no word of the vocabulary (only first-token shifting does).
    let words = CaptionVocab::from_words(Vec::new());
    let objective = TokenObjective::mle();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let batch = BatchTargets::new(b, &objective, &words, &c, &targets, steps, &mut rng).unwrap();
    let mut losses = Losses::new(b, objective, inputs.rows(), c.vocab_size);
    model
        .forward(b, &want.tensors["features"].data, &inputs)
        .unwrap();
    losses.forward_backward(b, model.logits(), &batch, true);
    model.params_mut().zero_grads(b);
    model.backward(b, &inputs, &losses.d_logits);
    let loss = losses.read(b, &batch).loss;
    let all = b.to_vec(model.logits());
    let v = c.vocab_size;
    let logits = sequences
        .iter()
        .enumerate()
        .flat_map(|(s, seq)| (0..seq.len() - 1).map(move |t| s * steps + t))
        .flat_map(|row| all[row * v..(row + 1) * v].to_vec())
        .collect();
    let grads = model
        .params()
        .specs
        .iter()
        .zip(&model.params().grads)
        .map(|(spec, g)| (spec.name.clone(), b.to_vec(g)))
        .collect();
    Step {
        logits,
        loss,
        grads,
    }
}

fn matches_transformers<B: Backend>(b: &B, file: &str, what: &str) {
    let want = expected(file);
    let got = clipcap_step(b, &want);
    assert_same_step(&got, &want, what);
}

/// `got` has the fixture's logits (and the padding column masked), loss
/// and gradients, the padding row none.
fn assert_same_step(got: &Step, want: &TensorFile, what: &str) {
    let expected_logits = &want.tensors["logits"];
    let v = expected_logits.shape[1];
    let rows = expected_logits.shape[0];
    // GPT-2's ids, then the padding column, masked.
    let (ours, pad): (Vec<f32>, Vec<f32>) = {
        let (mut ours, mut pad) = (Vec::new(), Vec::new());
        for row in got.logits.chunks(v + 1) {
            ours.extend(&row[..v]);
            pad.push(row[v]);
        }
        (ours, pad)
    };
    assert_eq!(pad.len(), rows, "{what}");
    assert!(
        pad.iter().all(|&z| z <= MASKED_LOGIT * 0.99),
        "{what}: {pad:?}"
    );
    let d = common::relative_difference(&ours, &expected_logits.data);
    assert!(d < 1e-5, "{what}: logits differ by {d} of their largest");
    let loss = want.tensors["loss"].data[0];
    assert!(
        (got.loss - loss).abs() < 1e-5 * loss.abs(),
        "{what}: loss {} vs transformers' {loss}",
        got.loss
    );
    let expected_grads = want
        .tensors
        .keys()
        .filter(|k| k.starts_with("grad."))
        .count();
    assert_eq!(
        got.grads.len(),
        expected_grads,
        "{what}: one gradient per parameter"
    );
    for (name, grad) in &got.grads {
        let expected = &want.tensors[&format!("grad.{name}")].data;
        let grad = if name == "decoder.tokens" {
            let (ours, pad_row) = grad.split_at(expected.len());
            assert!(
                pad_row.iter().all(|&g| g == 0.0),
                "{what}: the padding row moved"
            );
            ours
        } else {
            grad
        };
        let d = common::relative_difference(grad, expected);
        assert!(
            d < 1e-5,
            "{what}: {name}'s gradient differs by {d} of its largest"
        );
    }
}

#[test]
fn a_clipcap_step_matches_transformers_on_both_backends() {
    matches_transformers(&CpuBackend::new(), MLP_STEP, "cpu");
    if let Some(g) = common::gpu() {
        matches_transformers(&g, MLP_STEP, "gpu");
    }
}

/// ClipCap's transformer mapper (ReLU blocks, bias-free q, k, v, learned
/// constants, no final norm), against the script's PyTorch version of it
/// with ClipCap's separate query and key-value weights.
#[test]
fn a_clipcap_step_with_the_transformer_mapper_matches_on_both_backends() {
    matches_transformers(&CpuBackend::new(), TRANSFORMER_STEP, "cpu");
    if let Some(g) = common::gpu() {
        matches_transformers(&g, TRANSFORMER_STEP, "gpu");
    }
}

/// A prefix and captions longer than GPT-2's positions are refused,
/// naming both and what to shorten.
#[test]
fn a_prefix_and_captions_past_gpt2_s_positions_are_refused() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let gpt2 = gpt2::read(&dir, "decoder").unwrap();
    let shape = PrefixShape {
        embed_dim: 8,
        prefix_len: 10,
        mapper_hidden: 16,
        mapper_transformer: None,
        max_len: 24,
    };
    let Err(e) = pretrained::from_gpt2(&CpuBackend::new(), gpt2, shape, 0, 0) else {
        panic!("33 positions fit in 32");
    };
    let e = e.to_string();
    assert!(
        e.contains("33 positions") && e.contains("has 32 (n_positions)"),
        "{e}"
    );
}

/// Greedy and beam captions (width 3) of the fine-tuned ClipCap in
/// tests/data/clipcap-tiny, made by scripts/clipcap_decode_fixtures.py
/// with transformers (beam search by its own `generate`), for image
/// embeddings it was trained on and some it never saw.
fn decodes_as_transformers<B: Backend>(b: &B, what: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clipcap-tiny");
    let want = tensorfile::read(&dir.join("decode_expected.safetensors")).unwrap();
    let meta = |key: &str| want.metadata[key].parse::<usize>().unwrap();
    let shape = PrefixShape {
        embed_dim: 8,
        prefix_len: 4,
        mapper_hidden: 32,
        mapper_transformer: None,
        max_len: meta("max_len"),
    };
    let ck = pretrained::from_folder(b, &dir, shape, 0).unwrap();
    let features = &want.tensors["features"].data;
    let images = features.len() / shape.embed_dim;
    let rows = |name: &str| -> Vec<Vec<u32>> {
        (want.tensors[name].data.chunks(shape.max_len))
            .map(|r| {
                r.iter()
                    .take_while(|&&x| x >= 0.0)
                    .map(|&x| x as u32)
                    .collect()
            })
            .collect()
    };
    let options = DecodeOptions::default();
    let greedy = generate(b, &ck.model, features, &Decoding::Greedy, &options).unwrap();
    let beam = Decoding::Beam {
        width: meta("beams"),
        n_best: 1,
    };
    let beamed = generate(b, &ck.model, features, &beam, &options).unwrap();
    let (want_greedy, want_beam) = (rows("greedy"), rows("beam"));
    let beam_logp = &want.tensors["beam_logp"].data;
    assert_eq!(greedy.len(), images);
    let mut differ = 0;
    for i in 0..images {
        assert_eq!(greedy[i].ids, want_greedy[i], "{what}: greedy, image {i}");
        assert_eq!(beamed[i].ids, want_beam[i], "{what}: beam, image {i}");
        let gap = (beamed[i].logprob - beam_logp[i]).abs();
        assert!(
            gap < 1e-3,
            "{what}: beam log-probability of image {i} off by {gap}"
        );
        differ += usize::from(want_greedy[i] != want_beam[i]);
    }
    // The fixture tells the two searches apart, and holds captions that
    // end before the maximum length.
    assert!(differ > 0, "greedy and beam agree on every image");
    assert!(
        want_greedy
            .iter()
            .any(|g| g.len() > 3 && g.len() < shape.max_len - 1)
    );
}

/// ClipCap's own checkpoints, made by its authors' code
/// (`scripts/clipcap_original_fixtures.py`: ClipCaptionModel with its MLP
/// or transformer mapper, saved with the attention buffers released
/// checkpoints hold), read with the tiny GPT-2 folder's config and
/// tokenizer: no start is fed and "." ends a caption; the logits that
/// predict each piece and the stop, the loss, every gradient and the
/// greedy captions are ClipCap's.
fn reads_clipcap_s_own_checkpoint<B: Backend>(b: &B, kind: &str, what: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let original = dir.join("clipcap-original");
    let want = tensorfile::read(&original.join(format!("{kind}_expected.safetensors"))).unwrap();
    let max_len: usize = want.metadata["max_len"].parse().unwrap();
    let stop: u32 = want.metadata["stop"].parse().unwrap();
    let file = original.join(format!("{kind}.pt"));
    let mut ck = clipcap::read(b, &file, &dir.join("gpt2-tiny"), max_len).unwrap();
    let c = ck.model.config;
    assert!(c.prefix_predicts_first, "{what}");
    // The MLP reads CLIP's embeddings as they come, the transformer mapper normalised ones.
    assert_eq!(c.raw_embeddings, kind == "mlp", "{what}");
    assert_eq!((c.specials.start, c.specials.end), (stop, stop), "{what}");
    assert_eq!((c.embed_dim, c.prefix_len), (128, 4), "{what}");
    let mapper = c
        .mapper_transformer
        .map(|t| (t.clip_len, t.layers, t.heads));
    match kind {
        "mlp" => assert_eq!((mapper, c.mapper_hidden), (None, 64), "{what}"),
        _ => assert_eq!((mapper, c.mapper_hidden), (Some((3, 2, 8)), 64), "{what}"),
    }
    let got = step_of(b, &mut ck.model, &want, max_len);
    assert_same_step(&got, &want, &format!("{what}, {kind}"));

    let greedy = greedy_ids(b, &ck, &want.tensors["features"].data);
    let expected = common::padded_ids(&want.tensors["greedy"].data, max_len - 1);
    assert_eq!(greedy, expected, "{what}, {kind}: greedy captions");
    assert_eq!(ck.vocab.decode(&greedy[1]), "two girls play", "{what}");
}

#[test]
fn clipcap_s_own_checkpoints_read_and_decode_as_clipcap_on_both_backends() {
    for kind in ["mlp", "transformer"] {
        reads_clipcap_s_own_checkpoint(&CpuBackend::new(), kind, "CPU");
        if let Some(g) = common::gpu() {
            reads_clipcap_s_own_checkpoint(&g, kind, "GPU");
        }
    }
}

#[test]
fn greedy_and_beam_captions_match_transformers_on_both_backends() {
    decodes_as_transformers(&CpuBackend::new(), "CPU");
    if let Some(g) = common::gpu() {
        decodes_as_transformers(&g, "GPU");
    }
}

/// `train --decoder clipcap:FILE.pt --gpt2 FOLDER` fine-tunes ClipCap's
/// own checkpoint on a tiny world: the run records both, its checkpoints
/// keep ClipCap's layout (no start fed, captions ending at "."), and
/// `eval`, `--resume` and `caption` read them. Without --gpt2 it is
/// refused, naming the flag.
#[test]
fn a_run_starts_from_clipcap_s_own_checkpoint() {
    let dir = common::fresh_temp("clipcap-original-run");
    let (run, cache) = (dir.join("run"), dir.join("cache"));
    let captune = |args: &[&str]| common::captune_on_cpu(&cache, args);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let decoder = format!("clipcap:{}", data.join("clipcap-original/mlp.pt").display());
    let gpt2 = data.join("gpt2-tiny").display().to_string();
    let run_arg = run.display().to_string();
    let mut train = vec!["train", "--preset", "tiny", "--epochs", "1"];
    train.extend(["--decoder", &decoder, "--out", &run_arg]);
    train.extend(common::TINY_WORLD_ARGS);
    let (ok, _, err) = captune(&train);
    assert!(!ok && err.contains("--gpt2 FOLDER"), "{err}");
    train.extend(["--gpt2", &gpt2]);
    let (ok, _, err) = captune(&train);
    assert!(ok, "{err}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains(&format!("gpt2 = {gpt2:?}")), "{config}");
    let checkpoint = run.join("checkpoint.safetensors");
    let metadata = tensorfile::read_metadata(&checkpoint).unwrap();
    let model: serde_json::Value = serde_json::from_str(&metadata["captioner_config"]).unwrap();
    assert_eq!(model["prefix_predicts_first"], serde_json::json!(true));
    assert_eq!(metadata["caption_end"], ".");

    let checkpoint = checkpoint.display().to_string();
    let eval = ["eval", "--checkpoint", &checkpoint, "--split", "val"];
    let (ok, out, err) = captune(&eval);
    assert!(ok && out.contains("CIDEr-D"), "{err}");
    let resume = ["train", "--resume", "--epochs", "1", "--out", &run_arg];
    let (ok, _, err) = captune(&resume);
    assert!(ok, "{err}");
    let picture = data.join("clip-images/wide.png").display().to_string();
    let (ok, out, err) = captune(&["caption", "--checkpoint", &checkpoint, &picture]);
    assert!(ok, "{err}");
    assert!(out.starts_with(&format!("{picture}\t")), "{out}");

    // The export keeps the layout: read back, it decodes as the run does.
    let export = dir.join("export");
    let export_arg = export.display().to_string();
    let (ok, _, err) = captune(&["export", &run_arg, "--hf", &export_arg]);
    assert!(ok, "{err}");
    let b = CpuBackend::new();
    let trained = Checkpoint::load(&b, Path::new(&checkpoint)).unwrap();
    let exported = pretrained::from_export(&b, &export).unwrap();
    assert_same_captioner(&b, &exported, &trained);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A captioner that reads image embeddings unnormalised (ClipCap's MLP)
/// gets the data's unit rows times the norms their encoder gave them;
/// another gets the unit rows; without recorded norms it is refused,
/// saying how to get them.
#[test]
fn an_mlp_from_clipcap_reads_embeddings_as_their_encoder_gave_them() {
    let b = CpuBackend::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let file = dir.join("clipcap-original/mlp.pt");
    let ck = clipcap::read(&b, &file, &dir.join("gpt2-tiny"), 12).unwrap();
    let mut c = ck.model.config;
    let mut data = common::tiny_data();
    let items = [1, 3];
    let unit = data.features_of(&items);
    let err = format!(
        "{:#}",
        data.inputs_of(&items, c.embedding_reading()).unwrap_err()
    );
    assert!(err.contains("captune embed"), "{err}");
    let norms: Vec<f32> = (0..data.data.items.len()).map(|i| 2.0 + i as f32).collect();
    data.norms = Some(norms);
    let raw = data.inputs_of(&items, c.embedding_reading()).unwrap();
    let want: Vec<f32> = (unit.chunks(data.dim).zip([3.0, 5.0]))
        .flat_map(|(row, norm)| row.iter().map(move |x| x * norm))
        .collect();
    assert_eq!(raw, want);
    c.raw_embeddings = false;
    assert_eq!(data.inputs_of(&items, c.embedding_reading()).unwrap(), unit);
}

/// `captune convert --clipcap FILE.pt --gpt2 FOLDER` writes the folder
/// `captune export` writes; read back as `hf:DIR` it is the checkpoint as
/// read directly (config, vocabulary, greedy captions), and `eval
/// --checkpoint hf:DIR` scores it on a tiny world, its results beside the
/// folder.
#[test]
fn convert_writes_clipcap_s_checkpoint_as_an_export() {
    let dir = common::fresh_temp("clipcap-convert");
    let cache = dir.join("cache");
    let captune = |args: &[&str]| common::captune_on_cpu(&cache, args);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let file = data.join("clipcap-original/mlp.pt");
    let (gpt2, out) = (data.join("gpt2-tiny"), dir.join("out"));
    let (file_arg, gpt2_arg) = (file.display().to_string(), gpt2.display().to_string());
    let out_arg = out.display().to_string();
    let convert = ["convert", "--clipcap", &file_arg, "--gpt2", &gpt2_arg];
    let (ok, _, err) = captune(&[&convert[..], &["--max-len", "12", "--out", &out_arg]].concat());
    assert!(ok, "{err}");
    let b = CpuBackend::new();
    let direct = clipcap::read(&b, &file, &gpt2, 12).unwrap();
    let converted = pretrained::from_export(&b, &out).unwrap();
    assert_same_captioner(&b, &converted, &direct);
    // Exported without the GPT-2 folder, the positions are the captioner's alone.
    let bare = dir.join("bare");
    export::to_hf(&b, &direct, &bare, None).unwrap();
    assert_same_captioner(&b, &pretrained::from_export(&b, &bare).unwrap(), &direct);

    let hf = format!("hf:{out_arg}");
    let mut eval = vec!["eval", "--checkpoint", &hf, "--split", "val"];
    eval.extend(common::TINY_WORLD_ARGS);
    let (ok, stdout, err) = captune(&eval);
    assert!(ok && stdout.contains("CIDEr-D"), "{err}");
    let results = std::fs::read_to_string(dir.join("results-val.json")).unwrap();
    let results: Vec<serde_json::Value> = serde_json::from_str(&results).unwrap();
    // caption and inspect read the folder too.
    let picture = data.join("clip-images/wide.png").display().to_string();
    let (ok, out, err) = captune(&["caption", "--checkpoint", &hf, &picture]);
    assert!(ok && out.starts_with(&format!("{picture}\t")), "{err}");
    let image = results[0]["image_id"].to_string().replace('"', "");
    let mut inspect = vec!["inspect", "--checkpoint", &hf, "--image", &image];
    inspect.extend(["--caption", "a red circle"]);
    inspect.extend(common::TINY_WORLD_ARGS);
    let (ok, out, err) = captune(&inspect);
    assert!(ok && out.lines().count() > 2, "{err}{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `got` is `want` read back: the same config and vocabulary, and the
/// same greedy captions of the ClipCap fixture's embeddings.
fn assert_same_captioner(
    b: &CpuBackend,
    got: &Checkpoint<CpuBackend>,
    want: &Checkpoint<CpuBackend>,
) {
    assert_eq!(got.model.config, want.model.config);
    assert_eq!(got.vocab, want.vocab);
    let fixture = expected("clipcap-original/mlp_expected.safetensors");
    let features = &fixture.tensors["features"].data;
    assert_eq!(greedy_ids(b, got, features), greedy_ids(b, want, features));
}

/// The greedy captions' ids of `ck` for `features`.
fn greedy_ids<B: Backend>(b: &B, ck: &Checkpoint<B>, features: &[f32]) -> Vec<Vec<u32>> {
    let options = DecodeOptions::default();
    let captions = generate(b, &ck.model, features, &Decoding::Greedy, &options).unwrap();
    captions.into_iter().map(|g| g.ids).collect()
}
