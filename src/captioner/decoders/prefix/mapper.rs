//! The mapper: an image embedding to the decoder's k prefix vectors, in
//! one of ClipCap's two forms (Mokady et al., 2021):
//! - an MLP: fc1, an activation (captune's GELU or ClipCap's tanh), fc2
//!   to `[k, width]`;
//! - ClipCap's transformer mapper, its variant for a frozen language
//!   model: a linear layer turns the embedding into `clip_len` vectors,
//!   k learned constant vectors follow them, a non-causal transformer
//!   (ReLU MLPs, bias-free q, k, v, no final norm) reads all of them,
//!   and its outputs at the constants are the prefix.
//!
//! The weights are `mapper.*` parameters of the captioner; the
//! activations of `rows` embeddings live in a [`MapperActivations`].

use super::CaptionerConfig;
use crate::backend::{Backend, HeadLayout, TokenIndex};
use crate::model::layers::{Activation, Dense};
use crate::model::params::{Init, ParamId, Params};
use crate::model::transformer::{Activations, Transformer};

pub(super) enum Mapper {
    Mlp {
        fc1: Dense,
        fc2: Dense,
        activation: Activation,
    },
    Transformer {
        /// Vectors the embedding becomes.
        clip_len: usize,
        /// `[embed_dim, clip_len * width]`.
        linear: Dense,
        /// `[k, width]`: the constants the prefix is read at.
        constants: ParamId,
        transformer: Transformer,
    },
}

/// The mapper's activations for `rows` image embeddings, with the
/// gradient buffers when made for a backward pass.
pub(super) struct MapperActivations<B: Backend> {
    features: B::Tensor,
    /// `[rows, k * width]`: each row's k prefix vectors.
    pub(super) prefix: B::Tensor,
    kind: KindActivations<B>,
}

enum KindActivations<B: Backend> {
    Mlp {
        hidden: B::Tensor,
        act: B::Tensor,
        /// The gradient at the activation's output (unfused activations).
        d_act: B::Tensor,
        d_hidden: B::Tensor,
    },
    Transformer(Box<TransformerActivations<B>>),
}

/// The transformer mapper's buffers; the transformer's input and output
/// are `[rows, clip_len + k, width]`, the embedding's vectors first.
struct TransformerActivations<B: Backend> {
    /// `[rows, clip_len * width]`.
    clip: B::Tensor,
    /// `[rows * k]`: 0..k for every row, to gather the constants.
    constant_ids: TokenIndex<B>,
    /// `[rows * k, width]`.
    constant_rows: B::Tensor,
    clip_layout: HeadLayout,
    constant_layout: HeadLayout,
    transformer: Activations<B>,
    out: B::Tensor,
    d_out: B::Tensor,
    d_clip: B::Tensor,
    d_constant_rows: B::Tensor,
}

impl Mapper {
    pub(super) fn new<B: Backend>(p: &mut Params<B>, c: &CaptionerConfig) -> Self {
        let (w, k) = (c.decoder.width, c.prefix_len);
        let embed_std = (c.embed_dim as f32).powf(-0.5);
        match c.mapper_transformer {
            Some(shape) => {
                let clip_len = shape.clip_len;
                Mapper::Transformer {
                    clip_len,
                    linear: Dense::new(p, "mapper.linear", c.embed_dim, clip_len * w, embed_std),
                    // ClipCap draws its constants from a standard normal.
                    constants: p.add("mapper.constants".into(), &[k, w], Init::Normal(1.0), false),
                    transformer: Transformer::new(p, "mapper.transformer", shape.blocks(c)),
                }
            }
            None => Mapper::Mlp {
                fc1: Dense::new(p, "mapper.fc1", c.embed_dim, c.mapper_hidden, embed_std),
                fc2: Dense::new(p, "mapper.fc2", c.mapper_hidden, k * w, 0.02),
                activation: c.mapper_activation,
            },
        }
    }

