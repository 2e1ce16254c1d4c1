//! The one set of ops that model, objective and training code is written
//! against. Two backends implement it: [`crate::cpu::CpuBackend`] (plain
//! Rust, the reference) and [`crate::gpu::GpuBackend`] (wgpu + WGSL).
//!
//! Conventions, as in llm.c: tensors are flat f32 buffers with explicit
//! dimensions passed to each op; matrices are row-major; outputs are
//! `&mut` and preallocated, so a training step allocates nothing. An op
//! with an `accumulate` flag adds to its output instead of overwriting it
//! (gradients of a tensor used twice add up).
//!
//! On the GPU an op only records a dispatch; work runs when something is
//! read back (`to_vec`) or [`Backend::flush`] is called.

use crate::index::{FULL_VOCAB, IndexError, group_by_id, subset_bits};
use std::collections::BTreeMap;

/// A buffer that knows its element count.
pub trait Storage {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Storage for Vec<T> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// Counts of what stalls or costs a real GPU, since the backend was made:
/// compute dispatches, queue submissions, readbacks, and the buffers and
/// bind groups that ops and transfers create (uploads through the queue
/// and the device's own set-up are not counted). This project's machines
/// have no GPU to time, so the benchmarks report these per training step
/// and per decoded batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceCounters {
    pub dispatches: u64,
    /// Compute passes begun: a copy, a clear or an upload between two
    /// dispatches ends one.
    pub passes: u64,
    pub submissions: u64,
    /// Reads that wait for the device.
    pub readbacks: u64,
    /// Reads begun without waiting ([`Backend::begin_ids_read`]).
    pub async_reads: u64,
    pub buffers_created: u64,
    pub bind_groups_created: u64,
}

impl std::fmt::Display for DeviceCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} dispatches, {} passes, {} submissions, {} readbacks, {} reads without waiting, \
             {} buffers, {} bind groups",
            self.dispatches,
            self.passes,
            self.submissions,
            self.readbacks,
            self.async_reads,
            self.buffers_created,
            self.bind_groups_created
        )
    }
}

impl DeviceCounters {
    /// One `n`-th of each count, rounded up.
    pub fn per(&self, n: usize) -> DeviceCounters {
        let n = n.max(1) as u64;
        DeviceCounters {
            dispatches: self.dispatches.div_ceil(n),
            passes: self.passes.div_ceil(n),
            submissions: self.submissions.div_ceil(n),
            readbacks: self.readbacks.div_ceil(n),
            async_reads: self.async_reads.div_ceil(n),
            buffers_created: self.buffers_created.div_ceil(n),
            bind_groups_created: self.bind_groups_created.div_ceil(n),
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            dispatches: self.dispatches - earlier.dispatches,
            passes: self.passes - earlier.passes,
            submissions: self.submissions - earlier.submissions,
            readbacks: self.readbacks - earlier.readbacks,
            async_reads: self.async_reads - earlier.async_reads,
            buffers_created: self.buffers_created - earlier.buffers_created,
            bind_groups_created: self.bind_groups_created - earlier.bind_groups_created,
        }
    }
}

/// Matmul dispatches by their workgroup count and by the kernel chosen
/// for them: how well the products would fill a real GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkgroupCounts {
    pub workgroups: BTreeMap<u64, u64>,
    pub kernels: BTreeMap<String, u64>,
}

/// `now` less `earlier`, count by count.
fn counts_since<K: Ord + Clone>(
    now: &BTreeMap<K, u64>,
    earlier: &BTreeMap<K, u64>,
) -> BTreeMap<K, u64> {
    let mut out = now.clone();
    for (key, n) in earlier {
        if let Some(count) = out.get_mut(key) {
            *count -= n;
        }
    }
    out.retain(|_, n| *n > 0);
    out
}

impl WorkgroupCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &WorkgroupCounts) -> WorkgroupCounts {
        WorkgroupCounts {
            workgroups: counts_since(&self.workgroups, &earlier.workgroups),
            kernels: counts_since(&self.kernels, &earlier.kernels),
        }
    }

    /// The summary the benchmarks report (`None` without a dispatch).
    pub fn summary(&self) -> Option<WorkgroupSummary> {
        let dispatches: u64 = self.workgroups.values().sum();
        let min = *self.workgroups.keys().next()?;
        // The lower median: the count of the (dispatches - 1) / 2-th
        // dispatch in order of workgroups.
        let mut left = (dispatches - 1) / 2;
        let mut median = min;
        for (&groups, &n) in &self.workgroups {
            if left < n {
                median = groups;
                break;
            }
            left -= n;
        }
        Some(WorkgroupSummary {
            matmul_dispatches: dispatches,
            min,
            median,
            kernels: self.kernels.clone(),
        })
    }
}

/// Matmul dispatches, their fewest and median workgroups, and how many
/// ran each kernel (`+split` for split-K).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkgroupSummary {
    pub matmul_dispatches: u64,
    #[serde(rename = "matmul_workgroups_min")]
    pub min: u64,
    #[serde(rename = "matmul_workgroups_median")]
    pub median: u64,
    #[serde(rename = "matmul_kernels")]
    pub kernels: BTreeMap<String, u64>,
}

impl std::fmt::Display for WorkgroupSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} matmuls, workgroups min {} median {} (",
            self.matmul_dispatches, self.min, self.median
        )?;
        for (i, (kernel, n)) in self.kernels.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{kernel} {n}")?;
        }
        write!(f, ")")
    }
}

/// Which kind of backend an op set is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Cpu,
    Gpu,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Gpu => "gpu",
        })
    }
}

/// Shape of a (batched) matrix multiply
/// `C[i] = alpha * op(A[i]) * op(B[i]) (+ C[i] if accumulate)`.
/// op(A) is m x k (A stored [m, k], or [k, m] if `trans_a`); op(B) is k x n
/// (B stored [k, n], or [n, k] if `trans_b`). Where each batch item's
/// matrices lie is its operand's [`Operand`]: packed one after another by
/// default, or, for attention, heads side by side in token-major rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matmul {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub accumulate: bool,
    pub alpha: f32,
    /// Batch items come in groups of `heads`: item i is head `i % heads`
    /// of group `i / heads`. `batch` is a multiple of it.
    pub heads: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
}

/// Where one operand's matrices lie in its tensor: batch item i (head h of
/// group g, see [`Matmul::heads`]) starts at
/// `offset + g * group_stride + h * head_stride`, and its stored rows are
/// `row_stride` apart (0: rows packed, as many elements apart as a stored
/// row has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub offset: usize,
    pub row_stride: usize,
    pub group_stride: usize,
    pub head_stride: usize,
}

impl Operand {
    /// Matrices of `len` elements packed one after another.
    pub fn packed(len: usize) -> Self {
        Operand {
            offset: 0,
            row_stride: 0,
            group_stride: len,
            head_stride: 0,
        }
    }

