//! The one transformer: a stack of pre-LN blocks and a final layer norm,
//! used by the retriever's image and text towers and by the caption
//! decoder. [`Transformer`] is the weights (parameter ids); the
//! activations of one batch shape live in an [`Activations`], so one set
//! of weights serves any number of batch shapes. Forward is the list of
//! layer calls; backward is the same list reversed, with every activation
//! it needs kept in a named buffer. Decoding one position at a time over
//! cached keys and values is in [`super::kv_cache`].

use super::layers::{Activation, Dense, Norm, NormStats};
use super::params::Params;
use crate::backend::{Backend, Storage};
use crate::ops::attention::{Attention, AttentionShape};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformerConfig {
    pub width: usize,
    pub layers: usize,
    pub heads: usize,
    /// Each position attends only to itself and earlier ones.
    pub causal: bool,
    /// Each block's MLP hidden width; 4 width (GPT-2's) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_width: Option<usize>,
    /// Each block's MLP activation.
    #[serde(default, skip_serializing_if = "is_gelu")]
    pub activation: Activation,
    /// Whether the query, key and value projections have biases.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub qkv_bias: bool,
    /// Whether a layer norm follows the last block.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub final_norm: bool,
    /// Whether a layer norm (`ln_pre`) takes the input before the first
    /// block (CLIP's image tower).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pre_norm: bool,
}

fn is_gelu(a: &Activation) -> bool {
    *a == Activation::Gelu
}

fn yes() -> bool {
    true
}

fn is_true(x: &bool) -> bool {
    *x
}

impl TransformerConfig {
    /// GPT-2's blocks (a GELU MLP 4 times as wide, biased q, k, v) and a
    /// final layer norm.
    pub fn new(width: usize, layers: usize, heads: usize, causal: bool) -> Self {
        TransformerConfig {
            width,
            layers,
            heads,
            causal,
            mlp_width: None,
            activation: Activation::Gelu,
            qkv_bias: true,
            final_norm: true,
            pre_norm: false,
        }
    }

    fn init_std(&self) -> f32 {
        0.02
    }

    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    pub fn mlp_width(&self) -> usize {
        self.mlp_width.unwrap_or(4 * self.width)
    }

    /// Parameters of the blocks and the final layer norm: per block two
    /// layer norms (4d), qkv (3d^2, + 3d with biases), the projection
    /// (d^2 + d) and the MLP of hidden width h (2dh + h + d); GPT-2's
    /// blocks have 12d^2 + 13d. Checked against a built model in the
    /// tests; checkpoint loading compares it with a file before allocating.
    pub fn parameter_count(&self) -> u128 {
        let (d, h) = (self.width as u128, self.mlp_width() as u128);
        let qkv_bias = if self.qkv_bias { 3 * d } else { 0 };
        let block = 4 * d + 3 * d * d + qkv_bias + d * d + d + 2 * d * h + h + d;
        let norms = 2 * d * (u128::from(self.final_norm) + u128::from(self.pre_norm));
        self.layers as u128 * block + norms
    }
}

/// x + attn(ln1(x)), then + mlp(ln2(.)): the weights.
pub(super) struct Block {
    ln1: Norm,
    qkv: Dense,
    proj: Dense,
    ln2: Norm,
    fc1: Dense,
    fc2: Dense,
    activation: Activation,
}

/// One block's activations for a batch shape, `[rows, width]` unless
/// named otherwise.
pub(super) struct BlockActivations<B: Backend> {
    ln1: NormStats<B>,
    attn: Attention<B>,
    ln2: NormStats<B>,
    ln1_out: B::Tensor,
    pub(super) qkv_out: B::Tensor, // [rows, 3 width]
    attn_out: B::Tensor,
    mid: B::Tensor,
    ln2_out: B::Tensor,
    fc1_out: B::Tensor, // [rows, mlp width]
    act_out: B::Tensor,
    // gradients
    d_ln: B::Tensor,
    d_qkv: B::Tensor,
    d_attn: B::Tensor,
    d_fc1: B::Tensor,
    /// At the activation's output, for an activation not fused into fc2's
    /// backward (empty otherwise).
    d_act: B::Tensor,
}

