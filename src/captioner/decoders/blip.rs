//! BLIP's text decoder (Li et al., 2022) as a decoder family: BERT's
//! embeddings (word and learned positions, then a layer norm), causal
//! post-LN blocks that each cross-attend to the image's tokens, and BERT's
//! prediction head: logits = LN(GELU(h W + b)) E^T + bias + m, with E the
//! word embedding (tied) and m the policy mask
//! ([`crate::captioner::inputs::policy_mask`]).
//!
//! The image input of a row is its `[image_tokens, embed_dim]` tokens (a
//! vision tower's last hidden states). They are the blocks' memory: in
//! teacher forcing every block projects them to keys and values; in
//! decoding the stepper projects them once per batch.
//!
//! A prompt (`CaptionerConfig::prompt`, BLIP's "a picture of") is fed
//! after each caption's start: its positions run through the blocks, but
//! only the caption's positions reach the prediction head, so no loss
//! reads them, and the stepper feeds the prompt with the start.
//!
//! The cross-attention layers are the adapter between the image and the
//! language model: what `--freeze-decoder` trains.
//!
//! With `CaptionerConfig::vision` (`--train-vision`) the decoder owns the
//! vision tower too: a row's image input is then its patches, the tower
//! makes the tokens in every forward, and the blocks' gradient w.r.t.
//! them flows back through the tower.

use crate::backend::{Backend, Matmul, NO_ROW, TokenIndex};
use crate::captioner::CaptionerConfig;
use crate::captioner::decoder::{Decoder, Stepper};
use crate::captioner::inputs::{TokenInputs, Workspaces, policy_mask};
use crate::model::kv_cache::KvCache;
use crate::model::layers::{Dense, Norm, NormStats};
use crate::model::params::{Init, ParamId, Params};
use crate::model::transformer::{Activations, Transformer};
use crate::model::vision::{VisionTower, VisionWork};
use anyhow::{Result, bail};

pub struct BlipDecoder<B: Backend> {
    config: CaptionerConfig,
    params: Params<B>,
    /// `[vocab, width]`: the word embedding, also the output layer.
    tokens: ParamId,
    /// `[token positions, width]`.
    positions: ParamId,
    /// The embeddings' layer norm (`ln_pre`) and the blocks.
    decoder: Transformer,
    head: Head,
    /// The vision tower trained with the decoder, if it is.
    vision: Option<VisionTower>,
    /// `[vocab]`: the policy mask.
    policy_mask: B::Tensor,
    workspaces: Workspaces<Workspace<B>>,
}

/// BERT's prediction head before the tied output layer.
struct Head {
    dense: Dense,
    norm: Norm,
    /// `[vocab]`: the output layer's bias.
    bias: ParamId,
}

/// The head's activations for `rows` positions.
struct HeadActivations<B: Backend> {
    pre: B::Tensor,
    act: B::Tensor,
    stats: NormStats<B>,
    normed: B::Tensor,
    /// `[vocab]`: the output bias plus the policy mask.
    output_bias: B::Tensor,
    d_normed: B::Tensor,
    d_act: B::Tensor,
    d_pre: B::Tensor,
}

impl<B: Backend> HeadActivations<B> {
    fn new(b: &B, c: &CaptionerConfig, rows: usize, backward: bool) -> Self {
        let w = c.decoder.width;
        let grad = |len: usize| b.zeros(if backward { len } else { 0 });
        HeadActivations {
            pre: b.zeros(rows * w),
            act: b.zeros(rows * w),
            stats: NormStats::new(b, rows),
            normed: b.zeros(rows * w),
            output_bias: b.zeros(c.vocab_size),
            d_normed: grad(rows * w),
            d_act: grad(rows * w),
            d_pre: grad(rows * w),
        }
    }
}

/// The activations of one batch shape. With a prompt, each row feeds
/// the prompt's positions after its start: the blocks run over
/// `positions + prompt` positions per row, the head over `positions`.
struct Workspace<B: Backend> {
    position_ids: TokenIndex<B>,
    decoder: Activations<B>,
    /// The blocks' output at every fed position.
    hidden: B::Tensor,
    head: HeadActivations<B>,
    /// [batch * positions, vocab]: row b * positions + t predicts token t + 1.
    logits: B::Tensor,
    d_hidden: B::Tensor,
    prompted: Option<Prompted<B>>,
    /// The trained vision tower's activations.
    vision: Option<VisionWork<B>>,
}

/// A workspace's rows when a prompt is fed.
struct Prompted<B: Backend> {
    /// Each caption position's row among the fed positions: the one
    /// whose output predicts the caption's next piece.
    caption_rows: B::Ids,
    /// Each fed position's caption row, or `NO_ROW` where nothing is
    /// predicted (the start and all but the prompt's last piece).
    fed_rows: B::Ids,
    /// The batch's ids with the prompt after each start (made per batch).
    fed: Option<TokenIndex<B>>,
    /// `hidden` at the caption positions: the head's input.
    caption_hidden: B::Tensor,
    d_caption_hidden: B::Tensor,
}