    /// Head h of item g of a token-major tensor `[groups, seq, row_stride]`
    /// whose row holds the heads' `head_dim` columns side by side from
    /// `col_offset` on (q, k or v inside a fused qkv; an attention output).
    pub fn heads_in_rows(layout: &HeadLayout) -> Self {
        Operand {
            offset: layout.col_offset,
            row_stride: layout.row_stride,
            group_stride: layout.seq * layout.row_stride,
            head_stride: layout.head_dim,
        }
    }

    /// Where batch item `item` starts.
    pub fn start(&self, item: usize, heads: usize) -> usize {
        self.offset + item / heads * self.group_stride + item % heads * self.head_stride
    }
}

impl Matmul {
    /// One product of an m x k and a k x n matrix.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Self::batched(1, m, n, k)
    }

    /// `batch` independent products, matrices packed one after another.
    pub fn batched(batch: usize, m: usize, n: usize, k: usize) -> Self {
        Matmul {
            batch,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            accumulate: false,
            alpha: 1.0,
            heads: 1,
            a: Operand::packed(m * k),
            b: Operand::packed(k * n),
            c: Operand::packed(m * n),
        }
    }

    /// `groups * heads` products whose operands are packed head-major
    /// (`[groups, heads, rows, cols]`) until one is given another layout.
    pub fn per_head(groups: usize, heads: usize, m: usize, n: usize, k: usize) -> Self {
        let packed = |len: usize| Operand {
            head_stride: len,
            ..Operand::packed(heads * len)
        };
        Matmul {
            heads,
            a: packed(m * k),
            b: packed(k * n),
            c: packed(m * n),
            ..Self::batched(groups * heads, m, n, k)
        }
    }

    pub fn trans_a(mut self) -> Self {
        self.trans_a = true;
        self
    }

    pub fn trans_b(mut self) -> Self {
        self.trans_b = true;
        self
    }

    pub fn accumulate(mut self) -> Self {
        self.accumulate = true;
        self
    }

    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    /// Every batch item uses the same B (a weight).
    pub fn shared_b(mut self) -> Self {
        self.b.group_stride = 0;
        self.b.head_stride = 0;
        self
    }

    pub fn with_a(mut self, a: Operand) -> Self {
        self.a = a;
        self
    }

    pub fn with_b(mut self, b: Operand) -> Self {
        self.b = b;
        self
    }

    pub fn with_c(mut self, c: Operand) -> Self {
        self.c = c;
        self
    }

    pub fn flops(&self) -> f64 {
        2.0 * (self.batch * self.m * self.n * self.k) as f64
    }

    /// (rows, columns) of A, B and C as stored.
    pub fn stored_dims(&self) -> [(usize, usize); 3] {
        let (m, n, k) = (self.m, self.n, self.k);
        [
            if self.trans_a { (k, m) } else { (m, k) },
            if self.trans_b { (n, k) } else { (k, n) },
            (m, n),
        ]
    }

    /// The row strides of A, B and C, packed rows resolved.
    pub fn row_strides(&self) -> [usize; 3] {
        let dims = self.stored_dims();
        let resolve = |op: &Operand, (_, cols): (usize, usize)| {
            if op.row_stride == 0 {
                cols
            } else {
                op.row_stride
            }
        };
        [
            resolve(&self.a, dims[0]),
            resolve(&self.b, dims[1]),
            resolve(&self.c, dims[2]),
        ]
    }

    /// Multiply-adds of the whole product, every batch item.
    pub fn multiply_adds(&self) -> usize {
        self.batch * self.m * self.n * self.k
    }

    /// Elements each operand must hold.
    pub fn required_lens(&self) -> (usize, usize, usize) {
        let dims = self.stored_dims();
        let strides = self.row_strides();
        let len = |i: usize, op: &Operand| {
            let (rows, cols) = dims[i];
            if self.batch == 0 || rows == 0 || cols == 0 {
                return 0;
            }
            // Strides are not negative, so the last item reaches furthest
            // once `batch` is a multiple of `heads`.
            op.start(self.batch - 1, self.heads) + (rows - 1) * strides[i] + cols
        };
        (len(0, &self.a), len(1, &self.b), len(2, &self.c))
    }

    /// Panics unless the shape is one both backends compute alike: batch
    /// items grouped by whole heads, operands long enough, and no two
    /// items of C sharing an element (they are computed in parallel).
    pub fn check(&self, lens: (usize, usize, usize)) {
        let need = self.required_lens();
        assert!(
            self.heads >= 1 && self.batch.is_multiple_of(self.heads),
            "matmul: batch {} is not a multiple of heads {}",
            self.batch,
            self.heads
        );
        assert!(
            lens.0 >= need.0 && lens.1 >= need.1 && lens.2 >= need.2,
            "matmul: operands of {lens:?} elements, {need:?} needed for {self:?}"
        );
        assert!(
            self.c_items_disjoint(),
            "matmul: batch items of C overlap in {self:?}"
        );
    }

    /// Panics unless the column sums of op(B) are those of B as stored
    /// (`[k, n]` from its start, rows packed), for one product, and `sums`
    /// holds one per column.
    pub fn check_column_sums(&self, sums_len: usize) {
        assert!(
            self.batch == 1
                && !self.trans_b
                && self.b.offset == 0
                && self.row_strides()[1] == self.n
                && sums_len >= self.n,
            "matmul_column_sums: one product, B packed and not transposed, one sum per column"
        );
    }

    /// Panics unless this is one product written to a packed C, and
    /// `pre_len` covers C (`matmul_gelu_backward`).
    pub fn check_gelu_backward(&self, pre_len: usize) {
        assert!(
            self.batch == 1
                && !self.accumulate
                && self.c.offset == 0
                && self.row_strides()[2] == self.n
                && pre_len >= self.m * self.n,
            "matmul_gelu_backward: one product written to a packed C, GELU's input as large as C"
        );
    }

    fn c_items_disjoint(&self) -> bool {
        let (m, n) = (self.m, self.n);
        if self.batch <= 1 || m == 0 || n == 0 {
            return true;
        }
        let ld = self.row_strides()[2];
        let c = &self.c;
        let extent = (m - 1) * ld + n;
        let heads_apart = self.heads == 1
            || c.head_stride >= extent
            || (c.head_stride >= n && (self.heads - 1) * c.head_stride + n <= ld);
        let groups = self.batch / self.heads;
        let group_extent = (self.heads - 1) * c.head_stride + extent;
        heads_apart && (groups == 1 || c.group_stride >= group_extent)
    }
}

/// Token ids on the device, and the same positions grouped by id for the
/// embedding backward (`index::group_by_id`).
pub struct TokenIndex<B: Backend> {
    pub ids: B::Ids,
    pub unique: B::Ids,
    pub offsets: B::Ids,
    pub order: B::Ids,
    len: usize,
    unique_len: usize,
}

