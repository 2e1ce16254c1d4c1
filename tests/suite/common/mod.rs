//! Helpers shared by the integration tests.

use captune::backend::Backend;
use captune::captioner::Checkpoint;
use captune::captioner::run::RunConfig;
use captune::captioner::run_folder::{Begin, RunFolder};
use captune::captioner::train::Trainer;
use captune::data::karpathy;
use captune::gpu::{GpuBackend, adapter};
use captune::retriever::frozen::FrozenRetriever;
use captune::shapes::{self, Domain, ShapesConfig};
use captune::source::embeddings::CaptionData;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The shapes-world settings of a tiny world for command-line tests:
/// 32-pixel images, 48 training, 16 validation and 16 test images.
pub const TINY_WORLD_ARGS: [&str; 8] = [
    "--shapes-size",
    "32",
    "--shapes-train",
    "48",
    "--shapes-val",
    "16",
    "--shapes-test",
    "16",
];

/// Marks the running test as skipped where CI shows it: a line on
/// standard error, and one in the file `$CAPTUNE_SKIP_LOG`, which
/// scripts/test.sh counts and prints after the tests (cargo test itself
/// shows neither for a passing test).
pub fn skip(why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    eprintln!("SKIPPED: {test}: {why}");
    if let Some(path) = std::env::var_os("CAPTUNE_SKIP_LOG") {
        use std::io::Write;
        let line = format!("{test}: {why}\n");
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// The Flickr8k folder (the Karpathy split file `dataset_flickr8k.json`
/// and the images) named by `$CAPTUNE_FLICKR8K`; without it the calling
/// test is marked skipped and gets `None`.
pub fn flickr8k() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("CAPTUNE_FLICKR8K").map(PathBuf::from) else {
        skip("CAPTUNE_FLICKR8K is not set (a folder holding dataset_flickr8k.json and the images)");
        return None;
    };
    if !dir.join("dataset_flickr8k.json").is_file() {
        skip(&format!(
            "CAPTUNE_FLICKR8K={} holds no dataset_flickr8k.json",
            dir.display()
        ));
        return None;
    }
    Some(dir)
}

/// The GPU backend on the best adapter (lavapipe in CI). A machine without
/// any adapter fails these tests with the fix, unless
/// CAPTUNE_SKIP_GPU_TESTS=1 says to skip them. An adapter whose device
/// cannot be created always fails them: that is a bug to see, not a
/// missing driver.
pub fn gpu() -> Option<GpuBackend> {
    let backends = adapter::backends_from_env().unwrap();
    match adapter::adapters(backends).into_iter().next() {
        Some(found) => Some(GpuBackend::new(&found).unwrap_or_else(|e| {
            panic!("a GPU adapter exists but its device cannot be created: {e:#}")
        })),
        None if std::env::var("CAPTUNE_SKIP_GPU_TESTS").as_deref() == Ok("1") => {
            skip("no GPU adapter, and CAPTUNE_SKIP_GPU_TESTS=1 is set");
            None
        }
        None => panic!(
            "no GPU adapter: install a Vulkan driver (Debian: apt-get install mesa-vulkan-drivers), \
             or set CAPTUNE_SKIP_GPU_TESTS=1 to skip the GPU tests"
        ),
    }
}

/// `count` distinct coordinates of a tensor of `len` (all of them when it
/// is smaller), drawn with a generator seeded by `what`: a gradient check
/// probes every part of a tensor (every head, every dimension of q, k and
/// v), not a fixed stride that keeps landing on the same ones.
pub fn probes(what: &str, len: usize, count: usize) -> Vec<usize> {
    use rand::seq::SliceRandom;
    let seed = what.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut all: Vec<usize> = (0..len).collect();
    all.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    all.truncate(count);
    all.sort_unstable();
    all
}

/// How a finite-difference check probes a gradient: central differences
/// of step `eps` (in f32, the loss summed in f64) at `count` coordinates,
/// each within `atol + rtol |numeric|`.
pub struct Probing {
    pub eps: f32,
    pub count: usize,
    pub atol: f32,
    pub rtol: f32,
}

/// Checks `analytic`, the gradient of `loss` at `x`, against central
/// differences at the coordinates `probes(what, ..)` draws.
#[track_caller]
pub fn check_gradient(
    what: &str,
    x: &[f32],
    analytic: &[f32],
    mut loss: impl FnMut(&[f32]) -> f64,
    probing: &Probing,
) {
    assert_eq!(x.len(), analytic.len(), "{what}: gradient length");
    let mut x = x.to_vec();
    for i in probes(what, x.len(), probing.count) {
        let orig = x[i];
        x[i] = orig + probing.eps;
        let up = loss(&x);
        x[i] = orig - probing.eps;
        let down = loss(&x);
        x[i] = orig;
        let numeric = ((up - down) / (2.0 * probing.eps as f64)) as f32;
        let tol = probing.atol + probing.rtol * numeric.abs();
        assert!(
            (numeric - analytic[i]).abs() <= tol,
            "{what}: d/dx[{i}] is {} analytically but {numeric} numerically",
            analytic[i]
        );
    }
}

/// Checks every parameter's gradient `grads[p]` against central
/// differences (step `eps`) of `loss` at 6 random coordinates of it,
/// changing one element of `params(model)` at a time.
pub fn check_parameter_gradients<M>(
    model: &mut M,
    params: impl Fn(&mut M) -> &mut captune::model::params::Params<captune::cpu::CpuBackend>,
    grads: &[Vec<f32>],
    eps: f32,
    mut loss: impl FnMut(&mut M) -> f64,
) {
    for (p, grad) in grads.iter().enumerate() {
        let name = params(model).specs[p].name.clone();
        let original = params(model).values[p].clone();
        for i in probes(&name, grad.len(), 6) {
            let mut at = |delta: f32| {
                let mut x = original.clone();
                x[i] += delta;
                params(model).values[p] = x;
                loss(model)
            };
            let numeric = ((at(eps) - at(-eps)) / (2.0 * f64::from(eps))) as f32;
            params(model).values[p] = original.clone();
            let tol = 3e-3 + 3e-2 * numeric.abs();
            assert!(
                (numeric - grad[i]).abs() <= tol,
                "{name}[{i}]: {} analytically, {numeric} numerically",
                grad[i]
            );
        }
    }
}

pub fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

pub fn random_ids(len: usize, below: u32, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(0..below)).collect()
}

