//! BLIP read from a Hugging Face folder (a tiny random
//! `BlipForConditionalGeneration`, scripts/blip_fixtures.py) against what
//! transformers computes with it in float64: the vision tower's image
//! tokens, and the text decoder's logits, MLE loss and the gradient of
//! every decoder tensor, on both backends; and the decoder's decoding over
//! the KV cache against its full forward.

use crate::common;

use captune::backend::Backend;
use captune::captioner::blip::{blip_checkpoint, from_blip};
use captune::captioner::decode::{DecodeOptions, Decoding, generate};
use captune::captioner::inputs::{MASKED_LOGIT, TokenInputs, teacher_targets};
use captune::captioner::model::Captioner;
use captune::captioner::{Checkpoint, Prompt, export};
use captune::cpu::CpuBackend;
use captune::data::image_processor::ImageProcessor;
use captune::model::blip::{self, BlipVision, text_decoder_tensors, vision_tensors};
use captune::model::vision::patches_of_pixels;
use captune::tensorfile::{self, TensorFile};
use common::{gpu, relative_difference};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Caption ids the decoder is made for: the start, up to five pieces, the
/// end; six positions fed.
const MAX_LEN: usize = 7;

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/blip-tiny")
}

fn expected() -> TensorFile {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/blip_tiny_expected.safetensors");
    tensorfile::read(&path).unwrap()
}

fn model<B: Backend>(b: &B) -> Captioner<B> {
    from_blip(
        b,
        blip::read(&folder()).unwrap(),
        MAX_LEN,
        Prompt::default(),
        false,
    )
    .unwrap()
}

/// The model with its vision tower, to train it (`--train-vision`).
fn model_with_vision<B: Backend>(b: &B) -> Captioner<B> {
    let blip = blip::read(&folder()).unwrap();
    from_blip(b, blip, MAX_LEN, Prompt::default(), true).unwrap()
}

/// The fixture's fed ids, each row up to its length.
fn fed(want: &TensorFile) -> Vec<Vec<u32>> {
    let ids = &want.tensors["input_ids"];
    let width = ids.shape[1];
    let lengths = &want.tensors["lengths"].data;
    ids.data
        .chunks(width)
        .zip(lengths)
        .map(|(row, &n)| row[..n as usize].iter().map(|&v| v as u32).collect())
        .collect()
}

/// Logits, loss and every parameter's gradient (by captune's names) of
/// one MLE step on the fixture's captions, whose targets are the fed ids
/// shifted by one and then the end id.
fn mle_step<B: Backend>(
    b: &B,
    mut m: Captioner<B>,
    images: &[f32],
) -> (Vec<f32>, f64, HashMap<String, Vec<f32>>) {
    let want = expected();
    let c = m.config;
    let sequences = fed(&want);
    let inputs = TokenInputs::new(b, &c, &sequences).unwrap();
    m.forward(b, images, &inputs).unwrap();
    let logits = b.to_vec(m.logits());
    // d loss / d logits = (softmax - one-hot) / real targets.
    let (t, v) = (inputs.positions, c.vocab_size);
    let real: usize = sequences.iter().map(Vec::len).sum();
    let mut d_logits = vec![0.0f32; logits.len()];
    let mut loss = 0.0f64;
    for (i, s) in sequences.iter().enumerate() {
        for p in 0..s.len() {
            let target = s.get(p + 1).copied().unwrap_or(c.specials.end) as usize;
            let row = &logits[(i * t + p) * v..(i * t + p + 1) * v];
            let max = row.iter().fold(f32::MIN, |a, &x| a.max(x)) as f64;
            let total: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            loss -= (row[target] as f64 - max - total.ln()) / real as f64;
            for (j, d) in d_logits[(i * t + p) * v..(i * t + p + 1) * v]
                .iter_mut()
                .enumerate()
            {
                let prob = (row[j] as f64 - max).exp() / total;
                *d = ((prob - f64::from(u8::from(j == target))) / real as f64) as f32;
            }
        }
    }
    m.params_mut().zero_grads(b);
    m.backward(b, &inputs, &b.tensor(&d_logits));
    let params = m.params();
    let grads = params
        .specs
        .iter()
        .zip(&params.grads)
        .map(|(s, g)| (s.name.clone(), b.to_vec(g)))
        .collect();
    (logits, loss, grads)
}

fn matches_transformers<B: Backend>(b: &B, what: &str) {
    let want = expected();
    let images = &want.tensors["image_tokens"].data;
    let (logits, loss, grads) = mle_step(b, model(b), images);
    // The fed positions' logits: transformers' outside the policy mask.
    let specials = model(b).config.specials;
    let expected_logits = &want.tensors["logits"];
    let (t, v) = (expected_logits.shape[1], expected_logits.shape[2]);
    let (mut got, mut wanted) = (Vec::new(), Vec::new());
    for (i, s) in fed(&want).iter().enumerate() {
        for p in 0..s.len() {
            for j in 0..v {
                let at = (i * t + p) * v + j;
                if specials.is_masked(j as u32) {
                    assert_eq!(
                        logits[at], MASKED_LOGIT,
                        "{what}: id {j} is outside the policy"
                    );
                } else {
                    got.push(logits[at]);
                    wanted.push(expected_logits.data[at]);
                }
            }
        }
    }
    let d = relative_difference(&got, &wanted);
    assert!(d < 1e-5, "{what}: logits differ by {d} of their largest");
    let want_loss = want.tensors["loss"].data[0] as f64;
    assert!(
        (loss - want_loss).abs() < 1e-5 * want_loss,
        "{what}: loss {loss}, transformers {want_loss}"
    );
    same_gradients(want, &grads, what);
}

/// Every gradient in `grads` (by captune's names) equals the fixture's
/// `grad.NAME` (by transformers' names) within 1e-4 of its largest: the
/// text decoder's, and the vision tower's where `grads` has them.
fn same_gradients(fixture: TensorFile, grads: &HashMap<String, Vec<f32>>, what: &str) {
    let config = blip::read(&folder()).unwrap().config;
    let mut fixture = fixture.tensors;
    let mut expected_grads = text_decoder_tensors(&config.text_config, MAX_LEN - 1, |name| {
        Ok(fixture.remove(&format!("grad.{name}")).unwrap())
    })
    .unwrap();
    if grads.keys().any(|name| name.starts_with("vision.")) {
        let mut vision = TensorFile::new(
            (fixture.into_iter())
                .filter_map(|(name, t)| Some((name.strip_prefix("grad.")?.to_string(), t))),
        );
        let v = &config.vision_config;
        let tensors = vision_tensors(v, &mut vision, Path::new("fixture")).unwrap();
        expected_grads.extend(tensors);
    }
    assert_eq!(
        expected_grads.len(),
        grads.len(),
        "{what}: every tensor has a gradient"
    );
    for (name, tensor) in expected_grads {
        let d = relative_difference(&grads[&name], &tensor.data);
        assert!(
            d < 1e-4,
            "{what}: the gradient of {name} differs by {d} of its largest"
        );
    }
}