impl<B: Backend> TokenIndex<B> {
    pub fn new(backend: &B, ids: &[u32], vocab: usize) -> Result<Self, IndexError> {
        let groups = group_by_id(ids, vocab)?;
        Ok(TokenIndex {
            ids: backend.ids(ids),
            unique: backend.ids(&groups.unique),
            offsets: backend.ids(&groups.offsets),
            order: backend.ids(&groups.order),
            len: ids.len(),
            unique_len: groups.unique.len(),
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of distinct ids.
    pub fn unique_len(&self) -> usize {
        self.unique_len
    }
}

/// Which vocabulary each row of a logits matrix normalises over: row r uses
/// subset `row_subset[r]` (a bitset over the vocabulary), or the whole
/// vocabulary when it is [`FULL_VOCAB`]. The row's target always counts.
pub struct VocabSubsets<B: Backend> {
    pub row_subset: B::Ids,
    pub bits: B::Ids,
    /// u32 words per bitset.
    pub words: usize,
}

impl<B: Backend> VocabSubsets<B> {
    /// Every row over the whole vocabulary (plain cross-entropy).
    pub fn full(backend: &B, rows: usize) -> Self {
        VocabSubsets {
            row_subset: backend.ids(&vec![FULL_VOCAB; rows]),
            bits: backend.ids(&[0]),
            words: 1,
        }
    }

    /// `subsets[s]` lists the token ids of subset s; `row_subset[r]` picks a
    /// subset for row r, or is [`FULL_VOCAB`].
    pub fn new(
        backend: &B,
        vocab: usize,
        subsets: &[Vec<u32>],
        row_subset: &[u32],
    ) -> Result<Self, IndexError> {
        let (bits, words) = subset_bits(vocab, subsets, row_subset)?;
        Ok(VocabSubsets {
            row_subset: backend.ids(row_subset),
            bits: backend.ids(&bits),
            words,
        })
    }
}

/// A full reduction of a tensor to one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Mean,
    Max,
    SumSquares,
}

/// Rows of a row-wise softmax, grouped as `[batch, heads, q_len]` so that
/// attention masks can be applied: a causal mask (key j visible to query q
/// when j <= q) and a key padding mask (`[batch, cols]`, nonzero = real).
/// A plain softmax is `SoftmaxRows::plain(rows, cols)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftmaxRows {
    pub rows: usize,
    pub cols: usize,
    pub q_len: usize,
    pub heads: usize,
    pub causal: bool,
}

impl SoftmaxRows {
    pub fn plain(rows: usize, cols: usize) -> Self {
        SoftmaxRows {
            rows,
            cols,
            q_len: rows.max(1),
            heads: 1,
            causal: false,
        }
    }
}

/// Where attention heads sit in a token-major tensor: element e of head h of
/// token t of item b is at `(b * seq + t) * row_stride + col_offset + h * head_dim + e`.
/// The head-major side is `[batch, heads, seq, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadLayout {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub row_stride: usize,
    pub col_offset: usize,
}

impl HeadLayout {
    pub fn len(&self) -> usize {
        self.batch * self.seq * self.heads * self.head_dim
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Multi-head self-attention over a fused qkv tensor `[batch, seq, 3 *
/// channels]` (q, then k, then v, each `[heads, head_dim]` per token), with
/// its output `[batch, seq, channels]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Each position attends only to itself and earlier ones.
    pub causal: bool,
}

impl AttentionShape {
    /// The widest head the fused kernels take: they hold 16 rows of
    /// three operands in 16 KiB of workgroup memory.
    pub const MAX_FUSED_HEAD_DIM: usize = 64;

    pub fn channels(&self) -> usize {
        self.heads * self.head_dim
    }

    /// q (part 0), k (1) or v (2) inside the fused qkv tensor.
    pub fn qkv_part(&self, part: usize) -> HeadLayout {
        HeadLayout {
            batch: self.batch,
            seq: self.seq,
            heads: self.heads,
            head_dim: self.head_dim,
            row_stride: 3 * self.channels(),
            col_offset: part * self.channels(),
        }
    }

    /// What q k is multiplied by: 1 / sqrt(head_dim).
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Attention as batched products per head, each operand read in place.
    pub fn products(&self) -> AttentionProducts {
        let (t, d) = (self.seq, self.head_dim);
        let per_head = |m, n, k| Matmul::per_head(self.batch, self.heads, m, n, k);
        let part = |p| Operand::heads_in_rows(&self.qkv_part(p));
        let out = Operand::heads_in_rows(&HeadLayout {
            row_stride: self.channels(),
            col_offset: 0,
            ..self.qkv_part(0)
        });
        AttentionProducts {
            scores: per_head(t, t, d)
                .with_a(part(0))
                .with_b(part(1))
                .trans_b()
                .alpha(self.scale()),
            weighted_values: per_head(t, d, t).with_b(part(2)).with_c(out),
            d_weights: per_head(t, t, d).with_a(out).with_b(part(2)).trans_b(),
            d_values: per_head(t, d, t).trans_a().with_b(out).with_c(part(2)),
            d_queries: per_head(t, d, t)
                .with_b(part(1))
                .with_c(part(0))
                .alpha(self.scale()),
            d_keys: per_head(t, d, t)
                .trans_a()
                .with_b(part(0))
                .with_c(part(1))
                .alpha(self.scale()),
        }
    }

    /// Panics unless the tensors of [`Backend::attention`] have this shape:
    /// qkv `[batch, seq, 3 channels]`, out `[batch, seq, channels]`, the
    /// log-sum-exps `[batch, heads, seq]` and the mask `[batch, seq]`; and
    /// unless the heads fit the fused kernels.
    pub fn check(&self, (qkv, out, lse): (usize, usize, usize), mask: Option<usize>) {
        let tokens = self.batch * self.seq;
        assert!(
            qkv == tokens * 3 * self.channels()
                && out == tokens * self.channels()
                && lse == tokens * self.heads
                && mask.is_none_or(|m| m == tokens),
            "attention: tensors of {qkv}, {out}, {lse} and {mask:?} elements for {self:?}"
        );
        assert!(
            self.head_dim <= Self::MAX_FUSED_HEAD_DIM,
            "attention: heads of {} (the fused kernels take at most {})",
            self.head_dim,
            Self::MAX_FUSED_HEAD_DIM
        );
    }

