//! A Hugging Face CLIP read as captune's retriever, against transformers:
//! on the tiny random CLIPModel of tests/data/clip-tiny (made by
//! scripts/clip_fixtures.py, which also wrote what transformers computes
//! with it in float64), the image embeddings of three images, the text
//! embeddings of three id sequences of different lengths and the scaled
//! cosine similarities between them match on the CPU and on the GPU.
//! Two pictures preprocessed as CLIP's image processor does give its
//! pixels and so its embeddings; captions tokenised by the folder's
//! tokenizer give its ids and so its text embeddings. Folders captune cannot compute are
//! refused, naming the file and the field or tensor.

use crate::common;

use captune::backend::Backend;
use captune::captioner::CaptionVocab;
use captune::captioner::listener::{
    Relaxation, RelaxedListener, VocabMap, negative_cosine, read_caption,
};
use captune::cpu::CpuBackend;
use captune::data::clip_text::ClipTokenizer;
use captune::data::image_processor::ImageProcessor;
use captune::data::vocab::EOS;
use captune::model::retriever::TextBatch;
use captune::model::token_tower::TokenTower;
use captune::model::{clip, vision};
use captune::retriever::frozen::{CLIP_PREFIX, FrozenRetriever};
use captune::tensorfile;
use std::path::{Path, PathBuf};

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-tiny")
}

fn normalized(rows: &[f32], dim: usize) -> Vec<Vec<f32>> {
    rows.chunks(dim)
        .map(|r| {
            let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter().map(|x| x / n).collect()
        })
        .collect()
}

fn expected() -> tensorfile::TensorFile {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip_tiny_expected.safetensors");
    tensorfile::read(&path).unwrap()
}

fn matches_transformers<B: Backend>(b: &B, what: &str) {
    let want = expected();
    let clip = clip::read(&folder()).unwrap();
    let config = clip.retriever;
    let mut model = clip.into_retriever(b, 3).unwrap();
    let size = config.image_size as usize;
    let patches = vision::patches_of_pixels(
        &want.tensors["pixel_values"].data,
        size,
        config.patch as usize,
    );
    model.encode_images(b, &patches).unwrap();
    let images = b.to_vec(model.image_embeddings());
    let d = common::relative_difference(&images, &want.tensors["image_embeds"].data);
    assert!(
        d < 1e-5,
        "{what}: image embeddings differ by {d} of their largest"
    );

    let width = want.tensors["input_ids"].shape[1];
    let captions: Vec<Vec<u32>> = want.tensors["input_ids"]
        .data
        .chunks(width)
        .zip(&want.tensors["lengths"].data)
        .map(|(row, &n)| row[..n as usize].iter().map(|&x| x as u32).collect())
        .collect();
    let batch = TextBatch::new(b, &config, &captions).unwrap();
    model.encode_texts(b, &batch).unwrap();
    let texts = b.to_vec(model.text_embeddings());
    let d = common::relative_difference(&texts, &want.tensors["text_embeds"].data);
    assert!(
        d < 1e-5,
        "{what}: text embeddings differ by {d} of their largest"
    );

    let scale = b.to_vec(model.params.value(model.log_scale))[0].exp();
    let e = config.embed_dim;
    let (images, texts) = (normalized(&images, e), normalized(&texts, e));
    let logits: Vec<f32> = images
        .iter()
        .flat_map(|i| {
            texts
                .iter()
                .map(move |t| scale * i.iter().zip(t).map(|(a, b)| a * b).sum::<f32>())
        })
        .collect();
    let d = common::relative_difference(&logits, &want.tensors["logits_per_image"].data);
    assert!(
        d < 1e-5,
        "{what}: logits_per_image differ by {d} of their largest"
    );
}

/// The fixture's captions: one longer than the text tower's 16 positions.
const CAPTIONS: [&str; 3] = [
    "A black dog is running through the grass .",
    "Two girls play",
    "A man in a red shirt climbs a rock wall while another man watches from below .",
];

