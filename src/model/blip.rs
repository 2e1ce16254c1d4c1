//! Hugging Face BLIP (`BlipForConditionalGeneration`; Li et al., 2022):
//! its config, its vision tower (a ViT on the shared [`VisionTower`]),
//! and the map from its text decoder's tensors to captune's BLIP decoder
//! ([`crate::captioner::decoders::blip`]). The decoder is
//! BERT with cross-attention and the vision tower a ViT, so the maps are
//! renaming plus layout changes: PyTorch's `nn.Linear` weights (`[out,
//! in]`) are transposed to captune's input-major dense layers, the patch
//! convolution becomes rows in captune's patch order, and the text
//! decoder's separate query, key and value projections are fused
//! (self-attention's into `attn.qkv`, cross-attention's key and value
//! into `cross.kv`). [`VISION_LAYER_NAMES`], [`vision_tensors`],
//! [`TEXT_LAYER_NAMES`] and [`text_decoder_tensors`] are the whole map
//! ([`blip_text_tensors`] its inverse, for export).

use super::hf::HfFolder;
use super::layers::{Activation, NormEpsilon};
use super::params::Params;
use super::transformer::TransformerConfig;
use super::vision::{
    Patcher, VisionConfig, VisionTower, VisionWork, conv_of_patch_rows, patch_rows,
};
use crate::backend::Backend;
use crate::tensorfile::{Tensor, TensorFile};
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// captune's name within decoder block i, and BLIP's within
/// `text_decoder.bert.encoder.layer.{i}`, for the layers that map one to
/// one (the fused projections are [`text_decoder_tensors`]' own).
pub const TEXT_LAYER_NAMES: [(&str, &str); 8] = [
    ("attn.proj", "attention.output.dense"),
    ("ln1", "attention.output.LayerNorm"),
    ("cross.q", "crossattention.self.query"),
    ("cross.proj", "crossattention.output.dense"),
    ("cross.ln", "crossattention.output.LayerNorm"),
    ("mlp.fc1", "intermediate.dense"),
    ("mlp.fc2", "output.dense"),
    ("ln2", "output.LayerNorm"),
];

/// The fields of a BLIP `config.json` that decide the network.
#[derive(Clone, Debug, Deserialize)]
pub struct BlipConfig {
    pub model_type: String,
    pub text_config: BlipTextConfig,
    pub vision_config: BlipVisionConfig,
}

#[derive(Clone, Debug, Deserialize)]
pub struct BlipTextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub encoder_hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "gelu")]
    pub hidden_act: String,
    #[serde(default = "bert_epsilon")]
    pub layer_norm_eps: f64,
    pub bos_token_id: u32,
    pub sep_token_id: u32,
    pub pad_token_id: u32,
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
}

#[derive(Clone, Debug, Deserialize)]
pub struct BlipVisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub image_size: usize,
    pub patch_size: usize,
    #[serde(default = "gelu")]
    pub hidden_act: String,
    #[serde(default = "vit_epsilon")]
    pub layer_norm_eps: f64,
}

fn gelu() -> String {
    "gelu".into()
}

fn bert_epsilon() -> f64 {
    1e-12
}

fn vit_epsilon() -> f64 {
    1e-5
}

fn yes() -> bool {
    true
}

impl BlipVisionConfig {
    /// Tokens per image: the class token and the patches.
    pub fn tokens(&self) -> usize {
        let side = self.image_size / self.patch_size;
        side * side + 1
    }

    /// The ViT: a biased patch embedding, a class token, pre-LN blocks
    /// with the exact GELU, and `post_layernorm` on every token as the
    /// final norm.
    pub fn vision(&self) -> VisionConfig {
        let side = self.image_size / self.patch_size;
        VisionConfig {
            patches: side * side,
            patch_dim: 3 * self.patch_size * self.patch_size,
            class: true,
            patch_bias: true,
            transformer: TransformerConfig {
                mlp_width: Some(self.intermediate_size),
                activation: Activation::GeluErf,
                norm_eps: NormEpsilon(self.layer_norm_eps as f32),
                ..TransformerConfig::new(
                    self.hidden_size,
                    self.num_hidden_layers,
                    self.num_attention_heads,
                    false,
                )
            },
        }
    }
}

