//! A bounded fuzz of every loader, run by `cargo test` on stable: each
//! loader's seed corpus of valid files is mutated (bit flips, truncation,
//! spliced chunks, huge numbers, swapped brackets, other dtypes, NaN
//! values) for a fixed budget of inputs. Every input must load or fail
//! with an error naming the file; none may panic, and no allocation may
//! exceed a bound (a global allocator enforces it). The longer,
//! coverage-guided fuzz is `cargo +nightly fuzz run <loader>` (fuzz/).

use captune::app::follow::RunFiles;
use captune::app::history::History;
use captune::captioner::model::Captioner;
use captune::captioner::run::RunConfig;
use captune::captioner::run_folder::{self, ObjectiveState, Position, RunFolder};
use captune::captioner::{CaptionVocab, CaptionerConfig, Checkpoint, DecoderFamily, SpecialIds};
use captune::cpu::CpuBackend;
use captune::data::features::Features;
use captune::data::vocab::Vocab;
use captune::data::{Dataset, Item, Split, coco, images, karpathy};
use captune::model::layers::Activation;
use captune::model::retriever::RetrieverConfig;
use captune::model::transformer::TransformerConfig;
use captune::optim::{AdamW, AdamWConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// No loader may ask for more than this at once, whatever a file claims.
const ALLOCATION_LIMIT: usize = 1 << 30;
/// Mutated inputs per loader.
const BUDGET: usize = 2000;

/// Fails an allocation over the limit. The process then aborts (an
/// allocator may not unwind), so it first says which input asked, without
/// allocating: the input is left in its target file.
struct Bounded;

static CURRENT: Mutex<[u8; 160]> = Mutex::new([b' '; 160]);

fn over_limit() {
    let message = CURRENT.lock().map(|m| *m).unwrap_or([b'?'; 160]);
    let mut err = std::io::stderr();
    let _ = err.write_all(b"\nfuzz: an allocation over the limit while loading ");
    let _ = err.write_all(&message);
    let _ = err.write_all(b"\n");
}

unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_LIMIT {
            over_limit();
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOCATION_LIMIT {
            over_limit();
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Bounded = Bounded;

/// A test's own folder of inputs, removed when the test passes; a
/// failing one leaves it, with the input that crashed a loader.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!(
        "captune-fuzz-{name}-{}",
        captune::tensorfile::temporary_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// One way to damage a file.
fn mutate(seed: &[u8], rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    let n = b.len().max(1);
    match rng.random_range(0..8) {
        // Bit flips.
        0 => {
            for _ in 0..rng.random_range(1..9) {
                let i = rng.random_range(0..n).min(b.len().saturating_sub(1));
                if !b.is_empty() {
                    b[i] ^= 1 << rng.random_range(0..8);
                }
            }
        }
        // Truncation.
        1 => b.truncate(rng.random_range(0..n)),
        // A chunk of the file copied elsewhere in it.
        2 => {
            let (from, len) = (rng.random_range(0..n), rng.random_range(1..64));
            let chunk: Vec<u8> = b.iter().skip(from).take(len).copied().collect();
            let at = rng.random_range(0..=b.len());
            b.splice(at..at, chunk);
        }
        // A number made huge (dimensions, lengths, counts, offsets).
        3 => {
            let digits: Vec<usize> = (0..b.len()).filter(|&i| b[i].is_ascii_digit()).collect();
            if let Some(&i) = digits.get(rng.random_range(0..digits.len().max(1))) {
                let huge = [
                    "99999999999",
                    "4294967296",
                    "18446744073709551615",
                    "1e308",
                    "-1",
                ];
                let text = huge[rng.random_range(0..huge.len())].as_bytes().to_vec();
                b.splice(i..i + 1, text);
            }
        }
        // Wrong nesting: one bracket or brace swapped for another.
        4 => {
            let at: Vec<usize> = (0..b.len()).filter(|&i| b"[]{}".contains(&b[i])).collect();
            if let Some(&i) = at.get(rng.random_range(0..at.len().max(1))) {
                b[i] = b"[]{}\""[rng.random_range(0..5)];
            }
        }
        // Another dtype or type name in a header.
        5 => {
            let text = String::from_utf8_lossy(&b).into_owned();
            let swaps = [
                ("F32", "F16"),
                ("F32", "I64"),
                ("F32", "BOOL"),
                ("F32", "F64"),
                ("<f4", "<f8"),
                ("<f4", "|b1"),
                ("\"", "'"),
                ("true", "1"),
            ];
            let (from, to) = swaps[rng.random_range(0..swaps.len())];
            if text.contains(from) && b.len() == text.len() {
                b = text.replacen(from, to, 1).into_bytes();
            }
        }
        // NaN or infinity written over four bytes of data.
        6 => {
            if b.len() >= 8 {
                let i = rng.random_range(b.len() / 2..b.len() - 4) & !3;
                let v = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][rng.random_range(0..3)];
                b[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        // Random bytes over a stretch.
        _ => {
            let i = rng.random_range(0..n);
            for k in i..(i + rng.random_range(1..32)).min(b.len()) {
                b[k] = rng.random();
            }
        }
    }
    b
}

/// Runs `load` on `BUDGET` mutations of each seed, written to `target`;
/// returns (inputs, loaded, refused).
fn fuzz(
    name: &str,
    seeds: &[Vec<u8>],
    target: &Path,
    load: impl Fn(&Path) -> anyhow::Result<()>,
) -> (usize, usize, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed ^ name.len() as u64);
    let file_name = target.file_name().unwrap().to_str().unwrap().to_string();
    let (mut loaded, mut refused) = (0, 0);
    for k in 0..BUDGET {
        let seed = &seeds[k % seeds.len()];
        let input = mutate(seed, &mut rng);
        std::fs::write(target, &input).unwrap();
        let label = format!("{name} input {k} ({})", target.display());
        if let Ok(mut current) = CURRENT.lock() {
            let n = label.len().min(current.len());
            current.fill(b' ');
            current[..n].copy_from_slice(&label.as_bytes()[..n]);
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load(target)));
        match outcome {
            Err(_) => {
                let kept = target.with_extension("crash");
                std::fs::write(&kept, &input).unwrap();
                panic!("{name}: input {k} panicked; kept as {}", kept.display());
            }
            Ok(Ok(())) => loaded += 1,
            Ok(Err(e)) => {
                let message = format!("{e:#}");
                assert!(
                    message.contains(&file_name),
                    "{name}: input {k}: the error does not name the file: {message}"
                );
                refused += 1;
            }
        }
    }
    eprintln!(
        "fuzz {name}: {BUDGET} inputs, {loaded} loaded, {refused} refused with the file named"
    );
    (BUDGET, loaded, refused)
}

fn karpathy_seed() -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "dataset": "tiny",
        "images": [
            {"filename": "a.jpg", "imgid": 0, "cocoid": 17, "split": "train",
             "sentences": [{"raw": "A red circle."}, {"raw": "a big red circle"}]},
            {"filename": "b.jpg", "filepath": "val2014", "imgid": 1, "split": "val",
             "sentences": [{"raw": "Two blue stars, side by side."}]},
            {"filename": "c.jpg", "imgid": 2, "split": "test",
             "sentences": [{"raw": "a green square on a grey background"}],
             "scene": {"background": "gray", "objects": []}}
        ]
    }))
    .unwrap()
}