    /// `check`, and d_out as large as out and dqkv as qkv: the tensors of
    /// [`Backend::attention_backward`].
    pub fn check_backward(
        &self,
        (qkv, out, lse, d_out, dqkv): (usize, usize, usize, usize, usize),
        mask: Option<usize>,
    ) {
        self.check((qkv, out, lse), mask);
        assert!(
            d_out == out && dqkv == qkv,
            "attention_backward: d_out of {d_out} and dqkv of {dqkv} elements for {self:?}"
        );
    }
}

/// Attention's products per head ([`AttentionShape::products`]): q, k and
/// v read inside qkv, the heads of out and of its gradient inside `[batch,
/// seq, channels]`, the weights and scores packed `[batch, heads, seq,
/// seq]`. Each writes its part of C (none accumulates).
#[derive(Clone, Copy, Debug)]
pub struct AttentionProducts {
    /// scores = scale q k^T.
    pub scores: Matmul,
    /// out = weights v.
    pub weighted_values: Matmul,
    /// d weights = d_out v^T.
    pub d_weights: Matmul,
    /// dv = weights^T d_out.
    pub d_values: Matmul,
    /// dq = scale d_scores k.
    pub d_queries: Matmul,
    /// dk = scale d_scores^T q.
    pub d_keys: Matmul,
}

/// Decoding's attention at one new position of `rows` sequences, over a
/// KV cache of `[rows, heads, capacity, head_dim]` per layer (see
/// [`Backend::attend_cached`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CachedAttention {
    pub rows: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub capacity: usize,
    /// The new position: keys 0..=position take part.
    pub position: usize,
    /// Multiplies q k (1 / sqrt(head_dim)).
    pub scale: f32,
}

impl CachedAttention {
    /// Keys a cache may hold: the GPU kernel keeps a row's weights in
    /// workgroup memory.
    pub const MAX_CAPACITY: usize = 1024;

    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Panics unless the tensors have this shape: qkv `[rows, 3 width]`,
    /// each cache `[rows, heads, capacity, head_dim]`, out `[rows, width]`.
    pub fn check(&self, (qkv, keys, values, out): (usize, usize, usize, usize)) {
        let w = self.width();
        let cache = self.rows * self.heads * self.capacity * self.head_dim;
        assert!(
            qkv == self.rows * 3 * w && keys == cache && values == cache && out == self.rows * w,
            "attend_cached: tensors of {qkv}, {keys}, {values}, {out} elements for {self:?}"
        );
        assert!(
            self.position < self.capacity && self.capacity <= Self::MAX_CAPACITY,
            "attend_cached: position {} of a cache of {} (at most {})",
            self.position,
            self.capacity,
            Self::MAX_CAPACITY
        );
    }
}

/// One AdamW update's hyper-parameters for one tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// The step number, from 1 (bias corrections use it).
    pub t: u64,
    /// Clip to this global gradient norm; 0 = no clipping.
    pub max_norm: f32,
}

impl AdamWStep {
    pub fn bias_corrections(&self) -> (f32, f32) {
        let t = self.t as i32;
        (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t))
    }
}

/// Sampling settings of a [`TokenChoice`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    /// Keep the k most likely tokens (ties at the k-th kept); 0 keeps all.
    pub top_k: u32,
    /// Keep the most likely tokens whose mass reaches p (ties kept); 1 keeps all.
    pub top_p: f32,
}

/// An id [`Backend::embedding`] reads as a row of zeros.
pub const NO_ROW: u32 = u32::MAX;

/// How a [`TokenChoice`] picks a row's token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChoiceRule {
    /// The most likely allowed token (lowest id on ties).
    Greedy,
    Sample(Sampling),
    /// The allowed token with the largest logit plus Gumbel noise
    /// g(seed, row, step, token) (a sample at temperature 1 by the
    /// Gumbel-max trick), whose noise [`Backend::gumbel_logits`] draws
    /// again for the relaxation of the same choice.
    Gumbel,
}

/// One step of token choice over `[rows, vocab]` logits (see
/// `shaders/choose.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenChoice {
    pub rows: usize,
    pub vocab: usize,
    /// The column of `history` and `logprobs` this step writes.
    pub step: u32,
    /// Columns of `history` and `logprobs`.
    pub steps: usize,
    pub rule: ChoiceRule,
    pub seed: u64,
    /// Added to the row index in the random counter, so that the rows of
    /// successive batches draw different numbers.
    pub first_row: u32,
    /// A token never chosen (`<unk>` when suppressed), or `u32::MAX`.
    pub banned: u32,
    /// Never chosen either: a caption does not restart or pad itself.
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
}

/// Beam search's candidates: each row's `count` most likely tokens among
/// those that may be chosen (see [`Backend::top_candidates`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidates {
    pub rows: usize,
    pub vocab: usize,
    pub count: usize,
    /// Never a candidate: a banned token (`<unk>` when suppressed, or
    /// `u32::MAX`), `<bos>` and padding.
    pub banned: u32,
    pub bos: u32,
    pub pad: u32,
}

impl Candidates {
    /// Whether token j may be a candidate.
    pub fn allowed(&self, j: u32) -> bool {
        j != self.banned && j != self.bos && j != self.pad
    }

    /// Panics unless logits are `[rows, vocab]` and the candidates `[rows,
    /// count, 2]`.
    pub fn check(&self, (logits, candidates): (usize, usize)) {
        assert!(
            logits == self.rows * self.vocab && candidates == self.rows * self.count * 2,
            "top_candidates: tensors of {logits} and {candidates} elements for {self:?}"
        );
    }
}

/// One step of beam search over `images` images of `width` rows each,
/// beam k of image i on row i * width + k (see [`Backend::beam_step`]).
///
/// The search's record is one `[state_len()]` u32 tensor, zero at the
/// start: first the trace, `[steps, rows, 3]`, where (parent, token,
/// score bits) at (s, r) say that the beam on row r after step s took
/// `token` after the beam on row `parent` after step s - 1 and has total
/// log-probability `score`; a row without a beam has token `pad`. Then,
/// per image, the count of its finished captions and up to `width` of
/// them, best first, as (score bits, step, parent, token): the beam on row
/// `parent` after step - 1, followed by `token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeamStep {
    pub images: usize,
    pub width: usize,
    /// Captions kept per image: an image stops once its n_best-th finished
    /// caption beats every live beam.
    pub n_best: usize,
    /// Steps of the whole search (ids a caption may have, `<eos>`
    /// included): the last one finishes every beam.
    pub steps: usize,
    /// The step this call takes.
    pub step: usize,
    pub eos: u32,
    pub pad: u32,
}

impl BeamStep {
    /// Candidates each row offers ([`Candidates::count`]): 2 x width. An
    /// image's best 2 x width continuations are among its rows' best
    /// 2 x width, since a row adds its beam's score to each of its tokens
    /// alike.
    pub fn count(&self) -> usize {
        2 * self.width
    }

    pub fn rows(&self) -> usize {
        self.images * self.width
    }

    /// Where the finished captions start in the state tensor.
    pub fn finished_start(&self) -> usize {
        self.steps * self.rows() * 3
    }