impl<B: Backend> BlockActivations<B> {
    /// Buffers for `[batch, seq]`; with `backward` false (incremental
    /// decoding, a frozen tower's forward) the gradient buffers are empty.
    pub(super) fn new(
        b: &B,
        c: &TransformerConfig,
        batch: usize,
        seq: usize,
        backward: bool,
    ) -> Self {
        let (rows, w, h) = (batch * seq, c.width, c.mlp_width());
        let grad = |len: usize| b.zeros(if backward { len } else { 0 });
        let shape = AttentionShape {
            batch,
            seq,
            heads: c.heads,
            head_dim: c.head_dim(),
            causal: c.causal,
        };
        BlockActivations {
            ln1: NormStats::new(b, rows),
            attn: Attention::new(b, shape, backward),
            ln2: NormStats::new(b, rows),
            ln1_out: b.zeros(rows * w),
            qkv_out: b.zeros(rows * 3 * w),
            attn_out: b.zeros(rows * w),
            mid: b.zeros(rows * w),
            ln2_out: b.zeros(rows * w),
            fc1_out: b.zeros(rows * h),
            act_out: b.zeros(rows * h),
            d_ln: grad(rows * w),
            d_qkv: grad(rows * 3 * w),
            d_attn: grad(rows * w),
            d_fc1: grad(rows * h),
            d_act: grad(if c.activation.is_fused() { 0 } else { rows * h }),
        }
    }
}

impl Block {
    fn new<B: Backend>(params: &mut Params<B>, name: &str, c: &TransformerConfig) -> Self {
        let (w, h) = (c.width, c.mlp_width());
        let std = c.init_std();
        // Residual projections scaled down with depth, as GPT-2 does.
        let residual_std = std / (2.0 * c.layers as f32).sqrt();
        let qkv_name = format!("{name}.attn.qkv");
        Block {
            ln1: Norm::new(params, &format!("{name}.ln1"), w),
            qkv: if c.qkv_bias {
                Dense::new(params, &qkv_name, w, 3 * w, std)
            } else {
                Dense::without_bias(params, &qkv_name, w, 3 * w, std)
            },
            proj: Dense::new(params, &format!("{name}.attn.proj"), w, w, residual_std),
            ln2: Norm::new(params, &format!("{name}.ln2"), w),
            fc1: Dense::new(params, &format!("{name}.mlp.fc1"), w, h, std),
            fc2: Dense::new(params, &format!("{name}.mlp.fc2"), h, w, residual_std),
            activation: c.activation,
        }
    }

    pub(super) fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        x: &B::Tensor,
        key_mask: Option<&B::Ids>,
        out: &mut B::Tensor,
    ) {
        let attend = |qkv: &B::Tensor, attn: &mut Attention<B>, attended: &mut B::Tensor| {
            attn.forward(b, qkv, key_mask, attended)
        };
        self.forward_with(b, p, a, x, attend, out);
    }

    /// The block with `attend(qkv, a.attn, attended)` as its attention
    /// (decoding's attends over a KV cache instead).
    pub(super) fn forward_with<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        x: &B::Tensor,
        attend: impl FnOnce(&B::Tensor, &mut Attention<B>, &mut B::Tensor),
        out: &mut B::Tensor,
    ) {
        self.ln1.forward(b, p, x, &mut a.ln1_out, &mut a.ln1);
        self.qkv.forward(b, p, &a.ln1_out, &mut a.qkv_out);
        attend(&a.qkv_out, &mut a.attn, &mut a.attn_out);
        self.proj.forward_residual(b, p, &a.attn_out, x, &mut a.mid);
        self.mlp_forward(b, p, a, out);
    }

    /// out = mid + mlp(ln2(mid)).
    fn mlp_forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        out: &mut B::Tensor,
    ) {
        self.ln2.forward(b, p, &a.mid, &mut a.ln2_out, &mut a.ln2);
        self.fc1.forward_act(
            b,
            p,
            self.activation,
            &a.ln2_out,
            &mut a.fc1_out,
            &mut a.act_out,
        );
        self.fc2.forward_residual(b, p, &a.act_out, &a.mid, out);
    }

    /// Given the gradient w.r.t. the block's output in `d`, leaves there
    /// the gradient w.r.t. its input x (and the forward's key mask). The
    /// residual connections pass the gradient through unchanged, so each
    /// branch's layer norm adds its share in place.
    fn backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        a: &mut BlockActivations<B>,
        (x, key_mask): (&B::Tensor, Option<&B::Ids>),
        d: &mut B::Tensor,
    ) {
        // MLP branch: d becomes the gradient w.r.t. mid.
        self.fc2.backward_through_act(
            b,
            p,
            self.activation,
            d,
            &a.act_out,
            &a.fc1_out,
            &mut a.d_act,
            &mut a.d_fc1,
        );
        self.fc1
            .backward(b, p, &a.d_fc1, &a.ln2_out, Some((&mut a.d_ln, false)));
        self.ln2.backward(b, p, &a.d_ln, &a.mid, &a.ln2, d, true);
        // Attention branch: d becomes the gradient w.r.t. x.
        self.proj
            .backward(b, p, d, &a.attn_out, Some((&mut a.d_attn, false)));
        a.attn.backward(
            b,
            &a.qkv_out,
            key_mask,
            &a.attn_out,
            &a.d_attn,
            &mut a.d_qkv,
        );
        self.qkv
            .backward(b, p, &a.d_qkv, &a.ln1_out, Some((&mut a.d_ln, false)));
        self.ln1.backward(b, p, &a.d_ln, x, &a.ln1, d, true);
    }
}