fn coco_seed() -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
        "annotations": [
            {"image_id": 1, "id": 10, "caption": "A dog runs."},
            {"image_id": 2, "id": 11, "caption": "Two cats, sleeping."},
            {"image_id": 2, "id": 12, "caption": "cats on a sofa"}
        ]
    }))
    .unwrap()
}

#[test]
fn data_set_files() {
    let dir = scratch("data");
    let target = dir.join("fuzz-input-dataset_tiny.json");
    let karpathy = fuzz("karpathy", &[karpathy_seed()], &target, |p| {
        karpathy::load_references(p).map(|_| ())
    });
    // With images looked for (none exist: every entry is skipped and named).
    let with_images = fuzz("karpathy with images", &[karpathy_seed()], &target, |p| {
        karpathy::load(p, Some(&dir)).map(|_| ())
    });
    let target = dir.join("fuzz-input-captions_val2014.json");
    let coco = fuzz("coco", &[coco_seed()], &target, |p| {
        coco::load_references(p).map(|_| ())
    });
    // The mutations reach both sides: inputs that still load, and inputs
    // refused (with the file named, checked inside `fuzz`).
    for (name, (_, loaded, refused)) in [("karpathy", karpathy), ("coco", coco)] {
        assert!(
            loaded > 0 && refused > 0,
            "{name}: {loaded} loaded, {refused} refused"
        );
    }
    // No listed image exists: every input, readable or not, is refused.
    assert_eq!(
        with_images.2, with_images.0,
        "karpathy with images: {with_images:?}"
    );
}

