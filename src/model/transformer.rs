//! The one transformer: a stack of blocks and a final layer norm, used by
//! the retriever's image and text towers and by the caption decoder. A
//! block normalises before each branch (pre-LN, GPT-2's and CLIP's) or
//! after adding it (post-LN, BERT's), and may attend, after its
//! self-attention, to a memory of other tokens (cross-attention to image
//! tokens, as BLIP's text decoder does). [`Transformer`] is the weights (parameter ids); the
//! activations of one batch shape live in an [`Activations`], so one set
//! of weights serves any number of batch shapes. Forward is the list of
//! layer calls; backward is the same list reversed, with every activation
//! it needs kept in a named buffer. Decoding one position at a time over
//! cached keys and values is in [`super::kv_cache`].

use super::layers::{Activation, Dense, Norm, NormEpsilon, NormStats};
use super::params::Params;
use crate::backend::{Backend, Storage};
use crate::ops::attention::{Attention, AttentionShape};
use crate::ops::cross_attention::{CrossAttention, CrossAttentionShape};
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
    /// block (CLIP's image tower; BERT's embedding layer norm).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pre_norm: bool,
    /// Whether each block normalises after adding a branch to the stream,
    /// LN(x + f(x)) (BERT's post-LN), instead of x + f(LN(x)).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub post_norm: bool,
    /// The width of a memory every block attends to after its
    /// self-attention (cross-attention, with q from the stream and k, v
    /// from the memory); absent, none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_width: Option<usize>,
    /// Every layer norm's epsilon: 1e-5 when absent.
    #[serde(default, skip_serializing_if = "NormEpsilon::is_default")]
    pub norm_eps: NormEpsilon,
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
            post_norm: false,
            cross_width: None,
            norm_eps: NormEpsilon::DEFAULT,
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
    /// blocks have 12d^2 + 13d. Cross-attention to a memory m wide adds a
    /// layer norm (2d), q (d^2 + d), k and v (2md + 2d) and a projection
    /// (d^2 + d). Checked against a built model in the tests; checkpoint
    /// loading compares it with a file before allocating.
    pub fn parameter_count(&self) -> u128 {
        let (d, h) = (self.width as u128, self.mlp_width() as u128);
        let qkv_bias = if self.qkv_bias { 3 * d } else { 0 };
        let cross = self.cross_width.map_or(0, |m| {
            2 * d + d * d + d + 2 * m as u128 * d + 2 * d + d * d + d
        });
        let block = 4 * d + 3 * d * d + qkv_bias + d * d + d + 2 * d * h + h + d + cross;
        let norms = 2 * d * (u128::from(self.final_norm) + u128::from(self.pre_norm));
        self.layers as u128 * block + norms
    }
}

/// A block's weights. Pre-LN: x + attn(ln1(x)), then the cross-attention
/// sublayer c + cross(ln_c(c)) if any, then m + mlp(ln2(m)). Post-LN:
/// ln1(x + attn(x)), ln_c(c + cross(c)), ln2(m + mlp(m)).
pub(super) struct Block {
    ln1: Norm,
    qkv: Dense,
    proj: Dense,
    cross: Option<CrossLayer>,
    ln2: Norm,
    fc1: Dense,
    fc2: Dense,
    activation: Activation,
    post_norm: bool,
}

/// Cross-attention's weights: q from the stream, k and v (fused, `[memory
/// width, 2 width]`) from the memory, the output projection and its norm.
struct CrossLayer {
    ln: Norm,
    q: Dense,
    kv: Dense,
    proj: Dense,
}

