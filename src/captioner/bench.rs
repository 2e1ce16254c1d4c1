//! `captune bench train`: captioner training throughput in tokens per
//! second, one complete step each time (forward, loss, backward, AdamW),
//! with a preset's or a config file's network on 128-dimensional image
//! embeddings, on two workloads: a synthetic one that
//! `scripts/bench_torch_captioner.py` reproduces in PyTorch (79 ids by
//! default, the shapes world's size, or GPT-2's 50257; every caption the
//! full `max_len - 1` tokens, no padding), and real shapes-world captions
//! in batches trimmed as training trims them.
//! `captune bench decode`: captions per second of generation.
//! `captune bench scst`: SCST steps per second (5 samples and the greedy
//! caption per image, CIDEr-D rewards, the update) on a synthetic corpus
//! that `scripts/bench_torch_scst.py` reproduces in PyTorch, and the
//! step's split into sampling, rewards and the update.

use super::CaptionVocab;
use super::model::Captioner;
use super::objective::{Objective, StepContext, TrainingBatch, TrainingCorpus};
use super::objectives::{self, settings::Settings};
use super::run::RunConfig;
use super::train::optimise;
use crate::backend::{Backend, BackendKind, DeviceCounters, WorkgroupSummary};
use crate::bench::{MemoryUse, matmul_summary, per};
use crate::data::Split;
use crate::data::tokenize::ptb_tokenize;
use crate::kernel_profile::KernelProfile;
use crate::optim::{AdamW, AdamWConfig};
use crate::shapes;
use crate::source::embeddings::CaptionData;
use anyhow::{Result, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::BTreeSet;
use std::time::Instant;

pub const EMBED_DIM: usize = 128;
/// Image tokens per image of an attention LSTM's synthetic inputs: the 36
/// regions of bottom-up features (Anderson et al., 2018).
pub const BENCH_TOKENS: usize = 36;
/// The synthetic vocabulary's ids unless told otherwise: the shapes
/// world's size.
pub const VOCAB: usize = 79;

/// What a benchmark times: a run config's network and batch, named, and
/// the size of its synthetic vocabulary.
pub struct BenchModel {
    /// The preset's name or the config file's path.
    pub name: String,
    pub run: RunConfig,
    /// Ids of the synthetic vocabulary (GPT-2 has 50257).
    pub synthetic_vocab: usize,
    /// Whether to profile one more step (or decoded batch) kernel by
    /// kernel, where the backend can.
    pub profile: bool,
}

impl BenchModel {
    /// A preset's network, or a config file's when `config` is given;
    /// `batch` replaces the config's batch.
    pub fn new(
        preset: &str,
        config: Option<&std::path::Path>,
        vocab: usize,
        batch: Option<usize>,
    ) -> Result<BenchModel> {
        if vocab < 5 {
            bail!("--vocab {vocab}: the synthetic vocabulary needs at least 5 ids");
        }
        let (mut run, name) = match config {
            Some(path) => (RunConfig::load(path)?, path.display().to_string()),
            None => (RunConfig::preset(preset)?, preset.to_string()),
        };
        if let Some(batch) = batch {
            if batch == 0 {
                bail!("--batch must be positive");
            }
            run.train.batch = batch;
        }
        Ok(BenchModel {
            name,
            run,
            synthetic_vocab: vocab,
            profile: false,
        })
    }

    /// The synthetic vocabulary: the specials, then `w4`, `w5`, ...
    fn vocab(&self) -> CaptionVocab {
        CaptionVocab::from_words((4..self.synthetic_vocab).map(|i| format!("w{i}")).collect())
    }

    /// The config's pretrained BLIP decoder with its tokenizer, when it
    /// names one (`decoder = "hf:FOLDER"`): the network and vocabulary
    /// timed instead of a fresh one.
    fn pretrained<B: Backend>(&self, b: &B) -> Result<Option<super::Checkpoint<B>>> {
        let m = &self.run.model;
        let Some(dir) = m.blip_folder()? else {
            if m.decoder_folder()?.is_some() {
                bail!(
                    "{}: the benchmarks time BLIP folders and fresh networks (prefix or LSTM)",
                    self.name
                );
            }
            return Ok(None);
        };
        let blip = crate::model::blip::read(&dir)?;
        let shape = (m.max_len, m.prompt.as_deref());
        let ck = super::blip::blip_checkpoint(b, &dir, blip, shape, m.train_vision)?;
        Ok(Some(ck))
    }

    /// The network timed, fresh (with `vocab`) or pretrained.
    fn checkpoint<B: Backend>(
        &self,
        b: &B,
        pretrained: Option<super::Checkpoint<B>>,
        vocab: CaptionVocab,
    ) -> Result<super::Checkpoint<B>> {
        Ok(match pretrained {
            Some(ck) => ck,
            None => super::Checkpoint {
                model: Captioner::new(b, self.fresh_network(vocab.len()), 0)?,
                vocab,
            },
        })
    }

    /// The config's network on `EMBED_DIM`-wide image inputs: one
    /// embedding, or for an attention LSTM [`BENCH_TOKENS`] tokens.
    fn fresh_network(&self, vocab: usize) -> super::CaptionerConfig {
        let mut c = self.run.captioner(EMBED_DIM, vocab);
        if c.lstm.is_some_and(|l| l.model.reads_tokens()) {
            c.image_tokens = BENCH_TOKENS;
        }
        c
    }
}

/// `n` values in [-0.1, 0.1): random image inputs.
fn random_inputs(n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-0.1..0.1)).collect()
}