/// Blocks, a final layer norm and a layer norm before the first block,
/// each as the config says: the weights.
pub struct Transformer {
    pub config: TransformerConfig,
    pub(super) blocks: Vec<Block>,
    ln_f: Option<Norm>,
    ln_pre: Option<Norm>,
}

/// The activations of a transformer for `[batch, seq, width]` inputs.
pub struct Activations<B: Backend> {
    pub batch: usize,
    pub seq: usize,
    blocks: Vec<BlockActivations<B>>,
    ln_f: NormStats<B>,
    /// The input, and ln_pre's statistics (empty without it).
    input: B::Tensor,
    ln_pre: NormStats<B>,
    /// stream[0] is the first block's input (the input, or ln_pre of it),
    /// stream[i + 1] block i's output; forward-only, block i reads
    /// stream[i % 2] and writes stream[(i + 1) % 2].
    stream: Vec<B::Tensor>,
    /// The gradient w.r.t. the residual stream, from the top down.
    d_stream: B::Tensor,
    /// The gradient w.r.t. the input, through ln_pre (empty without it).
    d_input: B::Tensor,
    /// `forward_activations`: one set of block buffers and a stream of
    /// two, taken in turn.
    forward_only: bool,
}

impl<B: Backend> Activations<B> {
    /// Block i's buffers, its input and its output in the stream.
    fn block(&mut self, i: usize) -> (&mut BlockActivations<B>, &B::Tensor, &mut B::Tensor) {
        let (acts, from, to) = match self.forward_only {
            true => (&mut self.blocks[0], i % 2, (i + 1) % 2),
            false => (&mut self.blocks[i], i, i + 1),
        };
        let [from, to] = self
            .stream
            .get_disjoint_mut([from, to])
            .expect("two distinct stream buffers");
        (acts, from, to)
    }

    /// Where the last of `layers` blocks left its output in the stream.
    fn top(&self, layers: usize) -> usize {
        if self.forward_only {
            layers % 2
        } else {
            layers
        }
    }

    /// The input buffer: write the embeddings here before `forward`.
    pub fn input(&mut self) -> &mut B::Tensor {
        if self.input.is_empty() {
            &mut self.stream[0]
        } else {
            &mut self.input
        }
    }

    /// The gradient of the input, as the last `Transformer::backward` left it.
    pub fn d_input(&self) -> &B::Tensor {
        if self.d_input.is_empty() {
            &self.d_stream
        } else {
            &self.d_input
        }
    }
}

impl Transformer {
    pub fn new<B: Backend>(params: &mut Params<B>, name: &str, config: TransformerConfig) -> Self {
        assert!(
            config.width.is_multiple_of(config.heads),
            "width must be a multiple of heads"
        );
        let blocks = (0..config.layers)
            .map(|i| Block::new(params, &format!("{name}.blocks.{i}"), &config))
            .collect();
        Transformer {
            config,
            blocks,
            ln_f: config
                .final_norm
                .then(|| Norm::new(params, &format!("{name}.ln_f"), config.width)),
            ln_pre: config
                .pre_norm
                .then(|| Norm::new(params, &format!("{name}.ln_pre"), config.width)),
        }
    }

