//! The retriever: a dual encoder. The image tower is a small ViT (patches,
//! a linear patch embedding plus learned positions, the transformer, mean
//! pooling, a projection; or, as CLIP's, a class vector before the patches
//! whose output alone is pooled); the text tower embeds tokens and
//! positions, runs the transformer and takes the end token's state, then
//! projects. Both towers share the one transformer implementation. Its
//! config is a retriever checkpoint's (`docs/checkpoints.md`).

use super::checkpoint;
use super::layers::Dense;
use super::params::{Init, ParamId, Params};
use super::transformer::{Activations, Transformer, TransformerConfig};
use super::vision::{VisionConfig, VisionTower, VisionWork};
use crate::backend::{Backend, HeadLayout, TokenIndex};
use crate::data::vocab::PAD;
use crate::ops::contrastive::Contrastive;
use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetrieverConfig {
    pub image_size: u32,
    pub patch: u32,
    pub image: TransformerConfig,
    pub text: TransformerConfig,
    /// Token positions of the text tower, <bos> and <eos> included.
    pub max_len: usize,
    pub vocab_size: usize,
    pub embed_dim: usize,
    /// How the image tower pools its outputs.
    #[serde(default, skip_serializing_if = "ImagePool::is_mean")]
    pub image_pool: ImagePool,
    /// Whether the patch embedding and both projections have biases
    /// (CLIP's have none).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub biases: bool,
}

/// The image tower's pooling: the mean over the patches' outputs
/// (captune's), or a learned class vector placed before the patches whose
/// output alone is pooled (CLIP's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImagePool {
    #[default]
    Mean,
    Class,
}

impl ImagePool {
    fn is_mean(&self) -> bool {
        *self == ImagePool::Mean
    }
}

fn yes() -> bool {
    true
}

fn is_true(x: &bool) -> bool {
    *x
}

impl RetrieverConfig {
    pub fn patches_per_image(&self) -> usize {
        let side = (self.image_size / self.patch) as usize;
        side * side
    }

    /// Positions of the image tower: the patches, after the class vector
    /// when there is one.
    pub fn image_positions(&self) -> usize {
        self.patches_per_image() + usize::from(self.image_pool == ImagePool::Class)
    }

    /// Parameters of a retriever of this shape (see `docs/checkpoints.md`).
    pub fn parameter_count(&self) -> u128 {
        let (di, dt) = (self.image.width as u128, self.text.width as u128);
        let e = self.embed_dim as u128;
        let bias = |n: u128| if self.biases { n } else { 0 };
        let class = if self.image_pool == ImagePool::Class {
            di
        } else {
            0
        };
        let image = self.patch_dim() as u128 * di
            + bias(di)
            + class
            + self.image_positions() as u128 * di
            + self.image.parameter_count()
            + di * e
            + bias(e);
        let text = (self.vocab_size as u128 + self.max_len as u128) * dt
            + self.text.parameter_count()
            + dt * e
            + bias(e);
        image + text + 1
    }

    /// The image tower's ViT.
    pub fn vision(&self) -> VisionConfig {
        VisionConfig {
            patches: self.patches_per_image(),
            patch_dim: self.patch_dim(),
            class: self.image_pool == ImagePool::Class,
            patch_bias: self.biases,
            transformer: self.image,
        }
    }

    /// Floats per patch: RGB values of a patch x patch square.
    pub fn patch_dim(&self) -> usize {
        (3 * self.patch * self.patch) as usize
    }

    pub fn validate(&self) -> Result<()> {
        if self.patch == 0 || !self.image_size.is_multiple_of(self.patch) {
            bail!(
                "image size {} is not a multiple of the patch size {}",
                self.image_size,
                self.patch
            );
        }
        for (tower, t) in [("image", &self.image), ("text", &self.text)] {
            if t.heads == 0 || t.width % t.heads != 0 {
                bail!(
                    "{tower} tower: width {} is not a multiple of heads {}",
                    t.width,
                    t.heads
                );
            }
        }
        if self.max_len < 3 {
            bail!(
                "max_len {} leaves no room for a token between <bos> and <eos>",
                self.max_len
            );
        }
        Ok(())
    }
}

