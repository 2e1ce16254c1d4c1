//! `Backend` for the GPU: each op is in the file of its kernel family,
//! named after its `shaders/*.wgsl` file, which fills the kernel's parameter
//! block (laid out as that shader's `Params` struct) and records the
//! dispatch.

use super::{
    GpuBackend, GpuIds, GpuTensor, PendingRead, adamw, attention, beam, choose, describe,
    elementwise, embedding, heads, layernorm, logprob, lstm, matmul, normalize, pool, reduce,
    sequence, softmax,
};
use crate::backend::{
    AdamWStep, AttentionShape, Backend, BackendKind, BeamStep, CachedAttention, Candidates,
    DeviceCounters, HeadLayout, LstmStep, Matmul, Reduce, SoftmaxRows, Storage, TokenChoice,
    TokenIndex, VocabSubsets, WorkgroupCounts,
};

impl Backend for GpuBackend {
    type Tensor = GpuTensor;
    type Ids = GpuIds;
    type PendingIds = PendingRead;

    fn kind(&self) -> BackendKind {
        BackendKind::Gpu
    }

    fn adapter_name(&self) -> String {
        describe(&self.info)
    }

    fn zeros(&self, len: usize) -> GpuTensor {
        GpuTensor(self.zeroed(len))
    }

    fn tensor(&self, data: &[f32]) -> GpuTensor {
        self.new_tensor(data)
    }

    fn ids(&self, data: &[u32]) -> GpuIds {
        self.new_ids(data)
    }

    fn tensor_group(&self, data: &[&[f32]]) -> Vec<GpuTensor> {
        self.group(data)
    }

    fn span(&self, group: &[&GpuTensor]) -> Option<GpuTensor> {
        self.covering(group)
    }

    fn write(&self, dst: &mut GpuTensor, data: &[f32]) {
        assert_eq!(dst.len(), data.len(), "write: length mismatch");
        self.write_bytes(&dst.0, bytemuck::cast_slice(data));
    }

    fn to_vec(&self, src: &GpuTensor) -> Vec<f32> {
        bytemuck::pod_collect_to_vec(&self.read_bytes(&src.0))
    }

    fn ids_to_vec(&self, src: &GpuIds) -> Vec<u32> {
        bytemuck::pod_collect_to_vec(&self.read_bytes(&src.0))
    }

    fn begin_ids_read(&self, src: &GpuIds) -> PendingRead {
        self.begin_read(&src.0)
    }

    fn poll_ids_read(&self, pending: &mut PendingRead) -> Option<Vec<u32>> {
        pending
            .poll()
            .map(|bytes| bytemuck::pod_collect_to_vec(&bytes))
    }

    fn flush(&self) {
        GpuBackend::submit(self);
        self.wait();
    }

    fn submit(&self) {
        GpuBackend::submit(self);
    }

    fn counters(&self) -> Option<DeviceCounters> {
        Some(GpuBackend::counters(self))
    }

    fn matmul_workgroups(&self) -> Option<WorkgroupCounts> {
        Some(GpuBackend::matmul_workgroups(self))
    }

    fn start_kernel_profile(&self) -> bool {
        GpuBackend::start_kernel_profile(self)
    }

    fn finish_kernel_profile(&self) -> Option<crate::kernel_profile::KernelProfile> {
        GpuBackend::finish_kernel_profile(self)
    }

    fn device_memory_bytes(&self) -> Option<u64> {
        Some(GpuBackend::device_memory_bytes(self))
    }

    fn fill(&self, x: &mut GpuTensor, value: f32) {
        elementwise::fill(self, x, value);
    }

    fn scale(&self, x: &mut GpuTensor, alpha: f32) {
        elementwise::scale(self, x, alpha);
    }

    fn axpby(&self, alpha: f32, x: &GpuTensor, beta: f32, y: &mut GpuTensor) {
        elementwise::axpby(self, alpha, x, beta, y);
    }

    fn add(&self, alpha: f32, a: &GpuTensor, beta: f32, b: &GpuTensor, out: &mut GpuTensor) {
        elementwise::add(self, alpha, a, beta, b, out);
    }