/// The largest difference, relative to the largest magnitude of `want`:
/// how the tests against transformers' float64 fixtures compare tensors.
pub fn relative_difference(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-12);
    got.iter()
        .zip(want)
        .fold(0.0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

/// Id sequences a fixture stores as rows of `width` floats, each padded
/// with -1 after its ids.
pub fn padded_ids(data: &[f32], width: usize) -> Vec<Vec<u32>> {
    data.chunks(width)
        .map(|row| {
            row.iter()
                .take_while(|&&x| x >= 0.0)
                .map(|&x| x as u32)
                .collect()
        })
        .collect()
}

/// Asserts |a - b| <= atol + rtol * |b| elementwise, naming the worst element.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let mut worst: Option<(usize, f32)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        let fails = excess.is_nan() || excess > 0.0;
        if fails && worst.is_none_or(|(_, e)| excess > e || excess.is_nan()) {
            worst = Some((i, excess));
        }
    }
    if let Some((i, _)) = worst {
        panic!(
            "{what}: element {i} is {} but should be {} (rtol {rtol}, atol {atol})",
            got[i], want[i]
        );
    }
}

/// A path in the temporary folder that no other test, process or earlier
/// run uses: process ids repeat from one CI run to the next and across
/// containers sharing the folder, and what a failed run left must never
/// meet this one. `name` ends the path, so an extension stays one.
pub fn fresh_temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "captune-{}-{name}",
        captune::tensorfile::temporary_suffix()
    ))
}

/// The captune binary on the CPU with `cache` as its cache: whether it
/// succeeded, its stdout and its stderr.
pub fn captune_on_cpu(cache: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_captune"))
        .args(["--device", "cpu"])
        .args(args)
        .env("CAPTUNE_CACHE", cache)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// The embedding width of [`tiny_data`].
pub const TINY_DIM: usize = 8;

/// A 32-pixel shapes world (96 train, 16 val, 16 test images) with a
/// random embedding per image, written once per test binary.
pub fn tiny_data() -> CaptionData {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = fresh_temp("tiny-world");
        let config = ShapesConfig {
            seed: 9,
            image_size: 32,
            train: 96,
            val: 16,
            test: 16,
            domain: Domain::Default,
        };
        shapes::write(&config, &dir).unwrap();
        dir
    });
    let data = karpathy::load(&dir.join(shapes::SPLIT_FILE), None).unwrap();
    let features = random(data.items.len() * TINY_DIM, 3);
    CaptionData {
        data,
        features,
        dim: TINY_DIM,
        norms: None,
        image_tokens: None,
        pixels: None,
        source: None,
    }
}

