//! Log-probabilities under a softmax over the vocabulary or a subset of it,
//! and the softmax's entropy, on the GPU: the twin of
//! `shaders/logprob.wgsl` and `src/cpu/logprob.rs`.

use super::{GpuBackend, GpuIds, GpuTensor, u};
use crate::backend::{Storage, VocabSubsets};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LogprobParams {
    rows: u32,
    vocab: u32,
    words: u32,
    accumulate: u32,
}

pub(super) fn softmax_entropy(
    gpu: &GpuBackend,
    logits: &GpuTensor,
    vocab: usize,
    entropy: &mut GpuTensor,
    lse: &mut GpuTensor,
) {
    let rows = entropy.len();
    assert!(
        logits.len() >= rows * vocab && lse.len() >= rows,
        "softmax_entropy: shapes do not fit"
    );
    let params = LogprobParams {
        rows: u(rows),
        vocab: u(vocab),
        words: 0,
        accumulate: 0,
    };
    gpu.dispatch(
        "logprob",
        "softmax_entropy",
        &params,
        &[&logits.0, &entropy.0, &lse.0],
        gpu.grid(rows),
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn softmax_entropy_backward(
    gpu: &GpuBackend,
    logits: &GpuTensor,
    vocab: usize,
    entropy: &GpuTensor,
    lse: &GpuTensor,
    d_entropy: &GpuTensor,
    dlogits: &mut GpuTensor,
    accumulate: bool,
) {
    let rows = entropy.len();
    assert!(
        logits.len() >= rows * vocab && dlogits.len() >= rows * vocab,
        "softmax_entropy_backward: shapes do not fit"
    );
    let params = LogprobParams {
        rows: u(rows),
        vocab: u(vocab),
        words: 0,
        accumulate: accumulate as u32,
    };
    gpu.dispatch(
        "logprob",
        "softmax_entropy_backward",
        &params,
        &[&logits.0, &entropy.0, &lse.0, &d_entropy.0, &dlogits.0],
        gpu.grid_for(rows * vocab),
    );
}

pub(super) fn forward(
    gpu: &GpuBackend,
    logits: &GpuTensor,
    targets: &GpuIds,
    subsets: &VocabSubsets<GpuBackend>,
    vocab: usize,
    logp: &mut GpuTensor,
    lse: &mut GpuTensor,
) {
    let rows = targets.len();
    let params = LogprobParams {
        rows: u(rows),
        vocab: u(vocab),
        words: u(subsets.words),
        accumulate: 0,
    };
    let bufs = [
        &logits.0,
        &targets.0,
        &subsets.row_subset.0,
        &subsets.bits.0,
        &logp.0,
        &lse.0,
    ];
    gpu.dispatch(
        "logprob",
        "log_softmax_gather",
        &params,
        &bufs,
        gpu.grid(rows),
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    gpu: &GpuBackend,
    logits: &GpuTensor,
    targets: &GpuIds,
    subsets: &VocabSubsets<GpuBackend>,
    vocab: usize,
    lse: &GpuTensor,
    dlogp: &GpuTensor,
    dlogits: &mut GpuTensor,
    accumulate: bool,
) {
    let rows = targets.len();
    let params = LogprobParams {
        rows: u(rows),
        vocab: u(vocab),
        words: u(subsets.words),
        accumulate: accumulate as u32,
    };
    let bufs = [
        &logits.0,
        &targets.0,
        &subsets.row_subset.0,
        &subsets.bits.0,
        &lse.0,
        &dlogp.0,
        &dlogits.0,
    ];
    gpu.dispatch(
        "logprob",
        "log_softmax_gather_backward",
        &params,
        &bufs,
        gpu.grid_for(rows * vocab),
    );
}