impl<B: Backend> BlipDecoder<B> {
    /// A decoder with fresh weights from `seed`, for a validated `config`.
    pub fn new(b: &B, config: CaptionerConfig, seed: u64) -> Self {
        let c = &config;
        let (w, v) = (c.decoder.width, c.vocab_size);
        let mut p = Params::new(seed);
        let tokens = p.add("decoder.tokens".into(), &[v, w], Init::Normal(0.02), false);
        let positions = p.add(
            "decoder.positions".into(),
            &[c.seq_len(), w],
            Init::Normal(0.02),
            false,
        );
        let decoder = Transformer::new(&mut p, "decoder", c.decoder);
        let head = Head {
            dense: Dense::new(&mut p, "head.dense", w, w, 0.02),
            norm: Norm::with_eps(&mut p, "head.ln", w, c.decoder.norm_eps),
            bias: p.add("head.bias".into(), &[v], Init::Const(0.0), false),
        };
        let vision = (c.vision).map(|v| VisionTower::new(&mut p, "vision", v));
        p.finish(b);
        BlipDecoder {
            policy_mask: b.tensor(&policy_mask(c)),
            config,
            params: p,
            tokens,
            positions,
            decoder,
            head,
            vision,
            workspaces: Workspaces::default(),
        }
    }

    /// The activations of `inputs`' shape.
    fn workspace(&self, b: &B, inputs: &TokenInputs<B>) -> Result<Workspace<B>> {
        let c = &self.config;
        let (batch, t, w) = (inputs.batch, inputs.positions, c.decoder.width);
        let p = c.prompt.len();
        // Positions fed per row: the start, the prompt, the caption's others.
        let fed = t + p;
        let ids: Vec<u32> = (0..batch).flat_map(|_| 0..fed as u32).collect();
        let rows = batch * t;
        let prompted = (p > 0).then(|| {
            // Position j predicts the caption's piece j + 1 from fed
            // position p + j: the prompt's last for the first piece.
            let caption_rows: Vec<u32> = (0..batch)
                .flat_map(|r| (0..t).map(move |j| (r * fed + p + j) as u32))
                .collect();
            let mut fed_rows = vec![NO_ROW; batch * fed];
            for (k, &row) in caption_rows.iter().enumerate() {
                fed_rows[row as usize] = k as u32;
            }
            Prompted {
                caption_rows: b.ids(&caption_rows),
                fed_rows: b.ids(&fed_rows),
                fed: None,
                caption_hidden: b.zeros(rows * w),
                d_caption_hidden: b.zeros(rows * w),
            }
        });
        Ok(Workspace {
            position_ids: TokenIndex::new(b, &ids, c.seq_len())?,
            // The tokens of a frozen vision tower need no gradient.
            decoder: (self.decoder).cross_activations(
                b,
                (batch, fed, c.image_tokens),
                self.vision.is_some(),
            ),
            hidden: b.zeros(batch * fed * w),
            head: HeadActivations::new(b, c, rows, true),
            logits: b.zeros(rows * c.vocab_size),
            d_hidden: b.zeros(batch * fed * w),
            prompted,
            vision: (self.vision.as_ref())
                .map(|v| v.work(b, batch, true))
                .transpose()?,
        })
    }

    /// `inputs`' ids with the prompt after each row's start.
    fn with_prompt(&self, b: &B, inputs: &TokenInputs<B>) -> Result<TokenIndex<B>> {
        let (t, prompt) = (inputs.positions, self.config.prompt.ids());
        let fed: Vec<u32> = (inputs.host_ids.chunks(t))
            .flat_map(|row| row[..1].iter().chain(prompt).chain(&row[1..]).copied())
            .collect();
        Ok(TokenIndex::new(b, &fed, self.config.vocab_size)?)
    }

    /// The word and position embeddings of `ids` (at positions
    /// `position_ids`) into `input`.
    fn embed(&self, b: &B, ids: &B::Ids, position_ids: &B::Ids, input: &mut B::Tensor) {
        let (p, w) = (&self.params, self.config.decoder.width);
        b.embedding(p.value(self.tokens), ids, input, w, false);
        b.embedding(p.value(self.positions), position_ids, input, w, true);
    }

    /// `a.output_bias` = the output layer's bias plus the policy mask, for
    /// the head's forwards until the weights change.
    fn output_bias(&self, b: &B, a: &mut HeadActivations<B>) {
        let bias = self.params.value(self.head.bias);
        b.add(1.0, bias, 1.0, &self.policy_mask, &mut a.output_bias);
    }