fn features_seed(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let features = Features {
        source: dir.join("seed.safetensors"),
        ids: vec!["1".into(), "2".into(), "3".into()],
        dim: 4,
        embeddings: (0..12).map(|i| i as f32 - 5.5).collect(),
        encoder: Some("captune-retriever:0123456789abcdef".into()),
        norms: Some(vec![1.5, 2.0, 0.5]),
    };
    features
        .save(&dir.join("seed.safetensors"), HashMap::new())
        .unwrap();
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
    let pad = 64 - (10 + header.len() + 1) % 64;
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend(((header.len() + pad + 1) as u16).to_le_bytes());
    npy.extend(header.as_bytes());
    npy.extend(std::iter::repeat_n(b' ', pad));
    npy.push(b'\n');
    npy.extend(features.embeddings.iter().flat_map(|v| v.to_le_bytes()));
    (std::fs::read(dir.join("seed.safetensors")).unwrap(), npy)
}

#[test]
fn features_files() {
    let dir = scratch("features");
    let (safetensors, npy) = features_seed(&dir);
    let target = dir.join("fuzz-input-features.safetensors");
    fuzz(
        "features (safetensors)",
        std::slice::from_ref(&safetensors),
        &target,
        |p| Features::load(p, None).map(|_| ()),
    );
    fuzz("safetensors metadata", &[safetensors], &target, |p| {
        captune::tensorfile::read_metadata(p).map(|_| ())
    });
    let ids = dir.join("ids.txt");
    std::fs::write(&ids, "1\n2\n3\n").unwrap();
    let target = dir.join("fuzz-input-features.npy");
    fuzz(
        "features (.npy)",
        std::slice::from_ref(&npy),
        &target,
        |p| Features::load(p, Some(&ids)).map(|_| ()),
    );
    // The ids file damaged instead, beside a valid .npy.
    let npy_path = dir.join("valid.npy");
    std::fs::write(&npy_path, &npy).unwrap();
    let target = dir.join("fuzz-input-ids.txt");
    fuzz("features ids", &[b"1\n2\n3\n".to_vec()], &target, |p| {
        Features::load(&npy_path, Some(p)).map(|_| ())
    });
}

fn tiny_captioner(b: &CpuBackend) -> Checkpoint<CpuBackend> {
    let vocab = CaptionVocab::from_words(vec!["a".into(), "red".into(), "circle".into()]);
    let config = CaptionerConfig {
        family: DecoderFamily::Prefix,
        image_tokens: 0,
        embed_dim: 4,
        prefix_len: 1,
        mapper_hidden: 4,
        mapper_activation: Activation::Gelu,
        mapper_transformer: None,
        decoder: TransformerConfig::new(8, 1, 2, true),
        lstm: None,
        vision: None,
        prompt: Default::default(),
        max_len: 5,
        vocab_size: vocab.len(),
        specials: SpecialIds::WORDS,
        prefix_predicts_first: false,
        raw_embeddings: false,
    };
    Checkpoint {
        model: Captioner::new(b, config, 0).unwrap(),
        vocab,
    }
}