/// Captions through the folder's tokenizer.json give transformers' ids
/// (the long one cut to 16 with its end kept), and their text embeddings
/// match on both backends.
#[test]
fn captions_tokenise_and_embed_as_transformers_does() {
    let want = expected();
    let config = clip::read(&folder()).unwrap().retriever;
    let tokenizer = ClipTokenizer::load(&folder(), config.max_len).unwrap();
    let ids: Vec<Vec<u32>> = CAPTIONS
        .iter()
        .map(|c| tokenizer.encode(c).unwrap())
        .collect();
    let width = want.tensors["caption_ids"].shape[1];
    let expected_ids = common::padded_ids(&want.tensors["caption_ids"].data, width);
    assert_eq!(ids, expected_ids);
    assert_eq!(ids[2].len(), 16, "cut to the tower's positions");
    let check = |got: Vec<f32>, what: &str| {
        let d = common::relative_difference(&got, &want.tensors["caption_embeds"].data);
        assert!(
            d < 1e-5,
            "{what}: caption embeddings differ by {d} of their largest"
        );
    };
    check(text_embeddings(&CpuBackend::new(), &ids), "cpu");
    if let Some(g) = common::gpu() {
        check(text_embeddings(&g, &ids), "gpu");
    }
}

fn text_embeddings<B: Backend>(b: &B, ids: &[Vec<u32>]) -> Vec<f32> {
    let clip = clip::read(&folder()).unwrap();
    let config = clip.retriever;
    let mut model = clip.into_retriever(b, ids.len()).unwrap();
    let batch = TextBatch::new(b, &config, ids).unwrap();
    model.encode_texts(b, &batch).unwrap();
    b.to_vec(model.text_embeddings())
}

#[test]
fn clip_equals_transformers_on_both_backends() {
    matches_transformers(&CpuBackend::new(), "cpu");
    if let Some(g) = common::gpu() {
        matches_transformers(&g, "gpu");
    }
}

/// The pictures of tests/data/clip-images through the folder's
/// preprocessor_config.json: transformers' `CLIPImageProcessor` (its PIL
/// backend) made the same floats from them, since the resize is Pillow's
/// bicubic to the byte (measured difference 0); the embeddings of those
/// pixels match on both backends.
#[test]
fn preprocessing_gives_the_image_processor_s_pixels() {
    let want = expected();
    let processor = ImageProcessor::load(&folder()).unwrap();
    assert_eq!((processor.size, processor.crop), (40, Some(32)));
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images");
    let pixels: Vec<f32> = ["wide.png", "tall.png"]
        .iter()
        .flat_map(|name| processor.pixels(&image::open(images.join(name)).unwrap().to_rgb8()))
        .collect();
    let expected_pixels = &want.tensors["processed_pixels"].data;
    assert_eq!(pixels.len(), expected_pixels.len());
    let worst = pixels
        .iter()
        .zip(expected_pixels)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    // One byte is 1 / 255 / std, about 0.015 here: 1e-5 means the same bytes.
    assert!(worst < 1e-5, "pixels differ by {worst}");
    let patches = vision::patches_of_pixels(&pixels, 32, 8);
    let check = |got: Vec<f32>, what: &str| {
        let d = common::relative_difference(&got, &want.tensors["processed_embeds"].data);
        assert!(
            d < 1e-5,
            "{what}: embeddings differ by {d} of their largest"
        );
    };
    check(embeddings(&CpuBackend::new(), &patches), "cpu");
    if let Some(g) = common::gpu() {
        check(embeddings(&g, &patches), "gpu");
    }
}

/// The image tower's tokens, every token through `post_layernorm` (the
/// tokens an attention LSTM reads), equal transformers' on both backends,
/// from pixels and from the pictures through the folder's processor.
#[test]
fn the_image_tower_s_tokens_equal_transformers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/clip_tiny_tokens_expected.safetensors");
    let want = tensorfile::read(&path).unwrap();
    let pixels = &expected().tensors["pixel_values"].data;
    let check = |got: Vec<f32>, name: &str, what: &str| {
        let d = common::relative_difference(&got, &want.tensors[name].data);
        assert!(d < 1e-5, "{what}: {name} differ by {d} of their largest");
    };
    let pictures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images");
    let files = [pictures.join("wide.png"), pictures.join("tall.png")];
    let files: Vec<&Path> = files.iter().map(|f| f.as_path()).collect();
    let cpu = CpuBackend::new();
    let mut tower = TokenTower::open(&cpu, &folder()).unwrap();
    let shape = tower.shape();
    assert_eq!(
        (shape.tokens, shape.dim),
        (17, 32),
        "16 patches after the class token"
    );
    let patches = vision::patches_of_pixels(pixels, 32, 8);
    check(
        tower.image_tokens(&cpu, &patches).unwrap(),
        "image_tokens",
        "cpu",
    );
    check(
        tower.tokens_of_files(&cpu, &files).unwrap(),
        "processed_tokens",
        "cpu",
    );
    if let Some(g) = common::gpu() {
        let mut tower = TokenTower::open(&g, &folder()).unwrap();
        check(
            tower.image_tokens(&g, &patches).unwrap(),
            "image_tokens",
            "gpu",
        );
    }
}