impl BlipConfig {
    /// Refuses what captune's BLIP decoder cannot compute, naming the field.
    pub fn check(&self, path: &Path) -> Result<()> {
        if self.model_type != "blip" {
            bail!(
                "{}: model_type {:?} is not BLIP's captioner; captune reads model_type \"blip\" \
                 (BlipForConditionalGeneration)",
                path.display(),
                self.model_type
            );
        }
        let t = &self.text_config;
        if t.hidden_act != "gelu" {
            bail!(
                "{}: text_config.hidden_act is {:?}; captune computes BLIP's text decoder with \
                 the exact GELU (\"gelu\") only",
                path.display(),
                t.hidden_act
            );
        }
        if !t.tie_word_embeddings {
            bail!(
                "{}: text_config.tie_word_embeddings is false; captune's BLIP decoder ties its \
                 prediction head's decoder to the word embeddings",
                path.display()
            );
        }
        if t.num_attention_heads == 0 || !t.hidden_size.is_multiple_of(t.num_attention_heads) {
            bail!(
                "{}: text_config.hidden_size {} is not a multiple of num_attention_heads {}",
                path.display(),
                t.hidden_size,
                t.num_attention_heads
            );
        }
        if t.encoder_hidden_size != self.vision_config.hidden_size {
            bail!(
                "{}: text_config.encoder_hidden_size {} is not vision_config.hidden_size {}: \
                 the text decoder must read the vision tower's tokens",
                path.display(),
                t.encoder_hidden_size,
                self.vision_config.hidden_size
            );
        }
        let v = &self.vision_config;
        if v.hidden_act != "gelu" {
            bail!(
                "{}: vision_config.hidden_act is {:?}; captune computes BLIP's vision tower with \
                 the exact GELU (\"gelu\") only",
                path.display(),
                v.hidden_act
            );
        }
        if v.num_attention_heads == 0 || !v.hidden_size.is_multiple_of(v.num_attention_heads) {
            bail!(
                "{}: vision_config.hidden_size {} is not a multiple of num_attention_heads {}",
                path.display(),
                v.hidden_size,
                v.num_attention_heads
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
        Ok(())
    }

    /// The text decoder's blocks: BERT's, post-LN with an embedding layer
    /// norm and no final one, cross-attending to the vision tower's tokens.
    pub fn text_transformer(&self) -> TransformerConfig {
        let t = &self.text_config;
        TransformerConfig {
            mlp_width: Some(t.intermediate_size),
            activation: Activation::GeluErf,
            final_norm: false,
            pre_norm: true,
            post_norm: true,
            cross_width: Some(t.encoder_hidden_size),
            norm_eps: NormEpsilon(t.layer_norm_eps as f32),
            ..TransformerConfig::new(
                t.hidden_size,
                t.num_hidden_layers,
                t.num_attention_heads,
                true,
            )
        }
    }
}

/// A BLIP folder: its config and every tensor, by BLIP's names.
pub struct Blip {
    pub config: BlipConfig,
    pub weights: TensorFile,
    /// Where the weights came from, for errors.
    pub weights_path: PathBuf,
}

/// Reads a BLIP folder's config (checked) and weights.
pub fn read(dir: &Path) -> Result<Blip> {
    let (folder, config) = read_config(dir)?;
    let (weights, weights_path) = folder.weights()?;
    Ok(Blip {
        config,
        weights,
        weights_path,
    })
}

/// Reads a BLIP folder's config, checked.
fn read_config(dir: &Path) -> Result<(HfFolder, BlipConfig)> {
    let folder = HfFolder::open(dir)?;
    // The model type first: another model's config lacks BLIP's fields,
    // and its type says more than the first field it lacks.
    let kind = folder.model_type()?;
    if kind != "blip" {
        bail!(
            "{}: model_type {:?} is not BLIP's captioner; captune reads model_type \"blip\" \
             (BlipForConditionalGeneration)",
            folder.config_path().display(),
            kind
        );
    }
    let config: BlipConfig = folder.config()?;
    config.check(&folder.config_path())?;
    Ok((folder, config))
}

/// The text decoder's tensors under captune's names (`decoder.tokens`,
/// `decoder.positions` (the first `positions` rows), `decoder.ln_pre.*`,
/// `decoder.blocks.{i}.*`, `head.*`), each taken by `take(BLIP's name)`
/// and converted. `take` serves a model's weights and a file of their
/// gradients alike.
pub fn text_decoder_tensors(
    t: &BlipTextConfig,
    positions: usize,
    take: impl FnMut(&str) -> Result<Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    if positions > t.max_position_embeddings {
        bail!(
            "the captioner feeds {positions} positions, but text_config.max_position_embeddings \
             is {}",
            t.max_position_embeddings
        );
    }
    let (w, m, h) = (t.hidden_size, t.encoder_hidden_size, t.intermediate_size);
    let mut src = Source {
        module: "text_decoder",
        take,
    };
    let mut out = vec![(
        "decoder.tokens".to_string(),
        src.get("bert.embeddings.word_embeddings.weight", &[t.vocab_size, w])?,
    )];
    let table = src.get(
        "bert.embeddings.position_embeddings.weight",
        &[t.max_position_embeddings, w],
    )?;
    out.push((
        "decoder.positions".into(),
        Tensor {
            shape: vec![positions, w],
            data: table.data[..positions * w].to_vec(),
        },
    ));
    out.extend(src.pair("decoder.ln_pre", "bert.embeddings.LayerNorm", None, w)?);
    for i in 0..t.num_hidden_layers {
        let layer = format!("bert.encoder.layer.{i}");
        let ours = |name: &str| format!("decoder.blocks.{i}.{name}");
        let (qkv_w, qkv_b) = src.fused(&layer, &["query", "key", "value"], "attention", w, w)?;
        let (kv_w, kv_b) = src.fused(&layer, &["key", "value"], "crossattention", m, w)?;
        out.extend([
            (ours("attn.qkv.weight"), qkv_w),
            (ours("attn.qkv.bias"), qkv_b),
            (ours("cross.kv.weight"), kv_w),
            (ours("cross.kv.bias"), kv_b),
        ]);
        for (captune, blip) in TEXT_LAYER_NAMES {
            let input = match captune {
                "ln1" | "cross.ln" | "ln2" => None,
                "mlp.fc1" => Some((w, h)),
                "mlp.fc2" => Some((h, w)),
                _ => Some((w, w)),
            };
            let theirs = format!("{layer}.{blip}");
            out.extend(src.pair(&ours(captune), &theirs, input, w)?);
        }
    }
    let dense = Some((w, w));
    out.extend(src.pair("head.dense", "cls.predictions.transform.dense", dense, w)?);
    out.extend(src.pair("head.ln", "cls.predictions.transform.LayerNorm", None, w)?);
    out.push((
        "head.bias".into(),
        src.get("cls.predictions.bias", &[t.vocab_size])?,
    ));
    Ok(out)
}

/// The inverse of [`text_decoder_tensors`]: the text decoder's tensors
/// under BLIP's names from captune's (`ours(name)`), for a folder whose
/// position table is `positions` (BLIP's whole table: the captioner's
/// first rows replace its own, the rows past them are kept).
pub fn blip_text_tensors(
    t: &BlipTextConfig,
    positions: &Tensor,
    mut ours: impl FnMut(&str) -> Result<Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let theirs = |name: &str| format!("text_decoder.{name}");
    let mut out = vec![(
        theirs("bert.embeddings.word_embeddings.weight"),
        ours("decoder.tokens")?,
    )];
    let trained = ours("decoder.positions")?;
    if trained.data.len() > positions.data.len() {
        bail!(
            "the captioner has {} positions, the folder's table {}",
            trained.shape[0],
            positions.shape[0]
        );
    }
    let mut table = Tensor {
        shape: positions.shape.clone(),
        data: positions.data.clone(),
    };
    table.data[..trained.data.len()].copy_from_slice(&trained.data);
    out.push((theirs("bert.embeddings.position_embeddings.weight"), table));
    let embeddings_norm = ("decoder.ln_pre", &*theirs("bert.embeddings.LayerNorm"));
    put_pair(&mut ours, &mut out, embeddings_norm, false)?;
    let w = t.hidden_size;
    for i in 0..t.num_hidden_layers {
        let layer = format!("bert.encoder.layer.{i}");
        let mine = |name: &str| format!("decoder.blocks.{i}.{name}");
        for (captune, blip) in TEXT_LAYER_NAMES {
            let dense = !matches!(captune, "ln1" | "cross.ln" | "ln2");
            let names = (&*mine(captune), &*theirs(&format!("{layer}.{blip}")));
            put_pair(&mut ours, &mut out, names, dense)?;
        }
        let fused = [
            ("attn.qkv", "attention", &["query", "key", "value"][..]),
            ("cross.kv", "crossattention", &["key", "value"][..]),
        ];
        for (captune, attention, parts) in fused {
            let weight = ours(&mine(&format!("{captune}.weight")))?;
            let bias = ours(&mine(&format!("{captune}.bias")))?;
            for (k, part) in parts.iter().enumerate() {
                let name = format!("{layer}.{attention}.self.{part}");
                let columns = columns(&weight, k * w, w);
                out.push((theirs(&format!("{name}.weight")), columns.transposed()));
                let bias = bias.data[k * w..(k + 1) * w].to_vec();
                let bias = Tensor {
                    shape: vec![w],
                    data: bias,
                };
                out.push((theirs(&format!("{name}.bias")), bias));
            }
        }
    }
    let dense = ("head.dense", &*theirs("cls.predictions.transform.dense"));
    put_pair(&mut ours, &mut out, dense, true)?;
    let norm = ("head.ln", &*theirs("cls.predictions.transform.LayerNorm"));
    put_pair(&mut ours, &mut out, norm, false)?;
    out.push((theirs("cls.predictions.bias"), ours("head.bias")?));
    Ok(out)
}

/// captune's `{mine}.weight` and `.bias` (taken by `ours`) into `out` as
/// BLIP's `{theirs}.weight` and `.bias`: a dense layer's weight transposed
/// back to `nn.Linear`'s `[out, in]`, a layer norm's as it is.
fn put_pair(
    ours: &mut dyn FnMut(&str) -> Result<Tensor>,
    out: &mut Vec<(String, Tensor)>,
    (mine, theirs): (&str, &str),
    dense: bool,
) -> Result<()> {
    let weight = ours(&format!("{mine}.weight"))?;
    let weight = if dense { weight.transposed() } else { weight };
    out.push((format!("{theirs}.weight"), weight));
    out.push((format!("{theirs}.bias"), ours(&format!("{mine}.bias"))?));
    Ok(())
}

/// Columns `from..from + n` of a matrix.
fn columns(t: &Tensor, from: usize, n: usize) -> Tensor {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let data = (0..rows)
        .flat_map(|r| t.data[r * cols + from..r * cols + from + n].iter().copied())
        .collect();
    Tensor {
        shape: vec![rows, n],
        data,
    }
}

/// Where one module's tensors come from (`text_decoder` or
/// `vision_model`), by BLIP's names after the module's, checked against
/// the shapes the config makes.
struct Source<F> {
    module: &'static str,
    take: F,
}

impl<F: FnMut(&str) -> Result<Tensor>> Source<F> {
    fn get(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let name = format!("{}.{name}", self.module);
        let tensor = (self.take)(&name)?;
        if tensor.shape != shape {
            bail!(
                "tensor {name:?} has shape {:?}; the config makes it {shape:?}",
                tensor.shape
            );
        }
        Ok(tensor)
    }

    /// `ours.weight` and `ours.bias` from `theirs.*`: a dense layer of
    /// `(inputs, outputs)`, transposed from `nn.Linear`'s `[out, in]`,
    /// or (None) a layer norm of `w`.
    fn pair(
        &mut self,
        ours: &str,
        theirs: &str,
        dense: Option<(usize, usize)>,
        w: usize,
    ) -> Result<[(String, Tensor); 2]> {
        let (weight, outputs) = match dense {
            Some((inputs, outputs)) => {
                let weight = self.get(&format!("{theirs}.weight"), &[outputs, inputs])?;
                (weight.transposed(), outputs)
            }
            None => (self.get(&format!("{theirs}.weight"), &[w])?, w),
        };
        let bias = self.get(&format!("{theirs}.bias"), &[outputs])?;
        Ok([
            (format!("{ours}.weight"), weight),
            (format!("{ours}.bias"), bias),
        ])
    }

    /// `{layer}.{attention}.self.{part}` for each part, `[w, inputs]`
    /// each, fused input-major: weight `[inputs, parts * w]` and bias.
    fn fused(
        &mut self,
        layer: &str,
        parts: &[&str],
        attention: &str,
        inputs: usize,
        w: usize,
    ) -> Result<(Tensor, Tensor)> {
        let (mut weights, mut biases) = (Vec::new(), Vec::new());
        for part in parts {
            let [(_, weight), (_, bias)] = self.pair(
                "",
                &format!("{layer}.{attention}.self.{part}"),
                Some((inputs, w)),
                w,
            )?;
            weights.push(weight);
            biases.push(bias);
        }
        Ok((side_by_side(&weights), concatenated(&biases)))
    }
}

/// captune's name within vision block i, and BLIP's within
/// `vision_model.encoder.layers.{i}`.
pub const VISION_LAYER_NAMES: [(&str, &str); 6] = [
    ("attn.qkv", "self_attn.qkv"),
    ("attn.proj", "self_attn.projection"),
    ("ln1", "layer_norm1"),
    ("mlp.fc1", "mlp.fc1"),
    ("mlp.fc2", "mlp.fc2"),
    ("ln2", "layer_norm2"),
];

/// The vision tower's tensors under captune's names (`vision.patch_embed`,
/// `vision.class`, `vision.positions`, `vision.blocks.{i}.*`,
/// `vision.ln_f`, which is BLIP's `post_layernorm`), taken from `weights`
/// (`path` names them in errors).
pub fn vision_tensors(
    v: &BlipVisionConfig,
    weights: &mut TensorFile,
    path: &Path,
) -> Result<Vec<(String, Tensor)>> {
    let src = Source {
        module: "vision_model",
        take: |name: &str| {
            let tensor = weights.tensors.remove(name);
            tensor.with_context(|| format!("no tensor {name:?}"))
        },
    };
    vision_from(v, src).with_context(|| path.display().to_string())
}

fn vision_from<F: FnMut(&str) -> Result<Tensor>>(
    v: &BlipVisionConfig,
    mut src: Source<F>,
) -> Result<Vec<(String, Tensor)>> {
    let (w, p, h) = (v.hidden_size, v.patch_size, v.intermediate_size);
    let tokens = v.tokens();
    let conv = src.get("embeddings.patch_embedding.weight", &[w, 3, p, p])?;
    let class = src.get("embeddings.class_embedding", &[1, 1, w])?;
    let positions = src.get("embeddings.position_embedding", &[1, tokens, w])?;
    let mut out = vec![
        (
            "vision.patch_embed.weight".to_string(),
            Tensor {
                shape: vec![3 * p * p, w],
                data: patch_rows(&conv.data, w, p),
            },
        ),
        (
            "vision.patch_embed.bias".into(),
            src.get("embeddings.patch_embedding.bias", &[w])?,
        ),
        (
            "vision.class".into(),
            Tensor {
                shape: vec![1, w],
                data: class.data,
            },
        ),
        (
            "vision.positions".into(),
            Tensor {
                shape: vec![tokens, w],
                data: positions.data,
            },
        ),
    ];
    for i in 0..v.num_hidden_layers {
        for (ours, theirs) in VISION_LAYER_NAMES {
            let dense = match ours {
                "attn.qkv" => Some((w, 3 * w)),
                "mlp.fc1" => Some((w, h)),
                "mlp.fc2" => Some((h, w)),
                "attn.proj" => Some((w, w)),
                _ => None,
            };
            let ours = format!("vision.blocks.{i}.{ours}");
            let theirs = format!("encoder.layers.{i}.{theirs}");
            out.extend(src.pair(&ours, &theirs, dense, w)?);
        }
    }
    out.extend(src.pair("vision.ln_f", "post_layernorm", None, w)?);
    Ok(out)
}

/// The inverse of [`vision_tensors`]: the vision tower's tensors under
/// BLIP's names (`vision_model.*`) from captune's (`ours(name)`).
pub fn blip_vision_tensors(
    v: &BlipVisionConfig,
    mut ours: impl FnMut(&str) -> Result<Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let theirs = |name: &str| format!("vision_model.{name}");
    let (w, p) = (v.hidden_size, v.patch_size);
    let conv = conv_of_patch_rows(&ours("vision.patch_embed.weight")?.data, w, p);
    let with_shape = |t: Tensor, shape: &[usize]| Tensor {
        shape: shape.to_vec(),
        data: t.data,
    };
    let tokens = v.tokens();
    let mut out = vec![
        (
            theirs("embeddings.patch_embedding.weight"),
            Tensor {
                shape: vec![w, 3, p, p],
                data: conv,
            },
        ),
        (
            theirs("embeddings.patch_embedding.bias"),
            ours("vision.patch_embed.bias")?,
        ),
        (
            theirs("embeddings.class_embedding"),
            with_shape(ours("vision.class")?, &[1, 1, w]),
        ),
        (
            theirs("embeddings.position_embedding"),
            with_shape(ours("vision.positions")?, &[1, tokens, w]),
        ),
    ];
    for i in 0..v.num_hidden_layers {
        for (mine, blip) in VISION_LAYER_NAMES {
            let dense = !matches!(mine, "ln1" | "ln2");
            let mine = format!("vision.blocks.{i}.{mine}");
            let blip = theirs(&format!("encoder.layers.{i}.{blip}"));
            put_pair(&mut ours, &mut out, (&mine, &blip), dense)?;
        }
    }
    let norm = ("vision.ln_f", &*theirs("post_layernorm"));
    put_pair(&mut ours, &mut out, norm, false)?;
    Ok(out)
}

/// How the BLIP folder `dir`'s vision tower sees an image, reading its
/// config only.
pub fn patcher(dir: &Path) -> Result<Patcher> {
    let config = read_config(dir)?.1;
    let v = &config.vision_config;
    Patcher::new(dir, v.image_size, v.patch_size)
}

/// BLIP's vision tower with a folder's weights, frozen: image tokens for
/// the text decoder to cross-attend to.
pub struct BlipVision<B: Backend> {
    pub tower: VisionTower,
    params: Params<B>,
    works: Vec<VisionWork<B>>,
    pub patcher: Patcher,
}

impl<B: Backend> BlipVision<B> {
    /// The tower of `blip` (read from the folder `dir`, whose processor
    /// it keeps), its tensors taken out of `blip.weights`.
    pub fn new(b: &B, dir: &Path, blip: &mut Blip) -> Result<Self> {
        let v = &blip.config.vision_config;
        let patcher = Patcher::new(dir, v.image_size, v.patch_size)?;
        let mut params = Params::for_loading();
        let tower = VisionTower::new(&mut params, "vision", v.vision());
        params.finish_frozen(b);
        let path = blip.weights_path.clone();
        let tensors = vision_tensors(v, &mut blip.weights, &path)?;
        params.load(b, &path, &mut TensorFile::new(tensors))?;
        Ok(BlipVision {
            tower,
            params,
            works: Vec::new(),
            patcher,
        })
    }

    /// The image tokens `[images, tokens, width]` of `patches` (`[images,
    /// patches, patch_dim]`, as [`super::vision::patches_of_pixels`] cuts
    /// BLIP's processed pixels).
    pub fn image_tokens(&mut self, b: &B, patches: &[f32]) -> Result<Vec<f32>> {
        let c = &self.tower.config;
        let per_image = c.patches * c.patch_dim;
        if patches.is_empty() || !patches.len().is_multiple_of(per_image) {
            bail!(
                "{} patch values are not whole images of {} patches of {}",
                patches.len(),
                c.patches,
                c.patch_dim
            );
        }
        let batch = patches.len() / per_image;
        let at = match self.works.iter().position(|w| w.batch == batch) {
            Some(at) => at,
            None => {
                self.works.push(self.tower.work(b, batch, false)?);
                self.works.len() - 1
            }
        };
        let work = &mut self.works[at];
        self.tower.forward(b, &self.params, work, patches);
        Ok(b.to_vec(&work.hidden))
    }
}

/// Matrices of equal rows placed side by side: `[rows, sum of cols]`.
fn side_by_side(parts: &[Tensor]) -> Tensor {
    let rows = parts[0].shape[0];
    let cols: usize = parts.iter().map(|p| p.shape[1]).sum();
    let mut data = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for p in parts {
            let c = p.shape[1];
            data.extend_from_slice(&p.data[r * c..(r + 1) * c]);
        }
    }
    Tensor {
        shape: vec![rows, cols],
        data,
    }
}

fn concatenated(parts: &[Tensor]) -> Tensor {
    let data: Vec<f32> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
    Tensor {
        shape: vec![data.len()],
        data,
    }
}
