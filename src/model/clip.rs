//! Hugging Face CLIP (`CLIPModel`) as captune's retriever. The two towers
//! have the retriever's shape: pre-LN blocks with learned positions, the
//! text tower causal and pooled at its end token, the image tower a ViT
//! whose patch embedding is a matmul over each patch's pixels; CLIP adds a
//! class vector before the patches (pooled alone), a layer norm before
//! the first image block (`pre_layrnorm`), quick GELU and projections
//! without biases, which the retriever's config states. Its
//! `post_layernorm` on the pooled class output is the image tower's final
//! norm: a layer norm acts row by row. Loading is renaming plus three
//! layout changes, all in [`read`]: PyTorch's `nn.Linear` stores `[out,
//! in]` and captune `[in, out]`; the separate q, k and v projections
//! become the fused qkv (columns q, then k, then v); the patch
//! convolution `[width, 3, p, p]` becomes rows in captune's patch order
//! (row, column, channel).

use super::hf::HfFolder;
use super::layers::Activation;
use super::retriever::{ImagePool, Retriever, RetrieverConfig};
use super::transformer::TransformerConfig;
use super::vision::{Patcher, patch_rows, patches_of_pixels};
use crate::backend::Backend;
use crate::data::image_processor::ImageProcessor;
use crate::tensorfile::{Tensor, TensorFile};
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::path::Path;

/// One tower's fields of a CLIP `config.json` (`text_config` or
/// `vision_config`), with CLIP ViT-B/32's values where a field is absent.
#[derive(Clone, Debug, Deserialize)]
pub struct TowerConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_hidden_layers: usize,
    #[serde(default = "quick_gelu")]
    pub hidden_act: String,
    #[serde(default = "epsilon")]
    pub layer_norm_eps: f64,
    // The text tower's.
    #[serde(default = "text_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "clip_vocab")]
    pub vocab_size: usize,
    // The image tower's.
    #[serde(default = "image_size")]
    pub image_size: u32,
    #[serde(default = "patch_size")]
    pub patch_size: u32,
    #[serde(default = "channels")]
    pub num_channels: usize,
}

/// The fields of a CLIP `config.json` that decide the network.
#[derive(Clone, Debug, Deserialize)]
pub struct ClipConfig {
    pub model_type: String,
    pub projection_dim: usize,
    pub text_config: TowerConfig,
    pub vision_config: TowerConfig,
}

fn quick_gelu() -> String {
    "quick_gelu".into()
}
fn epsilon() -> f64 {
    1e-5
}
fn text_positions() -> usize {
    77
}
fn clip_vocab() -> usize {
    49408
}
fn image_size() -> u32 {
    224
}
fn patch_size() -> u32 {
    32
}
fn channels() -> usize {
    3
}

impl ClipConfig {
    /// Refuses what captune's retriever cannot compute, naming the field.
    pub fn check(&self, path: &Path) -> Result<()> {
        if self.model_type != "clip" {
            bail!(
                "{}: model_type {:?} is not a CLIP; captune reads model_type \"clip\" \
                 (CLIPModel)",
                path.display(),
                self.model_type
            );
        }
        for (tower, c) in [
            ("text_config", &self.text_config),
            ("vision_config", &self.vision_config),
        ] {
            if activation(&c.hidden_act).is_none() {
                bail!(
                    "{}: {tower}.hidden_act is {:?}; captune computes CLIP with \"quick_gelu\", \
                     \"gelu\", \"gelu_new\", \"gelu_pytorch_tanh\" or \"relu\"",
                    path.display(),
                    c.hidden_act
                );
            }
            if (c.layer_norm_eps - 1e-5).abs() > 1e-12 {
                bail!(
                    "{}: {tower}.layer_norm_eps is {}; captune's layer norms use 1e-5",
                    path.display(),
                    c.layer_norm_eps
                );
            }
            if c.num_attention_heads == 0 || !c.hidden_size.is_multiple_of(c.num_attention_heads) {
                bail!(
                    "{}: {tower}.hidden_size {} is not a multiple of num_attention_heads {}",
                    path.display(),
                    c.hidden_size,
                    c.num_attention_heads
                );
            }
        }
        let v = &self.vision_config;
        if v.num_channels != 3 {
            bail!(
                "{}: vision_config.num_channels is {}; captune reads RGB images (3)",
                path.display(),
                v.num_channels
            );
        }
        if v.patch_size == 0 || !v.image_size.is_multiple_of(v.patch_size) {
            bail!(
                "{}: vision_config.image_size {} is not a multiple of patch_size {}",
                path.display(),
                v.image_size,
                v.patch_size
            );
        }
        self.retriever()
            .validate()
            .with_context(|| format!("{}: not a retriever captune can build", path.display()))
    }
}