/// One step of SMILE's recipe (0.01 MLE + 0.99 SMILE, the first token by
/// MLE) through the objective registry on the BLIP decoder: its loss and
/// every gradient equal what PyTorch computes in float64 on the same
/// image tokens and captions (scripts/blip_fixtures.py smile).
fn smile_matches_transformers<B: Backend>(b: &B, what: &str) {
    use captune::captioner::objective::{StepContext, TrainingBatch, TrainingCorpus};
    use captune::captioner::objectives::{self, settings::SettingValue};
    use rand::SeedableRng;
    let want = expected();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/blip_tiny_smile_expected.safetensors");
    let smile = tensorfile::read(&path).unwrap();
    let blip = blip::read(&folder()).unwrap();
    let mut ck = blip_checkpoint(b, &folder(), blip, (MAX_LEN, None), false);
    let ck = ck.as_mut().unwrap();
    let end = ck.model.config.specials.end;
    let sequences: Vec<Vec<u32>> = fed(&want)
        .into_iter()
        .map(|s| s.into_iter().chain([end]).collect())
        .collect();
    let settings = [
        (
            "first_token".to_string(),
            SettingValue::Choice("mle".into()),
        ),
        ("mle_weight".to_string(), SettingValue::Number(0.01)),
    ]
    .into_iter()
    .collect();
    let mut objective = objectives::build::<B>("smile", &settings, ck.vocab.len()).unwrap();
    let batch = TrainingBatch {
        inputs: want.tensors["image_tokens"].data.clone(),
        embeddings: None,
        sequences,
        images: vec![0, 1],
        labelled: None,
    };
    let corpus = TrainingCorpus::new("blip-smile", vec![Vec::new(); 2]);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    ck.model.params_mut().zero_grads(b);
    let mut cx = StepContext {
        b,
        model: &mut ck.model,
        vocab: &ck.vocab,
        batch: &batch,
        corpus: &corpus,
        gradient_weight: 1.0,
        retriever: None,
        rng: &mut rng,
        monitor: true,
    };
    objective.step(&mut cx).unwrap();
    let read: Vec<f32> = objective.logged().iter().map(|t| b.to_vec(t)[0]).collect();
    let loss = objective.report(&read)[0];
    assert_eq!(loss.0, "loss");
    let want_loss = smile.tensors["loss"].data[0];
    assert!(
        (loss.1 - want_loss).abs() < 1e-5 * want_loss,
        "{what}: loss {}, PyTorch {want_loss}",
        loss.1
    );
    let params = ck.model.params();
    let grads = (params.specs.iter())
        .zip(&params.grads)
        .map(|(s, g)| (s.name.clone(), b.to_vec(g)))
        .collect();
    same_gradients(smile, &grads, what);
}

#[test]
fn a_smile_step_on_blip_matches_pytorch_on_the_cpu() {
    smile_matches_transformers(&CpuBackend::new(), "CPU");
}

#[test]
fn a_smile_step_on_blip_matches_pytorch_on_the_gpu() {
    let Some(g) = gpu() else { return };
    smile_matches_transformers(&g, "GPU");
}

/// One MLE step of the whole model, from pixels through the vision tower
/// into the decoder (`--train-vision`): its loss and the gradient of every
/// tensor, the vision tower's included, equal what PyTorch computes in
/// float64 (scripts/blip_fixtures.py vision).
fn a_step_through_the_vision_tower_matches_transformers<B: Backend>(b: &B, what: &str) {
    let want = expected();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/blip_tiny_vision_expected.safetensors");
    let vision = tensorfile::read(&path).unwrap();
    let v = blip::read(&folder()).unwrap().config.vision_config;
    let pixels = &want.tensors["pixel_values"].data;
    let patches = patches_of_pixels(pixels, v.image_size, v.patch_size);
    let m = model_with_vision(b);
    assert_eq!(m.config.image_input_len() * 2, patches.len());
    let (_, loss, grads) = mle_step(b, m, &patches);
    let want_loss = vision.tensors["loss"].data[0] as f64;
    assert!(
        (loss - want_loss).abs() < 1e-5 * want_loss,
        "{what}: loss {loss}, transformers {want_loss}"
    );
    assert!(grads.keys().any(|n| n == "vision.patch_embed.weight"));
    same_gradients(vision, &grads, what);
}

#[test]
fn a_step_through_the_vision_tower_matches_transformers_on_the_cpu() {
    a_step_through_the_vision_tower_matches_transformers(&CpuBackend::new(), "CPU");
}

#[test]
fn a_step_through_the_vision_tower_matches_transformers_on_the_gpu() {
    let Some(g) = gpu() else { return };
    a_step_through_the_vision_tower_matches_transformers(&g, "GPU");
}

#[test]
fn the_blip_decoder_matches_transformers_on_the_cpu() {
    matches_transformers(&CpuBackend::new(), "CPU");
}

#[test]
fn the_blip_decoder_matches_transformers_on_the_gpu() {
    let Some(g) = gpu() else { return };
    matches_transformers(&g, "GPU");
}

fn image_tokens_match<B: Backend>(b: &B, what: &str) {
    let want = expected();
    let mut blip = blip::read(&folder()).unwrap();
    let v = blip.config.vision_config.clone();
    let mut vision = BlipVision::new(b, &folder(), &mut blip).unwrap();
    let patches = patches_of_pixels(
        &want.tensors["pixel_values"].data,
        v.image_size,
        v.patch_size,
    );
    let tokens = vision.image_tokens(b, &patches).unwrap();
    let d = relative_difference(&tokens, &want.tensors["image_tokens"].data);
    assert!(
        d < 1e-5,
        "{what}: image tokens differ by {d} of their largest"
    );
}

/// Two pictures (one wide, one tall) through the folder's
/// preprocessor_config.json: the pixels BlipImageProcessor's PIL backend
/// makes (both sides resized to 32 by Pillow's bicubic, no crop), and
/// their image tokens.
#[test]
fn preprocessing_and_the_vision_tower_give_transformers_image_tokens() {
    let want = expected();
    let processor = ImageProcessor::load(&folder()).unwrap();
    assert_eq!((processor.size, processor.crop), (32, None));
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images");
    let pixels: Vec<f32> = ["wide.png", "tall.png"]
        .iter()
        .flat_map(|name| processor.pixels(&image::open(images.join(name)).unwrap().to_rgb8()))
        .collect();
    let d = relative_difference(&pixels, &want.tensors["processed_pixels"].data);
    assert!(d < 1e-6, "pixels differ by {d} of their largest");
    let b = CpuBackend::new();
    let mut blip = blip::read(&folder()).unwrap();
    let mut vision = BlipVision::new(&b, &folder(), &mut blip).unwrap();
    let tokens = vision
        .image_tokens(&b, &patches_of_pixels(&pixels, 32, 8))
        .unwrap();
    let d = relative_difference(&tokens, &want.tensors["processed_tokens"].data);
    assert!(d < 1e-5, "image tokens differ by {d} of their largest");
}