#[derive(Clone, Debug, Serialize)]
pub struct TrainBench {
    pub op: String,
    pub backend: BackendKind,
    pub adapter: String,
    pub preset: String,
    pub objective: String,
    pub workload: Workload,
    pub batch: usize,
    /// Real (not padding) tokens per step, on average.
    pub tokens_per_step: f64,
    pub parameters: usize,
    pub steps: usize,
    pub seconds_per_step: f64,
    pub tokens_per_s: f64,
    #[serde(flatten)]
    pub memory: MemoryUse,
    /// Per training step, on the GPU backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_step: Option<DeviceCounters>,
    /// Its matmul dispatches per step and their workgroups, on the GPU.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub matmuls: Option<WorkgroupSummary>,
    /// One more step's device time by kernel (`--profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelProfile>,
}

impl std::fmt::Display for TrainBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<4} train {} ({}) batch {}, {} captions: {:9.0} tokens/s ({:.1} ms/step)",
            self.backend,
            self.preset,
            self.objective,
            self.batch,
            match self.workload {
                Workload::Synthetic => "synthetic",
                Workload::Shapes => "shapes-world",
            },
            self.tokens_per_s,
            self.seconds_per_step * 1e3
        )?;
        write!(f, "{}", self.memory)?;
        if let Some(c) = &self.per_step {
            write!(f, "; per step: {c}")?;
        }
        if let Some(m) = &self.matmuls {
            write!(f, "; {m}")?;
        }
        if let Some(k) = &self.kernels {
            write!(f, "; {k}")?;
        }
        Ok(())
    }
}

/// What a benchmarked training step learns from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Random words, every caption the full `max_len - 1` tokens: the
    /// workload `scripts/bench_torch_captioner.py` reproduces, in positions/s.
    Synthetic,
    /// Shapes-world captions (one reference per image), batched by length
    /// and trimmed as training does: real tokens/s.
    Shapes,
}

/// Batches of caption ids for `workload`, and their vocabulary.
fn workload_batches(
    workload: Workload,
    bench: &BenchModel,
    pretrained: Option<&super::Checkpoint<impl Backend>>,
    batches: usize,
    rng: &mut ChaCha8Rng,
) -> Result<(CaptionVocab, Vec<Vec<Vec<u32>>>)> {
    // A pretrained decoder may take fewer caption ids than the config.
    let max_len = pretrained.map_or(bench.run.model.max_len, |ck| ck.model.config.max_len);
    let pretrained = pretrained.map(|ck| &ck.vocab);
    let batch = bench.run.train.batch;
    let t = max_len - 1;
    Ok(match workload {
        Workload::Synthetic => {
            let vocab = pretrained.cloned().unwrap_or_else(|| bench.vocab());
            let (s, ids) = (vocab.specials(), vocab.len() as u32);
            let word = |rng: &mut ChaCha8Rng| loop {
                let id = rng.random_range(4..ids);
                if ![s.start, s.end, s.pad].contains(&id) {
                    return id;
                }
            };
            // The start, t - 1 random words, the end: t inputs and t
            // targets per caption.
            let one: Vec<Vec<u32>> = (0..batch)
                .map(|_| {
                    std::iter::once(s.start)
                        .chain((1..t).map(|_| word(rng)))
                        .chain(std::iter::once(s.end))
                        .collect()
                })
                .collect();
            (vocab, vec![one; batches])
        }
        Workload::Shapes => {
            let captions: Vec<Vec<String>> = (0..batch * batches)
                .map(|i| {
                    let image = shapes::generate(0, shapes::Domain::Default, Split::Train, i);
                    let refs = &image.references;
                    ptb_tokenize(&refs[rng.random_range(0..refs.len())].1)
                })
                .collect();
            let vocab = pretrained.cloned().unwrap_or_else(|| {
                let words: BTreeSet<&String> = captions.iter().flatten().collect();
                CaptionVocab::from_words(words.into_iter().cloned().collect())
            });
            let encoded: Vec<Vec<u32>> = (captions.iter())
                .map(|c| vocab.encode(c, max_len))
                .collect::<Result<_>>()?;
            // Batched by length, as training batches them.
            let ordered = super::epoch_plan::batches_by_length(encoded, batch, Vec::len, rng);
            (vocab, ordered.chunks(batch).map(<[_]>::to_vec).collect())
        }
    })
}