/// One block's activations for a batch shape, `[rows, width]` unless
/// named otherwise. Under pre-LN `ln1_out` and `ln2_out` are the norms'
/// outputs, the branches' inputs; under post-LN they hold the sums the
/// norms read (x + attn(x), m + mlp(m)).
pub(super) struct BlockActivations<B: Backend> {
    ln1: NormStats<B>,
    attn: Attention<B>,
    ln2: NormStats<B>,
    ln1_out: B::Tensor,
    pub(super) qkv_out: B::Tensor, // [rows, 3 width]
    attn_out: B::Tensor,
    /// The stream after self-attention.
    mid: B::Tensor,
    cross: Option<CrossActivations<B>>,
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

/// The cross-attention sublayer's activations: `normed` is ln_c's output
/// (pre-LN) or the sum it reads (post-LN), `out` the stream after it.
struct CrossActivations<B: Backend> {
    stats: NormStats<B>,
    normed: B::Tensor,
    q: B::Tensor,
    /// `[batch, memory_len, 2 width]`.
    kv: B::Tensor,
    attn: CrossAttention<B>,
    attended: B::Tensor,
    out: B::Tensor,
    d_normed: B::Tensor,
    d_q: B::Tensor,
    d_kv: B::Tensor,
    d_attended: B::Tensor,
}

impl<B: Backend> BlockActivations<B> {
    /// Buffers for `[batch, seq]` (and a memory of `memory_len` tokens
    /// per item where the blocks cross-attend); with `backward` false
    /// (incremental decoding, a frozen tower's forward) the gradient
    /// buffers are empty.
    pub(super) fn new(
        b: &B,
        c: &TransformerConfig,
        (batch, seq, memory_len): (usize, usize, usize),
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
        let cross = c.cross_width.map(|_| {
            let shape = CrossAttentionShape {
                batch,
                q_len: seq,
                kv_len: memory_len,
                heads: c.heads,
                head_dim: c.head_dim(),
            };
            CrossActivations {
                stats: NormStats::new(b, rows),
                normed: b.zeros(rows * w),
                q: b.zeros(rows * w),
                kv: b.zeros(shape.kv_elements()),
                attn: CrossAttention::new(b, shape, backward),
                attended: b.zeros(rows * w),
                out: b.zeros(rows * w),
                d_normed: grad(rows * w),
                d_q: grad(rows * w),
                d_kv: grad(shape.kv_elements()),
                d_attended: grad(rows * w),
            }
        });
        BlockActivations {
            ln1: NormStats::new(b, rows),
            attn: Attention::new(b, shape, backward),
            ln2: NormStats::new(b, rows),
            ln1_out: b.zeros(rows * w),
            qkv_out: b.zeros(rows * 3 * w),
            attn_out: b.zeros(rows * w),
            mid: b.zeros(rows * w),
            cross,
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
            ln1: Norm::with_eps(params, &format!("{name}.ln1"), w, c.norm_eps),
            qkv: if c.qkv_bias {
                Dense::new(params, &qkv_name, w, 3 * w, std)
            } else {
                Dense::without_bias(params, &qkv_name, w, 3 * w, std)
            },
            proj: Dense::new(params, &format!("{name}.attn.proj"), w, w, residual_std),
            cross: c.cross_width.map(|m| CrossLayer {
                ln: Norm::with_eps(params, &format!("{name}.cross.ln"), w, c.norm_eps),
                q: Dense::new(params, &format!("{name}.cross.q"), w, w, std),
                kv: Dense::new(params, &format!("{name}.cross.kv"), m, 2 * w, std),
                proj: Dense::new(params, &format!("{name}.cross.proj"), w, w, residual_std),
            }),
            ln2: Norm::with_eps(params, &format!("{name}.ln2"), w, c.norm_eps),
            fc1: Dense::new(params, &format!("{name}.mlp.fc1"), w, h, std),
            fc2: Dense::new(params, &format!("{name}.mlp.fc2"), h, w, residual_std),
            activation: c.activation,
            post_norm: c.post_norm,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        x: &B::Tensor,
        key_mask: Option<&B::Ids>,
        memory: Option<&B::Tensor>,
        out: &mut B::Tensor,
    ) {
        let attend = |qkv: &B::Tensor, attn: &mut Attention<B>, attended: &mut B::Tensor| {
            attn.forward(b, qkv, key_mask, attended)
        };
        self.forward_with(b, p, a, x, attend, memory, out);
    }

    /// The block with `attend(qkv, a.attn, attended)` as its attention
    /// (decoding's attends over a KV cache instead). A cross-attending
    /// block projects `memory` to its keys and values first; without one
    /// they are in `a` already (decoding projects them once per batch,
    /// [`Block::project_memory`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward_with<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        x: &B::Tensor,
        attend: impl FnOnce(&B::Tensor, &mut Attention<B>, &mut B::Tensor),
        memory: Option<&B::Tensor>,
        out: &mut B::Tensor,
    ) {
        if self.post_norm {
            self.qkv.forward(b, p, x, &mut a.qkv_out);
            attend(&a.qkv_out, &mut a.attn, &mut a.attn_out);
            self.proj
                .forward_residual(b, p, &a.attn_out, x, &mut a.ln1_out);
            self.ln1.forward(b, p, &a.ln1_out, &mut a.mid, &mut a.ln1);
        } else {
            self.ln1.forward(b, p, x, &mut a.ln1_out, &mut a.ln1);
            self.qkv.forward(b, p, &a.ln1_out, &mut a.qkv_out);
            attend(&a.qkv_out, &mut a.attn, &mut a.attn_out);
            self.proj.forward_residual(b, p, &a.attn_out, x, &mut a.mid);
        }
        if let (Some(layer), Some(c)) = (&self.cross, &mut a.cross) {
            if let Some(memory) = memory {
                layer.kv.forward(b, p, memory, &mut c.kv);
            }
            layer.forward(b, p, c, &a.mid, self.post_norm);
        }
        self.mlp_forward(b, p, a, out);
    }