impl checkpoint::ModelConfig for RetrieverConfig {
    fn validate(&self) -> Result<()> {
        RetrieverConfig::validate(self)
    }
    fn parameter_count(&self) -> u128 {
        RetrieverConfig::parameter_count(self)
    }
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// ln(100): CLIP keeps the learned scale exp(log_scale) at most 100.
pub const MAX_LOG_SCALE: f32 = 4.605_17;
/// ln(1 / 0.07), CLIP's initial temperature.
pub const INIT_LOG_SCALE: f32 = 2.659_26;

/// The image tower's weights: the ViT, then the projection of its pooled
/// output.
struct ImageTower {
    vision: VisionTower,
    proj: Dense,
}

/// The text tower's weights.
struct TextTower {
    tokens: ParamId,
    positions: ParamId,
    transformer: Transformer,
    proj: Dense,
}

/// The image tower's activations for batches of `batch` images.
struct ImageWork<B: Backend> {
    vision: VisionWork<B>,
    /// `[batch, width]`: the class vector's output (CLIP's pooling) or the
    /// mean of the patches'.
    pooled: B::Tensor,
    d_pooled: B::Tensor,
    d_hidden: B::Tensor,
    embeddings: B::Tensor,
    d_embeddings: B::Tensor,
}

/// The text tower's activations for batches of `batch` captions.
struct TextWork<B: Backend> {
    batch: usize,
    position_ids: TokenIndex<B>,
    activations: Activations<B>,
    hidden: B::Tensor,
    pooled: B::Tensor,
    d_pooled: B::Tensor,
    d_hidden: B::Tensor,
    embeddings: B::Tensor,
    d_embeddings: B::Tensor,
}

/// `batch` repetitions of positions 0..n.
fn repeated_positions<B: Backend>(b: &B, batch: usize, n: usize) -> Result<TokenIndex<B>> {
    let ids: Vec<u32> = (0..batch).flat_map(|_| 0..n as u32).collect();
    Ok(TokenIndex::new(b, &ids, n)?)
}

/// Each image's class-vector row inside the tower's `[batch, tokens,
/// width]` output, as one "head" per image.
fn class_rows(c: &RetrieverConfig, batch: usize) -> HeadLayout {
    HeadLayout {
        batch,
        seq: 1,
        heads: 1,
        head_dim: c.image.width,
        row_stride: c.image_positions() * c.image.width,
        col_offset: 0,
    }
}

impl<B: Backend> ImageWork<B> {
    /// Buffers for batches of `batch` images; without `backward` (a frozen
    /// retriever's) no gradient buffers.
    fn new(
        b: &B,
        c: &RetrieverConfig,
        tower: &ImageTower,
        batch: usize,
        backward: bool,
    ) -> Result<Self> {
        let (iw, d) = (c.image.width, c.embed_dim);
        let rows = batch * c.image_positions();
        let grad = |len: usize| b.zeros(if backward { len } else { 0 });
        Ok(ImageWork {
            vision: tower.vision.work(b, batch, backward)?,
            pooled: b.zeros(batch * iw),
            d_pooled: grad(batch * iw),
            d_hidden: grad(rows * iw),
            embeddings: b.zeros(batch * d),
            d_embeddings: grad(batch * d),
        })
    }
}

impl<B: Backend> TextWork<B> {
    fn new(b: &B, c: &RetrieverConfig, tower: &TextTower, batch: usize) -> Result<Self> {
        let (rows, tw, d) = (batch * c.max_len, c.text.width, c.embed_dim);
        Ok(TextWork {
            batch,
            position_ids: repeated_positions(b, batch, c.max_len)?,
            activations: tower.transformer.activations(b, batch, c.max_len),
            hidden: b.zeros(rows * tw),
            pooled: b.zeros(batch * tw),
            d_pooled: b.zeros(batch * tw),
            d_hidden: b.zeros(rows * tw),
            embeddings: b.zeros(batch * d),
            d_embeddings: b.zeros(batch * d),
        })
    }
}

/// One batch of text, tokenised: `[batch, max_len]` ids padded with PAD.
pub struct TextBatch<B: Backend> {
    captions: usize,
    token_ids: TokenIndex<B>,
    /// Row b * max_len + (position of b's end token), per caption.
    end_rows: TokenIndex<B>,
    key_mask: B::Ids,
}

impl<B: Backend> TextBatch<B> {
    pub fn new(b: &B, config: &RetrieverConfig, captions: &[Vec<u32>]) -> Result<Self> {
        let t = config.max_len;
        let mut ids = vec![PAD; captions.len() * t];
        let mut mask = vec![0u32; captions.len() * t];
        let mut ends = Vec::with_capacity(captions.len());
        for (i, c) in captions.iter().enumerate() {
            assert!(
                !c.is_empty() && c.len() <= t,
                "captions are encoded to 1..=max_len ids"
            );
            ids[i * t..i * t + c.len()].copy_from_slice(c);
            mask[i * t..i * t + c.len()].fill(1);
            ends.push((i * t + c.len() - 1) as u32);
        }
        Ok(TextBatch {
            captions: captions.len(),
            token_ids: TokenIndex::new(b, &ids, config.vocab_size)?,
            end_rows: TokenIndex::new(b, &ends, captions.len() * t)?,
            key_mask: b.ids(&mask),
        })
    }
}

/// The dual encoder: its weights, and the activations of each batch size
/// it has run (kept, so that steps of one size allocate nothing).
pub struct Retriever<B: Backend> {
    pub config: RetrieverConfig,
    /// The batch size it trains and embeds in.
    pub batch: usize,
    pub params: Params<B>,
    pub log_scale: ParamId,
    image: ImageTower,
    text: TextTower,
    /// The contrastive loss over a training batch of `batch` pairs.
    pub loss: Contrastive<B>,
    image_work: Vec<ImageWork<B>>,
    text_work: Vec<TextWork<B>>,
    /// The workspaces of the last image and text encodings.
    image_current: usize,
    text_current: usize,
}

impl<B: Backend> Retriever<B> {
    /// A model with fresh weights (from `seed`) that trains and embeds in
    /// batches of `batch` (other batch sizes get workspaces as they come).
    pub fn new(b: &B, config: RetrieverConfig, batch: usize, seed: u64) -> Result<Self> {
        Self::build(b, config, batch, seed, true)
    }

