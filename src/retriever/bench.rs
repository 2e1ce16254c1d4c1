//! `captune bench embed`: how fast a retriever's image tower embeds
//! images (a CLIP's, for CLIP features), beside
//! scripts/bench_torch_clip_embed.py on the same model. Random
//! preprocessed images, so that decoding and resizing, which are not the
//! model's work, stay out of the figure on both sides.

use crate::backend::{Backend, BackendKind, DeviceCounters, WorkgroupSummary};
use crate::bench::{MemoryUse, matmul_summary, per};
use crate::model::retriever::Retriever;
use anyhow::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub struct EmbedBench {
    pub op: String,
    pub backend: BackendKind,
    pub adapter: String,
    pub model: String,
    pub images: usize,
    pub batch: usize,
    pub parameters: usize,
    pub seconds: f64,
    pub images_per_s: f64,
    #[serde(flatten)]
    pub memory: MemoryUse,
    /// The GPU's work per batch (absent on the CPU).
    pub per_batch: Option<DeviceCounters>,
    /// Its matmul dispatches per batch and their workgroups, on the GPU.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub matmuls: Option<WorkgroupSummary>,
}

impl std::fmt::Display for EmbedBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<4} embed {} on {} images: {:8.1} images/s",
            self.backend, self.model, self.images, self.images_per_s
        )?;
        write!(f, "{}", self.memory)?;
        if let Some(c) = &self.per_batch {
            write!(f, "; per batch of {}: {c}", self.batch)?;
        }
        if let Some(m) = &self.matmuls {
            write!(f, "; {m}")?;
        }
        Ok(())
    }
}

/// Times `model`'s image tower on `images` random images, `model.batch`
/// at a time, after one warm-up batch (the GPU builds its pipelines).
pub fn embed_throughput<B: Backend>(
    b: &B,
    model: &mut Retriever<B>,
    name: &str,
    images: usize,
) -> Result<EmbedBench> {
    MemoryUse::reset();
    let c = model.config;
    let per_image = c.patches_per_image() * c.patch_dim();
    let batch = model.batch;
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let patches: Vec<f32> = (0..batch * per_image)
        .map(|_| rng.random_range(-2.0..2.0))
        .collect();
    model.encode_images(b, &patches)?;
    b.to_vec(model.image_embeddings());
    let before = b.counters();
    let matmuls_before = b.matmul_workgroups();
    let start = Instant::now();
    let batches = images.div_ceil(batch);
    for _ in 0..batches {
        model.encode_images(b, &patches)?;
        // Read back, as `embed` does with every batch.
        b.to_vec(model.image_embeddings());
    }
    let seconds = start.elapsed().as_secs_f64();
    let embedded = batches * batch;
    Ok(EmbedBench {
        op: "embed".into(),
        backend: b.kind(),
        adapter: b.adapter_name(),
        model: name.to_string(),
        images: embedded,
        batch,
        parameters: model.params.count(),
        seconds,
        images_per_s: embedded as f64 / seconds,
        memory: MemoryUse::now(b),
        per_batch: per(b.counters(), before, batches),
        matmuls: matmul_summary(b, matmuls_before, batches),
    })
}
