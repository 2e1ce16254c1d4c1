//! The retriever: a dual encoder. The image tower is a small ViT (patches,
//! a linear patch embedding plus learned positions, the transformer, mean
//! pooling, a projection); the text tower embeds tokens and positions, runs
//! the transformer and takes the end token's state, then projects. Both
//! towers share the one transformer implementation.

use super::RetrieverConfig;
use crate::backend::{Backend, TokenIndex};
use crate::data::vocab::PAD;
use crate::model::layers::Dense;
use crate::model::params::{Init, ParamId, Params};
use crate::model::transformer::{Activations, Transformer};
use crate::ops::contrastive::Contrastive;
use anyhow::Result;

/// ln(100): CLIP keeps the learned scale exp(log_scale) at most 100.
pub const MAX_LOG_SCALE: f32 = 4.605_17;
/// ln(1 / 0.07), CLIP's initial temperature.
pub const INIT_LOG_SCALE: f32 = 2.659_26;

struct ImageTower<B: Backend> {
    patch_embed: Dense,
    positions: ParamId,
    position_ids: TokenIndex<B>,
    transformer: Transformer,
    activations: Activations<B>,
    proj: Dense,
    patches: B::Tensor,
    hidden: B::Tensor,
    pooled: B::Tensor,
    d_pooled: B::Tensor,
    d_hidden: B::Tensor,
}

struct TextTower<B: Backend> {
    tokens: ParamId,
    positions: ParamId,
    position_ids: TokenIndex<B>,
    transformer: Transformer,
    activations: Activations<B>,
    proj: Dense,
    hidden: B::Tensor,
    pooled: B::Tensor,
    d_pooled: B::Tensor,
    d_hidden: B::Tensor,
}

/// One batch of text, tokenised: `[batch, max_len]` ids padded with PAD.
pub struct TextBatch<B: Backend> {
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
            token_ids: TokenIndex::new(b, &ids, config.vocab_size)?,
            end_rows: TokenIndex::new(b, &ends, captions.len() * t)?,
            key_mask: b.ids(&mask),
        })
    }
}

pub struct Retriever<B: Backend> {
    pub config: RetrieverConfig,
    pub batch: usize,
    pub params: Params<B>,
    pub log_scale: ParamId,
    image: ImageTower<B>,
    text: TextTower<B>,
    pub loss: Contrastive<B>,
    pub image_embeddings: B::Tensor,
    pub text_embeddings: B::Tensor,
    d_image: B::Tensor,
    d_text: B::Tensor,
}

impl<B: Backend> Retriever<B> {
    /// A model with fresh weights (from `seed`) for batches of `batch`.
    pub fn new(b: &B, config: RetrieverConfig, batch: usize, seed: u64) -> Result<Self> {
        config.validate()?;
        let mut p = Params::new(seed);
        let c = &config;
        let patches = c.patches_per_image();
        let (iw, tw, d) = (c.image.width, c.text.width, c.embed_dim);
        let image_rows = batch * patches;
        let text_rows = batch * c.max_len;
        let repeat = |n: usize| -> Vec<u32> { (0..batch).flat_map(|_| 0..n as u32).collect() };
        let patch_embed = Dense::new(&mut p, "image.patch_embed", c.patch_dim(), iw, 0.02);
        let image_positions = p.add(
            "image.positions".into(),
            &[patches, iw],
            Init::Normal(0.02),
            false,
        );
        let transformer = Transformer::new(&mut p, "image", c.image);
        let image = ImageTower {
            patch_embed,
            positions: image_positions,
            position_ids: TokenIndex::new(b, &repeat(patches), patches)?,
            activations: transformer.activations(b, batch, patches),
            transformer,
            proj: Dense::new(&mut p, "image.proj", iw, d, (iw as f32).powf(-0.5)),
            patches: b.zeros(image_rows * c.patch_dim()),
            hidden: b.zeros(image_rows * iw),
            pooled: b.zeros(batch * iw),
            d_pooled: b.zeros(batch * iw),
            d_hidden: b.zeros(image_rows * iw),
        };
        let text_tokens = p.add(
            "text.tokens".into(),
            &[c.vocab_size, tw],
            Init::Normal(0.02),
            false,
        );
        let text_positions = p.add(
            "text.positions".into(),
            &[c.max_len, tw],
            Init::Normal(0.01),
            false,
        );
        let transformer = Transformer::new(&mut p, "text", c.text);
        let text = TextTower {
            tokens: text_tokens,
            positions: text_positions,
            position_ids: TokenIndex::new(b, &repeat(c.max_len), c.max_len)?,
            activations: transformer.activations(b, batch, c.max_len),
            transformer,
            proj: Dense::new(&mut p, "text.proj", tw, d, (tw as f32).powf(-0.5)),
            hidden: b.zeros(text_rows * tw),
            pooled: b.zeros(batch * tw),
            d_pooled: b.zeros(batch * tw),
            d_hidden: b.zeros(text_rows * tw),
        };
        let log_scale = p.add(
            "logit_scale".into(),
            &[1],
            Init::Const(INIT_LOG_SCALE),
            false,
        );
        p.finish(b);
        Ok(Retriever {
            config,
            batch,
            params: p,
            log_scale,
            image,
            text,
            loss: Contrastive::new(b, batch, d),
            image_embeddings: b.zeros(batch * d),
            text_embeddings: b.zeros(batch * d),
            d_image: b.zeros(batch * d),
            d_text: b.zeros(batch * d),
        })
    }