/// The activation a `hidden_act` names, when captune computes it.
fn activation(hidden_act: &str) -> Option<Activation> {
    match hidden_act {
        "quick_gelu" => Some(Activation::QuickGelu),
        "gelu" => Some(Activation::GeluErf),
        "gelu_new" | "gelu_pytorch_tanh" => Some(Activation::Gelu),
        "relu" => Some(Activation::Relu),
        _ => None,
    }
}

impl ClipConfig {
    /// The retriever of this CLIP's shape.
    pub fn retriever(&self) -> RetrieverConfig {
        let tower = |c: &TowerConfig, causal| TransformerConfig {
            mlp_width: Some(c.intermediate_size),
            activation: activation(&c.hidden_act).expect("checked by check"),
            ..TransformerConfig::new(
                c.hidden_size,
                c.num_hidden_layers,
                c.num_attention_heads,
                causal,
            )
        };
        let (t, v) = (&self.text_config, &self.vision_config);
        RetrieverConfig {
            image_size: v.image_size,
            patch: v.patch_size,
            image: TransformerConfig {
                pre_norm: true,
                ..tower(v, false)
            },
            text: tower(t, true),
            max_len: t.max_position_embeddings,
            vocab_size: t.vocab_size,
            embed_dim: self.projection_dim,
            image_pool: ImagePool::Class,
            biases: false,
        }
    }
}

/// A CLIP's weights under the retriever's names (`image.*`, `text.*`,
/// `logit_scale`), in captune's layouts.
pub struct Clip {
    pub config: ClipConfig,
    pub retriever: RetrieverConfig,
    pub weights: TensorFile,
}

/// captune's name within block i, CLIP's within `encoder.layers.{i}`, and
/// whether the tensor is an `nn.Linear` weight (stored transposed).
const BLOCK_NAMES: [(&str, &str, bool); 10] = [
    ("ln1.weight", "layer_norm1.weight", false),
    ("ln1.bias", "layer_norm1.bias", false),
    ("attn.proj.weight", "self_attn.out_proj.weight", true),
    ("attn.proj.bias", "self_attn.out_proj.bias", false),
    ("ln2.weight", "layer_norm2.weight", false),
    ("ln2.bias", "layer_norm2.bias", false),
    ("mlp.fc1.weight", "mlp.fc1.weight", true),
    ("mlp.fc1.bias", "mlp.fc1.bias", false),
    ("mlp.fc2.weight", "mlp.fc2.weight", true),
    ("mlp.fc2.bias", "mlp.fc2.bias", false),
];

/// Reads a CLIP folder's config.json, checked.
fn read_config(folder: &HfFolder) -> Result<ClipConfig> {
    let config: ClipConfig = folder.config()?;
    config.check(&folder.config_path())?;
    Ok(config)
}