/// A new training run of `config` in an empty temporary folder named
/// after `name` (the caller removes it): the trainer and the folder.
pub fn new_run<'d, B: Backend>(
    b: &B,
    ck: &'d mut Checkpoint<B>,
    data: &'d CaptionData,
    config: &RunConfig,
    name: &str,
    retriever: Option<&'d mut FrozenRetriever<B>>,
) -> (Trainer<'d, B>, PathBuf) {
    let dir = fresh_temp(name);
    let run = RunFolder::new(&dir);
    let trainer = Trainer::new(b, ck, data, config, run, Begin::New, retriever).unwrap();
    (trainer, dir)
}

/// Every objective of the registry trains the captioner that
/// `config_of(objective)` starts (fresh from its config, as `train`
/// starts it) for two tiny epochs of 6 steps on `data`, with the tiny
/// retriever for those that read one: the loss stays finite, the tensor
/// `watched` moves, an objective that rewards nothing lowers its loss from
/// the first epoch to the second, and the saved checkpoint loads back with
/// the same vocabulary and config. (A random pretrained decoder's rewards
/// are noise, too little for a direction to show; the collapse guard is
/// off for the same reason.)
pub fn every_objective_trains(
    data: &CaptionData,
    config_of: impl Fn(&str) -> RunConfig,
    watched: &str,
) {
    use captune::captioner::objectives;
    use captune::captioner::records::{Event, Flow};
    use captune::captioner::train::fresh_checkpoint;
    let b = captune::cpu::CpuBackend::new();
    let value = |ck: &Checkpoint<captune::cpu::CpuBackend>| {
        let p = ck.model.params();
        let at = p.specs.iter().position(|s| s.name == watched).unwrap();
        b.to_vec(&p.values[at])
    };
    for info in objectives::OBJECTIVES {
        let mut config = config_of(info.name);
        config.train.collapse_stop = false;
        let mut ck = fresh_checkpoint(&b, data, &config).unwrap();
        let before = value(&ck);
        let mut retriever = tiny_retriever(&b, data, 8);
        let name = format!("objective-{}", info.name);
        let (mut trainer, dir) = new_run(&b, &mut ck, data, &config, &name, Some(&mut retriever));
        let mut losses = Vec::new();
        for _ in 0..12 {
            trainer
                .train_batch(&b, |e| {
                    if let Event::Log(line) = e {
                        losses.push(line.values["loss"]);
                    }
                    Flow::Continue
                })
                .unwrap();
        }
        trainer.save(&b, &dir.join("trained.safetensors")).unwrap();
        drop(trainer);
        assert_eq!(losses.len(), 12, "{}: a log line per step", info.name);
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{}: losses {losses:?}",
            info.name
        );
        assert_ne!(before, value(&ck), "{}: the decoder learns", info.name);
        if info.reward.is_none() {
            let epoch = |e: &[f32]| e.iter().sum::<f32>() / 6.0;
            let (first, second) = (epoch(&losses[..6]), epoch(&losses[6..]));
            assert!(second < first, "{}: the loss falls: {losses:?}", info.name);
        }
        let loaded = Checkpoint::load(&b, &dir.join("trained.safetensors")).unwrap();
        assert_eq!(
            loaded.vocab, ck.vocab,
            "{}: the vocabulary comes back",
            info.name
        );
        assert_eq!(loaded.model.config, ck.model.config);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// [`tiny_retriever_checkpoint`], frozen.
pub fn tiny_retriever<B: Backend>(b: &B, data: &CaptionData, batch: usize) -> FrozenRetriever<B> {
    FrozenRetriever::from_checkpoint(b, tiny_retriever_checkpoint(b, data, batch)).unwrap()
}

/// A fresh retriever over the tiny world's words that embeds in the
/// features' width ([`tiny_data`]'s), for batches of `batch`.
pub fn tiny_retriever_checkpoint<B: Backend>(
    b: &B,
    data: &CaptionData,
    batch: usize,
) -> captune::retriever::Checkpoint<B> {
    let vocab = captune::data::vocab::Vocab::build(&data.data, 1);
    let tower = |causal| captune::model::transformer::TransformerConfig::new(16, 1, 2, causal);
    let config = captune::model::retriever::RetrieverConfig {
        image_size: 32,
        patch: 8,
        image: tower(false),
        text: tower(true),
        max_len: 24,
        vocab_size: vocab.len(),
        embed_dim: TINY_DIM,
        image_pool: captune::model::retriever::ImagePool::Mean,
        biases: true,
    };
    captune::retriever::Checkpoint {
        model: captune::model::retriever::Retriever::new(b, config, batch, 5).unwrap(),
        vocab,
    }
}

/// `python3` where it imports torch and safetensors (what the PyTorch
/// package, `python/`, needs); otherwise the calling test is marked
/// skipped and gets `None`.
pub fn python_with_torch() -> Option<&'static str> {
    python_importing(
        "torch, safetensors",
        "python3 cannot import torch and safetensors: the PyTorch package's tests need them \
         (pip install ./python)",
    )
}