    fn mul(&self, alpha: f32, a: &GpuTensor, b: &GpuTensor, out: &mut GpuTensor) {
        elementwise::mul(self, alpha, a, b, out);
    }

    fn add_bias(&self, y: &mut GpuTensor, bias: &GpuTensor) {
        elementwise::add_bias(self, y, bias);
    }

    fn gelu(&self, x: &GpuTensor, y: &mut GpuTensor) {
        elementwise::gelu(self, x, y);
    }

    fn tanh(&self, x: &GpuTensor, y: &mut GpuTensor) {
        elementwise::tanh_forward(self, x, y);
    }

    fn tanh_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
        elementwise::tanh_backward(self, x, dy, dx);
    }

    fn gelu_erf(&self, x: &GpuTensor, y: &mut GpuTensor) {
        elementwise::gelu_erf_forward(self, x, y);
    }

    fn gelu_erf_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
        elementwise::gelu_erf_backward(self, x, dy, dx);
    }

    fn quick_gelu(&self, x: &GpuTensor, y: &mut GpuTensor) {
        elementwise::quick_gelu_forward(self, x, y);
    }

    fn quick_gelu_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
        elementwise::quick_gelu_backward(self, x, dy, dx);
    }

    fn relu(&self, x: &GpuTensor, y: &mut GpuTensor) {
        elementwise::relu_forward(self, x, y);
    }

    fn relu_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
        elementwise::relu_backward(self, x, dy, dx);
    }

    fn gelu_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor, accumulate: bool) {
        elementwise::gelu_backward(self, x, dy, dx, accumulate);
    }

    fn scale_by_exp(
        &self,
        log_scale: &GpuTensor,
        x: &GpuTensor,
        y: &mut GpuTensor,
        accumulate: bool,
    ) {
        elementwise::scale_by_exp(self, log_scale, x, y, accumulate);
    }

    fn clamp(&self, x: &mut GpuTensor, lo: f32, hi: f32) {
        elementwise::clamp(self, x, lo, hi);
    }

    fn l2_normalize(&self, x: &GpuTensor, y: &mut GpuTensor, norm: &mut GpuTensor, cols: usize) {
        normalize::forward(self, x, y, norm, cols);
    }

    fn l2_normalize_backward(
        &self,
        y: &GpuTensor,
        norm: &GpuTensor,
        dy: &GpuTensor,
        dx: &mut GpuTensor,
        cols: usize,
        accumulate: bool,
    ) {
        normalize::backward(self, y, norm, dy, dx, cols, accumulate);
    }

    fn lstm_cell(
        &self,
        gates: &mut GpuTensor,
        cells: &mut GpuTensor,
        hidden: &mut GpuTensor,
        step: &LstmStep,
    ) {
        lstm::cell(self, gates, cells, hidden, step);
    }

    fn lstm_cell_backward(
        &self,
        gates: &GpuTensor,
        cells: &GpuTensor,
        d_hidden: &GpuTensor,
        d_cell: &mut GpuTensor,
        d_gates: &mut GpuTensor,
        step: &LstmStep,
    ) {
        lstm::cell_backward(self, gates, cells, d_hidden, d_cell, d_gates, step);
    }

    fn mean_pool(&self, x: &GpuTensor, y: &mut GpuTensor, group: usize, cols: usize) {
        pool::mean_pool(self, x, y, group, cols);
    }

    fn mean_pool_backward(
        &self,
        dy: &GpuTensor,
        dx: &mut GpuTensor,
        group: usize,
        cols: usize,
        accumulate: bool,
    ) {
        pool::mean_pool_backward(self, dy, dx, group, cols, accumulate);
    }

    fn matmul(&self, a: &GpuTensor, b: &GpuTensor, c: &mut GpuTensor, s: &Matmul) {
        matmul::matmul(self, a, b, c, s);
    }

    fn matmul_bias(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        bias: &GpuTensor,
        c: &mut GpuTensor,
        s: &Matmul,
    ) {
        matmul::matmul_bias(self, a, b, bias, c, s);
    }

    fn matmul_bias_residual(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        bias: &GpuTensor,
        residual: &GpuTensor,
        c: &mut GpuTensor,
        s: &Matmul,
    ) {
        matmul::matmul_bias_residual(self, a, b, bias, residual, c, s);
    }

    fn matmul_bias_gelu(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        bias: &GpuTensor,
        c: &mut GpuTensor,
        act: &mut GpuTensor,
        s: &Matmul,
    ) {
        matmul::matmul_bias_gelu(self, a, b, bias, c, act, s);
    }

    fn matmul_gelu_backward(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        pre: &GpuTensor,
        c: &mut GpuTensor,
        s: &Matmul,
    ) {
        matmul::matmul_gelu_backward(self, a, b, pre, c, s);
    }

    fn matmul_column_sums(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        c: &mut GpuTensor,
        sums: &mut GpuTensor,
        s: &Matmul,
    ) {
        matmul::matmul_column_sums(self, a, b, c, sums, s);
    }

    fn reduce_parts(
        &self,
        parts: &[&GpuTensor],
        op: Reduce,
        out: &mut GpuTensor,
        out_index: usize,
    ) {
        reduce::reduce_parts(self, parts, op, out, out_index);
    }

    fn column_sum(
        &self,
        x: &GpuTensor,
        rows: usize,
        cols: usize,
        out: &mut GpuTensor,
        accumulate: bool,
    ) {
        reduce::column_sum(self, x, rows, cols, out, accumulate);
    }

    fn layer_norm(
        &self,
        x: &GpuTensor,
        gamma: &GpuTensor,
        beta: &GpuTensor,
        y: &mut GpuTensor,
        mean: &mut GpuTensor,
        rstd: &mut GpuTensor,
        cols: usize,
        eps: f32,
    ) {
        layernorm::forward(self, x, gamma, beta, y, mean, rstd, cols, eps);
    }

    fn layer_norm_backward(
        &self,
        dy: &GpuTensor,
        x: &GpuTensor,
        gamma: &GpuTensor,
        mean: &GpuTensor,
        rstd: &GpuTensor,
        dx: &mut GpuTensor,
        dgamma: &mut GpuTensor,
        dbeta: &mut GpuTensor,
        cols: usize,
        accumulate_dx: bool,
    ) {
        layernorm::backward(
            self,
            dy,
            x,
            gamma,
            mean,
            rstd,
            dx,
            dgamma,
            dbeta,
            cols,
            accumulate_dx,
        );
    }

    fn softmax(
        &self,
        x: &GpuTensor,
        y: &mut GpuTensor,
        r: &SoftmaxRows,
        key_mask: Option<&GpuIds>,
    ) {
        softmax::forward(self, x, y, r, key_mask);
    }

    fn softmax_backward(
        &self,
        y: &GpuTensor,
        dy: &GpuTensor,
        dx: &mut GpuTensor,
        cols: usize,
        accumulate: bool,
    ) {
        softmax::backward(self, y, dy, dx, cols, accumulate);
    }

    fn attention(
        &self,
        qkv: &GpuTensor,
        key_mask: Option<&GpuIds>,
        out: &mut GpuTensor,
        lse: &mut GpuTensor,
        l: &AttentionShape,
    ) {
        attention::forward(self, qkv, key_mask, out, lse, l);
    }

    fn attention_backward(
        &self,
        qkv: &GpuTensor,
        key_mask: Option<&GpuIds>,
        out: &GpuTensor,
        lse: &GpuTensor,
        d_out: &GpuTensor,
        dqkv: &mut GpuTensor,
        l: &AttentionShape,
    ) {
        attention::backward(self, qkv, key_mask, out, lse, d_out, dqkv, l);
    }

    fn attend_cached(
        &self,
        qkv: &GpuTensor,
        keys: &mut GpuTensor,
        values: &mut GpuTensor,
        out: &mut GpuTensor,
        l: &CachedAttention,
    ) {
        attention::attend_cached(self, qkv, keys, values, out, l);
    }

    fn tokens_to_heads(&self, src: &GpuTensor, dst: &mut GpuTensor, l: &HeadLayout) {
        heads::tokens_to_heads(self, src, dst, l);
    }

    fn heads_to_tokens(
        &self,
        src: &GpuTensor,
        dst: &mut GpuTensor,
        l: &HeadLayout,
        accumulate: bool,
    ) {
        heads::heads_to_tokens(self, src, dst, l, accumulate);
    }

    fn embedding(
        &self,
        table: &GpuTensor,
        ids: &GpuIds,
        out: &mut GpuTensor,
        dim: usize,
        accumulate: bool,
    ) {
        embedding::forward(self, table, ids, out, dim, accumulate);
    }

    fn softmax_entropy(
        &self,
        logits: &GpuTensor,
        vocab: usize,
        entropy: &mut GpuTensor,
        lse: &mut GpuTensor,
    ) {
        logprob::softmax_entropy(self, logits, vocab, entropy, lse);
    }

    fn softmax_entropy_backward(
        &self,
        logits: &GpuTensor,
        vocab: usize,
        entropy: &GpuTensor,
        lse: &GpuTensor,
        d_entropy: &GpuTensor,
        dlogits: &mut GpuTensor,
        accumulate: bool,
    ) {
        logprob::softmax_entropy_backward(
            self, logits, vocab, entropy, lse, d_entropy, dlogits, accumulate,
        );
    }

    fn spread_sequence_weights(
        &self,
        weights: &GpuTensor,
        ids: &GpuIds,
        per_sequence: usize,
        pad: u32,
        alpha: f32,
        coef: &mut GpuTensor,
    ) {
        sequence::spread_weights(self, weights, ids, per_sequence, pad, alpha, coef);
    }

    fn choose_tokens(
        &self,
        logits: &GpuTensor,
        choice: &TokenChoice,
        next: &mut GpuIds,
        history: &mut GpuIds,
        logprobs: &mut GpuTensor,
    ) {
        choose::choose_tokens(self, logits, choice, next, history, logprobs);
    }

    fn top_candidates(&self, logits: &GpuTensor, c: &Candidates, candidates: &mut GpuIds) {
        choose::top_candidates(self, logits, c, candidates);
    }

    fn beam_step(
        &self,
        candidates: &GpuIds,
        step: &BeamStep,
        parents: &mut GpuIds,
        next: &mut GpuIds,
        state: &mut GpuIds,
    ) {
        beam::beam_step(self, candidates, step, parents, next, state);
    }

    fn gumbel_logits(
        &self,
        logits: &GpuTensor,
        vocab: usize,
        positions: usize,
        seed: u64,
        first_row: u32,
        tau: f32,
        out: &mut GpuTensor,
    ) {
        choose::gumbel_logits(self, logits, vocab, positions, seed, first_row, tau, out);
    }

    fn embedding_backward(
        &self,
        dout: &GpuTensor,
        ids: &TokenIndex<Self>,
        dtable: &mut GpuTensor,
        dim: usize,
    ) {
        embedding::backward(self, dout, ids, dtable, dim);
    }

    fn log_softmax_gather(
        &self,
        logits: &GpuTensor,
        targets: &GpuIds,
        subsets: &VocabSubsets<Self>,
        vocab: usize,
        logp: &mut GpuTensor,
        lse: &mut GpuTensor,
    ) {
        logprob::forward(self, logits, targets, subsets, vocab, logp, lse);
    }

    fn log_softmax_gather_backward(
        &self,
        logits: &GpuTensor,
        targets: &GpuIds,
        subsets: &VocabSubsets<Self>,
        vocab: usize,
        lse: &GpuTensor,
        dlogp: &GpuTensor,
        dlogits: &mut GpuTensor,
        accumulate: bool,
    ) {
        logprob::backward(
            self, logits, targets, subsets, vocab, lse, dlogp, dlogits, accumulate,
        );
    }

    fn adamw(
        &self,
        param: &mut GpuTensor,
        grad: &GpuTensor,
        m: &mut GpuTensor,
        v: &mut GpuTensor,
        grad_sumsq: &GpuTensor,
        s: &AdamWStep,
    ) {
        adamw::step(self, param, grad, m, v, grad_sumsq, s);
    }
}