/// Writes `from`'s tensors and metadata to `to`, changed by `edit`.
fn rewrite(from: &Path, to: &Path, edit: impl FnOnce(&mut captune::tensorfile::TensorFile)) {
    let mut file = captune::tensorfile::read(from).unwrap();
    edit(&mut file);
    let tensors: Vec<(&str, Vec<usize>, &[f32])> = file
        .tensors
        .iter()
        .map(|(k, t)| (k.as_str(), t.shape.clone(), t.data.as_slice()))
        .collect();
    captune::tensorfile::write(to, &tensors, file.metadata.clone()).unwrap();
}

#[test]
fn checkpoints_and_optimizer_state() {
    let b = CpuBackend::new();
    let dir = scratch("checkpoints");
    let ck = tiny_captioner(&b);
    let opt = AdamW::new(
        &b,
        AdamWConfig::default(),
        &ck.model.params().optimizer_layout(),
    );
    let run = RunFolder::new(dir.join("run"));
    run.start(false).unwrap();
    run.save_state(
        &b,
        &ck,
        &opt,
        // DiscriTune's running mean: the fuzzed file carries an objective's state.
        &ObjectiveState {
            objective: "discritune".into(),
            values: vec![-1.5, 12.0],
            guard: Default::default(),
        },
        Position { step: 3, epoch: 1 },
        HashMap::new(),
    )
    .unwrap();
    let captioner = std::fs::read(run.checkpoint()).unwrap();
    assert_eq!(
        ck.model.config.parameter_count(),
        ck.model.params().count() as u128,
        "the formula loading checks files against"
    );
    // A config asking for another size than the file holds is refused before allocating.
    let wide = dir.join("wide.safetensors");
    rewrite(&run.checkpoint(), &wide, |file| {
        let config = file.metadata["captioner_config"].replace("\"width\":8", "\"width\":4096");
        file.metadata.insert("captioner_config".into(), config);
    });
    let err = format!("{:#}", Checkpoint::load(&b, &wide).err().unwrap());
    assert!(
        err.contains("wide.safetensors") && err.contains("parameters"),
        "{err}"
    );
    let optimizer = std::fs::read(run.optimizer()).unwrap();

    // A checkpoint holding NaN weights is refused at load, its tensor named.
    let poisoned = dir.join("nan.safetensors");
    rewrite(&run.checkpoint(), &poisoned, |file| {
        file.tensors.get_mut("decoder.tokens").unwrap().data[5] = f32::NAN;
    });
    let err = format!("{:#}", Checkpoint::load(&b, &poisoned).err().unwrap());
    assert!(
        err.contains("nan.safetensors")
            && err.contains("\"decoder.tokens\"")
            && err.contains("NaN"),
        "{err}"
    );

    let target = dir.join("fuzz-input-captioner.safetensors");
    fuzz("captioner checkpoint", &[captioner], &target, |p| {
        Checkpoint::load(&b, p).map(|_| ())
    });
    let target = dir.join("fuzz-input-optimizer.safetensors");
    fuzz("optimizer state", &[optimizer], &target, |p| {
        let mut opt = AdamW::new(
            &b,
            AdamWConfig::default(),
            &ck.model.params().optimizer_layout(),
        );
        run_folder::load_optimizer(&b, &mut opt, p).map(|_| ())
    });

    let vocab = Vocab::from_words(vec!["a".into(), "red".into()]);
    let tower = |causal| TransformerConfig::new(8, 1, 2, causal);
    let config = RetrieverConfig {
        image_size: 8,
        patch: 4,
        image: tower(false),
        text: tower(true),
        max_len: 5,
        vocab_size: vocab.len(),
        embed_dim: 4,
        image_pool: captune::model::retriever::ImagePool::Mean,
        biases: true,
    };
    let retriever = captune::retriever::Checkpoint {
        model: captune::model::retriever::Retriever::new(&b, config, 1, 0).unwrap(),
        vocab,
    };
    assert_eq!(
        config.parameter_count(),
        retriever.model.params.count() as u128
    );
    let seed = dir.join("retriever.safetensors");
    retriever.save(&b, &seed, HashMap::new()).unwrap();
    let target = dir.join("fuzz-input-retriever.safetensors");
    fuzz(
        "retriever checkpoint",
        &[std::fs::read(seed).unwrap()],
        &target,
        |p| captune::retriever::Checkpoint::load(&b, p, 1).map(|_| ()),
    );
}