/// `python3` where it imports torch, transformers and safetensors (what
/// `scripts/check_export.py` needs); otherwise the calling test is marked
/// skipped and gets `None`.
pub fn python_with_transformers() -> Option<&'static str> {
    python_importing(
        "torch, transformers, safetensors",
        "python3 cannot import torch, transformers and safetensors: the check of an export \
         with transformers needs them (pip install torch transformers safetensors)",
    )
}

/// `python3` where `import {modules}` succeeds; otherwise the calling test
/// is marked skipped, saying `why`.
fn python_importing(modules: &str, why: &str) -> Option<&'static str> {
    let found = std::process::Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        skip(why);
        return None;
    }
    Some("python3")
}

/// The repository's `python/` folder, where the PyTorch package and its
/// tests live.
pub fn python_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// Checks a DiscriTune explanation (as JSON) against itself: the five
/// best matches are the candidates by falling cosine, each probability
/// is exp(scale x cosine) over one normaliser (so any two differ by the
/// same positive scale), the caption's rank is its own image's place
/// among them (past them when it is not there), and the reward is the
/// log-probability of its own image (below the fifth's when not shown).
pub fn assert_discritune_explanation(e: &serde_json::Value) {
    let candidates = e["figures"]["candidates"].as_f64().unwrap();
    let rank = e["figures"]["rank"].as_f64().unwrap();
    let reward = e["reward"].as_f64().unwrap();
    let best = e["compared_with"].as_array().unwrap();
    assert_eq!(
        best.len(),
        5.min(candidates as usize),
        "the five best matches: {e}"
    );
    let figure = |c: &serde_json::Value, k: &str| c["figures"][k].as_f64().unwrap();
    let scales: Vec<f64> = best
        .windows(2)
        .map(|w| {
            let (a, b) = (&w[0], &w[1]);
            let cosines = figure(a, "cosine") - figure(b, "cosine");
            assert!(cosines >= 0.0, "by falling cosine: {e}");
            (figure(a, "probability").ln() - figure(b, "probability").ln()) / cosines
        })
        .filter(|s| s.is_finite())
        .collect();
    assert!(!scales.is_empty(), "distinct cosines among the five: {e}");
    for s in &scales {
        assert!(
            *s > 1.0 && (s - scales[0]).abs() < 1e-3 * scales[0],
            "one scale: {scales:?} {e}"
        );
    }
    // The probabilities of all the candidates sum to 1: shown whole when
    // there are five or fewer.
    let total: f64 = best.iter().map(|c| figure(c, "probability")).sum();
    if best.len() == candidates as usize {
        assert!((total - 1.0).abs() < 1e-9, "{total}: {e}");
    } else {
        assert!(total < 1.0 + 1e-9, "{total}: {e}");
    }
    match best.iter().position(|c| c["kind"] == "own image") {
        Some(place) => {
            assert_eq!(rank, place as f64 + 1.0, "{e}");
            let p_own = figure(&best[place], "probability");
            assert!((p_own.ln() - reward).abs() < 1e-6, "{e}");
        }
        None => {
            assert!(rank > 5.0 && rank <= candidates, "{e}");
            assert!(reward < figure(&best[4], "probability").ln(), "{e}");
        }
    }
}