    /// The keys and values a cross-attending block reads from `memory`,
    /// into `a`, for the forwards that follow without it.
    pub(super) fn project_memory<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        memory: &B::Tensor,
    ) {
        if let (Some(layer), Some(c)) = (&self.cross, &mut a.cross) {
            layer.kv.forward(b, p, memory, &mut c.kv);
        }
    }

    /// out = mlp's sublayer on the stream after the attention(s).
    fn mlp_forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut BlockActivations<B>,
        out: &mut B::Tensor,
    ) {
        let m = a.cross.as_ref().map_or(&a.mid, |c| &c.out);
        if self.post_norm {
            let fc1_in = m;
            self.fc1.forward_act(
                b,
                p,
                self.activation,
                fc1_in,
                &mut a.fc1_out,
                &mut a.act_out,
            );
            self.fc2
                .forward_residual(b, p, &a.act_out, m, &mut a.ln2_out);
            self.ln2.forward(b, p, &a.ln2_out, out, &mut a.ln2);
        } else {
            self.ln2.forward(b, p, m, &mut a.ln2_out, &mut a.ln2);
            self.fc1.forward_act(
                b,
                p,
                self.activation,
                &a.ln2_out,
                &mut a.fc1_out,
                &mut a.act_out,
            );
            self.fc2.forward_residual(b, p, &a.act_out, m, out);
        }
    }

    /// Given the gradient w.r.t. the block's output in `d`, leaves there
    /// the gradient w.r.t. its input x (and the forward's key mask); the
    /// memory's gradient is added to `d_memory` where one is asked for. The residual connections
    /// pass the gradient through unchanged, so each pre-LN branch's layer
    /// norm adds its share in place; a post-LN sublayer's norm writes the
    /// sum's gradient to a buffer, its branch adds to it, and it becomes
    /// `d`.
    #[allow(clippy::too_many_arguments)]
    fn backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        a: &mut BlockActivations<B>,
        (x, key_mask): (&B::Tensor, Option<&B::Ids>),
        memory: Option<(&B::Tensor, Option<&mut B::Tensor>)>,
        d: &mut B::Tensor,
    ) {
        // MLP branch: d becomes the gradient w.r.t. the stream before it.
        let m = a.cross.as_ref().map_or(&a.mid, |c| &c.out);
        if self.post_norm {
            self.ln2
                .backward(b, p, d, &a.ln2_out, &a.ln2, &mut a.d_ln, false);
            std::mem::swap(d, &mut a.d_ln);
        }
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
        if self.post_norm {
            self.fc1.backward(b, p, &a.d_fc1, m, Some((d, true)));
        } else {
            self.fc1
                .backward(b, p, &a.d_fc1, &a.ln2_out, Some((&mut a.d_ln, false)));
            self.ln2.backward(b, p, &a.d_ln, m, &a.ln2, d, true);
        }
        if let (Some(layer), Some(c)) = (&self.cross, &mut a.cross) {
            let (memory, d_memory) = memory.expect("a cross-attending block reads a memory");
            layer.backward(b, p, c, (&a.mid, memory), d_memory, d, self.post_norm);
        }
        // Attention branch: d becomes the gradient w.r.t. x.
        if self.post_norm {
            self.ln1
                .backward(b, p, d, &a.ln1_out, &a.ln1, &mut a.d_ln, false);
            std::mem::swap(d, &mut a.d_ln);
        }
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
        if self.post_norm {
            self.qkv.backward(b, p, &a.d_qkv, x, Some((d, true)));
        } else {
            self.qkv
                .backward(b, p, &a.d_qkv, &a.ln1_out, Some((&mut a.d_ln, false)));
            self.ln1.backward(b, p, &a.d_ln, x, &a.ln1, d, true);
        }
    }
}