#[test]
fn run_folder_records_and_configs() {
    let dir = scratch("records");
    let log = br#"{"step":1,"epoch":1,"objective":"mle","loss":2.5,"mle":2.5,"smile":1.0,"lr":0.001,"grad_norm":1.2,"tokens_per_s":100.0}
{"step":2,"epoch":1,"objective":"smile (lambda 0.3)","loss":2.0,"mle":2.4,"smile":0.9,"lr":0.002,"grad_norm":1.1,"tokens_per_s":90.0}
"#;
    let metrics = br#"{"epoch":1,"step":2,"images":16,"BLEU-4":0.3,"CIDEr-D":1.2,"mean_length":7.5,"div1":null}
"#;
    let samples = br#"{"epoch":1,"step":2,"image_id":"20000","caption":"a red circle","tokens":[{"token":"a","mle_loss":0.1,"smile_loss":0.05,"p_full":0.9,"p_subset":0.95,"top5_full":[{"token":"a","probability":0.9}],"top5_subset":[]}],"samples":["a circle","red"]}
"#;
    // A saved state at step 1, so that resuming's repair reaches the records.
    let b = CpuBackend::new();
    let ck = tiny_captioner(&b);
    let opt = AdamW::new(
        &b,
        AdamWConfig::default(),
        &ck.model.params().optimizer_layout(),
    );
    for (file, seed) in [
        ("log.jsonl", &log[..]),
        ("metrics.jsonl", &metrics[..]),
        ("samples.jsonl", &samples[..]),
    ] {
        let run = dir.join("fuzz-input-run");
        let folder = RunFolder::new(&run);
        folder.start(false).unwrap();
        folder
            .save_state(
                &b,
                &ck,
                &opt,
                &Default::default(),
                Position { step: 1, epoch: 1 },
                HashMap::new(),
            )
            .unwrap();
        let target = run.join(file);
        fuzz(file, &[seed.to_vec()], &target, |p| {
            // The app's reader, from the start of the file each time.
            let mut history = History::default();
            RunFiles::new(p.parent().unwrap()).poll(&mut history)?;
            // Resuming's repair drops a damaged line, never fails on one.
            RunFolder::new(p.parent().unwrap()).recover()?;
            Ok(())
        });
        std::fs::remove_dir_all(&run).unwrap();
    }

    let preset = include_bytes!("../assets/presets/shapes.toml").to_vec();
    let target = dir.join("fuzz-input-config.toml");
    fuzz("run config", &[preset], &target, |p| {
        RunConfig::load(p).map(|_| ())
    });
}

#[test]
fn images() {
    let dir = scratch("images");
    let mut png = Vec::new();
    let picture =
        image::RgbImage::from_fn(12, 9, |x, y| image::Rgb([x as u8 * 20, y as u8 * 25, 7]));
    picture
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let mut jpeg = Vec::new();
    picture
        .write_to(
            &mut std::io::Cursor::new(&mut jpeg),
            image::ImageFormat::Jpeg,
        )
        .unwrap();
    for (name, seed) in [
        ("fuzz-input-image.png", png),
        ("fuzz-input-image.jpg", jpeg),
    ] {
        let target = dir.join(name);
        fuzz(name, &[seed], &target, |p| {
            let mut data = Dataset {
                name: "fuzzed".into(),
                items: vec![Item {
                    id: "1".into(),
                    split: Split::Test,
                    image: p.to_path_buf(),
                    captions: Vec::new(),
                    extensions: Default::default(),
                }],
                report: Default::default(),
            };
            images::load(&mut data, 16, &indicatif::ProgressBar::hidden()).map(|_| ())
        });
    }
}