/// Reads a CLIP folder, checking every tensor's presence and shape against
/// its config.json.
pub fn read(dir: &Path) -> Result<Clip> {
    let folder = HfFolder::open(dir)?;
    let config = read_config(&folder)?;
    let config_path = folder.config_path();
    let retriever = config.retriever();
    let (mut file, path) = folder.weights()?;
    let mut take = |name: &str, shape: &[usize]| -> Result<Tensor> {
        let Some(tensor) = file.tensors.remove(name) else {
            bail!(
                "{}: no tensor {name:?}, which {} calls for",
                path.display(),
                config_path.display()
            );
        };
        if tensor.shape != shape {
            bail!(
                "{}: tensor {name:?} has shape {:?}, but {} makes it {shape:?}",
                path.display(),
                tensor.shape,
                config_path.display()
            );
        }
        Ok(tensor)
    };
    let mut weights = TensorFile::new([]);
    let mut put = |name: String, shape: Vec<usize>, data: Vec<f32>| {
        weights.tensors.insert(name, Tensor { shape, data });
    };
    let e = config.projection_dim;
    for (ours, theirs, c) in [
        ("text", "text_model", &config.text_config),
        ("image", "vision_model", &config.vision_config),
    ] {
        let (w, h) = (c.hidden_size, c.intermediate_size);
        for i in 0..c.num_hidden_layers {
            let layer = format!("{theirs}.encoder.layers.{i}");
            for (name, clip, linear) in BLOCK_NAMES {
                let shape = block_shape(name, w, h);
                let want: Vec<usize> = if linear {
                    vec![shape[1], shape[0]]
                } else {
                    shape.clone()
                };
                let t = take(&format!("{layer}.{clip}"), &want)?;
                let data = if linear { t.transposed().data } else { t.data };
                put(format!("{ours}.blocks.{i}.{name}"), shape, data);
            }
            // q, k and v, each [out, in], as the fused [in, 3 out].
            let mut qkv = vec![0.0; w * 3 * w];
            let mut bias = Vec::with_capacity(3 * w);
            for (k, part) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                let weight = take(&format!("{layer}.self_attn.{part}.weight"), &[w, w])?;
                for (o, row) in weight.data.chunks(w).enumerate() {
                    for (input, &x) in row.iter().enumerate() {
                        qkv[input * 3 * w + k * w + o] = x;
                    }
                }
                bias.extend(take(&format!("{layer}.self_attn.{part}.bias"), &[w])?.data);
            }
            put(
                format!("{ours}.blocks.{i}.attn.qkv.weight"),
                vec![w, 3 * w],
                qkv,
            );
            put(
                format!("{ours}.blocks.{i}.attn.qkv.bias"),
                vec![3 * w],
                bias,
            );
        }
        let (final_norm, projection) = match ours {
            "text" => ("text_model.final_layer_norm", "text_projection.weight"),
            _ => ("vision_model.post_layernorm", "visual_projection.weight"),
        };
        for part in ["weight", "bias"] {
            let t = take(&format!("{final_norm}.{part}"), &[w])?;
            put(format!("{ours}.ln_f.{part}"), vec![w], t.data);
        }
        let t = take(projection, &[e, w])?;
        put(
            format!("{ours}.proj.weight"),
            vec![w, e],
            t.transposed().data,
        );
    }
    let (t, v) = (&config.text_config, &config.vision_config);
    let (tw, vw) = (t.hidden_size, v.hidden_size);
    let text = "text_model.embeddings";
    let t_tokens = take(
        &format!("{text}.token_embedding.weight"),
        &[t.vocab_size, tw],
    )?;
    put("text.tokens".into(), t_tokens.shape, t_tokens.data);
    let n = t.max_position_embeddings;
    let t_positions = take(&format!("{text}.position_embedding.weight"), &[n, tw])?;
    put("text.positions".into(), t_positions.shape, t_positions.data);
    let vision = "vision_model.embeddings";
    let class = take(&format!("{vision}.class_embedding"), &[vw])?;
    put("image.class".into(), vec![1, vw], class.data);
    let positions = retriever.image_positions();
    let v_positions = take(
        &format!("{vision}.position_embedding.weight"),
        &[positions, vw],
    )?;
    put(
        "image.positions".into(),
        v_positions.shape,
        v_positions.data,
    );
    let p = v.patch_size as usize;
    let conv = take(&format!("{vision}.patch_embedding.weight"), &[vw, 3, p, p])?;
    put(
        "image.patch_embed.weight".into(),
        vec![3 * p * p, vw],
        patch_rows(&conv.data, vw, p),
    );
    for part in ["weight", "bias"] {
        let t = take(&format!("vision_model.pre_layrnorm.{part}"), &[vw])?;
        put(format!("image.ln_pre.{part}"), vec![vw], t.data);
    }
    let scale = take("logit_scale", &[])?;
    put("logit_scale".into(), vec![1], scale.data);
    // Buffers transformers may save beside the weights.
    file.tensors
        .retain(|name, _| !name.ends_with("position_ids"));
    if let Some(name) = file.tensors.keys().next() {
        bail!(
            "{}: tensor {name:?} has no place in the CLIP {} describes (is this a CLIPModel?)",
            path.display(),
            config_path.display()
        );
    }
    Ok(Clip {
        config,
        retriever,
        weights,
    })
}

/// The shape of block tensor `name` at width `w` and MLP width `h`,
/// captune's layout.
fn block_shape(name: &str, w: usize, h: usize) -> Vec<usize> {
    match name {
        "attn.proj.weight" => vec![w, w],
        "mlp.fc1.weight" => vec![w, h],
        "mlp.fc1.bias" => vec![h],
        "mlp.fc2.weight" => vec![h, w],
        _ => vec![w],
    }
}

impl Clip {
    /// The retriever with this CLIP's weights, frozen (captune never
    /// trains a CLIP), for batches of `batch`.
    pub fn into_retriever<B: Backend>(self, b: &B, batch: usize) -> Result<Retriever<B>> {
        let mut model = Retriever::frozen(b, self.retriever, batch)?;
        let mut weights = self.weights;
        for (spec, value) in model.params.specs.iter().zip(&mut model.params.values) {
            let tensor = weights
                .tensors
                .remove(&spec.name)
                .expect("read gives every tensor of the retriever its config makes");
            assert_eq!(
                tensor.data.len(),
                spec.len(),
                "{}: checked by read",
                spec.name
            );
            b.write(value, &tensor.data);
        }
        assert!(
            weights.tensors.is_empty(),
            "read gives only the retriever's tensors"
        );
        drop(weights);
        crate::tensorfile::release_freed_memory();
        Ok(model)
    }
}