    /// A frozen model ([`Retriever::freeze`]), whose weights (zeros) the
    /// caller then writes: no gradient buffers are ever allocated.
    pub fn frozen(b: &B, config: RetrieverConfig, batch: usize) -> Result<Self> {
        Self::build(b, config, batch, 0, false)
    }

    fn build(
        b: &B,
        config: RetrieverConfig,
        batch: usize,
        seed: u64,
        trains: bool,
    ) -> Result<Self> {
        config.validate()?;
        let mut p = if trains {
            Params::new(seed)
        } else {
            Params::for_loading()
        };
        let c = &config;
        let (iw, tw, d) = (c.image.width, c.text.width, c.embed_dim);
        let dense = |p: &mut Params<B>, name: &str, inputs, outputs, std| {
            if c.biases {
                Dense::new(p, name, inputs, outputs, std)
            } else {
                Dense::without_bias(p, name, inputs, outputs, std)
            }
        };
        let image = ImageTower {
            vision: VisionTower::new(&mut p, "image", c.vision()),
            proj: dense(&mut p, "image.proj", iw, d, (iw as f32).powf(-0.5)),
        };
        let text = TextTower {
            tokens: p.add(
                "text.tokens".into(),
                &[c.vocab_size, tw],
                Init::Normal(0.02),
                false,
            ),
            positions: p.add(
                "text.positions".into(),
                &[c.max_len, tw],
                Init::Normal(0.01),
                false,
            ),
            transformer: Transformer::new(&mut p, "text", c.text),
            proj: dense(&mut p, "text.proj", tw, d, (tw as f32).powf(-0.5)),
        };
        let log_scale = p.add(
            "logit_scale".into(),
            &[1],
            Init::Const(INIT_LOG_SCALE),
            false,
        );
        if trains {
            p.finish(b);
        } else {
            p.finish_frozen(b);
        }
        let image_work = vec![ImageWork::new(b, c, &image, batch, trains)?];
        let text_work = vec![TextWork::new(b, c, &text, batch)?];
        Ok(Retriever {
            config,
            batch,
            params: p,
            log_scale,
            image,
            text,
            loss: Contrastive::new(b, batch, d),
            image_work,
            text_work,
            image_current: 0,
            text_current: 0,
        })
    }