    /// u32s per image in the finished part: the count, then `width`
    /// entries of 4.
    pub fn finished_stride(&self) -> usize {
        1 + 4 * self.width
    }

    pub fn state_len(&self) -> usize {
        self.finished_start() + self.images * self.finished_stride()
    }

    /// Panics unless candidates are `[rows, count, 2]`, parents and next
    /// `[rows]`, the state `[state_len()]`, the step within the search and
    /// n_best within the width.
    pub fn check(&self, (candidates, parents, next, state): (usize, usize, usize, usize)) {
        let rows = self.rows();
        assert!(
            candidates == rows * self.count() * 2
                && parents == rows
                && next == rows
                && state == self.state_len()
                && self.step < self.steps
                && (1..=self.width).contains(&self.n_best),
            "beam_step: tensors of {candidates}, {parents}, {next} and {state} elements for {self:?}"
        );
    }
}

/// An LSTM cell's gates, as a row of its gates' pre-activations lays
/// them out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CellGates {
    /// PyTorch's: input, forget, cell input (tanh), output.
    #[default]
    Lstm,
    /// Self-critical training's maxout cell (its FC and Att2in2 models):
    /// input, forget, output, then two candidates whose larger is the
    /// cell input, with no tanh.
    Maxout,
}

impl CellGates {
    /// Pre-activations per hidden unit.
    pub fn chunks(self) -> usize {
        match self {
            CellGates::Lstm => 4,
            CellGates::Maxout => 5,
        }
    }
}

/// One time step of an LSTM layer over `rows` sequences: the gates'
/// pre-activations `[rows, chunks * hidden]` start at `gates_offset`, rows
/// `gates_stride` apart; the cell and hidden states are read at `prev`
/// and written at `next`, rows `state_stride` apart in their tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LstmStep {
    pub cell: CellGates,
    pub rows: usize,
    pub hidden: usize,
    pub gates_offset: usize,
    pub gates_stride: usize,
    pub prev: usize,
    pub next: usize,
    pub state_stride: usize,
}

impl LstmStep {
    /// Step `t` of `rows` sequences of `steps` positions, gates
    /// `[rows, steps, chunks * hidden]` and states `[rows, steps + 1,
    /// hidden]` whose slot 0 is the initial state: step t reads slot t and
    /// writes slot t + 1.
    pub fn of_sequence(
        cell: CellGates,
        rows: usize,
        hidden: usize,
        steps: usize,
        t: usize,
    ) -> Self {
        let row = cell.chunks() * hidden;
        LstmStep {
            cell,
            rows,
            hidden,
            gates_offset: t * row,
            gates_stride: steps * row,
            prev: t * hidden,
            next: (t + 1) * hidden,
            state_stride: (steps + 1) * hidden,
        }
    }

    /// A decoding step of `rows` sequences: gates `[rows, chunks *
    /// hidden]`, states `[rows, 2, hidden]` read from slot `prev` (0 or 1)
    /// and written to the other.
    pub fn between_slots(cell: CellGates, rows: usize, hidden: usize, prev: usize) -> Self {
        LstmStep {
            cell,
            rows,
            hidden,
            gates_offset: 0,
            gates_stride: cell.chunks() * hidden,
            prev: prev * hidden,
            next: (1 - prev) * hidden,
            state_stride: 2 * hidden,
        }
    }

    /// Pre-activations in a row of gates.
    pub fn row(&self) -> usize {
        self.cell.chunks() * self.hidden
    }

    /// Elements the step reaches in the gates and in each state tensor.
    pub fn required_lens(&self) -> (usize, usize) {
        let last_row = self.rows.saturating_sub(1);
        let gates = self.gates_offset + last_row * self.gates_stride + self.row();
        let state = self.prev.max(self.next) + last_row * self.state_stride + self.hidden;
        (gates, state)
    }

    /// Panics unless the gates and the states hold what the step reaches,
    /// a state row holds both slots apart, and a gates row its gates.
    pub fn check(&self, gates: usize, states: &[usize]) {
        let (need_gates, need_state) = self.required_lens();
        let apart = self.prev.abs_diff(self.next) >= self.hidden;
        assert!(
            apart
                && self.gates_stride >= self.row()
                && self.state_stride >= self.prev.max(self.next) + self.hidden
                && gates >= need_gates
                && states.iter().all(|&n| n >= need_state),
            "lstm step: gates of {gates} and states of {states:?} elements for {self:?}"
        );
    }

    /// `check` for the backward's tensors, and `d_cell` `[rows, hidden]`.
    pub fn check_backward(&self, gates: usize, d_gates: usize, states: &[usize], d_cell: usize) {
        self.check(gates.min(d_gates), states);
        assert!(
            d_cell >= self.rows * self.hidden,
            "lstm step: d_cell of {d_cell} elements for {self:?}"
        );
    }
}