/// Times `steps` training steps of objective `name` (default settings)
/// on `workload` after `warmup` untimed ones. Each caption is also its
/// image's one reference, for objectives that reward against references.
pub fn train_throughput<B: Backend>(
    b: &B,
    bench: &BenchModel,
    name: &str,
    workload: Workload,
    warmup: usize,
    steps: usize,
) -> Result<TrainBench> {
    let settings = Settings::new();
    let needs = (objectives::find(name)?.needs)(&settings);
    if needs.retriever || needs.image_embeddings {
        bail!(
            "bench train times objectives that train on captions alone; {name} needs a retriever"
        );
    }
    MemoryUse::reset();
    let run = &bench.run;
    let batch = run.train.batch;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let pretrained = bench.pretrained(b)?;
    let (vocab, batches) = workload_batches(
        workload,
        bench,
        pretrained.as_ref(),
        warmup + steps,
        &mut rng,
    )?;
    let super::Checkpoint { mut model, vocab } = bench.checkpoint(b, pretrained, vocab)?;
    let mut opt = AdamW::new(
        b,
        AdamWConfig::default(),
        &model.params().optimizer_layout(),
    );
    let mut trained = objectives::build::<B>(name, &settings, vocab.len())?;
    let features = random_inputs(batch * model.config.image_input_len(), &mut rng);
    let references = batches
        .iter()
        .flatten()
        .map(|s| vec![vocab.decode_words(&s[1..])])
        .collect();
    let corpus = TrainingCorpus::new(format!("bench-train-{workload:?}"), references);
    // Returns the step's real tokens.
    let mut first_image = 0;
    let mut step = |sequences: &[Vec<u32>]| -> Result<usize> {
        let batch = TrainingBatch {
            inputs: features.clone(),
            embeddings: None,
            sequences: sequences.to_vec(),
            images: (first_image..first_image + sequences.len()).collect(),
            labelled: None,
        };
        first_image += sequences.len();
        let mut cx = StepContext {
            b,
            model: &mut model,
            vocab: &vocab,
            batch: &batch,
            corpus: &corpus,
            gradient_weight: 1.0,
            retriever: None,
            rng: &mut rng,
            monitor: false,
        };
        optimise(&mut opt, trained.as_mut(), &mut cx)?;
        Ok(batch.tokens())
    };
    for sequences in &batches[..warmup] {
        step(sequences)?;
    }
    b.flush();
    let before = b.counters();
    let matmuls_before = b.matmul_workgroups();
    let start = Instant::now();
    let mut tokens = 0;
    for sequences in &batches[warmup..] {
        tokens += step(sequences)?;
    }
    b.flush();
    let seconds = start.elapsed().as_secs_f64() / steps as f64;
    let per_step = per(b.counters(), before, steps);
    let matmuls = matmul_summary(b, matmuls_before, steps);
    let kernels = kernel_profile(b, bench.profile, || step(&batches[warmup]).map(drop))?;
    let parameters = model.params().count();
    Ok(TrainBench {
        op: "train".into(),
        backend: b.kind(),
        adapter: b.adapter_name(),
        preset: bench.name.clone(),
        objective: trained.describe(),
        workload,
        batch,
        tokens_per_step: tokens as f64 / steps as f64,
        parameters,
        steps,
        seconds_per_step: seconds,
        tokens_per_s: tokens as f64 / steps as f64 / seconds,
        memory: MemoryUse::now(b),
        per_step,
        matmuls,
        kernels,
    })
}