    /// Makes it a frozen retriever, which embeds and passes gradients to
    /// its text tower's input but never trains: no parameter gradients,
    /// and no gradient buffers for its image tower. (A model built
    /// frozen, [`Retriever::frozen`], never allocates them.)
    pub fn freeze(&mut self, b: &B) -> Result<()> {
        self.params.freeze(b);
        let c = &self.config;
        self.image_work = vec![ImageWork::new(b, c, &self.image, self.batch, false)?];
        self.image_current = 0;
        Ok(())
    }

    /// The image embeddings `[batch, embed_dim]` of the last `encode_images`.
    pub fn image_embeddings(&self) -> &B::Tensor {
        &self.image_work[self.image_current].embeddings
    }

    /// The text embeddings `[batch, embed_dim]` of the last text encoding.
    pub fn text_embeddings(&self) -> &B::Tensor {
        &self.text_work[self.text_current].embeddings
    }

    /// The image tower's every token after its final norm, `[batch,
    /// tokens, width]`, from the last `encode_images`.
    pub fn image_tokens(&self) -> &B::Tensor {
        &self.image_work[self.image_current].vision.hidden
    }

    /// image_embeddings = the image tower on `[batch, patches, patch_dim]`
    /// patches, for any batch size.
    pub fn encode_images(&mut self, b: &B, patches: &[f32]) -> Result<()> {
        let c = &self.config;
        let batch = patches.len() / (c.patches_per_image() * c.patch_dim());
        let at = match self.image_work.iter().position(|w| w.vision.batch == batch) {
            Some(at) => at,
            None => {
                let backward = !self.params.is_frozen();
                let work = ImageWork::new(b, c, &self.image, batch, backward)?;
                self.image_work.push(work);
                self.image_work.len() - 1
            }
        };
        self.image_current = at;
        let (t, w, p) = (&self.image, &mut self.image_work[at], &self.params);
        t.vision.forward(b, p, &mut w.vision, patches);
        let iw = c.image.width;
        match c.image_pool {
            ImagePool::Class => {
                b.tokens_to_heads(&w.vision.hidden, &mut w.pooled, &class_rows(c, batch))
            }
            ImagePool::Mean => {
                b.mean_pool(&w.vision.hidden, &mut w.pooled, c.patches_per_image(), iw)
            }
        }
        t.proj.forward(b, p, &w.pooled, &mut w.embeddings);
        Ok(())
    }

    /// text_embeddings = the text tower on a batch of captions.
    pub fn encode_texts(&mut self, b: &B, batch: &TextBatch<B>) -> Result<()> {
        self.encode_text_inputs(b, batch, None)
    }

    /// The retriever's token embedding table `[vocab, text width]`.
    pub fn token_table(&self) -> &B::Tensor {
        self.params.value(self.text.tokens)
    }

    /// As `encode_texts`, with `shift` (`[batch * max_len, text width]`)
    /// added to the token embeddings: a relaxed caption's tokens are
    /// mixtures of the table's rows.
    pub fn encode_text_inputs(
        &mut self,
        b: &B,
        batch: &TextBatch<B>,
        shift: Option<&B::Tensor>,
    ) -> Result<()> {
        let c = &self.config;
        let at = match self
            .text_work
            .iter()
            .position(|w| w.batch == batch.captions)
        {
            Some(at) => at,
            None => {
                let work = TextWork::new(b, c, &self.text, batch.captions)?;
                self.text_work.push(work);
                self.text_work.len() - 1
            }
        };
        self.text_current = at;
        let (t, w, p) = (&self.text, &mut self.text_work[at], &self.params);
        let tw = c.text.width;
        let input = w.activations.input();
        b.embedding(p.value(t.tokens), &batch.token_ids.ids, input, tw, false);
        if let Some(shift) = shift {
            b.axpby(1.0, shift, 1.0, input);
        }
        b.embedding(p.value(t.positions), &w.position_ids.ids, input, tw, true);
        t.transformer.forward(
            b,
            p,
            &mut w.activations,
            Some(&batch.key_mask),
            &mut w.hidden,
        );
        b.embedding(&w.hidden, &batch.end_rows.ids, &mut w.pooled, tw, false);
        t.proj.forward(b, p, &w.pooled, &mut w.embeddings);
        Ok(())
    }

