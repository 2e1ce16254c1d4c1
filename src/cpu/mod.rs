//! The CPU backend: plain Rust, the reference every GPU kernel is checked
//! against, and the fallback where no GPU exists. Each file here is the twin
//! of the `shaders/` file of the same name.

mod adamw;
mod attention;
mod beam;
pub mod choose;
mod elementwise;
mod embedding;
mod heads;
mod layernorm;
mod logprob;
mod lstm;
mod matmul;
mod normalize;
mod pool;
mod profile;
mod reduce;
mod softmax;

use crate::backend::{
    AdamWStep, AttentionShape, Backend, BackendKind, BeamStep, CachedAttention, Candidates,
    HeadLayout, LstmStep, Matmul, Reduce, SoftmaxRows, TokenChoice, TokenIndex, VocabSubsets,
};

#[derive(Clone, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

/// The processor's model name, as the kernel reports it.
pub fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn subsets(s: &VocabSubsets<CpuBackend>) -> logprob::Subsets<'_> {
    logprob::Subsets {
        row_subset: &s.row_subset,
        bits: &s.bits,
        words: s.words,
    }
}

/// A product's name in a profile, by which operand is transposed: a
/// layer's forward product, an input gradient and a weight gradient are
/// told apart.
fn matmul_entry(s: &Matmul) -> &'static str {
    match (s.trans_a, s.trans_b) {
        (false, false) => "matmul",
        (false, true) => "matmul_bt",
        (true, false) => "matmul_at",
        (true, true) => "matmul_at_bt",
    }
}

impl Backend for CpuBackend {
    type Tensor = Vec<f32>;
    type Ids = Vec<u32>;
    type PendingIds = Option<Vec<u32>>;

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn adapter_name(&self) -> String {
        format!(
            "{} ({} threads)",
            cpu_model_name(),
            rayon::current_num_threads()
        )
    }

    fn zeros(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn tensor(&self, data: &[f32]) -> Vec<f32> {
        data.to_vec()
    }

    fn ids(&self, data: &[u32]) -> Vec<u32> {
        data.to_vec()
    }

    fn write(&self, dst: &mut Vec<f32>, data: &[f32]) {
        assert_eq!(dst.len(), data.len(), "write: length mismatch");
        dst.copy_from_slice(data);
    }

    fn to_vec(&self, src: &Vec<f32>) -> Vec<f32> {
        src.clone()
    }

    fn ids_to_vec(&self, src: &Vec<u32>) -> Vec<u32> {
        src.clone()
    }

    fn begin_ids_read(&self, src: &Vec<u32>) -> Option<Vec<u32>> {
        Some(src.clone())
    }

    fn poll_ids_read(&self, pending: &mut Option<Vec<u32>>) -> Option<Vec<u32>> {
        pending.take()
    }

    fn flush(&self) {}

    fn start_kernel_profile(&self) -> bool {
        profile::start();
        true
    }

    fn finish_kernel_profile(&self) -> Option<crate::kernel_profile::KernelProfile> {
        profile::finish()
    }

    fn fill(&self, x: &mut Vec<f32>, value: f32) {
        let _op = profile::op("elementwise", "fill", x.len());
        x.fill(value);
    }

    fn scale(&self, x: &mut Vec<f32>, alpha: f32) {
        let _op = profile::op("elementwise", "scale", x.len());
        x.iter_mut().for_each(|v| *v *= alpha);
    }

    fn axpby(&self, alpha: f32, x: &Vec<f32>, beta: f32, y: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "axpby", y.len());
        for (yi, &xi) in y.iter_mut().zip(x) {
            *yi = if beta == 0.0 {
                alpha * xi
            } else {
                alpha * xi + beta * *yi
            };
        }
    }