#[test]
fn the_blip_vision_tower_matches_transformers() {
    image_tokens_match(&CpuBackend::new(), "CPU");
    if let Some(g) = gpu() {
        image_tokens_match(&g, "GPU");
    }
}

/// Greedy and beam captions over the KV cache, each checked against the
/// full forward on the caption: at every position the chosen id is the
/// best (greedy) and the log-probabilities sum to the caption's.
fn decoding_equals_the_full_forward<B: Backend>(b: &B, what: &str) {
    let want = expected();
    let images = &want.tensors["image_tokens"].data;
    let mut m = model(b);
    let c = m.config;
    for decoding in [
        Decoding::Greedy,
        Decoding::Beam {
            width: 3,
            n_best: 1,
        },
    ] {
        let captions = generate(b, &m, images, &decoding, &DecodeOptions::default()).unwrap();
        assert_eq!(captions.len(), 2, "{what}: a caption per image");
        for g in &captions {
            let image = &images[g.image * c.image_input_len()..][..c.image_input_len()];
            let fed: Vec<u32> = std::iter::once(c.specials.start)
                .chain(g.ids[..g.ids.len().min(MAX_LEN - 2)].iter().copied())
                .collect();
            let inputs = TokenInputs::new(b, &c, &[fed]).unwrap();
            m.forward(b, image, &inputs).unwrap();
            let logits = b.to_vec(m.logits());
            let v = c.vocab_size;
            let mut total = 0.0f64;
            for (p, &id) in g.ids.iter().enumerate() {
                let row = &logits[p * v..(p + 1) * v];
                let max = row.iter().fold(f32::MIN, |a, &x| a.max(x));
                let lse = max as f64
                    + row
                        .iter()
                        .map(|&x| ((x - max) as f64).exp())
                        .sum::<f64>()
                        .ln();
                total += row[id as usize] as f64 - lse;
                if decoding == Decoding::Greedy {
                    assert_eq!(
                        row[id as usize], max,
                        "{what}: greedy id {p} of {:?} is not the best",
                        g.ids
                    );
                }
            }
            assert!(
                (total - g.logprob as f64).abs() < 1e-4 * total.abs().max(1.0),
                "{what} {decoding:?}: log-probability {} over the cache, {total} in full",
                g.logprob
            );
        }
    }
}

#[test]
fn blip_decoding_over_the_cache_equals_the_full_forward() {
    decoding_equals_the_full_forward(&CpuBackend::new(), "CPU");
    if let Some(g) = gpu() {
        decoding_equals_the_full_forward(&g, "GPU");
    }
}

/// Every file of the folder `from` into a new folder `to`.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

/// The tiny folder as transformers 5's `BlipProcessor.save_pretrained`
/// lays it out: the image processor's settings inside
/// `processor_config.json`, no `preprocessor_config.json`.
fn folder_with_a_processor_config() -> PathBuf {
    let dir = common::fresh_temp("blip-processor-config");
    copy_folder(&folder(), &dir);
    let settings: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("preprocessor_config.json")).unwrap())
            .unwrap();
    let processor =
        serde_json::json!({"image_processor": settings, "processor_class": "BlipProcessor"});
    std::fs::write(dir.join("processor_config.json"), processor.to_string()).unwrap();
    std::fs::remove_file(dir.join("preprocessor_config.json")).unwrap();
    dir
}

/// `captune caption --checkpoint hf:FOLDER --json` on the two pictures,
/// greedy, with 3 beams, and greedy after the prompt "a picture of": the
/// pieces `generate` gives with the folder (at most 10 new pieces), and
/// their text as its tokenizer decodes it; for the folder as committed
/// and as transformers 5 saves a whole processor.
#[test]
fn caption_gives_generate_s_captions_for_a_blip_folder() {
    let saved_whole = folder_with_a_processor_config();
    for folder in [folder(), saved_whole.clone()] {
        captions_equal_generate_s(&folder);
    }
    std::fs::remove_dir_all(saved_whole).unwrap();
}