/// The tiny CLIP's image embeddings of `patches`.
fn embeddings<B: Backend>(b: &B, patches: &[f32]) -> Vec<f32> {
    let mut model = clip::read(&folder()).unwrap().into_retriever(b, 2).unwrap();
    model.encode_images(b, patches).unwrap();
    b.to_vec(model.image_embeddings())
}

/// A copy of the tiny CLIP's folder with its config.json edited by
/// `edit`, or its weights without `drop`.
fn altered(name: &str, edit: impl Fn(&mut serde_json::Value), drop: Option<&str>) -> PathBuf {
    let dir = crate::common::fresh_temp(&format!("clip-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(folder().join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut weights = tensorfile::read(&folder().join("model.safetensors")).unwrap();
    if let Some(name) = drop {
        weights.tensors.remove(name).unwrap();
    }
    let views: Vec<(&str, Vec<usize>, &[f32])> = weights
        .tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t.shape.clone(), t.data.as_slice()))
        .collect();
    tensorfile::write(&dir.join("model.safetensors"), &views, Default::default()).unwrap();
    dir
}

#[test]
fn folders_captune_cannot_compute_are_refused_naming_what() {
    let refused = |dir: &Path| {
        let Err(e) = clip::read(dir) else {
            panic!("{} was read", dir.display());
        };
        std::fs::remove_dir_all(dir).unwrap();
        format!("{e:#}")
    };
    let e = refused(&altered(
        "type",
        |c| c["model_type"] = "siglip".into(),
        None,
    ));
    assert!(e.contains("config.json") && e.contains("\"siglip\""), "{e}");
    let e = refused(&altered(
        "act",
        |c| c["vision_config"]["hidden_act"] = "silu".into(),
        None,
    ));
    assert!(
        e.contains("vision_config.hidden_act") && e.contains("\"silu\""),
        "{e}"
    );
    let e = refused(&altered(
        "missing",
        |_| {},
        Some("vision_model.pre_layrnorm.weight"),
    ));
    assert!(
        e.contains("model.safetensors") && e.contains("vision_model.pre_layrnorm.weight"),
        "{e}"
    );
    let e = refused(&altered(
        "shape",
        |c| c["vision_config"]["intermediate_size"] = 64.into(),
        None,
    ));
    assert!(
        e.contains("mlp.fc1.weight") && e.contains("[64, 32]"),
        "{e}"
    );
}