/// A Hugging Face CLIP folder (tests/data/clip-tiny): its config.json, its
/// weights and its preprocessor_config.json, each damaged in a copy of the
/// folder while the others stay whole, read into a retriever and an image
/// processor.
#[test]
fn hugging_face_clip_folders() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip-tiny");
    let dir = scratch("clip");
    let files = [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "tokenizer.json",
    ];
    for file in files {
        std::fs::copy(fixture.join(file), dir.join(file)).unwrap();
    }
    let b = CpuBackend::new();
    for file in files {
        let seed = std::fs::read(fixture.join(file)).unwrap();
        let target = dir.join(file);
        let (_, loaded, refused) = fuzz(
            &format!("clip {file}"),
            std::slice::from_ref(&seed),
            &target,
            |_| {
                let clip = captune::model::clip::read(&dir)?;
                let max_len = clip.retriever.max_len;
                clip.into_retriever(&b, 2)?;
                captune::data::image_processor::ImageProcessor::load(&dir)?;
                captune::data::clip_text::ClipTokenizer::load(&dir, max_len).map(|_| ())
            },
        );
        std::fs::write(&target, seed).unwrap();
        assert!(refused > 0, "{file}: {loaded} loaded, {refused} refused");
    }
}

/// A Hugging Face GPT-2 folder (tests/data/gpt2-tiny): its config.json,
/// its weights and its tokenizer.json, each damaged in a copy of the
/// folder while the other two stay whole.
#[test]
fn hugging_face_gpt2_folders() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
    let dir = scratch("gpt2");
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture.join(file), dir.join(file)).unwrap();
    }
    let mut outcomes = Vec::new();
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        let seed = std::fs::read(fixture.join(file)).unwrap();
        let target = dir.join(file);
        let outcome = fuzz(
            &format!("gpt2 {file}"),
            std::slice::from_ref(&seed),
            &target,
            |_| {
                captune::model::gpt2::read(&dir, "decoder")?;
                captune::data::bpe::BpeVocab::load(&dir).map(|_| ())
            },
        );
        std::fs::write(&target, seed).unwrap();
        outcomes.push((file, outcome));
    }
    for (file, (_, loaded, refused)) in outcomes {
        assert!(refused > 0, "{file}: {loaded} loaded, {refused} refused");
    }
}

/// PyTorch checkpoints: the zip archive, its pickle and the tensors'
/// views, from the fixtures PyTorch saved (a state dict of every dtype
/// and view, and one nested in a training checkpoint).
#[test]
fn pytorch_checkpoints() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch");
    let seeds: Vec<Vec<u8>> = ["state_dict.pt", "nested.pt"]
        .iter()
        .map(|f| std::fs::read(fixtures.join(f)).unwrap())
        .collect();
    let dir = scratch("torch");
    let target = dir.join("fuzz-input-checkpoint.pt");
    let (_, loaded, refused) = fuzz("pytorch checkpoint", &seeds, &target, |p| {
        captune::torch_checkpoint::read_state_dict(p, None).map(|_| ())
    });
    assert!(
        loaded > 0 && refused > 0,
        "{loaded} loaded, {refused} refused"
    );
}