fn captions_equal_generate_s(folder: &Path) {
    let want = expected();
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images");
    let hf = format!("hf:{}", folder.display());
    let cases = [
        ("greedy", "greedy_ids", None),
        ("beam:3", "beam_ids", None),
        ("greedy", "prompt_greedy_ids", Some("A picture of")),
    ];
    for (decode, name, prompt) in cases {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_captune"));
        cmd.args(["--device", "cpu", "caption", "--checkpoint", &hf, "--json"]);
        if let Some(text) = prompt {
            cmd.args(["--prompt", text]);
        }
        let out = cmd
            .args(["--max-words", "9", "--decode", decode])
            .arg(images.join("wide.png"))
            .arg(images.join("tall.png"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{decode} on {hf}: {stderr}");
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // generate's 10 new pieces, a caption that did not end (at [SEP],
        // id 2) cut to the 9 words asked for.
        let expected_ids: Vec<Vec<u32>> = common::padded_ids(&want.tensors[name].data, 10)
            .into_iter()
            .map(|ids| match ids.contains(&2) {
                true => ids,
                false => ids[..ids.len().min(9)].to_vec(),
            })
            .collect();
        assert_eq!(lines.len(), 2, "{decode}: a line per picture");
        for (line, (file, ids)) in lines
            .iter()
            .zip(["wide.png", "tall.png"].iter().zip(&expected_ids))
        {
            assert!(
                line["file"].as_str().unwrap().ends_with(file),
                "{decode}: {line}"
            );
            let got: Vec<u32> = serde_json::from_value(line["ids"].clone()).unwrap();
            assert_eq!(&got, ids, "{decode}: {file}'s pieces");
            let words: Vec<&str> = ids.iter().map(|&id| WORDS[id as usize]).collect();
            assert_eq!(
                line["caption"],
                words.join(" ").replace(" ##", ""),
                "{decode}: {file}"
            );
        }
    }
}

/// The tiny folder's vocabulary (scripts/blip_fixtures.py's WORDS).
const WORDS: [&str; 50] = [
    "[PAD]", "[UNK]", "[SEP]", "[CLS]", "[MASK]", "a", "an", "the", "picture", "of", "dog", "cat",
    "man", "woman", "red", "blue", "green", "ball", "on", "in", "with", "grass", "runs", "sits",
    "is", "and", "small", "large", "black", "white", "two", "three", "##s", "##ing", "##ed",
    "play", "walk", "water", "street", "car", "bike", "tree", "holding", "near", "jump", "park",
    "boy", "[DEC]", "girl", ".",
];

/// Another model's folder is refused by its type, naming the file.
#[test]
fn a_folder_of_another_model_is_refused_by_its_type() {
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let Err(e) = blip::read(&gpt2) else {
        panic!("a GPT-2 folder read as BLIP")
    };
    let message = format!("{e:#}");
    assert!(
        message.contains("gpt2-tiny/config.json") && message.contains("model_type \"gpt2\""),
        "{message}"
    );
}

/// A prompt that leaves a caption no position, or is longer than captune
/// feeds, is refused by an error that says so, not a panic; one that
/// fits takes its positions from the caption's.
#[test]
fn a_prompt_longer_than_the_positions_is_refused() {
    let b = CpuBackend::new();
    let refused = |prompt: &str| {
        let blip = blip::read(&folder()).unwrap();
        match blip_checkpoint::<CpuBackend>(&b, &folder(), blip, (20, Some(prompt)), false) {
            Ok(_) => panic!("{prompt:?} was taken"),
            Err(e) => format!("{e:#}"),
        }
    };
    // The tiny decoder has 32 positions: the start, 31 pieces, no caption.
    let e = refused(&["a"; 31].join(" "));
    assert!(e.contains("31 pieces leaves no room for a caption"), "{e}");
    let e = refused(&["a"; 17].join(" "));
    assert!(e.contains("17 ids is longer than the 16"), "{e}");
    // Sixteen pieces leave a caption the other 16 positions.
    let blip = blip::read(&folder()).unwrap();
    let prompt = ["a"; 16].join(" ");
    let ck =
        blip_checkpoint::<CpuBackend>(&b, &folder(), blip, (76, Some(&prompt)), false).unwrap();
    assert_eq!(ck.model.config.prompt.ids(), [5; 16]);
    assert_eq!(ck.model.config.max_len, 17);
    assert_eq!(ck.model.config.seq_len(), 32);
}

/// The mean cross-entropy of `logits` (`[rows, v]`) at the rows whose
/// target is not `pad`, and its gradient.
fn cross_entropy(logits: &[f32], targets: &[u32], v: usize, pad: u32) -> (f64, Vec<f32>) {
    let real = targets.iter().filter(|&&t| t != pad).count() as f64;
    let mut d = vec![0.0f32; logits.len()];
    let mut loss = 0.0;
    for (r, &target) in targets.iter().enumerate().filter(|(_, t)| **t != pad) {
        let row = &logits[r * v..(r + 1) * v];
        let max = row.iter().fold(f32::MIN, |a, &x| a.max(x)) as f64;
        let total: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        loss -= (row[target as usize] as f64 - max - total.ln()) / real;
        for (j, dj) in d[r * v..(r + 1) * v].iter_mut().enumerate() {
            let prob = (row[j] as f64 - max).exp() / total;
            *dj = ((prob - f64::from(u8::from(j == target as usize))) / real) as f32;
        }
    }
    (loss, d)
}

/// A prompt's positions are fed but never predicted: a decoder given the
/// prompt "a picture of" computes, at its caption's positions, the logits
/// the plain decoder computes when fed the start, the prompt and the
/// caption; its loss is the plain decoder's with the prompt's targets
/// left out, and so is every gradient; decoding after the prompt gives
/// the captions the plain decoder decodes from the fed prompt.
#[test]
fn a_prompt_is_fed_but_never_predicted() {
    let b = CpuBackend::new();
    let want = expected();
    let images = &want.tensors["image_tokens"].data;
    let prompt = [5u32, 8, 9];
    let plain = |b: &CpuBackend| {
        let blip = blip::read(&folder()).unwrap();
        from_blip(b, blip, MAX_LEN + prompt.len(), Prompt::default(), false).unwrap()
    };
    let mut prompted = {
        let blip = blip::read(&folder()).unwrap();
        from_blip(&b, blip, MAX_LEN, Prompt::new(&prompt).unwrap(), false).unwrap()
    };
    let mut plain = plain(&b);
    let c = prompted.config;
    let captions = fed(&want);
    let with_prompt: Vec<Vec<u32>> = captions
        .iter()
        .map(|s| [&s[..1], &prompt[..], &s[1..]].concat())
        .collect();
    let targets = |sequences: &[Vec<u32>], steps: usize, from: usize| {
        let mut t = teacher_targets(sequences, steps, c.specials.pad);
        // The prompt's targets count for nothing in the plain decoder.
        for row in t.chunks_mut(steps) {
            row[..from].fill(c.specials.pad);
        }
        t
    };
    let step = |m: &mut Captioner<CpuBackend>, sequences: &[Vec<u32>], from: usize| {
        let inputs = TokenInputs::new(&b, &m.config, sequences).unwrap();
        m.forward(&b, images, &inputs).unwrap();
        let rows = inputs.rows();
        let logits = b.to_vec(m.logits());
        let targets = targets(sequences, inputs.positions, from);
        let (loss, d_logits) = cross_entropy(&logits, &targets, c.vocab_size, c.specials.pad);
        m.params_mut().zero_grads(&b);
        m.backward(&b, &inputs, &b.tensor(&d_logits));
        let grads: Vec<Vec<f32>> = m.params().grads.iter().map(|g| b.to_vec(g)).collect();
        (logits, rows, loss, grads)
    };
    let (logits, rows, loss, grads) = step(&mut prompted, &captions, 0);
    let (plain_logits, _, plain_loss, plain_grads) = step(&mut plain, &with_prompt, prompt.len());
    let (t, v) = (c.token_positions(), c.vocab_size);
    let plain_t = t + prompt.len();
    for r in 0..rows {
        let (row, j) = (r / t, r % t);
        // Caption position j's prediction comes from fed position j + prompt.
        let at = row * plain_t + j + prompt.len();
        let (got, want) = (
            &logits[r * v..(r + 1) * v],
            &plain_logits[at * v..(at + 1) * v],
        );
        // The policy's masked ids (-1e30 in both) would hide any difference.
        let unmasked = |l: &[f32]| -> Vec<f32> {
            (0..v)
                .filter(|&k| want[k] > MASKED_LOGIT / 2.0)
                .map(|k| l[k])
                .collect()
        };
        let (got, want) = (unmasked(got), unmasked(want));
        assert!(
            relative_difference(&got, &want) < 1e-5,
            "row {row}, position {j}"
        );
    }
    assert!(
        (loss - plain_loss).abs() < 1e-5 * plain_loss.abs(),
        "{loss} vs {plain_loss}"
    );
    let names = &prompted.params().specs;
    for (k, (g, p)) in grads.iter().zip(&plain_grads).enumerate() {
        // The plain decoder's position table has the prompt's rows too.
        let p = &p[..g.len()];
        assert!(relative_difference(g, p) < 1e-4, "{}", names[k].name);
    }
    let decoded = generate(
        &b,
        &prompted,
        images,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(decoded.len(), 2);
    for g in &decoded {
        // The plain decoder fed the prompt chooses the same pieces.
        let mut fed = [&[c.specials.start][..], &prompt[..]].concat();
        for &id in &g.ids {
            let inputs = TokenInputs::new(&b, &plain.config, &[fed.clone()]).unwrap();
            let row = &images[g.image * c.image_input_len()..(g.image + 1) * c.image_input_len()];
            plain.forward(&b, row, &inputs).unwrap();
            let logits = b.to_vec(plain.logits());
            let at = fed.len() - 1;
            let next = &logits[at * v..(at + 1) * v];
            let best = (0..v).max_by(|&a, &b| next[a].total_cmp(&next[b])).unwrap();
            assert_eq!(best as u32, id);
            fed.push(id);
        }
    }
}

/// As a user meets it: `captune train --decoder hf:BLIP` on the tiny
/// world computes the images' tokens once with the folder's vision tower
/// and fine-tunes the text decoder; the run records where its tokens come
/// from and its prompt, so that `eval`, `inspect` and `--resume` read the
/// same tokens and feed the same prompt without being told; `export`
/// writes the BLIP folder with the trained decoder, which captune reads
/// back bit for bit and whose `generate` in transformers (where it is
/// installed) gives captune's captions.
#[test]
fn a_blip_run_trains_evaluates_inspects_and_resumes() {
    let dir = crate::common::fresh_temp("blip-run");
    let (run, cache) = (dir.join("run"), dir.join("cache"));
    let captune = |args: &[&str]| crate::common::captune_on_cpu(&cache, args);
    let run_arg = run.display().to_string();
    let hf = format!("hf:{}", folder().display());
    let mut train = vec![
        "train",
        "--preset",
        "tiny",
        "--epochs",
        "1",
        "--decoder",
        &hf,
    ];
    train.extend([
        "--lr",
        "1e-4",
        "--prompt",
        "a picture of",
        "--out",
        &run_arg,
    ]);
    train.extend(common::TINY_WORLD_ARGS);
    let (ok, _, err) = captune(&train);
    assert!(ok, "{err}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let recorded = format!("image_tokens = {:?}", folder().display().to_string());
    assert!(config.contains(&recorded), "{config}");
    assert!(config.contains("prompt = \"a picture of\""), "{config}");
    let checkpoint = tensorfile::read_metadata(&run.join("checkpoint.safetensors")).unwrap();
    let model: serde_json::Value = serde_json::from_str(&checkpoint["captioner_config"]).unwrap();
    assert_eq!(model["prompt"], serde_json::json!([5, 8, 9]));
    let cached = std::fs::read_dir(cache.join("image-tokens"))
        .unwrap()
        .count();
    assert_eq!(cached, 1, "the tokens are computed once, into the cache");

    let results = dir.join("results.json");
    let checkpoint = run.join("checkpoint.safetensors").display().to_string();
    let results_arg = results.display().to_string();
    let eval = ["eval", "--checkpoint", &checkpoint, "--split", "val"];
    let (ok, _, err) = captune(&[&eval[..], &["--results", &results_arg]].concat());
    assert!(ok, "{err}");
    assert!(err.contains("image tokens from the cache"), "{err}");
    let captions: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    assert_eq!(captions.len(), 16, "a caption per validation image");
    let image = captions[0]["image_id"].to_string().replace('"', "");

    let inspect = ["inspect", "--checkpoint", &checkpoint, "--image", &image];
    let (ok, out, err) = captune(&[&inspect[..], &["--caption", "two red balls"]].concat());
    assert!(ok, "{err}");
    // A row per piece, "balls" as a piece and its continuation, then the end.
    let first: Vec<&str> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(first, ["two", "red", "ball", "##s", "[SEP]"], "{out}");

    let resume = ["train", "--resume", "--epochs", "1", "--out", &run_arg];
    let (ok, _, err) = captune(&resume);
    assert!(ok, "{err}");
    let log = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 2, "an epoch more: {log}");

    export_is_the_trained_model(captune, (&dir, &run), Some("a picture of"), false);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `captune export RUN --hf` of a trained BLIP run (fed `prompt`, with a
/// trained tower where `vision`): the export reads back as the run's
/// checkpoint, bit for bit; captions of two pictures from the checkpoint
/// and from the export are the same, and so are transformers' `generate`'s
/// on the export where torch and transformers are installed.
fn export_is_the_trained_model(
    captune: impl Fn(&[&str]) -> (bool, String, String),
    (dir, run): (&Path, &Path),
    prompt: Option<&str>,
    vision: bool,
) {
    let hf = dir.join("hf");
    let hf_out = hf.display().to_string();
    let run_arg = run.display().to_string();
    let (ok, _, err) = captune(&["export", &run_arg, "--hf", &hf_out]);
    assert!(ok, "{err}");
    let b = CpuBackend::new();
    let checkpoint = run.join("checkpoint.safetensors");
    let trained = Checkpoint::load(&b, &checkpoint).unwrap();
    let c = trained.model.config;
    let exported = blip::read(&hf).unwrap();
    let back = blip_checkpoint::<CpuBackend>(&b, &hf, exported, (c.max_len, prompt), vision);
    let back = back.unwrap();
    assert_eq!(back.model.config, c);
    let (theirs, ours) = (back.model.params(), trained.model.params());
    for (k, spec) in ours.specs.iter().enumerate() {
        let (got, want) = (b.to_vec(&theirs.values[k]), b.to_vec(&ours.values[k]));
        assert!(got == want, "{} differs after export", spec.name);
    }
    assert_eq!(back.vocab, trained.vocab);
    // The checkpoint captions image files through the tower it recorded
    // (or trained), as its export does after the same prompt.
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images");
    let (wide, tall) = (images.join("wide.png"), images.join("tall.png"));
    let files = [wide.to_str().unwrap(), tall.to_str().unwrap()];
    let words = ["--json", "--max-words", "9"];
    let checkpoint = checkpoint.display().to_string();
    let from_run = ["caption", "--checkpoint", &checkpoint];
    let (ok, run_captions, err) = captune(&[&from_run[..], &words, &files].concat());
    assert!(ok, "{err}");
    let hf_arg = format!("hf:{hf_out}");
    let prompted: Vec<&str> = prompt.map_or(vec![], |p| vec!["--prompt", p]);
    let caption = ["caption", "--checkpoint", &hf_arg];
    let (ok, out, err) = captune(&[&caption[..], &words, &prompted, &files].concat());
    assert!(ok, "{err}");
    assert_eq!(
        run_captions, out,
        "the checkpoint and its export caption alike"
    );
    // transformers loads it, and its generate gives what captune gives.
    if let Some(python) = common::python_with_transformers() {
        let captions = dir.join("captions.jsonl");
        std::fs::write(&captions, out).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check_blip_export.py");
        let check = std::process::Command::new(python)
            .arg(&script)
            .arg(&hf)
            .arg("--captions")
            .arg(&captions)
            .args(["--max-words", "9"])
            .args(&prompted)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&check.stdout);
        let stderr = String::from_utf8_lossy(&check.stderr);
        assert!(check.status.success(), "{said}{stderr}");
        assert_eq!(said.matches("same ").count(), 2, "{said}");
    }
}

/// `train --train-vision` trains the vision tower with the decoder: no
/// tokens are cached, the tower's weights move and are the checkpoint's,
/// the run records the folder whose processor makes its pixels, so that
/// `eval`, `inspect` and `--resume` read them; the export writes the
/// trained tower into the folder, and captions from it (through the
/// tower's tokens) equal the checkpoint's (through its patches).
#[test]
fn a_blip_run_trains_its_vision_tower() {
    let dir = crate::common::fresh_temp("blip-vision-run");
    let (run, cache) = (dir.join("run"), dir.join("cache"));
    let captune = |args: &[&str]| crate::common::captune_on_cpu(&cache, args);
    let run_arg = run.display().to_string();
    let hf = format!("hf:{}", folder().display());
    let mut train = vec!["train", "--preset", "tiny", "--epochs", "1"];
    train.extend(["--decoder", &hf, "--train-vision", "--lr", "1e-3"]);
    train.extend(["--out", &run_arg]);
    train.extend(common::TINY_WORLD_ARGS);
    let (ok, _, err) = captune(&train);
    assert!(ok, "{err}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("train_vision = true"), "{config}");
    let recorded = format!("image_pixels = {:?}", folder().display().to_string());
    assert!(config.contains(&recorded), "{config}");
    assert!(
        !cache.join("image-tokens").exists(),
        "a trained tower's tokens are not cached"
    );
    let b = CpuBackend::new();
    let trained = Checkpoint::load(&b, &run.join("checkpoint.safetensors")).unwrap();
    let frozen = model_with_vision(&b);
    let c = trained.model.config;
    assert_eq!(c.vision, frozen.config.vision);
    let (ours, base) = (trained.model.params(), frozen.params());
    let moved = |name: &str| {
        let k = ours.specs.iter().position(|s| s.name == name).unwrap();
        b.to_vec(&ours.values[k]) != b.to_vec(&base.values[k])
    };
    assert!(moved("vision.patch_embed.weight"), "the tower trains");
    assert!(moved("vision.blocks.0.attn.qkv.weight"), "the tower trains");

    let checkpoint = run.join("checkpoint.safetensors").display().to_string();
    let eval = ["eval", "--checkpoint", &checkpoint, "--split", "val"];
    let results = dir.join("results.json").display().to_string();
    let (ok, _, err) = captune(&[&eval[..], &["--results", &results]].concat());
    assert!(ok, "{err}");
    let captions: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    assert_eq!(captions.len(), 16, "a caption per validation image");
    let image = captions[0]["image_id"].to_string().replace('"', "");
    let inspect = ["inspect", "--checkpoint", &checkpoint, "--image", &image];
    let (ok, out, err) = captune(&[&inspect[..], &["--caption", "two red balls"]].concat());
    assert!(ok, "{err}");
    assert!(out.contains("##s"), "{out}");
    let resume = ["train", "--resume", "--epochs", "1", "--out", &run_arg];
    let (ok, _, err) = captune(&resume);
    assert!(ok, "{err}");
    assert!(!cache.join("image-tokens").exists());
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("train_vision = true"), "{config}");

    export_is_the_trained_model(captune, (&dir, &run), None, true);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `embed --image-tokens hf:BLIP` writes the BLIP vision tower's tokens
/// into the features file after the embeddings (which read back as plain
/// `embed`'s, bit for bit); a BLIP run on that file reads its tokens, the
/// same as those it would compute into the cache, and caches none, and so
/// does `eval` of the run.
#[test]
fn a_features_file_carries_blip_image_tokens() {
    use captune::data::features::Features;
    use captune::data::image_tokens::ImageTokens;
    let dir = crate::common::fresh_temp("blip-features");
    let cache = dir.join("cache");
    let captune = |args: &[&str]| crate::common::captune_on_cpu(&cache, args);
    let clip = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-tiny");
    let (clip, hf) = (
        clip.display().to_string(),
        format!("hf:{}", folder().display()),
    );
    let (plain, both) = (dir.join("plain.safetensors"), dir.join("both.safetensors"));
    let embed = |out: &Path, tokens: bool| {
        let out = out.display().to_string();
        let mut args = vec!["embed", "--clip", &clip, "--out", &out];
        if tokens {
            args.extend(["--image-tokens", &hf]);
        }
        args.extend(common::TINY_WORLD_ARGS);
        let (ok, _, err) = captune(&args);
        assert!(ok, "{err}");
    };
    embed(&plain, false);
    embed(&both, true);
    let (a, b) = (
        Features::load(&plain, None).unwrap(),
        Features::load(&both, None).unwrap(),
    );
    assert_eq!((&a.ids, &a.encoder), (&b.ids, &b.encoder));
    assert!(a.embeddings == b.embeddings, "the same embeddings");
    let held = ImageTokens::open(&both).unwrap();
    assert_eq!(held.ids, a.ids);
    assert!(held.encoder.as_deref().unwrap().starts_with("blip-vision:"));

    // A BLIP run on a features file; what it printed.
    let train_on = |features: &Path, out: &str| {
        let (features, out) = (features.display().to_string(), dir.join(out));
        let out = out.display().to_string();
        let mut train = vec!["train", "--preset", "tiny", "--epochs", "1"];
        train.extend(["--decoder", &hf, "--features", &features, "--out", &out]);
        train.extend(common::TINY_WORLD_ARGS);
        let (ok, _, err) = captune(&train);
        assert!(ok, "{err}");
        err
    };
    let err = train_on(&both, "run");
    assert!(err.contains("image tokens from the features file"), "{err}");
    assert!(!cache.join("image-tokens").exists(), "none cached");
    let checkpoint = dir.join("run/checkpoint.safetensors").display().to_string();
    let eval = ["eval", "--checkpoint", &checkpoint, "--split", "val"];
    let (ok, _, err) = captune(&eval);
    assert!(ok, "{err}");
    assert!(err.contains("image tokens from the features file"), "{err}");

    // A run on the embeddings alone computes the same tokens into the cache.
    train_on(&plain, "other");
    let cached: Vec<PathBuf> = std::fs::read_dir(cache.join("image-tokens"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let computed = ImageTokens::open(&cached[0]).unwrap();
    let all: Vec<usize> = (0..held.ids.len()).collect();
    let index = computed.index();
    let same_order: Vec<usize> = held.ids.iter().map(|id| index[id.as_str()]).collect();
    assert!(held.rows(&all).unwrap() == computed.rows(&same_order).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A BLIP decoder that training has not changed exports as the folder it
/// came from, whole: every tensor bit for bit (the position rows past the
/// captioner's and the vision tower included), its config and its
/// processor's and tokenizer's files byte for byte. Without the folder,
/// the export says which to name.
#[test]
fn an_untrained_blip_exports_as_its_folder_bit_for_bit() {
    let b = CpuBackend::new();
    let base = folder();
    let ck =
        blip_checkpoint::<CpuBackend>(&b, &base, blip::read(&base).unwrap(), (12, None), false)
            .unwrap();
    let out = crate::common::fresh_temp("blip-export");
    let e = export::to_hf(&b, &ck, &out, None).unwrap_err();
    assert!(format!("{e:#}").contains("--decoder hf:FOLDER"), "{e:#}");
    export::to_hf(&b, &ck, &out, Some(&base)).unwrap();
    let (theirs, ours) = (
        tensorfile::read(&base.join("model.safetensors")).unwrap(),
        tensorfile::read(&out.join("model.safetensors")).unwrap(),
    );
    let mut names: Vec<&String> = theirs.tensors.keys().collect();
    names.sort();
    assert_eq!(names.len(), ours.tensors.len());
    for name in names {
        let (t, o) = (&theirs.tensors[name], &ours.tensors[name]);
        assert_eq!(t.shape, o.shape, "{name}");
        assert!(t.data == o.data, "{name} differs");
    }
    for file in ["config.json", "preprocessor_config.json", "tokenizer.json"] {
        let read = |dir: &Path| std::fs::read(dir.join(file)).unwrap();
        assert_eq!(read(&out), read(&base), "{file}");
    }
    // Another folder's decoder is refused, naming it.
    let other = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let e = export::to_hf(&b, &ck, &out, Some(&other)).unwrap_err();
    assert!(format!("{e:#}").contains("gpt2-tiny"), "{e:#}");
    // A folder that also stores the head's tied decoder gets the trained
    // embedding there too; one with a text tensor outside the map, or the
    // export written over its own folder, is refused.
    let copy = out.with_extension("base");
    copy_folder(&base, &copy);
    let write = |extra: &[(&str, Vec<usize>)]| {
        let mut file = tensorfile::read(&base.join("model.safetensors")).unwrap();
        for (name, shape) in extra {
            let data = vec![0.5; shape.iter().product()];
            file.tensors.insert(
                name.to_string(),
                tensorfile::Tensor {
                    shape: shape.clone(),
                    data,
                },
            );
        }
        let tensors: Vec<(&str, Vec<usize>, &[f32])> = (file.tensors.iter())
            .map(|(n, t)| (n.as_str(), t.shape.clone(), t.data.as_slice()))
            .collect();
        tensorfile::write(&copy.join("model.safetensors"), &tensors, HashMap::new()).unwrap();
    };
    let tied = "text_decoder.cls.predictions.decoder.weight";
    write(&[(tied, vec![50, 16])]);
    let exported = out.with_extension("tied");
    export::to_hf(&b, &ck, &exported, Some(&copy)).unwrap();
    let file = tensorfile::read(&exported.join("model.safetensors")).unwrap();
    let words = "text_decoder.bert.embeddings.word_embeddings.weight";
    assert!(file.tensors[tied].data == file.tensors[words].data);
    write(&[("text_decoder.bert.pooler.dense.weight", vec![16, 16])]);
    let e = export::to_hf(&b, &ck, &exported, Some(&copy)).unwrap_err();
    assert!(format!("{e:#}").contains("pooler.dense.weight"), "{e:#}");
    let e = export::to_hf(&b, &ck, &copy, Some(&copy)).unwrap_err();
    assert!(
        format!("{e:#}").contains("would replace the BLIP folder"),
        "{e:#}"
    );
    for dir in [&out, &copy, &exported] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// `bench train` and `bench decode` time a BLIP folder named by a run
/// config's `decoder`: its network (not a fresh prefix decoder) on
/// captions in its own ids and image tokens of its tower's shape.
#[test]
fn the_benchmarks_time_a_blip_folder() {
    use captune::captioner::bench::{BenchModel, Workload, decode_throughput, train_throughput};
    let dir = crate::common::fresh_temp("blip-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("blip.toml");
    let mut run = captune::captioner::run::RunConfig::preset("tiny").unwrap();
    run.model.decoder = Some(format!("hf:{}", folder().display()));
    run.model.max_len = 9;
    run.train.batch = 4;
    std::fs::write(&config, run.to_toml()).unwrap();
    let b = CpuBackend::new();
    let bench = BenchModel::new("tiny", Some(&config), 79, None).unwrap();
    for workload in [Workload::Synthetic, Workload::Shapes] {
        let t = train_throughput(&b, &bench, "mle", workload, 1, 2).unwrap();
        let timed = from_blip(
            &b,
            blip::read(&folder()).unwrap(),
            9,
            Prompt::default(),
            false,
        )
        .unwrap();
        assert_eq!(t.parameters, timed.params().count(), "the folder's network");
        assert!(
            t.tokens_per_s > 0.0 && t.tokens_per_step <= 4.0 * 8.0,
            "{t:?}"
        );
        if workload == Workload::Synthetic {
            assert_eq!(t.tokens_per_step, 4.0 * 8.0, "full-length captions");
        }
    }
    let d = decode_throughput(&b, &bench, None, None, &Decoding::Greedy, 3).unwrap();
    assert_eq!((d.images, d.captions), (3, 3));
    assert!(d.tokens >= 3 && d.tokens <= 3 * 8, "{d:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `inspect --checkpoint hf:FOLDER --image FILE` scores a caption of an
/// image file under the folder as it is: each piece's MLE loss is -log p
/// of the piece under the decoder reading transformers' image tokens of
/// that file (the fixture's `processed_tokens`), so the file's pixels,
/// the tower and the scoring agree with transformers; after a prompt the
/// prompt's pieces are fed, not scored; an objective is refused.
#[test]
fn inspect_scores_a_caption_of_an_image_file_under_a_blip_folder() {
    let want = expected();
    let hf = format!("hf:{}", folder().display());
    let image = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-images/wide.png");
    let inspect = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_captune"))
            .args(["--device", "cpu", "inspect", "--checkpoint", &hf, "--image"])
            .arg(&image)
            .args(["--json", "--caption"])
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), text, err)
    };
    let (ok, out, err) = inspect(&["a dog runs"]);
    assert!(ok, "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let tokens: Vec<&str> = rows.iter().map(|r| r["token"].as_str().unwrap()).collect();
    assert_eq!(tokens, ["a", "dog", "runs", "[SEP]"]);
    // The same caption scored here on transformers' tokens of wide.png.
    let b = CpuBackend::new();
    let mut m = model(&b);
    let c = m.config;
    let per_image = c.image_input_len();
    let tokens_of_wide = &want.tensors["processed_tokens"].data[..per_image];
    let fed = vec![vec![c.specials.start, 5, 10, 22]];
    let inputs = TokenInputs::new(&b, &c, &fed).unwrap();
    m.forward(&b, tokens_of_wide, &inputs).unwrap();
    let logits = b.to_vec(m.logits());
    let v = c.vocab_size;
    for (p, (row, target)) in rows.iter().zip([5u32, 10, 22, c.specials.end]).enumerate() {
        let z = &logits[p * v..(p + 1) * v];
        let max = z.iter().fold(f32::MIN, |a, &x| a.max(x)) as f64;
        let lse = max + z.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
        let nll = lse - z[target as usize] as f64;
        let got = row["mle_loss"].as_f64().unwrap();
        assert!(
            (got - nll).abs() < 1e-4 * nll.max(1.0),
            "piece {p}: {got} vs {nll}"
        );
    }
    let (ok, out, err) = inspect(&["dogs", "--prompt", "a picture of"]);
    assert!(ok, "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let tokens: Vec<&str> = rows.iter().map(|r| r["token"].as_str().unwrap()).collect();
    assert_eq!(
        tokens,
        ["dog", "##s", "[SEP]"],
        "the prompt is fed, not scored"
    );
    let (ok, _, err) = inspect(&["a dog", "--objective", "scst"]);
    assert!(!ok && err.contains("--objective scst"), "{err}");
}

/// BLIP's own checkpoint layout (`scripts/blip_original_fixtures.py`: its
/// authors' ViT and BERT decoder at blip-tiny's sizes, saved as their code
/// saves a captioner): `captune convert --blip FILE.pth --blip-config
/// FOLDER` writes a BLIP folder whose vision tower, text decoder and greedy
/// decoding of the two pictures are the authors' code's: the logits of
/// two captions fed after [DEC] within 1e-5 of their largest, the same
/// greedy pieces. A checkpoint of another model is refused by name.
#[test]
fn convert_writes_blip_s_own_checkpoint_as_a_blip_folder() {
    let dir = common::fresh_temp("blip-convert");
    let (out, cache) = (dir.join("out"), dir.join("cache"));
    let captune = |args: &[&str]| common::captune_on_cpu(&cache, args);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let original = data.join("blip-original");
    let (file, config) = (original.join("model.pth"), folder());
    let args = |file: &Path, out: &Path| {
        let (file, config, out) = (file.display(), config.display(), out.display());
        captune(&[
            "convert",
            "--blip",
            &file.to_string(),
            "--blip-config",
            &config.to_string(),
            "--out",
            &out.to_string(),
        ])
    };
    let (ok, _, err) = args(&file, &out);
    assert!(ok, "{err}");
    let want = tensorfile::read(&original.join("expected.safetensors")).unwrap();
    let b = CpuBackend::new();
    let mut blip = blip::read(&out).unwrap();
    let mut vision = BlipVision::new(&b, &out, &mut blip).unwrap();
    let pixels = &expected().tensors["processed_pixels"].data;
    let images = vision
        .image_tokens(&b, &patches_of_pixels(pixels, 32, 8))
        .unwrap();
    let max_new = want.tensors["greedy_ids"].shape[1];
    let mut m = from_blip(&b, blip, max_new + 1, Prompt::default(), false).unwrap();
    let c = m.config;

    let ids = &want.tensors["input_ids"];
    let fed: Vec<Vec<u32>> = (ids.data.chunks(ids.shape[1]))
        .map(|row| {
            let n = row.iter().rposition(|&x| x != 0.0).map_or(0, |p| p + 1);
            row[..n].iter().map(|&x| x as u32).collect()
        })
        .collect();
    let inputs = TokenInputs::new(&b, &c, &fed).unwrap();
    m.forward(&b, &images, &inputs).unwrap();
    let logits = b.to_vec(m.logits());
    let expected_logits = &want.tensors["logits"];
    let (t, v) = (expected_logits.shape[1], c.vocab_size);
    let (mut got, mut wanted) = (Vec::new(), Vec::new());
    for (i, s) in fed.iter().enumerate() {
        for p in 0..s.len() {
            for j in (0..v).filter(|&j| !c.specials.is_masked(j as u32)) {
                got.push(logits[(i * inputs.positions + p) * v + j]);
                wanted.push(expected_logits.data[(i * t + p) * v + j]);
            }
        }
    }
    let d = relative_difference(&got, &wanted);
    assert!(d < 1e-5, "logits differ by {d} of their largest");
    let greedy = generate(
        &b,
        &m,
        &images,
        &Decoding::Greedy,
        &DecodeOptions::default(),
    )
    .unwrap();
    let want_greedy = common::padded_ids(&want.tensors["greedy_ids"].data, max_new);
    for (i, (g, w)) in greedy.iter().zip(&want_greedy).enumerate() {
        assert_eq!(&g.ids, w, "greedy caption {i}");
    }

    let clipcap = data.join("clipcap-original/mlp.pt");
    let (ok, _, err) = args(&clipcap, &dir.join("other"));
    assert!(
        !ok && err.contains("\"clip_project.model.0.bias\" is neither the vision tower's"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `train --decoder blip:FILE.pth --blip-config FOLDER` starts a run from
/// BLIP's own checkpoint, converted once into the cache (a second run
/// reuses it); the run records both, and `eval` follows. Without
/// --blip-config it is refused, naming the flag.
#[test]
fn a_run_starts_from_blip_s_own_checkpoint() {
    let dir = common::fresh_temp("blip-original-run");
    let cache = dir.join("cache");
    let captune = |args: &[&str]| common::captune_on_cpu(&cache, args);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let decoder = format!("blip:{}", data.join("blip-original/model.pth").display());
    let config = folder().display().to_string();
    let run = |name: &str, with_config: bool| {
        let out = dir.join(name).display().to_string();
        let mut args = vec!["train", "--preset", "tiny", "--epochs", "1", "--lr", "1e-4"];
        args.extend(["--decoder", &decoder, "--out", &out]);
        if with_config {
            args.extend(["--blip-config", &config]);
        }
        args.extend(common::TINY_WORLD_ARGS);
        captune(&args)
    };
    let (ok, _, err) = run("refused", false);
    assert!(!ok && err.contains("--blip-config FOLDER"), "{err}");
    let (ok, _, err) = run("run", true);
    assert!(ok, "{err}");
    assert!(err.contains("converting"), "{err}");
    let recorded = std::fs::read_to_string(dir.join("run/config.toml")).unwrap();
    assert!(
        recorded.contains(&format!("blip_config = {config:?}")),
        "{recorded}"
    );
    let converted = std::fs::read_dir(cache.join("converted")).unwrap().count();
    assert_eq!(converted, 1, "one converted folder");
    let (ok, _, err) = run("again", true);
    assert!(ok && !err.contains("converting"), "{err}");

    let checkpoint = dir.join("run/checkpoint.safetensors").display().to_string();
    let eval = ["eval", "--checkpoint", &checkpoint, "--split", "val"];
    let (ok, out, err) = captune(&eval);
    assert!(ok && out.contains("CIDEr-D"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
