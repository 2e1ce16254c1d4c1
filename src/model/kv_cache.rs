//! Incremental decoding: the transformer run one position at a time,
//! each new position attending to the keys and values that every layer
//! cached for the earlier ones, after a prefill that runs the first
//! positions (a captioner's prefix) at once. Causal models only; the results equal
//! those of the full forward over the whole sequence (tests/suite/models/generation.rs).
//!
//! The cache of layer l is `[rows, heads, capacity, head_dim]` for keys
//! and the same for values, so that row r, head h's keys are one
//! contiguous `[capacity, head_dim]` matrix. A step's attention, with the
//! new position's key and value appended, is one op
//! ([`Backend::attend_cached`], one dispatch on the GPU); the prefill is
//! the training forward's blocks and strided copies into the cache.
//!
//! A transformer that cross-attends to a memory (image tokens) has every
//! layer's memory keys and values projected once per batch
//! ([`Transformer::remember`]); each step's queries read them.

use super::layers::NormStats;
use super::params::Params;
use super::transformer::{BlockActivations, Transformer};
use crate::backend::{Backend, CachedAttention, HeadLayout, Storage};
use crate::ops::attention::AttentionShape;

/// Keys and values of every layer for `rows` sequences of up to
/// `capacity` positions, and the buffers of one step.
pub struct KvCache<B: Backend> {
    pub rows: usize,
    pub capacity: usize,
    /// Positions cached so far.
    len: usize,
    keys: Vec<B::Tensor>,
    values: Vec<B::Tensor>,
    /// Where a reordered layer is built before it swaps in.
    spare: B::Tensor,
    blocks: Vec<BlockActivations<B>>,
    ln_pre: NormStats<B>,
    ln_f: NormStats<B>,
    /// The step's input `[rows, width]`, then each block's output in turn.
    stream: [B::Tensor; 2],
}

impl<B: Backend> KvCache<B> {
    /// Positions cached so far: the position the next step computes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position, for a new batch of sequences.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The next position's input `[rows, width]`: write it before `step`.
    pub fn input(&mut self) -> &mut B::Tensor {
        &mut self.stream[0]
    }

    /// Row r of every layer's cache becomes what row `parents[r]` held
    /// (beam search: each surviving beam continues one of the previous
    /// step's beams). The memory's keys and values stay: a beam's parent
    /// is one of its own image's beams, which read the same memory.
    pub fn reorder(&mut self, b: &B, parents: &B::Ids) {
        let per_row = self.keys[0].len() / self.rows;
        for layer in self.keys.iter_mut().chain(&mut self.values) {
            b.embedding(layer, parents, &mut self.spare, per_row, false);
            std::mem::swap(layer, &mut self.spare);
        }
    }
}

/// Buffers to run a cache's first `len` positions of `rows` sequences at
/// once (a captioner's prefix).
pub struct Prefill<B: Backend> {
    len: usize,
    block: BlockActivations<B>,
    /// The input `[rows, len, width]`, then each block's output in turn.
    stream: [B::Tensor; 2],
    /// One layer's keys or values, `[rows, heads, len, head_dim]`.
    packed: B::Tensor,
}

impl<B: Backend> Prefill<B> {
    /// The positions' input `[rows, len, width]`: write it before
    /// `Transformer::prefill_cached`.
    pub fn input(&mut self) -> &mut B::Tensor {
        &mut self.stream[0]
    }
}

impl Transformer {
    /// Buffers to fill a cache's first `len` positions of `rows` sequences
    /// in one pass.
    pub fn prefill<B: Backend>(&self, b: &B, rows: usize, len: usize) -> Prefill<B> {
        let w = self.config.width;
        Prefill {
            len,
            block: BlockActivations::new(b, &self.config, (rows, len, 0), false),
            stream: [b.zeros(rows * len * w), b.zeros(rows * len * w)],
            packed: b.zeros(rows * len * w),
        }
    }