    /// Forward and backward of the contrastive loss on one batch of
    /// `batch` matching pairs; gradients land in `params.grads` (zeroed first).
    pub fn forward_backward(&mut self, b: &B, patches: &[f32], texts: &TextBatch<B>) -> Result<()> {
        assert!(
            !self.params.is_frozen(),
            "a frozen retriever does not train"
        );
        if texts.captions != self.batch {
            anyhow::bail!(
                "a training batch holds {} pairs, not {}",
                self.batch,
                texts.captions
            );
        }
        self.encode_images(b, patches)?;
        self.encode_texts(b, texts)?;
        let log_scale = self.params.value(self.log_scale);
        let (iw, tw) = (
            &mut self.image_work[self.image_current],
            &mut self.text_work[self.text_current],
        );
        self.loss
            .forward(b, &iw.embeddings, &tw.embeddings, log_scale);
        self.params.zero_grads(b);
        let (values, grads) = (&self.params.values, &mut self.params.grads);
        self.loss.backward(
            b,
            &values[self.log_scale.0],
            &mut iw.d_embeddings,
            &mut tw.d_embeddings,
            &mut grads[self.log_scale.0],
        );
        self.backward_text(b, texts);
        self.backward_images(b);
        Ok(())
    }

    fn backward_images(&mut self, b: &B) {
        let (t, p, iw) = (&self.image, &mut self.params, self.config.image.width);
        let w = &mut self.image_work[self.image_current];
        t.proj.backward(
            b,
            p,
            &w.d_embeddings,
            &w.pooled,
            Some((&mut w.d_pooled, false)),
        );
        let c = &self.config;
        match c.image_pool {
            // The outputs at the patches are pooled by no one: their rows
            // of d_hidden stay zero from its making.
            ImagePool::Class => b.heads_to_tokens(
                &w.d_pooled,
                &mut w.d_hidden,
                &class_rows(c, w.vision.batch),
                false,
            ),
            ImagePool::Mean => b.mean_pool_backward(
                &w.d_pooled,
                &mut w.d_hidden,
                c.patches_per_image(),
                iw,
                false,
            ),
        }
        t.vision.backward(b, p, &mut w.vision, &w.d_hidden);
    }

    fn backward_text(&mut self, b: &B, texts: &TextBatch<B>) {
        self.text_tower_backward(b, texts);
        let (t, p, tw) = (&self.text, &mut self.params, self.config.text.width);
        let w = &self.text_work[self.text_current];
        let d_input = w.activations.d_input();
        b.embedding_backward(d_input, &w.position_ids, p.grad(t.positions), tw);
        b.embedding_backward(d_input, &texts.token_ids, p.grad(t.tokens), tw);
    }

    /// The gradient of the text tower's token inputs `[batch * max_len,
    /// text width]` given `d_text` on the embeddings of its last
    /// `encode_text_inputs` (of `texts`), for a frozen retriever: the
    /// tower's weights are not trained (their gradients are written on
    /// the way, and zeroed first).
    pub fn text_input_gradient(
        &mut self,
        b: &B,
        texts: &TextBatch<B>,
        d_text: &[f32],
    ) -> &B::Tensor {
        let w = &mut self.text_work[self.text_current];
        assert_eq!(
            w.batch, texts.captions,
            "the gradient of the last text encoding"
        );
        b.write(&mut w.d_embeddings, d_text);
        self.params.zero_grads(b);
        self.text_tower_backward(b, texts);
        self.text_work[self.text_current].activations.d_input()
    }

    /// From the text embeddings' gradient back to the transformer's input.
    fn text_tower_backward(&mut self, b: &B, texts: &TextBatch<B>) {
        let (t, p, tw) = (&self.text, &mut self.params, self.config.text.width);
        let w = &mut self.text_work[self.text_current];
        t.proj.backward(
            b,
            p,
            &w.d_embeddings,
            &w.pooled,
            Some((&mut w.d_pooled, false)),
        );
        b.fill(&mut w.d_hidden, 0.0);
        b.embedding_backward(&w.d_pooled, &texts.end_rows, &mut w.d_hidden, tw);
        t.transformer
            .backward(b, p, &mut w.activations, Some(&texts.key_mask), &w.d_hidden);
    }
}