/// ClipCap's own checkpoints read into a captioner (with the tiny GPT-2's
/// config and tokenizer), and BLIP's own converted to a BLIP folder: the
/// weight maps on top of the PyTorch reader
/// (tests/data/clipcap-original, tests/data/blip-original,
/// tests/data/self-critical: its model and its vocabulary in turn).
#[test]
fn clipcap_and_blip_checkpoints() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let read = |files: &[&str]| -> Vec<Vec<u8>> {
        files
            .iter()
            .map(|f| std::fs::read(data.join(f)).unwrap())
            .collect()
    };
    let dir = scratch("published");
    let b = CpuBackend::new();
    let gpt2 = data.join("gpt2-tiny");
    let seeds = read(&["clipcap-original/mlp.pt", "clipcap-original/transformer.pt"]);
    let target = dir.join("fuzz-input-clipcap.pt");
    let (_, loaded, refused) = fuzz("clipcap checkpoint", &seeds, &target, |p| {
        captune::captioner::clipcap::read(&b, p, &gpt2, 12).map(|_| ())
    });
    assert!(
        loaded > 0 && refused > 0,
        "clipcap: {loaded} loaded, {refused} refused"
    );
    let (blip, out) = (data.join("blip-tiny"), dir.join("converted"));
    let seeds = read(&["blip-original/model.pth"]);
    let target = dir.join("fuzz-input-blip.pth");
    let (_, loaded, refused) = fuzz("blip checkpoint", &seeds, &target, |p| {
        let converted = captune::model::blip_original::convert(p, &blip, &out);
        let _ = std::fs::remove_dir_all(&out);
        converted
    });
    assert!(
        loaded > 0 && refused > 0,
        "blip: {loaded} loaded, {refused} refused"
    );
    use captune::captioner::self_critical;
    let vocab = data.join("self-critical/cocotalk.json");
    for (model, tokens) in [("fc", None), ("updown", Some(5))] {
        let model = data.join(format!("self-critical/{model}.pth"));
        let seeds = [std::fs::read(&model).unwrap()];
        let target = dir.join("fuzz-input-self-critical.pth");
        let (_, loaded, refused) = fuzz("self-critical model", &seeds, &target, |p| {
            self_critical::read(&b, p, &vocab, 10, tokens).map(|_| ())
        });
        assert!(
            loaded > 0 && refused > 0,
            "self-critical {}: {loaded} loaded, {refused} refused",
            model.display()
        );
    }
    let seeds = [std::fs::read(&vocab).unwrap()];
    let target = dir.join("fuzz-input-cocotalk.json");
    let model = data.join("self-critical/fc.pth");
    let (_, loaded, refused) = fuzz("self-critical vocabulary", &seeds, &target, |p| {
        self_critical::read(&b, &model, p, 10, None).map(|_| ())
    });
    assert!(
        loaded > 0 && refused > 0,
        "self-critical vocabulary: {loaded} loaded, {refused} refused"
    );
}

/// METEOR's data (tests/data/meteor/tiny, made up in METEOR's layout): the
/// jar's deflated resources, then the gzipped paraphrase table, each
/// damaged in a copy of the folder while the other stays whole, read and
/// used to score a caption.
#[test]
fn meteor_data() {
    use captune::metrics::meteor::{Meteor, MeteorData};
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/meteor/tiny");
    let score = |dir: &Path| {
        let mut meteor = Meteor::load(&MeteorData::at(dir)?)?;
        let candidates = ["a big dog rides on the grass".to_string()];
        let references = [vec!["a large hound is riding on the lawn".to_string()]];
        meteor.score(&candidates, &references).map(|_| ())
    };
    for file in ["meteor-1.5.jar", "data/paraphrase-en.gz"] {
        let dir = scratch(&format!("meteor-{}", file.replace('/', "-")));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        for f in ["meteor-1.5.jar", "data/paraphrase-en.gz"] {
            std::fs::copy(tiny.join(f), dir.join(f)).unwrap();
        }
        let seeds = [std::fs::read(tiny.join(file)).unwrap()];
        let (_, loaded, refused) =
            fuzz(&format!("METEOR's {file}"), &seeds, &dir.join(file), |_| {
                score(&dir)
            });
        assert!(
            loaded > 0 && refused > 0,
            "{file}: {loaded} loaded, {refused} refused"
        );
    }
}