    /// image_embeddings = the image tower on `[batch, patches, patch_dim]` patches.
    pub fn encode_images(&mut self, b: &B, patches: &[f32]) {
        let t = &mut self.image;
        let p = &self.params;
        b.write(&mut t.patches, patches);
        let iw = self.config.image.width;
        let input = t.activations.input();
        t.patch_embed.forward(b, p, &t.patches, input);
        b.embedding(p.value(t.positions), &t.position_ids.ids, input, iw, true);
        t.transformer
            .forward(b, p, &mut t.activations, None, &mut t.hidden);
        b.mean_pool(
            &t.hidden,
            &mut t.pooled,
            self.config.patches_per_image(),
            iw,
        );
        t.proj.forward(b, p, &t.pooled, &mut self.image_embeddings);
    }

    /// text_embeddings = the text tower on a batch of captions.
    pub fn encode_texts(&mut self, b: &B, batch: &TextBatch<B>) {
        self.encode_text_inputs(b, batch, None);
    }

    /// The retriever's token embedding table `[vocab, text width]`.
    pub fn token_table(&self) -> &B::Tensor {
        self.params.value(self.text.tokens)
    }

    /// As `encode_texts`, with `shift` (`[batch * max_len, text width]`)
    /// added to the token embeddings: a relaxed caption's tokens are
    /// mixtures of the table's rows.
    pub fn encode_text_inputs(&mut self, b: &B, batch: &TextBatch<B>, shift: Option<&B::Tensor>) {
        let t = &mut self.text;
        let p = &self.params;
        let tw = self.config.text.width;
        let input = t.activations.input();
        b.embedding(p.value(t.tokens), &batch.token_ids.ids, input, tw, false);
        if let Some(shift) = shift {
            b.axpby(1.0, shift, 1.0, input);
        }
        b.embedding(p.value(t.positions), &t.position_ids.ids, input, tw, true);
        t.transformer.forward(
            b,
            p,
            &mut t.activations,
            Some(&batch.key_mask),
            &mut t.hidden,
        );
        b.embedding(&t.hidden, &batch.end_rows.ids, &mut t.pooled, tw, false);
        t.proj.forward(b, p, &t.pooled, &mut self.text_embeddings);
    }

    /// Forward and backward of the contrastive loss on one batch of
    /// matching pairs; gradients land in `params.grads` (zeroed first).
    pub fn forward_backward(&mut self, b: &B, patches: &[f32], texts: &TextBatch<B>) {
        self.encode_images(b, patches);
        self.encode_texts(b, texts);
        let log_scale = self.params.value(self.log_scale);
        self.loss
            .forward(b, &self.image_embeddings, &self.text_embeddings, log_scale);
        self.params.zero_grads(b);
        let (values, grads) = (&self.params.values, &mut self.params.grads);
        self.loss.backward(
            b,
            &values[self.log_scale.0],
            &mut self.d_image,
            &mut self.d_text,
            &mut grads[self.log_scale.0],
        );
        self.backward_text(b, texts);
        self.backward_images(b);
    }

    fn backward_images(&mut self, b: &B) {
        let (t, p, iw) = (&mut self.image, &mut self.params, self.config.image.width);
        t.proj.backward(
            b,
            p,
            &self.d_image,
            &t.pooled,
            Some((&mut t.d_pooled, false)),
        );
        b.mean_pool_backward(
            &t.d_pooled,
            &mut t.d_hidden,
            self.config.patches_per_image(),
            iw,
            false,
        );
        let d_input = t
            .transformer
            .backward(b, p, &mut t.activations, &t.d_hidden);
        b.embedding_backward(d_input, &t.position_ids, p.grad(t.positions), iw);
        t.patch_embed.backward(b, p, d_input, &t.patches, None);
    }

    fn backward_text(&mut self, b: &B, texts: &TextBatch<B>) {
        self.text_tower_backward(b, texts);
        let (t, p, tw) = (&mut self.text, &mut self.params, self.config.text.width);
        let d_input = t.activations.d_input();
        b.embedding_backward(d_input, &t.position_ids, p.grad(t.positions), tw);
        b.embedding_backward(d_input, &texts.token_ids, p.grad(t.tokens), tw);
    }

    /// The gradient of the text tower's token inputs `[batch * max_len,
    /// text width]` given `d_text` on its last `encode_text_inputs`'
    /// embeddings, for a frozen retriever: the tower's weights are not
    /// trained (their gradients are written on the way, and zeroed first).
    pub fn text_input_gradient(
        &mut self,
        b: &B,
        texts: &TextBatch<B>,
        d_text: &[f32],
    ) -> &B::Tensor {
        b.write(&mut self.d_text, d_text);
        self.params.zero_grads(b);
        self.text_tower_backward(b, texts);
        self.text.activations.d_input()
    }

    /// From d_text back to the gradient of the transformer's input.
    fn text_tower_backward(&mut self, b: &B, texts: &TextBatch<B>) {
        let (t, p, tw) = (&mut self.text, &mut self.params, self.config.text.width);
        t.proj.backward(
            b,
            p,
            &self.d_text,
            &t.pooled,
            Some((&mut t.d_pooled, false)),
        );
        b.fill(&mut t.d_hidden, 0.0);
        b.embedding_backward(&t.d_pooled, &texts.end_rows, &mut t.d_hidden, tw);
        t.transformer
            .backward(b, p, &mut t.activations, &t.d_hidden);
    }
}
