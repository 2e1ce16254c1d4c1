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
//!
//! The shapes the ops take are structs in this folder's files, one file
//! per family of ops; the trait's methods stand in sections by family.

mod attention;
mod counters;
mod generation;
mod index;
mod lstm;
mod matmul;

pub use attention::{AttentionProducts, AttentionShape, CachedAttention, HeadLayout, SoftmaxRows};
pub use counters::{DeviceCounters, WorkgroupCounts, WorkgroupSummary};
pub use generation::{BeamStep, Candidates, ChoiceRule, NO_ROW, Sampling, TokenChoice};
pub use index::{TokenIndex, VocabSubsets};
pub use lstm::{CellGates, LstmStep};
pub use matmul::{Matmul, Operand};

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

/// A full reduction of a tensor to one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Mean,
    Max,
    SumSquares,
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