impl CrossLayer {
    /// c.out = the sublayer on the stream `x`, attending to the memory's
    /// keys and values in `c.kv`.
    fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        c: &mut CrossActivations<B>,
        x: &B::Tensor,
        post_norm: bool,
    ) {
        let q_in = if post_norm {
            x
        } else {
            self.ln.forward(b, p, x, &mut c.normed, &mut c.stats);
            &c.normed
        };
        self.q.forward(b, p, q_in, &mut c.q);
        c.attn.forward(b, &c.q, &c.kv, None, &mut c.attended);
        if post_norm {
            self.proj
                .forward_residual(b, p, &c.attended, x, &mut c.normed);
            self.ln.forward(b, p, &c.normed, &mut c.out, &mut c.stats);
        } else {
            self.proj.forward_residual(b, p, &c.attended, x, &mut c.out);
        }
    }

    /// Given the gradient w.r.t. `c.out` in `d`, leaves there the
    /// gradient w.r.t. the stream `x`, and adds the memory's to `d_memory`
    /// when there is one (a frozen memory needs none).
    #[allow(clippy::too_many_arguments)]
    fn backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        c: &mut CrossActivations<B>,
        (x, memory): (&B::Tensor, &B::Tensor),
        d_memory: Option<&mut B::Tensor>,
        d: &mut B::Tensor,
        post_norm: bool,
    ) {
        if post_norm {
            self.ln
                .backward(b, p, d, &c.normed, &c.stats, &mut c.d_normed, false);
            std::mem::swap(d, &mut c.d_normed);
        }
        self.proj
            .backward(b, p, d, &c.attended, Some((&mut c.d_attended, false)));
        c.attn
            .backward(b, (&c.q, &c.kv), &c.d_attended, &mut c.d_q, &mut c.d_kv);
        self.kv
            .backward(b, p, &c.d_kv, memory, d_memory.map(|d| (d, true)));
        if post_norm {
            self.q.backward(b, p, &c.d_q, x, Some((d, true)));
        } else {
            self.q
                .backward(b, p, &c.d_q, &c.normed, Some((&mut c.d_normed, false)));
            self.ln.backward(b, p, &c.d_normed, x, &c.stats, d, true);
        }
    }
}

/// Blocks, a final layer norm and a layer norm before the first block,
/// each as the config says: the weights.
pub struct Transformer {
    pub config: TransformerConfig,
    pub(super) blocks: Vec<Block>,
    ln_f: Option<Norm>,
    pub(super) ln_pre: Option<Norm>,
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
    /// `[batch, memory_len, cross_width]`: what the blocks cross-attend
    /// to (empty without cross-attention), and its gradient (empty where
    /// none is computed).
    memory: B::Tensor,
    d_memory: B::Tensor,
    /// Whether the backward computes `d_memory`.
    memory_gradient: bool,
    /// `forward_activations`: one set of block buffers and a stream of
    /// two, taken in turn.
    forward_only: bool,
}