    /// The empty cache's first positions from `prefill.input()`, all at
    /// once: each block runs causally over them as in the full forward,
    /// and their keys and values join the cache. Their outputs are not
    /// kept (a prefix's next token is not asked for).
    pub fn prefill_cached<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        cache: &mut KvCache<B>,
        prefill: &mut Prefill<B>,
    ) {
        let c = &self.config;
        let (w, heads, d) = (c.width, c.heads, c.head_dim());
        let (rows, len, capacity) = (cache.rows, prefill.len, cache.capacity);
        assert!(cache.is_empty(), "a prefill starts an empty cache");
        assert!(
            c.cross_width.is_none() && !c.pre_norm,
            "a prefill neither cross-attends nor normalises its input"
        );
        assert!(len <= capacity, "the prefill is longer than the KV cache");
        assert!(
            prefill.stream[0].len() == rows * len * w,
            "the prefill is for another number of rows than the cache"
        );
        let shape = AttentionShape {
            batch: rows,
            seq: len,
            heads,
            head_dim: d,
            causal: true,
        };
        // [rows, heads, len, head_dim] into positions 0..len of each (row,
        // head)'s [capacity, head_dim] cache: a (row, head)'s positions are
        // the "heads" of one token row of capacity * head_dim.
        let slots = HeadLayout {
            batch: rows * heads,
            seq: 1,
            heads: len,
            head_dim: d,
            row_stride: capacity * d,
            col_offset: 0,
        };
        let Prefill {
            block: a,
            stream,
            packed,
            ..
        } = prefill;
        for (l, block) in self.blocks.iter().enumerate() {
            let [x, next] = &mut *stream;
            block.forward(b, p, a, x, None, None, next);
            // Keys (part 1) and values (part 2) of every position.
            for (k, layer) in [(1, &mut cache.keys[l]), (2, &mut cache.values[l])] {
                b.tokens_to_heads(&a.qkv_out, packed, &shape.qkv_part(k));
                b.heads_to_tokens(packed, layer, &slots, false);
            }
            std::mem::swap(x, next);
        }
        cache.len = len;
    }

    /// A cache for `rows` sequences of up to `capacity` positions.
    pub fn kv_cache<B: Backend>(&self, b: &B, rows: usize, capacity: usize) -> KvCache<B> {
        self.memory_kv_cache(b, rows, capacity, 0)
    }

    /// The same for a transformer that cross-attends to a memory of
    /// `memory_len` tokens per row.
    pub fn memory_kv_cache<B: Backend>(
        &self,
        b: &B,
        rows: usize,
        capacity: usize,
        memory_len: usize,
    ) -> KvCache<B> {
        let c = &self.config;
        assert!(c.causal, "only a causal transformer decodes incrementally");
        assert_eq!(
            c.cross_width.is_some(),
            memory_len > 0,
            "a memory exactly where the blocks cross-attend"
        );
        let w = c.width;
        let layer = rows * capacity * w;
        KvCache {
            rows,
            capacity,
            len: 0,
            keys: (0..c.layers).map(|_| b.zeros(layer)).collect(),
            values: (0..c.layers).map(|_| b.zeros(layer)).collect(),
            spare: b.zeros(layer),
            blocks: (0..c.layers)
                .map(|_| BlockActivations::new(b, c, (rows, 1, memory_len), false))
                .collect(),
            ln_pre: NormStats::new(b, if c.pre_norm { rows } else { 0 }),
            ln_f: NormStats::new(b, rows),
            stream: [b.zeros(rows * w), b.zeros(rows * w)],
        }
    }

    /// Every layer's keys and values of `memory` (`[rows, memory_len,
    /// cross_width]`), for the steps of a batch.
    pub fn remember<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        cache: &mut KvCache<B>,
        memory: &B::Tensor,
    ) {
        for (block, a) in self.blocks.iter().zip(&mut cache.blocks) {
            block.project_memory(b, p, a, memory);
        }
    }

    /// out `[rows, width]` = the final layer norm's output at the next
    /// position, given its input in `cache.input()`; the position's keys
    /// and values join the cache.
    pub fn forward_cached<B: Backend>(
        &self,
        b: &B,
        p: &Params<B>,
        cache: &mut KvCache<B>,
        out: &mut B::Tensor,
    ) {
        let c = &self.config;
        let (rows, capacity, position) = (cache.rows, cache.capacity, cache.len);
        assert!(position < capacity, "the KV cache is full");
        let shape = AttentionShape {
            batch: rows,
            seq: 1,
            heads: c.heads,
            head_dim: c.head_dim(),
            causal: true,
        };
        let attention = CachedAttention {
            rows,
            heads: c.heads,
            head_dim: c.head_dim(),
            capacity,
            position,
            scale: shape.scale(),
        };
        let KvCache {
            keys,
            values,
            blocks,
            stream,
            ln_pre: ln_pre_stats,
            ..
        } = cache;
        if let Some(ln_pre) = &self.ln_pre {
            let [x, next] = &mut *stream;
            ln_pre.forward(b, p, x, next, ln_pre_stats);
            std::mem::swap(x, next);
        }
        for (l, (block, a)) in self.blocks.iter().zip(blocks.iter_mut()).enumerate() {
            let [x, next] = &mut *stream;
            let (keys, values) = (&mut keys[l], &mut values[l]);
            let attend = |qkv: &B::Tensor, _: &mut _, attended: &mut B::Tensor| {
                b.attend_cached(qkv, keys, values, attended, &attention)
            };
            block.forward_with(b, p, a, x, attend, None, next);
            std::mem::swap(x, next);
        }
        self.final_output(b, p, &stream[0], out, &mut cache.ln_f);
        cache.len += 1;
    }
}