/// `work` run once more under a kernel profile, where `wanted` and the
/// backend can profile: its device time by kernel.
fn kernel_profile<B: Backend>(
    b: &B,
    wanted: bool,
    work: impl FnOnce() -> Result<()>,
) -> Result<Option<KernelProfile>> {
    if !wanted || !b.start_kernel_profile() {
        return Ok(None);
    }
    let done = work();
    let profile = b.finish_kernel_profile();
    done.map(|()| profile)
}

#[derive(Clone, Debug, Serialize)]
pub struct DecodeBench {
    pub op: String,
    pub backend: BackendKind,
    pub adapter: String,
    pub preset: String,
    pub decoding: String,
    pub images: usize,
    /// Images decoded at once (a decoded batch).
    pub batch: usize,
    pub captions: usize,
    /// Chosen tokens, <eos> included.
    pub tokens: usize,
    pub seconds: f64,
    pub captions_per_s: f64,
    pub tokens_per_s: f64,
    #[serde(flatten)]
    pub memory: MemoryUse,
    /// Per decoded batch, on the GPU backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_batch: Option<DeviceCounters>,
    /// Its matmul dispatches per decoded batch and their workgroups.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub matmuls: Option<WorkgroupSummary>,
    /// One more decoded batch's device time by kernel (`--profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelProfile>,
}

impl std::fmt::Display for DecodeBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<4} decode {} {} on {} images: {:8.1} captions/s, {:9.0} tokens/s",
            self.backend,
            self.preset,
            self.decoding,
            self.images,
            self.captions_per_s,
            self.tokens_per_s
        )?;
        write!(f, "{}", self.memory)?;
        if let Some(c) = &self.per_batch {
            write!(f, "; per batch of {}: {c}", self.batch)?;
        }
        if let Some(m) = &self.matmuls {
            write!(f, "; {m}")?;
        }
        if let Some(k) = &self.kernels {
            write!(f, "; {k}")?;
        }
        Ok(())
    }
}

/// Times decoding `images` image embeddings with the preset's network,
/// from `checkpoint` when given (its captions end where it says `<eos>`),
/// else with fresh weights (whose captions mostly run to the maximum
/// length: the most work a caption can take). The embeddings are the
/// first rows of the features file `features` when given (a trained
/// captioner's own, so that its captions are the ones it writes), else
/// random.
pub fn decode_throughput<B: Backend>(
    b: &B,
    bench: &BenchModel,
    checkpoint: Option<&std::path::Path>,
    features: Option<&std::path::Path>,
    decoding: &super::decode::Decoding,
    images: usize,
) -> Result<DecodeBench> {
    MemoryUse::reset();
    let ck = match checkpoint {
        Some(path) => super::Checkpoint::load(b, path)?,
        None => bench.checkpoint(b, bench.pretrained(b)?, bench.vocab())?,
    };
    let dim = ck.model.config.image_input_len();
    let features = match features {
        Some(path) => {
            if ck.model.config.image_tokens > 0 {
                anyhow::bail!(
                    "--features {}: this captioner reads a vision tower's image tokens, not \
                     embeddings from a features file; leave --features out",
                    path.display()
                );
            }
            let mut file = crate::data::features::Features::load(path, None)?;
            if file.dim != dim {
                anyhow::bail!(
                    "{}: {}-dimensional embeddings, but the captioner reads {dim}",
                    path.display(),
                    file.dim
                );
            }
            file.normalise()?;
            if ck.model.config.raw_embeddings {
                // As the encoder gave them, which this captioner reads.
                let Some(norms) = &file.norms else {
                    anyhow::bail!(
                        "{}: this captioner reads image embeddings as their encoder gives them, \
                         and the file records no norms: write it with `captune embed`",
                        path.display()
                    );
                };
                crate::data::features::times_norms(&mut file.embeddings, dim, norms);
            }
            let rows = images.min(file.ids.len());
            file.embeddings.truncate(rows * dim);
            file.embeddings
        }
        None => random_inputs(images * dim, &mut ChaCha8Rng::seed_from_u64(1)),
    };
    let images = features.len() / dim;
    // As `eval` decodes: 64 images at once.
    let batch = super::decode::IMAGES_PER_BATCH;
    // Warm-up: the first batch builds the GPU's pipelines.
    let first = &features[..features.len().min(batch * dim)];
    super::decode::generate(b, &ck.model, first, decoding, &Default::default())?;
    b.flush();
    let before = b.counters();
    let matmuls_before = b.matmul_workgroups();
    let start = Instant::now();
    let generated =
        super::decode::generate(b, &ck.model, &features, decoding, &Default::default())?;
    b.flush();
    let seconds = start.elapsed().as_secs_f64();
    let batches = images.div_ceil(batch);
    let counters = b.counters();
    let matmuls = matmul_summary(b, matmuls_before, batches);
    let kernels = kernel_profile(b, bench.profile, || {
        super::decode::generate(b, &ck.model, first, decoding, &Default::default()).map(drop)
    })?;
    let tokens: usize = generated.iter().map(|g| g.ids.len()).sum();
    Ok(DecodeBench {
        op: "decode".into(),
        backend: b.kind(),
        adapter: b.adapter_name(),
        preset: match checkpoint {
            Some(path) => path.display().to_string(),
            None => bench.name.clone(),
        },
        decoding: format!("{decoding:?}"),
        images,
        batch,
        captions: generated.len(),
        tokens,
        seconds,
        captions_per_s: generated.len() as f64 / seconds,
        tokens_per_s: tokens as f64 / seconds,
        memory: MemoryUse::now(b),
        per_batch: per(counters, before, batches),
        matmuls,
        kernels,
    })
}