    /// a.prefix = the mapper on `features` (`[rows, embed_dim]`).
    pub(super) fn forward<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        a: &mut MapperActivations<B>,
        features: &[f32],
    ) {
        b.write(&mut a.features, features);
        match (self, &mut a.kind) {
            (
                Mapper::Mlp {
                    fc1,
                    fc2,
                    activation,
                },
                KindActivations::Mlp { hidden, act, .. },
            ) => {
                fc1.forward_act(b, p, *activation, &a.features, hidden, act);
                fc2.forward(b, p, act, &mut a.prefix);
            }
            (
                Mapper::Transformer {
                    linear,
                    constants,
                    transformer,
                    ..
                },
                KindActivations::Transformer(t),
            ) => {
                let w = transformer.config.width;
                linear.forward(b, p, &a.features, &mut t.clip);
                b.embedding(
                    p.value(*constants),
                    &t.constant_ids.ids,
                    &mut t.constant_rows,
                    w,
                    false,
                );
                let input = t.transformer.input();
                b.heads_to_tokens(&t.clip, input, &t.clip_layout, false);
                b.heads_to_tokens(&t.constant_rows, input, &t.constant_layout, false);
                transformer.forward(b, p, &mut t.transformer, None, &mut t.out);
                b.tokens_to_heads(&t.out, &mut a.prefix, &t.constant_layout);
            }
            _ => unreachable!("activations made for this mapper"),
        }
    }

    /// The mapper's parameter gradients (+)= those of a loss whose
    /// gradient w.r.t. the prefix of the last `forward` is `d_prefix`.
    pub(super) fn backward<B: Backend>(
        &self,
        b: &B,
        p: &mut Params<B>,
        a: &mut MapperActivations<B>,
        d_prefix: &B::Tensor,
    ) {
        match (self, &mut a.kind) {
            (
                Mapper::Mlp {
                    fc1,
                    fc2,
                    activation,
                },
                KindActivations::Mlp {
                    hidden,
                    act,
                    d_act,
                    d_hidden,
                },
            ) => {
                fc2.backward_through_act(b, p, *activation, d_prefix, act, hidden, d_act, d_hidden);
                fc1.backward(b, p, d_hidden, &a.features, None);
            }
            (
                Mapper::Transformer {
                    linear,
                    constants,
                    transformer,
                    ..
                },
                KindActivations::Transformer(t),
            ) => {
                let w = transformer.config.width;
                // The outputs at the embedding's vectors are read by no
                // one: their rows of d_out stay zero from its making.
                b.heads_to_tokens(d_prefix, &mut t.d_out, &t.constant_layout, false);
                let d_input = transformer.backward(b, p, &mut t.transformer, None, &t.d_out);
                b.tokens_to_heads(d_input, &mut t.d_clip, &t.clip_layout);
                b.tokens_to_heads(d_input, &mut t.d_constant_rows, &t.constant_layout);
                b.embedding_backward(&t.d_constant_rows, &t.constant_ids, p.grad(*constants), w);
                linear.backward(b, p, &t.d_clip, &a.features, None);
            }
            _ => unreachable!("activations made for this mapper"),
        }
    }
}

impl<B: Backend> MapperActivations<B> {
    /// Buffers for `rows` embeddings; gradient buffers only when
    /// `backward` (decoding runs the mapper forward only).
    pub(super) fn new(
        b: &B,
        mapper: &Mapper,
        c: &CaptionerConfig,
        rows: usize,
        backward: bool,
    ) -> Self {
        let (w, k) = (c.decoder.width, c.prefix_len);
        let grad = |len: usize| b.zeros(if backward { len } else { 0 });
        let kind = match mapper {
            Mapper::Mlp { activation, .. } => KindActivations::Mlp {
                hidden: b.zeros(rows * c.mapper_hidden),
                act: b.zeros(rows * c.mapper_hidden),
                d_act: grad(if activation.is_fused() {
                    0
                } else {
                    rows * c.mapper_hidden
                }),
                d_hidden: grad(rows * c.mapper_hidden),
            },
            Mapper::Transformer {
                clip_len,
                transformer,
                ..
            } => {
                let clip_len = *clip_len;
                let s = clip_len + k;
                let ids: Vec<u32> = (0..rows).flat_map(|_| 0..k as u32).collect();
                let one_run_per_row = |head_dim, col_offset| HeadLayout {
                    batch: rows,
                    seq: 1,
                    heads: 1,
                    head_dim,
                    row_stride: s * w,
                    col_offset,
                };
                KindActivations::Transformer(Box::new(TransformerActivations {
                    clip: b.zeros(rows * clip_len * w),
                    constant_ids: TokenIndex::new(b, &ids, k).expect("ids 0..k name rows of k"),
                    constant_rows: b.zeros(rows * k * w),
                    clip_layout: one_run_per_row(clip_len * w, 0),
                    constant_layout: one_run_per_row(k * w, clip_len * w),
                    transformer: transformer.activations(b, rows, s),
                    out: b.zeros(rows * s * w),
                    d_out: grad(rows * s * w),
                    d_clip: grad(rows * clip_len * w),
                    d_constant_rows: grad(rows * k * w),
                }))
            }
        };
        MapperActivations {
            features: b.zeros(rows * c.embed_dim),
            prefix: b.zeros(rows * k * w),
            kind,
        }
    }
}