/// How the CLIP folder `dir`'s image tower sees an image, reading its
/// config only.
pub fn patcher(dir: &Path) -> Result<Patcher> {
    let v = read_config(&HfFolder::open(dir)?)?.vision_config;
    Patcher::new(dir, v.image_size as usize, v.patch_size as usize)
}

/// A CLIP folder's image tower, frozen, as a maker of image tokens: every
/// token of its last layer through `post_layernorm` (which transformers
/// applies to the class token alone, before the projection), `[images, 1
/// + patches, width]`.
pub struct ClipVision<B: Backend> {
    retriever: Retriever<B>,
    pub patcher: Patcher,
}

impl<B: Backend> ClipVision<B> {
    /// The image tower and processor of the CLIP folder `dir`.
    pub fn new(b: &B, dir: &Path) -> Result<Self> {
        let clip = read(dir)?;
        let v = &clip.config.vision_config;
        let patcher = Patcher::new(dir, v.image_size as usize, v.patch_size as usize)?;
        let retriever = clip.into_retriever(b, 1)?;
        Ok(ClipVision { retriever, patcher })
    }

    /// Tokens per image and values per token.
    pub fn shape(&self) -> (usize, usize) {
        let c = &self.retriever.config;
        (c.image_positions(), c.image.width)
    }

    /// The image tokens `[images, tokens, width]` of `patches` (`[images,
    /// patches, patch_dim]`).
    pub fn image_tokens(&mut self, b: &B, patches: &[f32]) -> Result<Vec<f32>> {
        let c = &self.retriever.config;
        let per_image = c.patches_per_image() * c.patch_dim();
        if patches.is_empty() || !patches.len().is_multiple_of(per_image) {
            bail!(
                "{} patch values are not whole images of {} patches of {}",
                patches.len(),
                c.patches_per_image(),
                c.patch_dim()
            );
        }
        self.retriever.encode_images(b, patches)?;
        Ok(b.to_vec(self.retriever.image_tokens()))
    }
}

/// What [`embed_files`] gives: the embeddings `[kept, embed_dim]` as CLIP
/// gives them (`get_image_features`, not normalised)
/// of the images it could read, their indices among the paths, and why
/// each other one was skipped.
pub struct Embedded {
    pub embeddings: Vec<f32>,
    pub kept: Vec<usize>,
    pub skipped: Vec<String>,
}

/// The image files at `paths` through CLIP's preprocessing and image
/// tower, `model.batch` at a time, advancing `progress` by one for each
/// file; a file that cannot be read is skipped, its reason kept.
pub fn embed_files<B: Backend>(
    b: &B,
    model: &mut Retriever<B>,
    processor: &ImageProcessor,
    paths: &[&Path],
    progress: &indicatif::ProgressBar,
) -> Result<Embedded> {
    use rayon::prelude::*;
    let (size, patch) = (processor.side() as usize, model.config.patch as usize);
    if processor.side() != model.config.image_size {
        bail!(
            "the image processor makes {} pixels a side but the image tower reads {}: \
             the processor's config and config.json are of different models",
            processor.side(),
            model.config.image_size
        );
    }
    let mut out = Embedded {
        embeddings: Vec::with_capacity(paths.len() * model.config.embed_dim),
        kept: Vec::new(),
        skipped: Vec::new(),
    };
    let batch = model.batch;
    for (start, chunk) in (0..paths.len()).step_by(batch).zip(paths.chunks(batch)) {
        let decoded: Vec<Result<Vec<f32>, String>> = chunk
            .par_iter()
            .map(|path| {
                let image =
                    image::open(path).map_err(|e| format!("{}: {e}; skipped", path.display()))?;
                Ok(patches_of_pixels(
                    &processor.pixels(&image.to_rgb8()),
                    size,
                    patch,
                ))
            })
            .collect();
        let mut patches = Vec::new();
        for (k, result) in decoded.into_iter().enumerate() {
            match result {
                Ok(p) => {
                    patches.extend(p);
                    out.kept.push(start + k);
                }
                Err(why) => out.skipped.push(why),
            }
        }
        if !patches.is_empty() {
            model.encode_images(b, &patches)?;
            out.embeddings.extend(b.to_vec(model.image_embeddings()));
        }
        progress.inc(chunk.len() as u64);
    }
    Ok(out)
}

/// The identity of the CLIP in `dir` as an encoder: a fingerprint of its
/// config.json and of every safetensors file (all shards of a sharded
/// one), so that features from two fine-tunes never pass for each other's.
pub fn encoder_id(dir: &Path) -> Result<String> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    files.insert(0, dir.join("config.json"));
    let mut prints = String::new();
    for file in &files {
        let bytes =
            std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
        prints.push_str(&crate::tensorfile::fingerprint(&bytes));
    }
    Ok(format!(
        "clip:{}",
        crate::tensorfile::fingerprint(prints.as_bytes())
    ))
}