    /// logits `[rows, vocab]` from the blocks' output `hidden`, with the
    /// output bias `a` holds ([`BlipDecoder::output_bias`]).
    fn head_forward(
        &self,
        b: &B,
        a: &mut HeadActivations<B>,
        hidden: &B::Tensor,
        logits: &mut B::Tensor,
        rows: usize,
    ) {
        let (p, c, h) = (&self.params, &self.config, &self.head);
        h.dense.forward(b, p, hidden, &mut a.pre);
        b.gelu_erf(&a.pre, &mut a.act);
        h.norm.forward(b, p, &a.act, &mut a.normed, &mut a.stats);
        b.matmul_bias(
            &a.normed,
            p.value(self.tokens),
            &a.output_bias,
            logits,
            &Matmul::new(rows, c.vocab_size, c.decoder.width).trans_b(),
        );
    }
}

impl<B: Backend> Decoder<B> for BlipDecoder<B> {
    fn params(&self) -> &Params<B> {
        &self.params
    }

    fn params_mut(&mut self) -> &mut Params<B> {
        &mut self.params
    }

    /// The blocks' cross-attention layers are the adapter.
    fn is_adapter(&self, i: usize) -> bool {
        self.params.specs[i].name.contains(".cross.")
    }

    fn logits(&self) -> &B::Tensor {
        &self.workspaces.current().logits
    }

    fn stepper(&self, b: &B, rows: usize, steps: usize) -> Box<dyn Stepper<B> + '_> {
        Box::new(BlipStepper::new(b, self, rows, steps))
    }

    /// The images are `[batch, image_tokens, embed_dim]` tokens, or
    /// `[batch, patches, patch_dim]` patches for a trained vision tower.
    fn forward(&mut self, b: &B, images: &[f32], inputs: &TokenInputs<B>) -> Result<()> {
        let c = &self.config;
        if images.len() != inputs.batch * c.image_input_len() {
            let per_image = match &c.vision {
                Some(v) => format!("{} patches of {}", v.patches, v.patch_dim),
                None => format!("{} tokens of {}", c.image_tokens, c.embed_dim),
            };
            bail!(
                "{} image values for {} captions; this BLIP decoder reads {per_image} per image",
                images.len(),
                inputs.batch,
            );
        }
        if !self.workspaces.select(inputs) {
            let ws = self.workspace(b, inputs)?;
            self.workspaces.add(inputs, ws);
        }
        // The workspaces step aside while the weights' methods run.
        let mut workspaces = std::mem::take(&mut self.workspaces);
        let ws = workspaces.current_for(inputs);
        if let Some(p) = &mut ws.prompted {
            p.fed = Some(self.with_prompt(b, inputs)?);
        }
        let fed =
            (ws.prompted.as_ref()).map_or(&inputs.ids, |p| p.fed.as_ref().expect("set above"));
        match (&self.vision, &mut ws.vision) {
            (Some(tower), Some(vw)) => {
                tower.forward(b, &self.params, vw, images);
                b.axpby(1.0, &vw.hidden, 0.0, ws.decoder.memory());
            }
            (None, _) => b.write(ws.decoder.memory(), images),
            (Some(_), None) => unreachable!("a workspace has a trained tower's buffers"),
        }
        self.embed(b, &fed.ids, &ws.position_ids.ids, ws.decoder.input());
        // Padding only follows a caption's real tokens, so the causal mask
        // already keeps it out of every real position's attention.
        self.decoder
            .forward(b, &self.params, &mut ws.decoder, None, &mut ws.hidden);
        let w = self.config.decoder.width;
        let caption_hidden = match &mut ws.prompted {
            Some(p) => {
                b.embedding(&ws.hidden, &p.caption_rows, &mut p.caption_hidden, w, false);
                &p.caption_hidden
            }
            None => &ws.hidden,
        };
        self.output_bias(b, &mut ws.head);
        self.head_forward(
            b,
            &mut ws.head,
            caption_hidden,
            &mut ws.logits,
            inputs.rows(),
        );
        self.workspaces = workspaces;
        Ok(())
    }

    fn backward(&mut self, b: &B, inputs: &TokenInputs<B>, d_logits: &B::Tensor) {
        let c = self.config;
        let ws = self.workspaces.current_for(inputs);
        let (w, v, rows) = (c.decoder.width, c.vocab_size, inputs.rows());
        let (p, h, a) = (&mut self.params, &self.head, &mut ws.head);
        b.matmul(
            d_logits,
            p.value(self.tokens),
            &mut a.d_normed,
            &Matmul::new(rows, w, v),
        );
        b.matmul(
            d_logits,
            &a.normed,
            p.grad(self.tokens),
            &Matmul::new(v, w, rows).trans_a().accumulate(),
        );
        b.column_sum(d_logits, rows, v, p.grad(h.bias), true);
        h.norm
            .backward(b, p, &a.d_normed, &a.act, &a.stats, &mut a.d_act, false);
        b.gelu_erf_backward(&a.pre, &a.d_act, &mut a.d_pre);
        match &mut ws.prompted {
            Some(prompted) => {
                let d = Some((&mut prompted.d_caption_hidden, false));
                h.dense
                    .backward(b, p, &a.d_pre, &prompted.caption_hidden, d);
                // The prompt's positions get no gradient from the head.
                let (from, rows) = (&prompted.d_caption_hidden, &prompted.fed_rows);
                b.embedding(from, rows, &mut ws.d_hidden, w, false);
            }
            None => {
                let d = Some((&mut ws.d_hidden, false));
                h.dense.backward(b, p, &a.d_pre, &ws.hidden, d);
            }
        }
        let d_input = self
            .decoder
            .backward(b, p, &mut ws.decoder, None, &ws.d_hidden);
        b.embedding_backward(d_input, &ws.position_ids, p.grad(self.positions), w);
        let fed = (ws.prompted.as_ref()).and_then(|p| p.fed.as_ref());
        b.embedding_backward(d_input, fed.unwrap_or(&inputs.ids), p.grad(self.tokens), w);
        if let (Some(tower), Some(vw)) = (&self.vision, &mut ws.vision) {
            tower.backward(b, p, vw, ws.decoder.d_memory());
        }
    }
}