    /// out = ln_f(x), or x itself without a final norm.
    pub(super) fn final_output<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        x: &B::Tensor,
        out: &mut B::Tensor,
        stats: &mut NormStats<B>,
    ) {
        match &self.ln_f {
            Some(ln_f) => ln_f.forward(b, p, x, out, stats),
            None => b.axpby(1.0, x, 0.0, out),
        }
    }

    /// Buffers for running this transformer on `[batch, seq, width]`,
    /// forward and backward.
    pub fn activations<B: Backend>(&self, b: &B, batch: usize, seq: usize) -> Activations<B> {
        self.activations_for(b, batch, seq, true)
    }

    /// Buffers for its forward only (a frozen tower that is only read): no
    /// gradient buffers, and since no block's activations are kept for a
    /// backward, one set of block buffers and two of the residual stream
    /// serve every block in turn.
    pub fn forward_activations<B: Backend>(
        &self,
        b: &B,
        batch: usize,
        seq: usize,
    ) -> Activations<B> {
        self.activations_for(b, batch, seq, false)
    }

    fn activations_for<B: Backend>(
        &self,
        b: &B,
        batch: usize,
        seq: usize,
        backward: bool,
    ) -> Activations<B> {
        let rows = batch * seq;
        let w = self.config.width;
        let pre = |len: usize| b.zeros(if self.config.pre_norm { len } else { 0 });
        let grad = |len: usize| b.zeros(if backward { len } else { 0 });
        let (blocks, streams) = match backward {
            true => (self.config.layers, self.config.layers + 1),
            false => (self.config.layers.min(1), 2),
        };
        Activations {
            batch,
            seq,
            blocks: (0..blocks)
                .map(|_| BlockActivations::new(b, &self.config, batch, seq, backward))
                .collect(),
            ln_f: NormStats::new(b, rows),
            input: pre(rows * w),
            ln_pre: NormStats::new(b, if self.config.pre_norm { rows } else { 0 }),
            stream: (0..streams).map(|_| b.zeros(rows * w)).collect(),
            d_stream: grad(rows * w),
            d_input: grad(if self.config.pre_norm { rows * w } else { 0 }),
            forward_only: !backward,
        }
    }

    /// out = ln_f(blocks(a.input())), or blocks(a.input()) without a final norm.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut Activations<B>,
        key_mask: Option<&B::Ids>,
        out: &mut B::Tensor,
    ) {
        if let Some(ln_pre) = &self.ln_pre {
            ln_pre.forward(b, p, &a.input, &mut a.stream[0], &mut a.ln_pre);
        }
        for (i, block) in self.blocks.iter().enumerate() {
            let (acts, from, to) = a.block(i);
            block.forward(b, p, acts, from, key_mask, to);
        }
        let top = &a.stream[a.top(self.config.layers)];
        self.final_output(b, p, top, out, &mut a.ln_f);
    }

    /// The gradient w.r.t. the input, given d_out and the forward's key
    /// mask; parameter gradients accumulate.
    pub fn backward<'a, B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        a: &'a mut Activations<B>,
        key_mask: Option<&B::Ids>,
        d_out: &B::Tensor,
    ) -> &'a B::Tensor {
        assert!(!a.forward_only, "activations made for the forward only");
        let d = &mut a.d_stream;
        let top = &a.stream[self.config.layers];
        match &self.ln_f {
            Some(ln_f) => ln_f.backward(b, p, d_out, top, &a.ln_f, d, false),
            None => b.axpby(1.0, d_out, 0.0, d),
        }
        for (i, (block, acts)) in self.blocks.iter().zip(&mut a.blocks).enumerate().rev() {
            block.backward(b, p, acts, (&a.stream[i], key_mask), d);
        }
        match &self.ln_pre {
            Some(ln_pre) => {
                ln_pre.backward(b, p, d, &a.input, &a.ln_pre, &mut a.d_input, false);
                &a.d_input
            }
            None => d,
        }
    }
}