impl<B: Backend> Activations<B> {
    /// Block i's buffers, its input and its output in the stream, and the memory.
    fn block(
        &mut self,
        i: usize,
    ) -> (
        &mut BlockActivations<B>,
        &B::Tensor,
        &mut B::Tensor,
        &B::Tensor,
    ) {
        let (acts, from, to) = match self.forward_only {
            true => (&mut self.blocks[0], i % 2, (i + 1) % 2),
            false => (&mut self.blocks[i], i, i + 1),
        };
        let [from, to] = self
            .stream
            .get_disjoint_mut([from, to])
            .expect("two distinct stream buffers");
        (acts, from, to, &self.memory)
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

    /// The memory the blocks cross-attend to: write it before `forward`.
    pub fn memory(&mut self) -> &mut B::Tensor {
        &mut self.memory
    }

    /// The memory's gradient, as the last `Transformer::backward` left it.
    pub fn d_memory(&self) -> &B::Tensor {
        &self.d_memory
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
            ln_f: config.final_norm.then(|| {
                Norm::with_eps(
                    params,
                    &format!("{name}.ln_f"),
                    config.width,
                    config.norm_eps,
                )
            }),
            ln_pre: config.pre_norm.then(|| {
                Norm::with_eps(
                    params,
                    &format!("{name}.ln_pre"),
                    config.width,
                    config.norm_eps,
                )
            }),
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
        self.activations_for(b, (batch, seq, 0), true)
    }

    /// The same for a transformer that cross-attends to a memory of
    /// `memory_len` tokens per item ([`Activations::memory`]).
    /// `memory_gradient`: whether the backward computes the memory's
    /// gradient ([`Activations::d_memory`]); a frozen memory (image tokens
    /// from a frozen tower) needs none, and skipping it saves a product
    /// as large as the keys' and values' per block.
    pub fn cross_activations<B: Backend>(
        &self,
        b: &B,
        (batch, seq, memory_len): (usize, usize, usize),
        memory_gradient: bool,
    ) -> Activations<B> {
        let mut a = self.activations_for(b, (batch, seq, memory_len), true);
        if !memory_gradient {
            a.d_memory = b.zeros(0);
            a.memory_gradient = false;
        }
        a
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
        self.activations_for(b, (batch, seq, 0), false)
    }

    fn activations_for<B: Backend>(
        &self,
        b: &B,
        (batch, seq, memory_len): (usize, usize, usize),
        backward: bool,
    ) -> Activations<B> {
        assert_eq!(
            self.config.cross_width.is_some(),
            memory_len > 0,
            "a memory exactly where the blocks cross-attend"
        );
        let rows = batch * seq;
        let memory = batch * memory_len * self.config.cross_width.unwrap_or(0);
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
                .map(|_| BlockActivations::new(b, &self.config, (batch, seq, memory_len), backward))
                .collect(),
            ln_f: NormStats::new(b, rows),
            input: pre(rows * w),
            ln_pre: NormStats::new(b, if self.config.pre_norm { rows } else { 0 }),
            stream: (0..streams).map(|_| b.zeros(rows * w)).collect(),
            d_stream: grad(rows * w),
            d_input: grad(if self.config.pre_norm { rows * w } else { 0 }),
            memory: b.zeros(memory),
            d_memory: grad(memory),
            memory_gradient: backward,
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
        for i in 0..self.blocks.len() {
            let (acts, from, to, memory) = a.block(i);
            let memory = self.config.cross_width.map(|_| memory);
            self.blocks[i].forward(b, p, acts, from, key_mask, memory, to);
        }
        let top = &a.stream[a.top(self.config.layers)];
        self.final_output(b, p, top, out, &mut a.ln_f);
    }

    /// The gradient w.r.t. the input, given d_out and the forward's key
    /// mask; parameter gradients accumulate, and the memory's gradient is
    /// left in [`Activations::d_memory`].
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
        let cross = self.config.cross_width.is_some();
        let d_memory = cross && a.memory_gradient;
        if d_memory {
            b.fill(&mut a.d_memory, 0.0);
        }
        for (i, (block, acts)) in self.blocks.iter().zip(&mut a.blocks).enumerate().rev() {
            let memory = cross.then_some((&a.memory, d_memory.then_some(&mut a.d_memory)));
            block.backward(b, p, acts, (&a.stream[i], key_mask), memory, d);
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