/// Synthetic training images in `bench scst`'s corpus (rewards' statistics).
pub const SCST_CORPUS_IMAGES: usize = 1000;

#[derive(Clone, Debug, Serialize)]
pub struct ScstBench {
    pub op: String,
    pub backend: BackendKind,
    pub adapter: String,
    pub preset: String,
    pub objective: String,
    /// Images per step.
    pub batch: usize,
    pub samples_per_image: usize,
    pub steps: usize,
    pub seconds_per_step: f64,
    pub steps_per_s: f64,
    /// Shares of the step: sampling (with the greedy captions), rewards
    /// (with the advantages) and the update (teacher-forced forward on the
    /// samples, backward, AdamW).
    pub sampling_share: f64,
    pub rewards_share: f64,
    pub update_share: f64,
    #[serde(flatten)]
    pub memory: MemoryUse,
    /// Per step, on the GPU backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_step: Option<DeviceCounters>,
    /// Its matmul dispatches per step and their workgroups, on the GPU.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub matmuls: Option<WorkgroupSummary>,
    /// One more step's device time by kernel (`--profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelProfile>,
}

impl std::fmt::Display for ScstBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<4} scst {} batch {} x {} samples: {:.2} steps/s ({:.0} ms/step: sampling {:.0}%, \
             rewards {:.0}%, update {:.0}%)",
            self.backend,
            self.preset,
            self.batch,
            self.samples_per_image,
            self.steps_per_s,
            self.seconds_per_step * 1e3,
            self.sampling_share * 100.0,
            self.rewards_share * 100.0,
            self.update_share * 100.0
        )?;
        write!(f, "{}", self.memory)?;
        if let Some(c) = &self.per_step {
            write!(f, "; per step: {c}")?;
        }
        if let Some(m) = &self.matmuls {
            write!(f, "; {m}")?;
        }
        if let Some(k) = &self.kernels {
            write!(f, "; {k}")?;
        }
        Ok(())
    }
}

/// What `bench scst` trains: a captioner, the corpus its rewards read, and
/// each corpus image's embedding.
pub struct ScstWorkload<B: Backend> {
    /// The preset's or the checkpoint's name, for the record.
    pub name: String,
    pub ck: super::Checkpoint<B>,
    pub corpus: TrainingCorpus,
    /// `[corpus images, image_input_len]`: embeddings, or tokens.
    pub features: Vec<f32>,
}