/// The ops. See the module documentation for conventions; each method's
/// GPU kernel lives in `shaders/`, its CPU twin in `src/cpu/`.
pub trait Backend: 'static {
    /// f32 storage.
    type Tensor: Storage;
    /// u32 storage (token ids, masks, index arrays).
    type Ids: Storage;
    /// A read of ids begun without waiting ([`Backend::begin_ids_read`]).
    type PendingIds;

    fn kind(&self) -> BackendKind;
    /// What runs the ops: the adapter's name, or the CPU's.
    fn adapter_name(&self) -> String;

    // ---- memory ----
    fn zeros(&self, len: usize) -> Self::Tensor;
    fn tensor(&self, data: &[f32]) -> Self::Tensor;
    fn ids(&self, data: &[u32]) -> Self::Ids;
    fn write(&self, dst: &mut Self::Tensor, data: &[f32]);
    /// Tensors holding `data`, which the backend may lay out one after
    /// another in one allocation (the GPU does), so that [`Backend::span`]
    /// covers them.
    fn tensor_group(&self, data: &[&[f32]]) -> Vec<Self::Tensor> {
        data.iter().map(|d| self.tensor(d)).collect()
    }
    /// One tensor covering the members of a `tensor_group`, in order,
    /// with the zeros between them (which filling with 0, sums of squares
    /// and AdamW keep zero), so that one op serves the whole group; `None`
    /// where they are not laid out so (always on the CPU, whose ops cost
    /// nothing to launch).
    fn span(&self, group: &[&Self::Tensor]) -> Option<Self::Tensor> {
        let _ = group;
        None
    }
    fn to_vec(&self, src: &Self::Tensor) -> Vec<f32>;
    fn ids_to_vec(&self, src: &Self::Ids) -> Vec<u32>;
    /// Starts reading `src` back as it is at this point of the program,
    /// without waiting for the device (later ops may change `src`).
    fn begin_ids_read(&self, src: &Self::Ids) -> Self::PendingIds;
    /// The ids a begun read gives, once the device has them; `None` while
    /// it still works. Never waits; `Some` once only.
    fn poll_ids_read(&self, pending: &mut Self::PendingIds) -> Option<Vec<u32>>;
    /// Run everything recorded so far and wait for it.
    fn flush(&self);
    /// Start everything recorded so far without waiting for it: a training
    /// step ends with it, so that a GPU runs one step while the host
    /// prepares the next. Nothing to do on the CPU.
    fn submit(&self) {}
    /// What a real GPU pays for so far (dispatches, submissions,
    /// readbacks, buffer and bind-group creations); `None` on the CPU.
    fn counters(&self) -> Option<DeviceCounters> {
        None
    }
    /// How many matmul dispatches so far had each workgroup count; `None`
    /// on the CPU.
    fn matmul_workgroups(&self) -> Option<WorkgroupCounts> {
        None
    }
    /// Starts timing each kernel's dispatches (on a GPU with timestamp
    /// queries) or each op (on the CPU); false, and nothing started,
    /// where the backend cannot.
    fn start_kernel_profile(&self) -> bool {
        false
    }
    /// Runs what is recorded and returns each kernel's time since
    /// `start_kernel_profile`; `None` where no profile is on.
    fn finish_kernel_profile(&self) -> Option<crate::kernel_profile::KernelProfile> {
        None
    }
    /// Device memory held so far (GPU buffers; none of them is released
    /// while the backend lives); `None` on the CPU, whose tensors are in
    /// the process's resident memory.
    fn device_memory_bytes(&self) -> Option<u64> {
        None
    }

    // ---- elementwise ----
    fn fill(&self, x: &mut Self::Tensor, value: f32);
    fn scale(&self, x: &mut Self::Tensor, alpha: f32);
    /// y = alpha * x + beta * y (beta = 0: a copy; y is not read).
    fn axpby(&self, alpha: f32, x: &Self::Tensor, beta: f32, y: &mut Self::Tensor);
    /// out = alpha * a + beta * b
    fn add(
        &self,
        alpha: f32,
        a: &Self::Tensor,
        beta: f32,
        b: &Self::Tensor,
        out: &mut Self::Tensor,
    );
    /// out = alpha * a * b
    fn mul(&self, alpha: f32, a: &Self::Tensor, b: &Self::Tensor, out: &mut Self::Tensor);
    /// y[r, c] += bias[c] for a row-major y with `bias.len()` columns.
    fn add_bias(&self, y: &mut Self::Tensor, bias: &Self::Tensor);
    /// GELU, tanh approximation.
    fn gelu(&self, x: &Self::Tensor, y: &mut Self::Tensor);
    /// y = tanh(x).
    fn tanh(&self, x: &Self::Tensor, y: &mut Self::Tensor);
    /// dx = dy * (1 - tanh(x)^2), the gradient through y = tanh(x).
    fn tanh_backward(&self, x: &Self::Tensor, dy: &Self::Tensor, dx: &mut Self::Tensor);
    /// y = x sigmoid(1.702 x), CLIP's quick GELU.
    fn quick_gelu(&self, x: &Self::Tensor, y: &mut Self::Tensor);
    /// The gradient through y = quick_gelu(x).
    fn quick_gelu_backward(&self, x: &Self::Tensor, dy: &Self::Tensor, dx: &mut Self::Tensor);
    /// y = x Phi(x), GELU with the normal distribution's exact CDF (erf).
    fn gelu_erf(&self, x: &Self::Tensor, y: &mut Self::Tensor);
    /// dx = dy (Phi(x) + x phi(x)), the gradient through y = gelu_erf(x).
    fn gelu_erf_backward(&self, x: &Self::Tensor, dy: &Self::Tensor, dx: &mut Self::Tensor);
    /// y = max(x, 0).
    fn relu(&self, x: &Self::Tensor, y: &mut Self::Tensor);
    /// dx = dy where x > 0, else 0: the gradient through y = max(x, 0).
    fn relu_backward(&self, x: &Self::Tensor, dy: &Self::Tensor, dx: &mut Self::Tensor);
    fn gelu_backward(
        &self,
        x: &Self::Tensor,
        dy: &Self::Tensor,
        dx: &mut Self::Tensor,
        accumulate: bool,
    );

    /// y (+)= exp(log_scale[0]) * x: scaling by a learned log-temperature.
    fn scale_by_exp(
        &self,
        log_scale: &Self::Tensor,
        x: &Self::Tensor,
        y: &mut Self::Tensor,
        accumulate: bool,
    );
    /// x = clamp(x, lo, hi)
    fn clamp(&self, x: &mut Self::Tensor, lo: f32, hi: f32);

    /// Self-attention, fused (FlashAttention's scheme: no `[seq, seq]`
    /// tensor is stored): out = softmax(scale q k + masks) v per head, with
    /// the causal mask if `l.causal` and, given `key_mask` (`[batch, seq]`,
    /// nonzero = a real token), padding keys masked. A query with no key
    /// left gets 0. `lse` (`[batch, heads, seq]`) gets each query's
    /// log-sum-exp of its scores, which the backward reads.
    fn attention(
        &self,
        qkv: &Self::Tensor,
        key_mask: Option<&Self::Ids>,
        out: &mut Self::Tensor,
        lse: &mut Self::Tensor,
        l: &AttentionShape,
    );
    /// dqkv (overwritten) = the gradient through `attention`, given its
    /// inputs, its out and lse, and d_out.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        qkv: &Self::Tensor,
        key_mask: Option<&Self::Ids>,
        out: &Self::Tensor,
        lse: &Self::Tensor,
        d_out: &Self::Tensor,
        dqkv: &mut Self::Tensor,
        l: &AttentionShape,
    );

    /// Decoding's attention, fused: each (row, head)'s new key and value
    /// (parts 1 and 2 of its row of `qkv`, `[rows, 3 width]`) join the
    /// caches at `l.position`, then its part of out (`[rows, width]`) is
    /// softmax(scale q k_j) over keys j <= position, times the values.
    fn attend_cached(
        &self,
        qkv: &Self::Tensor,
        keys: &mut Self::Tensor,
        values: &mut Self::Tensor,
        out: &mut Self::Tensor,
        l: &CachedAttention,
    );

    // ---- matmul ----
    fn matmul(&self, a: &Self::Tensor, b: &Self::Tensor, c: &mut Self::Tensor, shape: &Matmul);
    /// `matmul`, then `bias` (`[n]`) added to every row of C: a linear
    /// layer's forward, one dispatch on the GPU. One product, no batch.
    fn matmul_bias(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        bias: &Self::Tensor,
        c: &mut Self::Tensor,
        shape: &Matmul,
    ) {
        self.matmul(a, b, c, shape);
        self.add_bias(c, bias);
    }

    /// `matmul_bias`, then `residual` (as large as C) added: a residual
    /// branch's last linear layer and the add that joins the stream, one
    /// dispatch on the GPU. One product into a packed C.
    fn matmul_bias_residual(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        bias: &Self::Tensor,
        residual: &Self::Tensor,
        c: &mut Self::Tensor,
        shape: &Matmul,
    ) {
        assert!(
            residual.len() == c.len(),
            "matmul_bias_residual: a residual as large as C"
        );
        self.matmul_bias(a, b, bias, c, shape);
        self.axpby(1.0, residual, 1.0, c);
    }

    /// `matmul_bias`, then act = GELU(C): an MLP's first layer keeping its
    /// pre-activation for the backward, one dispatch on the GPU.
    fn matmul_bias_gelu(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        bias: &Self::Tensor,
        c: &mut Self::Tensor,
        act: &mut Self::Tensor,
        shape: &Matmul,
    ) {
        self.matmul_bias(a, b, bias, c, shape);
        self.gelu(c, act);
    }
    /// C = (alpha op(A) op(B)) * GELU'(pre), elementwise, for one product
    /// written (not added) to a packed C: the gradient w.r.t. a GELU's
    /// input, computed where the gradient w.r.t. its output is.
    fn matmul_gelu_backward(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        pre: &Self::Tensor,
        c: &mut Self::Tensor,
        shape: &Matmul,
    );
    /// `matmul` of one product, and `sums[col]` (+)= the sum over rows of
    /// op(B)`[.., col]` (added when the product accumulates): a linear
    /// layer's bias gradient computed beside its weight gradient, in the
    /// same dispatch on the GPU.
    fn matmul_column_sums(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        c: &mut Self::Tensor,
        sums: &mut Self::Tensor,
        shape: &Matmul,
    ) {
        shape.check_column_sums(sums.len());
        self.matmul(a, b, c, shape);
        self.column_sum(b, shape.k, shape.n, sums, shape.accumulate);
    }

    // ---- reductions ----
    /// out[out_index] = the reduction of all of x.
    fn reduce(&self, x: &Self::Tensor, op: Reduce, out: &mut Self::Tensor, out_index: usize) {
        self.reduce_parts(&[x], op, out, out_index);
    }
    /// out[out_index] = the reduction of all the elements of `parts`, as
    /// if concatenated (a gradient norm over parameter groups): one final
    /// pass on the GPU, whatever the number of parts.
    fn reduce_parts(
        &self,
        parts: &[&Self::Tensor],
        op: Reduce,
        out: &mut Self::Tensor,
        out_index: usize,
    );
    /// out[c] (+)= sum over rows of x[r, c]: the bias gradient.
    fn column_sum(
        &self,
        x: &Self::Tensor,
        rows: usize,
        cols: usize,
        out: &mut Self::Tensor,
        accumulate: bool,
    );

    // ---- layer norm ----
    /// y = (x - mean) * rstd * gamma + beta per row; saves mean and rstd per row.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        gamma: &Self::Tensor,
        beta: &Self::Tensor,
        y: &mut Self::Tensor,
        mean: &mut Self::Tensor,
        rstd: &mut Self::Tensor,
        cols: usize,
        eps: f32,
    );
    /// dx (+)= d/dx; dgamma += d/dgamma; dbeta += d/dbeta, unless they are
    /// empty (a frozen layer's).
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_backward(
        &self,
        dy: &Self::Tensor,
        x: &Self::Tensor,
        gamma: &Self::Tensor,
        mean: &Self::Tensor,
        rstd: &Self::Tensor,
        dx: &mut Self::Tensor,
        dgamma: &mut Self::Tensor,
        dbeta: &mut Self::Tensor,
        cols: usize,
        accumulate_dx: bool,
    );

    // ---- row normalisation and pooling ----
    /// y = x / max(||x||, 1e-12) per row of `cols`; saves the norm per row.
    fn l2_normalize(
        &self,
        x: &Self::Tensor,
        y: &mut Self::Tensor,
        norm: &mut Self::Tensor,
        cols: usize,
    );
    /// dx (+)= (dy - y * dot(y, dy)) / norm per row.
    fn l2_normalize_backward(
        &self,
        y: &Self::Tensor,
        norm: &Self::Tensor,
        dy: &Self::Tensor,
        dx: &mut Self::Tensor,
        cols: usize,
        accumulate: bool,
    );
    /// y[g, c] = mean of x[r, c] over the `group` rows of group g.
    fn mean_pool(&self, x: &Self::Tensor, y: &mut Self::Tensor, group: usize, cols: usize);
    /// dx[r, c] (+)= dy[r / group, c] / group
    fn mean_pool_backward(
        &self,
        dy: &Self::Tensor,
        dx: &mut Self::Tensor,
        group: usize,
        cols: usize,
        accumulate: bool,
    );

    // ---- recurrent cells ----
    /// One LSTM step: the gates at `step` become their activations, then
    /// c_next = f c_prev + i c_in and h_next = o tanh(c_next). PyTorch's
    /// cell (`CellGates::Lstm`): (i, f, c_in, o) = (sigmoid, sigmoid, tanh,
    /// sigmoid); the maxout cell (`CellGates::Maxout`): i, f, o sigmoids,
    /// c_in the larger of the last two chunks (kept with the first
    /// candidate's share of its gradient).
    fn lstm_cell(
        &self,
        gates: &mut Self::Tensor,
        cells: &mut Self::Tensor,
        hidden: &mut Self::Tensor,
        step: &LstmStep,
    );
    /// The step's backward from the activations `lstm_cell` left: with
    /// `d_hidden` at the step's `next` slot the whole gradient w.r.t.
    /// h_next, and `d_cell` (`[rows, hidden]`) the gradient w.r.t. c_next
    /// from the steps after it, writes the gradient w.r.t. the gates'
    /// pre-activations into `d_gates` (the gates' layout) and replaces
    /// `d_cell` with the gradient w.r.t. c_prev.
    fn lstm_cell_backward(
        &self,
        gates: &Self::Tensor,
        cells: &Self::Tensor,
        d_hidden: &Self::Tensor,
        d_cell: &mut Self::Tensor,
        d_gates: &mut Self::Tensor,
        step: &LstmStep,
    );

    // ---- softmax (with attention masks) ----
    fn softmax(
        &self,
        x: &Self::Tensor,
        y: &mut Self::Tensor,
        rows: &SoftmaxRows,
        key_mask: Option<&Self::Ids>,
    );
    /// dx (+)= y * (dy - sum(dy * y)) per row of `cols`.
    fn softmax_backward(
        &self,
        y: &Self::Tensor,
        dy: &Self::Tensor,
        dx: &mut Self::Tensor,
        cols: usize,
        accumulate: bool,
    );

    // ---- attention head layout ----
    /// Token-major (strided) to head-major.
    fn tokens_to_heads(&self, src: &Self::Tensor, dst: &mut Self::Tensor, layout: &HeadLayout);
    /// Head-major to token-major (strided), optionally adding.
    fn heads_to_tokens(
        &self,
        src: &Self::Tensor,
        dst: &mut Self::Tensor,
        layout: &HeadLayout,
        accumulate: bool,
    );

    // ---- embeddings ----
    /// out[i, :] (+)= table[ids[i], :] for every i of `ids`, which must
    /// name rows of `table` (a [`TokenIndex`] checked them, or a kernel
    /// wrote them) or be [`NO_ROW`] (a zero row: a gather moving rows
    /// between layouts leaves the rows without a source at zero).
    fn embedding(
        &self,
        table: &Self::Tensor,
        ids: &Self::Ids,
        out: &mut Self::Tensor,
        dim: usize,
        accumulate: bool,
    );
    /// dtable[v, :] += sum of dout[i, :] over the i with ids[i] = v, in order of i.
    fn embedding_backward(
        &self,
        dout: &Self::Tensor,
        ids: &TokenIndex<Self>,
        dtable: &mut Self::Tensor,
        dim: usize,
    ) where
        Self: Sized;

    // ---- log-probabilities of given tokens ----
    /// logp[r] = log softmax over row r's allowed tokens, at targets[r];
    /// lse[r] = the log-sum-exp it used. See `shaders/logprob.wgsl`.
    #[allow(clippy::too_many_arguments)]
    fn log_softmax_gather(
        &self,
        logits: &Self::Tensor,
        targets: &Self::Ids,
        subsets: &VocabSubsets<Self>,
        vocab: usize,
        logp: &mut Self::Tensor,
        lse: &mut Self::Tensor,
    ) where
        Self: Sized;
    /// dlogits (+)= dlogp[r] * (onehot(targets[r]) - softmax over allowed tokens).
    #[allow(clippy::too_many_arguments)]
    fn log_softmax_gather_backward(
        &self,
        logits: &Self::Tensor,
        targets: &Self::Ids,
        subsets: &VocabSubsets<Self>,
        vocab: usize,
        lse: &Self::Tensor,
        dlogp: &Self::Tensor,
        dlogits: &mut Self::Tensor,
        accumulate: bool,
    ) where
        Self: Sized;

    /// entropy[r] = -sum_j p_j log p_j of the softmax over row r of
    /// `logits` (`[rows, vocab]`, full vocabulary); lse[r] = the row's
    /// log-sum-exp, kept for the backward.
    fn softmax_entropy(
        &self,
        logits: &Self::Tensor,
        vocab: usize,
        entropy: &mut Self::Tensor,
        lse: &mut Self::Tensor,
    );
    /// dlogits[r, j] (+)= d_entropy[r] * (-p_j (log p_j + entropy[r])):
    /// the gradient of the entropy through the softmax.
    #[allow(clippy::too_many_arguments)]
    fn softmax_entropy_backward(
        &self,
        logits: &Self::Tensor,
        vocab: usize,
        entropy: &Self::Tensor,
        lse: &Self::Tensor,
        d_entropy: &Self::Tensor,
        dlogits: &mut Self::Tensor,
        accumulate: bool,
    );
    /// coef[i] = alpha * weights[i / per_sequence] * [ids[i] != pad] for
    /// every row i of `ids`: per-sequence weights (REINFORCE's advantages)
    /// on each real token of their sequence.
    fn spread_sequence_weights(
        &self,
        weights: &Self::Tensor,
        ids: &Self::Ids,
        per_sequence: usize,
        pad: u32,
        alpha: f32,
        coef: &mut Self::Tensor,
    );

    // ---- generation ----
    /// Each row's next token from `logits` (`[rows, vocab]`), as
    /// `choice` says: history[r, step] = the token, logprobs[r, step] =
    /// its log-probability under the full vocabulary, next[r] = the token.
    /// A row whose history[r, step - 1] is <eos> or padding gets padding.
    fn choose_tokens(
        &self,
        logits: &Self::Tensor,
        choice: &TokenChoice,
        next: &mut Self::Ids,
        history: &mut Self::Ids,
        logprobs: &mut Self::Tensor,
    );

    /// Beam search's candidates: each row's `count` most likely allowed
    /// tokens, best first (the largest log-probability as an f32, the
    /// lowest id on ties), as
    /// `[rows, count, 2]` pairs of the id and the bits of its
    /// log-probability under the softmax over the allowed tokens only (one
    /// tensor, so one read takes both). Where fewer are allowed, the rest
    /// get id `u32::MAX` and log-probability minus infinity.
    fn top_candidates(&self, logits: &Self::Tensor, c: &Candidates, candidates: &mut Self::Ids);

    /// One step of beam search (layout in [`BeamStep`]) from each row's
    /// candidates (the pairs of [`Backend::top_candidates`] for
    /// [`BeamStep::count`]). Per image, every live beam's continuations are
    /// ranked by total log-probability (then beam, then id); of the best 2
    /// x width, those among the best width that end (at `<eos>`, or at the
    /// last step) finish, and the best width of the others become the new
    /// beams, in rank order on the image's first rows: parents[r] = the row
    /// whose cache row r takes over, next[r] = the token it is fed (`pad`
    /// where no beam is left). Finished captions keep the best width,
    /// earlier ones first among equals. At step 0 only each image's first
    /// row is live, with score 0.
    fn beam_step(
        &self,
        candidates: &Self::Ids,
        step: &BeamStep,
        parents: &mut Self::Ids,
        next: &mut Self::Ids,
        state: &mut Self::Ids,
    );

    /// out[r, j] = (logits[r, j] + g(seed, first_row + r / positions,
    /// r % positions, j)) / tau over teacher-forced rows `[sequences *
    /// positions, vocab]`: the noise [`ChoiceRule::Gumbel`] chose sequence
    /// r / positions's token at step r % positions with, so a softmax of
    /// `out` is the Gumbel-softmax relaxation of that choice.
    #[allow(clippy::too_many_arguments)]
    fn gumbel_logits(
        &self,
        logits: &Self::Tensor,
        vocab: usize,
        positions: usize,
        seed: u64,
        first_row: u32,
        tau: f32,
        out: &mut Self::Tensor,
    );

    // ---- optimiser ----
    /// One AdamW update of `param` in place; `grad_sumsq[0]` holds the
    /// squared global gradient norm used for clipping.
    #[allow(clippy::too_many_arguments)]
    fn adamw(
        &self,
        param: &mut Self::Tensor,
        grad: &Self::Tensor,
        m: &mut Self::Tensor,
        v: &mut Self::Tensor,
        grad_sumsq: &Self::Tensor,
        step: &AdamWStep,
    );
}