/// `captune embed --clip FOLDER` on a data set of the two pictures and a
/// file that is no image: the features file holds the pictures' unit-norm
/// embeddings (transformers' `processed_embeds`, normalised) under their
/// ids, names CLIP as its encoder, and the other file is skipped with its
/// path said.
#[test]
fn embed_writes_a_features_file_from_clip() {
    let dir = crate::common::fresh_temp("clip-embed");
    let images = dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    let pictures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images");
    for name in ["wide.png", "tall.png"] {
        std::fs::copy(pictures.join(name), images.join(name)).unwrap();
    }
    std::fs::write(images.join("broken.png"), b"not a png").unwrap();
    let entry = |id: usize, file: &str| {
        serde_json::json!({"filename": file, "imgid": id, "split": "train", "sentids": [id],
            "sentences": [{"tokens": ["a", "picture"], "raw": "a picture", "imgid": id, "sentid": id}]})
    };
    let data = dir.join("data.json");
    let json = serde_json::json!({"dataset": "pictures",
        "images": [entry(0, "wide.png"), entry(1, "broken.png"), entry(2, "tall.png")]});
    std::fs::write(&data, json.to_string()).unwrap();
    let out = dir.join("clip.safetensors");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_captune"))
        .args(["--device", "cpu", "embed", "--clip"])
        .arg(folder())
        .arg("--data")
        .arg(format!("karpathy:{}", data.display()))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("broken.png"), "{stderr}");
    let features = captune::data::features::Features::load(&out, None).unwrap();
    assert_eq!(features.ids, ["0", "2"]);
    assert!(features.encoder.as_deref().unwrap().starts_with("clip:"));
    let want = expected();
    let e = features.dim;
    for (k, row) in normalized(&want.tensors["processed_embeds"].data, e)
        .iter()
        .enumerate()
    {
        let d = common::relative_difference(features.row(k), row);
        assert!(d < 1e-5, "image {k}: differs by {d}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `captune score --clip FOLDER`: CLIPScore and RefCLIPScore of two
/// candidates for the two pictures, with two references each, equal the
/// script's computation of Hessel et al.'s definitions with transformers
/// (the prompt, w = 2.5, the harmonic mean with the best reference).
#[test]
fn score_reports_clipscore_as_its_authors_define_it() {
    let dir = crate::common::fresh_temp("clip-score");
    let images = dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    let pictures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images");
    let candidates = [
        "a wide picture with a blue circle",
        "two girls play in the grass",
    ];
    let references = [
        [
            "a striped picture of a circle",
            "colours fade from left to right",
        ],
        ["a tall striped picture", "a dog runs through the water"],
    ];
    let mut entries = Vec::new();
    let mut results = Vec::new();
    for (id, name) in ["wide.png", "tall.png"].iter().enumerate() {
        std::fs::copy(pictures.join(name), images.join(name)).unwrap();
        let sentences: Vec<serde_json::Value> = references[id]
            .iter()
            .enumerate()
            .map(|(k, r)| {
                serde_json::json!({"tokens": r.split(' ').collect::<Vec<_>>(), "raw": r,
                    "imgid": id, "sentid": 2 * id + k})
            })
            .collect();
        entries.push(
            serde_json::json!({"filename": name, "imgid": id, "split": "test",
            "sentids": [2 * id, 2 * id + 1], "sentences": sentences}),
        );
        results.push(serde_json::json!({"image_id": id, "caption": candidates[id]}));
    }
    let data = dir.join("data.json");
    std::fs::write(
        &data,
        serde_json::json!({"dataset": "pictures", "images": entries}).to_string(),
    )
    .unwrap();
    let results_file = dir.join("results.json");
    std::fs::write(&results_file, serde_json::Value::from(results).to_string()).unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_captune"))
        .arg("score")
        .arg("--data")
        .arg(format!("karpathy:{}", data.display()))
        .arg("--results")
        .arg(&results_file)
        .arg("--clip")
        .arg(folder())
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let scores: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let want = expected();
    for (key, tensor) in [("CLIP-S", "clip_s"), ("RefCLIP-S", "ref_clip_s")] {
        let (got, want) = (
            scores[key].as_f64().unwrap(),
            f64::from(want.tensors[tensor].data[0]),
        );
        assert!(
            want > 0.05,
            "{key}: the fixture's figure is not floored at 0"
        );
        assert!(
            (got - want).abs() < 1e-5 * want,
            "{key}: {got} vs transformers' {want}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn frozen_clip<B: Backend>(b: &B) -> FrozenRetriever<B> {
    let named = PathBuf::from(format!("{CLIP_PREFIX}{}", folder().display()));
    FrozenRetriever::load(b, &named, 4).unwrap()
}

fn relevance_expected() -> tensorfile::TensorFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/clip_relevance_expected.safetensors");
    tensorfile::read(&path).unwrap()
}

fn relevance_vocab(want: &tensorfile::TensorFile) -> CaptionVocab {
    let words: Vec<String> = serde_json::from_str(&want.metadata["words"]).unwrap();
    CaptionVocab::from_words(words)
}

/// A captioner's caption, as a CLIP reads it, is CLIP's tokenizer's
/// encoding of its words: a word of several pieces reads as all of them,
/// in order; the caption stops at its end, an empty caption is the two
/// specials, and a long one is cut to the text tower's positions with the
/// end kept. A GPT-2 captioner's word of several pieces reaches CLIP as
/// the one word.
#[test]
fn captions_map_onto_clip_pieces_as_the_tokenizer_encodes_them() {
    let want = relevance_expected();
    let captioner = relevance_vocab(&want);
    let clip = frozen_clip(&CpuBackend::new());
    let map = VocabMap::new(&captioner, &clip.captions).unwrap();
    let tokenizer = ClipTokenizer::load(&folder(), clip.model.config.max_len).unwrap();
    let own = captioner.word_list().unwrap();
    let several = tokenizer.pieces("skateboarder").unwrap();
    assert!(several.len() > 1, "{several:?}");
    assert_eq!(map.pieces(own.id("skateboarder")), several);
    for text in [
        "a dog runs through the grass",
        "skateboarder girls play",
        "",
        "two girls play in the grass skateboarder qzxjvkwpfh a dog runs in the grass",
    ] {
        let ids: Vec<u32> = text
            .split_whitespace()
            .map(|w| own.id(w))
            .chain([EOS, own.id("dog")])
            .collect();
        let read = read_caption(&captioner, &clip.captions, &ids, clip.model.config.max_len);
        assert_eq!(read.unwrap(), tokenizer.encode(text).unwrap(), "{text:?}");
    }
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let bpe = captune::data::bpe::BpeVocab::load(&gpt2).unwrap();
    let pieces = CaptionVocab::from_tokenizer(bpe.clone(), bpe.len() + 1).unwrap();
    let text = "a skateboarder jumps";
    let words: Vec<String> = text.split(' ').map(String::from).collect();
    let ids = pieces.encode(&words, 16).unwrap();
    assert!(
        ids.len() > words.len() + 2,
        "a word of several pieces: {ids:?}"
    );
    let read = read_caption(
        &pieces,
        &clip.captions,
        &ids[1..],
        clip.model.config.max_len,
    );
    assert_eq!(read.unwrap(), tokenizer.encode(text).unwrap());
}

fn relaxed_step<B: Backend>(b: &B, relaxation: Relaxation, tau: f32) -> (f64, Vec<f32>) {
    let want = relevance_expected();
    let captioner = relevance_vocab(&want);
    let mut clip = frozen_clip(b);
    let map = VocabMap::new(&captioner, &clip.captions).unwrap();
    let mut listener = RelaxedListener::new(b, &clip.model, map);
    let images = &want.tensors["images"];
    let positions = want.tensors["captions"].shape[1];
    let captions = common::padded_ids(&want.tensors["captions"].data, positions);
    let seed: u64 = want.metadata["seed"].parse().unwrap();
    let logits = b.tensor(&want.tensors["logits"].data);
    let texts = listener
        .forward(
            b,
            &mut clip.model,
            &logits,
            &captions,
            positions,
            seed,
            tau,
            relaxation,
        )
        .unwrap();
    let (loss, _, d_texts) = negative_cosine(&images.data, &texts, images.shape[1]);
    let d_logits = b.to_vec(listener.backward(b, &mut clip.model, &d_texts));
    (loss, d_logits)
}

/// One CLIP-relevance step with the tiny CLIP as the listener, against
/// scripts/clip_fixtures.py (transformers' text tower, float64, fed the
/// relaxed inputs): the loss and the gradient at the captioner's logits,
/// straight-through and soft, on both backends. The captions hold words
/// CLIP reads as several pieces (one of ten, past the four that carry a
/// gradient), an empty caption and one cut at the tower's positions.
#[test]
fn clip_relevance_gradient_equals_transformers() {
    let want = relevance_expected();
    let check = |what: &str, (loss, d_logits): (f64, Vec<f32>), name: &str| {
        let expected_loss = want.tensors[&format!("{name}.loss")].data[0] as f64;
        assert!(
            (loss - expected_loss).abs() < 1e-5,
            "{what} {name}: loss {loss} against {expected_loss}"
        );
        let d =
            common::relative_difference(&d_logits, &want.tensors[&format!("{name}.d_logits")].data);
        assert!(
            d < 1e-5,
            "{what} {name}: d logits differ by {d} of their largest"
        );
    };
    let cases = [
        ("hard", Relaxation::StraightThrough, 1.0),
        ("soft", Relaxation::Soft, 0.5),
    ];
    for (name, relaxation, tau) in cases {
        check(
            "cpu",
            relaxed_step(&CpuBackend::new(), relaxation, tau),
            name,
        );
        if let Some(g) = common::gpu() {
            check("gpu", relaxed_step(&g, relaxation, tau), name);
        }
    }
}

fn captune(args: &[&str], cache: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_captune"))
        .args(["--device", "cpu"])
        .args(args)
        .env("CAPTUNE_CACHE", cache)
        .env_remove("CAPTUNE_DEVICE")
        .output()
        .unwrap()
}

/// Fails with the command's standard error unless it succeeded; returns it.
fn succeeded(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// `--retriever clip:FOLDER` through the commands, on a tiny shapes world
/// in a private cache: MLE on the image embeddings the CLIP computes (and
/// caches), then DiscriTune and CLIP relevance with the CLIP as their
/// listener (the run's recorded retriever), `eval` with self-retrieval
/// and CLIP-S beside the CLIPScore-style figure, and `caption` of an
/// image file through CLIP's preprocessing.
#[test]
fn a_clip_serves_as_the_retriever_of_every_command() {
    let dir = crate::common::fresh_temp("clip-commands");
    let cache = dir.join("cache");
    let clip = format!("{CLIP_PREFIX}{}", folder().display());
    let world = common::TINY_WORLD_ARGS;
    let train = |extra: &[&str], out: &Path| {
        let mut args = vec![
            "train", "--preset", "tiny", "--epochs", "1", "--batch", "16",
        ];
        args.extend(extra);
        args.extend(["--out", out.to_str().unwrap()]);
        captune(&args, &cache)
    };
    let mle = dir.join("mle");
    let mut args = vec!["--data", "shapes", "--retriever", &clip];
    args.extend(world);
    succeeded(&train(&args, &mle));
    let config = std::fs::read_to_string(mle.join("config.toml")).unwrap();
    assert!(config.contains("retriever = \"clip:"), "{config}");
    let ck = mle.join("checkpoint.safetensors");
    let ck = ck.to_str().unwrap();

    for objective in ["discritune", "clip-relevance"] {
        let run = dir.join(objective);
        let stderr = succeeded(&train(&["--init", ck, "--objective", objective], &run));
        assert!(
            stderr.contains("image embeddings from the cache"),
            "{stderr}"
        );
        let log = std::fs::read_to_string(run.join("log.jsonl")).unwrap();
        let series = if objective == "discritune" {
            "reward"
        } else {
            "cosine"
        };
        assert!(log.contains(&format!("\"{series}\"")), "{log}");
    }

    let tuned = dir.join("discritune/checkpoint.safetensors");
    let tuned = tuned.to_str().unwrap();
    let results = dir.join("results.json");
    let results = results.to_str().unwrap();
    let out = captune(
        &[
            "eval",
            "--checkpoint",
            tuned,
            "--split",
            "test",
            "--results",
            results,
            "--json",
        ],
        &cache,
    );
    succeeded(&out);
    let metrics: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "self_retrieval_r1",
        "p1_among_100",
        "clipscore",
        "refcompare",
    ] {
        assert!(
            metrics[key].is_number(),
            "eval --json lacks {key}: {metrics}"
        );
    }
    // eval's CLIP-S and RefCLIP-S are `score --clip`'s (held to
    // transformers above) of the captions eval wrote.
    let mut args = vec!["score", "--data", "shapes"];
    args.extend(world);
    args.extend(["--split", "test", "--results", results, "--clip"]);
    let folder = folder();
    args.extend([folder.to_str().unwrap(), "--json"]);
    let out = captune(&args, &cache);
    succeeded(&out);
    let scores: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["CLIP-S", "RefCLIP-S"] {
        let (e, s) = (
            metrics[key].as_f64().unwrap(),
            scores[key].as_f64().unwrap(),
        );
        // eval's image embeddings come from the cache, computed in other
        // batches than score's: equal to rounding.
        assert!(
            (e - s).abs() <= 1e-6 * s.abs(),
            "{key}: eval {e}, score {s}"
        );
    }
    let image = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images/wide.png");
    let out = captune(
        &["caption", "--checkpoint", tuned, image.to_str().unwrap()],
        &cache,
    );
    succeeded(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with(image.to_str().unwrap()), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}