impl<B: Backend> ScstWorkload<B> {
    /// The preset's network from fresh weights (whose samples run to the
    /// maximum length: the most work a step can take) on random image
    /// embeddings, against a corpus of [`SCST_CORPUS_IMAGES`] images with 5
    /// random references of 8 to 14 words over the synthetic vocabulary.
    pub fn synthetic(b: &B, bench: &BenchModel) -> Result<Self> {
        if bench.run.model.decoder_folder()?.is_some() {
            bail!(
                "{}: bench scst times a fresh network or a trained --checkpoint, not a \
                 pretrained decoder",
                bench.name
            );
        }
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let vocab = bench.vocab();
        let ids = bench.synthetic_vocab;
        let word = |rng: &mut ChaCha8Rng| format!("w{}", rng.random_range(4..ids));
        let references = (0..SCST_CORPUS_IMAGES)
            .map(|_| {
                (0..5)
                    .map(|_| {
                        (0..rng.random_range(8..=14))
                            .map(|_| word(&mut rng))
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let network = bench.fresh_network(vocab.len());
        let features = random_inputs(SCST_CORPUS_IMAGES * network.image_input_len(), &mut rng);
        Ok(ScstWorkload {
            name: bench.name.clone(),
            ck: super::Checkpoint {
                model: Captioner::new(b, network, 0)?,
                vocab,
            },
            corpus: TrainingCorpus::new("bench-scst-synthetic", references),
            features,
        })
    }

    /// A trained captioner on its data's training images, whose samples
    /// end where the model ends them, rewarded against their references.
    pub fn trained(name: String, ck: super::Checkpoint<B>, data: &CaptionData) -> Result<Self> {
        let (corpus, items) = TrainingCorpus::training_split(&data.data);
        if items.is_empty() {
            bail!(
                "{}: no training images to take SCST steps on",
                data.data.name
            );
        }
        let features = data.inputs_of(&items, ck.model.config.embedding_reading())?;
        Ok(ScstWorkload {
            name,
            ck,
            corpus,
            features,
        })
    }
}

/// Times SCST steps (greedy baseline, 5 samples, CIDEr-D) of `work`'s
/// captioner on batches of its corpus's images in order.
pub fn scst_throughput<B: Backend>(
    b: &B,
    bench: &BenchModel,
    work: ScstWorkload<B>,
    warmup: usize,
    steps: usize,
) -> Result<ScstBench> {
    MemoryUse::reset();
    let batch = bench.run.train.batch;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let ScstWorkload {
        name,
        ck,
        corpus,
        features,
    } = work;
    let super::Checkpoint { mut model, vocab } = ck;
    let images = corpus.references.len();
    let dim = model.config.image_input_len();
    let mut opt = AdamW::new(
        b,
        AdamWConfig::default(),
        &model.params().optimizer_layout(),
    );
    let mut scst = objectives::build::<B>("scst", &Settings::new(), vocab.len())?;
    let (mut sampling, mut rewards, mut total) = (0.0, 0.0, 0.0);
    let (mut before, mut matmuls_before) = (None, None);
    // One step on the batch of images from `step * batch` on.
    let mut take_step = |step: usize, scst: &mut dyn Objective<B>| -> Result<()> {
        let first = step * batch % images;
        let chosen: Vec<usize> = (0..batch).map(|i| (first + i) % images).collect();
        let batch_of = TrainingBatch {
            inputs: chosen
                .iter()
                .flat_map(|&i| features[i * dim..(i + 1) * dim].iter().copied())
                .collect(),
            embeddings: None,
            sequences: Vec::new(),
            images: chosen,
            labelled: None,
        };
        let mut cx = StepContext {
            b,
            model: &mut model,
            vocab: &vocab,
            batch: &batch_of,
            corpus: &corpus,
            gradient_weight: 1.0,
            retriever: None,
            rng: &mut rng,
            monitor: false,
        };
        optimise(&mut opt, scst, &mut cx)
    };
    for step in 0..warmup + steps {
        if step == warmup {
            b.flush();
            before = b.counters();
            matmuls_before = b.matmul_workgroups();
        }
        let start = Instant::now();
        take_step(step, scst.as_mut())?;
        b.flush();
        if step >= warmup {
            total += start.elapsed().as_secs_f64();
            let phases = scst.phases();
            let phase = |name| {
                phases
                    .iter()
                    .find(|p| p.0 == name)
                    .map_or(0.0, |p| p.1.as_secs_f64())
            };
            sampling += phase("sampling");
            rewards += phase("rewards");
        }
    }
    let per_step = per(b.counters(), before, steps);
    let matmuls = matmul_summary(b, matmuls_before, steps);
    let kernels = kernel_profile(b, bench.profile, || {
        take_step(warmup + steps, scst.as_mut())
    })?;
    let seconds = total / steps as f64;
    Ok(ScstBench {
        op: "scst".into(),
        backend: b.kind(),
        adapter: b.adapter_name(),
        preset: name,
        objective: scst.describe(),
        batch,
        samples_per_image: 5,
        steps,
        seconds_per_step: seconds,
        steps_per_s: 1.0 / seconds,
        sampling_share: sampling / total,
        rewards_share: rewards / total,
        update_share: (total - sampling - rewards) / total,
        memory: MemoryUse::now(b),
        per_step,
        matmuls,
        kernels,
    })
}
