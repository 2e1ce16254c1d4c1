//! Token choice on the GPU (greedy, sampled or by the Gumbel-max trick),
//! each row's top candidates, and the Gumbel-softmax logits: the twin of
//! `shaders/choose.wgsl` and `src/cpu/choose.rs`.

use super::{GpuBackend, GpuIds, GpuTensor, u};
use crate::backend::{Candidates, ChoiceRule, Storage, TokenChoice};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ChooseParams {
    rows: u32,
    vocab: u32,
    step: u32,
    steps: u32,
    sample: u32,
    top_k: u32,
    temperature: f32,
    top_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    first_row: u32,
    banned: u32,
    bos: u32,
    eos: u32,
    pad: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GumbelParams {
    len: u32,
    vocab: u32,
    positions: u32,
    first_row: u32,
    seed_lo: u32,
    seed_hi: u32,
    tau: f32,
    _pad: u32,
}

pub(super) fn choose_tokens(
    gpu: &GpuBackend,
    logits: &GpuTensor,
    choice: &TokenChoice,
    next: &mut GpuIds,
    history: &mut GpuIds,
    logprobs: &mut GpuTensor,
) {
    let (rule, sampling) = match choice.rule {
        ChoiceRule::Greedy => (0, None),
        ChoiceRule::Sample(s) => (1, Some(s)),
        ChoiceRule::Gumbel => (2, None),
    };
    let sampling = sampling.unwrap_or(crate::backend::Sampling {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    });
    let params = ChooseParams {
        rows: u(choice.rows),
        vocab: u(choice.vocab),
        step: choice.step,
        steps: u(choice.steps),
        sample: rule,
        top_k: sampling.top_k,
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        seed_lo: choice.seed as u32,
        seed_hi: (choice.seed >> 32) as u32,
        first_row: choice.first_row,
        banned: choice.banned,
        bos: choice.bos,
        eos: choice.eos,
        pad: choice.pad,
        _pad: 0,
    };
    gpu.dispatch(
        "choose",
        "choose_tokens",
        &params,
        &[&logits.0, &next.0, &history.0, &logprobs.0],
        gpu.grid(choice.rows),
    );
}

pub(super) fn top_candidates(
    gpu: &GpuBackend,
    logits: &GpuTensor,
    c: &Candidates,
    candidates: &mut GpuIds,
) {
    c.check((logits.len(), candidates.len()));
    let params = ChooseParams {
        rows: u(c.rows),
        vocab: u(c.vocab),
        top_k: u(c.count),
        banned: c.banned,
        bos: c.bos,
        pad: c.pad,
        ..ChooseParams::zeroed()
    };
    gpu.dispatch(
        "choose",
        "top_candidates",
        &params,
        &[&logits.0, &candidates.0],
        gpu.grid(c.rows),
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn gumbel_logits(
    gpu: &GpuBackend,
    logits: &GpuTensor,
    vocab: usize,
    positions: usize,
    seed: u64,
    first_row: u32,
    tau: f32,
    out: &mut GpuTensor,
) {
    let len = logits.len();
    assert!(
        out.len() == len && len.is_multiple_of(vocab * positions),
        "gumbel_logits: shapes do not fit"
    );
    let params = GumbelParams {
        len: u(len),
        vocab: u(vocab),
        positions: u(positions),
        first_row,
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        tau,
        _pad: 0,
    };
    gpu.dispatch(
        "choose",
        "gumbel_logits",
        &params,
        &[&logits.0, &out.0],
        gpu.grid_for(len),
    );
}