/// The BLIP decoder run one position at a time: the image tokens' keys
/// and values once per batch, then self-attention over a KV cache; the
/// prompt is fed with the start.
struct BlipStepper<'m, B: Backend> {
    model: &'m BlipDecoder<B>,
    rows: usize,
    cache: KvCache<B>,
    /// The image tokens of a frozen tower's rows (empty with a trained
    /// tower, which makes them in `vision`).
    memory: B::Tensor,
    vision: Option<VisionWork<B>>,
    /// positions[p] = [p; rows]: the position ids of fed position p.
    positions: Vec<B::Ids>,
    /// The prompt's ids, each `[id; rows]`.
    prompt: Vec<B::Ids>,
    hidden: B::Tensor,
    head: HeadActivations<B>,
    logits: B::Tensor,
}

impl<'m, B: Backend> BlipStepper<'m, B> {
    fn new(b: &B, model: &'m BlipDecoder<B>, rows: usize, steps: usize) -> Self {
        let c = &model.config;
        let fed = steps + c.prompt.len();
        BlipStepper {
            model,
            rows,
            cache: model.decoder.memory_kv_cache(b, rows, fed, c.image_tokens),
            memory: b.zeros(match model.vision {
                Some(_) => 0,
                None => rows * c.image_input_len(),
            }),
            vision: (model.vision.as_ref()).map(|v| {
                v.work(b, rows, false)
                    .expect("a tower's position ids fit its positions")
            }),
            positions: (0..fed).map(|p| b.ids(&vec![p as u32; rows])).collect(),
            prompt: (c.prompt.ids().iter())
                .map(|&id| b.ids(&vec![id; rows]))
                .collect(),
            hidden: b.zeros(rows * c.decoder.width),
            head: HeadActivations::new(b, c, rows, false),
            logits: b.zeros(rows * c.vocab_size),
        }
    }
}

impl<B: Backend> Stepper<B> for BlipStepper<'_, B> {
    /// `images` are `[rows, image_tokens, embed_dim]`, or the rows'
    /// patches for a trained vision tower.
    fn start(&mut self, b: &B, images: &[f32]) {
        let m = self.model;
        self.cache.clear();
        let memory = match (&m.vision, &mut self.vision) {
            (Some(tower), Some(vw)) => {
                tower.forward(b, &m.params, vw, images);
                &vw.hidden
            }
            (None, _) => {
                b.write(&mut self.memory, images);
                &self.memory
            }
            (Some(_), None) => unreachable!("a stepper has a trained tower's buffers"),
        };
        m.decoder.remember(b, &m.params, &mut self.cache, memory);
        // The weights hold still while a batch is decoded.
        m.output_bias(b, &mut self.head);
    }

    fn advance(&mut self, b: &B, ids: &B::Ids) {
        let m = self.model;
        let starts = self.cache.is_empty();
        let mut feed = |ids: &B::Ids| {
            let position = &self.positions[self.cache.len()];
            m.embed(b, ids, position, self.cache.input());
            m.decoder
                .forward_cached(b, &m.params, &mut self.cache, &mut self.hidden);
        };
        feed(ids);
        if starts {
            self.prompt.iter().for_each(&mut feed);
        }
        m.head_forward(b, &mut self.head, &self.hidden, &mut self.logits, self.rows);
    }

    fn logits(&self) -> &B::Tensor {
        &self.logits
    }

    fn reorder(&mut self, b: &B, parents: &B::Ids) {
        self.cache.reorder(b, parents);
    }
}