    fn add(&self, alpha: f32, a: &Vec<f32>, beta: f32, b: &Vec<f32>, out: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "add", out.len());
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = alpha * x + beta * y;
        }
    }

    fn mul(&self, alpha: f32, a: &Vec<f32>, b: &Vec<f32>, out: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "mul", out.len());
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = alpha * x * y;
        }
    }

    fn add_bias(&self, y: &mut Vec<f32>, bias: &Vec<f32>) {
        let _op = profile::op("elementwise", "add_bias", y.len());
        elementwise::add_bias(y, bias);
    }

    fn gelu(&self, x: &Vec<f32>, y: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "gelu", y.len());
        elementwise::gelu(x, y);
    }

    fn tanh(&self, x: &Vec<f32>, y: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "tanh", y.len());
        elementwise::tanh_forward(x, y);
    }

    fn tanh_backward(&self, x: &Vec<f32>, dy: &Vec<f32>, dx: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "tanh_backward", dx.len());
        elementwise::tanh_backward(x, dy, dx);
    }

    fn quick_gelu(&self, x: &Vec<f32>, y: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "quick_gelu", y.len());
        elementwise::quick_gelu_forward(x, y);
    }

    fn quick_gelu_backward(&self, x: &Vec<f32>, dy: &Vec<f32>, dx: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "quick_gelu_backward", dx.len());
        elementwise::quick_gelu_backward(x, dy, dx);
    }

    fn gelu_erf(&self, x: &Vec<f32>, y: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "gelu_erf", y.len());
        elementwise::gelu_erf_forward(x, y);
    }

    fn gelu_erf_backward(&self, x: &Vec<f32>, dy: &Vec<f32>, dx: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "gelu_erf_backward", dx.len());
        elementwise::gelu_erf_backward(x, dy, dx);
    }

    fn relu(&self, x: &Vec<f32>, y: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "relu", y.len());
        elementwise::relu_forward(x, y);
    }

    fn relu_backward(&self, x: &Vec<f32>, dy: &Vec<f32>, dx: &mut Vec<f32>) {
        let _op = profile::op("elementwise", "relu_backward", dx.len());
        elementwise::relu_backward(x, dy, dx);
    }

    fn matmul_gelu_backward(
        &self,
        a: &Vec<f32>,
        b: &Vec<f32>,
        pre: &Vec<f32>,
        c: &mut Vec<f32>,
        shape: &Matmul,
    ) {
        let _op = profile::op("matmul", "matmul_gelu_backward", shape.multiply_adds());
        shape.check_gelu_backward(pre.len());
        matmul::matmul(a, b, c, shape);
        let len = shape.m * shape.n;
        elementwise::gelu_backward_in_place(&pre[..len], &mut c[..len]);
    }

    fn gelu_backward(&self, x: &Vec<f32>, dy: &Vec<f32>, dx: &mut Vec<f32>, accumulate: bool) {
        let _op = profile::op("elementwise", "gelu_backward", dx.len());
        elementwise::gelu_backward(x, dy, dx, accumulate);
    }

    fn scale_by_exp(&self, log_scale: &Vec<f32>, x: &Vec<f32>, y: &mut Vec<f32>, accumulate: bool) {
        let _op = profile::op("elementwise", "scale_by_exp", y.len());
        elementwise::scale_by_exp(log_scale[0], x, y, accumulate);
    }

    fn clamp(&self, x: &mut Vec<f32>, lo: f32, hi: f32) {
        let _op = profile::op("elementwise", "clamp", x.len());
        x.iter_mut().for_each(|v| *v = v.clamp(lo, hi));
    }

    fn l2_normalize(&self, x: &Vec<f32>, y: &mut Vec<f32>, norm: &mut Vec<f32>, cols: usize) {
        let _op = profile::op("normalize", "l2_normalize", y.len());
        normalize::forward(x, y, norm, cols);
    }

    fn l2_normalize_backward(
        &self,
        y: &Vec<f32>,
        norm: &Vec<f32>,
        dy: &Vec<f32>,
        dx: &mut Vec<f32>,
        cols: usize,
        accumulate: bool,
    ) {
        let _op = profile::op("normalize", "l2_normalize_backward", dx.len());
        normalize::backward(y, norm, dy, dx, cols, accumulate);
    }

    fn lstm_cell(
        &self,
        gates: &mut Vec<f32>,
        cells: &mut Vec<f32>,
        hidden: &mut Vec<f32>,
        step: &LstmStep,
    ) {
        let _op = profile::op("lstm", "lstm_cell", gates.len());
        lstm::cell(gates, cells, hidden, step);
    }

    fn lstm_cell_backward(
        &self,
        gates: &Vec<f32>,
        cells: &Vec<f32>,
        d_hidden: &Vec<f32>,
        d_cell: &mut Vec<f32>,
        d_gates: &mut Vec<f32>,
        step: &LstmStep,
    ) {
        let _op = profile::op("lstm", "lstm_cell_backward", d_gates.len());
        lstm::cell_backward(gates, cells, d_hidden, d_cell, d_gates, step);
    }

    fn mean_pool(&self, x: &Vec<f32>, y: &mut Vec<f32>, group: usize, cols: usize) {
        let _op = profile::op("pool", "mean_pool", y.len());
        pool::mean_pool(x, y, group, cols);
    }

    fn mean_pool_backward(
        &self,
        dy: &Vec<f32>,
        dx: &mut Vec<f32>,
        group: usize,
        cols: usize,
        accumulate: bool,
    ) {
        let _op = profile::op("pool", "mean_pool_backward", dx.len());
        pool::mean_pool_backward(dy, dx, group, cols, accumulate);
    }

    fn matmul(&self, a: &Vec<f32>, b: &Vec<f32>, c: &mut Vec<f32>, shape: &Matmul) {
        let _op = profile::op("matmul", matmul_entry(shape), shape.multiply_adds());
        matmul::matmul(a, b, c, shape);
    }

    fn reduce_parts(&self, parts: &[&Vec<f32>], op: Reduce, out: &mut Vec<f32>, out_index: usize) {
        let _op = profile::op("reduce", "reduce_parts", 1);
        out[out_index] = reduce::reduce_parts(parts, op);
    }

    fn column_sum(
        &self,
        x: &Vec<f32>,
        rows: usize,
        cols: usize,
        out: &mut Vec<f32>,
        accumulate: bool,
    ) {
        let _op = profile::op("reduce", "column_sum", out.len());
        reduce::column_sum(x, rows, cols, out, accumulate);
    }

    fn layer_norm(
        &self,
        x: &Vec<f32>,
        gamma: &Vec<f32>,
        beta: &Vec<f32>,
        y: &mut Vec<f32>,
        mean: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
        cols: usize,
        eps: f32,
    ) {
        let _op = profile::op("layernorm", "layer_norm", y.len());
        layernorm::forward(
            x,
            gamma,
            beta,
            layernorm::LayerNormOut { y, mean, rstd },
            cols,
            eps,
        );
    }

    fn layer_norm_backward(
        &self,
        dy: &Vec<f32>,
        x: &Vec<f32>,
        gamma: &Vec<f32>,
        mean: &Vec<f32>,
        rstd: &Vec<f32>,
        dx: &mut Vec<f32>,
        dgamma: &mut Vec<f32>,
        dbeta: &mut Vec<f32>,
        cols: usize,
        accumulate_dx: bool,
    ) {
        let _op = profile::op("layernorm", "layer_norm_backward", dx.len());
        let grads = layernorm::LayerNormGrads { dx, dgamma, dbeta };
        layernorm::backward(dy, x, gamma, mean, rstd, grads, cols, accumulate_dx);
    }

    fn softmax(
        &self,
        x: &Vec<f32>,
        y: &mut Vec<f32>,
        rows: &SoftmaxRows,
        key_mask: Option<&Vec<u32>>,
    ) {
        let _op = profile::op("softmax", "softmax", y.len());
        softmax::forward(x, y, rows, key_mask.map(|m| m.as_slice()));
    }

    fn softmax_backward(
        &self,
        y: &Vec<f32>,
        dy: &Vec<f32>,
        dx: &mut Vec<f32>,
        cols: usize,
        accumulate: bool,
    ) {
        let _op = profile::op("softmax", "softmax_backward", dx.len());
        softmax::backward(y, dy, dx, cols, accumulate);
    }

    fn attention(
        &self,
        qkv: &Vec<f32>,
        key_mask: Option<&Vec<u32>>,
        out: &mut Vec<f32>,
        lse: &mut Vec<f32>,
        l: &AttentionShape,
    ) {
        let _op = profile::op("attention", "attention", out.len());
        l.check((qkv.len(), out.len(), lse.len()), key_mask.map(|m| m.len()));
        attention::forward(qkv, key_mask.map(|m| &m[..]), out, lse, l);
    }

    fn attention_backward(
        &self,
        qkv: &Vec<f32>,
        key_mask: Option<&Vec<u32>>,
        out: &Vec<f32>,
        lse: &Vec<f32>,
        d_out: &Vec<f32>,
        dqkv: &mut Vec<f32>,
        l: &AttentionShape,
    ) {
        let _op = profile::op("attention", "attention_backward", dqkv.len());
        let sizes = (qkv.len(), out.len(), lse.len(), d_out.len(), dqkv.len());
        l.check_backward(sizes, key_mask.map(|m| m.len()));
        attention::backward(qkv, key_mask.map(|m| &m[..]), out, lse, d_out, dqkv, l);
    }

    fn attend_cached(
        &self,
        qkv: &Vec<f32>,
        keys: &mut Vec<f32>,
        values: &mut Vec<f32>,
        out: &mut Vec<f32>,
        l: &CachedAttention,
    ) {
        let _op = profile::op("attention", "attend_cached", out.len());
        l.check((qkv.len(), keys.len(), values.len(), out.len()));
        attention::attend_cached(qkv, keys, values, out, l);
    }

    fn tokens_to_heads(&self, src: &Vec<f32>, dst: &mut Vec<f32>, layout: &HeadLayout) {
        let _op = profile::op("heads", "tokens_to_heads", dst.len());
        heads::tokens_to_heads(src, dst, layout);
    }

    fn heads_to_tokens(
        &self,
        src: &Vec<f32>,
        dst: &mut Vec<f32>,
        layout: &HeadLayout,
        accumulate: bool,
    ) {
        let _op = profile::op("heads", "heads_to_tokens", dst.len());
        heads::heads_to_tokens(src, dst, layout, accumulate);
    }

    fn embedding(
        &self,
        table: &Vec<f32>,
        ids: &Vec<u32>,
        out: &mut Vec<f32>,
        dim: usize,
        accumulate: bool,
    ) {
        let _op = profile::op("embedding", "embedding", out.len());
        embedding::forward(table, ids, out, dim, accumulate);
    }

    fn embedding_backward(
        &self,
        dout: &Vec<f32>,
        ids: &TokenIndex<Self>,
        dtable: &mut Vec<f32>,
        dim: usize,
    ) {
        let _op = profile::op("embedding", "embedding_backward", dtable.len());
        embedding::backward(dout, &ids.unique, &ids.offsets, &ids.order, dtable, dim);
    }

    fn softmax_entropy(
        &self,
        logits: &Vec<f32>,
        vocab: usize,
        entropy: &mut Vec<f32>,
        lse: &mut Vec<f32>,
    ) {
        let _op = profile::op("logprob", "softmax_entropy", entropy.len());
        logprob::softmax_entropy(logits, vocab, entropy, lse);
    }

    fn softmax_entropy_backward(
        &self,
        logits: &Vec<f32>,
        vocab: usize,
        entropy: &Vec<f32>,
        lse: &Vec<f32>,
        d_entropy: &Vec<f32>,
        dlogits: &mut Vec<f32>,
        accumulate: bool,
    ) {
        let _op = profile::op("logprob", "softmax_entropy_backward", dlogits.len());
        logprob::softmax_entropy_backward(
            logits, vocab, entropy, lse, d_entropy, dlogits, accumulate,
        );
    }

    fn spread_sequence_weights(
        &self,
        weights: &Vec<f32>,
        ids: &Vec<u32>,
        per_sequence: usize,
        pad: u32,
        alpha: f32,
        coef: &mut Vec<f32>,
    ) {
        let _op = profile::op("elementwise", "spread_sequence_weights", coef.len());
        for (i, (c, &id)) in coef.iter_mut().zip(ids).enumerate() {
            *c = if id != pad {
                alpha * weights[i / per_sequence]
            } else {
                0.0
            };
        }
    }

    fn choose_tokens(
        &self,
        logits: &Vec<f32>,
        choice: &TokenChoice,
        next: &mut Vec<u32>,
        history: &mut Vec<u32>,
        logprobs: &mut Vec<f32>,
    ) {
        let _op = profile::op("choose", "choose_tokens", next.len());
        choose::choose_tokens(logits, choice, next, history, logprobs);
    }

    fn top_candidates(&self, logits: &Vec<f32>, c: &Candidates, candidates: &mut Vec<u32>) {
        let _op = profile::op("choose", "top_candidates", candidates.len());
        c.check((logits.len(), candidates.len()));
        choose::top_candidates(logits, c, candidates);
    }

    fn beam_step(
        &self,
        candidates: &Vec<u32>,
        step: &BeamStep,
        parents: &mut Vec<u32>,
        next: &mut Vec<u32>,
        state: &mut Vec<u32>,
    ) {
        let _op = profile::op("beam", "beam_step", next.len());
        step.check((candidates.len(), parents.len(), next.len(), state.len()));
        beam::beam_step(candidates, step, parents, next, state);
    }

    fn gumbel_logits(
        &self,
        logits: &Vec<f32>,
        vocab: usize,
        positions: usize,
        seed: u64,
        first_row: u32,
        tau: f32,
        out: &mut Vec<f32>,
    ) {
        let _op = profile::op("choose", "gumbel_logits", out.len());
        assert!(
            out.len() == logits.len() && logits.len().is_multiple_of(vocab * positions),
            "gumbel_logits: shapes do not fit"
        );
        choose::gumbel_logits(logits, vocab, positions, seed, first_row, tau, out);
    }

    fn log_softmax_gather(
        &self,
        logits: &Vec<f32>,
        targets: &Vec<u32>,
        subsets: &VocabSubsets<Self>,
        vocab: usize,
        logp: &mut Vec<f32>,
        lse: &mut Vec<f32>,
    ) {
        let _op = profile::op("logprob", "log_softmax_gather", logp.len());
        logprob::forward(logits, targets, &self::subsets(subsets), vocab, logp, lse);
    }

    fn log_softmax_gather_backward(
        &self,
        logits: &Vec<f32>,
        targets: &Vec<u32>,
        subsets: &VocabSubsets<Self>,
        vocab: usize,
        lse: &Vec<f32>,
        dlogp: &Vec<f32>,
        dlogits: &mut Vec<f32>,
        accumulate: bool,
    ) {
        let _op = profile::op("logprob", "log_softmax_gather_backward", dlogits.len());
        logprob::backward(
            logits,
            targets,
            &self::subsets(subsets),
            vocab,
            lse,
            dlogp,
            dlogits,
            accumulate,
        );
    }

    fn adamw(
        &self,
        param: &mut Vec<f32>,
        grad: &Vec<f32>,
        m: &mut Vec<f32>,
        v: &mut Vec<f32>,
        grad_sumsq: &Vec<f32>,
        step: &AdamWStep,
    ) {
        let _op = profile::op("adamw", "adamw", param.len());
        adamw::step(param, grad, m, v, grad_sumsq[0], step);
    }
}
